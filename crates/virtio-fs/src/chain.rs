//! Descriptor chains: checked and translated to host addresses once, when
//! popped, then read and written through those addresses only.
//!
//! A FUSE request chain is device-readable descriptors (in header,
//! arguments, WRITE data) followed by device-writable ones (out header,
//! reply payload). Every descriptor is looked up in guest memory before
//! anything is read; a chain that breaks the rules is refused with a
//! [`ChainError`] and never half-served. A walk that ends early (a bad
//! `next`, a loop) is judged on what it yielded. A chain keeps the guest
//! memory it was translated against mapped (its load guard) for as long as
//! it lives, so its host addresses stay valid across a memory table update.
//! The descriptors are read here ([`Descriptors`]) with virtio-queue's
//! rules, from a descriptor table looked up once (the queue's, or an
//! indirect one) rather than once per descriptor.

use crate::GuestMmap;
use smallvec::SmallVec;
use thiserror::Error;
use virtio_queue::desc::split::Descriptor;
use vm_memory::{
    Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryLoadGuard, GuestMemoryRegion,
    MemoryRegionAddress, VolatileSlice,
};

/// The guest memory a chain's host addresses point into.
pub type Mem = GuestMemoryLoadGuard<GuestMmap>;

/// One descriptor, or the part of one inside one guest memory region: a
/// guest-physical range and where it is mapped in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seg {
    /// Start in guest memory.
    pub addr: GuestAddress,
    /// Length in bytes.
    pub len: u32,
    /// Host address of `addr` in the memory of the chain it came from
    /// (0 for an empty descriptor).
    host: usize,
}

impl Seg {
    /// Host address of `addr` in the memory its chain keeps mapped.
    pub fn host(&self) -> usize {
        self.host
    }

    /// The seg from byte `skip` on (`skip` at most `len`).
    pub(crate) fn skip(&self, skip: usize) -> Seg {
        debug_assert!(skip <= self.len as usize);
        Seg {
            addr: self.addr.unchecked_add(skip as u64),
            len: self.len - skip as u32,
            host: if self.len == 0 { 0 } else { self.host + skip },
        }
    }

    /// Bytes `from..from + n` of the seg as a volatile slice.
    ///
    /// # Safety
    /// The memory of the chain the seg came from must still be mapped
    /// (the chain, or another holder of that memory, is alive) and
    /// `from + n <= len`.
    unsafe fn slice(&self, from: usize, n: usize) -> VolatileSlice<'static> {
        // SAFETY: by the caller's contract the range lies inside a guest
        // memory mapping that stays mapped meanwhile; it is no Rust
        // object, so volatile access from here aliases none.
        unsafe { VolatileSlice::new((self.host + from) as *mut u8, n) }
    }
}

/// Why a chain was refused.
#[derive(Debug, Error)]
pub enum ChainError {
    /// A descriptor lies (partly) outside guest memory.
    #[error("descriptor {index} at {addr:#x}+{len} is outside guest memory")]
    OutsideMemory {
        /// Position in the chain.
        index: usize,
        /// Guest address.
        addr: u64,
        /// Length.
        len: u32,
    },
    /// A device-readable descriptor after a device-writable one.
    #[error("readable descriptor {0} after a writable one")]
    ReadableAfterWritable(usize),
    /// More descriptors, or bytes, than any FUSE request needs.
    #[error("chain too long ({descs} descriptors, {bytes} bytes)")]
    TooLong {
        /// Descriptors seen.
        descs: usize,
        /// Bytes seen.
        bytes: u64,
    },
}

/// A checked chain: its head and its two halves.
pub struct Chain {
    /// Head descriptor index (what goes back in the used ring).
    pub head: u16,
    /// The memory the segs' host addresses point into, kept mapped.
    mem: Mem,
    /// Its descriptors in order: the device-readable ones, then from
    /// `split` on the device-writable ones (held in place up to
    /// [`USUAL_DESCS`]).
    segs: SmallVec<[Seg; USUAL_DESCS]>,
    split: usize,
    /// Bytes of each half.
    readable_len: usize,
    writable_len: usize,
}

/// At most this many descriptors per chain (a 1 MiB request in 4 KiB
/// pages plus headers, with room to spare).
pub const MAX_DESCS: usize = 1024;

/// Descriptors most requests have (in header, arguments, out header, a
/// data buffer): a chain of up to this many allocates nothing.
const USUAL_DESCS: usize = 4;

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chain")
            .field("head", &self.head)
            .field("segs", &self.segs)
            .field("split", &self.split)
            .finish_non_exhaustive()
    }
}

impl Chain {
    /// Walks the chain at `head` of the split virtqueue whose descriptor
    /// table of `size` entries is at `table` in `mem` ([`Descriptors`]),
    /// looking every descriptor up in `mem`. `max_bytes` bounds each half
    /// (the largest request or reply the device accepts).
    pub fn parse(
        mem: &Mem,
        table: GuestAddress,
        size: u16,
        head: u16,
        max_bytes: u64,
    ) -> Result<Chain, ChainError> {
        let chain = Descriptors::new(mem, table, size, head);
        let mut out = Chain {
            head,
            mem: mem.clone(),
            segs: SmallVec::new(),
            split: 0,
            readable_len: 0,
            writable_len: 0,
        };
        let (mut rbytes, mut wbytes) = (0u64, 0u64);
        // The iterator ends a chain early on a bad index or a loop (its
        // TTL); what it yields is checked here.
        for (index, d) in chain.enumerate() {
            if index == MAX_DESCS {
                return Err(ChainError::TooLong {
                    descs: MAX_DESCS + 1,
                    bytes: 0,
                });
            }
            let (addr, len, write) = (d.addr(), d.len(), d.is_write_only());
            if write {
                wbytes += u64::from(len);
            } else {
                if out.segs.len() > out.split {
                    return Err(ChainError::ReadableAfterWritable(index));
                }
                rbytes += u64::from(len);
            }
            if rbytes > max_bytes || wbytes > max_bytes {
                return Err(ChainError::TooLong {
                    descs: index + 1,
                    bytes: rbytes + wbytes,
                });
            }
            let before = out.segs.len();
            if !translate(mem, addr, len, &mut out.segs) {
                return Err(ChainError::OutsideMemory {
                    index,
                    addr: addr.0,
                    len,
                });
            }
            if !write {
                out.split += out.segs.len() - before;
            }
        }
        // Both at most `max_bytes`, which the caller keeps well in usize.
        out.readable_len = rbytes as usize;
        out.writable_len = wbytes as usize;
        Ok(out)
    }

    /// The device-readable descriptors, in order.
    pub fn readable(&self) -> &[Seg] {
        &self.segs[..self.split]
    }

    /// The device-writable descriptors, in order.
    pub fn writable(&self) -> &[Seg] {
        &self.segs[self.split..]
    }

    /// Total device-readable bytes.
    pub fn readable_len(&self) -> usize {
        self.readable_len
    }

    /// Total device-writable bytes.
    pub fn writable_len(&self) -> usize {
        self.writable_len
    }

    /// The guest memory the chain lives in.
    pub fn mem(&self) -> &Mem {
        &self.mem
    }

    /// Copies the readable half, from byte `from` on, into `buf` (which
    /// must not be longer than what is left).
    pub fn read_at(&self, mut from: usize, buf: &mut [u8]) -> Result<(), ChainError> {
        let mut done = 0;
        for s in self.readable() {
            let len = s.len as usize;
            if from >= len {
                from -= len;
                continue;
            }
            let n = (len - from).min(buf.len() - done);
            // SAFETY: `self.mem` keeps the seg's memory mapped and
            // `from + n <= len`.
            unsafe { s.slice(from, n) }.copy_to(&mut buf[done..done + n]);
            done += n;
            from = 0;
            if done == buf.len() {
                break;
            }
        }
        if done == buf.len() {
            Ok(())
        } else {
            Err(ChainError::TooLong {
                descs: self.split,
                bytes: done as u64,
            })
        }
    }

    /// Writes `parts` one after another into the writable half; returns
    /// the bytes written. Fails if they do not fit.
    pub fn write_all(&self, parts: &[&[u8]]) -> Result<u32, ChainError> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if total > self.writable_len() {
            return Err(ChainError::TooLong {
                descs: self.segs.len() - self.split,
                bytes: total as u64,
            });
        }
        let mut segs = self.writable().iter();
        let (mut seg, mut off) = (None::<Seg>, 0usize);
        for part in parts {
            let mut p: &[u8] = part;
            while !p.is_empty() {
                let s = match seg {
                    Some(s) if off < s.len as usize => s,
                    _ => {
                        // `total` fits, so a descriptor is left.
                        let Some(next) = segs.next() else { break };
                        seg = Some(*next);
                        off = 0;
                        continue;
                    }
                };
                let n = (s.len as usize - off).min(p.len());
                // SAFETY: `self.mem` keeps the seg's memory mapped and
                // `off + n <= len`.
                unsafe { s.slice(off, n) }.copy_from(&p[..n]);
                off += n;
                p = &p[n..];
            }
        }
        Ok(total as u32)
    }
}

/// `VIRTQ_DESC_F_NEXT`, `VIRTQ_DESC_F_INDIRECT` (virtio 1.2, 2.7.5).
const F_NEXT: u16 = 1;
const F_INDIRECT: u16 = 4;
/// Bytes of a split virtqueue descriptor.
const DESC_SIZE: u64 = 16;

/// A descriptor table (a queue's, or an indirect one) of `count` entries
/// at `addr`: read through its host address when it lies in one memory
/// region (looked up once), else entry by entry through `mem`.
struct Table<'a> {
    mem: &'a GuestMmap,
    addr: GuestAddress,
    count: u16,
    host: Option<usize>,
}

impl<'a> Table<'a> {
    fn new(mem: &'a GuestMmap, addr: GuestAddress, count: u16) -> Table<'a> {
        let bytes = u64::from(count) * DESC_SIZE;
        let host = mem.find_region(addr).and_then(|r| {
            let off = addr.checked_offset_from(r.start_addr())?;
            if bytes > r.len() - off {
                return None;
            }
            r.get_host_address(MemoryRegionAddress(off)).ok()
        });
        Table {
            mem,
            addr,
            count,
            host: host.map(|p| p as usize),
        }
    }

    /// Entry `i` (below `count`); None if it is not in guest memory.
    fn get(&self, i: u16) -> Option<Descriptor> {
        let off = u64::from(i) * DESC_SIZE;
        match self.host {
            // SAFETY: the whole table lies in one region of `mem`, mapped
            // while `mem` is borrowed; guest memory is no Rust object.
            Some(h) => unsafe { VolatileSlice::new((h + off as usize) as *mut u8, 16) }
                .read_obj(0)
                .ok(),
            None => self.mem.read_obj(self.addr.checked_add(off)?).ok(),
        }
    }
}

/// The descriptors of one chain, as virtio-queue's `DescriptorChain`
/// yields them: from the head, following `next` while the NEXT flag is
/// set, into an indirect table (of whole descriptors, at most 65535, never
/// nested) where one refers to it. The walk ends, and what it yielded is
/// the chain, at an index past its table, after as many descriptors as
/// the table has (a loop), at a descriptor that is not in guest memory, at
/// a bad indirect table, or where the chain would pass 4 GiB.
pub struct Descriptors<'a> {
    table: Table<'a>,
    next: u16,
    ttl: u16,
    indirect: bool,
    bytes: u32,
}

impl<'a> Descriptors<'a> {
    /// The chain at `head` of the descriptor table of `size` entries at
    /// `table`.
    pub fn new(mem: &'a GuestMmap, table: GuestAddress, size: u16, head: u16) -> Descriptors<'a> {
        Descriptors {
            table: Table::new(mem, table, size),
            next: head,
            ttl: size,
            indirect: false,
            bytes: 0,
        }
    }
}

impl Iterator for Descriptors<'_> {
    type Item = Descriptor;

    fn next(&mut self) -> Option<Descriptor> {
        loop {
            if self.ttl == 0 || self.next >= self.table.count {
                return None;
            }
            let d = self.table.get(self.next)?;
            if d.flags() & F_INDIRECT != 0 {
                if self.indirect || d.len() % DESC_SIZE as u32 != 0 {
                    self.ttl = 0;
                    return None;
                }
                let Ok(count) = u16::try_from(d.len() / DESC_SIZE as u32) else {
                    self.ttl = 0;
                    return None;
                };
                self.table = Table::new(self.table.mem, d.addr(), count);
                (self.next, self.ttl, self.indirect) = (0, count, true);
                continue;
            }
            let Some(bytes) = self.bytes.checked_add(d.len()) else {
                self.ttl = 0;
                return None;
            };
            self.bytes = bytes;
            if d.flags() & F_NEXT != 0 {
                self.next = d.next();
                self.ttl -= 1;
            } else {
                self.ttl = 0;
            }
            return Some(d);
        }
    }
}

/// Appends the segs of the guest range `addr..addr + len` (one per memory
/// region it lies in) to `out`. False if part of it is not guest memory.
fn translate(
    mem: &GuestMmap,
    mut addr: GuestAddress,
    len: u32,
    out: &mut SmallVec<[Seg; USUAL_DESCS]>,
) -> bool {
    if len == 0 {
        out.push(Seg { addr, len, host: 0 });
        return true;
    }
    let mut left = u64::from(len);
    while left > 0 {
        let Some(r) = mem.find_region(addr) else {
            return false;
        };
        let off = addr.unchecked_offset_from(r.start_addr());
        // `find_region` returned the region holding `addr`: off < len.
        let n = left.min(r.len() - off);
        let Ok(host) = r.get_host_address(MemoryRegionAddress(off)) else {
            return false;
        };
        out.push(Seg {
            addr,
            // At most `len`, a u32.
            len: n as u32,
            host: host as usize,
        });
        left -= n;
        addr = addr.unchecked_add(n);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_queue::desc::split::Descriptor as SplitDescriptor;
    use virtio_queue::desc::RawDescriptor;
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{GuestAddressSpace, GuestMemoryAtomic};

    /// `VRING_DESC_F_WRITE`.
    const WRITE: u16 = 2;
    /// Where the first of two adjacent memory regions ends.
    const EDGE: u64 = 0x1_0000;
    /// Entries of the mock queues' descriptor tables.
    const SIZE: u16 = 16;

    /// Two adjacent regions (separate host mappings) of 64 KiB each.
    fn two_regions() -> Mem {
        let m = GuestMmap::from_ranges(&[
            (GuestAddress(0), EDGE as usize),
            (GuestAddress(EDGE), EDGE as usize),
        ])
        .unwrap();
        GuestMemoryAtomic::new(m).memory()
    }

    fn desc(addr: u64, len: u32, flags: u16) -> RawDescriptor {
        RawDescriptor::from(SplitDescriptor::new(addr, len, flags, 0))
    }

    /// Writes `descs` as one chain at the head of `q`'s table and parses it.
    fn chain_of(
        mem: &Mem,
        q: &MockSplitQueue<GuestMmap>,
        descs: &[RawDescriptor],
    ) -> Result<Chain, ChainError> {
        q.build_desc_chain(descs).unwrap();
        Chain::parse(mem, q.desc_table_addr(), SIZE, 0, 1 << 20)
    }

    #[test]
    fn descriptors_across_two_regions_are_split_and_copied_right() {
        let mem = two_regions();
        let q = MockSplitQueue::new(&*mem, SIZE);
        let into: Vec<u8> = (0..32).collect();
        mem.write_slice(&into, GuestAddress(EDGE - 16)).unwrap();
        let c = chain_of(
            &mem,
            &q,
            &[
                desc(EDGE - 16, 32, 0),
                desc(EDGE - 0x100 - 8, 16, WRITE),
                desc(EDGE + 0x200, 4, WRITE),
            ],
        )
        .unwrap();
        // Each crossing descriptor became one seg per region.
        assert_eq!(c.readable().len(), 2);
        assert_eq!(c.readable_len(), 32);
        assert_eq!(c.writable().len(), 2);
        assert_eq!(c.writable_len(), 20);
        let mut buf = [0u8; 20];
        c.read_at(6, &mut buf).unwrap();
        assert_eq!(&buf[..], &into[6..26]);
        let out: Vec<u8> = (100..120).collect();
        assert_eq!(c.write_all(&[&out[..3], &out[3..]]).unwrap(), 20);
        let mut back = [0u8; 16];
        mem.read_slice(&mut back, GuestAddress(EDGE - 0x108))
            .unwrap();
        assert_eq!(&back[..], &out[..16]);
        let mut tail = [0u8; 4];
        mem.read_slice(&mut tail, GuestAddress(EDGE + 0x200))
            .unwrap();
        assert_eq!(&tail[..], &out[16..]);
    }

    #[test]
    fn a_straddling_descriptor_is_split_where_the_regions_meet() {
        let mem = two_regions();
        let q = MockSplitQueue::new(&*mem, SIZE);
        let c = chain_of(&mem, &q, &[desc(0x1000, 64, 0), desc(EDGE - 10, 30, WRITE)]).unwrap();
        let w = c.writable();
        assert_eq!((w[0].addr, w[0].len), (GuestAddress(EDGE - 10), 10));
        assert_eq!((w[1].addr, w[1].len), (GuestAddress(EDGE), 20));
        let r0 = mem.find_region(GuestAddress(0)).unwrap();
        let r1 = mem.find_region(GuestAddress(EDGE)).unwrap();
        assert_eq!(
            w[0].host(),
            r0.get_host_address(MemoryRegionAddress(EDGE - 10)).unwrap() as usize
        );
        assert_eq!(
            w[1].host(),
            r1.get_host_address(MemoryRegionAddress(0)).unwrap() as usize
        );
    }

    #[test]
    fn a_descriptor_past_guest_memory_is_refused() {
        let mem = two_regions();
        let q = MockSplitQueue::new(&*mem, SIZE);
        let e = chain_of(
            &mem,
            &q,
            &[desc(0x1000, 64, 0), desc(2 * EDGE - 8, 16, WRITE)],
        )
        .unwrap_err();
        assert!(
            matches!(e, ChainError::OutsideMemory { index: 1, .. }),
            "{e:?}"
        );
    }
}
