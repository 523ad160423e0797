//! The layer rules of docs/DESIGN.md ("Layers"), checked on the sources:
//! a lower layer's code names no module above it. A rule broken here is a
//! circle between layers (the engine that names its transports, the ring
//! that names the server built on it), which the design keeps out.
//!
//! Comments may name anything (they say where things are assembled); code
//! may not. A name counts when it starts a path: `dev_uring::X`,
//! `crate::dev_uring`, `super::dev_uring`.

use std::path::{Path, PathBuf};

/// `(directory or file under src, modules its code must not name)`.
const RULES: &[(&str, &[&str])] = &[
    // The wire ABI is the bottom layer.
    (
        "abi",
        &[
            "chan",
            "dev_uring",
            "server",
            "client",
            "embedded",
            "testing",
            "assemble",
            "fasthash",
        ],
    ),
    // The engine knows its transports only as `Transport`s: the one place
    // that names them is `assemble`, which the engine does not name either.
    (
        "chan",
        &[
            "dev_uring",
            "server",
            "client",
            "embedded",
            "testing",
            "assemble",
        ],
    ),
    // The ring names the engine, never the servers and clients over it.
    ("dev_uring", &["server", "client", "embedded", "testing"]),
    // Product code names no test support.
    ("server", &["embedded", "testing", "client"]),
    ("client.rs", &["embedded", "testing", "server"]),
    ("assemble.rs", &["server", "client", "embedded", "testing"]),
];

fn sources(p: &Path, out: &mut Vec<PathBuf>) {
    if p.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for e in entries {
            sources(&e, out);
        }
    } else if p.extension().is_some_and(|e| e == "rs") {
        out.push(p.to_path_buf());
    }
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Whether `code` (one line, comments removed) names module `m` as a path:
/// `m::…` where `m` starts a word, or `crate::m` / `super::m` as a whole
/// word (a `use crate::m;`).
fn names(code: &str, m: &str) -> bool {
    let mut from = 0;
    while let Some(i) = code[from..].find(m) {
        let at = from + i;
        from = at + m.len();
        let before = code[..at].chars().next_back();
        let after = &code[at + m.len()..];
        if before.is_some_and(is_ident) || after.starts_with(is_ident) {
            continue;
        }
        // A field or method of the same name (`self.server`, `.client()`)
        // is not the module.
        if before == Some('.') {
            continue;
        }
        let prefix = code[..at].trim_end();
        if after.starts_with("::") || prefix.ends_with("crate::") || prefix.ends_with("super::") {
            return true;
        }
    }
    false
}

/// The line without its `//` comment (the sources put no `//` in strings
/// on lines that name modules).
fn code(line: &str) -> &str {
    line.find("//").map_or(line, |i| &line[..i])
}

/// Every `(file, line number, line)` under `rel` that names one of `banned`.
fn violations(src: &Path, rel: &str, banned: &[&str]) -> Vec<String> {
    let mut files = Vec::new();
    sources(&src.join(rel), &mut files);
    assert!(!files.is_empty(), "no sources under src/{rel}");
    let mut found = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for (n, line) in text.lines().enumerate() {
            let c = code(line);
            for m in banned {
                if names(c, m) {
                    found.push(format!(
                        "{}:{}: names `{m}`: {}",
                        f.strip_prefix(src).unwrap().display(),
                        n + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    found
}

#[test]
fn lower_layers_name_no_upper_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    for (rel, banned) in RULES {
        all.extend(violations(&src, rel, banned));
    }
    assert!(
        all.is_empty(),
        "layer rules (docs/DESIGN.md, Layers) broken:\n{}",
        all.join("\n")
    );
}

#[test]
fn the_checker_sees_a_path() {
    assert!(names("use crate::dev_uring::RingLink;", "dev_uring"));
    assert!(names("use crate::dev_uring;", "dev_uring"));
    assert!(names("    dev_uring::cmd_area(0, 0, 0)", "dev_uring"));
    assert!(names("use super::server::Dispatcher;", "server"));
    assert!(!names("let server = 1;", "server"));
    assert!(!names("self.server.flags", "server"));
    assert!(!names("use crate::chan::client_mem::X;", "client"));
    assert!(!names(code("x(); // see crate::assemble"), "assemble"));
}
