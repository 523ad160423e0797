//! Support for tests of this crate and of the crates above it (feature
//! `test-utils`): nothing here is used by the daemon.

pub mod acl;
