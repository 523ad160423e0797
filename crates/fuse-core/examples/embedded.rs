//! Testing a FUSE server without mounting: a small filesystem driven
//! through the embedded engine, with the kernel's interrupt, kill, abort
//! and timeout behaviour asserted. Runs in CI.
//!
//! `cargo run -p fuse-core --example embedded`

use fuse_core::abi::{Attr, ROOT_ID};
use fuse_core::embedded::{Embedded, Options, TraceEvent};
use fuse_core::server::{Ctx, Entry, Filesystem, FsResult, Opened, ReadSink};
use fuse_core::{abi::Opcode, Errno};
use std::collections::HashSet;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Three files: "hello" answers at once, "slow" waits until its request is
/// interrupted (then answers EINTR, as a well-behaved server does), and
/// "stuck" never answers (a hung backend).
#[derive(Default)]
struct SmallFs {
    interrupted: Mutex<HashSet<u64>>,
    cv: Condvar,
}

const HELLO: u64 = 2;
const SLOW: u64 = 3;
const STUCK: u64 = 4;

fn attr(ino: u64) -> Attr {
    Attr {
        ino,
        mode: if ino == ROOT_ID { 0o40755 } else { 0o100644 },
        nlink: 1,
        size: 6,
        ..Default::default()
    }
}

impl Filesystem for SmallFs {
    type Inode = u64;
    type Handle = u64;
    type Io = ();

    fn new_io(&self, _: fuse_core::server::Wake) {}

    fn lookup(&self, _: &Ctx, parent: u64, name: &[u8]) -> FsResult<Entry<u64>> {
        let ino = match (parent, name) {
            (ROOT_ID, b"hello") => HELLO,
            (ROOT_ID, b"slow") => SLOW,
            (ROOT_ID, b"stuck") => STUCK,
            _ => return Err(Errno::ENOENT),
        };
        Ok(Entry {
            inode: ino,
            generation: 0,
            attr: attr(ino),
            entry_valid: Duration::from_secs(1),
            attr_valid: Duration::from_secs(1),
        })
    }
    fn getattr(&self, _: &Ctx, ino: u64, _: Option<u64>) -> FsResult<(Attr, Duration)> {
        Ok((attr(ino), Duration::from_secs(1)))
    }
    fn open(&self, _: &Ctx, ino: u64, _: u32) -> FsResult<Opened<u64>> {
        Ok(Opened {
            handle: ino,
            open_flags: 0,
            backing_id: 0,
        })
    }
    fn read(
        &self,
        ctx: &Ctx,
        ino: u64,
        _: u64,
        off: u64,
        sink: &mut dyn ReadSink,
    ) -> FsResult<usize> {
        match ino {
            SLOW => {
                let mut seen = self.interrupted.lock().unwrap();
                while !seen.remove(&ctx.unique) {
                    seen = self.cv.wait(seen).unwrap();
                }
                Err(Errno::EINTR)
            }
            STUCK => loop {
                std::thread::park();
            },
            _ => {
                let data = &b"hello\n"[(off as usize).min(6)..];
                let n = data.len().min(sink.buffer().len());
                sink.buffer()[..n].copy_from_slice(&data[..n]);
                Ok(n)
            }
        }
    }
    fn interrupt(&self, unique: u64) {
        self.interrupted.lock().unwrap().insert(unique);
        self.cv.notify_all();
    }
}

fn until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(10), "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn main() {
    // 1. Plain calls, and the trace of what the server saw.
    let opts = Options {
        workers: 2,
        ..Options::default()
    };
    let fs = Embedded::start_traced(SmallFs::default(), opts).unwrap();
    let c = fs.client();
    let hello = c.lookup(ROOT_ID, b"hello").unwrap().nodeid;
    let fh = c.open(hello, 0).unwrap().fh;
    assert_eq!(c.read(hello, fh, 0, 100).unwrap(), b"hello\n");
    assert_eq!(c.lookup(ROOT_ID, b"nope").unwrap_err(), Errno::ENOENT);
    assert!(fs.trace().iter().any(|e| matches!(
        e,
        TraceEvent::Request {
            opcode: Some(Opcode::Read),
            ..
        }
    )));
    println!("plain calls: ok ({} trace events)", fs.trace().len());

    // 2. Interrupt: the caller's signal queues FUSE_INTERRUPT; the server
    //    stops the read and answers EINTR; the caller gets EINTR.
    let slow = c.lookup(ROOT_ID, b"slow").unwrap().nodeid;
    let call = fs.chan().call(
        fuse_core::Args::new(Opcode::Read, slow)
            .body(
                fuse_core::abi::encode::Body::new()
                    .push(&fuse_core::abi::ReadIn {
                        fh: slow,
                        size: 100,
                        ..Default::default()
                    })
                    .into_vec(),
            )
            .out(100, true),
    );
    let sig = call.signal();
    let t = std::thread::spawn(move || call.wait());
    until("the server got the slow read", || {
        fs.chan().stats().processing == 1
    });
    sig.interrupt();
    assert_eq!(t.join().unwrap().unwrap_err(), Errno::EINTR);
    assert!(fs.trace().iter().any(|e| matches!(
        e,
        TraceEvent::Request {
            opcode: Some(Opcode::Interrupt),
            ..
        }
    )));
    println!("interrupt: the server saw FUSE_INTERRUPT and answered EINTR");

    // 3. Kill: a request the server has not read yet is withdrawn at once
    //    (EINTR) and never reaches it. Both workers are held by stuck reads.
    let stuck = c.lookup(ROOT_ID, b"stuck").unwrap().nodeid;
    let read_stuck =
        |c: fuse_core::client::Client| std::thread::spawn(move || c.read(stuck, stuck, 0, 10));
    let hung: Vec<_> = (0..2).map(|_| read_stuck(c.clone())).collect();
    until("both workers hung", || fs.chan().stats().processing == 2);
    let pending = fs
        .chan()
        .call(fuse_core::Args::new(Opcode::Getattr, hello).out(104, false));
    let kill = pending.signal();
    let p = std::thread::spawn(move || pending.wait());
    until("queued", || fs.chan().stats().pending == 1);
    kill.kill();
    assert_eq!(p.join().unwrap().unwrap_err(), Errno::EINTR);
    println!("kill: an unsent request is withdrawn with EINTR");

    // 4. Abort: everything in flight ends with ENOTCONN, and so does every
    //    later call.
    fs.abort();
    for h in hung {
        assert_eq!(h.join().unwrap().unwrap_err(), Errno::ENOTCONN);
    }
    assert_eq!(c.getattr(hello, None).unwrap_err(), Errno::ENOTCONN);
    println!("abort: in-flight and later calls get ENOTCONN");
    // The stuck server threads are parked forever; a real test would give
    // its filesystem a way out. Leak this instance instead of joining them.
    std::mem::forget(fs);

    // 5. Timeout: with a 1 s request timeout, a hung backend is detected by
    //    the periodic scan and the connection is aborted (the kernel's
    //    answer to a hung server), within timeout + one scan period.
    let opts = Options {
        request_timeout: Duration::from_secs(1),
        scan_period: Duration::from_millis(100),
        workers: 1,
        ..Options::default()
    };
    let fs = Embedded::start(SmallFs::default(), opts).unwrap();
    let c = fs.client().clone();
    let stuck = c.lookup(ROOT_ID, b"stuck").unwrap().nodeid;
    let start = Instant::now();
    assert_eq!(c.read(stuck, stuck, 0, 10).unwrap_err(), Errno::ENOTCONN);
    let took = start.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert!(fs.chan().stats().timeouts_fired >= 1);
    println!("timeout: hung read aborted the connection after {took:.1?}");
    std::mem::forget(fs);
}
