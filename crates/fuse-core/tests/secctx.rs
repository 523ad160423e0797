//! FUSE_SECURITY_CTX: the label extension's decoder on well-formed,
//! malformed and arbitrary input, and the dispatcher handing the label of
//! CREATE, MKNOD, MKDIR, SYMLINK and TMPFILE to the filesystem only when
//! the filesystem asked for it in INIT; a malformed extension gets EINVAL
//! (the filesystem is not called), an extension length past the message
//! EIO, and the dispatcher keeps serving.

use fuse_core::abi::{encode, encode::Body, *};
use fuse_core::server::Dispatcher;
use fuse_core::Errno;
use proptest::prelude::*;
#[path = "common/creating.rs"]
mod creating;
use creating::{header, served_at as serve, Creating};
use std::sync::Mutex;

const NAME: &[u8] = b"security.selinux";
const LABEL: &[u8] = b"system_u:object_r:container_file_t:s0\0";

#[test]
fn a_label_the_kernel_would_send_reads_back() {
    let ext = encode::secctx_ext(NAME, LABEL);
    assert_eq!(ext.len() % 8, 0);
    let got = security_context(&ext).unwrap().unwrap();
    assert_eq!(got.name, NAME);
    assert_eq!(got.value, LABEL);
}

#[test]
fn no_label_and_other_extensions() {
    // nr_secctx 0: the kernel's message when no LSM labels the inode.
    let none = Body::new()
        .push(&SecctxHeader {
            size: 8,
            nr_secctx: 0,
        })
        .into_vec();
    assert_eq!(security_context(&none).unwrap(), None);
    assert_eq!(security_context(&[]).unwrap(), None);
    // Supplementary groups after the label: skipped.
    let groups = Body::new()
        .push(&ExtHeader {
            size: 16,
            typ: EXT_GROUPS,
        })
        .push(&SuppGroups { nr_groups: 1 })
        .bytes(&[0; 4])
        .into_vec();
    let mut both = encode::secctx_ext(NAME, LABEL);
    both.extend_from_slice(&groups);
    assert_eq!(security_context(&both).unwrap().unwrap().value, LABEL);
    assert_eq!(security_context(&groups).unwrap(), None);
}

#[test]
fn malformed_labels_are_errors() {
    let good = encode::secctx_ext(NAME, LABEL);
    let with = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut v = good.clone();
        f(&mut v);
        v
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        // Two labels claimed (the kernel sends one).
        ("nr 2", with(&|v| v[4] = 2)),
        // The label's size runs past the extension.
        ("value too long", with(&|v| v[8] = 0xff)),
        // An empty value.
        (
            "empty value",
            with(&|v| v[8..12].copy_from_slice(&0u32.to_ne_bytes())),
        ),
        // The extension's size below its header.
        (
            "size 4",
            with(&|v| v[0..4].copy_from_slice(&4u32.to_ne_bytes())),
        ),
        // The extension's size past the area.
        (
            "size past",
            with(&|v| v[0..4].copy_from_slice(&4096u32.to_ne_bytes())),
        ),
        // No NUL after the name.
        (
            "no nul",
            Body::new()
                .push(&SecctxHeader {
                    size: 24,
                    nr_secctx: 1,
                })
                .push(&Secctx {
                    size: 1,
                    padding: 0,
                })
                .bytes(b"abcdefgh")
                .into_vec(),
        ),
        // An empty name.
        ("empty name", encode::secctx_ext(b"", LABEL)),
        // More than padding after the value.
        ("trailing", {
            let mut v = encode::secctx_ext(NAME, b"x");
            let extra = v.len() as u32 + 8;
            v.extend_from_slice(&[0; 8]);
            v[0..4].copy_from_slice(&extra.to_ne_bytes());
            v
        }),
        // Two label extensions.
        ("twice", [good.clone(), good.clone()].concat()),
        // A header cut short.
        ("cut", good[..4].to_vec()),
    ];
    for (what, ext) in cases {
        assert!(security_context(&ext).is_err(), "{what}: accepted");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Any bytes: an answer, never a panic.
    #[test]
    fn arbitrary_extensions_never_panic(ext in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = security_context(&ext);
    }

    /// A kernel-made label with some bytes overwritten: an answer, never a
    /// panic, and a label it returns lies inside the extension.
    #[test]
    fn corrupted_labels_never_panic(
        name in proptest::collection::vec(1u8..=255, 1..40),
        value in proptest::collection::vec(any::<u8>(), 1..80),
        hits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
    ) {
        let name: Vec<u8> = name.into_iter().map(|b| if b == 0 { 1 } else { b }).collect();
        let mut ext = encode::secctx_ext(&name, &value);
        for (at, b) in hits {
            let i = at % ext.len();
            ext[i] = b;
        }
        if let Ok(Some(l)) = security_context(&ext) {
            prop_assert!(l.name.len() + l.value.len() < ext.len());
            // Both slices lie inside the buffer...
            let range = ext.as_ptr_range();
            for part in [l.name, l.value] {
                let r = part.as_ptr_range();
                prop_assert!(range.start <= r.start && r.end <= range.end);
            }
            // ...the name right after a fuse_secctx_header that says one
            // label and its fuse_secctx...
            let name_at = l.name.as_ptr() as usize - range.start as usize;
            prop_assert!(name_at >= 16);
            let nr = u32::from_ne_bytes(ext[name_at - 12..name_at - 8].try_into().unwrap());
            prop_assert_eq!(nr, 1);
            // ...whose size is the value's, which follows the name's NUL.
            let size = u32::from_ne_bytes(ext[name_at - 8..name_at - 4].try_into().unwrap());
            prop_assert_eq!(size as usize, l.value.len());
            prop_assert_eq!(ext[name_at + l.name.len()], 0);
            prop_assert_eq!(
                l.value.as_ptr() as usize,
                l.name.as_ptr() as usize + l.name.len() + 1
            );
        }
    }

    /// Every well-formed label reads back as made.
    #[test]
    fn well_formed_labels_round_trip(
        name in proptest::collection::vec(1u8..=255, 1..=255),
        value in proptest::collection::vec(any::<u8>(), 1..300),
    ) {
        let ext = encode::secctx_ext(&name, &value);
        let l = security_context(&ext).unwrap().unwrap();
        prop_assert_eq!(l.name, &name[..]);
        prop_assert_eq!(l.value, &value[..]);
    }
}

/// A label as the filesystem saw it: name and value.
type Seen = Option<(Vec<u8>, Vec<u8>)>;

/// What the filesystem records: the label each creating call saw.
type Labels = Creating<Seen>;

/// A dispatcher over [`Labels`] after an INIT offering `offer`.
fn served(ask: bool, offer: u64) -> Dispatcher<Labels> {
    served_at(ask, offer, KERNEL_MINOR_VERSION)
}

/// [`served`] by a kernel speaking protocol 7.`minor`.
fn served_at(ask: bool, offer: u64, minor: u32) -> Dispatcher<Labels> {
    let fs = Creating {
        flag: if ask { init::SECURITY_CTX } else { 0 },
        read: |ctx| ctx.secctx.map(|l| (l.name.to_vec(), l.value.to_vec())),
        seen: Mutex::new(Vec::new()),
    };
    serve(fs, offer, minor)
}

/// The arguments of `op` (named "n"), then `ext` as a request extension
/// (counted in `total_extlen`), as Linux 6.3 on sends it.
fn message(op: Opcode, unique: u64, ext: &[u8]) -> Vec<u8> {
    message_with(op, unique, ext, (ext.len() / 8) as u16)
}

/// The arguments of `op`, then `ext`, with `total_extlen` `extlen`.
fn message_with(op: Opcode, unique: u64, ext: &[u8], extlen: u16) -> Vec<u8> {
    let args = match op {
        Opcode::Mkdir => Body::new().push(&MkdirIn {
            mode: 0o755,
            umask: 0,
        }),
        Opcode::Mknod => Body::new().push(&MknodIn {
            mode: 0o010_644,
            ..Default::default()
        }),
        Opcode::Symlink => Body::new().cstr(b"n").cstr(b"target"),
        Opcode::Create | Opcode::Tmpfile => Body::new().push(&CreateIn {
            mode: 0o644,
            ..Default::default()
        }),
        _ => unreachable!(),
    };
    let args = match op {
        Opcode::Symlink => args,
        Opcode::Tmpfile => args.cstr(b"/"),
        _ => args.cstr(b"n"),
    };
    let body = args.bytes(ext).into_vec();
    encode::request(header(op, unique, extlen), &body)
}

const CREATING: [Opcode; 5] = [
    Opcode::Create,
    Opcode::Mknod,
    Opcode::Mkdir,
    Opcode::Symlink,
    Opcode::Tmpfile,
];

#[test]
fn the_filesystem_gets_the_label_of_every_creating_request() {
    let d = served(true, init::SECURITY_CTX);
    assert_ne!(d.decode_options().flags & init::SECURITY_CTX, 0);
    let ext = encode::secctx_ext(NAME, LABEL);
    let mut out = vec![0u8; 4096];
    for (i, op) in CREATING.into_iter().enumerate() {
        let o = d
            .handle_bytes(&message(op, 10 + 2 * i as u64, &ext), &mut out)
            .unwrap();
        assert_eq!(o.error, 0, "{op:?}");
    }
    let seen = d.fs().seen.lock().unwrap().clone();
    assert_eq!(seen.len(), CREATING.len());
    for (op, l) in seen {
        assert_eq!(l, Some((NAME.to_vec(), LABEL.to_vec())), "{op:?}");
    }
}

#[test]
fn no_label_unless_the_filesystem_asked_and_the_client_agreed() {
    let ext = encode::secctx_ext(NAME, LABEL);
    let mut out = vec![0u8; 4096];
    // Not asked for (the client offers it): not negotiated, not passed.
    let d = served(false, init::SECURITY_CTX);
    assert_eq!(d.decode_options().flags & init::SECURITY_CTX, 0);
    let o = d
        .handle_bytes(&message(Opcode::Mkdir, 4, &ext), &mut out)
        .unwrap();
    assert_eq!(o.error, 0);
    // Asked for, but not offered.
    let d2 = served(true, 0);
    assert_eq!(d2.decode_options().flags & init::SECURITY_CTX, 0);
    let o = d2
        .handle_bytes(&message(Opcode::Mkdir, 4, &ext), &mut out)
        .unwrap();
    assert_eq!(o.error, 0);
    for d in [&d, &d2] {
        assert_eq!(d.fs().seen.lock().unwrap().clone(), [(Opcode::Mkdir, None)]);
    }
}

#[test]
fn malformed_extensions_get_a_clean_errno_and_serving_goes_on() {
    let d = served(true, init::SECURITY_CTX);
    let mut out = vec![0u8; 4096];
    let mut bad = encode::secctx_ext(NAME, LABEL);
    bad[4] = 2; // two labels
    for (i, op) in CREATING.into_iter().enumerate() {
        let o = d
            .handle_bytes(&message(op, 20 + 2 * i as u64, &bad), &mut out)
            .unwrap();
        assert_eq!(o.error, Errno::EINVAL.to_wire(), "{op:?}");
    }
    // A total_extlen past the message: undecodable, EIO.
    let mut msg = message(Opcode::Mkdir, 40, &[]);
    msg[36..38].copy_from_slice(&200u16.to_ne_bytes());
    let o = d.handle_bytes(&msg, &mut out).unwrap();
    assert_eq!(o.error, Errno::EIO.to_wire());
    // An extension chain whose size breaks the 8-byte rule: EIO.
    let mut odd = encode::secctx_ext(NAME, LABEL);
    odd[0..4].copy_from_slice(&12u32.to_ne_bytes());
    let o = d
        .handle_bytes(&message(Opcode::Mkdir, 42, &odd), &mut out)
        .unwrap();
    assert_eq!(o.error, Errno::EIO.to_wire());
    assert!(d.fs().seen.lock().unwrap().is_empty(), "the fs was called");
    // Still serving.
    let ok = encode::secctx_ext(NAME, LABEL);
    let o = d
        .handle_bytes(&message(Opcode::Mkdir, 44, &ok), &mut out)
        .unwrap();
    assert_eq!(o.error, 0);
    assert_eq!(d.fs().seen.lock().unwrap().len(), 1);
}

/// The labels the filesystem saw, emptied.
fn take_seen(d: &Dispatcher<Labels>) -> Vec<(Opcode, Seen)> {
    std::mem::take(&mut *d.fs().seen.lock().unwrap())
}

#[test]
fn linux_5_17_to_6_2_send_the_label_after_the_last_argument() {
    // Protocol 7.36 and 7.37: the fuse_secctx_header block is one more
    // plain argument after the name (a SYMLINK's after its target), and
    // total_extlen is still zero padding.
    let ext = encode::secctx_ext(NAME, LABEL);
    let empty = Body::new()
        .push(&SecctxHeader {
            size: 8,
            nr_secctx: 0,
        })
        .into_vec();
    let mut out = vec![0u8; 4096];
    for minor in [36, 37] {
        let d = served_at(true, init::SECURITY_CTX, minor);
        assert_ne!(d.decode_options().flags & init::SECURITY_CTX, 0);
        for (i, op) in CREATING.into_iter().enumerate() {
            for (j, block) in [&ext, &empty].into_iter().enumerate() {
                let unique = 10 + 4 * i as u64 + 2 * j as u64;
                let o = d
                    .handle_bytes(&message_with(op, unique, block, 0), &mut out)
                    .unwrap();
                assert_eq!(o.error, 0, "7.{minor} {op:?}");
            }
        }
        let seen = take_seen(&d);
        assert_eq!(seen.len(), 2 * CREATING.len());
        for pair in seen.chunks(2) {
            let op = pair[0].0;
            assert_eq!(pair[0].1, Some((NAME.to_vec(), LABEL.to_vec())), "{op:?}");
            assert_eq!(pair[1].1, None, "{op:?}");
        }
        // A malformed block there: EINVAL, the filesystem not called.
        let mut bad = ext.clone();
        bad[4] = 2;
        for (k, block) in [bad, ext[..5].to_vec(), vec![0; 3]].iter().enumerate() {
            let o = d
                .handle_bytes(
                    &message_with(Opcode::Mkdir, 90 + 2 * k as u64, block, 0),
                    &mut out,
                )
                .unwrap();
            assert_eq!(o.error, Errno::EINVAL.to_wire(), "case {k}");
        }
        assert!(take_seen(&d).is_empty());
    }
}

#[test]
fn stable_6_1_kernels_send_the_extension_at_minor_37() {
    // 6.1.110 on carry 6.3's request extensions at protocol 7.37.
    let d = served_at(true, init::SECURITY_CTX, 37);
    let ext = encode::secctx_ext(NAME, LABEL);
    let mut out = vec![0u8; 4096];
    for (i, op) in CREATING.into_iter().enumerate() {
        let o = d
            .handle_bytes(&message(op, 10 + 2 * i as u64, &ext), &mut out)
            .unwrap();
        assert_eq!(o.error, 0, "{op:?}");
    }
    for (op, l) in take_seen(&d) {
        assert_eq!(l, Some((NAME.to_vec(), LABEL.to_vec())), "{op:?}");
    }
}

#[test]
fn a_creating_request_without_its_label_block_is_refused() {
    // Every kernel that negotiates FUSE_SECURITY_CTX sends the block with
    // every creating request; a request without one is not served
    // unlabelled.
    let ext = encode::secctx_ext(NAME, LABEL);
    let mut out = vec![0u8; 4096];
    for minor in [37, 38, KERNEL_MINOR_VERSION] {
        let d = served_at(true, init::SECURITY_CTX, minor);
        for (i, op) in CREATING.into_iter().enumerate() {
            let o = d
                .handle_bytes(&message(op, 10 + 2 * i as u64, &[]), &mut out)
                .unwrap();
            assert_eq!(o.error, Errno::EINVAL.to_wire(), "7.{minor} {op:?}");
        }
        if minor >= FIRST_EXTENSION_MINOR {
            // From 7.38 a block after the arguments with total_extlen 0
            // is not the label: still refused.
            let o = d
                .handle_bytes(&message_with(Opcode::Mkdir, 40, &ext, 0), &mut out)
                .unwrap();
            assert_eq!(o.error, Errno::EINVAL.to_wire(), "7.{minor}");
        }
        assert!(take_seen(&d).is_empty(), "7.{minor}: the fs was called");
    }
    // Not negotiated: nothing is required.
    let d = served_at(false, init::SECURITY_CTX, 37);
    let o = d
        .handle_bytes(&message(Opcode::Mkdir, 4, &[]), &mut out)
        .unwrap();
    assert_eq!(o.error, 0);
}
