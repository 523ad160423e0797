//! Device-style worker loops: read a request, dispatch it, write the reply.

use super::dispatch::DeferFn;
use super::{Deferred, Dispatcher, Filesystem, Handled};
use crate::chan::{Device, Errno, Fence};
use std::sync::Arc;

/// A device-style transport end (`/dev/fuse` or the in-process [`Device`]).
pub trait DeviceEnd: Send + Sync {
    /// Reads one message into `buf`.
    fn read_msg(&self, buf: &mut [u8]) -> Result<usize, Errno>;
    /// [`DeviceEnd::read_msg`], with the request's fence (`Args::fence`)
    /// in `fence` when the transport carries one.
    fn read_msg_fenced(
        &self,
        buf: &mut [u8],
        fence: &mut Option<Arc<Fence>>,
    ) -> Result<usize, Errno> {
        *fence = None;
        self.read_msg(buf)
    }
    /// Writes one reply: header plus `payload`.
    fn write_reply(&self, unique: u64, error: i32, payload: &[u8]) -> Result<(), Errno>;
    /// Smallest buffer `read_msg` accepts.
    fn min_read_buffer(&self) -> usize;
}

impl DeviceEnd for Device {
    fn read_msg(&self, buf: &mut [u8]) -> Result<usize, Errno> {
        self.read(buf)
    }
    fn read_msg_fenced(
        &self,
        buf: &mut [u8],
        fence: &mut Option<Arc<Fence>>,
    ) -> Result<usize, Errno> {
        self.read_fenced(buf, fence)
    }
    fn write_reply(&self, unique: u64, error: i32, payload: &[u8]) -> Result<(), Errno> {
        self.write_with(unique, error, payload.len(), |dst| {
            dst.copy_from_slice(payload)
        })
        .map(|_| ())
    }
    fn min_read_buffer(&self) -> usize {
        Device::min_read_buffer(self)
    }
}

/// Largest reply payload a worker prepares (max_pages × 4 KiB plus room for
/// a READDIR record).
const OUT_BUF: usize = (1 << 20) + 4096;

/// Serves `end` until it reports the connection gone (ENODEV or
/// ECONNABORTED). A reply the device refuses (ENOENT: the request was
/// interrupted or aborted meanwhile) is dropped; the loop keeps serving.
///
/// A request that would wait (SETLKW) is answered on this thread; use
/// [`serve_device`] to park such requests instead.
pub fn run_device_worker<E: DeviceEnd + ?Sized, F: Filesystem>(end: &E, disp: &Dispatcher<F>) {
    device_loop(end, disp, None)
}

fn device_loop<E: DeviceEnd + ?Sized, F: Filesystem>(
    end: &E,
    disp: &Dispatcher<F>,
    defer: Option<DeferFn<'_>>,
) {
    let mut inbuf = vec![0u8; end.min_read_buffer().max(OUT_BUF + 4096)];
    let mut out = vec![0u8; OUT_BUF];
    let mut fence = None;
    loop {
        let n = match end.read_msg_fenced(&mut inbuf, &mut fence) {
            Ok(n) => n,
            Err(Errno::EINTR) | Err(Errno::EAGAIN) => continue,
            Err(_) => return,
        };
        let msg = &inbuf[..n];
        if let Handled::Reply(o) = disp.handle_bytes_fenced(msg, &mut out, defer, fence.as_ref()) {
            let _ = end.write_reply(o.unique, o.error, &out[..o.len]);
        }
    }
}

/// Starts `threads` device workers; they exit when the connection goes.
/// Requests that wait (SETLKW) are parked and answered from whichever
/// thread completes them, so they never pin a worker.
pub fn serve_device<E, F>(
    end: E,
    disp: Arc<Dispatcher<F>>,
    threads: usize,
) -> Vec<std::thread::JoinHandle<()>>
where
    E: DeviceEnd + Clone + 'static,
    F: Filesystem + 'static,
{
    (0..threads.max(1))
        .map(|_| {
            let (end, disp) = (end.clone(), disp.clone());
            std::thread::spawn(move || {
                let make = |unique: u64| {
                    let end = end.clone();
                    Deferred::new(move |error| {
                        let _ = end.write_reply(unique, error, &[]);
                    })
                };
                device_loop(&end, &disp, Some(&make))
            })
        })
        .collect()
}
