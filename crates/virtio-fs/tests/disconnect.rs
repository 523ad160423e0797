//! A frontend that disconnects in the middle of I/O leaves nothing behind:
//! once the device is dropped, this process has exactly the fds and
//! threads it had before the device was made, over three connections
//! (serving in line, with workers, with a request timeout). This found the
//! exit-event fd vhost-user-backend 0.24 leaks per vring thread (see
//! `device/exit_fds.rs`). One test per file, so no other test's fds or
//! threads are counted.

mod common;

use passthrough::Config;
use virtio_fs::DeviceConfig;

use fuse_core::abi::ROOT_ID;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use virtio_fs::testing::frontend::{FrontendConfig, VhostFrontend};

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

#[test]
fn a_frontend_gone_mid_io_leaks_no_fds_or_threads() {
    let base = std::env::temp_dir().join(format!("fusebox-disconnect-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let dir = base.join("share");
    std::fs::create_dir_all(&dir).unwrap();
    let sock = base.join("vfs.sock");
    let (fds0, threads0) = (count("/proc/self/fd"), count("/proc/self/task"));
    let show = || {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.unwrap().path()).ok())
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
    };
    let before = show();
    for round in 0..3 {
        let (dev, served) = common::serve_passthrough(
            &dir,
            &sock,
            Config::default(),
            DeviceConfig {
                request_queues: 2,
                inline_per_batch: if round == 1 { 1 } else { usize::MAX },
                request_timeout: Duration::from_secs(if round == 2 { 5 } else { 0 }),
                ..DeviceConfig::default()
            },
        );
        let fe = VhostFrontend::connect(
            &sock,
            &FrontendConfig {
                request_queues: 2,
                ..FrontendConfig::default()
            },
        )
        .unwrap();
        let c = fe.client().clone();
        let (e, o) = c
            .create(
                ROOT_ID,
                format!("f{round}").as_bytes(),
                0o644,
                libc::O_RDWR as u32,
                0,
            )
            .unwrap();
        // Writers keep I/O in flight on both queues until the frontend goes.
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let writers: Vec<_> = (0..4)
            .map(|k| {
                let (c, stop, done) = (c.clone(), stop.clone(), done.clone());
                std::thread::spawn(move || {
                    let buf = vec![k as u8; 64 * 1024];
                    let mut i = 0u64;
                    while !stop.load(Ordering::SeqCst) {
                        if c.write(e.nodeid, o.fh, (i % 64) * 65536, &buf, 0).is_err() {
                            break;
                        }
                        done.fetch_add(1, Ordering::SeqCst);
                        i += 1;
                    }
                })
            })
            .collect();
        let t = Instant::now();
        while done.load(Ordering::SeqCst) < 50 {
            assert!(t.elapsed() < Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(2));
        }
        // Gone in the middle of it: the vhost-user connection closes.
        drop(fe);
        served.join().unwrap();
        stop.store(true, Ordering::SeqCst);
        for w in writers {
            w.join().unwrap();
        }
        drop(c);
        drop(dev);
    }
    // The device's helper threads (watchdog, timeout scanner) notice within
    // their tick that it is gone.
    let t = Instant::now();
    while (count("/proc/self/fd"), count("/proc/self/task")) != (fds0, threads0) {
        assert!(
            t.elapsed() < Duration::from_secs(5) || {
                println!("fds before: {before:?}\nfds after: {:?}", show());
                false
            },
            "fds {} (was {fds0}), threads {} (was {threads0})",
            count("/proc/self/fd"),
            count("/proc/self/task")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_dir_all(&base);
}
