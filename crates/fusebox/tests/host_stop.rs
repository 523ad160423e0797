//! How `fusebox mount` ends. A mount detached from outside (`umount -l`)
//! lives on, and is served, while anything still uses it; it ends the
//! daemon by itself when its last user goes. A stop signal ends the daemon
//! at once when its mount point no longer holds its mount, and never
//! unmounts another mount found there. A worker blocked in a call does not
//! keep a stop signal from ending the daemon.

mod common;

use common::{
    detach, exit_within, exits_cleanly_within, fusectl_connection, mount_tmpfs, mounted, signal,
    start, start_with, still_running, top_mount, Dirs,
};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const CONTENT: &[u8] = b"written to the share before the mount was detached\n";

/// Mounts, lets `hold` take a user of the mount, detaches the mount from
/// outside, checks that the connection and the daemon live on and that
/// `served` is served, then lets `let_go` end the user and checks that the
/// daemon ends by itself, promptly, and its connection with it.
fn a_detached_mount_lives_until_its_last_user_goes<U>(
    tag: &str,
    hold: impl FnOnce(&Dirs) -> U,
    served: impl FnOnce(&Dirs, &mut U),
    let_go: impl FnOnce(U),
) {
    let d = Dirs::new(tag);
    std::fs::write(d.share().join("f"), CONTENT).unwrap();
    let mut child = start(&d);
    let conn = fusectl_connection(&d.mnt());
    // Its directory's inode tells it from a later connection given the
    // same (freed, reused) number by another test's mount.
    let conn_dir = || std::fs::metadata(&conn).map(|m| m.ino()).ok();
    let ino = conn_dir();
    let mut user = hold(&d);
    detach(&d.mnt()).unwrap();
    assert!(!mounted(&d.mnt()));
    // Mounted nowhere, yet the connection and its daemon live on.
    still_running(&mut child, Duration::from_millis(300));
    assert_eq!(conn_dir(), ino, "{} gone", conn.display());
    served(&d, &mut user);
    let_go(user);
    exits_cleanly_within(child, Duration::from_secs(5));
    assert_ne!(conn_dir(), ino, "{} left", conn.display());
}

#[test]
fn a_detached_mount_is_served_until_the_last_file_open_on_it_closes() {
    a_detached_mount_lives_until_its_last_user_goes(
        "holder-fd",
        |d| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(d.mnt().join("f"))
                .unwrap()
        },
        |d, f| {
            f.write_all_at(b"served", 0).unwrap();
            assert!(std::fs::read(d.share().join("f"))
                .unwrap()
                .starts_with(b"served"));
        },
        drop,
    );
}

/// A shell whose cwd is in the mount: each line on its stdin makes it
/// create a file there (through the daemon) and say so.
fn shell_in_the_mount(d: &Dirs) -> Child {
    Command::new("sh")
        .args([
            "-c",
            "while read n; do echo served > \"$n\" && echo $n; done",
        ])
        .current_dir(d.mnt())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Sends `name` to a shell of [`shell_in_the_mount`] or
/// [`program_from_the_mount`] and waits for its answer.
fn ask(c: &mut Child, name: &str) -> String {
    writeln!(c.stdin.as_mut().unwrap(), "{name}").unwrap();
    let mut line = String::new();
    BufReader::new(c.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    line
}

/// Ends a shell by closing its stdin.
fn end_shell(mut c: Child) {
    drop(c.stdin.take());
    assert!(c.wait().unwrap().success());
}

#[test]
fn a_detached_mount_is_served_until_the_last_process_working_in_it_leaves() {
    a_detached_mount_lives_until_its_last_user_goes(
        "holder-cwd",
        |d| {
            let mut sh = shell_in_the_mount(d);
            assert_eq!(ask(&mut sh, "before"), "before\n");
            sh
        },
        |d, sh| {
            assert_eq!(ask(sh, "after"), "after\n");
            assert_eq!(std::fs::read(d.share().join("after")).unwrap(), b"served\n");
        },
        end_shell,
    );
}

/// A mapping of a file on the mount whose fd is closed.
struct Mapping(*mut libc::c_void, usize);

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: a mapping of this length made by mmap, unmapped once.
        assert_eq!(unsafe { libc::munmap(self.0, self.1) }, 0);
    }
}

#[test]
fn a_detached_mount_is_served_until_the_last_mapping_of_a_file_on_it_goes() {
    a_detached_mount_lives_until_its_last_user_goes(
        "holder-mmap",
        |d| {
            let f = std::fs::File::open(d.mnt().join("f")).unwrap();
            // SAFETY: a fresh shared read-only mapping of an open file; the
            // kernel picks the address.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    CONTENT.len(),
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    std::os::fd::AsRawFd::as_raw_fd(&f),
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            // Only the mapping holds the mount from here on.
            drop(f);
            Mapping(p, CONTENT.len())
        },
        |_, m| {
            // Never read before: the page fault is a READ to the daemon.
            // SAFETY: the mapping is m.1 bytes long and readable.
            let got = unsafe { std::slice::from_raw_parts(m.0.cast::<u8>(), m.1) };
            assert_eq!(got, CONTENT);
        },
        drop,
    );
}

/// A shell run from a copy on the mount, its cwd outside: each line on its
/// stdin makes it open its own program (/proc/self/exe, an OPEN of the
/// detached mount's file) and say so.
fn program_from_the_mount(d: &Dirs) -> Child {
    std::fs::copy("/bin/sh", d.share().join("sh")).unwrap();
    std::fs::set_permissions(d.share().join("sh"), PermissionsExt::from_mode(0o755)).unwrap();
    Command::new(d.mnt().join("sh"))
        .args(["-c", "while read n; do : < /proc/$$/exe && echo $n; done"])
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_detached_mount_is_served_until_the_last_program_run_from_it_exits() {
    a_detached_mount_lives_until_its_last_user_goes(
        "holder-exe",
        |d| {
            let mut sh = program_from_the_mount(d);
            assert_eq!(ask(&mut sh, "before"), "before\n");
            sh
        },
        |_, sh| assert_eq!(ask(sh, "after"), "after\n"),
        end_shell,
    );
}

#[test]
fn one_signal_ends_the_daemon_when_its_busy_mount_was_detached_from_outside() {
    for extra in [&[][..], &["--io-uring"]] {
        let d = Dirs::new(&format!("stop-detached{}", extra.len()));
        let mut child = start_with(&d, extra);
        std::fs::write(d.mnt().join("f"), b"x").unwrap();
        let held = std::fs::File::open(d.mnt().join("f")).unwrap();
        detach(&d.mnt()).unwrap();
        still_running(&mut child, Duration::from_millis(300));
        signal(&child, libc::SIGTERM);
        exits_cleanly_within(child, Duration::from_secs(5));
        // The connection was aborted: its last user gets an error, at once.
        let err = held.read_at(&mut [0u8; 1], 0).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN), "{extra:?}");
    }
}

#[test]
fn one_signal_ends_the_daemon_and_leaves_a_mount_made_where_its_own_was() {
    let d = Dirs::new("stop-replaced");
    let mut child = start(&d);
    std::fs::write(d.mnt().join("f"), b"x").unwrap();
    let held = std::fs::File::open(d.mnt().join("f")).unwrap();
    detach(&d.mnt()).unwrap();
    mount_tmpfs(&d.mnt());
    std::fs::write(d.mnt().join("mark"), b"someone else's").unwrap();
    still_running(&mut child, Duration::from_millis(300));
    signal(&child, libc::SIGTERM);
    let st = exit_within(child, Duration::from_secs(5));
    assert_eq!(top_mount(&d.mnt()).as_deref(), Some("tmpfs"));
    assert_eq!(
        std::fs::read(d.mnt().join("mark")).unwrap(),
        b"someone else's"
    );
    assert!(st.is_some_and(|s| s.success()), "{st:?}");
    let err = held.read_at(&mut [0u8; 1], 0).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN));
}

#[test]
fn one_signal_ends_the_daemon_and_leaves_a_mount_made_over_its_own() {
    let d = Dirs::new("stop-covered");
    let mut child = start(&d);
    std::fs::write(d.mnt().join("f"), b"x").unwrap();
    mount_tmpfs(&d.mnt());
    std::fs::write(d.mnt().join("mark"), b"someone else's").unwrap();
    still_running(&mut child, Duration::from_millis(300));
    signal(&child, libc::SIGTERM);
    let st = exit_within(child, Duration::from_secs(5));
    assert_eq!(top_mount(&d.mnt()).as_deref(), Some("tmpfs"));
    assert_eq!(
        std::fs::read(d.mnt().join("mark")).unwrap(),
        b"someone else's"
    );
    assert!(st.is_some_and(|s| s.success()), "{st:?}");
    // Underneath, our mount is left aborted, never hung.
    detach(&d.mnt()).unwrap();
    assert!(mounted(&d.mnt()));
    let err = std::fs::metadata(d.mnt().join("f")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN));
}

#[test]
fn a_stop_signal_ends_the_daemon_whatever_its_workers_are_blocked_in() {
    // A hang of the only worker (released only once the daemon ends), and
    // a sleep nothing interrupts (a host call that never returns).
    let faults: [(&str, &[&str]); 2] = [
        (
            "hang",
            &["--thread-pool-size", "1", "--inject-faults", "read:hang"],
        ),
        ("sleep", &["--inject-faults", "read:delay=3600s"]),
    ];
    for (tag, extra) in faults {
        for detached_from_outside in [false, true] {
            let d = Dirs::new(&format!("stop-blocked-{tag}-{detached_from_outside}"));
            std::fs::write(d.share().join("f"), b"x").unwrap();
            let args: Vec<&str> = ["--cache", "never"].iter().chain(extra).copied().collect();
            let mut child = start_with(&d, &args);
            let p = d.mnt().join("f");
            let reader = std::thread::spawn(move || std::fs::read(p));
            std::thread::sleep(Duration::from_millis(300));
            assert!(!reader.is_finished(), "{tag}: the read is not blocked");
            if detached_from_outside {
                detach(&d.mnt()).unwrap();
            } else {
                // The blocked reader keeps the mount busy: the first signal
                // only detaches it, the second aborts.
                signal(&child, libc::SIGTERM);
                still_running(&mut child, Duration::from_millis(300));
            }
            signal(&child, libc::SIGTERM);
            exits_cleanly_within(child, Duration::from_secs(10));
            let err = reader.join().unwrap().unwrap_err();
            assert!(
                matches!(
                    err.raw_os_error(),
                    Some(libc::ENOTCONN | libc::ECONNABORTED)
                ),
                "{tag}: {err:?}"
            );
        }
    }
}

#[test]
fn one_signal_ends_the_daemon_when_fusectl_cannot_abort_its_connection() {
    // In a mount namespace of its own where /sys/fs/fuse has no
    // connections directory, so that fusectl cannot be reached: the daemon
    // exits instead, and closing /dev/fuse aborts the connection.
    let d = Dirs::new("stop-no-fusectl");
    let script = r#"
        set -e
        mount -t tmpfs none /sys/fs/fuse
        "$BIN" mount --shared-dir "$SHARE" "$MNT" 2>/dev/null &
        daemon=$!
        for _ in $(seq 200); do
            grep -q " $MNT fuse.fusebox " /proc/mounts && break
            sleep 0.05
        done
        echo x > "$MNT/f"
        exec 3< "$MNT/f"
        umount -l "$MNT"
        kill -TERM $daemon
        for _ in $(seq 100); do
            kill -0 $daemon 2>/dev/null || break
            sleep 0.05
        done
        if kill -0 $daemon 2>/dev/null; then
            echo "still running"
            kill -KILL $daemon
        fi
        set +e
        wait $daemon
        echo "exited $?"
        cat <&3 2>&1 >/dev/null | grep -q "not connected" && echo "read: not connected"
        exit 0
    "#;
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", script])
        .env("BIN", env!("CARGO_BIN_EXE_fusebox"))
        .env("SHARE", d.share())
        .env("MNT", d.mnt())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(said, "exited 1\nread: not connected\n");
}

#[test]
fn a_second_signal_aborts_a_busy_mount_named_by_a_relative_path() {
    let d = Dirs::new("stop-relative");
    let mut child = Command::new(env!("CARGO_BIN_EXE_fusebox"))
        .args(["mount", "--shared-dir", "share", "mnt"])
        .current_dir(d.mnt().parent().unwrap())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    common::wait("mounted", || mounted(&d.mnt()));
    std::fs::write(d.mnt().join("f"), b"x").unwrap();
    let held = std::fs::File::open(d.mnt().join("f")).unwrap();
    signal(&child, libc::SIGTERM);
    still_running(&mut child, Duration::from_millis(300));
    assert!(!mounted(&d.mnt()), "the first signal detaches it");
    signal(&child, libc::SIGTERM);
    exits_cleanly_within(child, Duration::from_secs(5));
    let err = held.read_at(&mut [0u8; 1], 0).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN));
}
