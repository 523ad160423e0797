//! Floods from a hostile guest while the queue's worker is kept busy (a
//! hung host call): republished heads, FORCE requests with oversized
//! bodies, lock calls, forgets. The daemon (this process) must keep its
//! threads and memory bounded, and its other queues serving.

mod common;

use common::*;
use fuse_core::abi::{BatchForgetIn, FlushIn, GetattrIn, LkIn, Opcode};
use fuse_core::server::faults::{FaultPlan, Faulty};
use fuse_core::testing::memfs::MemFs;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vhost_user_backend::VringRwLock;
use virtio_fs::{DeviceConfig, GuestMem};
use vm_memory::{Bytes, GuestAddress};
use zerocopy::{FromZeros, IntoBytes};

/// Queue 2's vring and data, apart from queue 1's.
const DESC2: u64 = 0x80000;
const AVAIL2: u64 = 0x81000;
const USED2: u64 = 0x82000;
const DATA2: u64 = 0x84000;
/// 64 KiB of guest memory many descriptors point at (a big body).
const BIG: u64 = 0x90000;

/// The tests of this file measure the whole process's threads and RSS:
/// they run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    fuse_core::locks::lock(&SERIAL)
}

fn status(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn threads() -> u64 {
    status("Threads:")
}

fn rss_kib() -> u64 {
    status("VmRSS:")
}

/// Releases every hang when dropped (before the harness).
struct Release(Arc<Harness<Faulty<MemFs>>>);
impl Drop for Release {
    fn drop(&mut self) {
        self.0.dev.engine().fs().release_hangs();
        // The calls it frees end on the engine's threads, after the test
        // returned: wait for them here, under the serial lock, so the next
        // test (which measures the whole process's memory) starts quiet: a
        // lock flood's answers, ended while the next test measured, would
        // count against it.
        let t = Instant::now();
        while (1..=2).any(|q| self.0.dev.heads_in_flight(q) > 0)
            && t.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn device(spec: &str, queues: u16) -> Arc<Harness<Faulty<MemFs>>> {
    Arc::new(Harness::new(
        Faulty::new(MemFs::new(), FaultPlan::parse(spec, 1).unwrap()),
        DeviceConfig {
            request_queues: queues,
            queue_size: QSIZE,
            workers_per_queue: 1,
            inline_per_batch: 0,
            max_write: 1 << 20,
            ..DeviceConfig::default()
        },
    ))
}

/// Queue 2 of `h`: its own vring in the same guest memory.
fn vring2(h: &Harness<Faulty<MemFs>>) -> VringRwLock<GuestMem> {
    vring_at(h, DESC2, AVAIL2, USED2)
}

/// Queue 1's worker, hung in a GETATTR (head 0).
fn hang_the_worker(h: &Harness<Faulty<MemFs>>, vring: &VringRwLock<GuestMem>) -> u16 {
    let msg = request(Opcode::Getattr, 1, GetattrIn::new_zeroed().as_bytes());
    h.chain(0, DATA, &msg, 4096);
    let idx = h.publish_from(0, &[0]);
    h.kick(vring, 1);
    wait_for("the GETATTR to hang", || {
        h.dev
            .engine()
            .fs()
            .counts()
            .hangs
            .load(std::sync::atomic::Ordering::Relaxed)
            == 1
    });
    idx
}

/// Republishes head `head` `laps` times a full vring, kicking each lap.
fn republish(
    h: &Harness<Faulty<MemFs>>,
    vring: &VringRwLock<GuestMem>,
    mut idx: u16,
    head: u16,
    laps: usize,
) {
    for _ in 0..laps {
        idx = h.publish_from(idx, &vec![head; usize::from(QSIZE)]);
        h.kick(vring, 1);
    }
}

/// A LOOKUP on queue 2 is answered (ENOENT: the name does not exist).
fn queue2_serves(h: &Harness<Faulty<MemFs>>, round: u16) {
    let v2 = vring2(h);
    let msg = request(Opcode::Lookup, 1000 + u64::from(round), b"nothing\0");
    let at = DATA2;
    h.mem.write_slice(&msg, GuestAddress(at)).unwrap();
    let desc = |i: u16, addr: u64, len: u32, flags: u16, next: u16| {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&addr.to_le_bytes());
        b[8..12].copy_from_slice(&len.to_le_bytes());
        b[12..14].copy_from_slice(&flags.to_le_bytes());
        b[14..].copy_from_slice(&next.to_le_bytes());
        h.mem
            .write_slice(&b, GuestAddress(DESC2 + 16 * u64::from(i)))
            .unwrap();
    };
    desc(0, at, msg.len() as u32, F_NEXT, 1);
    desc(1, at + 0x1000, 4096, F_WRITE, 0);
    h.mem
        .write_obj(
            0u16,
            GuestAddress(AVAIL2 + 4 + 2 * u64::from(round % QSIZE)),
        )
        .unwrap();
    h.mem
        .write_obj(round + 1, GuestAddress(AVAIL2 + 2))
        .unwrap();
    h.kick(&v2, 2);
    wait_for("queue 2's answer", || {
        h.mem.read_obj::<u16>(GuestAddress(USED2 + 2)).unwrap() == round + 1
    });
    assert_eq!(h.reply(at + 0x1000).error, -libc::ENOENT);
}

/// Head 2: a FLUSH (FORCE: past admission) whose body is `body_len`
/// bytes, over 16 descriptors of the same guest memory when big.
fn flush_chain(h: &Harness<Faulty<MemFs>>, body_len: usize) {
    let flush = FlushIn {
        fh: 1,
        ..FlushIn::new_zeroed()
    };
    let mut msg = request(Opcode::Flush, 2, flush.as_bytes());
    let extra = body_len.saturating_sub(flush.as_bytes().len()) / 16 * 16;
    let total = msg.len() + extra;
    msg[..4].copy_from_slice(&(total as u32).to_le_bytes());
    h.mem.write_slice(&msg, GuestAddress(DATA)).unwrap();
    if extra == 0 {
        h.desc(2, DATA, msg.len() as u32, F_NEXT, 3);
        h.desc(3, DATA + 0x1000, 4096, F_WRITE, 0);
        return;
    }
    h.desc(2, DATA, msg.len() as u32, F_NEXT, 3);
    for i in 0..16 {
        h.desc(3 + i, BIG, (extra / 16) as u32, F_NEXT, 4 + i);
    }
    h.desc(19, DATA + 0x1000, 4096, F_WRITE, 0);
}

#[test]
fn a_head_republished_while_in_flight_is_refused_and_costs_nothing() {
    let _serial = serial();
    let h = device("getattr:hang", 2);
    let _r = Release(h.clone());
    let vring = h.vring();
    let idx = hang_the_worker(&h, &vring);
    let (t0, m0) = (threads(), rss_kib());
    // A FLUSH queued behind the hung worker, its head published again
    // and again while it waits there.
    flush_chain(&h, std::mem::size_of::<FlushIn>());
    republish(&h, &vring, idx, 2, 40);
    let (t1, m1) = (threads(), rss_kib());
    let q = &h.dev.stats().queues()[1];
    let malformed = q.malformed();
    println!("republished head: 2560 chains; threads {t0} -> {t1}; RSS {m0} -> {m1} KiB; refused {malformed}");
    assert_eq!(h.dev.heads_in_flight(1), 2, "the GETATTR and one FLUSH");
    assert_eq!(malformed, 2559);
    assert!(t1 <= t0 + 4, "threads {t0} -> {t1}");
    assert!(m1 <= m0 + 8 * 1024, "RSS {m0} -> {m1} KiB");
    queue2_serves(&h, 0);
}

#[test]
fn a_force_request_with_a_body_its_opcode_cannot_carry_is_refused() {
    let _serial = serial();
    let h = device("getattr:hang", 2);
    let _r = Release(h.clone());
    let vring = h.vring();
    let idx = hang_the_worker(&h, &vring);
    let m0 = rss_kib();
    // Nearly 1 MiB after a FLUSH's 24 bytes (small enough for the ring's
    // payload buffers): refused (EIO) before it is read.
    flush_chain(&h, (1 << 20) - 8192);
    republish(&h, &vring, idx, 2, 40);
    let m1 = rss_kib();
    println!("oversized FLUSH bodies: 2560 chains; RSS {m0} -> {m1} KiB");
    assert_eq!(h.reply(DATA + 0x1000).error, -libc::EIO);
    assert!(m1 <= m0 + 32 * 1024, "RSS {m0} -> {m1} KiB");
    assert_eq!(h.dev.heads_in_flight(1), 1, "only the GETATTR");
    queue2_serves(&h, 0);
}

#[test]
fn a_flood_of_lock_calls_takes_no_thread_each() {
    let _serial = serial();
    // The lock calls hang in the server too (two of them, on the engine's
    // device workers; the rest wait their turn).
    let h = device("getattr:hang,setlkw:hang", 2);
    let _r = Release(h.clone());
    let vring = h.vring();
    let mut idx = hang_the_worker(&h, &vring);
    let (t0, m0) = (threads(), rss_kib());
    let lk = LkIn::new_zeroed();
    // Distinct heads (a full vring of lock calls at once), then the same
    // heads republished without end.
    let mut heads = Vec::new();
    let mut at = DATA + 0x2000;
    let mut d = 2u16;
    while d + 2 <= QSIZE {
        let msg = request(Opcode::Setlkw, 100 + u64::from(d), lk.as_bytes());
        let (head, _, next, next_at) = h.chain(d, at, &msg, 256);
        heads.push(head);
        d = next;
        at = next_at;
    }
    for _ in 0..40 {
        idx = h.publish_from(idx, &heads);
        h.kick(&vring, 1);
    }
    let (t1, m1) = (threads(), rss_kib());
    println!(
        "lock flood: {} chains; threads {t0} -> {t1}; RSS {m0} -> {m1} KiB",
        40 * heads.len()
    );
    assert!(t1 <= t0 + 4, "threads {t0} -> {t1}");
    assert!(m1 <= m0 + 32 * 1024, "RSS {m0} -> {m1} KiB");
    queue2_serves(&h, 0);
}

#[test]
fn a_forget_flood_is_served_on_the_hiprio_thread_while_the_workers_hang() {
    let _serial = serial();
    // The engine's device workers are both stuck in lock calls; the
    // hiprio queue floods BATCH_FORGETs of 65,536 nodes. The hiprio
    // thread serves them itself: nothing queues in the engine, memory
    // stays flat, and every chain comes back while the workers hang.
    let h = device("getlk:hang", 1);
    let _r = Release(h.clone());
    let vring = h.vring();
    let lk = LkIn::new_zeroed();
    let mut at = DATA;
    let mut heads = Vec::new();
    let mut d = 0;
    for u in 0..2 {
        let msg = request(Opcode::Getlk, 10 + u, lk.as_bytes());
        let (head, _, next, next_at) = h.chain(d, at, &msg, 256);
        heads.push(head);
        d = next;
        at = next_at;
    }
    h.publish_from(0, &heads);
    h.kick(&vring, 1);
    wait_for("both lock calls to hang", || {
        h.dev
            .engine()
            .fs()
            .counts()
            .hangs
            .load(std::sync::atomic::Ordering::Relaxed)
            == 2
    });
    let m0 = rss_kib();
    // Hiprio: one BATCH_FORGET chain of 1 MiB (65,536 nodes), the body
    // over 16 descriptors of the same 64 KiB, published 64 times.
    let forgets = 65536u32;
    let b = BatchForgetIn {
        count: forgets,
        dummy: 0,
    };
    let mut msg = request(Opcode::BatchForget, 0, b.as_bytes());
    let total = msg.len() + forgets as usize * 16;
    msg[..4].copy_from_slice(&(total as u32).to_le_bytes());
    let hv = h.vring();
    h.mem
        .write_slice(&msg, GuestAddress(DATA + 0x8000))
        .unwrap();
    h.desc(10, DATA + 0x8000, msg.len() as u32, F_NEXT, 11);
    for i in 0..16 {
        let flags = if i == 15 { 0 } else { F_NEXT };
        h.desc(11 + i, BIG, 65536, flags, 12 + i);
    }
    // The hiprio vring shares queue 1's ring memory in this harness: use
    // it after queue 1's chains were taken.
    let h2 = h.clone();
    let flood = std::thread::spawn(move || {
        let mut idx = 0u16;
        for _ in 0..4 {
            idx = h2.publish_from(idx, &[10; 16]);
            h2.kick(&hv, 0);
        }
    });
    let chan = h.dev.engine().chan().clone();
    flood.join().unwrap();
    let m1 = rss_kib();
    let queued = chan.forgets_queued();
    println!("forget flood: 64 x 65,536 forgets served; {queued} queued; RSS {m0} -> {m1} KiB");
    assert_eq!(queued, 0, "forgets went to the engine's queue");
    assert!(m1 <= m0 + 32 * 1024, "RSS {m0} -> {m1} KiB");
    // The workers are still hung here (`_r` releases them when the test
    // ends).
    let hiprio = &h.dev.stats().queues()[0];
    assert_eq!(
        hiprio.completed(),
        64,
        "every BATCH_FORGET chain was given back"
    );
}

/// The passthrough of a directory holding file `f`, behind the device,
/// and the guest's requests to it on queue 1 as raw chains.
#[test]
fn a_guest_interrupt_ends_a_parked_lock_wait() {
    let _serial = serial();
    use fuse_core::abi::InterruptIn;
    let mut g = Guest::new("intr");
    let (node, fh) = g.open_f();
    let (e, _) = g.call(Opcode::Setlk, 6, node, lk(fh, 1, libc::F_WRLCK).as_bytes());
    assert_eq!(e, 0, "owner 1 takes the lock");
    // Owner 2 waits for it.
    let r = g.send(Opcode::Setlkw, 8, node, lk(fh, 2, libc::F_WRLCK).as_bytes());
    let fs = g.h.dev.engine().fs();
    wait_for("the SETLKW to park", || fs.parked_locks() == 1);
    // The guest interrupts it on the hiprio queue.
    let h = &g.h;
    let hp = vring_at(h, 0x60000, 0x61000, 0x62000);
    let intr = request(Opcode::Interrupt, 9, InterruptIn { unique: 8 }.as_bytes());
    h.mem.write_slice(&intr, GuestAddress(0x64000)).unwrap();
    let mut d = [0u8; 16];
    d[..8].copy_from_slice(&0x64000u64.to_le_bytes());
    d[8..12].copy_from_slice(&(intr.len() as u32).to_le_bytes());
    h.mem.write_slice(&d, GuestAddress(0x60000)).unwrap();
    h.mem.write_obj(0u16, GuestAddress(0x61004)).unwrap();
    h.mem.write_obj(1u16, GuestAddress(0x61002)).unwrap();
    h.kick(&hp, 0);
    wait_for("the SETLKW's answer", || h.used_idx() == g.idx);
    assert_eq!(h.reply(r).error, -libc::EINTR);
    assert_eq!(fs.parked_locks(), 0);
}

#[test]
fn parked_lock_waits_hold_no_ring_entry() {
    let _serial = serial();
    let mut g = Guest::new("parked");
    let (node, fh) = g.open_f();
    let (e, _) = g.call(Opcode::Setlk, 6, node, lk(fh, 1, libc::F_WRLCK).as_bytes());
    assert_eq!(e, 0);
    let ring = g.h.dev.engine().chan().ring_end(false);
    let before = ring.stats().unwrap();
    let t0 = threads();
    // 24 owners wait for read locks.
    let mut replies = Vec::new();
    for o in 0..24 {
        replies.push(g.send(
            Opcode::Setlkw,
            100 + 2 * o,
            node,
            lk(fh, 10 + o, libc::F_RDLCK).as_bytes(),
        ));
    }
    let dev = g.h.dev.clone();
    let fs = dev.engine().fs();
    wait_for("24 parked waits", || fs.parked_locks() == 24);
    let during = ring.stats().unwrap();
    println!(
        "parked: ring {before:?} -> {during:?}; threads {t0} -> {}",
        threads()
    );
    assert_eq!(
        during.in_userspace, before.in_userspace,
        "an entry held per parked wait"
    );
    assert_eq!(
        during.available + during.in_userspace,
        before.available + before.in_userspace,
        "entries registered for parked waits"
    );
    // One waiter thread each (small stacks), no thread per request.
    assert!(threads() <= t0 + 24 + 2, "threads {t0} -> {}", threads());
    // The unlock grants them all.
    let (e, _) = g.call(
        Opcode::Setlk,
        200,
        node,
        lk(fh, 1, libc::F_UNLCK).as_bytes(),
    );
    assert_eq!(e, 0);
    let want = g.idx;
    wait_for("the grants", || g.h.used_idx() == want);
    for r in replies {
        assert_eq!(g.h.reply(r).error, 0);
    }
    assert_eq!(fs.parked_locks(), 0);
}

#[test]
fn requests_answered_at_their_timeout_while_the_server_holds_them_stop_the_queue_at_its_size() {
    let _serial = serial();
    // The worker is stuck for seconds in a host call no interrupt ends; the
    // guest's requests time out (answered EIO, heads back) and the guest
    // publishes the same heads again, round after round.
    let h = Arc::new(Harness::new(
        Faulty::new(
            MemFs::new(),
            FaultPlan::parse("getattr:delay=4s", 1).unwrap(),
        ),
        DeviceConfig {
            queue_size: QSIZE,
            workers_per_queue: 1,
            inline_per_batch: 0,
            request_timeout: Duration::from_millis(100),
            ..DeviceConfig::default()
        },
    ));
    let vring = h.vring();
    let mut idx = hang_the_worker_for(&h, &vring);
    let flush = FlushIn {
        fh: 1,
        ..FlushIn::new_zeroed()
    };
    let mut heads = Vec::new();
    let (mut d, mut at) = (2u16, DATA + 0x2000);
    while d + 2 <= QSIZE {
        let msg = request(Opcode::Flush, 1000 + u64::from(d), flush.as_bytes());
        let (head, _, next, next_at) = h.chain(d, at, &msg, 256);
        heads.push(head);
        d = next;
        at = next_at;
    }
    let chan = h.dev.engine().chan().clone();
    let mut most = 0;
    for _ in 0..12 {
        idx = h.publish_from(idx, &heads);
        h.kick(&vring, 1);
        std::thread::sleep(Duration::from_millis(250));
        most = most.max(chan.stats().waiting);
    }
    println!(
        "timed-out republished FLUSHes: at most {most} held by the engine; {}",
        h.dev.report().lines().nth(1).unwrap_or("")
    );
    assert!(
        most <= 2 * usize::from(QSIZE),
        "{most} requests held by the engine"
    );
}

/// Queue 1's worker, in a GETATTR that takes long (head 0).
fn hang_the_worker_for(h: &Harness<Faulty<MemFs>>, vring: &VringRwLock<GuestMem>) -> u16 {
    let msg = request(Opcode::Getattr, 1, GetattrIn::new_zeroed().as_bytes());
    h.chain(0, DATA, &msg, 4096);
    let idx = h.publish_from(0, &[0]);
    h.kick(vring, 1);
    wait_for("the GETATTR to start", || {
        h.dev
            .engine()
            .fs()
            .counts()
            .delays
            .load(std::sync::atomic::Ordering::Relaxed)
            == 1
    });
    idx
}

#[test]
fn a_device_reset_ends_the_guests_parked_lock_waits() {
    let _serial = serial();
    // A rebooting guest resets the device and never answers its old
    // requests: a parked SETLKW must not keep its waiter for good.
    let mut g = Guest::new("resetlk");
    let (node, fh) = g.open_f();
    let (e, _) = g.call(Opcode::Setlk, 6, node, lk(fh, 1, libc::F_WRLCK).as_bytes());
    assert_eq!(e, 0);
    g.send(Opcode::Setlkw, 8, node, lk(fh, 2, libc::F_WRLCK).as_bytes());
    let dev = g.h.dev.clone();
    let fs = dev.engine().fs();
    wait_for("the SETLKW to park", || fs.parked_locks() == 1);
    vhost_user_backend::VhostUserBackend::reset_device(&dev);
    wait_for("the parked wait to end", || fs.parked_locks() == 0);
}

#[test]
fn a_vring_stop_answers_a_parked_lock_wait_before_it_returns() {
    let _serial = serial();
    // GET_VRING_BASE (before a migration) returns once every request
    // popped from the vring is answered: a SETLKW that waits for a lock
    // would hold it for good, so it is interrupted and answered EINTR,
    // well within the stop's wait (5 s).
    let mut g = Guest::new("stoplk");
    let (node, fh) = g.open_f();
    let (e, _) = g.call(Opcode::Setlk, 6, node, lk(fh, 1, libc::F_WRLCK).as_bytes());
    assert_eq!(e, 0);
    let r = g.send(Opcode::Setlkw, 8, node, lk(fh, 2, libc::F_WRLCK).as_bytes());
    let dev = g.h.dev.clone();
    let fs = dev.engine().fs();
    wait_for("the SETLKW to park", || fs.parked_locks() == 1);
    let t = Instant::now();
    vhost_user_backend::VhostUserBackend::stop_vring(&dev, 1).unwrap();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!(g.h.used_idx(), g.idx, "the SETLKW is in the used ring");
    assert_eq!((g.h.reply(r).unique, g.h.reply(r).error), (8, -libc::EINTR));
    assert_eq!(dev.stats().lost_on_stop(), 0);
    assert_eq!(fs.parked_locks(), 0);
}

#[test]
fn a_vring_stop_ends_every_parked_lock_wait_sent_under_one_guest_unique() {
    let _serial = serial();
    // A hostile guest sends two SETLKWs under one unique while the first
    // still waits. Both park; a vring stop must end both (each is kept by
    // the engine's own unique), or the first would hold its waiter, and
    // the lock once granted, for good.
    let mut g = Guest::new("duplk");
    let (node, fh) = g.open_f();
    let (e, _) = g.call(Opcode::Setlk, 6, node, lk(fh, 1, libc::F_WRLCK).as_bytes());
    assert_eq!(e, 0);
    g.send(Opcode::Setlkw, 8, node, lk(fh, 2, libc::F_WRLCK).as_bytes());
    g.send(Opcode::Setlkw, 8, node, lk(fh, 3, libc::F_WRLCK).as_bytes());
    let dev = g.h.dev.clone();
    let fs = dev.engine().fs();
    wait_for("both SETLKWs to park", || fs.parked_locks() == 2);
    vhost_user_backend::VhostUserBackend::stop_vring(&dev, 1).unwrap();
    wait_for("both parked waits to end", || fs.parked_locks() == 0);
}
