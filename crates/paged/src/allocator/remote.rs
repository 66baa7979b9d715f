//! The pool's side of the remote tier ([`crate::tier::RemoteTier`]): the full blocks this pool
//! computed since last asked, for the remote tier to write, and the levels it fetched, adopted
//! as tiered entries so that the hit search finds them like spilled ones.

use super::salted;
use crate::prefix_cache::{EntryId, Lookup};
use crate::{BlockAllocator, BlockId, Tenant};

impl BlockAllocator {
    /// Starts (or stops) listing the contents `register_full_blocks` stores for the first time.
    pub(crate) fn list_newly_cached(&mut self, on: bool) {
        self.newly_cached = on.then(Vec::new);
    }

    /// (level, block) of each content stored for the first time since the last call.
    pub(crate) fn take_newly_cached(&mut self) -> Vec<(usize, BlockId)> {
        self.newly_cached
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Adopts levels of the prompt `tokens` (salted `salt`) that the remote tier fetched:
    /// `fetched` holds (level, bytes) in increasing level order. The walk from level 0 to the
    /// last fetched level makes an entry (a ghost, no block) of each level the cache does not
    /// know — the fetched value's prefix digest proved the tokens before it — and each fetched
    /// level that no block holds and no tier holds becomes tiered. Returns those levels'
    /// (entry, bytes) for the store; the walk stops at a hash collision.
    pub(crate) fn adopt_fetched(
        &mut self,
        tokens: &[u32],
        salt: u64,
        fetched: Vec<(usize, Box<[u8]>)>,
        tenant: Tenant,
    ) -> Vec<(EntryId, Box<[u8]>)> {
        let Some(last) = fetched.last().map(|(level, _)| *level) else {
            return Vec::new();
        };
        let mut fetched = fetched.into_iter().peekable();
        let mut out = Vec::new();
        let mut parent = None;
        let blocks = tokens.chunks_exact(self.block_size).take(last + 1);
        for (level, block_tokens) in blocks.enumerate() {
            let key = salted(block_tokens, salt, level);
            let bytes = fetched.next_if(|(l, _)| *l == level).map(|(_, b)| b);
            let (hash, entry) = match self.cache.lookup(parent, &key) {
                Lookup::Hit { hash, entry, .. } => (hash, entry),
                Lookup::Miss { hash } => {
                    let p = parent.map(|(_, e)| e);
                    (hash, self.cache.insert(None, hash, p, &key, tenant))
                }
                Lookup::Collision { .. } => break,
            };
            if let Some(bytes) = bytes
                && self.cache.hold_fetched(entry)
            {
                out.push((entry, bytes));
            }
            parent = Some((hash, entry));
        }
        // Every ghost the walk made has a child but the last, which is held if it was fetched;
        // if it was not (a collision, a tier that refused it), this drops it and its chain.
        if let Some((_, entry)) = parent {
            self.cache.pin(entry);
            self.cache.unpin(entry);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use crate::{BlockAllocator, BlockTable};

    fn pool() -> BlockAllocator {
        BlockAllocator::new(8, 4)
            .unwrap()
            .with_tier(Some((4, None)))
    }

    #[test]
    fn fetched_levels_become_tiered_ghosts_that_the_hit_search_restores() {
        let mut a = pool();
        let prompt: Vec<u32> = (1..=13).collect();
        let bytes = |b: u8| vec![b; 8].into_boxed_slice();
        let held = a.adopt_fetched(&prompt, 0, vec![(0, bytes(1)), (1, bytes(2))], 0);
        assert_eq!(held.len(), 2);
        assert_eq!(a.num_tiered_blocks(), 2);
        let m = a.match_prefix(&prompt, 3);
        assert_eq!((m.num_blocks(), m.num_restores()), (2, 2));
        // Adopted like spilled levels: fresh blocks, and the tokens counted as computed.
        let mut table = BlockTable::new(4);
        assert_eq!(a.adopt_prefix(&mut table, &m).unwrap(), 8);
        assert_eq!(a.num_tiered_blocks(), 0);
        // Another salt is another prefix: nothing of it is known.
        assert_eq!(a.match_prefix_salted(&prompt, 7, 3).num_blocks(), 0);
    }

    #[test]
    fn a_level_fetched_past_a_gap_keeps_the_chain_and_leaks_no_ghost() {
        let mut a = pool();
        let prompt: Vec<u32> = (1..=17).collect();
        // Level 2 alone (a sliding-window group's needs): levels 0 and 1 become ghosts that
        // hang from it, so the chain to it stays verifiable.
        let held = a.adopt_fetched(&prompt, 0, vec![(2, vec![9; 8].into())], 0);
        assert_eq!(held.len(), 1);
        assert_eq!(a.num_ghost_entries(), 3);
        let m = a.match_prefix_levels(&prompt, 4);
        assert_eq!(m.num_blocks(), 3);
        assert_eq!(m.blocks(), &[None, None, None]);
        assert_eq!(m.num_restores(), 1);
        // Nothing fetched: nothing is left behind.
        let mut b = pool();
        assert!(b.adopt_fetched(&prompt, 0, Vec::new(), 0).is_empty());
        assert_eq!(b.num_ghost_entries(), 0);
        // Without tiers nothing can hold the bytes, and the walk's ghosts are dropped again.
        let mut c = BlockAllocator::new(8, 4).unwrap();
        assert!(
            c.adopt_fetched(&prompt, 0, vec![(1, vec![1; 8].into())], 0)
                .is_empty()
        );
        assert_eq!(c.num_ghost_entries(), 0);
    }

    #[test]
    fn only_contents_stored_for_the_first_time_are_listed_for_writing() {
        let mut a = pool();
        a.list_newly_cached(true);
        let tokens: Vec<u32> = (1..=9).collect();
        let mut t = BlockTable::new(4);
        a.append_slots(&mut t, 9, 0).unwrap();
        a.register_full_blocks(&mut t, &tokens, 9).unwrap();
        let first = a.take_newly_cached();
        assert_eq!(first.iter().map(|&(l, _)| l).collect::<Vec<_>>(), [0, 1]);
        assert!(a.take_newly_cached().is_empty(), "taken once");
        // A second table computing the same prefix deduplicates onto the cached blocks: nothing
        // new to write.
        let mut u = BlockTable::new(4);
        a.append_slots(&mut u, 9, 0).unwrap();
        a.register_full_blocks(&mut u, &tokens, 9).unwrap();
        assert!(a.take_newly_cached().is_empty());
    }
}
