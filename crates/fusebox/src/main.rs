//! `fusebox`: serve a host directory over FUSE.

mod host;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = host::Cli::parse();
    match host::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fusebox: {e}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                eprintln!("  caused by: {s}");
                src = s.source();
            }
            std::process::ExitCode::FAILURE
        }
    }
}
