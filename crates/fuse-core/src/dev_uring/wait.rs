//! Waiting on several entries at once: a server thread that owns more than
//! one entry of a queue (because one of its requests is parked) waits until
//! any of them holds a request, or until its own condition (a parked
//! request was answered) holds. This is what a thread does with the CQEs of
//! several COMMIT_AND_FETCH commands on the kernel's ring.

use super::{EntHandle, EntState, Fetched, Ring};
use crate::chan::Errno;
use crate::sync::{lock, wait, Arc, Condvar};

impl Ring {
    /// Waits (guarded by the queue's lock) until one of `entries()` holds a
    /// request, which it hands over, or `ready()` holds (None). Both
    /// closures are evaluated under the queue lock, so a condition set
    /// before [`Ring::wake`] is never missed.
    pub(super) fn fetch_any(
        self: &Arc<Self>,
        qid: u16,
        entries: &dyn Fn() -> Vec<EntHandle>,
        ready: &dyn Fn() -> bool,
    ) -> Result<Option<Fetched>, Errno> {
        let qi = self.qidx(qid)?;
        let found = {
            let mut q = lock(&self.queues[qi]);
            loop {
                if ready() {
                    return Ok(None);
                }
                let ents = entries();
                if q.stopped {
                    for h in ents.iter().filter(|h| h.qid == qid) {
                        if q.ents.get(h.ent as usize).map(|e| e.state) == Some(EntState::Available)
                        {
                            q.retire(h.ent);
                        }
                    }
                    return Err(Errno::ENOTCONN);
                }
                let hit = ents.iter().copied().find(|h| {
                    h.qid == qid
                        && q.ents
                            .get(h.ent as usize)
                            .is_some_and(|e| e.state == EntState::FuseReq && !e.copying)
                });
                if let Some(h) = hit {
                    break h;
                }
                // Sleep on a condvar of our own, registered for our entries
                // (and woken by `wake` and by the queue stopping).
                let cv = Arc::new(Condvar::new());
                let mine = ents.iter().filter(|h| h.qid == qid).map(|h| h.ent);
                let base = q.sleepers.len();
                q.sleepers.extend(mine.map(|e| (e, cv.clone())));
                if q.sleepers.len() == base {
                    // No entry of ours here: only `wake` or a stop helps.
                    q.sleepers.push((u32::MAX, cv.clone()));
                }
                q = wait(&cv, q);
                q.sleepers.retain(|(_, c)| !Arc::ptr_eq(c, &cv));
            }
        };
        // Only the owner fetches its entries, so the request is still there.
        self.fetch(found, false)
    }

    /// Wakes every thread waiting on queue `qid` (to re-check `ready`).
    pub(super) fn wake(&self, qid: u16) {
        if let Ok(qi) = self.qidx(qid) {
            let q = lock(&self.queues[qi]);
            q.wake_sleepers();
            q.notify_cv(&self.cvs[qi]);
        }
    }
}
