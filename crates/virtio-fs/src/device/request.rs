//! A guest request chain read into engine arguments and its ticket: the
//! headers copied out, READ and WRITE data left in guest memory by
//! reference (see `guest_mem.rs`), malformed chains refused.

use super::*;
use fuse_core::EndFn;
use std::sync::atomic::AtomicU8;

impl<F: Filesystem + 'static> FsDevice<F> {
    /// Reads a request chain into engine arguments, pushed onto `sends`
    /// with the ticket as their end (built in place there: `Args` is too
    /// large to move around per request), or refuses it (Err: its ticket,
    /// for [`FsDevice::refuse`]; nothing was answered or pushed). The
    /// chain comes with the memory generation it was translated in. `gen`
    /// is the queue's generation read before the chain was popped (a vring
    /// stopped after that makes it stale); `popped` is when its round was
    /// popped.
    pub(super) fn prepare(
        &self,
        vring: &Vring,
        (chain, mem_gen): (Chain, u64),
        q: RqId,
        gen: u64,
        popped: Instant,
        sends: &mut Vec<(Args, EndFn)>,
    ) -> Result<Arc<Ticket>, Arc<Ticket>> {
        let total = chain.readable_len();
        let mut hb = [0u8; IN_HEADER];
        let header = if total >= IN_HEADER && chain.read_at(0, &mut hb).is_ok() {
            InHeader::read_from_bytes(&hb).ok()
        } else {
            None
        };
        // READ and WRITE data stays in the guest's buffers: the engine gets
        // them by reference (copied only if the chain cannot be mapped).
        let wi = std::mem::size_of::<WriteIn>();
        let maps = self
            .inner
            .cfg
            .fixed_guest_memory
            .then_some(&self.inner.maps);
        let client = match header.map(|h| Opcode::from_u32(h.opcode)) {
            _ if !self.inner.cfg.zero_copy => None,
            Some(Some(Opcode::Read)) => Some(GuestSpans::new(
                chain.mem(),
                maps,
                chain.writable(),
                OUT_HEADER,
            )),
            Some(Some(Opcode::Write)) if total >= IN_HEADER + wi => Some(GuestSpans::new(
                chain.mem(),
                maps,
                chain.readable(),
                IN_HEADER + wi,
            )),
            _ => None,
        };
        let lends = client.is_some();
        let ticket = Arc::new(Ticket {
            unique: header.map_or(0, |h| h.unique),
            engine_unique: AtomicU64::new(0),
            gen,
            opcode: header.map_or(0, |h| h.opcode),
            queue: q,
            started: popped,
            chain,
            mem_gen,
            vring: vring.clone(),
            dev: Arc::downgrade(&self.inner) as Weak<dyn Finish>,
            client,
            orphan: AtomicU8::new(ORPHAN_NO),
            state: Mutex::new(TicketState::InFlight),
        });
        if lends {
            self.inner.queue(q).lent.lend(&ticket);
        }
        let replyable = ticket.chain.writable_len() >= OUT_HEADER;
        let Some(h) = header else {
            return Err(ticket);
        };
        // The header's length must agree with the chain, and a request
        // that wants a reply must have room for at least its header.
        let opcode = Opcode::from_u32(h.opcode);
        if h.len as usize != total
            || !replyable
            || matches!(
                opcode,
                None | Some(Opcode::Forget | Opcode::BatchForget | Opcode::Interrupt)
            )
        {
            return Err(ticket);
        }
        let Some(opcode) = opcode else {
            return Err(ticket);
        };
        // A WRITE's data goes apart from its arguments (by reference, or
        // copied into its own buffer).
        let body_len = if opcode == Opcode::Write && total >= IN_HEADER + wi {
            wi
        } else {
            total - IN_HEADER
        };
        if body_len > body_cap(opcode, self.inner.cfg.max_write as usize) {
            // More than the opcode can carry: the kernel never sends it,
            // and the device would keep it until the request ends.
            return Err(ticket);
        }
        // Inline for most requests: no allocation (see `ArgBody`).
        let mut body = fuse_core::ArgBody::new();
        body.resize(body_len, 0);
        if ticket.chain.read_at(IN_HEADER, &mut body).is_err() {
            return Err(ticket);
        }
        let mut data = Vec::new();
        if opcode == Opcode::Write && !lends && body_len == wi {
            data = vec![0u8; total - IN_HEADER - wi];
            if ticket.chain.read_at(IN_HEADER + wi, &mut data).is_err() {
                return Err(ticket);
            }
        }
        // What the guest left for the reply, up to the largest reply a
        // request can have (the engine's payload buffers are that size; a
        // READ's data goes to the guest's buffers by reference anyway).
        let reply_room = (ticket.chain.writable_len() - OUT_HEADER)
            .min(self.inner.cfg.max_write.max(8192) as usize);
        // Set in place (each builder call would move the whole `Args`).
        sends.push((Args::new(opcode, h.nodeid), EndFn::Shared(ticket.clone())));
        let Some((args, _)) = sends.last_mut() else {
            return Err(ticket);
        };
        (args.uid, args.gid, args.pid) = (h.uid, h.gid, h.pid);
        args.body = body;
        args.data = data;
        (args.out_size, args.out_var) = (reply_room, true);
        args.qid = q.ring_queue();
        if lends {
            args.client = Some(ticket.clone() as Arc<dyn fuse_core::ClientMem>);
        }
        args.total_extlen = h.total_extlen;
        // Never held back by admission, as in the kernel: INIT and DESTROY
        // (the connection's own), RELEASE and FLUSH (FORCE there). Lock
        // calls go synchronously (see `drain_requests`).
        args.force = matches!(
            opcode,
            Opcode::Init | Opcode::Destroy | Opcode::Release | Opcode::Releasedir | Opcode::Flush
        );
        Ok(ticket)
    }

    /// Answers a request [`FsDevice::prepare`] refused: EIO, or the chain
    /// given back unused when it has no room for a reply.
    pub(super) fn refuse(&self, t: &Ticket) {
        self.inner.counters(t.queue).add_malformed(1);
        if t.chain.writable_len() < OUT_HEADER {
            self.give_back_unanswered(t);
        } else if t.claim() {
            self.answer(t, Errno::EIO.to_wire(), &[]);
        }
    }
}

/// The most bytes after `fuse_in_header` a request of `op` can carry (a
/// WRITE's data apart): its op struct, the names or value it carries, and
/// request extensions. Longer bodies are refused, so what the device holds
/// per request in flight stays small.
fn body_cap(op: Opcode, max_write: usize) -> usize {
    /// Request extensions (a security context, supplementary groups).
    const EXTENSIONS: usize = 8192;
    /// A name (NAME_MAX and its NUL).
    const NAME: usize = 256;
    /// A symlink target (PATH_MAX).
    const PATH: usize = 4096;
    /// An extended attribute's value (XATTR_SIZE_MAX).
    const XATTR: usize = 65536;
    let fixed = fuse_core::abi::op_in_size(op, fuse_core::abi::DecodeOptions::default());
    let var = match op {
        // The copied form of a WRITE (not by reference).
        Opcode::Write => max_write,
        Opcode::Setxattr => NAME + XATTR,
        Opcode::Symlink => NAME + PATH,
        Opcode::Rename | Opcode::Rename2 => 2 * NAME,
        Opcode::Lookup
        | Opcode::Mknod
        | Opcode::Mkdir
        | Opcode::Unlink
        | Opcode::Rmdir
        | Opcode::Link
        | Opcode::Create
        | Opcode::Tmpfile
        | Opcode::Getxattr
        | Opcode::Removexattr => NAME,
        // IOCTL input (FUSE_IOCTL_MAX_IOV pages at most).
        Opcode::Ioctl => 256 * 4096,
        _ => 0,
    };
    fixed + var + EXTENSIONS
}

/// Whether a request of `op` may change something on the host, and so
/// goes under its queue's fence (`Generation`): a request given up at a
/// vring stop must not act afterwards. Those that only read, and those
/// that only let go of what the session holds, need no fence (and cost
/// none on their way).
pub(super) fn changes_host(op: Opcode) -> bool {
    !matches!(
        op,
        Opcode::Lookup
            | Opcode::Getattr
            | Opcode::Readlink
            | Opcode::Read
            | Opcode::Statfs
            | Opcode::Release
            | Opcode::Fsync
            | Opcode::Getxattr
            | Opcode::Listxattr
            | Opcode::Flush
            | Opcode::Init
            | Opcode::Opendir
            | Opcode::Readdir
            | Opcode::Releasedir
            | Opcode::Fsyncdir
            | Opcode::Getlk
            | Opcode::Access
            | Opcode::Destroy
            | Opcode::Readdirplus
            | Opcode::Lseek
            | Opcode::Statx
            | Opcode::Syncfs
    )
}
