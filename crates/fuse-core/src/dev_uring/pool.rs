//! The per-queue payload buffer pool (ADD_BUFPOOL): one memory area cut
//! into `len / buf_size` buffers with a free bitmap. A claimed buffer is
//! *moved* out of the pool to whoever uses it and moved back on release, so
//! two users can never share a buffer.

/// A buffer claimed from a pool.
#[derive(Debug)]
pub(crate) struct PoolBuf {
    pub index: u16,
    pub mem: Box<[u8]>,
}

#[derive(Debug)]
pub(crate) struct Pool {
    buf_size: usize,
    bufs: Vec<Option<Box<[u8]>>>,
    /// Bit i set = buffer i free.
    free: Vec<u64>,
}

impl Pool {
    /// Cuts `mem` into buffers of `buf_size` (the remainder is unused).
    pub fn new(mem: Vec<u8>, buf_size: usize) -> Pool {
        let n = (mem.len() / buf_size.max(1)).min(usize::from(u16::MAX));
        let bufs: Vec<Option<Box<[u8]>>> = mem
            .chunks_exact(buf_size)
            .take(n)
            .map(|c| Some(c.to_vec().into_boxed_slice()))
            .collect();
        let mut free = vec![0u64; n.div_ceil(64)];
        for i in 0..n {
            free[i / 64] |= 1 << (i % 64);
        }
        Pool {
            buf_size,
            bufs,
            free,
        }
    }

    #[cfg(feature = "test-utils")]
    pub fn len(&self) -> usize {
        self.bufs.len()
    }

    #[cfg(feature = "test-utils")]
    pub fn free_count(&self) -> usize {
        self.free.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Claims the first free buffer.
    pub fn claim(&mut self) -> Option<PoolBuf> {
        let (w, word) = self.free.iter().enumerate().find(|(_, w)| **w != 0)?;
        let bit = word.trailing_zeros() as usize;
        let i = w * 64 + bit;
        self.free[w] &= !(1 << bit);
        let mem = self.bufs.get_mut(i)?.take()?;
        Some(PoolBuf {
            index: i as u16,
            mem,
        })
    }

    /// Returns a buffer. A buffer that does not belong here is dropped.
    pub fn put(&mut self, b: PoolBuf) {
        let i = usize::from(b.index);
        if let Some(slot) = self.bufs.get_mut(i) {
            if slot.is_none() && b.mem.len() == self.buf_size {
                *slot = Some(b.mem);
                self.free[i / 64] |= 1 << (i % 64);
            }
        }
    }

    /// Offset of buffer `index` in the pool memory.
    pub fn offset(&self, index: u16) -> u32 {
        (usize::from(index) * self.buf_size) as u32
    }
}
