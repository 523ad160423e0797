//! `fusebox`: share a host directory with a VM as a vhost-user-fs device,
//! or serve it to the host kernel over FUSE.

mod allocator;
mod caps;
mod cli;
mod compat;
mod host;
mod logging;
mod rlimit;
mod sandbox;
mod seccomp;
mod signals;
mod userns;
mod vhost;

/// Says why the daemon stops: on stderr, whatever the log's destination
/// (a start error may come before the log is set up), and in the log too
/// when that is syslog.
fn report(e: &dyn std::error::Error) {
    let mut msg = format!("{e}");
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(&format!("\n  caused by: {s}"));
        src = s.source();
    }
    eprintln!("fusebox: {msg}");
    if logging::to_syslog() {
        log::error!("{msg}");
    }
}

fn main() -> std::process::ExitCode {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let cli = match compat::parse(std::env::args_os(), root) {
        Ok(c) => c,
        Err(compat::ArgsError::Usage(e)) => e.exit(),
        Err(compat::ArgsError::Compat(e)) => {
            report(&e);
            // As clap's usage errors.
            return std::process::ExitCode::from(2);
        }
    };
    let r = match cli.cmd {
        Some(cli::Cmd::Mount(a)) => host::run(a).map_err(|e| report(&e)),
        None => vhost::run(cli.vhost).map_err(|e| report(&e)),
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(()) => std::process::ExitCode::FAILURE,
    }
}
