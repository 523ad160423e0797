//! The passthrough's host I/O contexts (`Filesystem::Io`): what one
//! serving loop starts, only that loop's context completes, even on the
//! same thread as another. Needs root (mount, loop devices).

mod common;

use common::{Kind, Mount, Via};
use fuse_core::abi::ROOT_ID;
use fuse_core::server::{Completions, Ctx, Filesystem, IoDone};
use fuse_core::{ClientMem, Errno, HostSpan};
use passthrough::Config;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A page of aligned memory standing in for a client's (O_DIRECT wants
/// it aligned).
struct Page {
    buf: *mut u8,
    spans: [HostSpan; 1],
    held: AtomicIsize,
}

// SAFETY: the page is a private allocation used only through `ClientMem`.
unsafe impl Send for Page {}
// SAFETY: as above; `held` is atomic.
unsafe impl Sync for Page {}

impl Page {
    fn new(fill: u8) -> Arc<Page> {
        let layout = std::alloc::Layout::from_size_align(4096, 4096).unwrap();
        // SAFETY: a non-zero size.
        let buf = unsafe { std::alloc::alloc(layout) };
        assert!(!buf.is_null());
        // SAFETY: `buf` is 4096 writable bytes just allocated.
        unsafe { std::ptr::write_bytes(buf, fill, 4096) };
        Arc::new(Page {
            buf,
            spans: [HostSpan {
                addr: buf as usize,
                len: 4096,
            }],
            held: AtomicIsize::new(0),
        })
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(4096, 4096).unwrap();
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.buf, layout) };
    }
}

impl std::fmt::Debug for Page {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Page").finish_non_exhaustive()
    }
}

// SAFETY: the span is the page's own allocation, mapped and writable while
// the page lives, no Rust object handed out elsewhere.
unsafe impl ClientMem for Page {
    fn spans(&self) -> &[HostSpan] {
        &self.spans
    }
    fn begin_io(&self) -> bool {
        self.held.fetch_add(1, Ordering::SeqCst);
        true
    }
    fn end_io(&self) {
        self.held.fetch_sub(1, Ordering::SeqCst);
    }
    fn read_at(&self, off: usize, buf: &mut [u8]) -> Result<(), Errno> {
        // SAFETY: bounds checked by the slice below.
        let page = unsafe { std::slice::from_raw_parts(self.buf, 4096) };
        buf.copy_from_slice(page.get(off..off + buf.len()).ok_or(Errno::EIO)?);
        Ok(())
    }
    fn write_at(&self, _: usize, _: &[u8]) -> Result<(), Errno> {
        Err(Errno::EIO)
    }
}

fn ctx(unique: u64) -> Ctx<'static> {
    Ctx {
        unique,
        pid: 1,
        ..Ctx::default()
    }
}

/// Two serving loops on one thread, each with its own context: a WRITE
/// started on the first is never handed back by the second's
/// `collect_started`, however long it is asked, and the first's hands it
/// back. (Per-thread state handed a thread's completions to whichever
/// loop asked first.)
#[test]
fn a_started_write_is_completed_by_the_loop_that_owns_its_context_only() {
    let m = Mount::new(Kind::Ext4, Config::default(), Via::Device(1));
    let fs = m.fs();
    let direct = libc::O_DIRECT as u32;
    let (e, o) = m
        .client
        .create(ROOT_ID, b"f", 0o644, libc::O_RDWR as u32 | direct, 0)
        .unwrap();
    let mut a = fs.new_io(Arc::new(|| {}));
    let mut b = fs.new_io(Arc::new(|| {}));
    let (mut done_a, mut done_b) = (Completions::default(), Completions::default());
    let page = Page::new(0x42);
    let mem: Arc<dyn ClientMem> = page.clone();
    let unique = 1 << 42;
    fs.start_write(
        &mut a,
        &mut done_a,
        &ctx(unique),
        e.nodeid,
        o.fh,
        0,
        &mem,
        0,
        IoDone::new(unique),
    )
    .expect("an O_DIRECT write to ext4 is started");
    assert_eq!(fs.started_in_flight(&a), 1);
    assert_eq!(fs.started_in_flight(&b), 0);
    fs.submit_started(&mut a);
    fs.submit_started(&mut b);
    // Long enough for the write to land on the host.
    let t = Instant::now();
    while std::fs::read(m.path("f")).unwrap() != vec![0x42u8; 4096] {
        assert!(t.elapsed() < Duration::from_secs(10), "never landed");
        std::thread::sleep(Duration::from_millis(1));
    }
    for _ in 0..50 {
        assert_eq!(fs.collect_started(&mut b, &mut done_b), 0);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(done_b.is_empty(), "another loop took the completion");
    assert_eq!(page.held.load(Ordering::SeqCst), 1, "memory let go early");
    let t = Instant::now();
    while fs.started_in_flight(&a) > 0 {
        assert!(t.elapsed() < Duration::from_secs(10), "never completed");
        fs.collect_started(&mut a, &mut done_a);
    }
    let got: Vec<_> = done_a.drain().collect();
    assert_eq!(got, vec![(unique, Ok(4096))]);
    assert_eq!(page.held.load(Ordering::SeqCst), 0);
    m.client.release(e.nodeid, o.fh, 0).unwrap();
}
