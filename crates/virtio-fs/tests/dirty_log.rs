//! Live migration, over a real vhost-user socket with the passthrough
//! serving a host directory: once the frontend acks `VHOST_F_LOG_ALL` and
//! sets a dirty log (`VHOST_USER_SET_LOG_BASE`, a memfd with one bit per
//! 4 KiB guest page, as QEMU does before migrating), every guest page the
//! device writes is logged, and no other: a READ's data pages (which the
//! passthrough fills by host address with preadv or io_uring, not
//! through vm-memory), its out header, and the used ring; a GETATTR's
//! reply page and the used ring.
//!
//! (That a vring stop answers the requests in flight before it returns,
//! the other half of migrating, is tested in `started_wakeups.rs`.)

mod common;

use fuse_core::abi::{AttrOut, EntryOut, GetattrIn, Opcode, OpenIn, OpenOut, ReadIn};
use std::collections::BTreeSet;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::VhostUserFrontend;
use vhost::{VhostBackend, VhostUserDirtyLogRegion};
use virtio_fs::testing::guest::{Done, GuestDriver, Req};
use virtio_fs::DeviceConfig;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

const PAGE: u64 = 4096;
/// Request queue 1.
const Q: usize = 1;
/// Bytes each READ asks for: three pages.
const LEN: usize = 3 * PAGE as usize;
/// Where in the file it reads.
const AT: u64 = PAGE;

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(13) ^ 0x5a).collect()
}

fn memfd(len: u64) -> File {
    // SAFETY: the name is NUL-terminated; memfd_create returns a new fd
    // or -1.
    let fd = unsafe { libc::memfd_create(c"fusebox-dirty-log".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(len).unwrap();
    f
}

/// The guest, its open file, and the dirty log it set.
struct Migrating {
    base: PathBuf,
    dev: virtio_fs::FsDevice<passthrough::PassthroughFs>,
    guest: Option<GuestDriver>,
    daemon: Option<std::thread::JoinHandle<()>>,
    nodeid: u64,
    fh: u64,
    log: File,
    log_len: u64,
}

impl Migrating {
    /// Serves a directory holding one file, connects a guest, opens the
    /// file, then starts logging as QEMU does when a migration begins.
    fn start(name: &str, cfg: DeviceConfig) -> Migrating {
        let base =
            std::env::temp_dir().join(format!("fusebox-migration-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("share")).unwrap();
        std::fs::write(base.join("share/f"), pattern(4 * LEN)).unwrap();
        let sock = base.join("vfs.sock");
        let (dev, daemon) = common::serve_passthrough(
            &base.join("share"),
            &sock,
            passthrough::Config::default(),
            cfg,
        );
        let mut g = common::connect_guest(&sock, 4, LEN as u64);
        let (_, b) = g
            .call(
                Q,
                &Req {
                    opcode: Opcode::Lookup,
                    nodeid: 1,
                    args: b"f\0",
                    data_out: 0,
                    reply: std::mem::size_of::<EntryOut>() as u32,
                },
            )
            .unwrap();
        let nodeid = EntryOut::read_from_prefix(&b).unwrap().0.nodeid;
        let open = OpenIn {
            flags: libc::O_RDONLY as u32,
            ..OpenIn::new_zeroed()
        };
        let (_, b) = g
            .call(
                Q,
                &Req {
                    opcode: Opcode::Open,
                    nodeid,
                    args: open.as_bytes(),
                    data_out: 0,
                    reply: std::mem::size_of::<OpenOut>() as u32,
                },
            )
            .unwrap();
        let fh = OpenOut::read_from_prefix(&b).unwrap().0.fh;

        // The migration starts: LOG_SHMFD, a log covering guest RAM, and
        // LOG_ALL among the features.
        let size: u64 = g.memory().iter().map(|r| r.len()).sum();
        let log_len = size.div_ceil(PAGE).div_ceil(8).next_multiple_of(PAGE);
        let log = memfd(log_len);
        let mut fe = g.frontend().clone();
        let offered = fe.get_features().unwrap();
        assert_ne!(
            offered & VhostUserVirtioFeatures::LOG_ALL.bits(),
            0,
            "VHOST_F_LOG_ALL is offered"
        );
        let pf = fe.get_protocol_features().unwrap();
        assert!(pf.contains(VhostUserProtocolFeatures::LOG_SHMFD));
        fe.set_protocol_features(
            VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::LOG_SHMFD,
        )
        .unwrap();
        fe.set_log_base(
            0,
            Some(VhostUserDirtyLogRegion {
                mmap_size: log_len,
                mmap_offset: 0,
                mmap_handle: log.as_raw_fd(),
            }),
        )
        .unwrap();
        let mut features = (1u64 << 32) // VIRTIO_F_VERSION_1
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            | VhostUserVirtioFeatures::LOG_ALL.bits();
        if g.event_idx() {
            features |= 1 << 29; // VIRTIO_RING_F_EVENT_IDX
        }
        fe.set_features(features).unwrap();
        // SET_FEATURES has no reply here (no REPLY_ACK): a message that
        // has one makes sure it was handled, as QEMU makes sure before it
        // counts on the log.
        fe.get_features().unwrap();
        Migrating {
            base,
            dev,
            guest: Some(g),
            daemon: Some(daemon),
            nodeid,
            fh,
            log,
            log_len,
        }
    }

    /// READs the passthrough copied out of a mapping of the file.
    fn mapped(&self) -> u64 {
        self.dev.engine().fs().io_counts().read_mapped
    }

    fn g(&mut self) -> &mut GuestDriver {
        self.guest.as_mut().unwrap()
    }

    /// The guest pages the log has marked, but for the hiprio queue's used
    /// ring: its vring thread may still be writing its avail event there
    /// from setting the queue up (a real write, logged, at a time this
    /// test does not control).
    fn dirty(&mut self) -> BTreeSet<u64> {
        let hiprio = self.g().used_ring(0).0 / PAGE;
        let mut pages = self.log_pages();
        pages.remove(&hiprio);
        pages
    }

    /// The guest pages the log has marked.
    fn log_pages(&self) -> BTreeSet<u64> {
        let mut b = vec![0u8; self.log_len as usize];
        self.log.read_exact_at(&mut b, 0).unwrap();
        let mut pages = BTreeSet::new();
        for (i, byte) in b.iter().enumerate() {
            for bit in 0..8 {
                if byte & (1 << bit) != 0 {
                    pages.insert(i as u64 * 8 + bit);
                }
            }
        }
        pages
    }

    /// Clears the log, as QEMU does after each sync.
    fn clear(&self) {
        self.log
            .write_all_at(&vec![0u8; self.log_len as usize], 0)
            .unwrap();
    }

    /// Publishes what was posted and waits for slot `slot`'s answer.
    fn answer(&mut self, slot: u16) -> Done {
        self.g().publish(Q);
        let t = Instant::now();
        let mut got = Vec::new();
        loop {
            self.g().reap(Q, &mut got).unwrap();
            if let Some(d) = got.iter().find(|d| d.slot == slot) {
                return *d;
            }
            let left = Duration::from_secs(10).saturating_sub(t.elapsed());
            assert!(!left.is_zero(), "slot {slot} not answered");
            let _ = self.g().wait(Q, left);
        }
    }

    fn finish(mut self) {
        drop(self.guest.take());
        if let Some(d) = self.daemon.take() {
            d.join().unwrap();
        }
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

/// The pages of `len` bytes at `at`.
fn pages(at: GuestAddress, len: u64) -> impl Iterator<Item = u64> {
    at.0 / PAGE..(at.0 + len).div_ceil(PAGE)
}

/// `mapped`: the READ whose pages are checked is copied out of the file's
/// mapping (else read the usual way).
fn reads_and_replies_are_logged(name: &str, cfg: DeviceConfig, mapped: bool) {
    let mut m = Migrating::start(name, cfg);
    // Before any request, at most the used ring: the queue's thread may
    // still be writing its avail event there after answering the OPEN.
    let used = m.g().used_ring(Q);
    let early = m.dirty();
    assert!(
        early.iter().all(|p| *p == used.0 / PAGE),
        "logged before any request: {early:?}"
    );

    // A READ of three pages into slot 1's data pages.
    let body = ReadIn {
        fh: m.fh,
        offset: AT,
        size: LEN as u32,
        ..ReadIn::new_zeroed()
    };
    let nodeid = m.nodeid;
    let read = Req {
        opcode: Opcode::Read,
        nodeid,
        args: body.as_bytes(),
        data_out: 0,
        reply: LEN as u32,
    };
    // Mapped: READs until one is copied out of the mapping (its residency
    // check runs on a thread of its own, after the first reads); then the
    // READ checked below is too, or is made again (the check may expire
    // in between).
    let t = Instant::now();
    let d = loop {
        if mapped {
            let before = m.mapped();
            while m.mapped() == before {
                assert!(t.elapsed() < Duration::from_secs(20), "never mapped");
                m.g().post(Q, 1, &read).unwrap();
                assert_eq!(m.answer(1).out.error, 0);
            }
        }
        m.clear();
        let before = m.mapped();
        m.g().post(Q, 1, &read).unwrap();
        let d = m.answer(1);
        let copied = m.mapped() > before;
        assert!(mapped || !copied, "copied out of a mapping at once");
        if copied == mapped {
            break d;
        }
    };
    assert_eq!((d.out.error, d.used_len), (0, 16 + LEN as u32));
    let data_at = m.g().slot_data(Q, 1);
    let mut got = vec![0u8; LEN];
    m.g().memory().read_slice(&mut got, data_at).unwrap();
    assert_eq!(got, pattern(4 * LEN)[AT as usize..AT as usize + LEN]);
    // Its out header (a page before the payload of a small reply), its
    // data pages, the used ring: exactly those.
    let out_page = (m.g().reply_payload(Q, 1).0 - 16) / PAGE;
    let mut want: BTreeSet<u64> = pages(data_at, LEN as u64).collect();
    want.insert(out_page);
    want.extend(pages(used, 16));
    assert_eq!(
        m.dirty(),
        want,
        "READ data pages {:?}, out header page {out_page}, used ring page {}",
        pages(data_at, LEN as u64).collect::<Vec<_>>(),
        used.0 / PAGE
    );

    // A GETATTR: its reply page and the used ring.
    m.clear();
    let body = GetattrIn::new_zeroed();
    m.g()
        .post(
            Q,
            2,
            &Req {
                opcode: Opcode::Getattr,
                nodeid,
                args: body.as_bytes(),
                data_out: 0,
                reply: std::mem::size_of::<AttrOut>() as u32,
            },
        )
        .unwrap();
    let d = m.answer(2);
    assert_eq!(d.out.error, 0);
    let reply_page = (m.g().reply_payload(Q, 2).0 - 16) / PAGE;
    let mut want = BTreeSet::from([reply_page]);
    want.extend(pages(used, 16));
    assert_eq!(m.dirty(), want);
    m.finish();
}

/// READs served by the queue's ring workers (preadv into guest RAM).
#[test]
fn the_device_logs_every_page_it_writes_served_by_workers() {
    reads_and_replies_are_logged(
        "workers",
        DeviceConfig {
            inline_per_batch: 0,
            ..DeviceConfig::default()
        },
        false,
    );
}

/// READs served by the vring thread itself (preadv2 or its io_uring into
/// guest RAM), as fusebox runs by default.
#[test]
fn the_device_logs_every_page_it_writes_served_in_line() {
    reads_and_replies_are_logged(
        "inline",
        DeviceConfig {
            inline_per_batch: usize::MAX,
            ..DeviceConfig::default()
        },
        false,
    );
}

/// READs served by the vring thread, copied out of a mapping of the file
/// (it is cached whole once the first READs are done).
#[test]
fn the_device_logs_every_page_it_writes_from_a_mapped_file() {
    reads_and_replies_are_logged(
        "mapped",
        DeviceConfig {
            inline_per_batch: usize::MAX,
            ..DeviceConfig::default()
        },
        true,
    );
}
