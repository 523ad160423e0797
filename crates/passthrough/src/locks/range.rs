//! Lock ranges: the client's (`FileLock`, closed u64 ranges) checked and
//! turned into the host's `struct flock` and back without overflow, and
//! [`RangeSet`], the read ranges one description holds.

use fuse_core::abi::FileLock;
use fuse_core::Errno;
use std::collections::BTreeMap;

/// `OFFSET_MAX`: the last byte a lock can cover; a range ending there runs
/// to end of file (and beyond).
pub const OFFSET_MAX: u64 = i64::MAX as u64;

/// A checked lock request: type and closed range, `start <= end <=
/// OFFSET_MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// F_RDLCK, F_WRLCK or F_UNLCK.
    pub typ: i32,
    /// First byte.
    pub start: u64,
    /// Last byte.
    pub end: u64,
}

impl Span {
    /// The client's lock, or EINVAL where the kernel would refuse it: an
    /// unknown type, start after end, or a byte beyond `OFFSET_MAX`.
    pub fn of_client(l: &FileLock) -> Result<Span, Errno> {
        let typ = [libc::F_RDLCK, libc::F_WRLCK, libc::F_UNLCK]
            .into_iter()
            .find(|&t| u32::try_from(t) == Ok(l.typ))
            .ok_or(Errno::EINVAL)?;
        if l.start > l.end || l.end > OFFSET_MAX {
            return Err(Errno::EINVAL);
        }
        Ok(Span {
            typ,
            start: l.start,
            end: l.end,
        })
    }

    /// The same range with another type.
    pub fn with_type(self, typ: i32) -> Span {
        Span { typ, ..self }
    }

    /// As a `struct flock` (whence SEEK_SET, length 0 for "to EOF").
    pub fn flock(self) -> libc::flock {
        let mut f = host_io::sys::flock_zeroed();
        // F_RDLCK, F_WRLCK and F_UNLCK are 0..=2.
        f.l_type = self.typ as libc::c_short;
        f.l_whence = libc::SEEK_SET as libc::c_short;
        // start <= end <= OFFSET_MAX: both fit an off_t, and end - start + 1
        // cannot overflow when end < OFFSET_MAX.
        f.l_start = libc::off_t::try_from(self.start).unwrap_or(libc::off_t::MAX);
        f.l_len = if self.end >= OFFSET_MAX {
            0
        } else {
            libc::off_t::try_from(self.end - self.start + 1).unwrap_or(0)
        };
        f
    }

    /// The range of a `struct flock` with whence SEEK_SET (the kernel's
    /// answer to F_OFD_GETLK), read as fcntl(2) reads one: length 0 runs
    /// to `OFFSET_MAX`, a negative length ends just before the start.
    /// None for a range the kernel would refuse.
    pub fn of_flock(f: &libc::flock) -> Option<Span> {
        let start: i64 = f.l_start;
        let len: i64 = f.l_len;
        let (start, end) = match len {
            0 => (start, i64::MAX),
            1.. => (start, start.checked_add(len - 1)?),
            _ => (start.checked_add(len)?, start.checked_sub(1)?),
        };
        let start = u64::try_from(start).ok()?;
        let end = u64::try_from(end).ok()?;
        (start <= end).then_some(Span {
            typ: i32::from(f.l_type),
            start,
            end,
        })
    }

    /// The bytes both spans cover, with `self`'s type.
    pub fn overlap(self, other: Span) -> Option<Span> {
        let start = self.start.max(other.start);
        let end = self.end.min(other.end);
        (start <= end).then_some(Span {
            typ: self.typ,
            start,
            end,
        })
    }
}

/// The read locks an O_RDONLY description holds (a description can hold
/// only read locks when it is not open for writing), kept as the kernel
/// keeps one owner's locks: disjoint closed ranges, overlapping and
/// adjacent ones merged, an unlock of a part splitting a range. Ranges lie
/// within 0..=OFFSET_MAX.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RangeSet {
    /// start -> end.
    map: BTreeMap<u64, u64>,
}

impl RangeSet {
    /// Applies a granted F_RDLCK (adds) or F_UNLCK (removes) on `s`.
    pub fn apply(&mut self, s: Span) {
        match s.typ {
            libc::F_RDLCK => self.insert(s.start, s.end),
            libc::F_UNLCK => self.remove(s.start, s.end),
            // A write lock is never granted on a read-only description.
            _ => {}
        }
    }

    /// Adds `start..=end`, merging what it overlaps or touches.
    pub fn insert(&mut self, start: u64, end: u64) {
        if start > end {
            return;
        }
        let (mut lo, mut hi) = (start, end);
        // A range starting before `start` that reaches it (or ends just
        // before it).
        if let Some((&s, &e)) = self.map.range(..start).next_back() {
            if e.saturating_add(1) >= start {
                lo = s;
                hi = hi.max(e);
            }
        }
        // Ranges starting inside, or just after, the new one.
        let inside: Vec<u64> = self
            .map
            .range(start..=end.saturating_add(1))
            .map(|(&s, _)| s)
            .collect();
        for s in inside {
            if let Some(e) = self.map.remove(&s) {
                hi = hi.max(e);
            }
        }
        self.map.remove(&lo);
        self.map.insert(lo, hi);
    }

    /// Removes `start..=end`, splitting a range it falls inside.
    pub fn remove(&mut self, start: u64, end: u64) {
        if start > end {
            return;
        }
        let mut hit: Vec<(u64, u64)> = Vec::new();
        if let Some((&s, &e)) = self.map.range(..start).next_back() {
            if e >= start {
                hit.push((s, e));
            }
        }
        hit.extend(self.map.range(start..=end).map(|(&s, &e)| (s, e)));
        for (s, e) in hit {
            self.map.remove(&s);
            if s < start {
                self.map.insert(s, start - 1);
            }
            if e > end {
                self.map.insert(end + 1, e);
            }
        }
    }

    /// Removes everything.
    pub fn clear(&mut self) {
        self.map.clear();
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The ranges, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.map.iter().map(|(&s, &e)| (s, e))
    }
}

#[cfg(test)]
mod tests;
