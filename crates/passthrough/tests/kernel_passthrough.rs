//! Kernel FUSE passthrough on a real /dev/fuse mount served in-process:
//! the kernel does the data I/O of open files on the host files, the
//! daemon sees none of it, backing ids live exactly as long as the opens,
//! and a write keeps the rules a local write follows (setuid cleared).
//! Needs root (mount, CAP_SYS_ADMIN for the backing ioctl).

use fuse_core::server::{serve_device, Dispatcher, ServerConfig};
use host_mount::devfuse::{unmount, DevFuse, MountOptions};
use passthrough::{Config, PassthroughFs};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Mount {
    base: PathBuf,
    mnt: PathBuf,
    disp: Arc<Dispatcher<PassthroughFs>>,
    workers: Vec<std::thread::JoinHandle<()>>,
    extra: Vec<PathBuf>,
}

impl Mount {
    /// Serves `share` (made by `prepare` under a fresh base directory).
    fn new(tag: &str, prepare: impl FnOnce(&Path) -> (PathBuf, Vec<PathBuf>)) -> Mount {
        let base = std::env::temp_dir().join(format!("fusebox-kp-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("mnt")).unwrap();
        let (share, extra) = prepare(&base);
        let fs = PassthroughFs::new(
            &share,
            Config {
                kernel_passthrough: true,
                ..Config::default()
            },
        )
        .unwrap();
        let disp = Arc::new(Dispatcher::new(fs, ServerConfig::default()));
        let mnt = base.join("mnt");
        let dev = DevFuse::mount(&mnt, &MountOptions::default()).unwrap();
        assert!(disp.fs().attach_device(dev.clone()));
        let workers = serve_device(dev, disp.clone(), 2);
        Mount {
            base,
            mnt,
            disp,
            workers,
            extra,
        }
    }

    fn plain(tag: &str) -> Mount {
        Mount::new(tag, |base| {
            let share = base.join("share");
            std::fs::create_dir_all(&share).unwrap();
            (share, Vec::new())
        })
    }

    fn fs(&self) -> &PassthroughFs {
        self.disp.fs()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.mnt.join(name)
    }

    fn daemon_data_ops(&self) -> u64 {
        let c = self.fs().io_counts();
        c.read_uring + c.read_syscall + c.write_uring + c.write_syscall
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = unmount(&self.mnt, true);
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        for m in self.extra.iter().rev() {
            let _ = unmount(m, true);
        }
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

fn wait(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(10), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn reads_writes_and_maps_of_open_files_never_reach_the_daemon() {
    let m = Mount::plain("io");
    let data = pattern(1 << 20, 7);
    std::fs::write(m.path("f"), &data).unwrap();
    assert!(m.fs().kernel_passthrough(), "FUSE_PASSTHROUGH not in force");
    let share_file = m.base.join("share/f");
    assert_eq!(std::fs::read(&share_file).unwrap(), data);

    // Two opens of one inode share one backing file.
    let mut a = std::fs::File::open(m.path("f")).unwrap();
    let mut b = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(m.path("f"))
        .unwrap();
    assert_eq!(m.fs().backing_ids_open(), 1);
    let mut got = Vec::new();
    a.read_to_end(&mut got).unwrap();
    assert_eq!(got, data);
    // An O_DIRECT write through the second open, seen by the first and on
    // the host.
    let mut page = vec![0u8; 8192];
    let off = (page.as_ptr() as usize).next_multiple_of(4096) - page.as_ptr() as usize;
    page[off..off + 4096].fill(0xAB);
    b.seek(SeekFrom::Start(4096)).unwrap();
    b.write_all(&page[off..off + 4096]).unwrap();
    let mut back = [0u8; 4096];
    a.seek(SeekFrom::Start(4096)).unwrap();
    a.read_exact(&mut back).unwrap();
    assert!(back.iter().all(|&x| x == 0xAB));
    let host = std::fs::read(&share_file).unwrap();
    assert!(host[4096..8192].iter().all(|&x| x == 0xAB));

    // A shared writable mapping writes the host file.
    {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(m.path("f"))
            .unwrap();
        // SAFETY: a fresh shared mapping of one page of an open file of at
        // least that size, unmapped below before anything else uses it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: `p` maps 4096 writable bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(b"mapped".as_ptr(), p.cast::<u8>(), 6);
            assert_eq!(libc::msync(p, 4096, libc::MS_SYNC), 0);
            libc::munmap(p, 4096);
        }
    }
    assert_eq!(&std::fs::read(&share_file).unwrap()[..6], b"mapped");
    assert_eq!(
        m.daemon_data_ops(),
        0,
        "the daemon served data of a passthrough file"
    );

    // O_TRUNC is the daemon's open's work: the kernel's own open of the
    // backing file never truncates.
    let mut t = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(m.path("f"))
        .unwrap();
    assert_eq!(std::fs::metadata(&share_file).unwrap().len(), 0);
    t.write_all(b"short").unwrap();
    drop((a, b, t));
    assert_eq!(std::fs::read(&share_file).unwrap(), b"short");
    // The last RELEASE closes the backing id (RELEASE is asynchronous).
    wait("the backing id to be closed", || {
        m.fs().backing_ids_open() == 0
    });
    assert_eq!(m.fs().handle_count(), 0);
}

#[test]
fn a_users_write_clears_setuid_as_a_local_write_does() {
    let m = Mount::plain("suid");
    let share_file = m.base.join("share/prog");
    std::fs::write(&share_file, b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&share_file, std::fs::Permissions::from_mode(0o4777)).unwrap();
    let path = m.path("prog");
    // A thread with another fsuid has no CAP_FSETID: a local write of
    // such a caller clears setuid.
    as_nobody(move || {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(b"echo owned\n").unwrap();
    });
    assert!(m.fs().kernel_passthrough());
    assert_eq!(m.daemon_data_ops(), 0, "the write did not pass through");
    let mode = std::fs::metadata(&share_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o777, "setuid survived a user's write");
}

/// Runs `f` on a thread whose fsuid and fsgid are 65534 (so without the
/// file-system capabilities).
fn as_nobody<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: setfsuid/setfsgid change only this thread's credentials.
        unsafe {
            libc::setfsgid(65534);
            libc::setfsuid(65534);
        }
        f()
    })
    .join()
    .unwrap()
}

/// Mounts `what` (a `mount` argument list) on `base/share`, made world
/// writable.
fn mounted_share(base: &Path, args: &[&str]) -> (PathBuf, Vec<PathBuf>) {
    let share = base.join("share");
    std::fs::create_dir_all(&share).unwrap();
    let st = Command::new("mount")
        .args(args)
        .arg(&share)
        .status()
        .unwrap();
    assert!(st.success(), "mount {args:?}");
    std::fs::set_permissions(&share, std::fs::Permissions::from_mode(0o777)).unwrap();
    (share.clone(), vec![share])
}

fn statvfs(p: &Path) -> libc::statvfs {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a zeroed statvfs is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a valid out-pointer.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    st
}

#[test]
fn a_user_cannot_write_into_root_reserved_blocks() {
    // Half of this ext4 is reserved for root (resuid 0). A local write by
    // an ordinary user stops at the other half; passthrough writes must
    // too, so the kernel must not do them as fsuid 0.
    let m = Mount::new("reserved", |base| {
        let img = base.join("img");
        let f = std::fs::File::create(&img).unwrap();
        f.set_len(64 << 20).unwrap();
        let st = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "50"])
            .arg(&img)
            .status()
            .unwrap();
        assert!(st.success(), "mkfs.ext4");
        mounted_share(base, &["-o", "loop", img.to_str().unwrap()])
    });
    let v = statvfs(&m.base.join("share"));
    let for_users = v.f_bavail * v.f_frsize;
    let path = m.path("fill");
    let written = as_nobody(move || {
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0x5Au8; 1 << 20];
        let mut n = 0u64;
        while let Ok(k) = f.write(&chunk) {
            if k == 0 {
                break;
            }
            n += k as u64;
        }
        n
    });
    assert!(m.fs().kernel_passthrough());
    assert_eq!(m.daemon_data_ops(), 0, "the writes did not pass through");
    assert!(
        written <= for_users + (1 << 20),
        "a user wrote {written} bytes where {for_users} were free for users"
    );
}

#[test]
fn the_last_close_lets_the_host_file_go() {
    // A backing id pins its file: after the last close and an unlink the
    // host filesystem must get the space back, which it only does if the
    // id was really closed.
    let m = Mount::new("close", |base| {
        mounted_share(base, &["-t", "tmpfs", "-o", "size=64m", "fusebox-kp"])
    });
    let share = m.base.join("share");
    let before = statvfs(&share).f_bfree;
    std::fs::write(m.path("big"), pattern(16 << 20, 1)).unwrap();
    let held = std::fs::File::open(m.path("big")).unwrap();
    assert_eq!(m.fs().backing_ids_open(), 1);
    assert!(statvfs(&share).f_bfree < before);
    std::fs::remove_file(m.path("big")).unwrap();
    drop(held);
    wait("the backing id to be closed", || {
        m.fs().backing_ids_open() == 0
    });
    wait("tmpfs to free the unlinked file", || {
        statvfs(&share).f_bfree >= before
    });
    assert_eq!(m.daemon_data_ops(), 0);
}

#[test]
fn append_only_files_are_served_by_the_daemon() {
    // The kernel takes the flags of an asynchronous passthrough write from
    // the client's file, whose O_APPEND the caller may clear: an
    // append-only host file must never become a backing file.
    let m = Mount::plain("append");
    let host = m.base.join("share/log");
    std::fs::write(&host, b"AAAA").unwrap();
    let st = Command::new("chattr")
        .arg("+a")
        .arg(&host)
        .status()
        .unwrap();
    assert!(st.success(), "chattr +a");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(m.path("log"))
        .unwrap();
    f.write_all(b"BB").unwrap();
    assert_eq!(m.fs().backing_ids_open(), 0);
    assert!(
        m.daemon_data_ops() > 0,
        "the write did not reach the daemon"
    );
    drop(f);
    let _ = Command::new("chattr").arg("-a").arg(&host).status();
    assert_eq!(std::fs::read(&host).unwrap(), b"AAAABB");
}

#[test]
fn files_on_a_stacking_filesystem_are_served_by_the_daemon() {
    // The share is an overlayfs: not a local leaf filesystem (and one the
    // kernel would refuse with ELOOP at depth 1), so the opens of its
    // files are served as without passthrough.
    let m = Mount::new("overlay", |base| {
        for d in ["lower", "upper", "work", "share"] {
            std::fs::create_dir_all(base.join(d)).unwrap();
        }
        std::fs::write(base.join("lower/f"), pattern(65536, 3)).unwrap();
        let share = base.join("share");
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            base.join("lower").display(),
            base.join("upper").display(),
            base.join("work").display()
        );
        let st = Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &opts])
            .arg(&share)
            .status()
            .unwrap();
        assert!(st.success(), "mounting overlayfs");
        (share.clone(), vec![share])
    });
    assert_eq!(std::fs::read(m.path("f")).unwrap(), pattern(65536, 3));
    std::fs::write(m.path("g"), b"new").unwrap();
    assert_eq!(std::fs::read(m.path("g")).unwrap(), b"new");
    assert!(m.daemon_data_ops() > 0, "the daemon served no data");
    assert_eq!(m.fs().backing_ids_open(), 0);
    // Still in force for the connection: only these files fell back.
    assert!(m.fs().kernel_passthrough());
}
