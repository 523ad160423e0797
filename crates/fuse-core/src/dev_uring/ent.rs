//! Ring entries and their lifecycle.

use super::pool::PoolBuf;
use crate::abi::UringReqHeader;
use crate::chan::req::Request;
use crate::sync::Arc;

/// The state of a ring entry. Each state but `Invalid`, `Commit` and
/// `Released` has its own list in the queue; all lists and states are
/// guarded by the queue's lock. (An entry in `Commit` is held by the
/// thread committing it, which moves it on in the same call: nobody looks
/// for it on a list, so it is on none, and a commit costs two list moves
/// rather than four.)
///
/// ```text
/// Invalid ─REGISTER─> Available ─request assigned─> FuseReq ─copied to the server─> Userspace
/// FuseReq ─request does not fit─> Available (the request fails with EIO)
/// Userspace ─COMMIT─> Commit ─> Available | FuseReq (next request, same call)
/// Userspace ─server drops it unanswered─> Available (the request fails with EIO)
/// any ─abort─> Teardown ─> Released
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
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
    #[inline]
    pub fn can_move_to(self, to: EntState) -> bool {
        MOVES[self as usize] & (1 << to as u8) != 0
    }
}

/// The lifecycle's transitions: bit `to` of `MOVES[from]` (the states in
/// declaration order).
const MOVES: [u8; 7] = {
    use EntState::*;
    const fn bit(s: EntState) -> u8 {
        1 << s as u8
    }
    // Any state but Teardown and Released may be torn down.
    let teardown = bit(Teardown);
    [
        /* Invalid */ bit(Available) | teardown,
        /* Available */ bit(FuseReq) | teardown,
        /* FuseReq */ bit(Userspace) | bit(Available) | teardown,
        /* Userspace */ bit(Commit) | bit(Available) | teardown,
        /* Commit */ bit(Available) | bit(FuseReq) | teardown,
        /* Teardown */ bit(Released),
        /* Released */ 0,
    ]
};

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
    /// The server's header buffer while the ring holds the entry (None
    /// after a server dropped its `Fetched`: the next fetch makes one).
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
    /// submits (see `Queue::preferring`), or on its own commit. Changed
    /// only through [`Lists::set_reserved`] (it picks the entry's list).
    pub reserved: bool,
    /// The list the entry is on and its neighbours there (see [`Lists`]).
    link: Link,
}

impl Ent {
    /// A new entry (not registered yet: on no list).
    pub fn new(header: Box<UringReqHeader>, own_payload: Option<Vec<u8>>) -> Ent {
        Ent {
            state: EntState::Invalid,
            header: Some(header),
            own_payload,
            pool_buf: None,
            req: None,
            copying: false,
            client_pages: false,
            reserved: false,
            link: Link::default(),
        }
    }
}

/// No entry (the end of a list).
const NIL: u32 = u32::MAX;

/// The per-state lists. `Available` and `FuseReq` are each split in two,
/// reserved entries and the others, so the dispatcher finds a reserved
/// (or an unreserved) available entry, and a submitter its own entry
/// holding a request, at the head of a list instead of by a scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ListId {
    /// Available, not reserved.
    Avail = 0,
    /// Available, reserved.
    AvailOwn = 1,
    /// FuseReq, not reserved.
    FuseReq = 2,
    /// FuseReq, reserved.
    FuseReqOwn = 3,
    Userspace = 4,
    Teardown = 5,
}

const LISTS: usize = 6;

impl ListId {
    /// The list of an entry in state `s` (none for Invalid, Commit and
    /// Released).
    #[inline]
    fn of(s: EntState, reserved: bool) -> Option<ListId> {
        Some(match (s, reserved) {
            (EntState::Available, false) => ListId::Avail,
            (EntState::Available, true) => ListId::AvailOwn,
            (EntState::FuseReq, false) => ListId::FuseReq,
            (EntState::FuseReq, true) => ListId::FuseReqOwn,
            (EntState::Userspace, _) => ListId::Userspace,
            (EntState::Teardown, _) => ListId::Teardown,
            (EntState::Invalid | EntState::Commit | EntState::Released, _) => return None,
        })
    }
}

/// An entry's place on its list: an intrusive doubly linked list through
/// the queue's entry vector, so a move is O(1) whatever the queue's size.
#[derive(Clone, Copy, Debug)]
struct Link {
    list: Option<ListId>,
    prev: u32,
    next: u32,
}

impl Default for Link {
    fn default() -> Self {
        Link {
            list: None,
            prev: NIL,
            next: NIL,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Head {
    first: u32,
    last: u32,
    len: usize,
}

impl Default for Head {
    fn default() -> Self {
        Head {
            first: NIL,
            last: NIL,
            len: 0,
        }
    }
}

/// The per-state lists of a queue, oldest entry first (each entry is on
/// the list of its state, see [`ListId`]). Guarded by the queue's lock,
/// like the entries they link.
#[derive(Debug, Default)]
pub(crate) struct Lists {
    heads: [Head; LISTS],
}

impl Lists {
    /// The oldest entry on `l`.
    pub fn front(&self, l: ListId) -> Option<u32> {
        let f = self.heads[l as usize].first;
        (f != NIL).then_some(f)
    }

    /// The entry after `id` on its list.
    pub fn next(&self, ents: &[Ent], id: u32) -> Option<u32> {
        let n = ents.get(id as usize)?.link.next;
        (n != NIL).then_some(n)
    }

    /// How many entries are on `l`.
    pub fn len(&self, l: ListId) -> usize {
        self.heads[l as usize].len
    }

    /// Entries in state `s`.
    pub fn count_state(&self, s: EntState) -> usize {
        let own = ListId::of(s, true).filter(|l| Some(*l) != ListId::of(s, false));
        [ListId::of(s, false), own]
            .into_iter()
            .flatten()
            .map(|l| self.len(l))
            .sum()
    }

    /// The entries on `l`, oldest first.
    pub fn iter<'a>(&self, ents: &'a [Ent], l: ListId) -> impl Iterator<Item = u32> + 'a {
        let mut at = self.heads[l as usize].first;
        std::iter::from_fn(move || {
            if at == NIL {
                return None;
            }
            let id = at;
            at = ents.get(id as usize).map_or(NIL, |e| e.link.next);
            Some(id)
        })
    }

    /// How often `id` appears on the list(s) of state `s` (walking them:
    /// for the invariant check).
    #[cfg(feature = "test-utils")]
    pub fn count(&self, ents: &[Ent], s: EntState, id: u32) -> usize {
        let own = ListId::of(s, true).filter(|l| Some(*l) != ListId::of(s, false));
        [ListId::of(s, false), own]
            .into_iter()
            .flatten()
            .map(|l| {
                self.iter(ents, l)
                    .take(ents.len() + 1)
                    .filter(|x| *x == id)
                    .count()
            })
            .sum()
    }

    /// Checks the links of every list: lengths, back links, and that each
    /// entry says it is on the list it is found on.
    #[cfg(feature = "test-utils")]
    pub fn check(&self, ents: &[Ent]) -> Result<(), String> {
        for (li, h) in self.heads.iter().enumerate() {
            let mut n = 0;
            let mut prev = NIL;
            let mut at = h.first;
            while at != NIL {
                let e = ents
                    .get(at as usize)
                    .ok_or(format!("list {li}: entry {at}"))?;
                if e.link.prev != prev || e.link.list.map(|l| l as usize) != Some(li) {
                    return Err(format!("list {li}: entry {at} badly linked"));
                }
                n += 1;
                if n > ents.len() {
                    return Err(format!("list {li}: a cycle"));
                }
                prev = at;
                at = e.link.next;
            }
            if n != h.len || h.last != prev {
                return Err(format!("list {li}: {n} linked, {} counted", h.len));
            }
        }
        Ok(())
    }

    #[inline]
    fn unlink(&mut self, ents: &mut [Ent], id: u32) {
        let Link { list, prev, next } = ents[id as usize].link;
        let Some(l) = list else { return };
        let h = &mut self.heads[l as usize];
        if prev == NIL {
            h.first = next;
        } else {
            ents[prev as usize].link.next = next;
        }
        if next == NIL {
            h.last = prev;
        } else {
            ents[next as usize].link.prev = prev;
        }
        h.len -= 1;
        ents[id as usize].link = Link::default();
    }

    #[inline]
    fn push_back(&mut self, ents: &mut [Ent], id: u32, l: ListId) {
        let h = &mut self.heads[l as usize];
        let last = h.last;
        ents[id as usize].link = Link {
            list: Some(l),
            prev: last,
            next: NIL,
        };
        if last == NIL {
            h.first = id;
        } else {
            ents[last as usize].link.next = id;
        }
        h.last = id;
        h.len += 1;
    }

    /// Moves entry `id` of `ents` to state `to`: off its old list, onto the
    /// tail of the new one. An invalid transition changes nothing and is
    /// reported.
    #[inline(always)]
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
        e.state = to;
        let new = ListId::of(to, e.reserved);
        if e.link.list != new {
            self.unlink(ents, id);
            if let Some(l) = new {
                self.push_back(ents, id, l);
            }
        }
        Ok(())
    }

    /// Marks entry `id` reserved (or not), moving it to the matching list
    /// of its state (at the tail).
    pub fn set_reserved(&mut self, ents: &mut [Ent], id: u32, reserved: bool) {
        let Some(e) = ents.get_mut(id as usize) else {
            return;
        };
        if e.reserved == reserved {
            return;
        }
        e.reserved = reserved;
        let to = ListId::of(e.state, reserved);
        if to != e.link.list {
            self.unlink(ents, id);
            if let Some(l) = to {
                self.push_back(ents, id, l);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [EntState; 7] = [
        EntState::Invalid,
        EntState::Available,
        EntState::FuseReq,
        EntState::Userspace,
        EntState::Commit,
        EntState::Teardown,
        EntState::Released,
    ];

    /// The transition table is the lifecycle of the diagram.
    #[test]
    fn moves_table_is_the_lifecycle() {
        use EntState::*;
        for from in ALL {
            for to in ALL {
                let want = matches!(
                    (from, to),
                    (Invalid, Available)
                        | (Available, FuseReq)
                        | (FuseReq, Userspace)
                        | (FuseReq, Available)
                        | (Userspace, Commit)
                        | (Commit, Available)
                        | (Commit, FuseReq)
                        | (Userspace, Available)
                        | (Teardown, Released)
                ) || (to == Teardown && !matches!(from, Teardown | Released));
                assert_eq!(from.can_move_to(to), want, "{from:?} -> {to:?}");
            }
        }
    }

    /// Moves keep every list linked, in order, and reserving an entry
    /// moves it to the reserved list of its state.
    #[test]
    fn lists_stay_linked() {
        let mut ents: Vec<Ent> = (0..5).map(|_| Ent::new(Box::default(), None)).collect();
        let mut l = Lists::default();
        for id in 0..5 {
            l.move_ent(&mut ents, id, EntState::Available).unwrap();
        }
        l.set_reserved(&mut ents, 1, true);
        l.set_reserved(&mut ents, 3, true);
        l.check(&ents).unwrap();
        let avail: Vec<u32> = l.iter(&ents, ListId::Avail).collect();
        let own: Vec<u32> = l.iter(&ents, ListId::AvailOwn).collect();
        assert_eq!((avail, own), (vec![0, 2, 4], vec![1, 3]));
        l.move_ent(&mut ents, 2, EntState::FuseReq).unwrap();
        l.move_ent(&mut ents, 3, EntState::FuseReq).unwrap();
        l.move_ent(&mut ents, 0, EntState::FuseReq).unwrap();
        assert!(l.move_ent(&mut ents, 4, EntState::Commit).is_err());
        l.check(&ents).unwrap();
        assert_eq!(l.front(ListId::FuseReq), Some(2));
        assert_eq!(l.next(&ents, 2), Some(0));
        assert_eq!(l.front(ListId::FuseReqOwn), Some(3));
        assert_eq!(l.count_state(EntState::FuseReq), 3);
        assert_eq!(l.count_state(EntState::Available), 2);
        for id in [2, 0, 3] {
            l.move_ent(&mut ents, id, EntState::Userspace).unwrap();
        }
        assert_eq!(
            l.iter(&ents, ListId::Userspace).collect::<Vec<_>>(),
            [2, 0, 3]
        );
        l.move_ent(&mut ents, 0, EntState::Teardown).unwrap();
        l.move_ent(&mut ents, 0, EntState::Released).unwrap();
        l.check(&ents).unwrap();
        assert_eq!(l.iter(&ents, ListId::Userspace).collect::<Vec<_>>(), [2, 3]);
        assert_eq!(l.count(&ents, EntState::Teardown, 0), 0);
    }
}
