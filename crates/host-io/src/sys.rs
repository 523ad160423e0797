//! Thin wrappers over the passthrough's raw syscalls (`host-mount` uses
//! some and keeps its /dev/fuse ioctls, mount and mappings beside the code
//! that needs them). Every one takes file descriptors it borrows and
//! names as C strings, and returns the
//! kernel's errno unchanged. All are safe but [`preadv_nowait`], an
//! `unsafe fn` whose caller vouches for the memory it reads into, and
//! `wake::kick`, whose caller vouches that the thread it signals lives
//! (`locks.rs`, under the waiters' lock).
//!
//! One file on purpose (past the usual length): one flat list of wrappers
//! to audit in one read. The only other `unsafe` in the passthrough is I/O
//! on a client's memory
//! (fuse-core's `unsafe trait ClientMem`), discharged where the memory is
//! held for I/O: `client_io.rs` (its `IoGuard`), and `started.rs` and
//! `started/write.rs` (between `begin_io` and `end_io`).

use fuse_core::Errno;
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// The calling thread's errno.
pub fn errno() -> Errno {
    errno_of(&std::io::Error::last_os_error())
}

/// The errno of an I/O error (EIO for one that has none).
pub fn errno_of(e: &std::io::Error) -> Errno {
    Errno(e.raw_os_error().unwrap_or(libc::EIO))
}

fn check(r: libc::c_int) -> Result<libc::c_int, Errno> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r)
    }
}

fn check_long(r: libc::c_long) -> Result<libc::c_long, Errno> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r)
    }
}

fn owned(fd: libc::c_int) -> Result<OwnedFd, Errno> {
    let fd = check(fd)?;
    // SAFETY: the kernel just returned `fd` as a new descriptor that nothing
    // else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `struct open_how` of openat2(2).
#[repr(C)]
#[derive(Default)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}
const _: () = assert!(std::mem::size_of::<OpenHow>() == 24);

/// RESOLVE_NO_MAGICLINKS.
pub const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
/// RESOLVE_NO_SYMLINKS.
pub const RESOLVE_NO_SYMLINKS: u64 = 0x04;
/// RESOLVE_BENEATH.
pub const RESOLVE_BENEATH: u64 = 0x08;

/// openat2(2). ENOSYS on kernels before 5.6.
pub fn openat2(
    dir: BorrowedFd<'_>,
    name: &CStr,
    flags: i32,
    mode: u32,
    resolve: u64,
) -> Result<OwnedFd, Errno> {
    let how = OpenHow {
        flags: flags as u32 as u64,
        mode: u64::from(mode),
        resolve,
    };
    // SAFETY: `name` is NUL-terminated, `how` is a valid open_how whose size
    // is passed with it; the result is a new fd or -1.
    let r = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            name.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    owned(check_long(r)? as libc::c_int)
}

/// openat(2).
pub fn openat(dir: RawFd, name: &CStr, flags: i32, mode: u32) -> Result<OwnedFd, Errno> {
    // SAFETY: `name` is NUL-terminated; the result is a new fd or -1.
    owned(unsafe { libc::openat(dir, name.as_ptr(), flags | libc::O_CLOEXEC, mode) })
}

/// statx(2) of `name` relative to `dir` (`c""` with AT_EMPTY_PATH for the fd itself).
pub fn statx(dir: RawFd, name: &CStr, flags: i32, mask: u32) -> Result<libc::statx, Errno> {
    // SAFETY: a zeroed statx is a valid value of this plain C struct.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `name` is NUL-terminated and `st` is a valid out-pointer.
    check(unsafe { libc::statx(dir, name.as_ptr(), flags, mask, &mut st) })?;
    Ok(st)
}

/// mkdirat(2).
pub fn mkdirat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> Result<(), Errno> {
    // SAFETY: `name` is NUL-terminated.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) }).map(drop)
}

/// mknodat(2).
pub fn mknodat(dir: BorrowedFd<'_>, name: &CStr, mode: u32, rdev: u64) -> Result<(), Errno> {
    // SAFETY: `name` is NUL-terminated.
    check(unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode, rdev) }).map(drop)
}

/// symlinkat(2).
pub fn symlinkat(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
    // SAFETY: both strings are NUL-terminated.
    check(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) }).map(drop)
}

/// linkat(2).
pub fn linkat(
    olddir: RawFd,
    old: &CStr,
    newdir: BorrowedFd<'_>,
    new: &CStr,
    flags: i32,
) -> Result<(), Errno> {
    // SAFETY: both strings are NUL-terminated.
    check(unsafe {
        libc::linkat(
            olddir,
            old.as_ptr(),
            newdir.as_raw_fd(),
            new.as_ptr(),
            flags,
        )
    })
    .map(drop)
}

/// unlinkat(2).
pub fn unlinkat(dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> Result<(), Errno> {
    // SAFETY: `name` is NUL-terminated.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) }).map(drop)
}

/// renameat2(2).
pub fn renameat2(
    olddir: BorrowedFd<'_>,
    old: &CStr,
    newdir: BorrowedFd<'_>,
    new: &CStr,
    flags: u32,
) -> Result<(), Errno> {
    // SAFETY: both strings are NUL-terminated.
    check(unsafe {
        libc::renameat2(
            olddir.as_raw_fd(),
            old.as_ptr(),
            newdir.as_raw_fd(),
            new.as_ptr(),
            flags,
        )
    })
    .map(drop)
}

/// readlinkat(2) of the symlink `fd` refers to (O_PATH).
pub fn readlink(fd: BorrowedFd<'_>) -> Result<Vec<u8>, Errno> {
    readlinkat(fd.as_raw_fd(), c"")
}

/// readlinkat(2) of `name` in `dir`.
pub fn readlinkat(dir: RawFd, name: &CStr) -> Result<Vec<u8>, Errno> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: the buffer is valid for `len` bytes and `name` is a C string.
    let n = unsafe { libc::readlinkat(dir, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    let n = usize::try_from(n).map_err(|_| errno())?;
    buf.truncate(n);
    Ok(buf)
}

/// fchownat(2).
pub fn fchownat(dir: RawFd, name: &CStr, uid: u32, gid: u32, flags: i32) -> Result<(), Errno> {
    // SAFETY: `name` is NUL-terminated.
    check(unsafe { libc::fchownat(dir, name.as_ptr(), uid, gid, flags) }).map(drop)
}

/// fchmodat(2) (follows: used on /proc/self/fd entries).
pub fn fchmodat(dir: RawFd, name: &CStr, mode: u32) -> Result<(), Errno> {
    // SAFETY: `name` is NUL-terminated.
    check(unsafe { libc::fchmodat(dir, name.as_ptr(), mode, 0) }).map(drop)
}

/// fchmod(2) on an open file.
pub fn fchmod(fd: RawFd, mode: u32) -> Result<(), Errno> {
    // SAFETY: plain syscall on an fd.
    check(unsafe { libc::fchmod(fd, mode) }).map(drop)
}

/// utimensat(2).
pub fn utimensat(
    dir: RawFd,
    name: &CStr,
    times: &[libc::timespec; 2],
    flags: i32,
) -> Result<(), Errno> {
    // SAFETY: `name` is NUL-terminated and `times` points to two timespecs.
    check(unsafe { libc::utimensat(dir, name.as_ptr(), times.as_ptr(), flags) }).map(drop)
}

/// ftruncate(2).
pub fn ftruncate(fd: RawFd, size: u64) -> Result<(), Errno> {
    let size = libc::off_t::try_from(size).map_err(|_| Errno::EFBIG)?;
    // SAFETY: plain syscall on an fd.
    check(unsafe { libc::ftruncate(fd, size) }).map(drop)
}

/// fstatfs(2).
pub fn fstatfs(fd: RawFd) -> Result<libc::statvfs, Errno> {
    // SAFETY: a zeroed statvfs is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer.
    check(unsafe { libc::fstatvfs(fd, &mut st) })?;
    Ok(st)
}

/// The filesystem type (`f_type`, its magic number) of the file open on
/// `fd`, from fstatfs(2).
pub fn fs_magic(fd: RawFd) -> Result<i64, Errno> {
    // SAFETY: a zeroed statfs is a valid value of this plain C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer.
    check(unsafe { libc::fstatfs(fd, &mut st) })?;
    Ok(st.f_type)
}

/// faccessat2(2) with AT_EACCESS (checks the fsuid/fsgid).
pub fn faccessat_eaccess(dir: RawFd, name: &CStr, mask: u32) -> Result<(), Errno> {
    // SAFETY: `name` is NUL-terminated.
    let r = unsafe {
        libc::syscall(
            libc::SYS_faccessat2,
            dir,
            name.as_ptr(),
            mask as libc::c_int,
            libc::AT_EACCESS,
        )
    };
    check_long(r).map(drop)
}

/// One of the daemon's fds named through `/proc/self/fd`, for the xattr
/// family (which has no fd-relative form before Linux 6.13): relative to
/// the daemon's own `/proc/self/fd` directory fd, which keeps working
/// inside a chroot or a pivoted mount namespace, and absolute, for
/// kernels without the `*xattrat` calls.
#[derive(Debug)]
pub struct FdName {
    dir: RawFd,
    rel: CString,
    abs: CString,
}

impl FdName {
    /// `fd` as an entry of the `/proc/self/fd` directory open as `proc_dir`.
    pub fn new(proc_dir: RawFd, fd: RawFd) -> FdName {
        // Integers never contain NUL.
        FdName {
            dir: proc_dir,
            rel: CString::new(fd.to_string()).unwrap_or_default(),
            abs: CString::new(format!("/proc/self/fd/{fd}")).unwrap_or_default(),
        }
    }
}

/// `struct xattr_args` of the `*xattrat` calls.
#[repr(C)]
struct XattrArgs {
    value: u64,
    size: u32,
    flags: u32,
}
const _: () = assert!(std::mem::size_of::<XattrArgs>() == 16);

/// The `*xattrat` syscalls (Linux 6.13; the same numbers on every
/// architecture, being past the unified table's start).
const SYS_SETXATTRAT: libc::c_long = 463;
const SYS_GETXATTRAT: libc::c_long = 464;
const SYS_LISTXATTRAT: libc::c_long = 465;
const SYS_REMOVEXATTRAT: libc::c_long = 466;

/// Set once a `*xattrat` call said ENOSYS: use the absolute paths.
static NO_XATTRAT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the kernel has the `*xattrat` calls (Linux 6.13): asks for an
/// attribute of the current directory, which can fail in any way but
/// ENOSYS when the calls exist.
pub fn xattrat_supported() -> bool {
    let mut args = XattrArgs {
        value: 0,
        size: 0,
        flags: 0,
    };
    // SAFETY: strings are NUL-terminated; `args` names no buffer (size 0)
    // and is valid for its size.
    let r = unsafe {
        libc::syscall(
            SYS_GETXATTRAT,
            libc::AT_FDCWD,
            c".".as_ptr(),
            0,
            c"user.fusebox-probe".as_ptr(),
            &mut args as *mut XattrArgs,
            std::mem::size_of::<XattrArgs>(),
        )
    };
    r >= 0 || errno() != Errno::ENOSYS
}

/// Runs the fd-relative form, or the path form on an older kernel.
fn xattr_call(
    at: impl FnOnce() -> libc::c_long,
    path: impl FnOnce() -> libc::c_long,
) -> Result<usize, Errno> {
    use std::sync::atomic::Ordering;
    if !NO_XATTRAT.load(Ordering::Relaxed) {
        let r = at();
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = errno();
        if e != Errno::ENOSYS {
            return Err(e);
        }
        NO_XATTRAT.store(true, Ordering::Relaxed);
    }
    let r = path();
    usize::try_from(r).map_err(|_| errno())
}

/// getxattr(2) on an fd's name; `buf` empty asks for the size.
pub fn getxattr(f: &FdName, name: &CStr, buf: &mut [u8]) -> Result<usize, Errno> {
    let (ptr, len) = (buf.as_mut_ptr(), buf.len());
    xattr_call(
        || {
            let mut args = XattrArgs {
                value: ptr as u64,
                size: len as u32,
                flags: 0,
            };
            // SAFETY: strings are NUL-terminated; `args` names a buffer
            // valid for `len` bytes and is itself valid for its size.
            unsafe {
                libc::syscall(
                    SYS_GETXATTRAT,
                    f.dir,
                    f.rel.as_ptr(),
                    0,
                    name.as_ptr(),
                    &mut args as *mut XattrArgs,
                    std::mem::size_of::<XattrArgs>(),
                )
            }
        },
        // SAFETY: strings are NUL-terminated; buffer valid for its length.
        || unsafe {
            libc::getxattr(f.abs.as_ptr(), name.as_ptr(), ptr.cast(), len) as libc::c_long
        },
    )
}

/// listxattr(2) on an fd's name.
pub fn listxattr(f: &FdName, buf: &mut [u8]) -> Result<usize, Errno> {
    let (ptr, len) = (buf.as_mut_ptr(), buf.len());
    xattr_call(
        // SAFETY: string NUL-terminated; buffer valid for its length.
        || unsafe { libc::syscall(SYS_LISTXATTRAT, f.dir, f.rel.as_ptr(), 0, ptr, len) },
        // SAFETY: string NUL-terminated; buffer valid for its length.
        || unsafe { libc::listxattr(f.abs.as_ptr(), ptr.cast(), len) as libc::c_long },
    )
}

/// setxattr(2) on an fd's name.
pub fn setxattr(f: &FdName, name: &CStr, value: &[u8], flags: i32) -> Result<(), Errno> {
    xattr_call(
        || {
            let args = XattrArgs {
                value: value.as_ptr() as u64,
                size: value.len() as u32,
                flags: flags as u32,
            };
            // SAFETY: strings NUL-terminated; `args` names `value`, valid
            // for its length, and is itself valid for its size.
            unsafe {
                libc::syscall(
                    SYS_SETXATTRAT,
                    f.dir,
                    f.rel.as_ptr(),
                    0,
                    name.as_ptr(),
                    &args as *const XattrArgs,
                    std::mem::size_of::<XattrArgs>(),
                )
            }
        },
        // SAFETY: strings NUL-terminated; value valid for its length.
        || unsafe {
            libc::setxattr(
                f.abs.as_ptr(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                flags,
            ) as libc::c_long
        },
    )
    .map(drop)
}

/// removexattr(2) on an fd's name.
pub fn removexattr(f: &FdName, name: &CStr) -> Result<(), Errno> {
    xattr_call(
        // SAFETY: strings NUL-terminated.
        || unsafe { libc::syscall(SYS_REMOVEXATTRAT, f.dir, f.rel.as_ptr(), 0, name.as_ptr()) },
        // SAFETY: strings NUL-terminated.
        || unsafe { libc::removexattr(f.abs.as_ptr(), name.as_ptr()) as libc::c_long },
    )
    .map(drop)
}

/// getdents64(2) into `buf`; returns the bytes filled.
pub fn getdents64(fd: RawFd, buf: &mut [u8]) -> Result<usize, Errno> {
    // SAFETY: the buffer is valid for its length.
    let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
    Ok(check_long(n)? as usize)
}

/// lseek(2).
pub fn lseek(fd: RawFd, off: i64, whence: i32) -> Result<u64, Errno> {
    // SAFETY: plain syscall on an fd.
    let r = unsafe { libc::lseek(fd, off, whence) };
    u64::try_from(r).map_err(|_| errno())
}

/// fallocate(2).
pub fn fallocate(fd: RawFd, mode: i32, off: u64, len: u64) -> Result<(), Errno> {
    let off = i64::try_from(off).map_err(|_| Errno::EFBIG)?;
    let len = i64::try_from(len).map_err(|_| Errno::EFBIG)?;
    // SAFETY: plain syscall on an fd.
    check(unsafe { libc::fallocate(fd, mode, off, len) }).map(drop)
}

/// Writes the file's dirty pages back (fsync) and drops all of its pages
/// from the page cache (`POSIX_FADV_DONTNEED`): its next reads go to the
/// disk.
pub fn drop_cached(fd: RawFd) -> Result<(), Errno> {
    // SAFETY: plain syscall on an fd.
    check(unsafe { libc::fsync(fd) })?;
    // SAFETY: plain syscall on an fd; no memory arguments.
    match unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED) } {
        0 => Ok(()),
        e => Err(Errno(e)),
    }
}

/// copy_file_range(2).
pub fn copy_file_range(
    fd_in: RawFd,
    off_in: u64,
    fd_out: RawFd,
    off_out: u64,
    len: u64,
) -> Result<u64, Errno> {
    let mut oi = i64::try_from(off_in).map_err(|_| Errno::EINVAL)?;
    let mut oo = i64::try_from(off_out).map_err(|_| Errno::EINVAL)?;
    // SAFETY: the offset pointers are valid locals.
    let n = unsafe { libc::copy_file_range(fd_in, &mut oi, fd_out, &mut oo, len as usize, 0) };
    u64::try_from(n).map_err(|_| errno())
}

/// syncfs(2).
pub fn syncfs(fd: RawFd) -> Result<(), Errno> {
    // SAFETY: plain syscall on an fd.
    check(unsafe { libc::syncfs(fd) }).map(drop)
}

/// fsync(2) / fdatasync(2).
pub fn fsync(fd: RawFd, datasync: bool) -> Result<(), Errno> {
    // SAFETY: plain syscalls on an fd.
    check(unsafe {
        if datasync {
            libc::fdatasync(fd)
        } else {
            libc::fsync(fd)
        }
    })
    .map(drop)
}

/// dup(2) then close(2): makes the filesystem see a close of the open file
/// description without ending it (the FLUSH semantics of close(2)).
pub fn flush_fd(fd: RawFd) -> Result<(), Errno> {
    // SAFETY: dup returns a new fd that `owned` takes ownership of; dropping
    // it closes it.
    let dup = owned(unsafe { libc::dup(fd) })?;
    // SAFETY: we own `dup`; into_raw_fd hands it to close exactly once.
    check(unsafe { libc::close(std::os::fd::IntoRawFd::into_raw_fd(dup)) }).map(drop)
}

/// fcntl(2) with a `struct flock` (F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW;
/// any other command is EINVAL: its argument may not be a flock).
pub fn fcntl_lock(fd: RawFd, cmd: i32, fl: &mut libc::flock) -> Result<(), Errno> {
    if !matches!(
        cmd,
        libc::F_OFD_GETLK | libc::F_OFD_SETLK | libc::F_OFD_SETLKW
    ) {
        return Err(Errno::EINVAL);
    }
    // SAFETY: `cmd` is one of the lock commands, whose argument is a
    // `struct flock`; `fl` is a valid one for the duration of the call.
    check(unsafe { libc::fcntl(fd, cmd, fl as *mut libc::flock) }).map(drop)
}

/// fcntl(F_GETFL).
pub fn getfl(fd: RawFd) -> Result<i32, Errno> {
    // SAFETY: plain syscall on an fd.
    check(unsafe { libc::fcntl(fd, libc::F_GETFL) })
}

/// A `struct flock` of zeros (F_RDLCK, SEEK_SET, offset and length 0),
/// for the caller to fill in.
pub fn flock_zeroed() -> libc::flock {
    // SAFETY: a zeroed flock is a valid value of this plain C struct (all
    // integer fields).
    unsafe { std::mem::zeroed() }
}

/// flock(2).
pub fn flock(fd: RawFd, op: i32) -> Result<(), Errno> {
    // SAFETY: plain syscall on an fd.
    check(unsafe { libc::flock(fd, op) }).map(drop)
}

/// name_to_handle_at(2) for `fd` itself; returns (handle bytes, type, mount id).
pub fn name_to_handle(fd: RawFd) -> Result<(Vec<u8>, i32, i32), Errno> {
    const MAX: usize = 128;
    #[repr(C)]
    struct Fh {
        bytes: u32,
        typ: i32,
        data: [u8; MAX],
    }
    let mut fh = Fh {
        bytes: MAX as u32,
        typ: 0,
        data: [0; MAX],
    };
    let mut mnt = 0;
    // SAFETY: `fh` is laid out as struct file_handle with room for MAX
    // bytes (announced in `bytes`); `mnt` is a valid out-pointer.
    check(unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            fd,
            c"".as_ptr(),
            &mut fh as *mut Fh,
            &mut mnt as *mut libc::c_int,
            libc::AT_EMPTY_PATH,
        ) as libc::c_int
    })?;
    let n = (fh.bytes as usize).min(MAX);
    Ok((fh.data[..n].to_vec(), fh.typ, mnt))
}

/// open_by_handle_at(2).
pub fn open_by_handle(
    mount_fd: RawFd,
    handle: &[u8],
    typ: i32,
    flags: i32,
) -> Result<OwnedFd, Errno> {
    let mut raw = Vec::with_capacity(8 + handle.len());
    raw.extend_from_slice(&(handle.len() as u32).to_ne_bytes());
    raw.extend_from_slice(&typ.to_ne_bytes());
    raw.extend_from_slice(handle);
    // SAFETY: `raw` holds a struct file_handle (u32 bytes, i32 type, data)
    // whose `bytes` matches the data that follows.
    let r = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount_fd,
            raw.as_mut_ptr(),
            flags | libc::O_CLOEXEC,
        )
    };
    owned(check_long(r)? as libc::c_int)
}

/// Per-thread credential syscalls (raw, so they affect only this thread;
/// glibc's wrappers of setgroups broadcast to every thread).
pub mod thread {
    use super::{check_long, Errno};

    /// setfsuid(2); returns the previous fsuid.
    pub fn setfsuid(uid: u32) -> u32 {
        // SAFETY: plain syscall; it cannot fail in a way that returns -1.
        unsafe { libc::syscall(libc::SYS_setfsuid, uid) as u32 }
    }
    /// setfsgid(2); returns the previous fsgid.
    pub fn setfsgid(gid: u32) -> u32 {
        // SAFETY: plain syscall.
        unsafe { libc::syscall(libc::SYS_setfsgid, gid) as u32 }
    }
    /// setgroups(2) for this thread only.
    pub fn setgroups(groups: &[u32]) -> Result<(), Errno> {
        // SAFETY: the slice is valid for `len` gid_t values.
        check_long(unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) })
            .map(drop)
    }
    /// This thread's supplementary groups.
    pub fn getgroups() -> Vec<u32> {
        // SAFETY: size 0 only asks for the count; nothing is written.
        let n = unsafe { libc::syscall(libc::SYS_getgroups, 0, std::ptr::null_mut::<u32>()) };
        let mut g = vec![0u32; usize::try_from(n).unwrap_or(0)];
        // SAFETY: the buffer holds `len` gid_t values.
        let n = unsafe { libc::syscall(libc::SYS_getgroups, g.len(), g.as_mut_ptr()) };
        g.truncate(usize::try_from(n).unwrap_or(0));
        g
    }
    /// This thread's capability sets (effective, permitted, inheritable),
    /// 64 bits each.
    pub fn capget() -> Result<[u64; 3], Errno> {
        let mut hdr = CapHeader {
            version: CAP_V3,
            pid: 0,
        };
        let mut data = [CapData::default(); 2];
        // SAFETY: a v3 header and room for the two data words it fills.
        check_long(unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) })?;
        let join = |f: fn(&CapData) -> u32| u64::from(f(&data[0])) | (u64::from(f(&data[1])) << 32);
        Ok([
            join(|d| d.effective),
            join(|d| d.permitted),
            join(|d| d.inheritable),
        ])
    }
    /// Sets this thread's capability sets (see [`capget`]).
    pub fn capset(sets: [u64; 3]) -> Result<(), Errno> {
        let mut hdr = CapHeader {
            version: CAP_V3,
            pid: 0,
        };
        let word = |i: usize| CapData {
            effective: (sets[0] >> (32 * i)) as u32,
            permitted: (sets[1] >> (32 * i)) as u32,
            inheritable: (sets[2] >> (32 * i)) as u32,
        };
        let data = [word(0), word(1)];
        // SAFETY: a v3 header and the two data words it reads.
        check_long(unsafe { libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) }).map(drop)
    }
    const CAP_V3: u32 = 0x2008_0522;
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: i32,
    }
    const _: () = assert!(std::mem::size_of::<CapHeader>() == 8);
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const _: () = assert!(std::mem::size_of::<CapData>() == 12);

    /// unshare(CLONE_FS): gives this thread its own umask and cwd.
    pub fn unshare_fs() -> Result<(), Errno> {
        // SAFETY: plain syscall.
        check_long(unsafe { libc::syscall(libc::SYS_unshare, libc::CLONE_FS) }).map(drop)
    }
    /// umask(2) (per thread after [`unshare_fs`]).
    pub fn umask(mask: u32) -> u32 {
        // SAFETY: plain syscall.
        unsafe { libc::umask(mask) }
    }
}

/// Signal delivery to one thread, used to interrupt a blocked lock wait.
pub mod wake {
    use std::sync::Once;

    extern "C" fn nothing(_: libc::c_int) {}

    /// The signal used to interrupt a lock waiter.
    pub fn signal() -> libc::c_int {
        libc::SIGRTMIN() + 2
    }

    /// Installs a handler that does nothing, without SA_RESTART, so the
    /// signal makes a blocking fcntl/flock return EINTR.
    pub fn install() {
        static ONCE: Once = Once::new();
        ONCE.call_once(|| {
            // SAFETY: a zeroed sigaction is valid; the handler is an
            // async-signal-safe function that does nothing.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = nothing as extern "C" fn(libc::c_int) as usize;
                libc::sigemptyset(&mut sa.sa_mask);
                sa.sa_flags = 0;
                libc::sigaction(signal(), &sa, std::ptr::null_mut());
            }
        });
    }

    /// This thread.
    pub fn me() -> libc::pthread_t {
        // SAFETY: pthread_self has no preconditions.
        unsafe { libc::pthread_self() }
    }

    /// Unblocks the wake signal in this thread (a waiter inherits its
    /// creator's mask, which an embedder may have blocked it in).
    pub fn unblock() {
        // SAFETY: a zeroed sigset is valid input to sigemptyset, which
        // initialises it; pthread_sigmask reads it.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, signal());
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        }
    }

    /// Sends the wake signal to `t`.
    ///
    /// # Safety
    ///
    /// `t` must name a thread that has not exited (pthread_kill on an
    /// exited thread's id is undefined behaviour).
    pub unsafe fn kick(t: libc::pthread_t) {
        // A signal with no handler would end the process.
        install();
        // SAFETY: `t` names a live thread (this fn's contract); the
        // handler is set.
        unsafe {
            libc::pthread_kill(t, signal());
        }
    }
}

/// Whether `fd`'s file supports non-blocking reads (FMODE_NOWAIT): without
/// it io_uring hands every read to a worker thread. A one-byte
/// preadv2(RWF_NOWAIT) answers EOPNOTSUPP exactly when it does not.
/// None when the fd cannot be read.
pub fn supports_nowait(fd: RawFd) -> Option<bool> {
    let mut b = [0u8; 1];
    let iov = libc::iovec {
        iov_base: b.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: one iovec pointing at a valid one-byte buffer.
    let r = unsafe { libc::preadv2(fd, &iov, 1, 0, libc::RWF_NOWAIT) };
    if r >= 0 {
        return Some(true);
    }
    match errno().0 {
        libc::EOPNOTSUPP => Some(false),
        libc::EBADF | libc::EINVAL | libc::EISDIR => None,
        // EAGAIN: supported, the data is just not cached.
        _ => Some(true),
    }
}

/// preadv2(RWF_NOWAIT) at `off` into `iovs`: the bytes the page cache
/// holds now, or EAGAIN when it would have to wait for the disk.
///
/// # Safety
///
/// Every iovec must describe mapped, writable memory that no Rust
/// reference points into, for the duration of the call.
pub unsafe fn preadv_nowait(fd: RawFd, iovs: &[libc::iovec], off: u64) -> Result<usize, Errno> {
    let n = iovs.len().min(libc::c_int::MAX as usize) as libc::c_int;
    // SAFETY: the caller's contract: the iovecs name writable memory; the
    // kernel writes only there.
    let r = unsafe { libc::preadv2(fd, iovs.as_ptr(), n, off as libc::off_t, libc::RWF_NOWAIT) };
    if r < 0 {
        return Err(errno());
    }
    Ok(r as usize)
}

/// A new non-blocking eventfd (close-on-exec).
pub fn eventfd() -> Result<OwnedFd, Errno> {
    // SAFETY: eventfd has no memory arguments; it returns a new fd or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: `fd` was just returned by eventfd and is owned by no one.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Empties a non-blocking eventfd (its count is not needed); nothing
/// waiting is not an error.
pub fn eventfd_drain(fd: RawFd) {
    let mut v = 0u64;
    // SAFETY: reads at most 8 bytes into a local u64; the kernel checks
    // `fd`.
    unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
}

/// Adds one to an eventfd.
pub fn eventfd_signal(fd: RawFd) {
    let one = 1u64;
    // SAFETY: writes 8 bytes from a local u64; the kernel checks `fd`.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// The daemon's effective uid.
pub fn geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Sleeps for `d` (under a second) with nanosleep(2), which, unlike
/// `std::thread::sleep`, does not go back to sleep when a signal
/// interrupts it: EINTR then.
pub fn nap(d: std::time::Duration) -> Result<(), Errno> {
    let t = libc::timespec {
        tv_sec: d.as_secs() as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `t` is a valid timespec; no remainder asked.
    check(unsafe { libc::nanosleep(&t, std::ptr::null_mut()) }).map(drop)
}

/// write(2) of `b` to `fd`: how many bytes were written.
pub fn write(fd: RawFd, b: &[u8]) -> Result<usize, Errno> {
    // SAFETY: `b` is readable for its length.
    let n = unsafe { libc::write(fd, b.as_ptr().cast(), b.len()) };
    if n < 0 {
        return Err(errno());
    }
    Ok(n as usize)
}

/// CLOCK_REALTIME_COARSE now (seconds, nanoseconds): the clock the
/// kernel stamps inode times with.
pub fn realtime_coarse() -> Result<(i64, i64), Errno> {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is valid for writing; the clock id is a constant.
    check(unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut t) })?;
    Ok((t.tv_sec, t.tv_nsec))
}

/// lgetxattr(2) of `name` on the path `path` itself (tests look at what
/// the host stored).
#[cfg(feature = "test-utils")]
pub fn lgetxattr(path: &CStr, name: &CStr, buf: &mut [u8]) -> Result<usize, Errno> {
    // SAFETY: NUL-terminated strings; `buf` is writable for its length.
    let r = unsafe {
        libc::lgetxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if r < 0 {
        return Err(errno());
    }
    Ok(r as usize)
}
