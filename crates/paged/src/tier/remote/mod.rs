//! The remote tier: blocks in Redis, shared by every process that names the same store
//! (LMCache's Redis backend, SGLang HiCache's storage tier).
//!
//! Unlike host memory and files, which hold *this run's* evicted entries by entry id, the remote
//! tier is addressed by **content**, so that another process (another `kvlab serve` behind the
//! same load balancer, or this one after a restart) can find a block it never computed:
//!
//! ```text
//! seed    = SHA-256("kvlab remote tier v1" ‖ namespace digest ‖ group as u32)
//! d(-1)   = seed
//! d(i)    = SHA-256(d(i-1) ‖ key tokens of level i as u32 LE)     (the salt is in level 0's key)
//! key(i)  = "kvlab:{namespace digest, 16 hex}:g{group}:{d(i), 64 hex}"
//! ```
//!
//! The namespace names everything that makes a block's bytes reusable — model file digest,
//! engine, weight format, KV dtype, block size (the caller builds it) — and `d(i)` names the
//! whole prefix up to the end of level `i`, cache salt included, with a collision-resistant
//! hash. A value is
//!
//! ```text
//! "KVLABRT1" ‖ namespace digest (32) ‖ group u32 ‖ level u32 ‖ d(i) (32)
//!            ‖ n_tokens u32 ‖ tokens (n_tokens × u32) ‖ payload_len u64 ‖ payload ‖ CRC-32 u32
//! ```
//!
//! (little-endian; the CRC covers everything before it). **The store is untrusted**: a value is
//! used only if its length is exact, its CRC matches, its namespace, group, level and digest are
//! the ones asked for, its tokens are the request's and its payload has the length of one block
//! of this engine's pool for that group. Anything else is counted as rejected, deleted, and the
//! level recomputed. (A CRC stops corruption, not a writer with the store's credentials who
//! forges a well-formed value: keep Redis behind AUTH/ACLs, as the `--remote-tier` URL allows.)
//!
//! **Redis down, slow or full never fails a request** (`conn.rs`): every command runs with
//! short timeouts; a failed connection is counted, logged once per outage, and the tier stays
//! off for [`RETRY_AFTER`] before the next try: lookups then miss (the prefix is recomputed).
//! An error reply (Redis out of memory under `noeviction`) is counted and logged once, and what
//! failed is skipped. A value is read only up to the length a valid one has (`GETRANGE`), so a
//! planted huge value costs nothing.
//!
//! Writes are **write-through** and off the engine thread (`writer.rs`): each full block a
//! request computes is read when the step after it starts (before anything can overwrite it)
//! and handed to a writer thread, which stores it with `SET … NX` (the first writer of a
//! content wins); when the writer falls behind, writes are dropped and counted, never waited
//! for. A fetched block enters host
//! memory ([`super::KvTierStore`]) as if it had been spilled there, and is restored into the
//! pool the same way.

mod conn;
mod value;
mod writer;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use sha2::{Digest, Sha256};

use conn::Conn;
pub use conn::RETRY_AFTER;
use value::{Header, hex};
use writer::{Write, Writer};

use crate::allocator::salted;
use crate::{PagedError, Result};

const MAGIC: &[u8; 8] = b"KVLABRT1";
/// Contents remembered as already written, before the memory is cleared (a write after that
/// costs one `SET … NX` round trip, nothing else).
const MAX_REMEMBERED: usize = 1 << 20;
/// How long a lookup that found nothing is not repeated for the same first level.
const MISS_MEMORY: Duration = Duration::from_secs(1);
/// Misses remembered before the expired ones are forgotten.
const MAX_REMEMBERED_MISSES: usize = 4096;

/// Where the remote tier is and what its blocks belong to.
#[derive(Clone, PartialEq, Eq)]
pub struct RemoteTierConfig {
    /// `redis://[USER[:PASSWORD]@]HOST:PORT[/DB]` (or `unix:///PATH`).
    pub url: String,
    /// The password when the URL has none (the CLI reads it from `REDISCLI_AUTH`, redis-cli's
    /// variable, so that it stays out of process listings). Never printed.
    pub password: Option<String>,
    /// Everything that makes a block's bytes reusable, as text: model digest, engine, weight
    /// format, KV dtype, block size. Processes share blocks only under the same namespace.
    pub namespace: String,
    /// Seconds Redis keeps a block after it is written (`None`: until Redis evicts it under
    /// its `maxmemory` policy).
    pub ttl_secs: Option<u64>,
}

impl RemoteTierConfig {
    /// The URL with any password replaced by `***`, for logs and reports.
    pub fn redacted_url(&self) -> String {
        match (self.url.find("://"), self.url.rfind('@')) {
            (Some(s), Some(at)) if at > s => {
                let userinfo = &self.url[s + 3..at];
                let user = userinfo.split(':').next().unwrap_or("");
                let shown = if userinfo.contains(':') {
                    format!("{user}:***")
                } else {
                    "***".to_string()
                };
                format!("{}{shown}{}", &self.url[..s + 3], &self.url[at..])
            }
            _ => self.url.clone(),
        }
    }
}

impl fmt::Debug for RemoteTierConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteTierConfig")
            .field("url", &self.redacted_url())
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("namespace", &self.namespace)
            .field("ttl_secs", &self.ttl_secs)
            .finish()
    }
}

impl Serialize for RemoteTierConfig {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("RemoteTierConfig", 3)?;
        st.serialize_field("url", &self.redacted_url())?;
        st.serialize_field("namespace", &self.namespace)?;
        st.serialize_field("ttl_secs", &self.ttl_secs)?;
        st.end()
    }
}

/// What the remote tier did, in blocks, bytes and nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RemoteTierStats {
    /// Levels looked up (blocks the pool, host memory and files could not serve).
    pub lookups: u64,
    /// Levels found and verified, now in host memory for a restore.
    pub hits: u64,
    /// Levels the store did not have.
    pub misses: u64,
    /// Values found but refused: corrupt, truncated, another model's, another prefix's.
    pub rejected: u64,
    /// Commands that failed (connection refused, timeout, out of memory): each a miss or a
    /// skipped write.
    pub errors: u64,
    /// Blocks never sent to Redis because the writer thread was behind (its queue full).
    pub writes_dropped: u64,
    /// Payload bytes fetched and verified.
    pub bytes_read: u64,
    /// Blocks written (first writer of their content).
    pub blocks_written: u64,
    /// Payload bytes sent in writes.
    pub bytes_written: u64,
    /// Nanoseconds spent in lookups (round trips and verification).
    pub fetch_ns: u64,
}

/// One block to write: its group, level, prefix digest and tokens (its bytes come with it).
#[derive(Debug, Clone)]
pub(crate) struct Publish {
    pub(crate) group: usize,
    pub(crate) level: usize,
    pub(crate) digest: [u8; 32],
    pub(crate) tokens: Box<[u32]>,
}

/// A connection to the store for lookups, a writer thread for writes, the namespace, and what
/// they did.
pub struct RemoteTier {
    config: RemoteTierConfig,
    conn: Conn,
    writer: Writer,
    ns: [u8; 32],
    ns_hex: String,
    /// (num_groups,) bytes of one block of each group in the engine's pool, once known: a value
    /// of any other length is refused, and longer ones are never read whole.
    block_bytes: Vec<Option<usize>>,
    /// Digests written by this process (or found there), so each is written once.
    written: HashSet<[u8; 32]>,
    /// The first missing level of lookups that found nothing, and when: a prompt waiting to be
    /// admitted is not looked up again every step for [`MISS_MEMORY`].
    recent_misses: HashMap<(usize, [u8; 32]), Instant>,
    stats: RemoteTierStats,
}

impl fmt::Debug for RemoteTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteTier")
            .field("config", &self.config)
            .field("up", &self.conn.up())
            .field("stats", &self.stats())
            .finish()
    }
}

impl RemoteTier {
    /// The tier for `num_groups` KV cache groups. Connects lazily: a store that is down now is
    /// a warning and misses, not an error.
    ///
    /// # Errors
    /// [`PagedError::InvalidConfig`] for a URL Redis cannot parse, or an empty namespace.
    pub fn new(config: &RemoteTierConfig, num_groups: usize) -> Result<Self> {
        use redis::IntoConnectionInfo;
        let bad = |e: redis::RedisError| {
            PagedError::InvalidConfig(format!(
                "--remote-tier {}: {e}; expected redis://[USER[:PASSWORD]@]HOST:PORT[/DB]",
                config.redacted_url()
            ))
        };
        let mut info = config.url.as_str().into_connection_info().map_err(bad)?;
        if let Some(p) = &config.password
            && info.redis_settings().password().is_none()
        {
            let settings = info.redis_settings().clone().set_password(p);
            info = info.set_redis_settings(settings);
        }
        let client = redis::Client::open(info).map_err(bad)?;
        if config.namespace.is_empty() {
            return Err(PagedError::InvalidConfig(
                "the remote tier needs a namespace naming the model and the KV layout".into(),
            ));
        }
        let ns: [u8; 32] = Sha256::digest(config.namespace.as_bytes()).into();
        let errors = Arc::new(AtomicU64::new(0));
        let shown = config.redacted_url();
        let writer_conn = Conn::new(client.clone(), shown.clone(), errors.clone());
        Ok(Self {
            config: config.clone(),
            conn: Conn::new(client, shown, errors),
            writer: Writer::start(writer_conn, config.ttl_secs),
            ns_hex: hex(&ns[..8]),
            ns,
            block_bytes: vec![None; num_groups],
            written: HashSet::new(),
            recent_misses: HashMap::new(),
            stats: RemoteTierStats::default(),
        })
    }

    /// What it did so far (writes as far as the writer thread has sent them).
    pub fn stats(&self) -> RemoteTierStats {
        let w = &self.writer.counts;
        RemoteTierStats {
            errors: self.conn.errors.load(Ordering::Relaxed),
            blocks_written: w.blocks.load(Ordering::Relaxed),
            bytes_written: w.bytes.load(Ordering::Relaxed),
            writes_dropped: w.dropped.load(Ordering::Relaxed),
            ..self.stats
        }
    }

    /// The configuration, password included (print [`RemoteTierConfig::redacted_url`]).
    pub fn config(&self) -> &RemoteTierConfig {
        &self.config
    }

    /// Whether every group's block size in bytes is known (lookups wait for it).
    pub(crate) fn knows_block_bytes(&self) -> bool {
        self.block_bytes.iter().all(Option::is_some)
    }

    /// Records that one block of `group` is `bytes` bytes in the engine's pool.
    pub(crate) fn set_block_bytes(&mut self, group: usize, bytes: usize) {
        if let Some(b) = self.block_bytes.get_mut(group) {
            *b = Some(bytes);
        }
    }

    /// The prefix digests `d(0..levels)` of group `group` for the prompt `tokens` of a request
    /// salted `salt`, in blocks of `block_size` tokens (each level's key is its tokens, the salt
    /// mixed into level 0's as the prefix cache mixes it).
    pub(crate) fn digests(
        &self,
        group: usize,
        (tokens, salt): (&[u32], u64),
        block_size: usize,
        levels: usize,
    ) -> Vec<[u8; 32]> {
        let mut d: [u8; 32] = Sha256::new()
            .chain_update(b"kvlab remote tier v1")
            .chain_update(self.ns)
            .chain_update((group as u32).to_le_bytes())
            .finalize()
            .into();
        let blocks = tokens.chunks_exact(block_size).take(levels).enumerate();
        blocks
            .map(|(level, block)| {
                let key = salted(block, salt, level);
                let mut h = Sha256::new().chain_update(d);
                for t in key.iter() {
                    h.update(t.to_le_bytes());
                }
                d = h.finalize().into();
                d
            })
            .collect()
    }

    /// What the value of `group`'s level `level` (prefix digest `digest`, tokens `tokens`) must
    /// say about itself.
    fn header<'a>(
        &'a self,
        group: usize,
        level: usize,
        digest: &'a [u8; 32],
        tokens: &'a [u32],
    ) -> Header<'a> {
        Header {
            ns: &self.ns,
            group,
            level,
            digest,
            tokens,
        }
    }

    fn key(&self, group: usize, digest: &[u8; 32]) -> String {
        format!("kvlab:{}:g{group}:{}", self.ns_hex, hex(digest))
    }

    /// Fetches the levels `wanted` of group `group` (level, digest, the level's raw tokens), in
    /// order, stopping at the first that is missing or refused: their verified payloads. Each
    /// value is read only up to the length a valid one has (`GETRANGE`), so a planted huge value
    /// costs no memory; a level that was missing less than [`MISS_MEMORY`] ago is not asked
    /// for again.
    pub(crate) fn fetch(
        &mut self,
        group: usize,
        wanted: &[(usize, [u8; 32], &[u32])],
    ) -> Vec<Box<[u8]>> {
        let Some(Some(block_bytes)) = self.block_bytes.get(group).copied() else {
            return Vec::new();
        };
        let Some(&(_, first, _)) = wanted.first() else {
            return Vec::new();
        };
        let now = Instant::now();
        if self.recent_misses.len() > MAX_REMEMBERED_MISSES {
            self.recent_misses
                .retain(|_, at| now.duration_since(*at) < MISS_MEMORY);
        }
        if let Some(at) = self.recent_misses.get(&(group, first))
            && now.duration_since(*at) < MISS_MEMORY
        {
            return Vec::new();
        }
        let mut pipe = redis::pipe();
        for &(level, digest, tokens) in wanted {
            let whole = self.header(group, level, &digest, tokens).len() + block_bytes + 4;
            pipe.cmd("GETRANGE")
                .arg(self.key(group, &digest))
                .arg(0)
                .arg(whole - 1);
        }
        let Some(conn) = self.conn.get() else {
            return Vec::new();
        };
        let values: redis::RedisResult<Vec<Vec<u8>>> = pipe.query(conn);
        let values = match values {
            Ok(v) => v,
            Err(e) => {
                self.conn.failed(&e);
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        let mut bad = Vec::new();
        for ((level, digest, tokens), value) in wanted.iter().zip(values) {
            self.stats.lookups += 1;
            // GETRANGE answers an empty string for a missing key.
            if value.is_empty() {
                self.stats.misses += 1;
                if out.is_empty() {
                    self.recent_misses.insert((group, *digest), now);
                }
                break;
            }
            let opened = (self.header(group, *level, digest, tokens))
                .open(&value, block_bytes)
                .map(Box::<[u8]>::from);
            match opened {
                Some(payload) => {
                    self.stats.hits += 1;
                    self.stats.bytes_read += payload.len() as u64;
                    self.written.insert(*digest);
                    out.push(payload);
                }
                None => {
                    self.stats.rejected += 1;
                    bad.push(self.key(group, digest));
                    break;
                }
            }
        }
        if !bad.is_empty() {
            // A refused value is deleted, so that the next writer of the content replaces it.
            let deleted: redis::RedisResult<()> = match self.conn.get() {
                Some(conn) => redis::cmd("DEL").arg(&bad).query(conn),
                None => Ok(()),
            };
            if let Err(e) = deleted {
                self.conn.failed(&e);
            }
        }
        self.stats.fetch_ns += now.elapsed().as_nanos() as u64;
        out
    }

    /// Whether `digest` still needs writing (it was neither written nor found by this process).
    pub(crate) fn needs_write(&self, digest: &[u8; 32]) -> bool {
        !self.written.contains(digest)
    }

    /// Hands one step's new blocks to the writer thread, each sealed and written once
    /// (`SET … NX`, with the configured time to live); never waits for Redis.
    pub(crate) fn publish(&mut self, blocks: Vec<(Publish, Vec<u8>)>) {
        if self.written.len() > MAX_REMEMBERED {
            self.written.clear();
        }
        let mut batch = Vec::new();
        for (p, payload) in blocks {
            if !self.needs_write(&p.digest) {
                continue;
            }
            self.set_block_bytes(p.group, payload.len());
            let value = self
                .header(p.group, p.level, &p.digest, &p.tokens)
                .seal(&payload);
            batch.push(Write {
                key: self.key(p.group, &p.digest),
                value,
                payload: payload.len(),
            });
            self.written.insert(p.digest);
        }
        if !batch.is_empty() {
            self.writer.send(batch);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_name_the_whole_prefix_the_group_and_the_namespace() {
        let config = |ns: &str| RemoteTierConfig {
            url: "redis://127.0.0.1:1".into(),
            password: None,
            namespace: ns.into(),
            ttl_secs: None,
        };
        let t = RemoteTier::new(&config("model a"), 2).unwrap();
        let u = RemoteTier::new(&config("model b"), 2).unwrap();
        // Two levels of blocks of 2 tokens.
        let levels = |tier: &RemoteTier, group: usize, tokens: &[u32]| {
            tier.digests(group, (tokens, 0), 2, 2)
        };
        let d = levels(&t, 0, &[1, 2, 3, 4]);
        assert_eq!(d, levels(&t, 0, &[1, 2, 3, 4]), "deterministic");
        assert_ne!(d[1], levels(&t, 0, &[1, 9, 3, 4])[1], "an earlier level");
        assert_ne!(d[0], levels(&t, 1, &[1, 2, 3, 4])[0], "another group");
        assert_ne!(d[0], levels(&u, 0, &[1, 2, 3, 4])[0], "another model");
        assert_ne!(
            d[0],
            t.digests(0, (&[1, 2, 3, 4], 7), 2, 2)[0],
            "another salt"
        );
        assert_eq!(
            t.key(0, &d[0]).len(),
            "kvlab:".len() + 16 + ":g0:".len() + 64
        );
    }

    #[test]
    fn urls_are_checked_and_passwords_never_printed() {
        let c = RemoteTierConfig {
            url: "redis://kv:s3cret@10.0.0.1:6379/2".into(),
            password: Some("other".into()),
            namespace: "m".into(),
            ttl_secs: None,
        };
        assert_eq!(c.redacted_url(), "redis://kv:***@10.0.0.1:6379/2");
        assert!(!format!("{c:?}").contains("s3cret") && !format!("{c:?}").contains("other"));
        let bad = RemoteTierConfig {
            url: "http://x".into(),
            ..c
        };
        let e = RemoteTier::new(&bad, 1).unwrap_err().to_string();
        assert!(e.contains("redis://"), "{e}");
    }

    #[test]
    fn a_store_that_is_down_is_a_miss_and_an_error_not_a_failure() {
        // Port 1 on loopback: nothing listens there.
        let c = RemoteTierConfig {
            url: "redis://127.0.0.1:1".into(),
            password: None,
            namespace: "m".into(),
            ttl_secs: None,
        };
        let mut t = RemoteTier::new(&c, 1).unwrap();
        t.set_block_bytes(0, 8);
        let d = t.digests(0, (&[1, 2], 0), 2, 1);
        assert!(t.fetch(0, &[(0, d[0], &[1, 2])]).is_empty());
        assert_eq!(t.stats().errors, 1);
        // Off for a while: no second attempt, no second error.
        assert!(t.fetch(0, &[(0, d[0], &[1, 2])]).is_empty());
        assert_eq!(t.stats().errors, 1);
    }
}
