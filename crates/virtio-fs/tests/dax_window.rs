//! The DAX window over a real vhost-user socket (issue 34): the device
//! offers a shared memory region, and on the guest's FUSE_SETUPMAPPING
//! asks the frontend (on the back-end channel) to map the handle's file
//! into it; FUSE_REMOVEMAPPING unmaps. The frontend side
//! (`testing::window::FrontendWindow`) maps the file into this process as
//! QEMU 11.1 maps it into the guest, and refuses what QEMU refuses, so
//! these tests read and write what a guest would see through its window.

mod common;

use fuse_core::abi::flags::{SETUPMAPPING_FLAG_READ as READ, SETUPMAPPING_FLAG_WRITE as WRITE};
use fuse_core::abi::{
    init, EntryOut, Opcode, OpenIn, OpenOut, RemovemappingIn, RemovemappingOne, SetupmappingIn,
    ROOT_ID,
};
use passthrough::Config;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost::vhost_user::VhostUserFrontend;
use vhost_user_backend::VhostUserBackend;
use virtio_fs::testing::guest::{GuestConfig, GuestDriver, GuestError, Req};
use virtio_fs::testing::window::WindowEvent;
use virtio_fs::{DeviceConfig, FsDevice};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

const MIB: u64 = 1 << 20;
const SLOT: u64 = 2 * MIB;
const WINDOW: u64 = 8 * MIB;

struct Setup {
    base: PathBuf,
    dev: FsDevice<passthrough::PassthroughFs>,
    g: GuestDriver,
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

/// The byte at `off` of file `f` (a pattern, so offsets can be told apart).
fn pattern(off: u64) -> u8 {
    (off % 251) as u8
}

/// A share with `f` (4 MiB), `g` (2 MiB), `small` (10000 bytes) and
/// `empty`, served with a window of `cache_size` bytes, and a guest on it
/// (INIT done, offering FUSE_MAP_ALIGNMENT).
fn setup(name: &str, cache_size: u64) -> Setup {
    let base = std::env::temp_dir().join(format!("fusebox-dax-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let dir = base.join("share");
    std::fs::create_dir_all(&dir).unwrap();
    let f: Vec<u8> = (0..4 * MIB).map(pattern).collect();
    std::fs::write(dir.join("f"), &f).unwrap();
    std::fs::write(dir.join("g"), vec![7u8; SLOT as usize]).unwrap();
    std::fs::write(dir.join("small"), vec![1u8; 10000]).unwrap();
    std::fs::write(dir.join("empty"), b"").unwrap();
    let sock = base.join("vfs.sock");
    let (dev, _served) = common::serve_passthrough(
        &dir,
        &sock,
        Config::default(),
        DeviceConfig {
            cache_size,
            ..DeviceConfig::default()
        },
    );
    let cfg = GuestConfig {
        request_queues: 1,
        queue_size: 64,
        slots: 4,
        slot_data: 4096,
        event_idx: true,
    };
    let mut g = if cache_size > 0 {
        GuestDriver::connect_with_window(&sock, &cfg).unwrap()
    } else {
        GuestDriver::connect(&sock, &cfg).unwrap()
    };
    let out = g.init_offering(init::MAP_ALIGNMENT).unwrap();
    if cache_size > 0 {
        assert_ne!(u64::from(out.flags) & init::MAP_ALIGNMENT, 0);
        assert_eq!(out.map_alignment, 12);
    } else {
        assert_eq!(u64::from(out.flags) & init::MAP_ALIGNMENT, 0);
    }
    Setup { base, dev, g }
}

fn errno(r: Result<(fuse_core::abi::OutHeader, Vec<u8>), GuestError>) -> Result<Vec<u8>, i32> {
    match r {
        Ok((_, b)) => Ok(b),
        Err(GuestError::Fuse(_, e)) => Err(e),
        Err(e) => panic!("{e}"),
    }
}

fn call(
    g: &mut GuestDriver,
    opcode: Opcode,
    nodeid: u64,
    args: &[u8],
    reply: u32,
) -> Result<Vec<u8>, i32> {
    errno(g.call(
        1,
        &Req {
            opcode,
            nodeid,
            args,
            data_out: 0,
            reply,
        },
    ))
}

fn lookup(g: &mut GuestDriver, name: &str) -> u64 {
    let mut n = name.as_bytes().to_vec();
    n.push(0);
    let b = call(g, Opcode::Lookup, ROOT_ID, &n, 128).unwrap();
    EntryOut::read_from_prefix(&b).unwrap().0.nodeid
}

fn open(g: &mut GuestDriver, ino: u64, flags: i32) -> u64 {
    let o = OpenIn {
        flags: flags as u32,
        ..OpenIn::new_zeroed()
    };
    let b = call(g, Opcode::Open, ino, o.as_bytes(), 16).unwrap();
    OpenOut::read_from_prefix(&b).unwrap().0.fh
}

#[allow(clippy::too_many_arguments)]
fn map(
    g: &mut GuestDriver,
    ino: u64,
    fh: u64,
    foffset: u64,
    len: u64,
    flags: u64,
    moffset: u64,
) -> Result<(), i32> {
    let a = SetupmappingIn {
        fh,
        foffset,
        len,
        flags,
        moffset,
    };
    call(g, Opcode::Setupmapping, ino, a.as_bytes(), 0).map(drop)
}

fn unmap_body(count: u32, ranges: &[(u64, u64)]) -> Vec<u8> {
    let mut b = RemovemappingIn { count }.as_bytes().to_vec();
    for &(moffset, len) in ranges {
        b.extend_from_slice(RemovemappingOne { moffset, len }.as_bytes());
    }
    b
}

fn unmap(g: &mut GuestDriver, ranges: &[(u64, u64)]) -> Result<(), i32> {
    let b = unmap_body(ranges.len() as u32, ranges);
    call(g, Opcode::Removemapping, ROOT_ID, &b, 0).map(drop)
}

#[test]
fn a_mapping_shows_the_file_both_ways_and_goes_on_removemapping() {
    let mut s = setup("map", WINDOW);
    let w = s.g.window().unwrap().clone();
    assert_eq!(w.size(), WINDOW);
    let f = lookup(&mut s.g, "f");
    let ro = open(&mut s.g, f, libc::O_RDONLY);
    let rw = open(&mut s.g, f, libc::O_RDWR);

    // QEMU 11.1 cannot map a file not open for writing, even read-only:
    // refused before anything is asked of the frontend.
    assert_eq!(
        map(&mut s.g, f, ro, SLOT, SLOT, READ, SLOT),
        Err(libc::EACCES)
    );
    assert_eq!(
        map(&mut s.g, f, ro, SLOT, SLOT, READ | WRITE, SLOT),
        Err(libc::EACCES)
    );
    assert!(w.events().is_empty());

    // The file's second 2 MiB into the window's second slot: mapped
    // writable (QEMU 11.1 maps every range so; the caller may write).
    map(&mut s.g, f, rw, SLOT, SLOT, READ, SLOT).unwrap();
    assert_eq!(w.events(), [WindowEvent::Map(SLOT, SLOT, SLOT, true)]);
    assert_eq!(s.dev.dax_mappings(), 1);
    let want: Vec<u8> = (SLOT..SLOT + 4096).map(pattern).collect();
    assert_eq!(w.read(SLOT, 4096).unwrap(), want);
    // A host write shows through the mapping.
    let host = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(s.base.join("share/f"))
        .unwrap();
    host.write_at(b"host", SLOT + 100).unwrap();
    assert_eq!(&w.read(SLOT + 100, 4).unwrap(), b"host");

    // The same range again, writable: it is already; the frontend is not
    // asked again (no hole in the window meanwhile).
    map(&mut s.g, f, rw, SLOT, SLOT, READ | WRITE, SLOT).unwrap();
    assert_eq!(w.events().len(), 1);
    assert_eq!(s.dev.dax_mappings(), 1);
    assert!(w.write(SLOT + 8, b"guest"));
    let mut got = [0u8; 5];
    host.read_at(&mut got, SLOT + 8).unwrap();
    assert_eq!(&got, b"guest");

    // Another file into exactly that range: the old mapping goes first.
    let g = lookup(&mut s.g, "g");
    map(&mut s.g, g, u64::MAX, 0, SLOT, READ, SLOT).unwrap();
    assert_eq!(
        w.events()[1..],
        [
            WindowEvent::Unmap(SLOT, SLOT),
            WindowEvent::Map(SLOT, SLOT, 0, true)
        ]
    );
    assert_eq!(w.read(SLOT, 2).unwrap(), [7, 7]);
    map(&mut s.g, f, rw, SLOT, SLOT, READ | WRITE, SLOT).unwrap();
    assert_eq!(w.read(SLOT + 8, 5).unwrap(), b"guest");

    // The first 2 MiB into the last slot; then both go in one request.
    map(&mut s.g, f, rw, 0, SLOT, READ, 3 * SLOT).unwrap();
    assert_eq!(w.read(3 * SLOT, 1).unwrap(), [pattern(0)]);
    assert_eq!(s.dev.dax_mappings(), 2);
    // As Linux asks: no handle (-1), the inode's file, writable.
    map(&mut s.g, f, u64::MAX, 0, SLOT, READ | WRITE, 0).unwrap();
    assert_eq!(w.events().last(), Some(&WindowEvent::Map(0, SLOT, 0, true)));
    assert!(w.write(4, b"inode"));
    host.read_at(&mut got, 4).unwrap();
    assert_eq!(&got, b"inode");
    unmap(&mut s.g, &[(3 * SLOT, SLOT), (SLOT, SLOT), (0, SLOT)]).unwrap();
    assert_eq!(s.dev.dax_mappings(), 0);
    assert!(w.mappings().is_empty());
    assert!(w.read(SLOT, 1).is_none());
    let stats = s.dev.stats();
    assert_eq!(stats.op_count(Opcode::Setupmapping), 8);
    assert_eq!(stats.op_count(Opcode::Removemapping), 1);
}

#[test]
fn hostile_mapping_requests_get_an_errno_and_map_nothing() {
    let mut s = setup("hostile", WINDOW);
    let w = s.g.window().unwrap().clone();
    let f = lookup(&mut s.g, "f");
    let g = lookup(&mut s.g, "g");
    let small = lookup(&mut s.g, "small");
    let empty = lookup(&mut s.g, "empty");
    let fh = open(&mut s.g, f, libc::O_RDWR);
    let gh = open(&mut s.g, g, libc::O_RDWR);
    let sh = open(&mut s.g, small, libc::O_RDWR);
    let eh = open(&mut s.g, empty, libc::O_RDWR);
    let einval = Err(libc::EINVAL);
    let cases: [(&str, Result<(), i32>); 14] = [
        (
            "unaligned window offset",
            map(&mut s.g, f, fh, 0, SLOT, READ, 100),
        ),
        (
            "unaligned file offset",
            map(&mut s.g, f, fh, 100, 4096, READ, 0),
        ),
        ("unaligned length", map(&mut s.g, f, fh, 0, 4097, READ, 0)),
        ("empty range", map(&mut s.g, f, fh, 0, 0, READ, 0)),
        (
            "past the window",
            map(&mut s.g, f, fh, 0, SLOT, READ, WINDOW),
        ),
        (
            "across two slots",
            map(&mut s.g, f, fh, 0, SLOT, READ, 4096),
        ),
        (
            "wrapping offsets",
            map(&mut s.g, f, fh, 0, SLOT, READ, u64::MAX - SLOT + 1),
        ),
        (
            "past the file's end",
            map(&mut s.g, small, sh, 0, SLOT, READ, 0),
        ),
        ("an empty file", map(&mut s.g, empty, eh, 0, 4096, READ, 0)),
        (
            "another inode's handle",
            map(&mut s.g, f, gh, 0, SLOT, READ, 0),
        ),
        ("no flags", map(&mut s.g, f, fh, 0, SLOT, 0, 0)),
        ("unknown flags", map(&mut s.g, f, fh, 0, SLOT, READ | 8, 0)),
        ("remove what is not mapped", unmap(&mut s.g, &[(0, SLOT)])),
        (
            "more ranges than the window has slots",
            unmap(&mut s.g, &[(0, SLOT); 5]),
        ),
    ];
    for (what, r) in cases {
        assert_eq!(r, einval, "{what}");
    }
    assert_eq!(map(&mut s.g, f, 12345, 0, SLOT, READ, 0), Err(libc::EBADF));
    // Without a handle: the inode must be a regular file.
    assert_eq!(
        map(&mut s.g, ROOT_ID, u64::MAX, 0, SLOT, READ, 0),
        Err(libc::EISDIR)
    );
    // A count that disagrees with the ranges sent.
    let b = unmap_body(3, &[(0, SLOT)]);
    assert_eq!(
        call(&mut s.g, Opcode::Removemapping, ROOT_ID, &b, 0),
        Err(libc::EINVAL)
    );
    let b = unmap_body(u32::MAX, &[]);
    assert_eq!(
        call(&mut s.g, Opcode::Removemapping, ROOT_ID, &b, 0),
        Err(libc::EINVAL)
    );
    assert!(w.events().is_empty(), "{:?}", w.events());
    assert_eq!(s.dev.dax_mappings(), 0);

    // A mapping; then a request overlapping it, and one naming it twice.
    map(&mut s.g, f, fh, 0, SLOT, READ, 0).unwrap();
    assert_eq!(map(&mut s.g, g, gh, 0, 4096, READ, 4096), einval);
    assert_eq!(unmap(&mut s.g, &[(0, SLOT), (0, SLOT)]), einval);
    assert_eq!(unmap(&mut s.g, &[(0, 4096)]), einval);
    assert_eq!(w.events(), [WindowEvent::Map(0, SLOT, 0, true)]);
    assert_eq!(s.dev.dax_mappings(), 1);
    // Still serving.
    unmap(&mut s.g, &[(0, SLOT)]).unwrap();
    assert_eq!(s.dev.dax_mappings(), 0);
}

#[test]
fn a_new_session_unmaps_what_the_last_one_mapped() {
    let mut s = setup("session", WINDOW);
    let w = s.g.window().unwrap().clone();
    let f = lookup(&mut s.g, "f");
    let fh = open(&mut s.g, f, libc::O_RDWR);
    map(&mut s.g, f, fh, 0, SLOT, READ, 0).unwrap();
    map(&mut s.g, f, fh, SLOT, SLOT, READ, 2 * SLOT).unwrap();
    assert_eq!(s.dev.dax_mappings(), 2);
    // The guest mounts again: INIT.
    s.g.init_offering(init::MAP_ALIGNMENT).unwrap();
    assert_eq!(s.dev.dax_mappings(), 0);
    assert!(w.mappings().is_empty(), "{:?}", w.mappings());
    let ev = w.events();
    assert!(ev.contains(&WindowEvent::Unmap(0, SLOT)), "{ev:?}");
    assert!(ev.contains(&WindowEvent::Unmap(2 * SLOT, SLOT)), "{ev:?}");
    // The new session maps a slot the old one held, with another length.
    let f = lookup(&mut s.g, "f");
    let fh = open(&mut s.g, f, libc::O_RDWR);
    map(&mut s.g, f, fh, 0, 4096, READ, 0).unwrap();
    assert_eq!(w.read(0, 1).unwrap(), [pattern(0)]);
}

#[test]
fn without_a_window_nothing_is_offered_and_mappings_are_not_served() {
    let mut s = setup("off", 0);
    let f = lookup(&mut s.g, "f");
    let fh = open(&mut s.g, f, libc::O_RDONLY);
    assert_eq!(map(&mut s.g, f, fh, 0, SLOT, READ, 0), Err(libc::ENOSYS));
    let pf = s.dev.protocol_features();
    assert!(
        !pf.intersects(VhostUserProtocolFeatures::SHMEM | VhostUserProtocolFeatures::BACKEND_REQ)
    );
    let on = setup("on", WINDOW);
    let pf = on.dev.protocol_features();
    assert!(pf.contains(VhostUserProtocolFeatures::SHMEM | VhostUserProtocolFeatures::BACKEND_REQ));
}

#[test]
fn window_sizes_the_frontend_cannot_offer_are_refused() {
    for size in [MIB, 3 * MIB, 6 * MIB, 1024 * MIB] {
        let dir = std::env::temp_dir();
        let fs = passthrough::PassthroughFs::new(&dir, Config::default()).unwrap();
        let r = FsDevice::new(
            fs,
            DeviceConfig {
                cache_size: size,
                ..DeviceConfig::default()
            },
        );
        assert!(
            matches!(r, Err(virtio_fs::DeviceError::CacheSize(n)) if n == size),
            "{size}"
        );
    }
}

#[test]
fn a_guest_with_ranges_mapped_cannot_migrate() {
    use vhost::vhost_user::message::{VhostTransferStateDirection, VhostTransferStatePhase};
    let save = |dev: &FsDevice<passthrough::PassthroughFs>| {
        let (mut rd, w) = common::pipe();
        dev.set_device_state_fd(
            VhostTransferStateDirection::SAVE,
            VhostTransferStatePhase::STOPPED,
            w,
        )?;
        let mut state = Vec::new();
        std::io::Read::read_to_end(&mut rd, &mut state)?;
        dev.check_device_state()
    };
    let mut s = setup("migrate", WINDOW);
    let f = lookup(&mut s.g, "f");
    map(&mut s.g, f, u64::MAX, 0, SLOT, READ, 0).unwrap();
    let e = save(&s.dev).unwrap_err();
    assert!(e.to_string().contains("1 DAX mapping"), "{e}");
    unmap(&mut s.g, &[(0, SLOT)]).unwrap();
    save(&s.dev).unwrap();
}

/// QEMU hands each window mapping to the back-end as guest memory: the
/// device guards those regions, so a request pointed at one whose file
/// the host truncated cannot kill the daemon (`host_io::mapped`'s test
/// shows the guard itself).
#[test]
fn window_mappings_handed_back_as_guest_memory_are_guarded() {
    let mut s = setup("guard", WINDOW);
    let w = s.g.window().unwrap().clone();
    let f = lookup(&mut s.g, "f");
    map(&mut s.g, f, u64::MAX, 0, SLOT, READ, 0).unwrap();
    map(&mut s.g, f, u64::MAX, SLOT, SLOT, READ, 2 * SLOT).unwrap();
    assert_eq!(s.dev.dax_guarded_regions(), 0);
    // Where a guest's BAR might put the window.
    const GPA: u64 = 1 << 40;
    let r0 = w.region_at(0, GPA).unwrap();
    let r2 = w.region_at(2 * SLOT, GPA + 2 * SLOT).unwrap();
    s.g.frontend_mut().add_mem_region(&r0).unwrap();
    s.g.frontend_mut().add_mem_region(&r2).unwrap();
    assert!(common::within(std::time::Duration::from_secs(5), || {
        s.dev.dax_guarded_regions() == 2
    }));
    // Guest RAM itself (a memfd) is not guarded; a region taken away no
    // longer is.
    s.g.frontend_mut().remove_mem_region(&r2).unwrap();
    assert!(common::within(std::time::Duration::from_secs(5), || {
        s.dev.dax_guarded_regions() == 1
    }));
}
