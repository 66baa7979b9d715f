//! Activation buffers of one step, allocated once and grown (to the next power of two) only when
//! a step brings more tokens or sequences than ever before: the forward pass never allocates.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use kvlab_model::Config;

use crate::dtype::DType;
use crate::error::Result;

/// Buffers over the step's tokens (`cap_tokens` rows) and sequences (`cap_seqs` rows), in the
/// activation type `A` unless noted.
pub struct Workspace<A> {
    /// Tokens a step may bring before the buffers grow (a power of two once grown).
    pub cap_tokens: usize,
    /// Sequences a step may bring before the buffers grow.
    pub cap_seqs: usize,
    /// (cap_tokens, dim) f32: the residual stream stays f32 in every mode.
    pub x: CudaSlice<f32>,
    /// (cap_tokens, dim) normalised input of a block.
    pub xn: CudaSlice<A>,
    /// (cap_tokens, q_dim)
    pub q: CudaSlice<A>,
    /// (cap_tokens, kv_dim) each
    pub k: CudaSlice<A>,
    /// (cap_tokens, kv_dim) the step's values.
    pub v: CudaSlice<A>,
    /// (cap_tokens, q_dim) attention output
    pub att: CudaSlice<A>,
    /// (cap_tokens, dim) output of wo / w2
    pub o: CudaSlice<A>,
    /// (cap_tokens, hidden_dim) each
    pub gate: CudaSlice<A>,
    /// (cap_tokens, hidden_dim) the up projection, multiplied into `gate` by the GLU.
    pub up: CudaSlice<A>,
    /// (cap_seqs, dim) f32: the residual row of each row whose logits are computed (each
    /// sequence's last token, and its draft tokens)
    pub last: CudaSlice<f32>,
    /// (cap_seqs, dim) its final norm
    pub last_n: CudaSlice<A>,
    /// (cap_seqs, vocab_size) f32
    pub logits: CudaSlice<f32>,
    /// (cap_seqs,) greedy tokens
    pub tokens: CudaSlice<i32>,
}

impl<A: DType> Workspace<A> {
    /// Buffers for up to `tokens` tokens and `seqs` rows of logits (a sequence's last token,
    /// or a draft token's) per step.
    ///
    /// # Errors
    /// Driver errors (out of memory).
    pub fn new(stream: &Arc<CudaStream>, c: &Config, tokens: usize, seqs: usize) -> Result<Self> {
        let (t, s) = (tokens.max(1), seqs.max(1));
        Ok(Workspace {
            cap_tokens: t,
            cap_seqs: s,
            x: stream.alloc_zeros(t * c.dim)?,
            xn: stream.alloc_zeros(t * c.dim)?,
            q: stream.alloc_zeros(t * c.q_dim())?,
            k: stream.alloc_zeros(t * c.kv_dim())?,
            v: stream.alloc_zeros(t * c.kv_dim())?,
            att: stream.alloc_zeros(t * c.q_dim())?,
            o: stream.alloc_zeros(t * c.dim)?,
            gate: stream.alloc_zeros(t * c.hidden_dim)?,
            up: stream.alloc_zeros(t * c.hidden_dim)?,
            last: stream.alloc_zeros(s * c.dim)?,
            last_n: stream.alloc_zeros(s * c.dim)?,
            logits: stream.alloc_zeros(s * c.vocab_size)?,
            tokens: stream.alloc_zeros(s)?,
        })
    }

    /// Grows the buffers if a step needs more than their capacity.
    ///
    /// # Errors
    /// Driver errors (out of memory).
    pub fn ensure(
        &mut self,
        stream: &Arc<CudaStream>,
        c: &Config,
        tokens: usize,
        seqs: usize,
    ) -> Result<()> {
        if tokens > self.cap_tokens || seqs > self.cap_seqs {
            let t = self.cap_tokens.max(tokens.next_power_of_two());
            let s = self.cap_seqs.max(seqs.next_power_of_two());
            *self = Workspace::new(stream, c, t, s)?;
        }
        Ok(())
    }
}
