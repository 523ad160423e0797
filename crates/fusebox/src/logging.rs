//! The `log` facade's backend for the daemon: stderr (`env_logger`, each
//! line as `fusebox: …`) or syslog (the `syslog` crate, facility daemon),
//! filtered by --log-level. The libraries log through the facade too, so
//! their messages follow --syslog and --log-level.

use crate::cli::LogLevel;
use fuse_core::locks::lock;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Whether the log goes to syslog.
static SYSLOG: AtomicBool = AtomicBool::new(false);

/// Whether the log goes to syslog (else stderr, or nowhere yet).
pub fn to_syslog() -> bool {
    SYSLOG.load(Ordering::Relaxed)
}

/// The facade's level for --log-level.
fn filter(level: LogLevel) -> log::LevelFilter {
    match level {
        LogLevel::Off => log::LevelFilter::Off,
        LogLevel::Error => log::LevelFilter::Error,
        LogLevel::Warn => log::LevelFilter::Warn,
        LogLevel::Info => log::LevelFilter::Info,
        LogLevel::Debug => log::LevelFilter::Debug,
        LogLevel::Trace => log::LevelFilter::Trace,
    }
}

/// Installs the backend (once; later calls change nothing). With `syslog`,
/// the connection to /dev/log is made now: a sandbox cannot reach it
/// later. If syslog cannot be reached, the log goes to stderr and says so.
pub fn init(level: LogLevel, syslog: bool) {
    let max = filter(level);
    if syslog {
        let fmt = syslog::Formatter3164 {
            facility: syslog::Facility::LOG_DAEMON,
            hostname: None,
            process: "fusebox".into(),
            pid: std::process::id(),
        };
        match syslog::unix(fmt) {
            Ok(l) => {
                if log::set_boxed_logger(Box::new(Syslog(Mutex::new(l)))).is_ok() {
                    log::set_max_level(max);
                    SYSLOG.store(true, Ordering::Relaxed);
                }
                return;
            }
            Err(e) => {
                stderr(max);
                log::warn!("syslog: {e}; logging to stderr");
                return;
            }
        }
    }
    stderr(max);
}

/// Installs the stderr backend: each line of a message as `fusebox: line`.
fn stderr(max: log::LevelFilter) {
    let _ = env_logger::Builder::new()
        .filter_level(max)
        .target(env_logger::Target::Stderr)
        .format(|buf, rec| {
            for line in rec.args().to_string().lines() {
                writeln!(buf, "fusebox: {line}")?;
            }
            Ok(())
        })
        .try_init();
}

/// The syslog backend: one syslog message per line of a record.
struct Syslog(Mutex<syslog::Logger<syslog::LoggerBackend, syslog::Formatter3164>>);

impl log::Log for Syslog {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, rec: &log::Record<'_>) {
        if !self.enabled(rec.metadata()) {
            return;
        }
        let mut l = lock(&self.0);
        for line in rec.args().to_string().lines() {
            // A lost log line has nowhere to be reported.
            let _ = match rec.level() {
                log::Level::Error => l.err(line),
                log::Level::Warn => l.warning(line),
                log::Level::Info => l.info(line),
                log::Level::Debug | log::Level::Trace => l.debug(line),
            };
        }
    }

    fn flush(&self) {}
}
