//! `DeviceConfig::fixed_guest_memory`: guest RAM registered as io_uring
//! fixed buffers. Over a real vhost-user socket, with the passthrough of an
//! ext4 directory (whose files take non-blocking I/O, so data goes through
//! io_uring), reads and O_DIRECT writes go as READ(V)_FIXED and
//! WRITE(V)_FIXED straight between guest RAM and the file, and the data
//! is right; with the option off the same traffic uses none.

mod common;

use fuse_core::abi::ROOT_ID;
use passthrough::Config;
use std::path::{Path, PathBuf};
use std::process::Command;
use virtio_fs::testing::frontend::{FrontendConfig, VhostFrontend};
use virtio_fs::DeviceConfig;

/// A fresh ext4 image mounted at `base/share` (unmounted on drop).
struct Ext4 {
    base: PathBuf,
}

impl Ext4 {
    fn new(tag: &str) -> Ext4 {
        let base = std::env::temp_dir().join(format!("fusebox-fixed-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("share")).unwrap();
        let img = base.join("fs.img");
        std::fs::File::create(&img)
            .unwrap()
            .set_len(128 << 20)
            .unwrap();
        let ok = |c: &mut Command| assert!(c.status().unwrap().success(), "{c:?}");
        ok(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&img));
        ok(Command::new("mount")
            .arg("-o")
            .arg("loop")
            .arg(&img)
            .arg(base.join("share")));
        Ext4 { base }
    }
    fn share(&self) -> PathBuf {
        self.base.join("share")
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.share()).status();
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

/// Writes and reads a file through the device; returns the passthrough's
/// I/O counts.
fn traffic(share: &Path, sock: &Path, fixed: bool) -> passthrough::IoCounts {
    let (dev, served) = common::serve_passthrough(
        share,
        sock,
        Config::default(),
        DeviceConfig {
            inline_per_batch: usize::MAX,
            fixed_guest_memory: fixed,
            ..DeviceConfig::default()
        },
    );
    let fe = VhostFrontend::connect(sock, &FrontendConfig::default()).unwrap();
    let c = fe.client().clone();
    let rw = libc::O_RDWR as u32;
    let (e, o) = c.create(ROOT_ID, b"f", 0o644, rw, 0).unwrap();
    let data = pattern(1 << 20, 7);
    // Buffered: reads go through io_uring on ext4.
    assert_eq!(c.write(e.nodeid, o.fh, 0, &data, 0).unwrap(), 1 << 20);
    assert_eq!(c.read(e.nodeid, o.fh, 0, 1 << 20).unwrap(), data);
    for off in [0u64, 4096, 12345, 1000 * 1000] {
        let got = c.read(e.nodeid, o.fh, off, 4096).unwrap();
        let end = (off as usize + 4096).min(data.len());
        assert_eq!(got, &data[off as usize..end], "at {off}");
    }
    c.release(e.nodeid, o.fh, rw).unwrap();
    // O_DIRECT: writes go through io_uring too.
    let d = c.open(e.nodeid, rw | libc::O_DIRECT as u32).unwrap();
    let data2 = pattern(256 << 10, 99);
    assert_eq!(
        c.write(e.nodeid, d.fh, 64 << 10, &data2, 0).unwrap(),
        256 << 10
    );
    assert_eq!(c.read(e.nodeid, d.fh, 64 << 10, 256 << 10).unwrap(), data2);
    c.release(e.nodeid, d.fh, rw).unwrap();
    let mut want = data.clone();
    want[64 << 10..320 << 10].copy_from_slice(&data2);
    assert_eq!(std::fs::read(share.join("f")).unwrap(), want);
    std::fs::remove_file(share.join("f")).unwrap();
    let counts = dev.engine().fs().io_counts();
    drop(fe);
    served.join().unwrap();
    counts
}

#[test]
fn guest_ram_as_fixed_buffers_carries_reads_and_direct_writes() {
    let fs = Ext4::new("on");
    let sock = fs.base.join("vfs.sock");
    let on = traffic(&fs.share(), &sock, true);
    assert!(on.read_uring > 0, "{on:?}");
    assert!(
        on.read_fixed > 0,
        "reads through io_uring were fixed: {on:?}"
    );
    assert!(on.write_fixed > 0, "O_DIRECT writes were fixed: {on:?}");
    assert!(on.read_fixed <= on.read_uring && on.write_fixed <= on.write_uring);
    let off = traffic(&fs.share(), &sock, false);
    assert!(off.read_uring > 0, "{off:?}");
    assert_eq!((off.read_fixed, off.write_fixed), (0, 0), "{off:?}");
}

/// A READ the page cache can answer is read synchronously (preadv2
/// RWF_NOWAIT on the queue thread), one across the end of the file too, unless it is
/// large (then an io-wq worker of io_uring copies it); one that would
/// wait for the disk goes through io_uring and is answered when it
/// completes. All with the right data.
#[test]
fn cached_reads_are_answered_synchronously_and_cold_or_large_ones_go_through_io_uring() {
    let fs = Ext4::new("cold");
    let share = fs.share();
    let sock = fs.base.join("vfs.sock");
    let (dev, served) = common::serve_passthrough(
        &share,
        &sock,
        Config::default(),
        DeviceConfig {
            inline_per_batch: usize::MAX,
            ..DeviceConfig::default()
        },
    );
    let data = pattern(4 << 20, 3);
    std::fs::write(share.join("f"), &data).unwrap();
    let fe = VhostFrontend::connect(&sock, &FrontendConfig::default()).unwrap();
    let c = fe.client().clone();
    let e = c.lookup(ROOT_ID, b"f").unwrap();
    let o = c.open(e.nodeid, libc::O_RDONLY as u32).unwrap();
    let counts = || dev.engine().fs().io_counts();

    // Cached (just written): synchronously, not on io_uring.
    let before = counts();
    assert_eq!(
        c.read(e.nodeid, o.fh, 8192, 4096).unwrap(),
        &data[8192..12288]
    );
    // Across the end of the file: the short answer, synchronously too.
    let end = data.len() as u64 - 1000;
    assert_eq!(
        c.read(e.nodeid, o.fh, end, 4096).unwrap(),
        &data[end as usize..]
    );
    assert!(c.read(e.nodeid, o.fh, end + 1000, 4096).unwrap().is_empty());
    let after = counts();
    assert_eq!(after.read_uring, before.read_uring, "{after:?}");
    assert!(after.read_syscall >= before.read_syscall + 3, "{after:?}");

    // A large one, cached too, goes through io_uring (an io-wq worker
    // copies it beside the queue thread), with the right data.
    let before = counts();
    assert_eq!(
        c.read(e.nodeid, o.fh, 1 << 20, 1 << 20).unwrap(),
        &data[1 << 20..2 << 20]
    );
    let after = counts();
    assert!(after.read_uring > before.read_uring, "{after:?}");
    assert_eq!(after.read_syscall, before.read_syscall, "{after:?}");

    // Dropped from the page cache: through io_uring.
    let f = std::fs::File::open(share.join("f")).unwrap();
    host_io::sys::drop_cached(std::os::fd::AsRawFd::as_raw_fd(&f)).unwrap();
    let before = counts();
    for off in [1u64 << 20, 3 << 20] {
        let at = off as usize;
        assert_eq!(
            c.read(e.nodeid, o.fh, off, 4096).unwrap(),
            &data[at..at + 4096]
        );
    }
    let after = counts();
    assert!(after.read_uring > before.read_uring, "{after:?}");
    c.release(e.nodeid, o.fh, libc::O_RDONLY as u32).unwrap();
    drop(fe);
    served.join().unwrap();
}

/// Reads a file through the device (cached reads synchronously, O_DIRECT
/// ones through io_uring, from two threads) while a third keeps discarding the
/// guest's free buffer pages, as a balloon does; every read must return
/// the file's data in the pages the guest has now. Returns how many reads
/// came back wrong.
fn reads_while_discarding(share: &Path, sock: &Path, fixed: bool) -> usize {
    let (dev, served) = common::serve_passthrough(
        share,
        sock,
        Config::default(),
        DeviceConfig {
            inline_per_batch: usize::MAX,
            fixed_guest_memory: fixed,
            ..DeviceConfig::default()
        },
    );
    let data = std::sync::Arc::new(pattern(4 << 20, 5));
    std::fs::write(share.join("d"), &*data).unwrap();
    let fe = std::sync::Arc::new(VhostFrontend::connect(sock, &FrontendConfig::default()).unwrap());
    let c = fe.client().clone();
    let e = c.lookup(ROOT_ID, b"d").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let discarder = {
        let (fe, stop) = (fe.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rounds = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                fe.discard_free_buffers().unwrap();
                rounds += 1;
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            rounds
        })
    };
    let readers: Vec<_> = [0u32, libc::O_DIRECT as u32]
        .into_iter()
        .map(|direct| {
            let (c, data) = (c.clone(), data.clone());
            std::thread::spawn(move || {
                let flags = libc::O_RDONLY as u32 | direct;
                let o = c.open(e.nodeid, flags).unwrap();
                let mut wrong = 0;
                for i in 0..400u64 {
                    let off = (i * 7919 * 4096) % (4 << 20);
                    let len = if i % 3 == 0 { 64 << 10 } else { 4096 };
                    let end = (off as usize + len).min(data.len());
                    let got = c.read(e.nodeid, o.fh, off, len as u32).unwrap();
                    if got != data[off as usize..end] {
                        wrong += 1;
                    }
                }
                c.release(e.nodeid, o.fh, flags).unwrap();
                wrong
            })
        })
        .collect();
    let wrong: usize = readers.into_iter().map(|r| r.join().unwrap()).sum();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rounds = discarder.join().unwrap();
    assert!(rounds > 0, "the discards ran");
    let counts = dev.engine().fs().io_counts();
    assert!(
        counts.read_uring > 0,
        "some reads went through io_uring: {counts:?}"
    );
    std::fs::remove_file(share.join("d")).unwrap();
    drop(c);
    drop(std::sync::Arc::into_inner(fe));
    served.join().unwrap();
    wrong
}

#[test]
fn guest_pages_discarded_between_reads_get_the_data_without_fixed_memory() {
    // Without --fixed-guest-memory nothing of guest RAM is pinned past a
    // request: a page the VMM discarded and the guest reused gets the data.
    let fs = Ext4::new("discard");
    let sock = fs.base.join("vfs.sock");
    assert_eq!(reads_while_discarding(&fs.share(), &sock, false), 0);
}
