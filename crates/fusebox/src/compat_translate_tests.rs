//! Unit tests of `--translate-uid` / `--translate-gid` on the command
//! line (the mappings' own syntax and checks are tested in the passthrough's
//! `passthrough/idmap/tests.rs`).

use super::tests::{err, ok, ROOT};
use super::*;

/// The [`CompatError::Translate`] a command line ends in.
fn translate_err(args: &[&str]) -> (&'static str, IdMapError) {
    let argv = std::iter::once("fusebox").chain(args.iter().copied());
    match parse(argv, ROOT) {
        Err(ArgsError::Compat(CompatError::Translate { opt, source })) => (opt, source),
        Err(e) => panic!("{args:?}: {e}"),
        Ok(c) => panic!("{args:?} parsed: {:?}", c.vhost),
    }
}

#[test]
fn translate_options_take_virtiofsds_mappings() {
    use passthrough::{Forbidden, IdMapping};
    let a = ok(&[
        "--socket-path=/s",
        "--shared-dir=/a",
        "--translate-uid=map:0:1000:10",
        "--translate-uid",
        "SQUASH-GUEST:10:65534:5",
        "--translate-uid=host/5000/70/1",
        "--translate-gid=forbid-guest:5:1",
    ]);
    // Repeated, they add up (no option overrides itself here).
    assert_eq!(
        a.translate_uid,
        [
            IdMapping::Map {
                guest: 0,
                host: 1000,
                count: 10
            },
            IdMapping::SquashGuest {
                guest: 10,
                host: 65534,
                count: 5
            },
            IdMapping::Host {
                host: 5000,
                guest: 70,
                count: 1
            },
        ]
    );
    assert_eq!(a.uids.to_host(3), Ok(1003));
    assert_eq!(a.uids.to_guest(1003), 3);
    assert_eq!(a.uids.to_host(12), Ok(65534));
    // One way only.
    assert_eq!(a.uids.to_guest(5000), 70);
    assert_eq!(a.uids.to_host(70), Ok(70));
    assert_eq!(a.gids.to_host(5), Err(Forbidden(5)));
    assert_eq!(a.gids.to_host(6), Ok(6));
    // None given: nothing translated.
    let a = ok(&["--socket-path=/s", "--shared-dir=/a"]);
    assert!(a.uids.is_identity() && a.gids.is_identity());
    // With --posix-acl too (virtiofsd refuses that; fusebox translates
    // the ACLs' IDs).
    let a = ok(&[
        "--socket-path=/s",
        "--shared-dir=/a",
        "--posix-acl",
        "--translate-uid=map:0:1000:10",
    ]);
    assert_eq!(a.posix_acl, AclMode::Always);
    assert!(!a.uids.is_identity());
}

#[test]
fn malformed_or_clashing_translations_stop_the_start_naming_the_option() {
    let base = ["--socket-path=/s", "--shared-dir=/a"];
    // One malformed mapping: clap's error, with the option and the value.
    for (arg, why) in [
        ("--translate-uid=bogus:1:2:3", "unknown type \"bogus\""),
        (
            "--translate-gid=guest:1:2",
            "guest takes 3 numbers after the type, 2 given",
        ),
        (
            "--translate-uid=map:0:1000:-1",
            "\"-1\" is not an ID or count",
        ),
        ("--translate-uid=guest", "expected <type>:"),
    ] {
        let e = err(&[&base[..], &[arg]].concat());
        let (opt, value) = arg.split_once('=').unwrap_or_default();
        assert!(
            e.contains(&format!("invalid value '{value}' for '{opt} <MAP>'")),
            "{arg}: {e}"
        );
        assert!(e.contains(why), "{arg}: {e}");
    }
    // Mappings that cannot go together, or one past the highest ID.
    let (opt, e) = translate_err(
        &[
            &base[..],
            &[
                "--translate-gid=map:0:1000:10",
                "--translate-gid=guest:5:1:1",
            ],
        ]
        .concat(),
    );
    assert_eq!(opt, "--translate-gid");
    assert_eq!(
        e.to_string(),
        "guest:5:1:1 overlaps map:0:1000:10 (guest to host)"
    );
    let (opt, e) = translate_err(&[&base[..], &["--translate-uid=guest:4294967295:0:1"]].concat());
    assert_eq!(opt, "--translate-uid");
    assert!(
        matches!(e, IdMapError::TooHigh { side: "guest", .. }),
        "{e}"
    );
    // Both directions of map count: its host side against a host mapping.
    let (_, e) = translate_err(
        &[
            &base[..],
            &[
                "--translate-uid=host:1005:0:1",
                "--translate-uid=map:0:1000:10",
            ],
        ]
        .concat(),
    );
    assert!(
        matches!(
            e,
            IdMapError::Overlap {
                direction: "host to guest",
                ..
            }
        ),
        "{e}"
    );
    // The other option is checked too, and is named.
    let (opt, _) = translate_err(
        &[
            &base[..],
            &[
                "--translate-uid=map:0:1000:10",
                "--translate-gid=forbid-guest:4294967295:1",
            ],
        ]
        .concat(),
    );
    assert_eq!(opt, "--translate-gid");
    // --print-capabilities: a malformed mapping stops it (clap parses
    // it, as virtiofsd's does), mappings that clash do not (virtiofsd
    // checks them when it starts serving).
    let caps = |args: &[&str]| {
        let argv = std::iter::once("fusebox").chain(args.iter().copied());
        parse(argv, ROOT).map(|c| c.vhost.print_capabilities)
    };
    assert!(caps(&["--print-capabilities", "--translate-uid=nope"]).is_err());
    assert!(matches!(
        caps(&[
            "--print-capabilities",
            "--translate-uid=guest:0:1:5",
            "--translate-uid=guest:1:1:5"
        ]),
        Ok(true)
    ));
}
