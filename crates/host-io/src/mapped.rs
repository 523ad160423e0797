//! Reads out of a shared mapping of a host file ([`FileMap`]): a copy, no
//! system call per read. Two things stand between such a copy and a read's
//! semantics, and both are handled here:
//!
//! - **A truncation on the host.** A page of the mapping wholly past the
//!   file's end raises SIGBUS on access. Every access goes through one
//!   copy routine (`rep movsb`, below); a SIGBUS whose instruction is that
//!   routine's is turned into a failed copy ([`MapRead::Fault`]) by the
//!   process's SIGBUS handler ([`install_fence`]). Another fault goes to
//!   the handler there was before (std's), or to the default action
//!   (death); a SIGBUS sent with kill(2) or the like gets the default
//!   action (unless it was ignored). The daemon never dies of a host
//!   truncation.
//! - **The end of the file.** Bytes past the end in the file's last page
//!   read as zeros through a mapping, where a read must come back short.
//!   So after the copy one byte of the page after the range's last page
//!   is read through the same routine: that page exists only if the file
//!   goes on past the range (a truncation unmaps the pages past the new
//!   end before it zeroes the tail of the page the end falls in). A read that reaches the file's last page
//!   (or the mapping's end) is [`MapRead::Outside`]: the caller reads it
//!   the usual way.
//!
//! What is not handled here is residency: a page not in the page cache is
//! read from the disk by the copy's page fault, on the calling thread.
//! [`cachestat`] tells the caller how much of a file is cached.
//!
//! Only on x86_64 Linux (the copy routine and the register it fixes up);
//! elsewhere [`FileMap::new`] answers [`MapError::Unsupported`].

use std::os::fd::RawFd;
use std::ptr::NonNull;

/// The page size the probe steps by (x86_64 Linux: 4 KiB).
const PAGE: u64 = 4096;

/// Why a file could not be mapped.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    /// Mapped reads exist only on x86_64 Linux.
    #[error("mapped reads need x86_64 Linux")]
    Unsupported,
    /// The SIGBUS handler could not be installed.
    #[error("installing the SIGBUS handler for mapped reads")]
    Fence(#[source] std::io::Error),
    /// mmap refused the file.
    #[error("mapping the file")]
    Mmap(#[source] std::io::Error),
    /// Nothing to map.
    #[error("the file is empty")]
    Empty,
}

/// What [`FileMap::read_into`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapRead {
    /// Copied, all of it: the file goes on past the range.
    Done(usize),
    /// Not tried: the range (or the page after it) is not inside the
    /// mapping, or the file has no page after the range (it ends in the
    /// range's last page, or before).
    Outside,
    /// A SIGBUS stopped the copy or the probe (the file was truncated, or
    /// the destination's memory is gone); the destination may hold part
    /// of the range.
    Fault,
}

/// A shared, read-only mapping of a host file, from offset 0 for the
/// file's size when it was made (rounded up to a page). Unmapped on drop.
#[derive(Debug)]
pub struct FileMap {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; it is only read, through
// `fault_copy`, and unmapped once, by the owner's drop.
unsafe impl Send for FileMap {}
// SAFETY: as for Send: `&FileMap` allows only reads of the mapping.
unsafe impl Sync for FileMap {}

impl FileMap {
    /// Maps `size` bytes of `fd` (which must be open for reading) shared
    /// and read-only; installs the SIGBUS handler first.
    pub fn new(fd: RawFd, size: u64) -> Result<FileMap, MapError> {
        install_fence()?;
        if size == 0 {
            return Err(MapError::Empty);
        }
        let len = usize::try_from(size.div_ceil(PAGE) * PAGE).map_err(|e| {
            MapError::Mmap(std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
        })?;
        // SAFETY: a new mapping at an address the kernel picks; no memory
        // of this process is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(MapError::Mmap(std::io::Error::last_os_error()));
        }
        let base = NonNull::new(p.cast::<u8>()).ok_or(MapError::Mmap(std::io::Error::from(
            std::io::ErrorKind::AddrNotAvailable,
        )))?;
        Ok(FileMap { base, len })
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never: a map is at least a page.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies the file's bytes from `off` on into `iovs`, in order, if
    /// the file goes on past them (see the module docs).
    ///
    /// # Safety
    ///
    /// Every iovec must describe mapped, writable memory that no Rust
    /// reference points into, for the duration of the call (as for
    /// preadv).
    pub unsafe fn read_into(&self, off: u64, iovs: &[libc::iovec]) -> MapRead {
        let total: usize = iovs.iter().map(|v| v.iov_len).sum();
        if total == 0 {
            return MapRead::Outside;
        }
        // The first byte of the page after the range's last.
        let Some(probe) = off
            .checked_add(total as u64 - 1)
            .map(|last| (last / PAGE + 1) * PAGE)
        else {
            return MapRead::Outside;
        };
        if probe >= self.len as u64 {
            return MapRead::Outside;
        }
        let mut at = off as usize;
        for v in iovs {
            // SAFETY: `at..at + iov_len` is inside the mapping (it ends
            // before `probe`); the destination is the caller's contract.
            let r = unsafe {
                fault_copy(
                    v.iov_base.cast::<u8>(),
                    self.base.as_ptr().add(at),
                    v.iov_len,
                )
            };
            if r.is_err() {
                return MapRead::Fault;
            }
            at += v.iov_len;
        }
        // After the copy: a truncation into the range's last page first
        // takes the pages past it away, then zeroes that page's tail, so
        // zeros the copy saw there mean the probe faults now.
        let mut byte = 0u8;
        // SAFETY: `probe` is inside the mapping (checked above); `byte` is
        // a local no reference points into.
        if unsafe { fault_copy(&mut byte, self.base.as_ptr().add(probe as usize), 1) }.is_err() {
            return MapRead::Fault;
        }
        MapRead::Done(total)
    }
}

impl Drop for FileMap {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once; no borrow of it
        // outlives `self`.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// A file's page-cache state for a range (cachestat(2), Linux 6.5):
/// pages cached, dirty, under writeback, evicted, recently evicted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct CacheStat {
    /// Pages of the range in the page cache.
    pub cache: u64,
    /// Of them, dirty.
    pub dirty: u64,
    /// Of them, under writeback.
    pub writeback: u64,
    /// Pages of the range evicted from the page cache.
    pub evicted: u64,
    /// Of them, evicted recently (they would be in a larger cache).
    pub recently_evicted: u64,
}
const _: () = assert!(std::mem::size_of::<CacheStat>() == 40);

/// cachestat(2)'s range argument.
#[repr(C)]
struct CacheStatRange {
    off: u64,
    len: u64,
}
const _: () = assert!(std::mem::size_of::<CacheStatRange>() == 16);

/// cachestat(2)'s number (the same in every architecture's table).
pub const SYS_CACHESTAT: libc::c_long = 451;

/// How much of `len` bytes of `fd` from `off` the page cache holds (`len`
/// 0: to the end of the file).
pub fn cachestat(fd: RawFd, off: u64, len: u64) -> Result<CacheStat, fuse_core::Errno> {
    let range = CacheStatRange { off, len };
    let mut st = CacheStat::default();
    // SAFETY: cachestat reads `range` and writes `st`, both locals of the
    // uapi's layout (size-checked above).
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            fd,
            &range as *const CacheStatRange,
            &mut st as *mut CacheStat,
            0u32,
        )
    };
    if r < 0 {
        return Err(crate::sys::errno());
    }
    Ok(st)
}

/// Whether a copy stopped short (a SIGBUS in it).
struct Faulted;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod fence {
    use super::{Faulted, MapError, PAGE};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::OnceLock;

    /// Most guarded ranges ([`add_guarded`]).
    const GUARDED_MAX: usize = 1024;
    /// Guarded ranges, `[start, end)`; end 0: a free slot. Read by the
    /// handler without a lock: a slot is emptied (end 0) before its start
    /// changes, and gets its end last.
    static GUARDED: [(AtomicUsize, AtomicUsize); GUARDED_MAX] =
        [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; GUARDED_MAX];
    /// The slot the next range goes to once every slot is taken (the
    /// oldest); the writers' lock.
    static NEXT: std::sync::Mutex<usize> = std::sync::Mutex::new(0);

    /// Adds the ranges not guarded yet. A range stays guarded (a thread
    /// may still touch memory its owner dropped from its own tables)
    /// until every slot is taken, when the oldest slots are reused.
    pub(super) fn add_guarded(ranges: &[(usize, usize)]) {
        let mut next = NEXT
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for &(s, len) in ranges {
            let e = s.saturating_add(len);
            let known = GUARDED.iter().any(|(start, end)| {
                end.load(Ordering::SeqCst) == e && start.load(Ordering::SeqCst) == s
            });
            if known || len == 0 {
                continue;
            }
            let (start, end) = &GUARDED[*next % GUARDED_MAX];
            *next = (*next + 1) % GUARDED_MAX;
            end.store(0, Ordering::SeqCst);
            start.store(s, Ordering::SeqCst);
            end.store(e, Ordering::SeqCst);
        }
    }

    /// Whether `addr` lies in a guarded range (async-signal-safe: loads).
    fn guarded(addr: usize) -> bool {
        GUARDED.iter().any(|(start, end)| {
            let e = end.load(Ordering::SeqCst);
            e != 0 && (start.load(Ordering::SeqCst)..e).contains(&addr)
        })
    }

    // `fault_copy(dst, src, len)`: `rep movsb`, returning 0, or, when a
    // SIGBUS stopped it, the bytes it had left (the handler moves the
    // instruction pointer from the `rep movsb` to the fixup, rcx holds
    // what is left). The direction flag is clear on entry (SysV ABI).
    std::arch::global_asm!(
        ".pushsection .text.host_io_fault_copy,\"ax\",@progbits",
        ".p2align 4",
        ".globl host_io_fault_copy",
        ".hidden host_io_fault_copy",
        ".type host_io_fault_copy,@function",
        "host_io_fault_copy:",
        "    mov rcx, rdx",
        ".globl host_io_fault_copy_insn",
        ".hidden host_io_fault_copy_insn",
        "host_io_fault_copy_insn:",
        "    rep movsb",
        "    xor eax, eax",
        "    ret",
        ".globl host_io_fault_copy_fixup",
        ".hidden host_io_fault_copy_fixup",
        "host_io_fault_copy_fixup:",
        "    mov rax, rcx",
        "    ret",
        ".size host_io_fault_copy, .-host_io_fault_copy",
        ".popsection",
    );

    extern "C" {
        fn host_io_fault_copy(dst: *mut u8, src: *const u8, len: usize) -> usize;
        static host_io_fault_copy_insn: u8;
        static host_io_fault_copy_fixup: u8;
    }

    /// The handler that was installed before the fence (std's stack
    /// overflow handler, as a rule), set once before the fence is.
    static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
    /// Whether the fence is in (or why it could not be put in).
    static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();

    /// Copies `len` bytes from `src` to `dst`, or stops at a SIGBUS.
    ///
    /// # Safety
    ///
    /// Both ranges are mapped (a SIGBUS aside), `dst` writable with no
    /// Rust reference into it, and the fence installed.
    pub(super) unsafe fn fault_copy(
        dst: *mut u8,
        src: *const u8,
        len: usize,
    ) -> Result<(), Faulted> {
        // SAFETY: the caller's contract; the routine touches only the two
        // ranges and the registers the C ABI lets it clobber.
        match unsafe { host_io_fault_copy(dst, src, len) } {
            0 => Ok(()),
            _ => Err(Faulted),
        }
    }

    extern "C" fn on_sigbus(_: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        // SAFETY: installed with SA_SIGINFO, so `info` is the signal's
        // information and `ctx` the interrupted context the kernel saved
        // (restored from it when this returns); errno is this thread's.
        let (code, uc, errno) = unsafe {
            (
                (*info).si_code,
                &mut *ctx.cast::<libc::ucontext_t>(),
                libc::__errno_location(),
            )
        };
        // SAFETY: this thread's errno, kept across the calls below.
        let saved = unsafe { *errno };
        let rip = &mut uc.uc_mcontext.gregs[libc::REG_RIP as usize];
        // Only the symbols' addresses are taken (no read of them).
        let (insn, fixup) = (
            std::ptr::addr_of!(host_io_fault_copy_insn) as usize,
            std::ptr::addr_of!(host_io_fault_copy_fixup) as usize,
        );
        // A fault of the instruction it interrupted (not a sent signal,
        // nor a memory error reported ahead of any access).
        let fault = matches!(
            code,
            libc::BUS_ADRALN | libc::BUS_ADRERR | libc::BUS_OBJERR | libc::BUS_MCEERR_AR
        );
        if fault && *rip as usize == insn {
            *rip = fixup as libc::greg_t;
            return;
        }
        // SAFETY: a fault's siginfo carries the faulting address.
        let addr = unsafe { (*info).si_addr() } as usize;
        // BUS_ADRERR: a page the file does not reach (a memory error is
        // not papered over).
        if code == libc::BUS_ADRERR && guarded(addr) {
            // A page of a guarded mapping past its file's end: an
            // anonymous zero page takes its place, and the access is
            // retried on it (reads see zeros, writes go nowhere).
            let page = addr & !(PAGE as usize - 1);
            // SAFETY: mmap is async-signal-safe; MAP_FIXED replaces only
            // that page, of a range its owner registered as replaceable.
            let p = unsafe {
                libc::mmap(
                    page as *mut libc::c_void,
                    PAGE as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                // SAFETY: this thread's errno.
                unsafe { *errno = saved };
                return;
            }
        }
        let previous = PREVIOUS.get();
        // SAFETY: sigaction, getpid, gettid and tgkill are
        // async-signal-safe; the action set is a zeroed one with SIG_DFL
        // (the default disposition); the handler called is the one
        // installed before, with the signature its flags say.
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            let handler = previous
                .map(|p| p.sa_sigaction)
                .filter(|&h| h != libc::SIG_DFL && h != libc::SIG_IGN);
            if let (true, Some(h), Some(p)) = (fault, handler, previous) {
                // Another fault: the handler there was before (std's, which
                // tells a stack overflow and otherwise lets the access fault
                // again under the default action), with what the kernel
                // gave this one.
                if p.sa_flags & libc::SA_SIGINFO != 0 {
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                        std::mem::transmute(h);
                    f(libc::SIGBUS, info, ctx);
                } else {
                    let f: extern "C" fn(libc::c_int) = std::mem::transmute(h);
                    f(libc::SIGBUS);
                }
            } else if fault {
                // Another fault, and no handler before: the default action,
                // under which the access faults again and kills.
                libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
            } else if previous.is_none_or(|p| p.sa_sigaction != libc::SIG_IGN) {
                // Sent (or an early memory error): what a process without a
                // handler gets, the default action, once this returns.
                libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
                libc::syscall(
                    libc::SYS_tgkill,
                    libc::getpid(),
                    libc::gettid(),
                    libc::SIGBUS,
                );
            }
            *errno = saved;
        }
    }

    /// Installs the SIGBUS handler (once per process).
    pub(super) fn install() -> Result<(), MapError> {
        let r = INSTALLED.get_or_init(|| {
            // SAFETY: sigaction reads `act` and writes `old`, both locals;
            // `on_sigbus` is async-signal-safe (it touches the context,
            // a static set before it is installed, and sigaction).
            unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                    return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
                }
                let _ = PREVIOUS.set(old);
                let mut act: libc::sigaction = std::mem::zeroed();
                act.sa_sigaction = on_sigbus as *const () as usize;
                act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut act.sa_mask);
                if libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut()) != 0 {
                    return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
                }
            }
            Ok(())
        });
        (*r).map_err(|e| MapError::Fence(std::io::Error::from_raw_os_error(e)))
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod fence {
    use super::{Faulted, MapError};

    pub(super) unsafe fn fault_copy(_: *mut u8, _: *const u8, _: usize) -> Result<(), Faulted> {
        Err(Faulted)
    }

    pub(super) fn install() -> Result<(), MapError> {
        Err(MapError::Unsupported)
    }

    pub(super) fn add_guarded(_: &[(usize, usize)]) {}
}

use fence::fault_copy;

/// Installs the process's SIGBUS handler that lets a mapped read fail
/// instead of killing the process (done by [`FileMap::new`]; call it before
/// a seccomp filter that refuses rt_sigaction).
pub fn install_fence() -> Result<(), MapError> {
    fence::install()
}

/// Guards the shared file mappings `ranges` (`(address, length)` each):
/// a page of one past its file's end (the file was truncated) is replaced
/// by a zero page when it is touched, instead of the SIGBUS killing the
/// process. For mappings a guest may make the daemon touch (a VMM's DAX
/// window, mapped as guest memory). Ranges are added to those guarded
/// before, and stay guarded (a thread may touch memory after its owner
/// dropped it from its own tables) until 1024 are, when the oldest go.
/// Installs the SIGBUS handler first.
pub fn guard_mappings(ranges: &[(usize, usize)]) -> Result<(), MapError> {
    fence::install()?;
    fence::add_guarded(ranges);
    Ok(())
}

#[cfg(test)]
mod tests;
