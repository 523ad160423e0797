//! The dispatcher and the in-memory filesystem end to end: requests built
//! by a client travel through the engine and the in-process device to
//! device-style workers, and back.

use fuse_core::abi::{self, encode::Body, *};
use fuse_core::server::{serve_device, Dispatcher, ServerConfig};
use fuse_core::testing::memfs::MemFs;
use fuse_core::{Args, Chan, ChanConfig, Errno, ReplyPayload};
use std::sync::Arc;
use zerocopy::FromBytes;

struct Client {
    chan: Chan,
    fs: Arc<Dispatcher<MemFs>>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for Client {
    fn drop(&mut self) {
        self.chan.abort();
        for w in self.workers.drain(..) {
            w.join().unwrap();
        }
    }
}

fn sz<T>() -> usize {
    std::mem::size_of::<T>()
}

impl Client {
    fn new(threads: usize) -> Client {
        let chan = Chan::new(ChanConfig {
            spawn_scanner: false,
            ..Default::default()
        });
        let fs = Arc::new(Dispatcher::new(MemFs::new(), ServerConfig::default()));
        let workers = serve_device(chan.device().unwrap(), fs.clone(), threads);
        chan.init().unwrap();
        Client { chan, fs, workers }
    }
    fn req(
        &self,
        op: Opcode,
        node: u64,
        body: Body,
        out: usize,
        var: bool,
    ) -> Result<ReplyPayload, Errno> {
        self.chan.send(
            Args::new(op, node)
                .body(body.into_vec())
                .out(out, var)
                .creds(1000, 1000, 1),
        )
    }
    fn lookup(&self, parent: u64, name: &str) -> Result<EntryOut, Errno> {
        self.req(
            Opcode::Lookup,
            parent,
            Body::new().cstr(name.as_bytes()),
            sz::<EntryOut>(),
            false,
        )
        .map(|r| r.read().unwrap())
    }
    fn mkdir(&self, parent: u64, name: &str) -> Result<EntryOut, Errno> {
        let b = Body::new()
            .push(&MkdirIn {
                mode: 0o755,
                umask: 0o022,
            })
            .cstr(name.as_bytes());
        self.req(Opcode::Mkdir, parent, b, sz::<EntryOut>(), false)
            .map(|r| r.read().unwrap())
    }
    fn create(&self, parent: u64, name: &str) -> Result<(EntryOut, OpenOut), Errno> {
        let b = Body::new()
            .push(&CreateIn {
                flags: 2,
                mode: 0o644,
                umask: 0o022,
                open_flags: 0,
            })
            .cstr(name.as_bytes());
        let r = self.req(
            Opcode::Create,
            parent,
            b,
            sz::<EntryOut>() + sz::<OpenOut>(),
            false,
        )?;
        let e: EntryOut = r.read().unwrap();
        let o = OpenOut::read_from_bytes(&r.data[sz::<EntryOut>()..]).unwrap();
        Ok((e, o))
    }
    fn write(&self, ino: u64, fh: u64, off: u64, data: &[u8]) -> Result<u32, Errno> {
        let b = Body::new()
            .push(&WriteIn {
                fh,
                offset: off,
                size: data.len() as u32,
                ..Default::default()
            })
            .bytes(data);
        self.req(Opcode::Write, ino, b, sz::<WriteOut>(), false)
            .map(|r| r.read::<WriteOut>().unwrap().size)
    }
    fn read(&self, ino: u64, fh: u64, off: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let b = Body::new().push(&ReadIn {
            fh,
            offset: off,
            size,
            ..Default::default()
        });
        self.req(Opcode::Read, ino, b, size as usize, true)
            .map(|r| r.data)
    }
    fn getattr(&self, ino: u64) -> Result<Attr, Errno> {
        self.req(
            Opcode::Getattr,
            ino,
            Body::new().push(&GetattrIn::default()),
            sz::<AttrOut>(),
            false,
        )
        .map(|r| r.read::<AttrOut>().unwrap().attr)
    }
    fn readdir(&self, ino: u64) -> Vec<String> {
        let fh = self
            .req(
                Opcode::Opendir,
                ino,
                Body::new().push(&OpenIn::default()),
                sz::<OpenOut>(),
                false,
            )
            .unwrap()
            .read::<OpenOut>()
            .unwrap()
            .fh;
        let mut names = Vec::new();
        let mut off = 0;
        loop {
            // A small buffer forces several READDIR rounds.
            let b = Body::new().push(&ReadIn {
                fh,
                offset: off,
                size: 96,
                ..Default::default()
            });
            let r = self.req(Opcode::Readdir, ino, b, 96, true).unwrap();
            let ents = abi::decode_dirents(&r.data).unwrap();
            if ents.is_empty() {
                break;
            }
            for e in &ents {
                names.push(String::from_utf8(e.name.to_vec()).unwrap());
                off = e.dirent.off;
            }
        }
        names
    }
}

fn forget(c: &Client, ino: u64, n: u64) {
    c.chan.send_forget(ino, n);
}

#[test]
fn init_negotiates_through_the_dispatcher() {
    let c = Client::new(1);
    let neg = c.chan.negotiated().unwrap();
    assert_eq!(neg.minor, 45);
    assert_eq!(neg.max_write, 1 << 20);
    assert!(neg.flags & init::ASYNC_READ != 0);
    assert_eq!(c.fs.decode_options().minor, 45);
}

#[test]
fn files_directories_and_data() {
    let c = Client::new(2);
    let d = c.mkdir(1, "dir").unwrap();
    assert_eq!(d.attr.mode, 0o040755);
    assert_eq!(d.attr.uid, 1000);
    assert_eq!(c.mkdir(1, "dir"), Err(Errno::EEXIST));
    let (f, o) = c.create(d.nodeid, "file").unwrap();
    assert_eq!(f.attr.mode, 0o100644);
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(c.write(f.nodeid, o.fh, 0, &data).unwrap(), 200_000);
    assert_eq!(c.getattr(f.nodeid).unwrap().size, 200_000);
    assert_eq!(c.read(f.nodeid, o.fh, 100, 1000).unwrap(), &data[100..1100]);
    assert_eq!(
        c.read(f.nodeid, o.fh, 199_990, 100).unwrap(),
        &data[199_990..],
        "short read at EOF"
    );
    assert_eq!(c.lookup(d.nodeid, "file").unwrap().nodeid, f.nodeid);
    assert_eq!(c.lookup(d.nodeid, "nope"), Err(Errno::ENOENT));
    for i in 0..20 {
        c.create(d.nodeid, &format!("f{i:02}")).unwrap();
    }
    let names = c.readdir(d.nodeid);
    assert_eq!(names.len(), 2 + 1 + 20, "{names:?}");
    assert_eq!(&names[..3], [".", "..", "f00"]);
    // rmdir of a non-empty directory, then unlink and rename.
    let rm = |p, n: &str| c.req(Opcode::Rmdir, p, Body::new().cstr(n.as_bytes()), 0, false);
    assert_eq!(rm(1, "dir"), Err(Errno::ENOTEMPTY));
    let rn = Body::new()
        .push(&RenameIn { newdir: 1 })
        .cstr(b"file")
        .cstr(b"moved");
    c.req(Opcode::Rename, d.nodeid, rn, 0, false).unwrap();
    assert_eq!(c.lookup(1, "moved").unwrap().nodeid, f.nodeid);
    c.req(Opcode::Unlink, 1, Body::new().cstr(b"moved"), 0, false)
        .unwrap();
    assert_eq!(c.lookup(1, "moved"), Err(Errno::ENOENT));
}

#[test]
fn forgets_free_unlinked_inodes() {
    let c = Client::new(1);
    let before = c.fs.fs().live_inodes();
    let (f, _) = c.create(1, "gone").unwrap();
    c.lookup(1, "gone").unwrap();
    c.req(Opcode::Unlink, 1, Body::new().cstr(b"gone"), 0, false)
        .unwrap();
    assert_eq!(
        c.fs.fs().live_inodes(),
        before + 1,
        "still referenced by two lookups"
    );
    forget(&c, f.nodeid, 2);
    // Forgets have no reply: wait for the worker to process them.
    let start = std::time::Instant::now();
    while c.fs.fs().live_inodes() != before {
        assert!(start.elapsed().as_secs() < 10);
        std::thread::yield_now();
    }
}

#[test]
fn xattrs_and_errors() {
    let c = Client::new(1);
    // SETXATTR_EXT is not negotiated: the compat 8-byte argument.
    let arg = SetxattrIn {
        size: 3,
        ..Default::default()
    };
    let set = Body::new()
        .bytes(&zerocopy::IntoBytes::as_bytes(&arg)[..COMPAT_SETXATTR_IN_SIZE])
        .cstr(b"user.k")
        .bytes(b"val");
    c.req(Opcode::Setxattr, 1, set, 0, false).unwrap();
    let get = |size: u32| {
        c.req(
            Opcode::Getxattr,
            1,
            Body::new()
                .push(&GetxattrIn { size, padding: 0 })
                .cstr(b"user.k"),
            if size == 0 { 8 } else { size as usize },
            size != 0,
        )
    };
    assert_eq!(get(0).unwrap().read::<GetxattrOut>().unwrap().size, 3);
    assert_eq!(get(16).unwrap().data, b"val");
    assert_eq!(get(2), Err(Errno::ERANGE));
    // Unimplemented opcodes answer ENOSYS.
    let r = c.req(
        Opcode::Bmap,
        1,
        Body::new().push(&BmapIn::default()),
        8,
        false,
    );
    assert_eq!(r, Err(Errno::ENOSYS));
}

#[test]
fn malformed_requests_get_an_error_reply_not_a_panic() {
    let disp = Dispatcher::new(MemFs::new(), ServerConfig::default());
    let mut out = vec![0u8; 1 << 16];
    // A LOOKUP whose name has no NUL.
    let h = InHeader {
        opcode: Opcode::Lookup as u32,
        unique: 8,
        nodeid: 1,
        ..Default::default()
    };
    let msg = encode::request(h, b"abc");
    let o = disp.handle_bytes(&msg, &mut out).unwrap();
    assert_eq!((o.unique, o.error), (8, Errno::EIO.to_wire()));
    // Too short for a header: nothing to answer.
    assert!(disp.handle_bytes(&[1, 2, 3], &mut out).is_none());
    // A READ larger than the reply buffer is clamped, not overrun.
    let mut small = vec![0u8; 10];
    let h = InHeader {
        opcode: Opcode::Read as u32,
        unique: 10,
        nodeid: 1,
        ..Default::default()
    };
    let msg = encode::request(
        h,
        zerocopy::IntoBytes::as_bytes(&ReadIn {
            size: 1 << 20,
            ..Default::default()
        }),
    );
    let o = disp.handle_bytes(&msg, &mut small).unwrap();
    assert_eq!(o.error, Errno::EISDIR.to_wire());
}

#[test]
fn split_decoding_matches_contiguous() {
    // What the ring delivers: the op struct in op_in, the rest in payload.
    let arg = WriteIn {
        fh: 3,
        offset: 9,
        size: 4,
        ..Default::default()
    };
    let h = InHeader {
        opcode: Opcode::Write as u32,
        unique: 2,
        nodeid: 5,
        ..Default::default()
    };
    let contiguous = encode::request(h, &Body::new().push(&arg).bytes(b"data").into_vec());
    let a = abi::decode_request(&contiguous, DecodeOptions::default()).unwrap();
    let mut op_in = [0u8; 128];
    op_in[..40].copy_from_slice(zerocopy::IntoBytes::as_bytes(&arg));
    let mut hs = h;
    hs.len = contiguous.len() as u32;
    let b = abi::decode_split(hs, &op_in, b"data", DecodeOptions::default()).unwrap();
    assert_eq!(a.op, b.op);
    let h = InHeader {
        opcode: Opcode::Rename as u32,
        unique: 2,
        nodeid: 5,
        ..Default::default()
    };
    let mut op_in = [0u8; 128];
    op_in[..8].copy_from_slice(&7u64.to_le_bytes());
    let r = abi::decode_split(h, &op_in, b"a\0b\0", DecodeOptions::default()).unwrap();
    assert_eq!(
        r.op,
        Operation::Rename {
            arg: RenameIn { newdir: 7 },
            old: b"a",
            new: b"b"
        }
    );
}
