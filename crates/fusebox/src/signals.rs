//! Signals are blocked in every thread before any is started, and one
//! thread takes them with sigwait: none is lost and no handler runs in
//! async-signal context.

/// Blocks `sigs` in the calling thread (and so in every thread it starts
/// afterwards); returns the set for [`wait`].
pub fn block(sigs: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: a zeroed sigset is initialised by sigemptyset before use;
    // pthread_sigmask reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in sigs {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Waits for one signal of `set`.
pub fn wait(set: &libc::sigset_t) -> libc::c_int {
    let mut sig = 0;
    // SAFETY: `set` is an initialised sigset; `sig` is a valid out-pointer.
    unsafe { libc::sigwait(set, &mut sig) };
    sig
}
