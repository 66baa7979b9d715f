//! One sequence's map from logical blocks to physical blocks, and the flat arrays a kernel reads.
//!
//! Token position `pos` of a sequence lives in logical block `pos / block_size` at offset
//! `pos % block_size`. The block table turns the logical block into a physical one, and the
//! *slot* is the token's row in the pool, viewed as `(num_blocks · block_size)` rows:
//!
//! ```text
//! slot = block_table[pos / block_size] · block_size + pos % block_size
//! ```
//!
//! A KV cache tensor shaped `(num_blocks, block_size, n_kv_heads, head_dim)` per layer is the
//! same memory as `(num_slots, n_kv_heads, head_dim)`, so writing a token's k and v is a single
//! indexed store at its slot (vLLM's `reshape_and_cache`), and reading position `j` during
//! attention goes through the table again.
//!
//! Sliding-window layers free blocks that fell out of the window; the table keeps `None` there
//! (a hole) so that logical indices, and therefore slot arithmetic, stay stable.

use serde::Serialize;

use crate::prefix_cache::PrefixChain;

/// A physical block id: an index into the pool `0..num_blocks`.
pub type BlockId = u32;

/// Pad value of kernel-facing block tables (`i32`): marks "no block" (a padded column of a short
/// row, or a hole left by a sliding window). Kernels must never dereference it.
pub const PAD_BLOCK: i32 = -1;

/// Pad value of kernel-facing slot mappings (`i64`), as in vLLM: the token's k and v are not
/// stored (its block is a sliding-window hole). Cache-write kernels must skip it.
pub const PAD_SLOT: i64 = -1;

/// The physical blocks of one sequence (for one KV cache group), in logical order.
///
/// Invariant kept by [`crate::BlockAllocator`]: `blocks.len() == ceil(num_tokens / block_size)`,
/// and every `Some(b)` holds one reference on `b`. Tables are filled only by the allocator; the
/// engine reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockTable {
    block_size: usize,
    /// (num_logical_blocks,) physical block per logical block; `None` is a sliding-window hole.
    pub(crate) blocks: Vec<Option<BlockId>>,
    /// Token positions `0..num_tokens` have a slot reserved (written, or being written this step).
    pub(crate) num_tokens: usize,
    /// How far the prefix cache has registered this table's full blocks.
    pub(crate) chain: PrefixChain,
    /// Whose blocks these are: the blocks it registers count against this tenant's quota.
    pub(crate) tenant: Tenant,
    /// The request's cache salt (0: none): its prefix-cache entries are shared only with
    /// tables of the same salt.
    pub(crate) salt: u64,
}

/// Who a request belongs to, for per-tenant prefix-cache quotas (0 when nobody says).
pub type Tenant = u32;

impl BlockTable {
    /// An empty table for blocks of `block_size` tokens.
    pub fn new(block_size: usize) -> Self {
        Self {
            block_size,
            blocks: Vec::new(),
            num_tokens: 0,
            chain: PrefixChain::default(),
            tenant: 0,
            salt: 0,
        }
    }

    /// The same empty table, owned by `tenant`.
    pub fn with_tenant(mut self, tenant: Tenant) -> Self {
        self.tenant = tenant;
        self
    }

    /// The same empty table, salted: its blocks are shared through the prefix cache only with
    /// tables of the same `salt` (0: unsalted, shared with every unsalted table).
    pub fn with_salt(mut self, salt: u64) -> Self {
        self.salt = salt;
        self
    }

    /// The cache salt (0: none).
    pub fn salt(&self) -> u64 {
        self.salt
    }

    /// The tenant whose quota this table's cached blocks count against.
    pub fn tenant(&self) -> Tenant {
        self.tenant
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Number of token positions with a reserved slot.
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    /// The table itself: `(num_logical_blocks,)`, `None` for holes.
    pub fn blocks(&self) -> &[Option<BlockId>] {
        &self.blocks
    }

    /// Number of physical blocks this table holds a reference on (holes excluded).
    pub fn num_held_blocks(&self) -> usize {
        self.blocks.iter().flatten().count()
    }

    /// The slot of token position `pos`, or `None` when `pos` has no slot reserved or its block
    /// is a hole. `slot = block · block_size + pos mod block_size`.
    pub fn slot(&self, pos: usize) -> Option<i64> {
        if pos >= self.num_tokens || self.block_size == 0 {
            return None;
        }
        let block = self.blocks.get(pos / self.block_size).copied().flatten()?;
        let slot = block as usize * self.block_size + pos % self.block_size;
        i64::try_from(slot).ok()
    }

    /// Kernel-facing slots for consecutive positions, `PAD_SLOT` where [`Self::slot`] is `None`.
    /// Shape `(positions.len(),)`.
    pub fn slot_mapping(&self, positions: std::ops::Range<usize>) -> Vec<i64> {
        positions
            .map(|pos| self.slot(pos).unwrap_or(PAD_SLOT))
            .collect()
    }

    /// Kernel-facing row `(num_logical_blocks,)` of `i32` block ids, `PAD_BLOCK` for holes.
    pub fn to_row(&self) -> Vec<i32> {
        self.blocks
            .iter()
            .map(|b| b.map_or(PAD_BLOCK, |id| i32::try_from(id).unwrap_or(PAD_BLOCK)))
            .collect()
    }
}

/// The block tables of a batch padded into one rectangle, exactly as a paged-attention kernel
/// takes them: `data` is `(num_seqs, max_blocks_per_seq)` row-major `i32`, short rows and holes
/// filled with [`PAD_BLOCK`] (-1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PaddedBlockTables {
    /// Rows: one per sequence of the batch.
    pub num_seqs: usize,
    /// Columns: the longest table of the batch.
    pub max_blocks_per_seq: usize,
    /// (num_seqs, max_blocks_per_seq) row-major.
    pub data: Vec<i32>,
}

impl PaddedBlockTables {
    /// Pads kernel-facing rows (as from [`BlockTable::to_row`]) to the longest one.
    pub fn from_rows<R: AsRef<[i32]>>(rows: &[R]) -> Self {
        let num_seqs = rows.len();
        let max_blocks_per_seq = rows.iter().map(|r| r.as_ref().len()).max().unwrap_or(0);
        let mut data = vec![PAD_BLOCK; num_seqs * max_blocks_per_seq];
        for (i, row) in rows.iter().enumerate() {
            let row = row.as_ref();
            let start = i * max_blocks_per_seq;
            data[start..start + row.len()].copy_from_slice(row);
        }
        Self {
            num_seqs,
            max_blocks_per_seq,
            data,
        }
    }

    /// Pads the given tables.
    pub fn from_tables(tables: &[&BlockTable]) -> Self {
        let rows: Vec<Vec<i32>> = tables.iter().map(|t| t.to_row()).collect();
        Self::from_rows(&rows)
    }

    /// Row `seq` (`max_blocks_per_seq` entries), or `None` when out of range.
    pub fn row(&self, seq: usize) -> Option<&[i32]> {
        if seq >= self.num_seqs {
            return None;
        }
        let start = seq * self.max_blocks_per_seq;
        self.data.get(start..start + self.max_blocks_per_seq)
    }
}
