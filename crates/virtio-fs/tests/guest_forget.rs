//! The VM-free guest driver forgets nodes as a guest kernel does: a FORGET
//! on the hiprio queue lets the daemon drop the inode (and its fd) of a file
//! the guest created and unlinked. Without it a load generator's
//! create/unlink loop made the daemon hold an fd per unlinked file, and the
//! host filesystem a growing set of orphan inodes (on this machine's
//! journal-less ext4, creates then slowed to a tenth).

mod common;

use fuse_core::abi::{CreateIn, EntryOut, Opcode, ReleaseIn, ROOT_ID};
use passthrough::Config;
use std::time::{Duration, Instant};
use virtio_fs::testing::guest::Req;
use virtio_fs::DeviceConfig;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

fn req(opcode: Opcode, nodeid: u64, args: &[u8], reply: u32) -> Req<'_> {
    Req {
        opcode,
        nodeid,
        args,
        data_out: 0,
        reply,
    }
}

fn with_name(args: &[u8], name: &str) -> Vec<u8> {
    let mut v = args.to_vec();
    v.extend_from_slice(name.as_bytes());
    v.push(0);
    v
}

#[test]
fn forgotten_unlinked_files_give_their_fds_back() {
    let base = std::env::temp_dir().join(format!("fusebox-guest-forget-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let dir = base.join("share");
    std::fs::create_dir_all(&dir).unwrap();
    let sock = base.join("vfs.sock");
    let (dev, served) = common::serve_passthrough(
        &dir,
        &sock,
        Config::default(),
        DeviceConfig {
            inline_per_batch: usize::MAX,
            ..DeviceConfig::default()
        },
    );
    let mut g = common::connect_guest(&sock, 4, 4096);
    let fds0 = dev.engine().fs().fds_in_use();
    // More files than the hiprio queue has slots: its chains must be
    // taken back and reused.
    for i in 0..64 {
        let name = format!("f{i}");
        let c = CreateIn {
            flags: libc::O_WRONLY as u32,
            mode: 0o644,
            ..CreateIn::new_zeroed()
        };
        let args = with_name(c.as_bytes(), &name);
        let (_, out) = g
            .call(1, &req(Opcode::Create, ROOT_ID, &args, 144))
            .unwrap();
        let node = EntryOut::read_from_prefix(&out).unwrap().0.nodeid;
        let fh = u64::from_le_bytes(out[128..136].try_into().unwrap());
        let r = ReleaseIn {
            fh,
            ..ReleaseIn::new_zeroed()
        };
        g.call(1, &req(Opcode::Release, node, r.as_bytes(), 0))
            .unwrap();
        let unlink = with_name(&[], &name);
        g.call(1, &req(Opcode::Unlink, ROOT_ID, &unlink, 0))
            .unwrap();
        g.forget(node, 1, Duration::from_secs(10)).unwrap();
    }
    let t = Instant::now();
    while dev.engine().fs().fds_in_use() > fds0 || dev.engine().fs().inode_count() > 1 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the daemon still holds {} fds ({} at the start), {} inodes",
            dev.engine().fs().fds_in_use(),
            fds0,
            dev.engine().fs().inode_count()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(g);
    served.join().unwrap();
    let _ = std::fs::remove_dir_all(&base);
}
