//! Hostile ring commands: random and mutated 80-byte command areas (the
//! SQE128 command bytes a server hands the kernel's ring), sent as
//! ADD_QUEUE, ADD_BUFPOOL, REGISTER and COMMIT in random order against a
//! live connection with requests flowing. Nothing panics, every error is
//! a clean errno, the ring's invariants hold after every step, and the
//! requests sent meanwhile all end. `FUSEBOX_RING_FUZZ_ITERS` sets the
//! number of commands (default 4,000; CI runs 20,000 in release).

use fuse_core::abi::{encode::Body, init, GetattrIn, Opcode};
use fuse_core::dev_uring::{bufpool_area, cmd_area, EntryBufs, RingEnd};
use fuse_core::testing::rng::Rng;
use fuse_core::{Args, Chan, ChanConfig, Errno, Negotiated};

/// A command area: a valid one for a random queue, mutated or not, or
/// random bytes.
fn area(r: &mut Rng, commit_id: u64) -> [u8; 80] {
    let mut a = match r.below(3) {
        0 => cmd_area(r.below(4) as u16, r.below(3), commit_id),
        1 => bufpool_area(r.below(4) as u16, (r.below(4) * 65536) as u32),
        _ => {
            let mut a = [0u8; 80];
            for b in a.iter_mut() {
                *b = r.next_u64() as u8;
            }
            a
        }
    };
    for _ in 0..r.below(4) {
        let i = r.below(80) as usize;
        a[i] = r.next_u64() as u8;
    }
    a
}

#[test]
fn hostile_ring_commands_never_break_the_ring() {
    let iters: u64 = std::env::var("FUSEBOX_RING_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4_000);
    let chan = Chan::new(ChanConfig {
        spawn_scanner: false,
        ring_queues: 2,
        ..Default::default()
    });
    chan.set_initialized(Negotiated {
        max_write: 64 * 1024,
        flags: init::OVER_IO_URING,
        ring_queues: 2,
        ..Negotiated::with_max_background(8)
    });
    let end: RingEnd = chan.ring_end(true);
    let mut r = Rng::new(0x5eed);
    let mut held = Vec::new();
    let mut handles = Vec::new();
    let (mut ok, mut refused) = (0u64, 0u64);
    let getattr = |q: u16| {
        Args::new(Opcode::Getattr, 1)
            .body(Body::new().push(&GetattrIn::default()).into_vec())
            .out(104, false)
            .qid(q)
    };
    let mut senders = Vec::new();
    for i in 0..iters {
        if i % 64 == 0 && senders.len() < 32 {
            let c = chan.clone();
            let q = r.below(2) as u16;
            senders.push(std::thread::spawn(move || c.send(getattr(q))));
        }
        let result: Result<(), Errno> = match r.below(6) {
            0 => end.add_queue(&area(&mut r, 0)),
            1 => {
                let len = r.below(3) as usize * 65536;
                end.add_bufpool(&area(&mut r, 0), vec![0u8; len], None)
            }
            2 | 3 => {
                let bufs = if r.below(2) == 0 {
                    EntryBufs::pooled()
                } else {
                    EntryBufs::with_payload(r.below(3) as usize * 65536)
                };
                end.register(&area(&mut r, 0), bufs, None).map(|h| {
                    handles.push(h);
                })
            }
            4 => match handles.get(r.below(handles.len() as u64 + 1) as usize) {
                Some(&h) => end.fetch(h, false).map(|f| held.extend(f)),
                None => Ok(()),
            },
            _ => {
                if held.is_empty() {
                    Ok(())
                } else {
                    let k = r.below(held.len() as u64) as usize;
                    let mut f: fuse_core::dev_uring::Fetched = held.swap_remove(k);
                    let id = if r.below(2) == 0 {
                        f.commit_id()
                    } else {
                        r.next_u64()
                    };
                    f.set_reply(-(r.below(3) as i32), 0);
                    match end.commit(&area(&mut r, id), f, None) {
                        Ok(_) => Ok(()),
                        Err((e, back)) => {
                            // A refused commit hands the entry back.
                            held.extend(back);
                            Err(e)
                        }
                    }
                }
            }
        };
        match result {
            Ok(()) => ok += 1,
            Err(e) => {
                assert!(e.0 > 0 && e.0 < 4096, "{e:?}");
                refused += 1;
            }
        }
        end.check_invariants().unwrap();
    }
    // Answer what is held properly; the connection still serves.
    for mut f in held.drain(..) {
        f.set_reply(-(Errno::EIO.0), 0);
        let area = f.commit_cmd();
        let _ = end.commit(&area, f, None);
    }
    end.check_invariants().unwrap();
    println!("ring command fuzz: {iters} commands, {ok} accepted, {refused} refused");
    assert!(ok > 0 && refused > 0);
    chan.abort();
    // Every requester got an answer (none is left hanging).
    let n = senders.len();
    let answered = senders
        .into_iter()
        .map(|s| s.join().unwrap())
        .filter(|r| r.is_ok())
        .count();
    println!("ring command fuzz: {n} requests ended, {answered} of them without error");
}
