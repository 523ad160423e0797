//! A forget flood against the passthrough, through the whole device on a
//! real vhost-user socket: while the guest (the engine as frontend)
//! forgets 40,000 inodes in BATCH_FORGETs on the hiprio queue, LOOKUPs
//! on the request queue go on being answered. Prints LOOKUP latency
//! percentiles with and without the flood (docs/SECURITY.md records
//! them); asserts only liveness (a starved LOOKUP would take seconds).

mod common;

use fuse_core::abi::ROOT_ID;
use passthrough::Config;
use std::time::{Duration, Instant};
use virtio_fs::testing::frontend::{FrontendConfig, VhostFrontend};
use virtio_fs::DeviceConfig;

const FILES: usize = 40_000;

fn percentiles(mut v: Vec<Duration>) -> (Duration, Duration, Duration) {
    v.sort_unstable();
    let at = |p: f64| v[((v.len() - 1) as f64 * p) as usize];
    (at(0.5), at(0.99), *v.last().unwrap())
}

fn lookups_while(c: &fuse_core::client::Client, mut busy: impl FnMut() -> bool) -> Vec<Duration> {
    let mut lat = Vec::new();
    while busy() || lat.len() < 200 {
        let t = Instant::now();
        let e = c.lookup(ROOT_ID, b"probe").unwrap();
        lat.push(t.elapsed());
        c.forget(e.nodeid, 1);
    }
    lat
}

#[test]
fn lookups_are_served_while_the_guest_forgets_forty_thousand_inodes() {
    let base = std::env::temp_dir().join(format!("fusebox-forgets-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let dir = base.join("share");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..FILES {
        std::fs::File::create(dir.join(format!("f{i}"))).unwrap();
    }
    std::fs::write(dir.join("probe"), b"p").unwrap();
    let sock = base.join("vfs.sock");
    let (dev, served) = common::serve_passthrough(
        &dir,
        &sock,
        Config {
            inode_file_handles: true,
            // Within this test process's own fd limit.
            max_fds: 4096,
            ..Config::default()
        },
        DeviceConfig {
            inline_per_batch: usize::MAX,
            ..DeviceConfig::default()
        },
    );
    let fe = VhostFrontend::connect(&sock, &FrontendConfig::default()).unwrap();
    let c = fe.client();
    let nodes: Vec<u64> = (0..FILES)
        .map(|i| {
            c.lookup(ROOT_ID, format!("f{i}").as_bytes())
                .unwrap()
                .nodeid
        })
        .collect();
    let fs = dev.engine().fs();
    assert!(fs.inode_count() > FILES);

    let quiet = percentiles(lookups_while(c, || false));
    let chan = c.chan().clone();
    let flood = std::thread::spawn(move || {
        for n in nodes {
            chan.send_forget(n, 1);
        }
    });
    let t = Instant::now();
    let under = lookups_while(c, || !flood.is_finished() || fs.inode_count() > 2);
    let took = t.elapsed();
    flood.join().unwrap();
    let under = percentiles(under);
    println!(
        "forget flood: {FILES} forgets in {took:?}; LOOKUP p50/p99/max quiet {:?}/{:?}/{:?}, \
         during the flood {:?}/{:?}/{:?}",
        quiet.0, quiet.1, quiet.2, under.0, under.1, under.2
    );
    assert!(fs.inode_count() <= 2, "{} inodes left", fs.inode_count());
    assert!(
        under.2 < Duration::from_secs(2),
        "a LOOKUP waited {:?}",
        under.2
    );
    drop(fe);
    served.join().unwrap();
    let _ = std::fs::remove_dir_all(&base);
}
