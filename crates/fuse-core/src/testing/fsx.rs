//! An fsx-style data integrity checker over FUSE requests: random writes,
//! reads, truncates, fsyncs, fallocates, hole punches, copy_file_ranges and
//! close/reopens on one file, each checked against an in-memory model of
//! what the file must hold. It drives any server through a [`Client`] (the
//! embedded engine, or a vhost-user-fs backend through the VM-free
//! frontend), so a backend's data path can be soaked with no mount.
//!
//! A run is reproducible from its seed (one caller per file).

use super::rng::Rng;
use crate::abi::{fattr, SetattrIn};
use crate::client::Client;
use crate::Errno;
use thiserror::Error;

/// fallocate modes (linux/falloc.h).
const KEEP_SIZE: u32 = 0x01;
const PUNCH_HOLE: u32 = 0x02;

/// How the file may grow and what one operation may touch.
#[derive(Debug, Clone, Copy)]
pub struct FsxConfig {
    /// Operations to run.
    pub ops: u64,
    /// Seed of the run.
    pub seed: u64,
    /// Largest file size.
    pub max_len: u64,
    /// Largest single read, write or copy.
    pub max_op: u64,
}

impl Default for FsxConfig {
    fn default() -> Self {
        FsxConfig {
            ops: 10_000,
            seed: 1,
            max_len: 1 << 20,
            max_op: 128 * 1024,
        }
    }
}

/// Operations run, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FsxReport {
    /// WRITE.
    pub writes: u64,
    /// READ (each checked against the model).
    pub reads: u64,
    /// SETATTR size.
    pub truncates: u64,
    /// FSYNC (data or full).
    pub fsyncs: u64,
    /// FALLOCATE that allocates.
    pub fallocates: u64,
    /// FALLOCATE punching a hole.
    pub punch_holes: u64,
    /// COPY_FILE_RANGE within the file.
    pub copies: u64,
    /// RELEASE and OPEN again.
    pub reopens: u64,
}

/// Why a run stopped.
#[derive(Debug, Error)]
pub enum FsxError {
    /// A request failed.
    #[error("operation {op} ({what}) failed")]
    Op {
        /// Operation number.
        op: u64,
        /// What it was.
        what: &'static str,
        /// The error.
        #[source]
        errno: Errno,
    },
    /// The file does not hold what it must.
    #[error("operation {op} ({what}): at offset {offset}, {got} bytes read back differ from the model (first difference at +{first})")]
    Mismatch {
        /// Operation number.
        op: u64,
        /// What found it.
        what: &'static str,
        /// Where the read started.
        offset: u64,
        /// Bytes read.
        got: usize,
        /// First differing byte, relative to `offset`.
        first: usize,
    },
    /// The size the server reports is not the model's.
    #[error("operation {op}: size {got}, expected {want}")]
    Size {
        /// Operation number.
        op: u64,
        /// Reported.
        got: u64,
        /// Expected.
        want: u64,
    },
}

/// Runs `cfg.ops` operations on a new file `name` in directory `dir`
/// (O_RDWR, created or truncated), checking every read and size.
pub fn run(c: &Client, dir: u64, name: &[u8], cfg: FsxConfig) -> Result<FsxReport, FsxError> {
    let fail = |op, what| move |errno| FsxError::Op { op, what, errno };
    let (e, o) = c
        .create(
            dir,
            name,
            0o100_644,
            2 | 0o1000, /* O_RDWR | O_TRUNC */
            0,
        )
        .map_err(fail(0, "create"))?;
    let node = e.nodeid;
    let mut fh = o.fh;
    let mut model: Vec<u8> = Vec::new();
    let mut r = Rng::new(cfg.seed);
    let mut rep = FsxReport::default();
    for op in 1..=cfg.ops {
        let len = model.len() as u64;
        match r.below(100) {
            0..=29 => {
                let off = r.below(cfg.max_len);
                let n = (1 + r.below(cfg.max_op)).min(cfg.max_len - off);
                let data: Vec<u8> = (0..n).map(|_| r.next_u64() as u8).collect();
                let wrote = c
                    .write(node, fh, off, &data, 0)
                    .map_err(fail(op, "write"))?;
                if u64::from(wrote) != n {
                    return Err(FsxError::Op {
                        op,
                        what: "short write",
                        errno: Errno::EIO,
                    });
                }
                let end = (off + n) as usize;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[off as usize..end].copy_from_slice(&data);
                rep.writes += 1;
            }
            30..=59 => {
                let off = r.below(len + 1);
                let n = 1 + r.below(cfg.max_op);
                check_read(c, node, fh, off, n, &model, op, "read")?;
                rep.reads += 1;
            }
            60..=67 => {
                let size = r.below(cfg.max_len + 1);
                let arg = SetattrIn {
                    valid: fattr::SIZE | fattr::FH,
                    fh,
                    size,
                    ..Default::default()
                };
                let a = c.setattr(node, &arg).map_err(fail(op, "truncate"))?;
                model.resize(size as usize, 0);
                if a.attr.size != size {
                    return Err(FsxError::Size {
                        op,
                        got: a.attr.size,
                        want: size,
                    });
                }
                rep.truncates += 1;
            }
            68..=71 => {
                c.fsync(node, fh, r.below(2) == 0)
                    .map_err(fail(op, "fsync"))?;
                rep.fsyncs += 1;
            }
            72..=77 => {
                let off = r.below(cfg.max_len);
                let n = (1 + r.below(cfg.max_op)).min(cfg.max_len - off);
                let keep = r.below(2) == 0;
                match c.fallocate(node, fh, if keep { KEEP_SIZE } else { 0 }, off, n) {
                    Err(e) if unsupported(e) => continue,
                    r => r.map_err(fail(op, "fallocate"))?,
                }
                if !keep && model.len() < (off + n) as usize {
                    model.resize((off + n) as usize, 0);
                }
                rep.fallocates += 1;
            }
            78..=83 => {
                let off = r.below(len + 1);
                let n = 1 + r.below(cfg.max_op);
                match c.fallocate(node, fh, PUNCH_HOLE | KEEP_SIZE, off, n) {
                    Err(e) if unsupported(e) => continue,
                    r => r.map_err(fail(op, "punch hole"))?,
                }
                let end = ((off + n) as usize).min(model.len());
                if (off as usize) < end {
                    model[off as usize..end].fill(0);
                }
                rep.punch_holes += 1;
            }
            84..=91 => {
                // Within the file, source and destination apart.
                if len < 2 {
                    continue;
                }
                let n = 1 + r.below(cfg.max_op.min(len / 2));
                let from = r.below(len - n + 1);
                let to = r.below(cfg.max_len - n + 1);
                if from < to + n && to < from + n {
                    continue;
                }
                let got = match c.copy_file_range(node, fh, from, node, fh, to, n) {
                    Err(e) if unsupported(e) => continue,
                    r => r.map_err(fail(op, "copy_file_range"))?,
                };
                let got = got as usize;
                let src = model[from as usize..from as usize + got].to_vec();
                let end = to as usize + got;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[to as usize..end].copy_from_slice(&src);
                rep.copies += 1;
            }
            _ => {
                c.release(node, fh, 0).map_err(fail(op, "release"))?;
                fh = c.open(node, 2).map_err(fail(op, "open"))?.fh;
                rep.reopens += 1;
            }
        }
        if op % 64 == 0 {
            let size = c
                .getattr(node, Some(fh))
                .map_err(fail(op, "getattr"))?
                .attr
                .size;
            if size != model.len() as u64 {
                return Err(FsxError::Size {
                    op,
                    got: size,
                    want: model.len() as u64,
                });
            }
        }
    }
    // The whole file, once more.
    let mut off = 0;
    while off < model.len() as u64 {
        check_read(c, node, fh, off, cfg.max_op, &model, cfg.ops, "final read")?;
        off += cfg.max_op;
    }
    c.release(node, fh, 0).map_err(fail(cfg.ops, "release"))?;
    c.forget(node, 1);
    Ok(rep)
}

/// A server without the operation: skipped, as fsx skips what a
/// filesystem does not support.
fn unsupported(e: Errno) -> bool {
    e == Errno::ENOSYS || e == Errno(95)
}

#[allow(clippy::too_many_arguments)]
fn check_read(
    c: &Client,
    node: u64,
    fh: u64,
    off: u64,
    n: u64,
    model: &[u8],
    op: u64,
    what: &'static str,
) -> Result<(), FsxError> {
    let got = c
        .read(node, fh, off, n as u32)
        .map_err(|errno| FsxError::Op { op, what, errno })?;
    let start = (off as usize).min(model.len());
    let want = &model[start..(start + n as usize).min(model.len())];
    if got.as_slice() != want {
        let first = got
            .iter()
            .zip(want)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(want.len()));
        return Err(FsxError::Mismatch {
            op,
            what,
            offset: off,
            got: got.len(),
            first,
        });
    }
    Ok(())
}
