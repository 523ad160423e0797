//! Answering a guest request: the engine's end callback, and the reply
//! written into the chain and published in the used ring (unless the vring
//! was stopped or reset since the chain was popped).

use super::*;

impl<F: Filesystem + 'static> Finish for Inner<F> {
    fn finish(self: Arc<Self>, t: &Arc<Ticket>, r: ReqResult) {
        FsDevice { inner: self }.finish(t, r);
    }
}

impl<F: Filesystem + 'static> FsDevice<F> {
    /// The engine's answer to a request.
    pub(super) fn finish(&self, t: &Arc<Ticket>, r: ReqResult) {
        if t.orphan.swap(ORPHAN_ENDED, Ordering::SeqCst) == ORPHAN_YES {
            self.inner
                .queue(t.queue)
                .orphans
                .fetch_sub(1, Ordering::SeqCst);
        }
        self.resume_stalled();
        if !t.claim() {
            return;
        }
        match r {
            Ok(reply) => self.answer_with(t, 0, &reply.data, reply.in_client),
            Err(e) => {
                if e == Errno::ENOTCONN {
                    self.inner.stats.add_aborted(1);
                }
                self.answer(t, e.to_wire(), &[])
            }
        }
    }

    /// Wakes every stalled queue: a background slot may have freed.
    fn resume_stalled(&self) {
        for q in &self.inner.queues {
            // Looked at before it is cleared: every request's end comes
            // here, and a swap would take each queue's cache line (shared
            // with the next queue's hot fields) for writing every time.
            // SeqCst, for the stall's recheck handshake in submit_requests.
            if q.stalled.load(Ordering::SeqCst) && q.stalled.swap(false, Ordering::SeqCst) {
                let _ = q.resume.write(1);
            }
        }
    }

    /// Writes the reply into the chain and returns it to the guest, unless
    /// its vring was stopped or reset since the chain was popped.
    pub(super) fn answer(&self, t: &Ticket, error: i32, payload: &[u8]) {
        self.answer_with(t, error, payload, 0);
    }

    /// Returns a chain that cannot carry a reply unused (length 0), unless
    /// its vring was stopped or reset since it was popped.
    pub(super) fn give_back_unanswered(&self, t: &Ticket) {
        let rq = self.inner.queue(t.queue);
        let gen = read(&rq.gen);
        if gen.n != t.gen {
            return;
        }
        rq.heads.release(t.chain.head);
        let used = &rq.signals.used;
        let current = self.memory_since(t);
        let mem = current.as_deref().unwrap_or(t.chain.mem());
        self.publish(&t.vring, used, mem, t.chain.head, t.chain.writable(), 0);
        notify(&t.vring, used, Some(mem));
    }

    /// The guest memory `t`'s answer is published through (its used
    /// element, the dirty marks of its buffers): None while the memory
    /// table is the one its chain was translated in (then the chain's),
    /// else the current one, where the used ring and the log now are.
    fn memory_since(&self, t: &Ticket) -> Option<GuestMemoryLoadGuard<GuestMmap>> {
        if t.mem_gen == self.inner.mem_gen.load(Ordering::SeqCst) {
            None
        } else {
            self.memory()
        }
    }

    /// [`FsDevice::answer`] for a reply whose last `in_guest` payload bytes
    /// the server already put in the guest's buffers (a READ by reference).
    fn answer_with(&self, t: &Ticket, error: i32, payload: &[u8], in_guest: usize) {
        let rq = self.inner.queue(t.queue);
        let gen = read(&rq.gen);
        if gen.n != t.gen {
            self.inner.stats.add_aborted(1);
            return;
        }
        // Given back to the guest below, and free to come again.
        rq.heads.release(t.chain.head);
        let reply_len = OUT_HEADER + payload.len() + in_guest;
        let (error, payload, reply_len) = if reply_len > t.chain.writable_len() {
            (Errno::ERANGE.to_wire(), &[][..], OUT_HEADER)
        } else {
            (error, payload, reply_len)
        };
        let h = OutHeader {
            len: reply_len as u32,
            error,
            unique: t.unique,
        };
        let written = match t.chain.write_all(&[h.as_bytes(), payload]) {
            // The data the server put in the guest's buffers counts too.
            Ok(_) => reply_len as u32,
            Err(_) => 0,
        };
        // From its round's pop (one clock read per round) to now.
        self.inner
            .stats
            .record(t.queue.vq(), t.opcode, error, t.started.elapsed());
        if t.opcode == Opcode::Init as u32 {
            // What a migration replays is the INIT the guest was granted.
            self.inner.migration.init_answered(t.unique, error == 0);
        }
        self.inner.counters(t.queue).add_completed(1);
        // The server may have written the chain's pages by host address
        // (a READ by reference): logged here, before the guest has them.
        let current = self.memory_since(t);
        let mem = current.as_deref().unwrap_or(t.chain.mem());
        let used = &rq.signals.used;
        self.publish(
            &t.vring,
            used,
            mem,
            t.chain.head,
            t.chain.writable(),
            written,
        );
        rq.signals.answered(&t.vring, mem);
    }
}
