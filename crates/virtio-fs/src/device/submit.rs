//! Taking requests off a request queue, in rounds of three stages:
//! **pop** up to [`ROUND`] chains (each read into engine arguments and a
//! ticket, `request.rs`), **send** them to the engine as one batch (one
//! lock for their admission, one for their ring entries, one clock read),
//! and, on the vring thread, **serve** what its own entries got in chunks
//! (`inline.rs`, `notify.rs`: a round there is one chunk, or up to
//! `QUICK_ROUND` requests after a round of READs the page cache held). A
//! round ends early at a chain that does not go into the batch (its
//! *tail*): a malformed or refused chain is answered right after the send,
//! still under `pop_lock`; a lock call is sent before the round is served;
//! an INIT after it, and only if the vring was not stopped meanwhile.
//!
//! When admission is full, the refused chains and the tail go back to the
//! avail ring (under `pop_lock`), so nothing popped is held unsent, and the
//! queue stalls until a request ends. Nothing is answered or given back
//! before the send, so moving back over the tail is always right.

use super::*;
use fuse_core::EndFn;

/// Chains popped per round.
const ROUND: usize = 16;

/// The chain that ended a round, dealt with after its batch.
enum Tail {
    /// A lock call: never background, sent on a thread of its own.
    Lock(Args, Arc<Ticket>),
    /// A guest INIT: ends the old session first.
    Init(Args, Arc<Ticket>),
    /// A FUSE_SETUPMAPPING or FUSE_REMOVEMAPPING, with a DAX window:
    /// served by the device (`window.rs`).
    Dax(Args, Arc<Ticket>),
    /// A request `prepare` refused.
    Refused(Arc<Ticket>),
    /// A chain that could not be read (its head), or whose head the
    /// device still serves (None: the guest republished it).
    Malformed(Option<u16>),
}

/// One round: the requests for the engine's batch, in the order popped,
/// and what ended it. Reused from round to round, and by a vring thread
/// that serves in line from kick to kick (kept in its `QueueServer`).
#[derive(Default)]
pub(super) struct Round {
    sends: Vec<(Args, EndFn)>,
    tickets: Vec<Arc<Ticket>>,
    results: Vec<Result<u64, Errno>>,
    tail: Option<Tail>,
}

impl Round {
    /// Whether nothing is left in it (true between rounds).
    fn is_empty(&self) -> bool {
        self.sends.is_empty()
            && self.tickets.is_empty()
            && self.results.is_empty()
            && self.tail.is_none()
    }
}

/// How a round's send went.
enum Outcome {
    /// This many requests are in the engine.
    All(usize),
    /// Admission was full: the first `usize` are in, the rest went back.
    Stalled(usize),
}

impl<F: Filesystem + 'static> FsDevice<F> {
    /// Pops and submits until the queue is empty (false) or admission is
    /// full (true: the refused chains went back to the avail ring). With
    /// `inline`, this thread serves what its entries get, until it served
    /// `k` requests (see [`FsDevice::drain_requests`]).
    ///
    /// It pops the chains the avail ring announced when it began and
    /// returns once they are all popped and served: what the guest adds
    /// meanwhile is found by the caller's re-enabling of notifications
    /// (`serve_queue`), or by its kick.
    pub(super) fn submit_requests(
        &self,
        vring: &Vring,
        q: RqId,
        mut inline: Option<(&mut QueueServer, usize)>,
    ) -> bool {
        let mut round = match inline.as_mut() {
            Some((s, _)) => std::mem::take(&mut s.round),
            None => Round::default(),
        };
        debug_assert!(round.is_empty());
        let stalled = self.submit_rounds(vring, q, &mut inline, &mut round);
        if let Some((s, _)) = inline {
            s.round = round;
        }
        stalled
    }

    /// [`FsDevice::submit_requests`]'s rounds, with `round` to reuse.
    fn submit_rounds(
        &self,
        vring: &Vring,
        q: RqId,
        inline: &mut Option<(&mut QueueServer, usize)>,
        round: &mut Round,
    ) -> bool {
        let rq = self.inner.queue(q);
        let mut chunks = Chunks::new(self.inner.cfg.submit_batch);
        let mut served = 0;
        // The avail index when the drain began (read once, below).
        let mut end = None;
        loop {
            // Each round: serving may have taken long, and the memory
            // table may have changed meanwhile. (Its generation first: a
            // change between the two only makes answers look it up again.)
            let mem_gen = self.inner.mem_gen.load(Ordering::SeqCst);
            let Some(mem) = self.memory() else {
                return false;
            };
            let end = *end.get_or_insert_with(|| avail_index(vring, &mem));
            // Counted from the queue's next index each round: chains put
            // back (admission full) count again, those the watchdog popped
            // meanwhile do not (counted again under `pop_lock` below).
            let left = left_before(vring, end);
            if left == 0 {
                return false;
            }
            if self.too_many_orphans(q) {
                return true;
            }
            let mut want = ROUND.min(left);
            if let Some((s, k)) = inline.as_mut() {
                if served < *k {
                    want = want.min(*k - served).min(chunks.round_len());
                    // Entries of this thread free for all of them.
                    s.make_room(want);
                }
            }
            let (sent, gen, tail) = {
                let _pop = lock(&rq.pop_lock);
                // Before the pop: a vring stopped after it leaves these
                // chains with the old generation, so their answers never
                // reach the new vring.
                let gen = read(&rq.gen).n;
                let want = want.min(left_before(vring, end));
                if want == 0 || self.pop_round(vring, (&mem, mem_gen), q, gen, want, round) == 0 {
                    return false;
                }
                let sent = self.send_round(vring, q, round);
                let tail = match round.tail.take() {
                    Some(Tail::Refused(t)) => {
                        self.refuse(&t);
                        None
                    }
                    Some(Tail::Malformed(head)) => {
                        self.malformed(vring, &mem, q, head);
                        None
                    }
                    tail => tail,
                };
                (sent, gen, tail)
            };
            let tail = match tail {
                Some(Tail::Lock(args, t)) => {
                    self.send_lock(q, args, &t);
                    None
                }
                Some(Tail::Dax(args, t)) => {
                    self.serve_dax(&args, &t);
                    None
                }
                tail => tail,
            };
            let n = match sent {
                Outcome::All(n) | Outcome::Stalled(n) => n,
            };
            if let Some((s, k)) = inline.as_mut() {
                if served < *k && n > 0 {
                    served += self.serve_chunk(vring, s, q, &mut chunks, n);
                }
            }
            if let Outcome::Stalled(_) = sent {
                return true;
            }
            if let Some(Tail::Init(args, t)) = tail {
                self.send_init(q, gen, args, t);
            }
        }
    }

    /// The pop stage: pops up to `want` chains into `round`, stopping
    /// after one that does not go into the batch. Returns how many chains
    /// it popped (0: the queue is empty).
    fn pop_round(
        &self,
        vring: &Vring,
        (mem, mem_gen): (&GuestMemoryLoadGuard<GuestMmap>, u64),
        q: RqId,
        gen: u64,
        want: usize,
        round: &mut Round,
    ) -> usize {
        let heads = &self.inner.queue(q).heads;
        // One clock read for the round: its requests' timeouts and
        // latencies count from here.
        let popped_at = Instant::now();
        let mut n = 0;
        while n < want {
            let Some(popped) = self.pop(vring, mem) else {
                break;
            };
            n += 1;
            let chain = match popped {
                Ok(c) if heads.claim(c.head) => c,
                // A head republished while the device still serves it:
                // the guest broke the vring's rules; it gets nothing back.
                Ok(_) => {
                    round.tail = Some(Tail::Malformed(None));
                    break;
                }
                Err((head, _)) => {
                    round.tail = Some(Tail::Malformed(Some(head)));
                    break;
                }
            };
            // Its arguments go onto `round.sends` in place.
            let ticket =
                match self.prepare(vring, (chain, mem_gen), q, gen, popped_at, &mut round.sends) {
                    Ok(t) => t,
                    Err(t) => {
                        round.tail = Some(Tail::Refused(t));
                        break;
                    }
                };
            let op = Opcode::from_u32(ticket.opcode);
            if op.is_some_and(request::changes_host) {
                if let Some((args, _)) = round.sends.last_mut() {
                    args.fence = Some(self.fence_of(q, gen));
                }
            }
            let lock_call = matches!(op, Some(Opcode::Getlk | Opcode::Setlk | Opcode::Setlkw));
            let dax = self.inner.dax.is_some()
                && matches!(op, Some(Opcode::Setupmapping | Opcode::Removemapping));
            if lock_call || dax || op == Some(Opcode::Init) {
                // Not for the batch: taken back off it, as the tail.
                if let Some((args, _)) = round.sends.pop() {
                    round.tail = Some(if lock_call {
                        Tail::Lock(args, ticket)
                    } else if dax {
                        Tail::Dax(args, ticket)
                    } else {
                        Tail::Init(args, ticket)
                    });
                }
                break;
            }
            round.tickets.push(ticket);
        }
        n
    }

    /// The send stage (under `pop_lock`): the round's requests go to the
    /// engine in one batch. Refused for admission, they and the round's
    /// tail go back to the avail ring.
    fn send_round(&self, vring: &Vring, q: RqId, round: &mut Round) -> Outcome {
        let rq = self.inner.queue(q);
        let qs = &self.inner.counters(q);
        let taken = if round.sends.is_empty() {
            0
        } else {
            let chan = self.inner.engine.chan();
            chan.try_send_background_batch(&mut round.sends, &mut round.results)
        };
        let mut failed = Vec::new();
        {
            let mut timeouts = self.inner.timeouts.round();
            for (t, r) in round.tickets.drain(..taken).zip(round.results.drain(..)) {
                match r {
                    Ok(unique) => {
                        t.engine_unique.store(unique, Ordering::Relaxed);
                        if t.opcode == Opcode::Destroy as u32 {
                            // The engine's DESTROY ends it in the
                            // filesystem.
                            self.inner.migration.session_ended();
                        }
                        timeouts.track(t);
                    }
                    // The connection is gone: answered below, outside the
                    // timeouts lock.
                    Err(e) => failed.push((t, e)),
                }
            }
        }
        qs.add_submitted(taken as u64);
        for (t, e) in failed {
            self.inner.stats.add_aborted(1);
            if t.claim() {
                self.answer(&t, e.to_wire(), &[]);
            }
        }
        if round.sends.is_empty() {
            return Outcome::All(taken);
        }
        // Refused for admission: they and the tail go back, last popped
        // first (the refused are the round's last requests).
        let back = round.sends.len() + usize::from(round.tail.is_some());
        {
            let mut v = vring.get_mut();
            let queue = v.get_queue_mut();
            for _ in 0..back {
                queue.go_to_previous_position();
            }
        }
        round.sends.clear();
        for t in round.tickets.drain(..) {
            rq.heads.release(t.chain.head);
        }
        match round.tail.take() {
            Some(Tail::Lock(_, t) | Tail::Init(_, t) | Tail::Dax(_, t) | Tail::Refused(t)) => {
                rq.heads.release(t.chain.head)
            }
            Some(Tail::Malformed(_)) | None => {}
        }
        let stalled = &rq.stalled;
        stalled.store(true, Ordering::SeqCst);
        qs.add_stalls(1);
        // A slot freed between the refusal and the flag would not wake
        // us: look once more.
        let s = self.inner.engine.chan().stats();
        if s.ready && !s.blocked && s.parked == 0 && stalled.swap(false, Ordering::SeqCst) {
            return Outcome::All(taken);
        }
        Outcome::Stalled(taken)
    }

    /// Sends a lock call that ended a round. Lock calls are synchronous
    /// in the kernel, never background: a parked SETLKW must not hold a
    /// background slot (enough of them would keep out the unlock that
    /// frees them). They wait on a thread of their own, which only the
    /// gate holds.
    fn send_lock(&self, q: RqId, args: Args, ticket: &Arc<Ticket>) {
        self.inner.counters(q).add_submitted(1);
        self.inner.timeouts.track(ticket.clone());
        self.send_lock_call(args, ticket);
    }

    /// Sends a guest INIT that ended a round popped in generation `gen`
    /// (no queue lock held): a guest that rebooted sends no DESTROY, so
    /// its INIT ends the old session first. A vring stopped since the pop
    /// gave the INIT up: it then does nothing. INIT is FORCE, so admission
    /// never refuses it.
    fn send_init(&self, q: RqId, gen: u64, args: Args, ticket: Arc<Ticket>) {
        if read(&self.inner.queue(q).gen).n != gen {
            return;
        }
        // The new session starts with an empty DAX window (the device
        // runs: the frontend takes unmaps now).
        if let Some(dax) = &self.inner.dax {
            dax.unmap_all();
        }
        self.end_session("a new INIT");
        // Kept for a live migration: the destination replays it.
        self.inner.migration.note_init(ticket.unique, &args.body);
        let end = EndFn::Shared(ticket.clone());
        self.inner.counters(q).add_submitted(1);
        match self.inner.engine.chan().try_send_background(args, end) {
            Ok(unique) => {
                ticket.engine_unique.store(unique, Ordering::Relaxed);
                self.inner.timeouts.track(ticket);
            }
            Err(TrySendError::Closed(e)) => {
                self.inner.stats.add_aborted(1);
                if ticket.claim() {
                    self.answer(&ticket, e.to_wire(), &[]);
                }
            }
            // FORCE: admission never refuses it.
            Err(TrySendError::Full(_)) => {
                if ticket.claim() {
                    self.answer(&ticket, Errno::EIO.to_wire(), &[]);
                }
            }
        }
    }

    /// Counts a malformed chain (under `pop_lock`): one that could not be
    /// read (`head`) goes back unused, one whose head the device still
    /// serves (None: the guest republished it) gets nothing back.
    fn malformed(
        &self,
        vring: &Vring,
        mem: &GuestMemoryLoadGuard<GuestMmap>,
        q: RqId,
        head: Option<u16>,
    ) {
        self.inner.counters(q).add_malformed(1);
        if let Some(head) = head {
            if !self.inner.queue(q).heads.in_flight(head) {
                // Refused before anything was written to it.
                let used = &self.inner.queue(q).signals.used;
                self.publish(vring, used, mem, head, &[], 0);
                notify(vring, used, Some(mem));
            }
        }
    }

    pub(super) fn pop(
        &self,
        vring: &Vring,
        mem: &GuestMemoryLoadGuard<GuestMmap>,
    ) -> Option<Result<Chain, (u16, ChainError)>> {
        let (head, table, size) = {
            let mut v = vring.get_mut();
            let queue = v.get_queue_mut();
            let head = rings::pop_head(queue, mem)?;
            (head, queue.desc_table(), queue.size())
        };
        let max = u64::from(self.inner.cfg.max_write) + 64 * 1024;
        Some(
            Chain::parse(mem, vm_memory::GuestAddress(table), size, head, max)
                .map_err(|e| (head, e)),
        )
    }

    /// The fence of request queue `q`'s generation `gen` (a closed one if
    /// that generation has ended since).
    fn fence_of(&self, q: RqId, gen: u64) -> Arc<fuse_core::Fence> {
        let g = read(&self.inner.queue(q).gen);
        if g.n == gen {
            return g.fence.clone();
        }
        let f = fuse_core::Fence::new();
        f.close();
        f
    }

    /// Whether queue `q` must stop popping while the engine still holds as
    /// many timed-out requests as the queue has room for (then it is
    /// marked stalled; an end of a request resumes it).
    fn too_many_orphans(&self, q: RqId) -> bool {
        let max = u64::from(self.inner.cfg.queue_size);
        let rq = self.inner.queue(q);
        let orphans = &rq.orphans;
        if orphans.load(Ordering::SeqCst) < max {
            return false;
        }
        let stalled = &rq.stalled;
        stalled.store(true, Ordering::SeqCst);
        self.inner.counters(q).add_stalls(1);
        // One that ended between the look and the flag would not wake us.
        if orphans.load(Ordering::SeqCst) < max && stalled.swap(false, Ordering::SeqCst) {
            return false;
        }
        true
    }
}

/// `vring`'s avail index (its next index when the index cannot be read:
/// nothing to pop).
fn avail_index(vring: &Vring, mem: &GuestMemoryLoadGuard<GuestMmap>) -> u16 {
    let v = vring.get_ref();
    let queue = v.get_queue();
    queue
        .avail_idx(&**mem, Ordering::Acquire)
        .map_or(queue.next_avail(), |idx| idx.0)
}

/// Chains announced up to avail index `end` that are not popped yet (0
/// when the queue's next index is past `end`, or `end` is more than a
/// vring's size ahead of it: a pop would find nothing there).
fn left_before(vring: &Vring, end: u16) -> usize {
    let v = vring.get_ref();
    let queue = v.get_queue();
    let n = end.wrapping_sub(queue.next_avail());
    if n > queue.size() {
        0
    } else {
        usize::from(n)
    }
}
