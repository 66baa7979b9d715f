//! Synthetic models: seeded random weights of any Llama shape, for tests, verify and benchmarks
//! at real model sizes without downloading anything.
//!
//! # Why the weights are scaled the way they are
//! Plain random weights give near-uniform logits, and greedy decoding over near-ties flips between
//! two correct engines by float noise alone. So the classifier is built to make greedy margins
//! large while keeping them context-dependent:
//!
//! * the embedding `E` has N(0, 1) entries, so a token's row has norm ≈ √dim;
//! * every projection has N(0, 1/fan_in) entries (q·k/√head_dim is then O(1), a softmax that is
//!   neither uniform nor one-hot), and the attention and FFN output projections are scaled by
//!   `residual_scale` so the layers perturb, but do not swamp, the residual stream;
//! * the classifier is unshared: row `σ(t)` is `E[t] · margin / √dim` for a seeded permutation σ.
//!   After the final RMSNorm the residual of a token t points mostly along `E[t]`, so the logit of
//!   σ(t) is ≈ margin·√dim while the others are ≈ margin·N(0, 1): the top-2 margin is several
//!   units, far above f32 noise (≈1e-5), yet attention and the FFN move the residual enough that the
//!   next token still depends on the context.
//!
//! `verify` prints the smallest top-2 margin it meets, so a reader can see how large it stays.

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::weights::{LayerWeights, Tensor};
use crate::{Config, Model, Result, Weights};

/// A named synthetic model: a Llama shape and a seed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SyntheticSpec {
    /// Residual stream width ([`Config::dim`]).
    pub dim: usize,
    /// FFN inner width.
    pub hidden_dim: usize,
    /// Transformer layers.
    pub n_layers: usize,
    /// Query heads; head_dim is dim / n_heads.
    pub n_heads: usize,
    /// Key/value heads (n_heads for MHA, 1 for MQA).
    pub n_kv_heads: usize,
    /// Tokens in the vocabulary; the entry's tokenizer file, if any, must have as many.
    pub vocab_size: usize,
    /// Longest context (positions).
    pub max_seq_len: usize,
    /// Seed of every tensor's random stream: one seed, one set of weights.
    pub seed: u64,
    /// Classifier gain (see the module docs); 4 by default.
    #[serde(default = "default_margin")]
    pub margin: f32,
    /// Gain of the attention and FFN output projections; 0.5 by default.
    #[serde(default = "default_residual_scale")]
    pub residual_scale: f32,
    /// Reuse the embedding as classifier (then the margin construction does not apply).
    #[serde(default)]
    pub shared_classifier: bool,
}

fn default_margin() -> f32 {
    4.0
}
fn default_residual_scale() -> f32 {
    0.5
}

impl SyntheticSpec {
    /// A spec with the default margin and residual scale.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        dim: usize,
        hidden_dim: usize,
        n_layers: usize,
        n_heads: usize,
        n_kv_heads: usize,
        vocab_size: usize,
        max_seq_len: usize,
        seed: u64,
    ) -> SyntheticSpec {
        SyntheticSpec {
            dim,
            hidden_dim,
            n_layers,
            n_heads,
            n_kv_heads,
            vocab_size,
            max_seq_len,
            seed,
            margin: default_margin(),
            residual_scale: default_residual_scale(),
            shared_classifier: false,
        }
    }

    /// The Llama config this spec describes.
    pub fn config(&self) -> Config {
        Config::llama(
            self.dim,
            self.hidden_dim,
            self.n_layers,
            self.n_heads,
            self.n_kv_heads,
            self.vocab_size,
            self.max_seq_len,
            self.shared_classifier,
        )
    }

    /// Generates the weights. Each tensor has its own stream (seed, tensor index), so generation
    /// runs in parallel and gives the same weights on any number of threads.
    ///
    /// # Errors
    /// [`crate::Error::Config`] if the shape is invalid.
    pub fn build(&self) -> Result<Model> {
        let c = self.config();
        c.validate()?;
        if !c.dim.is_multiple_of(c.n_heads) {
            return Err(crate::Error::Config(format!(
                "dim ({}) is not a multiple of n_heads ({})",
                c.dim, c.n_heads
            )));
        }
        let (d, h, q, kv) = (c.dim, c.hidden_dim, c.q_dim(), c.kv_dim());
        let rs = self.residual_scale;
        // (length, std) of every tensor in a fixed order; index = stream id.
        let mut specs: Vec<(usize, f32)> = vec![(c.vocab_size * d, 1.0), (d, 0.0)];
        for _ in 0..c.n_layers {
            specs.extend([
                (d, 0.0),
                (q * d, 1.0 / (d as f32).sqrt()),
                (kv * d, 1.0 / (d as f32).sqrt()),
                (kv * d, 1.0 / (d as f32).sqrt()),
                (d * q, rs / (q as f32).sqrt()),
                (d, 0.0),
                (h * d, 1.0 / (d as f32).sqrt()),
                (d * h, rs / (h as f32).sqrt()),
                (h * d, 1.0 / (d as f32).sqrt()),
            ]);
        }
        let seed = self.seed;
        let mut tensors: Vec<Vec<f32>> = specs
            .par_iter()
            .enumerate()
            .map(|(i, &(n, std))| {
                let mut rng = ChaCha8Rng::seed_from_u64(
                    seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                );
                // RMSNorm gains (std 0): 1 + N(0, 0.1²), so a wrong gain index shows in the logits.
                let (mean, std) = if std == 0.0 { (1.0, 0.1) } else { (0.0, std) };
                let normal = Normal::new(mean, std).expect("valid normal");
                (0..n).map(|_| normal.sample(&mut rng)).collect()
            })
            .collect();
        let mut take = {
            let mut it = tensors.drain(..);
            move || Tensor::from(it.next().expect("tensor count"))
        };
        let token_embedding = take();
        let final_norm = take();
        let layers = (0..c.n_layers)
            .map(|_| LayerWeights::llama(std::array::from_fn(|_| take())))
            .collect();
        let classifier = (!c.shared_classifier).then(|| {
            let mut perm: Vec<usize> = (0..c.vocab_size).collect();
            perm.shuffle(&mut ChaCha8Rng::seed_from_u64(seed.wrapping_add(1)));
            let gain = self.margin / (d as f32).sqrt();
            let mut cls = vec![0.0f32; c.vocab_size * d];
            for (t, &target) in perm.iter().enumerate() {
                for (o, &e) in cls[target * d..(target + 1) * d]
                    .iter_mut()
                    .zip(&token_embedding[t * d..(t + 1) * d])
                {
                    *o = e * gain;
                }
            }
            Tensor::from(cls)
        });
        Model::new(
            c,
            Weights {
                token_embedding,
                layers,
                final_norm,
                classifier,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_weights_other_seed_other_weights() {
        let a = SyntheticSpec::new(32, 64, 2, 4, 2, 50, 64, 7)
            .build()
            .unwrap();
        let b = SyntheticSpec::new(32, 64, 2, 4, 2, 50, 64, 7)
            .build()
            .unwrap();
        let c = SyntheticSpec::new(32, 64, 2, 4, 2, 50, 64, 8)
            .build()
            .unwrap();
        assert_eq!(a.weights.layers[1].w2, b.weights.layers[1].w2);
        assert_ne!(a.weights.layers[1].w2, c.weights.layers[1].w2);
        assert_eq!(a.weights.classifier().len(), 50 * 32);
    }

    #[test]
    fn bad_shapes_are_errors() {
        assert!(
            SyntheticSpec::new(30, 64, 2, 4, 2, 50, 64, 7)
                .build()
                .is_err()
        );
        assert!(
            SyntheticSpec::new(32, 64, 2, 4, 3, 50, 64, 7)
                .build()
                .is_err()
        );
    }
}
