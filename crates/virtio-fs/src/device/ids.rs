//! How the device's queues are numbered, in one place. Virtqueue 0 is the
//! hiprio queue; virtqueues 1..=N are the request queues. Request queue `i`
//! (0-based, an [`RqId`]) is virtqueue `i + 1`, served by vring thread
//! `i`, and maps to the engine's ring queue `i`; vring thread 0 serves the
//! hiprio queue too (its vrings: hiprio, then request queue 0), so a
//! guest's FORGET and the requests of the same kick cost one wake-up.
//! Every function that needs the size of the device takes `count`, the
//! number of request queues.

/// Virtqueue index of the hiprio queue (also its counters in
/// `DeviceStats::queues`); vring thread 0 serves it.
pub(super) const HIPRIO: usize = 0;

/// A request queue, by its 0-based number among the request queues. Made
/// only for a queue the device has (so it indexes `Inner::queues`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RqId(u16);

impl RqId {
    /// Request queue `i` (0-based) of a device with `count` of them.
    pub(super) fn from_index(i: usize, count: usize) -> Option<RqId> {
        if i < count {
            u16::try_from(i).ok().map(RqId)
        } else {
            None
        }
    }

    /// The request queue on virtqueue `vq` of a device with `count` request
    /// queues (None for hiprio, and past the last).
    pub(super) fn from_vq(vq: usize, count: usize) -> Option<RqId> {
        RqId::from_index(vq.checked_sub(1)?, count)
    }

    /// Every request queue of a device with `count` of them.
    pub(super) fn all(count: usize) -> impl Iterator<Item = RqId> {
        (0..count).filter_map(move |i| RqId::from_index(i, count))
    }

    /// Its place in `Inner::queues`.
    pub(super) fn index(self) -> usize {
        usize::from(self.0)
    }

    /// Its virtqueue index: also its counters in `DeviceStats::queues`.
    pub(super) fn vq(self) -> usize {
        self.index() + 1
    }

    /// Its vring thread (vhost-user-backend's thread index).
    pub(super) fn thread(self) -> usize {
        self.index()
    }

    /// The engine ring queue it maps to.
    pub(super) fn ring_queue(self) -> u16 {
        self.0
    }

    /// The device event that resumes it after a stall (its resume eventfd,
    /// registered with its vring thread), on a device with `count` request
    /// queues: after the kicks of all `count + 1` virtqueues and the one
    /// event vhost-user-backend keeps for itself.
    pub(super) fn resume_event(self, count: usize) -> u64 {
        (count + 2 + self.index()) as u64
    }

    /// The device event of its vring thread's io_uring completions (that
    /// io_uring's eventfd, registered once the thread has one).
    pub(super) fn completion_event(self, count: usize) -> u64 {
        // After the resume events of all `count` request queues.
        (2 * count + 2 + self.index()) as u64
    }
}

/// A virtqueue of the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Vq {
    /// Virtqueue 0: FORGET, BATCH_FORGET, INTERRUPT.
    Hiprio,
    /// A request queue.
    Request(RqId),
}

impl From<RqId> for Vq {
    fn from(q: RqId) -> Vq {
        Vq::Request(q)
    }
}

impl Vq {
    /// Virtqueue `vq` of a device with `count` request queues.
    #[cfg(test)]
    pub(super) fn from_index(vq: usize, count: usize) -> Option<Vq> {
        if vq == HIPRIO {
            Some(Vq::Hiprio)
        } else {
            RqId::from_vq(vq, count).map(Vq::Request)
        }
    }

    /// Its virtqueue index.
    pub(super) fn index(self) -> usize {
        match self {
            Vq::Hiprio => HIPRIO,
            Vq::Request(id) => id.vq(),
        }
    }

    /// The virtqueue whose kick is device event `ev` of vring thread
    /// `thread` (its vrings are numbered from 0 in virtqueue order).
    pub(super) fn of_kick(thread: usize, ev: usize, count: usize) -> Option<Vq> {
        match (thread, ev) {
            (0, 0) => Some(Vq::Hiprio),
            (0, 1) => RqId::from_index(0, count).map(Vq::Request),
            (t, 0) => RqId::from_index(t, count).map(Vq::Request),
            _ => None,
        }
    }

    /// Its kick's device event (its place among its thread's vrings):
    /// [`Vq::of_kick`] backwards.
    pub(super) fn kick_event(self) -> usize {
        match self {
            Vq::Request(id) if id.index() == 0 => 1,
            _ => 0,
        }
    }

    /// What each vring thread serves, as virtqueue bit masks
    /// (`VhostUserBackend::queues_per_thread`); [`Vq::of_kick`] reads
    /// them back.
    pub(super) fn threads(count: usize) -> Vec<u64> {
        (0..count.max(1))
            .map(|t| if t == 0 { 0b11 } else { 1u64 << (t + 1) })
            .collect()
    }
}

/// What a device event handed to a vring thread is, beside the kicks of its
/// own vring (vhost-user-backend numbers a thread's vrings from 0 and
/// leaves the events past `num_queues` to the backend).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Event {
    /// The thread's vring number `.0` (among its own) was kicked.
    Kick(usize),
    /// A stalled request queue may go on ([`RqId::resume_event`]).
    Resume(RqId),
    /// A request queue's thread has io_uring completions
    /// ([`RqId::completion_event`]).
    Completions(RqId),
    /// Nothing the device registered.
    Other,
}

impl Event {
    /// The event `ev` of a device with `count` request queues.
    pub(super) fn decode(ev: u16, count: usize) -> Event {
        let ev = usize::from(ev);
        let num_queues = count + 1;
        if ev < num_queues {
            return Event::Kick(ev);
        }
        let Some(i) = ev.checked_sub(num_queues + 1) else {
            return Event::Other;
        };
        if let Some(id) = RqId::from_index(i, count) {
            return Event::Resume(id);
        }
        match RqId::from_index(i - count, count) {
            Some(id) => Event::Completions(id),
            None => Event::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_queue_numbers_and_events_agree() {
        let count = 3;
        let num_queues = count + 1;
        assert_eq!(RqId::from_vq(HIPRIO, count), None);
        assert_eq!(RqId::from_vq(count + 1, count), None);
        assert_eq!(Vq::from_index(HIPRIO, count), Some(Vq::Hiprio));
        assert_eq!(Vq::from_index(count + 1, count), None);
        let ids: Vec<RqId> = RqId::all(count).collect();
        assert_eq!(ids.len(), count);
        for (i, id) in ids.into_iter().enumerate() {
            assert_eq!(RqId::from_vq(i + 1, count), Some(id));
            assert_eq!(Vq::from_index(i + 1, count).map(Vq::index), Some(i + 1));
            assert_eq!((id.vq(), id.ring_queue()), (i + 1, i as u16));
            let ev = |e: u64| Event::decode(u16::try_from(e).unwrap(), count);
            assert_eq!(ev(id.resume_event(count)), Event::Resume(id));
            assert_eq!(ev(id.completion_event(count)), Event::Completions(id));
        }
        for ev in 0..num_queues {
            assert_eq!(Event::decode(ev as u16, count), Event::Kick(ev));
        }
        assert_eq!(Event::decode(num_queues as u16, count), Event::Other);
        assert_eq!(Event::decode((3 * num_queues) as u16, count), Event::Other);
    }

    #[test]
    fn each_virtqueue_is_served_by_one_thread_in_the_order_its_kicks_come() {
        for count in 1..=8 {
            let mut seen = Vec::new();
            for (t, mask) in Vq::threads(count).into_iter().enumerate() {
                // vhost-user-backend numbers a thread's vrings (and their
                // kick events) by ascending virtqueue index.
                let vqs: Vec<usize> = (0..64).filter(|b| mask & (1 << b) != 0).collect();
                for (ev, &vq) in vqs.iter().enumerate() {
                    assert_eq!(Vq::of_kick(t, ev, count).map(Vq::index), Some(vq));
                    assert_eq!(Vq::from_index(vq, count).map(Vq::kick_event), Some(ev));
                    if let Some(Vq::Request(id)) = Vq::from_index(vq, count) {
                        assert_eq!(id.thread(), t);
                    }
                    seen.push(vq);
                }
                assert_eq!(Vq::of_kick(t, vqs.len(), count), None);
            }
            seen.sort_unstable();
            assert_eq!(seen, (0..=count).collect::<Vec<_>>(), "{count} queues");
        }
    }
}
