use super::*;
use std::io::Write;
use std::os::fd::AsRawFd;

const PAGES: usize = 4;

/// A file of `PAGES` pages where byte i is i * 7 (mod 251), open
/// read-write, in the system's temporary directory.
fn pattern_file() -> (std::fs::File, std::path::PathBuf, Vec<u8>) {
    let path = std::env::temp_dir().join(format!(
        "host-io-mapped-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let data: Vec<u8> = (0..PAGES * PAGE as usize)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    f.write_all(&data).unwrap();
    (f, path, data)
}

fn iov(buf: &mut [u8]) -> libc::iovec {
    libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    }
}

/// Waits for child `pid`, which must have died of SIGBUS.
fn assert_killed_by_sigbus(pid: libc::pid_t) {
    let mut status = 0;
    // SAFETY: waits for a child of this process.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFSIGNALED(status), "status {status:#x}");
    assert_eq!(libc::WTERMSIG(status), libc::SIGBUS);
}

#[test]
fn copies_into_each_iovec_in_order() {
    let (f, path, data) = pattern_file();
    let m = FileMap::new(f.as_raw_fd(), data.len() as u64).unwrap();
    assert_eq!(m.len(), data.len());
    let (mut a, mut b) = (vec![0u8; 100], vec![0u8; 3000]);
    // SAFETY: two iovecs over local buffers nothing else borrows meanwhile.
    let r = unsafe { m.read_into(1000, &[iov(&mut a), iov(&mut b)]) };
    assert_eq!(r, MapRead::Done(3100));
    assert_eq!(a, data[1000..1100]);
    assert_eq!(b, data[1100..4100]);
    std::fs::remove_file(path).unwrap();
}

#[test]
fn a_read_that_reaches_the_last_page_is_left_to_the_caller() {
    let (f, path, data) = pattern_file();
    let m = FileMap::new(f.as_raw_fd(), data.len() as u64).unwrap();
    let mut buf = vec![0u8; PAGE as usize];
    let last = (PAGES as u64 - 1) * PAGE;
    // SAFETY: one iovec over a local buffer.
    unsafe {
        // Ends in the page before the last: the last page is the probe.
        assert_eq!(
            m.read_into(last - PAGE, &[iov(&mut buf)]),
            MapRead::Done(4096)
        );
        // In the last page: no page after it to prove the file goes on.
        assert_eq!(m.read_into(last, &[iov(&mut buf)]), MapRead::Outside);
        assert_eq!(m.read_into(last - 1, &[iov(&mut buf)]), MapRead::Outside);
        assert_eq!(
            m.read_into(u64::MAX - 10, &[iov(&mut buf)]),
            MapRead::Outside
        );
        assert_eq!(m.read_into(0, &[iov(&mut buf[..0])]), MapRead::Outside);
    }
    std::fs::remove_file(path).unwrap();
}

#[test]
fn a_truncation_on_the_host_fails_the_read_and_does_not_kill() {
    let (f, path, data) = pattern_file();
    let m = FileMap::new(f.as_raw_fd(), data.len() as u64).unwrap();
    let mut buf = vec![0u8; 512];
    // Cut to the middle of page 1: page 2 and on are gone.
    f.set_len(PAGE + 100).unwrap();
    // SAFETY: one iovec over a local buffer.
    unsafe {
        // Page 2 itself: the copy's source faults (the probe first).
        assert_eq!(m.read_into(2 * PAGE, &[iov(&mut buf)]), MapRead::Fault);
        // In page 1, wholly before the new end: its probe (page 2)
        // faults, so no zeros are passed off as data.
        assert_eq!(m.read_into(PAGE, &[iov(&mut buf[..50])]), MapRead::Fault);
        // Page 0: the file still goes on past it.
        assert_eq!(m.read_into(0, &[iov(&mut buf)]), MapRead::Done(512));
    }
    assert_eq!(buf, data[..512]);
    // It keeps working after faults.
    f.set_len(data.len() as u64).unwrap();
    // SAFETY: as above.
    let r = unsafe { m.read_into(PAGE, &[iov(&mut buf)]) };
    assert_eq!(r, MapRead::Done(512));
    assert_eq!(&buf[..100], &data[PAGE as usize..PAGE as usize + 100]);
    assert!(
        buf[100..].iter().all(|&b| b == 0),
        "the cut tail reads as a hole"
    );
    std::fs::remove_file(path).unwrap();
}

#[test]
fn a_destination_that_faults_fails_the_read() {
    let (f, path, data) = pattern_file();
    let m = FileMap::new(f.as_raw_fd(), data.len() as u64).unwrap();
    // A destination whose memory goes: a shared mapping of a memfd that
    // is then truncated to nothing.
    // SAFETY: a new memfd; its fd is owned below.
    let mfd = unsafe { libc::memfd_create(c"dst".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(mfd >= 0);
    // SAFETY: `mfd` was just created and is owned by nothing else.
    let mfd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(mfd) };
    let mf = std::fs::File::from(mfd);
    mf.set_len(PAGE).unwrap();
    // SAFETY: a writable shared mapping of the same memfd, unmapped below.
    let w = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            mf.as_raw_fd(),
            0,
        )
    };
    assert_ne!(w, libc::MAP_FAILED);
    mf.set_len(0).unwrap();
    let v = libc::iovec {
        iov_base: w,
        iov_len: 100,
    };
    // SAFETY: `w` is mapped and no Rust reference points into it; its
    // pages are past the memfd's end (the point of the test).
    assert_eq!(unsafe { m.read_into(0, &[v]) }, MapRead::Fault);
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(w, PAGE as usize) };
    std::fs::remove_file(path).unwrap();
}

#[test]
fn a_sigbus_outside_the_copy_still_kills() {
    let (f, path, data) = pattern_file();
    let m = FileMap::new(f.as_raw_fd(), data.len() as u64).unwrap();
    f.set_len(0).unwrap();
    let p = m.base.as_ptr();
    // SAFETY: the child only reads the mapping (raising SIGBUS) and
    // _exits: nothing that needs a lock another thread may hold.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: `p` is mapped; the file under it is gone, so the read
        // raises SIGBUS outside the copy routine.
        unsafe {
            std::ptr::read_volatile(p);
            libc::_exit(0);
        }
    }
    assert_killed_by_sigbus(pid);
    std::fs::remove_file(path).unwrap();
}

#[test]
fn a_sent_sigbus_still_kills() {
    let (f, path, data) = pattern_file();
    let m = FileMap::new(f.as_raw_fd(), data.len() as u64).unwrap();
    f.set_len(0).unwrap();
    // SAFETY: the child only reads the mapping through the copy routine,
    // sends itself SIGBUS and _exits: nothing that needs a lock another
    // thread may hold.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let mut b = [0u8; 8];
        // SAFETY: as in the tests above; then a signal to itself, which
        // must kill as it would without the handler (exit 3: it did not;
        // 4: the fence did not hold before it).
        unsafe {
            if m.read_into(0, &[iov(&mut b)]) != MapRead::Fault {
                libc::_exit(4);
            }
            libc::raise(libc::SIGBUS);
            libc::_exit(3);
        }
    }
    assert_killed_by_sigbus(pid);
    std::fs::remove_file(path).unwrap();
}

#[test]
fn cachestat_counts_the_cached_pages() {
    let (f, path, data) = pattern_file();
    let st = cachestat(f.as_raw_fd(), 0, 0).unwrap();
    assert_eq!(st.cache, (data.len() as u64) / PAGE);
    let st = cachestat(f.as_raw_fd(), PAGE, PAGE).unwrap();
    assert_eq!(st.cache, 1);
    std::fs::remove_file(path).unwrap();
}

/// A guarded shared mapping of a file truncated under it: touching a page
/// past the new end reads zeros and takes writes, instead of killing. The
/// same access to an unguarded mapping dies of SIGBUS (in a child).
#[test]
fn a_guarded_mapping_of_a_truncated_file_reads_zeros() {
    let (f, path, data) = pattern_file();
    let len = PAGES * PAGE as usize;
    let map = |f: &std::fs::File| {
        // SAFETY: a new shared mapping of the file's `len` bytes.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        p.cast::<u8>()
    };
    let p = map(&f);
    guard_mappings(&[(p as usize, len)]).unwrap();
    // SAFETY: inside the mapping; no reference is made into it.
    let before = unsafe { p.add(PAGE as usize + 1).read_volatile() };
    assert_eq!(before, data[PAGE as usize + 1]);
    f.set_len(PAGE).unwrap();
    // SAFETY: as above; the page is past the file's end now.
    unsafe {
        assert_eq!(p.add(2 * PAGE as usize + 5).read_volatile(), 0);
        p.add(2 * PAGE as usize + 5).write_volatile(9);
        assert_eq!(p.add(2 * PAGE as usize + 5).read_volatile(), 9);
        // The file's own page is still the file's.
        assert_eq!(p.add(3).read_volatile(), data[3]);
    }
    // Unguarded (another mapping), the same access kills.
    let q = map(&f);
    // SAFETY: fork in a test; the child only touches the mapping and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: the child reads past the file's end, then exits.
        unsafe {
            q.add(2 * PAGE as usize).read_volatile();
            libc::_exit(0);
        }
    }
    assert_killed_by_sigbus(pid);
    // SAFETY: the unguarded mapping made above. The guarded one stays
    // (a range stays guarded for the process's life: another test's
    // mapping must not come at its address).
    unsafe { libc::munmap(q.cast(), len) };
    let _ = std::fs::remove_file(path);
}
