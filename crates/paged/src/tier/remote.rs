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
//! **Redis down, slow or full never fails a request**: every command runs with short timeouts;
//! a failed connection is counted, logged once per outage, and the tier stays off for
//! [`RETRY_AFTER`] before the next try: lookups then miss (the prefix is recomputed) and writes
//! are skipped. An error reply (Redis out of memory under `noeviction`) is counted and logged
//! once, and what failed is skipped.
//!
//! Writes are **write-through**: each full block a request computes is stored once, when the
//! step after it starts (before anything can overwrite it), with `SET … NX` so that the first
//! writer of a content wins and later ones cost one round trip. A fetched block enters host
//! memory ([`super::KvTierStore`]) as if it had been spilled there, and is restored into the
//! pool the same way.

use std::collections::HashSet;
use std::fmt;
use std::time::{Duration, Instant};

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::{PagedError, Result};

const MAGIC: &[u8; 8] = b"KVLABRT1";
/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(250);
/// How long one command may wait for its reply or to send.
const IO_TIMEOUT: Duration = Duration::from_millis(500);
/// How long the tier stays off after a failure before it tries the store again.
pub const RETRY_AFTER: Duration = Duration::from_secs(2);
/// Contents remembered as already written, before the memory is cleared (a write after that
/// costs one `SET … NX` round trip, nothing else).
const MAX_REMEMBERED: usize = 1 << 20;

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
    /// Payload bytes fetched and verified.
    pub bytes_read: u64,
    /// Blocks written (first writer of their content).
    pub blocks_written: u64,
    /// Payload bytes sent in writes.
    pub bytes_written: u64,
    /// Nanoseconds spent in lookups (round trips and verification).
    pub fetch_ns: u64,
}

/// One block to write: its group, level, prefix digest, tokens and bytes.
#[derive(Debug, Clone)]
pub(crate) struct Publish {
    pub(crate) group: usize,
    pub(crate) level: usize,
    pub(crate) digest: [u8; 32],
    pub(crate) tokens: Box<[u32]>,
}

/// A connection to the store, the namespace, and what it did.
pub struct RemoteTier {
    config: RemoteTierConfig,
    client: redis::Client,
    conn: Option<redis::Connection>,
    /// When the tier may try the store again after a failure (`None`: it is up).
    down_until: Option<Instant>,
    ns: [u8; 32],
    ns_hex: String,
    /// (num_groups,) bytes of one block of each group in the engine's pool, once known: a value
    /// of any other length is refused.
    block_bytes: Vec<Option<usize>>,
    /// Digests written by this process (or found there), so each is written once.
    written: HashSet<[u8; 32]>,
    /// Whether an error reply (not a connection failure) was logged already.
    warned_reply: bool,
    stats: RemoteTierStats,
}

impl fmt::Debug for RemoteTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteTier")
            .field("config", &self.config)
            .field("up", &self.down_until.is_none())
            .field("stats", &self.stats)
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
        Ok(Self {
            config: config.clone(),
            client,
            conn: None,
            down_until: None,
            ns_hex: hex(&ns[..8]),
            ns,
            block_bytes: vec![None; num_groups],
            written: HashSet::new(),
            warned_reply: false,
            stats: RemoteTierStats::default(),
        })
    }

    /// What it did so far.
    pub fn stats(&self) -> RemoteTierStats {
        self.stats
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

    /// The prefix digests `d(0..n)` of group `group` for a prompt whose level keys (tokens,
    /// the salt mixed into level 0) are `levels`.
    pub(crate) fn digests<'a>(
        &self,
        group: usize,
        levels: impl IntoIterator<Item = std::borrow::Cow<'a, [u32]>>,
    ) -> Vec<[u8; 32]> {
        let mut d: [u8; 32] = Sha256::new()
            .chain_update(b"kvlab remote tier v1")
            .chain_update(self.ns)
            .chain_update((group as u32).to_le_bytes())
            .finalize()
            .into();
        levels
            .into_iter()
            .map(|key| {
                let mut h = Sha256::new().chain_update(d);
                for t in key.iter() {
                    h.update(t.to_le_bytes());
                }
                d = h.finalize().into();
                d
            })
            .collect()
    }

    fn key(&self, group: usize, digest: &[u8; 32]) -> String {
        format!("kvlab:{}:g{group}:{}", self.ns_hex, hex(digest))
    }

    /// Whether the store may be tried now; connects if needed.
    fn connection(&mut self) -> Option<&mut redis::Connection> {
        if let Some(t) = self.down_until {
            if Instant::now() < t {
                return None;
            }
            self.down_until = None;
        }
        if self.conn.is_none() {
            let conn = self
                .client
                .get_connection_with_timeout(CONNECT_TIMEOUT)
                .and_then(|c| {
                    c.set_read_timeout(Some(IO_TIMEOUT))?;
                    c.set_write_timeout(Some(IO_TIMEOUT))?;
                    Ok(c)
                });
            match conn {
                Ok(c) => self.conn = Some(c),
                Err(e) => {
                    self.failed(&e);
                    return None;
                }
            }
        }
        self.conn.as_mut()
    }

    /// A command failed: counted and logged. A connection that failed (refused, timed out,
    /// dropped) turns the tier off for [`RETRY_AFTER`], logged once per outage; an error reply
    /// (Redis full under `noeviction`, a command refused by an ACL) is logged once and the
    /// connection kept, so that lookups go on while writes fail.
    fn failed(&mut self, e: &redis::RedisError) {
        self.stats.errors += 1;
        let connection = e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal();
        if !connection {
            if !self.warned_reply {
                self.warned_reply = true;
                tracing::warn!(
                    "remote KV tier {}: {e}; carrying on without what failed (counted in kvlab:kv_tier_errors_total)",
                    self.config.redacted_url()
                );
            }
            return;
        }
        self.conn = None;
        if self.down_until.is_none() {
            tracing::warn!(
                "remote KV tier {}: {e}; recomputing instead of restoring, retrying in {:?}",
                self.config.redacted_url(),
                RETRY_AFTER
            );
        }
        self.down_until = Some(Instant::now() + RETRY_AFTER);
    }

    /// Fetches the levels `wanted` of group `group` (level, digest, the level's raw tokens), in
    /// order, stopping at the first that is missing or refused: their verified payloads.
    pub(crate) fn fetch(
        &mut self,
        group: usize,
        wanted: &[(usize, [u8; 32], &[u32])],
    ) -> Vec<Box<[u8]>> {
        let Some(Some(block_bytes)) = self.block_bytes.get(group).copied() else {
            return Vec::new();
        };
        if wanted.is_empty() {
            return Vec::new();
        }
        let t = Instant::now();
        let keys: Vec<String> = wanted.iter().map(|(_, d, _)| self.key(group, d)).collect();
        let Some(conn) = self.connection() else {
            return Vec::new();
        };
        let values: redis::RedisResult<Vec<Option<Vec<u8>>>> =
            redis::cmd("MGET").arg(&keys).query(conn);
        let values = match values {
            Ok(v) => v,
            Err(e) => {
                self.failed(&e);
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        let mut bad = Vec::new();
        for ((level, digest, tokens), value) in wanted.iter().zip(values) {
            self.stats.lookups += 1;
            let Some(value) = value else {
                self.stats.misses += 1;
                break;
            };
            let head = Header {
                ns: &self.ns,
                group,
                level: *level,
                digest,
                tokens,
            };
            match head.open(&value, block_bytes) {
                Some(payload) => {
                    self.stats.hits += 1;
                    self.stats.bytes_read += payload.len() as u64;
                    self.written.insert(*digest);
                    out.push(payload.into());
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
            let deleted: redis::RedisResult<()> = match self.connection() {
                Some(conn) => redis::cmd("DEL").arg(&bad).query(conn),
                None => Ok(()),
            };
            if let Err(e) = deleted {
                self.failed(&e);
            }
        }
        self.stats.fetch_ns += t.elapsed().as_nanos() as u64;
        out
    }

    /// Whether `digest` still needs writing (it was neither written nor found by this process).
    pub(crate) fn needs_write(&self, digest: &[u8; 32]) -> bool {
        !self.written.contains(digest)
    }

    /// Writes each block once (`SET … NX`, with the configured time to live), in one pipeline.
    /// A block whose bytes are `None` (the engine cannot read blocks) is skipped.
    pub(crate) fn publish(&mut self, blocks: Vec<(Publish, Vec<u8>)>) {
        if blocks.is_empty() {
            return;
        }
        if self.written.len() > MAX_REMEMBERED {
            self.written.clear();
        }
        let mut pipe = redis::pipe();
        let mut sizes = Vec::new();
        for (p, payload) in &blocks {
            if !self.needs_write(&p.digest) {
                continue;
            }
            self.set_block_bytes(p.group, payload.len());
            let head = Header {
                ns: &self.ns,
                group: p.group,
                level: p.level,
                digest: &p.digest,
                tokens: &p.tokens,
            };
            let value = head.seal(payload);
            let mut cmd = redis::cmd("SET");
            cmd.arg(self.key(p.group, &p.digest)).arg(value).arg("NX");
            if let Some(ttl) = self.config.ttl_secs {
                cmd.arg("EX").arg(ttl);
            }
            pipe.add_command(cmd);
            sizes.push((p.digest, payload.len()));
        }
        if sizes.is_empty() {
            return;
        }
        let Some(conn) = self.connection() else {
            return;
        };
        let replies: redis::RedisResult<Vec<Option<String>>> = pipe.query(conn);
        match replies {
            Ok(replies) => {
                for ((digest, n), reply) in sizes.into_iter().zip(replies) {
                    self.written.insert(digest);
                    if reply.is_some() {
                        self.stats.blocks_written += 1;
                        self.stats.bytes_written += n as u64;
                    }
                }
            }
            Err(e) => self.failed(&e),
        }
    }
}

/// What a value must say about itself: the namespace, group, level, prefix digest and tokens
/// of the block asked for.
struct Header<'a> {
    ns: &'a [u8; 32],
    group: usize,
    level: usize,
    digest: &'a [u8; 32],
    tokens: &'a [u32],
}

impl Header<'_> {
    /// Bytes before the payload.
    fn len(&self) -> usize {
        8 + 32 + 4 + 4 + 32 + 4 + 4 * self.tokens.len() + 8
    }

    fn write(&self, out: &mut Vec<u8>, payload_len: usize) {
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(self.ns);
        out.extend_from_slice(&(self.group as u32).to_le_bytes());
        out.extend_from_slice(&(self.level as u32).to_le_bytes());
        out.extend_from_slice(self.digest);
        out.extend_from_slice(&(self.tokens.len() as u32).to_le_bytes());
        for t in self.tokens {
            out.extend_from_slice(&t.to_le_bytes());
        }
        out.extend_from_slice(&(payload_len as u64).to_le_bytes());
    }

    /// The value stored for `payload`.
    fn seal(&self, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len() + payload.len() + 4);
        self.write(&mut v, payload.len());
        v.extend_from_slice(payload);
        let crc = crc32fast::hash(&v);
        v.extend_from_slice(&crc.to_le_bytes());
        v
    }

    /// The payload of `value` if it is exactly what [`Self::seal`] writes for this header and a
    /// payload of `payload_len` bytes; `None` for anything else.
    fn open<'v>(&self, value: &'v [u8], payload_len: usize) -> Option<&'v [u8]> {
        let head = self.len();
        if value.len() != head + payload_len + 4 {
            return None;
        }
        let (body, crc) = value.split_at(head + payload_len);
        if u32::from_le_bytes(crc.try_into().ok()?) != crc32fast::hash(body) {
            return None;
        }
        let mut expected = Vec::with_capacity(head);
        self.write(&mut expected, payload_len);
        (body[..head] == expected[..]).then(|| &body[head..])
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header<'a>(ns: &'a [u8; 32], digest: &'a [u8; 32], tokens: &'a [u32]) -> Header<'a> {
        Header {
            ns,
            group: 1,
            level: 3,
            digest,
            tokens,
        }
    }

    #[test]
    fn a_value_opens_only_for_the_block_it_was_sealed_for() {
        let (ns, digest, tokens) = ([7u8; 32], [9u8; 32], [1u32, 2, 3, 4]);
        let payload: Vec<u8> = (0..64).collect();
        let h = header(&ns, &digest, &tokens);
        let value = h.seal(&payload);
        assert_eq!(h.open(&value, 64), Some(&payload[..]));
        assert_eq!(h.open(&value, 63), None, "another block size");
        assert_eq!(h.open(&value[..value.len() - 1], 64), None, "truncated");
        for i in [0, 9, 45, 60, value.len() - 10, value.len() - 1] {
            let mut bad = value.clone();
            bad[i] ^= 0x10;
            assert_eq!(h.open(&bad, 64), None, "byte {i} flipped");
        }
        let other_ns = [8u8; 32];
        assert_eq!(header(&other_ns, &digest, &tokens).open(&value, 64), None);
        let other_prefix = [10u8; 32];
        assert_eq!(header(&ns, &other_prefix, &tokens).open(&value, 64), None);
        assert_eq!(header(&ns, &digest, &[1, 2, 3, 5]).open(&value, 64), None);
        let mut other_level = header(&ns, &digest, &tokens);
        other_level.level = 4;
        assert_eq!(other_level.open(&value, 64), None);
    }

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
        let levels = |a: &[u32], b: &[u32]| -> Vec<std::borrow::Cow<'static, [u32]>> {
            vec![a.to_vec().into(), b.to_vec().into()]
        };
        let d = t.digests(0, levels(&[1, 2], &[3, 4]));
        assert_eq!(d, t.digests(0, levels(&[1, 2], &[3, 4])), "deterministic");
        assert_ne!(
            d[1],
            t.digests(0, levels(&[1, 9], &[3, 4]))[1],
            "an earlier level"
        );
        assert_ne!(
            d[0],
            t.digests(1, levels(&[1, 2], &[3, 4]))[0],
            "another group"
        );
        assert_ne!(
            d[0],
            u.digests(0, levels(&[1, 2], &[3, 4]))[0],
            "another model"
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
        let d = t.digests(0, [std::borrow::Cow::Owned(vec![1u32, 2])]);
        assert!(t.fetch(0, &[(0, d[0], &[1, 2])]).is_empty());
        assert_eq!(t.stats().errors, 1);
        // Off for a while: no second attempt, no second error.
        assert!(t.fetch(0, &[(0, d[0], &[1, 2])]).is_empty());
        assert_eq!(t.stats().errors, 1);
    }
}
