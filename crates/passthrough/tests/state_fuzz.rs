//! Stable fuzz harness for the passthrough's migration state load
//! (`Filesystem::load_state`): real states saved from daemons holding
//! inodes, handles and POSIX locks, mutated (bits, counts, lengths, tags,
//! cuts, splices), random bytes, and streams whose counts the rest of the
//! stream could hold only as the smallest records, each taken up by a
//! fresh destination on a real tmpfs share. Every load must end in
//! success or a `StateError` naming the stream or a refusal, never a
//! panic, and allocate no more than a small multiple of the stream's size
//! (a counting allocator measures each load on its own thread).
//! `FUSEBOX_STATE_FUZZ_ITERS` sets the count, `FUSEBOX_STATE_FUZZ_SEED`
//! the seed (printed). Needs root (mounts the tmpfs).

mod common;

use common::{HostDir, Kind};
use fuse_core::abi::{FileLock, ROOT_ID};
use fuse_core::embedded::{Embedded, Options};
use fuse_core::server::state::{StateError, StateWriter};
use fuse_core::server::Filesystem;
use fuse_core::testing::rng::Rng;
use passthrough::{Config, PassthroughFs};
use passthrough::{MigrationConfig, MigrationMode, MigrationOnError};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::{Path, PathBuf};

/// The system allocator, counting the bytes each thread has allocated and
/// not freed, and the most it had at once.
struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn note(delta: isize) {
    // try_with: a thread's last frees come after its locals are gone.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: every call goes to the system allocator with the caller's
// arguments unchanged; the counting touches only const-initialised
// thread locals, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, as GlobalAlloc::alloc requires.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            note(layout.size() as isize);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as alloc.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            note(layout.size() as isize);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator (the system's) with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        note(-(layout.size() as isize));
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout`; the caller
        // checked `new_size`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            note(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// `f`'s result, and the most bytes it had allocated at once on this
/// thread beyond what was allocated before it ran.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let r = f();
    let peak = PEAK.with(Cell::get);
    (r, usize::try_from(peak - base).unwrap_or(0))
}

/// The most a load may allocate: a small multiple of its stream (what it
/// takes up: table entries, the locks' ranges) and a constant (one
/// record's strings: a path, 65,536 groups).
fn allowed(len: usize) -> usize {
    3 * len + (1 << 20)
}

/// Encoded size of the smallest inode record (node id, references, file
/// type, locator tag, an empty path, no verify handle), which the loader
/// checks counts against.
const INODE_MIN: usize = 8 + 8 + 4 + 1 + 4 + 1;

fn config(mode: MigrationMode, on_error: MigrationOnError, verify: bool) -> Config {
    Config {
        migration: MigrationConfig {
            mode,
            on_error,
            verify_handles: verify,
        },
        ..Config::default()
    }
}

const CONFIGS: [(MigrationMode, MigrationOnError, bool); 4] = [
    (MigrationMode::FindPaths, MigrationOnError::Abort, false),
    (MigrationMode::FindPaths, MigrationOnError::GuestError, true),
    (MigrationMode::FileHandles, MigrationOnError::Abort, false),
    (
        MigrationMode::FileHandles,
        MigrationOnError::GuestError,
        false,
    ),
];

struct Share {
    _host: HostDir,
    dir: PathBuf,
}

/// A tmpfs share with files, a subdirectory, a symlink, and a secret next
/// to it.
fn share() -> Share {
    let host = HostDir::new(Kind::Tmpfs);
    let dir = host.path.join("share");
    std::fs::create_dir_all(dir.join("d")).unwrap();
    std::fs::create_dir_all(host.path.join("outside")).unwrap();
    std::fs::write(host.path.join("outside/secret"), b"secret").unwrap();
    std::fs::write(dir.join("a"), b"a").unwrap();
    std::fs::write(dir.join("d/b"), b"b").unwrap();
    std::os::unix::fs::symlink("a", dir.join("l")).unwrap();
    Share { _host: host, dir }
}

const RW: u32 = libc::O_RDWR as u32;

/// Real states: saved by daemons of each configuration holding inodes
/// (looked up, created, one unlinked while open), handles of files and a
/// directory, and POSIX locks.
fn saved_states(dir: &Path) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (i, &(mode, on_error, verify)) in CONFIGS.iter().enumerate() {
        let src = Embedded::start(
            PassthroughFs::new(dir, config(mode, on_error, verify)).unwrap(),
            Options::default(),
        )
        .unwrap();
        let c = src.client();
        let d = c.lookup(ROOT_ID, b"d").unwrap().nodeid;
        c.lookup(d, b"b").unwrap();
        let a = c.lookup(ROOT_ID, b"a").unwrap().nodeid;
        c.lookup(ROOT_ID, b"l").unwrap();
        let fh = c.open(a, RW).unwrap().fh;
        c.opendir(d).unwrap();
        let lock = |typ: i32, start, end| FileLock {
            start,
            end,
            typ: typ as u32,
            pid: 42,
        };
        c.setlk(a, fh, 7, lock(libc::F_WRLCK, 0, 9), false).unwrap();
        c.setlk(a, fh, 8, lock(libc::F_RDLCK, 100, 199), false)
            .unwrap();
        let name = format!("new{i}");
        let (e, o) = c.create(d, name.as_bytes(), 0o644, RW, 0).unwrap();
        c.write(e.nodeid, o.fh, 0, b"data", 0).unwrap();
        if on_error == MigrationOnError::GuestError || mode == MigrationMode::FileHandles {
            // Carried by handle, or as lost.
            let name = format!("gone{i}");
            c.create(ROOT_ID, name.as_bytes(), 0o644, RW, 0).unwrap();
            c.unlink(ROOT_ID, name.as_bytes()).unwrap();
        }
        out.push(src.fs().save_state().unwrap());
    }
    out
}

/// States made here: an opener with groups, an owner with many ranges, a
/// lost inode and a lost handle.
fn made_states() -> Vec<Vec<u8>> {
    let mut w = StateWriter::new();
    w.u32(1).u32(2);
    w.u64(2).u64(1).u32(libc::S_IFREG).u8(1).bytes(b"a").u8(0);
    w.u64(3).u64(5).u32(libc::S_IFDIR).u8(3).bytes(b"why").u8(0);
    w.u32(2);
    w.u64(1).u64(2).u32(RW).u32(1000).u32(1000).u8(0).u32(3);
    w.u32(4).u32(27).u32(100);
    w.u64(2).u64(0).u32(u32::MAX).u32(0).u32(0).u8(0).u32(0);
    w.u32(1);
    w.u64(2).u64(7).u32(RW).u32(42).u32(40);
    for i in 0..40u64 {
        w.u32(if i % 2 == 0 { 0 } else { 1 })
            .u64(i * 10)
            .u64(i * 10 + 4);
    }
    vec![w.finish()]
}

/// Values that make counts and lengths interesting.
fn interesting_u32(rng: &mut Rng, len: usize) -> u32 {
    let len = len as u32;
    let v = [
        0,
        1,
        2,
        3,
        127,
        128,
        129,
        4096,
        4097,
        65536,
        65537,
        u32::MAX,
        u32::MAX - 1,
        1 << 31,
        len,
        len / INODE_MIN as u32,
        len / 4,
        len / 20,
    ];
    v[rng.below_usize(v.len())]
}

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut v = seeds[rng.below_usize(seeds.len())].clone();
    for _ in 0..1 + rng.below_usize(4) {
        let at = rng.below_usize(v.len() + 1);
        match rng.below_usize(10) {
            0 if !v.is_empty() => {
                let i = rng.below_usize(v.len());
                v[i] ^= 1 << rng.below_usize(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below_usize(v.len());
                v[i] = rng.next_u64() as u8;
            }
            2 if v.len() >= 4 => {
                let i = rng.below_usize(v.len() - 3);
                let x = interesting_u32(rng, v.len() - i);
                v[i..i + 4].copy_from_slice(&x.to_le_bytes());
            }
            3 if v.len() >= 8 => {
                let i = rng.below_usize(v.len() - 7);
                let x = [0, 1, 2, u64::MAX, u64::MAX / 2, 1 << 63][rng.below_usize(6)];
                v[i..i + 8].copy_from_slice(&x.to_le_bytes());
            }
            4 => v.truncate(at),
            5 => {
                let n = 1 + rng.below_usize(64);
                let b = rng.bytes(n);
                v.splice(at..at, b);
            }
            6 => {
                let end = (at + rng.below_usize(64)).min(v.len());
                v.drain(at..end);
            }
            7 => {
                let end = (at + rng.below_usize(256)).min(v.len());
                let part = v[at..end].to_vec();
                let to = rng.below_usize(v.len() + 1);
                v.splice(to..to, part);
            }
            8 => {
                let other = &seeds[rng.below_usize(seeds.len())];
                let from = rng.below_usize(other.len() + 1);
                v.truncate(at);
                v.extend_from_slice(&other[from..]);
            }
            _ => {
                let n = rng.below_usize(32);
                v.extend(rng.bytes(n));
            }
        }
    }
    v
}

/// A stream of the current version whose first count (of inodes, or of
/// handles or lock owners after empty sections) the rest could hold only
/// as the smallest records, followed by `fill`: zeros, random bytes, or
/// smallest inode records carried as lost.
fn big_count(rng: &mut Rng) -> Vec<u8> {
    let body = (1 << 20) + rng.below_usize(1 << 20);
    let mut w = StateWriter::new();
    w.u32(1);
    let (skip, min) = [(0, INODE_MIN), (1, 33), (2, 28)][rng.below_usize(3)];
    for _ in 0..skip {
        w.u32(0);
    }
    w.u32((body / min) as u32);
    let mut v = w.finish();
    match rng.below_usize(3) {
        0 => v.resize(v.len() + body, 0),
        1 => v.extend(rng.bytes(body)),
        _ => {
            let mut w = StateWriter::new();
            for i in 0..body / INODE_MIN {
                w.u64(2 + i as u64).u64(1).u32(0).u8(3).bytes(b"").u8(0);
            }
            v.extend(w.finish());
        }
    }
    v
}

/// Loads `input` into a fresh destination of configuration `cfg` on
/// `dir`: how it ended (0: taken up, 1: corrupt, 2: another version, 3:
/// refused). Panics (with the input saved to a file) on anything but a
/// clean end within the allocation bound.
fn load_one(dir: &Path, cfg: usize, input: &[u8], seed: u64, i: u64) -> usize {
    let (mode, on_error, verify) = CONFIGS[cfg];
    let fs = PassthroughFs::new(dir, config(mode, on_error, verify)).unwrap();
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        peak_of(|| fs.load_state(input))
    }));
    let fail = |why: String| -> ! {
        let saved = std::env::temp_dir().join(format!("fusebox-state-fuzz-{seed}-{i}"));
        std::fs::write(&saved, input).unwrap();
        panic!(
            "seed {seed}, input {i} ({} bytes, config {cfg}, saved to {}): {why}",
            input.len(),
            saved.display()
        );
    };
    match run {
        Err(_) => fail("load_state panicked".into()),
        Ok((Err(StateError::Unsupported), _)) => fail("Unsupported".into()),
        Ok((_, peak)) if peak > allowed(input.len()) => fail(format!(
            "allocated {peak} bytes at once, more than {}",
            allowed(input.len())
        )),
        Ok((Ok(()), _)) => 0,
        Ok((Err(StateError::Corrupt(_)), _)) => 1,
        Ok((Err(StateError::Version { .. }), _)) => 2,
        Ok((Err(StateError::Refused { .. }), _)) => 3,
    }
}

#[test]
fn hostile_states_never_panic_and_load_in_bounded_memory() {
    let iters: u64 = std::env::var("FUSEBOX_STATE_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let seed: u64 = std::env::var("FUSEBOX_STATE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("state fuzz: seed {seed}, {iters} inputs");
    let s = share();
    let mut seeds = saved_states(&s.dir);
    // Every saved state loads whole into a destination of its kind.
    for (cfg, st) in seeds.iter().enumerate() {
        let (mode, on_error, verify) = CONFIGS[cfg];
        let fs = PassthroughFs::new(&s.dir, config(mode, on_error, verify)).unwrap();
        if let Err(e) = fs.load_state(st) {
            // Only the file unlinked while open, gone with its source.
            assert!(matches!(e, StateError::Refused { .. }), "config {cfg}: {e}");
        }
    }
    seeds.extend(made_states());
    let mut rng = Rng::new(seed | 1);
    let mut ends = [0u64; 4];
    for i in 0..iters {
        let input = match rng.below_usize(100) {
            0 => big_count(&mut rng),
            1..=5 => {
                let n = rng.below_usize(256);
                let mut v = rng.bytes(n);
                if v.len() >= 4 && rng.below_usize(2) == 0 {
                    v[..4].copy_from_slice(&1u32.to_le_bytes());
                }
                v
            }
            _ => mutate(&mut rng, &seeds),
        };
        let cfg = rng.below_usize(CONFIGS.len());
        ends[load_one(&s.dir, cfg, &input, seed, i)] += 1;
    }
    // Nothing the loads did reached outside the share.
    assert_eq!(
        std::fs::read(s.dir.parent().unwrap().join("outside/secret")).unwrap(),
        b"secret"
    );
    let [taken, corrupt, version, refused] = ends;
    println!(
        "state fuzz: {taken} taken up, {corrupt} corrupt, {version} of another version, \
         {refused} refused"
    );
}

#[test]
fn a_count_the_stream_could_hold_allocates_nothing_for_records_that_are_not_there() {
    // 64 MiB after an inode count the stream could hold at the smallest
    // record's size (26 bytes), none of it a record: the load is refused
    // at the first, with nothing allocated for the count (a decoded
    // record is several times its encoded size).
    let s = share();
    let body = 64 << 20;
    let mut w = StateWriter::new();
    w.u32(1).u32((body / INODE_MIN) as u32);
    let mut input = w.finish();
    input.resize(input.len() + body, 0);
    let fs = PassthroughFs::new(&s.dir, Config::default()).unwrap();
    let (r, peak) = peak_of(|| fs.load_state(&input));
    let e = r.unwrap_err();
    assert!(matches!(e, StateError::Corrupt(_)), "{e}");
    assert!(e.to_string().contains("locator tag 0"), "{e}");
    assert!(
        peak < 1 << 20,
        "{peak} bytes allocated for a refused stream"
    );
    assert_eq!(fs.inode_count(), 1);
}
