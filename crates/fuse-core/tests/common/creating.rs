//! A filesystem that records what each creating request's `Ctx` carries
//! (a label, groups), for the tests of the creating requests' extensions,
//! and a dispatcher over it after an INIT.

use fuse_core::abi::{encode, encode::Body, init, InHeader, InitIn, Opcode, KERNEL_VERSION};
use fuse_core::abi::{Attr, ROOT_ID};
use fuse_core::server::{Created, Ctx, Dispatcher, Entry, Filesystem, FsResult, Opened};
use std::sync::Mutex;
use std::time::Duration;

/// Records `read(ctx)` for each creating call; asks for `flag` in INIT.
pub struct Creating<T> {
    pub flag: u64,
    pub read: fn(&Ctx) -> T,
    pub seen: Mutex<Vec<(Opcode, T)>>,
}

impl<T: Send + 'static> Creating<T> {
    fn note(&self, op: Opcode, ctx: &Ctx) -> FsResult<Entry<u64>> {
        self.seen.lock().unwrap().push((op, (self.read)(ctx)));
        Ok(Entry {
            inode: 2,
            generation: 0,
            attr: Attr::default(),
            entry_valid: Duration::ZERO,
            attr_valid: Duration::ZERO,
        })
    }
    fn opened() -> Opened<u64> {
        Opened {
            handle: 1,
            open_flags: 0,
            backing_id: 0,
        }
    }
}

impl<T: Send + 'static> Filesystem for Creating<T> {
    type Inode = u64;
    type Handle = u64;
    type Io = ();

    fn new_io(&self, _: fuse_core::server::Wake) {}
    fn init(&self, _capable: u64) -> FsResult<u64> {
        Ok(self.flag)
    }
    fn mkdir(&self, ctx: &Ctx, _: u64, _: &[u8], _: u32, _: u32) -> FsResult<Entry<u64>> {
        self.note(Opcode::Mkdir, ctx)
    }
    fn mknod(&self, ctx: &Ctx, _: u64, _: &[u8], _: u32, _: u32, _: u32) -> FsResult<Entry<u64>> {
        self.note(Opcode::Mknod, ctx)
    }
    fn symlink(&self, ctx: &Ctx, _: u64, _: &[u8], _: &[u8]) -> FsResult<Entry<u64>> {
        self.note(Opcode::Symlink, ctx)
    }
    fn create(
        &self,
        ctx: &Ctx,
        _: u64,
        _: &[u8],
        _: u32,
        _: u32,
        _: u32,
    ) -> FsResult<Created<u64, u64>> {
        Ok((self.note(Opcode::Create, ctx)?, Self::opened()))
    }
    fn tmpfile(&self, ctx: &Ctx, _: u64, _: u32, _: u32, _: u32) -> FsResult<Created<u64, u64>> {
        Ok((self.note(Opcode::Tmpfile, ctx)?, Self::opened()))
    }
}

/// A request header for `op` on the root, with `extlen` of extensions.
pub fn header(op: Opcode, unique: u64, extlen: u16) -> InHeader {
    InHeader {
        opcode: op as u32,
        unique,
        nodeid: ROOT_ID,
        total_extlen: extlen,
        ..Default::default()
    }
}

/// A dispatcher over `fs` after an INIT offering `offer` at protocol
/// 7.`minor`.
pub fn served_at<T: Send + 'static>(
    fs: Creating<T>,
    offer: u64,
    minor: u32,
) -> Dispatcher<Creating<T>> {
    let d = Dispatcher::new(fs, Default::default());
    let (f1, f2) = init::split(offer | init::INIT_EXT);
    let arg = InitIn {
        major: KERNEL_VERSION,
        minor,
        flags: f1,
        flags2: f2,
        ..Default::default()
    };
    let msg = encode::request(header(Opcode::Init, 2, 0), &Body::new().push(&arg).0);
    let mut out = vec![0u8; 4096];
    let o = d.handle_bytes(&msg, &mut out).unwrap();
    assert_eq!(o.error, 0);
    d
}
