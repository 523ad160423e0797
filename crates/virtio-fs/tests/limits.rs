//! Resource limits through the whole device, no VM: a guest (the engine
//! as frontend) that holds 10,000 files open against a 1,024-fd cap gets
//! clean EMFILE errors, the daemon keeps serving, and everything works
//! again once the guest closes and forgets them.

mod common;

use passthrough::Config;
use virtio_fs::DeviceConfig;

use fuse_core::abi::ROOT_ID;
use fuse_core::Errno;
use virtio_fs::testing::frontend::{FrontendConfig, VhostFrontend};

#[test]
fn ten_thousand_open_files_against_a_1024_fd_cap() {
    let base = std::env::temp_dir().join(format!("fusebox-limits-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let dir = base.join("share");
    std::fs::create_dir_all(&dir).unwrap();
    let sock = base.join("vfs.sock");
    let (dev, served) = common::serve_passthrough(
        &dir,
        &sock,
        Config {
            max_fds: 1024,
            ..Config::default()
        },
        DeviceConfig {
            inline_per_batch: usize::MAX,
            ..DeviceConfig::default()
        },
    );
    let fe = VhostFrontend::connect(&sock, &FrontendConfig::default()).unwrap();
    let c = fe.client();

    let (mut open, mut refused) = (Vec::new(), 0);
    for i in 0..10_000 {
        match c.create(
            ROOT_ID,
            format!("f{i}").as_bytes(),
            0o644,
            libc::O_RDWR as u32,
            0,
        ) {
            Ok((e, o)) => open.push((e.nodeid, o.fh)),
            Err(e) => {
                assert_eq!(e, Errno::EMFILE, "file {i}");
                refused += 1;
            }
        }
    }
    // Each open file costs the daemon two fds (the inode's and the open
    // file's): about half the cap is open, the rest refused cleanly.
    println!(
        "limits: {} of 10000 opened, {refused} refused with EMFILE, daemon holds {} fds",
        open.len(),
        dev.engine().fs().fds_in_use()
    );
    assert!(open.len() >= 400 && open.len() <= 1024, "{}", open.len());
    assert_eq!(open.len() + refused, 10_000);
    assert!(dev.engine().fs().fds_in_use() <= 1024);
    // Still serving at the cap.
    assert!(c.getattr(ROOT_ID, None).is_ok());
    assert_eq!(c.lookup(ROOT_ID, b"nope").unwrap_err(), Errno::ENOENT);
    // Closing (and forgetting) gives the fds back: opening works again.
    for (node, fh) in open.drain(..) {
        c.release(node, fh, 0).unwrap();
        c.forget(node, 1);
    }
    let t = std::time::Instant::now();
    while dev.engine().fs().fds_in_use() > 16 {
        assert!(t.elapsed().as_secs() < 10, "fds not given back");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    for i in 0..200 {
        let (e, o) = c
            .create(
                ROOT_ID,
                format!("g{i}").as_bytes(),
                0o644,
                libc::O_RDWR as u32,
                0,
            )
            .unwrap();
        c.release(e.nodeid, o.fh, 0).unwrap();
    }
    drop(fe);
    served.join().unwrap();
    let _ = std::fs::remove_dir_all(&base);
}
