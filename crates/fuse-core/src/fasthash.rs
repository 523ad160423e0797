//! A hasher for the small integer keys of the per-request maps on the
//! serving path (uniques, slot indexes, op ids): the standard SipHash is
//! built to resist hostile keys, which these are not (the daemon makes
//! them), and costs a measurable part of a cached READ (docs/BENCHMARKS.md,
//! "The short request path, second steps"). Keys a client or a migration
//! stream can choose keep the standard hasher.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Multiplicative (Fibonacci) hashing of integer words.
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }
    fn write_u16(&mut self, x: u16) {
        self.write_u64(u64::from(x));
    }
    fn write_u8(&mut self, x: u8) {
        self.write_u64(u64::from(x));
    }
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
    fn write_i32(&mut self, x: i32) {
        self.write_u64(u64::from(x as u32));
    }
}

/// A map keyed by daemon-made integers (see the module docs).
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_keys_spread_over_the_top_bits() {
        // hashbrown takes its control byte from the top 7 bits: sequential
        // uniques must not all share them.
        let tops: std::collections::HashSet<u64> = (0..128u64)
            .map(|k| {
                let mut h = IdHasher::default();
                h.write_u64(k);
                h.finish() >> 57
            })
            .collect();
        assert!(tops.len() > 64, "{}", tops.len());
        let mut m: IdMap<u64, u64> = IdMap::default();
        for k in 0..1000 {
            m.insert(k * 2, k);
        }
        assert_eq!(m.get(&500), Some(&250));
        assert_eq!(m.get(&501), None);
    }
}
