//! Test harness: a passthrough filesystem over a real host directory on a
//! filesystem the test mounts itself (tmpfs, or ext4 on a loop device),
//! served through the in-process engine by device workers or ring workers,
//! and a [`Client`] that speaks FUSE to it.

#![allow(dead_code)]

use fuse_core::client::Client;
use fuse_core::server::{
    run_device_worker, run_ring_worker, serve_device, Dispatcher, ServerConfig,
};
use fuse_core::server::{Completions, Ctx, Filesystem, FsResult, IoDone};
use fuse_core::{Chan, ChanConfig, ClientMem, Errno, HostSpan};
use passthrough::{Config, PassthroughFs, PassthroughIo};
use std::alloc::Layout;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicIsize, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

static SEQ: AtomicU32 = AtomicU32::new(0);

pub fn run(cmd: &mut Command) {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A new empty directory to mount on.
fn fresh_dir() -> PathBuf {
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let base = std::env::temp_dir().join(format!("fusebox-t{}-{n}", std::process::id()));
    std::fs::create_dir_all(&base).unwrap();
    base
}

/// Host filesystem kinds the tests run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A fresh tmpfs.
    Tmpfs,
    /// A fresh ext4 image on a loop device.
    Ext4,
}

/// A directory on a filesystem mounted for one test (unmounted on drop).
pub struct HostDir {
    pub path: PathBuf,
    image: Option<PathBuf>,
}

impl HostDir {
    pub fn new(kind: Kind) -> HostDir {
        match kind {
            Kind::Tmpfs => {
                let base = fresh_dir();
                run(Command::new("mount")
                    .args(["-t", "tmpfs", "-o", "size=512m", "fusebox"])
                    .arg(&base));
                HostDir {
                    path: base,
                    image: None,
                }
            }
            Kind::Ext4 => HostDir::ext4(256 << 20, |img| {
                run(Command::new("mkfs.ext4")
                    .args(["-q", "-F", "-O", "^has_journal"])
                    .arg(img));
            }),
        }
    }

    /// An ext4 on a loop device: an image of `size` bytes that `make`
    /// formats (mkfs.ext4 with its options, then any tune2fs).
    pub fn ext4(size: u64, make: impl FnOnce(&Path)) -> HostDir {
        let base = fresh_dir();
        let img = base.with_extension("img");
        let f = std::fs::File::create(&img).unwrap();
        f.set_len(size).unwrap();
        make(&img);
        run(Command::new("mount")
            .args(["-o", "loop,user_xattr"])
            .arg(&img)
            .arg(&base));
        HostDir {
            path: base,
            image: Some(img),
        }
    }
}

impl Drop for HostDir {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        let _ = std::fs::remove_dir(&self.path);
        if let Some(img) = &self.image {
            let _ = std::fs::remove_file(img);
        }
    }
}

/// How requests reach the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// Device workers (read/write of whole messages).
    Device(usize),
    /// The emulated FUSE-over-io_uring ring: `queues` queues with one
    /// entry each (a device worker serves INIT, FORGET and INTERRUPT, as
    /// /dev/fuse does for the kernel's ring).
    Ring(u16),
}

/// A served passthrough and its client.
pub struct Mount {
    pub client: Client,
    pub disp: Arc<Dispatcher<PassthroughFs>>,
    pub host: HostDir,
    /// The shared directory.
    pub share: PathBuf,
    workers: Vec<std::thread::JoinHandle<()>>,
}

impl Mount {
    pub fn new(kind: Kind, cfg: Config, via: Via) -> Mount {
        let host = HostDir::new(kind);
        Self::on(host, cfg, via)
    }

    pub fn on(host: HostDir, cfg: Config, via: Via) -> Mount {
        let share = host.path.clone();
        Self::sharing(host, &share, cfg, via)
    }

    /// Serves `share`, a directory inside `host`.
    pub fn sharing(host: HostDir, share: &Path, cfg: Config, via: Via) -> Mount {
        Self::offering(host, share, cfg, via, 0, 0).unwrap()
    }

    /// As [`Mount::sharing`], with the client offering `add` INIT flags
    /// beyond the engine's defaults and not offering `drop`; INIT's error
    /// if the server refuses.
    pub fn offering(
        host: HostDir,
        share: &Path,
        cfg: Config,
        via: Via,
        add: u64,
        drop: u64,
    ) -> Result<Mount, fuse_core::Errno> {
        let fs = PassthroughFs::new(share, cfg).unwrap();
        let queues = match via {
            Via::Ring(q) => q,
            Via::Device(_) => 0,
        };
        let mut scfg = ServerConfig::default();
        if queues > 0 {
            scfg.flags |= fuse_core::abi::init::OVER_IO_URING;
        }
        let disp = Arc::new(Dispatcher::new(fs, scfg));
        let dflt = ChanConfig::default();
        let chan = Chan::new(ChanConfig {
            spawn_scanner: false,
            ring_queues: queues,
            // The kernel offers the writeback cache; the engine's default
            // set leaves it out because it has no page cache of its own.
            init_flags: (dflt.init_flags | fuse_core::abi::init::WRITEBACK_CACHE | add) & !drop,
            ..dflt
        });
        let mut workers = match via {
            Via::Device(n) => serve_device(chan.device().unwrap(), disp.clone(), n),
            Via::Ring(_) => {
                let (dev, d) = (chan.device().unwrap(), disp.clone());
                vec![std::thread::spawn(move || run_device_worker(&dev, &d))]
            }
        };
        if let Err(e) = chan.init() {
            chan.abort();
            for w in workers {
                let _ = w.join();
            }
            return Err(e);
        }
        for q in 0..queues {
            let (end, d) = (chan.ring_end(false), disp.clone());
            workers.push(std::thread::spawn(move || {
                run_ring_worker(&end, q, 1 << 20, None, &d).unwrap()
            }));
        }
        Ok(Mount {
            client: Client::new(chan),
            disp,
            share: share.to_path_buf(),
            host,
            workers,
        })
    }

    pub fn fs(&self) -> &PassthroughFs {
        self.disp.fs()
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.share.join(rel)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.client.chan().abort();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// The open flags of this process's open (not O_PATH) fds on `path`'s
/// inode.
pub fn host_open_flags(path: &std::path::Path) -> Vec<i32> {
    use std::os::unix::fs::MetadataExt;
    let want = std::fs::metadata(path).unwrap();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(meta) = std::fs::metadata(e.path()) else {
            continue;
        };
        if (meta.dev(), meta.ino()) != (want.dev(), want.ino()) {
            continue;
        }
        let info = std::path::Path::new("/proc/self/fdinfo").join(e.file_name());
        let Ok(info) = std::fs::read_to_string(info) else {
            continue;
        };
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .map(|f| i32::from_str_radix(f.trim(), 8).unwrap())
            .unwrap();
        if flags & libc::O_PATH == 0 {
            out.push(flags);
        }
    }
    out
}

/// Sets the owner of host file `p` (not following a symlink).
pub fn chown(p: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), Some(gid)).unwrap();
}

/// SETATTR of `node`'s owner and group (those given) by `c`: the owner
/// and group the reply gives.
pub fn set_ids(
    c: &Client,
    node: u64,
    uid: Option<u32>,
    gid: Option<u32>,
) -> Result<(u32, u32), fuse_core::Errno> {
    use fuse_core::abi::{fattr, SetattrIn};
    let sa = SetattrIn {
        valid: uid.map_or(0, |_| fattr::UID) | gid.map_or(0, |_| fattr::GID),
        uid: uid.unwrap_or(0),
        gid: gid.unwrap_or(0),
        ..Default::default()
    };
    c.setattr(node, &sa).map(|a| (a.attr.uid, a.attr.gid))
}

/// SETATTR of `node`'s mode by `c`.
pub fn chmod(c: &Client, node: u64, mode: u32) -> Result<(), fuse_core::Errno> {
    use fuse_core::abi::{fattr, SetattrIn};
    let sa = SetattrIn {
        valid: fattr::MODE,
        mode,
        ..Default::default()
    };
    c.setattr(node, &sa).map(drop)
}

/// This thread as a serving loop: the host I/O context it owns, its
/// completions, and the answers taken so far by unique.
pub struct Loop {
    pub io: PassthroughIo,
    pub done: Completions,
    answers: HashMap<u64, FsResult<usize>>,
}

impl Loop {
    pub fn new(fs: &PassthroughFs) -> Loop {
        Loop {
            io: fs.new_io(Arc::new(|| {})),
            done: Completions::default(),
            answers: HashMap::new(),
        }
    }

    pub fn submit(&mut self, fs: &PassthroughFs) {
        fs.submit_started(&mut self.io);
    }

    /// The answer of started request `unique`, if taken.
    pub fn answer(&mut self, unique: u64) -> Result<FsResult<usize>, &'static str> {
        for (u, r) in self.done.drain() {
            self.answers.insert(u, r);
        }
        self.answers.remove(&unique).ok_or("not answered")
    }
}

/// Offers a READ of `len` bytes at `off` of handle `fh` to `m`'s
/// filesystem on `lp`, as a serving loop does: a cached read is answered
/// at once, one started on the ring when it completes; one it declines (a file with no non-blocking reads, such as
/// tmpfs, not read through a mapping) is served the usual way, through
/// the client. Returns the answer and the bytes read.
pub fn read(
    m: &Mount,
    lp: &mut Loop,
    h: (u64, u64),
    off: u64,
    len: usize,
) -> (FsResult<usize>, Vec<u8>) {
    read_into(m, lp, h, off, Mem::new(&vec![0xee; len], 0))
}

/// [`read`] into `mem` (its length).
pub fn read_into(
    m: &Mount,
    lp: &mut Loop,
    (node, fh): (u64, u64),
    off: u64,
    mem: Arc<Mem>,
) -> (FsResult<usize>, Vec<u8>) {
    let len = mem.len();
    static UNIQUE: AtomicU64 = AtomicU64::new(1 << 40);
    let ctx = Ctx {
        unique: UNIQUE.fetch_add(2, Ordering::Relaxed),
        ..Ctx::default()
    };
    let c: Arc<dyn ClientMem> = mem.clone();
    let fs = m.fs();
    if fs
        .start_read(
            &mut lp.io,
            &mut lp.done,
            &ctx,
            node,
            fh,
            off,
            len,
            &c,
            IoDone::new(ctx.unique),
        )
        .is_err()
    {
        assert_eq!(mem.held(), 0, "memory held by a declined read");
        let got = m.client.read(node, fh, off, len as u32).unwrap();
        return (Ok(got.len()), got);
    }
    // Started on the ring (O_DIRECT, or not cached): submitted and waited for.
    let t = Instant::now();
    let r = loop {
        if let Ok(r) = lp.answer(ctx.unique) {
            break r;
        }
        lp.submit(fs);
        fs.collect_started(&mut lp.io, &mut lp.done);
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "a read never answered"
        );
    };
    assert_eq!(mem.held(), 0, "memory held after the answer");
    (r, mem.bytes())
}

/// Drops the file at `path` from the host's page cache (written back
/// first); returns it open for reading.
pub fn drop_cache(path: &Path) -> std::fs::File {
    let f = std::fs::File::open(path).unwrap();
    host_io::sys::drop_cached(std::os::fd::AsRawFd::as_raw_fd(&f)).unwrap();
    f
}

/// Client memory: one raw, page-aligned allocation (no Rust object)
/// holding the data, in one span or several, counting its I/O holds.
#[derive(Debug)]
pub struct Mem {
    base: usize,
    layout: Layout,
    spans: Vec<HostSpan>,
    held: AtomicIsize,
}

impl Mem {
    /// `data` in one span from byte `skew` of the allocation.
    pub fn new(data: &[u8], skew: usize) -> Arc<Mem> {
        Mem::make(data, skew, data.len())
    }

    /// `data` from the start of the allocation, in spans of `piece` bytes.
    pub fn split(data: &[u8], piece: usize) -> Arc<Mem> {
        Mem::make(data, 0, piece)
    }

    fn make(data: &[u8], skew: usize, piece: usize) -> Arc<Mem> {
        let layout = Layout::from_size_align(data.len() + skew, 4096).unwrap();
        // SAFETY: a non-zero size (the tests write at least one byte).
        let base = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!base.is_null());
        // SAFETY: `data.len()` bytes from `skew` lie inside the allocation,
        // which no Rust reference points into.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), base.add(skew), data.len()) };
        let at = base as usize + skew;
        let spans = (0..data.len())
            .step_by(piece)
            .map(|k| HostSpan {
                addr: at + k,
                len: piece.min(data.len() - k),
            })
            .collect();
        Arc::new(Mem {
            base: base as usize,
            layout,
            spans,
            held: AtomicIsize::new(0),
        })
    }

    /// What the memory holds now.
    pub fn bytes(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len()];
        self.read_at(0, &mut v).unwrap();
        v
    }

    /// `begin_io` calls not yet ended.
    pub fn held(&self) -> isize {
        self.held.load(Ordering::SeqCst)
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        assert_eq!(self.held(), 0, "memory freed while held for I/O");
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.base as *mut u8, self.layout) };
    }
}

// SAFETY: the spans lie in the allocation, which stays until the last
// reference goes (a started write holds one until its completion) and is
// only touched through raw pointers; the tests never reuse it.
unsafe impl ClientMem for Mem {
    fn spans(&self) -> &[HostSpan] {
        &self.spans
    }
    fn begin_io(&self) -> bool {
        self.held.fetch_add(1, Ordering::SeqCst);
        true
    }
    fn end_io(&self) {
        self.held.fetch_sub(1, Ordering::SeqCst);
    }
    fn read_at(&self, off: usize, buf: &mut [u8]) -> Result<(), Errno> {
        if off.checked_add(buf.len()).is_none_or(|e| e > self.len()) {
            return Err(Errno::EIO);
        }
        // SAFETY: the spans are contiguous, so the data is too: inside it
        // (checked).
        unsafe {
            std::ptr::copy_nonoverlapping(
                (self.spans[0].addr + off) as *const u8,
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        Ok(())
    }
    fn write_at(&self, _off: usize, _buf: &[u8]) -> Result<(), Errno> {
        Err(Errno::EIO)
    }
}
