//! The vhost-user daemon started by an unprivileged user (no
//! capabilities, a supplementary group), as rootless setups run it: with
//! `--sandbox namespace` it makes a user namespace in which root is that
//! user and nothing else is mapped, so every request runs as the user; or,
//! with `--uid-map` / `--gid-map`, one that maps the user's subordinate
//! ranges, where requests run as their guest ids (the guest suite runs
//! unprivileged in CI too: `tests/guest/run.sh --as-user`).

use fuse_core::abi::ROOT_ID;
use fuse_core::Errno;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use virtio_fs::testing::frontend::{FrontendConfig, VhostFrontend};

mod vhost_support;

const NOBODY: u32 = 65534;

/// The test's directory, and the binary its daemon runs (both removed
/// when dropped).
struct Dir {
    path: PathBuf,
    _bin: Option<vhost_support::FuseboxCopy>,
}
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The serving process: the child of the one started.
fn server_pid(started: u32) -> u32 {
    let t = Instant::now();
    loop {
        if let Some(pid) = vhost_support::child_of(started) {
            return pid;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "no serving child");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let t = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the daemon did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts fusebox as `uid`:`gid`, with supplementary group 100 as most
/// users have some (setpriv(1): no capabilities), with `args` on a share
/// of theirs; the share, the socket and the daemon. The daemon runs a
/// copy of the binary that user can reach.
fn start_as(tag: &str, uid: u32, gid: u32, args: &[&str]) -> (Dir, PathBuf, PathBuf, Child) {
    let base = std::env::temp_dir().join(format!("fusebox-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let share = base.join("share");
    std::fs::create_dir_all(&share).unwrap();
    let bin = vhost_support::FuseboxCopy::new(tag);
    for p in [&base, &share] {
        std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
    }
    let sock = base.join("vfs.sock");
    let mut child = Command::new("setpriv")
        .args([
            format!("--reuid={uid}"),
            format!("--regid={gid}"),
            "--groups=100".into(),
            "--inh-caps=-all".into(),
            "--".into(),
        ])
        .arg(bin.path())
        .arg("--socket-path")
        .arg(&sock)
        .arg("--shared-dir")
        .arg(&share)
        .args(["--sandbox", "namespace", "--seccomp", "kill"])
        .args(args)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !sock.exists() {
        if let Some(s) = child.try_wait().unwrap() {
            panic!("fusebox exited {s:?} before listening");
        }
        assert!(t.elapsed() < Duration::from_secs(10), "no socket");
        std::thread::sleep(Duration::from_millis(10));
    }
    let dir = Dir {
        path: base,
        _bin: Some(bin),
    };
    (dir, share, sock, child)
}

#[test]
fn an_unprivileged_user_serves_from_a_user_namespace() {
    let (_dir, share, sock, mut child) = start_as("unpriv", NOBODY, NOBODY, &[]);
    let fe = VhostFrontend::connect(&sock, &FrontendConfig::default()).unwrap();
    let pid = server_pid(child.id());
    // Root in its own user namespace, which maps that root to nobody only.
    assert_ne!(
        std::fs::read_link(format!("/proc/{pid}/ns/user")).unwrap(),
        std::fs::read_link("/proc/self/ns/user").unwrap(),
        "a user namespace of its own"
    );
    let map = std::fs::read_to_string(format!("/proc/{pid}/uid_map")).unwrap();
    let fields: Vec<&str> = map.split_whitespace().collect();
    assert_eq!(fields, ["0", "65534", "1"], "uid_map: {map}");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(
        uid.split_whitespace().skip(1).all(|u| u == "65534"),
        "host ids of the serving process: {uid}"
    );

    // Guest root makes a file: it is nobody's on the host.
    let c = fe.client();
    let (f, o) = c
        .create(ROOT_ID, b"by-guest-root", 0o644, libc::O_RDWR as u32, 0)
        .unwrap();
    c.write(f.nodeid, o.fh, 0, b"hello", 0).unwrap();
    c.release(f.nodeid, o.fh, 0).unwrap();
    let host = share.join("by-guest-root");
    assert_eq!(std::fs::read(&host).unwrap(), b"hello");
    let m = std::fs::metadata(&host).unwrap();
    assert_eq!((m.uid(), m.gid()), (NOBODY, NOBODY));
    // ... and the guest sees it as its root's.
    let a = c.getattr(f.nodeid, None).unwrap().attr;
    assert_eq!((a.uid, a.gid), (0, 0));
    // Any other guest id: no other id is mapped, so it acts as the user
    // too (and the guest sees the file as root's, the user's inside).
    let u = c.as_user(1000, 1000);
    let (g, o) = u
        .create(ROOT_ID, b"by-guest-user", 0o644, libc::O_RDWR as u32, 0)
        .unwrap();
    u.release(g.nodeid, o.fh, 0).unwrap();
    let m = std::fs::metadata(share.join("by-guest-user")).unwrap();
    assert_eq!((m.uid(), m.gid()), (NOBODY, NOBODY));
    let a = u.getattr(g.nodeid, None).unwrap().attr;
    assert_eq!((a.uid, a.gid), (0, 0));
    drop(fe);
    let s = wait_exit(&mut child);
    assert!(s.success(), "{s:?}");
}

/// The `tests` user's uid and gid, and the first of its subordinate uids
/// and gids (scripts/test.sh makes them).
fn tests_user() -> (u32, u32, u32, u32) {
    let pw = std::fs::read_to_string("/etc/passwd").unwrap();
    let f: Vec<&str> = pw
        .lines()
        .find(|l| l.starts_with("tests:"))
        .expect("no user `tests` (scripts/test.sh makes it)")
        .split(':')
        .collect();
    let sub = |file: &str| -> u32 {
        let t = std::fs::read_to_string(file).unwrap_or_default();
        let l = t
            .lines()
            .find(|l| l.starts_with("tests:"))
            .unwrap_or_else(|| panic!("no `tests` range in {file} (scripts/test.sh adds one)"));
        let v: Vec<&str> = l.split(':').collect();
        assert!(v[2].parse::<u32>().unwrap() >= 2000, "{file}: {l}");
        v[1].parse().unwrap()
    };
    (
        f[2].parse().unwrap(),
        f[3].parse().unwrap(),
        sub("/etc/subuid"),
        sub("/etc/subgid"),
    )
}

#[test]
fn uid_and_gid_maps_give_guest_ids_the_users_subordinate_ranges() {
    assert!(
        std::path::Path::new("/usr/bin/newuidmap").exists(),
        "newuidmap is missing (apt-get install uidmap; scripts/test.sh does)"
    );
    let (uid, gid, subuid, subgid) = tests_user();
    let maps = [
        format!("--uid-map=:0:{uid}:1:"),
        format!("--uid-map=:1:{subuid}:2000:"),
        format!("--gid-map=:0:{gid}:1:"),
        format!("--gid-map=:1:{subgid}:2000:"),
    ];
    let args: Vec<&str> = maps.iter().map(String::as_str).collect();
    let (_dir, share, sock, mut child) = start_as("submap", uid, gid, &args);
    // Guest users other than root may create files there too.
    std::fs::set_permissions(&share, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let fe = VhostFrontend::connect(&sock, &FrontendConfig::default()).unwrap();
    let pid = server_pid(child.id());
    let map = std::fs::read_to_string(format!("/proc/{pid}/uid_map")).unwrap();
    let lines: Vec<Vec<String>> = map
        .lines()
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect();
    assert_eq!(
        lines,
        [
            ["0", &uid.to_string(), "1"].map(String::from).to_vec(),
            ["1", &subuid.to_string(), "2000"]
                .map(String::from)
                .to_vec(),
        ],
        "uid_map: {map}"
    );
    let c = fe.client();
    // Guest root: the user; guest 1000:1000: the user's subordinate ids.
    for (who, g_uid, host) in [
        ("root", 0, (uid, gid)),
        ("user", 1000, (subuid + 999, subgid + 999)),
    ] {
        let c = c.as_user(g_uid, g_uid);
        let (f, o) = c
            .create(ROOT_ID, who.as_bytes(), 0o644, libc::O_RDWR as u32, 0)
            .unwrap();
        c.release(f.nodeid, o.fh, 0).unwrap();
        let m = std::fs::metadata(share.join(who)).unwrap();
        assert_eq!((m.uid(), m.gid()), host, "{who}");
        let a = c.getattr(f.nodeid, None).unwrap().attr;
        assert_eq!((a.uid, a.gid), (g_uid, g_uid), "{who} as the guest sees it");
    }
    // Past the mapped range: refused.
    let e = c
        .as_user(5000, 5000)
        .create(ROOT_ID, b"unmapped", 0o644, libc::O_RDWR as u32, 0)
        .unwrap_err();
    assert_eq!(e, Errno::EPERM);
    drop(fe);
    let s = wait_exit(&mut child);
    assert!(s.success(), "{s:?}");
}

#[test]
fn maps_without_a_user_namespace_are_an_error_at_start() {
    let base = std::env::temp_dir().join(format!("fusebox-mapsroot-{}", std::process::id()));
    std::fs::create_dir_all(base.join("share")).unwrap();
    let _dir = Dir {
        path: base.clone(),
        _bin: None,
    };
    for sandbox in ["namespace", "none"] {
        let out = Command::new(env!("CARGO_BIN_EXE_fusebox"))
            .arg("--socket-path")
            .arg(base.join("s"))
            .arg("--shared-dir")
            .arg(base.join("share"))
            .args(["--sandbox", sandbox, "--uid-map=:0:1000:1:"])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{sandbox}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--uid-map and --gid-map need --sandbox namespace"),
            "{sandbox}: {err}"
        );
    }
}

#[test]
fn uid_ranges_with_the_users_own_gid_keep_its_groups() {
    // No --gid-map: the gid map is the user's own gid alone, written with
    // setgroups denied, so no call may change the groups (each would fail
    // with EPERM): they keep the user's.
    let (uid, gid, subuid, _) = tests_user();
    let maps = [
        format!("--uid-map=:0:{uid}:1:"),
        format!("--uid-map=:1:{subuid}:2000:"),
    ];
    let args: Vec<&str> = maps.iter().map(String::as_str).collect();
    let (_dir, share, sock, mut child) = start_as("uidonly", uid, gid, &args);
    std::fs::set_permissions(&share, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let fe = VhostFrontend::connect(&sock, &FrontendConfig::default()).unwrap();
    let c = fe.client();
    for (who, g_uid, host_uid) in [("root", 0, uid), ("user", 1000, subuid + 999)] {
        let c = c.as_user(g_uid, 0);
        let (f, o) = c
            .create(ROOT_ID, who.as_bytes(), 0o644, libc::O_RDWR as u32, 0)
            .unwrap();
        c.write(f.nodeid, o.fh, 0, b"x", 0).unwrap();
        c.release(f.nodeid, o.fh, 0).unwrap();
        let m = std::fs::metadata(share.join(who)).unwrap();
        assert_eq!((m.uid(), m.gid()), (host_uid, gid), "{who}");
    }
    drop(fe);
    let s = wait_exit(&mut child);
    assert!(s.success(), "{s:?}");
}
