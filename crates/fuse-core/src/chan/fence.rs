//! Requests a client has given up on: a [`Fence`] shared by a group of
//! requests (a device's ring generation) that the client closes when it
//! will never take their answers. A server checks it before it starts a
//! request and right before each host call that changes something
//! ([`crate::server::Ctx::enter_host`]), so a request given up never acts
//! on the host afterwards; the calls already running are counted, so the
//! client can wait for them (with a bound of its own) and report those
//! that outlast it. Requests that only let go of what the session holds
//! (RELEASE, RELEASEDIR, FLUSH, DESTROY) are not fenced: see
//! [`runs_when_given_up`].
//!
//! State: one atomic word, the closed bit and the number of host calls
//! inside. Entering adds one and backs out if the bit was set; closing sets
//! the bit. Once `close` has returned, every later `enter` fails, and
//! [`Fence::inside`] only goes down.

use crate::abi::Opcode;
use crate::sync::{Arc, AtomicU64, Ordering};

/// Set in `Fence::state` once the fence is closed.
const CLOSED: u64 = 1 << 63;

/// A group of requests a client may give up at once (see the module docs).
#[derive(Debug, Default)]
pub struct Fence {
    /// [`CLOSED`] and the count of [`FenceGuard`]s alive.
    state: AtomicU64,
}

impl Fence {
    /// An open fence.
    pub fn new() -> Arc<Fence> {
        Arc::new(Fence::default())
    }

    /// Marks one host call as running until the guard drops; None once the
    /// fence is closed (the request was given up: it must not act).
    pub fn enter(self: &Arc<Self>) -> Option<FenceGuard> {
        // AcqRel: a close that came first is seen here, and a close that
        // comes later sees this call counted.
        if self.state.fetch_add(1, Ordering::AcqRel) & CLOSED != 0 {
            self.state.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(FenceGuard(self.clone()))
    }

    /// Closes the fence: from now on [`Fence::enter`] fails.
    pub fn close(&self) {
        self.state.fetch_or(CLOSED, Ordering::AcqRel);
    }

    /// Whether it is closed.
    pub fn is_closed(&self) -> bool {
        self.state.load(Ordering::Acquire) & CLOSED != 0
    }

    /// Host calls running under it now.
    pub fn inside(&self) -> u64 {
        self.state.load(Ordering::Acquire) & !CLOSED
    }
}

/// Whether a request of `op` runs even once its fence is closed: those
/// that only let go of what the client's session holds (an open file, its
/// lock owners, the whole session) cannot act on anyone else's data, and
/// skipping them would leave what they let go of held.
pub(crate) fn runs_when_given_up(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::Release | Opcode::Releasedir | Opcode::Flush | Opcode::Destroy
    )
}

/// Fences are equal when they are the same fence.
impl PartialEq for Fence {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}
impl Eq for Fence {}

/// A host call running under a [`Fence`] (counted until dropped).
#[derive(Debug)]
pub struct FenceGuard(Arc<Fence>);

impl Drop for FenceGuard {
    fn drop(&mut self) {
        self.0.state.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_closed_fence_admits_nothing_and_counts_what_runs() {
        let f = Fence::new();
        let g = f.enter().expect("open");
        let g2 = f.enter().expect("open");
        assert_eq!(f.inside(), 2);
        f.close();
        assert!(f.is_closed());
        assert!(f.enter().is_none(), "closed: nothing new enters");
        assert_eq!(f.inside(), 2, "a refused enter leaves no count");
        drop(g);
        assert_eq!(f.inside(), 1);
        drop(g2);
        assert_eq!(f.inside(), 0);
        assert!(f.is_closed());
    }
}
