//! The fsx-style checker itself: it passes on a correct server (MemFs
//! through the embedded engine) and catches a server that returns short
//! reads (fault injection), so a passing soak means something.

use fuse_core::abi::ROOT_ID;
use fuse_core::embedded::{Embedded, Options};
use fuse_core::server::faults::{FaultPlan, Faulty};
use fuse_core::testing::fsx::{self, FsxConfig, FsxError};
use fuse_core::testing::memfs::MemFs;

fn cfg(ops: u64) -> FsxConfig {
    FsxConfig {
        ops,
        seed: 9,
        max_len: 256 * 1024,
        max_op: 32 * 1024,
    }
}

#[test]
fn passes_on_a_correct_server() {
    let e = Embedded::start(MemFs::new(), Options::default()).unwrap();
    let r = fsx::run(e.client(), ROOT_ID, b"f", cfg(3000)).unwrap();
    assert!(r.writes > 500 && r.reads > 500 && r.truncates > 100 && r.reopens > 50);
}

#[test]
fn catches_short_reads() {
    let plan = FaultPlan::parse("read:short:p=0.2", 1).unwrap();
    let e = Embedded::start(Faulty::new(MemFs::new(), plan), Options::default()).unwrap();
    match fsx::run(e.client(), ROOT_ID, b"f", cfg(3000)) {
        Err(FsxError::Mismatch { .. }) => {}
        other => panic!("short reads not caught: {other:?}"),
    }
}
