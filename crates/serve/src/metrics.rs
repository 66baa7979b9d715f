//! `GET /metrics`: the server's Prometheus registry (the `prometheus` crate), with vLLM's metric
//! names where vLLM has one (`vllm:`, from vLLM's `vllm/v1/metrics/loggers.py`) and `kvlab:` for
//! kvlab's own. Every metric carries the label `model_name`, as vLLM's do.
//!
//! The engine thread writes it: the scheduler's gauges and counters after every step
//! ([`ServerMetrics::observe_scheduler`]), and each request's latencies as its tokens come out
//! ([`ServerMetrics::first_token`], [`ServerMetrics::next_token`], [`ServerMetrics::finished`]).
//! Handlers only read it ([`ServerMetrics::render`]).

use std::collections::HashMap;
use std::time::Duration;

use kvlab_paged::{FinishReason, Scheduler};
use prometheus::{
    CounterVec, Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Buckets of the time to first token, in seconds: vLLM's, with finer ones below 1 ms added
/// because stories260K answers in well under a millisecond.
const TTFT_BUCKETS_S: &[f64] = &[
    0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
/// Buckets of the time between two output tokens of one request, in seconds (vLLM's, with finer
/// ones below 10 ms).
const TPOT_BUCKETS_S: &[f64] = &[
    0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
    0.75, 1.0, 2.5,
];
/// Buckets of a request's whole latency, arrival to last token, in seconds.
const E2E_BUCKETS_S: &[f64] = &[
    0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0,
];

/// The registry and a handle to each metric in it.
pub struct ServerMetrics {
    registry: Registry,
    running: IntGauge,
    waiting: IntGauge,
    pending: IntGauge,
    usage: Gauge,
    blocks_free: IntGaugeVec,
    blocks_cached_free: IntGaugeVec,
    blocks_total: IntGaugeVec,
    prefix_queries: IntCounter,
    prefix_hits: IntCounter,
    preemptions: IntCounter,
    recomputed_tokens: IntCounter,
    cow_copies: IntCounter,
    spec_drafts: IntCounter,
    spec_draft_tokens: IntCounter,
    spec_accepted_tokens: IntCounter,
    evictions: IntCounterVec,
    hits_by_tier: IntCounterVec,
    tiers: TierMetrics,
    steps: IntCounter,
    prompt_tokens: IntCounter,
    generation_tokens: IntCounter,
    request_success: IntCounterVec,
    cancelled: IntCounter,
    ttft: Histogram,
    tpot: Histogram,
    e2e: Histogram,
}

/// The KV tiers' metrics (host memory, disk, a shared remote tier).
struct TierMetrics {
    spills: IntCounter,
    offloads: IntCounter,
    restores: IntCounter,
    drops: IntCounterVec,
    file_errors: IntCounter,
    bytes: IntGaugeVec,
    lookups: IntCounterVec,
    errors: IntCounterVec,
    bytes_moved: IntCounterVec,
    fetch_seconds: CounterVec,
}

impl TierMetrics {
    /// Registers the tier metrics in `r`.
    fn new(r: &Registry) -> prometheus::Result<TierMetrics> {
        Ok(TierMetrics {
            spills: counter(
                r,
                "kvlab:kv_tier_spills_total",
                "Evicted cached blocks whose bytes went down to host memory or disk (--host-tier-blocks, --disk-tier).",
            )?,
            offloads: counter(
                r,
                "kvlab:kv_tier_offloads_total",
                "Of the spills, blocks of paused sessions moved down on purpose as their turn ended.",
            )?,
            restores: counter(
                r,
                "kvlab:kv_tier_restores_total",
                "Prefix-cache blocks restored from a tier instead of recomputed.",
            )?,
            drops: counter_by(
                r,
                "kvlab:kv_tier_drops_total",
                "Blocks the tiers let go, by reason: full (oldest spill pushed out), expired (--tier-ttl-steps), recomputed (the content computed again), lost (a file failed to write or verify).",
                &["reason"],
            )?,
            file_errors: counter(
                r,
                "kvlab:kv_tier_file_errors_total",
                "Disk-tier files that failed to write or to verify (each a clean miss).",
            )?,
            bytes: gauge_by(
                r,
                "kvlab:kv_tier_bytes",
                "Bytes of KV blocks each tier holds now.",
                "tier",
            )?,
            lookups: counter_by(
                r,
                "kvlab:kv_tier_lookups_total",
                "Blocks looked up in a shared tier (--remote-tier: tier=\"remote\"), by result: hit (found and verified), miss (absent), rejected (corrupt, truncated, another model's or another prefix's; recomputed and deleted).",
                &["tier", "result"],
            )?,
            errors: counter_by(
                r,
                "kvlab:kv_tier_errors_total",
                "Commands to a shared tier that failed (down, timed out, out of memory): each a miss or a skipped write, never a failed request.",
                &["tier"],
            )?,
            bytes_moved: counter_by(
                r,
                "kvlab:kv_tier_bytes_moved_total",
                "Bytes of KV blocks moved to and from a shared tier, by direction: read (fetched and verified) or written (first writer of a block's content).",
                &["tier", "direction"],
            )?,
            fetch_seconds: register(
                r,
                CounterVec::new(
                    Opts::new(
                        "kvlab:kv_tier_fetch_seconds_total",
                        "Seconds spent looking blocks up in a shared tier (round trips and verification); over the hits, the restore latency per block.",
                    ),
                    &["tier"],
                ),
            )?,
        })
    }

    /// Copies the scheduler's tier counters, as [`ServerMetrics::observe_scheduler`] does.
    fn observe(&self, m: &kvlab_paged::Metrics) {
        let r = m.remote_tier;
        for (result, total) in [
            ("hit", r.hits),
            ("miss", r.misses),
            ("rejected", r.rejected),
        ] {
            advance(&self.lookups.with_label_values(&["remote", result]), total);
        }
        advance(&self.errors.with_label_values(&["remote"]), r.errors);
        for (direction, total) in [("read", r.bytes_read), ("written", r.bytes_written)] {
            let c = self.bytes_moved.with_label_values(&["remote", direction]);
            advance(&c, total);
        }
        let c = self.fetch_seconds.with_label_values(&["remote"]);
        c.inc_by((r.fetch_ns as f64 * 1e-9 - c.get()).max(0.0));
        let d = m.tier_drops;
        for (reason, total) in [
            ("full", d.full),
            ("expired", d.expired),
            ("recomputed", d.recomputed),
            ("lost", d.lost),
        ] {
            advance(&self.drops.with_label_values(&[reason]), total);
        }
        for (tier, bytes) in [
            ("host", m.tier_store.host_bytes),
            ("disk", m.tier_store.disk_bytes),
        ] {
            self.bytes
                .with_label_values(&[tier])
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        for (c, total) in [
            (&self.spills, m.num_spills),
            (&self.offloads, m.num_offloaded_blocks),
            (&self.restores, m.num_restores),
            (
                &self.file_errors,
                m.tier_store.disk_read_errors + m.tier_store.disk_write_errors,
            ),
        ] {
            advance(c, total);
        }
    }
}

impl ServerMetrics {
    /// A registry whose metrics all carry `model_name="<model_name>"`.
    ///
    /// # Errors
    /// The `prometheus` crate's, for an invalid name or a name registered twice: a bug, which
    /// the unit test below would catch.
    pub fn new(model_name: &str) -> prometheus::Result<ServerMetrics> {
        let labels = HashMap::from([("model_name".to_string(), model_name.to_string())]);
        let registry = Registry::new_custom(None, Some(labels))?;
        let r = &registry;
        Ok(ServerMetrics {
            running: gauge(
                r,
                "vllm:num_requests_running",
                "Sequences in the running queue.",
            )?,
            waiting: gauge(
                r,
                "vllm:num_requests_waiting",
                "Sequences in the scheduler's waiting queue.",
            )?,
            pending: gauge(
                r,
                "kvlab:num_requests_pending",
                "Requests accepted that have not produced a token yet (the channel to the engine thread plus the waiting queue plus prefills in progress); new requests get 429 when it reaches --max-waiting.",
            )?,
            usage: register(
                r,
                Gauge::new(
                    "vllm:kv_cache_usage_perc",
                    "Fraction of KV blocks in use, 0 to 1 (vLLM's name and unit).",
                ),
            )?,
            blocks_free: per_group(
                r,
                "kvlab:num_blocks_free",
                "KV blocks that can be handed out (never used, or cached and evictable), per KV cache group.",
            )?,
            blocks_cached_free: per_group(
                r,
                "kvlab:num_blocks_cached_free",
                "Free KV blocks that keep a cached prefix a later prompt can reuse, per KV cache group.",
            )?,
            blocks_total: per_group(
                r,
                "kvlab:num_blocks_total",
                "KV blocks in the pool, per KV cache group.",
            )?,
            prefix_queries: counter(
                r,
                "vllm:prefix_cache_queries_total",
                "Prompt tokens looked up in the prefix cache.",
            )?,
            prefix_hits: counter(
                r,
                "vllm:prefix_cache_hits_total",
                "Prompt tokens served by the prefix cache (their prefill was skipped).",
            )?,
            preemptions: counter(
                r,
                "vllm:num_preemptions_total",
                "Sequences preempted by recompute.",
            )?,
            recomputed_tokens: counter(
                r,
                "kvlab:recomputed_tokens_total",
                "Tokens prefilled again after a preemption.",
            )?,
            cow_copies: counter(r, "kvlab:cow_copies_total", "Copy-on-write block copies.")?,
            spec_drafts: counter(
                r,
                "vllm:spec_decode_num_drafts_total",
                "Decode steps that checked draft tokens (--speculative).",
            )?,
            spec_draft_tokens: counter(
                r,
                "vllm:spec_decode_num_draft_tokens_total",
                "Draft tokens checked.",
            )?,
            spec_accepted_tokens: counter(
                r,
                "vllm:spec_decode_num_accepted_tokens_total",
                "Draft tokens the model agreed with and kept.",
            )?,
            evictions: counter_by(
                r,
                "kvlab:evictions_total",
                "Cached blocks whose content was dropped (or spilled) to make room, by the eviction policy that chose them (--eviction).",
                &["policy"],
            )?,
            hits_by_tier: counter_by(
                r,
                "kvlab:prefix_cache_hits_by_tier_total",
                "Prompt tokens the prefix cache served, by where their KV came from: pool (blocks in the pool), host, disk or remote (restored from a tier; remote: fetched from the Redis tier another process wrote); each over vllm:prefix_cache_queries_total is that tier's hit rate.",
                &["tier"],
            )?,
            tiers: TierMetrics::new(r)?,
            steps: counter(r, "kvlab:steps_total", "Engine steps run.")?,
            prompt_tokens: counter(
                r,
                "vllm:prompt_tokens_total",
                "Prompt tokens of finished requests.",
            )?,
            generation_tokens: counter(
                r,
                "vllm:generation_tokens_total",
                "Tokens generated, over all requests.",
            )?,
            request_success: counter_by(
                r,
                "vllm:request_success_total",
                "Requests that ran to their end, by finish reason.",
                &["finished_reason"],
            )?,
            cancelled: counter(
                r,
                "kvlab:requests_cancelled_total",
                "Requests aborted because their handler stopped listening (the client went away, or a stop string ended the text).",
            )?,
            ttft: histogram(
                r,
                "vllm:time_to_first_token_seconds",
                "Seconds from a request's arrival to its first token.",
                TTFT_BUCKETS_S,
            )?,
            tpot: histogram(
                r,
                "vllm:time_per_output_token_seconds",
                "Seconds between two consecutive output tokens of one request.",
                TPOT_BUCKETS_S,
            )?,
            e2e: histogram(
                r,
                "vllm:e2e_request_latency_seconds",
                "Seconds from a request's arrival to its last token.",
                E2E_BUCKETS_S,
            )?,
            registry,
        })
    }

    /// Copies the scheduler's gauges and counters (counters only ever grow, so each is advanced
    /// by what the scheduler counted since the last call).
    pub fn observe_scheduler(&self, s: &Scheduler) {
        let m = s.metrics();
        self.running.set(m.num_running as i64);
        self.waiting.set(m.num_waiting as i64);
        self.usage.set(m.kv_cache_usage_perc);
        for (g, a) in s.kv_cache_manager().allocators().iter().enumerate() {
            let g = g.to_string();
            let set = |v: &IntGaugeVec, n: usize| v.with_label_values(&[g.as_str()]).set(n as i64);
            set(&self.blocks_free, a.num_free_blocks());
            set(&self.blocks_cached_free, a.num_evictable_blocks());
            set(&self.blocks_total, a.num_blocks());
        }
        let policy = s.config().eviction_policy.name();
        advance(
            &self.evictions.with_label_values(&[policy]),
            m.num_evictions,
        );
        let h = m.prefix_cache_hits_by_tier;
        let tiers = [
            ("pool", h.pool),
            ("host", h.host),
            ("disk", h.disk),
            ("remote", h.remote),
        ];
        for (tier, total) in tiers {
            advance(&self.hits_by_tier.with_label_values(&[tier]), total);
        }
        self.tiers.observe(&m);
        for (c, total) in [
            (&self.prefix_queries, m.prefix_cache_queries),
            (&self.prefix_hits, m.prefix_cache_hits),
            (&self.preemptions, m.num_preemptions),
            (&self.recomputed_tokens, m.num_recomputed_tokens),
            (&self.cow_copies, m.num_cow_copies),
            (&self.spec_drafts, m.spec_decode_num_drafts),
            (&self.spec_draft_tokens, m.spec_decode_num_draft_tokens),
            (
                &self.spec_accepted_tokens,
                m.spec_decode_num_accepted_tokens,
            ),
            (&self.steps, m.num_steps),
        ] {
            advance(c, total);
        }
    }

    /// A request's first token came `since_arrival` after it arrived.
    pub fn first_token(&self, since_arrival: Duration) {
        self.ttft.observe(since_arrival.as_secs_f64());
        self.generation_tokens.inc();
    }

    /// A later token came `since_previous` after the request's previous one.
    pub fn next_token(&self, since_previous: Duration) {
        self.tpot.observe(since_previous.as_secs_f64());
        self.generation_tokens.inc();
    }

    /// A request ran to its end (`reason`) `since_arrival` after it arrived.
    pub fn finished(&self, reason: FinishReason, prompt_tokens: usize, since_arrival: Duration) {
        self.request_success
            .with_label_values(&[finish_reason(reason)])
            .inc();
        self.prompt_tokens.inc_by(prompt_tokens as u64);
        self.e2e.observe(since_arrival.as_secs_f64());
    }

    /// A request was aborted because its handler closed its channel.
    pub fn cancelled(&self) {
        self.cancelled.inc();
    }

    /// Requests cancelled so far (see [`ServerMetrics::cancelled`]).
    pub fn num_cancelled(&self) -> u64 {
        self.cancelled.get()
    }

    /// Sets the pending gauge (read from the admission counter when the page is scraped).
    pub fn set_pending(&self, pending: usize) {
        self.pending.set(pending as i64);
    }

    /// Everything, in Prometheus' text exposition format 0.0.4.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec only fails on an invalid metric, and every one here is built valid.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

/// Registers `metric` and returns it.
fn register<M: prometheus::core::Collector + Clone + 'static>(
    r: &Registry,
    metric: prometheus::Result<M>,
) -> prometheus::Result<M> {
    let m = metric?;
    r.register(Box::new(m.clone()))?;
    Ok(m)
}

fn gauge(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntGauge> {
    register(r, IntGauge::new(name, help))
}

fn counter(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntCounter> {
    register(r, IntCounter::new(name, help))
}

/// An integer counter with the labels `labels`.
fn counter_by(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntCounterVec> {
    register(r, IntCounterVec::new(Opts::new(name, help), labels))
}

/// Advances counter `c` to `total`, what the scheduler counted so far (counters never go back).
fn advance(c: &IntCounter, total: u64) {
    c.inc_by(total.saturating_sub(c.get()));
}

/// An integer gauge with one label, `label`.
fn gauge_by(r: &Registry, name: &str, help: &str, label: &str) -> prometheus::Result<IntGaugeVec> {
    register(r, IntGaugeVec::new(Opts::new(name, help), &[label]))
}

fn per_group(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntGaugeVec> {
    gauge_by(r, name, help, "group")
}

fn histogram(
    r: &Registry,
    name: &str,
    help: &str,
    buckets: &[f64],
) -> prometheus::Result<Histogram> {
    register(
        r,
        Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec())),
    )
}

/// A finish reason's name, the same in OpenAI's `finish_reason` and in vLLM's
/// `request_success` label: "stop", "length" (the token limit or the context's end), "abort".
pub fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length | FinishReason::MaxSeqLen => "length",
        FinishReason::Aborted => "abort",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every metric registers (a bad name would panic here, not in a running server) and the
    /// text has vLLM's names with the model label.
    #[test]
    fn registry_builds_and_renders() {
        let m = ServerMetrics::new("stories260K").unwrap();
        m.first_token(Duration::from_millis(3));
        m.next_token(Duration::from_millis(1));
        m.finished(FinishReason::Length, 5, Duration::from_millis(4));
        let text = m.render();
        for line in [
            "vllm:generation_tokens_total{model_name=\"stories260K\"} 2",
            "vllm:prompt_tokens_total{model_name=\"stories260K\"} 5",
            "vllm:request_success_total{finished_reason=\"length\",model_name=\"stories260K\"} 1",
            "vllm:time_to_first_token_seconds_count{model_name=\"stories260K\"} 1",
            "vllm:time_to_first_token_seconds_bucket{model_name=\"stories260K\",le=\"0.005\"} 1",
            "vllm:time_to_first_token_seconds_bucket{model_name=\"stories260K\",le=\"0.002\"} 0",
            "# TYPE vllm:e2e_request_latency_seconds histogram",
        ] {
            assert!(text.contains(line), "{line:?} missing from\n{text}");
        }
    }
}
