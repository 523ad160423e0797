//! Stable fuzz harness for the decoders: millions of mutated real messages
//! and random byte strings through `decode_request` and `decode_reply`.
//! Nothing may panic. `FUSEBOX_FUZZ_ITERS` sets the count (default 1M).

use fuse_core::abi::{self, encode::Body, *};
use fuse_core::testing::rng::Rng;

fn seeds() -> Vec<Vec<u8>> {
    let h = |op: Opcode| InHeader {
        opcode: op as u32,
        unique: 2,
        nodeid: 1,
        ..Default::default()
    };
    let mut v = Vec::new();
    let mut add = |op: Opcode, body: Body| v.push(encode::request(h(op), &body.into_vec()));
    add(Opcode::Lookup, Body::new().cstr(b"name"));
    add(Opcode::Forget, Body::new().push(&ForgetIn { nlookup: 3 }));
    add(Opcode::Getattr, Body::new().push(&GetattrIn::default()));
    add(Opcode::Setattr, Body::new().push(&SetattrIn::default()));
    add(Opcode::Symlink, Body::new().cstr(b"l").cstr(b"/target"));
    add(
        Opcode::Mknod,
        Body::new().push(&MknodIn::default()).cstr(b"n"),
    );
    add(
        Opcode::Mkdir,
        Body::new().push(&MkdirIn::default()).cstr(b"d"),
    );
    add(
        Opcode::Rename,
        Body::new()
            .push(&RenameIn { newdir: 1 })
            .cstr(b"a")
            .cstr(b"b"),
    );
    add(
        Opcode::Rename2,
        Body::new()
            .push(&Rename2In::default())
            .cstr(b"a")
            .cstr(b"b"),
    );
    add(
        Opcode::Link,
        Body::new().push(&LinkIn { oldnodeid: 5 }).cstr(b"l"),
    );
    add(Opcode::Open, Body::new().push(&OpenIn::default()));
    add(
        Opcode::Read,
        Body::new().push(&ReadIn {
            size: 4096,
            ..Default::default()
        }),
    );
    add(
        Opcode::Write,
        Body::new()
            .push(&WriteIn {
                size: 5,
                ..Default::default()
            })
            .bytes(b"hello"),
    );
    add(
        Opcode::Setxattr,
        Body::new()
            .push(&SetxattrIn {
                size: 3,
                ..Default::default()
            })
            .cstr(b"user.a")
            .bytes(b"xyz"),
    );
    add(
        Opcode::Getxattr,
        Body::new().push(&GetxattrIn::default()).cstr(b"user.a"),
    );
    add(
        Opcode::Init,
        Body::new().push(&InitIn {
            major: 7,
            minor: 45,
            ..Default::default()
        }),
    );
    add(
        Opcode::Create,
        Body::new().push(&CreateIn::default()).cstr(b"f"),
    );
    add(
        Opcode::Tmpfile,
        Body::new().push(&CreateIn::default()).cstr(b"t"),
    );
    add(
        Opcode::Interrupt,
        Body::new().push(&InterruptIn { unique: 2 }),
    );
    add(
        Opcode::BatchForget,
        Body::new()
            .push(&BatchForgetIn { count: 2, dummy: 0 })
            .push(&ForgetOne::default())
            .push(&ForgetOne::default()),
    );
    add(
        Opcode::Removemapping,
        Body::new()
            .push(&RemovemappingIn { count: 1 })
            .push(&RemovemappingOne::default()),
    );
    add(
        Opcode::Ioctl,
        Body::new()
            .push(&IoctlIn {
                in_size: 2,
                ..Default::default()
            })
            .bytes(b"io"),
    );
    add(Opcode::Statx, Body::new().push(&StatxIn::default()));
    add(
        Opcode::CopyFileRange64,
        Body::new().push(&CopyFileRangeIn::default()),
    );
    add(
        Opcode::Setupmapping,
        Body::new().push(&SetupmappingIn::default()),
    );
    add(Opcode::Syncfs, Body::new().push(&SyncfsIn::default()));
    add(Opcode::Lseek, Body::new().push(&LseekIn::default()));
    add(
        Opcode::NotifyReply,
        Body::new()
            .push(&NotifyRetrieveIn {
                size: 1,
                ..Default::default()
            })
            .bytes(b"z"),
    );
    let mut with_ext = h(Opcode::Mkdir);
    with_ext.total_extlen = 2;
    v.push(encode::request(
        with_ext,
        &Body::new()
            .push(&MkdirIn::default())
            .cstr(b"d")
            .push(&ExtHeader {
                size: 16,
                typ: EXT_GROUPS,
            })
            .push(&SuppGroups { nr_groups: 1 })
            .bytes(&[0; 4])
            .into_vec(),
    ));
    // A label and three groups.
    let ext = [
        encode::secctx_ext(b"security.selinux", b"label\0"),
        encode::groups_ext(&[5, 6, 7]),
    ]
    .concat();
    let mut with_both = h(Opcode::Create);
    with_both.total_extlen = (ext.len() / 8) as u16;
    v.push(encode::request(
        with_both,
        &Body::new()
            .push(&CreateIn::default())
            .cstr(b"f")
            .bytes(&ext)
            .into_vec(),
    ));
    // Replies.
    v.push(encode::reply(
        2,
        0,
        zerocopy::IntoBytes::as_bytes(&EntryOut::default()),
    ));
    let mut dir = Vec::new();
    encode::push_dirent(&mut dir, 4096, 1, 1, 4, b"a");
    encode::push_dirent(&mut dir, 4096, 2, 2, 8, b"bcdefghij");
    v.push(encode::reply(2, 0, &dir));
    let mut plus = Vec::new();
    encode::push_direntplus(&mut plus, 4096, &EntryOut::default(), 1, 4, b"x");
    v.push(encode::reply(2, 0, &plus));
    v
}

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut m = seed.to_vec();
    for _ in 0..=rng.below_usize(4) {
        match rng.below_usize(6) {
            0 if !m.is_empty() => {
                let i = rng.below_usize(m.len());
                m[i] = rng.next_u64() as u8;
            }
            1 if !m.is_empty() => {
                let i = rng.below_usize(m.len());
                m.truncate(i);
            }
            2 => m.extend((0..rng.below_usize(64)).map(|_| rng.next_u64() as u8)),
            3 if m.len() >= 4 => {
                // Keep the header's len consistent half of the time so the
                // body decoders are reached.
                let l = m.len() as u32;
                m[..4].copy_from_slice(&l.to_le_bytes());
            }
            4 if m.len() >= 8 => {
                let i = rng.below_usize(m.len() - 3);
                let v = [0u32, 1, u32::MAX, 0x8000_0000, rng.next_u64() as u32][rng.below_usize(5)];
                m[i..i + 4].copy_from_slice(&v.to_le_bytes());
            }
            _ => {
                let l = m.len() as u32;
                if m.len() >= 4 {
                    m[..4].copy_from_slice(&l.to_le_bytes());
                }
            }
        }
    }
    m
}

#[test]
fn decoders_never_panic() {
    let iters: usize = std::env::var("FUSEBOX_FUZZ_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let seeds = seeds();
    for s in &seeds {
        // Every seed is itself valid.
        if s.len() >= 40 && u32::from_le_bytes([s[4], s[5], s[6], s[7]]) != 0 {
            let _ = abi::decode_request(s, DecodeOptions::default());
        }
    }
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    let mut ok = 0usize;
    for i in 0..iters {
        let input = if i % 8 == 0 {
            (0..rng.below_usize(300))
                .map(|_| rng.next_u64() as u8)
                .collect()
        } else {
            let s = &seeds[rng.below_usize(seeds.len())];
            mutate(&mut rng, s)
        };
        if let Ok(req) = abi::decode_request(&input, DecodeOptions::default()) {
            ok += 1;
            // The extension decoders on whatever extensions got through.
            let _ = abi::security_context(req.ext);
            let _ = abi::supplementary_groups(req.ext);
        }
        let op = Opcode::ALL[rng.below_usize(Opcode::ALL.len())];
        let _ = abi::decode_reply(op, &input, rng.below_usize(2) as u32);
        let _ = abi::decode_dirents(&input);
        let _ = abi::decode_direntplus(&input);
        let _ = UringCmdReq::from_cmd_area(&input);
    }
    // The mutator must reach the body decoders, not only reject headers.
    assert!(
        ok > iters / 50,
        "only {ok} of {iters} inputs decoded: the harness is too shallow"
    );
}

#[test]
fn seeds_decode() {
    for s in seeds().iter().filter(|s| {
        // requests have a non-zero opcode at bytes 4..8; replies have error there
        u32::from_le_bytes([s[4], s[5], s[6], s[7]]) != 0
    }) {
        let r = abi::decode_request(s, DecodeOptions::default());
        assert!(r.is_ok(), "{r:?}");
    }
    let d = seeds();
    let dir = &d[d.len() - 2];
    match abi::decode_reply(Opcode::Readdir, dir, 0).unwrap().body {
        abi::ReplyBody::Dir(e) => {
            assert_eq!(e.len(), 2);
            assert_eq!(e[1].name, b"bcdefghij");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn names_with_slash_or_without_nul_are_rejected() {
    let h = InHeader {
        opcode: Opcode::Lookup as u32,
        unique: 2,
        ..Default::default()
    };
    for bad in [&b"a/b\0"[..], b"noterminator", b"\0", b"../x\0"] {
        let m = encode::request(h, bad);
        assert!(
            abi::decode_request(&m, DecodeOptions::default()).is_err(),
            "{bad:?}"
        );
    }
    let m = encode::request(h, b"..\0");
    assert!(
        abi::decode_request(&m, DecodeOptions::default()).is_ok(),
        "'..' is a valid name"
    );
    // Counts that exceed the message.
    let h = InHeader {
        opcode: Opcode::BatchForget as u32,
        unique: 2,
        ..Default::default()
    };
    let m = encode::request(
        h,
        zerocopy::IntoBytes::as_bytes(&BatchForgetIn {
            count: u32::MAX,
            dummy: 0,
        }),
    );
    assert!(matches!(
        abi::decode_request(&m, DecodeOptions::default()),
        Err(DecodeError::BadCount { .. })
    ));
}
