//! int4 keys on the device: which f32 residual holds the keys of a block still filling.
//!
//! KIVI quantizes keys per channel over a group of tokens (keys have outlier channels); in the
//! paged pool the group is the block, so a block's keys are quantized only when its last row
//! arrives, and until then they stay in f32: the residual. kvlab-cpu's `KvStore` keeps one per
//! open group; the device pool has a fixed number of them, `(capacity, block_size, kv_dim)` f32
//! per layer, and this map, kept on the host, hands them out step by step and says what the
//! kernels do with them (`kernels/cache.cu`):
//!
//! 1. *close early*: a residual is taken back from the block least recently written that the
//!    step does not touch (a freed block's, in practice), quantizing what it holds;
//! 2. *copies*: a copy-on-write copy of a block still filling copies its residual too;
//! 3. *open*: a complete block written again (a truncated sequence going on) is decoded back
//!    into a residual first, so its other rows read as before — unless the step writes its row
//!    0, after which every row is written again before the block completes;
//! 4. the step's keys go to their blocks' residuals (`write_map`);
//! 5. *close*: a block whose last row the step writes is quantized, and its residual is free.
//!
//! Attention then reads `read_map`: the map after the closes. This is kvlab-cpu's order (a group
//! is quantized as its last row is written, before attention reads the pool), so both engines
//! quantize the same rows. The one difference: kvlab-cpu never takes a residual back; here a
//! block closed early and written again later reads back its early rows quantized over a range
//! that included rows not written yet. `capacity_for` sizes the pool so that this needs more
//! sequences holding a block still filling than the scheduler runs at once. A block restored
//! from a tier (`restore`) protects only itself, so with every residual held it can close
//! early a block that a sequence not in the step still fills.

use std::collections::HashSet;

use crate::error::{CudaError, Result};

/// The residual map of one KV cache group (every layer of the group shares it).
#[derive(Clone, Debug)]
pub struct Residuals {
    block_size: usize,
    /// (num_blocks,) the residual holding each block's keys, -1 once they are quantized.
    of_block: Vec<i32>,
    /// (capacity,) the block each residual holds, -1 when free.
    holder: Vec<i32>,
    /// (capacity,) the step each residual was last written in.
    last_used: Vec<u64>,
    step: u64,
    /// Whether a residual was taken or given back since the last plan (by a step or by
    /// `restore`): the maps on the device are out of date.
    moved: bool,
    /// Blocks closed early so far (see the module).
    pub early_closes: u64,
}

/// What one step does with the residuals, in the order the kernels run it. Pairs are i32, as
/// the kernels take them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResidualPlan {
    /// (block, residual): quantize before anything else, the residual is then another block's.
    pub close_early: Vec<[i32; 2]>,
    /// (src residual, dst residual): after the block copies.
    pub copies: Vec<[i32; 2]>,
    /// (block, residual): decode the block's keys into the residual, before the writes.
    pub open: Vec<[i32; 2]>,
    /// (block, residual): quantize after the writes.
    pub close: Vec<[i32; 2]>,
    /// (num_blocks,) the map while the step writes its keys.
    pub write_map: Vec<i32>,
    /// (num_blocks,) the map after `close`: what attention reads.
    pub read_map: Vec<i32>,
    /// Whether the maps differ from the last plan's read map (a residual was taken or given
    /// back since, in this step or by `restore`). When not, the maps on the device are current:
    /// every block the step writes already had its residual.
    pub changed: bool,
}

impl Residuals {
    /// A map for `num_blocks` blocks of `block_size` rows with `capacity` residuals, every
    /// block quantized (a zeroed block decodes to zeros, as kvlab-cpu's does).
    pub fn new(num_blocks: usize, block_size: usize, capacity: usize) -> Residuals {
        Residuals {
            block_size: block_size.max(1),
            of_block: vec![-1; num_blocks],
            holder: vec![-1; capacity],
            last_used: vec![0; capacity],
            step: 0,
            moved: false,
            early_closes: 0,
        }
    }

    /// Residuals a pool needs so that no block a running sequence still fills is ever closed
    /// early: one per sequence of a step (its last block), plus the blocks one step's tokens
    /// can span, plus one; never more than the blocks.
    pub fn capacity_for(
        num_blocks: usize,
        block_size: usize,
        max_seqs: usize,
        max_batch_tokens: usize,
    ) -> usize {
        (max_seqs + max_batch_tokens.div_ceil(block_size.max(1)) + 1).clamp(1, num_blocks.max(1))
    }

    /// Residuals in the pool.
    pub fn capacity(&self) -> usize {
        self.holder.len()
    }

    /// The residual holding `block`'s keys, `None` once they are quantized.
    pub fn residual_of(&self, block: usize) -> Option<usize> {
        let r = *self.of_block.get(block)?;
        usize::try_from(r).ok()
    }

    /// Plans one step: block copies `copies` (src, dst) and key slots `slots` (-1 = not
    /// stored), as the step's metadata gives them (already checked to lie in the pool).
    ///
    /// # Errors
    /// [`CudaError::OutOfMemory`] when the step writes or copies more blocks than there are
    /// residuals; the map is then unchanged.
    pub fn plan_step(&mut self, copies: &[[i32; 2]], slots: &[i64]) -> Result<ResidualPlan> {
        self.step += 1;
        let bs = self.block_size as i64;
        // Blocks in first-write order with the lowest row the step writes and whether it
        // writes the last one.
        let mut written: Vec<(i32, i64, bool)> = Vec::new();
        for &slot in slots.iter().filter(|&&s| s >= 0) {
            let (block, row) = ((slot / bs) as i32, slot % bs);
            match written.iter_mut().find(|w| w.0 == block) {
                Some(w) => {
                    w.1 = w.1.min(row);
                    w.2 |= row == bs - 1;
                }
                None => written.push((block, row, row == bs - 1)),
            }
        }
        let touched: HashSet<i32> = copies
            .iter()
            .flatten()
            .copied()
            .chain(written.iter().map(|w| w.0))
            .collect();
        // `take` finds a residual whenever the touched blocks fit in the pool (at most
        // capacity − 1 others hold one); checked before anything changes.
        if touched.len() > self.capacity() {
            return Err(CudaError::OutOfMemory(format!(
                "int4 keys: a step writes or copies {} blocks, more than the pool's {} \
                 residuals; lower max_batch_tokens or max_seqs",
                touched.len(),
                self.capacity()
            )));
        }
        let mut plan = ResidualPlan::default();
        for &[src, dst] in copies {
            match self.residual_of(src as usize) {
                Some(rs) => {
                    let rd = match self.residual_of(dst as usize) {
                        Some(rd) => rd,
                        None => self.take(dst, &touched, &mut plan.close_early)?,
                    };
                    plan.copies.push([rs as i32, rd as i32]);
                }
                // A quantized source: the copy is quantized too.
                None => self.release(dst),
            }
        }
        for &(block, first_row, closes) in &written {
            let r = match self.residual_of(block as usize) {
                Some(r) => r,
                None => {
                    let r = self.take(block, &touched, &mut plan.close_early)?;
                    if first_row > 0 {
                        plan.open.push([block, r as i32]);
                    }
                    r
                }
            };
            self.last_used[r] = self.step;
            if closes {
                plan.close.push([block, r as i32]);
            }
        }
        plan.write_map = self.of_block.clone();
        for &[block, _] in &plan.close {
            self.release(block);
        }
        plan.read_map = self.of_block.clone();
        plan.changed = std::mem::take(&mut self.moved);
        Ok(plan)
    }

    /// A block restored from a tier: `open` if its bytes carry a residual. Returns the residual
    /// to fill (for an open block) and the blocks to close early first, as
    /// [`ResidualPlan::close_early`].
    ///
    /// # Errors
    /// As [`Residuals::plan_step`].
    pub fn restore(&mut self, block: usize, open: bool) -> Result<(Option<usize>, Vec<[i32; 2]>)> {
        let mut close_early = Vec::new();
        let b = block as i32;
        if !open {
            self.release(b);
            return Ok((None, close_early));
        }
        self.step += 1;
        let r = match self.residual_of(block) {
            Some(r) => r,
            None => self.take(b, &HashSet::from([b]), &mut close_early)?,
        };
        self.last_used[r] = self.step;
        Ok((Some(r), close_early))
    }

    /// A free residual for `block`, or the least recently written one of a block not in
    /// `touched`, whose block is then closed early (pushed to `close_early`).
    fn take(
        &mut self,
        block: i32,
        touched: &HashSet<i32>,
        close_early: &mut Vec<[i32; 2]>,
    ) -> Result<usize> {
        let r = match self.holder.iter().position(|&h| h < 0) {
            Some(r) => r,
            None => {
                let r = (0..self.holder.len())
                    .filter(|&r| !touched.contains(&self.holder[r]))
                    .min_by_key(|&r| self.last_used[r])
                    .ok_or_else(|| {
                        CudaError::OutOfMemory(format!(
                            "int4 keys: no residual is free for block {block} of {} touched",
                            touched.len()
                        ))
                    })?;
                let old = self.holder[r];
                close_early.push([old, r as i32]);
                self.of_block[old as usize] = -1;
                self.early_closes += 1;
                r
            }
        };
        self.holder[r] = block;
        self.of_block[block as usize] = r as i32;
        self.moved = true;
        Ok(r)
    }

    /// `block`'s keys are quantized: its residual, if any, is free.
    fn release(&mut self, block: i32) {
        if let Some(r) = self.residual_of(block as usize) {
            self.holder[r] = -1;
            self.of_block[block as usize] = -1;
            self.moved = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots of rows `rows` of `block` (block_size 4).
    fn slots(block: i64, rows: std::ops::Range<i64>) -> Vec<i64> {
        rows.map(|r| block * 4 + r).collect()
    }

    #[test]
    fn a_block_fills_in_its_residual_and_closes_on_its_last_row() {
        let mut m = Residuals::new(8, 4, 3);
        // A prefill of 6 tokens: block 2 complete (closed this step), block 5 holds 2 rows.
        let s: Vec<i64> = [slots(2, 0..4), slots(5, 0..2)].concat();
        let p = m.plan_step(&[], &s).unwrap();
        assert!(p.open.is_empty(), "row 0 is written: nothing to decode");
        assert_eq!(p.close, vec![[2, 0]]);
        assert_eq!((p.write_map[2], p.write_map[5]), (0, 1));
        assert_eq!((p.read_map[2], p.read_map[5]), (-1, 1));
        assert_eq!((m.residual_of(2), m.residual_of(5)), (None, Some(1)));
        assert!(p.changed);
        // Decodes: rows 2 and 3 of block 5; it closes on row 3 and its residual is free again.
        let p = m.plan_step(&[], &slots(5, 2..3)).unwrap();
        assert_eq!((p.close.len(), p.read_map[5]), (0, 1));
        assert!(
            !p.changed,
            "a row into a block's own residual changes no map"
        );
        let p = m.plan_step(&[], &slots(5, 3..4)).unwrap();
        assert_eq!(p.close, vec![[5, 1]]);
        assert!(p.changed);
        assert_eq!(p.read_map, vec![-1; 8]);
        assert_eq!(m.early_closes, 0);
    }

    /// A complete block written again from a row past 0 (a truncated sequence going on) is
    /// decoded back first, as kvlab-cpu reopens a quantized group.
    #[test]
    fn a_complete_block_written_again_is_opened_first() {
        let mut m = Residuals::new(4, 4, 2);
        m.plan_step(&[], &slots(1, 0..4)).unwrap();
        let p = m.plan_step(&[], &slots(1, 2..3)).unwrap();
        assert_eq!(p.open, vec![[1, 0]]);
        assert_eq!(p.read_map[1], 0);
    }

    /// A copy of a block still filling copies its residual; a copy of a quantized one frees the
    /// destination's.
    #[test]
    fn copies_carry_residuals() {
        let mut m = Residuals::new(6, 4, 4);
        m.plan_step(&[], &slots(0, 0..2)).unwrap();
        m.plan_step(&[], &slots(3, 0..4)).unwrap();
        // Block 0 (open, residual 0) → 1, then row 2 of block 1; block 3 (quantized) → 4.
        let p = m.plan_step(&[[0, 1], [3, 4]], &slots(1, 2..3)).unwrap();
        assert_eq!(p.copies, vec![[0, 1]]);
        assert!(p.open.is_empty(), "the copy is open already");
        assert_eq!((p.read_map[0], p.read_map[1], p.read_map[4]), (0, 1, -1));
    }

    /// With every residual held, the least recently written one of a block the step does not
    /// touch is taken back, its block closed first; with none to take the step is refused.
    #[test]
    fn a_full_map_closes_the_stalest_untouched_block_early() {
        let mut m = Residuals::new(8, 4, 2);
        m.plan_step(&[], &slots(0, 0..1)).unwrap(); // residual 0
        m.plan_step(&[], &slots(1, 0..1)).unwrap(); // residual 1
        m.plan_step(&[], &slots(0, 1..2)).unwrap(); // block 0 written again: block 1 is stalest
        let p = m.plan_step(&[], &slots(2, 0..1)).unwrap();
        assert_eq!(p.close_early, vec![[1, 1]]);
        assert_eq!((p.read_map[1], p.read_map[2]), (-1, 1));
        assert_eq!(m.early_closes, 1);
        let three: Vec<i64> = [slots(4, 0..1), slots(5, 0..1), slots(6, 0..1)].concat();
        let before = m.clone();
        let e = m.plan_step(&[], &three).unwrap_err();
        assert!(e.to_string().contains("residuals"), "{e}");
        assert_eq!(
            m.of_block, before.of_block,
            "a refused step changes nothing"
        );
    }

    #[test]
    fn restored_blocks_take_or_free_a_residual() {
        let mut m = Residuals::new(4, 4, 1);
        m.plan_step(&[], &slots(0, 0..1)).unwrap();
        let (r, early) = m.restore(2, true).unwrap();
        assert_eq!((r, early), (Some(0), vec![[0, 0]]));
        assert_eq!(m.restore(2, false).unwrap(), (None, vec![]));
        assert_eq!(m.residual_of(2), None);
        // The next step's maps carry what the restores changed, even if the step moves nothing.
        assert!(m.plan_step(&[], &[]).unwrap().changed);
        assert!(!m.plan_step(&[], &[]).unwrap().changed);
        assert_eq!(Residuals::capacity_for(1000, 16, 8, 100), 8 + 7 + 1);
        assert_eq!(Residuals::capacity_for(4, 16, 8, 100), 4);
    }
}
