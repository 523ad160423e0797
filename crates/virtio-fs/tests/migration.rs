//! The device's state in a live migration, through the vhost-user
//! backend's own entry points (SET_DEVICE_STATE_FD over a pipe, then
//! CHECK_DEVICE_STATE), between two devices on the same host directory:
//! the second serves the first one's guest — its node ids, its handles,
//! what its INIT negotiated — and a damaged stream fails the load.

mod common;

use common::pipe;
use fuse_core::abi::ROOT_ID;
use passthrough::{Config, PassthroughFs};
use std::io::{Read, Write};
use std::path::PathBuf;
use vhost::vhost_user::message::{VhostTransferStateDirection, VhostTransferStatePhase};
use vhost_user_backend::VhostUserBackend;
use virtio_fs::testing::frontend::{FrontendConfig, VhostFrontend};
use virtio_fs::{DeviceConfig, FsDevice};

fn device(dir: &std::path::Path) -> FsDevice<PassthroughFs> {
    FsDevice::new(
        PassthroughFs::new(dir, Config::default()).unwrap(),
        DeviceConfig {
            inline_per_batch: usize::MAX,
            ..DeviceConfig::default()
        },
    )
    .unwrap()
}

fn save(dev: &FsDevice<PassthroughFs>) -> Vec<u8> {
    let (mut r, w) = pipe();
    let back = dev
        .set_device_state_fd(
            VhostTransferStateDirection::SAVE,
            VhostTransferStatePhase::STOPPED,
            w,
        )
        .unwrap();
    assert!(back.is_none(), "the pipe given is used");
    let mut state = Vec::new();
    r.read_to_end(&mut state).unwrap();
    dev.check_device_state().unwrap();
    state
}

fn load(dev: &FsDevice<PassthroughFs>, state: &[u8]) -> std::io::Result<()> {
    let (r, mut w) = pipe();
    dev.set_device_state_fd(
        VhostTransferStateDirection::LOAD,
        VhostTransferStatePhase::STOPPED,
        r,
    )?;
    w.write_all(state).unwrap();
    drop(w);
    dev.check_device_state()
}

#[test]
fn a_second_device_serves_the_first_ones_guest_after_the_state_moves() {
    let base = std::env::temp_dir().join(format!("fusebox-migration-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let dir = base.join("share");
    std::fs::create_dir_all(&dir).unwrap();
    let sock = |n: &str| -> PathBuf { base.join(n) };

    let a = device(&dir);
    let _da = common::serve_device(&a, &sock("a.sock"));
    let fe = VhostFrontend::connect(&sock("a.sock"), &FrontendConfig::default()).unwrap();
    let c = fe.client();
    let d = c.mkdir(ROOT_ID, b"d", 0o755, 0).unwrap().nodeid;
    let (f, o) = c.create(d, b"f", 0o644, libc::O_RDWR as u32, 0).unwrap();
    c.write(f.nodeid, o.fh, 0, b"before,", 0).unwrap();
    let dh = c.opendir(d).unwrap().fh;
    let state = save(&a);
    // Saving changes nothing on the source (a failed migration goes on
    // there).
    c.write(f.nodeid, o.fh, 7, b"still,", 0).unwrap();

    // A damaged stream fails the load, whatever byte it is.
    let b = device(&dir);
    for i in [0, 8, 12, state.len() / 2, state.len() - 1] {
        let mut bad = state.clone();
        bad[i] ^= 0x10;
        assert!(load(&b, &bad).is_err(), "byte {i} flipped");
    }
    assert!(load(&b, &state[..state.len() - 3]).is_err(), "cut short");
    assert_eq!(b.engine().fs().inode_count(), 1);

    load(&b, &state).unwrap();
    // What the guest negotiated came along with its INIT.
    assert_eq!(
        b.engine().dispatcher().decode_options().minor,
        a.engine().dispatcher().decode_options().minor
    );
    assert_eq!(
        b.engine().dispatcher().decode_options().flags,
        a.engine().dispatcher().decode_options().flags
    );
    let _db = common::serve_device(&b, &sock("b.sock"));
    // The guest goes on with its session: it sends no INIT.
    let resume = FrontendConfig {
        resume: c.chan().negotiated(),
        ..FrontendConfig::default()
    };
    let fe = VhostFrontend::connect(&sock("b.sock"), &resume).unwrap();
    let c = fe.client();
    c.write(f.nodeid, o.fh, 13, b"after", 0).unwrap();
    assert_eq!(
        std::fs::read(dir.join("d/f")).unwrap(),
        b"before,still,after"
    );
    let names: Vec<Vec<u8>> = c
        .readdir(d, dh, 0, 4096)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(names.contains(&b"f".to_vec()), "{names:?}");
    let _ = std::fs::remove_dir_all(&base);
}
