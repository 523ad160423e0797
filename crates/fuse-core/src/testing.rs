//! Test support that is not product code: an in-memory filesystem to serve
//! ([`memfs::MemFs`]) and an fsx-style data checker to drive a server with
//! ([`fsx`]), and the deterministic generator they and the fuzz harnesses
//! share ([`rng::Rng`]). Tests of this crate and of the crates above it use them; no
//! daemon does, so they exist only with feature `test-utils`.

pub mod fsx;
pub mod memfs;
pub mod rng;
