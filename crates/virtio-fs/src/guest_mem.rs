//! A guest request's data buffers, handed to the engine by reference.
//!
//! A READ's writable descriptors (after the out header) and a WRITE's
//! readable ones (after `fuse_write_in`) become a [`GuestSpans`]: the host
//! addresses of those guest pages, and the guest memory mapping they live
//! in (kept mapped while the spans exist, even across a memory table
//! update), so the passthrough reads or writes the host file in guest RAM.
//!
//! The guest gets its buffers back when its request is answered, and a
//! request answered by the timeout scanner may still be in a server's
//! hands. So host I/O happens under `begin_io`/`end_io`, and
//! [`GuestSpans::revoke_or_when_idle`] refuses new I/O: the timeout answer
//! goes out at once if none runs, else from the last `end_io`. The guest
//! never sees a buffer answered and written afterwards.

use crate::chain::{Mem, Seg};
use crate::GuestMmap;
use fuse_core::locks::{lock, read, wait_for, write};
use fuse_core::{ClientMap, ClientMem, Errno, HostSpan};
use smallvec::SmallVec;
use std::sync::{Arc, Condvar, Mutex, RwLock};
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress, VolatileSlice};

/// The guest's RAM as a [`ClientMap`], made once per memory table, for
/// servers that register it with io_uring as fixed buffers
/// (`DeviceConfig::fixed_guest_memory`). The memory it was made from is
/// kept with it, so a new table can never be taken for the old one.
#[derive(Default)]
pub(crate) struct MapCache(RwLock<Option<(Mem, Arc<ClientMap>)>>);

impl MapCache {
    /// Forgets the map (a new memory table: the old one may be unmapped).
    pub(crate) fn clear(&self) {
        *write(&self.0) = None;
    }

    /// The map of `mem`'s regions (None if one has no host address).
    pub(crate) fn get(&self, mem: &Mem) -> Option<Arc<ClientMap>> {
        let same = |c: &Option<(Mem, Arc<ClientMap>)>| {
            c.as_ref()
                .filter(|(m, _)| std::ptr::eq::<GuestMmap>(&**m, &**mem))
                .map(|(_, map)| map.clone())
        };
        if let Some(map) = same(&read(&self.0)) {
            return Some(map);
        }
        let mut c = write(&self.0);
        if let Some(map) = same(&c) {
            return Some(map);
        }
        let regions = mem
            .iter()
            .map(|r| {
                let p = r.get_host_address(MemoryRegionAddress(0)).ok()?;
                Some(HostSpan {
                    addr: p as usize,
                    len: usize::try_from(r.len()).ok()?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        let map = Arc::new(ClientMap::new(regions));
        *c = Some((mem.clone(), map.clone()));
        Some(map)
    }
}

/// Access state (guarded by `GuestSpans::access`, a leaf lock).
#[derive(Default)]
struct Access {
    /// Host I/O calls in progress.
    busy: usize,
    /// The guest's buffers are no longer ours to touch.
    revoked: bool,
    /// Called once, by the `end_io` that leaves the revoked memory idle
    /// (set by a revoke that found I/O running: `revoke_or_when_idle`).
    on_idle: Option<Box<dyn FnOnce() + Send>>,
}

/// Guest buffers of one request (see the module docs).
pub(crate) struct GuestSpans {
    spans: SmallVec<[HostSpan; 2]>,
    /// Keeps the spans' memory mapped while they exist (only held).
    _mem: Mem,
    /// The map of `mem`, when the device registers guest RAM.
    map: Option<Arc<ClientMap>>,
    access: Mutex<Access>,
    /// Signalled when the last I/O ends (for `wait_idle`).
    idle: Condvar,
}

impl std::fmt::Debug for GuestSpans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestSpans")
            .field("spans", &self.spans)
            .finish_non_exhaustive()
    }
}

impl GuestSpans {
    /// The bytes of `segs` (of a chain in `mem`, `Chain::mem`) from byte
    /// `skip` on, with the map of `mem` from `maps` when guest RAM is
    /// registered (taken here, so the map is always `mem`'s:
    /// `ClientMem::map` promises its regions hold every span).
    pub(crate) fn new(
        mem: &Mem,
        maps: Option<&MapCache>,
        segs: &[Seg],
        mut skip: usize,
    ) -> GuestSpans {
        let map = maps.and_then(|c| c.get(mem));
        // Most READs and WRITEs have one or two data descriptors: no
        // allocation for them.
        let mut spans = SmallVec::new();
        for s in segs {
            let len = s.len as usize;
            if skip >= len {
                skip -= len;
                continue;
            }
            let s = s.skip(skip);
            skip = 0;
            if s.len > 0 {
                spans.push(HostSpan {
                    addr: s.host(),
                    len: s.len as usize,
                });
            }
        }
        GuestSpans {
            spans,
            _mem: mem.clone(),
            map,
            access: Mutex::new(Access::default()),
            idle: Condvar::new(),
        }
    }

    /// Takes the buffers back: no host I/O may start on them after this.
    /// True if none is running (the request may be answered now); false if
    /// some is (it ends without being waited for here).
    pub(crate) fn revoke(&self) -> bool {
        self.revoke_with(None)
    }

    /// [`GuestSpans::revoke`], and if I/O is running, `f` is called by the
    /// `end_io` that ends the last of it (in the same critical section as
    /// the revoke, so that end cannot slip between the two). `f` is dropped
    /// unused when nothing runs (true).
    pub(crate) fn revoke_or_when_idle(&self, f: Box<dyn FnOnce() + Send>) -> bool {
        self.revoke_with(Some(f))
    }

    fn revoke_with(&self, f: Option<Box<dyn FnOnce() + Send>>) -> bool {
        let mut a = lock(&self.access);
        a.revoked = true;
        if a.busy == 0 {
            return true;
        }
        if let Some(f) = f {
            a.on_idle = Some(f);
        }
        false
    }

    /// Waits until no host I/O runs on the buffers (after `revoke`, none
    /// can start again), but not past `deadline`: false if some still
    /// runs then.
    pub(crate) fn wait_idle_until(&self, deadline: std::time::Instant) -> bool {
        let mut a = lock(&self.access);
        while a.busy > 0 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            a = wait_for(&self.idle, a, left);
        }
        true
    }

    /// Walks the spans for bytes `off..off + len`, calling `f` with each
    /// piece as a volatile slice and its offset in the caller's buffer.
    /// EFAULT if the spans end first.
    fn walk(
        &self,
        mut off: usize,
        len: usize,
        mut f: impl FnMut(VolatileSlice<'_>, usize),
    ) -> Result<(), Errno> {
        let mut done = 0;
        for s in &self.spans {
            if off >= s.len {
                off -= s.len;
                continue;
            }
            if done == len {
                break;
            }
            let n = (s.len - off).min(len - done);
            // SAFETY: the span is guest memory that `self._mem` keeps mapped
            // (no Rust object: volatile access aliases none), and
            // `off + n <= s.len`.
            f(
                unsafe { VolatileSlice::new((s.addr + off) as *mut u8, n) },
                done,
            );
            done += n;
            off = 0;
        }
        if done == len {
            Ok(())
        } else {
            Err(Errno::EFAULT)
        }
    }
}

// SAFETY: every span comes from a `VolatileSlice` of `mem`, a mapping of
// guest RAM (not a Rust object, so no Rust reference aliases it) that
// `self._mem` keeps mapped for as long as `self` lives: host I/O through the
// spans can never touch memory the daemon's own code uses. The guest
// reuses the buffers once its request is answered. A request the timeout
// scanner answers is answered only after `revoke_or_when_idle` found no
// I/O running, or from the callback the last one's end runs; a vring stop
// revokes and waits for the I/O to end before the guest may reuse the
// vring (it answers nothing); and `begin_io` fails once revoked. A
// request the filesystem answers is answered when the filesystem says its
// I/O is done: a filesystem that kept the memory and did I/O after
// answering would write buffers the guest owns again (the guest's data,
// not the daemon's memory, is what it could spoil).
#[allow(unsafe_code)]
unsafe impl ClientMem for GuestSpans {
    fn spans(&self) -> &[HostSpan] {
        &self.spans
    }

    // The map was made from `mem`'s regions (`MapCache`), which hold every
    // span, and `mem` keeps them mapped while this exists.
    fn map(&self) -> Option<Arc<ClientMap>> {
        self.map.clone()
    }

    fn begin_io(&self) -> bool {
        let mut a = lock(&self.access);
        if a.revoked {
            return false;
        }
        a.busy += 1;
        true
    }

    fn end_io(&self) {
        let f = {
            let mut a = lock(&self.access);
            a.busy = a.busy.saturating_sub(1);
            // Only a revoker waits (`wait_idle` follows `revoke`): an
            // unconditional notify costs a futex call per request.
            if a.busy == 0 && a.revoked {
                self.idle.notify_all();
                a.on_idle.take()
            } else {
                None
            }
        };
        // Out of the lock: it answers the request (taking its ticket's
        // `state`, then the device's `timeouts.deferred`).
        if let Some(f) = f {
            f();
        }
    }

    fn read_at(&self, off: usize, buf: &mut [u8]) -> Result<(), Errno> {
        if !self.begin_io() {
            return Err(Errno::EIO);
        }
        let r = self.walk(off, buf.len(), |s, at| {
            s.copy_to(&mut buf[at..at + s.len()]);
        });
        self.end_io();
        r
    }

    fn write_at(&self, off: usize, buf: &[u8]) -> Result<(), Errno> {
        if !self.begin_io() {
            return Err(Errno::EIO);
        }
        let r = self.walk(off, buf.len(), |s, at| {
            s.copy_from(&buf[at..at + s.len()]);
        });
        self.end_io();
        r
    }
}
