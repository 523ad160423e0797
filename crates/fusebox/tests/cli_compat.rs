//! virtiofsd's compatibility command line, run as the real binary: the
//! exact shape libvirt starts a daemon with when it does not know
//! `separate-options` (libvirt 9.0: `--fd=N -o source=DIR,cache=...,
//! sandbox=...,xattr,flock,posix_lock --thread-pool-size=N
//! --rlimit-nofile=N -d`, commas of the path doubled) serves the directory
//! with its locks, and so does the separate-options shape later libvirt
//! builds (`--shared-dir DIR --cache never ...`); `--socket` and
//! `-f` still work; every malformed, unknown or unsupported item stops
//! the start with a message naming it; `--print-capabilities` is JSON
//! listing what works. `-o no_flock,no_posix_lock` (what a libvirt that
//! passes `-o` makes of `<lock posix='off' flock='off'/>`),
//! `no_readdirplus` and `no_killpriv_v2`
//! take those offers out of INIT. The parser's every case is unit-tested in
//! `src/compat.rs`.

use fuse_core::abi::{init, FileLock, ROOT_ID};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use virtio_fs::testing::frontend::{FrontendConfig, VhostFrontend};

const BIN: &str = env!("CARGO_BIN_EXE_fusebox");

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn base(tag: &str) -> Dir {
    let b = std::env::temp_dir().join(format!("fusebox-compat-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&b);
    std::fs::create_dir_all(&b).unwrap();
    Dir(b)
}

fn wait_exit(child: &mut Child) -> ExitStatus {
    let t = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if t.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("the daemon did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn connect(sock: &Path, child: &mut Child, log: &Path) -> VhostFrontend {
    let t = Instant::now();
    loop {
        match VhostFrontend::connect(sock, &FrontendConfig::default()) {
            Ok(fe) => return fe,
            Err(e) => {
                if let Some(s) = child.try_wait().unwrap() {
                    panic!(
                        "fusebox exited ({s}): {}",
                        std::fs::read_to_string(log).unwrap_or_default()
                    );
                }
                assert!(t.elapsed() < Duration::from_secs(10), "{e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// Starts fusebox as libvirt does: `--fd=N` naming a socket listening on
/// `dir/vfs.sock`, which the daemon inherits, then `args`; stderr to
/// `dir/stderr`. Returns the daemon, a frontend connected to it, and the
/// log's path.
fn start_on_fd(dir: &Path, args: &[&str]) -> (Child, VhostFrontend, PathBuf) {
    let sock = dir.join("vfs.sock");
    let log = dir.join("stderr");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let fd = listener.as_raw_fd();
    let mut cmd = Command::new(BIN);
    cmd.arg(format!("--fd={fd}"))
        .args(args)
        .stderr(std::fs::File::create(&log).unwrap());
    // The listening socket is passed as libvirt does: inherited.
    inherit(&mut cmd, fd);
    let mut child = cmd.spawn().unwrap();
    drop(listener);
    let fe = connect(&sock, &mut child, &log);
    (child, fe, log)
}

/// Disconnects `fe`, checks the daemon then exits with success, and
/// returns what it logged.
fn ends_cleanly(fe: VhostFrontend, child: &mut Child, log: &Path) -> String {
    drop(fe);
    let status = wait_exit(child);
    let err = std::fs::read_to_string(log).unwrap();
    assert!(status.success(), "{status}: {err}");
    err
}

/// Has `cmd`'s process inherit `fd` (its close-on-exec flag cleared in
/// the child).
fn inherit(cmd: &mut Command, fd: i32) {
    // SAFETY: fcntl is async-signal-safe; the closure touches nothing else.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[test]
fn libvirts_command_line_starts_a_serving_daemon() {
    let d = base("libvirt");
    // A path with commas, one at its end: libvirt doubles each.
    let share = d.0.join("sh,are,");
    std::fs::create_dir_all(&share).unwrap();
    let escaped = share.to_str().unwrap().replace(',', ",,");
    let (mut child, fe, log) = start_on_fd(
        &d.0,
        &[
            "-o",
            &format!("source={escaped},cache=always,sandbox=chroot,xattr,flock,posix_lock"),
            "--thread-pool-size=2",
            "--rlimit-nofile=4096",
            "-d",
        ],
    );
    let c = fe.client();
    // Tests run as root: KILLPRIV_V2 is offered too.
    let offers = init::FLOCK_LOCKS
        | init::POSIX_LOCKS
        | init::DO_READDIRPLUS
        | init::READDIRPLUS_AUTO
        | init::HANDLE_KILLPRIV_V2;
    let flags = c.chan().negotiated().unwrap().flags;
    assert_eq!(flags & offers, offers, "{flags:#x}");
    let (f, o) = c
        .create(ROOT_ID, b"from-guest", 0o644, libc::O_RDWR as u32, 0)
        .unwrap();
    c.write(f.nodeid, o.fh, 0, b"hello", 0).unwrap();
    c.setxattr(f.nodeid, b"user.k", b"v", 0).unwrap();
    let wr = FileLock {
        start: 0,
        end: i64::MAX as u64,
        typ: libc::F_WRLCK as u32,
        pid: 1,
    };
    c.setlk(f.nodeid, o.fh, 7, wr, false).unwrap();
    c.setlk(f.nodeid, o.fh, 7, wr, true).unwrap();
    // The host sees the data, and both locks, on the file in the share.
    let host = share.join("from-guest");
    assert_eq!(std::fs::read(&host).unwrap(), b"hello");
    let hf = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&host)
        .unwrap();
    // SAFETY: a zeroed flock is a valid value of this plain C struct.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    // SAFETY: `fl` is a valid flock for the duration of the call.
    let r = unsafe { libc::fcntl(hf.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    assert_eq!(fl.l_type, libc::F_WRLCK as i16, "the guest's POSIX lock");
    // SAFETY: flock on an fd this test owns.
    let r = unsafe { libc::flock(hf.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(r, -1, "the guest's flock lock");
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EWOULDBLOCK)
    );
    c.release(f.nodeid, o.fh, 0).unwrap();
    let err = ends_cleanly(fe, &mut child, &log);
    assert_eq!(err.matches("-o is deprecated").count(), 1, "{err}");
    assert!(err.contains("-d is deprecated"), "{err}");
}

/// The command line a libvirt that reads the `separate-options` feature
/// builds for a daemon that advertises it (as fusebox does, and
/// virtiofsd 1.14):
/// `--shared-dir`, `--cache never` for `<cache mode='none'/>`, `--sandbox`,
/// `--xattr`, `--thread-pool-size=N`, `--rlimit-nofile=N`, `--log-level
/// debug` and `--uid-map=:inside:outside:count:` in session mode (not
/// here: this test runs as root, where a map is an error as in virtiofsd).
#[test]
fn newer_libvirts_separate_options_start_a_serving_daemon() {
    let d = base("libvirt-separate");
    let share = d.0.join("share");
    std::fs::create_dir_all(&share).unwrap();
    let (mut child, fe, log) = start_on_fd(
        &d.0,
        &[
            "--shared-dir",
            share.to_str().unwrap(),
            "--cache",
            "never",
            "--sandbox",
            "namespace",
            "--xattr",
            "--thread-pool-size=2",
            "--rlimit-nofile=4096",
            "--log-level",
            "debug",
        ],
    );
    let c = fe.client();
    let (f, o) = c
        .create(ROOT_ID, b"from-guest", 0o644, libc::O_RDWR as u32, 0)
        .unwrap();
    // --cache never: the guest's page cache is bypassed.
    assert_ne!(o.open_flags & fuse_core::abi::fopen::DIRECT_IO, 0);
    c.write(f.nodeid, o.fh, 0, b"hello", 0).unwrap();
    c.setxattr(f.nodeid, b"user.k", b"v", 0).unwrap();
    c.release(f.nodeid, o.fh, 0).unwrap();
    let host = share.join("from-guest");
    assert_eq!(std::fs::read(&host).unwrap(), b"hello");
    let err = ends_cleanly(fe, &mut child, &log);
    assert!(!err.contains("deprecated"), "{err}");
}

/// The flags of `pid`'s open (not O_PATH) fds on `path`'s inode.
fn open_flags(pid: u32, path: &Path) -> Vec<i32> {
    use std::os::unix::fs::MetadataExt;
    let want = std::fs::metadata(path).unwrap();
    let mut out = Vec::new();
    let proc = PathBuf::from(format!("/proc/{pid}"));
    for e in std::fs::read_dir(proc.join("fd")).unwrap().flatten() {
        let Ok(meta) = std::fs::metadata(e.path()) else {
            continue;
        };
        if (meta.dev(), meta.ino()) != (want.dev(), want.ino()) {
            continue;
        }
        let Ok(info) = std::fs::read_to_string(proc.join("fdinfo").join(e.file_name())) else {
            continue;
        };
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .map(|f| i32::from_str_radix(f.trim(), 8).unwrap())
            .unwrap();
        if flags & libc::O_PATH == 0 {
            out.push(flags);
        }
    }
    out
}

#[test]
fn locks_readdirplus_and_killpriv_left_out_of_init_when_asked() {
    let d = base("nolocks");
    let share = d.0.join("share");
    std::fs::create_dir_all(&share).unwrap();
    let sock = d.0.join("vfs.sock");
    let log = d.0.join("stderr");
    let mut child = Command::new(BIN)
        .arg("--socket-path")
        .arg(&sock)
        .arg("-o")
        .arg(format!(
            "source={},sandbox=chroot,no_flock,no_posix_lock,no_readdirplus,no_killpriv_v2,\
             no_allow_direct_io",
            share.display()
        ))
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let fe = connect(&sock, &mut child, &log);
    let flags = fe.client().chan().negotiated().unwrap().flags;
    for (bit, name) in [
        (init::FLOCK_LOCKS, "FLOCK_LOCKS"),
        (init::POSIX_LOCKS, "POSIX_LOCKS"),
        (init::DO_READDIRPLUS, "DO_READDIRPLUS"),
        (init::READDIRPLUS_AUTO, "READDIRPLUS_AUTO"),
        (init::HANDLE_KILLPRIV_V2, "HANDLE_KILLPRIV_V2"),
    ] {
        assert_eq!(flags & bit, 0, "{name} negotiated: {flags:#x}");
    }
    // O_DIRECT from the guest does not reach the host open.
    let c = fe.client();
    let odirect = (libc::O_RDWR | libc::O_DIRECT) as u32;
    let (f, o) = c.create(ROOT_ID, b"d", 0o644, odirect, 0).unwrap();
    c.write(f.nodeid, o.fh, 0, b"abc", 0).unwrap();
    let opens = open_flags(child.id(), &share.join("d"));
    assert!(
        opens.iter().any(|f| f & libc::O_ACCMODE == libc::O_RDWR),
        "the guest's open: {opens:?}"
    );
    for f in opens {
        assert_eq!(f & libc::O_DIRECT, 0, "{f:o}");
    }
    c.release(f.nodeid, o.fh, 0).unwrap();
    let err = ends_cleanly(fe, &mut child, &log);
    assert!(
        err.contains("no_flock, no_posix_lock, no_allow_direct_io have no separate option"),
        "{err}"
    );
}

#[test]
fn the_deprecated_socket_alias_and_f_serve() {
    let d = base("socket");
    let share = d.0.join("share");
    std::fs::create_dir_all(&share).unwrap();
    std::fs::write(share.join("there"), b"x").unwrap();
    let sock = d.0.join("vfs.sock");
    let log = d.0.join("stderr");
    let mut child = Command::new(BIN)
        .arg("--socket")
        .arg(&sock)
        .arg("-f")
        .arg(format!("-osource={}", share.display()))
        .args(["-o", "cache=none", "-o", "no_xattr"])
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let fe = connect(&sock, &mut child, &log);
    assert!(fe.client().lookup(ROOT_ID, b"there").is_ok());
    let err = ends_cleanly(fe, &mut child, &log);
    assert!(err.contains("--socket is deprecated"), "{err}");
    assert!(err.contains("-f is deprecated"), "{err}");
    assert_eq!(
        err.matches("-o is deprecated").count(),
        3,
        "one per -o: {err}"
    );
}

#[test]
fn bad_compatibility_options_stop_the_start_naming_them() {
    let d = base("errors");
    let sock = d.0.join("never.sock");
    let sock = sock.to_str().unwrap();
    let dir = d.0.to_str().unwrap();
    let src = format!("source={dir}");
    for (args, named) in [
        (vec!["-o".into(), format!("{src},")], "empty suboption"),
        (vec!["-o".into(), "=x".into()], "-o =x"),
        (vec!["-o".into(), format!("{src},cache=")], "-o cache="),
        (
            vec!["-o".into(), format!("{src},cache=sometimes")],
            "-o cache=sometimes",
        ),
        (
            vec!["-o".into(), format!("{src},nonsense")],
            "-o nonsense: unknown suboption",
        ),
        (
            vec!["-o".into(), format!("{src},modcaps=+nosuch")],
            "unknown capability \"nosuch\"",
        ),
        (
            vec!["--modcaps=sys_admin".into(), "-o".into(), src.clone()],
            "starts with + (keep) or - (drop)",
        ),
        (
            vec!["-o".into(), format!("{src},norace")],
            "-o norace: not supported by fusebox (",
        ),
        (
            vec!["-o".into(), format!("{src},no_flock=")],
            "-o no_flock=: no_flock takes no value",
        ),
        (
            vec![
                "-o".into(),
                src.clone(),
                "--security-label=sometimes".into(),
            ],
            "invalid value 'sometimes' for '--security-label[=<MODE>]'",
        ),
        (
            vec!["-o".into(), src.clone(), "--uid-map=:0:100000:0:".into()],
            "invalid value ':0:100000:0:' for '--uid-map <MAP>'",
        ),
        (
            vec![
                "-o".into(),
                src.clone(),
                "--translate-uid=squash:0:1:1".into(),
            ],
            "invalid value 'squash:0:1:1' for '--translate-uid <MAP>'",
        ),
        (
            vec![
                "-o".into(),
                src.clone(),
                "--translate-gid=map:0:1000:10".into(),
                "--translate-gid=forbid-guest:9:1".into(),
            ],
            "fusebox: --translate-gid\n  caused by: forbid-guest:9:1 overlaps map:0:1000:10 \
             (guest to host)",
        ),
        (
            vec![
                "-o".into(),
                "source=/elsewhere".into(),
                "--shared-dir".into(),
                dir.into(),
            ],
            "-o source=/elsewhere conflicts with --shared-dir",
        ),
        (
            vec!["-o".into(), "cache=auto".into()],
            "--shared-dir (or -o source=DIR)",
        ),
        (
            vec![
                "-o".into(),
                src.clone(),
                "--sandbox=none".into(),
                "--modcaps=-setuid".into(),
            ],
            "--modcaps: running each request as its caller",
        ),
        (
            vec![
                "-o".into(),
                src.clone(),
                "--sandbox=none".into(),
                "--migration-mode=file-handles".into(),
                "--modcaps=-dac_read_search".into(),
            ],
            "--migration-mode file-handles (file handles are opened)",
        ),
    ] {
        let out = Command::new(BIN)
            .args(["--socket-path", sock])
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} started");
        assert!(err.contains(named), "{args:?}: {err}");
        assert!(!Path::new(sock).exists(), "{args:?} made the socket");
    }
}

/// A JSON value, as far as the capabilities need.
#[derive(Debug, PartialEq)]
enum Json {
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

/// A strict parser of strings, arrays and objects (all the capabilities
/// use); anything else, or trailing text, is an error.
fn json(s: &str) -> Result<Json, String> {
    fn ws(b: &[u8], i: &mut usize) {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    }
    fn string(b: &[u8], i: &mut usize) -> Result<String, String> {
        if b.get(*i) != Some(&b'"') {
            return Err(format!("string expected at {i}"));
        }
        *i += 1;
        let start = *i;
        while *i < b.len() && b[*i] != b'"' {
            if b[*i] == b'\\' || b[*i] < 0x20 {
                return Err(format!("unexpected escape or control byte at {i}"));
            }
            *i += 1;
        }
        if *i == b.len() {
            return Err("unterminated string".into());
        }
        *i += 1;
        String::from_utf8(b[start..*i - 1].to_vec()).map_err(|e| e.to_string())
    }
    fn value(b: &[u8], i: &mut usize) -> Result<Json, String> {
        ws(b, i);
        match b.get(*i) {
            Some(b'"') => string(b, i).map(Json::Str),
            Some(&open @ (b'[' | b'{')) => {
                let close = if open == b'[' { b']' } else { b'}' };
                *i += 1;
                let mut arr = Vec::new();
                let mut obj = Vec::new();
                ws(b, i);
                if b.get(*i) == Some(&close) {
                    *i += 1;
                } else {
                    loop {
                        if open == b'[' {
                            arr.push(value(b, i)?);
                        } else {
                            ws(b, i);
                            let k = string(b, i)?;
                            ws(b, i);
                            if b.get(*i) != Some(&b':') {
                                return Err(format!("':' expected at {i}"));
                            }
                            *i += 1;
                            obj.push((k, value(b, i)?));
                        }
                        ws(b, i);
                        match b.get(*i) {
                            Some(b',') => *i += 1,
                            Some(c) if *c == close => {
                                *i += 1;
                                break;
                            }
                            _ => return Err(format!("',' or close expected at {i}")),
                        }
                    }
                }
                Ok(if open == b'[' {
                    Json::Arr(arr)
                } else {
                    Json::Obj(obj)
                })
            }
            _ => Err(format!("value expected at {i}")),
        }
    }
    let b = s.as_bytes();
    let mut i = 0;
    let v = value(b, &mut i)?;
    ws(b, &mut i);
    if i != b.len() {
        return Err(format!("trailing text at {i}"));
    }
    Ok(v)
}

#[test]
fn print_capabilities_is_json_listing_what_works() {
    let out = Command::new(BIN)
        .arg("--print-capabilities")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let caps = json(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(
        caps,
        Json::Obj(vec![
            ("type".into(), Json::Str("fs".into())),
            (
                "features".into(),
                // virtiofsd 1.14's set.
                Json::Arr(vec![
                    Json::Str("migrate-precopy".into()),
                    Json::Str("posix-acl-negotiation-mode".into()),
                    Json::Str("security-label-negotiation-mode".into()),
                    Json::Str("separate-options".into())
                ])
            ),
        ]),
        "{text}"
    );
    assert!(json("{\"a\": [\"b\",]}").is_err());
    // Printed whatever else fusebox would refuse (as virtiofsd, which
    // prints with any option it parses).
    let out = Command::new(BIN)
        .args([
            "--print-capabilities",
            "--modcaps=+sys_admin",
            "--uid-map=:0:100000:65536:",
            "-o",
            "source=/nowhere,security_label,norace",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8(out.stdout).unwrap(), text);
}

/// `--fd` must name a listening socket the caller handed over: a standard
/// stream or an ordinary open file is refused at start, naming the option,
/// and left open (the daemon must not own and close what is not its own).
#[test]
fn an_fd_that_is_no_listening_socket_is_refused() {
    let d = base("badfd");
    let share = d.0.join("share");
    std::fs::create_dir_all(&share).unwrap();
    let file = std::fs::File::create(d.0.join("plain")).unwrap();
    let fd = file.as_raw_fd();
    for (arg, inherited) in [
        ("--fd=0".to_string(), None),
        (format!("--fd={fd}"), Some(fd)),
    ] {
        let mut cmd = Command::new(BIN);
        cmd.arg(&arg)
            .arg("--shared-dir")
            .arg(&share)
            .arg("--sandbox=none");
        if let Some(fd) = inherited {
            inherit(&mut cmd, fd);
        }
        let out = cmd.stdin(std::process::Stdio::null()).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{arg}: started: {err}");
        let named = arg.replace('=', " ");
        assert!(err.contains(&named), "{arg}: {err}");
    }
}
