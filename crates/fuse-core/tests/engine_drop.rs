//! An engine whose last owner lets go of it on one of its own server
//! threads (a device's request ending there, holding the last reference to
//! the device) shuts down: the other threads are joined, the current one
//! is left to return, and nothing panics.

use fuse_core::abi::{Attr, GetattrIn, Opcode};
use fuse_core::server::{Ctx, Engine, EngineConfig, Filesystem, FsResult, Wake};
use fuse_core::Args;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zerocopy::{FromZeros, IntoBytes};

type Slot = Arc<Mutex<Option<Engine<DropsEngine>>>>;

/// GETATTR takes the engine out of its slot and drops it, on the server
/// thread that serves it.
struct DropsEngine {
    slot: Slot,
    dropped: Arc<AtomicBool>,
}

impl Filesystem for DropsEngine {
    type Inode = u64;
    type Handle = u64;
    type Io = ();

    fn new_io(&self, _: Wake) {}
    fn getattr(&self, _ctx: &Ctx, ino: u64, _fh: Option<u64>) -> FsResult<(Attr, Duration)> {
        let engine = self.slot.lock().unwrap().take();
        drop(engine);
        self.dropped.store(true, Ordering::SeqCst);
        Ok((
            Attr {
                ino,
                mode: 0o040_755,
                nlink: 2,
                ..Attr::new_zeroed()
            },
            Duration::ZERO,
        ))
    }
}

#[test]
fn an_engine_dropped_on_its_own_server_thread_shuts_down() {
    let slot: Slot = Arc::default();
    let dropped = Arc::new(AtomicBool::new(false));
    let fs = DropsEngine {
        slot: slot.clone(),
        dropped: dropped.clone(),
    };
    let engine = Engine::start(fs, EngineConfig::default()).unwrap();
    let chan = engine.chan().clone();
    *slot.lock().unwrap() = Some(engine);
    let getattr = Args::new(Opcode::Getattr, 1)
        .body(GetattrIn::new_zeroed().as_bytes().to_vec())
        .out(104, false);
    let caller = std::thread::spawn(move || chan.send(getattr));
    let t = Instant::now();
    while !dropped.load(Ordering::SeqCst) && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        dropped.load(Ordering::SeqCst),
        "dropping the engine on its own server thread did not return"
    );
    // The request ends one way or the other (answered, or the connection
    // aborted under it); the caller is not left waiting.
    let _ = caller.join().unwrap();
    assert!(slot.lock().unwrap().is_none());
}
