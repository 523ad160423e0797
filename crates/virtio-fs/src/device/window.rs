//! The DAX window served (issue 34, docs/DAX.md). With
//! `DeviceConfig::cache_size` the device offers one shared memory region
//! (shmid 0, the guest's cache window) and serves the guest's
//! FUSE_SETUPMAPPING and FUSE_REMOVEMAPPING itself, on the vring thread
//! that popped them: the window's checks (`crate::dax::Window`), the
//! handle's file from the filesystem (`Filesystem::map_source`: its open
//! mode, its size), then SHMEM_MAP / SHMEM_UNMAP to the frontend on the
//! back-end channel, which maps the file into the region.

use super::*;
use crate::dax::{Mapping, Setup, Window};
use fuse_core::abi::{RemovemappingIn, RemovemappingOne, SetupmappingIn};
use fuse_core::server::Ctx;
use std::collections::HashSet;
use std::os::fd::{AsRawFd, RawFd};
use vhost::vhost_user::message::{VhostUserMMap, VhostUserMMapFlags};
use vhost::vhost_user::{Backend, VhostUserFrontendReqHandler};
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
use zerocopy::FromBytes;

/// The window's mappings and the frontend's back-end channel.
struct State {
    window: Window,
    backend: Option<Backend>,
}

/// The device's DAX window, if it has one.
pub(super) struct DaxWindow {
    /// A leaf lock, held across a map or unmap message to the frontend
    /// (the guest's DAX calls are served one at a time), so the window
    /// always says what the frontend has mapped.
    state: Mutex<State>,
    /// Set when the frontend dropped every mapping (a device reset) or
    /// the guest's session ended, by a thread that must not wait for a
    /// call in progress: the next call forgets every mapping first.
    stale: AtomicBool,
    /// The files (device, inode) ever given to the frontend to map (a
    /// leaf lock): the frontend hands each mapping back to the device as
    /// guest memory, which [`DaxWindow::guard`] guards.
    files: Mutex<HashSet<(u64, u64)>>,
    /// How many regions of the current guest memory are window mappings
    /// (guarded).
    guarded: AtomicUsize,
}

impl DaxWindow {
    /// A window of `size` bytes (see `crate::dax::Window::new`); None if
    /// the size is not one.
    pub(super) fn new(size: u64) -> Option<DaxWindow> {
        let window = Window::new(size, 4096)?;
        Some(DaxWindow {
            state: Mutex::new(State {
                window,
                backend: None,
            }),
            stale: AtomicBool::new(false),
            files: Mutex::new(HashSet::new()),
            guarded: AtomicUsize::new(0),
        })
    }

    /// Guards the regions of guest memory `mem` that are files this window
    /// had mapped (QEMU hands every window mapping to the back-end as
    /// guest memory): a guest that points a request's buffer, or its
    /// vring, at one whose file was truncated since gets zeros there,
    /// where the daemon would die of SIGBUS (`host_io::mapped`).
    pub(super) fn guard(&self, mem: &GuestMmap) {
        let files = lock(&self.files);
        let ranges: Vec<(usize, usize)> = mem
            .iter()
            .filter(|r| {
                r.file_offset()
                    .and_then(|fo| file_id(fo.file().as_raw_fd()))
                    .is_some_and(|id| files.contains(&id))
            })
            .map(|r| (r.as_ptr() as usize, r.len() as usize))
            .collect();
        drop(files);
        match host_io::mapped::guard_mappings(&ranges) {
            Ok(()) => {
                log::debug!(
                    "DAX: {} guest memory region(s) of mapped files guarded",
                    ranges.len()
                );
                self.guarded.store(ranges.len(), Ordering::SeqCst);
            }
            Err(e) => log::warn!("DAX: guest memory of mapped files left unguarded: {e}"),
        }
    }

    /// How many guest memory regions are guarded now.
    pub(super) fn guarded(&self) -> usize {
        self.guarded.load(Ordering::SeqCst)
    }

    /// The window's size.
    pub(super) fn size(&self) -> u64 {
        lock(&self.state).window.size()
    }

    /// The frontend's new back-end channel (its mappings are its own).
    pub(super) fn set_backend(&self, backend: Backend) {
        lock(&self.state).backend = Some(backend);
        self.forget_all();
    }

    /// Every mapping is gone (the frontend dropped them); does not wait
    /// for a call in progress.
    pub(super) fn forget_all(&self) {
        self.stale.store(true, Ordering::SeqCst);
    }

    /// Unmaps every mapping (a new INIT: the guest's next session starts
    /// with an empty window). One the frontend refuses to unmap is
    /// forgotten all the same. Only on a vring thread, with the device
    /// running: never on a reset (see `forget_all`).
    pub(super) fn unmap_all(&self) {
        let mut st = self.current();
        let State { window, backend } = &mut *st;
        let Some(backend) = backend.as_ref() else {
            return;
        };
        let all: Vec<Mapping> = window.mappings().copied().collect();
        for m in all {
            let _ = unmap(backend, &m);
            window.remove(m.moffset);
        }
    }

    /// How many mappings the window holds.
    pub(super) fn mappings(&self) -> usize {
        let st = self.current();
        st.window.len()
    }

    /// [`DaxWindow::mappings`] without waiting: None while a mapping
    /// request is being served (its map message may wait for a frontend
    /// that waits for the caller).
    pub(super) fn mappings_now(&self) -> Option<usize> {
        let mut st = self.state.try_lock().ok()?;
        self.refresh(&mut st);
        Some(st.window.len())
    }

    /// The window's state, locked, with every mapping forgotten first if
    /// the frontend dropped them meanwhile (`stale`).
    fn current(&self) -> std::sync::MutexGuard<'_, State> {
        let mut st = lock(&self.state);
        self.refresh(&mut st);
        st
    }

    fn refresh(&self, st: &mut State) {
        if self.stale.swap(false, Ordering::SeqCst) {
            st.window.clear();
        }
    }
}

/// A mapping as the frontend's SHMEM_MAP / SHMEM_UNMAP name it.
fn mmap_msg(moffset: u64, len: u64, foffset: u64, writable: bool) -> VhostUserMMap {
    VhostUserMMap {
        shmid: 0,
        padding: [0; 7],
        fd_offset: foffset,
        shm_offset: moffset,
        len,
        flags: if writable {
            VhostUserMMapFlags::WRITABLE.bits()
        } else {
            0
        },
    }
}

/// A file's (device, inode).
fn file_id(fd: RawFd) -> Option<(u64, u64)> {
    // SAFETY: a zeroed stat is a valid out-buffer for fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on a borrowed fd into a local.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

fn unmap(backend: &Backend, m: &Mapping) -> Result<(), Errno> {
    // As it was mapped: writable (see `setup_mapping`).
    let msg = mmap_msg(m.moffset, m.len, m.foffset, true);
    match backend.shmem_unmap(&msg) {
        Ok(_) => Ok(()),
        Err(e) => {
            log::warn!("DAX: the frontend refused to unmap {m:?}: {e}");
            Err(Errno::EIO)
        }
    }
}

impl<F: Filesystem + 'static> FsDevice<F> {
    /// Serves a FUSE_SETUPMAPPING or FUSE_REMOVEMAPPING (the window is
    /// on) and answers it: nothing is mapped or unmapped unless every
    /// check passed.
    pub(super) fn serve_dax(&self, args: &Args, t: &Arc<Ticket>) {
        let r = match self.inner.dax.as_ref() {
            None => Err(Errno::ENOSYS),
            Some(dax) => match args.opcode {
                Opcode::Setupmapping => self.setup_mapping(dax, args, t.unique),
                Opcode::Removemapping => remove_mappings(dax, &args.body),
                _ => Err(Errno::EINVAL),
            },
        };
        if let Err(e) = r {
            log::debug!("DAX: {:?} refused: errno {}", args.opcode, e.0);
        }
        if t.claim() {
            self.answer(t, r.map_or_else(Errno::to_wire, |()| 0), &[]);
        }
    }

    fn setup_mapping(&self, dax: &DaxWindow, args: &Args, unique: u64) -> Result<(), Errno> {
        let (arg, _) = SetupmappingIn::read_from_prefix(&args.body).map_err(|_| Errno::EINVAL)?;
        let s = Setup {
            moffset: arg.moffset,
            len: arg.len,
            ino: args.nodeid,
            fh: arg.fh,
            foffset: arg.foffset,
            flags: arg.flags,
        };
        // Linux sends no handle (-1): its mappings are the inode's, and
        // the file is opened for the call, for writing whatever the flags
        // say (see the check below).
        let handle = (arg.fh != u64::MAX).then(|| F::Handle::from(arg.fh));
        let mut st = dax.current();
        let State { window, backend } = &mut *st;
        let replaced = window.check_setup(&s).map_err(|e| e.errno())?;
        // Without the back-end channel the frontend cannot map anything.
        let backend = backend.as_ref().ok_or(Errno(libc::EOPNOTSUPP))?;
        let ctx = Ctx {
            unique,
            uid: args.uid,
            gid: args.gid,
            pid: args.pid,
            ..Ctx::default()
        };
        let mut old_unmapped = false;
        let r = self
            .inner
            .engine
            .fs()
            .map_source(&ctx, s.ino.into(), handle, true, &mut |src| {
                // QEMU 11.1 maps every range writable, and refuses a file
                // not open for writing even for a read-only range
                // (docs/DAX.md): only a file the caller may write is
                // mapped, so a guest gains no write access through its
                // window.
                if !src.writable {
                    return Err(Errno(libc::EACCES));
                }
                // The frontend maps whole pages of the file, and would
                // extend an empty file to the mapping's end.
                if s.foffset.checked_add(s.len).is_none_or(|e| e > src.size) {
                    return Err(Errno::EINVAL);
                }
                if let Some(old) = &replaced {
                    // The same file range again (the guest makes a range
                    // writable so): it is mapped writable already.
                    if (old.ino, old.foffset) == (s.ino, s.foffset) {
                        return Ok(());
                    }
                    unmap(backend, old)?;
                    old_unmapped = true;
                }
                // QEMU hands the mapping back as guest memory: `guard`
                // knows it by its file.
                if let Some(id) = file_id(src.fd.as_raw_fd()) {
                    lock(&dax.files).insert(id);
                }
                // Writable: a file the caller may write (checked above),
                // as QEMU 11.1 maps every range anyway; so a later
                // request to write through it needs no remapping, which
                // would leave a hole in the window meanwhile.
                let msg = mmap_msg(s.moffset, s.len, s.foffset, true);
                backend.shmem_map(&msg, &src.fd).map(drop).map_err(|e| {
                    log::warn!("DAX: the frontend refused to map {s:?}: {e}");
                    Errno::EIO
                })
            });
        match r {
            Ok(()) => window.insert(&s),
            Err(_) if old_unmapped => {
                window.remove(s.moffset);
            }
            Err(_) => {}
        }
        r
    }
}

/// FUSE_REMOVEMAPPING: every range is checked first (none is unmapped if
/// one fails a check); one the frontend refuses stops the rest, those
/// before it stay unmapped.
fn remove_mappings(dax: &DaxWindow, body: &[u8]) -> Result<(), Errno> {
    let (arg, rest) = RemovemappingIn::read_from_prefix(body).map_err(|_| Errno::EINVAL)?;
    let n = arg.count as usize;
    let one = std::mem::size_of::<RemovemappingOne>();
    if n == 0 || rest.len() != n.checked_mul(one).ok_or(Errno::EINVAL)? {
        return Err(Errno::EINVAL);
    }
    let ranges: Vec<(u64, u64)> = rest
        .chunks_exact(one)
        .filter_map(|c| RemovemappingOne::read_from_bytes(c).ok())
        .map(|r| (r.moffset, r.len))
        .collect();
    let mut st = dax.current();
    let State { window, backend } = &mut *st;
    let maps = window.check_remove(&ranges).map_err(|e| e.errno())?;
    let backend = backend.as_ref().ok_or(Errno(libc::EOPNOTSUPP))?;
    for m in maps {
        // One the frontend refused stays recorded (it still maps it).
        unmap(backend, &m)?;
        window.remove(m.moffset);
    }
    Ok(())
}
