//! POSIX record locks and BSD flock for the client.
//!
//! POSIX locks belong to a lock owner, not to an open file, so each
//! (inode, owner) pair gets its own open file description on the host and
//! the lock is taken there as an OFD lock: owners conflict with each other
//! and with host processes exactly as processes do. FLUSH from an owner
//! closes its description, which drops its locks (close(2) semantics).
//! flock locks belong to the open file and are taken on the handle's fd.
//!
//! A SETLKW that has to wait is parked on a waiter thread of its own (the
//! worker that received it goes back to serving) and answered through its
//! [`Deferred`]; FUSE_INTERRUPT for it signals that thread, whose blocking
//! call then returns EINTR.
//!
//! Lock order: `owners` and `waiters` are never held together.

use super::file::HandleData;
use super::inode::CountedFd;
use super::sys::{self, wake};
use super::PassthroughFs;
use fuse_core::abi::FileLock;
use fuse_core::server::{Ctx, Deferred, FsResult, LockReq};
use fuse_core::Errno;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Most SETLKW requests parked at once; beyond it, ENOLCK.
const MAX_WAITERS: usize = 1024;
/// `OFFSET_MAX`: a lock to end of file.
const OFFSET_MAX: u64 = i64::MAX as u64;

#[derive(Debug, Clone, Copy)]
struct Waiter {
    thread: Option<libc::pthread_t>,
    interrupted: bool,
}

/// Lock state of the filesystem.
#[derive(Debug, Default)]
pub struct Locks {
    owners: Mutex<HashMap<(u64, u64), Arc<CountedFd>>>,
    waiters: Arc<Mutex<HashMap<u64, Waiter>>>,
}

impl Locks {
    /// FLUSH by `owner`: its description closes and its locks go.
    pub fn drop_owner(&self, nodeid: u64, owner: u64) {
        let fd = self
            .owners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(nodeid, owner));
        drop(fd);
    }
    /// DESTROY.
    pub fn clear(&self) {
        self.owners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
    /// Parked waiters.
    pub fn parked(&self) -> usize {
        self.waiters.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
    /// Interrupts the parked SETLKW `unique`, if any: its thread is
    /// signalled until it has left the blocking call.
    pub fn interrupt(&self, unique: u64) {
        for _ in 0..1000 {
            {
                let mut w = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
                let Some(waiter) = w.get_mut(&unique) else {
                    return;
                };
                waiter.interrupted = true;
                if let Some(t) = waiter.thread {
                    // The thread removes itself under this lock before it
                    // exits, so it is alive here.
                    wake::kick(t);
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn to_flock(l: &FileLock) -> libc::flock {
    // SAFETY: a zeroed flock is a valid value of this plain C struct.
    let mut f: libc::flock = unsafe { std::mem::zeroed() };
    f.l_type = l.typ as libc::c_short;
    f.l_whence = libc::SEEK_SET as libc::c_short;
    f.l_start = l.start.min(OFFSET_MAX) as libc::off_t;
    f.l_len = if l.end >= OFFSET_MAX {
        0
    } else {
        (l.end.saturating_sub(l.start) + 1) as libc::off_t
    };
    f
}

fn from_flock(f: &libc::flock) -> FileLock {
    let start = f.l_start.max(0) as u64;
    FileLock {
        start,
        end: if f.l_len == 0 {
            OFFSET_MAX
        } else {
            start + f.l_len as u64 - 1
        },
        typ: f.l_type as u32,
        pid: f.l_pid.max(0) as u32,
    }
}

fn flock_op(typ: u32, wait: bool) -> Result<i32, Errno> {
    let op = match typ as i32 {
        libc::F_RDLCK => libc::LOCK_SH,
        libc::F_WRLCK => libc::LOCK_EX,
        libc::F_UNLCK => libc::LOCK_UN,
        _ => return Err(Errno::EINVAL),
    };
    Ok(if wait { op } else { op | libc::LOCK_NB })
}

impl PassthroughFs {
    /// The owner's description on the handle's inode, made on first use.
    fn owner_fd(&self, h: &HandleData, owner: u64) -> Result<Arc<CountedFd>, Errno> {
        let key = (h.inode.nodeid, owner);
        if let Some(fd) = self
            .locks
            .owners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok(fd.clone());
        }
        let mode = if h.inode.is_dir() {
            libc::O_RDONLY
        } else {
            libc::O_RDWR
        };
        let fd = match self.reopen(&h.inode, mode) {
            Err(Errno(libc::EACCES)) | Err(Errno(libc::EROFS)) => {
                self.reopen(&h.inode, libc::O_RDONLY)
            }
            r => r,
        }?;
        let fd = Arc::new(fd);
        let mut owners = self.locks.owners.lock().unwrap_or_else(|e| e.into_inner());
        Ok(owners.entry(key).or_insert(fd).clone())
    }

    pub(super) fn op_getlk(&self, fh: u64, req: &LockReq) -> FsResult<FileLock> {
        let h = self.handles.get(fh)?;
        if req.flock {
            return Err(Errno::EINVAL);
        }
        let fd = self.owner_fd(&h, req.owner)?;
        let mut fl = to_flock(&req.lock);
        sys::fcntl_lock(fd.raw(), libc::F_OFD_GETLK, &mut fl)?;
        Ok(from_flock(&fl))
    }

    /// The blocking call a lock request makes, on fds it keeps alive.
    fn lock_call(&self, h: &Arc<HandleData>, req: &LockReq, wait: bool) -> Result<LockCall, Errno> {
        if req.flock {
            return Ok(LockCall::Flock(h.clone(), flock_op(req.lock.typ, wait)?));
        }
        let fd = self.owner_fd(h, req.owner)?;
        let cmd = if wait {
            libc::F_OFD_SETLKW
        } else {
            libc::F_OFD_SETLK
        };
        Ok(LockCall::Ofd(fd, cmd, to_flock(&req.lock)))
    }

    pub(super) fn op_setlk(&self, fh: u64, req: &LockReq) -> FsResult<()> {
        let h = self.handles.get(fh)?;
        match self.lock_call(&h, req, false)?.run() {
            // POSIX may report a conflict as EACCES; FUSE wants EAGAIN.
            Err(Errno(libc::EACCES)) => Err(Errno::EAGAIN),
            r => r,
        }
    }

    pub(super) fn op_setlkw(&self, ctx: &Ctx, fh: u64, req: &LockReq, done: Deferred) {
        let h = match self.handles.get(fh) {
            Ok(h) => h,
            Err(e) => return done.complete(Err(e)),
        };
        match self.op_setlk(fh, req) {
            Err(Errno::EAGAIN) => {}
            r => return done.complete(r),
        }
        let call = match self.lock_call(&h, req, true) {
            Ok(c) => c,
            Err(e) => return done.complete(Err(e)),
        };
        let waiters = self.locks.waiters.clone();
        {
            let mut w = waiters.lock().unwrap_or_else(|e| e.into_inner());
            if w.len() >= MAX_WAITERS {
                drop(w);
                return done.complete(Err(Errno(libc::ENOLCK)));
            }
            w.insert(
                ctx.unique,
                Waiter {
                    thread: None,
                    interrupted: false,
                },
            );
        }
        wake::install();
        let unique = ctx.unique;
        let table = waiters.clone();
        let spawned = std::thread::Builder::new()
            .name("fusebox-lockwait".into())
            .spawn(move || {
                let go = {
                    let mut w = table.lock().unwrap_or_else(|e| e.into_inner());
                    match w.get_mut(&unique) {
                        Some(me) if !me.interrupted => {
                            me.thread = Some(wake::me());
                            true
                        }
                        _ => false,
                    }
                };
                let r = if go { call.run() } else { Err(Errno::EINTR) };
                // Leave the table before the thread can end, so nobody
                // signals a thread that is gone.
                table
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&unique);
                done.complete(r);
            });
        if spawned.is_err() {
            // The closure (and with it `done`, which answers EIO when
            // dropped) is gone; only the table entry is left to remove.
            waiters
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&unique);
        }
    }
}

/// A lock syscall with the fds it needs.
enum LockCall {
    Flock(Arc<HandleData>, i32),
    Ofd(Arc<CountedFd>, i32, libc::flock),
}

impl LockCall {
    fn run(self) -> Result<(), Errno> {
        match self {
            LockCall::Flock(h, op) => sys::flock(h.fd.raw(), op),
            LockCall::Ofd(fd, cmd, mut fl) => sys::fcntl_lock(fd.raw(), cmd, &mut fl),
        }
    }
}
