//! The bitmap of each guest memory region: the frontend's dirty-page log
//! once it sets one (`VHOST_USER_SET_LOG_BASE`), nothing before.
//!
//! vhost-user-backend's `BitmapMmapRegion` does the logging (it maps the
//! log and marks pages in it), but costs every guest memory access: its
//! slices are owned clones (an `Arc` increment and decrement per access,
//! reads included) and each write takes its `RwLock`, log or not.
//! [`LogBitmap`] wraps it: slices borrow the region's bitmap (`RefSlice`,
//! no atomic operation), and a write looks at one flag, set once a log
//! was installed, before anything else (the cost per access:
//! docs/BENCHMARKS.md, "The dirty log's cost on the hot path").

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use vhost_user_backend::bitmap::{AtomicBitmapMmap, BitmapMmapRegion, BitmapReplace};
use vm_memory::bitmap::{Bitmap, RefSlice, WithBitmapSlice};
use vm_memory::mmap::NewBitmap;

/// A guest memory region's bitmap (see the module docs).
#[derive(Debug, Default, Clone)]
pub struct LogBitmap {
    /// Where the marks go once a log is set.
    log: BitmapMmapRegion,
    /// Whether a log was ever set (shared by the clones of this region's
    /// bitmap, as `log` is).
    on: Arc<AtomicBool>,
}

impl LogBitmap {
    /// Whether a log was set for this region.
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }
}

impl Bitmap for LogBitmap {
    fn mark_dirty(&self, offset: usize, len: usize) {
        if self.on.load(Ordering::Acquire) {
            self.log.mark_dirty(offset, len);
        }
    }

    fn dirty_at(&self, offset: usize) -> bool {
        self.on.load(Ordering::Acquire) && self.log.dirty_at(offset)
    }

    fn slice_at(&self, offset: usize) -> RefSlice<'_, Self> {
        RefSlice::new(self, offset)
    }
}

impl<'a> WithBitmapSlice<'a> for LogBitmap {
    type S = RefSlice<'a, Self>;
}

impl NewBitmap for LogBitmap {
    fn with_len(len: usize) -> Self {
        LogBitmap {
            log: BitmapMmapRegion::with_len(len),
            on: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl BitmapReplace for LogBitmap {
    type InnerBitmap = AtomicBitmapMmap;

    fn replace(&self, bitmap: AtomicBitmapMmap) {
        self.log.replace(bitmap);
        self.on.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

    #[test]
    fn nothing_is_marked_without_a_log_and_slices_share_the_regions_flag() {
        let mem = GuestMemoryMmap::<LogBitmap>::from_ranges(&[(GuestAddress(0), 1 << 16)]).unwrap();
        mem.write_slice(&[1u8; 64], GuestAddress(4096)).unwrap();
        let r = mem.find_region(GuestAddress(0)).unwrap();
        assert!(!vm_memory::GuestMemoryRegion::bitmap(r).dirty_at(4096));
        for s in GuestMemoryBackend::get_slices(&mem, GuestAddress(8192), 100) {
            s.unwrap().bitmap().mark_dirty(0, 100);
        }
        assert!(!vm_memory::GuestMemoryRegion::bitmap(r).dirty_at(8192));
    }
}
