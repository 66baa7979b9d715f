//! The paged KV pool of the CPU engine: per layer, K and V of shape
//! `(num_blocks, block_size, n_kv_heads, head_dim)`, i.e. one row of kv_dim elements per slot,
//! slot = block · block_size + offset (vLLM's layout, flattened), stored in the pool's
//! [`KvDtype`]. Allocated once, up front; blocks are handed out by
//! `kvlab_paged::BlockAllocator`, never by this struct.

use kvlab_model::KvDtype;

use crate::kv_store::{KvStore, Part};

/// K and V blocks for every layer.
pub struct KvPool {
    /// Per layer. (n_layers,) × (num_blocks · block_size, n_kv_heads, head_dim)
    k: Vec<KvStore>,
    v: Vec<KvStore>,
    /// Blocks per layer, the same block ids in every layer.
    pub num_blocks: usize,
    /// Slots (token positions) per block.
    pub block_size: usize,
    /// Elements of one slot's key or value row: n_kv_heads · head_dim.
    pub kv_dim: usize,
}

impl KvPool {
    /// Allocates `num_blocks` blocks for each of `n_layers` layers, elements stored as `dtype`
    /// (int4 keys grouped by block: a group never holds two sequences' tokens).
    pub fn new(
        n_layers: usize,
        num_blocks: usize,
        block_size: usize,
        (n_kv_heads, head_dim): (usize, usize),
        dtype: KvDtype,
    ) -> KvPool {
        let slots = num_blocks * block_size;
        let store = |part| KvStore::new(dtype, part, slots, (n_kv_heads, head_dim), block_size);
        KvPool {
            k: (0..n_layers).map(|_| store(Part::Keys)).collect(),
            v: (0..n_layers).map(|_| store(Part::Values)).collect(),
            num_blocks,
            block_size,
            kv_dim: n_kv_heads * head_dim,
        }
    }

    /// Layer `l`'s K and V, each (num_blocks · block_size, kv_dim).
    pub fn layer(&self, l: usize) -> (&KvStore, &KvStore) {
        (&self.k[l], &self.v[l])
    }

    /// `reshape_and_cache`: stores one token's k and v (kv_dim,) at `slot` of layer `l`,
    /// quantized to the pool's dtype.
    pub fn write(&mut self, l: usize, slot: usize, k: &[f32], v: &[f32]) {
        self.k[l].write(slot, k);
        self.v[l].write(slot, v);
    }

    /// Copy-on-write: block `dst` of layer `l` becomes a copy of block `src` (scales included).
    pub fn copy_block(&mut self, l: usize, src: usize, dst: usize) {
        let bs = self.block_size;
        self.k[l].copy_rows(src * bs, dst * bs, bs);
        self.v[l].copy_rows(src * bs, dst * bs, bs);
    }

    /// Appends block `block` of `layers` (K then V of each, as stored) to `out`: what a tier
    /// below the pool keeps. `None` only for int4 keys not grouped by block (never: see `new`).
    pub fn save_block(&self, layers: &[usize], block: usize, out: &mut Vec<u8>) -> Option<()> {
        let bs = self.block_size;
        for &l in layers {
            self.k[l].save_rows(block * bs, bs, out)?;
            self.v[l].save_rows(block * bs, bs, out)?;
        }
        Some(())
    }

    /// Overwrites block `block` of `layers` with bytes [`KvPool::save_block`] gave for the same
    /// layers. `None` if `bytes` is not exactly that long or malformed.
    pub fn load_block(&mut self, layers: &[usize], block: usize, mut bytes: &[u8]) -> Option<()> {
        let bs = self.block_size;
        for &l in layers {
            self.k[l].load_rows(block * bs, bs, &mut bytes)?;
            self.v[l].load_rows(block * bs, bs, &mut bytes)?;
        }
        bytes.is_empty().then_some(())
    }

    /// The dtype keys and values are stored in.
    pub fn dtype(&self) -> KvDtype {
        self.k.first().map_or(KvDtype::F32, KvStore::dtype)
    }

    /// Bytes of one block across K and V of one layer.
    pub fn block_bytes(&self) -> usize {
        let (k, v) = (self.k.first(), self.v.first());
        k.zip(v).map_or(0, |(k, v)| {
            k.bytes_for(self.block_size) + v.bytes_for(self.block_size)
        })
    }

    /// Bytes the whole pool reserves.
    pub fn reserved_bytes(&self) -> usize {
        self.k.iter().chain(&self.v).map(KvStore::bytes).sum()
    }

    /// Bytes of int4 key blocks not yet full, held in f32 beside the pool (0 for the other
    /// dtypes).
    pub fn residual_bytes(&self) -> usize {
        self.k.iter().map(KvStore::residual_bytes).sum()
    }
}
