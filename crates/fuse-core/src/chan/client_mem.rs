//! The client's own memory, handed to the server by reference.
//!
//! A guest's READ and WRITE buffers are guest RAM that the device has mapped
//! into this process. Instead of copying them into the request and back, the
//! device attaches them to the request ([`Args::client`](super::Args)) as a
//! [`ClientMem`]: the ring hands them to the server untouched, and a server
//! that can do host I/O (the passthrough) reads or writes the host file
//! straight from them. A server that cannot (an in-memory filesystem) still
//! works: it sees an ordinary buffer and the worker copies through
//! [`ClientMem::read_at`] / [`ClientMem::write_at`].
//!
//! fuse-core itself never dereferences the addresses; only the copy methods
//! of the implementor touch the memory.

use super::Errno;

/// One contiguous piece of client memory, as mapped in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostSpan {
    /// Start address in this process.
    pub addr: usize,
    /// Length in bytes.
    pub len: usize,
}

/// The client's whole memory as mapped in this process (a guest's RAM
/// regions), for host I/O layers that register it once instead of per
/// request (io_uring fixed buffers). Each map has an identity of its own:
/// a new memory table is a new map, never an old one changed.
#[derive(Debug)]
pub struct ClientMap {
    id: u64,
    regions: Vec<HostSpan>,
}

impl ClientMap {
    /// A map of `regions`, with a fresh identity.
    pub fn new(regions: Vec<HostSpan>) -> ClientMap {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        ClientMap {
            id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            regions,
        }
    }
    /// The identity: equal ids are the same regions.
    pub fn id(&self) -> u64 {
        self.id
    }
    /// The regions.
    pub fn regions(&self) -> &[HostSpan] {
        &self.regions
    }
}

/// Client memory that a request's data lives in, as a list of mapped spans
/// (in order: byte `k` of the data is found by walking the spans).
///
/// The memory is shared with the client, which may change it at any time:
/// it must only be handed to the kernel (`preadv`, io_uring) or copied with
/// volatile accesses, never turned into a Rust reference.
///
/// The client may take its memory back while a server still holds the
/// request (a guest request answered by a timeout returns its buffers to
/// the guest). So host I/O on the spans happens only under an [`IoGuard`]
/// from `io()` (on `dyn ClientMem`): the provider refuses new guards once the memory
/// is taken back, and waits for the guards held to be dropped before it
/// gives the memory back.
///
/// # Safety
///
/// Implementors guarantee that every span of [`ClientMem::spans`] is
/// mapped, readable and writable memory of this process that is not a Rust
/// object, and that while [`ClientMem::begin_io`] has returned true more
/// often than [`ClientMem::end_io`] was called, the spans stay mapped and
/// are not reused by the client. Servers pass the spans to system calls
/// relying on exactly this. If [`ClientMem::map`] returns a map, every
/// span lies inside one of its regions, and the regions are mapped memory
/// of this process (not Rust objects) while this `ClientMem` exists.
#[allow(unsafe_code)] // Declares the contract; fuse-core implements none.
pub unsafe trait ClientMem: Send + Sync + std::fmt::Debug {
    /// The spans, in data order (addresses only: use them under a guard).
    fn spans(&self) -> &[HostSpan];

    /// Total length.
    fn len(&self) -> usize {
        self.spans().iter().map(|s| s.len).sum()
    }

    /// Whether it is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Starts host I/O on the spans; false once the client took the
    /// memory back. Pair with [`ClientMem::end_io`], or use `io()` on `dyn ClientMem`.
    fn begin_io(&self) -> bool;

    /// Ends host I/O started by [`ClientMem::begin_io`]. A server ends its
    /// I/O before it answers the request the memory came with: a
    /// transport may wait for the memory to be idle before it reuses it,
    /// on the very thread that would otherwise reap that I/O.
    fn end_io(&self);

    /// Copies `buf.len()` bytes from offset `off` into `buf` (EIO once the
    /// memory was taken back).
    fn read_at(&self, off: usize, buf: &mut [u8]) -> Result<(), Errno>;

    /// Copies `buf` to offset `off` (EIO once the memory was taken back).
    fn write_at(&self, off: usize, buf: &[u8]) -> Result<(), Errno>;

    /// The client's whole memory, which the spans lie in, when the
    /// provider knows it (for registering it once with the host I/O layer).
    fn map(&self) -> Option<std::sync::Arc<ClientMap>> {
        None
    }
}

impl dyn ClientMem + '_ {
    /// The spans for host I/O, valid while the guard lives; None when the
    /// client took the memory back (fail the operation).
    pub fn io(&self) -> Option<IoGuard<'_>> {
        self.begin_io().then_some(IoGuard { mem: self })
    }
}

/// Host I/O in progress on a [`ClientMem`], from `io()` on `dyn ClientMem`.
#[derive(Debug)]
pub struct IoGuard<'a> {
    mem: &'a dyn ClientMem,
}

impl IoGuard<'_> {
    /// The spans, valid (mapped, not reused) while this guard lives.
    pub fn spans(&self) -> &[HostSpan] {
        self.mem.spans()
    }
}

impl Drop for IoGuard<'_> {
    fn drop(&mut self) {
        self.mem.end_io();
    }
}
