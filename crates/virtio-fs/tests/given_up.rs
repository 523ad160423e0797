//! What a vring stop or a device reset gives up, and what a guest that
//! reboots leaves behind: a request given up never acts on the host
//! afterwards; the vhost-user thread never waits without bound for host
//! work that hangs; a reset or a new INIT ends the guest's session, its
//! locks and handles with it.

mod common;

use common::*;
use fuse_core::abi::{init, EntryOut, InitIn, Opcode, ReadIn, SetattrIn};
use fuse_core::server::faults::{FaultPlan, Faulty};
use fuse_core::server::{Ctx, Entry, Filesystem, FsResult, ReadSink};
use fuse_core::Errno;
use passthrough::{Config, PassthroughFs};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use vhost_user_backend::VhostUserBackend;
use virtio_fs::DeviceConfig;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

/// The tests count this process's fds and threads: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    fuse_core::locks::lock(&SERIAL)
}

/// How long a stop waits for what it gives up, in these tests.
const BOUND: Duration = Duration::from_millis(300);

fn cfg() -> DeviceConfig {
    DeviceConfig {
        queue_size: QSIZE,
        vring_stop_drain: BOUND,
        ..DeviceConfig::default()
    }
}

/// LOOKUP of `f`: its nodeid.
fn lookup_f<F: Filesystem>(g: &mut Guest<F>) -> u64 {
    let (e, b) = g.call(Opcode::Lookup, 2, 1, b"f\0");
    assert_eq!(e, 0, "LOOKUP f");
    EntryOut::read_from_prefix(&b).unwrap().0.nodeid
}

fn truncate_to_zero() -> SetattrIn {
    SetattrIn {
        valid: fuse_core::abi::fattr::SIZE,
        size: 0,
        ..SetattrIn::new_zeroed()
    }
}

#[test]
fn a_setattr_given_up_at_a_vring_stop_never_truncates_the_file() {
    let _serial = serial();
    // The SETATTR is held in front of the passthrough (as by a slow lock
    // or a busy worker) until after the stop gave it up. Once let go, it
    // must not truncate the file: the destination of a migration may be
    // writing it by then.
    let mut g = Guest::with(
        "gaveup",
        |dir| {
            Faulty::new(
                PassthroughFs::new(dir, Config::default()).unwrap(),
                FaultPlan::parse("setattr:delay=1500ms", 1).unwrap(),
            )
        },
        cfg(),
    );
    let node = lookup_f(&mut g);
    g.send(Opcode::Setattr, 4, node, truncate_to_zero().as_bytes());
    let fs = g.h.dev.engine().fs();
    wait_for("the SETATTR to be held", || {
        fs.counts().delays.load(Ordering::Relaxed) == 1
    });
    let t = Instant::now();
    g.h.dev.stop_vring(1).unwrap();
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    let stats = g.h.dev.stats();
    assert_eq!(stats.lost_on_stop(), 1);
    // The hold ends; the request reaches the passthrough, and ends.
    wait_for("the SETATTR to end", || {
        g.h.dev.engine().chan().stats().waiting == 0
    });
    assert_eq!(
        std::fs::read(g.dir.join("f")).unwrap(),
        b"locked",
        "a request given up truncated the file"
    );
    assert_eq!(stats.stuck_on_stop(), 0);
}

#[test]
fn a_request_still_queued_at_a_vring_stop_never_reaches_the_filesystem() {
    let _serial = serial();
    // The queue's one worker is stuck in a GETATTR, so the SETATTR behind
    // it waits in the engine: given up at the stop, it is answered
    // unseen once the worker is free, never served.
    let mut g = Guest::with(
        "queued",
        |dir| {
            Faulty::new(
                PassthroughFs::new(dir, Config::default()).unwrap(),
                FaultPlan::parse("getattr:hang:times=1, setattr:delay=1ms", 1).unwrap(),
            )
        },
        DeviceConfig {
            workers_per_queue: 1,
            ..cfg()
        },
    );
    let node = lookup_f(&mut g);
    g.send(Opcode::Getattr, 4, node, &[0u8; 16]);
    let dev = g.h.dev.clone();
    let fs = dev.engine().fs();
    wait_for("the GETATTR to hang", || {
        fs.counts().hangs.load(Ordering::Relaxed) == 1
    });
    g.send(Opcode::Setattr, 6, node, truncate_to_zero().as_bytes());
    g.h.dev.stop_vring(1).unwrap();
    assert_eq!(g.h.dev.stats().lost_on_stop(), 2);
    fs.release_hangs();
    wait_for("both to end", || {
        g.h.dev.engine().chan().stats().waiting == 0
    });
    assert_eq!(
        fs.counts().delays.load(Ordering::Relaxed),
        0,
        "the SETATTR given up reached the filesystem"
    );
    assert_eq!(std::fs::read(g.dir.join("f")).unwrap(), b"locked");
}

#[test]
fn a_lock_call_given_up_at_a_vring_stop_never_takes_its_lock() {
    let _serial = serial();
    // Lock calls travel over the engine's device, not the ring: they go
    // under the fence all the same.
    let mut g = Guest::with(
        "gaveuplk",
        |dir| {
            Faulty::new(
                PassthroughFs::new(dir, Config::default()).unwrap(),
                FaultPlan::parse("setlk:delay=1500ms", 1).unwrap(),
            )
        },
        cfg(),
    );
    let (node, fh) = g.open_f();
    g.send(Opcode::Setlk, 6, node, lk(fh, 1, libc::F_WRLCK).as_bytes());
    let fs = g.h.dev.engine().fs();
    wait_for("the SETLK to be held", || {
        fs.counts().delays.load(Ordering::Relaxed) == 1
    });
    g.h.dev.stop_vring(1).unwrap();
    assert_eq!(g.h.dev.stats().lost_on_stop(), 1);
    wait_for("the SETLK to end", || {
        g.h.dev.engine().chan().stats().waiting == 0
    });
    assert!(
        host_can_lock(&g.dir.join("f")).0,
        "a SETLK given up at the stop took its lock afterwards"
    );
}

/// A filesystem whose SETATTR and READ hang inside their host call (as on
/// a dead NFS server) until `release`.
#[derive(Default)]
struct Hung {
    released: Mutex<bool>,
    cv: Condvar,
    inside: std::sync::atomic::AtomicUsize,
}

impl Hung {
    fn hang(&self) {
        self.inside.fetch_add(1, Ordering::SeqCst);
        let mut r = self.released.lock().unwrap();
        while !*r {
            r = self.cv.wait(r).unwrap();
        }
    }
    fn release(&self) {
        *self.released.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

/// [`Hung`] as a filesystem.
struct HungFs(Arc<Hung>);

impl Filesystem for HungFs {
    type Inode = u64;
    type Handle = u64;
    type Io = ();

    fn new_io(&self, _: fuse_core::server::Wake) {}
    fn lookup(&self, _ctx: &Ctx, _parent: u64, _name: &[u8]) -> FsResult<Entry<u64>> {
        Err(Errno::ENOENT)
    }
    fn setattr(
        &self,
        ctx: &Ctx,
        _inode: u64,
        _arg: &SetattrIn,
    ) -> FsResult<(fuse_core::abi::Attr, Duration)> {
        let _host = ctx.enter_host()?;
        self.0.hang();
        Err(Errno::EIO)
    }
    fn read(
        &self,
        _ctx: &Ctx,
        _inode: u64,
        _handle: u64,
        _offset: u64,
        sink: &mut dyn ReadSink,
    ) -> FsResult<usize> {
        // Host I/O into the guest's buffers, which never ends by itself.
        let (mem, _) = sink.client().ok_or(Errno::EIO)?;
        let _io = mem.io().ok_or(Errno::EIO)?;
        self.0.hang();
        Err(Errno::EIO)
    }
}

#[test]
fn host_work_that_outlives_a_stop_is_waited_for_with_a_bound_and_counted() {
    let _serial = serial();
    // GET_VRING_BASE waits on the vhost-user thread, and QEMU waits for
    // its answer to stop, migrate or reboot the VM: a host call that never
    // returns (inside a fence) and I/O on the guest's buffers that never
    // ends must not hold it for good.
    let hung = Arc::new(Hung::default());
    let mut g = Guest::with("hung", |_| HungFs(hung.clone()), cfg());
    g.send(Opcode::Setattr, 4, 1, truncate_to_zero().as_bytes());
    let read = ReadIn {
        size: 4096,
        ..ReadIn::new_zeroed()
    };
    g.send(Opcode::Read, 6, 1, read.as_bytes());
    wait_for("both to hang", || hung.inside.load(Ordering::SeqCst) == 2);
    let dev = g.h.dev.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let t = Instant::now();
        dev.stop_vring(1).unwrap();
        let _ = tx.send(t.elapsed());
    });
    let took = rx.recv_timeout(Duration::from_secs(10));
    hung.release();
    let took = took.expect("the vring stop never returned");
    // The drain's bound, then the bound of the wait for what it gave up.
    assert!(took < 4 * BOUND, "{took:?}");
    let stats = g.h.dev.stats();
    assert_eq!(stats.lost_on_stop(), 2);
    assert_eq!(stats.stuck_on_stop(), 2);
}

/// The fds this process has open.
fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Whether a process of its own (not this one, whose OFD locks and flocks
/// on other descriptions would also conflict) can take a write lock and
/// an exclusive flock on `path`, without waiting.
fn host_can_lock(path: &std::path::Path) -> (bool, bool) {
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import fcntl, sys\n\
             f = open(sys.argv[1], 'r+')\n\
             def t(fn):\n\
             \x20   try:\n\
             \x20       fn(); return '1'\n\
             \x20   except OSError:\n\
             \x20       return '0'\n\
             print(t(lambda: fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)) + \
             t(lambda: fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)))",
        )
        .arg(path)
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "python3: {s}");
    (s.starts_with('1'), s.trim_end().ends_with('1'))
}

/// The guest's INIT (what a Linux guest offers, with locks).
fn guest_init<F: Filesystem>(g: &mut Guest<F>, unique: u64) {
    let (f1, f2) = init::split(
        init::ASYNC_READ
            | init::POSIX_LOCKS
            | init::FLOCK_LOCKS
            | init::BIG_WRITES
            | init::INIT_EXT,
    );
    let i = InitIn {
        major: 7,
        minor: 38,
        max_readahead: 128 * 1024,
        flags: f1,
        flags2: f2,
        ..InitIn::new_zeroed()
    };
    let (e, _) = g.call(Opcode::Init, unique, 0, i.as_bytes());
    assert_eq!(e, 0, "INIT");
}

/// Boots a guest session: INIT, 50 files looked up and opened, and on `f`
/// a POSIX write lock and a flock. Returns the fds this process had
/// before the files were opened.
fn hold_locks_and_files(g: &mut Guest) -> usize {
    guest_init(g, 100);
    let before = fds();
    for i in 0..50 {
        let name = format!("n{i}");
        std::fs::write(g.dir.join(&name), b"x").unwrap();
        let (e, b) = g.call(
            Opcode::Lookup,
            200 + 4 * i,
            1,
            format!("{name}\0").as_bytes(),
        );
        assert_eq!(e, 0);
        let node = EntryOut::read_from_prefix(&b).unwrap().0.nodeid;
        let open = fuse_core::abi::OpenIn {
            flags: libc::O_RDONLY as u32,
            open_flags: 0,
        };
        let (e, _) = g.call(Opcode::Open, 202 + 4 * i, node, open.as_bytes());
        assert_eq!(e, 0);
    }
    let (node, fh) = g.open_f();
    let (e, _) = g.call(Opcode::Setlk, 6, node, lk(fh, 1, libc::F_WRLCK).as_bytes());
    assert_eq!(e, 0, "POSIX lock");
    let mut fl = lk(fh, 2, libc::F_WRLCK);
    fl.lk_flags = fuse_core::abi::flags::LK_FLOCK;
    let (e, _) = g.call(Opcode::Setlk, 8, node, fl.as_bytes());
    assert_eq!(e, 0, "flock");
    assert_eq!(host_can_lock(&g.dir.join("f")), (false, false));
    assert!(fds() >= before + 50, "the daemon holds the open files");
    before
}

#[test]
fn a_device_reset_ends_the_guests_session() {
    let _serial = serial();
    // A guest reset (RESET_DEVICE) and reboot sends no DESTROY: the old
    // session's locks and open files must not outlive it.
    let mut g = Guest::new("resetsess");
    let before = hold_locks_and_files(&mut g);
    g.h.dev.reset_device();
    assert_eq!(host_can_lock(&g.dir.join("f")), (true, true));
    assert_eq!(fds(), before, "the session's fds are closed");
    assert_eq!(g.h.dev.stats().sessions_ended(), 1);
}

#[test]
fn a_new_init_ends_the_old_session_first() {
    let _serial = serial();
    // What QEMU does on a guest reboot without RESET_DEVICE: every vring
    // stopped (GET_VRING_BASE), then fresh vrings and the rebooted
    // kernel's INIT.
    let mut g = Guest::new("reinit");
    let before = hold_locks_and_files(&mut g);
    g.h.dev.stop_vring(1).unwrap();
    assert_eq!(
        host_can_lock(&g.dir.join("f")),
        (false, false),
        "a vring stop alone (a paused VM) keeps the session"
    );
    g.restart();
    guest_init(&mut g, 2);
    assert_eq!(host_can_lock(&g.dir.join("f")), (true, true));
    assert_eq!(fds(), before, "the old session's fds are closed");
    // The new session works, and takes the locks again.
    let (node, fh) = g.open_f();
    let (e, _) = g.call(Opcode::Setlk, 6, node, lk(fh, 1, libc::F_WRLCK).as_bytes());
    assert_eq!(e, 0);
    assert_eq!(host_can_lock(&g.dir.join("f")), (false, true));
    assert_eq!(g.h.dev.stats().sessions_ended(), 1);
}
