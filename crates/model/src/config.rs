//! The model's hyperparameters. One struct describes every Llama-family model kvlab runs:
//! llama2.c checkpoints, synthetic models and (as configuration, not a copy of the model) Gemma 3.

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// How RoPE pairs the dimensions of a head that it rotates together.
///
/// RoPE (Su et al. 2021, "RoFormer", eq. 34) rotates pairs of dimensions by an angle
/// `pos · theta^(-2i/head_dim)`. Implementations disagree on *which* two dimensions form pair `i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RopeLayout {
    /// Adjacent pairs (0,1), (2,3), ...: llama2.c's run.c and Meta's original Llama code.
    Interleaved,
    /// Pair `i` is (i, i + head_dim/2): GPT-NeoX, Hugging Face `rotate_half`, llama.cpp's
    /// `LLAMA_ROPE_TYPE_NEOX` (used for gemma3).
    Neox,
}

/// The gated feed-forward's activation: `FFN(x) = W2 (act(W1 x) ⊙ W3 x)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Activation {
    /// SwiGLU (Shazeer 2020): act = silu(x) = x·σ(x). Llama.
    Silu,
    /// GeGLU with the tanh approximation of GELU (Hendrycks & Gimpel 2016):
    /// gelu(x) ≈ 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))). Gemma.
    GeluTanh,
}

/// Which positions a layer's attention sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LayerKind {
    /// Causal attention over every earlier position.
    Global,
    /// Causal attention over the last `window` positions, the query's own included: a query at
    /// `pos` sees keys `pos + 1 - window ..= pos` (Mistral's and Gemma's sliding window).
    Local {
        /// Positions a query sees, its own included (config.json's `sliding_window`, GGUF's
        /// `{arch}.attention.sliding_window`).
        window: usize,
    },
}

impl LayerKind {
    /// The window of a sliding-window layer; `None` for a global one.
    pub fn window(self) -> Option<usize> {
        match self {
            LayerKind::Global => None,
            LayerKind::Local { window } => Some(window),
        }
    }

    /// Gemma 3's interleaving: every `period`-th layer global (layers period − 1, 2·period − 1,
    /// ...), the others sliding windows of `window` positions. (n_layers,)
    pub fn interleaved(n_layers: usize, period: usize, window: usize) -> Vec<LayerKind> {
        (0..n_layers)
            .map(|l| {
                if l % period == period - 1 {
                    LayerKind::Global
                } else {
                    LayerKind::Local { window }
                }
            })
            .collect()
    }
}

/// Llama 3.1's RoPE frequency scaling (config.json `rope_type: "llama3"`): low frequencies
/// divided by `factor`, high ones kept, the band between interpolated, so a model trained at
/// `original_max_position_embeddings` reads longer contexts. The formula is transformers'
/// `_compute_llama3_parameters` (modeling_rope_utils.py), which llama.cpp's converter also
/// bakes into its `rope_freqs` tensor.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Llama3RopeScaling {
    /// Divisor of the low frequencies (8 for Llama 3.1, 32 for Llama 3.2).
    pub factor: f32,
    /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are divided by
    /// `factor` (1 for Llama 3.1).
    pub low_freq_factor: f32,
    /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept (4 for
    /// Llama 3.1).
    pub high_freq_factor: f32,
    /// Positions (the context the model was first trained at: 8192 for Llama 3.1).
    pub original_max_position_embeddings: usize,
}

impl Llama3RopeScaling {
    /// One frequency (radians per position), scaled: with wavelength λ = 2π/f, λ below
    /// `original / high_freq_factor` keeps f, λ above `original / low_freq_factor` gets
    /// f / factor, and between them s = (original/λ − low) / (high − low) mixes the two,
    /// (1 − s)·f/factor + s·f.
    pub fn scale(&self, f: f32) -> f32 {
        let original = self.original_max_position_embeddings as f32;
        let (low_wavelen, high_wavelen) = (
            original / self.low_freq_factor,
            original / self.high_freq_factor,
        );
        let wavelen = 2.0 * std::f32::consts::PI / f;
        if wavelen < high_wavelen {
            f
        } else if wavelen > low_wavelen {
            f / self.factor
        } else {
            let s = (original / wavelen - self.low_freq_factor)
                / (self.high_freq_factor - self.low_freq_factor);
            (1.0 - s) * f / self.factor + s * f
        }
    }
}

/// Everything the forward pass needs to know about a model's shape and arithmetic.
///
/// Shapes use the field's names: `dim` is the residual width, `q_dim = n_heads · head_dim`,
/// `kv_dim = n_kv_heads · head_dim`, `hidden_dim` the FFN width.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// Residual stream width (llama2.c's `dim`, GGUF's `embedding_length`).
    pub dim: usize,
    /// FFN inner width.
    pub hidden_dim: usize,
    /// Transformer layers (GGUF's `block_count`, config.json's `num_hidden_layers`).
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads; `n_heads / n_kv_heads` query heads share one (GQA; MQA when 1).
    pub n_kv_heads: usize,
    /// Width of one head (dim / n_heads for llama2.c; 256 for Gemma 3 270M).
    pub head_dim: usize,
    /// Tokens in the vocabulary: rows of the embedding and of the classifier (GGUF: the length
    /// of `tokenizer.ggml.tokens`; config.json's `vocab_size`).
    pub vocab_size: usize,
    /// Longest context the model was trained for (positions).
    pub max_seq_len: usize,
    /// RMSNorm epsilon: y = x / sqrt(mean(x²) + eps) · w.
    pub norm_eps: f32,
    /// Which dimensions RoPE pairs: interleaved for llama2.c and `llama` GGUFs, NeoX for the other
    /// GGUF architectures and Hugging Face folders.
    pub rope_layout: RopeLayout,
    /// RoPE base for global layers (10,000 in Llama 2; 1e6 in Gemma 3's global layers).
    pub rope_theta: f32,
    /// RoPE base for local (sliding-window) layers (1e4 in Gemma 3).
    pub rope_theta_local: f32,
    /// Llama 3.1's frequency scaling, when the model has it.
    #[serde(default)]
    pub rope_scaling: Option<Llama3RopeScaling>,
    /// Per-frequency divisors stored with the weights instead (a GGUF's `rope_freqs.weight`,
    /// which llama.cpp's converter computes from the same Llama 3.1 scaling; ggml_rope_ext's
    /// `freq_factors`): frequency j becomes f_j / factor_j. Empty when absent. (head_dim/2,)
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rope_freq_factors: Vec<f32>,
    /// The FFN's gate activation: SiLU for Llama, Qwen and Mistral, GELU-tanh for Gemma
    /// (config.json's `hidden_act` or `hidden_activation`).
    pub activation: Activation,
    /// One entry per layer.
    pub layer_kinds: Vec<LayerKind>,
    /// Multiply the token embedding by this (Gemma: sqrt(dim)); 1 for Llama.
    pub embed_scale: f32,
    /// Scale of q·k before softmax (1/sqrt(head_dim) for Llama; Gemma 3 uses
    /// query_pre_attn_scalar^-0.5, which is the same number for the 270M model).
    pub attn_scale: f32,
    /// Per-head RMSNorm of q and k before RoPE (Gemma 3's QK-norm).
    pub qk_norm: bool,
    /// The q, k and v projections add a bias (Qwen2's `attention_bias`; `q_proj` etc. are
    /// `nn.Linear(..., bias=True)` in modeling_qwen2.py).
    #[serde(default)]
    pub qkv_bias: bool,
    /// RMSNorm of the attention and FFN outputs before they join the residual (Gemma's
    /// "sandwich" norms).
    pub post_norms: bool,
    /// The classifier reuses the token embedding.
    pub shared_classifier: bool,
    /// Beginning-of-sequence token id (1 in llama2.c; GGUF's `tokenizer.ggml.bos_token_id`,
    /// config.json's `bos_token_id`).
    pub bos_id: u32,
    /// Generation stops when the model emits one of these (llama2.c's run.c stops on BOS).
    pub stop_ids: Vec<u32>,
}

/// Bounds that reject absurd header fields before anything is allocated from them.
/// This one bounds widths and head counts (`dim`, `n_heads`, `head_dim`; llama2.c's
/// `hidden_dim` gets 8×).
pub const MAX_DIM: usize = 1 << 16;
/// Most layers a header may announce.
pub const MAX_LAYERS: usize = 1024;
/// Largest vocabulary a header may announce (tokens).
pub const MAX_VOCAB: usize = 1 << 20;
/// Longest context or sliding window a header may announce (positions).
pub const MAX_SEQ_LEN: usize = 1 << 20;

/// Rejects a zero or absurd header field before anything is sized from it.
///
/// # Errors
/// [`Error::Config`] naming the field.
pub fn check_field(name: &str, value: usize, max: usize) -> Result<usize> {
    if value == 0 {
        return Err(Error::Config(format!("{name} is 0; it must be positive")));
    }
    if value > max {
        return Err(Error::Config(format!(
            "{name} = {value} is absurd (limit {max})"
        )));
    }
    Ok(value)
}

impl Config {
    /// [`Config::llama`] with this config's sizes (dims, heads, vocabulary, context, classifier
    /// sharing): equal to `self` exactly when `self` is a plain Llama with run.c's constants,
    /// which the model writers check before writing a format that can only hold one.
    pub fn plain_llama_of_same_shape(&self) -> Config {
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

    /// A plain Llama config (SwiGLU, interleaved RoPE with base 10,000, eps 1e-5, global
    /// attention everywhere), as llama2.c's run.c computes it.
    #[allow(clippy::too_many_arguments)]
    pub fn llama(
        dim: usize,
        hidden_dim: usize,
        n_layers: usize,
        n_heads: usize,
        n_kv_heads: usize,
        vocab_size: usize,
        max_seq_len: usize,
        shared_classifier: bool,
    ) -> Config {
        let head_dim = dim.checked_div(n_heads).unwrap_or(0);
        Config {
            dim,
            hidden_dim,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab_size,
            max_seq_len,
            norm_eps: 1e-5,
            rope_layout: RopeLayout::Interleaved,
            rope_theta: 10_000.0,
            rope_theta_local: 10_000.0,
            rope_scaling: None,
            rope_freq_factors: Vec::new(),
            activation: Activation::Silu,
            layer_kinds: vec![LayerKind::Global; n_layers],
            embed_scale: 1.0,
            attn_scale: if head_dim == 0 {
                0.0
            } else {
                1.0 / (head_dim as f32).sqrt()
            },
            qk_norm: false,
            qkv_bias: false,
            post_norms: false,
            shared_classifier,
            bos_id: 1,
            stop_ids: vec![1],
        }
    }

    /// Query width: n_heads · head_dim.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Key (and value) width: n_kv_heads · head_dim.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Query heads per KV head: 1 for MHA, n_heads for MQA (run.c's `kv_mul`, Hugging Face's
    /// `num_key_value_groups`). Not to be confused with [`Config::kv_cache_groups`].
    pub fn kv_mul(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }

    /// The rotation frequency of each pair j of a head, (head_dim/2,), for base `theta`:
    /// theta^(−2j/head_dim) (RoFormer; computed as run.c does, 1/theta^(2j/head_dim)), scaled by
    /// [`Llama3RopeScaling`] when the model has it. Every engine's RoPE takes its angles
    /// `pos · freq` from here.
    pub fn rope_freqs(&self, theta: f32) -> Vec<f32> {
        let hd = self.head_dim;
        (0..hd / 2)
            .map(|j| {
                let f = 1.0 / theta.powf((2 * j) as f32 / hd as f32);
                let f = self.rope_freq_factors.get(j).map_or(f, |d| f / d);
                self.rope_scaling.map_or(f, |s| s.scale(f))
            })
            .collect()
    }

    /// Which member of the Llama family these features make the model, and what sets it apart
    /// from plain Llama (`kvlab info`'s "architecture" line): `gemma3` (post-norms, GeGLU,
    /// scaled embedding), `qwen3` (QK-norm), `qwen2` (q/k/v biases), `mistral` (every layer
    /// windowed), else `llama`. A Mistral GGUF has no window (llama.cpp drops it) and reads as
    /// `llama`.
    pub fn architecture(&self) -> String {
        let windowed = |k: &LayerKind| k.window().is_some();
        let name = if self.post_norms {
            "gemma3"
        } else if self.qk_norm {
            "qwen3"
        } else if self.qkv_bias {
            "qwen2"
        } else if self.layer_kinds.iter().all(windowed) {
            "mistral"
        } else {
            "llama"
        };
        let extras: Vec<&str> = [
            (self.qkv_bias, "q/k/v biases"),
            (self.qk_norm, "QK-norm"),
            (self.post_norms, "post-norms"),
            (self.activation == Activation::GeluTanh, "GeGLU"),
            (self.embed_scale != 1.0, "scaled embedding"),
            (self.layer_kinds.iter().any(windowed), "sliding window"),
            (
                self.rope_scaling.is_some() || !self.rope_freq_factors.is_empty(),
                "Llama 3.1 RoPE scaling",
            ),
        ]
        .into_iter()
        .filter_map(|(has, what)| has.then_some(what))
        .collect();
        if extras.is_empty() {
            format!("{name} (plain Llama: RMSNorm, SwiGLU, RoPE)")
        } else {
            format!("{name} (Llama with {})", extras.join(", "))
        }
    }

    /// RoPE base for layer `layer`: `rope_theta` if it is global, `rope_theta_local` if it is a
    /// sliding-window layer.
    pub fn rope_theta_for(&self, layer: usize) -> f32 {
        match self.layer_kinds[layer] {
            LayerKind::Global => self.rope_theta,
            LayerKind::Local { .. } => self.rope_theta_local,
        }
    }

    /// The KV cache groups of a paged cache (vLLM's term): layers that attend alike share a
    /// block pool and a block table. `None` is the global group, `Some(w)` a sliding-window
    /// group; global first.
    pub fn kv_cache_groups(&self) -> Vec<Option<usize>> {
        let mut g: Vec<Option<usize>> = self.layer_kinds.iter().map(|k| k.window()).collect();
        g.sort();
        g.dedup();
        g
    }

    /// Index into [`Config::kv_cache_groups`] of layer `l`'s group.
    pub fn layer_cache_group(&self, layer: usize) -> usize {
        self.kv_cache_groups()
            .iter()
            .position(|g| *g == self.layer_kinds[layer].window())
            .expect("every layer's kind is a group")
    }

    /// Positions layer `l` must keep for a sequence of `max_seq_len` positions: all of them for
    /// a global layer, `min(window, max_seq_len)` for a sliding-window layer (a ring buffer).
    pub fn cache_positions(&self, layer: usize, max_seq_len: usize) -> usize {
        self.layer_kinds[layer]
            .window()
            .map_or(max_seq_len, |w| w.min(max_seq_len))
    }

    /// KV bytes per token, the formula the field uses:
    /// `2 (K and V) × n_layers × n_kv_heads × head_dim × bytes_per_element`.
    pub fn kv_bytes_per_token(&self, bytes_per_element: usize) -> usize {
        2 * self.n_layers * self.n_kv_heads * self.head_dim * bytes_per_element
    }

    /// KV bytes for a context of `positions` when every layer keeps every position.
    pub fn kv_bytes_full(&self, positions: usize, bytes_per_element: usize) -> usize {
        self.kv_bytes_per_token(bytes_per_element) * positions
    }

    /// KV bytes for a context of `positions` when sliding-window layers keep only their window
    /// (a ring buffer): Σ_layers 2 × kv_dim × cache_positions(layer) × bytes.
    pub fn kv_bytes_windowed(&self, positions: usize, bytes_per_element: usize) -> usize {
        (0..self.n_layers)
            .map(|l| 2 * self.kv_dim() * self.cache_positions(l, positions) * bytes_per_element)
            .sum()
    }

    /// Parameter count of the weights (f32 each in [`crate::Weights`]).
    pub fn n_params(&self) -> usize {
        let (d, h, q, kv) = (self.dim, self.hidden_dim, self.q_dim(), self.kv_dim());
        let per_layer = d
            + d * q
            + 2 * kv * d
            + q * d
            + d
            + 3 * h * d
            + if self.qk_norm { 2 * self.head_dim } else { 0 }
            + if self.post_norms { 2 * d } else { 0 };
        let cls = if self.shared_classifier {
            0
        } else {
            self.vocab_size * d
        };
        self.vocab_size * d + self.n_layers * per_layer + d + cls
    }

    /// Checks every field is positive, bounded and consistent with the others.
    ///
    /// # Errors
    /// [`Error::Config`] naming the first offending field.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::Config(msg));
        for (name, v, max) in [
            ("dim", self.dim, MAX_DIM),
            ("hidden_dim", self.hidden_dim, MAX_DIM * 8),
            ("n_layers", self.n_layers, MAX_LAYERS),
            ("n_heads", self.n_heads, MAX_DIM),
            ("n_kv_heads", self.n_kv_heads, MAX_DIM),
            ("head_dim", self.head_dim, MAX_DIM),
            ("vocab_size", self.vocab_size, MAX_VOCAB),
            ("max_seq_len", self.max_seq_len, MAX_SEQ_LEN),
        ] {
            check_field(name, v, max)?;
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(format!(
                "n_heads ({}) is not a multiple of n_kv_heads ({})",
                self.n_heads, self.n_kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "head_dim ({}) must be even for RoPE",
                self.head_dim
            ));
        }
        if self.layer_kinds.len() != self.n_layers {
            return bad(format!(
                "layer_kinds has {} entries for {} layers",
                self.layer_kinds.len(),
                self.n_layers
            ));
        }
        if self
            .layer_kinds
            .iter()
            .any(|k| matches!(k, LayerKind::Local { window: 0 }))
        {
            return bad("a sliding window of 0 positions".into());
        }
        if self.bos_id as usize >= self.vocab_size {
            return bad(format!("bos_id {} is outside the vocabulary", self.bos_id));
        }
        let finite = [
            self.norm_eps,
            self.rope_theta,
            self.rope_theta_local,
            self.attn_scale,
            self.embed_scale,
        ]
        .iter()
        .all(|v| v.is_finite());
        if let Some(r) = self.rope_scaling {
            let ok = [r.factor, r.low_freq_factor, r.high_freq_factor]
                .iter()
                .all(|v| v.is_finite() && *v > 0.0)
                && r.high_freq_factor > r.low_freq_factor
                && r.original_max_position_embeddings > 0;
            if !ok {
                return bad(format!(
                    "rope_scaling {r:?}: factors must be finite and positive, high_freq_factor above low_freq_factor"
                ));
            }
        }
        if !self.rope_freq_factors.is_empty()
            && (self.rope_freq_factors.len() != self.head_dim / 2
                || !self
                    .rope_freq_factors
                    .iter()
                    .all(|v| v.is_finite() && *v > 0.0))
        {
            return bad(format!(
                "rope_freq_factors: {} values for head_dim {} (head_dim/2 expected), each finite and positive",
                self.rope_freq_factors.len(),
                self.head_dim
            ));
        }
        if !finite || self.norm_eps < 0.0 || self.rope_theta <= 0.0 || self.rope_theta_local <= 0.0
        {
            return bad(
                "norm_eps, rope_theta, attn_scale and embed_scale must be finite and positive"
                    .into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stories260k_kv_bytes_per_token() {
        // dim 64, 5 layers, 8 heads, 4 KV heads: head_dim 8, kv_dim 32.
        let c = Config::llama(64, 172, 5, 8, 4, 512, 512, true);
        assert_eq!(c.kv_dim(), 32);
        assert_eq!(c.kv_bytes_per_token(4), 2 * 5 * 4 * 8 * 4);
        assert!(c.validate().is_ok());
    }

    #[test]
    fn windowed_bytes_cap_local_layers() {
        let mut c = Config::llama(64, 172, 6, 8, 1, 512, 8192, true);
        c.layer_kinds = LayerKind::interleaved(6, 6, 512);
        let per_pos_layer = 2 * c.kv_dim() * 4;
        assert_eq!(
            c.kv_bytes_windowed(8192, 4),
            per_pos_layer * (8192 + 5 * 512)
        );
        assert_eq!(c.kv_bytes_windowed(100, 4), per_pos_layer * 6 * 100);
        assert_eq!(c.kv_bytes_full(8192, 4), per_pos_layer * 6 * 8192);
    }

    #[test]
    fn validate_rejects_bad_shapes() {
        let ok = Config::llama(64, 172, 5, 8, 4, 512, 512, true);
        let mut c = ok.clone();
        c.n_kv_heads = 3;
        assert!(c.validate().unwrap_err().to_string().contains("multiple"));
        let mut c = ok.clone();
        c.dim = 0;
        assert!(c.validate().is_err());
        let mut c = ok;
        c.vocab_size = usize::MAX / 2;
        assert!(c.validate().unwrap_err().to_string().contains("absurd"));
    }
}
