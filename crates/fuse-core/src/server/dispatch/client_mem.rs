//! READ and WRITE whose data is the client's memory (a READ's
//! destination, a WRITE's source) rather than the reply or request
//! buffer. The filesystem may use the memory itself or ask for a plain
//! buffer, which is then copied; a copy that fails fails the request.

use super::reply::put;
use super::Dispatcher;
use crate::abi::{self, WriteOut};
use crate::chan::{ClientMem, Errno};
use crate::server::{Ctx, Filesystem, ReadSink, WriteSource};

impl<F: Filesystem> Dispatcher<F> {
    /// READ into client memory; `out` is the buffer offered to a
    /// filesystem that cannot use the client's memory itself.
    pub(super) fn read_client(
        &self,
        ctx: &Ctx,
        nodeid: u64,
        arg: &abi::ReadIn,
        mem: &dyn ClientMem,
        out: &mut [u8],
    ) -> Result<usize, Errno> {
        let n = (arg.size as usize).min(mem.len());
        let mut sink = ClientSink {
            mem,
            out,
            n,
            spill: Vec::new(),
            buffered: false,
        };
        let got = self.fs.read(
            ctx,
            F::Inode::from(nodeid),
            F::Handle::from(arg.fh),
            arg.offset,
            &mut sink,
        )?;
        let got = got.min(n);
        if sink.buffered {
            let buf = if sink.spill.is_empty() {
                &sink.out[..got]
            } else {
                &sink.spill[..got]
            };
            mem.write_at(0, buf)?;
        }
        Ok(got)
    }

    /// WRITE from client memory (the decoded `data` is empty; the client's
    /// memory holds exactly `arg.size` bytes).
    pub(super) fn write_client(
        &self,
        ctx: &Ctx,
        nodeid: u64,
        arg: &abi::WriteIn,
        data: &[u8],
        mem: &dyn ClientMem,
        out: &mut [u8],
    ) -> Result<usize, Errno> {
        if !data.is_empty() || arg.size as usize != mem.len() {
            return Err(Errno::EINVAL);
        }
        let src = ClientSource {
            mem,
            copy: std::cell::OnceCell::new(),
        };
        let n = self.fs.write(
            ctx,
            F::Inode::from(nodeid),
            F::Handle::from(arg.fh),
            arg.offset,
            &src,
            arg.write_flags,
        );
        // A filesystem that asked for the bytes and got none because the
        // client's memory could not be read must not report a short write.
        if let Some(Err(e)) = src.copy.get() {
            return Err(*e);
        }
        put(
            out,
            &WriteOut {
                size: n?.min(mem.len()) as u32,
                padding: 0,
            },
        )
    }
}

/// READ sink over the client's memory, with a plain buffer for
/// filesystems that want one (then copied to the client).
struct ClientSink<'a> {
    mem: &'a dyn ClientMem,
    out: &'a mut [u8],
    n: usize,
    /// Used when `out` is smaller than the READ.
    spill: Vec<u8>,
    buffered: bool,
}

impl ReadSink for ClientSink<'_> {
    fn buffer(&mut self) -> &mut [u8] {
        self.buffered = true;
        if self.out.len() >= self.n {
            &mut self.out[..self.n]
        } else {
            self.spill.resize(self.n, 0);
            &mut self.spill
        }
    }
    fn client(&self) -> Option<(&dyn ClientMem, usize)> {
        Some((self.mem, self.n))
    }
}

/// WRITE source over the client's memory, copied out only if the
/// filesystem asks for the bytes.
struct ClientSource<'a> {
    mem: &'a dyn ClientMem,
    copy: std::cell::OnceCell<Result<Vec<u8>, Errno>>,
}

impl WriteSource for ClientSource<'_> {
    fn data(&self) -> &[u8] {
        let r = self.copy.get_or_init(|| {
            let mut v = vec![0u8; self.mem.len()];
            self.mem.read_at(0, &mut v).map(|()| v)
        });
        r.as_deref().unwrap_or(&[])
    }
    fn client(&self) -> Option<&dyn ClientMem> {
        Some(self.mem)
    }
}
