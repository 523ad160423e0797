//! Handle ids a migration's state stream gives (`Handles::insert(.., at)`)
//! against the handle table's hasher: the stream is untrusted, so ids it
//! picks must not make every handle lookup of the destination walk the
//! whole table. Needs root (mounts a tmpfs).

mod common;

use common::{HostDir, Kind};
use fuse_core::abi::ROOT_ID;
use fuse_core::server::state::StateWriter;
use fuse_core::server::{Ctx, Filesystem};
use fuse_core::Errno;
use passthrough::{Config, PassthroughFs};
use std::path::Path;
use std::time::{Duration, Instant};

/// Handles in the stream (each takes an fd: well under the test's limit).
const N: u64 = 12_000;
/// Lookups timed per try.
const LOOKUPS: u64 = 10_000;

/// A state of `N` handles of the shared directory, with ids `id(1..=N)`.
fn state(id: impl Fn(u64) -> u64) -> Vec<u8> {
    let mut w = StateWriter::new();
    w.u32(1).u32(0).u32(N as u32);
    for i in 1..=N {
        // Handle, node, open flags, opener uid, gid, root, no groups.
        w.u64(id(i)).u64(ROOT_ID).u32(libc::O_RDONLY as u32);
        w.u32(0).u32(0).u8(1).u32(0);
    }
    w.u32(0);
    w.finish()
}

/// Loads the state with ids `id` into a fresh destination on `dir`, then
/// times `LOOKUPS` lookups of a handle id `id(N + 1)` it does not hold
/// (EBADF; no host call): the best of a few tries.
fn lookups_with(dir: &Path, id: impl Fn(u64) -> u64) -> (Duration, Duration) {
    let fs = PassthroughFs::new(dir, Config::default()).unwrap();
    let t = Instant::now();
    fs.load_state(&state(&id)).unwrap();
    let load = t.elapsed();
    assert_eq!(fs.handle_count(), N as usize);
    let ctx = Ctx::default();
    let missing = id(N + 1);
    let mut best = Duration::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..LOOKUPS {
            let r = fs.lseek(&ctx, ROOT_ID, missing, 0, libc::SEEK_DATA as u32);
            assert_eq!(r.unwrap_err(), Errno::EBADF);
        }
        best = best.min(t.elapsed());
    }
    (load, best)
}

/// Ids with the same low bits (multiples of 2^40, all under the loader's
/// MAX_RESTORED_ID) cost a lookup about what sequential ids do.
#[test]
fn handle_ids_from_a_state_stream_do_not_make_lookups_walk_the_table() {
    let host = HostDir::new(Kind::Tmpfs);
    let (load_seq, seq) = lookups_with(&host.path, |i| i);
    let (load_odd, odd) = lookups_with(&host.path, |i| i << 40);
    println!(
        "sequential ids: load {load_seq:?}, {LOOKUPS} lookups {seq:?}; \
         ids i << 40: load {load_odd:?}, {LOOKUPS} lookups {odd:?}"
    );
    assert!(
        odd < seq * 4,
        "lookups {odd:?} with ids i << 40, {seq:?} with sequential ids"
    );
}
