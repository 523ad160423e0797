//! A vring's avail and used rings, read and written by the device itself
//! through one slice of the memory region that holds each ring
//! (virtio-queue's `pop_descriptor_chain` and `add_used` walk vm-memory's
//! generic ranged access two and three times per chain). The rules are
//! the split virtqueue's, as virtio-queue keeps them:
//! - a head is popped when the avail index (read with Acquire) is past
//!   the queue's `next_avail`, from the ring entry it points at (Acquire);
//! - a used element is written before the used index is stored
//!   (Release), and the queue's `next_used` moves on with it;
//! - with VIRTIO_RING_F_EVENT_IDX the guest is signalled when the used
//!   index passed its `used_event` since the last decision. That needs
//!   the count of elements published since it (virtio-queue's private
//!   `num_added`), so the decision is made here too
//!   ([`Used::needs_notification`]).
//!
//! All of it runs under the vring's write lock. A ring that is not in one
//! region falls back to vm-memory's ranged access.

use super::{GuestMmap, Vring};
use std::num::Wrapping;
use std::sync::atomic::{fence, AtomicU16, Ordering};
use vhost_user_backend::VringT;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

/// Bytes before either ring's entries (flags, idx).
const RING_HEADER: u64 = 4;
/// One used element (id, len).
const USED_ELEM: u64 = 8;

/// One vring's used-ring bookkeeping.
#[derive(Debug, Default)]
pub(super) struct Used {
    /// Elements published since the last [`Used::needs_notification`]
    /// (wrapping). Changed only under the vring's write lock; atomic so
    /// the owner can be shared.
    unsignalled: AtomicU16,
}

impl Used {
    /// Adds the used element (`head`, `len`) to `vring`'s used ring in
    /// `mem` and moves the used index on. False if `head` is not a
    /// descriptor index of the queue or the ring is not in `mem`
    /// (nothing is published then).
    pub(super) fn add(&self, vring: &Vring, mem: &GuestMmap, head: u16, len: u32) -> bool {
        let mut v = vring.get_mut();
        let q = v.get_queue_mut();
        let size = q.size();
        if size == 0 || head >= size {
            return false;
        }
        let next = Wrapping(q.next_used());
        let ring = GuestAddress(q.used_ring());
        let slot = u64::from(next.0 % size);
        let mut elem = [0u8; USED_ELEM as usize];
        elem[..4].copy_from_slice(&u32::from(head).to_le_bytes());
        elem[4..].copy_from_slice(&len.to_le_bytes());
        let idx = (next + Wrapping(1)).0.to_le();
        let ring_bytes = RING_HEADER + USED_ELEM * u64::from(size);
        let written = match mem.get_slice(ring, ring_bytes as usize) {
            // The whole ring in one region (always, in practice): one
            // lookup; the slice's writes log themselves dirty.
            Ok(s) => {
                let at = (RING_HEADER + USED_ELEM * slot) as usize;
                s.write_slice(&elem, at).is_ok() && s.store(idx, 2, Ordering::Release).is_ok()
            }
            // Across regions: vm-memory's ranged access, as virtio-queue.
            Err(_) => {
                let Some(at) = ring.0.checked_add(RING_HEADER + USED_ELEM * slot) else {
                    return false;
                };
                mem.write_slice(&elem, GuestAddress(at)).is_ok()
                    && mem
                        .store(idx, GuestAddress(ring.0 + 2), Ordering::Release)
                        .is_ok()
            }
        };
        if written {
            q.set_next_used((next + Wrapping(1)).0);
            let n = self.unsignalled.load(Ordering::Relaxed);
            self.unsignalled.store(n.wrapping_add(1), Ordering::Relaxed);
        }
        written
    }

    /// Forgets the elements published so far (the guest is signalled
    /// without a look at its wish).
    pub(super) fn forget_unsignalled(&self, vring: &Vring) {
        let _v = vring.get_mut();
        self.unsignalled.store(0, Ordering::Relaxed);
    }

    /// Whether the guest wants to hear of the elements published since
    /// the last call: always without EVENT_IDX; with it, when the used
    /// index passed the guest's `used_event` meanwhile (true too when
    /// `used_event` cannot be read).
    pub(super) fn needs_notification(&self, vring: &Vring, mem: &GuestMmap) -> bool {
        let v = vring.get_mut();
        let q = v.get_queue();
        if !q.event_idx_enabled() {
            self.unsignalled.store(0, Ordering::Relaxed);
            return true;
        }
        let used_idx = Wrapping(q.next_used());
        // The used index is stored before `used_event` is read.
        fence(Ordering::SeqCst);
        let at = q
            .avail_ring()
            .checked_add(RING_HEADER + 2 * u64::from(q.size()));
        let Some(Ok(event)) = at.map(|a| mem.load::<u16>(GuestAddress(a), Ordering::Relaxed))
        else {
            return true;
        };
        let event = Wrapping(u16::from_le(event));
        let added = Wrapping(self.unsignalled.swap(0, Ordering::Relaxed));
        let old = used_idx - added;
        used_idx - event - Wrapping(1) < used_idx - old
    }
}

/// Pops the next head the guest made available on `q`, in `mem` (None:
/// none, the queue is not set up, or the avail index is more than the
/// queue's size ahead). The head is not checked against
/// the queue's size: walking its chain does that.
pub(super) fn pop_head(q: &mut Queue, mem: &GuestMmap) -> Option<u16> {
    let (size, ring) = (q.size(), q.avail_ring());
    if !q.ready() || ring == 0 || size == 0 {
        return None;
    }
    let next = q.next_avail();
    let bytes = RING_HEADER + 2 * u64::from(size);
    let head = match mem.get_slice(GuestAddress(ring), bytes as usize) {
        Ok(s) => {
            let avail = u16::from_le(s.load::<u16>(2, Ordering::Acquire).ok()?);
            // More than a ring's worth ahead: the guest broke the rules
            // (virtio-queue refuses it too), and nothing is popped.
            if avail == next || avail.wrapping_sub(next) > size {
                return None;
            }
            let at = RING_HEADER as usize + 2 * usize::from(next % size);
            u16::from_le(s.load::<u16>(at, Ordering::Acquire).ok()?)
        }
        // Across regions: virtio-queue's own pop.
        Err(_) => return q.pop_descriptor_chain(mem).map(|c| c.head_index()),
    };
    q.set_next_avail(next.wrapping_add(1));
    Some(head)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::GuestMem;
    use fuse_core::testing::rng::Rng;
    use virtio_queue::Queue;
    use vm_memory::{GuestAddressSpace, GuestMemoryAtomic};

    const SIZE: u16 = 8;
    const DESC: u64 = 0x1000;
    const AVAIL: u64 = 0x2000;
    const USED: u64 = 0x3000;
    const RING_BYTES: usize = (RING_HEADER + USED_ELEM * SIZE as u64) as usize;
    /// Where guest memory is split in two regions, in [`split_memory`].
    const EDGE: u64 = 0x4000;

    fn memory() -> GuestMem {
        GuestMemoryAtomic::new(GuestMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap())
    }

    fn split_memory() -> GuestMem {
        GuestMemoryAtomic::new(
            GuestMmap::from_ranges(&[
                (GuestAddress(0), EDGE as usize),
                (GuestAddress(EDGE), 0x10000 - EDGE as usize),
            ])
            .unwrap(),
        )
    }

    /// A ready vring of [`SIZE`] on `mem`, its used ring at `used_at`.
    fn vring(mem: &GuestMem, used_at: u64, event_idx: bool) -> Vring {
        let vring = Vring::new(mem.clone(), SIZE).unwrap();
        vring.set_queue_info(DESC, AVAIL, used_at).unwrap();
        vring.set_queue_size(SIZE);
        vring.set_queue_event_idx(event_idx);
        vring.set_queue_ready(true);
        vring
    }

    /// A ready virtio-queue `Queue` of [`SIZE`] with its rings there.
    fn queue(avail_at: u64, used_at: u64, event_idx: bool) -> Queue {
        let mut q = Queue::new(SIZE).unwrap();
        q.set_desc_table_address(Some(DESC as u32), Some(0));
        q.set_avail_ring_address(Some(avail_at as u32), Some(0));
        q.set_used_ring_address(Some(used_at as u32), Some(0));
        q.set_event_idx(event_idx);
        q.set_ready(true);
        q
    }

    /// The same steps on [`Used`] and on virtio-queue's own `Queue`, each
    /// on its own guest memory, give the same used rings, the same
    /// `next_used` and the same notification decisions, with EVENT_IDX
    /// and without.
    #[test]
    fn publishes_and_decides_as_virtio_queue_does() {
        same_as_virtio_queue(memory, USED);
    }

    /// So does a used ring across two memory regions, with an element
    /// across them too (vm-memory's ranged access then).
    #[test]
    fn a_ring_across_regions_is_published_as_virtio_queue_does() {
        same_as_virtio_queue(split_memory, EDGE - 8);
    }

    fn same_as_virtio_queue(memory: fn() -> GuestMem, used_at: u64) {
        for event_idx in [true, false] {
            let (ours_mem, theirs_mem) = (memory(), memory());
            let vring = vring(&ours_mem, used_at, event_idx);
            let mut theirs = queue(AVAIL, used_at, event_idx);
            let used = Used::default();
            let (om, tm) = (ours_mem.memory(), theirs_mem.memory());
            let event_at = GuestAddress(AVAIL + RING_HEADER + 2 * u64::from(SIZE));
            let mut rng = Rng::new(0x05ed);
            let (mut wanted, mut not_wanted) = (0, 0);
            let same_rings = || {
                let (mut a, mut b) = ([0u8; RING_BYTES], [0u8; RING_BYTES]);
                om.read_slice(&mut a, GuestAddress(used_at)).unwrap();
                tm.read_slice(&mut b, GuestAddress(used_at)).unwrap();
                a == b
            };
            // Past a wrap of the 16-bit index.
            for step in 0..70_000u32 {
                match rng.below(4) {
                    0 | 1 => {
                        let head = rng.below(u64::from(SIZE)) as u16;
                        let len = rng.next_u64() as u32;
                        assert!(used.add(&vring, &om, head, len));
                        theirs.add_used(&*tm, head, len).unwrap();
                        assert!(same_rings(), "step {step}");
                    }
                    2 => {
                        // The guest moves its used_event near the index.
                        let idx = theirs.next_used();
                        let ev = idx.wrapping_add(rng.below(6) as u16).wrapping_sub(3);
                        om.write_obj(ev.to_le(), event_at).unwrap();
                        tm.write_obj(ev.to_le(), event_at).unwrap();
                    }
                    _ => {
                        let ours = used.needs_notification(&vring, &om);
                        assert_eq!(
                            ours,
                            theirs.needs_notification(&*tm).unwrap(),
                            "step {step}"
                        );
                        wanted += usize::from(ours);
                        not_wanted += usize::from(!ours);
                    }
                }
                assert_eq!(vring.get_ref().get_queue().next_used(), theirs.next_used());
            }
            // Both kinds of decision were taken (without EVENT_IDX every
            // look wants a signal).
            assert!(wanted > 100, "{wanted}");
            assert_eq!(not_wanted > 100, event_idx, "{not_wanted}");
        }
    }

    /// Heads popped here and by virtio-queue's `pop_descriptor_chain`
    /// from the same avail rings are the same, in one region and across
    /// two; neither pops past the avail index, nor at all while the index
    /// is more than a ring ahead.
    #[test]
    fn pops_heads_as_virtio_queue_does() {
        for (memory, avail_at) in [
            (memory as fn() -> GuestMem, AVAIL),
            (split_memory, EDGE - 6),
        ] {
            let (ours_mem, theirs_mem) = (memory(), memory());
            let (om, tm) = (ours_mem.memory(), theirs_mem.memory());
            let mut ours = queue(avail_at, USED, false);
            let mut theirs = queue(avail_at, USED, false);
            let mut rng = Rng::new(0xa7a1);
            let mut avail = 0u16;
            let mut popped = 0;
            for _ in 0..70_000u32 {
                let ahead = avail.wrapping_sub(theirs.next_avail());
                if rng.below(50) == 0 {
                    // A hostile avail index, more than a ring ahead:
                    // neither pops; then the true one is back.
                    let bogus = theirs
                        .next_avail()
                        .wrapping_add(SIZE + 1 + rng.below(1000) as u16);
                    for m in [&om, &tm] {
                        m.write_obj(bogus.to_le(), GuestAddress(avail_at + 2))
                            .unwrap();
                    }
                    assert_eq!(pop_head(&mut ours, &om), None);
                    assert!(theirs.pop_descriptor_chain(&*tm).is_none());
                    for m in [&om, &tm] {
                        m.write_obj(avail.to_le(), GuestAddress(avail_at + 2))
                            .unwrap();
                    }
                } else if ahead < SIZE && rng.below(2) == 0 {
                    // The guest offers a head (any value) and moves on.
                    let slot = u64::from(avail % SIZE);
                    let head = rng.next_u64() as u16;
                    let at = GuestAddress(avail_at + RING_HEADER + 2 * slot);
                    avail = avail.wrapping_add(1);
                    for m in [&om, &tm] {
                        m.write_obj(head.to_le(), at).unwrap();
                        m.write_obj(avail.to_le(), GuestAddress(avail_at + 2))
                            .unwrap();
                    }
                } else {
                    let a = pop_head(&mut ours, &om);
                    let b = theirs.pop_descriptor_chain(&*tm).map(|c| c.head_index());
                    assert_eq!(a, b);
                    popped += usize::from(a.is_some());
                }
                assert_eq!(ours.next_avail(), theirs.next_avail());
            }
            assert!(popped > 1000, "{popped}");
        }
    }

    /// A queue that is not ready (a stop marked it) or has no avail ring
    /// yet pops nothing, whatever the guest announced.
    #[test]
    fn a_queue_not_ready_pops_nothing() {
        let m = memory();
        let mem = m.memory();
        let mut q = Queue::new(SIZE).unwrap();
        q.set_desc_table_address(Some(DESC as u32), Some(0));
        q.set_used_ring_address(Some(USED as u32), Some(0));
        mem.write_obj(3u16.to_le(), GuestAddress(AVAIL + 2))
            .unwrap();
        q.set_ready(true);
        // No avail ring address yet.
        assert_eq!(pop_head(&mut q, &mem), None);
        q.set_avail_ring_address(Some(AVAIL as u32), Some(0));
        q.set_ready(false);
        assert_eq!(pop_head(&mut q, &mem), None);
        q.set_ready(true);
        assert_eq!(pop_head(&mut q, &mem), Some(0));
        assert_eq!(q.next_avail(), 1);
    }

    /// A head past the queue's size, or a ring outside guest memory,
    /// publishes nothing and leaves the index where it was.
    #[test]
    fn a_bad_head_or_ring_publishes_nothing() {
        let mem = memory();
        let vring = vring(&mem, USED, false);
        let m = mem.memory();
        let used = Used::default();
        assert!(!used.add(&vring, &m, SIZE, 1));
        assert_eq!(vring.get_ref().get_queue().next_used(), 0);
        vring.set_queue_info(DESC, AVAIL, 0x10000 - 4).unwrap();
        assert!(!used.add(&vring, &m, 0, 1));
        assert_eq!(vring.get_ref().get_queue().next_used(), 0);
    }
}
