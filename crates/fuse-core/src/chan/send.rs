//! Background sends: the blocking form, the form that never waits, and
//! its batch form, which admits and queues several requests per
//! acquisition of `bg_lock` (and of the ring queue's lock); each reuses
//! the allocations of requests that ended (`Core::spares`).

use super::req::{flag, Args, EndFn, Request};
use super::{call::SigState, Chan, Core, Errno, InFlight, Transport};
use crate::sync::{lock, Arc, Ordering};

/// Most requests kept for reuse (`Core::spares`).
const SPARES: usize = 256;

/// `Core::spares`: ended requests kept for reuse, and the vector a batch
/// send builds its requests in (kept empty between sends, for its
/// capacity: no allocation per batch).
#[derive(Default)]
pub(crate) struct Spares {
    reqs: Vec<Arc<Request>>,
    room: Vec<Arc<Request>>,
}

impl Core {
    /// Lets go of ended requests (each slot is emptied): those nobody
    /// else holds are kept for reuse (up to [`SPARES`]), the others
    /// dropped. What dropping them would run for the client (its memory
    /// handle) runs before the spares' lock is taken.
    pub(crate) fn recycle(&self, reqs: &mut [Option<Arc<Request>>]) {
        let mut waiting = 0;
        for slot in reqs.iter_mut() {
            if let Some(r) = slot.take() {
                if let Some((r, w)) = Request::recycle(r) {
                    waiting += usize::from(w);
                    *slot = Some(r);
                }
            }
        }
        {
            let spares = &mut lock(&self.spares).reqs;
            let room = SPARES.saturating_sub(spares.len());
            spares.extend(reqs.iter_mut().filter_map(Option::take).take(room));
        }
        // Over the limit: dropped (no longer counted as waiting).
        for slot in reqs.iter_mut() {
            slot.take();
        }
        self.drop_waiting_n(waiting);
    }

    /// Lets go of one ended request as [`Core::recycle`] does.
    pub(crate) fn recycle_one(&self, req: Arc<Request>) {
        let Some((r, waiting)) = Request::recycle(req) else {
            return;
        };
        let over = {
            let spares = &mut lock(&self.spares).reqs;
            if spares.len() < SPARES {
                spares.push(r);
                None
            } else {
                Some(r)
            }
        };
        drop(over);
        self.drop_waiting_n(usize::from(waiting));
    }

    /// A spare request, if one is kept.
    fn take_spare(&self) -> Option<Arc<Request>> {
        lock(&self.spares).reqs.pop()
    }

    /// The room for a batch send's requests (`Spares::room`, with room
    /// for `n`), holding up to `n` spare requests.
    fn take_spares(&self, n: usize) -> Vec<Arc<Request>> {
        let mut into = {
            let mut s = lock(&self.spares);
            let mut into = std::mem::take(&mut s.room);
            let k = n.min(s.reqs.len());
            let at = s.reqs.len() - k;
            into.extend(s.reqs.drain(at..));
            into
        };
        into.reserve(n - into.len());
        into
    }

    /// Keeps a batch send's room, emptied, for the next (the larger of it
    /// and the one kept, when two sends overlapped).
    fn give_room(&self, mut room: Vec<Arc<Request>>) {
        // The requests' handles are let go of before the lock.
        room.clear();
        let mut s = lock(&self.spares);
        if s.room.capacity() < room.capacity() {
            std::mem::swap(&mut s.room, &mut room);
        }
    }
}

/// What `Chan::send_admitted` leaves to its caller: the ring, when it
/// queues the requests itself, and the requests the transport refused.
type Admitted<'a> = (Option<&'a Arc<dyn Transport>>, Vec<InFlight>);

/// The flags of a background request.
fn bg_flags(force: bool) -> u32 {
    let f = flag::ISREPLY | flag::WAITING | flag::BACKGROUND | flag::ASYNC;
    if force {
        f | flag::FORCE
    } else {
        f
    }
}

/// Why [`Chan::try_send_background`] did not send.
pub enum TrySendError {
    /// Admission is closed for now: the request and its end callback,
    /// given back.
    Full(Box<(Args, EndFn)>),
    /// The connection is gone (or the request could not be queued).
    Closed(Errno),
}

impl std::fmt::Debug for TrySendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TrySendError::Full(b) => f.debug_tuple("Full").field(&b.0.opcode).finish(),
            TrySendError::Closed(e) => f.debug_tuple("Closed").field(e).finish(),
        }
    }
}

impl Chan {
    /// Sends a background request; `end` runs once with its result (on the
    /// thread that ends it). Blocks while background admission is closed.
    /// An error here means the request was not sent and `end` will not run.
    pub fn send_background(&self, args: Args, end: EndFn) -> Result<(), Errno> {
        let core = self.core();
        core.add_waiting();
        if !args.force {
            if let Err(e) = core.get_req(true, &SigState::new(core.clone())) {
                core.drop_waiting();
                return Err(e);
            }
        }
        self.send_admitted_one(args, end).map(drop)
    }

    /// [`Chan::send_background`] that never waits: when background
    /// admission is closed (max_background reached, or earlier background
    /// requesters still parked) it gives the request back untouched, so a
    /// transport can leave it where it came from (a virtqueue leaves the
    /// descriptors in its avail ring) and retry once a slot frees. Returns
    /// the unique the server will see (to interrupt it by).
    #[inline]
    pub fn try_send_background(&self, args: Args, end: EndFn) -> Result<u64, TrySendError> {
        let core = self.core();
        core.add_waiting();
        if !args.force {
            let admitted = {
                let mut bg = lock(&core.bg);
                if !bg.connected {
                    drop(bg);
                    core.drop_waiting();
                    return Err(TrySendError::Closed(Errno::ENOTCONN));
                }
                bg.try_admit(true)
            };
            if !admitted {
                core.drop_waiting();
                return Err(TrySendError::Full(Box::new((args, end))));
            }
        }
        self.send_admitted_one(args, end)
            .map_err(TrySendError::Closed)
    }

    /// [`Chan::try_send_background`] for several requests at once: takes
    /// requests from the front of `batch`, in order, as one caller sending
    /// them one by one with [`Chan::try_send_background`] and stopping at
    /// the first that is refused for admission (`TrySendError::Full`)
    /// would, and appends one result per request taken to `sent`: the
    /// unique the server will see, or the error (ENOTCONN: the connection
    /// is gone; `TrySendError::Closed`) with which it was not sent (its end
    /// callback then never runs). What stays in `batch` was refused for
    /// admission (nothing of it was touched, its order kept): the first of
    /// it found admission full, as the single form's `Full` says, and the
    /// rest were not tried. Returns how many requests were taken.
    ///
    /// Each request gets everything the single form gives it (its own
    /// unique, a background slot or FORCE, the connection's checks, its
    /// timeout clock, interrupts once the server has it); the batch costs
    /// one acquisition of `bg_lock` for the admission of all, one more to
    /// queue them, one of the ring queue's lock per run of requests for
    /// the same queue, and one reading of the clock (they are admitted at
    /// the same instant).
    pub fn try_send_background_batch(
        &self,
        batch: &mut Vec<(Args, EndFn)>,
        sent: &mut Vec<Result<u64, Errno>>,
    ) -> usize {
        let core = self.core();
        let n = batch.len();
        if n == 0 {
            return 0;
        }
        if n == 1 {
            // One request: the single form costs less than the batch's
            // bookkeeping.
            let Some((args, end)) = batch.pop() else {
                return 0;
            };
            return match self.try_send_background(args, end) {
                Ok(unique) => {
                    sent.push(Ok(unique));
                    1
                }
                Err(TrySendError::Closed(e)) => {
                    sent.push(Err(e));
                    1
                }
                Err(TrySendError::Full(b)) => {
                    batch.push(*b);
                    0
                }
            };
        }
        core.num_waiting.fetch_add(n, Ordering::SeqCst);
        // Admission of each in order, under one bg_lock (guards
        // num_background, the waiters and `connected`).
        let admitted = {
            let mut bg = lock(&core.bg);
            if bg.connected {
                let mut k = 0;
                for (args, _) in batch.iter() {
                    if !args.force && !bg.try_admit(true) {
                        break;
                    }
                    k += 1;
                }
                Some(k)
            } else {
                None
            }
        };
        let Some(k) = admitted else {
            // Every one of them would have been Closed.
            core.drop_waiting_n(n);
            sent.extend(batch.drain(..).map(|_| Err(Errno::ENOTCONN)));
            return n;
        };
        core.drop_waiting_n(n - k);
        let now = core.clock.now();
        let first = sent.len();
        let mut reqs = core.take_spares(k);
        let reused = reqs.len();
        for (i, (args, end)) in batch.drain(..k).enumerate() {
            let unique = core.next_unique();
            sent.push(Ok(unique));
            let flags = bg_flags(args.force);
            if i < reused {
                Request::renew(&mut reqs[i], unique, args, flags, now, Some(end));
            } else {
                reqs.push(Request::new(core, unique, args, flags, now, Some(end)));
            }
        }
        match self.send_admitted(&reqs) {
            Ok((ring, mut refused)) => {
                if let Some(ring) = ring {
                    ring.send_background(&mut reqs.drain(..).map(InFlight), &mut refused);
                }
                core.end_refused(refused);
            }
            Err(e) => {
                for r in &mut sent[first..] {
                    *r = Err(e);
                }
            }
        }
        core.give_room(reqs);
        k
    }

    /// The part of sending background requests after admission (the
    /// caller has counted each as waiting and, unless FORCE, holds a slot
    /// for it), under bg_lock: the connection's check, FORCE requests
    /// counted, and without the ring the background queue and its flush
    /// to the transport. Returns the ring to queue them on (outside
    /// bg_lock: it queues background requests itself), if it carries them,
    /// and the requests the transport refused (to end). On an error nothing
    /// was sent and no end callback runs.
    fn send_admitted(&self, reqs: &[Arc<Request>]) -> Result<Admitted<'_>, Errno> {
        let core = self.core();
        let ring = core.route();
        let mut bg = lock(&core.bg);
        if !bg.connected {
            for r in reqs {
                if !r.args.force {
                    bg.unreserve(core.budget());
                }
            }
            drop(bg);
            // Not sent: the caller keeps responsibility, `end` is dropped.
            for r in reqs {
                lock(&r.data).end = None;
            }
            return Err(Errno::ENOTCONN);
        }
        for r in reqs {
            if r.args.force {
                bg.num_background += 1;
            }
        }
        if ring.is_some() {
            // Ring background requests queue per ring queue, outside
            // bg_lock.
            return Ok((ring, Vec::new()));
        }
        for r in reqs {
            bg.enqueue(r.clone());
        }
        let next = bg.flush();
        Ok((None, core.send_to_transport(next)))
    }

    /// Builds and sends one admitted background request.
    #[inline]
    fn send_admitted_one(&self, args: Args, end: EndFn) -> Result<u64, Errno> {
        let core = self.core();
        let unique = core.next_unique();
        let flags = bg_flags(args.force);
        let now = core.clock.now();
        let req = match core.take_spare() {
            Some(mut r) => {
                Request::renew(&mut r, unique, args, flags, now, Some(end));
                r
            }
            None => Request::new(core, unique, args, flags, now, Some(end)),
        };
        let (ring, mut refused) = self.send_admitted(std::slice::from_ref(&req))?;
        if let Some(ring) = ring {
            ring.send_background(&mut std::iter::once(InFlight(req)), &mut refused);
        }
        core.end_refused(refused);
        Ok(unique)
    }
}
