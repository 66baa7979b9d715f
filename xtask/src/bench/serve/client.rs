//! The HTTP client: streamed completions sent at Poisson arrival times, each one's TTFT, TPOT and
//! e2e from its server-sent events, `/metrics` counters, and a rate's requests summarised.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use indicatif::ProgressBar;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};

use super::{Plan, PromptRef, RateRow, rate_name};
use crate::bench::stats::Summary;

pub(in crate::bench) struct Client {
    pub(in crate::bench) http: reqwest::Client,
    pub(in crate::bench) base: String,
}

/// How one streamed request ended.
pub(in crate::bench) enum Outcome {
    Done(Timing),
    /// 429 or 503.
    Refused,
    Lost(String),
}

/// A completed streamed request: times from its send, in ms.
pub(in crate::bench) struct Timing {
    pub(in crate::bench) ttft_ms: f64,
    pub(in crate::bench) e2e_ms: f64,
    pub(in crate::bench) text: String,
    /// Since the rate's start, seconds.
    pub(super) end_s: f64,
}

/// The single-threaded tokio runtime the load tests' clients run on.
///
/// # Errors
/// When tokio cannot start it.
pub(in crate::bench) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the client's tokio runtime")
}

impl Client {
    /// A client of the server at `base`, once its `/health` answers 200.
    pub(in crate::bench) async fn connect(base: &str) -> Result<Client> {
        let c = Client {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(900))
                .build()?,
            base: base.trim_end_matches('/').to_string(),
        };
        c.wait_healthy(Duration::from_secs(300)).await?;
        Ok(c)
    }

    pub(super) async fn wait_healthy(&self, limit: Duration) -> Result<()> {
        let t = Instant::now();
        loop {
            if let Ok(r) = self.http.get(format!("{}/health", self.base)).send().await
                && r.status().is_success()
            {
                return Ok(());
            }
            if t.elapsed() > limit {
                bail!("{}/health did not answer 200 within {limit:?}", self.base);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(super) fn body(model: &str, prompt: &str, max_tokens: usize, stream: bool) -> Value {
        json!({
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stream": stream,
        })
    }

    /// Every prompt alone, one after another, not streamed: the reference texts and the token
    /// counts (`usage`).
    pub(super) async fn solo_all(
        &self,
        texts: &[String],
        max_tokens: usize,
        model: &str,
        bar: &ProgressBar,
    ) -> Result<Vec<PromptRef>> {
        let mut refs = Vec::new();
        for (i, t) in texts.iter().enumerate() {
            let r = self
                .http
                .post(format!("{}/v1/completions", self.base))
                .json(&Self::body(model, t, max_tokens, false))
                .send()
                .await
                .with_context(|| format!("prompt {i} alone"))?;
            let status = r.status();
            let v: Value = r
                .json()
                .await
                .with_context(|| format!("prompt {i} alone"))?;
            if !status.is_success() {
                bail!("prompt {i} alone: HTTP {status}: {v}");
            }
            let choice = &v["choices"][0];
            refs.push(PromptRef {
                index: i,
                text: t.clone(),
                prompt_tokens: v["usage"]["prompt_tokens"].as_u64().unwrap_or(0) as usize,
                completion_tokens: v["usage"]["completion_tokens"]
                    .as_u64()
                    .with_context(|| format!("prompt {i} alone: no usage in {v}"))?
                    as usize,
                finish_reason: choice["finish_reason"].as_str().unwrap_or("").into(),
                completion: choice["text"].as_str().unwrap_or("").into(),
            });
            bar.inc(1);
        }
        Ok(refs)
    }

    /// The model id the server answers to (`/v1/models`' first).
    pub(super) async fn served_model(&self) -> Result<String> {
        let v: Value = self
            .http
            .get(format!("{}/v1/models", self.base))
            .send()
            .await?
            .json()
            .await
            .context("/v1/models")?;
        v["data"][0]["id"]
            .as_str()
            .map(str::to_string)
            .with_context(|| format!("/v1/models names no model: {v}"))
    }

    /// `/metrics`, as Prometheus text.
    pub(in crate::bench) async fn metrics(&self) -> Result<String> {
        Ok(self
            .http
            .get(format!("{}/metrics", self.base))
            .send()
            .await?
            .text()
            .await?)
    }

    /// One rate: every prompt sent at its Poisson arrival time, streamed; the results checked
    /// against the solo texts and summarised. A text that differs from its solo run fails the
    /// rate if `strict`, else is counted.
    pub(super) async fn sweep(
        &self,
        rate: f64,
        refs: &[PromptRef],
        plan: &Plan,
        seed: u64,
        bar: &ProgressBar,
        strict: bool,
    ) -> Result<RateRow> {
        let before = self.metrics().await?;
        let arrivals = arrival_times(refs.len(), rate, seed);
        let t0 = Instant::now();
        let tasks: Vec<_> = refs
            .iter()
            .zip(arrivals)
            .map(|(r, at)| {
                let body = Self::body(&plan.model, &r.text, plan.max_tokens, true);
                let req = self
                    .http
                    .post(format!("{}/v1/completions", self.base))
                    .json(&body);
                let bar = bar.clone();
                tokio::spawn(async move {
                    tokio::time::sleep_until((t0 + Duration::from_secs_f64(at)).into()).await;
                    let out = stream_one(req, t0).await;
                    bar.inc(1);
                    out
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for t in tasks {
            outcomes.push(t.await.map_err(|e| anyhow!("client task: {e}"))?);
        }
        let after = self.metrics().await?;
        summarise(rate, refs, outcomes, (&before, &after), strict)
    }
}

/// Send times in seconds from the start: exponential gaps of mean 1/rate (a Poisson process, as
/// benchmark_serving.py's `np.random.exponential(1.0 / request_rate)`), the first request at 0;
/// all at 0 for an infinite rate.
pub(super) fn arrival_times(n: usize, rate: f64, seed: u64) -> Vec<f64> {
    if !rate.is_finite() {
        return vec![0.0; n];
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ rate.to_bits());
    let mut t = 0.0;
    (0..n)
        .map(|i| {
            if i > 0 {
                // Inverse transform: −ln(1 − U) / rate, U uniform in [0, 1).
                let u: f64 = rng.random();
                t += -(1.0 - u).ln() / rate;
            }
            t
        })
        .collect()
}

/// Sends one streamed request and reads its server-sent events to `data: [DONE]`.
pub(in crate::bench) async fn stream_one(req: reqwest::RequestBuilder, t0: Instant) -> Outcome {
    let sent = Instant::now();
    let mut resp = match req.send().await {
        Ok(r) => r,
        Err(e) => return Outcome::Lost(format!("send: {e}")),
    };
    let status = resp.status().as_u16();
    if status == 429 || status == 503 {
        return Outcome::Refused;
    }
    if status != 200 {
        let body = resp.text().await.unwrap_or_default();
        return Outcome::Lost(format!("HTTP {status}: {body}"));
    }
    let mut sse = Sse::default();
    loop {
        match resp.chunk().await {
            Ok(Some(bytes)) => {
                if let Err(e) = sse.feed(&bytes) {
                    return Outcome::Lost(e);
                }
                if sse.done {
                    break;
                }
            }
            Ok(None) => break,
            Err(e) => return Outcome::Lost(format!("reading the stream: {e}")),
        }
    }
    if !sse.done {
        return Outcome::Lost("the stream ended before data: [DONE]".into());
    }
    let now = Instant::now();
    Outcome::Done(Timing {
        ttft_ms: sse.first.map_or(f64::NAN, |f| ms(f - sent)),
        e2e_ms: ms(now - sent),
        text: sse.text,
        end_s: (now - t0).as_secs_f64(),
    })
}

pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A server-sent event stream being read: the text so far, when its first text came.
#[derive(Default)]
pub(super) struct Sse {
    /// Bytes after the last complete line.
    pub(super) pending: Vec<u8>,
    pub(super) text: String,
    pub(super) first: Option<Instant>,
    pub(super) done: bool,
}

impl Sse {
    /// Takes the next bytes; handles every complete `data:` line. An error object in the stream
    /// is an error.
    pub(super) fn feed(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.pending.extend_from_slice(bytes);
        while let Some(nl) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=nl).collect();
            let line = String::from_utf8(line).map_err(|e| format!("not UTF-8: {e}"))?;
            let Some(data) = line.trim_end().strip_prefix("data:") else {
                continue;
            };
            let data = data.trim_start();
            if data == "[DONE]" {
                self.done = true;
                return Ok(());
            }
            let v: Value =
                serde_json::from_str(data).map_err(|e| format!("bad chunk {data:?}: {e}"))?;
            if let Some(err) = v.get("error") {
                return Err(format!("error in the stream: {err}"));
            }
            let text = v["choices"][0]["text"].as_str().unwrap_or("");
            if !text.is_empty() && self.first.is_none() {
                self.first = Some(Instant::now());
            }
            self.text.push_str(text);
        }
        Ok(())
    }
}

/// Prometheus text: the sum of `name`'s samples (any labels).
pub(in crate::bench) fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// One rate's outcomes checked and summarised; a lost request fails with every loss listed. A
/// text that differs from its solo run is lost if `strict`, else counted in `differs_from_solo`
/// (and timed like the others). `metrics` are `/metrics` before and after the rate.
pub(super) fn summarise(
    rate: f64,
    refs: &[PromptRef],
    outcomes: Vec<Outcome>,
    (before, after): (&str, &str),
    strict: bool,
) -> Result<RateRow> {
    let (mut ttft, mut tpot, mut e2e) = (Vec::new(), Vec::new(), Vec::new());
    let (mut refused, mut lost, mut tokens, mut end) = (0, Vec::new(), 0, 0.0f64);
    let mut differs = 0;
    for (r, o) in refs.iter().zip(outcomes) {
        match o {
            Outcome::Refused => refused += 1,
            Outcome::Lost(why) => lost.push(format!("prompt {}: {why}", r.index)),
            Outcome::Done(t) if strict && t.text != r.completion => lost.push(format!(
                "prompt {}: text differs from its solo run\n  solo:   {:?}\n  loaded: {:?}",
                r.index, r.completion, t.text
            )),
            Outcome::Done(t) => {
                differs += usize::from(t.text != r.completion);
                ttft.push(t.ttft_ms);
                e2e.push(t.e2e_ms);
                if r.completion_tokens > 1 {
                    tpot.push((t.e2e_ms - t.ttft_ms) / (r.completion_tokens - 1) as f64);
                }
                tokens += r.completion_tokens;
                end = end.max(t.end_s);
            }
        }
    }
    if !lost.is_empty() {
        bail!(
            "rate {} req/s: {} of {} requests LOST:\n{}",
            rate_name(rate),
            lost.len(),
            refs.len(),
            lost.join("\n")
        );
    }
    let delta = |name: &str| metric(after, name) - metric(before, name);
    let queries = delta("vllm:prefix_cache_queries_total");
    let hits = delta("vllm:prefix_cache_hits_total");
    let ok = e2e.len();
    Ok(RateRow {
        rate: rate_name(rate),
        rate_req_per_s: rate.is_finite().then_some(rate),
        ok,
        refused,
        lost: 0,
        differs_from_solo: differs,
        duration_s: end,
        output_tokens: tokens,
        output_tok_per_s: tokens as f64 / end.max(1e-9),
        req_per_s: ok as f64 / end.max(1e-9),
        ttft_ms: Summary::of(&ttft),
        tpot_ms: Summary::of(&tpot),
        e2e_ms: Summary::of(&e2e),
        prefix_cache_hit_rate: (queries > 0.0).then(|| hits / queries),
        prefix_cache_queries: queries,
        prefix_cache_hits: hits,
        preemptions: delta("vllm:num_preemptions_total"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_are_seeded_poisson() {
        let a = arrival_times(2000, 4.0, 7);
        assert_eq!(a, arrival_times(2000, 4.0, 7));
        assert_eq!(a[0], 0.0);
        assert!(a.windows(2).all(|w| w[1] >= w[0]));
        // Mean gap 1/rate = 0.25 s, within a few standard errors.
        let mean = a[1999] / 1999.0;
        assert!((mean - 0.25).abs() < 0.03, "{mean}");
        assert_eq!(arrival_times(3, f64::INFINITY, 7), vec![0.0; 3]);
    }

    #[test]
    fn sse_lines_split_anywhere() {
        let body = "data: {\"choices\":[{\"text\":\"Hel\"}]}\n\ndata: {\"choices\":[{\"text\":\
                    \"lo\"}]}\n\ndata: [DONE]\n\n";
        let mut s = Sse::default();
        for chunk in body.as_bytes().chunks(7) {
            s.feed(chunk).unwrap();
        }
        assert!(s.done);
        assert_eq!(s.text, "Hello");
        let mut e = Sse::default();
        assert!(e.feed(b"data: {\"error\":{\"message\":\"x\"}}\n").is_err());
    }

    fn reference(index: usize, completion: &str) -> PromptRef {
        PromptRef {
            index,
            text: "Once".into(),
            prompt_tokens: 2,
            completion_tokens: 3,
            finish_reason: "length".into(),
            completion: completion.into(),
        }
    }

    fn done(text: &str) -> Outcome {
        Outcome::Done(Timing {
            ttft_ms: 10.0,
            e2e_ms: 30.0,
            text: text.into(),
            end_s: 0.5,
        })
    }

    #[test]
    fn a_different_text_or_a_failure_is_lost_a_refusal_is_not() {
        let refs = [reference(0, " upon"), reference(1, " a time")];
        let row = summarise(
            1.0,
            &refs,
            vec![done(" upon"), Outcome::Refused],
            ("", ""),
            true,
        )
        .unwrap();
        assert_eq!((row.ok, row.refused, row.output_tokens), (1, 1, 3));
        assert_eq!(row.tpot_ms.median, 10.0);
        let e = summarise(
            1.0,
            &refs,
            vec![done(" upon"), done(" a tim")],
            ("", ""),
            true,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("prompt 1: text differs"), "{e}");
        // Not strict (a peer's run): counted and timed, not lost.
        let row = summarise(
            1.0,
            &refs,
            vec![done(" upon"), done(" a tim")],
            ("", ""),
            false,
        )
        .unwrap();
        assert_eq!((row.ok, row.differs_from_solo), (2, 1));
        let e = summarise(
            f64::INFINITY,
            &refs,
            vec![Outcome::Lost("x".into()), done(" a time")],
            ("", ""),
            false,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("rate inf") && e.contains("prompt 0: x"), "{e}");
    }

    #[test]
    fn metrics_sum_over_labels() {
        let t = "# TYPE vllm:x counter\nvllm:x{model_name=\"a\"} 3\nvllm:x_other 9\nvllm:x 2\n";
        assert_eq!(metric(t, "vllm:x"), 5.0);
    }
}
