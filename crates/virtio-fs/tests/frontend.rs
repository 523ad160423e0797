//! The whole device end to end in process, no VM: fusebox's device (the
//! passthrough filesystem of a temporary directory behind it) on a real
//! vhost-user socket, and the engine as its guest through the frontend.

mod common;

use fuse_core::abi::{Opcode, ROOT_ID};
use passthrough::{Config, PassthroughFs};
use std::path::PathBuf;
use virtio_fs::testing::frontend::{FrontendConfig, VhostFrontend};
use virtio_fs::{DeviceConfig, FsDevice};

struct Served {
    dir: PathBuf,
    sock: PathBuf,
    dev: FsDevice<PassthroughFs>,
    daemon: Option<std::thread::JoinHandle<()>>,
}

fn serve(name: &str, queues: u16) -> Served {
    let base = std::env::temp_dir().join(format!("fusebox-frontend-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let dir = base.join("share");
    std::fs::create_dir_all(&dir).unwrap();
    let sock = base.join("vfs.sock");
    let fs = PassthroughFs::new(&dir, Config::default()).unwrap();
    let dev = FsDevice::new(
        fs,
        DeviceConfig {
            request_queues: queues,
            // As the fusebox binary runs it by default: the vring threads
            // serve in line.
            inline_per_batch: usize::MAX,
            ..DeviceConfig::default()
        },
    )
    .unwrap();
    let daemon = common::serve_device(&dev, &sock);
    Served {
        dir,
        sock,
        dev,
        daemon: Some(daemon),
    }
}

#[test]
fn the_engine_drives_the_device_over_vhost_user() {
    let mut s = serve("e2e", 2);
    let fe = VhostFrontend::connect(
        &s.sock,
        &FrontendConfig {
            request_queues: 2,
            ..FrontendConfig::default()
        },
    )
    .unwrap();
    let c = fe.client();
    // Metadata and data through the queues, checked on the host.
    let d = c.mkdir(ROOT_ID, b"dir", 0o755, 0).unwrap();
    let (f, o) = c
        .create(d.nodeid, b"file", 0o640, libc::O_RDWR as u32, 0)
        .unwrap();
    let data: Vec<u8> = (0..(1 << 20) + 777).map(|i| (i * 31 % 251) as u8).collect();
    let mut off = 0;
    for chunk in data.chunks(256 * 1024) {
        assert_eq!(
            c.write(f.nodeid, o.fh, off, chunk, 0).unwrap() as usize,
            chunk.len()
        );
        off += chunk.len() as u64;
    }
    let mut back = Vec::new();
    while back.len() < data.len() {
        let got = c
            .read(f.nodeid, o.fh, back.len() as u64, 128 * 1024)
            .unwrap();
        assert!(!got.is_empty());
        back.extend_from_slice(&got);
    }
    assert!(back == data, "data read back differs");
    assert_eq!(std::fs::read(s.dir.join("dir/file")).unwrap(), data);
    assert_eq!(
        c.getattr(f.nodeid, None).unwrap().attr.size,
        data.len() as u64
    );
    c.release(f.nodeid, o.fh, 0).unwrap();
    // Errors come back as errors.
    assert_eq!(
        c.lookup(ROOT_ID, b"missing").unwrap_err(),
        fuse_core::Errno::ENOENT
    );
    c.unlink(d.nodeid, b"file").unwrap();
    assert!(!s.dir.join("dir/file").exists());
    // FORGET travels on hiprio; requests spread over both request queues.
    c.forget(f.nodeid, 1);
    let t = std::time::Instant::now();
    while s.dev.stats().queues()[0].completed() == 0 {
        assert!(t.elapsed().as_secs() < 5, "the forget never arrived");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let per = fe.requests_per_queue();
    assert!(per[1] > 0 && per[2] > 0, "requests per queue: {per:?}");
    let used: Vec<u64> = s.dev.stats().queues()[1..]
        .iter()
        .map(|q| q.completed())
        .collect();
    assert_eq!(
        used.iter().sum::<u64>(),
        per[1] + per[2],
        "{used:?} vs {per:?}"
    );
    assert!(s.dev.stats().op_count(Opcode::Write) >= 5);
    // The frontend leaving ends the daemon's connection.
    drop(fe);
    s.daemon.take().unwrap().join().unwrap();
}
