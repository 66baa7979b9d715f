//! Picking the next token from logits: greedy, temperature, top-p (nucleus, Holtzman et al. 2019),
//! as llama2.c's run.c `sample` does, with a seeded ChaCha RNG.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Turns logits into a token id.
#[derive(Clone, Debug)]
pub struct Sampler {
    /// 0 means greedy.
    pub temperature: f32,
    /// Nucleus threshold in (0, 1); outside it, plain multinomial sampling.
    pub top_p: f32,
    rng: ChaCha8Rng,
}

impl Sampler {
    pub fn new(temperature: f32, top_p: f32, seed: u64) -> Sampler {
        Sampler {
            temperature,
            top_p,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// The deterministic sampler: argmax, ties to the lowest id.
    pub fn greedy() -> Sampler {
        Sampler::new(0.0, 1.0, 0)
    }

    /// Samples one token. `logits` is scratch: it is overwritten with probabilities.
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        if self.temperature <= 0.0 {
            return argmax(logits);
        }
        for l in logits.iter_mut() {
            *l /= self.temperature;
        }
        softmax_in_place(logits);
        let coin: f32 = self.rng.random();
        if self.top_p <= 0.0 || self.top_p >= 1.0 {
            sample_multinomial(logits, coin)
        } else {
            sample_top_p(logits, self.top_p, coin)
        }
    }
}

/// Index of the largest value; the lowest index wins ties; NaN never wins.
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] || x[best].is_nan() && !v.is_nan() {
            best = i;
        }
    }
    best as u32
}

/// The largest and second-largest values' difference: how close greedy decoding is to a tie.
pub fn top2_margin(x: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in x {
        if v > a {
            b = a;
            a = v;
        } else if v > b {
            b = v;
        }
    }
    a - b
}

/// softmax(x)_i = exp(x_i − max x) / Σ_j exp(x_j − max x)
pub fn softmax_in_place(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

fn sample_multinomial(probs: &[f32], coin: f32) -> u32 {
    let mut cdf = 0.0;
    for (i, &p) in probs.iter().enumerate() {
        cdf += p;
        if coin < cdf {
            return i as u32;
        }
    }
    (probs.len() - 1) as u32
}

/// Samples from the smallest set of most likely tokens whose probability exceeds `top_p`.
/// Tokens below (1 − top_p)/(n − 1) cannot be in the nucleus and are skipped before sorting,
/// as run.c does.
fn sample_top_p(probs: &[f32], top_p: f32, coin: f32) -> u32 {
    let cutoff = (1.0 - top_p) / (probs.len().max(2) - 1) as f32;
    let mut cand: Vec<(u32, f32)> = probs
        .iter()
        .enumerate()
        .filter(|(_, p)| **p >= cutoff)
        .map(|(i, &p)| (i as u32, p))
        .collect();
    cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut cum = 0.0;
    let mut last = cand.len().saturating_sub(1);
    for (i, &(_, p)) in cand.iter().enumerate() {
        cum += p;
        if cum > top_p {
            last = i;
            break;
        }
    }
    let r = coin * cum;
    let mut cdf = 0.0;
    for &(id, p) in &cand[..=last] {
        cdf += p;
        if r < cdf {
            return id;
        }
    }
    cand.get(last).map_or(0, |c| c.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_ties_go_to_the_lowest_id() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5, 0.5]), 1);
    }

    #[test]
    fn greedy_ignores_the_seed() {
        let mut l = vec![0.1, 0.9, 0.3];
        assert_eq!(Sampler::greedy().sample(&mut l.clone()), 1);
        assert_eq!(Sampler::new(0.0, 0.9, 7).sample(&mut l), 1);
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_respects_top_p() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let run = |seed| {
            let mut s = Sampler::new(1.0, 0.5, seed);
            (0..20)
                .map(|_| s.sample(&mut logits.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        // With top-p 0.5 only tokens in the nucleus can come out.
        let mut probs = logits.clone();
        softmax_in_place(&mut probs);
        let mut order: Vec<usize> = (0..50).collect();
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
        let mut cum = 0.0;
        let mut nucleus = Vec::new();
        for &i in &order {
            nucleus.push(i as u32);
            cum += probs[i];
            if cum > 0.5 {
                break;
            }
        }
        for t in run(3) {
            assert!(nucleus.contains(&t), "{t} outside the nucleus {nucleus:?}");
        }
    }

    #[test]
    fn top2_margin_measures_the_gap() {
        assert_eq!(top2_margin(&[1.0, 4.0, 2.5]), 1.5);
    }
}
