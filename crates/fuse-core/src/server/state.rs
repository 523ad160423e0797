//! A server's state in bytes, for live migration.
//!
//! A daemon that hands its clients over to another (a VM's live migration:
//! the source's FUSE session continues on the destination) sends what the
//! client holds references to: the node ids it looked up, the handles it
//! opened, what INIT negotiated. [`Filesystem::save_state`] and
//! [`Filesystem::load_state`] carry a filesystem's part; [`StateWriter`]
//! and [`StateReader`] are the one encoding every part uses: little-endian
//! integers and length-prefixed byte strings, every read bounds-checked, so
//! a truncated or hostile stream is an error and never a panic.
//!
//! [`Filesystem::save_state`]: super::Filesystem::save_state
//! [`Filesystem::load_state`]: super::Filesystem::load_state

use thiserror::Error;

/// Why state could not be saved or loaded.
#[derive(Debug, Error)]
pub enum StateError {
    /// The filesystem (or transport) cannot hand its state over.
    #[error("this server cannot migrate its state")]
    Unsupported,
    /// The stream ended early, or a length or tag in it is impossible.
    #[error("corrupt state: {0}")]
    Corrupt(String),
    /// The stream was made by a format this build does not read.
    #[error("state format {found}, this build reads {expected}")]
    Version {
        /// What the stream says.
        found: u32,
        /// What this build reads.
        expected: u32,
    },
    /// Part of the state cannot be carried over or taken up (a file that
    /// cannot be found, on the source or on the destination).
    #[error("{what}")]
    Refused {
        /// What and why, for the operator.
        what: String,
        /// The host error behind it, if any.
        #[source]
        source: Option<std::io::Error>,
    },
}

impl StateError {
    /// A refusal with no host error behind it.
    pub fn refused(what: impl Into<String>) -> StateError {
        StateError::Refused {
            what: what.into(),
            source: None,
        }
    }
}

/// Appends state to a byte vector.
#[derive(Debug, Default)]
pub struct StateWriter {
    buf: Vec<u8>,
}

impl StateWriter {
    /// An empty writer.
    pub fn new() -> StateWriter {
        StateWriter::default()
    }
    /// A u8.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    /// A u32, little-endian.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A u64, little-endian.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Bytes, prefixed with their length as a u32.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        // A part longer than 4 GiB cannot be told; no part comes near it
        // (the largest is a file handle or a path), and the reader then
        // finds the stream corrupt rather than reading a wrong length.
        self.u32(u32::try_from(v.len()).unwrap_or(u32::MAX));
        self.buf.extend_from_slice(v);
        self
    }
    /// What was written.
    pub fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// Reads state written by [`StateWriter`]; every read checks the bounds.
#[derive(Debug)]
pub struct StateReader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> StateReader<'a> {
    /// A reader of `buf`.
    pub fn new(buf: &'a [u8]) -> StateReader<'a> {
        StateReader { buf, at: 0 }
    }
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], StateError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                StateError::Corrupt(format!(
                    "{what}: {n} bytes wanted at {} of {}",
                    self.at,
                    self.buf.len()
                ))
            })?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }
    /// A u8.
    pub fn u8(&mut self, what: &str) -> Result<u8, StateError> {
        Ok(self.take(1, what)?[0])
    }
    /// A u32.
    pub fn u32(&mut self, what: &str) -> Result<u32, StateError> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4, what)?);
        Ok(u32::from_le_bytes(b))
    }
    /// A u64.
    pub fn u64(&mut self, what: &str) -> Result<u64, StateError> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8, what)?);
        Ok(u64::from_le_bytes(b))
    }
    /// A length-prefixed byte string of at most `max` bytes.
    pub fn bytes(&mut self, max: usize, what: &str) -> Result<&'a [u8], StateError> {
        let n = self.u32(what)? as usize;
        if n > max {
            return Err(StateError::Corrupt(format!(
                "{what}: {n} bytes, at most {max} expected"
            )));
        }
        self.take(n, what)
    }
    /// A count of records, each at least `min_size` bytes: one the rest of
    /// the stream cannot hold is refused. `min_size` is the encoded size of
    /// the smallest record the count can name (what the writer makes of it,
    /// checked by a test next to the writer); a count is no size to
    /// allocate by (a record's decoded form is larger than its bytes), so
    /// callers read records one at a time.
    pub fn count(&mut self, min_size: usize, what: &str) -> Result<usize, StateError> {
        let n = self.u32(what)? as usize;
        if n.saturating_mul(min_size.max(1)) > self.remaining() {
            return Err(StateError::Corrupt(format!(
                "{what}: {n} records cannot fit in {} bytes",
                self.remaining()
            )));
        }
        Ok(n)
    }
    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.at
    }
    /// Fails unless everything was read.
    pub fn end(&self, what: &str) -> Result<(), StateError> {
        if self.remaining() != 0 {
            return Err(StateError::Corrupt(format!(
                "{what}: {} bytes left over",
                self.remaining()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_written_reads_back_and_every_truncation_is_an_error() {
        let mut w = StateWriter::new();
        w.u8(7).u32(0xdead_beef).u64(u64::MAX - 1).bytes(b"a/b");
        w.u32(2);
        let buf = w.finish();
        let mut r = StateReader::new(&buf);
        assert_eq!(r.u8("a").unwrap(), 7);
        assert_eq!(r.u32("b").unwrap(), 0xdead_beef);
        assert_eq!(r.u64("c").unwrap(), u64::MAX - 1);
        assert_eq!(r.bytes(16, "d").unwrap(), b"a/b");
        assert!(r.count(1, "e").is_err(), "2 records in 0 bytes");
        r.end("all").unwrap();
        for cut in 0..buf.len() - 4 {
            let mut r = StateReader::new(&buf[..cut]);
            let all = (|| {
                r.u8("a")?;
                r.u32("b")?;
                r.u64("c")?;
                r.bytes(16, "d")?;
                Ok::<_, StateError>(())
            })();
            assert!(matches!(all, Err(StateError::Corrupt(_))), "cut at {cut}");
        }
        let mut r = StateReader::new(&buf);
        r.u8("a").unwrap();
        r.u32("b").unwrap();
        r.u64("c").unwrap();
        assert!(r.bytes(2, "d").is_err(), "longer than allowed");
    }
}
