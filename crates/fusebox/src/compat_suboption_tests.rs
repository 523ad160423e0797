//! Unit tests of `compat`'s `-o` suboptions: how they are split and
//! escaped, what each maps to, which one wins when they repeat or meet a
//! separate option, and the errors that name a bad one.

use super::tests::{err, err_as, ok};
use super::*;

#[test]
fn commas_are_escaped_by_doubling() {
    let s = |x: &str| -> Vec<String> {
        split(x.as_bytes())
            .map(|v| v.iter().map(|i| lossy(i)).collect())
            .unwrap_or_else(|e| panic!("{x}: {e}"))
    };
    assert_eq!(s("source=/a,,b"), ["source=/a,b"]);
    assert_eq!(s("source=/a,,,xattr"), ["source=/a,", "xattr"]);
    assert_eq!(s("source=/a,,,,b,xattr"), ["source=/a,,b", "xattr"]);
    assert_eq!(s("xattr"), ["xattr"]);
    for bad in ["", ",", "xattr,", ",xattr", "xattr,,,", "a,,,,,"] {
        assert!(
            matches!(split(bad.as_bytes()), Err(CompatError::Empty(_))),
            "{bad:?}"
        );
    }
}

#[test]
fn every_suboption_maps_to_its_option() {
    let a = ok(&[
        "--socket-path=/s",
        "-o",
        "source=/x,cache=metadata,sandbox=none,no_xattr,posix_acl,writeback",
        "-o",
        "log_level=warn,announce_submounts,killpriv_v2,allow_direct_io,readdirplus",
    ]);
    assert_eq!(a.shared_dir, Some(PathBuf::from("/x")));
    assert_eq!(a.cache, Cache::Metadata);
    assert_eq!(a.sandbox, Sandbox::None);
    assert!(!a.xattr);
    assert_eq!(a.posix_acl, AclMode::Always);
    assert!(a.writeback);
    assert_eq!(a.log_level, LogLevel::Warn);
    assert!(a.announce_submounts);
    assert_eq!(a.notices.len(), 2, "one notice per -o: {:?}", a.notices);
    let a = ok(&[
        "--socket-path=/s",
        "-o",
        "source=/x,cache=always,sandbox=namespace,xattr,no_posix_acl,no_writeback,loglevel=err",
    ]);
    assert_eq!(a.cache, Cache::Always);
    assert_eq!(a.sandbox, Sandbox::Namespace);
    assert!(a.xattr);
    assert_eq!(a.posix_acl, AclMode::Never);
    assert!(!a.writeback);
    assert_eq!(a.log_level, LogLevel::Error);
    for (v, c) in [("auto", Cache::Auto), ("never", Cache::Never)] {
        let a = ok(&["--socket-path=/s", "-o", &format!("source=/x,cache={v}")]);
        assert_eq!(a.cache, c);
    }
    for (v, l) in [("info", LogLevel::Info), ("debug", LogLevel::Debug)] {
        let a = ok(&[
            "--socket-path=/s",
            "-o",
            &format!("source=/x,log_level={v}"),
        ]);
        assert_eq!(a.log_level, l);
    }
}

#[test]
fn later_suboptions_override_earlier_ones() {
    let a = ok(&[
        "--socket-path=/s",
        "-o",
        "source=/x,xattr",
        "-o",
        "no_xattr",
    ]);
    assert!(!a.xattr);
    let a = ok(&["--socket-path=/s", "-osource=/x,cache=never,cache=always"]);
    assert_eq!(a.cache, Cache::Always);
}

#[test]
fn the_same_value_twice_is_no_conflict() {
    let a = ok(&[
        "--socket-path=/s",
        "--shared-dir=/x/",
        "--cache=never",
        "--xattr",
        "--log-level=debug",
        "-d",
        "-o",
        "source=/x,cache=none,xattr,log_level=debug",
    ]);
    assert_eq!(a.cache, Cache::Never);
    assert_eq!(a.log_level, LogLevel::Debug);
}

#[test]
fn a_suboption_disagreeing_with_a_separate_option_is_an_error() {
    for (args, named) in [
        (
            &["--shared-dir=/b", "-o", "source=/a"][..],
            "-o source=/a conflicts with --shared-dir",
        ),
        (
            &["--shared-dir=/a", "--cache=auto", "-o", "cache=never"],
            "-o cache=never conflicts with --cache",
        ),
        (
            &["--shared-dir=/a", "--sandbox=none", "-o", "sandbox=chroot"],
            "-o sandbox=chroot conflicts with --sandbox",
        ),
        (
            &["--shared-dir=/a", "--xattr", "-o", "no_xattr"],
            "-o no_xattr conflicts with --xattr",
        ),
        (
            &["--shared-dir=/a", "--posix-acl=auto", "-o", "posix_acl"],
            "-o posix_acl conflicts with --posix-acl",
        ),
        (
            &["--shared-dir=/a", "--writeback", "-o", "no_writeback"],
            "-o no_writeback conflicts with --writeback",
        ),
        (
            &[
                "--shared-dir=/a",
                "--log-level=info",
                "-o",
                "log_level=warn",
            ],
            "-o log_level=warn conflicts with --log-level",
        ),
        (
            &["--shared-dir=/a", "-d", "-o", "log_level=warn"],
            "-o log_level=warn conflicts with -d",
        ),
        (
            &["--shared-dir=/a", "--log-level=warn", "-d"],
            "-d conflicts with --log-level",
        ),
        (
            &[
                "--shared-dir=/a",
                "--announce-submounts",
                "-o",
                "no_announce_submounts",
            ],
            "-o no_announce_submounts conflicts with --announce-submounts",
        ),
        (
            &[
                "--shared-dir=/a",
                "--no-announce-submounts",
                "-o",
                "announce_submounts",
            ],
            "-o announce_submounts conflicts with --no-announce-submounts",
        ),
    ] {
        let args = [&["--socket-path=/s"][..], args].concat();
        let e = err(&args);
        assert!(e.contains(named), "{args:?}: {e}");
    }
}

#[test]
fn malformed_and_unknown_suboptions_are_errors_naming_them() {
    for (o, named) in [
        ("", "-o \"\": empty suboption"),
        ("source=/a,", "empty suboption"),
        ("source=/a,,,", "empty suboption"),
        ("=x", "-o =x: '=' without a suboption name"),
        ("source=/a,cache=", "-o cache=: the suboption needs a value"),
        ("source=", "-o source=: the suboption needs a value"),
        ("cache", "-o cache: the suboption needs a value"),
        ("source=/a,cache=sometimes", "-o cache=sometimes: expected"),
        ("source=/a,sandbox=jail", "-o sandbox=jail: expected"),
        ("source=/a,log_level=trace", "-o log_level=trace: expected"),
        ("source=/a,xattr=on", "-o xattr=on: xattr takes no value"),
        (
            "source=/a,no_flock=1",
            "-o no_flock=1: no_flock takes no value",
        ),
        // A flag with an empty value: the flag is named, not a value
        // asked for.
        ("source=/a,xattr=", "-o xattr=: xattr takes no value"),
        (
            "source=/a,no_flock=",
            "-o no_flock=: no_flock takes no value",
        ),
        ("source=/a,debug=1", "-o debug=1: debug takes no value"),
        ("source=/a,nonsense", "-o nonsense: unknown suboption"),
        ("source=/a,nonsense=1", "-o nonsense: unknown suboption"),
    ] {
        let e = err(&["--socket-path=/s", "-o", o]);
        assert!(e.contains(named), "-o {o:?}: {e}");
    }
}

#[test]
fn a_later_suboption_overrides_an_earlier_one_for_every_pair() {
    let base = ["--socket-path=/s", "--shared-dir=/a", "-o"];
    fn with<'a>(base: &[&'a str], o: &'a str) -> Vec<&'a str> {
        [base, &[o]].concat()
    }
    let with = |o: &'static str| with(&base, o);
    let a = ok(&with("security_label,no_security_label"));
    assert_eq!(a.security_label, AclMode::Never);
    let a = ok(&with("no_security_label,security_label"));
    assert_eq!(a.security_label, AclMode::Always);
    let a = ok(&with("no_flock,flock"));
    assert!(!a.no_flock);
    let a = ok(&with("flock,no_flock"));
    assert!(a.no_flock);
    // As another user KILLPRIV_V2 cannot be offered: refused only
    // when the last word asks for it, named as given.
    let argv = |o: &'static str| {
        let mut v = vec!["fusebox"];
        v.extend(with(o));
        v
    };
    let a = parse(argv("killpriv_v2,no_killpriv_v2"), false).map(|c| c.vhost);
    assert!(a.is_ok_and(|a| a.virtiofsd.no_killpriv_v2));
    let e = err_as(&with("no_killpriv_v2,killpriv_v2"), false);
    assert!(
        e.contains("-o killpriv_v2: not supported by fusebox"),
        "{e}"
    );
    // Across -o uses too.
    let a = ok(&[
        "--socket-path=/s",
        "--shared-dir=/a",
        "-o",
        "no_posix_lock,writeback",
        "-o",
        "posix_lock,no_writeback",
    ]);
    assert!(!a.no_posix_lock && !a.writeback);
    let a = ok(&[&base[..], &["announce_submounts,no_announce_submounts"]].concat());
    assert!(!a.announce_submounts && a.no_announce_submounts);
    let a = ok(&[&base[..], &["posix_acl,no_posix_acl"]].concat());
    assert_eq!(a.posix_acl, AclMode::Never);
}

#[test]
fn the_old_c_daemons_suboptions() {
    let a = ok(&["--socket-path=/s", "-o", "source=/a,debug"]);
    assert_eq!(a.log_level, LogLevel::Debug);
    let o = a.notices.last().cloned().unwrap_or_default();
    assert!(o.contains("means --shared-dir /a --log-level debug"), "{o}");
    let a = ok(&["--socket-path=/s", "-d", "-o", "source=/a,debug"]);
    assert_eq!(a.log_level, LogLevel::Debug);
    let e = err(&[
        "--socket-path=/s",
        "--log-level=warn",
        "-o",
        "source=/a,debug",
    ]);
    assert!(e.contains("-o debug conflicts with --log-level"), "{e}");
    for (o, why) in [
        ("norace", "old C virtiofsd"),
        ("timeout=5", "cache timeouts follow --cache"),
        ("timeout", "cache timeouts follow --cache"),
        ("allow_root", "FUSE mount option"),
        ("max_idle_threads=4", "use --thread-pool-size"),
        ("max_background=64", "use --max-background"),
        ("no_remote_lock", "use no_flock,no_posix_lock"),
        ("writeback_cache", "use writeback"),
        ("splice_read", "old C virtiofsd"),
    ] {
        let name = o.split('=').next().unwrap_or_default();
        let e = err(&["--socket-path=/s", "-o", &format!("source=/a,{o}")]);
        assert!(
            e.contains(&format!("-o {name}: not supported by fusebox (")),
            "{o}: {e}"
        );
        assert!(e.contains(why), "{o}: {e}");
    }
}
