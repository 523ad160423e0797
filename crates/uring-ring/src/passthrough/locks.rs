//! POSIX record locks and BSD flock for the client.
//!
//! POSIX locks belong to a lock owner, not to an open file, so each
//! (inode, owner) pair that holds a lock gets its own open file description
//! on the host and the lock is taken there as an OFD lock: owners conflict
//! with each other and with host processes exactly as processes do. FLUSH
//! from an owner closes its description, which drops its locks (close(2)
//! semantics); so does the release of the inode's last handle. GETLK and
//! unlocks by an owner with no description make none. At most
//! `MAX_OWNERS` owners per inode hold descriptions (ENOLCK beyond), so a
//! client cannot spend the fd budget on owners. flock locks belong to the
//! open file and are taken on the handle's fd.
//!
//! A SETLKW that has to wait is parked on a waiter thread of its own (the
//! worker that received it goes back to serving) and answered through its
//! [`Deferred`]; FUSE_INTERRUPT for it signals that thread, whose blocking
//! call then returns EINTR. An interrupt that arrives before its SETLKW is
//! parked is remembered (the last `RECENT` of them).
//!
//! Lock order: `owners`, `pids` and `waiters` are never held together.

mod range;

use super::file::HandleData;
use super::inode::CountedFd;
use super::sys::{self, wake};
use super::PassthroughFs;
use fuse_core::abi::FileLock;
use fuse_core::server::{Ctx, Deferred, FsResult, LockReq};
use fuse_core::Errno;
use range::Span;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Most SETLKW requests parked at once; beyond it, ENOLCK.
const MAX_WAITERS: usize = 1024;
/// Most lock owners holding a description on one inode.
const MAX_OWNERS: usize = 256;
/// Interrupts for unknown requests remembered.
const RECENT: usize = 64;
/// Stack of a waiter thread. It makes a blocking fcntl or flock, a few
/// table updates and the reply (a device write or a ring wake-up): the
/// lock tests pass with 16 KiB in a debug build. `MAX_WAITERS` parked
/// waiters cost 64 MiB of address space at most, not 2 GiB.
const WAITER_STACK: usize = 64 * 1024;

#[derive(Debug, Clone, Copy)]
struct Waiter {
    thread: Option<libc::pthread_t>,
    interrupted: bool,
}

type Owners = Arc<Mutex<HashMap<(u64, u64), Arc<CountedFd>>>>;
/// The pid that last took a lock for each (inode, owner): OFD locks carry
/// no pid, and GETLK must name the holder as the client knows it.
type Pids = Arc<Mutex<HashMap<(u64, u64), u32>>>;

#[derive(Debug, Default)]
struct Waiters {
    parked: HashMap<u64, Waiter>,
    /// Interrupts that found no parked request (yet).
    early: VecDeque<u64>,
}

/// Lock state of the filesystem.
#[derive(Debug, Default)]
pub struct Locks {
    owners: Owners,
    pids: Pids,
    waiters: Arc<Mutex<Waiters>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Locks {
    /// FLUSH by `owner`: its description closes and its locks go.
    pub fn drop_owner(&self, nodeid: u64, owner: u64) {
        let fd = lock(&self.owners).remove(&(nodeid, owner));
        drop(fd);
        lock(&self.pids).remove(&(nodeid, owner));
    }
    /// The inode's last handle is gone: every owner's description closes.
    pub fn drop_inode(&self, nodeid: u64) {
        lock(&self.owners).retain(|&(n, _), _| n != nodeid);
        lock(&self.pids).retain(|&(n, _), _| n != nodeid);
    }
    /// DESTROY.
    pub fn clear(&self) {
        lock(&self.owners).clear();
        lock(&self.pids).clear();
    }
    /// Parked waiters.
    pub fn parked(&self) -> usize {
        lock(&self.waiters).parked.len()
    }
    /// Descriptions held for lock owners.
    pub fn owner_fds(&self) -> usize {
        lock(&self.owners).len()
    }
    /// Interrupts the parked SETLKW `unique`: its thread is signalled until
    /// it has left the blocking call. An unknown unique is remembered, in
    /// case its SETLKW is still on the way to being parked.
    pub fn interrupt(&self, unique: u64) {
        for _ in 0..1000 {
            {
                let mut w = lock(&self.waiters);
                let Some(waiter) = w.parked.get_mut(&unique) else {
                    if w.early.len() >= RECENT {
                        w.early.pop_front();
                    }
                    w.early.push_back(unique);
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

fn flock_op(typ: u32, wait: bool) -> Result<i32, Errno> {
    let op = match typ as i32 {
        libc::F_RDLCK => libc::LOCK_SH,
        libc::F_WRLCK => libc::LOCK_EX,
        libc::F_UNLCK => libc::LOCK_UN,
        _ => return Err(Errno::EINVAL),
    };
    Ok(if wait { op } else { op | libc::LOCK_NB })
}

/// A lock syscall with the fds it needs.
enum LockCall {
    /// Nothing to do (an unlock by an owner that holds nothing).
    Nothing,
    Flock(Arc<HandleData>, i32),
    Ofd {
        fd: Arc<CountedFd>,
        cmd: i32,
        fl: libc::flock,
        /// Where the description belongs once the lock is granted.
        key: (u64, u64),
        owners: Owners,
        /// The requesting pid, recorded once the lock is granted.
        pid: u32,
        pids: Pids,
    },
}

impl LockCall {
    fn run(self) -> Result<(), Errno> {
        match self {
            LockCall::Nothing => Ok(()),
            LockCall::Flock(h, op) => sys::flock(h.fd.raw(), op),
            LockCall::Ofd {
                fd,
                cmd,
                mut fl,
                key,
                owners,
                pid,
                pids,
            } => {
                sys::fcntl_lock(fd.raw(), cmd, &mut fl)?;
                if fl.l_type != libc::F_UNLCK as libc::c_short {
                    // A FLUSH while we waited took the description out of
                    // the table: the granted lock must stay reachable.
                    lock(&owners).entry(key).or_insert(fd);
                    if pid != 0 {
                        lock(&pids).insert(key, pid);
                    }
                }
                Ok(())
            }
        }
    }
}

impl PassthroughFs {
    /// The owner's description on the handle's inode: the existing one, or
    /// (`make`) a new one, or None.
    fn owner_fd(
        &self,
        h: &HandleData,
        owner: u64,
        make: bool,
    ) -> Result<Option<Arc<CountedFd>>, Errno> {
        let key = (h.inode.nodeid, owner);
        {
            let owners = lock(&self.locks.owners);
            if let Some(fd) = owners.get(&key) {
                return Ok(Some(fd.clone()));
            }
            if !make {
                return Ok(None);
            }
            if owners.keys().filter(|(n, _)| *n == key.0).count() >= MAX_OWNERS {
                return Err(Errno(libc::ENOLCK));
            }
        }
        // The daemon's own access: the client's right to the lock type was
        // checked against the handle (`check_mode`).
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
        Ok(Some(
            lock(&self.locks.owners).entry(key).or_insert(fd).clone(),
        ))
    }

    /// fcntl(2) refuses a read lock on a file not open for reading and a
    /// write lock on one not open for writing (EBADF); so do we.
    fn check_mode(h: &HandleData, typ: u32) -> Result<(), Errno> {
        let acc = sys::getfl(h.fd.raw())? & libc::O_ACCMODE;
        let ok = match typ as i32 {
            libc::F_RDLCK => acc != libc::O_WRONLY,
            libc::F_WRLCK => acc != libc::O_RDONLY,
            _ => true,
        };
        if ok {
            Ok(())
        } else {
            Err(Errno::EBADF)
        }
    }

    pub(super) fn op_getlk(&self, fh: u64, req: &LockReq) -> FsResult<FileLock> {
        let h = self.handles.get(fh)?;
        if req.flock {
            return Err(Errno::EINVAL);
        }
        let asked = Span::of_client(&req.lock)?;
        let mut fl = asked.flock();
        match self.owner_fd(&h, req.owner, false)? {
            Some(fd) => sys::fcntl_lock(fd.raw(), libc::F_OFD_GETLK, &mut fl)?,
            // An owner with no description holds no locks: a fresh one
            // sees every conflicting lock, and is closed again.
            None => {
                let fd = self.reopen(&h.inode, libc::O_RDONLY)?;
                sys::fcntl_lock(fd.raw(), libc::F_OFD_GETLK, &mut fl)?;
            }
        }
        if fl.l_type == libc::F_UNLCK as libc::c_short {
            return Ok(FileLock {
                typ: libc::F_UNLCK as u32,
                pid: 0,
                ..req.lock
            });
        }
        // The kernel names a lock within 0..=OFFSET_MAX; anything else is
        // not passed on.
        let held = Span::of_flock(&fl).ok_or(Errno::EIO)?;
        let pid = match u32::try_from(fl.l_pid) {
            Ok(pid) if pid > 0 => pid,
            // F_UNLCK asks what the description itself holds (as
            // F_OFD_GETLK with F_UNLCK does): the owner's own lock.
            _ if asked.typ == libc::F_UNLCK => lock(&self.locks.pids)
                .get(&(h.inode.nodeid, req.owner))
                .copied()
                .unwrap_or(0),
            // An OFD lock: one of the client's owners, or a host process's.
            // Probe only where the request and the conflict overlap.
            _ => self.lock_holder(
                h.inode.nodeid,
                req.owner,
                held.overlap(asked).unwrap_or(held),
            ),
        };
        Ok(FileLock {
            start: held.start,
            end: held.end,
            // F_RDLCK or F_WRLCK: not negative.
            typ: held.typ as u32,
            pid,
        })
    }

    /// The pid of the client's owner that holds `conflict` (0 if it is
    /// not one of the client's, or cannot be told). An owner holds it when
    /// the range looks free from its own description, which does not see
    /// its own locks: probing with a read lock for a write conflict (so
    /// other readers do not count) and with a write lock for a read one.
    fn lock_holder(&self, nodeid: u64, requester: u64, conflict: Span) -> u32 {
        let candidates: Vec<_> = lock(&self.locks.owners)
            .iter()
            .filter(|(&(n, o), _)| n == nodeid && o != requester)
            .map(|(&k, fd)| (k, fd.clone()))
            .collect();
        let probe = conflict.with_type(if conflict.typ == libc::F_WRLCK {
            libc::F_RDLCK
        } else {
            libc::F_WRLCK
        });
        for (key, fd) in candidates {
            let mut fl = probe.flock();
            let free = sys::fcntl_lock(fd.raw(), libc::F_OFD_GETLK, &mut fl).is_ok()
                && fl.l_type == libc::F_UNLCK as libc::c_short;
            if free {
                if let Some(&pid) = lock(&self.locks.pids).get(&key) {
                    return pid;
                }
            }
        }
        0
    }

    /// The blocking call a lock request makes, on fds it keeps alive.
    fn lock_call(&self, h: &Arc<HandleData>, req: &LockReq, wait: bool) -> Result<LockCall, Errno> {
        Self::check_mode(h, req.lock.typ)?;
        if req.flock {
            return Ok(LockCall::Flock(h.clone(), flock_op(req.lock.typ, wait)?));
        }
        let span = Span::of_client(&req.lock)?;
        let unlock = span.typ == libc::F_UNLCK;
        let Some(fd) = self.owner_fd(h, req.owner, !unlock)? else {
            return Ok(LockCall::Nothing);
        };
        let cmd = if wait {
            libc::F_OFD_SETLKW
        } else {
            libc::F_OFD_SETLK
        };
        Ok(LockCall::Ofd {
            fd,
            cmd,
            fl: span.flock(),
            key: (h.inode.nodeid, req.owner),
            owners: self.locks.owners.clone(),
            pid: req.lock.pid,
            pids: self.locks.pids.clone(),
        })
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
        let unique = ctx.unique;
        {
            let mut w = lock(&waiters);
            if let Some(i) = w.early.iter().position(|&u| u == unique) {
                w.early.remove(i);
                drop(w);
                return done.complete(Err(Errno::EINTR));
            }
            if w.parked.contains_key(&unique) {
                // A unique already in flight: a client bug or an attack.
                drop(w);
                return done.complete(Err(Errno::EINVAL));
            }
            if w.parked.len() >= MAX_WAITERS {
                drop(w);
                return done.complete(Err(Errno(libc::ENOLCK)));
            }
            w.parked.insert(
                unique,
                Waiter {
                    thread: None,
                    interrupted: false,
                },
            );
        }
        wake::install();
        let table = waiters.clone();
        let spawned = std::thread::Builder::new()
            .name("fusebox-lockwait".into())
            .stack_size(WAITER_STACK)
            .spawn(move || {
                wake::unblock();
                let go = {
                    let mut w = lock(&table);
                    match w.parked.get_mut(&unique) {
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
                lock(&table).parked.remove(&unique);
                done.complete(r);
            });
        if spawned.is_err() {
            // The closure (and with it `done`, which answers EIO when
            // dropped) is gone; only the table entry is left to remove.
            lock(&waiters).parked.remove(&unique);
        }
    }
}
