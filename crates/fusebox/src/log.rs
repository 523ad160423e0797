//! Log lines to stderr or syslog, filtered by --log-level.

use crate::cli::LogLevel;
use std::sync::OnceLock;

static SINK: OnceLock<(LogLevel, bool)> = OnceLock::new();

/// Sets the level and the destination (once; later calls are ignored).
pub fn init(level: LogLevel, syslog: bool) {
    if syslog {
        // Connected now (LOG_NDELAY): a sandbox cannot reach /dev/log later.
        // SAFETY: the ident is a static NUL-terminated string that lives
        // for the whole process, as openlog requires.
        unsafe {
            libc::openlog(
                c"fusebox".as_ptr(),
                libc::LOG_PID | libc::LOG_NDELAY,
                libc::LOG_DAEMON,
            )
        };
    }
    let _ = SINK.set((level, syslog));
}

/// Logs `msg` at `level`.
pub fn log(level: LogLevel, msg: &str) {
    let (max, syslog) = SINK.get().copied().unwrap_or((LogLevel::Info, false));
    if level > max || level == LogLevel::Off {
        return;
    }
    if syslog {
        let prio = match level {
            LogLevel::Error => libc::LOG_ERR,
            LogLevel::Warn => libc::LOG_WARNING,
            LogLevel::Info => libc::LOG_INFO,
            _ => libc::LOG_DEBUG,
        };
        for line in msg.lines() {
            let Ok(c) = std::ffi::CString::new(line) else {
                continue;
            };
            // SAFETY: both strings are NUL-terminated and outlive the call;
            // the format consumes exactly one string argument.
            unsafe { libc::syslog(prio, c"%s".as_ptr(), c.as_ptr()) };
        }
    } else {
        for line in msg.lines() {
            eprintln!("fusebox: {line}");
        }
    }
}

/// Logs at info.
pub fn info(msg: &str) {
    log(LogLevel::Info, msg);
}

/// Logs at warn.
pub fn warn(msg: &str) {
    log(LogLevel::Warn, msg);
}

/// Logs at error.
pub fn error(msg: &str) {
    log(LogLevel::Error, msg);
}
