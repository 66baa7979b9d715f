//! The load test's prompt set: fixed openings shared by several prompts and different
//! continuations, combined and ordered by a seeded RNG; and the pool that holds them all.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::BLOCK_SIZE;

/// Openings shared by several prompts: each is longer than a block of the Llama 2 tokenizer's
/// tokens, so a prompt that repeats one can take whole blocks from the prefix cache.
pub(super) const OPENINGS: [&str; 4] = [
    "Once upon a time, in a small town near the sea, there lived a kind old man who had a little \
     boat. Every morning he went out on the water to catch fish for the children of the town.",
    "One day, a little girl named Lily went to the park with her mom. The sun was shining and the \
     birds were singing in the tall trees.",
    "Tom was a big brown dog who loved to play in the garden. He liked to dig holes and chase the \
     red ball that his friend Sam threw for him.",
    "There was a tiny bird who lived in a nest at the top of an old tree. She wanted to fly far \
     away and see the world.",
];

/// Continuations, one sentence each.
pub(super) const CONTINUATIONS: [&str; 8] = [
    " One day,",
    " But then something strange happened.",
    " Suddenly, they heard a loud noise.",
    " The next morning,",
    " They were very happy and",
    " She looked around and saw",
    " He did not know what to do, so",
    " It was the best day ever because",
];

/// `n` prompts: openings × continuations in a seeded order, repeating the combinations if `n`
/// is larger than their number.
pub(super) fn prompts(n: usize, seed: u64) -> Vec<String> {
    let mut all: Vec<String> = OPENINGS
        .iter()
        .flat_map(|o| CONTINUATIONS.iter().map(move |c| format!("{o}{c}")))
        .collect();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // Fisher–Yates with the seeded RNG.
    for i in (1..all.len()).rev() {
        all.swap(i, rng.random_range(0..=i));
    }
    (0..n).map(|i| all[i % all.len()].clone()).collect()
}

/// Blocks for every request at once on both sides: a prompt has at most one token per byte
/// plus BOS (byte fallback), then `max_tokens`; one block spare, as `kvlab batch` keeps.
pub(super) fn pool_blocks(texts: &[String], max_tokens: usize) -> usize {
    texts
        .iter()
        .map(|t| (t.len() + 1 + max_tokens).div_ceil(BLOCK_SIZE))
        .sum::<usize>()
        + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_are_fixed_and_share_openings() {
        let p = prompts(8, 1);
        assert_eq!(p, prompts(8, 1));
        assert!(p.iter().all(|t| OPENINGS.iter().any(|o| t.starts_with(o))));
    }
}
