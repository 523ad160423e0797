//! The default mode: the queue driven as a guest kernel drives it
//! (`virtio_fs::testing::guest`), one thread, `--depth` chains in flight.

use crate::{Args, LoadError, Report, Rng, Workload};
use fuse_core::abi::{
    CreateIn, EntryOut, FsyncIn, GetattrIn, Opcode, OpenIn, OpenOut, ReadIn, ReleaseIn, WriteIn,
};
use std::time::{Duration, Instant};
use virtio_fs::testing::guest::{Done, GuestConfig, GuestDriver, GuestError, Req};
use vm_memory::Bytes;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

/// The request queue driven (1: the first after hiprio).
const Q: usize = 1;

fn guest(e: GuestError) -> LoadError {
    LoadError::Guest(e)
}

fn name_arg(name: &[u8]) -> Vec<u8> {
    let mut v = name.to_vec();
    v.push(0);
    v
}

/// A request with small arguments, answered with `reply` bytes at most.
fn small<'a>(opcode: Opcode, nodeid: u64, args: &'a [u8], reply: u32) -> Req<'a> {
    Req {
        opcode,
        nodeid,
        args,
        data_out: 0,
        reply,
    }
}

/// The data file, by name in the root: made (or remade, at another size)
/// with 1 MiB writes, then opened. Returns (node, fh).
fn data_file(g: &mut GuestDriver, a: &Args, max_write: u32) -> Result<(u64, u64), LoadError> {
    let size = a.file_mib.max(1) << 20;
    let name = name_arg(a.file.as_bytes());
    let looked = g.call(Q, &small(Opcode::Lookup, 1, &name, 128));
    let node = match looked {
        Ok((_, b)) => {
            let e = EntryOut::read_from_prefix(&b).map_err(|_| bad("LOOKUP"))?.0;
            (e.attr.size == size).then_some(e.nodeid)
        }
        Err(GuestError::Fuse(_, libc::ENOENT)) => None,
        Err(e) => return Err(guest(e)),
    };
    let node = match node {
        Some(n) => n,
        None => {
            let (nodeid, fh) = own_file(g, &a.file, false)?;
            let chunk = (1u64 << 20).min(u64::from(max_write));
            let pattern = vec![0x5au8; chunk as usize];
            g.memory()
                .write_slice(&pattern, g.slot_data(Q, 0))
                .map_err(|e| LoadError::Host("guest memory", std::io::Error::other(e)))?;
            let mut off = 0;
            while off < size {
                let w = WriteIn {
                    fh,
                    offset: off,
                    size: chunk as u32,
                    ..WriteIn::new_zeroed()
                };
                g.call(
                    Q,
                    &Req {
                        opcode: Opcode::Write,
                        nodeid,
                        args: w.as_bytes(),
                        data_out: chunk as u32,
                        reply: 8,
                    },
                )
                .map_err(guest)?;
                off += chunk;
            }
            let r = ReleaseIn {
                fh,
                ..ReleaseIn::new_zeroed()
            };
            g.call(Q, &small(Opcode::Release, nodeid, r.as_bytes(), 0))
                .map_err(guest)?;
            nodeid
        }
    };
    let mut flags = libc::O_RDWR as u32;
    if a.direct {
        flags |= libc::O_DIRECT as u32;
    }
    let o = OpenIn {
        flags,
        open_flags: 0,
    };
    let (_, b) = g
        .call(Q, &small(Opcode::Open, node, o.as_bytes(), 16))
        .map_err(guest)?;
    let fh = OpenOut::read_from_prefix(&b).map_err(|_| bad("OPEN"))?.0.fh;
    Ok((node, fh))
}

fn bad(what: &'static str) -> LoadError {
    LoadError::Guest(GuestError::BadReply(what))
}

/// Drops the data file's pages from the host's page cache.
fn drop_cache(a: &Args) -> Result<(), LoadError> {
    use std::os::fd::AsRawFd;
    let Some(dir) = &a.host_dir else {
        return Ok(());
    };
    let f = std::fs::File::open(dir.join(&a.file)).map_err(|e| LoadError::Host("--cold", e))?;
    host_io::sys::drop_cached(f.as_raw_fd()).map_err(|e| {
        LoadError::Host(
            "--cold fsync and fadvise",
            std::io::Error::from_raw_os_error(e.0),
        )
    })
}

/// Makes (or empties) the file `name` in the root and keeps it open for
/// read and write (O_DIRECT with `--direct`). Returns (node, fh).
fn own_file(g: &mut GuestDriver, name: &str, direct: bool) -> Result<(u64, u64), LoadError> {
    let mut flags = libc::O_RDWR | libc::O_TRUNC;
    if direct {
        flags |= libc::O_DIRECT;
    }
    let c = CreateIn {
        flags: flags as u32,
        mode: 0o644,
        umask: 0,
        open_flags: 0,
    };
    let mut args = c.as_bytes().to_vec();
    args.extend_from_slice(&name_arg(name.as_bytes()));
    let (_, b) = g
        .call(Q, &small(Opcode::Create, 1, &args, 144))
        .map_err(guest)?;
    let e = EntryOut::read_from_prefix(&b).map_err(|_| bad("CREATE"))?.0;
    let fh = OpenOut::read_from_prefix(&b[128..])
        .map_err(|_| bad("CREATE"))?
        .0
        .fh;
    Ok((e.nodeid, fh))
}

/// Per-slot state of the meta workload.
#[derive(Debug, Clone, Copy, Default)]
struct MetaSlot {
    step: u8,
    n: u64,
    node: u64,
    fh: u64,
}

/// What the slots run, and what a completion means.
struct Work {
    w: Workload,
    node: u64,
    fh: u64,
    size: u64,
    chunk: u32,
    rng: Rng,
    seq: u64,
    args: Vec<u8>,
    meta: Vec<MetaSlot>,
    /// The syncwrite workload: each slot's file (node, fh), and whether
    /// its next request is the FSYNC.
    own: Vec<(u64, u64, bool)>,
    /// Nodes unlinked since the last batch of completions: the guest
    /// forgets them (a guest kernel evicts an unlinked file it does not
    /// hold open at once, and sends a FORGET for it).
    forgets: Vec<u64>,
}

impl Work {
    /// The next request of `slot`.
    fn next(&mut self, slot: u16) -> Req<'_> {
        self.args.clear();
        let blocks = (self.size / 4096).max(1);
        match self.w {
            Workload::Randread | Workload::Seqread => {
                let (off, size) = if self.w == Workload::Randread {
                    (self.rng.next() % blocks * 4096, 4096)
                } else {
                    let off = self.seq;
                    self.seq = (self.seq + u64::from(self.chunk)) % self.size;
                    (off, self.chunk)
                };
                let r = ReadIn {
                    fh: self.fh,
                    offset: off,
                    size,
                    ..ReadIn::new_zeroed()
                };
                self.args.extend_from_slice(r.as_bytes());
                Req {
                    opcode: Opcode::Read,
                    nodeid: self.node,
                    args: &self.args,
                    data_out: 0,
                    reply: size,
                }
            }
            Workload::Randwrite | Workload::Seqwrite => {
                let (off, size) = if self.w == Workload::Randwrite {
                    (self.rng.next() % blocks * 4096, 4096)
                } else {
                    let off = self.seq;
                    self.seq = (self.seq + u64::from(self.chunk)) % self.size;
                    (off, self.chunk)
                };
                let r = WriteIn {
                    fh: self.fh,
                    offset: off,
                    size,
                    ..WriteIn::new_zeroed()
                };
                self.args.extend_from_slice(r.as_bytes());
                Req {
                    opcode: Opcode::Write,
                    nodeid: self.node,
                    args: &self.args,
                    data_out: size,
                    reply: 8,
                }
            }
            Workload::Getattr => {
                self.args
                    .extend_from_slice(GetattrIn::new_zeroed().as_bytes());
                small(Opcode::Getattr, self.node, &self.args, 104)
            }
            Workload::Syncwrite => {
                let (node, fh, sync) = self.own[usize::from(slot)];
                if sync {
                    let f = FsyncIn {
                        fh,
                        ..FsyncIn::new_zeroed()
                    };
                    self.args.extend_from_slice(f.as_bytes());
                    return small(Opcode::Fsync, node, &self.args, 0);
                }
                let w = WriteIn {
                    fh,
                    offset: self.rng.next() % 256 * 4096,
                    size: 4096,
                    ..WriteIn::new_zeroed()
                };
                self.args.extend_from_slice(w.as_bytes());
                Req {
                    opcode: Opcode::Write,
                    nodeid: node,
                    args: &self.args,
                    data_out: 4096,
                    reply: 8,
                }
            }
            Workload::Meta => {
                let m = self.meta[usize::from(slot)];
                let name = format!("m-{slot}-{}", m.n);
                match m.step {
                    0 => {
                        let c = CreateIn {
                            flags: libc::O_WRONLY as u32,
                            mode: 0o644,
                            umask: 0,
                            open_flags: 0,
                        };
                        self.args.extend_from_slice(c.as_bytes());
                        self.args.extend_from_slice(&name_arg(name.as_bytes()));
                        small(Opcode::Create, 1, &self.args, 144)
                    }
                    1 => {
                        let r = ReleaseIn {
                            fh: m.fh,
                            ..ReleaseIn::new_zeroed()
                        };
                        self.args.extend_from_slice(r.as_bytes());
                        small(Opcode::Release, m.node, &self.args, 0)
                    }
                    2 => {
                        self.args
                            .extend_from_slice(GetattrIn::new_zeroed().as_bytes());
                        small(Opcode::Getattr, m.node, &self.args, 104)
                    }
                    _ => {
                        self.args.extend_from_slice(&name_arg(name.as_bytes()));
                        small(Opcode::Unlink, 1, &self.args, 0)
                    }
                }
            }
        }
    }

    /// A completion of `slot`: the data bytes it moved and whether it
    /// finished one operation.
    fn done(&mut self, g: &GuestDriver, d: &Done) -> Result<(u64, bool), LoadError> {
        if d.out.error != 0 {
            return Err(LoadError::Fs("request", fuse_core::Errno(-d.out.error)));
        }
        let payload = u64::from(d.out.len.saturating_sub(16));
        match self.w {
            Workload::Randread | Workload::Seqread => Ok((payload, true)),
            Workload::Randwrite | Workload::Seqwrite => {
                let mut b = [0u8; 8];
                let _ = g.memory().read_slice(&mut b, g.reply_payload(Q, d.slot));
                Ok((
                    u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                    true,
                ))
            }
            Workload::Getattr => Ok((0, true)),
            Workload::Syncwrite => {
                let own = &mut self.own[usize::from(d.slot)];
                own.2 = !own.2;
                // The write's 4 KiB count when its FSYNC is answered.
                Ok(if own.2 { (0, false) } else { (4096, true) })
            }
            Workload::Meta => {
                let m = &mut self.meta[usize::from(d.slot)];
                if m.step == 0 {
                    let mut b = [0u8; 144];
                    let _ = g.memory().read_slice(&mut b, g.reply_payload(Q, d.slot));
                    m.node = EntryOut::read_from_prefix(&b)
                        .map_err(|_| bad("CREATE"))?
                        .0
                        .nodeid;
                    m.fh = OpenOut::read_from_prefix(&b[128..])
                        .map_err(|_| bad("CREATE"))?
                        .0
                        .fh;
                }
                if m.step == 3 {
                    // UNLINK done: CREATE gave the one lookup.
                    self.forgets.push(m.node);
                }
                m.step = (m.step + 1) % 4;
                let finished = m.step == 0;
                if finished {
                    m.n += 1;
                }
                Ok((0, finished))
            }
        }
    }
}

/// Latencies in microseconds, 1 µs buckets up to 1 s.
struct Histogram(Vec<u32>);

impl Histogram {
    fn add(&mut self, d: Duration) {
        let us = usize::try_from(d.as_micros()).unwrap_or(usize::MAX);
        let i = us.min(self.0.len() - 1);
        self.0[i] += 1;
    }
    fn pct(&self, p: f64) -> u64 {
        let total: u64 = self.0.iter().map(|&c| u64::from(c)).sum();
        let want = ((total as f64) * p).ceil() as u64;
        let mut seen = 0u64;
        for (i, &c) in self.0.iter().enumerate() {
            seen += u64::from(c);
            if seen >= want.max(1) {
                return i as u64;
            }
        }
        0
    }
}

pub fn run(a: &Args) -> Result<Report, LoadError> {
    let depth = u16::try_from(a.depth.max(1)).unwrap_or(u16::MAX);
    let slots = depth.max(1);
    let queue_size = a.queue_size.max((slots * 4).next_power_of_two()).min(1024);
    if slots * 4 > queue_size {
        return Err(LoadError::Guest(GuestError::Config(
            "depth is at most a quarter of the queue size (1024)",
        )));
    }
    let mut g = GuestDriver::connect(
        &a.socket_path,
        &GuestConfig {
            request_queues: a.queues,
            queue_size,
            slots,
            slot_data: 1 << 20,
            event_idx: true,
        },
    )
    .map_err(guest)?;
    let init = g.init().map_err(guest)?;
    let max_write = init.max_write.max(4096);
    let chunk = (1u32 << 20).min(max_write);
    let (node, fh) = if matches!(a.workload, Workload::Meta | Workload::Syncwrite) {
        (1, 0)
    } else {
        data_file(&mut g, a, max_write)?
    };
    let mut own = Vec::new();
    if a.workload == Workload::Syncwrite {
        for s in 0..slots {
            let (n, f) = own_file(&mut g, &format!("{}.sync-{s}", a.file), a.direct)?;
            own.push((n, f, false));
        }
    }
    if a.cold {
        drop_cache(a)?;
    }
    // Data the writes carry.
    for s in 0..slots {
        let _ = g
            .memory()
            .write_slice(&vec![0xa5u8; chunk as usize], g.slot_data(Q, s));
    }
    let size = a.file_mib.max(1) << 20;
    let mut work = Work {
        w: a.workload,
        node,
        fh,
        size,
        chunk,
        rng: Rng(0x9e37_79b9_7f4a_7c15),
        seq: 0,
        args: Vec::with_capacity(512),
        meta: vec![MetaSlot::default(); usize::from(slots)],
        own,
        forgets: Vec::new(),
    };
    let pid = a.daemon_pid.or(g.backend_pid());
    let mut hist = Histogram(vec![0; 1_000_000]);
    let (mut ops, mut bytes) = (0u64, 0u64);
    let mut done = Vec::with_capacity(usize::from(slots));
    let (d0, l0) = (pid.and_then(crate::cpu_us), crate::own_cpu_us());
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(a.seconds);
    for s in 0..slots {
        let r = work.next(s);
        g.post(Q, s, &r).map_err(guest)?;
    }
    g.publish(Q);
    let mut in_flight = usize::from(slots);
    while in_flight > 0 {
        g.wait(Q, Duration::from_secs(30)).map_err(guest)?;
        done.clear();
        g.reap(Q, &mut done).map_err(guest)?;
        let more = Instant::now() < deadline;
        for d in &done {
            let (b, finished) = work.done(&g, d)?;
            hist.add(d.latency);
            if finished {
                ops += 1;
                bytes += b;
            }
            if more {
                let r = work.next(d.slot);
                g.post(Q, d.slot, &r).map_err(guest)?;
            } else {
                in_flight -= 1;
            }
        }
        for node in work.forgets.drain(..) {
            g.forget(node, 1, Duration::from_secs(30)).map_err(guest)?;
        }
        g.publish(Q);
    }
    let secs = t0.elapsed().as_secs_f64();
    let daemon = d0
        .zip(pid.and_then(crate::cpu_us))
        .map(|(b, e)| e.saturating_sub(b));
    Ok(Report {
        ops,
        secs,
        bytes,
        p50_us: hist.pct(0.50),
        p90_us: hist.pct(0.90),
        p99_us: hist.pct(0.99),
        daemon_cpu_us: daemon,
        load_cpu_us: crate::own_cpu_us().saturating_sub(l0),
    })
}
