//! Payload buffers of a kernel ring queue's entries: page-aligned slots of
//! one anonymous mapping per queue (a second, one-slot mapping for each
//! entry beyond the queue's depth).
//!
//! The memory is no Rust object: the kernel's FUSE ring writes a request's
//! payload into a slot while the entry's command is in flight, and a READ
//! started on the serving thread's io_uring writes its data there while the
//! entry waits for its commit. Both only ever hold the slot through an
//! `Arc<Arena>`: the mapping goes when the last holder (entries, and the
//! [`PayloadMem`] a started READ keeps until its completion is taken) lets
//! go of it, never under a write in flight.

use fuse_core::{ClientMap, ClientMem, Errno, HostSpan};
use std::ptr::NonNull;
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
        debug_assert!(i < self.slots);
        // SAFETY: `i < slots`, so the offset stays inside the mapping.
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

    /// The buffer as a slice.
    ///
    /// # Safety
    ///
    /// Nobody else reads or writes the slot while the slice lives: the
    /// kernel has no command of this entry in flight, and no READ into it
    /// (a [`PayloadMem`] of it doing I/O) runs.
    pub(super) unsafe fn slice_mut(&mut self) -> &mut [u8] {
        // SAFETY: the slot is inside the live mapping (we hold the Arc);
        // exclusivity is the caller's contract.
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
/// mapped for as long as any I/O on it can run.
#[derive(Debug)]
pub(crate) struct PayloadMem {
    arena: Arc<Arena>,
    span: [HostSpan; 1],
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("slots", &self.slots)
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

// SAFETY: the span is one slot of a private anonymous mapping (no Rust
// object) that stays mapped while this value holds the arena; the map, when
// offered, is that whole mapping. The slot is not reused while I/O may run
// on it: its entry is held by the serving thread (no kernel command of it
// in flight) from the READ's (WRITE's) fetch until its completion was
// taken, and is committed only after that.
unsafe impl ClientMem for PayloadMem {
    fn spans(&self) -> &[HostSpan] {
        &self.span
    }
    fn begin_io(&self) -> bool {
        // Never taken back: the entry waits for the READ's answer.
        true
    }
    fn end_io(&self) {}
    fn read_at(&self, off: usize, buf: &mut [u8]) -> Result<(), Errno> {
        let end = off.checked_add(buf.len()).ok_or(Errno::EINVAL)?;
        if end > self.span[0].len {
            return Err(Errno::EINVAL);
        }
        // SAFETY: inside the slot (checked), which is mapped while we hold
        // the arena; `buf` is a Rust buffer that cannot overlap it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (self.span[0].addr + off) as *const u8,
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        Ok(())
    }
    fn write_at(&self, off: usize, buf: &[u8]) -> Result<(), Errno> {
        let end = off.checked_add(buf.len()).ok_or(Errno::EINVAL)?;
        if end > self.span[0].len {
            return Err(Errno::EINVAL);
        }
        // SAFETY: as in `read_at`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                buf.as_ptr(),
                (self.span[0].addr + off) as *mut u8,
                buf.len(),
            )
        };
        Ok(())
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
}
