//! The model's weights, one [`Tensor`] per tensor, matrices row-major `(out, in)` so that a
//! matrix-vector product `W (out, in) @ x (in,)` reads each row contiguously.
//!
//! A tensor holds f32 values (owned, or read in place from the checkpoint's memory map as run.c
//! and llama.cpp do, so that loading copies nothing), or an **encoded** matrix: rows of ggml
//! blocks (F16, BF16, Q8_0, Q5_0, Q4_K, Q6_K; layouts in ggml-common.h) kept as the checkpoint
//! stores them or converted once at load (`--weights bf16|f16`). The CPU engine's kernels read
//! encoded rows directly ([`Tensor::encoded`]); code that wants f32 dereferences the tensor,
//! which decodes it once, on first use, with the reference dequantizers of `kvlab-gguf`.

use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, OnceLock};

use kvlab_gguf::GgmlType;
use memmap2::Mmap;

use crate::Config;

/// One tensor's values; dereferences to `[f32]` (decoding an encoded tensor once).
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
    /// `len` elements as whole blocks of `ty`, and their f32 values once someone asked.
    Encoded {
        ty: GgmlType,
        bytes: Bytes,
        len: usize,
        decoded: OnceLock<Vec<f32>>,
        /// What the products with this matrix round the activations to.
        activations: Activations,
    },
}

/// An encoded tensor's bytes: owned (converted at load) or a range of a read-only map.
#[derive(Clone)]
enum Bytes {
    Owned(Arc<[u8]>),
    Mapped {
        map: Arc<Mmap>,
        byte_offset: usize,
        n_bytes: usize,
    },
}

impl Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Owned(b) => b,
            Bytes::Mapped {
                map,
                byte_offset,
                n_bytes,
            } => &map[*byte_offset..*byte_offset + *n_bytes],
        }
    }
}

impl Default for Storage {
    fn default() -> Self {
        Storage::Owned(Vec::new())
    }
}

/// The encodings a tensor can keep (the others are decoded to f32 at load): the ones the CPU
/// engine has dot-product kernels for.
pub const ENCODINGS: [GgmlType; 6] = [
    GgmlType::F16,
    GgmlType::BF16,
    QUANTIZED[0],
    QUANTIZED[1],
    QUANTIZED[2],
    QUANTIZED[3],
];

/// The [`ENCODINGS`] quantized in blocks with integer codes (ggml's Q8_0, Q5_0, Q4_K, Q6_K):
/// the formats with a few-rows kernel and an integer one (`--activations q8`).
pub const QUANTIZED: [GgmlType; 4] = [
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

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

    /// `len` elements of type `ty` (one of [`ENCODINGS`]) read in place at `byte_offset` of
    /// `map`. `None` if `ty` is not kept encoded, `len` is not whole blocks, or the bytes lie
    /// outside the map.
    pub fn encoded_from_map(
        map: &Arc<Mmap>,
        ty: GgmlType,
        byte_offset: usize,
        len: usize,
    ) -> Option<Tensor> {
        let n_bytes = usize::try_from(ty.bytes_for(len as u64)?).ok()?;
        map.get(byte_offset..byte_offset.checked_add(n_bytes)?)?;
        ENCODINGS.contains(&ty).then(|| {
            Tensor(Storage::Encoded {
                ty,
                bytes: Bytes::Mapped {
                    map: Arc::clone(map),
                    byte_offset,
                    n_bytes,
                },
                len,
                decoded: OnceLock::new(),
                activations: Activations::F32,
            })
        })
    }

    /// `len` elements of type `ty` (one of [`ENCODINGS`]) in owned `bytes`. `None` if `ty` is
    /// not kept encoded or `bytes` is not exactly `len` elements of it.
    pub fn encoded_from_bytes(ty: GgmlType, bytes: Vec<u8>, len: usize) -> Option<Tensor> {
        (ENCODINGS.contains(&ty) && ty.bytes_for(len as u64) == Some(bytes.len() as u64)).then(
            || {
                Tensor(Storage::Encoded {
                    ty,
                    bytes: Bytes::Owned(bytes.into()),
                    len,
                    decoded: OnceLock::new(),
                    activations: Activations::F32,
                })
            },
        )
    }

    /// The f32 values converted to `ty` (`F16` or `BF16`, round to nearest even, through the
    /// `half` crate); `F32` keeps them as they are (decoding an encoded tensor).
    ///
    /// # Panics
    /// For any other `ty` (quantizing at load is not something kvlab does).
    pub fn convert(&self, ty: GgmlType) -> Tensor {
        let bytes: Vec<u8> = match ty {
            GgmlType::F32 => {
                return match self.encoded() {
                    // Decoded straight into the new tensor (not through this one's cache).
                    Some((ty, bytes)) => Tensor::from(
                        kvlab_gguf::dequantize(ty, bytes, self.len())
                            .expect("whole blocks of a known type"),
                    ),
                    None => self.clone(),
                };
            }
            GgmlType::F16 => self
                .iter()
                .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                .collect(),
            GgmlType::BF16 => self
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                .collect(),
            other => panic!("Tensor::convert: {other} is not a conversion target"),
        };
        Tensor::encoded_from_bytes(ty, bytes, self.len()).expect("2 bytes per element")
    }

    /// Number of elements (without decoding).
    pub fn len(&self) -> usize {
        match &self.0 {
            Storage::Owned(v) => v.len(),
            Storage::Mapped { len, .. } | Storage::Encoded { len, .. } => *len,
        }
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type as stored: `F32`, or the encoding.
    pub fn dtype(&self) -> GgmlType {
        match &self.0 {
            Storage::Encoded { ty, .. } => *ty,
            _ => GgmlType::F32,
        }
    }

    /// Bytes the values occupy as stored (not counting a decoded copy).
    pub fn nbytes(&self) -> usize {
        match &self.0 {
            Storage::Encoded { bytes, .. } => bytes.len(),
            _ => 4 * self.len(),
        }
    }

    /// An encoded tensor's type and raw bytes (rows of whole blocks); `None` for f32.
    pub fn encoded(&self) -> Option<(GgmlType, &[u8])> {
        match &self.0 {
            Storage::Encoded { ty, bytes, .. } => Some((*ty, bytes)),
            _ => None,
        }
    }

    /// What the products with this matrix round the activations to: [`Activations::Q8`] only
    /// where [`Tensor::with_activations`] set it on a Q8_0, Q5_0, Q4_K or Q6_K matrix.
    pub fn activations(&self) -> Activations {
        match &self.0 {
            Storage::Encoded { activations, .. } => *activations,
            _ => Activations::F32,
        }
    }

    /// This tensor with its products rounding the activations as `a` says, where it can: `Q8`
    /// applies to Q8_0, Q5_0, Q4_K and Q6_K matrices (the formats with an integer kernel),
    /// and leaves every other tensor as it is.
    pub fn with_activations(mut self, a: Activations) -> Tensor {
        if let Storage::Encoded {
            ty, activations, ..
        } = &mut self.0
        {
            *activations = if QUANTIZED.contains(ty) {
                a
            } else {
                Activations::F32
            };
        }
        self
    }

    /// Row `row` of a matrix with `cols` columns, as f32 into `out` (`cols` long), without
    /// decoding the rest: one token's embedding from a table kept encoded.
    ///
    /// # Panics
    /// If the row is outside the tensor or `out` is not `cols` long.
    pub fn row_into(&self, row: usize, cols: usize, out: &mut [f32]) {
        assert_eq!(out.len(), cols, "row_into: out must be one row");
        match self.encoded() {
            None => out.copy_from_slice(&self[row * cols..(row + 1) * cols]),
            Some((ty, bytes)) => {
                let row_bytes = ty.bytes_for(cols as u64).expect("whole blocks") as usize;
                kvlab_gguf::dequantize_into(ty, &bytes[row * row_bytes..][..row_bytes], out)
                    .expect("an encoded tensor holds whole blocks");
            }
        }
    }

    /// Asks the kernel to map this tensor's pages now (`MADV_POPULATE_READ`, Linux), when it is
    /// read in place from a memory map: llama.cpp maps its weights with `MAP_POPULATE`, so
    /// without this kvlab's first forward pass (the prefill) would pay every page fault that
    /// llama.cpp paid at load. A hint: where the kernel does not support it, nothing happens.
    pub fn prefault(&self) {
        let (map, offset, len) = match &self.0 {
            Storage::Mapped {
                map,
                byte_offset,
                len,
            } => (map, *byte_offset, 4 * len),
            Storage::Encoded {
                bytes:
                    Bytes::Mapped {
                        map,
                        byte_offset,
                        n_bytes,
                    },
                ..
            } => (map, *byte_offset, *n_bytes),
            _ => return,
        };
        #[cfg(target_os = "linux")]
        let _ = map.advise_range(memmap2::Advice::PopulateRead, offset, len);
        #[cfg(not(target_os = "linux"))]
        let _ = (map, offset, len);
    }

    /// Whether the values are read in place from a memory map (not copied at load).
    pub fn is_mapped(&self) -> bool {
        matches!(
            self.0,
            Storage::Mapped { .. }
                | Storage::Encoded {
                    bytes: Bytes::Mapped { .. },
                    ..
                }
        )
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
            Storage::Encoded {
                ty,
                bytes,
                len,
                decoded,
                ..
            } => decoded.get_or_init(|| {
                // The constructors checked that the bytes are exactly `len` elements of `ty`.
                kvlab_gguf::dequantize(*ty, bytes, *len).expect("whole blocks of a known type")
            }),
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
        write!(f, "Tensor({} {}, {how})", self.len(), self.dtype())
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
    /// Biases of the q, k, v projections (Qwen2). (q_dim,), (kv_dim,), (kv_dim,); empty when
    /// unused.
    pub bq: Tensor,
    /// Key bias (Qwen2). (kv_dim,); empty when unused.
    pub bk: Tensor,
    /// Value bias (Qwen2). (kv_dim,); empty when unused.
    pub bv: Tensor,
    /// QK-norm gains, shared by all heads (Gemma 3). (head_dim,) each; empty when unused.
    pub q_norm: Tensor,
    /// QK-norm gain of the keys. (head_dim,); empty when unused.
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
    /// All sixteen tensors of the layer, in field order (unused ones are empty).
    pub fn tensors(&self) -> [&Tensor; 16] {
        [
            &self.attn_norm,
            &self.wq,
            &self.wk,
            &self.wv,
            &self.wo,
            &self.bq,
            &self.bk,
            &self.bv,
            &self.q_norm,
            &self.k_norm,
            &self.post_attn_norm,
            &self.ffn_norm,
            &self.w1,
            &self.w2,
            &self.w3,
            &self.post_ffn_norm,
        ]
    }

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
    pub fn classifier(&self) -> &Tensor {
        self.classifier.as_ref().unwrap_or(&self.token_embedding)
    }

    /// Every matrix a GEMV reads (the seven per layer, the embedding and an unshared
    /// classifier), the tensors `--weights` converts; the norm gains stay f32.
    pub fn matrices(&self) -> impl Iterator<Item = &Tensor> {
        self.layers
            .iter()
            .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w1, &l.w2, &l.w3])
            .chain([&self.token_embedding])
            .chain(self.classifier.as_ref())
    }

    /// [`Weights::matrices`], mutably (the same tensors in the same order).
    pub fn matrices_mut(&mut self) -> impl Iterator<Item = &mut Tensor> {
        self.layers
            .iter_mut()
            .flat_map(|l| {
                [
                    &mut l.wq, &mut l.wk, &mut l.wv, &mut l.wo, &mut l.w1, &mut l.w2, &mut l.w3,
                ]
            })
            .chain([&mut self.token_embedding])
            .chain(self.classifier.as_mut())
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
                ("bq", l.bq.len(), opt(c.qkv_bias, q)),
                ("bk", l.bk.len(), opt(c.qkv_bias, kv)),
                ("bv", l.bv.len(), opt(c.qkv_bias, kv)),
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

    /// Maps now the pages of every tensor a forward step reads (all but the embedding table,
    /// unless it is also the classifier): see [`Tensor::prefault`]. Embedding rows of tokens a
    /// run never sees stay out of memory, as in run.c.
    pub fn prefault(&self) {
        for t in self.layers.iter().flat_map(LayerWeights::tensors) {
            t.prefault();
        }
        self.final_norm.prefault();
        self.classifier().prefault();
    }

    /// Bytes the weights occupy in memory as stored (f32, or their encoding).
    pub fn bytes(&self) -> usize {
        let layer: usize = self
            .layers
            .iter()
            .flat_map(LayerWeights::tensors)
            .map(Tensor::nbytes)
            .sum();
        self.token_embedding.nbytes()
            + layer
            + self.final_norm.nbytes()
            + self.classifier.as_ref().map_or(0, Tensor::nbytes)
    }
}

/// How the engines hold the weight matrices (`--weights`): as the checkpoint stores them, or
/// converted once at load. Norm gains are always f32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WeightFormat {
    /// As stored: f32 for llama2.c files; F16/BF16/Q8_0/Q5_0/Q4_K/Q6_K blocks of a GGUF kept as
    /// they are (llama.cpp's behaviour), other GGUF types decoded to f32.
    #[default]
    Stored,
    /// Every matrix decoded to f32: the path every other format is measured against.
    F32,
    /// Every matrix as bfloat16 (8-bit exponent, 7-bit mantissa): half the bytes of f32.
    Bf16,
    /// Every matrix as IEEE half precision (5-bit exponent, 10-bit mantissa).
    F16,
}

impl WeightFormat {
    /// Every format, in the order reports list them.
    pub const ALL: [WeightFormat; 4] = [
        WeightFormat::Stored,
        WeightFormat::F32,
        WeightFormat::Bf16,
        WeightFormat::F16,
    ];

    /// The name `--weights` takes.
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::Stored => "stored",
            WeightFormat::F32 => "f32",
            WeightFormat::Bf16 => "bf16",
            WeightFormat::F16 => "f16",
        }
    }
}

impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for WeightFormat {
    type Err = crate::Error;

    fn from_str(s: &str) -> crate::Result<WeightFormat> {
        WeightFormat::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                crate::Error::Config(format!(
                    "unknown weight format {s:?}; expected one of stored, f32, bf16, f16"
                ))
            })
    }
}

/// What the matrix products round the activations to (`--activations`): the weights stay as
/// [`WeightFormat`] holds them either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Activations {
    /// f32, as computed: the reference every engine is proven token-identical on.
    #[default]
    F32,
    /// Rounded to 8 bits in blocks of 32 (ggml's Q8_0 layout, f32 scales) for the products
    /// with Q8_0, Q5_0, Q4_K and Q6_K matrices, which then use integer dot products as
    /// llama.cpp does; every other product keeps f32.
    Q8,
}

impl Activations {
    /// Every setting, in the order reports list them.
    pub const ALL: [Activations; 2] = [Activations::F32, Activations::Q8];

    /// The name `--activations` takes.
    pub fn name(self) -> &'static str {
        match self {
            Activations::F32 => "f32",
            Activations::Q8 => "q8",
        }
    }
}

impl fmt::Display for Activations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Activations {
    type Err = crate::Error;

    fn from_str(s: &str) -> crate::Result<Activations> {
        Activations::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| {
                crate::Error::Config(format!("unknown activations {s:?}; expected f32 or q8"))
            })
    }
}

/// A model: its config and its weights, checked against each other.
#[derive(Clone, Debug)]
pub struct Model {
    /// Shapes and arithmetic, checked against the weights.
    pub config: Config,
    /// The tensors, shaped by `config`.
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

    /// This model with its matrices held in `format`, converted tensor by tensor (so peak
    /// memory is the converted weights plus one tensor). `Stored` returns the model unchanged.
    pub fn with_weight_format(self, format: WeightFormat) -> Model {
        let mut m = self;
        let ty = match format {
            WeightFormat::Stored => return m,
            WeightFormat::F32 => GgmlType::F32,
            WeightFormat::Bf16 => GgmlType::BF16,
            WeightFormat::F16 => GgmlType::F16,
        };
        for t in m.weights.matrices_mut() {
            if t.dtype() != ty {
                *t = t.convert(ty);
            }
        }
        m
    }

    /// This model with every matrix product rounding the activations as `a` says
    /// ([`Tensor::with_activations`]: Q8 where a matrix is Q8_0, Q5_0, Q4_K or Q6_K).
    pub fn with_activations(self, a: Activations) -> Model {
        let mut m = self;
        for t in m.weights.matrices_mut() {
            *t = std::mem::take(t).with_activations(a);
        }
        m
    }

    /// The model's first `n_layers` layers under its own embedding, final norm and classifier:
    /// the draft of self-speculative decoding by early exit (LayerSkip, Elhoushi et al. 2024),
    /// which shares the tokenizer and agrees with the whole model the more often the more layers
    /// it keeps. The tensors are cloned (an encoded or mapped tensor shares its bytes).
    ///
    /// # Errors
    /// [`crate::Error::Config`] if `n_layers` is 0 or more than the model has.
    pub fn early_exit(&self, n_layers: usize) -> crate::Result<Model> {
        if n_layers == 0 || n_layers > self.config.n_layers {
            return Err(crate::Error::Config(format!(
                "an early exit keeps 1 to {} layers, not {n_layers}",
                self.config.n_layers
            )));
        }
        let mut config = self.config.clone();
        config.n_layers = n_layers;
        config.layer_kinds.truncate(n_layers);
        let w = &self.weights;
        let weights = Weights {
            token_embedding: w.token_embedding.clone(),
            layers: w.layers[..n_layers].to_vec(),
            final_norm: w.final_norm.clone(),
            classifier: w.classifier.clone(),
        };
        Model::new(config, weights)
    }

    /// The matrices' element types and how many matrices have each, e.g. `[(Q5_0, 72), …]`,
    /// for `info` and the generate stats line.
    pub fn matrix_dtypes(&self) -> Vec<(GgmlType, usize)> {
        let mut counts: Vec<(GgmlType, usize)> = Vec::new();
        for t in self.weights.matrices() {
            match counts.iter_mut().find(|(ty, _)| *ty == t.dtype()) {
                Some((_, n)) => *n += 1,
                None => counts.push((t.dtype(), 1)),
            }
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_encoded_tensor_reports_its_size_without_decoding_and_decodes_once() {
        let values: Vec<f32> = (0..64).map(|i| i as f32 * 0.25 - 8.0).collect();
        let t = Tensor::from(values.clone()).convert(GgmlType::BF16);
        assert_eq!((t.len(), t.nbytes(), t.dtype()), (64, 128, GgmlType::BF16));
        let Storage::Encoded { decoded, .. } = &t.0 else {
            panic!("not encoded")
        };
        assert!(decoded.get().is_none(), "len and nbytes must not decode");
        // These values have at most 8 significant bits: bf16 holds them exactly.
        assert_eq!(&t[..], &values[..]);
        let mut row = vec![0.0; 16];
        t.row_into(2, 16, &mut row);
        assert_eq!(row, values[32..48]);
    }

    #[test]
    fn encoded_constructors_refuse_wrong_sizes_and_types() {
        assert!(Tensor::encoded_from_bytes(GgmlType::Q8_0, vec![0; 34], 32).is_some());
        assert!(Tensor::encoded_from_bytes(GgmlType::Q8_0, vec![0; 33], 32).is_none());
        assert!(Tensor::encoded_from_bytes(GgmlType::Q8_0, vec![0; 34], 31).is_none());
        // Q4_0 has no kernel, so it is decoded at load instead of kept.
        assert!(Tensor::encoded_from_bytes(GgmlType::Q4_0, vec![0; 18], 32).is_none());
    }

    #[test]
    fn weight_formats_round_trip_their_names() {
        for f in WeightFormat::ALL {
            assert_eq!(f.name().parse::<WeightFormat>().unwrap(), f);
        }
        let e = "q4".parse::<WeightFormat>().unwrap_err().to_string();
        assert!(e.contains("stored, f32, bf16, f16"), "{e}");
    }
}
