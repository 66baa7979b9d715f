//! `cargo xtask load --peer llama-server` (also spelled `cargo xtask bench --serve --peer
//! llama-server`): `kvlab serve` against llama.cpp's own HTTP server under the same load, on the
//! same GGUF with the same threads.
//!
//! llama-server runs as it ships for many users at once: `-np N` parallel slots (N = the most
//! requests of any load point, each slot's context the longest prompt plus the completion,
//! within the model's), continuous
//! batching on (`-cb`), its prompt cache on (its default; kvlab's prefix cache is on too). Both
//! servers get the same streamed, greedy (temperature 0) completions: N requests all at once for
//! N in [`STREAMS`] (1 to 64 concurrent streams, or `--streams`), and Poisson rates (4, 16 and
//! "inf" requests/s of `--requests` requests, or `--rate`). Each load
//! point starts a fresh process of each server, kvlab first at even points and llama-server
//! first at odd ones, so that a change in the machine's load hits both alike.
//!
//! Every completion under load is checked against the same prompt's completion run alone on
//! the same server; a differing text is counted, not dropped (llama.cpp's batched kernels round
//! differently from its single-sequence ones, so its greedy texts may part at near-ties). The
//! verdict ([`GOAL_STREAMS`] streams): kvlab's output tokens/s at least [`GOAL_RATIO`]× llama-
//! server's and its TTFT p99 no worse. Output tokens are each prompt's solo `usage`, so a
//! differing text is counted at its solo length (at `max_tokens`, as every solo run of the
//! default prompts is, both are the same). llama-server runs without `--metrics`: its rows'
//! prefix-cache and preemption fields (kvlab's `vllm:` counters) stay empty. `--quick` does not
//! apply.
//!
//! llama-server is found at `KVLAB_LLAMA_SERVER` or as `llama-server` on the PATH; without it
//! the report names it missing with the command that builds it
//! (`scripts/peers/build_llama_server.sh`).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result};
use kvlab_model::Activations;
use serde::Serialize;

use super::client::{self, Client};
use super::server::Server;
use super::{BLOCK_SIZE, Plan, PromptRef, RateRow, ServeOpts, pool_blocks, prompts, rate_name};
use crate::paths::workspace_root;

/// Concurrent streams: this many requests sent at once.
pub const STREAMS: [usize; 5] = [1, 8, 16, 32, 64];
/// The streams at which the goal is judged.
pub const GOAL_STREAMS: usize = 32;
/// kvlab's output tokens/s over llama-server's at [`GOAL_STREAMS`]: the goal.
pub const GOAL_RATIO: f64 = 1.5;
/// The command that builds llama-server, for a report where it is missing.
pub const BUILD_COMMAND: &str = "scripts/peers/build_llama_server.sh ~/llama.cpp \
     && export KVLAB_LLAMA_SERVER=~/llama.cpp/build/bin/llama-server";

/// The comparison's report (`serve_peer.json`).
#[derive(Debug, Serialize)]
pub struct PeerServeReport {
    pub format_version: u32,
    pub kind: String,
    pub machine: String,
    pub notes: Vec<String>,
    pub model: String,
    /// The GGUF both servers load.
    pub gguf: String,
    pub peer: String,
    /// `llama-server --version`, or why it is missing.
    pub peer_version: String,
    /// Why the peer did not run and the command that builds it (`null` when it ran).
    pub peer_missing: Option<String>,
    pub threads: usize,
    pub max_tokens: usize,
    pub seed: u64,
    /// Each server's command line (prompts and ports aside).
    pub kvlab_command: String,
    pub peer_command: String,
    /// Distinct prompts, and how many of them the two servers completed alike when run alone.
    pub solo_prompts: usize,
    pub solo_same_text: usize,
    pub points: Vec<PeerPoint>,
    pub goal_streams: usize,
    pub goal_ratio: f64,
    /// At [`GOAL_STREAMS`]: kvlab / llama-server output tokens/s, and whether kvlab's TTFT p99 is
    /// no worse (`null` when the point did not run).
    pub goal_output_ratio: Option<f64>,
    pub goal_ttft_p99_no_worse: Option<bool>,
    pub wall_seconds: f64,
    pub plots: Vec<String>,
}

/// One load point, both servers.
#[derive(Debug, Serialize)]
pub struct PeerPoint {
    /// "N streams" (all at once) or "R req/s" (Poisson).
    pub load: String,
    /// Requests sent at once; `null` for a Poisson rate.
    pub streams: Option<usize>,
    /// Requests/s; `null` for all at once.
    pub rate_req_per_s: Option<f64>,
    pub requests: usize,
    pub kvlab_first: bool,
    pub kvlab: RateRow,
    pub peer: RateRow,
    /// kvlab / llama-server output tokens/s.
    pub output_ratio: f64,
}

/// The comparison: the solo texts on each server, then every load point on fresh servers.
///
/// # Errors
/// A server that does not start or answers with an error, a lost request, no GGUF for the model.
pub fn run(o: &ServeOpts, peer_bin: Option<PathBuf>) -> Result<PeerServeReport> {
    let started = Instant::now();
    let model = o.model.clone().unwrap_or_else(|| "gemma-3-270m".into());
    let threads = o.threads;
    let max_tokens = o.max_tokens.unwrap_or(64);
    let requests = o.requests.unwrap_or(32);
    let rates = if o.rates.is_empty() {
        vec![4.0, 16.0, f64::INFINITY]
    } else {
        o.rates.clone()
    };
    let streams = if o.streams.is_empty() {
        STREAMS.to_vec()
    } else {
        o.streams.clone()
    };
    let most = streams.iter().copied().chain([requests]).max().unwrap_or(1);
    let texts = prompts(most, o.seed);
    let mut rep = PeerServeReport {
        format_version: 1,
        kind: "kvlab-bench-serve-peer".into(),
        machine: o.machine.clone(),
        notes: o.notes.clone(),
        model: model.clone(),
        gguf: String::new(),
        peer: "llama-server".into(),
        peer_version: String::new(),
        peer_missing: None,
        threads,
        max_tokens,
        seed: o.seed,
        kvlab_command: String::new(),
        peer_command: String::new(),
        solo_prompts: 0,
        solo_same_text: 0,
        points: Vec::new(),
        goal_streams: GOAL_STREAMS,
        goal_ratio: GOAL_RATIO,
        goal_output_ratio: None,
        goal_ttft_p99_no_worse: None,
        wall_seconds: 0.0,
        plots: Vec::new(),
    };
    let peer_bin = match peer_bin.or_else(find_llama_server) {
        Some(p) if p.is_file() => std::fs::canonicalize(&p).unwrap_or(p),
        other => {
            rep.peer_version = "missing".into();
            let looked = match other {
                Some(p) => format!("{} is not a file", p.display()),
                None => "KVLAB_LLAMA_SERVER unset, none on the PATH".into(),
            };
            rep.peer_missing = Some(format!(
                "llama-server not found ({looked}); build it with CMake from llama.cpp's \
                 source: {BUILD_COMMAND}"
            ));
            rep.wall_seconds = started.elapsed().as_secs_f64();
            return Ok(rep);
        }
    };
    let kvlab = crate::bench::peers::build_kvlab()?;
    let dir = o.out.join("serve_peer");
    std::fs::create_dir_all(&dir)?;
    let (gguf, _) = crate::bench::peers::gguf_of(&kvlab, &dir, &model)?;
    // The servers start in the workspace root: an absolute path, whatever --out was.
    let gguf = std::fs::canonicalize(&gguf).unwrap_or(gguf);
    rep.gguf = gguf.display().to_string();
    rep.peer_version = version(&peer_bin);
    // Each slot holds its longest prompt (at most a token per byte, plus BOS) and completion,
    // within the model's context.
    let slot_ctx = (texts.iter().map(|t| t.len() + 1).max().unwrap_or(1) + max_tokens)
        .next_multiple_of(256)
        .min(context_length(&gguf)?);
    let sides = Sides {
        kvlab: &kvlab,
        peer: &peer_bin,
        gguf: &gguf,
        threads,
        // Every request of the largest load at once, and at least one whole slot context
        // (kvlab serve refuses a pool that cannot hold one sequence of its -c).
        num_blocks: pool_blocks(&texts, max_tokens).max(slot_ctx.div_ceil(BLOCK_SIZE) + 1),
        slots: most,
        slot_ctx,
        log: dir.join("llama-server.log"),
        activations: o.activations,
    };
    rep.kvlab_command = sides.kvlab_args().join(" ");
    rep.peer_command = sides.peer_args(0).join(" ");
    let rt = client::runtime()?;
    // Each distinct prompt runs alone once per server; load point k's request is text k.
    let mut unique: Vec<String> = Vec::new();
    let solo_of: Vec<usize> = texts
        .iter()
        .map(|t| match unique.iter().position(|u| u == t) {
            Some(i) => i,
            None => {
                unique.push(t.clone());
                unique.len() - 1
            }
        })
        .collect();
    let loads: Vec<(Option<usize>, f64)> = streams
        .iter()
        .map(|&n| (Some(n), f64::INFINITY))
        .chain(rates.iter().map(|&r| (None, r)))
        .collect();
    let total = 2 * unique.len()
        + loads
            .iter()
            .map(|l| 2 * l.0.unwrap_or(requests))
            .sum::<usize>();
    let bar = super::progress(total as u64);
    bar.set_message("solo runs on kvlab serve and llama-server (reference texts)");
    let solo = |side: Side| -> Result<(Vec<PromptRef>, String)> {
        let server = sides.start(side)?;
        rt.block_on(async {
            let c = Client::connect(&server.base).await?;
            let model = c.served_model().await?;
            Ok((c.solo_all(&unique, max_tokens, &model, &bar).await?, model))
        })
    };
    let (kvlab_solo, kvlab_model) = solo(Side::Kvlab)?;
    let (peer_solo, peer_model) = solo(Side::Peer)?;
    rep.solo_prompts = unique.len();
    rep.solo_same_text = kvlab_solo
        .iter()
        .zip(&peer_solo)
        .filter(|(a, b)| a.completion == b.completion)
        .count();
    // kvlab's f32 path gives a request its solo text whatever it is batched with (a differing
    // text fails the run); with 8-bit activations, as llama.cpp's, a rounding boundary crossed by
    // another kernel's last bit can change a greedy text, so those are counted as the peer's are.
    let strict = |side: Side| side == Side::Kvlab && o.activations == Activations::F32;
    for (i, &(streams, rate)) in loads.iter().enumerate() {
        let n = streams.unwrap_or(requests);
        let load = match streams {
            Some(1) => "1 stream".into(),
            Some(n) => format!("{n} streams"),
            None => format!("{} req/s", rate_name(rate)),
        };
        bar.set_message(load.clone());
        let refs_of = |solo: &[PromptRef]| -> Vec<PromptRef> {
            (0..n)
                .map(|k| PromptRef {
                    index: k,
                    ..solo[solo_of[k]].clone()
                })
                .collect()
        };
        let point = |side: Side| -> Result<RateRow> {
            let (solo, model) = match side {
                Side::Kvlab => (&kvlab_solo, &kvlab_model),
                Side::Peer => (&peer_solo, &peer_model),
            };
            let plan = Plan {
                model: model.clone(),
                requests: n,
                max_tokens,
                rates: vec![rate],
                pairs: 0,
            };
            let server = sides.start(side)?;
            rt.block_on(async {
                let c = Client::connect(&server.base).await?;
                c.sweep(rate, &refs_of(solo), &plan, o.seed, &bar, strict(side))
                    .await
            })
        };
        let kvlab_first = i % 2 == 0;
        let (kvlab_row, peer_row) = if kvlab_first {
            let k = point(Side::Kvlab)?;
            (k, point(Side::Peer)?)
        } else {
            let p = point(Side::Peer)?;
            (point(Side::Kvlab)?, p)
        };
        rep.points.push(PeerPoint {
            load,
            streams,
            rate_req_per_s: rate.is_finite().then_some(rate),
            requests: n,
            kvlab_first,
            output_ratio: kvlab_row.output_tok_per_s / peer_row.output_tok_per_s,
            kvlab: kvlab_row,
            peer: peer_row,
        });
    }
    bar.finish_and_clear();
    if let Some(p) = rep.points.iter().find(|p| p.streams == Some(GOAL_STREAMS)) {
        rep.goal_output_ratio = Some(p.output_ratio);
        rep.goal_ttft_p99_no_worse = Some(p.kvlab.ttft_ms.p99 <= p.peer.ttft_ms.p99);
    }
    if o.plots {
        rep.plots = super::plot::peer_report(&rep, &o.out)?;
    }
    rep.wall_seconds = started.elapsed().as_secs_f64();
    Ok(rep)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Kvlab,
    Peer,
}

/// How both servers are started.
struct Sides<'a> {
    kvlab: &'a Path,
    peer: &'a Path,
    gguf: &'a Path,
    threads: usize,
    /// kvlab's pool: every request of the largest load at once.
    num_blocks: usize,
    /// llama-server's parallel slots (`-np`) and each one's context, tokens.
    slots: usize,
    slot_ctx: usize,
    /// llama-server's stderr, the last run's.
    log: PathBuf,
    /// kvlab serve's `--activations`.
    activations: Activations,
}

impl Sides<'_> {
    /// `kvlab serve`'s flags after `-m GGUF` (the load test's Server adds the pool's): each
    /// sequence's context as long as a llama-server slot's.
    fn kvlab_args(&self) -> Vec<String> {
        let n = |x: usize| x.to_string();
        vec![
            "-t".into(),
            n(self.threads),
            "-c".into(),
            n(self.slot_ctx),
            "--activations".into(),
            self.activations.name().into(),
        ]
    }

    /// llama-server's command line on `port`.
    fn peer_args(&self, port: u16) -> Vec<String> {
        let n = |x: usize| x.to_string();
        let threads = n(self.threads);
        let mut args = vec!["-m".into(), self.gguf.display().to_string()];
        args.extend([
            "-np".into(),
            n(self.slots),
            "-c".into(),
            n(self.slots * self.slot_ctx),
        ]);
        args.extend([
            "-cb".into(),
            "-t".into(),
            threads.clone(),
            "-tb".into(),
            threads,
        ]);
        args.extend(["--no-webui", "--host", "127.0.0.1", "--port"].map(String::from));
        args.push(port.to_string());
        args
    }

    fn start(&self, side: Side) -> Result<Server> {
        match side {
            Side::Kvlab => Server::start(
                self.kvlab,
                &self.gguf.display().to_string(),
                self.num_blocks,
                true,
                &self.kvlab_args(),
            ),
            Side::Peer => {
                let port = free_port()?;
                let mut cmd = Command::new(self.peer);
                cmd.args(self.peer_args(port))
                    .current_dir(workspace_root())
                    .stdin(Stdio::null())
                    .stdout(Stdio::null());
                let base = format!("http://127.0.0.1:{port}");
                Server::spawn(cmd, base, "llama-server", &self.log)
            }
        }
    }
}

/// The GGUF's `{architecture}.context_length`: the most positions a sequence may have.
///
/// # Errors
/// As [`arch_usize`], and when the key is absent.
pub(crate) fn context_length(gguf: &Path) -> Result<usize> {
    arch_usize(gguf, "context_length")?
        .with_context(|| format!("{} has no context_length", gguf.display()))
}

/// The GGUF's `{architecture}.{key}` as a number; `None` when absent.
///
/// # Errors
/// An unreadable GGUF or one without `general.architecture`.
pub(crate) fn arch_usize(gguf: &Path, key: &str) -> Result<Option<usize>> {
    let file =
        kvlab_gguf::GgufFile::open(gguf).with_context(|| format!("reading {}", gguf.display()))?;
    let meta = file.metadata();
    let arch = meta.get_str("general.architecture")?;
    Ok(meta.get_usize(&format!("{arch}.{key}")).ok())
}

/// A port nobody listens on now (bound and released; llama-server takes no port 0).
fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

/// `KVLAB_LLAMA_SERVER`, else `llama-server` on the PATH.
fn find_llama_server() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KVLAB_LLAMA_SERVER") {
        return Some(PathBuf::from(p));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join("llama-server"))
        .find(|p| p.is_file())
}

/// `llama-server --version`'s version line.
fn version(bin: &Path) -> String {
    let out = Command::new(bin).arg("--version").output();
    match out {
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stderr).to_string()
                + &String::from_utf8_lossy(&o.stdout);
            text.lines()
                .find(|l| l.starts_with("version"))
                .unwrap_or("unknown version")
                .trim()
                .to_string()
        }
        Err(e) => format!("{} --version failed: {e}", bin.display()),
    }
}

/// The table, on stdout.
pub fn print(r: &PeerServeReport) {
    println!(
        "== kvlab serve vs llama-server: {} ({}), {} threads each, {} tokens per request ==",
        r.model, r.gguf, r.threads, r.max_tokens
    );
    if let Some(why) = &r.peer_missing {
        println!("llama-server: MISSING — {why}");
        return;
    }
    println!("llama-server {}: {}", r.peer_version, r.peer_command);
    println!(
        "solo texts the same on both servers: {} of {} prompts",
        r.solo_same_text, r.solo_prompts
    );
    let q = |s: &crate::bench::stats::Summary| format!("{:.0} / {:.0}", s.median, s.p99);
    crate::table::columns(
        &r.points,
        &[
            ("load", &|p| p.load.clone()),
            ("first", &|p| {
                if p.kvlab_first { "kvlab" } else { "llama" }.into()
            }),
            ("out tok/s kvlab (llama)", &|p| {
                format!(
                    "{:.0} ({:.0})",
                    p.kvlab.output_tok_per_s, p.peer.output_tok_per_s
                )
            }),
            ("ratio", &|p| format!("{:.2}x", p.output_ratio)),
            ("TTFT ms p50/p99 kvlab", &|p| q(&p.kvlab.ttft_ms)),
            ("llama", &|p| q(&p.peer.ttft_ms)),
            ("ITL ms p50/p99 kvlab", &|p| q(&p.kvlab.tpot_ms)),
            ("llama ", &|p| q(&p.peer.tpot_ms)),
            ("not as solo kvlab (llama)", &|p| {
                format!(
                    "{} ({})",
                    p.kvlab.differs_from_solo, p.peer.differs_from_solo
                )
            }),
        ],
    );
    match (r.goal_output_ratio, r.goal_ttft_p99_no_worse) {
        (Some(ratio), Some(ttft)) => println!(
            "goal at {} streams: output tok/s >= {:.1}x llama-server's ({:.2}x: {}) and TTFT p99 \
             no worse ({})",
            r.goal_streams,
            r.goal_ratio,
            ratio,
            if ratio >= r.goal_ratio {
                "met"
            } else {
                "NOT met"
            },
            if ttft { "met" } else { "NOT met" }
        ),
        _ => println!("goal at {} streams: not run", r.goal_streams),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(out: &Path) -> ServeOpts {
        ServeOpts {
            quick: false,
            model: Some("stories260K".into()),
            requests: Some(2),
            max_tokens: Some(4),
            rates: vec![],
            pairs: None,
            seed: 0,
            out: out.to_path_buf(),
            plots: false,
            notes: vec![],
            machine: "test".into(),
            threads: 1,
            streams: vec![1],
            activations: Activations::F32,
        }
    }

    #[test]
    fn a_missing_llama_server_is_reported_with_the_command_that_builds_it() {
        let dir = tempfile::tempdir().unwrap();
        let rep = run(
            &opts(dir.path()),
            Some(dir.path().join("no-such-llama-server")),
        )
        .unwrap();
        let why = rep.peer_missing.unwrap();
        assert!(
            why.contains("is not a file") && why.contains(BUILD_COMMAND),
            "{why}"
        );
        assert_eq!(rep.peer_version, "missing");
        assert!(rep.points.is_empty() && rep.goal_output_ratio.is_none());
    }

    #[test]
    fn llama_server_gets_the_slots_context_threads_and_port() {
        let sides = Sides {
            kvlab: Path::new("kvlab"),
            peer: Path::new("llama-server"),
            gguf: Path::new("m.gguf"),
            threads: 3,
            num_blocks: 10,
            slots: 64,
            slot_ctx: 256,
            log: PathBuf::from("log"),
            activations: Activations::Q8,
        };
        let args = sides.peer_args(4242).join(" ");
        for flag in [
            "-m m.gguf",
            "-np 64",
            "-c 16384",
            "-cb",
            "-t 3",
            "-tb 3",
            "--port 4242",
        ] {
            assert!(args.contains(flag), "{flag} missing from {args}");
        }
        assert_eq!(sides.kvlab_args().join(" "), "-t 3 -c 256 --activations q8");
    }
}
