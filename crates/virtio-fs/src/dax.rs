//! The DAX window's bookkeeping (issue 34, docs/DAX.md): which ranges of
//! the shared memory region (shmid 0) map which host file ranges, and
//! the checks a guest's FUSE_SETUPMAPPING and FUSE_REMOVEMAPPING must
//! pass before anything is mapped or unmapped.
//!
//! The window is cut into 2 MiB slots (the guest's `FUSE_DAX_SZ`). A
//! mapping lies inside one slot, and a slot holds at most one mapping, so
//! a window of at most [`MAX_WINDOW`] holds at most 256 mappings: the
//! VMM gets one memory region per mapping and gives up past 512 (QEMU
//! 11.1 aborts at the 513th).
//!
//! Every check is done before anything changes: a request that fails one
//! gets an error and changes nothing. Mapping and unmapping on the VMM
//! (SHMEM_MAP / SHMEM_UNMAP) is the caller's; this type only says what
//! to do and records what was done.

use std::collections::BTreeMap;
use thiserror::Error;

/// The guest's mapping unit (`FUSE_DAX_SZ`): one slot of the window.
pub const SLOT: u64 = 2 << 20;
/// The largest window: 256 slots.
pub const MAX_WINDOW: u64 = 256 * SLOT;

/// Why a mapping request was refused (nothing was changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum WindowError {
    /// An offset or length not a multiple of the page size, or a zero
    /// length.
    #[error("range not aligned to {0} bytes, or empty")]
    Unaligned(u64),
    /// The range reaches past the window, or across a slot boundary.
    #[error("range outside the window or across a 2 MiB slot")]
    OutOfWindow,
    /// The range overlaps a mapping it is not exactly the range of.
    #[error("range overlaps another mapping")]
    Overlap,
    /// A range to remove is not a mapping (or is named twice).
    #[error("no such mapping")]
    NotMapped,
    /// More ranges to remove than the window has slots.
    #[error("too many ranges")]
    TooMany,
    /// Neither read nor write asked for, or unknown flag bits.
    #[error("bad mapping flags {0:#x}")]
    Flags(u64),
}

impl WindowError {
    /// The errno the guest gets.
    pub fn errno(self) -> fuse_core::Errno {
        fuse_core::Errno::EINVAL
    }
}

/// What one slot of the window maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    /// Offset in the window.
    pub moffset: u64,
    /// Length in bytes (within its slot).
    pub len: u64,
    /// The file's inode and the handle it was mapped through.
    pub ino: u64,
    /// The handle.
    pub fh: u64,
    /// Offset in the file.
    pub foffset: u64,
    /// Mapped for writing too.
    pub writable: bool,
}

/// What a FUSE_SETUPMAPPING asks for, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setup {
    /// Where in the window.
    pub moffset: u64,
    /// How much.
    pub len: u64,
    /// The file's inode (the request's nodeid) and handle.
    pub ino: u64,
    /// The handle.
    pub fh: u64,
    /// From where in the file.
    pub foffset: u64,
    /// `FUSE_SETUPMAPPING_FLAG_*`.
    pub flags: u64,
}

/// The window: its size, the page size offsets must align to, and its
/// mappings by window offset.
#[derive(Debug)]
pub struct Window {
    size: u64,
    page: u64,
    maps: BTreeMap<u64, Mapping>,
}

impl Window {
    /// A window of `size` bytes (a power of two from [`SLOT`] to
    /// [`MAX_WINDOW`], as a PCI BAR must be; None otherwise) whose mappings align to `page`
    /// bytes (a power of two, at most a slot).
    pub fn new(size: u64, page: u64) -> Option<Window> {
        let ok = size.is_power_of_two()
            && (SLOT..=MAX_WINDOW).contains(&size)
            && page.is_power_of_two()
            && page <= SLOT;
        ok.then(|| Window {
            size,
            page,
            maps: BTreeMap::new(),
        })
    }

    /// The window's size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// How many mappings it holds.
    pub fn len(&self) -> usize {
        self.maps.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.maps.is_empty()
    }

    /// Every mapping, by window offset.
    pub fn mappings(&self) -> impl Iterator<Item = &Mapping> {
        self.maps.values()
    }

    /// The mapping at window offset `moffset`, if one starts there.
    pub fn get(&self, moffset: u64) -> Option<&Mapping> {
        self.maps.get(&moffset)
    }

    /// Checks `s` and says what it needs: the mapping it replaces, if the
    /// guest maps exactly the range of one again (it does so to make a
    /// read-only mapping writable), which the caller unmaps first. The
    /// caller checks the handle (its inode, its open mode against the
    /// flags, the file's size) and maps, then calls [`Window::insert`].
    pub fn check_setup(&self, s: &Setup) -> Result<Option<Mapping>, WindowError> {
        use fuse_core::abi::flags::{
            SETUPMAPPING_FLAG_READ as FLAG_READ, SETUPMAPPING_FLAG_WRITE as FLAG_WRITE,
        };
        if s.flags & !(FLAG_READ | FLAG_WRITE) != 0 || s.flags == 0 {
            return Err(WindowError::Flags(s.flags));
        }
        let p = self.page;
        if s.len == 0 || s.len % p != 0 || s.moffset % p != 0 || s.foffset % p != 0 {
            return Err(WindowError::Unaligned(p));
        }
        let end = s
            .moffset
            .checked_add(s.len)
            .filter(|e| *e <= self.size)
            .ok_or(WindowError::OutOfWindow)?;
        if s.foffset.checked_add(s.len).is_none() {
            return Err(WindowError::OutOfWindow);
        }
        if s.moffset / SLOT != (end - 1) / SLOT {
            return Err(WindowError::OutOfWindow);
        }
        // One mapping per slot: anything else in this slot overlaps,
        // unless it is exactly this range.
        let slot = s.moffset - s.moffset % SLOT;
        let mut found = None;
        for m in self.maps.range(slot..slot + SLOT).map(|(_, m)| m) {
            if m.moffset == s.moffset && m.len == s.len {
                found = Some(*m);
            } else {
                return Err(WindowError::Overlap);
            }
        }
        Ok(found)
    }

    /// Records a mapping [`Window::check_setup`] allowed and the caller
    /// made (replacing the one it named).
    pub fn insert(&mut self, s: &Setup) {
        use fuse_core::abi::flags::SETUPMAPPING_FLAG_WRITE as FLAG_WRITE;
        self.maps.insert(
            s.moffset,
            Mapping {
                moffset: s.moffset,
                len: s.len,
                ino: s.ino,
                fh: s.fh,
                foffset: s.foffset,
                writable: s.flags & FLAG_WRITE != 0,
            },
        );
    }

    /// Checks a FUSE_REMOVEMAPPING's ranges, `(moffset, len)` each: every
    /// one must be exactly a mapping, none named twice. Returns the
    /// mappings, for the caller to unmap and then [`Window::remove`].
    pub fn check_remove(&self, ranges: &[(u64, u64)]) -> Result<Vec<Mapping>, WindowError> {
        if ranges.len() as u64 > self.size / SLOT {
            return Err(WindowError::TooMany);
        }
        let mut out: Vec<Mapping> = Vec::with_capacity(ranges.len());
        for &(moffset, len) in ranges {
            match self.maps.get(&moffset) {
                Some(m) if m.len == len && !out.iter().any(|o| o.moffset == moffset) => {
                    out.push(*m)
                }
                _ => return Err(WindowError::NotMapped),
            }
        }
        Ok(out)
    }

    /// Forgets the mapping at `moffset` (unmapped by the caller).
    pub fn remove(&mut self, moffset: u64) -> Option<Mapping> {
        self.maps.remove(&moffset)
    }

    /// Forgets every mapping (the VMM dropped them: a reset, a new
    /// session, a disconnect); returns how many there were.
    pub fn clear(&mut self) -> usize {
        let n = self.maps.len();
        self.maps.clear();
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fuse_core::abi::flags::{
        SETUPMAPPING_FLAG_READ as FLAG_READ, SETUPMAPPING_FLAG_WRITE as FLAG_WRITE,
    };

    const PAGE: u64 = 4096;

    fn setup(moffset: u64, len: u64, flags: u64) -> Setup {
        Setup {
            moffset,
            len,
            ino: 7,
            fh: 3,
            foffset: 4 * SLOT,
            flags,
        }
    }

    fn window() -> Window {
        Window::new(8 * SLOT, PAGE).unwrap()
    }

    #[test]
    fn window_sizes_are_whole_slots_up_to_the_most() {
        assert!(Window::new(0, PAGE).is_none());
        assert!(Window::new(SLOT + PAGE, PAGE).is_none());
        assert!(Window::new(3 * SLOT, PAGE).is_none());
        assert!(Window::new(MAX_WINDOW + SLOT, PAGE).is_none());
        assert!(Window::new(SLOT, 3000).is_none());
        assert!(Window::new(SLOT, 2 * SLOT).is_none());
        assert_eq!(Window::new(MAX_WINDOW, PAGE).unwrap().size(), MAX_WINDOW);
    }

    #[test]
    fn a_mapping_is_checked_then_recorded() {
        let mut w = window();
        let s = setup(3 * SLOT, SLOT, FLAG_READ);
        assert_eq!(w.check_setup(&s), Ok(None));
        w.insert(&s);
        let m = *w.get(3 * SLOT).unwrap();
        assert_eq!((m.ino, m.fh, m.foffset, m.len), (7, 3, 4 * SLOT, SLOT));
        assert!(!m.writable);
        // The guest maps the same range writable: a replacement.
        let up = setup(3 * SLOT, SLOT, FLAG_READ | FLAG_WRITE);
        assert_eq!(w.check_setup(&up), Ok(Some(m)));
        w.insert(&up);
        assert_eq!(w.len(), 1);
        assert!(w.get(3 * SLOT).unwrap().writable);
    }

    #[test]
    fn hostile_setups_are_refused() {
        let mut w = window();
        w.insert(&setup(2 * SLOT, SLOT, FLAG_READ));
        let bad = [
            (setup(0, 0, FLAG_READ), WindowError::Unaligned(PAGE)),
            (setup(100, PAGE, FLAG_READ), WindowError::Unaligned(PAGE)),
            (setup(0, PAGE + 1, FLAG_READ), WindowError::Unaligned(PAGE)),
            (
                Setup {
                    foffset: 5,
                    ..setup(0, PAGE, FLAG_READ)
                },
                WindowError::Unaligned(PAGE),
            ),
            (
                setup(7 * SLOT, 2 * SLOT, FLAG_READ),
                WindowError::OutOfWindow,
            ),
            (setup(8 * SLOT, PAGE, FLAG_READ), WindowError::OutOfWindow),
            (
                setup(u64::MAX - PAGE + 1, PAGE, FLAG_READ),
                WindowError::OutOfWindow,
            ),
            (
                Setup {
                    foffset: u64::MAX - PAGE + 1,
                    ..setup(0, 2 * PAGE, FLAG_READ)
                },
                WindowError::OutOfWindow,
            ),
            // Across a slot boundary.
            (
                setup(SLOT - PAGE, 2 * PAGE, FLAG_READ),
                WindowError::OutOfWindow,
            ),
            // Inside the mapped slot, not exactly its mapping.
            (setup(2 * SLOT, PAGE, FLAG_READ), WindowError::Overlap),
            (
                setup(2 * SLOT + PAGE, PAGE, FLAG_READ),
                WindowError::Overlap,
            ),
            (setup(0, PAGE, 0), WindowError::Flags(0)),
            (
                setup(0, PAGE, 4 | FLAG_READ),
                WindowError::Flags(4 | FLAG_READ),
            ),
        ];
        for (s, e) in bad {
            assert_eq!(w.check_setup(&s), Err(e), "{s:?}");
            assert_eq!(e.errno(), fuse_core::Errno::EINVAL);
        }
        assert_eq!(w.len(), 1);
    }

    #[test]
    fn a_small_mapping_takes_a_whole_slot() {
        let mut w = window();
        w.insert(&setup(SLOT + PAGE, PAGE, FLAG_READ));
        assert_eq!(
            w.check_setup(&setup(SLOT + 2 * PAGE, PAGE, FLAG_READ)),
            Err(WindowError::Overlap)
        );
        assert_eq!(w.check_setup(&setup(2 * SLOT, PAGE, FLAG_READ)), Ok(None));
        // A full window holds one mapping per slot, no more.
        let mut w = window();
        for i in 0..8 {
            let s = setup(i * SLOT, PAGE, FLAG_READ);
            assert_eq!(w.check_setup(&s), Ok(None));
            w.insert(&s);
        }
        for i in 0..8 {
            let other = setup(i * SLOT + PAGE, PAGE, FLAG_READ);
            assert_eq!(w.check_setup(&other), Err(WindowError::Overlap));
        }
    }

    #[test]
    fn removals_are_all_or_nothing() {
        let mut w = window();
        for i in [0, 1, 5] {
            w.insert(&setup(i * SLOT, SLOT, FLAG_READ));
        }
        let refused: [&[(u64, u64)]; 5] = [
            &[(0, SLOT), (2 * SLOT, SLOT)],
            &[(0, SLOT), (SLOT, PAGE)],
            &[(0, SLOT), (0, SLOT)],
            &[(PAGE, SLOT)],
            &[(0, SLOT); 9],
        ];
        for r in refused {
            assert!(w.check_remove(r).is_err(), "{r:?}");
        }
        assert_eq!(w.check_remove(&[(0, SLOT); 9]), Err(WindowError::TooMany));
        assert_eq!(w.len(), 3);
        let ms = w.check_remove(&[(5 * SLOT, SLOT), (0, SLOT)]).unwrap();
        assert_eq!(
            ms.iter().map(|m| m.moffset).collect::<Vec<_>>(),
            [5 * SLOT, 0]
        );
        for m in ms {
            assert!(w.remove(m.moffset).is_some());
        }
        assert_eq!(w.len(), 1);
        assert_eq!(w.clear(), 1);
        assert!(w.is_empty());
    }
}
