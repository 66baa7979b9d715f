//! The model's weights in f32, one `Vec` per tensor, matrices row-major `(out, in)` so that a
//! matrix-vector product `W (out, in) @ x (in,)` reads each row contiguously.

use crate::Config;

/// One transformer layer's tensors.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    /// RMSNorm gain before attention. (dim,)
    pub attn_norm: Vec<f32>,
    /// Query projection. (q_dim, dim)
    pub wq: Vec<f32>,
    /// Key projection. (kv_dim, dim)
    pub wk: Vec<f32>,
    /// Value projection. (kv_dim, dim)
    pub wv: Vec<f32>,
    /// Output projection. (dim, q_dim)
    pub wo: Vec<f32>,
    /// QK-norm gains, shared by all heads (Gemma 3). (head_dim,) each; empty when unused.
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    /// RMSNorm gain on the attention output before the residual add (Gemma). (dim,) or empty.
    pub post_attn_norm: Vec<f32>,
    /// RMSNorm gain before the FFN. (dim,)
    pub ffn_norm: Vec<f32>,
    /// Gate projection, goes through the activation. (hidden_dim, dim)
    pub w1: Vec<f32>,
    /// Down projection. (dim, hidden_dim)
    pub w2: Vec<f32>,
    /// Up projection. (hidden_dim, dim)
    pub w3: Vec<f32>,
    /// RMSNorm gain on the FFN output before the residual add (Gemma). (dim,) or empty.
    pub post_ffn_norm: Vec<f32>,
}

/// All of a model's weights.
#[derive(Clone, Debug)]
pub struct Weights {
    /// Token embedding table. (vocab_size, dim)
    pub token_embedding: Vec<f32>,
    /// One per layer. (n_layers,)
    pub layers: Vec<LayerWeights>,
    /// Final RMSNorm gain. (dim,)
    pub final_norm: Vec<f32>,
    /// Unshared classifier (vocab_size, dim); `None` when the embedding is reused.
    pub classifier: Option<Vec<f32>>,
}

impl Weights {
    /// The classifier matrix (vocab_size, dim): the unshared one or the embedding.
    pub fn classifier(&self) -> &[f32] {
        self.classifier.as_deref().unwrap_or(&self.token_embedding)
    }

    /// Checks that every tensor has the length its config implies; loaders and generators call
    /// this so that engines can index without bounds surprises.
    ///
    /// # Errors
    /// [`crate::Error::Config`] naming the first tensor of the wrong length.
    pub fn check_shapes(&self, c: &Config) -> crate::Result<()> {
        let (d, h, q, kv, hd) = (c.dim, c.hidden_dim, c.q_dim(), c.kv_dim(), c.head_dim);
        let opt = |on: bool, n: usize| if on { n } else { 0 };
        let mut expect: Vec<(String, usize, usize)> = vec![
            (
                "token_embedding".into(),
                self.token_embedding.len(),
                c.vocab_size * d,
            ),
            ("final_norm".into(), self.final_norm.len(), d),
            ("layers".into(), self.layers.len(), c.n_layers),
        ];
        if let Some(cls) = &self.classifier {
            expect.push(("classifier".into(), cls.len(), c.vocab_size * d));
        }
        for (i, l) in self.layers.iter().enumerate() {
            for (name, got, want) in [
                ("attn_norm", l.attn_norm.len(), d),
                ("wq", l.wq.len(), q * d),
                ("wk", l.wk.len(), kv * d),
                ("wv", l.wv.len(), kv * d),
                ("wo", l.wo.len(), d * q),
                ("q_norm", l.q_norm.len(), opt(c.qk_norm, hd)),
                ("k_norm", l.k_norm.len(), opt(c.qk_norm, hd)),
                (
                    "post_attn_norm",
                    l.post_attn_norm.len(),
                    opt(c.post_norms, d),
                ),
                ("ffn_norm", l.ffn_norm.len(), d),
                ("w1", l.w1.len(), h * d),
                ("w2", l.w2.len(), d * h),
                ("w3", l.w3.len(), h * d),
                ("post_ffn_norm", l.post_ffn_norm.len(), opt(c.post_norms, d)),
            ] {
                expect.push((format!("layers[{i}].{name}"), got, want));
            }
        }
        for (name, got, want) in expect {
            if got != want {
                return Err(crate::Error::Config(format!(
                    "tensor {name} has {got} elements, the config implies {want}"
                )));
            }
        }
        Ok(())
    }

    /// Bytes the weights occupy in memory (f32).
    pub fn bytes(&self) -> usize {
        let layer: usize = self
            .layers
            .iter()
            .map(|l| {
                [
                    &l.attn_norm,
                    &l.wq,
                    &l.wk,
                    &l.wv,
                    &l.wo,
                    &l.q_norm,
                    &l.k_norm,
                    &l.post_attn_norm,
                    &l.ffn_norm,
                    &l.w1,
                    &l.w2,
                    &l.w3,
                    &l.post_ffn_norm,
                ]
                .iter()
                .map(|t| t.len())
                .sum::<usize>()
            })
            .sum();
        4 * (self.token_embedding.len()
            + layer
            + self.final_norm.len()
            + self.classifier.as_ref().map_or(0, Vec::len))
    }
}

/// A model: its config and its weights, checked against each other.
#[derive(Clone, Debug)]
pub struct Model {
    pub config: Config,
    pub weights: Weights,
}

impl Model {
    /// Pairs a config with weights after checking both.
    ///
    /// # Errors
    /// [`crate::Error::Config`] if the config is invalid or a tensor has the wrong length.
    pub fn new(config: Config, weights: Weights) -> crate::Result<Model> {
        config.validate()?;
        weights.check_shapes(&config)?;
        Ok(Model { config, weights })
    }
}
