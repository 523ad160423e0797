//! A filesystem may keep the `Arc<dyn ClientMem>` a READ or WRITE lent it
//! (safe code can): once the request is answered, its payload slot is
//! reused for the next request, so the kept memory must refuse (EIO), and
//! the next request's data must be what it is. Served for real, through a
//! kernel mount: /dev/fuse workers at depth (`devfuse::serve_dev`) and
//! FUSE-over-io_uring queues (`kernel_uring::serve::serve_queue`), each
//! with one slot so every request reuses the last one's.

use fuse_core::abi::{fopen, init, Attr};
use fuse_core::server::{
    serve_device, Ctx, Dispatcher, Entry, Filesystem, FsResult, IoDone, Opened, ServerConfig,
};
use fuse_core::{ClientMem, Errno};
use host_mount::devfuse::{self, DevFuse, MountOptions};
use host_mount::kernel_uring::{self, KernelQueue};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const INO: u64 = 2;
const SIZE: usize = 64 * 1024;
const TTL: Duration = Duration::from_secs(60);

/// One regular file, `f`, served from memory; READs and WRITEs are
/// answered at once from the memory they lend, which it keeps. Before
/// answering each, it writes 0xEE over the memory every earlier request
/// lent it, and reads from it, noting what those calls returned.
struct Keeper {
    data: Mutex<Vec<u8>>,
    kept: Mutex<Vec<Arc<dyn ClientMem>>>,
    /// Results of the late writes and reads (all should be EIO).
    late: Mutex<Vec<Result<(), Errno>>>,
    /// READs and WRITEs served by reference.
    by_ref: Mutex<usize>,
}

impl Keeper {
    fn attr(ino: u64, len: usize) -> Attr {
        Attr {
            ino,
            size: len as u64,
            blocks: len.div_ceil(512) as u64,
            mode: if ino == 1 { 0o040755 } else { 0o100644 },
            nlink: 1,
            blksize: 4096,
            ..Default::default()
        }
    }

    /// Scribbles over (and reads) all memory kept so far, then keeps `mem`.
    fn meddle_and_keep(&self, mem: Arc<dyn ClientMem>) {
        let mut kept = self.kept.lock().unwrap();
        let mut late = self.late.lock().unwrap();
        for old in kept.iter() {
            late.push(old.write_at(0, &vec![0xEE; old.len()]));
            late.push(old.read_at(0, &mut vec![0; old.len()]));
        }
        kept.push(mem);
        *self.by_ref.lock().unwrap() += 1;
    }
}

impl Filesystem for Keeper {
    type Inode = u64;
    type Handle = u64;
    type Io = ();

    fn new_io(&self, _: fuse_core::server::Wake) {}

    fn lookup(&self, _: &Ctx, parent: u64, name: &[u8]) -> FsResult<Entry<u64>> {
        if parent != 1 || name != b"f" {
            return Err(Errno::ENOENT);
        }
        Ok(Entry {
            inode: INO,
            generation: 1,
            attr: Self::attr(INO, self.data.lock().unwrap().len()),
            entry_valid: TTL,
            attr_valid: TTL,
        })
    }

    fn getattr(&self, _: &Ctx, ino: u64, _: Option<u64>) -> FsResult<(Attr, Duration)> {
        match ino {
            1 => Ok((Self::attr(1, 0), TTL)),
            INO => Ok((Self::attr(INO, self.data.lock().unwrap().len()), TTL)),
            _ => Err(Errno::ENOENT),
        }
    }

    fn open(&self, _: &Ctx, ino: u64, _: u32) -> FsResult<Opened<u64>> {
        if ino != INO {
            return Err(Errno::EISDIR);
        }
        // Every READ and WRITE reaches us (no page cache in between).
        Ok(Opened {
            handle: 1,
            open_flags: fopen::DIRECT_IO,
            backing_id: 0,
        })
    }

    fn flush(&self, _: &Ctx, _: u64, _: u64, _: u64) -> FsResult<()> {
        Ok(())
    }

    fn start_read(
        &self,
        _: &mut (),
        out: &mut fuse_core::server::Completions,
        _: &Ctx,
        _: u64,
        _: u64,
        offset: u64,
        len: usize,
        mem: &Arc<dyn ClientMem>,
        done: IoDone,
    ) -> Result<(), IoDone> {
        let r = {
            let data = self.data.lock().unwrap();
            let from = (offset as usize).min(data.len());
            let n = len.min(data.len() - from).min(mem.len());
            mem.write_at(0, &data[from..from + n]).map(|()| n)
        };
        self.meddle_and_keep(mem.clone());
        out.complete(done, r);
        Ok(())
    }

    fn start_write(
        &self,
        _: &mut (),
        out: &mut fuse_core::server::Completions,
        _: &Ctx,
        _: u64,
        _: u64,
        offset: u64,
        mem: &Arc<dyn ClientMem>,
        _: u32,
        done: IoDone,
    ) -> Result<(), IoDone> {
        let mut buf = vec![0u8; mem.len()];
        let r = mem.read_at(0, &mut buf).map(|()| {
            let mut data = self.data.lock().unwrap();
            let end = offset as usize + buf.len();
            if data.len() < end {
                data.resize(end, 0);
            }
            data[offset as usize..end].copy_from_slice(&buf);
            buf.len()
        });
        self.meddle_and_keep(mem.clone());
        out.complete(done, r);
        Ok(())
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

#[derive(Clone, Copy)]
enum Mode {
    Dev,
    Ring,
}

fn mountpoint(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("fusebox-lent-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&p).unwrap();
    p
}

/// Serves `fs` on a fresh mount through `mode`, one slot per serving
/// thread; returns the mount, its connection and the serving threads.
fn serve(
    mode: Mode,
    tag: &str,
    fs: Keeper,
) -> (
    PathBuf,
    DevFuse,
    Arc<Dispatcher<Keeper>>,
    Vec<std::thread::JoinHandle<()>>,
) {
    let mnt = mountpoint(tag);
    let mut scfg = ServerConfig::default();
    if let Mode::Ring = mode {
        kernel_uring::enable().unwrap();
        scfg.flags |= init::OVER_IO_URING;
    }
    let disp = Arc::new(Dispatcher::new(fs, scfg));
    let dev = DevFuse::mount(&mnt, &MountOptions::default()).unwrap();
    let mut threads = Vec::new();
    match mode {
        Mode::Dev => {
            let w = devfuse::DevWorker::new(&dev, 1).unwrap();
            let d = disp.clone();
            threads.push(std::thread::spawn(move || {
                devfuse::serve_dev(w, &d).unwrap();
            }));
        }
        Mode::Ring => {
            // INIT (and FORGET, INTERRUPT) over /dev/fuse, then a queue
            // per possible CPU, pinned to it, once INIT's reply is in.
            threads.extend(serve_device(dev.clone(), disp.clone(), 1));
            let t = Instant::now();
            while !disp.init_done() || dev.replies_written() == 0 {
                assert!(t.elapsed() < Duration::from_secs(10), "no INIT");
                std::thread::sleep(Duration::from_millis(5));
            }
            assert_ne!(
                disp.decode_options().flags & init::OVER_IO_URING,
                0,
                "the kernel did not take FUSE-over-io_uring"
            );
            for qid in 0..kernel_uring::possible_cpus() as u16 {
                let (dev, d) = (dev.clone(), disp.clone());
                threads.push(std::thread::spawn(move || {
                    kernel_uring::pin_to_cpu(usize::from(qid));
                    let q = KernelQueue::with_depth(&dev, qid, 1 << 20, 1).unwrap();
                    kernel_uring::serve::serve_queue(&q, &d, 1).unwrap();
                }));
            }
        }
    }
    // The mount answers once the workers are up.
    let t = Instant::now();
    while std::fs::metadata(mnt.join("f")).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "mount never answered"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    (mnt, dev, disp, threads)
}

fn kept_memory_refuses_and_the_next_request_is_intact(mode: Mode, tag: &str) {
    let fs = Keeper {
        data: Mutex::new(pattern(SIZE, 1)),
        kept: Mutex::default(),
        late: Mutex::default(),
        by_ref: Mutex::default(),
    };
    let (mnt, dev, disp, threads) = serve(mode, tag, fs);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(mnt.join("f"))
        .unwrap();
    let mut model = pattern(SIZE, 1);
    let mut buf = vec![0u8; 8192];
    for round in 0..8u8 {
        let off = usize::from(round) * 4096;
        // A READ after requests whose memory the filesystem kept (and
        // wrote 0xEE over before answering this one): its data intact.
        f.read_exact_at(&mut buf, off as u64).unwrap();
        assert!(
            buf == model[off..off + 8192],
            "round {round}: READ data overwritten through memory kept from an earlier request"
        );
        // A WRITE, and the READ that shows what landed.
        let w = pattern(4096, round.wrapping_add(7));
        f.write_all_at(&w, off as u64).unwrap();
        model[off..off + 4096].copy_from_slice(&w);
        f.read_exact_at(&mut buf, off as u64).unwrap();
        assert!(
            buf == model[off..off + 8192],
            "round {round}: WRITE data or the READ after it overwritten"
        );
    }
    drop(f);
    let fs = disp.fs();
    assert!(
        *fs.by_ref.lock().unwrap() >= 24,
        "READs and WRITEs were not served by reference"
    );
    assert!(*fs.data.lock().unwrap() == model);
    // All answered: every memory lent is taken back, even the last one's.
    for m in fs.kept.lock().unwrap().iter() {
        fs.late.lock().unwrap().push(m.write_at(0, b"x"));
        assert!(!m.begin_io(), "I/O on memory taken back");
    }
    let late = fs.late.lock().unwrap();
    assert!(!late.is_empty());
    assert!(
        late.iter().all(|r| *r == Err(Errno::EIO)),
        "memory kept past its answer still worked: {late:?}"
    );
    drop(late);
    let _ = dev.abort();
    for t in threads {
        t.join().unwrap();
    }
    let _ = devfuse::unmount(&mnt, true);
    let _ = std::fs::remove_dir(Path::new(&mnt));
}

#[test]
fn dev_workers_take_back_the_memory_a_filesystem_kept() {
    kept_memory_refuses_and_the_next_request_is_intact(Mode::Dev, "dev");
}

#[test]
fn ring_queues_take_back_the_memory_a_filesystem_kept() {
    kept_memory_refuses_and_the_next_request_is_intact(Mode::Ring, "ring");
}
