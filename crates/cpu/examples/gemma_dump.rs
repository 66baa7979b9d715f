//! Dumps kvlab's Gemma 3 logits for every case of fixtures/gemma3/greedy.json as JSON on stdout,
//! for scripts/gemma_hf_reference.py --compare-kvlab (the f32 oracle from Hugging Face).
//!
//!     KVLAB_MODELS=/path/to/models cargo run --release -p kvlab-cpu --example gemma_dump -- \
//!         [fixtures/gemma3/hf_f32.json] [--raw DIR] > /tmp/kvlab_dump.json
//!
//! Per case: step-0 top-10 (id, logit) and, for prompt00/prompt02, the first 64 step-0 logits;
//! free-running greedy ids (argmax, ties to the lowest id), second ids and margins; teacher-forced
//! on llama.cpp's ids: kvlab's argmax and logit(llama id) − logit(llama second) at each step.
//! With the HF fixture: kvlab's step-0 logits of HF's step-0 top-10 ids, and teacher-forced on
//! HF's ids: kvlab's argmax and logit(hf id) − logit(hf second) at each step. With --raw DIR, each
//! case's full step-0 logits as little-endian f32 in DIR/NAME.f32.

// An example may unwrap: it is run by hand, and a panic says where it stopped.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use kvlab_model::Engine;
use serde_json::{Value, json};

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// (best, second) with ties to the lowest id.
fn top2(l: &[f32]) -> (usize, usize) {
    let mut best = 0;
    for i in 1..l.len() {
        if l[i] > l[best] {
            best = i;
        }
    }
    let mut second = if best == 0 { 1 } else { 0 };
    for i in 0..l.len() {
        if i != best && l[i] > l[second] {
            second = i;
        }
    }
    (best, second)
}

fn top10(l: &[f32]) -> Vec<(usize, f32)> {
    let mut idx: Vec<usize> = (0..l.len()).collect();
    idx.sort_by(|&a, &b| l[b].partial_cmp(&l[a]).unwrap().then(a.cmp(&b)));
    idx.into_iter().take(10).map(|i| (i, l[i])).collect()
}

/// Teacher-forced run: prompt, then `forced` one at a time; logits before each forced token.
fn forced_steps(
    model: &Arc<kvlab_model::Model>,
    prompt: &[u32],
    forced: &[u32],
    mut f: impl FnMut(usize, &[f32]),
) {
    let mut e = kvlab_cpu::CpuEngine::new(model.clone());
    let s = e.new_sequence(prompt.len() + forced.len() + 1).unwrap();
    let mut l = e.prefill(s, prompt).unwrap();
    for (i, &t) in forced.iter().enumerate() {
        f(i, &l);
        if i + 1 < forced.len() {
            l = e.decode(s, t).unwrap();
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut hf_path = None;
    let mut raw_dir = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--raw" {
            raw_dir = Some(std::path::PathBuf::from(it.next().expect("--raw DIR")));
        } else {
            hf_path = Some(a.clone());
        }
    }
    let hf: Option<Value> =
        hf_path.map(|p| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap());
    let path = std::path::PathBuf::from(std::env::var("KVLAB_MODELS").unwrap())
        .join("gemma-3-270m-q4_k_m.gguf");
    let (model, _) = kvlab_model::load_gguf(&path).unwrap();
    let model = Arc::new(model);
    let fx: Value =
        serde_json::from_str(include_str!("../../../fixtures/gemma3/greedy.json")).unwrap();
    let eos = fx["eos_id"].as_u64().unwrap() as usize;
    let mut out_cases = Vec::new();
    for case in fx["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let prompt = ids(&case["prompt_ids"]);
        let n_gen = case["n_gen"].as_u64().unwrap() as usize;
        let hf_case = hf.as_ref().and_then(|h| {
            h["cases"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == name)
        });

        // Free-running greedy.
        let mut e = kvlab_cpu::CpuEngine::new(model.clone());
        let s = e.new_sequence(prompt.len() + n_gen + 1).unwrap();
        let mut l = e.prefill(s, &prompt).unwrap();
        let step0 = l.clone();
        let (mut generated, mut second, mut margins) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..n_gen {
            let (b, s2) = top2(&l);
            generated.push(b);
            second.push(s2);
            margins.push(l[b] - l[s2]);
            if b == eos || i + 1 == n_gen {
                break;
            }
            l = e.decode(s, b as u32).unwrap();
        }
        let mut c = json!({
            "name": name,
            "generated_ids": generated,
            "second_ids": second,
            "margins": margins,
            "step0_top10": top10(&step0),
        });
        if name == "prompt00" || name == "prompt02" {
            c["step0_logits_head"] = json!(step0[..64].to_vec());
            c["step0_max_abs_logit"] = json!(step0.iter().fold(0.0f32, |m, v| m.max(v.abs())));
        }
        if let Some(dir) = &raw_dir {
            let p = dir.join(format!("{name}.f32"));
            let bytes: Vec<u8> = step0.iter().flat_map(|v| v.to_le_bytes()).collect();
            std::fs::write(&p, bytes).unwrap();
            c["step0_raw"] = json!(p.to_str().unwrap());
        }

        // Teacher-forced on llama.cpp's ids.
        let ll = ids(&case["generated_ids"]);
        let ll2 = ids(&case["second_ids"]);
        let (mut am, mut mg) = (Vec::new(), Vec::new());
        forced_steps(&model, &prompt, &ll, |i, l| {
            am.push(top2(l).0);
            mg.push(l[ll[i] as usize] - l[ll2[i] as usize]);
        });
        c["tf_llama"] = json!({"argmax": am, "margin_llama_pair": mg});

        if let Some(h) = hf_case {
            let top: Vec<usize> = h["steps01"][0]["top10"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p[0].as_u64().unwrap() as usize)
                .collect();
            c["step0_at_hf_top10"] = json!(top.iter().map(|&i| (i, step0[i])).collect::<Vec<_>>());
            let hg = ids(&h["generated_ids"]);
            let hs = ids(&h["second_ids"]);
            let (mut am, mut mg) = (Vec::new(), Vec::new());
            forced_steps(&model, &prompt, &hg, |i, l| {
                am.push(top2(l).0);
                mg.push(l[hg[i] as usize] - l[hs[i] as usize]);
            });
            c["tf_hf"] = json!({"argmax": am, "margin_hf_pair": mg});
        }
        eprintln!("{name}: done");
        out_cases.push(c);
    }
    println!(
        "{}",
        serde_json::to_string(
            &json!({"format_version": 1, "engine": "kvlab-cpu CpuEngine (f32)", "cases": out_cases})
        )
        .unwrap()
    );
}
