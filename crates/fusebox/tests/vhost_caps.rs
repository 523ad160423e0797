//! What each of root's capabilities is worth to a guest caller through
//! the fusebox binary over a real vhost-user socket, with the guest's root
//! squashed onto host uid 65534 (`--translate-uid/--translate-gid
//! squash-guest:0:65534:1`, `--sandbox none`) and guest 4000 translated
//! to host root: one probe per capability, by each caller, and what it
//! left on the host. Capabilities follow the host uid: the guest's root
//! keeps none (but the file owner's group and setgid change, which the
//! guest kernel already checked), host root keeps root's.
//!
//! `side_by_side_with_virtiofsd` (ignored: CI does not install
//! virtiofsd) runs the same probes against `$VIRTIOFSD` (default
//! `~/.cargo/bin/virtiofsd`) and prints both as the table in
//! docs/SECURITY.md.

use fuse_core::abi::{fattr, init, SetattrIn, ROOT_ID};
use fuse_core::client::Client;
use fuse_core::Errno;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use virtio_fs::testing::frontend::FrontendConfig;

mod vhost_support;

const ARGS: &[&str] = &[
    "--translate-uid",
    "squash-guest:0:65534:1",
    "--translate-uid",
    "guest:4000:0:1",
    "--translate-gid",
    "squash-guest:0:65534:1",
    "--translate-gid",
    "guest:4000:0:1",
    "--sandbox",
    "none",
    "--xattr",
];

/// Guest root, host 65534; guest 4000, host root.
const CALLERS: [(&str, u32); 2] = [
    ("guest root as host 65534", 0),
    ("guest 4000 as host 0", 4000),
];

fn set_mode(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn chown(p: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), Some(gid)).unwrap();
}

/// The share as each probe finds it (the share's root stays root's,
/// 0755): `pub` (0777), `theirs` (1000's, 0600), `closed/in` (in a 0700
/// directory of 1000's), `sticky/theirs` (1000's, in a 1777 directory),
/// `mine` (65534's), `team` (65534:65531) and `suid` (65534's, 04755).
fn prepare(share: &Path) {
    let file = |name: &str, uid, gid, mode| {
        std::fs::write(share.join(name), b"secret").unwrap();
        chown(&share.join(name), uid, gid);
        set_mode(&share.join(name), mode);
    };
    let dir = |name: &str, uid, mode| {
        std::fs::create_dir(share.join(name)).unwrap();
        chown(&share.join(name), uid, uid);
        set_mode(&share.join(name), mode);
    };
    dir("pub", 0, 0o777);
    dir("closed", 1000, 0o700);
    dir("sticky", 0, 0o1777);
    file("theirs", 1000, 1000, 0o600);
    file("closed/in", 1000, 1000, 0o644);
    file("sticky/theirs", 1000, 1000, 0o644);
    file("mine", 65534, 65534, 0o644);
    file("team", 65534, 65531, 0o644);
    file("suid", 65534, 65534, 0o4755);
}

fn name(r: Result<(), Errno>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(Errno(libc::EPERM)) => "EPERM".into(),
        Err(Errno(libc::EACCES)) => "EACCES".into(),
        Err(Errno(e)) => format!("errno {e}"),
    }
}

fn setattr(c: &Client, node: u64, sa: SetattrIn) -> Result<(), Errno> {
    c.setattr(node, &sa).map(drop)
}

fn mode_of(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

/// One probe per row: (capability, what is tried, answer and what the
/// host shows after).
fn probe(c: &Client, share: &Path) -> Vec<(&'static str, &'static str, String)> {
    let node = |parent: u64, n: &str| c.lookup(parent, n.as_bytes()).map(|e| e.nodeid);
    let root_node = |n: &str| node(ROOT_ID, n).unwrap();
    let exists = |n: &str| std::fs::symlink_metadata(share.join(n)).is_ok();
    let mut rows = Vec::new();
    let pubd = root_node("pub");
    for (what, kind, rdev, n) in [
        ("MKNOD block device 8:0", libc::S_IFBLK, 8 << 8, "pub/sda"),
        (
            "MKNOD char device 1:3",
            libc::S_IFCHR,
            (1 << 8) | 3,
            "pub/null",
        ),
    ] {
        let r = c.mknod(pubd, &n.as_bytes()[4..], kind | 0o666, rdev, 0);
        let left = std::fs::symlink_metadata(share.join(n))
            .is_ok_and(|m| m.file_type().is_block_device() || m.file_type().is_char_device());
        let left = if left { ", node left" } else { "" };
        rows.push(("MKNOD", what, format!("{}{left}", name(r.map(drop)))));
    }
    let r = c.mknod(pubd, b"fifo", libc::S_IFIFO | 0o644, 0, 0);
    rows.push(("(none)", "MKNOD fifo in a 0777 dir", name(r.map(drop))));
    let r = c.mknod(ROOT_ID, b"fifo", libc::S_IFIFO | 0o644, 0, 0);
    rows.push((
        "DAC_OVERRIDE",
        "MKNOD fifo in root's 0755 share root",
        name(r.map(drop)),
    ));
    let mine = root_node("mine");
    let theirs = root_node("theirs");
    let ids = |uid: Option<u32>, gid: Option<u32>| SetattrIn {
        valid: uid.map_or(0, |_| fattr::UID) | gid.map_or(0, |_| fattr::GID),
        uid: uid.unwrap_or(0),
        gid: gid.unwrap_or(0),
        ..Default::default()
    };
    let owner = |n: &str| {
        let m = std::fs::symlink_metadata(share.join(n)).unwrap();
        format!("{}:{}", m.uid(), m.gid())
    };
    let r = setattr(c, mine, ids(Some(1000), None));
    rows.push((
        "CHOWN",
        "chown 65534's file to uid 1000",
        format!("{}, {}", name(r), owner("mine")),
    ));
    let r = setattr(c, theirs, ids(None, Some(65534)));
    rows.push((
        "CHOWN",
        "chgrp 1000's file to 65534",
        format!("{}, {}", name(r), owner("theirs")),
    ));
    let r = setattr(c, mine, ids(None, Some(65531)));
    rows.push((
        "CHOWN",
        "chgrp 65534's file to 65531",
        format!("{}, {}", name(r), owner("mine")),
    ));
    let mode = |m| SetattrIn {
        valid: fattr::MODE,
        mode: m,
        ..Default::default()
    };
    let r = setattr(c, theirs, mode(0o666));
    rows.push((
        "FOWNER",
        "chmod 1000's file",
        format!("{}, {:o}", name(r), mode_of(&share.join("theirs"))),
    ));
    let r = setattr(c, root_node("team"), mode(0o2755));
    rows.push((
        "FSETID",
        "chmod g+s 65534:65531's file",
        format!("{}, {:o}", name(r), mode_of(&share.join("team"))),
    ));
    let times = SetattrIn {
        valid: fattr::ATIME | fattr::MTIME,
        atime: 1,
        mtime: 1,
        ..Default::default()
    };
    let r = setattr(c, theirs, times);
    rows.push(("FOWNER", "utimes (explicit) on 1000's file", name(r)));
    let r = c.unlink(root_node("sticky"), b"theirs");
    let gone = if exists("sticky/theirs") {
        ""
    } else {
        ", removed"
    };
    rows.push((
        "FOWNER",
        "unlink 1000's file in a sticky dir",
        format!("{}{gone}", name(r)),
    ));
    let r = c.open(theirs, libc::O_RDONLY as u32).map(|o| {
        let _ = c.release(theirs, o.fh, 0);
    });
    rows.push(("DAC_OVERRIDE", "open 1000's 0600 file", name(r)));
    let r = node(root_node("closed"), "in").map(drop);
    rows.push(("DAC_READ_SEARCH", "lookup in 1000's 0700 dir", name(r)));
    let r = c.setxattr(mine, b"trusted.probe", b"v", 0);
    rows.push(("SYS_ADMIN", "setxattr trusted.*", name(r)));
    // A v2 security.capability: effective, CAP_NET_RAW permitted.
    let mut caps = [0u8; 20];
    caps[..4].copy_from_slice(&0x0200_0001u32.to_le_bytes());
    caps[4..8].copy_from_slice(&(1u32 << 13).to_le_bytes());
    let r = c.setxattr(mine, b"security.capability", &caps, 0);
    rows.push(("SETFCAP", "setxattr security.capability", name(r)));
    let suid = root_node("suid");
    let r = c
        .open(suid, libc::O_RDWR as u32)
        .and_then(|o| {
            let w = c.write(suid, o.fh, 0, b"x", 0).map(drop);
            let _ = c.release(suid, o.fh, 0);
            w
        })
        .map(drop);
    rows.push((
        "FSETID",
        "WRITE to its own 04755 file",
        format!("{}, {:o}", name(r), mode_of(&share.join("suid"))),
    ));
    rows
}

/// The probes of `bin` for each caller, each on a fresh share.
fn run(
    bin: &Path,
    tag: &str,
    cfg: &FrontendConfig,
) -> Vec<Vec<(&'static str, &'static str, String)>> {
    CALLERS
        .iter()
        .map(|&(_, uid)| {
            let (d, fe) =
                vhost_support::start_bin(bin, &format!("caps-{tag}-{uid}"), ARGS, cfg, prepare);
            probe(&fe.client().as_user(uid, uid), &d.share())
        })
        .collect()
}

#[test]
fn a_squashed_guest_root_keeps_no_capability_host_root_keeps_roots() {
    let got = run(
        Path::new(env!("CARGO_BIN_EXE_fusebox")),
        "fusebox",
        &FrontendConfig::default(),
    );
    let answers = |rows: &Vec<(&str, &str, String)>| -> Vec<String> {
        rows.iter().map(|r| r.2.clone()).collect()
    };
    assert_eq!(
        answers(&got[0]),
        [
            "EPERM",
            "EPERM",
            "ok",
            "EACCES",
            "EPERM, 65534:65534",
            "EPERM, 1000:1000",
            // The owner's group change the guest kernel allowed.
            "ok, 65534:65531",
            "EPERM, 600",
            // The owner's setgid the guest kernel allowed.
            "ok, 2755",
            "EPERM",
            "EPERM",
            "EACCES",
            "EACCES",
            "EPERM",
            "EPERM",
            "ok, 755",
        ],
        "{:#?}",
        got[0]
    );
    assert_eq!(
        answers(&got[1]),
        [
            "ok, node left",
            "ok, node left",
            "ok",
            "ok",
            "ok, 1000:65534",
            "ok, 1000:65534",
            "ok, 1000:65531",
            "ok, 666",
            "ok, 2755",
            "ok",
            "ok, removed",
            "ok",
            "ok",
            "ok",
            "ok",
            "ok, 4755",
        ],
        "{:#?}",
        got[1]
    );
}

#[test]
#[ignore = "needs virtiofsd: run by hand to compare (docs/SECURITY.md's table)"]
fn side_by_side_with_virtiofsd() {
    let virtiofsd = std::env::var_os("VIRTIOFSD").map_or_else(
        || PathBuf::from(std::env::var("HOME").unwrap()).join(".cargo/bin/virtiofsd"),
        PathBuf::from,
    );
    let plain = FrontendConfig::default();
    // A guest kernel of Linux 6.3 on offers FUSE_CREATE_SUPP_GROUP.
    let groups = FrontendConfig {
        offer_flags: init::CREATE_SUPP_GROUP,
        ..FrontendConfig::default()
    };
    let fusebox = Path::new(env!("CARGO_BIN_EXE_fusebox"));
    let columns = [
        ("fusebox", run(fusebox, "fb", &plain)),
        ("virtiofsd", run(&virtiofsd, "vd", &plain)),
        (
            "virtiofsd, guest offers CREATE_SUPP_GROUP",
            run(&virtiofsd, "vds", &groups),
        ),
    ];
    for (i, (who, _)) in CALLERS.iter().enumerate() {
        let heads: Vec<&str> = columns.iter().map(|c| c.0).collect();
        println!("\n{who}:\n| capability | probe | {} |", heads.join(" | "));
        println!("| --- | --- |{}", " --- |".repeat(columns.len()));
        for (r, row) in columns[0].1[i].iter().enumerate() {
            let cells: Vec<&str> = columns.iter().map(|c| c.1[i][r].2.as_str()).collect();
            println!("| {} | {} | {} |", row.0, row.1, cells.join(" | "));
        }
    }
}
