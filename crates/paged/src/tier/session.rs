//! Saved sessions: a conversation's cached blocks in a file, restored into this process or a
//! restarted one (llama.cpp's `/slots/{id}?action=save|restore`).
//!
//! A file holds what the blocks are only reusable under (the namespace: model file digests,
//! weight format, engine, KV dtype, block size, kvlab's version — the remote tier's), the
//! conversation's tokens and cache salt, and each cached block's bytes with a CRC-32, as the
//! disk tier writes them:
//!
//! ```text
//! "KVLABSS1" ‖ namespace_len u32 ‖ namespace ‖ block_size u32 ‖ num_groups u32 ‖ salt u64
//!            ‖ n_tokens u32 ‖ tokens (u32 each) ‖ n_blocks u32
//!            ‖ n_blocks × (group u32 ‖ level u32 ‖ payload_len u64 ‖ CRC-32 u32 ‖ payload)
//!            ‖ CRC-32 of everything before, u32
//! ```
//!
//! (little-endian). Reading checks every length against the bytes that are there (no
//! allocation is sized by a header field) and both checksums; a file of another namespace is
//! refused by [`crate::KvCacheManager::restore_session`] with both namespaces named.

use std::path::Path;

use crate::{PagedError, Result};

const MAGIC: &[u8; 8] = b"KVLABSS1";

/// One cached block of a saved session: its KV cache group, its level (block index in the
/// conversation) and its bytes as the pool stores them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedBlock {
    /// The KV cache group.
    pub group: u32,
    /// The block's index in the conversation's tokens.
    pub level: u32,
    /// Every layer of the group, keys and values, as the engine's `read_block` gives them.
    pub bytes: Vec<u8>,
}

/// A conversation's cached blocks and what they belong to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedSession {
    /// What the blocks are reusable under (the remote tier's namespace).
    pub namespace: String,
    /// Tokens per block.
    pub block_size: usize,
    /// KV cache groups of the model.
    pub num_groups: usize,
    /// The conversation's cache salt (0: none).
    pub salt: u64,
    /// The conversation's tokens, BOS included.
    pub tokens: Vec<u32>,
    /// Its cached blocks, by group then level.
    pub blocks: Vec<SavedBlock>,
}

impl SavedSession {
    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(MAGIC);
        let u32le = |v: &mut Vec<u8>, x: usize| v.extend_from_slice(&(x as u32).to_le_bytes());
        u32le(&mut v, self.namespace.len());
        v.extend_from_slice(self.namespace.as_bytes());
        u32le(&mut v, self.block_size);
        u32le(&mut v, self.num_groups);
        v.extend_from_slice(&self.salt.to_le_bytes());
        u32le(&mut v, self.tokens.len());
        for t in &self.tokens {
            v.extend_from_slice(&t.to_le_bytes());
        }
        u32le(&mut v, self.blocks.len());
        for b in &self.blocks {
            v.extend_from_slice(&b.group.to_le_bytes());
            v.extend_from_slice(&b.level.to_le_bytes());
            v.extend_from_slice(&(b.bytes.len() as u64).to_le_bytes());
            v.extend_from_slice(&crc32fast::hash(&b.bytes).to_le_bytes());
            v.extend_from_slice(&b.bytes);
        }
        let crc = crc32fast::hash(&v);
        v.extend_from_slice(&crc.to_le_bytes());
        v
    }

    /// Parses a file's bytes.
    ///
    /// # Errors
    /// [`PagedError::Session`] for anything but a whole, uncorrupted session file.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<SavedSession> {
        let bad = |reason: &str| PagedError::Session {
            path: path.display().to_string(),
            reason: reason.to_string(),
        };
        let Some((body, crc)) = bytes.split_last_chunk::<4>() else {
            return Err(bad("too short to be a saved session"));
        };
        if body.get(..8) != Some(MAGIC) {
            return Err(bad("not a kvlab saved session (no KVLABSS1 header)"));
        }
        if u32::from_le_bytes(*crc) != crc32fast::hash(body) {
            return Err(bad(
                "its checksum does not match: the file is truncated or corrupt",
            ));
        }
        let mut r = Reader { rest: &body[8..] };
        let truncated = || bad("it ends inside a record: the file is truncated");
        let ns_len = r.u32().ok_or_else(truncated)? as usize;
        let namespace = String::from_utf8(r.take(ns_len).ok_or_else(truncated)?.to_vec())
            .map_err(|_| bad("its namespace is not UTF-8"))?;
        let block_size = r.u32().ok_or_else(truncated)? as usize;
        let num_groups = r.u32().ok_or_else(truncated)? as usize;
        let salt = r.u64().ok_or_else(truncated)?;
        let n_tokens = r.u32().ok_or_else(truncated)? as usize;
        let raw = r
            .take(n_tokens.checked_mul(4).ok_or_else(truncated)?)
            .ok_or_else(truncated)?;
        let tokens = raw
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let n_blocks = r.u32().ok_or_else(truncated)? as usize;
        let mut blocks = Vec::new();
        for _ in 0..n_blocks {
            let group = r.u32().ok_or_else(truncated)?;
            let level = r.u32().ok_or_else(truncated)?;
            let len = usize::try_from(r.u64().ok_or_else(truncated)?).map_err(|_| truncated())?;
            let crc = r.u32().ok_or_else(truncated)?;
            let payload = r.take(len).ok_or_else(truncated)?;
            if crc32fast::hash(payload) != crc {
                return Err(bad("a block's checksum does not match"));
            }
            blocks.push(SavedBlock {
                group,
                level,
                bytes: payload.to_vec(),
            });
        }
        if !r.rest.is_empty() {
            return Err(bad("bytes follow its last block"));
        }
        Ok(SavedSession {
            namespace,
            block_size,
            num_groups,
            salt,
            tokens,
            blocks,
        })
    }

    /// Writes the file at `path` (through a temporary file beside it, renamed, so a crash
    /// never leaves half a session under the name). Returns the bytes written.
    ///
    /// # Errors
    /// [`PagedError::Session`] if the file cannot be written.
    pub fn write(&self, path: &Path) -> Result<u64> {
        let fail = |e: std::io::Error| PagedError::Session {
            path: path.display().to_string(),
            reason: e.to_string(),
        };
        let bytes = self.to_bytes();
        let tmp = path.with_extension("partial");
        std::fs::write(&tmp, &bytes).map_err(fail)?;
        std::fs::rename(&tmp, path).map_err(fail)?;
        Ok(bytes.len() as u64)
    }

    /// Reads and checks the file at `path`.
    ///
    /// # Errors
    /// [`PagedError::Session`] if it cannot be read or is not a whole, uncorrupted session.
    pub fn read(path: &Path) -> Result<SavedSession> {
        let bytes = std::fs::read(path).map_err(|e| PagedError::Session {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Self::from_bytes(&bytes, path)
    }
}

/// Little-endian fields off the front of a byte slice; `None` past its end.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.rest.len() {
            return None;
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Some(head)
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4)?.try_into().ok().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.take(8)?.try_into().ok().map(u64::from_le_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> SavedSession {
        SavedSession {
            namespace: "model=m kv_dtype=f32 block_size=4".into(),
            block_size: 4,
            num_groups: 2,
            salt: 7,
            tokens: (1..=9).collect(),
            blocks: vec![
                SavedBlock {
                    group: 0,
                    level: 0,
                    bytes: vec![1; 16],
                },
                SavedBlock {
                    group: 1,
                    level: 1,
                    bytes: vec![2; 16],
                },
            ],
        }
    }

    #[test]
    fn a_session_file_round_trips_and_anything_else_is_refused() {
        let s = session();
        let p = Path::new("s.kvsession");
        let bytes = s.to_bytes();
        assert_eq!(SavedSession::from_bytes(&bytes, p).unwrap(), s);
        for cut in [0, 3, 8, 20, bytes.len() / 2, bytes.len() - 1] {
            assert!(
                SavedSession::from_bytes(&bytes[..cut], p).is_err(),
                "cut at {cut}"
            );
        }
        for i in [9, 30, bytes.len() - 20, bytes.len() - 2] {
            let mut bad = bytes.clone();
            bad[i] ^= 1;
            let e = SavedSession::from_bytes(&bad, p).unwrap_err().to_string();
            assert!(e.contains("s.kvsession"), "{e}");
        }
        // A header that claims more blocks than the file holds (checksum made right): refused,
        // nothing allocated for the claim.
        let mut forged = bytes[..bytes.len() - 4].to_vec();
        let n_blocks_at = 8 + 4 + s.namespace.len() + 4 + 4 + 8 + 4 + 4 * s.tokens.len();
        forged[n_blocks_at..n_blocks_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let crc = crc32fast::hash(&forged);
        forged.extend_from_slice(&crc.to_le_bytes());
        let e = SavedSession::from_bytes(&forged, p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("truncated"), "{e}");
    }
}
