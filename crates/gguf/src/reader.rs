//! A bounds-checked little-endian cursor over the file's bytes.
//!
//! Every read checks the remaining length first and reports [`GgufError::Truncated`] with what
//! was being read; nothing here can panic or read past the slice.

use crate::error::{GgufError, Result};

#[derive(Clone)]
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }

    /// Byte offset of the next read from the start of the file.
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes left after the cursor.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The truncation error for needing `needed` bytes here.
    pub(crate) fn truncated(&self, what: impl Into<String>, needed: u64) -> GgufError {
        GgufError::Truncated {
            what: what.into(),
            offset: self.pos as u64,
            needed,
            available: self.remaining() as u64,
        }
    }

    /// Fails unless `count` items of at least `min_item_bytes` each can still fit in the file.
    /// Called before any allocation sized by a count read from the file.
    pub(crate) fn check_count(&self, count: u64, min_item_bytes: u64, what: &str) -> Result<usize> {
        let needed = count.saturating_mul(min_item_bytes);
        if needed > self.remaining() as u64 {
            return Err(self.truncated(format!("{what} (count {count})"), needed));
        }
        // needed <= remaining <= usize::MAX, and min_item_bytes >= 1, so count fits in usize.
        usize::try_from(count).map_err(|_| self.truncated(what.to_string(), needed))
    }

    pub(crate) fn bytes(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() as u64 {
            return Err(self.truncated(what, n));
        }
        let n = n as usize; // n <= remaining, fits.
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let b = self.bytes(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }
    pub(crate) fn i8(&mut self, what: &str) -> Result<i8> {
        Ok(i8::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn i16(&mut self, what: &str) -> Result<i16> {
        Ok(i16::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn i32(&mut self, what: &str) -> Result<i32> {
        Ok(i32::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn i64(&mut self, what: &str) -> Result<i64> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn f32(&mut self, what: &str) -> Result<f32> {
        Ok(f32::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn f64(&mut self, what: &str) -> Result<f64> {
        Ok(f64::from_le_bytes(self.array(what)?))
    }

    /// A GGUF string: u64 byte length, then that many UTF-8 bytes (no terminator).
    pub(crate) fn string(&mut self, what: &str) -> Result<&'a str> {
        let len = self.u64(what)?;
        let start = self.pos;
        let bytes = self.bytes(len, what)?;
        std::str::from_utf8(bytes).map_err(|_| GgufError::InvalidUtf8 {
            what: what.to_string(),
            offset: start as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_little_endian_and_stops_at_the_end() {
        let data = [1u8, 0, 0, 0, 0xff];
        let mut c = Cursor::new(&data);
        assert_eq!(c.u32("x").unwrap(), 1);
        assert_eq!(c.remaining(), 1);
        let err = c.u32("the y field").unwrap_err();
        assert!(
            matches!(
                err,
                GgufError::Truncated {
                    needed: 4,
                    available: 1,
                    offset: 4,
                    ..
                }
            ),
            "{err}"
        );
        // A failed read does not move the cursor.
        assert_eq!(c.u8("z").unwrap(), 0xff);
    }

    #[test]
    fn huge_string_length_is_rejected_without_allocating() {
        let mut data = u64::MAX.to_le_bytes().to_vec();
        data.extend_from_slice(b"abc");
        let err = Cursor::new(&data).string("key").unwrap_err();
        assert!(matches!(err, GgufError::Truncated { .. }), "{err}");
    }

    #[test]
    fn check_count_guards_allocations() {
        let data = [0u8; 16];
        let c = Cursor::new(&data);
        assert_eq!(c.check_count(2, 8, "items").unwrap(), 2);
        assert!(c.check_count(3, 8, "items").is_err());
        assert!(c.check_count(u64::MAX, 8, "items").is_err());
    }
}
