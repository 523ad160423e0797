//! The device's state in a live migration (VHOST_USER_PROTOCOL_F_DEVICE_STATE).
//!
//! With the VM and every vring stopped (their requests answered, see
//! `stop_vring`), QEMU asks the source for its state over a pipe
//! (SET_DEVICE_STATE_FD, SAVE), hands it to the destination's daemon (LOAD)
//! and asks each whether that went well (CHECK_DEVICE_STATE, which waits
//! for the pipe's own thread). The state is the INIT the guest sent
//! (replayed to the destination's dispatcher and filesystem, so they
//! negotiate what the source did) and `Filesystem::save_state`'s.
//!
//! Format (little-endian): 8 bytes of magic, a u32 version, the INIT body
//! and the filesystem's state as length-prefixed byte strings, and an
//! FNV-1a 64 of all that. The destination checks each before using
//! anything: a corrupt or hostile stream fails the load, never a panic.

use fuse_core::abi::InHeader;
use fuse_core::abi::Opcode;
use fuse_core::locks::lock;
use fuse_core::server::state::{StateError, StateReader, StateWriter};
use fuse_core::server::Filesystem;
use std::io::{Read, Write};
use std::sync::Mutex;
use std::thread::JoinHandle;
use vhost::vhost_user::message::{VhostTransferStateDirection, VhostTransferStatePhase};

const MAGIC: &[u8; 8] = b"FUSEBOX\x01";
const VERSION: u32 = 1;
/// Largest state accepted (a table of a million inodes by path fits).
const MAX_STATE: usize = 1 << 30;
/// Largest INIT body (`fuse_init_in` is 104 bytes today).
const MAX_INIT: usize = 4096;

/// The bodies of the guest's INITs, as it sent them.
#[derive(Debug, Default)]
struct Inits {
    /// The last one that succeeded: the session's.
    granted: Option<Vec<u8>>,
    /// Those on their way, by unique (their answers not seen yet; a few
    /// at most: a guest sends one per connection).
    pending: Vec<(u64, Vec<u8>)>,
}

/// Migration state of the device (guarded by its own mutexes; leaf locks).
#[derive(Debug, Default)]
pub(crate) struct Migration {
    /// The guest's INITs.
    guest_init: Mutex<Inits>,
    /// The transfer in progress (SET_DEVICE_STATE_FD), until checked.
    transfer: Mutex<Option<JoinHandle<Result<(), StateError>>>>,
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn io_refused(what: &str, e: std::io::Error) -> StateError {
    StateError::Refused {
        what: what.into(),
        source: Some(e),
    }
}

/// Tells the operator about `e`, with its causes, in the log: QEMU is
/// told only that the transfer failed.
fn tell(e: &StateError) {
    let mut msg = format!("migration: {e}");
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(&format!(": {s}"));
        src = s.source();
    }
    log::error!("{msg}");
}

/// The stream for `init` (the guest's INIT body) and `fs` (the
/// filesystem's state).
pub(crate) fn encode(init: &[u8], fs: &[u8]) -> Vec<u8> {
    let mut w = StateWriter::new();
    w.u32(VERSION).bytes(init).bytes(fs);
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&w.finish());
    let sum = fnv1a(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// The guest's INIT body and the filesystem's state from a stream.
pub(crate) fn decode(buf: &[u8]) -> Result<(&[u8], &[u8]), StateError> {
    let body = buf
        .strip_prefix(MAGIC)
        .ok_or_else(|| StateError::Corrupt("not a fusebox device state".into()))?;
    let (body, sum) = body
        .split_last_chunk::<8>()
        .ok_or_else(|| StateError::Corrupt("too short".into()))?;
    if fnv1a(&buf[..buf.len() - 8]) != u64::from_le_bytes(*sum) {
        return Err(StateError::Corrupt("checksum mismatch".into()));
    }
    let mut r = StateReader::new(body);
    let version = r.u32("version")?;
    if version != VERSION {
        return Err(StateError::Version {
            found: version,
            expected: VERSION,
        });
    }
    let init = r.bytes(MAX_INIT, "the guest's INIT")?;
    let fs = r.bytes(MAX_STATE, "the filesystem's state")?;
    r.end("device state")?;
    Ok((init, fs))
}

impl Migration {
    /// Remembers the guest's INIT (its body after `fuse_in_header`) until
    /// its answer tells whether it is the session's.
    pub(crate) fn note_init(&self, unique: u64, body: &[u8]) {
        let mut g = lock(&self.guest_init);
        g.pending.retain(|(u, _)| *u != unique);
        if g.pending.len() >= 4 {
            g.pending.remove(0);
        }
        g.pending.push((unique, body.to_vec()));
    }

    /// The guest's INIT was answered: with success, it is the session's.
    pub(crate) fn init_answered(&self, unique: u64, ok: bool) {
        let mut g = lock(&self.guest_init);
        if let Some(i) = g.pending.iter().position(|(u, _)| *u == unique) {
            let (_, body) = g.pending.remove(i);
            if ok {
                g.granted = Some(body);
            }
        }
    }

    /// The guest's session ended (a device reset, DESTROY, a new INIT):
    /// nothing to replay. Returns whether one was on (an INIT had been
    /// sent since the last end).
    pub(crate) fn session_ended(&self) -> bool {
        let old = std::mem::take(&mut *lock(&self.guest_init));
        old.granted.is_some() || !old.pending.is_empty()
    }

    /// Takes `init` as the session's INIT (a destination that took up a
    /// state).
    fn took_up(&self, init: &[u8]) {
        *lock(&self.guest_init) = Inits {
            granted: Some(init.to_vec()),
            pending: Vec::new(),
        };
    }

    /// The state to send: taken (`save`) and written to `file` on the
    /// transfer thread, while the device stays stopped (QEMU reads the
    /// pipe, then checks the transfer, before it resumes anything).
    fn save(
        &self,
        file: std::fs::File,
        save: impl FnOnce() -> Result<Vec<u8>, StateError> + Send + 'static,
    ) -> Result<(), StateError> {
        let init = lock(&self.guest_init).granted.clone().unwrap_or_default();
        let t = std::thread::Builder::new()
            .name("fusebox-state".into())
            .spawn(move || {
                let state = encode(&init, &save()?);
                let mut file = file;
                file.write_all(&state)
                    .map_err(|e| io_refused("writing the state", e))
            })
            .map_err(|e| io_refused("a thread to write the state", e))?;
        *lock(&self.transfer) = Some(t);
        Ok(())
    }

    /// SET_DEVICE_STATE_FD. `save` takes the filesystem's state and `load`
    /// takes up a received one, each on the transfer thread (a load once
    /// the stream has ended).
    pub(crate) fn start(
        &self,
        direction: VhostTransferStateDirection,
        phase: VhostTransferStatePhase,
        file: std::fs::File,
        save: impl FnOnce() -> Result<Vec<u8>, StateError> + Send + 'static,
        load: impl FnOnce(Vec<u8>) -> Result<(), StateError> + Send + 'static,
    ) -> std::io::Result<()> {
        if phase != VhostTransferStatePhase::STOPPED {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "state transfer only with the device stopped",
            ));
        }
        // A transfer never checked is over: its result no longer matters,
        // but two may not run at once.
        if let Some(t) = lock(&self.transfer).take() {
            if finish(t).is_none() {
                let e = StateError::refused("the last state transfer has not ended");
                tell(&e);
                return Err(std::io::Error::other(e));
            }
        }
        let r = match direction {
            VhostTransferStateDirection::SAVE => self.save(file, save),
            VhostTransferStateDirection::LOAD => std::thread::Builder::new()
                .name("fusebox-state".into())
                .spawn(move || load(read_capped(&file, MAX_STATE + 64 * 1024)?))
                .map(|t| *lock(&self.transfer) = Some(t))
                .map_err(|e| io_refused("a thread to read the state", e)),
        };
        r.map_err(|e| {
            tell(&e);
            std::io::Error::other(e)
        })
    }

    /// CHECK_DEVICE_STATE: how the last transfer ended (waited for at most
    /// [`TRANSFER_WAIT`]: a transfer that has not ended by then failed).
    pub(crate) fn check(&self) -> std::io::Result<()> {
        let Some(t) = lock(&self.transfer).take() else {
            return Err(std::io::Error::other("no state transfer to check"));
        };
        let r = finish(t).unwrap_or_else(|| {
            Err(StateError::refused(format!(
                "the state transfer did not end within {TRANSFER_WAIT:?}"
            )))
        });
        match r {
            Ok(()) => {
                log::info!("migration: device state transferred");
                Ok(())
            }
            Err(e) => {
                tell(&e);
                Err(std::io::Error::other(e))
            }
        }
    }
}

/// The whole of `file`, or an error past `cap` bytes; never holds more
/// than `cap` bytes of room (a growing `Vec` would double past it).
fn read_capped(mut file: &std::fs::File, cap: usize) -> Result<Vec<u8>, StateError> {
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        let n = match file.read(&mut chunk) {
            Ok(0) => return Ok(buf),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_refused("reading the state", e)),
        };
        if buf.len() + n > cap {
            return Err(StateError::Corrupt(format!(
                "a state of more than {cap} bytes"
            )));
        }
        if buf.capacity() < buf.len() + n {
            let room = (buf.capacity() * 2).clamp(buf.len() + n, cap);
            buf.reserve_exact(room - buf.len());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// How long the vhost-user thread waits for a state transfer to end (a
/// state that takes longer to save or take up, or a pipe the VMM does not
/// read, fails the migration; the transfer thread is left to end).
const TRANSFER_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// The result of transfer thread `t`, once it ended; None if it has not
/// within [`TRANSFER_WAIT`] (it is left running).
fn finish(t: JoinHandle<Result<(), StateError>>) -> Option<Result<(), StateError>> {
    let start = std::time::Instant::now();
    let mut nap = std::time::Duration::from_micros(100);
    while !t.is_finished() {
        if start.elapsed() >= TRANSFER_WAIT {
            return None;
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(std::time::Duration::from_millis(10));
    }
    Some(
        t.join()
            .unwrap_or_else(|_| Err(StateError::refused("the transfer thread panicked"))),
    )
}

/// Takes up a received state: the guest's INIT replayed to `dispatch`
/// (with a reply buffer of `reply_room`), then the filesystem's state.
pub(crate) fn load<F: Filesystem>(
    dispatcher: &fuse_core::server::Dispatcher<F>,
    buf: &[u8],
    note: &Migration,
) -> Result<(), StateError> {
    let (init, fs) = decode(buf)?;
    if !init.is_empty() {
        let msg = fuse_core::abi::encode::request(
            InHeader {
                len: 0,
                opcode: Opcode::Init as u32,
                unique: u64::MAX - 1,
                nodeid: 0,
                uid: 0,
                gid: 0,
                pid: 0,
                total_extlen: 0,
                padding: 0,
            },
            init,
        );
        let mut out = vec![0u8; 4096];
        match dispatcher.handle_bytes(&msg, &mut out) {
            Some(o) if o.error == 0 => {}
            Some(o) => {
                return Err(StateError::refused(format!(
                    "the guest's INIT, replayed, failed with error {}",
                    -o.error
                )))
            }
            None => {
                return Err(StateError::Corrupt(
                    "the guest's INIT does not decode".into(),
                ))
            }
        }
        note.took_up(init);
    }
    dispatcher.fs().load_state(fs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_is_read_in_no_more_room_than_its_cap() {
        let cap = 3 << 20;
        let file = |len: usize| {
            let mut f = std::fs::File::from(unnamed_file().expect("a file for the state"));
            f.write_all(&vec![7u8; len]).unwrap();
            std::io::Seek::rewind(&mut f).unwrap();
            f
        };
        let got = read_capped(&file(cap), cap).unwrap();
        assert_eq!(got.len(), cap);
        assert!(got.capacity() <= cap, "{} bytes of room", got.capacity());
        assert!(read_capped(&file(cap + 1), cap).is_err());
    }

    /// An unnamed file in the temp directory.
    fn unnamed_file() -> std::io::Result<std::os::fd::OwnedFd> {
        let dir =
            std::ffi::CString::new(std::env::temp_dir().into_os_string().into_encoded_bytes())
                .map_err(std::io::Error::other)?;
        // SAFETY: a NUL-terminated path; the result is a new fd or -1.
        let fd = unsafe { libc::open(dir.as_ptr(), libc::O_TMPFILE | libc::O_RDWR, 0o600) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a new fd nothing else owns.
        Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
    }

    #[test]
    fn a_state_reads_back_and_any_damage_is_refused() {
        let s = encode(b"init-body", b"fs-state");
        assert_eq!(decode(&s).unwrap(), (&b"init-body"[..], &b"fs-state"[..]));
        for i in 0..s.len() {
            let mut bad = s.clone();
            bad[i] ^= 0x40;
            assert!(decode(&bad).is_err(), "byte {i} flipped");
        }
        for cut in 0..s.len() {
            assert!(decode(&s[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = s.clone();
        longer.push(0);
        assert!(decode(&longer).is_err());
    }
}
