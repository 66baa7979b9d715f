//! Sliding-window layers: free the blocks that no future query can attend to.
//!
//! With a window of `W` tokens the query at position `p` attends to the keys at positions
//! `p - W + 1 ..= p` (W keys, itself included; Mistral's layers, Gemma 3's local layers with
//! W = 512). Once a sequence has computed positions `0..num_computed`, the next query is at
//! `num_computed`, so every key below `num_computed + 1 - W` ([`window_start`]) is dead for
//! good, and a block whose positions all lie below it can return to the pool.
//!
//! **Layer groups.** A model that mixes global (full-attention) and local (sliding-window) layers
//! keeps one KV cache *group* per kind. Each group has its own [`crate::BlockAllocator`] (its own
//! pool: the engine allocates one cache tensor per group, `(n_layers_in_group, num_blocks_g,
//! block_size, n_kv_heads, head_dim)`), and each sequence has one [`BlockTable`] per group. The
//! global group grows with the sequence; the local group's table keeps a hole (`None`) for every
//! block behind the window, so its logical indices (and slot arithmetic) stay the same as the
//! global group's, while it holds at most `ceil(W / block_size) + 1` blocks at any time (a span
//! of `W` positions touches at most that many blocks) — 33 for W = 512, block_size = 16, however
//! long the sequence. Separate pools (rather than vLLM v1's one shared pool) keep each group's
//! page size free and make the memory of each group a number the engine can state.
//!
//! The scheduler trims before each step and right after it, and reserves a prefill's slots with
//! `keep_from = window_start(end_of_step)`: keys that only this step's own queries read get
//! [`crate::PAD_SLOT`] and no memory, so a 100k-token prompt still takes ~W/block_size blocks in
//! the local group. The engine then takes those keys from the step's in-flight k/v (as vLLM v0's
//! sliding-window prefill did).
//!
//! **Prefix caching** works in local groups too: a prefix hit there needs only the blocks the
//! first uncached query can see, so the levels behind the window are adopted as holes (their
//! content stays verified through ghost entries, see `prefix.rs` and
//! `prefix_cache.rs`), and a hit counts only if every group can serve it.

use crate::{BlockAllocator, BlockId, BlockTable, PagedError, Result};

/// The first key position that the query at `next_pos` (or any later one) attends to under a
/// window of `window` tokens: `max(0, next_pos + 1 - window)`.
pub fn window_start(next_pos: usize, window: usize) -> usize {
    next_pos.saturating_add(1).saturating_sub(window)
}

/// The most blocks a sliding-window table holds at once: a span of `window` positions touches at
/// most `ceil(window / block_size) + 1` blocks (only `ceil` when the span is block-aligned).
pub fn max_window_blocks(window: usize, block_size: usize) -> usize {
    if block_size == 0 {
        return 0;
    }
    window.div_ceil(block_size) + 1
}

impl BlockAllocator {
    /// Frees every block of `table` whose positions all lie below
    /// [`window_start`]`(num_computed, window)`, leaves a hole (`None`) in its place so logical
    /// indices stay stable, and returns the freed block ids in logical order. Idempotent: holes
    /// are skipped, so calling it every step costs only the newly dead blocks.
    ///
    /// `num_computed` is the sequence's current length in the cache: the number of positions
    /// whose k and v are written, which is also the position of the next query.
    ///
    /// # Errors
    /// [`PagedError::InvalidWindow`] if `window` is 0; [`PagedError::BlockSizeMismatch`] /
    /// [`PagedError::InvalidBlock`] (nothing is freed) if the table does not belong to this
    /// allocator.
    pub fn free_outside_window(
        &mut self,
        table: &mut BlockTable,
        num_computed: usize,
        window: usize,
    ) -> Result<Vec<BlockId>> {
        if window == 0 {
            return Err(PagedError::InvalidWindow { window });
        }
        self.check_table(table)?;
        let dead_blocks = window_start(num_computed, window) / self.block_size;
        let end = dead_blocks.min(table.blocks.len());
        let mut freed = Vec::new();
        for entry in &mut table.blocks[..end] {
            if let Some(block) = entry.take() {
                freed.push(block);
            }
        }
        for &block in freed.iter().rev() {
            self.release(block);
        }
        Ok(freed)
    }
}
