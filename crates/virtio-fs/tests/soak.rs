//! Soak through the whole device with no VM: the fsx-style checker
//! (`fuse_core::testing::fsx`: writes, verified reads, truncates, fsyncs,
//! fallocates, hole punches, copy_file_ranges, reopens) drives fusebox's
//! device over a real vhost-user socket, with the passthrough of a
//! temporary directory behind it: one run, then four at once on distinct
//! files over two request queues. CI runs the short default (4,000
//! operations, then 4 x 1,000, in the debug test run; 20,000 in release);
//! FUSEBOX_SOAK=1 runs 1,000,000.

mod common;

use passthrough::Config;
use virtio_fs::DeviceConfig;

use fuse_core::abi::ROOT_ID;
use fuse_core::testing::fsx::{self, FsxConfig};
use virtio_fs::testing::frontend::{FrontendConfig, VhostFrontend};

#[test]
fn fsx_through_the_device() {
    let ops: u64 = if std::env::var_os("FUSEBOX_SOAK").is_some() {
        1_000_000
    } else if cfg!(debug_assertions) {
        4_000
    } else {
        20_000
    };
    let base = std::env::temp_dir().join(format!("fusebox-soak-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let dir = base.join("share");
    std::fs::create_dir_all(&dir).unwrap();
    let sock = base.join("vfs.sock");
    let (_dev, served) = common::serve_passthrough(
        &dir,
        &sock,
        Config::default(),
        DeviceConfig {
            request_queues: 2,
            inline_per_batch: usize::MAX,
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
    let cfg = |ops, seed| FsxConfig {
        ops,
        seed,
        ..FsxConfig::default()
    };
    let t = std::time::Instant::now();
    let r = fsx::run(&c, ROOT_ID, b"fsx0", cfg(ops, 1)).unwrap();
    println!(
        "soak: fsx through the device, {ops} operations: A-OK in {:.1?} ({r:?})",
        t.elapsed()
    );
    assert!(r.writes > 0 && r.reads > 0 && r.truncates > 0 && r.fsyncs > 0);
    assert!(r.fallocates > 0 && r.punch_holes > 0 && r.copies > 0 && r.reopens > 0);
    let t = std::time::Instant::now();
    let runs: Vec<_> = (1..=4u64)
        .map(|i| {
            let c = c.clone();
            std::thread::spawn(move || {
                fsx::run(
                    &c,
                    ROOT_ID,
                    format!("fsx{i}").as_bytes(),
                    cfg(ops / 4, 1 + i),
                )
            })
        })
        .collect();
    for (i, h) in runs.into_iter().enumerate() {
        if let Err(e) = h.join().unwrap() {
            panic!("fsx{}: {e}", i + 1);
        }
    }
    println!(
        "soak: 4 fsx at once on distinct files, {} operations each: A-OK in {:.1?}",
        ops / 4,
        t.elapsed()
    );
    // The files on the host hold what the last reads saw.
    assert!(std::fs::metadata(dir.join("fsx0")).is_ok());
    drop(fe);
    served.join().unwrap();
    let _ = std::fs::remove_dir_all(&base);
}
