//! A frontend's side of the DAX window, for tests: it answers the
//! device's SHMEM_MAP and SHMEM_UNMAP on the back-end channel, refusing
//! what QEMU 11.1.3 was seen to refuse (a range outside the window, an
//! overlap, an unmap that is not exactly a mapping, a file shorter than the
//! range, a file not open for writing) and an empty file (which QEMU
//! would extend instead), and maps the file into a region of this
//! process, so a test reads what a guest would see through its window.
//! Unlike QEMU it maps a range without WRITABLE read-only, and it never
//! crashes on a message after a stop (docs/DAX.md).

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Mutex;
use vhost::vhost_user::message::{VhostUserMMap, VhostUserMMapFlags};
use vhost::vhost_user::{HandlerResult, VhostUserFrontendReqHandler};
use vhost::VhostUserMemoryRegionInfo;

/// What the device asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowEvent {
    /// A range mapped (window offset, length, file offset, writable).
    Map(u64, u64, u64, bool),
    /// A range unmapped (window offset, length).
    Unmap(u64, u64),
    /// A request refused, as QEMU refuses it (window offset, length).
    Refused(u64, u64),
}

/// The window: `size` bytes of this process's address space, inaccessible
/// where nothing is mapped.
#[derive(Debug)]
pub struct FrontendWindow {
    base: usize,
    size: u64,
    /// Mapped ranges: (window offset, length, writable).
    maps: Mutex<Vec<(u64, u64, bool)>>,
    /// The file of each mapping (a duplicate), by window offset, with its
    /// file offset.
    files: Mutex<Vec<(u64, std::fs::File, u64)>>,
    events: Mutex<Vec<WindowEvent>>,
}

fn err(what: &str) -> std::io::Error {
    std::io::Error::other(what.to_string())
}

impl FrontendWindow {
    /// A window of `size` bytes (reserved, nothing mapped).
    pub fn new(size: u64) -> std::io::Result<FrontendWindow> {
        // SAFETY: a new anonymous reservation; the kernel picks the place.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(FrontendWindow {
            base: p as usize,
            size,
            maps: Mutex::new(Vec::new()),
            files: Mutex::new(Vec::new()),
            events: Mutex::new(Vec::new()),
        })
    }

    /// The window's size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// What the device asked for so far.
    pub fn events(&self) -> Vec<WindowEvent> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// The ranges mapped now: (window offset, length, writable).
    pub fn mappings(&self) -> Vec<(u64, u64, bool)> {
        self.maps.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// The mapping at window offset `off` as guest memory at `gpa`, as
    /// QEMU hands each window mapping to the back-end (ADD_MEM_REG): its
    /// region, whose file descriptor lives as long as the window.
    pub fn region_at(&self, off: u64, gpa: u64) -> Option<VhostUserMemoryRegionInfo> {
        let maps = self.maps.lock().ok()?;
        let &(_, len, _) = maps.iter().find(|(o, _, _)| *o == off)?;
        let files = self.files.lock().ok()?;
        let (_, file, foff) = files.iter().find(|(o, _, _)| *o == off)?;
        Some(VhostUserMemoryRegionInfo {
            guest_phys_addr: gpa,
            memory_size: len,
            userspace_addr: (self.base + off as usize) as u64,
            mmap_offset: *foff,
            mmap_handle: file.as_raw_fd(),
        })
    }

    /// `len` bytes at window offset `off`, if a mapping holds them all.
    pub fn read(&self, off: u64, len: usize) -> Option<Vec<u8>> {
        let maps = self.maps.lock().ok()?;
        let end = off.checked_add(len as u64)?;
        maps.iter().find(|(o, l, _)| *o <= off && end <= o + l)?;
        let mut out = vec![0u8; len];
        // SAFETY: the bytes lie in a mapping of this window (checked under
        // `maps`, which an unmap also takes); the file behind it is at
        // least that long (checked at map time).
        unsafe {
            std::ptr::copy_nonoverlapping(
                (self.base + off as usize) as *const u8,
                out.as_mut_ptr(),
                len,
            )
        };
        Some(out)
    }

    /// Writes `data` at window offset `off`, if a writable mapping holds
    /// it all (as a guest's store through its window).
    pub fn write(&self, off: u64, data: &[u8]) -> bool {
        let Ok(maps) = self.maps.lock() else {
            return false;
        };
        let end = off + data.len() as u64;
        if !maps.iter().any(|(o, l, w)| *w && *o <= off && end <= o + l) {
            return false;
        }
        // SAFETY: as in `read`, and the mapping is writable.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                (self.base + off as usize) as *mut u8,
                data.len(),
            )
        };
        true
    }

    fn note(&self, e: WindowEvent) {
        if let Ok(mut ev) = self.events.lock() {
            ev.push(e);
        }
    }

    fn refuse(&self, req: &VhostUserMMap, why: &str) -> std::io::Error {
        self.note(WindowEvent::Refused(req.shm_offset, req.len));
        err(why)
    }
}

impl Drop for FrontendWindow {
    fn drop(&mut self) {
        // SAFETY: the reservation made in `new`, with its mappings.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.size as usize) };
    }
}

fn file_size(fd: RawFd) -> Option<u64> {
    // SAFETY: `st` is a valid out-pointer; fstat on a borrowed fd.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st.st_size as u64)
}

impl VhostUserFrontendReqHandler for FrontendWindow {
    fn shmem_map(&self, req: &VhostUserMMap, fd: &dyn AsRawFd) -> HandlerResult<u64> {
        let (off, len, foff) = (req.shm_offset, req.len, req.fd_offset);
        let writable = req.flags & VhostUserMMapFlags::WRITABLE.bits() != 0;
        let mut maps = self.maps.lock().map_err(|_| err("poisoned"))?;
        let end = off.checked_add(len);
        if req.shmid != 0 || len == 0 || end.is_none_or(|e| e > self.size) || off % 4096 != 0 {
            return Err(self.refuse(req, "outside the window"));
        }
        if maps.iter().any(|(o, l, _)| off < o + l && *o < off + len) {
            return Err(self.refuse(req, "overlap"));
        }
        // SAFETY: fcntl(F_GETFL) on a borrowed fd.
        let mode = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) } & libc::O_ACCMODE;
        if mode != libc::O_RDWR {
            // QEMU 11.1 maps even a read-only range writable (EACCES).
            return Err(self.refuse(req, "a file not open for writing"));
        }
        let size = file_size(fd.as_raw_fd()).unwrap_or(0);
        if size == 0 || foff.checked_add(len).is_none_or(|e| e > size) {
            return Err(self.refuse(req, "file shorter than the range"));
        }
        let prot = libc::PROT_READ | if writable { libc::PROT_WRITE } else { 0 };
        // SAFETY: the range lies in this window's reservation (checked);
        // MAP_FIXED replaces only that part of it.
        let p = unsafe {
            libc::mmap(
                (self.base + off as usize) as *mut libc::c_void,
                len as usize,
                prot,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd.as_raw_fd(),
                foff as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(self.refuse(req, "mmap failed"));
        }
        maps.push((off, len, writable));
        // SAFETY: fcntl(F_DUPFD_CLOEXEC) of a borrowed fd; the new fd is
        // owned by the File alone.
        let dup = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if dup >= 0 {
            // SAFETY: `dup` is a new fd nothing else owns.
            let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(dup) };
            if let Ok(mut files) = self.files.lock() {
                files.retain(|(o, _, _)| *o != off);
                files.push((off, file, foff));
            }
        }
        self.note(WindowEvent::Map(off, len, foff, writable));
        Ok(0)
    }

    fn shmem_unmap(&self, req: &VhostUserMMap) -> HandlerResult<u64> {
        let (off, len) = (req.shm_offset, req.len);
        let mut maps = self.maps.lock().map_err(|_| err("poisoned"))?;
        let Some(i) = maps.iter().position(|(o, l, _)| *o == off && *l == len) else {
            return Err(self.refuse(req, "no such mapping"));
        };
        maps.remove(i);
        if let Ok(mut files) = self.files.lock() {
            files.retain(|(o, _, _)| *o != off);
        }
        // SAFETY: the range was a mapping of this window; it goes back to
        // an inaccessible reservation.
        unsafe {
            libc::mmap(
                (self.base + off as usize) as *mut libc::c_void,
                len as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        self.note(WindowEvent::Unmap(off, len));
        Ok(0)
    }
}
