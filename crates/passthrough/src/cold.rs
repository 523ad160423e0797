//! Whether a handle's READs lately found nothing in the page cache, so
//! the next ones skip the synchronous preadv2(RWF_NOWAIT) and are started
//! on the serving loop's ring at once (the ring tries the page cache
//! itself when it takes the read, so a read skipped wrongly is still
//! answered from the cache, at the ring's cost).
//!
//! A cached read answered by preadv2 costs less than one started on the
//! ring, but a read of uncached data pays for both: the failed preadv2 (a
//! system call and a page-cache walk, which also starts the disk read)
//! and the ring's read after it. A skipped read's disk read starts when
//! the ring's submission takes it instead (`--submit-batch` started
//! requests at most after its pop, or at the end of the round). After
//! [`MISS_RUN`] misses in a row a handle skips preadv2 for its next
//! [`FIRST_SKIP`] reads; the read after a skip tries again, and a miss
//! there skips twice as many (up to [`MAX_SKIP`]). A read that finds any
//! of its data cached ends the skipping. The counts are hints shared by
//! every thread that reads the handle and moved without a lock: threads
//! racing may double a skip more than once or restore one a hit just
//! ended (a warm handle then sends at most [`MAX_SKIP`] reads to the
//! ring), never more, and never change an answer.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

/// Misses in a row (with no skipping before) that start skipping.
const MISS_RUN: u32 = 4;
/// Reads skipped after the first run of misses.
const FIRST_SKIP: u32 = 8;
/// The most reads skipped before preadv2 is tried again: a file that
/// turned cached is read through the ring for at most this many reads.
const MAX_SKIP: u32 = 128;

/// A handle's recent misses (see the module's comment).
#[derive(Debug, Default)]
pub(crate) struct ColdHint {
    /// Misses in a row while not skipping.
    misses: AtomicU32,
    /// Reads left to skip.
    skip: AtomicU32,
    /// How many the last skip was (0: not skipping since the last hit).
    run: AtomicU32,
}

impl ColdHint {
    /// Whether the next read tries the page cache synchronously (false:
    /// it is one of the reads skipped).
    pub(crate) fn try_cache(&self) -> bool {
        if self.skip.load(Relaxed) == 0 {
            return true;
        }
        // Another thread may take the last one meanwhile: this read then
        // skips too.
        let _ = self
            .skip
            .fetch_update(Relaxed, Relaxed, |s| s.checked_sub(1));
        false
    }

    /// A synchronous try found data cached. Costs loads only while the
    /// handle's reads keep finding it.
    pub(crate) fn hit(&self) {
        if self.misses.load(Relaxed) != 0 {
            self.misses.store(0, Relaxed);
        }
        if self.run.load(Relaxed) != 0 {
            self.run.store(0, Relaxed);
            self.skip.store(0, Relaxed);
        }
    }

    /// A synchronous try found nothing cached.
    pub(crate) fn miss(&self) {
        let run = self.run.load(Relaxed);
        let next = if run != 0 {
            // The try after a skip: still cold.
            (run * 2).min(MAX_SKIP)
        } else if self.misses.fetch_add(1, Relaxed) + 1 >= MISS_RUN {
            self.misses.store(0, Relaxed);
            FIRST_SKIP
        } else {
            return;
        };
        self.run.store(next, Relaxed);
        self.skip.store(next, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads until one tries the cache; returns how many were skipped.
    fn skipped(h: &ColdHint) -> u32 {
        let mut n = 0;
        while !h.try_cache() {
            n += 1;
            assert!(n <= MAX_SKIP, "skipping never ends");
        }
        n
    }

    #[test]
    fn a_run_of_misses_skips_and_each_cold_try_doubles_the_skip() {
        let h = ColdHint::default();
        for _ in 0..MISS_RUN - 1 {
            assert!(h.try_cache());
            h.miss();
        }
        assert_eq!(skipped(&h), 0, "fewer misses than a run");
        h.miss();
        assert_eq!(skipped(&h), FIRST_SKIP);
        h.miss();
        assert_eq!(skipped(&h), 2 * FIRST_SKIP);
        for _ in 0..10 {
            h.miss();
        }
        assert_eq!(skipped(&h), MAX_SKIP, "never past the most");
    }

    #[test]
    fn a_hit_ends_skipping_and_the_run_starts_over() {
        let h = ColdHint::default();
        for _ in 0..MISS_RUN {
            h.miss();
        }
        assert!(!h.try_cache());
        h.hit();
        assert_eq!(skipped(&h), 0, "a hit elsewhere ends the skip at once");
        for _ in 0..MISS_RUN - 1 {
            h.miss();
        }
        assert_eq!(skipped(&h), 0);
        h.miss();
        assert_eq!(skipped(&h), FIRST_SKIP, "the first skip again, not doubled");
    }

    #[test]
    fn misses_broken_by_hits_never_skip() {
        let h = ColdHint::default();
        for _ in 0..100 {
            for _ in 0..MISS_RUN - 1 {
                h.miss();
            }
            h.hit();
            assert!(h.try_cache());
        }
    }
}
