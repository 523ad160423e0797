//! The hiprio queue (virtqueue 0): FORGET and BATCH_FORGET go to the
//! engine, the guest's INTERRUPT to the lock call it names. Nothing on it
//! gets a reply, so each chain is given back as it is taken.

use super::*;

/// Most forgets the engine holds for the server: past it the hiprio
/// thread takes no more chains until the server has taken half of them
/// (FORGET has no reply, so nothing else would slow a guest that sends
/// them faster than the server takes them). 64 Ki forgets, 1 MiB.
const FORGETS_HIGH: usize = 1 << 16;

impl<F: Filesystem + 'static> FsDevice<F> {
    /// Waits while the engine holds more than [`FORGETS_HIGH`] forgets
    /// for the server, until it holds half as many. False if the device is
    /// going away meanwhile (the hiprio thread's exit event was raised).
    fn wait_for_forget_room(&self) -> bool {
        let chan = self.inner.engine.chan();
        if chan.forgets_queued() <= FORGETS_HIGH {
            return true;
        }
        self.inner
            .stats
            .forget_waits
            .fetch_add(1, Ordering::Relaxed);
        while chan.forgets_queued() > FORGETS_HIGH / 2 {
            if self.inner.stop.load(Ordering::Relaxed) || !chan.is_connected() {
                return false;
            }
            let exit = lock(&self.inner.exit_fds)
                .iter()
                .rev()
                .find(|(t, _)| *t == 0)
                .map(|(_, l)| l.raised(1));
            match exit {
                Some(true) => return false,
                Some(false) => {}
                None => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        true
    }

    pub(super) fn drain_hiprio(&self, vring: &Vring) {
        let Some(mem) = self.memory() else { return };
        let qs = &self.inner.stats.queues[HIPRIO];
        let mut used = false;
        while self.wait_for_forget_room() {
            let Some(popped) = self.pop(vring, &mem) else {
                break;
            };
            used = true;
            let chain = match popped {
                Ok(c) => c,
                Err((head, _)) => {
                    qs.malformed.fetch_add(1, Ordering::Relaxed);
                    self.publish(vring, &mem, head, &[], 0);
                    continue;
                }
            };
            qs.submitted.fetch_add(1, Ordering::Relaxed);
            self.forget(&chain);
            qs.completed.fetch_add(1, Ordering::Relaxed);
            self.publish(vring, &mem, chain.head, chain.writable(), 0);
        }
        if used {
            notify(vring);
        }
    }

    /// FORGET and BATCH_FORGET go to the engine; INTERRUPT (which Linux's
    /// virtio-fs does not send today) to the lock call it names; anything
    /// else is dropped and counted as malformed.
    fn forget(&self, chain: &Chain) {
        let len = chain.readable_len().min(1 << 20);
        let mut buf = vec![0u8; len];
        if chain.read_at(0, &mut buf).is_err() {
            return;
        }
        let Ok((h, rest)) = InHeader::read_from_prefix(&buf) else {
            return;
        };
        let chan = self.inner.engine.chan();
        match Opcode::from_u32(h.opcode) {
            Some(Opcode::Forget) => {
                if let Ok((f, _)) = ForgetIn::read_from_prefix(rest) {
                    chan.send_forget(h.nodeid, f.nlookup);
                }
            }
            Some(Opcode::BatchForget) => {
                let Ok((b, rest)) = BatchForgetIn::read_from_prefix(rest) else {
                    return;
                };
                let n = (b.count as usize).min(rest.len() / std::mem::size_of::<ForgetOne>());
                if let Ok((list, _)) = <[ForgetOne]>::ref_from_prefix_with_elems(rest, n) {
                    chan.send_forgets(list);
                }
            }
            Some(Opcode::Interrupt) => {
                if let Ok((i, _)) = InterruptIn::read_from_prefix(rest) {
                    self.interrupt_waiter(i.unique);
                }
            }
            _ => {
                self.inner.stats.queues[HIPRIO]
                    .malformed
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
