//! The workspace's crate graph: each crate depends on exactly the crates
//! of fusebox docs/DESIGN.md's table names, so dependencies point one way
//! (fuse-core at the bottom, the binary at the top) and no crate reaches
//! around the layer it sits on. Cargo refuses cycles; this refuses an
//! edge the design does not have. Test-only edges are listed apart, and
//! DESIGN.md's table must say the same.

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
    ("virtio-fs", &["fuse-core", "host-io"], &["passthrough"]),
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

/// What kind of dependency a manifest section declares, if any:
/// `[dependencies]`, `[build-dependencies]`, `[target.….dependencies]` and
/// `[dependencies.NAME]` are normal (a build script is the crate too),
/// `[dev-dependencies]` and its target and table forms are dev.
fn kind(header: &str) -> Option<Kind> {
    if header.contains("dev-dependencies") {
        Some(Kind::Dev)
    } else if header.contains("dependencies") {
        Some(Kind::Normal)
    } else {
        None
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    Normal,
    Dev,
}

/// The fusebox crates a manifest depends on, by kind: every fusebox crate
/// name written anywhere in a dependency section (its header, a key,
/// quoted or not, a `package = "…"` rename, a path) counts, so no form of
/// the manifest hides an edge.
fn deps(toml: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut normal, mut dev) = (BTreeSet::new(), BTreeSet::new());
    let mut inside = None;
    for line in toml.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = kind(line);
        }
        let Some(k) = inside else { continue };
        let words = line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'));
        for w in words.filter(|w| CRATES.contains(w)) {
            match k {
                Kind::Normal => normal.insert(w.to_string()),
                Kind::Dev => dev.insert(w.to_string()),
            };
        }
    }
    (normal, dev)
}

#[test]
fn every_crate_depends_on_what_the_design_says_and_nothing_else() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    for (name, want, test_only) in GRAPH {
        let toml = std::fs::read_to_string(root.join(name).join("Cargo.toml")).unwrap();
        assert!(toml.contains(&format!("name = \"{name}\"")), "{name}");
        let (normal, mut dev) = deps(&toml);
        let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
        assert_eq!(normal, want, "{name}'s dependencies");
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

/// docs/DESIGN.md's crate table (`| `name` | what | depends on |`) says
/// what `GRAPH` says.
#[test]
fn the_design_table_is_the_graph() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let design = std::fs::read_to_string(root.join("docs/DESIGN.md")).unwrap();
    let mut rows = 0;
    for line in design.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let [_, name, _, on, _] = cells[..] else {
            continue;
        };
        let Some((_, want, _)) = GRAPH.iter().find(|g| name == format!("`{}`", g.0)) else {
            continue;
        };
        let on: BTreeSet<&str> = if on == "none" {
            BTreeSet::new()
        } else if on == "all" {
            CRATES
                .iter()
                .copied()
                .filter(|c| format!("`{c}`") != name)
                .collect()
        } else {
            on.split(',').map(str::trim).collect()
        };
        assert_eq!(
            on,
            want.iter().copied().collect(),
            "DESIGN.md's row for {name}"
        );
        rows += 1;
    }
    assert_eq!(rows, GRAPH.len(), "DESIGN.md has one row per crate");
}

#[test]
fn the_manifest_reader_sees_every_form() {
    let toml = "[package]\nname = \"passthrough\"\n\n[features]\nx = [\"virtio-fs/x\"]\n\n\
[dependencies]\nfuse-core.workspace = true\nhost-io = { workspace = true }\nlibc = \"1\"\n\
\"virtio-fs\" = { path = \"v\" }\npt = { package = \"host-mount\" }\n\n\
[target.'cfg(unix)'.dependencies]\nfusebox = \"1\"\n\n[build-dependencies.fuse-core]\npath = \"f\"\n\n\
[dev-dependencies]\npassthrough = { path = \".\" }\n";
    let (normal, dev) = deps(toml);
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(
        normal,
        set(&["fuse-core", "host-io", "virtio-fs", "host-mount", "fusebox"])
    );
    assert_eq!(dev, set(&["passthrough"]));
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
