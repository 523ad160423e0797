//! The daemon's allocator: mimalloc rather than glibc's malloc. A batch
//! of requests allocates and frees more blocks of one size than glibc's
//! per-thread cache holds, and the rest took its slow path
//! (docs/BENCHMARKS.md, "fifth steps"). Its arenas are committed on
//! demand, so memory a burst of requests freed goes back to the system:
//! eagerly committed (mimalloc's default), it stayed resident, about 16 MB
//! more than glibc's malloc with every queue full (benches/rss.sh).

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

extern "C" {
    /// mimalloc's option setter (in the library the `mimalloc` crate
    /// links).
    fn mi_option_set(option: libc::c_int, value: libc::c_long);
    /// mimalloc's option getter.
    #[cfg(test)]
    fn mi_option_get(option: libc::c_int) -> libc::c_long;
}

/// `mi_option_arena_eager_commit` in mimalloc v3's `mi_option_e` (its
/// fifth member; the version is the one Cargo.lock pins: the test below
/// trips if the enum moves).
const MI_OPTION_ARENA_EAGER_COMMIT: libc::c_int = 4;

/// Run by the loader before `main`, so before the Rust runtime's first
/// allocation, which makes mimalloc's first arena (an option set in
/// `main` comes too late for it).
#[used]
#[link_section = ".init_array"]
static MIMALLOC_OPTIONS: extern "C" fn() = mimalloc_options;

extern "C" fn mimalloc_options() {
    // SAFETY: sets one of mimalloc's options; any value is allowed.
    unsafe { mi_option_set(MI_OPTION_ARENA_EAGER_COMMIT, 0) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `mi_option_purge_delay` in v3's enum, and its default (ms) there.
    const MI_OPTION_PURGE_DELAY: libc::c_int = 15;

    #[test]
    fn arenas_are_committed_on_demand_from_the_start() {
        // SAFETY: reads options; any index of the enum is valid.
        let (eager, purge) = unsafe {
            (
                mi_option_get(MI_OPTION_ARENA_EAGER_COMMIT),
                mi_option_get(MI_OPTION_PURGE_DELAY),
            )
        };
        // The loader ran the setter in this test binary too.
        assert_eq!(eager, 0);
        // The enum is laid out as the index above assumes (a default
        // read where v3 keeps purge_delay).
        assert_eq!(
            purge, 1000,
            "mimalloc's option enum moved: recheck the index"
        );
    }
}
