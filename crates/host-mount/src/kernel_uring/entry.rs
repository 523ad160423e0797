//! A ring entry: its memory ([`KernelSlot`] while the serving thread
//! holds it) and its lifecycle ([`EntState`]), whose transitions are
//! checked on every step. A slot's header and payload are the request as
//! the kernel wrote it and, once answered, the reply the commit carries.

use super::arena;
use fuse_core::abi::{uring, InHeader, OutHeader, UringReqHeader};
use fuse_core::server::RingSlot;
use std::sync::Arc;
use zerocopy::{FromBytes, IntoBytes};

/// Where an entry is in its life (the kernel's own states in brackets):
///
/// ```text
///  New ─REGISTER─▶ Fetching ─CQE 0─▶ Fetched ─take─▶ Serving ─answered──────▶ Fetching
///  [INVALID]       [AVAILABLE,                       [USERSPACE]  │         (COMMIT_AND_FETCH)
///                   FUSE_REQ]                                     ├─I/O started─▶ Started
///                                                                 │   Started ─I/O done─▶ Fetching
///                                                                 └─SETLKW waits─▶ Parked
///                                                                     Parked ─answer─▶ Fetching
///  Fetching ─CQE error (ENOTCONN at teardown)─▶ dropped (memory ours again)
/// ```
///
/// Started: a READ, WRITE, FSYNC, FSYNCDIR or FALLOCATE whose host I/O
/// runs. `Fetching` entries are in `State::inflight` and `Fetched` ones in
/// `State::done`, both guarded by the `Shared::state` mutex; `Serving`,
/// `Started` and `Parked` ones are the serving thread's own (its maps, no
/// lock). Only the serving thread moves entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntState {
    /// Made, no command sent yet.
    New,
    /// REGISTER or COMMIT_AND_FETCH in flight: the kernel may write the
    /// header and the payload (in `State::inflight`).
    Fetching,
    /// Its command completed with a request (in `State::done`).
    Fetched,
    /// Taken by the serving thread, being served synchronously.
    Serving,
    /// A READ, WRITE, FSYNC, FSYNCDIR or FALLOCATE whose host I/O runs (a
    /// READ's into the payload buffer, a WRITE's from it).
    Started,
    /// A request that waits for something outside the server (SETLKW).
    Parked,
}

impl EntState {
    /// Whether the lifecycle allows `self` → `to`.
    fn may_become(self, to: EntState) -> bool {
        use EntState::*;
        matches!(
            (self, to),
            (New, Fetching)
                | (Fetching, Fetched)
                | (Fetched, Serving)
                | (Serving, Started | Parked | Fetching)
                | (Started | Parked, Fetching)
        )
    }
}

/// One ring entry's memory.
pub(super) struct Ent {
    pub(super) id: u64,
    pub(super) state: EntState,
    pub(super) header: UringReqHeader,
    pub(super) payload: arena::Payload,
    pub(super) iov: [libc::iovec; 2],
}

impl Ent {
    pub(super) fn step(&mut self, to: EntState) {
        debug_assert!(
            self.state.may_become(to),
            "entry {}: {:?} -> {:?}",
            self.id,
            self.state,
            to
        );
        self.state = to;
    }
}

// SAFETY: the raw pointers in `iov` point into the same Box (header) and
// into the payload slot the entry holds; the entry moves between threads
// only as a whole.
unsafe impl Send for Ent {}

/// An entry holding a request, between its completion and its commit.
pub struct KernelSlot {
    pub(super) ent: Box<Ent>,
}

impl std::fmt::Debug for KernelSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelSlot")
            .field("id", &self.ent.id)
            .field("state", &self.ent.state)
            .finish()
    }
}

impl KernelSlot {
    /// The entry's state.
    pub fn state(&self) -> EntState {
        self.ent.state
    }
    /// Moves a fetched entry on (`Serving`, then `Started` or `Parked`);
    /// the serving thread's own bookkeeping, checked against the lifecycle.
    pub fn set_state(&mut self, to: EntState) {
        self.ent.step(to);
    }
    fn is_read(&self) -> bool {
        self.in_header().opcode == fuse_core::abi::Opcode::Read as u32
    }
    /// Whether the request is a WRITE.
    pub fn is_write(&self) -> bool {
        self.in_header().opcode == fuse_core::abi::Opcode::Write as u32
    }
}

impl RingSlot for KernelSlot {
    fn in_header(&self) -> InHeader {
        InHeader::read_from_prefix(&self.ent.header.in_out)
            .map(|(h, _)| h)
            .unwrap_or_default()
    }
    fn request_payload_len(&self) -> usize {
        (self.ent.header.ring_ent_in_out.payload_sz as usize).min(self.ent.payload.len())
    }
    fn is_zero_copy(&self) -> bool {
        self.ent.header.ring_ent_in_out.flags & uring::ENT_ZERO_COPY != 0
    }
    /// A READ's payload buffer is its [`RingSlot::take_client_mem`]: the data
    /// is read there by reference, and no slice of it is handed out. Any
    /// other request's buffer is taken back from the memory lent of it
    /// before (a WRITE's [`RingSlot::write_mem`]): that memory gets EIO
    /// from then on, so start a WRITE from it before asking for the slice
    /// (`serve_slot` does), and a started WRITE's slice waits for its I/O.
    fn parts_mut(&mut self) -> (&mut UringReqHeader, &mut [u8]) {
        let read = self.is_read();
        let e = &mut *self.ent;
        if read {
            return (&mut e.header, &mut []);
        }
        // SAFETY: the entry is held by the serving thread (a `KernelSlot`
        // exists only between its command's completion and its next
        // `send`), so the kernel does not touch the slot; its `Payload` is
        // the only one of its slot (`register_entry` gives each entry a
        // slot of its own); `slice_mut` takes the slot back from every
        // `PayloadMem` made of it, and no new one can be made while the
        // slice mutably borrows the entry.
        (&mut e.header, unsafe { e.payload.slice_mut() })
    }
    fn has_client_mem(&self) -> bool {
        self.is_read()
    }
    fn take_client_mem(&mut self) -> Option<Arc<dyn fuse_core::ClientMem>> {
        self.is_read()
            .then(|| Arc::new(self.ent.payload.client_mem()) as Arc<dyn fuse_core::ClientMem>)
    }
    /// A WRITE's data is at the start of the payload buffer (its
    /// `fuse_write_in` in the header); its reply, a `fuse_write_out`, goes
    /// to the payload once the write is over
    /// ([`fuse_core::server::complete_started`]).
    fn write_mem(&self) -> Option<Arc<dyn fuse_core::ClientMem>> {
        (self.is_write() && !self.is_zero_copy()).then(|| {
            let len = self.request_payload_len();
            Arc::new(self.ent.payload.client_mem_of(len)) as Arc<dyn fuse_core::ClientMem>
        })
    }
    fn set_reply(&mut self, error: i32, len: usize) {
        let unique = self.in_header().unique;
        let len = if error == 0 { len } else { 0 };
        let out = OutHeader {
            len: (std::mem::size_of::<OutHeader>() + len) as u32,
            error,
            unique,
        };
        self.ent.header.in_out[..std::mem::size_of::<OutHeader>()].copy_from_slice(out.as_bytes());
        self.ent.header.ring_ent_in_out.payload_sz = len as u32;
    }
}

#[cfg(test)]
mod tests {
    use super::EntState::*;

    #[test]
    fn the_entry_lifecycle_allows_only_its_transitions() {
        assert!(New.may_become(Fetching));
        assert!(Fetching.may_become(Fetched));
        assert!(Fetched.may_become(Serving));
        for s in [Started, Parked, Fetching] {
            assert!(Serving.may_become(s));
        }
        assert!(Started.may_become(Fetching));
        assert!(Parked.may_become(Fetching));
        // A fetched entry is never committed unserved, a started READ never
        // re-served, and nothing skips its command.
        assert!(!Fetched.may_become(Fetching));
        assert!(!Started.may_become(Serving));
        assert!(!New.may_become(Fetched));
        assert!(!Fetching.may_become(Serving));
    }
}
