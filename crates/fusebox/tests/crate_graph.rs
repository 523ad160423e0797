//! The workspace's crate graph: each crate depends on exactly the crates
//! of fusebox docs/DESIGN.md's table names, so dependencies point one way
//! (fuse-core at the bottom, the binary at the top) and no crate reaches
//! around the layer it sits on. Cargo refuses cycles; this refuses an
//! edge the design does not have. Test-only edges are listed apart.

use std::collections::BTreeSet;
use std::path::Path;

/// fusebox's own crates.
const CRATES: [&str; 6] = [
    "fuse-core",
    "host-io",
    "passthrough",
    "host-mount",
    "virtio-fs",
    "fusebox",
];

/// What each crate may depend on: (crate, `[dependencies]`,
/// `[dev-dependencies]` besides those and itself).
const GRAPH: [(&str, &[&str], &[&str]); 6] = [
    ("fuse-core", &[], &[]),
    ("host-io", &["fuse-core"], &[]),
    ("passthrough", &["fuse-core", "host-io"], &["host-mount"]),
    ("host-mount", &["fuse-core", "host-io"], &[]),
    ("virtio-fs", &["fuse-core"], &["passthrough"]),
    (
        "fusebox",
        &[
            "fuse-core",
            "host-io",
            "passthrough",
            "host-mount",
            "virtio-fs",
        ],
        &[],
    ),
];

/// The fusebox crates named in `section` of the manifest `toml` (a key at
/// the start of a line: `name.workspace = true`, `name = { … }`).
fn deps(toml: &str, section: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut inside = false;
    for line in toml.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == section;
            continue;
        }
        if !inside {
            continue;
        }
        let key = line.split(['=', '.', ' ']).next().unwrap_or("");
        if CRATES.contains(&key) {
            out.insert(key.to_string());
        }
    }
    out
}

#[test]
fn every_crate_depends_on_what_the_design_says_and_nothing_else() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    for (name, want, test_only) in GRAPH {
        let toml = std::fs::read_to_string(root.join(name).join("Cargo.toml")).unwrap();
        assert!(toml.contains(&format!("name = \"{name}\"")), "{name}");
        let normal = deps(&toml, "[dependencies]");
        let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
        assert_eq!(normal, want, "{name}'s [dependencies]");
        let mut dev = deps(&toml, "[dev-dependencies]");
        dev.remove(name);
        for d in &dev {
            assert!(
                want.contains(d) || test_only.contains(&d.as_str()),
                "{name} tests with {d}"
            );
        }
        found.push(name);
    }
    // Every crate of the workspace is in the table.
    let members: BTreeSet<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let table: BTreeSet<String> = found.iter().map(|s| s.to_string()).collect();
    assert_eq!(members, table, "crates/ holds a crate the table lacks");
}

#[test]
fn the_manifest_reader_sees_both_forms_and_only_its_section() {
    let toml = "[package]\nname = \"x\"\n\n[dependencies]\nfuse-core.workspace = true\nhost-io = { workspace = true }\nlibc = \"1\"\n\n[dev-dependencies]\npassthrough = { path = \".\" }\n";
    let normal = deps(toml, "[dependencies]");
    assert_eq!(
        normal,
        BTreeSet::from(["fuse-core".to_string(), "host-io".to_string()])
    );
    let dev = deps(toml, "[dev-dependencies]");
    assert_eq!(dev, BTreeSet::from(["passthrough".to_string()]));
}

/// The passthrough never names the host mount, nor the host mount the
/// passthrough, outside tests (a dev-dependency would let them).
#[test]
fn the_passthrough_and_the_host_mount_do_not_name_each_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for (krate, other) in [
        ("passthrough", "host_mount"),
        ("host-mount", "passthrough::"),
    ] {
        let mut stack = vec![root.join(krate).join("src")];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    let text = std::fs::read_to_string(&p).unwrap();
                    for (i, line) in text.lines().enumerate() {
                        let code = line.split("//").next().unwrap_or("");
                        assert!(
                            !code.contains(other),
                            "{}:{}: names {other}",
                            p.display(),
                            i + 1
                        );
                    }
                }
            }
        }
    }
}
