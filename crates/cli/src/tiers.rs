//! The tiers below a paged engine's pool, as flags: host memory, files, and a remote tier in
//! Redis shared with other kvlab processes; and the one-line summary of what they did.

use anyhow::{Context, Result};

use crate::bytes;

/// Host-memory blocks per group when `--remote-tier` or `--slot-save-path` is given without
/// `--host-tier-blocks`: fetched and restored blocks come back through host memory.
const REMOTE_HOST_BLOCKS: usize = 1024;

/// Tiers below a paged engine's pool: evicted prefix-cache blocks are spilled to host memory,
/// then to files, and restored on a later hit instead of recomputed.
#[derive(clap::Args, Clone)]
pub struct TierArgs {
    /// Blocks per KV cache group kept in host memory below the pool (0: none).
    #[arg(long, default_value_t = 0, value_parser = kvlab_cli::args::usize_in(0, kvlab_cli::args::MAX_NUM_BLOCKS))]
    pub host_tier_blocks: usize,
    /// Directory for a disk tier below host memory (a subdirectory per run, removed at the
    /// end); blocks are written with a CRC-32 and a corrupt file is a miss.
    #[arg(long)]
    pub disk_tier: Option<std::path::PathBuf>,
    /// Blocks per KV cache group the disk tier holds.
    #[arg(long, default_value_t = 4096, value_parser = kvlab_cli::args::usize_in(1, kvlab_cli::args::MAX_NUM_BLOCKS))]
    pub disk_tier_blocks: usize,
    /// Scheduler steps a spilled block may stay below before it is dropped (default: until
    /// the tiers are full and it is the oldest).
    #[arg(long, value_parser = kvlab_cli::args::usize_in(1, 1 << 40))]
    pub tier_ttl_steps: Option<usize>,
    /// Restore a request's spilled levels only when faster than recomputing them, by the cost
    /// model NS_PER_TOKEN,HOST_BYTES_PER_S,DISK_BYTES_PER_S (prefill nanoseconds per token;
    /// bytes per second restored from memory and from files; `cargo xtask bench --tiers`
    /// prints this machine's). Default: always restore.
    #[arg(long, value_name = "NS,HOST_BPS,DISK_BPS", value_parser = parse_restore_cost)]
    pub restore_cost: Option<kvlab_paged::RestoreCost>,
    /// A tier in Redis below host memory and files, shared by every kvlab process that names
    /// it: each full block computed is written there once, and a prefix this process lacks is
    /// fetched from there (verified against the model, the KV layout and the tokens) instead of
    /// recomputed. redis://[USER[:PASSWORD]@]HOST:PORT[/DB]; a password may also come from
    /// REDISCLI_AUTH. Redis down or slow means recompute, never a failed request. Fetched
    /// blocks come back through host memory (--host-tier-blocks, 1024 unless given).
    #[arg(long, env = "KVLAB_REMOTE_TIER", value_name = "URL")]
    pub remote_tier: Option<String>,
    /// Seconds Redis keeps each block written to the remote tier (default: until Redis's
    /// maxmemory policy evicts it).
    #[arg(long, requires = "remote_tier", value_parser = clap::value_parser!(u64).range(1..))]
    pub remote_tier_ttl: Option<u64>,
}

/// `--restore-cost NS_PER_TOKEN,HOST_BYTES_PER_S,DISK_BYTES_PER_S`.
fn parse_restore_cost(s: &str) -> Result<kvlab_paged::RestoreCost, String> {
    let v: Vec<u64> = s
        .split(',')
        .map(|x| x.trim().parse::<u64>())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{s:?}: {e}; expected three whole numbers NS,HOST_BPS,DISK_BPS"))?;
    match v[..] {
        [ns, host, disk] if host > 0 && disk > 0 => Ok(kvlab_paged::RestoreCost {
            prefill_ns_per_token: ns,
            host_bytes_per_s: host,
            disk_bytes_per_s: disk,
        }),
        _ => Err(format!(
            "{s:?}: expected NS_PER_TOKEN,HOST_BYTES_PER_S,DISK_BYTES_PER_S with both rates above 0"
        )),
    }
}

impl TierArgs {
    /// The tiers asked for, `None` when no tier flag is given. The remote tier's blocks are
    /// shared only with processes of the same `namespace` ([`remote_namespace`]), which is
    /// called only when `--remote-tier` is given. With `restores` (saved sessions restore
    /// through host memory) host memory is on even without a tier flag.
    ///
    /// # Errors
    /// Whatever `namespace` fails with (a model file that cannot be read for its digest).
    pub fn config(
        &self,
        restores: bool,
        namespace: impl FnOnce() -> Result<String>,
    ) -> Result<Option<kvlab_paged::TierConfig>> {
        let host = match self.host_tier_blocks {
            0 if restores || self.remote_tier.is_some() => REMOTE_HOST_BLOCKS,
            n => n,
        };
        let Some(url) = &self.remote_tier else {
            return Ok(self.local_config(host));
        };
        let remote = kvlab_paged::RemoteTierConfig {
            url: url.clone(),
            password: std::env::var("REDISCLI_AUTH").ok(),
            namespace: namespace()?,
            ttl_secs: self.remote_tier_ttl,
        };
        let host = match self.host_tier_blocks {
            0 => REMOTE_HOST_BLOCKS,
            n => n,
        };
        Ok(self.local_config(host).map(|t| t.with_remote(Some(remote))))
    }

    /// The tiers of this process alone (host memory, files), `None` when neither is asked for.
    pub fn local(&self) -> Option<kvlab_paged::TierConfig> {
        self.local_config(self.host_tier_blocks)
    }

    /// Host memory of `host_blocks` blocks and the disk tier, if either is asked for.
    fn local_config(&self, host_blocks: usize) -> Option<kvlab_paged::TierConfig> {
        let host = kvlab_paged::TierConfig::host(host_blocks)
            .with_ttl_steps(self.tier_ttl_steps.map(|s| s as u64))
            .with_restore_cost(self.restore_cost);
        match &self.disk_tier {
            Some(dir) => Some(host.with_disk(dir, self.disk_tier_blocks)),
            None => (host_blocks > 0).then_some(host),
        }
    }
}

/// What a remote tier's blocks are only reusable under: the model (its name and the sha256 of
/// every file it was read from), how its weights are held, the engine, the KV dtype, the block
/// size and kvlab's version. The KV bytes of a block depend on each.
///
/// # Errors
/// A model file that cannot be read.
pub fn remote_namespace(
    loaded: (&str, &[std::path::PathBuf]),
    weights: kvlab_model::WeightFormat,
    engine: &str,
    kv_dtype: kvlab_model::KvDtype,
    block_size: usize,
) -> Result<String> {
    let (name, paths) = loaded;
    let mut files = Vec::new();
    for f in paths {
        let sha = kvlab_model::registry::sha256_file(f)
            .with_context(|| format!("the remote tier's model digest: {}", f.display()))?;
        files.push(sha);
    }
    Ok(format!(
        "model={} files={} weights={} engine={engine} kv_dtype={kv_dtype} block_size={block_size} kvlab={}",
        name,
        files.join(","),
        weights.name(),
        env!("CARGO_PKG_VERSION")
    ))
}

/// One line on what the tiers did, from a run's metrics.
pub fn tier_summary(m: &kvlab_paged::Metrics) -> String {
    let t = &m.tier_store;
    let r = &m.remote_tier;
    let remote = if r.lookups + r.blocks_written + r.errors == 0 {
        String::new()
    } else {
        format!(
            "; remote tier: {} blocks fetched ({}), {} missing, {} refused, {} restored, {} written ({}), {} failed commands",
            r.hits,
            bytes(r.bytes_read as usize),
            r.misses,
            r.rejected,
            t.blocks_restored_from_remote,
            r.blocks_written,
            bytes(r.bytes_written as usize),
            r.errors
        )
    };
    format!(
        "tiers: {} blocks spilled, {} restored ({} read back from disk, {} declined by the cost model), {} dropped ({} full, {} expired, {} computed again, {} lost); now {} blocks ({}) in host memory and {} ({}) on disk; {} unreadable files, {} failed writes; prefix-cache hit tokens by tier: {} pool, {} host, {} disk, {} remote{remote}",
        m.num_spills,
        m.num_restores,
        bytes(t.bytes_read_from_disk as usize),
        m.num_restores_declined,
        m.tier_drops.total(),
        m.tier_drops.full,
        m.tier_drops.expired,
        m.tier_drops.recomputed,
        m.tier_drops.lost,
        t.host_blocks,
        bytes(t.host_bytes as usize),
        t.disk_blocks,
        bytes(t.disk_bytes as usize),
        t.disk_read_errors,
        t.disk_write_errors,
        m.prefix_cache_hits_by_tier.pool,
        m.prefix_cache_hits_by_tier.host,
        m.prefix_cache_hits_by_tier.disk,
        m.prefix_cache_hits_by_tier.remote
    )
}
