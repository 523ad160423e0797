//! FUSE_CREATE_SUPP_GROUP: the supplementary-groups extension's decoder
//! on well-formed, malformed and arbitrary input, and the dispatcher
//! handing the groups of CREATE, MKNOD, MKDIR, SYMLINK and TMPFILE to the
//! filesystem only when the filesystem asked for it in INIT; a malformed
//! extension gets EINVAL (the filesystem is not called) and the dispatcher
//! keeps serving.

use fuse_core::abi::{encode, encode::Body, *};
use fuse_core::server::Dispatcher;
use fuse_core::Errno;
use proptest::prelude::*;
#[path = "common/creating.rs"]
mod creating;
use creating::{header, served_at as serve, Creating};
use std::sync::Mutex;

fn gids(ext: &[u8]) -> Result<Option<Vec<u32>>, DecodeError> {
    Ok(supplementary_groups(ext)?.map(|g| g.iter().collect()))
}

#[test]
fn groups_the_kernel_would_send_read_back() {
    // Linux sends one group: 16 bytes.
    let one = encode::groups_ext(&[65531]);
    assert_eq!(one.len(), 16);
    assert_eq!(gids(&one).unwrap(), Some(vec![65531]));
    // More, padded to 8 bytes (virtiofsd takes them too).
    let three = encode::groups_ext(&[1, 2, 3]);
    assert_eq!(three.len(), 24);
    assert_eq!(gids(&three).unwrap(), Some(vec![1, 2, 3]));
    assert_eq!(gids(&encode::groups_ext(&[])).unwrap(), Some(vec![]));
    assert_eq!(gids(&[]).unwrap(), None);
}

#[test]
fn a_label_around_the_groups_is_skipped() {
    let label = encode::secctx_ext(b"security.selinux", b"l\0");
    let mut ext = label.clone();
    ext.extend_from_slice(&encode::groups_ext(&[7]));
    assert_eq!(gids(&ext).unwrap(), Some(vec![7]));
    assert_eq!(security_context(&ext).unwrap().unwrap().value, b"l\0");
    assert_eq!(gids(&label).unwrap(), None);
}

#[test]
fn malformed_groups_are_errors() {
    let good = encode::groups_ext(&[5]);
    let with = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut v = good.clone();
        f(&mut v);
        v
    };
    let set =
        |at: usize, n: u32| move |v: &mut Vec<u8>| v[at..at + 4].copy_from_slice(&n.to_ne_bytes());
    let cases: Vec<(&str, Vec<u8>)> = vec![
        // More groups claimed than sent.
        ("nr 2", with(&set(8, 2))),
        ("nr huge", with(&set(8, u32::MAX))),
        ("nr past the bound", with(&set(8, MAX_SUPP_GROUPS + 1))),
        // Fewer: bytes beyond the padding.
        ("fewer claimed than sent", {
            let mut v = encode::groups_ext(&[1, 2]);
            v[8..12].copy_from_slice(&1u32.to_ne_bytes());
            v
        }),
        // The body too short for its header.
        ("size 8", {
            let mut v = with(&set(0, 8));
            v.truncate(8);
            v
        }),
        // The extension's size below its header, or past the area.
        ("size 4", with(&set(0, 4))),
        ("size past", with(&set(0, 4096))),
        // Two groups extensions.
        ("twice", [good.clone(), good.clone()].concat()),
    ];
    for (what, ext) in cases {
        assert!(gids(&ext).is_err(), "{what}: accepted");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Any bytes: an answer, never a panic.
    #[test]
    fn arbitrary_extensions_never_panic(ext in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = gids(&ext);
    }

    /// A kernel-made extension with some bytes overwritten: an answer,
    /// never a panic, and the groups it returns are the extension's own
    /// bytes, as many as its header says.
    #[test]
    fn corrupted_groups_never_panic(
        groups in proptest::collection::vec(any::<u32>(), 0..20),
        hits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
    ) {
        let mut ext = encode::groups_ext(&groups);
        for (at, b) in hits {
            let i = at % ext.len();
            ext[i] = b;
        }
        let first = u32::from_ne_bytes(ext[4..8].try_into().unwrap()) == EXT_GROUPS;
        if let (Ok(Some(g)), true) = (supplementary_groups(&ext), first) {
            // The first extension is the one found.
            let nr = u32::from_ne_bytes(ext[8..12].try_into().unwrap()) as usize;
            prop_assert_eq!(g.len(), nr);
            prop_assert!(12 + 4 * nr <= ext.len());
            let want: Vec<u32> = ext[12..12 + 4 * nr]
                .chunks_exact(4)
                .map(|c| u32::from_ne_bytes(c.try_into().unwrap()))
                .collect();
            prop_assert_eq!(g.iter().collect::<Vec<_>>(), want);
        }
    }

    /// Every well-formed extension reads back as made.
    #[test]
    fn well_formed_groups_round_trip(groups in proptest::collection::vec(any::<u32>(), 0..=MAX_SUPP_GROUPS as usize)) {
        let ext = encode::groups_ext(&groups);
        prop_assert_eq!(gids(&ext).unwrap(), Some(groups));
    }
}

/// What the filesystem records: the groups each creating call saw.
type Groups = Creating<Vec<u32>>;

/// A dispatcher over [`Groups`] after an INIT offering `offer`.
fn served(ask: bool, offer: u64) -> Dispatcher<Groups> {
    let fs = Creating {
        flag: if ask { init::CREATE_SUPP_GROUP } else { 0 },
        read: |ctx| ctx.groups.iter().collect(),
        seen: Mutex::new(Vec::new()),
    };
    serve(fs, offer, KERNEL_MINOR_VERSION)
}

/// The arguments of `op` (named "n"), then `ext` as a request extension.
fn message(op: Opcode, unique: u64, ext: &[u8]) -> Vec<u8> {
    let args = match op {
        Opcode::Mkdir => Body::new().push(&MkdirIn::default()).cstr(b"n"),
        Opcode::Mknod => Body::new().push(&MknodIn::default()).cstr(b"n"),
        Opcode::Symlink => Body::new().cstr(b"n").cstr(b"target"),
        Opcode::Create => Body::new().push(&CreateIn::default()).cstr(b"n"),
        Opcode::Tmpfile => Body::new().push(&CreateIn::default()).cstr(b"/"),
        _ => unreachable!(),
    };
    let body = args.bytes(ext).into_vec();
    encode::request(header(op, unique, (ext.len() / 8) as u16), &body)
}

const CREATING: [Opcode; 5] = [
    Opcode::Create,
    Opcode::Mknod,
    Opcode::Mkdir,
    Opcode::Symlink,
    Opcode::Tmpfile,
];

#[test]
fn the_filesystem_gets_the_groups_of_every_creating_request() {
    let d = served(true, init::CREATE_SUPP_GROUP);
    let ext = encode::groups_ext(&[65531]);
    let mut out = vec![0u8; 4096];
    for (i, op) in CREATING.into_iter().enumerate() {
        let o = d
            .handle_bytes(&message(op, 10 + 2 * i as u64, &ext), &mut out)
            .unwrap();
        assert_eq!(o.error, 0, "{op:?}");
    }
    let seen = d.fs().seen.lock().unwrap().clone();
    let want: Vec<_> = CREATING.iter().map(|&op| (op, vec![65531])).collect();
    assert_eq!(seen, want);
}

#[test]
fn no_groups_unless_the_filesystem_asked_and_the_client_agreed() {
    let ext = encode::groups_ext(&[65531]);
    let mut out = vec![0u8; 4096];
    for (ask, offer) in [(false, init::CREATE_SUPP_GROUP), (true, 0)] {
        let d = served(ask, offer);
        assert_eq!(d.decode_options().flags & init::CREATE_SUPP_GROUP, 0);
        let o = d
            .handle_bytes(&message(Opcode::Mkdir, 4, &ext), &mut out)
            .unwrap();
        assert_eq!(o.error, 0);
        assert_eq!(
            d.fs().seen.lock().unwrap().clone(),
            [(Opcode::Mkdir, vec![])],
            "ask {ask}"
        );
    }
}

#[test]
fn malformed_groups_get_einval_and_serving_goes_on() {
    let d = served(true, init::CREATE_SUPP_GROUP);
    let mut out = vec![0u8; 4096];
    let mut bad = encode::groups_ext(&[5]);
    bad[8] = 2; // two groups claimed, one sent
    for (i, op) in CREATING.into_iter().enumerate() {
        let o = d
            .handle_bytes(&message(op, 20 + 2 * i as u64, &bad), &mut out)
            .unwrap();
        assert_eq!(o.error, Errno::EINVAL.to_wire(), "{op:?}");
    }
    assert!(d.fs().seen.lock().unwrap().is_empty(), "the fs was called");
    let o = d
        .handle_bytes(
            &message(Opcode::Mkdir, 40, &encode::groups_ext(&[5])),
            &mut out,
        )
        .unwrap();
    assert_eq!(o.error, 0);
    assert_eq!(d.fs().seen.lock().unwrap().len(), 1);
}
