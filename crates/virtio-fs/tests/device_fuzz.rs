//! Hostile guest, stable fuzzing: descriptor tables, avail rings and FUSE
//! bytes, mutated from valid requests or random, fed through the real
//! device (its vring path, chain checks, the engine and an in-memory
//! filesystem) in mock guest memory. Nothing may panic; every popped chain
//! must come back in the used ring or stay in the avail ring; valid seeds
//! must reach the filesystem.
//!
//! `FUSEBOX_DEVICE_FUZZ_ITERS` sets the number of rounds (CI: 200000).

mod common;

use common::*;
use fuse_core::abi::{CreateIn, ForgetIn, GetattrIn, MkdirIn, Opcode, OutHeader, ReadIn, WriteIn};
use fuse_core::testing::memfs::MemFs;
use fuse_core::testing::rng::Rng;
use std::time::{Duration, Instant};
use vhost_user_backend::VringT;
use virtio_fs::DeviceConfig;
use vm_memory::{Bytes, GuestAddress};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

/// A field of /proc/self/status (Threads:, VmRSS: in KiB).
fn status(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// Valid requests of every argument shape the device splits differently.
fn seeds(unique: u64) -> Vec<(Vec<u8>, bool)> {
    let mkdir = MkdirIn {
        mode: 0o755,
        umask: 0,
    };
    let create = CreateIn {
        flags: 2,
        mode: 0o644,
        umask: 0,
        open_flags: 0,
    };
    let write = WriteIn {
        fh: 1,
        offset: 0,
        size: 300,
        ..WriteIn::new_zeroed()
    };
    let read = ReadIn {
        fh: 1,
        offset: 0,
        size: 4096,
        ..ReadIn::new_zeroed()
    };
    vec![
        (request(Opcode::Lookup, unique, b"f\0"), false),
        (
            request(Opcode::Getattr, unique, GetattrIn::new_zeroed().as_bytes()),
            false,
        ),
        (
            request(Opcode::Mkdir, unique, &cat(&[mkdir.as_bytes(), b"d\0"])),
            false,
        ),
        (
            request(Opcode::Create, unique, &cat(&[create.as_bytes(), b"f\0"])),
            false,
        ),
        (
            request(
                Opcode::Write,
                unique,
                &cat(&[write.as_bytes(), &[7u8; 300]]),
            ),
            false,
        ),
        (request(Opcode::Read, unique, read.as_bytes()), false),
        (
            request(Opcode::Forget, 0, ForgetIn { nlookup: 1 }.as_bytes()),
            true,
        ),
    ]
}

/// One round: a few chains, valid or mutated, on the hiprio or the
/// request queue, with the used ring at `used`. Returns (chains
/// published, replies with error 0).
fn round(h: &Harness<MemFs>, rng: &mut Rng, unique: &mut u64, used: u64) -> (usize, usize) {
    h.reset();
    let hiprio = rng.below(8) == 0;
    let n = 1 + rng.below(6) as u16;
    let mut heads = Vec::new();
    let mut sent = Vec::new();
    let mut reply_at = Vec::new();
    let mut next_desc = 0u16;
    let mut data = DATA;
    for _ in 0..n {
        *unique += 1;
        let seeds = seeds(*unique);
        let (mut msg, forget) = seeds[rng.below(seeds.len() as u64) as usize].clone();
        let mutate = rng.below(3) != 0;
        if mutate {
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(msg.len() as u64) as usize;
                msg[i] = rng.next_u64() as u8;
            }
            if rng.below(4) == 0 {
                msg.truncate(rng.below(msg.len() as u64 + 1) as usize);
            }
        }
        h.mem.write_slice(&msg, GuestAddress(data)).unwrap();
        sent.push(msg[..msg.len().min(48)].to_vec());
        let head = next_desc;
        // The request split over 1-3 readable descriptors.
        let parts = 1 + rng.below(3) as usize;
        let has_reply = !(forget && hiprio);
        let mut off = 0usize;
        for p in 0..parts {
            let last = p + 1 == parts;
            let len = if last {
                msg.len() - off
            } else {
                rng.below((msg.len() - off) as u64 + 1) as usize
            };
            let flags = if last && !has_reply { 0 } else { F_NEXT };
            h.desc(
                next_desc,
                data + off as u64,
                len as u32,
                flags,
                next_desc + 1,
            );
            next_desc += 1;
            off += len;
        }
        data += (msg.len() as u64 + 63) & !63;
        if has_reply {
            // The reply buffer.
            let rlen = if rng.below(5) == 0 {
                rng.below(64) as u32
            } else {
                8192
            };
            h.desc(next_desc, data, rlen, F_WRITE, 0);
            reply_at.push(data);
            next_desc += 1;
            data += 8192;
        }
        heads.push(head);
        if mutate && rng.below(3) == 0 {
            // Hostile descriptor table: an entry of this chain rewritten.
            let i = head + rng.below(u64::from(next_desc - head)) as u16;
            let addr = match rng.below(4) {
                0 => MEM - rng.below(64),
                1 => u64::MAX - rng.below(4096),
                2 => rng.next_u64(),
                _ => DATA + rng.below(MEM - DATA),
            };
            let flags =
                [0, F_NEXT, F_WRITE, F_NEXT | F_WRITE, F_INDIRECT, 0xffff][rng.below(6) as usize];
            let next = match rng.below(3) {
                0 => i, // a loop
                1 => head,
                _ => rng.next_u64() as u16,
            };
            h.desc(i, addr, rng.next_u64() as u32 % 200_000, flags, next);
        }
        if next_desc + 8 >= QSIZE {
            break;
        }
    }
    if rng.below(10) == 0 {
        // Hostile avail ring: heads out of range or repeated.
        let k = rng.below(heads.len() as u64) as usize;
        heads[k] = rng.next_u64() as u16;
    }
    if rng.below(50) == 0 {
        // A flood: one head published again and again (a full vring).
        let k = rng.below(heads.len() as u64) as usize;
        let h = heads[k];
        heads.resize(usize::from(QSIZE), h);
    }
    h.publish(&heads);
    let vring = vring_at(h, DESC, AVAIL, used);
    let used_idx = || h.mem.read_obj::<u16>(GuestAddress(used + 2)).unwrap();
    let queue = if hiprio { 0 } else { 1 };
    kick(&h.dev, &vring, queue);
    // Replies come from engine workers: wait for them (or for the queue
    // to stall), bounded.
    let t = Instant::now();
    let published = heads.len();
    // Every chain the device popped comes back in the used ring, except
    // heads outside the queue, which cannot be named there, and a head
    // published again while the device still held it (refused): at least
    // once per distinct head, at most once per publication.
    let popped = |p: u16| -> Vec<u16> {
        heads[..usize::from(p).min(heads.len())]
            .iter()
            .copied()
            .filter(|&h| h < QSIZE)
            .collect()
    };
    let settled = |p: u16| {
        let all = popped(p);
        let used = used_idx() as usize;
        if used == all.len() {
            return true;
        }
        let mut distinct = all.clone();
        distinct.sort_unstable();
        distinct.dedup();
        queue == 1 && h.dev.heads_in_flight(1) == 0 && used >= distinct.len() && used <= all.len()
    };
    while !settled(vring.queue_next_avail()) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "popped chains not returned: used {} of {}\n{}\n{:?}",
            used_idx(),
            popped(vring.queue_next_avail()).len(),
            h.dev.report(),
            sent
        );
        std::thread::yield_now();
    }
    let mut ok = 0;
    for at in reply_at {
        let Ok(o) = h.mem.read_obj::<[u8; 16]>(GuestAddress(at)) else {
            continue;
        };
        let o = OutHeader::read_from_bytes(&o).unwrap();
        if o.error == 0 && o.unique != 0 {
            ok += 1;
        }
    }
    (published, ok)
}

#[test]
fn hostile_chains_never_crash_the_device() {
    let iters: u64 = std::env::var("FUSEBOX_DEVICE_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let h = Harness::new(
        MemFs::new(),
        DeviceConfig {
            request_queues: 1,
            queue_size: QSIZE,
            // Small, so that admission fills and queues stall.
            max_background: 4,
            congestion_threshold: 3,
            workers_per_queue: 2,
            max_write: 64 * 1024,
            // The first request of each batch in line, the rest on workers.
            inline_per_batch: 1,
            ..DeviceConfig::default()
        },
    );
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    let mut unique = 0;
    let (mut published, mut ok) = (0, 0);
    // After a warm-up, what the daemon (this process) holds may not grow
    // with the rounds: floods of republished heads included.
    let (mut threads0, mut rss0) = (0, 0);
    let (mut threads_max, mut rss_max) = (0, 0);
    for i in 0..iters {
        // The device releases a chain's head before it publishes the
        // chain, so a round whose heads are all released may move on
        // with a republished head's answer still to come: it lands in
        // its own round's used ring, one of four in turn, not in the
        // next round's.
        let used = USED + 0x400 * (i % 4);
        let (p, o) = round(&h, &mut rng, &mut unique, used);
        published += p;
        ok += o;
        if i == iters.min(200) / 2 {
            (threads0, rss0) = (status("Threads:"), status("VmRSS:"));
        }
        if i > iters.min(200) / 2 && i % 64 == 0 {
            threads_max = threads_max.max(status("Threads:"));
            rss_max = rss_max.max(status("VmRSS:"));
        }
    }
    let stats = h.dev.stats();
    let malformed: u64 = stats.queues().iter().map(|q| q.malformed()).sum();
    eprintln!(
        "device fuzz: {iters} rounds, {published} chains, {ok} answered without error, \
         {malformed} refused as malformed\n{}",
        h.dev.report()
    );
    eprintln!(
        "device fuzz: threads {threads0} -> at most {threads_max}, RSS {rss0} -> at most {rss_max} KiB"
    );
    // Bounds: no thread per request (the pool is fixed), and memory that
    // does not grow with the rounds (64 MiB of slack for the allocator).
    assert!(
        threads_max <= threads0 + 2,
        "threads {threads0} -> {threads_max}"
    );
    assert!(rss_max <= rss0 + 64 * 1024, "RSS {rss0} -> {rss_max} KiB");
    // The valid seeds reached the filesystem, and the hostile ones were
    // refused rather than served.
    assert!(ok > iters as usize / 4, "too few requests served: {ok}");
    assert!(malformed > 0, "no chain was refused");
    assert!(h.dev.stats().op_count(Opcode::Mkdir) > 0);
    assert!(h.dev.stats().op_count(Opcode::Write) > 0);
}
