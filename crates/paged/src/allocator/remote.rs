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
