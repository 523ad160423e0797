//! POSIX record locks and BSD flock for the client.
//!
//! POSIX locks belong to a lock owner: each (inode, owner) pair that holds
//! one gets its own open file description on the host, opened as the
//! caller with no more access than the handle the lock comes through (a
//! reader's lock never makes the daemon a writer), and takes it there as
//! an OFD lock. A write lock on a read-only description replaces it with a
//! writable one that first takes the same read ranges (`upgrade`,
//! `range::RangeSet`). FLUSH by the owner, or the inode's last RELEASE,
//! drops its locks and closes it; at most `MAX_OWNERS` per inode (ENOLCK
//! beyond). flock locks are taken on the handle's fd. Client ranges are
//! checked before any arithmetic (`range::Span`). A SETLKW that waits is
//! parked on a waiter thread and answered through its [`Deferred`].
//! Lock order: a description's `held` before the owner table (`owners.rs`);
//! the owner table, `pids` and `waiters` are never held together.

mod handover;
mod owners;
mod range;

pub use handover::SavedOwner;

use super::file::HandleData;
use super::PassthroughFs;
use fuse_core::abi::FileLock;
use fuse_core::locks::lock;
use fuse_core::server::{Ctx, Deferred, FsResult, LockReq};
use fuse_core::Errno;
use host_io::sys::{self, wake};
use owners::{settle, Key, OwnerDesc, OwnerTable, Settled, MAX_OWNERS, RETRIES};
use range::Span;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Most SETLKW requests parked at once; beyond it, ENOLCK.
const MAX_WAITERS: usize = 1024;
/// Interrupts for unknown requests remembered: a SETLKW whose interrupt
/// came before it was parked is answered EINTR instead. (A parked one's
/// interrupt signals its waiter thread, whose blocking call returns EINTR.)
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

/// The pid that last took a lock for each (inode, owner): OFD locks carry
/// no pid, and GETLK must name the holder as the client knows it.
type Pids = Arc<Mutex<HashMap<Key, u32>>>;

#[derive(Debug, Default)]
struct Waiters {
    parked: HashMap<u64, Waiter>,
    /// Interrupts that found no parked request (yet).
    early: VecDeque<u64>,
}

/// Lock state of the filesystem.
#[derive(Debug, Default)]
pub struct Locks {
    owners: Arc<OwnerTable>,
    pids: Pids,
    waiters: Arc<Mutex<Waiters>>,
    /// Locks taken up from a migration's source that it still holds
    /// (`handover.rs`; lock order: before any description's `held`).
    pending: Arc<Mutex<handover::Pending>>,
}

impl Locks {
    /// FLUSH by `owner`: its locks go and its description closes.
    pub fn drop_owner(&self, nodeid: u64, owner: u64) {
        self.forget_pending(Some(nodeid), Some(owner));
        if let Some(d) = self.owners.remove((nodeid, owner)) {
            d.release_all(&mut d.held());
        }
        lock(&self.pids).remove(&(nodeid, owner));
    }
    /// The inode's last handle is gone: every owner's description closes.
    pub fn drop_inode(&self, nodeid: u64) {
        self.forget_pending(Some(nodeid), None);
        for d in self.owners.remove_all(Some(nodeid)) {
            d.release_all(&mut d.held());
        }
        lock(&self.pids).retain(|&(n, _), _| n != nodeid);
    }
    /// DESTROY.
    pub fn clear(&self) {
        self.interrupt_all();
        self.forget_pending(None, None);
        for d in self.owners.remove_all(None) {
            d.release_all(&mut d.held());
        }
        lock(&self.pids).clear();
    }
    #[cfg(feature = "test-utils")]
    /// Parked waiters.
    pub fn parked(&self) -> usize {
        lock(&self.waiters).parked.len()
    }
    #[cfg(feature = "test-utils")]
    /// Descriptions held for lock owners.
    pub fn owner_fds(&self) -> usize {
        self.owners.len()
    }
    /// Interrupts every parked SETLKW (the session ends: they end with
    /// EINTR rather than take a lock nobody would release), signalling
    /// their threads until they have left, for one second at most in all.
    fn interrupt_all(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(1);
        loop {
            {
                let mut w = lock(&self.waiters);
                if w.parked.is_empty() {
                    return;
                }
                for waiter in w.parked.values_mut() {
                    waiter.interrupted = true;
                    if let Some(t) = waiter.thread {
                        // SAFETY: the thread removes itself from `parked`
                        // under this lock before it exits, so it is alive
                        // here.
                        unsafe { wake::kick(t) };
                    }
                }
            }
            if std::time::Instant::now() >= deadline {
                log::warn!("parked lock waits still running as the session ends");
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
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
                    // SAFETY: the thread removes itself from `parked` under
                    // this lock before it exits, so it is alive here.
                    unsafe { wake::kick(t) };
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

/// The blocking call of a parked SETLKW, with what it keeps alive.
enum LockCall {
    /// Nothing to do (an unlock by an owner that holds nothing).
    Nothing,
    Flock(Arc<HandleData>, i32),
    Ofd {
        desc: Arc<OwnerDesc>,
        span: Span,
        key: Key,
        owners: Arc<OwnerTable>,
        /// The requesting pid, recorded once the lock is granted.
        pid: u32,
        pids: Pids,
        /// Locks taken up from a migration (`handover.rs`): the wait
        /// starts once none of another owner conflicts.
        pending: Arc<Mutex<handover::Pending>>,
    },
}

impl LockCall {
    fn run(self) -> Result<(), Errno> {
        match self {
            LockCall::Nothing => Ok(()),
            LockCall::Flock(h, op) => sys::flock(h.fd.raw(), op),
            LockCall::Ofd {
                desc,
                span,
                key,
                owners,
                pid,
                pids,
                pending,
            } => {
                // Another owner's pending lock is waited for here; so is
                // the owner's own (the retry thread takes it once the source
                // lets go), so no other owner's wait in the host gets in
                // between.
                while {
                    let p = lock(&pending);
                    p.conflict(key, span).is_some() || p.overlaps_own(key, span)
                } {
                    // Interruptible (FUSE_INTERRUPT signals this thread):
                    // std's sleep would go back to sleep on EINTR.
                    if sys::nap(Duration::from_millis(10)).is_err() {
                        return Err(Errno::EINTR);
                    }
                }
                let mut desc = desc;
                for _ in 0..RETRIES {
                    desc.set(span, true)?;
                    match settle(&owners, key, &desc, span)? {
                        Settled::Held => {
                            if pid != 0 {
                                lock(&pids).insert(key, pid);
                            }
                            return Ok(());
                        }
                        Settled::WaitOn(current) => desc = current,
                    }
                }
                Err(Errno(libc::ENOLCK))
            }
        }
    }
}

impl PassthroughFs {
    /// A new description for a lock owner, through handle `h`, that can
    /// carry read locks (`read`) and write locks (`write`). Opened as the
    /// caller, with the handle's access mode, except that a write-only
    /// handle gets a read-write description where the caller may read
    /// (so the owner's read locks through other handles fit on it too).
    fn open_desc(
        &self,
        ctx: &Ctx,
        h: &HandleData,
        read: bool,
        write: bool,
    ) -> Result<OwnerDesc, Errno> {
        let hacc = sys::getfl(h.fd.raw())? & libc::O_ACCMODE;
        let fits = |acc: i32| (!read || acc != libc::O_WRONLY) && (!write || acc != libc::O_RDONLY);
        let modes: &[i32] = match hacc {
            libc::O_RDONLY => &[libc::O_RDONLY],
            libc::O_WRONLY => &[libc::O_RDWR, libc::O_WRONLY],
            _ => &[libc::O_RDWR],
        };
        let mut refused = false;
        {
            let _c = self.creds(ctx)?;
            for &acc in modes.iter().filter(|&&a| fits(a)) {
                match self.reopen(&h.inode, acc | libc::O_CLOEXEC) {
                    Ok(fd) => return Ok(OwnerDesc::new(fd, acc)),
                    Err(Errno(libc::EACCES | libc::EPERM)) => refused = true,
                    Err(e) => return Err(e),
                }
            }
        }
        if !refused || !fits(hacc) {
            // No mode the handle allows carries what is asked.
            return Err(Errno::EBADF);
        }
        // The caller may not open the file now (its mode changed since the
        // open, or the open file went to a process with other credentials).
        // fcntl(2) checks no permission on an open file, so the handle's own
        // access mode is opened with the daemon's credentials: it gives
        // nothing the handle does not have already.
        let fd = self.reopen(&h.inode, hacc | libc::O_CLOEXEC)?;
        Ok(OwnerDesc::new(fd, hacc))
    }

    /// The owner's description, made, or upgraded so it can carry `typ`.
    fn owner_desc(
        &self,
        ctx: &Ctx,
        h: &HandleData,
        key: Key,
        typ: i32,
    ) -> Result<Arc<OwnerDesc>, Errno> {
        let owners = &self.locks.owners;
        for _ in 0..RETRIES {
            match owners.get(key) {
                Some(d) if d.carries(typ) => return Ok(d),
                Some(d) => self.upgrade(ctx, h, key, &d, typ)?,
                None => {
                    if owners.count(key.0) >= MAX_OWNERS {
                        return Err(Errno(libc::ENOLCK));
                    }
                    let d = self.open_desc(ctx, h, typ == libc::F_RDLCK, typ == libc::F_WRLCK)?;
                    let d = owners.enter(key, d)?;
                    if d.carries(typ) {
                        return Ok(d);
                    }
                }
            }
        }
        Err(Errno(libc::ENOLCK))
    }

    /// A write lock for an owner whose description `old` is O_RDONLY:
    /// replaces it with one open for writing (as the caller, through the
    /// writable handle `h`) that holds the same read locks, taken again on
    /// it before `old` lets go. They cannot conflict (no writer can hold a
    /// range `old` holds a read lock on), so the owner's locks are held
    /// throughout. If one cannot be taken, `old` stays as it was. Done (or
    /// overtaken by another request of the owner) when Ok: look again.
    fn upgrade(
        &self,
        ctx: &Ctx,
        h: &HandleData,
        key: Key,
        old: &Arc<OwnerDesc>,
        typ: i32,
    ) -> Result<(), Errno> {
        // A write-only description holds write locks, which no second
        // description can take while it holds them: fcntl's EBADF.
        if !old.read_only() || typ != libc::F_WRLCK {
            return Err(Errno::EBADF);
        }
        let keep = !old.held().is_empty();
        let new = self.open_desc(ctx, h, keep, true)?;
        let mut held = old.held();
        if !self.locks.owners.is(key, old) {
            return Ok(());
        }
        if !held.is_empty() && !new.carries(libc::F_RDLCK) {
            return Err(Errno::EBADF);
        }
        for (start, end) in held.iter() {
            let span = Span {
                typ: libc::F_RDLCK,
                start,
                end,
            };
            new.set(span, false).map_err(|e| match e {
                // Cannot happen (see above), but is no conflict to report.
                Errno::EAGAIN => Errno(libc::ENOLCK),
                e => e,
            })?;
        }
        if self.locks.owners.replace(key, old, Arc::new(new)) {
            // Its locks are on the new one now. A SETLKW parked on it keeps
            // it open; what such a waiter is granted moves over (`settle`).
            old.release_all(&mut held);
        }
        Ok(())
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
        // F_OFD_GETLK checks no access mode, so no description is opened:
        // the owner's own does not see the owner's locks; without one, the
        // handle's fd, which holds no OFD locks (its flock locks are apart),
        // sees every conflicting lock.
        let key = (h.inode.nodeid, req.owner);
        // A lock taken up from a migration and not granted on the host yet
        // is its owner's all the same (`handover.rs`).
        let (theirs, mine) = self.locks.with_pending(|p| match p {
            Some(p) => (p.conflict(key, asked), Some(p.clone_of(key))),
            None => (None, None),
        });
        if let Some((k, s)) = theirs {
            let pid = lock(&self.locks.pids).get(&k).copied().unwrap_or(0);
            return Ok(FileLock {
                start: s.start,
                end: s.end,
                typ: s.typ as u32,
                pid,
            });
        }
        let desc = self.locks.owners.get(key);
        let fd = desc.as_ref().map_or(h.fd.raw(), |d| d.raw());
        let mut fl = asked.flock();
        sys::fcntl_lock(fd, libc::F_OFD_GETLK, &mut fl)?;
        let own_pending =
            Span::of_flock(&fl).is_some_and(|c| mine.as_ref().is_some_and(|m| m.covers(key, c)));
        if fl.l_type == libc::F_UNLCK as libc::c_short || own_pending {
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
            _ if asked.typ == libc::F_UNLCK => {
                lock(&self.locks.pids).get(&key).copied().unwrap_or(0)
            }
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
        let probe = conflict.with_type(if conflict.typ == libc::F_WRLCK {
            libc::F_RDLCK
        } else {
            libc::F_WRLCK
        });
        for (key, d) in self.locks.owners.others(nodeid, requester) {
            let mut fl = probe.flock();
            let free = sys::fcntl_lock(d.raw(), libc::F_OFD_GETLK, &mut fl).is_ok()
                && fl.l_type == libc::F_UNLCK as libc::c_short;
            if free {
                if let Some(&pid) = lock(&self.locks.pids).get(&key) {
                    return pid;
                }
            }
        }
        0
    }

    /// A POSIX lock or unlock without waiting, on the owner's description
    /// as it is when the lock is taken.
    fn set_posix(&self, ctx: &Ctx, h: &HandleData, req: &LockReq) -> Result<(), Errno> {
        let span = Span::of_client(&req.lock)?;
        let key = (h.inode.nodeid, req.owner);
        self.locks.with_pending(|mut pending| {
            if let Some(p) = pending.as_deref_mut() {
                if p.conflict(key, span).is_some() {
                    return Err(Errno::EAGAIN);
                }
                if p.takes(key, span) {
                    // The host has the source's lock there still: the
                    // owner's change is made to what is pending.
                    p.apply(key, span);
                    return Ok(());
                }
            }
            for _ in 0..RETRIES {
                let desc = if span.typ == libc::F_UNLCK {
                    match self.locks.owners.get(key) {
                        Some(d) => d,
                        None => return Ok(()),
                    }
                } else {
                    self.owner_desc(ctx, h, key, span.typ)?
                };
                let mut held = desc.held();
                if !self.locks.owners.is(key, &desc) {
                    // Replaced meanwhile (FLUSH, upgrade): use the new one.
                    continue;
                }
                desc.set_held(&mut held, span)?;
                drop(held);
                if let Some(p) = pending.as_deref_mut() {
                    p.settle(key, span.start, span.end);
                }
                if span.typ != libc::F_UNLCK && req.lock.pid != 0 {
                    lock(&self.locks.pids).insert(key, req.lock.pid);
                }
                return Ok(());
            }
            Err(Errno(libc::ENOLCK))
        })
    }

    pub(super) fn op_setlk(&self, ctx: &Ctx, fh: u64, req: &LockReq) -> FsResult<()> {
        let h = self.handles.get(fh)?;
        Self::check_mode(&h, req.lock.typ)?;
        if req.flock {
            return sys::flock(h.fd.raw(), flock_op(req.lock.typ, false)?);
        }
        self.set_posix(ctx, &h, req)
    }

    /// The blocking call of a SETLKW that has to wait.
    fn wait_call(&self, ctx: &Ctx, h: &Arc<HandleData>, req: &LockReq) -> Result<LockCall, Errno> {
        if req.flock {
            return Ok(LockCall::Flock(h.clone(), flock_op(req.lock.typ, true)?));
        }
        let span = Span::of_client(&req.lock)?;
        if span.typ == libc::F_UNLCK {
            return Ok(LockCall::Nothing);
        }
        let key = (h.inode.nodeid, req.owner);
        Ok(LockCall::Ofd {
            desc: self.owner_desc(ctx, h, key, span.typ)?,
            span,
            key,
            owners: self.locks.owners.clone(),
            pid: req.lock.pid,
            pids: self.locks.pids.clone(),
            pending: self.locks.pending.clone(),
        })
    }

    pub(super) fn op_setlkw(&self, ctx: &Ctx, fh: u64, req: &LockReq, done: Deferred) {
        let h = match self.handles.get(fh) {
            Ok(h) => h,
            Err(e) => return done.complete(Err(e)),
        };
        match self.op_setlk(ctx, fh, req) {
            Err(Errno::EAGAIN) => {}
            r => return done.complete(r),
        }
        let call = match self.wait_call(ctx, &h, req) {
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
