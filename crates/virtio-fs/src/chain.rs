//! Descriptor chains: checked once when popped, then read and written by
//! guest address only.
//!
//! A FUSE request chain is device-readable descriptors (in header,
//! arguments, WRITE data) followed by device-writable ones (out header,
//! reply payload). Every descriptor is checked against guest memory before
//! anything is read; a chain that breaks the rules is refused with a
//! [`ChainError`] and never half-served. A bad `next` index or a loop ends
//! virtio-queue's walk early: what it yielded is judged as the whole chain
//! (in practice the request then disagrees with its header length and is
//! refused).

use std::ops::Deref;
use thiserror::Error;
use virtio_queue::DescriptorChain;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, Permissions};

/// One descriptor: a guest-physical range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seg {
    /// Start in guest memory.
    pub addr: GuestAddress,
    /// Length in bytes.
    pub len: u32,
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
    /// Reading or writing guest memory failed after the check.
    #[error("guest memory access failed")]
    Memory(#[source] vm_memory::GuestMemoryError),
}

/// A checked chain: its head and its two halves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chain {
    /// Head descriptor index (what goes back in the used ring).
    pub head: u16,
    /// Its descriptors in order: the device-readable ones, then from
    /// `split` on the device-writable ones (one allocation per chain).
    segs: Vec<Seg>,
    split: usize,
    /// Bytes of each half.
    readable_len: usize,
    writable_len: usize,
}

/// At most this many descriptors per chain (a 1 MiB request in 4 KiB
/// pages plus headers, with room to spare).
pub const MAX_DESCS: usize = 1024;

/// Descriptors most requests have (headers, arguments, a data buffer or
/// two): room for them is made at once.
const USUAL_DESCS: usize = 8;

impl Chain {
    /// Walks `chain`, checking every descriptor against `mem`. `max_bytes`
    /// bounds each half (the largest request or reply the device accepts).
    pub fn parse<M>(mut chain: DescriptorChain<M>, max_bytes: u64) -> Result<Chain, ChainError>
    where
        M: Deref,
        M::Target: GuestMemory,
    {
        let head = chain.head_index();
        let mut out = Chain {
            head,
            segs: Vec::with_capacity(USUAL_DESCS),
            ..Chain::default()
        };
        let (mut rbytes, mut wbytes) = (0u64, 0u64);
        // The iterator ends a chain early on a bad index or a loop (its
        // TTL); what it yields is checked here.
        let mut index = 0;
        while let Some(d) = chain.next() {
            if index == MAX_DESCS {
                return Err(ChainError::TooLong {
                    descs: MAX_DESCS + 1,
                    bytes: 0,
                });
            }
            let (addr, len, write) = (d.addr(), d.len(), d.is_write_only());
            let access = if write {
                Permissions::Write
            } else {
                Permissions::Read
            };
            if len > 0 && !chain.memory().check_range(addr, len as usize, access) {
                return Err(ChainError::OutsideMemory {
                    index,
                    addr: addr.0,
                    len,
                });
            }
            if write {
                wbytes += u64::from(len);
            } else {
                if out.segs.len() > out.split {
                    return Err(ChainError::ReadableAfterWritable(index));
                }
                rbytes += u64::from(len);
                out.split += 1;
            }
            out.segs.push(Seg { addr, len });
            if rbytes > max_bytes || wbytes > max_bytes {
                return Err(ChainError::TooLong {
                    descs: index + 1,
                    bytes: rbytes + wbytes,
                });
            }
            index += 1;
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

    /// Copies the readable half, from byte `from` on, into `buf` (which
    /// must not be longer than what is left).
    pub fn read_at<M: GuestMemory>(
        &self,
        mem: &M,
        mut from: usize,
        buf: &mut [u8],
    ) -> Result<(), ChainError> {
        let mut done = 0;
        for s in self.readable() {
            let len = s.len as usize;
            if from >= len {
                from -= len;
                continue;
            }
            let n = (len - from).min(buf.len() - done);
            let addr = s.addr.unchecked_add(from as u64);
            mem.read_slice(&mut buf[done..done + n], addr)
                .map_err(ChainError::Memory)?;
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
    pub fn write_all<M: GuestMemory>(&self, mem: &M, parts: &[&[u8]]) -> Result<u32, ChainError> {
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
                mem.write_slice(&p[..n], s.addr.unchecked_add(off as u64))
                    .map_err(ChainError::Memory)?;
                off += n;
                p = &p[n..];
            }
        }
        Ok(total as u32)
    }
}
