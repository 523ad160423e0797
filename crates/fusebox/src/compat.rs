//! virtiofsd's compatibility syntax and options: `-o SUBOPTS` (what
//! libvirt passes to a daemon that does not advertise `separate-options`,
//! and what the old C virtiofsd took), `-d`, `-f`, `--socket`, and the
//! virtiofsd options fusebox has no option of its own for. Each is turned
//! into fusebox's option of the same meaning, or taken with no effect when
//! it asks for what fusebox does by default, or refused with an error
//! naming it and why: never ignored. Within `-o` a later item overrides an
//! earlier one, and refusals look at the last word only (`-o
//! killpriv_v2,no_killpriv_v2` is taken by a daemon not started as root).
//!
//! [`parse`] goes from the command line to the options in force, so that
//! everything here is tested without starting a daemon.

use crate::cli::{AclMode, Cache, Cli, LogLevel, Sandbox, VhostArgs};
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches};
use passthrough::{IdMap, IdMapError, XattrMap, XattrMapError};
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
    /// --translate-uid or --translate-gid mappings that cannot be taken
    /// together (overlapping ranges of one direction), or one that runs
    /// past the highest ID.
    #[error("{opt}")]
    Translate {
        /// The option.
        opt: &'static str,
        /// What is wrong.
        #[source]
        source: IdMapError,
    },
    /// Neither --shared-dir nor `-o source`.
    #[error("--shared-dir (or -o source=DIR) is required")]
    NoSharedDir,
    /// `-o xattrmap=` rules that do not parse.
    #[error("-o xattrmap")]
    Xattrmap(#[source] XattrMapError),
    /// `-o xattrmap=` rules that are not UTF-8.
    #[error("-o xattrmap")]
    XattrmapText(#[source] std::str::Utf8Error),
    /// `-o modcaps=` that does not parse.
    #[error("-o modcaps")]
    Modcaps(#[source] crate::caps::ModCapsError),
    /// `-o modcaps=` that is not UTF-8.
    #[error("-o modcaps")]
    ModcapsText(#[source] std::str::Utf8Error),
}

const WHY_KILLPRIV_USER: &str = "it offers KILLPRIV_V2 only when it runs as root";

/// The suboptions refused in any form (with or without a value), with
/// why: virtiofsd's that fusebox cannot honour, and the old C daemon's
/// (and its libfuse's) that no virtiofsd takes any more.
fn refused(name: &str) -> Option<&'static str> {
    Some(match name {
        "norace" => "an option of the old C virtiofsd, with no counterpart in fusebox",
        "timeout" => "an option of the old C virtiofsd; cache timeouts follow --cache",
        "allow_root" | "allow_other" | "default_permissions" | "fsname" | "subtype" => {
            "a FUSE mount option of the old C virtiofsd; the guest mounts virtio-fs itself"
        }
        "max_idle_threads" => "an option of the old C virtiofsd; use --thread-pool-size",
        "max_background" => "an option of the old C virtiofsd; use --max-background",
        "congestion_threshold" => "an option of the old C virtiofsd; use --congestion-threshold",
        "writeback_cache" | "no_writeback_cache" => {
            "an option of the old C virtiofsd; use writeback or no_writeback"
        }
        "no_remote_lock" => "an option of the old C virtiofsd; use no_flock,no_posix_lock",
        "no_remote_flock" => "an option of the old C virtiofsd; use no_flock",
        "no_remote_posix_lock" => "an option of the old C virtiofsd; use no_posix_lock",
        "max_write" | "max_readahead" | "time_gran" | "sync_read" | "async_read"
        | "atomic_o_trunc" | "async_dio" | "no_async_dio" | "auto_inval_data"
        | "no_auto_inval_data" | "splice_read" | "no_splice_read" | "splice_write"
        | "no_splice_write" | "splice_move" | "no_splice_move" => {
            "an option of the old C virtiofsd; fusebox negotiates this with the guest itself"
        }
        _ => return None,
    })
}

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
    /// `debug` (the old C daemon's): -d.
    Debug,
    /// `announce_submounts`, `no_announce_submounts`.
    AnnounceSubmounts(bool),
    /// `killpriv_v2`, `no_killpriv_v2`.
    KillprivV2(bool),
    /// `flock` (the default), `no_flock`: whether FLOCK_LOCKS is offered.
    Flock(bool),
    /// `posix_lock` (the default), `no_posix_lock`: POSIX_LOCKS.
    PosixLock(bool),
    /// `readdirplus` (the default), `no_readdirplus`: --no-readdirplus.
    Readdirplus(bool),
    /// `allow_direct_io` (the default), `no_allow_direct_io`: whether
    /// O_DIRECT reaches the host open.
    DirectIo(bool),
    /// `security_label` (--security-label=always), `no_security_label`
    /// (the default).
    SecurityLabel(bool),
    /// `modcaps=LIST` (as written): --modcaps.
    ModCaps(String, crate::caps::ModCaps),
    /// `xattrmap=RULES`: --xattrmap.
    Xattrmap(Box<XattrMap>),
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
    if let Some(why) = refused(name) {
        return Err(unsupported(name, why));
    }
    let Some(value) = value else {
        return flag(name);
    };
    // A flag given a value (even an empty one) is told so first.
    match flag(name) {
        Ok(_) => {
            return Err(CompatError::TakesNoValue {
                name: name.into(),
                value: lossy(value),
            })
        }
        Err(CompatError::MissingValue(_)) => {}
        Err(e) => return Err(e),
    }
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
        "xattrmap" => Sub::Xattrmap(Box::new(
            std::str::from_utf8(value)
                .map_err(CompatError::XattrmapText)?
                .parse::<XattrMap>()
                .map_err(CompatError::Xattrmap)?,
        )),
        "modcaps" => {
            let text = std::str::from_utf8(value).map_err(CompatError::ModcapsText)?;
            Sub::ModCaps(text.into(), text.parse().map_err(CompatError::Modcaps)?)
        }
        "log_level" | "loglevel" => Sub::LogLevel(match value {
            b"err" => LogLevel::Error,
            b"warn" => LogLevel::Warn,
            b"info" => LogLevel::Info,
            b"debug" => LogLevel::Debug,
            _ => return Err(bad("err, warn, info or debug")),
        }),
        _ => return Err(CompatError::Unknown(name.into())),
    })
}

/// A suboption without `=`: a flag, or MissingValue for a suboption that
/// takes a value, or Unknown.
fn flag(name: &str) -> Result<Sub, CompatError> {
    Ok(match name {
        "xattr" => Sub::Xattr(true),
        "no_xattr" => Sub::Xattr(false),
        "flock" => Sub::Flock(true),
        "no_flock" => Sub::Flock(false),
        "posix_lock" => Sub::PosixLock(true),
        "no_posix_lock" => Sub::PosixLock(false),
        "posix_acl" => Sub::PosixAcl(AclMode::Always),
        "no_posix_acl" => Sub::PosixAcl(AclMode::Never),
        "readdirplus" => Sub::Readdirplus(true),
        "no_readdirplus" => Sub::Readdirplus(false),
        "writeback" => Sub::Writeback(true),
        "no_writeback" => Sub::Writeback(false),
        "announce_submounts" => Sub::AnnounceSubmounts(true),
        "no_announce_submounts" => Sub::AnnounceSubmounts(false),
        "killpriv_v2" => Sub::KillprivV2(true),
        "no_killpriv_v2" => Sub::KillprivV2(false),
        "allow_direct_io" => Sub::DirectIo(true),
        "no_allow_direct_io" => Sub::DirectIo(false),
        "security_label" => Sub::SecurityLabel(true),
        "no_security_label" => Sub::SecurityLabel(false),
        "debug" => Sub::Debug,
        "source" | "cache" | "sandbox" | "log_level" | "loglevel" | "xattrmap" | "modcaps" => {
            return Err(CompatError::MissingValue(name.into()))
        }
        _ => return Err(CompatError::Unknown(name.into())),
    })
}

/// What the deprecation notice says of a suboption.
enum Instead {
    /// The separate option it stands for.
    Opt(String),
    /// Needs no option: fusebox's default.
    Default(&'static str),
    /// Has no separate option (keep it in `-o`).
    OnlyHere(&'static str),
}

/// The deprecation notice's word on `sub`.
fn instead(sub: &Sub) -> Instead {
    fn v(x: &impl clap::ValueEnum) -> String {
        x.to_possible_value()
            .map(|p| p.get_name().to_string())
            .unwrap_or_default()
    }
    use Instead::{Default, OnlyHere, Opt};
    match sub {
        Sub::Source(p) => Opt(format!("--shared-dir {}", p.display())),
        Sub::Cache(c) => Opt(format!("--cache {}", v(c))),
        Sub::Sandbox(s) => Opt(format!("--sandbox {}", v(s))),
        Sub::Xattrmap(_) => Opt("--xattrmap RULES".into()),
        Sub::Xattr(true) => Opt("--xattr".into()),
        Sub::Xattr(false) => Opt("no --xattr".into()),
        Sub::PosixAcl(m) => Opt(format!("--posix-acl={}", v(m))),
        Sub::Writeback(true) => Opt("--writeback".into()),
        Sub::Writeback(false) => Opt("no --writeback".into()),
        Sub::LogLevel(l) => Opt(format!("--log-level {}", v(l))),
        Sub::Debug => Opt("--log-level debug".into()),
        Sub::AnnounceSubmounts(true) => Opt("--announce-submounts".into()),
        Sub::AnnounceSubmounts(false) => Opt("--no-announce-submounts".into()),
        Sub::KillprivV2(true) => Opt("--killpriv-v2".into()),
        Sub::KillprivV2(false) => Opt("--no-killpriv-v2".into()),
        Sub::Readdirplus(false) => Opt("--no-readdirplus".into()),
        Sub::Readdirplus(true) => Default("readdirplus"),
        Sub::Flock(true) => Default("flock"),
        Sub::PosixLock(true) => Default("posix_lock"),
        Sub::DirectIo(true) => Default("allow_direct_io"),
        Sub::SecurityLabel(false) => Default("no_security_label"),
        Sub::SecurityLabel(true) => Opt("--security-label".into()),
        Sub::ModCaps(text, _) => Opt(format!("--modcaps={text}")),
        Sub::Flock(false) => OnlyHere("no_flock"),
        Sub::PosixLock(false) => OnlyHere("no_posix_lock"),
        Sub::DirectIo(false) => OnlyHere("no_allow_direct_io"),
    }
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

/// The ID translations of --translate-uid and --translate-gid (each
/// mapping was checked by clap; here they must fit together, as virtiofsd
/// checks when it starts serving).
fn translations(a: &mut VhostArgs) -> Result<(), CompatError> {
    let build =
        |opt, maps: &[_]| IdMap::new(maps).map_err(|source| CompatError::Translate { opt, source });
    a.uids = build("--translate-uid", &a.translate_uid)?;
    a.gids = build("--translate-gid", &a.translate_gid)?;
    Ok(())
}

/// Applies `-d`, `-f`, `--socket` and every `-o` to `a`, and builds the ID
/// translations; `root`: whether the daemon runs as root (KILLPRIV_V2
/// depends on it).
pub fn resolve(a: &mut VhostArgs, m: &ArgMatches, root: bool) -> Result<(), CompatError> {
    translations(a)?;
    let mut g = Given {
        m,
        by: HashMap::new(),
    };
    g.record("shared_dir", &[("shared_dir", "--shared-dir")]);
    g.record("cache", &[("cache", "--cache")]);
    g.record("sandbox", &[("sandbox", "--sandbox")]);
    g.record("xattr", &[("xattr", "--xattr")]);
    g.record("posix_acl", &[("posix_acl", "--posix-acl")]);
    g.record("security_label", &[("security_label", "--security-label")]);
    g.record("modcaps", &[("modcaps", "--modcaps")]);
    g.record("writeback", &[("writeback", "--writeback")]);
    g.record("log_level", &[("log_level", "--log-level")]);
    g.record("readdirplus", &[("no_readdirplus", "--no-readdirplus")]);
    g.record("direct_io", &[("allow_direct_io", "--allow-direct-io")]);
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
    // KILLPRIV_V2 as asked for (None: fusebox's default), and how.
    let mut killpriv = if a.virtiofsd.killpriv_v2 {
        Some(true)
    } else if a.virtiofsd.no_killpriv_v2 {
        Some(false)
    } else {
        None
    };
    let mut killpriv_by = String::from("--killpriv-v2");
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
        let mut opt = Vec::new();
        let mut default = Vec::new();
        let mut only_here = Vec::new();
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
                Sub::Debug => g.set("log_level", &mut a.log_level, LogLevel::Debug, &what)?,
                Sub::AnnounceSubmounts(on) => {
                    g.set("announce_submounts", &mut a.announce_submounts, *on, &what)?;
                    a.no_announce_submounts = !on;
                }
                Sub::KillprivV2(on) => {
                    g.set("killpriv_v2", &mut killpriv, Some(*on), &what)?;
                    killpriv_by = what.clone();
                }
                Sub::Readdirplus(on) => {
                    g.set("readdirplus", &mut a.virtiofsd.no_readdirplus, !on, &what)?
                }
                Sub::DirectIo(on) => g.set("direct_io", &mut a.no_direct_io, !on, &what)?,
                Sub::Flock(on) => a.no_flock = !on,
                Sub::PosixLock(on) => a.no_posix_lock = !on,
                Sub::SecurityLabel(on) => {
                    let mode = if *on { AclMode::Always } else { AclMode::Never };
                    g.set("security_label", &mut a.security_label, mode, &what)?
                }
                Sub::ModCaps(_, m) => g.set("modcaps", &mut a.modcaps, Some(*m), &what)?,
                Sub::Xattrmap(m) => g.set(
                    "xattrmap",
                    &mut a.virtiofsd.xattrmap,
                    Some((**m).clone()),
                    &what,
                )?,
            }
            match instead(&sub) {
                Instead::Opt(o) => opt.push(o),
                Instead::Default(n) => default.push(n),
                Instead::OnlyHere(n) => only_here.push(n),
            }
        }
        let mut notice = format!(
            "-o is deprecated, use the separate options: -o {}",
            opts.to_string_lossy()
        );
        if !opt.is_empty() {
            notice.push_str(&format!(" means {}", opt.join(" ")));
        }
        if !default.is_empty() {
            notice.push_str(&format!(
                "; {} need no option (fusebox's default)",
                default.join(", ")
            ));
        }
        if !only_here.is_empty() {
            notice.push_str(&format!(
                "; {} have no separate option",
                only_here.join(", ")
            ));
        }
        a.notices.push(notice);
    }
    // What the last word on each asked for (a later item overrides an
    // earlier one, so these are checked once every -o is read).
    if killpriv == Some(true) && !root {
        return Err(CompatError::Unsupported {
            opt: killpriv_by,
            why: WHY_KILLPRIV_USER,
        });
    }
    a.virtiofsd.killpriv_v2 = killpriv == Some(true);
    a.virtiofsd.no_killpriv_v2 = killpriv == Some(false);
    if a.shared_dir.is_none() && !a.print_capabilities {
        return Err(CompatError::NoSharedDir);
    }
    Ok(())
}

/// With --print-capabilities only a malformed or unknown `-o` item stops
/// the output, as with virtiofsd, which prints whatever else it is given
/// (libvirt asks with no other option).
fn check_syntax(a: &VhostArgs) -> Result<(), CompatError> {
    for opts in &a.compat_options {
        for item in split(opts.as_bytes())? {
            match parse_item(&item) {
                Ok(_) | Err(CompatError::Unsupported { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// The command line (`argv[0]` first) to the options in force.
pub fn parse<I, T>(argv: I, root: bool) -> Result<Cli, ArgsError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let m = Cli::command().try_get_matches_from(argv)?;
    let mut cli = Cli::from_arg_matches(&m)?;
    if cli.cmd.is_none() {
        if cli.vhost.print_capabilities {
            check_syntax(&cli.vhost)?;
        } else {
            resolve(&mut cli.vhost, &m, root)?;
        }
    }
    Ok(cli)
}

#[cfg(test)]
#[path = "compat_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "compat_suboption_tests.rs"]
mod suboption_tests;

#[cfg(test)]
#[path = "compat_translate_tests.rs"]
mod translate_tests;
