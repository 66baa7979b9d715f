//! `--remote-tier`: several `kvlab serve` processes share one prefix cache through a real Redis
//! (Debian's `redis-server`), and nothing Redis does — holding another process's blocks,
//! corrupt, truncated, misplaced or foreign ones, or going away — changes a token or fails a
//! request.
//!
//! Without `redis-server` on PATH these tests say so and pass; with `KVLAB_REQUIRE_MODELS=1`
//! (CI, whose `.ci/run` installs it) they fail instead.

// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

mod common;

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Server, free_port};

/// A `redis-server` of its own on a free loopback port, without persistence, killed on drop.
struct Redis {
    child: Child,
    port: u16,
}

impl Redis {
    /// Starts one; `None` (after saying so) when `redis-server` is not installed, unless
    /// `KVLAB_REQUIRE_MODELS=1`, which makes that a failure.
    fn start() -> Option<Redis> {
        Self::start_with(&[])
    }

    /// [`Self::start`] with more `redis-server` flags.
    fn start_with(flags: &[&str]) -> Option<Redis> {
        let port = free_port();
        let spawned = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(flags)
            .stdout(Stdio::null())
            .spawn();
        let child = match spawned {
            Ok(c) => c,
            Err(e) => {
                let msg = format!(
                    "redis-server cannot be started ({e}); install it (apt-get install redis-server) to run the remote-tier tests"
                );
                assert!(
                    std::env::var("KVLAB_REQUIRE_MODELS").as_deref() != Ok("1"),
                    "{msg} (KVLAB_REQUIRE_MODELS=1)"
                );
                eprintln!("SKIPPED: {msg}");
                return None;
            }
        };
        let redis = Redis { child, port };
        let t = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "redis-server did not listen"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(redis)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// The keys the remote tier wrote, sorted.
    fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg("kvlab:*")
            .query(&mut self.connection())
            .unwrap();
        keys.sort();
        keys
    }

    /// The keys once the writers are done: polled until they stop changing (writes go to Redis
    /// from each server's writer thread, after the request that computed them has answered).
    fn settled_keys(&self) -> Vec<String> {
        let t = Instant::now();
        let mut last = self.keys();
        loop {
            std::thread::sleep(Duration::from_millis(100));
            let now = self.keys();
            if (now == last && !now.is_empty()) || t.elapsed() > Duration::from_secs(10) {
                return now;
            }
            last = now;
        }
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}

const REMOTE_HITS: &str = "kvlab:prefix_cache_hits_by_tier_total{tier=\"remote\"";
const REJECTED: &str = "kvlab:kv_tier_lookups_total{result=\"rejected\",tier=\"remote\"";
const ERRORS: &str = "kvlab:kv_tier_errors_total{tier=\"remote\"";

/// Where the tiny Gemma 3 checkpoint lives (sliding-window layers of 16 and a global one).
fn tiny_gemma3() -> String {
    let p =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/tiny-gemma3");
    p.display().to_string()
}

const PROMPT: &str = "Once upon a time there was a little girl named Lily. She loved to play outside in the park with her friends and her dog, who was called Max.";

/// A prompt served by instance A and then by instance B: B fetches A's blocks from Redis
/// instead of computing them, says so in its usage and metrics, and gives the tokens of a
/// server without the remote tier. On a model of full-attention layers (stories260K) and on
/// one with sliding-window layers (tiny Gemma 3, whose window groups fetch only the blocks the
/// window needs).
#[test]
fn a_prompt_served_by_one_instance_is_restored_by_another_with_the_same_tokens() {
    let Some(redis) = Redis::start() else { return };
    let url = redis.url();
    for model in ["stories260K".to_string(), tiny_gemma3()] {
        let remote = ["--remote-tier", url.as_str()];
        let (a, b, solo) = (
            Server::start(&model, &remote),
            Server::start(&model, &remote),
            Server::start(&model, &[]),
        );
        let (want, _) = solo.complete(PROMPT);
        let (text_a, cached_a) = a.complete(PROMPT);
        assert_eq!(text_a, want, "{model}: A");
        assert_eq!(cached_a, 0, "{model}: A computes everything");
        assert!(
            !redis.settled_keys().is_empty(),
            "{model}: A wrote its blocks"
        );
        let (text_b, cached_b) = b.complete(PROMPT);
        assert_eq!(text_b, want, "{model}: B, restored from A's blocks");
        assert!(
            cached_b >= 16,
            "{model}: B's usage counts the restored tokens"
        );
        let hits = b.metric(REMOTE_HITS);
        assert_eq!(
            hits, cached_b as f64,
            "{model}: every cached token came from Redis"
        );
        assert_eq!(a.metric(REMOTE_HITS), 0.0, "{model}");
    }
}

/// Redis holding corrupt, truncated and misplaced values is recomputed around (the values are
/// refused and counted, the tokens are a solo run's); an instance of another KV layout finds
/// nothing; and with Redis gone every request still succeeds with the same tokens, the failures
/// counted.
#[test]
fn a_poisoned_or_missing_redis_changes_no_token_and_fails_no_request() {
    let Some(mut redis) = Redis::start() else {
        return;
    };
    let url = redis.url();
    let remote = ["--remote-tier", url.as_str()];
    let solo = Server::start("stories260K", &[]);
    let (want, _) = solo.complete(PROMPT);
    let writer = Server::start("stories260K", &remote);
    assert_eq!(writer.complete(PROMPT).0, want);
    let keys = redis.settled_keys();
    assert!(keys.len() >= 3, "{keys:?}");
    let mut conn = redis.connection();
    let get = |conn: &mut redis::Connection, k: &str| -> Vec<u8> {
        redis::cmd("GET").arg(k).query(conn).unwrap()
    };
    let set = |conn: &mut redis::Connection, k: &str, v: &[u8]| {
        redis::cmd("SET").arg(k).arg(v).query::<()>(conn).unwrap();
    };
    let first = get(&mut conn, &keys[0]);
    for (i, key) in keys.iter().enumerate() {
        let mut v = get(&mut conn, key);
        match i % 3 {
            // A flipped bit in the KV payload.
            0 => {
                let mid = v.len() / 2;
                v[mid] ^= 0x04;
            }
            // Truncated.
            1 => v.truncate(v.len() - 7),
            // Another block's value under this key (well formed, checksum right).
            _ => v = first.clone(),
        }
        set(&mut conn, key, &v);
    }
    let reader = Server::start("stories260K", &remote);
    assert_eq!(reader.complete(PROMPT).0, want, "poisoned Redis");
    assert!(
        reader.metric(REJECTED) >= 1.0,
        "the poisoned values were refused"
    );
    assert_eq!(reader.metric(REMOTE_HITS), 0.0);
    // Another weight format is another namespace: nothing to find, nothing refused.
    let other = Server::start("stories260K", &["--remote-tier", &url, "--weights", "f16"]);
    other.complete(PROMPT);
    assert_eq!(other.metric(REMOTE_HITS) + other.metric(REJECTED), 0.0);
    redis.stop();
    let prompt = "The cat sat on the mat and looked at the moon. It was big and round and bright.";
    let (want, _) = solo.complete(prompt);
    assert_eq!(reader.complete(prompt).0, want, "Redis gone");
    assert!(reader.metric(ERRORS) >= 1.0, "the failures are counted");
}

/// A salted request (vLLM's `cache_salt`) shares blocks across instances only with requests
/// of the same salt: the salt is part of every block's name in Redis too.
#[test]
fn across_instances_blocks_are_shared_only_under_the_same_cache_salt() {
    let Some(redis) = Redis::start() else { return };
    let url = redis.url();
    let remote = ["--remote-tier", url.as_str()];
    let (a, b) = (
        Server::start("stories260K", &remote),
        Server::start("stories260K", &remote),
    );
    let (want, _) = a.complete_salted(PROMPT, "tenant-a");
    redis.settled_keys();
    let (text, cached) = b.complete_salted(PROMPT, "tenant-b");
    assert_eq!((text.as_str(), cached), (want.as_str(), 0), "another salt");
    assert_eq!(b.complete(PROMPT).1, 0, "no salt");
    let (text, cached) = b.complete_salted(PROMPT, "tenant-a");
    assert_eq!(text, want);
    assert!(cached >= 16, "the same salt restores A's blocks");
    assert_eq!(b.metric(REMOTE_HITS), cached as f64);
}

/// A Redis that is full (`maxmemory` reached under `noeviction`) refuses every write: each is
/// counted, no request fails, and the tokens are a solo run's.
#[test]
fn a_full_redis_refuses_writes_and_fails_no_request() {
    // An empty Redis 7 takes about 0.9 MB: 512 kB is full before anything is written.
    let flags = ["--maxmemory", "512kb", "--maxmemory-policy", "noeviction"];
    let Some(redis) = Redis::start_with(&flags) else {
        return;
    };
    let url = redis.url();
    let (solo, full) = (
        Server::start("stories260K", &[]),
        Server::start("stories260K", &["--remote-tier", &url]),
    );
    for prompt in [PROMPT, "The cat sat on the mat and looked at the moon."] {
        assert_eq!(full.complete(prompt).0, solo.complete(prompt).0);
    }
    // The writes fail on the writer thread, after the requests answered.
    let t = Instant::now();
    while full.metric(ERRORS) < 1.0 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(full.metric(ERRORS) >= 1.0, "the refused writes are counted");
    assert!(redis.keys().is_empty(), "nothing was written");
}

/// `kvlab evict --remote-tier`: a run per pool and policy with Redis below a small host tier,
/// each under a namespace of its own, restoring what the pool evicted with the same tokens as
/// every other run (evict fails otherwise) — many admissions of one step fetching into a full
/// host memory.
#[test]
fn evict_with_a_remote_tier_restores_evicted_blocks_with_the_same_tokens() {
    let Some(redis) = Redis::start() else { return };
    let out = Command::new(env!("CARGO_BIN_EXE_kvlab"))
        .args(["evict", "--num-blocks", "40", "--eviction", "lru"])
        .args([
            "--host-tier-blocks",
            "8",
            "--remote-tier",
            &redis.url(),
            "--json",
        ])
        .env_remove("KVLAB_REMOTE_TIER")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(
        rows.len(),
        3,
        "no tiers, the host tier, the host tier and Redis"
    );
    let (host, remote) = (&rows[1], &rows[2]);
    assert_eq!(remote["remote_tier"], true);
    assert!(remote["remote_restores"].as_u64().unwrap() > 0, "{remote}");
    let rate = |r: &serde_json::Value| r["prefix_hit_rate"].as_f64().unwrap();
    assert!(rate(remote) > rate(host), "{host} {remote}");
}
