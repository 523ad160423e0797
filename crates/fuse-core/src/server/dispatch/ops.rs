//! One handler per opcode: decodes the request's arguments for the
//! [`Filesystem`] call and encodes its answer with `reply`. INIT records
//! the negotiated minor and flags, which later requests decode under.

use super::reply::{attr_out, entry_out, lock_req, open_out, put, DirBuf, DirPlusBuf};
use super::{DeferFn, Dispatcher, Handled, Outcome};
use crate::abi::{
    self, init, CopyFileRangeOut, GetxattrOut, InitIn, InitOut, LkIn, LkOut, LseekOut, Operation,
    StatfsOut, StatxOut, WriteOut,
};
use crate::chan::Errno;
use crate::server::{Ctx, Deferred, Filesystem, Xattr};
use std::sync::atomic::Ordering;

impl<F: Filesystem> Dispatcher<F> {
    pub(super) fn setlkw(
        &self,
        ctx: &Ctx,
        nodeid: u64,
        arg: &LkIn,
        defer: Option<DeferFn<'_>>,
    ) -> Handled {
        let req = lock_req(arg);
        let (ino, fh) = (F::Inode::from(nodeid), F::Handle::from(arg.fh));
        if let Some(make) = defer {
            self.fs.setlkw(ctx, ino, fh, &req, make(ctx.unique));
            return Handled::Parked;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let done = Deferred::new(move |e| {
            let _ = tx.send(e);
        });
        self.fs.setlkw(ctx, ino, fh, &req, done);
        let error = rx.recv().unwrap_or(Errno::EIO.to_wire());
        Handled::Reply(Outcome {
            unique: ctx.unique,
            error,
            len: 0,
        })
    }

    fn init(&self, arg: &InitIn, out: &mut [u8]) -> Result<usize, Errno> {
        let mut reply = InitOut {
            major: abi::KERNEL_VERSION,
            minor: abi::KERNEL_MINOR_VERSION,
            ..Default::default()
        };
        if arg.major != abi::KERNEL_VERSION {
            // Tell the kernel our major; it retries or gives up.
            return put(out, &reply);
        }
        let mut offered = u64::from(arg.flags);
        if offered & init::INIT_EXT != 0 {
            offered |= u64::from(arg.flags2) << 32;
        }
        let wanted = self.fs.init(offered)? | self.cfg.flags;
        let mut flags = wanted & offered;
        if self.cfg.request_timeout != 0 {
            flags |= init::REQUEST_TIMEOUT & offered;
        }
        let minor = arg.minor.min(abi::KERNEL_MINOR_VERSION);
        self.minor.store(minor, Ordering::Relaxed);
        self.flags.store(flags, Ordering::Relaxed);
        let (f1, f2) = init::split(flags);
        reply.minor = minor;
        reply.flags = f1;
        reply.flags2 = f2;
        reply.max_readahead = arg.max_readahead;
        reply.max_write = self.cfg.max_write;
        reply.max_background = self.cfg.max_background;
        reply.congestion_threshold = self.cfg.congestion_threshold;
        reply.max_pages =
            ((self.cfg.max_write as usize).div_ceil(4096)).min(u16::MAX as usize) as u16;
        reply.time_gran = 1;
        reply.request_timeout = self.cfg.request_timeout;
        if flags & init::MAP_ALIGNMENT != 0 {
            // DAX mappings (FUSE_SETUPMAPPING) align to the host's pages:
            // log2 of 4 KiB.
            reply.map_alignment = 12;
        }
        if flags & init::PASSTHROUGH != 0 {
            // Backing files may sit on a filesystem that stacks on nothing
            // (depth 0); the mount itself then counts as depth 1. A share
            // on overlayfs gets no passthrough (its backing opens fail
            // with ELOOP and the server falls back to serving the data).
            reply.max_stack_depth = 1;
        }
        let n = put(out, &reply)?;
        self.inited.store(true, Ordering::Release);
        Ok(n)
    }

    fn xattr(x: Xattr, size: u32, out: &mut [u8]) -> Result<usize, Errno> {
        match x {
            Xattr::Size(n) => put(
                out,
                &GetxattrOut {
                    size: n,
                    padding: 0,
                },
            ),
            Xattr::Data(d) if size == 0 => put(
                out,
                &GetxattrOut {
                    size: d.len() as u32,
                    padding: 0,
                },
            ),
            Xattr::Data(d) if d.len() > size as usize => Err(Errno::ERANGE),
            Xattr::Data(d) => {
                out.get_mut(..d.len())
                    .ok_or(Errno::ERANGE)?
                    .copy_from_slice(&d);
                Ok(d.len())
            }
        }
    }

    pub(super) fn call(
        &self,
        ctx: &Ctx,
        nodeid: u64,
        op: &Operation<'_>,
        out: &mut [u8],
    ) -> Result<usize, Errno> {
        use Operation as O;
        let fs = &self.fs;
        let ino = F::Inode::from(nodeid);
        let fh = |fh: u64| F::Handle::from(fh);
        match op {
            O::Init { arg } => self.init(arg, out),
            O::Destroy => {
                fs.destroy();
                Ok(0)
            }
            O::Lookup { name } => put(out, &entry_out(fs.lookup(ctx, ino, name)?)),
            O::Getattr { arg } => {
                let handle = (arg.getattr_flags & abi::flags::GETATTR_FH != 0).then(|| fh(arg.fh));
                let (a, v) = fs.getattr(ctx, ino, handle)?;
                put(out, &attr_out(a, v))
            }
            O::Setattr { arg } => {
                let (a, v) = fs.setattr(ctx, ino, arg)?;
                put(out, &attr_out(a, v))
            }
            O::Readlink => {
                let t = fs.readlink(ctx, ino)?;
                out.get_mut(..t.len())
                    .ok_or(Errno::ENAMETOOLONG)?
                    .copy_from_slice(&t);
                Ok(t.len())
            }
            O::Symlink { name, target } => {
                put(out, &entry_out(fs.symlink(ctx, ino, name, target)?))
            }
            O::Mknod { arg, name } => put(
                out,
                &entry_out(fs.mknod(ctx, ino, name, arg.mode, arg.rdev, arg.umask)?),
            ),
            O::Mkdir { arg, name } => put(
                out,
                &entry_out(fs.mkdir(ctx, ino, name, arg.mode, arg.umask)?),
            ),
            O::Unlink { name } => fs.unlink(ctx, ino, name).map(|()| 0),
            O::Rmdir { name } => fs.rmdir(ctx, ino, name).map(|()| 0),
            O::Rename { arg, old, new } => fs
                .rename(ctx, ino, old, arg.newdir.into(), new, 0)
                .map(|()| 0),
            O::Rename2 { arg, old, new } => fs
                .rename(ctx, ino, old, arg.newdir.into(), new, arg.flags)
                .map(|()| 0),
            O::Link { arg, name } => put(
                out,
                &entry_out(fs.link(ctx, arg.oldnodeid.into(), ino, name)?),
            ),
            O::Open { arg } => put(out, &open_out(fs.open(ctx, ino, arg.flags)?)),
            O::Opendir { arg } => put(out, &open_out(fs.opendir(ctx, ino, arg.flags)?)),
            O::Read { arg } => {
                let n = (arg.size as usize).min(out.len());
                let mut sink = &mut out[..n];
                let got = fs.read(ctx, ino, fh(arg.fh), arg.offset, &mut sink)?;
                Ok(got.min(n))
            }
            O::Write { arg, data } => {
                let n = fs.write(ctx, ino, fh(arg.fh), arg.offset, data, arg.write_flags)?;
                put(
                    out,
                    &WriteOut {
                        size: n.min(data.len()) as u32,
                        padding: 0,
                    },
                )
            }
            O::Flush { arg } => fs.flush(ctx, ino, fh(arg.fh), arg.lock_owner).map(|()| 0),
            O::Release { arg } => fs.release(ctx, ino, fh(arg.fh), arg.flags).map(|()| 0),
            O::Releasedir { arg } => fs.releasedir(ctx, ino, fh(arg.fh)).map(|()| 0),
            O::Fsync { arg } => {
                let data = arg.fsync_flags & abi::flags::FSYNC_FDATASYNC != 0;
                fs.fsync(ctx, ino, fh(arg.fh), data).map(|()| 0)
            }
            O::Fsyncdir { arg } => {
                let data = arg.fsync_flags & abi::flags::FSYNC_FDATASYNC != 0;
                fs.fsyncdir(ctx, ino, fh(arg.fh), data).map(|()| 0)
            }
            O::Readdir { arg } => {
                let n = (arg.size as usize).min(out.len());
                let mut sink = DirBuf {
                    out: &mut out[..n],
                    len: 0,
                };
                fs.readdir(ctx, ino, fh(arg.fh), arg.offset, &mut sink)?;
                Ok(sink.len)
            }
            O::Statfs => put(
                out,
                &StatfsOut {
                    st: fs.statfs(ctx, ino)?,
                },
            ),
            O::Setxattr { arg, name, value } => fs
                .setxattr(ctx, ino, name, value, arg.flags, arg.setxattr_flags)
                .map(|()| 0),
            O::Getxattr { arg, name } => {
                Self::xattr(fs.getxattr(ctx, ino, name, arg.size)?, arg.size, out)
            }
            O::Listxattr { arg } => Self::xattr(fs.listxattr(ctx, ino, arg.size)?, arg.size, out),
            O::Removexattr { name } => fs.removexattr(ctx, ino, name).map(|()| 0),
            O::Access { arg } => fs.access(ctx, ino, arg.mask).map(|()| 0),
            O::Create { arg, name } => {
                let (e, o) = fs.create(ctx, ino, name, arg.mode, arg.flags, arg.umask)?;
                let n = put(out, &entry_out(e))?;
                Ok(n + put(&mut out[n..], &open_out(o))?)
            }
            O::Fallocate { arg } => fs
                .fallocate(ctx, ino, fh(arg.fh), arg.mode, arg.offset, arg.length)
                .map(|()| 0),
            O::Lseek { arg } => {
                let off = fs.lseek(ctx, ino, fh(arg.fh), arg.offset, arg.whence)?;
                put(out, &LseekOut { offset: off })
            }
            O::Syncfs { .. } => fs.syncfs(ctx, ino).map(|()| 0),
            O::Readdirplus { arg } => {
                let n = (arg.size as usize).min(out.len());
                let mut sink = DirPlusBuf {
                    out: &mut out[..n],
                    len: 0,
                };
                fs.readdirplus(ctx, ino, fh(arg.fh), arg.offset, &mut sink)?;
                Ok(sink.len)
            }
            O::Getlk { arg } => {
                let lk = fs.getlk(ctx, ino, fh(arg.fh), &lock_req(arg))?;
                put(out, &LkOut { lk })
            }
            O::Setlk { arg } => fs.setlk(ctx, ino, fh(arg.fh), &lock_req(arg)).map(|()| 0),
            O::Tmpfile { arg, .. } => {
                let (e, o) = fs.tmpfile(ctx, ino, arg.mode, arg.flags, arg.umask)?;
                let n = put(out, &entry_out(e))?;
                Ok(n + put(&mut out[n..], &open_out(o))?)
            }
            O::CopyFileRange { arg } | O::CopyFileRange64 { arg } => {
                let narrow = matches!(op, O::CopyFileRange { .. });
                // The 32-bit reply cannot report more: copy no more.
                let len = if narrow {
                    arg.len.min(u64::from(u32::MAX))
                } else {
                    arg.len
                };
                let n = fs.copy_file_range(
                    ctx,
                    ino,
                    fh(arg.fh_in),
                    arg.off_in,
                    arg.nodeid_out.into(),
                    fh(arg.fh_out),
                    arg.off_out,
                    len,
                    arg.flags,
                )?;
                if narrow {
                    put(
                        out,
                        &WriteOut {
                            size: n.min(u64::from(u32::MAX)) as u32,
                            padding: 0,
                        },
                    )
                } else {
                    put(out, &CopyFileRangeOut { bytes_copied: n })
                }
            }
            O::Statx { arg } => {
                let handle = (arg.getattr_flags & abi::flags::GETATTR_FH != 0).then(|| fh(arg.fh));
                let (stat, v) = fs.statx(ctx, ino, handle, arg.sx_flags, arg.sx_mask)?;
                put(
                    out,
                    &StatxOut {
                        attr_valid: v.as_secs(),
                        attr_valid_nsec: v.subsec_nanos(),
                        stat,
                        ..Default::default()
                    },
                )
            }
            _ => Err(Errno::ENOSYS),
        }
    }
}
