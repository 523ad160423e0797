//! Unit tests of `compat` (the parser is a pure function of argv): whole
//! command lines and separate options, and the helpers the other test
//! modules of `compat` share. The `-o` suboptions are tested in
//! `compat_suboption_tests.rs`, the ID translations in
//! `compat_translate_tests.rs`.

use super::*;

pub(super) const ROOT: bool = true;

pub(super) fn ok(args: &[&str]) -> VhostArgs {
    let argv = std::iter::once("fusebox").chain(args.iter().copied());
    match parse(argv, ROOT) {
        Ok(c) => c.vhost,
        Err(e) => panic!("{args:?}: {e}"),
    }
}

pub(super) fn err(args: &[&str]) -> String {
    err_as(args, ROOT)
}

pub(super) fn err_as(args: &[&str], root: bool) -> String {
    let argv = std::iter::once("fusebox").chain(args.iter().copied());
    match parse(argv, root) {
        Ok(c) => panic!("{args:?} parsed: {:?}", c.vhost),
        Err(ArgsError::Compat(e)) => e.to_string(),
        Err(ArgsError::Usage(e)) => e.to_string(),
    }
}

#[test]
fn libvirts_command_line() {
    let a = ok(&[
        "--fd=3",
        "-o",
        "source=/srv/a,,b,cache=none,sandbox=chroot,xattr,flock,posix_lock",
        "--thread-pool-size=16",
        "--rlimit-nofile=4096",
        "-d",
    ]);
    assert_eq!(a.shared_dir, Some(PathBuf::from("/srv/a,b")));
    assert_eq!(a.fd, Some(3));
    assert_eq!(a.cache, Cache::Never);
    assert_eq!(a.sandbox, Sandbox::Chroot);
    assert!(a.xattr);
    assert_eq!(a.thread_pool_size, 16);
    assert_eq!(a.rlimit_nofile, Some(4096));
    assert_eq!(a.log_level, LogLevel::Debug);
    assert!(a.compat_options.is_empty());
    assert_eq!(a.notices.len(), 2, "{:?}", a.notices);
    assert!(a.notices.iter().any(|n| n.starts_with("-d is deprecated")));
    let o = a
        .notices
        .iter()
        .find(|n| n.starts_with("-o is deprecated"))
        .cloned()
        .unwrap_or_default();
    assert!(
        o.contains("--shared-dir /srv/a,b --cache never --sandbox chroot --xattr"),
        "{o}"
    );
    assert!(o.contains("flock, posix_lock"), "{o}");
}

#[test]
fn what_fusebox_cannot_honour_is_an_error_naming_it() {
    let e = err_as(&["--socket-path=/s", "-o", "source=/a,killpriv_v2"], false);
    assert!(
        e.contains("-o killpriv_v2: not supported by fusebox"),
        "{e}"
    );
    let e = err_as(
        &["--socket-path=/s", "--shared-dir=/a", "--killpriv-v2"],
        false,
    );
    assert!(e.contains("--killpriv-v2: not supported by fusebox"), "{e}");
}

#[test]
fn migration_options_as_virtiofsd_takes_them() {
    use crate::cli::{MigrationMode, MigrationOnError};
    let base = ["--socket-path=/s", "--shared-dir=/a"];
    let with = |more: &[&'static str]| -> Vec<&'static str> { [&base[..], more].concat() };
    let a = ok(&with(&[]));
    assert_eq!(a.virtiofsd.migration_mode, MigrationMode::FindPaths);
    assert_eq!(a.virtiofsd.migration_on_error, MigrationOnError::Abort);
    assert!(!a.virtiofsd.migration_verify_handles);
    let a = ok(&with(&[
        "--migration-mode=file-handles",
        "--migration-on-error=guest-error",
        "--migration-verify-handles",
        "--migration-confirm-paths",
    ]));
    assert_eq!(a.virtiofsd.migration_mode, MigrationMode::FileHandles);
    assert_eq!(a.virtiofsd.migration_on_error, MigrationOnError::GuestError);
    assert!(a.virtiofsd.migration_verify_handles && a.virtiofsd.migration_confirm_paths);
    for bad in ["--migration-mode=by-magic", "--migration-on-error=ignore"] {
        let e = err(&with(&[bad]));
        assert!(e.contains(bad.split('=').nth(1).unwrap_or_default()), "{e}");
    }
}

#[test]
fn security_label_as_virtiofsd_takes_it() {
    let base = ["--socket-path=/s", "--shared-dir=/a"];
    let with = |more: &[&'static str]| -> Vec<&'static str> { [&base[..], more].concat() };
    assert_eq!(ok(&with(&[])).security_label, AclMode::Never);
    for (args, mode) in [
        (&["--security-label"][..], AclMode::Always),
        (&["--security-label=always"], AclMode::Always),
        (&["--security-label=auto"], AclMode::Auto),
        (&["--security-label=never"], AclMode::Never),
        (&["-o", "security_label"], AclMode::Always),
        (&["-o", "no_security_label"], AclMode::Never),
        (
            &["--security-label", "-o", "security_label"],
            AclMode::Always,
        ),
    ] {
        assert_eq!(ok(&with(args)).security_label, mode, "{args:?}");
    }
    let a = ok(&with(&["-o", "security_label"]));
    let o = a.notices.last().cloned().unwrap_or_default();
    assert!(o.contains("means --security-label"), "{o}");
    // A bad mode, and an -o that says otherwise than the option.
    let e = err(&with(&["--security-label=sometimes"]));
    assert!(e.contains("sometimes"), "{e}");
    let e = err(&with(&["--security-label=auto", "-o", "security_label"]));
    assert!(
        e.contains("-o security_label conflicts with --security-label"),
        "{e}"
    );
}

#[test]
fn modcaps_as_virtiofsd_takes_it() {
    let base = ["--socket-path=/s", "--shared-dir=/a"];
    let with = |more: &[&'static str]| -> Vec<&'static str> { [&base[..], more].concat() };
    assert_eq!(ok(&with(&[])).modcaps, None);
    let want = crate::caps::ModCaps {
        add: 1 << 21,
        drop: 1,
    };
    for args in [
        &["--modcaps=+sys_admin:-chown"][..],
        &["--modcaps", "+sys_admin:-chown"],
        &["--modcaps", "-chown:+SYS_ADMIN"],
        &["-o", "modcaps=+sys_admin:-chown"],
        &["-o", "source=/a,modcaps=+sys_admin:-chown"],
    ] {
        assert_eq!(ok(&with(args)).modcaps, Some(want), "{args:?}");
    }
    let a = ok(&with(&["-o", "modcaps=-chown"]));
    let o = a.notices.last().cloned().unwrap_or_default();
    assert!(o.contains("means --modcaps=-chown"), "{o}");
    // Unknown names, bad items: errors at start.
    for (args, named) in [
        (&["--modcaps=+nosuch"][..], "unknown capability \"nosuch\""),
        (&["--modcaps=chown"], "starts with + (keep) or - (drop)"),
        (&["--modcaps=+chown::-mknod"], "empty item"),
        (&["-o", "modcaps=-nosuch"], "-o modcaps"),
        (
            &["-o", "modcaps"],
            "-o modcaps: the suboption needs a value",
        ),
        (
            &["--modcaps=-chown", "-o", "modcaps=-mknod"],
            "-o modcaps=-mknod conflicts with --modcaps",
        ),
    ] {
        let e = err(&with(args));
        assert!(e.contains(named), "{args:?}: {e}");
    }
    let e = err(&with(&["-o", "modcaps=-nosuch"]));
    assert!(e.contains("-o modcaps"), "{e}");
}

#[test]
fn options_asking_for_what_fusebox_does_are_taken() {
    let a = ok(&[
        "--socket-path=/s",
        "--shared-dir=/a",
        "--allow-direct-io",
        "--allow-mmap",
        "--preserve-noatime",
        "--killpriv-v2",
        "--security-label=never",
        "--no-announce-submounts",
        "-o",
        "no_security_label,flock,posix_lock,readdirplus,allow_direct_io,killpriv_v2",
    ]);
    assert!(!a.no_flock && !a.no_posix_lock && !a.no_direct_io);
    assert!(!a.virtiofsd.no_readdirplus && !a.virtiofsd.no_killpriv_v2);
    let o = a.notices.last().cloned().unwrap_or_default();
    assert!(
        o.contains(
            "no_security_label, flock, posix_lock, readdirplus, allow_direct_io need no option"
        ),
        "{o}"
    );
    let argv = [
        "fusebox",
        "--socket-path=/s",
        "--shared-dir=/a",
        "--no-killpriv-v2",
    ];
    assert!(parse(argv, false).is_ok());
}

#[test]
fn lock_readdirplus_killpriv_and_direct_io_switches_are_honoured() {
    // Each off by default.
    let a = ok(&["--socket-path=/s", "--shared-dir=/a"]);
    assert!(!a.no_flock && !a.no_posix_lock && !a.no_direct_io);
    assert!(!a.virtiofsd.no_readdirplus && !a.virtiofsd.no_killpriv_v2);
    // libvirt's <lock posix='off' flock='off'/>, and the rest.
    let a = ok(&[
        "--socket-path=/s",
        "-o",
        "source=/a,no_flock,no_posix_lock,no_readdirplus,no_allow_direct_io,no_killpriv_v2",
    ]);
    assert!(a.no_flock && a.no_posix_lock && a.no_direct_io);
    assert!(a.virtiofsd.no_readdirplus);
    assert!(a.virtiofsd.no_killpriv_v2, "as root too");
    let o = a.notices.last().cloned().unwrap_or_default();
    assert!(
        o.contains("means --shared-dir /a --no-readdirplus --no-killpriv-v2"),
        "{o}"
    );
    assert!(
        o.contains("no_flock, no_posix_lock, no_allow_direct_io have no separate option"),
        "{o}"
    );
    // Each on its own.
    for (o, check) in [
        (
            "no_flock",
            (|a: &VhostArgs| a.no_flock) as fn(&VhostArgs) -> bool,
        ),
        ("no_posix_lock", |a| a.no_posix_lock),
        ("no_readdirplus", |a| a.virtiofsd.no_readdirplus),
        ("no_allow_direct_io", |a| a.no_direct_io),
        ("no_killpriv_v2", |a| a.virtiofsd.no_killpriv_v2),
    ] {
        let a = ok(&["--socket-path=/s", "-o", &format!("source=/a,{o}")]);
        assert!(check(&a), "{o}");
        let on = o.trim_start_matches("no_");
        let a = ok(&["--socket-path=/s", "-o", &format!("source=/a,{o},{on}")]);
        assert!(!check(&a), "{o},{on}: the later wins");
    }
    // The separate options.
    let a = ok(&[
        "--socket-path=/s",
        "--shared-dir=/a",
        "--no-readdirplus",
        "--no-killpriv-v2",
    ]);
    assert!(a.virtiofsd.no_readdirplus && a.virtiofsd.no_killpriv_v2);
    // A suboption against the separate option.
    for (args, named) in [
        (
            &["--no-readdirplus", "-o", "readdirplus"][..],
            "-o readdirplus conflicts with --no-readdirplus",
        ),
        (
            &["--allow-direct-io", "-o", "no_allow_direct_io"],
            "-o no_allow_direct_io conflicts with --allow-direct-io",
        ),
        (
            &["--killpriv-v2", "-o", "no_killpriv_v2"],
            "-o no_killpriv_v2 conflicts with --killpriv-v2",
        ),
        (
            &["--no-killpriv-v2", "-o", "killpriv_v2"],
            "-o killpriv_v2 conflicts with --no-killpriv-v2",
        ),
    ] {
        let all = [&["--socket-path=/s", "--shared-dir=/a"][..], args].concat();
        let e = err(&all);
        assert!(e.contains(named), "{args:?}: {e}");
    }
}

#[test]
fn a_repeated_or_overriding_option_the_last_one_wins() {
    let a = ok(&["--socket-path=/s", "--shared-dir=/a", "-d", "-d"]);
    assert_eq!(a.log_level, LogLevel::Debug);
    let a = ok(&[
        "--socket-path=/s",
        "--shared-dir=/a",
        "--cache=auto",
        "--cache=never",
        "--sandbox=none",
        "--sandbox=chroot",
        "--xattr",
        "--xattr",
        "--thread-pool-size=2",
        "--thread-pool-size=4",
    ]);
    assert_eq!(a.cache, Cache::Never);
    assert_eq!(a.sandbox, Sandbox::Chroot);
    assert!(a.xattr);
    assert_eq!(a.thread_pool_size, 4);
    let a = ok(&[
        "--socket-path=/s",
        "--socket-path=/t",
        "--shared-dir=/a",
        "--shared-dir=/b",
    ]);
    assert_eq!(a.socket_path, Some(PathBuf::from("/t")));
    assert_eq!(a.shared_dir, Some(PathBuf::from("/b")));
    for (args, announce) in [
        (["--announce-submounts", "--no-announce-submounts"], false),
        (["--no-announce-submounts", "--announce-submounts"], true),
    ] {
        let a = ok(&[&["--socket-path=/s", "--shared-dir=/a"][..], &args].concat());
        assert_eq!(
            (a.announce_submounts, a.no_announce_submounts),
            (announce, !announce),
            "{args:?}"
        );
    }
    for (args, killpriv) in [
        (["--killpriv-v2", "--no-killpriv-v2"], false),
        (["--no-killpriv-v2", "--killpriv-v2"], true),
    ] {
        let a = ok(&[&["--socket-path=/s", "--shared-dir=/a"][..], &args].concat());
        assert_eq!(
            (a.virtiofsd.killpriv_v2, a.virtiofsd.no_killpriv_v2),
            (killpriv, !killpriv),
            "{args:?}"
        );
    }
    // The overridden option was not given: no conflict with -o.
    let a = ok(&[
        "--socket-path=/s",
        "--shared-dir=/a",
        "--announce-submounts",
        "--no-announce-submounts",
        "-o",
        "no_announce_submounts",
    ]);
    assert!(!a.announce_submounts);
    // Not --socket-group with --fd (it would go unused), as virtiofsd.
    let e = err(&["--fd=3", "--socket-group=kvm", "--shared-dir=/a"]);
    assert!(e.contains("--socket-group"), "{e}");
    // -o still gathers every use.
    let a = ok(&["--socket-path=/s", "-o", "source=/a", "-o", "xattr"]);
    assert!(a.xattr);
}

#[test]
fn the_mount_subcommand_parses_as_before() {
    let argv = [
        "fusebox",
        "mount",
        "--shared-dir",
        "/srv/a",
        "--cache=never",
        "/mnt/a",
    ];
    match parse(argv, ROOT) {
        Ok(Cli {
            cmd: Some(crate::cli::Cmd::Mount(m)),
            ..
        }) => {
            let d = format!("{m:?}");
            assert!(d.contains("shared_dir: \"/srv/a\""), "{d}");
            assert!(d.contains("mountpoint: \"/mnt/a\""), "{d}");
            assert!(d.contains("cache: Never"), "{d}");
        }
        Ok(c) => panic!("not the mount subcommand: {c:?}"),
        Err(e) => panic!("{e}"),
    }
    // The device's options do not go with it.
    let argv = ["fusebox", "--xattr", "mount", "--shared-dir", "/a", "/m"];
    assert!(parse(argv, ROOT).is_err());
    let argv = ["fusebox", "mount", "/m"];
    assert!(parse(argv, ROOT).is_err(), "--shared-dir is required");
}

#[test]
fn values_as_virtiofsd_takes_them() {
    let a = ok(&[
        "--socket-path=/s",
        "--shared-dir=/a",
        "--cache=NEVER",
        "--sandbox=CHROOT",
        "--log-level=INFO",
    ]);
    assert_eq!(a.cache, Cache::Never);
    assert_eq!(a.sandbox, Sandbox::Chroot);
    assert_eq!(a.log_level, LogLevel::Info);
    let a = ok(&["--socket-path=/s", "--shared-dir=/a", "--cache=Always"]);
    assert_eq!(a.cache, Cache::Always);
    let a = ok(&[
        "--socket-path=/s",
        "--shared-dir=/a",
        "--inode-file-handles=fallback",
    ]);
    assert_eq!(a.inode_file_handles, crate::cli::FileHandles::Prefer);
    // virtiofsd takes these in lower case only, and so does fusebox.
    for bad in [
        "--inode-file-handles=PREFER",
        "--seccomp=KILL",
        "--posix-acl=AUTO",
    ] {
        let e = err(&["--socket-path=/s", "--shared-dir=/a", bad]);
        assert!(e.contains("invalid value"), "{bad}: {e}");
    }
    // -o values are the C daemon's: lower case.
    let e = err(&["--socket-path=/s", "-o", "source=/a,cache=NEVER"]);
    assert!(e.contains("-o cache=NEVER: expected"), "{e}");
}

#[test]
fn print_capabilities_whatever_else_is_refused() {
    let caps = |args: &[&str], root| {
        let argv = std::iter::once("fusebox").chain(args.iter().copied());
        parse(argv, root).map(|c| c.vhost.print_capabilities)
    };
    for args in [
        &["--print-capabilities", "--modcaps=+sys_admin"][..],
        &["--print-capabilities", "--uid-map=:0:1000:1:"],
        &["--print-capabilities", "--migration-mode=find-paths"],
        &["--print-capabilities", "-o", "source=/a,security_label"],
        &["--print-capabilities", "-o", "xattrmap=:ok:all:::,norace"],
        &["--print-capabilities", "--shared-dir=/b", "-o", "source=/a"],
        &["--print-capabilities", "--killpriv-v2"],
        &["--print-capabilities", "-o", "killpriv_v2"],
    ] {
        assert!(matches!(caps(args, false), Ok(true)), "{args:?}");
    }
    // A malformed or unknown -o item stops it (virtiofsd too).
    for o in ["nonsense", "cache=sometimes", "source=/a,", "xattr=1"] {
        let args = ["--print-capabilities", "-o", o];
        assert!(caps(&args, ROOT).is_err(), "{o}");
    }
}

#[test]
fn deprecated_spellings() {
    let a = ok(&["--socket", "/s", "--shared-dir", "/a", "-f"]);
    assert_eq!(a.socket_path, Some(PathBuf::from("/s")));
    assert_eq!(a.socket, None);
    assert!(a
        .notices
        .iter()
        .any(|n| n.contains("--socket is deprecated")));
    assert!(a.notices.iter().any(|n| n.starts_with("-f is deprecated")));
    let e = err(&[
        "--socket",
        "/s",
        "--socket-path",
        "/t",
        "--shared-dir",
        "/a",
    ]);
    assert!(e.contains("--socket"), "{e}");
}

#[test]
fn a_shared_dir_is_needed_one_way_or_the_other() {
    let e = err(&["--socket-path=/s", "-o", "cache=auto"]);
    assert!(
        e.contains("--shared-dir (or -o source=DIR) is required"),
        "{e}"
    );
    let e = err(&["--socket-path=/s"]);
    assert!(e.contains("--shared-dir"), "{e}");
    ok(&["--print-capabilities"]);
}

#[test]
fn a_non_utf8_source_path() {
    use std::os::unix::ffi::OsStringExt;
    let o = OsString::from_vec(b"source=/a\xff,,b,xattr".to_vec());
    let argv: Vec<OsString> = vec!["fusebox".into(), "--socket-path=/s".into(), "-o".into(), o];
    let a = parse(argv, ROOT).map(|c| c.vhost).ok();
    let dir = a.and_then(|a| a.shared_dir);
    assert_eq!(
        dir.map(|d| d.into_os_string().into_vec()),
        Some(b"/a\xff,b".to_vec())
    );
}

#[test]
fn xattrmap_rules_are_taken_from_the_option_and_from_o() {
    let rules = |args: &[&str]| {
        let argv = std::iter::once("fusebox").chain(args.iter().copied());
        parse(argv, true).map(|c| c.vhost.virtiofsd.xattrmap)
    };
    let want: passthrough::XattrMap = ":map::user.virtiofs.:".parse().unwrap();
    let a = rules(&[
        "--socket-path=/s",
        "--shared-dir=/a",
        "--xattrmap",
        ":map::user.virtiofs.:",
    ]);
    assert_eq!(a.ok().flatten().as_ref(), Some(&want));
    let o = rules(&[
        "--socket-path=/s",
        "-o",
        "source=/a,xattrmap=:map::user.virtiofs.:",
    ]);
    assert_eq!(o.ok().flatten().as_ref(), Some(&want));
    // Rules that do not parse, or leave names without an answer: errors
    // naming the option.
    for bad in [":map::user.virtiofs.", ":ok:client:::", ":nope:all:::"] {
        let e = err(&["--socket-path=/s", "--shared-dir=/a", "--xattrmap", bad]);
        assert!(e.contains("--xattrmap"), "{bad}: {e}");
        let e = err(&[
            "--socket-path=/s",
            "-o",
            &format!("source=/a,xattrmap={bad}"),
        ]);
        assert!(e.contains("-o xattrmap"), "{bad}: {e}");
    }
}

#[test]
fn mounts_in_flight_has_its_old_name_ring_depth() {
    use crate::cli::Cmd;
    let depth = |flag: &str| match parse(
        [
            "fusebox",
            "mount",
            "--shared-dir",
            "/src",
            flag,
            "7",
            "/mnt",
        ],
        true,
    ) {
        Ok(Cli {
            cmd: Some(Cmd::Mount(m)),
            ..
        }) => m.in_flight,
        _ => panic!("{flag} refused"),
    };
    assert_eq!(depth("--in-flight"), 7);
    assert_eq!(depth("--ring-depth"), 7);
}
