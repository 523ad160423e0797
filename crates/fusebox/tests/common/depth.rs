//! The bodies of the depth tests, run over both host-mount transports
//! (`host_ring_depth.rs`: the kernel's FUSE-over-io_uring ring,
//! `host_dev_depth.rs`: /dev/fuse): many requests in flight per serving
//! thread, READs and O_DIRECT WRITEs, syncs and FALLOCATEs started on the
//! thread's io_uring while it serves the others. Callers are pinned to
//! CPU 0, so on the ring their requests all land on queue 0 and its one
//! serving thread; on /dev/fuse the daemon has one worker thread.

use super::*;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// The transport a depth test runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `fusebox mount --io-uring`: one serving thread per CPU's queue.
    Ring,
    /// `fusebox mount --thread-pool-size 1`: one /dev/fuse worker.
    Dev,
}

impl Mode {
    /// A directory tag naming the test and the mode.
    pub fn tag(self, test: &str) -> String {
        match self {
            Mode::Ring => format!("ring-{test}"),
            Mode::Dev => format!("dev-{test}"),
        }
    }

    /// `fusebox mount` in this mode with `extra`, its stderr in `log`, and
    /// the serving threads' statistics printed at its end.
    pub fn start(self, d: &Dirs, log: &Path, extra: &[&str]) -> Child {
        let mode: &[&str] = match self {
            Mode::Ring => &["--io-uring"],
            Mode::Dev => &["--thread-pool-size", "1"],
        };
        let child = Command::new(env!("CARGO_BIN_EXE_fusebox"))
            .env("FUSEBOX_RING_STATS", "1")
            .arg("mount")
            .args(mode)
            .args(extra)
            .arg("--shared-dir")
            .arg(d.share())
            .arg(d.mnt())
            .stdout(Stdio::null())
            .stderr(File::create(log).unwrap())
            .spawn()
            .unwrap();
        wait("mounted", || mounted(&d.mnt()));
        child
    }

    /// The label of the count of started requests in its statistics.
    pub fn started(self) -> &'static str {
        match self {
            Mode::Ring => "READs started",
            Mode::Dev => "started",
        }
    }

    /// The statistics lines of its serving threads in the daemon's log.
    fn stat_lines(self, log: &Path) -> Vec<String> {
        let prefix = match self {
            Mode::Ring => "fusebox: ring queue ",
            Mode::Dev => "fusebox: dev worker ",
        };
        let text = std::fs::read_to_string(log).unwrap();
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .map(str::to_owned)
            .collect()
    }

    /// The figures labelled `label` ("N label", or "at most N label") of
    /// every serving thread.
    fn stats(self, log: &Path, label: &str) -> Vec<u64> {
        self.stat_lines(log)
            .iter()
            .filter_map(|l| {
                let fields = &l[l.find(": ")? + 2..];
                fields.split(", ").find_map(|f| {
                    let f = f.trim_start_matches("at most ");
                    let (n, rest) = f.split_once(' ')?;
                    (rest == label).then(|| n.parse().ok()).flatten()
                })
            })
            .collect()
    }

    /// The sum of `label` over the serving threads (None: no statistics).
    pub fn stat_sum(self, log: &Path, label: &str) -> Option<u64> {
        let v = self.stats(log, label);
        (!v.is_empty()).then(|| v.iter().sum())
    }

    /// The largest `label` of one serving thread.
    pub fn stat_max(self, log: &Path, label: &str) -> Option<u64> {
        self.stats(log, label).into_iter().max()
    }
}

fn pin_to_cpu0() {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET writes inside it and
    // sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0
        );
    }
}

pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The result of the caller thread `t`; past `limit` the connection is
/// aborted (which frees a caller stuck in the mount) and the test fails
/// with `what`.
pub fn join_or_abort<T>(
    t: std::thread::JoinHandle<T>,
    conn: &Path,
    limit: Duration,
    what: &str,
) -> T {
    let started = Instant::now();
    while !t.is_finished() {
        if started.elapsed() > limit {
            let _ = std::fs::write(conn.join("abort"), "1");
            let _ = t.join();
            panic!("{what}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    t.join().unwrap()
}

/// Ends the daemon (SIGTERM, the lazy unmount) and checks it exits
/// cleanly; its log is then complete.
pub fn stop(child: Child) {
    signal(&child, libc::SIGTERM);
    exits_cleanly(child);
}

pub fn sixteen_reads_are_in_flight_at_once_on_one_queue_thread(mode: Mode) {
    let d = Dirs::new(&mode.tag("depth16"));
    let data = pattern(16 * 65536, 7);
    std::fs::write(d.share().join("f"), &data).unwrap();
    let log = d.share().with_file_name("log");
    // Every READ is held until 16 are held at once: a queue thread that
    // served one READ at a time would never get there (the callers'
    // reads would hang until the abort below).
    let child = mode.start(
        &d,
        &log,
        &["--cache", "never", "--inject-faults", "read:gather=16"],
    );
    let conn = fusectl_connection(&d.mnt());
    let f = Arc::new(File::open(d.mnt().join("f")).unwrap());
    let go = Arc::new(Barrier::new(16));
    let readers: Vec<_> = (0..16usize)
        .map(|i| {
            let (f, go) = (f.clone(), go.clone());
            std::thread::spawn(move || {
                pin_to_cpu0();
                go.wait();
                let mut buf = vec![0u8; 4096];
                let n = f.read_at(&mut buf, (i * 65536) as u64);
                (i, n.map(|n| buf[..n].to_vec()))
            })
        })
        .collect();
    let t = Instant::now();
    while !readers.iter().all(|r| r.is_finished()) {
        if t.elapsed() > Duration::from_secs(10) {
            // Free the callers before failing: abort the connection.
            let _ = std::fs::write(conn.join("abort"), "1");
            for r in readers {
                let _ = r.join();
            }
            panic!("16 READs were never in flight at once");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    for r in readers {
        let (i, got) = r.join().unwrap();
        let got = got.unwrap();
        assert_eq!(got, data[i * 65536..i * 65536 + 4096], "read {i}");
    }
    drop(f);
    stop(child);
    let most = mode.stat_max(&log, "in flight").expect("statistics");
    assert!(
        most >= 16,
        "at most {most} READs in flight on one serving thread"
    );
}

pub fn reads_at_depth_match_the_host_file_at_random_offsets(mode: Mode) {
    let d = Dirs::new(&mode.tag("integrity"));
    let len = 8 << 20;
    let data = Arc::new(pattern(len, 11));
    let host = d.share().join("f");
    std::fs::write(&host, &*data).unwrap();
    let log = d.share().with_file_name("log");
    let child = mode.start(&d, &log, &["--cache", "never"]);
    // Out of the host's page cache, so that reads wait for the disk and
    // run on the serving thread's io_uring.
    let hf = File::open(&host).unwrap();
    host_io::sys::drop_cached(std::os::fd::AsRawFd::as_raw_fd(&hf)).unwrap();
    let f = Arc::new(File::open(d.mnt().join("f")).unwrap());
    let go = Arc::new(Barrier::new(16));
    let readers: Vec<_> = (0..16u64)
        .map(|t| {
            let (f, go, data) = (f.clone(), go.clone(), data.clone());
            std::thread::spawn(move || {
                pin_to_cpu0();
                go.wait();
                let mut x = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(t + 1);
                let mut next = move || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                for _ in 0..200 {
                    // Sizes up to 256 KiB, offsets anywhere (some past the
                    // end: short reads).
                    let size = 1 + (next() % (256 << 10)) as usize;
                    let off = next() % (len as u64 + 4096);
                    let mut buf = vec![0u8; size];
                    let n = f.read_at(&mut buf, off).unwrap();
                    let start = (off as usize).min(len);
                    let want = &data[start..(start + size).min(len)];
                    assert_eq!(n, want.len(), "size at {off}+{size}");
                    assert!(buf[..n] == *want, "data at {off}+{size}");
                }
            })
        })
        .collect();
    for r in readers {
        r.join().unwrap();
    }
    drop(f);
    stop(child);
    let s = mode.stat_sum(&log, mode.started()).expect("statistics");
    assert!(s > 0, "no READ was started without waiting");
}

/// A no-op handler, so that a signal interrupts a system call (no
/// SA_RESTART) without killing the process.
pub fn catch_sigusr1() {
    extern "C" fn nothing(_: i32) {}
    // SAFETY: a zeroed sigaction with a handler that does nothing.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = nothing as *const () as usize;
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
}

pub fn a_hung_read_does_not_stall_the_other_requests_of_its_queue(mode: Mode) {
    catch_sigusr1();
    let d = Dirs::new(&mode.tag("hang"));
    std::fs::write(d.share().join("slow"), pattern(65536, 3)).unwrap();
    let fast = pattern(65536, 5);
    std::fs::write(d.share().join("fast"), &fast).unwrap();
    let log = d.share().with_file_name("log");
    // The first READ hangs until interrupted; the rest are served.
    let child = mode.start(
        &d,
        &log,
        &["--cache", "never", "--inject-faults", "read:hang:times=1"],
    );
    let conn = fusectl_connection(&d.mnt());
    let slow = File::open(d.mnt().join("slow")).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let hung = std::thread::spawn(move || {
        pin_to_cpu0();
        // SAFETY: pthread_self has no preconditions.
        tx.send(unsafe { libc::pthread_self() }).unwrap();
        let mut buf = [0u8; 4096];
        slow.read_at(&mut buf, 0)
    });
    let tid = rx.recv().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(!hung.is_finished(), "the first READ should hang");
    // Everything else on the same queue is served meanwhile (a thread
    // stalled behind the hung READ would wait until the abort).
    let others = std::thread::spawn({
        let mnt = d.mnt();
        move || {
            pin_to_cpu0();
            let t = Instant::now();
            let f = File::open(mnt.join("fast")).unwrap();
            for i in 0..50u64 {
                let mut buf = [0u8; 1000];
                let off = (i * 1237) % 60000;
                assert_eq!(f.read_at(&mut buf, off).unwrap(), 1000);
                assert_eq!(buf[..], fast[off as usize..off as usize + 1000]);
                assert_eq!(std::fs::metadata(mnt.join("fast")).unwrap().len(), 65536);
            }
            std::fs::write(mnt.join("new"), b"x").unwrap();
            (t.elapsed(), f)
        }
    });
    let (took, f) = join_or_abort(
        others,
        &conn,
        Duration::from_secs(20),
        "the other requests stalled behind a hung READ",
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(!hung.is_finished());
    // A signal makes the kernel send FUSE_INTERRUPT: the hung READ ends
    // with EINTR, as on every other path.
    // SAFETY: signals a thread of ours that is still running.
    unsafe { libc::pthread_kill(tid, libc::SIGUSR1) };
    let t = Instant::now();
    while !hung.is_finished() {
        assert!(t.elapsed() < Duration::from_secs(5), "not interrupted");
        std::thread::sleep(Duration::from_millis(10));
    }
    let err = hung.join().unwrap().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINTR), "{err:?}");
    drop(f);
    stop(child);
}

pub fn an_abort_with_every_entry_holding_a_hung_read_ends_cleanly(mode: Mode) {
    let d = Dirs::new(&mode.tag("abort"));
    std::fs::write(d.share().join("f"), pattern(65536, 9)).unwrap();
    let log = d.share().with_file_name("log");
    let child = mode.start(
        &d,
        &log,
        &[
            "--cache",
            "never",
            "--in-flight",
            "4",
            "--inject-faults",
            "read:hang",
        ],
    );
    // Before the READs hang: looking it up asks the mount for attributes,
    // which could land on the blocked queue.
    let conn = fusectl_connection(&d.mnt());
    let f = Arc::new(File::open(d.mnt().join("f")).unwrap());
    // More hung READs than queue 0 has entries: the queue holds no command
    // the kernel could end, so only the daemon can tell its thread.
    let readers: Vec<_> = (0..6u64)
        .map(|i| {
            let f = f.clone();
            std::thread::spawn(move || {
                pin_to_cpu0();
                let mut buf = [0u8; 512];
                f.read_at(&mut buf, i * 4096)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    assert!(readers.iter().all(|r| !r.is_finished()));
    std::fs::write(conn.join("abort"), "1").unwrap();
    for r in readers {
        let err = r.join().unwrap().unwrap_err();
        assert!(
            matches!(
                err.raw_os_error(),
                Some(libc::ECONNABORTED | libc::ENOTCONN)
            ),
            "{err:?}"
        );
    }
    drop(f);
    let t = Instant::now();
    exits_cleanly_within(child, Duration::from_secs(10));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("still blocked"), "{text}");
}

/// A 4 KiB-aligned buffer (O_DIRECT).
pub struct Aligned {
    pub ptr: *mut u8,
    pub len: usize,
}

impl Aligned {
    pub fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Aligned { ptr, len }
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: our own allocation of `len` bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, 4096).unwrap();
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}

pub fn one_io_uring_caller_at_depth_16_gets_16_reads_in_flight(mode: Mode) {
    // O_DIRECT reads submitted without waiting reach the daemon at once
    // (FUSE_ASYNC_DIO, max_background raised for the ring's entries):
    // without that the kernel would serve them one by one and the gather
    // of 16 would never complete.
    let d = Dirs::new(&mode.tag("uring-client"));
    let data = pattern(16 * 65536, 13);
    std::fs::write(d.share().join("f"), &data).unwrap();
    let log = d.share().with_file_name("log");
    let child = mode.start(&d, &log, &["--inject-faults", "read:gather=16"]);
    let conn = fusectl_connection(&d.mnt());
    let t = std::thread::spawn({
        let path = d.mnt().join("f");
        move || {
            pin_to_cpu0();
            let f = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
                .unwrap();
            let bufs: Vec<Aligned> = (0..16).map(|_| Aligned::new(4096)).collect();
            let mut ring = io_uring::IoUring::new(32).unwrap();
            for (i, b) in bufs.iter().enumerate() {
                let sqe = io_uring::opcode::Read::new(
                    io_uring::types::Fd(std::os::fd::AsRawFd::as_raw_fd(&f)),
                    b.ptr,
                    4096,
                )
                .offset((i * 65536) as u64)
                .build()
                .user_data(i as u64);
                // SAFETY: the buffers outlive the ring's use of them (we
                // wait for every completion below before dropping them).
                unsafe { ring.submission().push(&sqe).unwrap() };
            }
            ring.submit_and_wait(16).unwrap();
            let mut got: Vec<(u64, i32)> = ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            got.sort();
            (
                got,
                bufs.iter()
                    .map(|b| b.as_slice().to_vec())
                    .collect::<Vec<_>>(),
            )
        }
    });
    let (got, bufs) = join_or_abort(
        t,
        &conn,
        Duration::from_secs(10),
        "16 READs of one io_uring caller were never in flight at once",
    );
    assert_eq!(got.len(), 16);
    for (i, (ud, res)) in got.into_iter().enumerate() {
        assert_eq!((ud, res), (i as u64, 4096));
        assert_eq!(bufs[i], data[i * 65536..i * 65536 + 4096], "read {i}");
    }
    stop(child);
    let most = mode.stat_max(&log, "in flight");
    assert!(
        most >= Some(16),
        "at most {most:?} READs in flight on a queue"
    );
}

/// More lock waits than a queue has entries, forked in a burst: each
/// waiting SETLKW keeps its entry and another is registered in its place,
/// however many wait, and the kernel is nudged after each park, so the
/// holder's unlock, and every waiter's, is served and ends them all.
///
/// The waiters are processes of their own (POSIX locks are per process)
/// pinned to CPU 0, so their requests land on queue 0, which has one
/// entry. Forked faster than it serves, their OPENs and SETLKWs queue up
/// in the kernel while the entry is busy. The kernel gives a queued
/// request only to an entry that commits, never to one just registered,
/// and a parked entry does not commit: without the nudge
/// (`KernelQueue::nudge`), the queue once sat with free entries and
/// every waiter's unlock queued behind lock waits (a C program forking
/// 80 left all 80 waiting). A cap of 64 replacements once left every
/// entry holding a wait and the unlock with nowhere to go.
pub fn more_lock_waits_than_entries_do_not_stall_the_unlock(mode: Mode) {
    let d = Dirs::new(&mode.tag("lockwaits"));
    std::fs::write(d.share().join("lk"), b"x").unwrap();
    let log = d.share().with_file_name("log");
    // Over /dev/fuse depth 1 is the plain worker: 2 keeps the test on the
    // workers that serve at depth (still far fewer slots than waiters).
    let depth = match mode {
        Mode::Ring => "1",
        Mode::Dev => "2",
    };
    let child = mode.start(&d, &log, &["--in-flight", depth]);
    let conn = fusectl_connection(&d.mnt());
    const PROGRAM: &str = r#"
import fcntl, os, sys, time
os.sched_setaffinity(0, {0})
path, n = sys.argv[1], int(sys.argv[2])
h = open(path, "r+")
fcntl.lockf(h, fcntl.LOCK_EX)
# Every waiter forked first and held at a gate (a pipe), then let go at
# once: their OPENs and SETLKWs arrive together.
gate, go = os.pipe()
kids = []
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        os.close(go)
        os.read(gate, 1)
        f = open(path, "r+")
        fcntl.lockf(f, fcntl.LOCK_EX)
        fcntl.lockf(f, fcntl.LOCK_UN)
        os._exit(0)
    kids.append(pid)
os.close(go)
time.sleep(2)
fcntl.lockf(h, fcntl.LOCK_UN)
bad = sum(os.waitpid(k, 0)[1] != 0 for k in kids)
sys.exit(1 if bad else 0)
"#;
    let mut waiters = Command::new("python3")
        .arg("-c")
        .arg(PROGRAM)
        .arg(d.mnt().join("lk"))
        .arg("80")
        .spawn()
        .unwrap();
    let t = Instant::now();
    let status = loop {
        if let Some(s) = waiters.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(30) {
            // Free them before failing.
            let _ = std::fs::write(conn.join("abort"), "1");
            let _ = waiters.wait();
            panic!("80 lock waits on a queue of one entry still parked after 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    stop(child);
    // On the ring, every waiter parked on queue 0 (the unlocks, and
    // SETLKWs that found the lock free, are answered at once and do not
    // count), and the nudges that followed came back there. A /dev/fuse
    // worker parks a wait without holding a slot: nothing to nudge.
    if mode == Mode::Ring {
        let (parked, nudged) = (
            mode.stat_sum(&log, "parked"),
            mode.stat_sum(&log, "nudges committed"),
        );
        assert!(parked >= Some(80), "{parked:?} parked on queue 0");
        assert!(nudged >= Some(1), "{nudged:?} nudges committed on queue 0");
    }
}

/// O_DIRECT writes submitted without waiting by one io_uring caller: the
/// serving thread starts each from the entry's payload buffer on its own
/// io_uring (a WRITE's data is never copied), and every byte lands where
/// it was written. Half the writes are 4 KiB, half 128 KiB, at scattered
/// offsets, so completions come back in any order.
pub fn writes_submitted_together_start_on_the_queue_thread_and_land_whole(mode: Mode) {
    let d = Dirs::new(&mode.tag("writes"));
    let len = 4 << 20;
    std::fs::write(d.share().join("f"), vec![0u8; len]).unwrap();
    let log = d.share().with_file_name("log");
    let child = mode.start(&d, &log, &[]);
    let conn = fusectl_connection(&d.mnt());
    let sizes: Vec<usize> = (0..16)
        .map(|i| if i % 2 == 0 { 4096 } else { 128 << 10 })
        .collect();
    let offsets: Vec<u64> = (0..16u64).map(|i| (i * 7 % 16) * (256 << 10)).collect();
    let datas: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n, 100 + i as u64))
        .collect();
    let t = std::thread::spawn({
        let (path, sizes, offsets, datas) = (
            d.mnt().join("f"),
            sizes.clone(),
            offsets.clone(),
            datas.clone(),
        );
        move || {
            pin_to_cpu0();
            let f = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
                .unwrap();
            let bufs: Vec<Aligned> = sizes.iter().map(|&n| Aligned::new(n)).collect();
            for (b, data) in bufs.iter().zip(&datas) {
                // SAFETY: our own allocation of that length.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), b.ptr, b.len) };
            }
            let mut ring = io_uring::IoUring::new(32).unwrap();
            for (i, b) in bufs.iter().enumerate() {
                let sqe = io_uring::opcode::Write::new(
                    io_uring::types::Fd(std::os::fd::AsRawFd::as_raw_fd(&f)),
                    b.ptr,
                    b.len as u32,
                )
                .offset(offsets[i])
                .build()
                .user_data(i as u64);
                // SAFETY: the buffers outlive the ring's use of them (we
                // wait for every completion below before dropping them).
                unsafe { ring.submission().push(&sqe).unwrap() };
            }
            ring.submit_and_wait(16).unwrap();
            let mut got: Vec<(u64, i32)> = ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            got.sort();
            got
        }
    });
    let got = join_or_abort(
        t,
        &conn,
        Duration::from_secs(20),
        "16 WRITEs of one io_uring caller never completed",
    );
    assert_eq!(got.len(), 16);
    for (i, (ud, res)) in got.into_iter().enumerate() {
        assert_eq!((ud, res), (i as u64, sizes[i] as i32), "write {i}");
    }
    stop(child);
    let host = std::fs::read(d.share().join("f")).unwrap();
    assert_eq!(host.len(), len);
    for i in 0..16 {
        let at = offsets[i] as usize;
        assert!(
            host[at..at + sizes[i]] == datas[i][..],
            "write {i} at {at} did not land whole"
        );
    }
    let writes = mode.stat_sum(&log, "WRITEs started");
    assert!(
        writes >= Some(16),
        "{writes:?} WRITEs started on the serving thread's io_uring"
    );
}

/// A WRITE started without waiting runs with the writer's credentials,
/// as one served in line does: another user's O_DIRECT write to a setuid
/// file of theirs clears the setuid and setgid bits on the host (the host
/// kernel does it only for a writer without CAP_FSETID). Run as root
/// with its capabilities, the host write would leave them.
pub fn a_started_write_runs_as_the_writer(mode: Mode) {
    let d = Dirs::new(&mode.tag("write-creds"));
    let host = d.share().join("f");
    std::fs::write(&host, vec![0u8; 8192]).unwrap();
    std::os::unix::fs::chown(&host, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(&host, std::os::unix::fs::PermissionsExt::from_mode(0o6777)).unwrap();
    std::os::unix::fs::chown(d.share(), Some(65534), Some(65534)).unwrap();
    let log = d.share().with_file_name("log");
    let child = mode.start(&d, &log, &[]);
    const PROGRAM: &str = r#"
import mmap, os, sys
os.sched_setaffinity(0, {0})
buf = mmap.mmap(-1, 4096)
buf.write(b"w" * 4096)
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_DIRECT)
n = os.pwrite(fd, buf, 4096)
os.close(fd)
sys.exit(0 if n == 4096 else 1)
"#;
    let status = Command::new("python3")
        .arg("-c")
        .arg(PROGRAM)
        .arg(d.mnt().join("f"))
        .uid(65534)
        .gid(65534)
        .status()
        .unwrap();
    assert!(status.success(), "{status}");
    stop(child);
    let meta = std::fs::metadata(&host).unwrap();
    let bits = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777;
    assert_eq!(bits, 0o777, "setuid/setgid left on the host file: {bits:o}");
    let data = std::fs::read(&host).unwrap();
    assert!(data[4096..] == [b'w'; 4096][..]);
    let writes = mode.stat_sum(&log, "WRITEs started");
    assert!(writes >= Some(1), "{writes:?} WRITEs started ");
}

/// O_DIRECT reads and writes at depth 16 from one io_uring caller, against
/// a model of the file: the ops of a batch never overlap (the order of
/// two overlapping ones in flight together is the caller's to keep), each
/// read sees what the batches before it wrote, and the host file ends as
/// the model. Writes start on the queue thread's io_uring and complete in
/// any order; nothing acknowledged is lost or torn.
pub fn direct_reads_and_writes_at_depth_match_a_model_of_the_file(mode: Mode) {
    let d = Dirs::new(&mode.tag("direct-model"));
    const SLOT: usize = 128 << 10;
    const SLOTS: usize = 64;
    let len = SLOT * SLOTS;
    std::fs::write(d.share().join("f"), vec![0u8; len]).unwrap();
    let log = d.share().with_file_name("log");
    let child = mode.start(&d, &log, &[]);
    let conn = fusectl_connection(&d.mnt());
    let t = std::thread::spawn({
        let path = d.mnt().join("f");
        move || {
            pin_to_cpu0();
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
                .unwrap();
            let fd = io_uring::types::Fd(std::os::fd::AsRawFd::as_raw_fd(&f));
            let mut model = vec![0u8; len];
            let mut x = 0x2545_f491_4f6c_dd1du64;
            let mut next = move || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            let mut ring = io_uring::IoUring::new(32).unwrap();
            let bufs: Vec<Aligned> = (0..16).map(|_| Aligned::new(SLOT)).collect();
            let mut writes = 0;
            for batch in 0..120u64 {
                // 16 distinct slots, an aligned range inside each.
                let mut slots: Vec<usize> = (0..SLOTS).collect();
                for i in 0..16 {
                    let j = i + (next() as usize) % (SLOTS - i);
                    slots.swap(i, j);
                }
                let mut ops = Vec::new();
                for (i, &slot) in slots[..16].iter().enumerate() {
                    let pages = 1 + (next() as usize) % (SLOT / 4096);
                    let first = (next() as usize) % (SLOT / 4096 - pages + 1);
                    let off = slot * SLOT + first * 4096;
                    let n = pages * 4096;
                    let write = next() % 2 == 0;
                    let b = &bufs[i];
                    let sqe = if write {
                        let data = pattern(n, batch * 16 + i as u64 + 1);
                        // SAFETY: our own allocation of SLOT >= n bytes.
                        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), b.ptr, n) };
                        io_uring::opcode::Write::new(fd, b.ptr, n as u32)
                            .offset(off as u64)
                            .build()
                    } else {
                        io_uring::opcode::Read::new(fd, b.ptr, n as u32)
                            .offset(off as u64)
                            .build()
                    };
                    // SAFETY: the buffers outlive the ring's use of them
                    // (every completion is waited for below).
                    unsafe { ring.submission().push(&sqe.user_data(i as u64)).unwrap() };
                    ops.push((write, off, n));
                }
                ring.submit_and_wait(16).unwrap();
                let done: Vec<(u64, i32)> = ring
                    .completion()
                    .map(|c| (c.user_data(), c.result()))
                    .collect();
                assert_eq!(done.len(), 16);
                for (ud, res) in done {
                    let (write, off, n) = ops[ud as usize];
                    assert_eq!(res, n as i32, "batch {batch} op {ud}: {write} at {off}+{n}");
                    let got = &bufs[ud as usize].as_slice()[..n];
                    if write {
                        writes += 1;
                        model[off..off + n].copy_from_slice(got);
                    } else {
                        assert!(
                            got == &model[off..off + n],
                            "batch {batch}: read at {off}+{n} differs from what was written"
                        );
                    }
                }
            }
            (model, writes)
        }
    });
    let (model, writes) = join_or_abort(
        t,
        &conn,
        Duration::from_secs(120),
        "the direct I/O batches did not finish in 120 s",
    );
    stop(child);
    assert!(
        std::fs::read(d.share().join("f")).unwrap() == model,
        "the host file is not what was written"
    );
    let started_writes = mode.stat_sum(&log, "WRITEs started");
    assert!(
        started_writes >= Some(writes),
        "{started_writes:?} of {writes} WRITEs started on the serving thread's io_uring"
    );
}

/// FSYNCs, FDATASYNCs and FALLOCATEs of 16 files, submitted together by
/// one io_uring caller, start on the queue thread's io_uring (their waits
/// for the disk run on the ring's io-wq workers, not on the thread) and
/// are answered with success, while reads submitted with them are
/// answered too; the files hold on the host what was written before the
/// syncs, and the space the FALLOCATEs asked for.
pub fn syncs_and_fallocates_submitted_together_start_on_the_queue_thread(mode: Mode) {
    let d = Dirs::new(&mode.tag("syncs"));
    let data = pattern(16 * 65536, 21);
    std::fs::write(d.share().join("r"), &data).unwrap();
    let log = d.share().with_file_name("log");
    let child = mode.start(&d, &log, &[]);
    let conn = fusectl_connection(&d.mnt());
    let t = std::thread::spawn({
        let mnt = d.mnt();
        move || {
            pin_to_cpu0();
            let files: Vec<File> = (0..16)
                .map(|i| {
                    let f = File::create(mnt.join(format!("s{i}"))).unwrap();
                    f.write_all_at(&pattern(65536, 200 + i), 0).unwrap();
                    f
                })
                .collect();
            let r = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(mnt.join("r"))
                .unwrap();
            let bufs: Vec<Aligned> = (0..16).map(|_| Aligned::new(4096)).collect();
            let mut ring = io_uring::IoUring::new(64).unwrap();
            for (i, f) in files.iter().enumerate() {
                let flags = if i % 2 == 0 {
                    io_uring::types::FsyncFlags::DATASYNC
                } else {
                    io_uring::types::FsyncFlags::empty()
                };
                let sqe = io_uring::opcode::Fsync::new(io_uring::types::Fd(
                    std::os::fd::AsRawFd::as_raw_fd(f),
                ))
                .flags(flags)
                .build()
                .user_data(i as u64);
                // SAFETY: an fsync names no memory.
                unsafe { ring.submission().push(&sqe).unwrap() };
                // Without a size change the kernel holds no inode lock for
                // it: the 16 reach the daemon together.
                let sqe = io_uring::opcode::Fallocate::new(
                    io_uring::types::Fd(std::os::fd::AsRawFd::as_raw_fd(f)),
                    1 << 20,
                )
                .mode(libc::FALLOC_FL_KEEP_SIZE)
                .build()
                .user_data(200 + i as u64);
                // SAFETY: a fallocate names no memory.
                unsafe { ring.submission().push(&sqe).unwrap() };
            }
            for (i, b) in bufs.iter().enumerate() {
                let sqe = io_uring::opcode::Read::new(
                    io_uring::types::Fd(std::os::fd::AsRawFd::as_raw_fd(&r)),
                    b.ptr,
                    4096,
                )
                .offset((i * 65536) as u64)
                .build()
                .user_data(100 + i as u64);
                // SAFETY: the buffers outlive the ring's use of them (we
                // wait for every completion below before dropping them).
                unsafe { ring.submission().push(&sqe).unwrap() };
            }
            ring.submit_and_wait(48).unwrap();
            let mut got: Vec<(u64, i32)> = ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            got.sort();
            (
                got,
                bufs.iter()
                    .map(|b| b.as_slice().to_vec())
                    .collect::<Vec<_>>(),
            )
        }
    });
    let (got, bufs) = join_or_abort(
        t,
        &conn,
        Duration::from_secs(20),
        "16 syncs, 16 FALLOCATEs and 16 reads of one io_uring caller never completed",
    );
    assert_eq!(got.len(), 48);
    for (i, &(ud, res)) in got[..16].iter().enumerate() {
        assert_eq!((ud, res), (i as u64, 0), "sync {i}");
    }
    for (i, &(ud, res)) in got[16..32].iter().enumerate() {
        assert_eq!((ud, res), (100 + i as u64, 4096), "read {i}");
        assert_eq!(bufs[i], data[i * 65536..i * 65536 + 4096], "read {i}");
    }
    for (i, &(ud, res)) in got[32..].iter().enumerate() {
        assert_eq!((ud, res), (200 + i as u64, 0), "fallocate {i}");
    }
    stop(child);
    for i in 0..16u64 {
        let host = std::fs::read(d.share().join(format!("s{i}"))).unwrap();
        assert!(host == pattern(65536, 200 + i), "file s{i} on the host");
        let md = std::fs::metadata(d.share().join(format!("s{i}"))).unwrap();
        assert!(
            std::os::unix::fs::MetadataExt::blocks(&md) * 512 >= 1 << 20,
            "file s{i}: its FALLOCATE did not allocate"
        );
    }
    let started = mode.stat_sum(&log, "syncs and FALLOCATEs started");
    assert!(
        started >= Some(32),
        "{started:?} syncs and FALLOCATEs started on the serving thread's io_uring"
    );
}
