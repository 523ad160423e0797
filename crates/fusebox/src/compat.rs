//! virtiofsd's compatibility syntax and options: `-o SUBOPTS` (what
//! libvirt passes to a daemon that does not advertise `separate-options`,
//! and what the old C virtiofsd took), `-d`, `-f`, `--socket`, and the
//! virtiofsd options fusebox has no option of its own for. Each is turned
//! into fusebox's option of the same meaning, or taken with no effect when
//! it asks for what fusebox always does, or refused with an error naming
//! it: never ignored.
//!
//! [`parse`] goes from the command line to the options in force, so that
//! everything here is tested without starting a daemon.

use crate::cli::{AclMode, Cache, Cli, LogLevel, Sandbox, VhostArgs};
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches};
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// The command line could not be turned into options.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    /// clap's own errors (and --help, --version), printed by clap.
    #[error(transparent)]
    Usage(#[from] clap::Error),
    /// The compatibility syntax.
    #[error(transparent)]
    Compat(#[from] CompatError),
}

/// A compatibility option fusebox cannot take.
#[derive(Debug, thiserror::Error)]
pub enum CompatError {
    /// An empty item: `-o ''`, `-o a,,,` style leftovers, a trailing or
    /// leading comma.
    #[error("-o {0:?}: empty suboption (suboptions are separated by ',', and ',,' is a comma)")]
    Empty(String),
    /// `=value` with no name.
    #[error("-o {0}: '=' without a suboption name")]
    NoName(String),
    /// `name=` with nothing after it.
    #[error("-o {0}=: the suboption needs a value")]
    NoValue(String),
    /// `name` alone where a value is needed.
    #[error("-o {0}: the suboption needs a value ({0}=...)")]
    MissingValue(String),
    /// `name=value` where `name` is a flag.
    #[error("-o {name}={value}: {name} takes no value")]
    TakesNoValue {
        /// The suboption.
        name: String,
        /// What was given.
        value: String,
    },
    /// A value outside the suboption's set.
    #[error("-o {name}={value}: expected {expected}")]
    BadValue {
        /// The suboption.
        name: String,
        /// What was given.
        value: String,
        /// What it takes.
        expected: &'static str,
    },
    /// A suboption neither fusebox nor virtiofsd knows.
    #[error("-o {0}: unknown suboption")]
    Unknown(String),
    /// An option or suboption asking for what fusebox does not do.
    #[error("{opt}: not supported by fusebox ({why})")]
    Unsupported {
        /// `-o name` or `--name`.
        opt: String,
        /// What fusebox does instead.
        why: &'static str,
    },
    /// A suboption (or `-d`) at odds with a separate option also given.
    #[error("{given} conflicts with {other}")]
    Conflict {
        /// The compatibility form.
        given: String,
        /// The option it disagrees with.
        other: String,
    },
    /// Neither --shared-dir nor `-o source`.
    #[error("--shared-dir (or -o source=DIR) is required")]
    NoSharedDir,
}

const WHY_LOCKS: &str = "it always serves POSIX and flock locks itself";
const WHY_READDIRPLUS: &str = "it always offers READDIRPLUS";
const WHY_DIRECT_IO: &str = "it always honours O_DIRECT from the guest";
const WHY_MODCAPS: &str = "it keeps the capabilities it is started with";
const WHY_XATTRMAP: &str = "no xattr name mapping; use --xattr";
const WHY_SECURITY_LABEL: &str = "no FUSE_SECURITY_CTX";
const WHY_IDMAP: &str = "no user namespace ID mapping or ID translation";
const WHY_MIGRATION: &str = "no live migration yet";
const WHY_KILLPRIV_ROOT: &str =
    "as root it always offers KILLPRIV_V2: writes run as the caller, so the host clears setuid/setgid";
const WHY_KILLPRIV_USER: &str = "it offers KILLPRIV_V2 only when it runs as root";

/// One `-o` suboption, as fusebox takes it.
#[derive(Debug, Clone, PartialEq)]
pub enum Sub {
    /// `source=DIR`: --shared-dir.
    Source(PathBuf),
    /// `cache=`: --cache (`none` is `never`, as the C daemon).
    Cache(Cache),
    /// `sandbox=`: --sandbox.
    Sandbox(Sandbox),
    /// `xattr`, `no_xattr`: --xattr.
    Xattr(bool),
    /// `posix_acl`, `no_posix_acl`: --posix-acl=always|never.
    PosixAcl(AclMode),
    /// `writeback`, `no_writeback`: --writeback.
    Writeback(bool),
    /// `log_level=` (also virtiofsd's `loglevel=`): --log-level.
    LogLevel(LogLevel),
    /// `announce_submounts`, `no_announce_submounts`.
    AnnounceSubmounts(bool),
    /// `killpriv_v2`, `no_killpriv_v2`.
    KillprivV2(bool),
    /// A suboption asking for what fusebox always does (`flock`,
    /// `posix_lock`, `readdirplus`, `allow_direct_io`,
    /// `no_security_label`).
    Always(&'static str),
}

/// Splits one `-o` string at its commas; `,,` is a comma inside an item
/// (libvirt doubles the commas of the source path).
pub fn split(s: &[u8]) -> Result<Vec<Vec<u8>>, CompatError> {
    let mut items = Vec::new();
    let mut cur = Vec::new();
    let mut i = 0;
    while i < s.len() {
        if s[i] == b',' {
            if s.get(i + 1) == Some(&b',') {
                cur.push(b',');
                i += 2;
                continue;
            }
            items.push(std::mem::take(&mut cur));
        } else {
            cur.push(s[i]);
        }
        i += 1;
    }
    items.push(cur);
    if items.iter().any(Vec::is_empty) {
        return Err(CompatError::Empty(lossy(s)));
    }
    Ok(items)
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn unsupported(name: &str, why: &'static str) -> CompatError {
    CompatError::Unsupported {
        opt: format!("-o {name}"),
        why,
    }
}

/// Parses one suboption.
pub fn parse_item(item: &[u8]) -> Result<Sub, CompatError> {
    let (name, value) = match item.iter().position(|&b| b == b'=') {
        Some(0) => return Err(CompatError::NoName(lossy(item))),
        Some(eq) => (&item[..eq], Some(&item[eq + 1..])),
        None => (item, None),
    };
    let name = std::str::from_utf8(name).map_err(|_| CompatError::Unknown(lossy(name)))?;
    let Some(value) = value else {
        return single(name);
    };
    if value.is_empty() {
        return Err(CompatError::NoValue(name.into()));
    }
    let bad = |expected| CompatError::BadValue {
        name: name.into(),
        value: lossy(value),
        expected,
    };
    Ok(match name {
        "source" => Sub::Source(PathBuf::from(OsStr::from_bytes(value))),
        "cache" => Sub::Cache(match value {
            b"none" | b"never" => Cache::Never,
            b"metadata" => Cache::Metadata,
            b"auto" => Cache::Auto,
            b"always" => Cache::Always,
            _ => return Err(bad("none, never, metadata, auto or always")),
        }),
        "sandbox" => Sub::Sandbox(match value {
            b"namespace" => Sandbox::Namespace,
            b"chroot" => Sandbox::Chroot,
            b"none" => Sandbox::None,
            _ => return Err(bad("namespace, chroot or none")),
        }),
        "log_level" | "loglevel" => Sub::LogLevel(match value {
            b"err" => LogLevel::Error,
            b"warn" => LogLevel::Warn,
            b"info" => LogLevel::Info,
            b"debug" => LogLevel::Debug,
            _ => return Err(bad("err, warn, info or debug")),
        }),
        "modcaps" => return Err(unsupported(name, WHY_MODCAPS)),
        "xattrmap" => return Err(unsupported(name, WHY_XATTRMAP)),
        _ => match single(name) {
            // A known flag given a value.
            Ok(_) | Err(CompatError::Unsupported { .. }) => {
                return Err(CompatError::TakesNoValue {
                    name: name.into(),
                    value: lossy(value),
                })
            }
            Err(e) => return Err(e),
        },
    })
}

/// A suboption without `=`.
fn single(name: &str) -> Result<Sub, CompatError> {
    Ok(match name {
        "xattr" => Sub::Xattr(true),
        "no_xattr" => Sub::Xattr(false),
        "flock" => Sub::Always("flock"),
        "posix_lock" => Sub::Always("posix_lock"),
        "no_flock" | "no_posix_lock" => return Err(unsupported(name, WHY_LOCKS)),
        "posix_acl" => Sub::PosixAcl(AclMode::Always),
        "no_posix_acl" => Sub::PosixAcl(AclMode::Never),
        "readdirplus" => Sub::Always("readdirplus"),
        "no_readdirplus" => return Err(unsupported(name, WHY_READDIRPLUS)),
        "writeback" => Sub::Writeback(true),
        "no_writeback" => Sub::Writeback(false),
        "announce_submounts" => Sub::AnnounceSubmounts(true),
        "no_announce_submounts" => Sub::AnnounceSubmounts(false),
        "killpriv_v2" => Sub::KillprivV2(true),
        "no_killpriv_v2" => Sub::KillprivV2(false),
        "allow_direct_io" => Sub::Always("allow_direct_io"),
        "no_allow_direct_io" => return Err(unsupported(name, WHY_DIRECT_IO)),
        "security_label" => return Err(unsupported(name, WHY_SECURITY_LABEL)),
        "no_security_label" => Sub::Always("no_security_label"),
        "source" | "cache" | "sandbox" | "log_level" | "loglevel" | "modcaps" | "xattrmap" => {
            return Err(CompatError::MissingValue(name.into()))
        }
        _ => return Err(CompatError::Unknown(name.into())),
    })
}

/// The separate option a suboption stands for (for the deprecation
/// notice), or None for those that ask for what fusebox always does.
fn separate(sub: &Sub) -> Option<String> {
    fn v(x: &impl clap::ValueEnum) -> String {
        x.to_possible_value()
            .map(|p| p.get_name().to_string())
            .unwrap_or_default()
    }
    Some(match sub {
        Sub::Source(p) => format!("--shared-dir {}", p.display()),
        Sub::Cache(c) => format!("--cache {}", v(c)),
        Sub::Sandbox(s) => format!("--sandbox {}", v(s)),
        Sub::Xattr(true) => "--xattr".into(),
        Sub::Xattr(false) => "no --xattr".into(),
        Sub::PosixAcl(m) => format!("--posix-acl={}", v(m)),
        Sub::Writeback(true) => "--writeback".into(),
        Sub::Writeback(false) => "no --writeback".into(),
        Sub::LogLevel(l) => format!("--log-level {}", v(l)),
        Sub::AnnounceSubmounts(true) => "--announce-submounts".into(),
        Sub::AnnounceSubmounts(false) => "--no-announce-submounts".into(),
        Sub::KillprivV2(true) => "--killpriv-v2".into(),
        Sub::KillprivV2(false) => "--no-killpriv-v2".into(),
        Sub::Always(_) => return None,
    })
}

/// Which options the command line gave (not clap's defaults), each with
/// how it was given, so a suboption that disagrees is refused.
struct Given<'a> {
    m: &'a ArgMatches,
    by: HashMap<&'static str, String>,
}

impl Given<'_> {
    /// Whether clap's `id` came from the command line.
    fn explicit(&self, id: &str) -> bool {
        self.m.value_source(id) == Some(ValueSource::CommandLine)
    }

    /// Records the field `key` as given by the first of `opts` (clap id,
    /// as written) that the command line has.
    fn record(&mut self, key: &'static str, opts: &[(&str, &str)]) {
        if let Some((_, written)) = opts.iter().find(|(id, _)| self.explicit(id)) {
            self.by.insert(key, (*written).to_string());
        }
    }

    /// Sets `slot` from a suboption `what`, unless the field was given
    /// otherwise (later suboptions override earlier ones, as virtiofsd).
    fn set<T: PartialEq>(
        &self,
        key: &str,
        slot: &mut T,
        v: T,
        what: &str,
    ) -> Result<(), CompatError> {
        if let Some(by) = self.by.get(key) {
            if *slot != v {
                return Err(CompatError::Conflict {
                    given: what.into(),
                    other: by.clone(),
                });
            }
        }
        *slot = v;
        Ok(())
    }
}

/// Refuses the virtiofsd options fusebox cannot honour.
fn refuse_unsupported(a: &VhostArgs, root: bool) -> Result<(), CompatError> {
    let v = &a.virtiofsd;
    let refuse = |opt: &str, why| {
        Err(CompatError::Unsupported {
            opt: opt.into(),
            why,
        })
    };
    if v.no_readdirplus {
        return refuse("--no-readdirplus", WHY_READDIRPLUS);
    }
    if v.modcaps.is_some() {
        return refuse("--modcaps", WHY_MODCAPS);
    }
    if v.xattrmap.is_some() {
        return refuse("--xattrmap", WHY_XATTRMAP);
    }
    if v.security_label.as_deref().is_some_and(|m| m != "never") {
        return refuse("--security-label", WHY_SECURITY_LABEL);
    }
    for (opt, given) in [
        ("--uid-map", !v.uid_map.is_empty()),
        ("--gid-map", !v.gid_map.is_empty()),
        ("--translate-uid", !v.translate_uid.is_empty()),
        ("--translate-gid", !v.translate_gid.is_empty()),
    ] {
        if given {
            return refuse(opt, WHY_IDMAP);
        }
    }
    for (opt, given) in [
        ("--migration-mode", v.migration_mode.is_some()),
        ("--migration-on-error", v.migration_on_error.is_some()),
        ("--migration-verify-handles", v.migration_verify_handles),
        ("--migration-confirm-paths", v.migration_confirm_paths),
    ] {
        if given {
            return refuse(opt, WHY_MIGRATION);
        }
    }
    if v.killpriv_v2 && !root {
        return refuse("--killpriv-v2", WHY_KILLPRIV_USER);
    }
    if v.no_killpriv_v2 && root {
        return refuse("--no-killpriv-v2", WHY_KILLPRIV_ROOT);
    }
    Ok(())
}

/// Applies `-d`, `-f`, `--socket` and every `-o` to `a`; `root`: whether
/// the daemon runs as root (KILLPRIV_V2 depends on it).
pub fn resolve(a: &mut VhostArgs, m: &ArgMatches, root: bool) -> Result<(), CompatError> {
    refuse_unsupported(a, root)?;
    let mut g = Given {
        m,
        by: HashMap::new(),
    };
    g.record("shared_dir", &[("shared_dir", "--shared-dir")]);
    g.record("cache", &[("cache", "--cache")]);
    g.record("sandbox", &[("sandbox", "--sandbox")]);
    g.record("xattr", &[("xattr", "--xattr")]);
    g.record("posix_acl", &[("posix_acl", "--posix-acl")]);
    g.record("writeback", &[("writeback", "--writeback")]);
    g.record("log_level", &[("log_level", "--log-level")]);
    g.record(
        "announce_submounts",
        &[
            ("announce_submounts", "--announce-submounts"),
            ("no_announce_submounts", "--no-announce-submounts"),
        ],
    );
    g.record(
        "killpriv_v2",
        &[
            ("killpriv_v2", "--killpriv-v2"),
            ("no_killpriv_v2", "--no-killpriv-v2"),
        ],
    );
    let mut killpriv = if a.virtiofsd.killpriv_v2 {
        Some(true)
    } else if a.virtiofsd.no_killpriv_v2 {
        Some(false)
    } else {
        None
    };
    if a.compat_foreground {
        a.notices
            .push("-f is deprecated and has no effect: remove it".into());
    }
    if let Some(p) = a.socket.take() {
        a.notices
            .push("--socket is deprecated: use --socket-path".into());
        a.socket_path = Some(p);
    }
    if a.compat_debug {
        g.set("log_level", &mut a.log_level, LogLevel::Debug, "-d")?;
        g.by.insert("log_level", "-d".into());
        a.notices
            .push("-d is deprecated: use --log-level debug".into());
    }
    for opts in std::mem::take(&mut a.compat_options) {
        let mut instead = Vec::new();
        let mut always = Vec::new();
        for item in split(opts.as_bytes())? {
            let sub = parse_item(&item)?;
            let what = format!("-o {}", lossy(&item));
            match &sub {
                Sub::Source(p) => g.set("shared_dir", &mut a.shared_dir, Some(p.clone()), &what)?,
                Sub::Cache(c) => g.set("cache", &mut a.cache, *c, &what)?,
                Sub::Sandbox(s) => g.set("sandbox", &mut a.sandbox, *s, &what)?,
                Sub::Xattr(x) => g.set("xattr", &mut a.xattr, *x, &what)?,
                Sub::PosixAcl(m) => g.set("posix_acl", &mut a.posix_acl, *m, &what)?,
                Sub::Writeback(w) => g.set("writeback", &mut a.writeback, *w, &what)?,
                Sub::LogLevel(l) => g.set("log_level", &mut a.log_level, *l, &what)?,
                Sub::AnnounceSubmounts(on) => {
                    g.set("announce_submounts", &mut a.announce_submounts, *on, &what)?;
                    a.no_announce_submounts = !on;
                }
                Sub::KillprivV2(on) => {
                    if *on && !root {
                        return Err(unsupported("killpriv_v2", WHY_KILLPRIV_USER));
                    }
                    if !on && root {
                        return Err(unsupported("no_killpriv_v2", WHY_KILLPRIV_ROOT));
                    }
                    g.set("killpriv_v2", &mut killpriv, Some(*on), &what)?;
                }
                Sub::Always(name) => always.push(*name),
            }
            instead.extend(separate(&sub));
        }
        let mut notice = format!(
            "-o is deprecated, use the separate options: -o {}",
            opts.to_string_lossy()
        );
        if !instead.is_empty() {
            notice.push_str(&format!(" means {}", instead.join(" ")));
        }
        if !always.is_empty() {
            notice.push_str(&format!(
                "; {} need no option (fusebox always does this)",
                always.join(", ")
            ));
        }
        a.notices.push(notice);
    }
    if a.shared_dir.is_none() && !a.print_capabilities {
        return Err(CompatError::NoSharedDir);
    }
    Ok(())
}

/// The command line (argv[0] first) to the options in force.
pub fn parse<I, T>(argv: I, root: bool) -> Result<Cli, ArgsError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let m = Cli::command().try_get_matches_from(argv)?;
    let mut cli = Cli::from_arg_matches(&m)?;
    if cli.cmd.is_none() {
        resolve(&mut cli.vhost, &m, root)?;
    }
    Ok(cli)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: bool = true;

    fn ok(args: &[&str]) -> VhostArgs {
        let argv = std::iter::once("fusebox").chain(args.iter().copied());
        match parse(argv, ROOT) {
            Ok(c) => c.vhost,
            Err(e) => panic!("{args:?}: {e}"),
        }
    }

    fn err(args: &[&str]) -> String {
        err_as(args, ROOT)
    }

    fn err_as(args: &[&str], root: bool) -> String {
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
            ("source=/a,timeout=5", "-o timeout: unknown suboption"),
            ("source=/a,norace", "-o norace: unknown suboption"),
        ] {
            let e = err(&["--socket-path=/s", "-o", o]);
            assert!(e.contains(named), "-o {o:?}: {e}");
        }
    }

    #[test]
    fn what_fusebox_cannot_honour_is_an_error_naming_it() {
        for (o, named) in [
            ("modcaps=+sys_admin", "-o modcaps: not supported by fusebox"),
            (
                "xattrmap=:ok:all:::",
                "-o xattrmap: not supported by fusebox",
            ),
            ("no_flock", "-o no_flock: not supported by fusebox"),
            (
                "no_posix_lock",
                "-o no_posix_lock: not supported by fusebox",
            ),
            (
                "no_readdirplus",
                "-o no_readdirplus: not supported by fusebox",
            ),
            (
                "no_allow_direct_io",
                "-o no_allow_direct_io: not supported by fusebox",
            ),
            (
                "security_label",
                "-o security_label: not supported by fusebox",
            ),
            (
                "no_killpriv_v2",
                "-o no_killpriv_v2: not supported by fusebox",
            ),
        ] {
            let e = err(&["--socket-path=/s", "-o", &format!("source=/a,{o}")]);
            assert!(e.contains(named), "-o {o}: {e}");
        }
        let e = err_as(&["--socket-path=/s", "-o", "source=/a,killpriv_v2"], false);
        assert!(
            e.contains("-o killpriv_v2: not supported by fusebox"),
            "{e}"
        );
        for args in [
            &["--modcaps=+sys_admin"][..],
            &["--xattrmap", ":ok:all:::"],
            &["--no-readdirplus"],
            &["--security-label"],
            &["--security-label=auto"],
            &["--uid-map=:0:1000:1:"],
            &["--gid-map=:0:1000:1:"],
            &["--translate-uid=map:0:1000:1"],
            &["--translate-gid=map:0:1000:1"],
            &["--migration-mode=find-paths"],
            &["--migration-on-error=abort"],
            &["--migration-verify-handles"],
            &["--migration-confirm-paths"],
            &["--no-killpriv-v2"],
        ] {
            let all = [&["--socket-path=/s", "--shared-dir=/a"][..], args].concat();
            let e = err(&all);
            let opt = args[0].split('=').next().unwrap_or_default();
            assert!(
                e.contains(&format!("{opt}: not supported by fusebox")),
                "{args:?}: {e}"
            );
        }
        let e = err_as(
            &["--socket-path=/s", "--shared-dir=/a", "--killpriv-v2"],
            false,
        );
        assert!(e.contains("--killpriv-v2: not supported by fusebox"), "{e}");
    }

    #[test]
    fn options_asking_for_what_fusebox_does_are_taken() {
        ok(&[
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
        let argv = [
            "fusebox",
            "--socket-path=/s",
            "--shared-dir=/a",
            "--no-killpriv-v2",
        ];
        assert!(parse(argv, false).is_ok());
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
}
