//! Cached READs copied out of a shared mapping of the host file
//! (`Config::mapped_reads`): offered with `Filesystem::start_read` on this
//! thread, as a serving loop does, into client memory standing in for guest
//! RAM; the file opened through the engine's embedded client. A file the
//! page cache holds whole is read through its mapping after the first
//! reads; the answers are the file's bytes, short at its end, and a
//! truncation on the host gives a short read, not zeros and not a SIGBUS
//! that kills. Needs root (mount, loop devices).

mod common;

use common::{drop_cache, read, read_into, Kind, Loop, Mem, Mount, Via};
use fuse_core::abi::ROOT_ID;
use passthrough::Config;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

const PAGE: usize = 4096;
/// The test file: 64 pages.
const SIZE: usize = 64 * PAGE;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i / 3 % 251) as u8 ^ seed).collect()
}

/// A mount of `kind` with a file "f" of `SIZE` pattern bytes, in the
/// page cache, open through the client: (mount, node, handle, data).
fn setup(kind: Kind, cfg: Config) -> (Mount, u64, u64, Vec<u8>) {
    let m = Mount::new(kind, cfg, Via::Device(1));
    let data = pattern(SIZE, 0);
    std::fs::write(m.path("f"), &data).unwrap();
    let e = m.client.lookup(ROOT_ID, b"f").unwrap();
    let o = m.client.open(e.nodeid, libc::O_RDONLY as u32).unwrap();
    (m, e.nodeid, o.fh, data)
}

/// Reads `len` bytes at `off` until one is copied out of the file's
/// mapping (the residency check runs on a thread of its own, after the
/// first reads), each answer checked against `want`.
fn read_until_mapped(m: &Mount, lp: &mut Loop, h: (u64, u64), off: u64, want: &[u8]) {
    let t = Instant::now();
    loop {
        let before = m.fs().io_counts().read_mapped;
        let (r, got) = read(m, lp, h, off, want.len());
        assert_eq!(r, Ok(want.len()));
        assert!(got == want, "wrong bytes at {off}");
        if m.fs().io_counts().read_mapped > before {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "never read through the mapping"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Reads every page but the last, twice over, checking each answer.
fn read_all(m: &Mount, lp: &mut Loop, h: (u64, u64), data: &[u8]) {
    for round in 0..2 {
        for p in 0..SIZE / PAGE - 1 {
            let off = p * PAGE + round * 100;
            let (r, got) = read(m, lp, h, off as u64, PAGE);
            assert_eq!(r, Ok(PAGE), "page {p}");
            assert!(
                got[..PAGE] == data[off..off + PAGE],
                "page {p}: wrong bytes"
            );
        }
    }
}

#[test]
fn a_wholly_cached_file_is_read_through_its_mapping() {
    for kind in [Kind::Ext4, Kind::Tmpfs] {
        let (m, node, fh, data) = setup(kind, Config::default());
        let fs = m.fs();
        let mut lp = Loop::new(fs);
        read_until_mapped(&m, &mut lp, (node, fh), 0, &data[..PAGE]);
        // Most of a round's reads (a check that expires meanwhile has the
        // reads go the usual way until the next is done: on a loaded
        // machine, rounds again).
        let t = Instant::now();
        loop {
            let before = fs.io_counts();
            read_all(&m, &mut lp, (node, fh), &data);
            let n = fs.io_counts().read_mapped - before.read_mapped;
            if n >= 63 {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "{kind:?}: {n} mapped reads of 126"
            );
        }
        // The file's last page: its end is not to be had from a mapping.
        let (r, got) = read(&m, &mut lp, (node, fh), (SIZE - PAGE + 10) as u64, PAGE);
        assert_eq!(r, Ok(PAGE - 10));
        assert!(got[..PAGE - 10] == data[SIZE - PAGE + 10..]);
        // A host write shows through the mapping.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(m.path("f"))
            .unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, b"host", 5 * PAGE as u64).unwrap();
        let mut want = data[5 * PAGE..6 * PAGE].to_vec();
        want[..4].copy_from_slice(b"host");
        read_until_mapped(&m, &mut lp, (node, fh), 5 * PAGE as u64, &want);
        m.client.release(node, fh, 0).unwrap();
    }
}

#[test]
fn off_the_mapped_reads_go_the_usual_way() {
    let cfg = Config {
        mapped_reads: false,
        ..Config::default()
    };
    let (m, node, fh, data) = setup(Kind::Ext4, cfg);
    let fs = m.fs();
    let mut lp = Loop::new(fs);
    read_all(&m, &mut lp, (node, fh), &data);
    assert_eq!(fs.io_counts().read_mapped, 0);
    m.client.release(node, fh, 0).unwrap();
}

#[test]
fn a_truncation_on_the_host_gives_short_reads_not_zeros() {
    for kind in [Kind::Ext4, Kind::Tmpfs] {
        let (m, node, fh, data) = setup(kind, Config::default());
        let fs = m.fs();
        let mut lp = Loop::new(fs);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(m.path("f"))
            .unwrap();
        // Cut to 100 bytes into page 10: pages 11 and on are gone under
        // the mapping, page 10's tail reads as zeros through it. Until the
        // first read after the cut met the fence (a SIGBUS in the copy):
        // on a loaded machine the check may lapse first.
        let cut = 10 * PAGE + 100;
        let t = Instant::now();
        loop {
            std::os::unix::fs::FileExt::write_all_at(&f, &data, 0).unwrap();
            read_until_mapped(&m, &mut lp, (node, fh), 0, &data[..PAGE]);
            let faults = fs.io_counts().read_mapped_faults;
            f.set_len(cut as u64).unwrap();
            let (r, got) = read(&m, &mut lp, (node, fh), 10 * PAGE as u64, PAGE);
            assert_eq!(r, Ok(100), "{kind:?}: the read in the cut page");
            assert!(got[..100] == data[10 * PAGE..cut]);
            if fs.io_counts().read_mapped_faults > faults {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "{kind:?}: the fence never met"
            );
        }
        let (r, _) = read(&m, &mut lp, (node, fh), 20 * PAGE as u64, PAGE);
        assert_eq!(r, Ok(0), "{kind:?}: a read past the new end");
        let (r, got) = read(&m, &mut lp, (node, fh), 10 * PAGE as u64 - 50, PAGE);
        assert_eq!(r, Ok(150), "{kind:?}: a read across the new end");
        assert!(got[..150] == data[10 * PAGE - 50..cut]);
        // Written back whole: the mapped reads resume.
        std::os::unix::fs::FileExt::write_all_at(&f, &data, 0).unwrap();
        read_until_mapped(&m, &mut lp, (node, fh), 0, &data[..PAGE]);
        m.client.release(node, fh, 0).unwrap();
    }
}

#[test]
fn a_file_not_wholly_cached_is_not_read_through_a_mapping() {
    let (m, node, fh, data) = setup(Kind::Ext4, Config::default());
    let fs = m.fs();
    let f = drop_cache(&m.path("f"));
    // No readahead on the host's reads below.
    // SAFETY: posix_fadvise on an open fd takes no memory.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    assert_eq!(r, 0);
    let mut lp = Loop::new(fs);
    // The even pages only, each read (and so cached) on the host first:
    // every READ is a cached one, the odd pages stay out of the cache.
    let before = fs.io_counts();
    for _ in 0..4 {
        for p in (0..SIZE / PAGE - 1).step_by(2) {
            let off = (p * PAGE) as u64;
            let mut b = vec![0u8; PAGE];
            std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, off).unwrap();
            let (r, got) = read(&m, &mut lp, (node, fh), off, PAGE);
            assert_eq!(r, Ok(PAGE));
            assert!(got == data[p * PAGE..(p + 1) * PAGE]);
        }
        // Time for the check the reads asked for to run.
        std::thread::sleep(Duration::from_millis(20));
    }
    let after = fs.io_counts();
    assert_eq!(after.read_mapped, before.read_mapped, "{after:?}");
    m.client.release(node, fh, 0).unwrap();
}

#[test]
fn a_read_into_more_spans_than_one_copy_takes_is_read_whole() {
    // 1100 spans of 4 bytes: more than the 1024 iovecs a read takes at
    // once. A mapped read would stop there; the usual path goes on.
    let (m, node, fh, data) = setup(Kind::Ext4, Config::default());
    let mut lp = Loop::new(m.fs());
    read_until_mapped(&m, &mut lp, (node, fh), 0, &data[..PAGE]);
    let mem = Mem::split(&vec![0xee; 4400], 4);
    let (r, got) = read_into(&m, &mut lp, (node, fh), 100, mem);
    assert_eq!(r, Ok(4400));
    assert!(got == data[100..4500]);
    m.client.release(node, fh, 0).unwrap();
}

#[test]
fn handles_of_files_that_cannot_be_mapped_read_the_usual_way() {
    // O_DIRECT asks for the disk; a file of one page always reads its
    // last page.
    let (m, node, _, data) = setup(Kind::Ext4, Config::default());
    let mut lp = Loop::new(m.fs());
    let o = m
        .client
        .open(node, (libc::O_RDONLY | libc::O_DIRECT) as u32)
        .unwrap();
    std::fs::write(m.path("small"), &data[..PAGE]).unwrap();
    let e = m.client.lookup(ROOT_ID, b"small").unwrap();
    let small = m.client.open(e.nodeid, libc::O_RDONLY as u32).unwrap();
    for _ in 0..3 {
        for _ in 0..64 {
            let (r, got) = read(&m, &mut lp, (node, o.fh), 0, PAGE);
            assert_eq!(r, Ok(PAGE));
            assert!(got == data[..PAGE]);
            let (r, got) = read(&m, &mut lp, (e.nodeid, small.fh), 0, 100);
            assert_eq!(r, Ok(100));
            assert!(got == data[..100]);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(m.fs().io_counts().read_mapped, 0);
    m.client.release(node, o.fh, 0).unwrap();
    m.client.release(e.nodeid, small.fh, 0).unwrap();
}
