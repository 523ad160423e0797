//! The reply of a started WRITE, FSYNC or FALLOCATE (`complete_started`).

use fuse_core::abi::{InHeader, Opcode, UringReqHeader, WriteIn, WriteOut};
use fuse_core::server::{complete_started, RingSlot};
use zerocopy::{FromBytes, IntoBytes};

/// A kernel-ring-like entry: a WRITE copied into the payload buffer.
struct Slot {
    h: UringReqHeader,
    payload: Vec<u8>,
    reply: Option<(i32, usize)>,
}

impl RingSlot for Slot {
    fn in_header(&self) -> InHeader {
        InHeader::read_from_prefix(&self.h.in_out).unwrap().0
    }
    fn request_payload_len(&self) -> usize {
        4096
    }
    fn is_zero_copy(&self) -> bool {
        false
    }
    fn parts_mut(&mut self) -> (&mut UringReqHeader, &mut [u8]) {
        (&mut self.h, &mut self.payload)
    }
    fn set_reply(&mut self, error: i32, len: usize) {
        self.reply = Some((error, len));
    }
}

/// The synchronous path answers `n.min(size)` (dispatch/client_mem.rs
/// `write_client` and dispatch/ops.rs `call`); a started WRITE's answer
/// must not claim more than the WRITE carried either.
#[test]
fn a_started_writes_reply_never_exceeds_the_requests_size() {
    let mut h = UringReqHeader::default();
    let ih = InHeader {
        len: 40 + 40 + 4096,
        opcode: Opcode::Write as u32,
        unique: 2,
        ..Default::default()
    };
    h.in_out[..40].copy_from_slice(ih.as_bytes());
    let wi = WriteIn {
        size: 4096,
        ..Default::default()
    };
    h.op_in[..40].copy_from_slice(wi.as_bytes());
    let mut s = Slot {
        h,
        payload: vec![0; 8192],
        reply: None,
    };
    // A start_write that reports more than it was given.
    complete_started(&mut s, Ok(8192));
    assert_eq!(s.reply, Some((0, 8)));
    let out = WriteOut::read_from_prefix(&s.payload).unwrap().0;
    assert!(
        out.size <= 4096,
        "fuse_write_out.size {} for a WRITE of 4096 bytes",
        out.size
    );
}

/// A started FSYNC, FSYNCDIR or FALLOCATE answers nothing but its
/// success, whatever count its filesystem reported; an error as it is.
#[test]
fn a_started_sync_or_fallocate_answers_no_payload() {
    for op in [Opcode::Fsync, Opcode::Fsyncdir, Opcode::Fallocate] {
        let mut h = UringReqHeader::default();
        let ih = InHeader {
            len: 40 + 24,
            opcode: op as u32,
            unique: 4,
            ..Default::default()
        };
        h.in_out[..40].copy_from_slice(ih.as_bytes());
        let mut s = Slot {
            h,
            payload: vec![0xee; 4096],
            reply: None,
        };
        complete_started(&mut s, Ok(77));
        assert_eq!(s.reply, Some((0, 0)), "{op:?}");
        // ENOSPC
        complete_started(&mut s, Err(fuse_core::Errno(28)));
        assert_eq!(s.reply, Some((-28, 0)), "{op:?}");
    }
}

fn write_slot(unique: u64, size: u32) -> Slot {
    let mut h = UringReqHeader::default();
    let ih = InHeader {
        len: 40 + 40 + size,
        opcode: Opcode::Write as u32,
        unique,
        ..Default::default()
    };
    h.in_out[..40].copy_from_slice(ih.as_bytes());
    let wi = WriteIn {
        size,
        ..Default::default()
    };
    h.op_in[..40].copy_from_slice(wi.as_bytes());
    Slot {
        h,
        payload: vec![0; 8192],
        reply: None,
    }
}

/// A serving loop's `StartedIo`: a request whose completion came before it
/// was held (the filesystem answered inside its start) is answered at
/// once; one completed later is answered when the loop takes its
/// completions, with the reply rule applied (a WRITE's `fuse_write_out`);
/// a started op's fence guard stays entered until its token is handed
/// back; a completion of a request it does not hold is dropped.
#[test]
fn in_flight_answers_by_the_reply_rule_when_its_completions_are_taken() {
    use fuse_core::server::{IoDone, StartedIo};
    use fuse_core::Fence;
    let mut f: StartedIo<Slot> = StartedIo::new();
    // Handed back before it is held.
    f.completions().complete(IoDone::new(2), Ok(100));
    let s = f.hold(2, write_slot(2, 4096)).expect("answered at once");
    assert_eq!(s.reply, Some((0, 8)));
    assert_eq!(WriteOut::read_from_prefix(&s.payload).unwrap().0.size, 100);
    assert!(f.is_empty());
    // Held, then handed back with its fence guard.
    let fence = Fence::new();
    let mut done = IoDone::new(4);
    done.hold(fence.enter().unwrap());
    assert!(f.hold(4, write_slot(4, 4096)).is_none());
    assert_eq!(f.len(), 1);
    assert_eq!(fence.inside(), 1);
    f.completions().complete(done, Err(fuse_core::Errno::EIO));
    assert_eq!(fence.inside(), 0);
    let mut answered = Vec::new();
    assert_eq!(f.take_completed(|s| answered.push(s)), 1);
    assert_eq!(answered.len(), 1);
    assert_eq!(
        answered[0].reply,
        Some((fuse_core::Errno::EIO.to_wire(), 0))
    );
    assert!(f.is_empty());
    // A completion of a request it never held.
    f.completions().complete(IoDone::new(6), Ok(1));
    assert_eq!(f.take_completed(|_| panic!("not held")), 0);
}
