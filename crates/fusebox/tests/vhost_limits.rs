//! The daemon's fds as an operator starts it: from a shell whose soft
//! RLIMIT_NOFILE is the common 1,024, a guest (the engine as frontend)
//! looks up and opens 10,000 files. fusebox raises the soft limit as
//! virtiofsd does and holds inodes by file handle, so every lookup is
//! served; where even the hard limit is 1,024 it answers EMFILE for opens
//! beyond what it can hold and keeps enough fds back to go on receiving
//! the VMM's fds.

use fuse_core::abi::ROOT_ID;
use fuse_core::Errno;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use virtio_fs::testing::frontend::{FrontendConfig, VhostFrontend};

mod vhost_support;

const FILES: usize = 10_000;

struct Setup {
    base: PathBuf,
    child: Child,
    /// The binary the child runs, when it runs as another user.
    _bin: Option<vhost_support::FuseboxCopy>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

/// Starts fusebox on a share of `FILES` files with RLIMIT_NOFILE
/// `soft`:`hard` (None: the hard limit as it is).
fn start(tag: &str, soft: u64, hard: Option<u64>) -> (Setup, PathBuf) {
    let base = std::env::temp_dir().join(format!("fusebox-nofile-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let share = base.join("share");
    std::fs::create_dir_all(&share).unwrap();
    for i in 0..FILES {
        std::fs::write(share.join(format!("f{i}")), format!("file {i}")).unwrap();
    }
    let sock = base.join("vfs.sock");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fusebox"));
    cmd.arg("--socket-path")
        .arg(&sock)
        .arg("--shared-dir")
        .arg(&share)
        .stderr(Stdio::null());
    // SAFETY: the closure only calls getrlimit/setrlimit (async-signal
    // safe) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let mut r = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
            r.rlim_cur = soft;
            if let Some(h) = hard {
                r.rlim_max = h;
            }
            if libc::setrlimit(libc::RLIMIT_NOFILE, &r) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    let child = cmd.spawn().unwrap();
    let t = Instant::now();
    while !sock.exists() {
        assert!(t.elapsed() < Duration::from_secs(10), "no socket");
        std::thread::sleep(Duration::from_millis(10));
    }
    (
        Setup {
            base,
            child,
            _bin: None,
        },
        sock,
    )
}

fn lookup_all(fe: &VhostFrontend) -> Vec<u64> {
    let c = fe.client();
    (0..FILES)
        .map(|i| match c.lookup(ROOT_ID, format!("f{i}").as_bytes()) {
            Ok(e) => e.nodeid,
            Err(e) => panic!("LOOKUP of file {i} of {FILES}: {e:?}"),
        })
        .collect()
}

fn exits(mut s: Setup) {
    let t = Instant::now();
    loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            assert!(st.success(), "{st:?}");
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "daemon did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn soft_limit_of(pid: u32) -> u64 {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    line.split_whitespace().nth(3).unwrap().parse().unwrap()
}

#[test]
fn ten_thousand_files_are_served_from_a_soft_fd_limit_of_1024() {
    let (s, sock) = start("soft", 1024, None);
    let fe = VhostFrontend::connect(&sock, &FrontendConfig::default()).unwrap();
    // The serving process (the namespace sandbox's child) raised its limit.
    let served_by = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|st| st.split(' ').nth(3) == Some(&s.child.id().to_string()))
        })
        .unwrap_or(s.child.id());
    assert!(
        soft_limit_of(served_by) > 1024,
        "the soft limit was not raised"
    );
    let c = fe.client();
    let nodes = lookup_all(&fe);
    for (i, &n) in nodes.iter().enumerate() {
        c.getattr(n, None)
            .unwrap_or_else(|e| panic!("GETATTR of file {i}: {e:?}"));
    }
    // Each file opened, read and closed in turn.
    for (i, &n) in nodes.iter().enumerate() {
        let fh = c.open(n, libc::O_RDONLY as u32).unwrap().fh;
        assert_eq!(
            c.read(n, fh, 0, 64).unwrap(),
            format!("file {i}").as_bytes()
        );
        c.release(n, fh, 0).unwrap();
    }
    drop(fe);
    exits(s);
}

#[test]
fn at_a_hard_fd_limit_of_1024_opens_beyond_it_get_emfile_and_the_vmm_is_still_served() {
    let (s, sock) = start("hard", 1024, Some(1024));
    let fe = VhostFrontend::connect(&sock, &FrontendConfig::default()).unwrap();
    let c = fe.client();
    // Inodes by file handle: all 10,000 lookups are served.
    let nodes = lookup_all(&fe);
    // Holding every file open: the daemon refuses with EMFILE once its
    // share of the fds is gone, and only with EMFILE.
    let mut open = Vec::new();
    for (i, &n) in nodes.iter().enumerate() {
        match c.open(n, libc::O_RDONLY as u32) {
            Ok(o) => open.push((n, o.fh)),
            Err(e) => assert_eq!(e, Errno::EMFILE, "OPEN of file {i}"),
        }
    }
    println!(
        "nofile: {} of {FILES} held open at a hard limit of 1024",
        open.len()
    );
    assert!(open.len() >= 100, "only {} opened", open.len());
    assert!(open.len() < FILES);
    // The connection can still take the VMM's fds, and requests.
    fe.resend_vring_calls()
        .expect("the daemon could not receive an fd at its limit");
    assert!(c.getattr(ROOT_ID, None).is_ok());
    // Closing gives the fds back.
    for (n, fh) in open.drain(..) {
        c.release(n, fh, 0).unwrap();
    }
    for &n in nodes.iter().take(200) {
        let fh = c.open(n, libc::O_RDONLY as u32).unwrap().fh;
        c.release(n, fh, 0).unwrap();
    }
    drop(fe);
    exits(s);
}

#[test]
fn a_daemon_that_cannot_open_file_handles_holds_fds_instead() {
    // As uid 65534 the daemon lacks CAP_DAC_READ_SEARCH: the file handles
    // it could make it could not open again. Each inode it enters keeps
    // its fd then, and every LOOKUP that got an inode can be used.
    let base = std::env::temp_dir().join(format!("fusebox-nofh-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let share = base.join("share");
    std::fs::create_dir_all(&share).unwrap();
    for i in 0..200 {
        std::fs::write(share.join(format!("f{i}")), b"x").unwrap();
    }
    let chown = |p: &std::path::Path| {
        std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
    };
    chown(&base);
    chown(&share);
    let sock = base.join("vfs.sock");
    let bin = vhost_support::FuseboxCopy::new("nofh");
    let mut cmd = Command::new(bin.path());
    cmd.arg("--socket-path")
        .arg(&sock)
        .arg("--shared-dir")
        .arg(&share)
        .args(["--sandbox", "none", "--seccomp", "none"])
        .stderr(Stdio::null());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let r = libc::rlimit {
                rlim_cur: 256,
                rlim_max: 256,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &r) < 0
                || libc::setgroups(0, std::ptr::null()) < 0
                || libc::setgid(65534) < 0
                || libc::setuid(65534) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    let child = cmd.spawn().unwrap();
    let s = Setup {
        base: base.clone(),
        child,
        _bin: Some(bin),
    };
    let t = Instant::now();
    while !sock.exists() {
        assert!(t.elapsed() < Duration::from_secs(10), "no socket");
        std::thread::sleep(Duration::from_millis(10));
    }
    let fe = VhostFrontend::connect(&sock, &FrontendConfig::default()).unwrap();
    let c = fe.client();
    let (mut served, mut refused) = (0, 0);
    for i in 0..200 {
        match c.lookup(ROOT_ID, format!("f{i}").as_bytes()) {
            Ok(e) => {
                c.getattr(e.nodeid, None)
                    .unwrap_or_else(|err| panic!("GETATTR of looked-up file {i}: {err:?}"));
                served += 1;
            }
            Err(e) => {
                assert_eq!(e, Errno::EMFILE, "LOOKUP of file {i}");
                refused += 1;
            }
        }
    }
    println!("no file handles: {served} served, {refused} refused with EMFILE");
    assert!(served >= 60, "only {served} served");
    drop(fe);
    exits(s);
}
