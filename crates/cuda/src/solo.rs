//! Single-sequence mode's block bookkeeping (the `Engine` trait drives one sequence at a time,
//! with no scheduler): one `BlockAllocator` per KV group, prefix caching off, and per sequence a
//! `BlockTable` per group. Each step reserves slots exactly as `kvlab_paged::Scheduler` does —
//! free the sliding-window blocks the next query cannot reach, then `append_slots` with
//! `keep_from = window_start(end, window)` — and describes itself as a one-sequence
//! `ScheduledSeq`, which the batched forward pass then runs. Pure data, tested on the CPU.

use kvlab_paged::{BlockAllocator, BlockTable, GroupStep, ScheduledSeq, StepKind, window_start};

use crate::error::{CudaError, Result};

/// One sequence's tables and length.
#[derive(Debug, Clone)]
pub struct SoloSeq {
    /// (num_groups,)
    pub tables: Vec<BlockTable>,
    /// Positions whose K and V are in the pool.
    pub len: usize,
    pub max_seq_len: usize,
    /// Group 0's slots of the last step, for `Engine::trace`.
    pub last_slots: Vec<i64>,
}

/// The pools of single-sequence mode.
#[derive(Debug, Clone)]
pub struct SoloPools {
    pub allocators: Vec<BlockAllocator>,
    /// (num_groups,) `None` global, `Some(window)` sliding window.
    pub windows: Vec<Option<usize>>,
}

impl SoloPools {
    /// Pools of `num_blocks` blocks of `block_size` for each group.
    ///
    /// # Errors
    /// Sizes the allocator refuses.
    pub fn new(windows: Vec<Option<usize>>, num_blocks: usize, block_size: usize) -> Result<Self> {
        let allocators = windows
            .iter()
            .map(|_| {
                BlockAllocator::new(num_blocks, block_size).map(|a| a.with_prefix_caching(false))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(SoloPools {
            allocators,
            windows,
        })
    }

    /// An empty sequence.
    pub fn new_seq(&self, max_seq_len: usize) -> SoloSeq {
        let bs = self
            .allocators
            .first()
            .map_or(1, BlockAllocator::block_size);
        SoloSeq {
            tables: vec![BlockTable::new(bs); self.windows.len()],
            len: 0,
            max_seq_len,
            last_slots: Vec::new(),
        }
    }

    /// Reserves the slots of `tokens` at the sequence's next positions in every group (all or
    /// none) and returns the step. The caller adds `tokens.len()` to `seq.len` once the step ran.
    ///
    /// # Errors
    /// [`CudaError::PoolFull`] when a group lacks free blocks (nothing reserved).
    pub fn reserve(&mut self, seq: &mut SoloSeq, id: u64, tokens: &[u32]) -> Result<ScheduledSeq> {
        let (pos0, n) = (seq.len, tokens.len());
        let end = pos0 + n;
        for ((alloc, table), w) in self
            .allocators
            .iter_mut()
            .zip(&mut seq.tables)
            .zip(&self.windows)
        {
            if let Some(w) = *w {
                alloc.free_outside_window(table, pos0, w)?;
            }
        }
        let keep = |w: &Option<usize>| w.map_or(0, |w| window_start(end, w));
        for ((alloc, table), w) in self.allocators.iter().zip(&seq.tables).zip(&self.windows) {
            if alloc.blocks_needed_to_append(table, n, keep(w))? > alloc.num_free_blocks() {
                return Err(CudaError::PoolFull {
                    num_blocks: alloc.num_blocks(),
                    block_size: alloc.block_size(),
                });
            }
        }
        let mut groups = Vec::with_capacity(self.windows.len());
        for ((alloc, table), w) in self
            .allocators
            .iter_mut()
            .zip(&mut seq.tables)
            .zip(&self.windows)
        {
            let block_copies = alloc.append_slots(table, n, keep(w))?;
            groups.push(GroupStep {
                slot_mapping: table.slot_mapping(pos0..end),
                block_table: table.to_row(),
                block_copies,
            });
        }
        seq.last_slots = groups
            .first()
            .map(|g| g.slot_mapping.clone())
            .unwrap_or_default();
        Ok(ScheduledSeq {
            seq_id: kvlab_paged::SeqId(id),
            token_ids: tokens.to_vec(),
            positions: (pos0..end).collect(),
            context_len: end,
            kind: if n == 1 && pos0 > 0 {
                StepKind::Decode
            } else {
                StepKind::Prefill {
                    num_cached_tokens: 0,
                    is_recompute: false,
                }
            },
            groups,
        })
    }

    /// Returns every block of `seq` to the pools.
    pub fn free(&mut self, seq: &mut SoloSeq) {
        for (alloc, table) in self.allocators.iter_mut().zip(&mut seq.tables) {
            // A table built by these pools always belongs to its allocator.
            let _ = alloc.free(table);
        }
    }

    /// Blocks in use in group `g`.
    pub fn used_blocks(&self, g: usize) -> usize {
        self.allocators
            .get(g)
            .map_or(0, BlockAllocator::num_used_blocks)
    }
}

#[cfg(test)]
mod tests {
    use kvlab_paged::{ScheduledBatch, max_window_blocks};

    use super::*;
    use crate::launch::{PackGeometry, pack_step};

    fn geometry(windows: Vec<Option<usize>>, num_blocks: usize) -> PackGeometry {
        PackGeometry {
            vocab_size: 1000,
            max_positions: 4096,
            num_blocks,
            block_size: 16,
            windows,
        }
    }

    /// A prefill then 300 decodes with a global and a 40-token window group: every step packs
    /// (slots agree with tables, every cached key a query reads has a block), the window group
    /// never holds more than ceil(40/16)+1 blocks, and freeing returns everything.
    #[test]
    fn windowed_steps_pack_and_stay_bounded() {
        let windows = vec![None, Some(40)];
        let mut pools = SoloPools::new(windows.clone(), 64, 16).unwrap();
        let mut seq = pools.new_seq(1024);
        let geom = geometry(windows, 64);
        let prompt: Vec<u32> = (0..70).map(|i| i % 900 + 1).collect();
        let mut tokens = prompt;
        for step in 0..301 {
            let s = pools.reserve(&mut seq, 7, &tokens).unwrap();
            assert_eq!(s.positions[0], seq.len);
            let batch = ScheduledBatch {
                seqs: vec![s],
                preempted: vec![],
            };
            let p = pack_step(&batch.model_input(), &geom)
                .unwrap_or_else(|e| panic!("step {step}: {e}"));
            assert_eq!(p.n_decode, usize::from(step > 0));
            seq.len += tokens.len();
            assert!(
                pools.used_blocks(1) <= max_window_blocks(40, 16),
                "step {step}"
            );
            assert_eq!(pools.used_blocks(0), seq.len.div_ceil(16));
            tokens = vec![5];
        }
        pools.free(&mut seq);
        assert_eq!((pools.used_blocks(0), pools.used_blocks(1)), (0, 0));
    }

    #[test]
    fn a_full_pool_is_refused_without_reserving() {
        let mut pools = SoloPools::new(vec![None], 2, 16).unwrap();
        let mut a = pools.new_seq(64);
        pools.reserve(&mut a, 0, &[1; 20]).unwrap();
        a.len = 20;
        let mut b = pools.new_seq(64);
        let e = pools.reserve(&mut b, 1, &[1; 17]).unwrap_err();
        assert!(e.to_string().contains("KV pool is full"), "{e}");
        assert_eq!(pools.used_blocks(0), 2);
        assert!(b.tables[0].blocks().is_empty());
    }
}
