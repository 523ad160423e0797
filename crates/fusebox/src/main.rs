//! `fusebox`: share a host directory with a VM as a vhost-user-fs device,
//! or serve it to the host kernel over FUSE.

mod cli;
mod host;
mod log;
mod rlimit;
mod sandbox;
mod seccomp;
mod signals;
mod vhost;

use clap::Parser;

fn report(e: &dyn std::error::Error) {
    eprintln!("fusebox: {e}");
    let mut src = e.source();
    while let Some(s) = src {
        eprintln!("  caused by: {s}");
        src = s.source();
    }
}

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    let r = match cli.cmd {
        Some(cli::Cmd::Mount(a)) => host::run(a).map_err(|e| report(&e)),
        None => vhost::run(cli.vhost).map_err(|e| report(&e)),
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(()) => std::process::ExitCode::FAILURE,
    }
}
