//! Reserving the slots of a step's tokens in a block table, copying shared blocks first.
//!
//! Appending `n` tokens to a table that holds `t` touches logical blocks `t / block_size ..=
//! (t + n - 1) / block_size`. Each one is, in this order of checks:
//!
//! * the existing partial last block, held alone (ref count 1): written in place;
//! * the existing partial last block, shared (ref count > 1, after a fork): **copy-on-write**,
//!   a fresh block replaces it in this table and the engine copies `src → dst` first;
//! * a new block (or a hole being refilled): taken from the pool, unless every position in it
//!   is below `keep_from`, in which case it stays a hole and its tokens get `PAD_SLOT`.
//!
//! `keep_from` exists for sliding-window groups: keys at positions below it are never read
//! after this step (see `window.rs`), so they need no memory. Full-attention groups pass 0.
//!
//! **Copy-on-write.** A block with ref count > 1 is never written: when a sequence must write
//! into a shared partial block (after a fork), `append_slots` gives it a fresh block and returns
//! a [`BlockCopy`] `src → dst` that the engine must perform *before* any k/v write of the step.

use serde::Serialize;

use crate::{BlockAllocator, BlockId, BlockTable, PagedError, Result};

/// Copy every slot of physical block `src` into block `dst` (all layers of the group, k and v):
/// the copy-on-write order the engine executes before the step's writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BlockCopy {
    /// The shared block to read (its ref count stays above 1).
    pub src: BlockId,
    /// The sequence's fresh block that receives the copy and then the step's writes.
    pub dst: BlockId,
}

/// What appending does to one logical block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    InPlace,
    Copy(BlockId),
    Fresh,
    Hole,
}

impl BlockAllocator {
    /// Fresh blocks that appending `n` tokens to `table` would take (new blocks plus
    /// copy-on-write copies). Positions below `keep_from` need no block (pass 0 to keep all).
    ///
    /// # Errors
    /// [`PagedError::BlockSizeMismatch`] / [`PagedError::InvalidBlock`] if the table does not
    /// belong to this allocator; [`PagedError::InvalidRequest`] if `num_tokens + n` overflows.
    pub fn blocks_needed_to_append(
        &self,
        table: &BlockTable,
        n: usize,
        keep_from: usize,
    ) -> Result<usize> {
        let mut need = 0;
        for j in self.touched_blocks(table, n)? {
            if matches!(self.plan(table, j, keep_from)?, Plan::Copy(_) | Plan::Fresh) {
                need += 1;
            }
        }
        Ok(need)
    }

    /// Whether the next single token of `table` (full attention) can get its slot now: either
    /// it fits the last block in place, or one free block is there for a new or copied block.
    pub fn can_append(&self, table: &BlockTable) -> bool {
        self.blocks_needed_to_append(table, 1, 0)
            .is_ok_and(|need| need <= self.num_free_blocks())
    }

    /// Reserves the slot of the next token of `table` (full attention). Returns the block copy
    /// the engine must do before writing, if the last block was shared.
    ///
    /// # Errors
    /// As [`Self::append_slots`].
    pub fn append_slot(&mut self, table: &mut BlockTable) -> Result<Option<BlockCopy>> {
        Ok(self.append_slots(table, 1, 0)?.pop())
    }

    /// Reserves slots for the next `n` tokens of `table`; positions below `keep_from` get no
    /// block where a whole block would lie below it. Returns the copy-on-write copies that the
    /// engine must perform before any k/v write of the step. A shared block is never written:
    /// after this call every block the step writes has ref count 1.
    ///
    /// # Errors
    /// [`PagedError::OutOfBlocks`] (nothing changes) if the pool lacks the blocks; ask
    /// [`Self::blocks_needed_to_append`] first. [`PagedError::BlockSizeMismatch`] /
    /// [`PagedError::InvalidBlock`] if the table does not belong to this allocator;
    /// [`PagedError::InvalidRequest`] if the table would outgrow `i32` block indices.
    pub fn append_slots(
        &mut self,
        table: &mut BlockTable,
        n: usize,
        keep_from: usize,
    ) -> Result<Vec<BlockCopy>> {
        let need = self.blocks_needed_to_append(table, n, keep_from)?;
        self.ensure_free(need)?;
        let mut copies = Vec::new();
        for j in self.touched_blocks(table, n)? {
            let block = match self.plan(table, j, keep_from)? {
                Plan::InPlace => continue,
                Plan::Hole => None,
                Plan::Fresh => Some(self.alloc_one()?),
                Plan::Copy(src) => {
                    let dst = self.alloc_one()?;
                    self.release(src);
                    self.stats.num_cow_copies += 1;
                    copies.push(BlockCopy { src, dst });
                    Some(dst)
                }
            };
            match table.blocks.get_mut(j) {
                Some(slot) => *slot = block,
                None => table.blocks.push(block),
            }
        }
        table.num_tokens += n;
        Ok(copies)
    }

    /// Logical blocks that appending `n` tokens touches (empty for `n == 0`).
    fn touched_blocks(&self, table: &BlockTable, n: usize) -> Result<std::ops::Range<usize>> {
        self.check_block_size(table)?;
        let t = table.num_tokens;
        let bs = self.block_size;
        let too_long = || {
            PagedError::InvalidRequest(format!(
                "appending {n} tokens to {t} would exceed i32::MAX logical blocks"
            ))
        };
        let end = t.checked_add(n).ok_or_else(too_long)?;
        if end.div_ceil(bs) > i32::MAX as usize {
            return Err(too_long());
        }
        if n == 0 {
            return Ok(0..0);
        }
        Ok(t / bs..(end - 1) / bs + 1)
    }

    /// What appending does to logical block `j` (a query; validates the block it reads).
    fn plan(&self, table: &BlockTable, j: usize, keep_from: usize) -> Result<Plan> {
        let keep = (j + 1).saturating_mul(self.block_size) > keep_from;
        Ok(match table.blocks.get(j).copied().flatten() {
            Some(b) => {
                self.check_held(b)?;
                if self.ref_counts[b as usize] > 1 {
                    Plan::Copy(b)
                } else {
                    Plan::InPlace
                }
            }
            None if keep => Plan::Fresh,
            None => Plan::Hole,
        })
    }
}
