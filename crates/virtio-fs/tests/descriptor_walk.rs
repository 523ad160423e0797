//! `chain::Descriptors` (the device's own descriptor walk) against
//! virtio-queue 0.18's `DescriptorChain` on hostile descriptor tables:
//! loops, bad `next`, indirect tables (aligned or not, nested, of bad
//! lengths, across the two memory regions, past memory), chains past
//! 4 GiB, queue sizes 1 to 32.

use fuse_core::testing::rng::Rng;
use virtio_fs::chain::Descriptors;
use virtio_fs::GuestMmap;
use virtio_queue::desc::split::Descriptor as SplitDescriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic};

const EDGE: u64 = 0x1_0000;

const INDIRECT_AT: [u64; 8] = [
    0x4000,
    EDGE - 0x20,
    0x8000,
    0x4403,
    EDGE - 0x21,
    EDGE - 8,
    0x8801,
    2 * EDGE - 0x18,
];

fn any_desc(r: &mut Rng, size: u16) -> RawDescriptor {
    let addr = if r.next_u64() % 2 == 0 {
        r.pick(&INDIRECT_AT)
    } else {
        r.pick(&[
            0x3000,
            EDGE - 8,
            2 * EDGE - 16,
            2 * EDGE,
            u64::MAX - 8,
            0x5001,
        ])
    };
    let len = r.pick(&[
        0,
        1,
        16,
        32,
        48,
        64,
        17,
        0x20,
        4096,
        u32::MAX,
        u32::MAX - 15,
        0x10_0000,
    ]);
    let mut flags = 0;
    if r.next_u64() % 4 != 0 {
        flags |= 1;
    }
    if r.next_u64() % 2 == 0 {
        flags |= 2;
    }
    if r.next_u64() % 4 == 0 {
        flags |= 4;
    }
    let next = (r.next_u64() % u64::from(size + 4)) as u16;
    RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next))
}

#[test]
fn the_walk_matches_virtio_queue_on_more_hostile_tables() {
    let mut r = Rng::new(0x1234_5678_9abc_def1);
    let (mut yielded, mut long) = (0, 0);
    for round in 0..6000 {
        let size = r.pick(&[1u16, 2, 4, 8, 16, 32]);
        let m = GuestMmap::from_ranges(&[
            (GuestAddress(0), EDGE as usize),
            (GuestAddress(EDGE), EDGE as usize),
        ])
        .unwrap();
        let mem = GuestMemoryAtomic::new(m).memory();
        let q = MockSplitQueue::new(&*mem, size);
        for i in 0..size {
            q.desc_table().store(i, any_desc(&mut r, size)).unwrap();
        }
        for at in INDIRECT_AT {
            for i in 0..4u64 {
                let d = any_desc(&mut r, size);
                let _ = mem.write_obj(d, GuestAddress(at + 16 * i));
            }
        }
        let head = (r.next_u64() % u64::from(size + 2)) as u16;
        q.avail().ring().ref_at(0).unwrap().store(head);
        q.avail().idx().store(1);
        let mut queue: Queue = q.create_queue().unwrap();
        let theirs: Vec<_> = queue
            .pop_descriptor_chain(&*mem)
            .unwrap()
            .map(|d| (d.addr(), d.len(), d.flags(), d.next()))
            .collect();
        let ours: Vec<_> = Descriptors::new(&mem, GuestAddress(queue.desc_table()), size, head)
            .map(|d| (d.addr(), d.len(), d.flags(), d.next()))
            .collect();
        assert_eq!(ours, theirs, "round {round} size {size} head {head}");
        yielded += ours.len();
        long += usize::from(ours.len() >= 3);
    }
    // Not all refused at once: many chains were walked some way.
    assert!(yielded > 2000 && long > 200, "{yielded} {long}");
}
