//! The file a DAX mapping would map (`Filesystem::map_source`, issue 34):
//! the handle's own open file, writable only when opened for writing,
//! refused for a handle of another inode, a directory or a closed handle;
//! and the files marked FUSE_ATTR_DAX for a guest mounted `-o dax=inode`.
//! Needs root (mounts a tmpfs).

mod common;

use common::{HostDir, Kind};
use fuse_core::abi::ROOT_ID;
use fuse_core::server::{Ctx, Filesystem, FsResult};
use fuse_core::Errno;
use passthrough::{Config, PassthroughFs};
use std::os::fd::AsRawFd;

/// What `map_source` lent: (writable, size, the first bytes read through
/// the lent fd).
fn lent(fs: &PassthroughFs, ino: u64, fh: u64) -> FsResult<(bool, u64, Vec<u8>)> {
    let mut got = None;
    fs.map_source(&Ctx::default(), ino, Some(fh), false, &mut |m| {
        let mut buf = [0u8; 8];
        // SAFETY: `buf` is valid for 8 bytes; `m.fd` is open during the call.
        let n = unsafe { libc::pread(m.fd.as_raw_fd(), buf.as_mut_ptr().cast(), 8, 0) };
        assert_eq!(n, 8);
        got = Some((m.writable, m.size, buf.to_vec()));
        Ok(())
    })?;
    Ok(got.expect("map was called"))
}

#[test]
fn a_mapping_gets_the_handles_file_with_its_open_mode() {
    let host = HostDir::new(Kind::Tmpfs);
    std::fs::write(host.path.join("f"), b"contents of f, 24 bytes.").unwrap();
    std::fs::write(host.path.join("g"), b"gggggggg").unwrap();
    std::fs::create_dir(host.path.join("d")).unwrap();
    let fs = PassthroughFs::new(&host.path, Config::default()).unwrap();
    let ctx = Ctx::default();
    let f = fs.lookup(&ctx, ROOT_ID, b"f").unwrap().inode;
    let g = fs.lookup(&ctx, ROOT_ID, b"g").unwrap().inode;
    let d = fs.lookup(&ctx, ROOT_ID, b"d").unwrap().inode;

    let ro = fs.open(&ctx, f, libc::O_RDONLY as u32).unwrap().handle;
    assert_eq!(lent(&fs, f, ro), Ok((false, 24, b"contents".to_vec())));
    let rw = fs.open(&ctx, f, libc::O_RDWR as u32).unwrap().handle;
    assert_eq!(lent(&fs, f, rw), Ok((true, 24, b"contents".to_vec())));

    // What `map` returns is what the call returns.
    let r = fs.map_source(&ctx, f, Some(rw), false, &mut |_| Err(Errno::ENOSPC));
    assert_eq!(r, Err(Errno::ENOSPC));

    // Another inode's handle, a directory's, a closed one.
    let hg = fs.open(&ctx, g, libc::O_RDWR as u32).unwrap().handle;
    assert_eq!(lent(&fs, f, hg), Err(Errno::EINVAL));
    assert_eq!(lent(&fs, g, hg), Ok((true, 8, b"gggggggg".to_vec())));
    let hd = fs.opendir(&ctx, d, libc::O_RDONLY as u32).unwrap().handle;
    assert!(lent(&fs, d, hd).is_err());
    // Linux sends no handle: the inode's file is opened for the call,
    // for writing only when asked, and closed again.
    let open_before = fs.handle_count();
    let mut seen = None;
    fs.map_source(&ctx, f, None, false, &mut |m| {
        seen = Some((m.writable, m.size));
        Ok(())
    })
    .unwrap();
    assert_eq!(seen, Some((false, 24)));
    fs.map_source(&ctx, f, None, true, &mut |m| {
        seen = Some((m.writable, m.size));
        Ok(())
    })
    .unwrap();
    assert_eq!(seen, Some((true, 24)));
    assert_eq!(fs.handle_count(), open_before);
    assert!(fs
        .map_source(&ctx, d, None, false, &mut |_| Ok(()))
        .is_err());
    assert_eq!(fs.handle_count(), open_before);
    fs.release(&ctx, f, ro, 0).unwrap();
    assert_eq!(lent(&fs, f, ro), Err(Errno::EBADF));
    assert_eq!(lent(&fs, f, u64::MAX), Err(Errno::EBADF));
}

#[test]
fn files_a_window_can_map_whole_are_marked_for_dax_inode_guests() {
    let host = HostDir::new(Kind::Tmpfs);
    std::fs::write(host.path.join("whole"), vec![1u8; 4 << 20]).unwrap();
    std::fs::write(host.path.join("part"), vec![1u8; (2 << 20) + 4096]).unwrap();
    std::fs::write(host.path.join("empty"), b"").unwrap();
    std::fs::create_dir(host.path.join("d")).unwrap();
    let dax = fuse_core::abi::flags::ATTR_DAX;
    for on in [false, true] {
        let cfg = Config {
            dax_inodes: on,
            ..Config::default()
        };
        let fs = PassthroughFs::new(&host.path, cfg).unwrap();
        let ctx = Ctx::default();
        for (name, marked) in [
            ("whole", on),
            ("part", false),
            ("empty", false),
            ("d", false),
        ] {
            let e = fs.lookup(&ctx, ROOT_ID, name.as_bytes()).unwrap();
            assert_eq!(e.attr.flags & dax != 0, marked, "{name}, dax_inodes {on}");
            let (a, _) = fs.getattr(&ctx, e.inode, None).unwrap();
            assert_eq!(a.flags & dax != 0, marked, "{name}, dax_inodes {on}");
        }
    }
    // A read-only share: nothing can be mapped (QEMU 11.1 maps only files
    // open for writing), so nothing is marked.
    let cfg = Config {
        dax_inodes: true,
        readonly: true,
        ..Config::default()
    };
    let fs = PassthroughFs::new(&host.path, cfg).unwrap();
    let e = fs.lookup(&Ctx::default(), ROOT_ID, b"whole").unwrap();
    assert_eq!(e.attr.flags & dax, 0);
}
