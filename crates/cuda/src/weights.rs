//! The model's weights on the device: matrices in the weight type `W` (f32 for parity, f16 for
//! speed), norm gains always in f32 (they are tiny, and the norm kernels read them as f32).
//! Row-major `(out, in)` as in kvlab-model, which is what `Ops::linear` (`gemm.rs`) expects.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use kvlab_model::Weights;

use crate::dtype::DType;
use crate::error::{CudaError, Result};

/// Largest finite f16.
const F16_MAX: f32 = 65504.0;

/// One layer's tensors on the device.
pub struct DeviceLayer<W> {
    /// (dim,) f32
    pub attn_norm: CudaSlice<f32>,
    /// (q_dim, dim)
    pub wq: CudaSlice<W>,
    /// (kv_dim, dim)
    pub wk: CudaSlice<W>,
    /// (kv_dim, dim)
    pub wv: CudaSlice<W>,
    /// (dim, q_dim)
    pub wo: CudaSlice<W>,
    /// (q_dim,), (kv_dim,), (kv_dim,) f32, when the projections have biases (Qwen2).
    pub bq: Option<CudaSlice<f32>>,
    /// (kv_dim,) f32 key bias, when the projections have biases.
    pub bk: Option<CudaSlice<f32>>,
    /// (kv_dim,) f32 value bias, when the projections have biases.
    pub bv: Option<CudaSlice<f32>>,
    /// (head_dim,) f32 each, when the model has QK-norm.
    pub q_norm: Option<CudaSlice<f32>>,
    /// (head_dim,) f32 key norm gain, when the model has QK-norm.
    pub k_norm: Option<CudaSlice<f32>>,
    /// (dim,) f32, when the model has post norms.
    pub post_attn_norm: Option<CudaSlice<f32>>,
    /// (dim,) f32
    pub ffn_norm: CudaSlice<f32>,
    /// (hidden_dim, dim) gate
    pub w1: CudaSlice<W>,
    /// (dim, hidden_dim) down
    pub w2: CudaSlice<W>,
    /// (hidden_dim, dim) up
    pub w3: CudaSlice<W>,
    /// (dim,) f32, when the model has post norms.
    pub post_ffn_norm: Option<CudaSlice<f32>>,
}

/// All weights on the device.
pub struct DeviceWeights<W> {
    /// (vocab_size, dim)
    pub token_embedding: CudaSlice<W>,
    /// (vocab_size, dim), when not shared with the embedding.
    pub classifier: Option<CudaSlice<W>>,
    /// (dim,) f32
    pub final_norm: CudaSlice<f32>,
    /// (n_layers,)
    pub layers: Vec<DeviceLayer<W>>,
    /// Bytes on the device.
    pub bytes: usize,
}

/// Uploads tensors one at a time (a converted copy of one tensor at most lives on the host) and
/// counts the bytes.
struct Uploader<'a, W> {
    stream: &'a Arc<CudaStream>,
    bytes: usize,
    _w: PhantomData<W>,
}

impl<W: DType> Uploader<'_, W> {
    fn matrix(&mut self, name: &str, x: &[f32]) -> Result<CudaSlice<W>> {
        let overflow = if W::BYTES == 2 {
            x.iter().find(|v| v.abs() > F16_MAX)
        } else {
            None
        };
        if let Some(v) = overflow {
            return Err(CudaError::Unsupported(format!(
                "weight {name} holds {v}, beyond f16's range; use precision f32"
            )));
        }
        self.bytes += x.len() * W::BYTES;
        Ok(self.stream.clone_htod(W::from_f32_slice(x).as_ref())?)
    }

    fn gain(&mut self, x: &[f32]) -> Result<CudaSlice<f32>> {
        self.bytes += x.len() * 4;
        Ok(self.stream.clone_htod(x)?)
    }

    fn optional_gain(&mut self, x: &[f32]) -> Result<Option<CudaSlice<f32>>> {
        if x.is_empty() {
            Ok(None)
        } else {
            self.gain(x).map(Some)
        }
    }
}

impl<W: DType> DeviceWeights<W> {
    /// Uploads `w` (already checked against its config by `Model::new`), converting matrices
    /// to `W`.
    ///
    /// # Errors
    /// [`CudaError::Unsupported`] if a weight is outside f16's range in f16 mode; driver errors
    /// (out of memory).
    pub fn upload(stream: &Arc<CudaStream>, w: &Weights) -> Result<DeviceWeights<W>> {
        let mut up = Uploader::<W> {
            stream,
            bytes: 0,
            _w: PhantomData,
        };
        let token_embedding = up.matrix("token_embedding", &w.token_embedding)?;
        let classifier = match &w.classifier {
            Some(cls) => Some(up.matrix("classifier", cls)?),
            None => None,
        };
        let final_norm = up.gain(&w.final_norm)?;
        let mut layers = Vec::with_capacity(w.layers.len());
        for (i, l) in w.layers.iter().enumerate() {
            let name = |t: &str| format!("layers[{i}].{t}");
            layers.push(DeviceLayer {
                attn_norm: up.gain(&l.attn_norm)?,
                wq: up.matrix(&name("wq"), &l.wq)?,
                wk: up.matrix(&name("wk"), &l.wk)?,
                wv: up.matrix(&name("wv"), &l.wv)?,
                wo: up.matrix(&name("wo"), &l.wo)?,
                bq: up.optional_gain(&l.bq)?,
                bk: up.optional_gain(&l.bk)?,
                bv: up.optional_gain(&l.bv)?,
                q_norm: up.optional_gain(&l.q_norm)?,
                k_norm: up.optional_gain(&l.k_norm)?,
                post_attn_norm: up.optional_gain(&l.post_attn_norm)?,
                ffn_norm: up.gain(&l.ffn_norm)?,
                w1: up.matrix(&name("w1"), &l.w1)?,
                w2: up.matrix(&name("w2"), &l.w2)?,
                w3: up.matrix(&name("w3"), &l.w3)?,
                post_ffn_norm: up.optional_gain(&l.post_ffn_norm)?,
            });
        }
        Ok(DeviceWeights {
            token_embedding,
            classifier,
            final_norm,
            layers,
            bytes: up.bytes,
        })
    }

    /// The classifier (vocab_size, dim): the unshared one or the embedding.
    pub fn classifier(&self) -> &CudaSlice<W> {
        self.classifier.as_ref().unwrap_or(&self.token_embedding)
    }
}
