//! A mock guest for device tests: one region of guest memory with a split
//! virtqueue laid out at fixed addresses, and helpers to write descriptor
//! tables, publish heads and read replies.
#![allow(dead_code)]

use fuse_core::abi::{InHeader, Opcode, OutHeader};
use fuse_core::server::Filesystem;
use std::os::fd::{FromRawFd, OwnedFd};
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_fs::{DeviceConfig, FsDevice, GuestMem, GuestMmap};
use vm_memory::{Bytes, GuestAddress, GuestMemoryAtomic};
use zerocopy::{FromBytes, IntoBytes};

pub const MEM: u64 = 1 << 20;
pub const QSIZE: u16 = 64;
pub const DESC: u64 = 0;
pub const AVAIL: u64 = 0x1000;
pub const USED: u64 = 0x2000;
pub const DATA: u64 = 0x4000;
pub const F_NEXT: u16 = 1;
pub const F_WRITE: u16 = 2;
pub const F_INDIRECT: u16 = 4;

/// A FUSE request from node 1 with credentials (0, 0, pid 7).
pub fn request(op: Opcode, unique: u64, body: &[u8]) -> Vec<u8> {
    let h = InHeader {
        len: (40 + body.len()) as u32,
        opcode: op as u32,
        unique,
        nodeid: 1,
        uid: 0,
        gid: 0,
        pid: 7,
        total_extlen: 0,
        padding: 0,
    };
    let mut v = h.as_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

/// A guest with the device attached.
pub struct Harness<F: Filesystem + 'static> {
    pub mem: GuestMmap,
    pub atomic: GuestMem,
    pub dev: FsDevice<F>,
}

impl<F: Filesystem + 'static> Harness<F> {
    pub fn new(fs: F, cfg: DeviceConfig) -> Harness<F> {
        let mem = GuestMmap::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap();
        let atomic = GuestMemoryAtomic::new(mem.clone());
        let dev = FsDevice::new(fs, cfg).unwrap();
        dev.update_memory(atomic.clone()).unwrap();
        Harness { mem, atomic, dev }
    }

    pub fn vring(&self) -> VringRwLock<GuestMem> {
        let v = VringRwLock::new(self.atomic.clone(), QSIZE).unwrap();
        v.set_queue_size(QSIZE);
        v.set_queue_info(DESC, AVAIL, USED).unwrap();
        v.set_queue_ready(true);
        v.set_enabled(true);
        v
    }

    pub fn desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let a = GuestAddress(DESC + 16 * u64::from(i % QSIZE));
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&addr.to_le_bytes());
        b[8..12].copy_from_slice(&len.to_le_bytes());
        b[12..14].copy_from_slice(&flags.to_le_bytes());
        b[14..].copy_from_slice(&next.to_le_bytes());
        self.mem.write_slice(&b, a).unwrap();
    }

    pub fn publish(&self, heads: &[u16]) {
        for (i, h) in heads.iter().enumerate() {
            self.mem
                .write_obj(*h, GuestAddress(AVAIL + 4 + 2 * i as u64))
                .unwrap();
        }
        self.mem
            .write_obj(heads.len() as u16, GuestAddress(AVAIL + 2))
            .unwrap();
    }

    /// Publishes `heads` at avail ring positions from `start` on (the
    /// running avail index, wrapping), and moves the index past them.
    pub fn publish_from(&self, start: u16, heads: &[u16]) -> u16 {
        let mut idx = start;
        for h in heads {
            self.mem
                .write_obj(*h, GuestAddress(AVAIL + 4 + 2 * u64::from(idx % QSIZE)))
                .unwrap();
            idx = idx.wrapping_add(1);
        }
        self.mem.write_obj(idx, GuestAddress(AVAIL + 2)).unwrap();
        idx
    }

    pub fn used_idx(&self) -> u16 {
        self.mem.read_obj(GuestAddress(USED + 2)).unwrap()
    }

    pub fn reset(&self) {
        self.mem
            .write_slice(&[0u8; 0x4000], GuestAddress(0))
            .unwrap();
    }
}

impl<F: Filesystem + 'static> Harness<F> {
    /// Writes a chain at descriptor `first`: the request in one readable
    /// descriptor at `at`, a writable reply buffer of `reply` bytes after
    /// it. Returns (head, reply address, next free descriptor, next free
    /// address).
    pub fn chain(&self, first: u16, at: u64, msg: &[u8], reply: u32) -> (u16, u64, u16, u64) {
        self.mem.write_slice(msg, GuestAddress(at)).unwrap();
        let rat = at + ((msg.len() as u64 + 63) & !63);
        self.desc(first, at, msg.len() as u32, F_NEXT, first + 1);
        self.desc(first + 1, rat, reply, F_WRITE, 0);
        (first, rat, first + 2, rat + u64::from(reply))
    }

    /// The out header written at `at`.
    pub fn reply(&self, at: u64) -> OutHeader {
        let b: [u8; 16] = self.mem.read_obj(GuestAddress(at)).unwrap();
        OutHeader::read_from_bytes(&b).unwrap()
    }

    /// Serves queue `queue` as its vring thread would on a kick.
    pub fn kick(&self, vring: &VringRwLock<GuestMem>, queue: usize) {
        kick(&self.dev, vring, queue);
    }
}

/// Where the vring thread of virtqueue `vq` finds it, as
/// vhost-user-backend reads `queues_per_thread`: (thread index, the
/// queue's place among that thread's vrings, which is also its kick's
/// device event).
pub fn thread_of<F: Filesystem + 'static>(dev: &FsDevice<F>, vq: usize) -> (usize, usize) {
    let masks = dev.queues_per_thread();
    let t = masks
        .iter()
        .position(|m| m & (1 << vq) != 0)
        .expect("every queue has a thread");
    (t, (masks[t] & ((1 << vq) - 1)).count_ones() as usize)
}

/// Hands device event `ev` of virtqueue `vq`'s thread to the device, with
/// `vring` in that queue's place among the thread's vrings (the places
/// before it hold vrings the guest never set up: thread 0's first is
/// hiprio, which the device keeps for its watchdog).
pub fn thread_event<F: Filesystem + 'static>(
    dev: &FsDevice<F>,
    ev: u16,
    vring: &VringRwLock<GuestMem>,
    vq: usize,
) -> std::io::Result<()> {
    let (t, place) = thread_of(dev, vq);
    let mut vrings: Vec<_> = (0..place)
        .map(|_| {
            let mem = GuestMmap::from_ranges(&[(GuestAddress(0), 4096)]).unwrap();
            VringRwLock::new(GuestMemoryAtomic::new(mem), QSIZE).unwrap()
        })
        .collect();
    vrings.push(vring.clone());
    dev.handle_event(ev, vmm_sys_util::epoll::EventSet::IN, &vrings, t)
}

/// Serves virtqueue `vq` of `dev` as its vring thread would on a kick.
pub fn kick<F: Filesystem + 'static>(dev: &FsDevice<F>, vring: &VringRwLock<GuestMem>, vq: usize) {
    let (_, place) = thread_of(dev, vq);
    thread_event(dev, place as u16, vring, vq).unwrap();
}

impl<F: Filesystem + 'static> Harness<F> {
    /// Asserts that request queue `queue` (1-based) was told to resume,
    /// then serves it as its vring thread would on that event.
    pub fn resume(&self, vring: &VringRwLock<GuestMem>, queue: usize) {
        let fd = self.dev.resume_fd(queue - 1).unwrap();
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no timeout.
        let ready = unsafe { libc::poll(&mut p, 1, 0) };
        assert_eq!(ready, 1, "no resume signalled");
        let ev = (self.dev.num_queues() + queue) as u16;
        thread_event(&self.dev, ev, vring, queue).unwrap();
    }
}

/// `request` with other credentials.
pub fn request_as(op: Opcode, unique: u64, uid: u32, body: &[u8]) -> Vec<u8> {
    let mut v = request(op, unique, body);
    let mut h = InHeader::read_from_prefix(&v).unwrap().0;
    h.uid = uid;
    v[..40].copy_from_slice(h.as_bytes());
    v
}

/// fusebox's device over the passthrough of `dir`, served on a real
/// vhost-user socket `sock` (removed first); the thread ends when the
/// frontend goes.
pub fn serve_passthrough(
    dir: &std::path::Path,
    sock: &std::path::Path,
    fs_cfg: passthrough::Config,
    cfg: DeviceConfig,
) -> (
    FsDevice<passthrough::PassthroughFs>,
    std::thread::JoinHandle<()>,
) {
    let dev = FsDevice::new(passthrough::PassthroughFs::new(dir, fs_cfg).unwrap(), cfg).unwrap();
    let served = serve_device(&dev, sock);
    (dev, served)
}

/// Serves `dev` on a real vhost-user socket `sock` (removed first), as
/// the fusebox binary does; the thread ends when the frontend goes.
pub fn serve_device<F: Filesystem + 'static>(
    dev: &FsDevice<F>,
    sock: &std::path::Path,
) -> std::thread::JoinHandle<()> {
    let mut daemon = vhost_user_backend::VhostUserDaemon::new(
        "fusebox-test".into(),
        dev.clone(),
        GuestMemoryAtomic::new(GuestMmap::new()),
    )
    .unwrap();
    dev.register_listeners(&daemon.get_epoll_handlers())
        .unwrap();
    let _ = std::fs::remove_file(sock);
    let mut listener = vhost::vhost_user::Listener::new(sock, true).unwrap();
    std::thread::spawn(move || {
        daemon.start(&mut listener).unwrap();
        // The frontend going away ends the connection.
        let _ = daemon.wait();
    })
}

/// A guest driver on `sock` as a Linux guest runs one (one request queue
/// of 64 entries, EVENT_IDX), with `slots` requests of up to `slot_data`
/// bytes of data each, after INIT.
pub fn connect_guest(
    sock: &std::path::Path,
    slots: u16,
    slot_data: u64,
) -> virtio_fs::testing::guest::GuestDriver {
    let mut g = virtio_fs::testing::guest::GuestDriver::connect(
        sock,
        &virtio_fs::testing::guest::GuestConfig {
            request_queues: 1,
            queue_size: 64,
            slots,
            slot_data,
            event_idx: true,
        },
    )
    .unwrap();
    assert!(g.event_idx(), "EVENT_IDX negotiated, as Linux runs it");
    g.init().unwrap();
    g
}

/// Polls `f` every 2 ms for `d`; whether it held.
pub fn within(d: std::time::Duration, mut f: impl FnMut() -> bool) -> bool {
    let t = std::time::Instant::now();
    while t.elapsed() < d {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    f()
}

/// Polls `f` every 2 ms until it holds; fails the test after 20 s.
pub fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t = std::time::Instant::now();
    while !f() {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(20),
            "timed out: {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// A guest on request queue 1 of a device in this process, over a fresh
/// directory holding the file `f` ("locked"), removed when dropped.
pub struct Guest<F: Filesystem + 'static = passthrough::PassthroughFs> {
    pub h: Harness<F>,
    pub vring: VringRwLock<GuestMem>,
    /// The avail index after the last request sent.
    pub idx: u16,
    next_desc: u16,
    at: u64,
    pub dir: std::path::PathBuf,
}

impl<F: Filesystem + 'static> Drop for Guest<F> {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Guest {
    /// The passthrough of a fresh directory, with the device's defaults
    /// (but a queue of [`QSIZE`]).
    pub fn new(tag: &str) -> Guest {
        Guest::with(
            tag,
            |dir| passthrough::PassthroughFs::new(dir, passthrough::Config::default()).unwrap(),
            DeviceConfig {
                queue_size: QSIZE,
                ..DeviceConfig::default()
            },
        )
    }
}

impl<F: Filesystem + 'static> Guest<F> {
    /// The filesystem `make` makes of a fresh directory, in a device of
    /// `cfg`.
    pub fn with(tag: &str, make: impl FnOnce(&std::path::Path) -> F, cfg: DeviceConfig) -> Self {
        let dir = std::env::temp_dir().join(format!("fusebox-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("f"), b"locked").unwrap();
        let h = Harness::new(make(&dir), cfg);
        let vring = h.vring();
        Guest {
            h,
            vring,
            idx: 0,
            next_desc: 0,
            at: DATA,
            dir,
        }
    }

    /// Fresh vrings, as a rebooted guest's driver sets them up (the device
    /// is told nothing: the frontend's stop or reset came before).
    pub fn restart(&mut self) {
        self.h.reset();
        self.vring = self.h.vring();
        self.idx = 0;
        self.next_desc = 0;
        self.at = DATA;
    }

    /// Sends one request on queue 1; returns where its reply goes. The
    /// descriptors and memory of requests long answered are used again.
    pub fn send(&mut self, op: Opcode, unique: u64, nodeid: u64, body: &[u8]) -> u64 {
        if self.next_desc + 2 > QSIZE {
            self.next_desc = 0;
        }
        if self.at + 2 * 4096 + body.len() as u64 > MEM {
            self.at = DATA;
        }
        let mut msg = request(op, unique, body);
        msg[16..24].copy_from_slice(&nodeid.to_le_bytes());
        let (head, reply_at, nd, na) = self.h.chain(self.next_desc, self.at, &msg, 4096);
        self.next_desc = nd;
        self.at = na;
        self.idx = self.h.publish_from(self.idx, &[head]);
        self.h.kick(&self.vring, 1);
        reply_at
    }

    /// Sends one request and waits for its reply's payload.
    pub fn call(&mut self, op: Opcode, unique: u64, nodeid: u64, body: &[u8]) -> (i32, [u8; 128]) {
        let r = self.send(op, unique, nodeid, body);
        let want = self.idx;
        wait_for("a reply", || self.h.used_idx() == want);
        let mut b = [0u8; 128];
        self.h.mem.read_slice(&mut b, GuestAddress(r + 16)).unwrap();
        (self.h.reply(r).error, b)
    }

    /// LOOKUP and OPEN of `f`: (nodeid, fh).
    pub fn open_f(&mut self) -> (u64, u64) {
        use fuse_core::abi::{EntryOut, OpenIn, OpenOut};
        let (_, b) = self.call(Opcode::Lookup, 2, 1, b"f\0");
        let node = EntryOut::read_from_prefix(&b).unwrap().0.nodeid;
        let open = OpenIn {
            flags: libc::O_RDWR as u32,
            open_flags: 0,
        };
        let (_, b) = self.call(Opcode::Open, 4, node, open.as_bytes());
        (node, OpenOut::read_from_prefix(&b).unwrap().0.fh)
    }
}

/// A lock request by `owner` on all of handle `fh`.
pub fn lk(fh: u64, owner: u64, typ: i32) -> fuse_core::abi::LkIn {
    use zerocopy::FromZeros;
    fuse_core::abi::LkIn {
        fh,
        owner,
        lk: fuse_core::abi::FileLock {
            start: 0,
            end: i64::MAX as u64,
            typ: typ as u32,
            pid: 1,
        },
        ..fuse_core::abi::LkIn::new_zeroed()
    }
}

/// A split virtqueue at its own addresses in `h`'s guest memory.
pub fn vring_at<F: Filesystem + 'static>(
    h: &Harness<F>,
    desc: u64,
    avail: u64,
    used: u64,
) -> VringRwLock<GuestMem> {
    let v = VringRwLock::new(h.atomic.clone(), QSIZE).unwrap();
    v.set_queue_size(QSIZE);
    v.set_queue_info(desc, avail, used).unwrap();
    v.set_queue_ready(true);
    v.set_enabled(true);
    v
}

/// A directory's attributes for node `ino`, not to be cached: what the
/// tests' own filesystems answer GETATTR with.
pub fn dir_attr(
    ino: u64,
) -> fuse_core::server::FsResult<(fuse_core::abi::Attr, std::time::Duration)> {
    use zerocopy::FromZeros;
    Ok((
        fuse_core::abi::Attr {
            ino,
            mode: libc::S_IFDIR | 0o755,
            nlink: 2,
            ..fuse_core::abi::Attr::new_zeroed()
        },
        std::time::Duration::ZERO,
    ))
}

/// A device whose vring threads serve every request themselves, with
/// two standby workers per queue for the watchdog.
pub fn in_line_with_standby() -> DeviceConfig {
    DeviceConfig {
        inline_per_batch: usize::MAX,
        workers_per_queue: 2,
        ..DeviceConfig::default()
    }
}

/// The uid whose GETATTRs and READs [`HangFs`] holds.
pub const HANG_UID: u32 = 4242;

/// A filesystem whose GETATTR and READ from [`HANG_UID`] hang until
/// `release` is set (others answer at once: a directory's attributes, an
/// empty read). `hung` counts the requests that began hanging, `finished`
/// those that ended; `hung_unique` is the last one's unique. An interrupt
/// is recorded in `interrupted` and sets `release`; forgotten lookups add
/// up in `dropped`. With `spin` it busy-waits instead of sleeping 2 ms
/// between looks (for races that want the waiter on a CPU).
#[derive(Clone, Default)]
pub struct HangFs {
    pub release: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub spin: bool,
    pub hung: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    pub finished: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    pub hung_unique: std::sync::Arc<std::sync::atomic::AtomicU64>,
    pub interrupted: std::sync::Arc<std::sync::Mutex<Vec<u64>>>,
    pub dropped: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl HangFs {
    fn maybe_hang(&self, ctx: &fuse_core::server::Ctx) {
        use std::sync::atomic::Ordering::SeqCst;
        if ctx.uid != HANG_UID {
            return;
        }
        self.hung_unique.store(ctx.unique, SeqCst);
        self.hung.fetch_add(1, SeqCst);
        while !self.release.load(SeqCst) {
            if self.spin {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
        self.finished.fetch_add(1, SeqCst);
    }
}

impl Filesystem for HangFs {
    type Inode = u64;
    type Handle = u64;
    type Io = ();

    fn new_io(&self, _: fuse_core::server::Wake) {}
    fn getattr(
        &self,
        ctx: &fuse_core::server::Ctx,
        ino: u64,
        _fh: Option<u64>,
    ) -> fuse_core::server::FsResult<(fuse_core::abi::Attr, std::time::Duration)> {
        self.maybe_hang(ctx);
        dir_attr(ino)
    }
    fn read(
        &self,
        ctx: &fuse_core::server::Ctx,
        _: u64,
        _: u64,
        _: u64,
        _: &mut dyn fuse_core::server::ReadSink,
    ) -> fuse_core::server::FsResult<usize> {
        self.maybe_hang(ctx);
        Ok(0)
    }
    fn interrupt(&self, unique: u64) {
        fuse_core::locks::lock(&self.interrupted).push(unique);
        self.release
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
    fn forget(&self, _ino: u64, nlookup: u64) {
        self.dropped
            .fetch_add(nlookup, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Sets its flag when dropped: declared after a harness, it releases a
/// [`HangFs`] before the harness goes, so a failing assertion does not
/// leave the engine's workers hung in its drop.
pub struct ReleaseOnDrop(pub std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A GETATTR request from `uid`.
pub fn getattr(unique: u64, uid: u32) -> Vec<u8> {
    use zerocopy::FromZeros;
    request_as(
        Opcode::Getattr,
        unique,
        uid,
        fuse_core::abi::GetattrIn::new_zeroed().as_bytes(),
    )
}

/// A pipe (read end, write end), both close-on-exec.
pub fn pipe() -> (std::fs::File, std::fs::File) {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two fds pipe2 writes.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: pipe2 just made both fds; each is owned once, here.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    (r.into(), w.into())
}
