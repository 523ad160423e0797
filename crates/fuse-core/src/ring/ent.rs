//! Ring entries and their lifecycle.

use super::pool::PoolBuf;
use crate::abi::UringReqHeader;
use crate::chan::req::Request;
use std::collections::VecDeque;
use std::sync::Arc;

/// The state of a ring entry. Each state but `Invalid` and `Released` has
/// its own list in the queue; all lists and states are guarded by the
/// queue's lock.
///
/// ```text
/// Invalid ─REGISTER─> Available ─request assigned─> FuseReq ─copied to the server─> Userspace
/// FuseReq ─request does not fit─> Available (the request fails with EIO)
/// Userspace ─COMMIT─> Commit ─> Available | FuseReq (next request, same call)
/// Userspace ─server drops it unanswered─> Available (the request fails with EIO)
/// any ─abort─> Teardown ─> Released
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntState {
    /// Not registered.
    Invalid,
    /// Registered, waiting for a request (its command is held).
    Available,
    /// A request is assigned and about to be copied to the server.
    FuseReq,
    /// The server owns the entry and works on the request.
    Userspace,
    /// The server's result is being copied back.
    Commit,
    /// Being torn down.
    Teardown,
    /// Gone.
    Released,
}

impl EntState {
    /// Whether `self -> to` is a transition of the lifecycle.
    pub fn can_move_to(self, to: EntState) -> bool {
        use EntState::*;
        matches!(
            (self, to),
            (Invalid, Available)
                | (Available, FuseReq)
                | (FuseReq, Userspace)
                | (FuseReq, Available)
                | (Userspace, Commit)
                | (Commit, Available)
                | (Commit, FuseReq)
                | (Userspace, Available)
                | (Teardown, Released)
        ) || (to == Teardown && !matches!(self, Teardown | Released))
    }
}

/// Buffers a server registers for one entry: the 288-byte header and, in
/// per-entry payload mode, its own payload buffer (empty in pool mode).
#[derive(Debug)]
pub struct EntryBufs {
    /// The header buffer.
    pub header: Box<UringReqHeader>,
    /// The payload buffer (per-entry mode) or empty (pool mode).
    pub payload: Vec<u8>,
}

impl EntryBufs {
    /// Buffers for pool mode.
    pub fn pooled() -> Self {
        EntryBufs {
            header: Box::default(),
            payload: Vec::new(),
        }
    }
    /// Buffers with a per-entry payload of `size` bytes.
    pub fn with_payload(size: usize) -> Self {
        EntryBufs {
            header: Box::default(),
            payload: vec![0; size],
        }
    }
}

/// One entry, guarded by its queue's lock.
#[derive(Debug)]
pub(crate) struct Ent {
    pub state: EntState,
    /// The server's header buffer while the ring holds the entry.
    pub header: Option<Box<UringReqHeader>>,
    /// The server's own payload buffer (per-entry mode) while the ring holds it.
    pub own_payload: Option<Vec<u8>>,
    /// A claimed pool buffer kept for the entry's next request.
    pub pool_buf: Option<PoolBuf>,
    pub req: Option<Arc<Request>>,
    /// The request is being copied to the server outside the lock.
    pub copying: bool,
    /// The server holds the client's pages (zero-copy): the request may
    /// end only once they are back.
    pub client_pages: bool,
    /// A submitter's own entry: it takes requests only while its owner
    /// submits (see `Queue::preferring`), or on its own commit.
    pub reserved: bool,
}

/// The per-state lists of a queue.
#[derive(Debug, Default)]
pub(crate) struct Lists {
    pub avail: VecDeque<u32>,
    pub fuse_req: VecDeque<u32>,
    pub userspace: VecDeque<u32>,
    pub commit: VecDeque<u32>,
    pub teardown: VecDeque<u32>,
}

impl Lists {
    pub fn list(&mut self, s: EntState) -> Option<&mut VecDeque<u32>> {
        match s {
            EntState::Available => Some(&mut self.avail),
            EntState::FuseReq => Some(&mut self.fuse_req),
            EntState::Userspace => Some(&mut self.userspace),
            EntState::Commit => Some(&mut self.commit),
            EntState::Teardown => Some(&mut self.teardown),
            EntState::Invalid | EntState::Released => None,
        }
    }

    /// How often `id` appears on the list of state `s`.
    pub fn count(&self, s: EntState, id: u32) -> usize {
        let l = match s {
            EntState::Available => &self.avail,
            EntState::FuseReq => &self.fuse_req,
            EntState::Userspace => &self.userspace,
            EntState::Commit => &self.commit,
            EntState::Teardown => &self.teardown,
            EntState::Invalid | EntState::Released => return 0,
        };
        l.iter().filter(|x| **x == id).count()
    }

    /// Moves entry `id` of `ents` to state `to`: off its old list, onto the
    /// new one. An invalid transition changes nothing and is reported.
    pub fn move_ent(
        &mut self,
        ents: &mut [Ent],
        id: u32,
        to: EntState,
    ) -> Result<(), (EntState, EntState)> {
        let Some(e) = ents.get_mut(id as usize) else {
            return Err((EntState::Invalid, to));
        };
        let from = e.state;
        if !from.can_move_to(to) {
            return Err((from, to));
        }
        if let Some(l) = self.list(from) {
            l.retain(|x| *x != id);
        }
        if let Some(l) = self.list(to) {
            l.push_back(id);
        }
        e.state = to;
        Ok(())
    }
}
