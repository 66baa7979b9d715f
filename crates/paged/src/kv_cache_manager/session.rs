//! Saving a conversation's cached blocks to a file and restoring them, in this process or a
//! restarted one ([`crate::tier::SavedSession`]). Restored blocks enter host memory as tiered
//! levels, exactly as blocks fetched from the remote tier do, so the conversation's next turn
//! restores them into the pool through the ordinary hit search.

use std::path::Path;

use super::KvCacheManager;
use super::remote::engine_block_bytes;
use crate::tier::{SavedBlock, SavedSession};
use crate::{PagedError, StepExecutor, TierKey};

impl KvCacheManager {
    /// The cached blocks of the conversation `tokens` (salted `salt`), as a session saved under
    /// `namespace`: in each KV cache group, every full block of it that a pool block holds (read
    /// from `engine`) or a tier below holds (copied) — for a full-attention group the leading
    /// run of them, which is all a later hit can use.
    ///
    /// # Errors
    /// Whatever the engine fails with reading a block.
    pub fn save_session<E: StepExecutor + ?Sized>(
        &self,
        engine: &mut E,
        (tokens, salt): (&[u32], u64),
        namespace: &str,
    ) -> Result<SavedSession, E::Error> {
        let bs = self.kv_cache.block_size;
        let mut blocks = Vec::new();
        for (g, alloc) in self.allocators.iter().enumerate() {
            let full_attention = self.kv_cache.groups[g].sliding_window.is_none();
            let m = alloc.match_prefix_levels_salted(tokens, salt, tokens.len() / bs);
            for (level, block) in m.blocks().iter().enumerate() {
                let bytes = match block {
                    Some(b) => engine.read_block(g, *b)?,
                    None if m.restore[level] => (self.tiers.as_ref())
                        .and_then(|s| s.peek(TierKey::new(g, m.links[level].1))),
                    None => None,
                };
                match bytes {
                    Some(bytes) => blocks.push(SavedBlock {
                        group: g as u32,
                        level: level as u32,
                        bytes,
                    }),
                    None if full_attention => break,
                    None => {}
                }
            }
        }
        Ok(SavedSession {
            namespace: namespace.to_string(),
            block_size: bs,
            num_groups: self.allocators.len(),
            salt,
            tokens: tokens.to_vec(),
            blocks,
        })
    }

    /// Tokens the blocks of a saved session cover: up to the end of the shortest group's last
    /// block (every group must serve a hit), 0 without blocks.
    pub fn session_tokens(session: &SavedSession) -> usize {
        let last = |g: usize| {
            (session.blocks.iter())
                .filter(|b| b.group as usize == g)
                .map(|b| b.level as usize)
                .max()
        };
        let shortest: Option<Option<usize>> = (0..session.num_groups).map(last).min();
        shortest
            .flatten()
            .map_or(0, |l| (l + 1) * session.block_size)
    }

    /// Makes the blocks of `session` (read from `path`) restorable: each becomes a level held
    /// in host memory, which a request starting with the session's tokens (and salt) restores
    /// into the pool. Returns the tokens the restored blocks cover.
    ///
    /// # Errors
    /// [`PagedError::Session`] when the session was saved under another `namespace` (another
    /// model, weight format, engine, KV dtype or block size), does not fit this pool's shape or
    /// host memory (`--host-tier-blocks`), or has a block of the wrong size; nothing changes then.
    pub fn restore_session<E: StepExecutor + ?Sized>(
        &mut self,
        engine: &mut E,
        session: SavedSession,
        namespace: &str,
        path: &Path,
    ) -> Result<usize, PagedError> {
        let refuse = |reason: String| PagedError::Session {
            path: path.display().to_string(),
            reason,
        };
        if session.namespace != namespace {
            return Err(refuse(format!(
                "it was saved by a server of [{}]; this one is [{}]: restore it on a server of that model and KV layout",
                session.namespace, namespace
            )));
        }
        let bs = self.kv_cache.block_size;
        let groups = self.allocators.len();
        if session.block_size != bs || session.num_groups != groups {
            return Err(refuse(format!(
                "it has {} KV cache groups of blocks of {} tokens; this pool has {groups} of {bs}",
                session.num_groups, session.block_size
            )));
        }
        let covered = Self::session_tokens(&session);
        let room = self.tier_config.as_ref().map_or(0, |t| t.host_blocks);
        let max_level = session.tokens.len() / bs;
        let block_bytes: Vec<Option<usize>> = engine_block_bytes(engine, groups).collect();
        let mut by_group: Vec<Vec<(usize, Box<[u8]>)>> = vec![Vec::new(); groups];
        for b in session.blocks {
            let (g, level) = (b.group as usize, b.level as usize);
            let Some(levels) = by_group.get_mut(g) else {
                return Err(refuse(format!(
                    "a block of group {g}, which this pool lacks"
                )));
            };
            if level >= max_level || levels.last().is_some_and(|&(l, _)| l >= level) {
                return Err(refuse(format!(
                    "group {g}'s block {level} is out of order or past its {max_level} full blocks"
                )));
            }
            let want = block_bytes[g];
            if want != Some(b.bytes.len()) {
                return Err(refuse(format!(
                    "group {g}'s block {level} has {} bytes; this engine's blocks have {want:?}",
                    b.bytes.len()
                )));
            }
            levels.push((level, b.bytes.into()));
        }
        if let Some(n) = by_group.iter().map(Vec::len).max()
            && n > room
        {
            return Err(refuse(format!(
                "it has {n} blocks in one KV cache group and host memory below the pool holds {room}: give --host-tier-blocks at least {n}"
            )));
        }
        for (g, levels) in by_group.into_iter().enumerate() {
            self.adopt_from_outside(g, (&session.tokens, session.salt), levels, false);
        }
        Ok(covered)
    }
}
