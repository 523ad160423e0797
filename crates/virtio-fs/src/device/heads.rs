//! The heads of a request queue's chains in flight.
//!
//! A chain's head index names it in the used ring, and a driver may
//! publish a head again only after the device gave it back. A guest that
//! republishes a head still in flight (without end, if it likes) would
//! otherwise make the device serve the same buffers twice at once and
//! queue unbounded work; with this set, the device refuses such a head
//! (it is dropped, counted as malformed, never answered), so the requests
//! in flight on a queue never outnumber its size.
//!
//! Guarded by its own mutex, a leaf lock; taken when a chain is popped
//! and when it is answered (under the queue's generation read lock, so a
//! vring stop, which clears the set under the write lock, never races an
//! answer of the old vring).

use fuse_core::locks::lock;
use std::sync::Mutex;

/// One bit per possible head index (a u16).
#[derive(Debug)]
pub(super) struct Heads(Mutex<Vec<u64>>);

impl Default for Heads {
    fn default() -> Self {
        Heads(Mutex::new(vec![0; (1 << 16) / 64]))
    }
}

impl Heads {
    fn bits(&self) -> std::sync::MutexGuard<'_, Vec<u64>> {
        lock(&self.0)
    }

    /// Marks `head` in flight; false if it already was.
    pub(super) fn claim(&self, head: u16) -> bool {
        let (w, b) = (usize::from(head) / 64, 1u64 << (head % 64));
        let mut bits = self.bits();
        let fresh = bits[w] & b == 0;
        bits[w] |= b;
        fresh
    }

    /// Whether `head` is in flight.
    pub(super) fn in_flight(&self, head: u16) -> bool {
        let (w, b) = (usize::from(head) / 64, 1u64 << (head % 64));
        self.bits()[w] & b != 0
    }

    /// `head` is given back (or was never taken after all).
    pub(super) fn release(&self, head: u16) {
        let (w, b) = (usize::from(head) / 64, 1u64 << (head % 64));
        self.bits()[w] &= !b;
    }

    /// The frontend took the vring back: nothing of it is in flight.
    pub(super) fn clear(&self) {
        self.bits().fill(0);
    }

    /// Heads in flight.
    pub(super) fn count(&self) -> usize {
        self.bits().iter().map(|w| w.count_ones() as usize).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_is_claimed_once_until_released() {
        let h = Heads::default();
        assert!(h.claim(7));
        assert!(!h.claim(7), "in flight");
        assert!(h.claim(65535));
        assert_eq!(h.count(), 2);
        h.release(7);
        assert!(!h.in_flight(7));
        assert!(h.claim(7));
        h.clear();
        assert_eq!(h.count(), 0);
    }
}
