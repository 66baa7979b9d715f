//! The paged KV pool of the CPU engine: per layer, K and V of shape
//! `(num_blocks, block_size, n_kv_heads, head_dim)`, i.e. one row of `kv_dim` floats per slot,
//! slot = block · block_size + offset (vLLM's layout, flattened). Allocated once, up front; blocks
//! are handed out by `kvlab_paged::BlockAllocator`, never by this struct.

/// K and V blocks for every layer.
pub struct KvPool {
    /// Per layer. (n_layers,) × (num_blocks, block_size, n_kv_heads, head_dim)
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    pub num_blocks: usize,
    pub block_size: usize,
    pub kv_dim: usize,
}

impl KvPool {
    /// Allocates `num_blocks` blocks for each of `n_layers` layers.
    pub fn new(n_layers: usize, num_blocks: usize, block_size: usize, kv_dim: usize) -> KvPool {
        let n = num_blocks * block_size * kv_dim;
        KvPool {
            k: vec![vec![0.0; n]; n_layers],
            v: vec![vec![0.0; n]; n_layers],
            num_blocks,
            block_size,
            kv_dim,
        }
    }

    /// Layer `l`'s K and V, each (num_blocks · block_size, kv_dim).
    pub fn layer(&self, l: usize) -> (&[f32], &[f32]) {
        (&self.k[l], &self.v[l])
    }

    /// `reshape_and_cache`: stores one token's k and v (kv_dim,) at `slot` of layer `l`.
    pub fn write(&mut self, l: usize, slot: usize, k: &[f32], v: &[f32]) {
        let at = slot * self.kv_dim;
        self.k[l][at..at + self.kv_dim].copy_from_slice(k);
        self.v[l][at..at + self.kv_dim].copy_from_slice(v);
    }

    /// Copy-on-write: block `dst` of layer `l` becomes a copy of block `src`.
    pub fn copy_block(&mut self, l: usize, src: usize, dst: usize) {
        let n = self.block_size * self.kv_dim;
        self.k[l].copy_within(src * n..(src + 1) * n, dst * n);
        self.v[l].copy_within(src * n..(src + 1) * n, dst * n);
    }

    /// Bytes of one block across K and V of one layer (f32).
    pub fn block_bytes(&self) -> usize {
        2 * self.block_size * self.kv_dim * 4
    }

    /// Bytes the whole pool reserves.
    pub fn reserved_bytes(&self) -> usize {
        self.k.len() * self.num_blocks * self.block_bytes()
    }
}
