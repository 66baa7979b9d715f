//! A remote tier value: the block's bytes behind a header that says which block they are, and
//! a CRC-32 over both (the format is in the module docs of [`super`]).

use super::MAGIC;

/// What a value must say about itself: the namespace, group, level, prefix digest and tokens
/// of the block asked for.
pub(super) struct Header<'a> {
    pub(super) ns: &'a [u8; 32],
    pub(super) group: usize,
    pub(super) level: usize,
    pub(super) digest: &'a [u8; 32],
    pub(super) tokens: &'a [u32],
}

impl Header<'_> {
    /// Bytes before the payload.
    pub(super) fn len(&self) -> usize {
        8 + 32 + 4 + 4 + 32 + 4 + 4 * self.tokens.len() + 8
    }

    fn write(&self, out: &mut Vec<u8>, payload_len: usize) {
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(self.ns);
        out.extend_from_slice(&(self.group as u32).to_le_bytes());
        out.extend_from_slice(&(self.level as u32).to_le_bytes());
        out.extend_from_slice(self.digest);
        out.extend_from_slice(&(self.tokens.len() as u32).to_le_bytes());
        for t in self.tokens {
            out.extend_from_slice(&t.to_le_bytes());
        }
        out.extend_from_slice(&(payload_len as u64).to_le_bytes());
    }

    /// The value stored for `payload`.
    pub(super) fn seal(&self, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len() + payload.len() + 4);
        self.write(&mut v, payload.len());
        v.extend_from_slice(payload);
        let crc = crc32fast::hash(&v);
        v.extend_from_slice(&crc.to_le_bytes());
        v
    }

    /// The payload of `value` if it is exactly what [`Self::seal`] writes for this header and a
    /// payload of `payload_len` bytes; `None` for anything else.
    pub(super) fn open<'v>(&self, value: &'v [u8], payload_len: usize) -> Option<&'v [u8]> {
        let head = self.len();
        if value.len() != head + payload_len + 4 {
            return None;
        }
        let (body, crc) = value.split_at(head + payload_len);
        if u32::from_le_bytes(crc.try_into().ok()?) != crc32fast::hash(body) {
            return None;
        }
        let mut expected = Vec::with_capacity(head);
        self.write(&mut expected, payload_len);
        (body[..head] == expected[..]).then(|| &body[head..])
    }
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header<'a>(ns: &'a [u8; 32], digest: &'a [u8; 32], tokens: &'a [u32]) -> Header<'a> {
        Header {
            ns,
            group: 1,
            level: 3,
            digest,
            tokens,
        }
    }

    #[test]
    fn a_value_opens_only_for_the_block_it_was_sealed_for() {
        let (ns, digest, tokens) = ([7u8; 32], [9u8; 32], [1u32, 2, 3, 4]);
        let payload: Vec<u8> = (0..64).collect();
        let h = header(&ns, &digest, &tokens);
        let value = h.seal(&payload);
        assert_eq!(h.open(&value, 64), Some(&payload[..]));
        assert_eq!(h.open(&value, 63), None, "another block size");
        assert_eq!(h.open(&value[..value.len() - 1], 64), None, "truncated");
        for i in [0, 9, 45, 60, value.len() - 10, value.len() - 1] {
            let mut bad = value.clone();
            bad[i] ^= 0x10;
            assert_eq!(h.open(&bad, 64), None, "byte {i} flipped");
        }
        let other_ns = [8u8; 32];
        assert_eq!(header(&other_ns, &digest, &tokens).open(&value, 64), None);
        let other_prefix = [10u8; 32];
        assert_eq!(header(&ns, &other_prefix, &tokens).open(&value, 64), None);
        assert_eq!(header(&ns, &digest, &[1, 2, 3, 5]).open(&value, 64), None);
        let mut other_level = header(&ns, &digest, &tokens);
        other_level.level = 4;
        assert_eq!(other_level.open(&value, 64), None);
    }
}
