//! cargo-fuzz target: the passthrough's migration state load must end in
//! success or a `StateError`, never a panic, whatever the stream.
//! Destinations serve a directory made for the run (files, a subdirectory,
//! a symlink), one fresh per input.
#![no_main]
use fuse_core::server::Filesystem;
use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;
use std::sync::OnceLock;
use passthrough::{
    Config, MigrationConfig, MigrationMode, MigrationOnError, PassthroughFs,
};

fn share() -> &'static PathBuf {
    static SHARE: OnceLock<PathBuf> = OnceLock::new();
    SHARE.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("fusebox-fuzz-state-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("d")).unwrap();
        std::fs::write(dir.join("a"), b"a").unwrap();
        std::fs::write(dir.join("d/b"), b"b").unwrap();
        let _ = std::os::unix::fs::symlink("a", dir.join("l"));
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    // The first byte picks the destination's migration options, the rest
    // is the stream.
    let Some((&sel, state)) = data.split_first() else { return };
    let migration = MigrationConfig {
        mode: if sel & 1 != 0 {
            MigrationMode::FileHandles
        } else {
            MigrationMode::FindPaths
        },
        on_error: if sel & 2 != 0 {
            MigrationOnError::GuestError
        } else {
            MigrationOnError::Abort
        },
        verify_handles: sel & 4 != 0,
    };
    let cfg = Config {
        migration,
        ..Config::default()
    };
    let fs = PassthroughFs::new(share(), cfg).expect("the fuzz share");
    let _ = fs.load_state(state);
});
