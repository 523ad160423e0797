//! Cached READs copied out of a shared mapping of the host file
//! (`host_io::mapped`), with no system call per read, on files the page
//! cache holds whole.
//!
//! A copy from a mapping cannot ask the page cache not to wait: a page it
//! lacks is read from the disk in the copy's page fault, on the serving
//! thread. So a handle reads through its mapping only while a check found
//! every page of the file cached (cachestat(2) over the whole file, with
//! its size from statx), and for at most a period after it (64 times
//! what the check took, at least [`MIN_PERIOD_MS`] and at most
//! [`MAX_PERIOD_MS`]). A page evicted within the period costs one
//! blocking fault.
//! The checks run on a thread of their own ([`Checker`]; a check of a
//! large file with small folios takes milliseconds, which a serving
//! thread would make its requests wait for): a read that finds no valid
//! check asks for one and goes the usual way (preadv2(RWF_NOWAIT), the
//! ring), as do the reads after it until the check is done. A file found
//! not wholly cached is checked again after twice as many reads as
//! before, so a cold file costs few checks.
//!
//! Reads that reach the file's last page, and a mapped read that faulted
//! (a truncation on the host), also go the usual way, which gets the
//! length and the errors right; a fault also ends the period.

use crate::file::HandleData;
use fuse_core::locks::lock;
use host_io::mapped::{cachestat, FileMap, MapRead};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Mutex, OnceLock, Weak};

/// Whether this build can read through mappings (host-io's copy routine
/// is x86_64 Linux only).
pub(crate) const SUPPORTED: bool = cfg!(all(target_arch = "x86_64", target_os = "linux"));

/// The shortest time a check holds, in ms.
const MIN_PERIOD_MS: u64 = 10;
/// The longest (a page evicted meanwhile costs a blocking fault).
const MAX_PERIOD_MS: u64 = 1000;
/// Reads a handle serves the usual way before its first check.
const FIRST_WAIT: u32 = 16;
/// The most reads between checks of a file found not wholly cached.
const MAX_WAIT: u32 = 1 << 16;
/// The most mappings the process holds at once (each is one of the
/// process's at most `vm.max_map_count` memory areas).
const MAX_MAPPINGS: usize = 4096;
/// The most bytes mapped at once, all mappings together: what their page
/// tables can take (8 bytes per 4 KiB page touched: 128 MiB at most).
const MAX_MAPPED_BYTES: u64 = 64 << 30;
/// Larger files are read the usual way (a check of one walks its pages).
const MAX_FILE: u64 = 4 << 30;

/// Mappings alive in the process, and their bytes.
static MAPPINGS: AtomicUsize = AtomicUsize::new(0);
static MAPPED_BYTES: AtomicU64 = AtomicU64::new(0);

/// A handle's mapping and the state of its residency checks. Shared by
/// every thread that reads the handle; the atomics are hints each
/// protected by nothing more (a lost update only moves a check).
#[derive(Debug, Default)]
pub(crate) struct MapSlot {
    /// The mapping, made by the first check that found the file wholly
    /// cached (and room for it); None for good when it cannot be (not a
    /// readable regular file of a local file system, or mapped reads off:
    /// set at open; mmap or cachestat refused).
    map: OnceLock<Option<FileMap>>,
    /// When (coarse ms, [`now_ms`]) a check last found the file wholly
    /// cached; 0 when the last check did not, or none ran.
    fresh_at: AtomicU64,
    /// How long that check holds, in ms.
    period: AtomicU64,
    /// Reads offered since the last check.
    reads: AtomicU32,
    /// Reads to offer before the next check (0: [`FIRST_WAIT`]).
    wait: AtomicU32,
    /// A check was asked for and is not done (set by the read that asks,
    /// cleared by the check).
    asked: AtomicBool,
}

/// What [`MapSlot::read`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mapped {
    /// Read all of it (bytes).
    Read(usize),
    /// Not tried: read it the usual way.
    Usual,
    /// A SIGBUS stopped the copy (a host truncation): read it the usual
    /// way.
    Faulted,
}

impl MapSlot {
    /// Whether reads may go through a mapping (not known not to).
    pub(crate) fn may_map(&self) -> bool {
        !matches!(self.map.get(), Some(None))
    }

    /// The slot of a new handle; `mappable`: its reads may go through a
    /// mapping of its file (decided at open, `file/open.rs`).
    pub(crate) fn new(mappable: bool) -> MapSlot {
        let s = MapSlot::default();
        if !mappable {
            let _ = s.map.set(None);
        }
        s
    }

    /// Reads `iovs`' length from `off` of this handle's file through the
    /// mapping when it may (see the module docs). With no valid check,
    /// `ask` is called (once until that check is done) to have one run;
    /// it says whether it could.
    ///
    /// # Safety
    ///
    /// As for preadv: every iovec describes mapped, writable memory that
    /// no Rust reference points into, for the duration of the call.
    pub(crate) unsafe fn read(
        &self,
        off: u64,
        iovs: &[libc::iovec],
        ask: impl FnOnce() -> bool,
    ) -> Mapped {
        if !self.may_map() {
            return Mapped::Usual;
        }
        let fresh = self.fresh_at.load(Ordering::Relaxed);
        if fresh == 0 || now_ms().saturating_sub(fresh) >= self.period.load(Ordering::Relaxed) {
            let wait = match self.wait.load(Ordering::Relaxed) {
                0 => FIRST_WAIT,
                w => w,
            };
            if self.reads.fetch_add(1, Ordering::Relaxed) + 1 >= wait
                && !self.asked.swap(true, Ordering::AcqRel)
                && !ask()
            {
                self.asked.store(false, Ordering::Release);
            }
            return Mapped::Usual;
        }
        let Some(Some(map)) = self.map.get() else {
            return Mapped::Usual;
        };
        // SAFETY: the caller's contract.
        match unsafe { map.read_into(off, iovs) } {
            MapRead::Done(n) => Mapped::Read(n),
            MapRead::Outside => Mapped::Usual,
            MapRead::Fault => {
                self.fresh_at.store(0, Ordering::Relaxed);
                self.reads.store(0, Ordering::Relaxed);
                self.wait.store(FIRST_WAIT, Ordering::Relaxed);
                Mapped::Faulted
            }
        }
    }

    /// Checks whether the page cache holds all of `fd`'s file (mapping it
    /// the first time it does), and sets the next check (on the
    /// [`Checker`]'s thread).
    fn check(&self, fd: RawFd) {
        let now = now_ms();
        let t = std::time::Instant::now();
        let whole = self.whole_file_cached(fd);
        let took_us = t.elapsed().as_micros() as u64;
        self.reads.store(0, Ordering::Relaxed);
        if whole {
            let period = (64 * took_us / 1000).clamp(MIN_PERIOD_MS, MAX_PERIOD_MS);
            self.period.store(period, Ordering::Relaxed);
            self.fresh_at.store(now.max(1), Ordering::Relaxed);
            // Checked again at the first read after the period.
            self.wait.store(1, Ordering::Relaxed);
        } else {
            self.fresh_at.store(0, Ordering::Relaxed);
            let w = self.wait.load(Ordering::Relaxed).max(FIRST_WAIT / 2);
            self.wait
                .store(w.saturating_mul(2).min(MAX_WAIT), Ordering::Relaxed);
        }
        self.asked.store(false, Ordering::Release);
    }

    /// The check itself: a regular file of more than a page (a read of a
    /// smaller one always reaches its last page) and at most [`MAX_FILE`],
    /// every page cached, and mapped (or mapped now).
    fn whole_file_cached(&self, fd: RawFd) -> bool {
        if !self.may_map() {
            return false;
        }
        let mask = libc::STATX_TYPE | libc::STATX_SIZE;
        let Ok(st) = host_io::sys::statx(fd, c"", libc::AT_EMPTY_PATH, mask) else {
            return false;
        };
        if u32::from(st.stx_mode) & libc::S_IFMT != libc::S_IFREG {
            let _ = self.map.set(None);
            return false;
        }
        if st.stx_size <= 4096 || st.stx_size > MAX_FILE {
            return false;
        }
        let mapped = self
            .map
            .get()
            .and_then(|m| m.as_ref())
            .map(|m| m.len() as u64);
        // What the mapping covers (a file grown since is read the usual
        // way past it).
        let size = mapped.map_or(st.stx_size, |len| len.min(st.stx_size));
        let cs = match cachestat(fd, 0, size) {
            Ok(cs) => cs,
            // A kernel before 6.5, or a filter that refuses it: never.
            Err(e) if e == fuse_core::Errno::ENOSYS || e == fuse_core::Errno::EPERM => {
                let _ = self.map.set(None);
                return false;
            }
            Err(_) => return false,
        };
        if cs.cache < size.div_ceil(4096) {
            return false;
        }
        if mapped.is_some() {
            return true;
        }
        // Only this (the checker's) thread sets a mapping; a slot set to
        // None at open never gets here.
        match map_file(fd, st.stx_size) {
            Ok(m) => self.map.set(Some(m)).is_ok(),
            // Over the budget now: maybe not at a later check.
            Err(Unmapped::NoRoom) => false,
            Err(Unmapped::Refused) => {
                let _ = self.map.set(None);
                false
            }
        }
    }
}

impl Drop for MapSlot {
    fn drop(&mut self) {
        if let Some(Some(m)) = self.map.get() {
            MAPPINGS.fetch_sub(1, Ordering::Relaxed);
            MAPPED_BYTES.fetch_sub(m.len() as u64, Ordering::Relaxed);
        }
    }
}

/// The thread that runs a filesystem's residency checks, made on first
/// use; it ends when the filesystem goes (its queue's sender with it).
/// A check holds its handle for the time it runs.
#[derive(Debug, Default)]
pub(crate) struct Checker {
    /// Handles whose check is asked for (None: no thread yet, or it could
    /// not be made).
    tx: Mutex<Option<Sender<Weak<HandleData>>>>,
}

impl Checker {
    /// Has `h`'s file checked.
    /// Returns false when the check could not be queued (the thread is
    /// gone; the next ask makes another): the caller may ask again. A
    /// thread that cannot be made is logged, and the handle that asked
    /// reads the usual way from then on.
    pub(crate) fn ask(&self, h: Weak<HandleData>) -> bool {
        let mut tx = lock(&self.tx);
        if tx.is_none() {
            let (s, rx) = channel::<Weak<HandleData>>();
            let spawned = std::thread::Builder::new()
                .name("fusebox-mapcheck".into())
                .spawn(move || {
                    for h in rx {
                        if let Some(h) = h.upgrade() {
                            h.map.check(h.fd.raw());
                        }
                    }
                });
            match spawned {
                Ok(_) => *tx = Some(s),
                Err(e) => {
                    log::warn!("no thread for mapped reads' checks: {e}");
                    return true;
                }
            }
        }
        match tx.as_ref().map(|s| s.send(h)) {
            Some(Ok(())) => true,
            _ => {
                *tx = None;
                false
            }
        }
    }
}

/// Why [`map_file`] made no mapping.
enum Unmapped {
    /// Past [`MAX_MAPPINGS`] or [`MAX_MAPPED_BYTES`] now.
    NoRoom,
    /// mmap refused the file (for good).
    Refused,
}

/// A new mapping of `size` bytes of `fd`, counted in [`MAPPINGS`] and
/// [`MAPPED_BYTES`] (given back by the slot's drop).
fn map_file(fd: RawFd, size: u64) -> Result<FileMap, Unmapped> {
    let bytes = size.div_ceil(4096) * 4096;
    let counted = MAPPINGS.fetch_add(1, Ordering::Relaxed) < MAX_MAPPINGS;
    let sized = MAPPED_BYTES.fetch_add(bytes, Ordering::Relaxed) + bytes <= MAX_MAPPED_BYTES;
    let m = if counted && sized {
        FileMap::new(fd, size).map_err(|e| {
            log::debug!("not mapping a file for reads: {e}");
            Unmapped::Refused
        })
    } else {
        Err(Unmapped::NoRoom)
    };
    if m.is_err() {
        MAPPINGS.fetch_sub(1, Ordering::Relaxed);
        MAPPED_BYTES.fetch_sub(bytes, Ordering::Relaxed);
    }
    m
}

/// CLOCK_MONOTONIC_COARSE in ms (a vDSO read, no system call; a few ms
/// of resolution is plenty for the period).
fn now_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the local `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}
