//! Content hashes of full blocks, chained from the first block of a sequence.
//!
//! Prefix caching needs a name for "the KV of these `block_size` tokens, given everything before
//! them". The KV of a token depends on every earlier token (attention mixes them in at every
//! layer), so a block's name must cover its whole prefix. Hashing the whole prefix each time would
//! cost O(len) per block; instead the hash is *chained*:
//!
//! ```text
//! h0 = H(None,     tokens[0..16])
//! h1 = H(Some(h0), tokens[16..32])
//! h2 = H(Some(h1), tokens[32..48])      equal h2  ⇔(almost surely)  equal tokens[0..48]
//! ```
//!
//! Only *full* blocks are hashed: a partial block will still change, so it has no stable name.
//!
//! The default [`HashFn`] is 64-bit FNV-1a, written out below so that it is deterministic across
//! Rust versions and platforms (std's `DefaultHasher` promises neither). FNV-1a is not collision
//! resistant, and no 64-bit hash is collision free; the prefix cache therefore never trusts a hash
//! alone: every cached block stores its token ids and the identity of its parent block, and a hit
//! must match both (see `prefix_cache.rs`). The hash function is injectable
//! ([`crate::BlockAllocator::with_hash_fn`]) so tests can force collisions and watch them be
//! caught.

use serde::Serialize;

/// The chained content hash of one full block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct BlockHash(pub u64);

/// A block hash function: `(parent block's hash or None for the first block, the block's token
/// ids) -> hash`. A plain `fn` pointer (closures without captures coerce to it) keeps the
/// allocator `Clone`, `Debug` and free of trait objects.
pub type HashFn = fn(Option<BlockHash>, &[u32]) -> BlockHash;

/// FNV-1a 64-bit offset basis (the hash of the empty input).
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a 64-bit prime.
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a over bytes: for each byte b, `h = (h ^ b) · prime mod 2^64`.
fn fnv1a_bytes(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// FNV-1a 64 of `bytes`: the same hash, for names that are not token blocks (a tenant).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    fnv1a_bytes(FNV_OFFSET, bytes)
}

/// The default block hash: FNV-1a 64 over a tag byte (0 for a first block, 1 for a block with a
/// parent), the parent hash as 8 little-endian bytes (if any), then each token id as 4
/// little-endian bytes. The tag keeps "no parent" distinct from "a parent whose hash is 0".
pub fn fnv1a_block_hash(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
    let mut h = FNV_OFFSET;
    match parent {
        None => h = fnv1a_bytes(h, &[0]),
        Some(BlockHash(p)) => {
            h = fnv1a_bytes(h, &[1]);
            h = fnv1a_bytes(h, &p.to_le_bytes());
        }
    }
    for &t in tokens {
        h = fnv1a_bytes(h, &t.to_le_bytes());
    }
    BlockHash(h)
}

/// The chained hashes of every *full* block of `tokens`: element i names tokens
/// `[0, (i + 1) · block_size)`. Returns an empty vector when `block_size` is 0.
pub fn chain_hashes(hash_fn: HashFn, tokens: &[u32], block_size: usize) -> Vec<BlockHash> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut parent = None;
    tokens
        .chunks_exact(block_size)
        .map(|block| {
            let h = hash_fn(parent, block);
            parent = Some(h);
            h
        })
        .collect()
}
