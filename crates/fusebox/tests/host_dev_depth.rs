//! `fusebox mount` over /dev/fuse keeps `--in-flight` requests in flight
//! per worker thread: READs, O_DIRECT WRITEs, syncs and FALLOCATEs start
//! on the worker's io_uring and it goes on reading requests. The daemon
//! runs one worker (`--thread-pool-size 1`), so what the tests see in
//! flight at once is one thread's. The bodies are in `common/depth.rs`,
//! shared with the FUSE-over-io_uring transport.

mod common;

use common::depth::{self, Mode};
use common::*;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn sixteen_reads_are_in_flight_at_once_on_one_queue_thread() {
    depth::sixteen_reads_are_in_flight_at_once_on_one_queue_thread(Mode::Dev);
}

#[test]
fn reads_at_depth_match_the_host_file_at_random_offsets() {
    depth::reads_at_depth_match_the_host_file_at_random_offsets(Mode::Dev);
}

#[test]
fn a_hung_read_does_not_stall_the_other_requests_of_its_queue() {
    depth::a_hung_read_does_not_stall_the_other_requests_of_its_queue(Mode::Dev);
}

#[test]
fn an_abort_with_every_entry_holding_a_hung_read_ends_cleanly() {
    depth::an_abort_with_every_entry_holding_a_hung_read_ends_cleanly(Mode::Dev);
}

#[test]
fn one_io_uring_caller_at_depth_16_gets_16_reads_in_flight() {
    depth::one_io_uring_caller_at_depth_16_gets_16_reads_in_flight(Mode::Dev);
}

#[test]
fn more_lock_waits_than_entries_do_not_stall_the_unlock() {
    depth::more_lock_waits_than_entries_do_not_stall_the_unlock(Mode::Dev);
}

#[test]
fn writes_submitted_together_start_on_the_queue_thread_and_land_whole() {
    depth::writes_submitted_together_start_on_the_queue_thread_and_land_whole(Mode::Dev);
}

#[test]
fn a_started_write_runs_as_the_writer() {
    depth::a_started_write_runs_as_the_writer(Mode::Dev);
}

#[test]
fn direct_reads_and_writes_at_depth_match_a_model_of_the_file() {
    depth::direct_reads_and_writes_at_depth_match_a_model_of_the_file(Mode::Dev);
}

#[test]
fn syncs_and_fallocates_submitted_together_start_on_the_queue_thread() {
    depth::syncs_and_fallocates_submitted_together_start_on_the_queue_thread(Mode::Dev);
}

/// Lock waits parked by one worker are answered through that worker's own
/// fd (the kernel looks a reply up among the requests read from the fd it
/// is written to), whichever thread ends the wait.
#[test]
fn lock_waits_parked_by_a_worker_are_answered_through_its_fd() {
    let d = Dirs::new("dev-lockwait");
    std::fs::write(d.share().join("lk"), b"x").unwrap();
    let child = start_with(&d, &["--thread-pool-size", "2"]);
    let conn = fusectl_connection(&d.mnt());
    const PROGRAM: &str = r#"
import fcntl, os, sys, time
path = sys.argv[1]
h = open(path, "r+")
fcntl.lockf(h, fcntl.LOCK_EX)
kids = []
for _ in range(8):
    pid = os.fork()
    if pid == 0:
        f = open(path, "r+")
        fcntl.lockf(f, fcntl.LOCK_EX)
        fcntl.lockf(f, fcntl.LOCK_UN)
        os._exit(0)
    kids.append(pid)
time.sleep(1)
fcntl.lockf(h, fcntl.LOCK_UN)
sys.exit(1 if sum(os.waitpid(k, 0)[1] != 0 for k in kids) else 0)
"#;
    let mut p = Command::new("python3")
        .arg("-c")
        .arg(PROGRAM)
        .arg(d.mnt().join("lk"))
        .spawn()
        .unwrap();
    let t = Instant::now();
    let status = loop {
        if let Some(s) = p.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(15) {
            let _ = std::fs::write(conn.join("abort"), "1");
            let _ = p.wait();
            panic!("lock waits never answered");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    depth::stop(child);
}

/// A started READ that hangs, interrupted by a FUSE_INTERRUPT that another
/// worker reads: the cancel's answer comes on the hung READ's worker's
/// thread, which is woken for it (its wait would otherwise not end).
#[test]
fn an_interrupt_read_by_another_worker_ends_a_hung_read() {
    depth::catch_sigusr1();
    let d = Dirs::new("dev-xintr");
    std::fs::write(d.share().join("slow"), depth::pattern(65536, 3)).unwrap();
    let child = start_with(
        &d,
        &[
            "--thread-pool-size",
            "4",
            "--cache",
            "never",
            "--inject-faults",
            "read:hang",
        ],
    );
    let conn = fusectl_connection(&d.mnt());
    for round in 0..8 {
        let slow = File::open(d.mnt().join("slow")).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let hung = std::thread::spawn(move || {
            // SAFETY: pthread_self has no preconditions.
            tx.send(unsafe { libc::pthread_self() }).unwrap();
            let mut buf = [0u8; 4096];
            slow.read_at(&mut buf, 0)
        });
        let tid = rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert!(!hung.is_finished(), "round {round}: the READ should hang");
        // SAFETY: signals a thread of ours that is still running.
        unsafe { libc::pthread_kill(tid, libc::SIGUSR1) };
        let r = depth::join_or_abort(
            hung,
            &conn,
            Duration::from_secs(5),
            &format!("round {round}: an interrupted READ was never answered"),
        );
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EINTR));
    }
    depth::stop(child);
}
