//! Payload buffers of a kernel ring queue's entries: page-aligned slots of
//! one anonymous mapping per queue (a second, one-slot mapping for each
//! entry beyond the queue's depth).
//!
//! The kernel's FUSE ring writes a request's payload into a slot, and a
//! started READ its data, so the memory is no Rust object: both hold it
//! through an `Arc<Arena>`, and the mapping goes only when the last holder
//! (entries, a started READ's [`PayloadMem`]) lets go, never under a write
//! in flight. A slot lent to the filesystem as a [`PayloadMem`] may be kept
//! past the answer, so each slot has a [`Gate`]: a generation, and counts
//! of the host I/O and copies running. Before the serving loop reuses a
//! slot (hands it to the kernel, frees it, or makes a Rust slice of it) it
//! calls [`Payload::take_back`]: the generation moves on, so older
//! `PayloadMem`s refuse I/O (`begin_io` false, copies EIO), and it waits
//! for what they already run to end.

use fuse_core::{ClientMap, ClientMem, Errno, HostSpan};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

/// Payload buffers start on a page, so that a file opened O_DIRECT (fio
/// --direct=1 asks for one) reads and writes them in place.
pub(crate) const PAGE: usize = 4096;

/// One anonymous mapping cut into `slots` slots of `slot` bytes.
pub(crate) struct Arena {
    base: NonNull<u8>,
    len: usize,
    slot: usize,
    slots: usize,
    /// The whole mapping as a client map, for a READ's host I/O layer to
    /// register once as io_uring fixed buffers (the queue's main arena
    /// only: a map registered per extra entry would replace it each time).
    map: Option<Arc<ClientMap>>,
    /// One gate per slot.
    gates: Box<[Gate]>,
}

/// Who may still use a slot's memory through a [`PayloadMem`] (see the
/// module docs). Every access is SeqCst: a user raises a count, then
/// reads the generation; a taker moves the generation, then reads the
/// counts. In the single total order of SeqCst operations one of them
/// sees the other's change: the user backs off, or the taker waits for
/// it.
#[derive(Default)]
struct Gate {
    /// Bumped by each take-back; a `PayloadMem` of an older one is dead.
    gen: AtomicU64,
    /// `begin_io`s that returned true and were not yet ended (the
    /// filesystem's host I/O on the spans). A u64: no program counts that
    /// high.
    io: AtomicU64,
    /// `read_at`/`write_at` copies running: our own, always paired, kept
    /// apart from the filesystem's `begin_io`/`end_io` accounting.
    copies: AtomicU64,
}

// SAFETY: the mapping is plain memory owned by the arena; who writes which
// slot, and when, is decided by the entry that owns the slot (see the
// module docs), not by the thread holding the Arc.
unsafe impl Send for Arena {}
// SAFETY: as above; the arena itself is never mutated after creation.
unsafe impl Sync for Arena {}

impl Arena {
    /// `slots` slots of at least `slot` bytes (rounded up to a page).
    pub(crate) fn new(slot: usize, slots: usize, offer_map: bool) -> std::io::Result<Arc<Arena>> {
        let slot = slot.max(1).div_ceil(PAGE) * PAGE;
        let slots = slots.max(1);
        let len = slot
            .checked_mul(slots)
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOMEM))?;
        // SAFETY: a fresh private anonymous mapping; no memory of ours is
        // passed in. Pages are only backed once touched (a 4 KiB READ
        // touches one page of its 1 MiB slot), unless the map is offered
        // and registered as fixed buffers, which pins all of it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let base = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOMEM))?;
        let map = offer_map.then(|| {
            Arc::new(ClientMap::new(vec![HostSpan {
                addr: base.as_ptr() as usize,
                len,
            }]))
        });
        Ok(Arc::new(Arena {
            base,
            len,
            slot,
            slots,
            map,
            gates: (0..slots).map(|_| Gate::default()).collect(),
        }))
    }

    /// How many slots it has.
    pub(crate) fn slots(&self) -> usize {
        self.slots
    }

    /// The bytes of one slot.
    pub(crate) fn slot_len(&self) -> usize {
        self.slot
    }

    /// The address of slot `i`.
    fn addr(&self, i: usize) -> *mut u8 {
        // Checked in release builds too: `add` out of the mapping is UB.
        assert!(i < self.slots, "slot {i} of {}", self.slots);
        // SAFETY: `i < slots` (asserted), so `i * slot < len`: the offset
        // stays inside the mapping.
        unsafe { self.base.as_ptr().add(i * self.slot) }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: our own mapping; the last Arc is gone, so no entry and
        // no started READ holds a slot of it any more.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// One entry's payload buffer: slot `index` of `arena`.
pub(crate) struct Payload {
    arena: Arc<Arena>,
    index: usize,
}

impl Payload {
    pub(crate) fn new(arena: Arc<Arena>, index: usize) -> Payload {
        assert!(index < arena.slots, "slot {index} of {}", arena.slots);
        Payload { arena, index }
    }

    pub(crate) fn len(&self) -> usize {
        self.arena.slot_len()
    }

    pub(crate) fn as_mut_ptr(&self) -> *mut u8 {
        self.arena.addr(self.index)
    }

    /// Takes the slot back from every [`PayloadMem`] made of it so far:
    /// from now on they refuse I/O (`begin_io` false, copies EIO), and
    /// this returns once the I/O and copies they had running are over.
    /// Then no `PayloadMem` touches the slot until a new one is made.
    ///
    /// Copies are short; host I/O is over by the time a serving loop takes
    /// a slot back (it waits for its completion, and the filesystem ends
    /// its I/O before it answers: `ClientMem::end_io`'s rule). A
    /// filesystem that never ends its I/O, or answers first while the I/O
    /// waits on this thread's own ring, holds the slot and this thread, as
    /// a READ that hangs would.
    pub(crate) fn take_back(&self) {
        let g = &self.arena.gates[self.index];
        g.gen.fetch_add(1, SeqCst);
        let mut tries = 0u32;
        while g.io.load(SeqCst) != 0 || g.copies.load(SeqCst) != 0 {
            tries = tries.saturating_add(1);
            if tries < 64 {
                std::hint::spin_loop();
            } else if tries < 1024 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
        }
    }

    /// The buffer as a slice, after taking the slot back from any
    /// [`PayloadMem`] of it ([`Payload::take_back`]).
    ///
    /// # Safety
    ///
    /// While the slice lives, nothing else reads or writes the slot: the
    /// kernel has no command of this entry in flight, and no other
    /// `Payload` of the same slot is used.
    pub(super) unsafe fn slice_mut(&mut self) -> &mut [u8] {
        self.take_back();
        // SAFETY: the slot is inside the live mapping (we hold the Arc); no
        // `PayloadMem` made so far touches it (taken back above), and no
        // new one can be made of `self` while the slice borrows it
        // mutably; the kernel and other `Payload`s are the caller's
        // contract.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), self.len()) }
    }

    /// The slot as a READ's destination.
    pub(super) fn client_mem(&self) -> PayloadMem {
        self.client_mem_of(self.len())
    }

    /// The slot's first `len` bytes (at most the slot) as a WRITE's data.
    pub(super) fn client_mem_of(&self, len: usize) -> PayloadMem {
        self.client_mem_at(0, len)
    }

    /// `len` bytes of the slot from byte `at` (at most to its end) as a
    /// READ's destination or a WRITE's data.
    pub(crate) fn client_mem_at(&self, at: usize, len: usize) -> PayloadMem {
        let at = at.min(self.len());
        PayloadMem {
            arena: self.arena.clone(),
            index: self.index,
            gen: self.arena.gates[self.index].gen.load(SeqCst),
            held: AtomicU64::new(0),
            span: [HostSpan {
                addr: self.as_mut_ptr() as usize + at,
                len: len.min(self.len() - at),
            }],
        }
    }
}

/// An entry's payload slot as the destination of a READ served by
/// reference ([`ClientMem`]), or the source of a WRITE started without
/// waiting: the filesystem reads into it (writes from it) directly, in
/// line or started on its io_uring. It holds the arena, so the slot stays
/// mapped for as long as any I/O on it can run, and it works only until
/// the slot is taken back ([`Payload::take_back`]): the filesystem may
/// keep it past its answer, but then it gets EIO.
#[derive(Debug)]
pub(crate) struct PayloadMem {
    arena: Arc<Arena>,
    index: usize,
    /// The slot's generation this was made in.
    gen: u64,
    /// This value's own `begin_io`s not yet ended: `end_io` gives back only
    /// what this value took from the gate's `io`, so a stray `end_io` on an
    /// older memory of the slot cannot release a newer one's running I/O.
    held: AtomicU64,
    span: [HostSpan; 1],
}

impl PayloadMem {
    fn gate(&self) -> &Gate {
        &self.arena.gates[self.index]
    }

    /// Runs `f` (a copy to or from the slot) unless the slot was taken
    /// back, counted in `copies` meanwhile so a take-back waits for it.
    fn copy(&self, f: impl FnOnce()) -> Result<(), Errno> {
        let g = self.gate();
        // A dead memory's callers never touch the count (polling one
        // cannot hold a take-back off); the check after the raise decides.
        if g.gen.load(SeqCst) != self.gen {
            return Err(Errno::EIO);
        }
        g.copies.fetch_add(1, SeqCst);
        let live = g.gen.load(SeqCst) == self.gen;
        if live {
            f();
        }
        g.copies.fetch_sub(1, SeqCst);
        if live {
            Ok(())
        } else {
            Err(Errno::EIO)
        }
    }
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("slots", &self.slots)
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

// SAFETY: the span is inside one slot of a private anonymous mapping (no
// Rust object) that stays mapped while this value holds the arena; the
// map, when offered, is that whole mapping. `begin_io` returns true only
// while the slot's generation is this value's, counted in the gate's `io`,
// and the slot is reused (handed to the kernel, freed, or made a slice)
// only after `Payload::take_back`, which moves the generation on and then
// waits for `io` to fall to 0; `end_io` gives back only this value's own
// raises (`held`): so while this value's `begin_io` has returned true more
// often than its `end_io` was called, the slot is not reused.
unsafe impl ClientMem for PayloadMem {
    fn spans(&self) -> &[HostSpan] {
        &self.span
    }
    fn begin_io(&self) -> bool {
        let g = self.gate();
        // As in `copy`: a dead memory leaves the count alone.
        if g.gen.load(SeqCst) != self.gen {
            return false;
        }
        g.io.fetch_add(1, SeqCst);
        if g.gen.load(SeqCst) == self.gen {
            self.held.fetch_add(1, SeqCst);
            return true;
        }
        // Taken back: undone, and refused.
        g.io.fetch_sub(1, SeqCst);
        false
    }
    fn end_io(&self) {
        // Only what this value holds goes back (an unpaired call, which
        // the trait's contract leaves to its caller, changes nothing): the
        // gate's count is shared by every memory ever made of the slot.
        if self
            .held
            .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            self.gate().io.fetch_sub(1, SeqCst);
        }
    }
    fn read_at(&self, off: usize, buf: &mut [u8]) -> Result<(), Errno> {
        let end = off.checked_add(buf.len()).ok_or(Errno::EINVAL)?;
        if end > self.span[0].len {
            return Err(Errno::EINVAL);
        }
        let src = (self.span[0].addr + off) as *const u8;
        self.copy(|| {
            // SAFETY: inside the slot (checked), which is mapped while we
            // hold the arena and not reused while the copy is counted live
            // (`copy`; see the impl's comment); `buf` is a Rust buffer,
            // which cannot overlap the mapping.
            unsafe { std::ptr::copy_nonoverlapping(src, buf.as_mut_ptr(), buf.len()) }
        })
    }
    fn write_at(&self, off: usize, buf: &[u8]) -> Result<(), Errno> {
        let end = off.checked_add(buf.len()).ok_or(Errno::EINVAL)?;
        if end > self.span[0].len {
            return Err(Errno::EINVAL);
        }
        let dst = (self.span[0].addr + off) as *mut u8;
        self.copy(|| {
            // SAFETY: as in `read_at`.
            unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), dst, buf.len()) }
        })
    }
    fn map(&self) -> Option<Arc<ClientMap>> {
        self.arena.map.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_buffers_start_on_a_page() {
        for len in [1, 4096, 8192, 1 << 20, (1 << 20) + 4096] {
            let a = Arena::new(len, 3, true).unwrap();
            for i in 0..3 {
                let mut p = Payload::new(a.clone(), i);
                // SAFETY: nobody else uses the slot in this test.
                let s = unsafe { p.slice_mut() };
                assert!(s.len() >= len);
                assert_eq!(s.as_ptr() as usize % PAGE, 0, "{len}");
                s[s.len() - 1] = 7;
            }
        }
    }

    #[test]
    fn a_slot_outlives_its_entry_while_a_read_holds_it() {
        let a = Arena::new(4096, 1, false).unwrap();
        let mem = Payload::new(a.clone(), 0).client_mem();
        drop(a);
        mem.write_at(10, b"abc").unwrap();
        let mut b = [0u8; 3];
        mem.read_at(10, &mut b).unwrap();
        assert_eq!(&b, b"abc");
        assert!(mem.write_at(4095, b"ab").is_err());
    }

    #[test]
    fn a_slot_taken_back_refuses_the_memory_lent_before() {
        let a = Arena::new(4096, 2, false).unwrap();
        let p = Payload::new(a.clone(), 0);
        let old = p.client_mem();
        let other = Payload::new(a, 1).client_mem();
        assert!(old.begin_io());
        old.end_io();
        // An unpaired end_io leaves the count at 0, not wrapped.
        old.end_io();
        p.take_back();
        assert!(!old.begin_io());
        assert_eq!(old.write_at(0, b"x"), Err(Errno::EIO));
        assert_eq!(old.read_at(0, &mut [0u8; 1]), Err(Errno::EIO));
        // The next request's memory works; the other slot's never stopped.
        let new = p.client_mem();
        new.write_at(0, b"y").unwrap();
        assert!(other.begin_io());
        other.end_io();
        let mut b = [0u8; 1];
        new.read_at(0, &mut b).unwrap();
        assert_eq!(&b, b"y");
        assert_eq!(old.write_at(0, b"x"), Err(Errno::EIO));
    }

    #[test]
    fn a_take_back_waits_for_the_io_running() {
        let a = Arena::new(4096, 1, false).unwrap();
        let p = Payload::new(a, 0);
        let mem = p.client_mem();
        assert!(mem.begin_io());
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                p.take_back();
                assert!(done.load(SeqCst), "taken back under I/O");
            });
            std::thread::sleep(std::time::Duration::from_millis(50));
            done.store(true, SeqCst);
            mem.end_io();
        });
        assert!(!mem.begin_io());
    }

    /// Every memory of a slot shares the gate: an `end_io` on an old one
    /// (refused, or unpaired) must not give back a newer one's running
    /// I/O, or the next take-back would not wait for it.
    #[test]
    fn an_old_memorys_end_io_does_not_release_a_newer_ones_io() {
        let a = Arena::new(4096, 1, false).unwrap();
        let p = Payload::new(a, 0);
        let old = p.client_mem();
        p.take_back();
        let new = p.client_mem();
        assert!(new.begin_io());
        assert!(!old.begin_io());
        old.end_io();
        old.end_io();
        // A second unpaired end on the new one gives back only its own.
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                p.take_back();
                assert!(done.load(SeqCst), "taken back under the new memory's I/O");
            });
            std::thread::sleep(std::time::Duration::from_millis(50));
            done.store(true, SeqCst);
            new.end_io();
            new.end_io();
        });
        assert!(!new.begin_io());
    }
}
