//! READs of a handle whose reads keep finding nothing in the page cache
//! skip the synchronous preadv2(RWF_NOWAIT) try and are started on the
//! serving loop's ring at once (`cold.rs`); once the file is cached they
//! are answered at once again. Offered with `Filesystem::start_read` on
//! this thread, as a serving loop does, on ext4 on a loop device (tmpfs
//! has no non-blocking reads), mapped reads off. Needs root.

mod common;

use common::{drop_cache, read, Kind, Loop, Mount, Via};
use fuse_core::abi::ROOT_ID;
use passthrough::Config;

const PAGE: usize = 4096;
/// The test file: 16 MiB.
const PAGES: usize = 4096;
/// Pages apart the cold reads are: past what the kernel reads ahead of a
/// small read, so no cold read finds its page cached by one before it.
const STRIDE: usize = 64;

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i / 5 % 253) as u8).collect()
}

#[test]
fn reads_that_keep_missing_skip_the_synchronous_try_until_the_file_is_cached() {
    let cfg = Config {
        mapped_reads: false,
        ..Config::default()
    };
    let m = Mount::new(Kind::Ext4, cfg, Via::Device(1));
    let data = pattern(PAGES * PAGE);
    std::fs::write(m.path("f"), &data).unwrap();
    let e = m.client.lookup(ROOT_ID, b"f").unwrap();
    let o = m.client.open(e.nodeid, libc::O_RDONLY as u32).unwrap();
    let h = (e.nodeid, o.fh);
    let fs = m.fs();
    let mut lp = Loop::new(fs);
    let check = |lp: &mut Loop, page: usize| {
        let off = page * PAGE;
        let (r, got) = read(&m, lp, h, off as u64, PAGE);
        assert_eq!(r, Ok(PAGE), "page {page}");
        assert!(got == data[off..off + PAGE], "page {page}: wrong bytes");
    };

    // Cold: every read misses. The first few try the page cache and find
    // nothing; after them most reads go to the ring with no try.
    drop_cache(&m.path("f"));
    let before = fs.io_counts();
    let cold = PAGES / STRIDE;
    for i in 0..cold {
        check(&mut lp, i * STRIDE);
    }
    let after = fs.io_counts();
    let skipped = after.read_cold_skips - before.read_cold_skips;
    assert_eq!(
        after.read_syscall, before.read_syscall,
        "a cold read answered at once: {after:?}"
    );
    assert_eq!(after.read_uring - before.read_uring, cold as u64);
    // (4 misses, then skips of 8, 16 and 32 with a try after each, and the
    // first read of a skip of 64: 57 of 64.)
    assert!(
        skipped >= (cold * 3 / 4) as u64,
        "{skipped} of {cold} cold reads skipped the try"
    );
    assert!(skipped < cold as u64, "the first reads try");

    // A cold read across the end of the file: the ring's short read.
    let before = fs.io_counts();
    let off = PAGES * PAGE - 1000;
    let (r, got) = read(&m, &mut lp, h, off as u64, PAGE);
    assert_eq!(r, Ok(1000));
    assert!(got[..1000] == data[off..], "the file's last bytes");
    let after = fs.io_counts();
    // (The short read is continued once, to find the end.)
    assert!(after.read_uring > before.read_uring, "{after:?}");
    assert_eq!(after.read_syscall, before.read_syscall);

    // Cached: a try finds the data within the longest skip (128 reads)
    // and its try, and from then on every read is answered at once.
    std::fs::read(m.path("f")).unwrap();
    let mut tries = 0;
    let mut page = 1;
    loop {
        let n = fs.io_counts().read_syscall;
        check(&mut lp, page);
        page = (page + STRIDE) % PAGES;
        tries += 1;
        if fs.io_counts().read_syscall > n {
            break;
        }
        assert!(
            tries <= 129,
            "a cached file still skipped after {tries} reads"
        );
    }
    let before = fs.io_counts();
    for i in 0..32 {
        check(&mut lp, (page + i * 3) % PAGES);
    }
    let after = fs.io_counts();
    assert_eq!(after.read_cold_skips, before.read_cold_skips);
    assert_eq!(after.read_syscall - before.read_syscall, 32, "{after:?}");
    m.client.release(e.nodeid, o.fh, 0).unwrap();
}
