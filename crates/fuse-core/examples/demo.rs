//! The embedded demo: a tiny FUSE server served through the in-process
//! device, driven by the engine with the kernel's semantics. No mount, no
//! root, no VM.
//!
//! `cargo run -p fuse-core --example demo`

use fuse_core::abi::{self, Attr, AttrOut, InHeader, InitOut, Opcode};
use fuse_core::{Args, Chan, ChanConfig, Device, Errno};
use std::time::{Duration, Instant};
use zerocopy::{FromBytes, IntoBytes};

/// A server that answers INIT, GETATTR and READ, and never answers
/// anything on node 666 (a "hung" backend).
fn server(dev: Device) {
    let mut buf = vec![0u8; dev.min_read_buffer().max(1 << 20)];
    while let Ok(n) = dev.read(&mut buf) {
        let Ok((h, _)) = InHeader::read_from_prefix(&buf[..n]) else {
            continue;
        };
        let reply = |err: i32, body: &[u8]| {
            let _ = dev.write(&abi::encode::reply(h.unique, err, body));
        };
        match Opcode::from_u32(h.opcode) {
            Some(Opcode::Init) => {
                let out = InitOut {
                    major: 7,
                    minor: 45,
                    max_background: 4,
                    congestion_threshold: 3,
                    max_write: 128 * 1024,
                    flags: abi::init::INIT_EXT as u32,
                    flags2: (abi::init::REQUEST_TIMEOUT >> 32) as u32,
                    request_timeout: 1,
                    ..Default::default()
                };
                reply(0, out.as_bytes());
            }
            Some(Opcode::Interrupt) | Some(Opcode::Forget) | Some(Opcode::BatchForget) => {}
            _ if h.nodeid == 666 => {} // hang
            Some(Opcode::Getattr) => {
                let out = AttrOut {
                    attr_valid: 1,
                    attr: Attr {
                        ino: h.nodeid,
                        mode: 0o100644,
                        nlink: 1,
                        size: 42,
                        ..Default::default()
                    },
                    ..Default::default()
                };
                reply(0, out.as_bytes());
            }
            Some(Opcode::Read) => reply(0, b"hello from the box\n"),
            _ => reply(Errno::ENOSYS.to_wire(), &[]),
        }
    }
}

fn main() {
    let chan = Chan::new(ChanConfig {
        scan_period: Duration::from_millis(250),
        ..Default::default()
    });
    let dev = chan.device().expect("in-process device");
    let srv = std::thread::spawn(move || server(dev));

    let neg = chan.init().expect("INIT");
    println!(
        "INIT: protocol 7.{} max_background={} congestion_threshold={} request_timeout={:?}",
        neg.minor, neg.max_background, neg.congestion_threshold, neg.request_timeout
    );

    let attr: AttrOut = chan
        .send(Args::new(Opcode::Getattr, 1).out(std::mem::size_of::<AttrOut>(), false))
        .expect("GETATTR")
        .read()
        .expect("attr_out");
    println!(
        "GETATTR ino=1: mode={:o} size={}",
        attr.attr.mode, attr.attr.size
    );

    let data = chan
        .send(Args::new(Opcode::Read, 2).out(4096, true))
        .expect("READ");
    print!("READ: {}", String::from_utf8_lossy(&data.data));

    let (tx, rx) = std::sync::mpsc::channel();
    for i in 0..20 {
        let tx = tx.clone();
        chan.send_background(
            Args::new(Opcode::Read, 10 + i).out(4096, true),
            fuse_core::EndFn::once(move |r| {
                tx.send(r.is_ok()).unwrap();
            }),
        )
        .expect("background");
    }
    let ok = (0..20).filter(|_| rx.recv().unwrap()).count();
    println!(
        "20 background READs through max_background=4: {ok} ok; stats {:?}",
        chan.stats()
    );

    let start = Instant::now();
    let r = chan.send(Args::new(Opcode::Getattr, 666).out(std::mem::size_of::<AttrOut>(), false));
    println!(
        "GETATTR on a hung node: {:?} after {:.1}s (timeout 1s, scan every 250ms); timeouts fired: {}",
        r.as_ref().map(|_| ()),
        start.elapsed().as_secs_f64(),
        chan.stats().timeouts_fired
    );
    assert_eq!(r, Err(Errno::ENOTCONN));
    chan.wait_aborted();
    srv.join().unwrap();
    println!("connection aborted cleanly; server exited");
}
