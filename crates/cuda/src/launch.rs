//! Launch configurations and argument packing: pure functions of shapes and step metadata, so
//! every grid size, partition count and packed array is unit-tested on a machine without a GPU.
//!
//! The constants mirror the `#define`s of `kernels/*.cu`; the kernels assume them (e.g. the
//! attention kernels use exactly [`ATTN_WARPS`] warps, argmax exactly [`ARGMAX_THREADS`] threads).

use std::ops::Range;

use cudarc::driver::LaunchConfig;
pub use kvlab_paged::first_key;
use kvlab_paged::{KvCacheConfig, ModelInput, PAD_BLOCK};

use crate::error::{CudaError, Result};

/// Threads per warp.
pub const WARP: u32 = 32;
/// Warps per attention thread block (`KVLAB_ATTN_WARPS`).
pub const ATTN_WARPS: u32 = 4;
/// Threads per attention thread block.
pub const ATTN_THREADS: u32 = ATTN_WARPS * WARP;
/// Largest head_dim of the attention kernels (`KVLAB_MAX_HEAD_DIM`).
pub const MAX_HEAD_DIM: usize = 256;
/// Threads of the argmax kernel (`KVLAB_ARGMAX_THREADS`, a power of two).
pub const ARGMAX_THREADS: u32 = 256;
/// Threads per block of elementwise and row-copy kernels.
pub const ELEMENTWISE_THREADS: u32 = 256;
/// Keys per partition of paged_attention_v2 (vLLM uses 512 too).
pub const PARTITION_SIZE: usize = 512;
/// Grid-stride kernels never launch more blocks than this; the loop covers the rest.
pub const MAX_ELEMENTWISE_BLOCKS: usize = 1 << 16;
/// CUDA's limit on gridDim.y and gridDim.z.
pub const MAX_GRID_YZ: usize = 65_535;

/// `v` as an i32 kernel argument.
///
/// # Errors
/// [`CudaError::Unsupported`] naming `what` when it does not fit.
pub fn i32_of(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| {
        CudaError::Unsupported(format!(
            "{what} = {v} does not fit the kernels' i32 arguments"
        ))
    })
}

fn grid_x(what: &str, n: usize) -> Result<u32> {
    if n == 0 {
        return Err(CudaError::BadInput(format!("a launch over 0 {what}")));
    }
    Ok(i32_of(what, n)? as u32)
}

fn grid_yz(what: &str, n: usize) -> Result<u32> {
    if n == 0 || n > MAX_GRID_YZ {
        return Err(CudaError::Unsupported(format!(
            "{what} = {n}: a grid's y and z extents must be in 1..=65535"
        )));
    }
    Ok(n as u32)
}

/// Threads for a kernel that reduces over a row of `n` elements with `block_sum`: a multiple of
/// 32 covering `n`, at least 32, at most `max`.
pub fn row_threads(n: usize, max: u32) -> u32 {
    let rounded = n.div_ceil(WARP as usize).max(1) * WARP as usize;
    rounded.min(max as usize) as u32
}

/// A launch of `grid_dim` blocks of `threads` threads, no dynamic shared memory.
fn config(grid_dim: (u32, u32, u32), threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim,
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// RMSNorm: one block per row of `n`, up to 1024 threads.
///
/// # Errors
/// No rows, or too many.
pub fn rmsnorm_config(rows: usize, n: usize) -> Result<LaunchConfig> {
    Ok(config((grid_x("rows", rows)?, 1, 1), row_threads(n, 1024)))
}

/// Row copies (embedding gather, reshape_and_cache, gather_rows): one block per row, up to 256
/// threads striding over the row.
///
/// # Errors
/// No rows, or too many.
pub fn row_copy_config(rows: usize, n: usize) -> Result<LaunchConfig> {
    let threads = row_threads(n, ELEMENTWISE_THREADS);
    Ok(config((grid_x("rows", rows)?, 1, 1), threads))
}

/// Grid-stride elementwise kernels over `n` elements.
pub fn elementwise_config(n: usize) -> LaunchConfig {
    let blocks = n
        .div_ceil(ELEMENTWISE_THREADS as usize)
        .clamp(1, MAX_ELEMENTWISE_BLOCKS);
    config((blocks as u32, 1, 1), ELEMENTWISE_THREADS)
}

/// RoPE: one thread per (token, head, pair); no grid-stride loop, so the grid covers them all.
///
/// # Errors
/// Nothing to rotate, or more pairs than a grid holds.
pub fn rope_config(n_tokens: usize, n_heads: usize, head_dim: usize) -> Result<LaunchConfig> {
    let pairs = n_tokens * n_heads * (head_dim / 2);
    let blocks = pairs.div_ceil(ELEMENTWISE_THREADS as usize);
    Ok(config(
        (grid_x("rope thread blocks", blocks)?, 1, 1),
        ELEMENTWISE_THREADS,
    ))
}

/// paged_attention_v1 (and v2's reduce): one block per (decode sequence, query head).
///
/// # Errors
/// No sequences, or too many heads.
pub fn decode_v1_config(n_decode: usize, n_heads: usize) -> Result<LaunchConfig> {
    decode_v2_config(n_decode, n_heads, 1)
}

/// paged_attention_v2: one block per (decode sequence, query head, partition).
///
/// # Errors
/// As [`decode_v1_config`], or too many partitions.
pub fn decode_v2_config(
    n_decode: usize,
    n_heads: usize,
    max_partitions: usize,
) -> Result<LaunchConfig> {
    let grid = (
        grid_x("decode sequences", n_decode)?,
        grid_yz("n_heads", n_heads)?,
        grid_yz("partitions", max_partitions)?,
    );
    Ok(config(grid, ATTN_THREADS))
}

/// prefill_attention_v1: one block per (query token, query head).
///
/// # Errors
/// No tokens, or too many heads.
pub fn prefill_config(n_query_tokens: usize, n_heads: usize) -> Result<LaunchConfig> {
    let grid = (
        grid_x("prefill tokens", n_query_tokens)?,
        grid_yz("n_heads", n_heads)?,
        1,
    );
    Ok(config(grid, ATTN_THREADS))
}

/// copy_blocks_v1: one block per (src, dst) pair.
///
/// # Errors
/// No pairs, or too many.
pub fn copy_blocks_config(n_pairs: usize) -> Result<LaunchConfig> {
    let grid = (grid_x("block copies", n_pairs)?, 1, 1);
    Ok(config(grid, ELEMENTWISE_THREADS))
}

/// argmax_v1: one block of exactly [`ARGMAX_THREADS`] per row.
///
/// # Errors
/// No rows, or too many.
pub fn argmax_config(rows: usize) -> Result<LaunchConfig> {
    Ok(config((grid_x("rows", rows)?, 1, 1), ARGMAX_THREADS))
}

/// Partitions of `partition_size` keys that `n_keys` keys need (at least 1).
pub fn num_partitions(n_keys: usize, partition_size: usize) -> usize {
    n_keys.div_ceil(partition_size.max(1)).max(1)
}

/// Floats of paged_attention_v2's workspace: per (sequence, head, partition) a max, a sum and a
/// head_dim accumulator.
pub fn v2_workspace_floats(
    n_decode: usize,
    n_heads: usize,
    max_partitions: usize,
    head_dim: usize,
) -> usize {
    n_decode * n_heads * max_partitions * (head_dim + 2)
}

/// Which decode attention kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeKernel {
    /// paged_attention_v1: one thread block per (decode sequence, query head) over all its keys.
    V1,
    /// paged_attention_v2: the keys split into partitions of [`PARTITION_SIZE`], one block per
    /// (sequence, head, partition), then a reduce; when v1 would leave SMs idle.
    V2 {
        /// Partitions of the longest decode context: the grid's z extent.
        max_partitions: usize,
    },
}

/// A forced choice of decode kernel (benchmarks compare them), or the automatic one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecodeAttention {
    /// [`choose_decode_kernel`] decides per step (the engine's default).
    #[default]
    Auto,
    /// v1 always.
    V1,
    /// v2 whenever it can run (workspace fits, at most 65,535 partitions), else v1.
    V2,
}

/// Picks the decode kernel. v1 when one partition covers the longest context, or when
/// `n_decode · n_heads` blocks already give every SM 4 blocks; otherwise v2 (partitions fill the
/// GPU), as long as its workspace fits `workspace_floats`. A forced version is honoured when it
/// can run (v2 needs the workspace and at most 65,535 partitions).
pub fn choose_decode_kernel(
    choice: DecodeAttention,
    n_decode: usize,
    n_heads: usize,
    max_keys: usize,
    head_dim: usize,
    multiprocessors: usize,
    workspace_floats: usize,
) -> DecodeKernel {
    let parts = num_partitions(max_keys, PARTITION_SIZE);
    let fits = parts <= MAX_GRID_YZ
        && v2_workspace_floats(n_decode, n_heads, parts, head_dim) <= workspace_floats;
    let v2 = DecodeKernel::V2 {
        max_partitions: parts,
    };
    match choice {
        DecodeAttention::V1 => DecodeKernel::V1,
        DecodeAttention::V2 if fits => v2,
        DecodeAttention::V2 => DecodeKernel::V1,
        DecodeAttention::Auto => {
            if parts <= 1 || n_decode * n_heads >= 4 * multiprocessors.max(1) || !fits {
                DecodeKernel::V1
            } else {
                v2
            }
        }
    }
}

/// Checks a head_dim against what the attention and RoPE kernels take.
///
/// # Errors
/// [`CudaError::Unsupported`] for an odd or zero head_dim, or one above [`MAX_HEAD_DIM`].
pub fn check_head_dim(head_dim: usize) -> Result<()> {
    if head_dim == 0 || !head_dim.is_multiple_of(2) || head_dim > MAX_HEAD_DIM {
        return Err(CudaError::Unsupported(format!(
            "head_dim {head_dim}: the attention kernels take even head_dim up to {MAX_HEAD_DIM}"
        )));
    }
    Ok(())
}

/// What the packer checks step metadata against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackGeometry {
    /// Tokens in the vocabulary: input ids must be below it.
    pub vocab_size: usize,
    /// Rows of the RoPE tables: positions must be below it.
    pub max_positions: usize,
    /// The pool: tokens per block, and per group its blocks and window (`None` for the global
    /// group) — the engine's one `KvCacheConfig`.
    pub kv_cache: KvCacheConfig,
}

/// Where one group's arrays are in [`PackedStep::ints`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupMeta {
    /// (n_tokens,) slot per token, -1 = do not store.
    pub slot_mapping: Range<usize>,
    /// (n_seqs, max_blocks) row-major, -1 padded.
    pub block_tables: Range<usize>,
    /// Columns of `block_tables`: the longest table of the step, at least 1.
    pub max_blocks: usize,
    /// (n_copies, 2) (src, dst) block pairs.
    pub copies: Range<usize>,
    /// Pairs in `copies`: copy-on-write block copies, run in each layer before the step's writes.
    pub n_copies: usize,
    /// Most keys any decode sequence of the step attends to in this group (window-limited).
    pub max_decode_keys: usize,
    /// The group's sliding window in keys, `None` for the global group.
    pub window: Option<usize>,
}

/// A step's metadata as one i32 arena (one host-to-device copy per step) and the ranges of its
/// arrays.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackedStep {
    /// Every array of the step, one after another, as copied to the device.
    pub ints: Vec<i32>,
    /// New tokens of the step, prefill and decode together.
    pub n_tokens: usize,
    /// Sequences in the step.
    pub n_seqs: usize,
    /// The leading sequences with exactly one new token: the decode kernel takes them, and their
    /// tokens are rows 0..n_decode. The prefill kernel takes rows n_decode..n_tokens.
    pub n_decode: usize,
    /// (n_tokens,) token ids.
    pub input_ids: Range<usize>,
    /// (n_tokens,) positions.
    pub positions: Range<usize>,
    /// (n_seqs + 1,) cumulative query lengths.
    pub query_start_loc: Range<usize>,
    /// (n_seqs,) keys per sequence after the step.
    pub context_lens: Range<usize>,
    /// (n_tokens,) sequence index of each token.
    pub token_seq: Range<usize>,
    /// (n_logits,) the rows whose logits the step returns: each sequence's last token's, and
    /// with speculative decoding its draft tokens' before it (n_logits = n_seqs without).
    pub logits_indices: Range<usize>,
    /// (num_groups,)
    pub groups: Vec<GroupMeta>,
}

fn push(ints: &mut Vec<i32>, values: impl IntoIterator<Item = i32>) -> Range<usize> {
    let start = ints.len();
    ints.extend(values);
    start..ints.len()
}

/// Validates a [`ModelInput`] ([`ModelInput::validate`]: what the kernels would otherwise read
/// or write out of bounds — token ids, consecutive positions below the RoPE tables, slots that
/// match the block tables, cached keys backed by blocks, copies inside the pool) and packs it
/// into one i32 arena.
///
/// # Errors
/// [`CudaError::BadInput`] naming the first violation; [`CudaError::Unsupported`] for counts
/// beyond i32.
pub fn pack_step(input: &ModelInput, geom: &PackGeometry) -> Result<PackedStep> {
    input
        .validate(&geom.kv_cache, geom.vocab_size, geom.max_positions)
        .map_err(|e| CudaError::BadInput(e.to_string()))?;
    let (n_tokens, n_seqs) = (input.input_ids.len(), input.num_seqs());
    let bs = geom.kv_cache.block_size;
    i32_of("tokens in a step", n_tokens)?;
    for group in &geom.kv_cache.groups {
        i32_of("slots in the pool", group.num_blocks * bs)?;
    }
    let qsl = &input.query_start_loc;
    let mut ints = Vec::new();
    let input_ids = push(&mut ints, input.input_ids.iter().map(|&t| t as i32));
    let n_decode = (0..n_seqs)
        .take_while(|&s| qsl[s + 1] - qsl[s] == 1)
        .count();
    let positions = push(&mut ints, input.positions.iter().map(|&p| p as i32));
    let query_start_loc = push(&mut ints, qsl.iter().copied());
    let context_lens = push(&mut ints, input.context_lens.iter().copied());
    let token_seq = push(
        &mut ints,
        (0..n_seqs).flat_map(|s| std::iter::repeat_n(s as i32, (qsl[s + 1] - qsl[s]) as usize)),
    );
    let logits_indices = push(&mut ints, input.logits_indices.iter().map(|&r| r as i32));
    let mut groups = Vec::with_capacity(input.groups.len());
    for (gi, group) in input.groups.iter().zip(&geom.kv_cache.groups) {
        let window = group.sliding_window;
        let bt = &gi.block_tables;
        // A kernel needs at least one column even if every row is empty.
        let max_blocks = bt.max_blocks_per_seq.max(1);
        let max_decode_keys = (0..n_decode)
            .map(|s| {
                let ctx = input.context_lens[s] as usize;
                ctx - first_key(ctx - 1, window)
            })
            .max()
            .unwrap_or(0);
        let slot_mapping = push(&mut ints, gi.slot_mapping.iter().map(|&s| s as i32));
        let block_tables = if bt.max_blocks_per_seq == 0 {
            push(&mut ints, std::iter::repeat_n(PAD_BLOCK, n_seqs))
        } else {
            push(&mut ints, bt.data.iter().copied())
        };
        let copies = push(
            &mut ints,
            gi.block_copies
                .iter()
                .flat_map(|c| [c.src as i32, c.dst as i32]),
        );
        groups.push(GroupMeta {
            slot_mapping,
            block_tables,
            max_blocks,
            copies,
            n_copies: gi.block_copies.len(),
            max_decode_keys,
            window,
        });
    }
    Ok(PackedStep {
        ints,
        n_tokens,
        n_seqs,
        n_decode,
        input_ids,
        positions,
        query_start_loc,
        context_lens,
        token_seq,
        logits_indices,
        groups,
    })
}

#[cfg(test)]
mod tests;
