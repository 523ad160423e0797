//! What one thread waking another costs on this machine: two threads
//! pass a token back and forth through a pair of eventfds (a blocking
//! read(2) on each side, as a vring thread waits for a kick and a guest
//! for its interrupt), pinned to two CPUs and then both to one.
//!
//!     cargo run --release -p host-io --example wakeup [ROUND_TRIPS]
//!
//! Prints the mean round trip and half of it (one wake-up) for each
//! placement. docs/BENCHMARKS.md uses it for the cold-read arithmetic.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Instant;

fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes
    // inside it; sched_setaffinity reads it for this thread (pid 0).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        let r = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        assert_eq!(r, 0, "sched_setaffinity({cpu})");
    }
}

/// A blocking eventfd.
fn eventfd() -> OwnedFd {
    // SAFETY: eventfd has no memory arguments; it returns a new fd or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    assert!(fd >= 0, "eventfd");
    // SAFETY: `fd` was just returned by eventfd and is owned by no one.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn send(fd: &OwnedFd) {
    let v = 1u64;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd.
    let r = unsafe { libc::write(fd.as_raw_fd(), (&v as *const u64).cast(), 8) };
    assert_eq!(r, 8);
}

fn wait(fd: &OwnedFd) {
    let mut v = 0u64;
    // SAFETY: reads 8 bytes into a live u64 from a blocking eventfd.
    let r = unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    assert_eq!(r, 8);
}

/// Mean round trip in µs, this thread on `here`, its peer on `there`.
fn round_trip(here: usize, there: usize, n: usize) -> f64 {
    let ping = eventfd();
    let pong = eventfd();
    std::thread::scope(|s| {
        s.spawn(|| {
            pin(there);
            for _ in 0..n {
                wait(&ping);
                send(&pong);
            }
        });
        pin(here);
        // The peer's first wait, then the timed trips.
        std::thread::sleep(std::time::Duration::from_millis(10));
        let t = Instant::now();
        for _ in 0..n {
            send(&ping);
            wait(&pong);
        }
        t.elapsed().as_secs_f64() * 1e6 / n as f64
    })
}

fn main() {
    let n = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    for (name, here, there) in [("two CPUs", 0, 1), ("one CPU", 0, 0)] {
        let rt = round_trip(here, there, n);
        println!(
            "{name}: round trip {rt:.2} µs, one wake-up {:.2} µs",
            rt / 2.0
        );
    }
}
