//! How `fusebox mount` ends. A stop signal ends the daemon at once when
//! its mount point no longer holds its mount, and never unmounts another
//! mount found there. A worker blocked in a call does not keep a stop
//! signal from ending the daemon.

mod common;

use common::{
    detach, exit_within, exits_cleanly_within, mount_tmpfs, mounted, signal, start, start_with,
    still_running, top_mount, Dirs,
};
use std::os::unix::fs::FileExt;
use std::process::{Command, Stdio};
use std::time::Duration;

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
