//! The model's weights in f32, one [`Tensor`] per tensor, matrices row-major `(out, in)` so that
//! a matrix-vector product `W (out, in) @ x (in,)` reads each row contiguously. A tensor is either
//! owned (dequantized, generated, or converted) or read in place from the checkpoint's memory map,
//! as run.c and llama.cpp do: then loading copies nothing and the weights' pages are the file's.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use memmap2::Mmap;

use crate::Config;

/// One tensor's f32 values; dereferences to `[f32]`.
#[derive(Clone, Default)]
pub struct Tensor(Storage);

#[derive(Clone)]
enum Storage {
    Owned(Vec<f32>),
    /// `len` little-endian f32s at `byte_offset` of a read-only map, 4-byte aligned.
    Mapped {
        map: Arc<Mmap>,
        byte_offset: usize,
        len: usize,
    },
}

impl Default for Storage {
    fn default() -> Self {
        Storage::Owned(Vec::new())
    }
}

impl Tensor {
    /// `len` little-endian f32s at `byte_offset` of `map`: borrowed in place where this host is
    /// little-endian and the offset 4-byte aligned (a map starts page-aligned), copied otherwise.
    /// `None` if the range is outside the map.
    pub fn from_map(map: &Arc<Mmap>, byte_offset: usize, len: usize) -> Option<Tensor> {
        let bytes = map.get(byte_offset..byte_offset.checked_add(len.checked_mul(4)?)?)?;
        Some(match bytemuck::try_cast_slice::<u8, f32>(bytes) {
            Ok(_) if cfg!(target_endian = "little") => Tensor(Storage::Mapped {
                map: Arc::clone(map),
                byte_offset,
                len,
            }),
            _ => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect::<Vec<f32>>()
                .into(),
        })
    }

    /// Whether the values are read in place from a memory map (not copied at load).
    pub fn is_mapped(&self) -> bool {
        matches!(self.0, Storage::Mapped { .. })
    }
}

impl From<Vec<f32>> for Tensor {
    fn from(v: Vec<f32>) -> Tensor {
        Tensor(Storage::Owned(v))
    }
}

impl FromIterator<f32> for Tensor {
    fn from_iter<I: IntoIterator<Item = f32>>(iter: I) -> Tensor {
        Tensor::from(iter.into_iter().collect::<Vec<f32>>())
    }
}

impl Deref for Tensor {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match &self.0 {
            Storage::Owned(v) => v,
            Storage::Mapped {
                map,
                byte_offset,
                len,
            } => bytemuck::cast_slice(&map[*byte_offset..*byte_offset + 4 * len]),
        }
    }
}

/// Equal values, however they are stored.
impl PartialEq for Tensor {
    fn eq(&self, other: &Tensor) -> bool {
        **self == **other
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let how = if self.is_mapped() { "mapped" } else { "owned" };
        write!(f, "Tensor({} f32, {how})", self.len())
    }
}

/// One transformer layer's tensors.
#[derive(Clone, Debug, Default)]
pub struct LayerWeights {
    /// RMSNorm gain before attention. (dim,)
    pub attn_norm: Tensor,
    /// Query projection. (q_dim, dim)
    pub wq: Tensor,
    /// Key projection. (kv_dim, dim)
    pub wk: Tensor,
    /// Value projection. (kv_dim, dim)
    pub wv: Tensor,
    /// Output projection. (dim, q_dim)
    pub wo: Tensor,
    /// QK-norm gains, shared by all heads (Gemma 3). (head_dim,) each; empty when unused.
    pub q_norm: Tensor,
    pub k_norm: Tensor,
    /// RMSNorm gain on the attention output before the residual add (Gemma). (dim,) or empty.
    pub post_attn_norm: Tensor,
    /// RMSNorm gain before the FFN. (dim,)
    pub ffn_norm: Tensor,
    /// Gate projection, goes through the activation. (hidden_dim, dim)
    pub w1: Tensor,
    /// Down projection. (dim, hidden_dim)
    pub w2: Tensor,
    /// Up projection. (hidden_dim, dim)
    pub w3: Tensor,
    /// RMSNorm gain on the FFN output before the residual add (Gemma). (dim,) or empty.
    pub post_ffn_norm: Tensor,
}

impl LayerWeights {
    /// A plain Llama layer (no QK-norm, no post-norms) from its nine tensors in llama2.c's file
    /// order, the order synthetic models generate them in too.
    pub fn llama([attn_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3]: [Tensor; 9]) -> LayerWeights {
        LayerWeights {
            attn_norm,
            wq,
            wk,
            wv,
            wo,
            ffn_norm,
            w1,
            w2,
            w3,
            ..LayerWeights::default()
        }
    }
}

/// All of a model's weights.
#[derive(Clone, Debug)]
pub struct Weights {
    /// Token embedding table. (vocab_size, dim)
    pub token_embedding: Tensor,
    /// One per layer. (n_layers,)
    pub layers: Vec<LayerWeights>,
    /// Final RMSNorm gain. (dim,)
    pub final_norm: Tensor,
    /// Unshared classifier (vocab_size, dim); `None` when the embedding is reused.
    pub classifier: Option<Tensor>,
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
            + self.classifier.as_ref().map_or(0, |t| t.len()))
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
