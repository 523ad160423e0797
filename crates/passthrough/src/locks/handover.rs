//! POSIX locks across a live migration.
//!
//! The source saves each owner description's OFD locks as the host kernel
//! lists them (`/proc/self/fdinfo`). The destination opens a description
//! per owner again and takes each lock; one the source still holds is
//! *pending*, retried every `RETRY_EVERY` until the source lets go (or
//! `RETRY_FOR` passed, which is reported). The daemon holds a pending lock
//! for its owner: another owner's conflicting lock gets EAGAIN, or waits
//! (SETLKW) until the range is no longer pending; GETLK names the owner.
//! The owner's own change wholly within its pending ranges is made to them;
//! one reaching past them, or an upgrade, goes to the host (a SETLKW once
//! the owner's overlapping pending ranges were taken), and what it is
//! granted leaves them. All under `Pending`'s lock (before any
//! description's `held`), so the retry thread never takes back a range the
//! client changed. FLUSH and the last RELEASE take the owner's out.

use super::owners::{Key, OwnerDesc, OwnerTable};
use super::range::{Span, OFFSET_MAX};
use super::{lock, Locks};
use fuse_core::Errno;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// How often a pending lock is tried again.
const RETRY_EVERY: Duration = Duration::from_millis(10);
/// How long pending locks are tried before they are given up.
const RETRY_FOR: Duration = Duration::from_secs(600);

/// One owner's locks as saved: its description's access mode, the pid
/// its locks were last taken by, and (type, first byte, last byte).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedOwner {
    /// Node id of the inode.
    pub nodeid: u64,
    /// The client's lock owner.
    pub owner: u64,
    /// O_RDONLY, O_WRONLY or O_RDWR.
    pub acc: i32,
    /// The pid GETLK names for it.
    pub pid: u32,
    /// F_RDLCK or F_WRLCK, start, end (inclusive).
    pub spans: Vec<(i32, u64, u64)>,
}

/// Locks taken up from a migration's source that it still holds.
#[derive(Debug, Default)]
pub(super) struct Pending {
    map: HashMap<Key, Vec<Span>>,
}

impl Pending {
    /// Takes `[start, end]` out of `key`'s pending ranges.
    pub(super) fn settle(&mut self, key: Key, start: u64, end: u64) {
        let Some(spans) = self.map.get_mut(&key) else {
            return;
        };
        let mut out = Vec::with_capacity(spans.len() + 1);
        for s in spans.drain(..) {
            if s.end < start || s.start > end {
                out.push(s);
                continue;
            }
            if s.start < start {
                out.push(Span {
                    end: start - 1,
                    ..s
                });
            }
            if s.end > end {
                out.push(Span {
                    start: end + 1,
                    ..s
                });
            }
        }
        if out.is_empty() {
            self.map.remove(&key);
        } else {
            *spans = out;
        }
    }
}

/// Whether types `a` and `b` conflict (a write lock conflicts with any).
fn conflicts(a: i32, b: i32) -> bool {
    a == libc::F_WRLCK || b == libc::F_WRLCK
}

impl Pending {
    /// A pending lock of another owner than `key`'s on the same inode that
    /// `span` conflicts with: the daemon holds it for that owner until the
    /// host grants it, so others are refused (or wait) as if it were held.
    pub(super) fn conflict(&self, key: Key, span: Span) -> Option<(Key, Span)> {
        if span.typ == libc::F_UNLCK {
            return None;
        }
        self.map
            .iter()
            .filter(|(k, _)| k.0 == key.0 && k.1 != key.1)
            .flat_map(|(k, v)| v.iter().map(move |s| (*k, *s)))
            .find(|(_, s)| conflicts(s.typ, span.typ) && s.overlap(span).is_some())
    }

    /// Whether `span` lies wholly within `key`'s pending ranges: the
    /// owner's change of it is then made to them (the host still has the
    /// source's lock there), not on the host.
    pub(super) fn covers(&self, key: Key, span: Span) -> bool {
        let Some(v) = self.map.get(&key) else {
            return false;
        };
        let mut at = span.start;
        let mut sorted: Vec<&Span> = v.iter().collect();
        sorted.sort_by_key(|s| s.start);
        for s in sorted {
            if s.start <= at && s.end >= at {
                if s.end >= span.end {
                    return true;
                }
                at = s.end + 1;
            }
        }
        false
    }

    /// Whether the owner's lock or unlock of `span` can be made to its
    /// pending ranges alone: `span` lies within them, and is no write lock
    /// over a pending read lock (that would be an upgrade, which needs the
    /// host: another owner may wait there for a read lock on the range).
    pub(super) fn takes(&self, key: Key, span: Span) -> bool {
        if !self.covers(key, span) {
            return false;
        }
        span.typ != libc::F_WRLCK
            || self.map.get(&key).is_some_and(|v| {
                v.iter()
                    .filter(|s| s.overlap(span).is_some())
                    .all(|s| s.typ == libc::F_WRLCK)
            })
    }

    /// Whether `span` overlaps `key`'s own pending ranges.
    pub(super) fn overlaps_own(&self, key: Key, span: Span) -> bool {
        self.map
            .get(&key)
            .is_some_and(|v| v.iter().any(|s| s.overlap(span).is_some()))
    }

    /// `key`'s pending ranges alone.
    pub(super) fn clone_of(&self, key: Key) -> Pending {
        let mut map = HashMap::new();
        if let Some(v) = self.map.get(&key) {
            map.insert(key, v.clone());
        }
        Pending { map }
    }

    /// The owner changed `span` within its pending ranges: an unlock
    /// takes it out, a lock sets its type there.
    pub(super) fn apply(&mut self, key: Key, span: Span) {
        self.settle(key, span.start, span.end);
        if span.typ != libc::F_UNLCK {
            self.map.entry(key).or_default().push(span);
        }
    }
}

/// The OFD locks listed in an fdinfo text (`lock:` lines; waiters, marked
/// `->`, and other kinds of lock left out).
pub fn parse_fdinfo(text: &str) -> Vec<(i32, u64, u64)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("lock:") else {
            continue;
        };
        let t: Vec<&str> = rest.split_whitespace().collect();
        // "1: OFDLCK ADVISORY WRITE -1 08:02:1234 0 EOF"
        if t.len() < 8 || t[1] != "OFDLCK" {
            continue;
        }
        let typ = match t[3] {
            "READ" => libc::F_RDLCK,
            "WRITE" => libc::F_WRLCK,
            _ => continue,
        };
        let Ok(start) = t[6].parse::<u64>() else {
            continue;
        };
        let end = match t[7] {
            "EOF" => OFFSET_MAX,
            e => match e.parse::<u64>() {
                Ok(e) => e,
                Err(_) => continue,
            },
        };
        out.push((typ, start, end));
    }
    out
}

impl Locks {
    /// Whether any lock taken up from a migration is still pending.
    fn pending_any(&self) -> bool {
        !lock(&self.pending).map.is_empty()
    }

    /// Runs `f` (a client's lock change) with the pending locks, locked,
    /// when any is pending (None otherwise), so the retry thread cannot
    /// interleave; `f` settles what it changed.
    pub(super) fn with_pending<T>(&self, f: impl FnOnce(Option<&mut Pending>) -> T) -> T {
        if !self.pending_any() {
            return f(None);
        }
        let mut g = lock(&self.pending);
        f(Some(&mut g))
    }

    /// Forgets what is pending for `key` (its owner closed), or for every
    /// owner of `nodeid`, or everything.
    pub(super) fn forget_pending(&self, nodeid: Option<u64>, owner: Option<u64>) {
        lock(&self.pending)
            .map
            .retain(|&(n, o), _| !(nodeid.is_none_or(|x| x == n) && owner.is_none_or(|x| x == o)));
    }

    /// Every owner's held locks, read with `fdinfo` (an fd's
    /// /proc/self/fdinfo text), pending ones included.
    pub fn save(
        &self,
        fdinfo: impl Fn(i32) -> Result<String, Errno>,
    ) -> Result<Vec<SavedOwner>, Errno> {
        let pending = lock(&self.pending);
        let pids = lock(&self.pids).clone();
        let mut out = Vec::new();
        for (key, d) in self.owners.all() {
            let mut spans = parse_fdinfo(&fdinfo(d.raw())?);
            if let Some(p) = pending.map.get(&key) {
                spans.extend(p.iter().map(|s| (s.typ, s.start, s.end)));
            }
            if spans.is_empty() {
                continue;
            }
            out.push(SavedOwner {
                nodeid: key.0,
                owner: key.1,
                acc: d.acc(),
                pid: pids.get(&key).copied().unwrap_or(0),
                spans,
            });
        }
        out.sort_by_key(|o| (o.nodeid, o.owner));
        Ok(out)
    }

    /// Takes up `saved` with `open` (a description of the inode with that
    /// access mode). A lock that conflicts is pending (see the module
    /// docs); any other failure is returned, naming the owner.
    pub fn restore(
        &self,
        saved: &SavedOwner,
        open: impl FnOnce() -> Result<super::super::inode::CountedFd, Errno>,
    ) -> Result<(), Errno> {
        let key = (saved.nodeid, saved.owner);
        if !matches!(saved.acc, libc::O_RDONLY | libc::O_WRONLY | libc::O_RDWR)
            || self.owners.get(key).is_some()
        {
            return Err(Errno::EINVAL);
        }
        let spans = saved
            .spans
            .iter()
            .map(|&(typ, start, end)| {
                let ok = matches!(typ, libc::F_RDLCK | libc::F_WRLCK)
                    && start <= end
                    && end <= OFFSET_MAX;
                ok.then_some(Span { typ, start, end }).ok_or(Errno::EINVAL)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let d = self.owners.enter(key, OwnerDesc::new(open()?, saved.acc))?;
        if saved.pid != 0 {
            lock(&self.pids).insert(key, saved.pid);
        }
        let mut later = Vec::new();
        {
            let mut held = d.held();
            for s in spans {
                if !d.carries(s.typ) {
                    return Err(Errno::EBADF);
                }
                match d.set_held(&mut held, s) {
                    Ok(()) => {}
                    Err(Errno::EAGAIN) => later.push(s),
                    Err(e) => return Err(e),
                }
            }
        }
        if !later.is_empty() {
            let start = {
                let mut p = lock(&self.pending);
                let first = p.map.is_empty();
                p.map.entry(key).or_default().extend(later);
                first
            };
            if start {
                retry(Arc::downgrade(&self.pending), Arc::downgrade(&self.owners));
            }
        }
        Ok(())
    }
}

/// The retry thread (see the module docs).
fn retry(pending: Weak<Mutex<Pending>>, owners: Weak<OwnerTable>) {
    let begun = Instant::now();
    let _ = std::thread::Builder::new()
        .name("fusebox-lockmove".into())
        .spawn(move || loop {
            std::thread::sleep(RETRY_EVERY);
            let (Some(pending), Some(owners)) = (pending.upgrade(), owners.upgrade()) else {
                return;
            };
            let mut p = lock(&pending);
            if begun.elapsed() > RETRY_FOR {
                for (key, spans) in p.map.drain() {
                    log::warn!(
                        "migration: gave up taking {} POSIX lock(s) of owner {:#x} on node {} \
                         from the source (still held on the host by another)",
                        spans.len(),
                        key.1,
                        key.0
                    );
                }
            }
            p.map.retain(|&key, spans| {
                let Some(d) = owners.get(key) else {
                    return false;
                };
                let mut held = d.held();
                if !owners.is(key, &d) {
                    return false;
                }
                spans.retain(|&s| matches!(d.set_held(&mut held, s), Err(Errno::EAGAIN)));
                !spans.is_empty()
            });
            if p.map.is_empty() {
                return;
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fdinfo_lists_the_descriptions_own_ofd_locks() {
        let text = "pos:\t0\nflags:\t02\nmnt_id:\t30\nino:\t12\n\
            lock:\t1: OFDLCK ADVISORY  WRITE -1 00:2a:12 0 9\n\
            lock:\t2: OFDLCK ADVISORY  READ  -1 00:2a:12 100 EOF\n\
            lock:\t2: -> OFDLCK ADVISORY  WRITE -1 00:2a:12 0 9\n\
            lock:\t3: FLOCK  ADVISORY  WRITE 77 00:2a:12 0 EOF\n";
        assert_eq!(
            parse_fdinfo(text),
            vec![(libc::F_WRLCK, 0, 9), (libc::F_RDLCK, 100, OFFSET_MAX)]
        );
    }

    #[test]
    fn settling_a_range_splits_what_is_pending_around_it() {
        let mut p = Pending::default();
        let w = |start, end| Span {
            typ: libc::F_WRLCK,
            start,
            end,
        };
        p.map.insert((1, 7), vec![w(0, 99), w(200, 299)]);
        p.settle((1, 7), 50, 59);
        assert_eq!(p.map[&(1, 7)], vec![w(0, 49), w(60, 99), w(200, 299)]);
        p.settle((1, 7), 0, 250);
        assert_eq!(p.map[&(1, 7)], vec![w(251, 299)]);
        p.settle((1, 7), 0, OFFSET_MAX);
        assert!(p.map.is_empty());
    }
}
