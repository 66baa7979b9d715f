//! Fuzz targets run on stable as bounded random-input tests (proptest): the llama2.c loader, the
//! Hugging Face folder loader (safetensors header, config.json, tokenizer.json), byte-level GGUF
//! vocabularies, the tokenizer loader with encode/decode, and the sampler. Every input must give a value or a
//! typed error, never a panic, a hang or an allocation sized by an unchecked field. Each
//! `proptest!` runs 256 cases by default (`PROPTEST_CASES` raises it for a longer campaign).

// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

mod common;

use common::tmp;
use kvlab_model::{Sampler, Tokenizer, llama2c};
use proptest::prelude::*;

/// A llama2.c header of small random fields (some zero or negative) and a body whose length is
/// right, short or long by a little.
fn checkpoint() -> impl Strategy<Value = Vec<u8>> {
    (prop::array::uniform7(-2i32..40), -64i64..64, any::<u64>()).prop_map(|(h, slack, seed)| {
        let mut bytes: Vec<u8> = h.iter().flat_map(|v| v.to_le_bytes()).collect();
        let body = h
            .iter()
            .map(|&v| v.unsigned_abs() as i64)
            .product::<i64>()
            .min(1 << 16)
            + slack;
        bytes.extend((0..body.max(0)).map(|i| (seed >> (i % 64)) as u8));
        bytes
    })
}

/// A valid tiny checkpoint with a few bytes overwritten (header fields, weights, or the end).
fn mutated_checkpoint() -> impl Strategy<Value = Vec<u8>> {
    let spec = kvlab_model::SyntheticSpec::new(16, 24, 2, 4, 2, 32, 8, 1);
    let p = tmp("valid.bin");
    llama2c::write(&spec.build().unwrap(), &p).unwrap();
    let valid = std::fs::read(&p).unwrap();
    let n = valid.len();
    (prop::collection::vec((0..n, any::<u8>()), 1..8), 0..n + 8).prop_map(move |(edits, len)| {
        let mut b = valid.clone();
        for (i, v) in edits {
            b[i] = v;
        }
        b.resize(len, 0);
        b
    })
}

proptest! {
    #[test]
    fn llama2c_loader_never_panics(bytes in prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        checkpoint(),
        mutated_checkpoint(),
    ]) {
        let p = tmp("fuzz.bin");
        std::fs::write(&p, &bytes).unwrap();
        if let Ok(m) = llama2c::load(&p) {
            prop_assert_eq!(llama2c::expected_file_bytes(&m.config), bytes.len() as u64);
        }
        let _ = llama2c::read_config(&p);
    }

    #[test]
    fn tokenizer_loader_and_codec_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..512),
        vocab in 0usize..64,
        text in "\\PC{0,40}",
    ) {
        let p = tmp("fuzz-tok.bin");
        std::fs::write(&p, &bytes).unwrap();
        if let Ok(t) = Tokenizer::load_llama2c(&p, vocab) {
            let ids = t.encode(&text, true, true);
            let _ = t.decode_all(&ids, false);
        }
    }

    #[test]
    fn tok512_round_trips_any_text(text in "\\PC{0,200}") {
        let t = common::tok512().expect("tok512.bin is shipped");
        let ids = t.encode(&text, true, false);
        prop_assert!(ids.iter().all(|&i| (i as usize) < t.vocab_size()));
        prop_assert_eq!(t.decode_all(&ids, false), text);
    }

    #[test]
    fn sampler_never_panics_and_picks_a_token_or_names_the_bad_logit(
        logits in prop::collection::vec(
            prop_oneof![any::<f32>(), -50f32..50.0, Just(f32::NAN), Just(f32::INFINITY)],
            1..64,
        ),
        temperature in prop_oneof![Just(0.0f32), 0.001f32..100.0, any::<f32>()],
        top_p in prop_oneof![Just(1.0f32), 0.0001f32..1.0, any::<f32>()],
        seed in any::<u64>(),
    ) {
        let Ok(mut s) = Sampler::new(temperature, top_p, seed) else {
            return Ok(());
        };
        let finite = logits.iter().all(|v| v.is_finite());
        match s.sample(&mut logits.clone()) {
            Ok(id) => prop_assert!(finite && (id as usize) < logits.len()),
            Err(e) => prop_assert!(!finite && !logits[e.index].is_finite()),
        }
    }
}

/// The files of the shipped tiny-qwen2 folder, in [`HF_FILES`] order.
const HF_FILES: [&str; 4] = [
    "model.safetensors",
    "config.json",
    "tokenizer.json",
    "generation_config.json",
];

fn hf_folder_files() -> Vec<Vec<u8>> {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/tiny-qwen2");
    HF_FILES
        .iter()
        .map(|f| std::fs::read(dir.join(f)).unwrap())
        .collect()
}

/// One of the folder's first three files with 1–8 bytes overwritten (for the safetensors
/// file, within its header and the first tensor bytes) or cut: (file index, its new bytes).
fn mutated_hf_file() -> impl Strategy<Value = (usize, Vec<u8>)> {
    let files = hf_folder_files();
    (0usize..3).prop_flat_map(move |which| {
        let bytes = files[which].clone();
        let span = if which == 0 {
            let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            (8 + header + 64).min(bytes.len())
        } else {
            bytes.len()
        };
        (
            prop::collection::vec((0..span, any::<u8>()), 1..8),
            prop::option::of(0..span),
        )
            .prop_map(move |(edits, cut)| {
                let mut b = bytes.clone();
                for (i, v) in edits {
                    b[i] = v;
                }
                if let Some(len) = cut {
                    b.truncate(len);
                }
                (which, b)
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The stable twin of fuzz/fuzz_targets/hf_folder.rs: a Hugging Face folder with a corrupt
    /// safetensors header, config.json or tokenizer.json is a typed error, never a panic.
    #[test]
    fn hf_folder_loader_never_panics((which, bytes) in mutated_hf_file()) {
        let dir = tmp("hf-fuzz");
        std::fs::create_dir_all(&dir).unwrap();
        for (i, (name, good)) in HF_FILES.iter().zip(hf_folder_files()).enumerate() {
            std::fs::write(dir.join(name), if i == which { &bytes } else { &good }).unwrap();
        }
        let _ = kvlab_model::hf::read_hf_config(&dir);
        if let Ok((m, tok, _)) = kvlab_model::hf::load_hf_dir(&dir) {
            prop_assert_eq!(m.weights.token_embedding.len(), m.config.vocab_size * m.config.dim);
            let ids = tok.encode_special("<|im_start|>user\nhi 123<|im_end|>", true, true);
            let _ = tok.decode_all(&ids, false);
        }
    }

    /// tiny-qwen2.gguf with its header (metadata, the byte-level vocabulary and its merges)
    /// mutated: the GGUF config, tokenizer and loader give a value or a typed error.
    #[test]
    fn byte_level_gguf_vocabularies_never_panic(
        edits in prop::collection::vec((0usize..(64 << 10), any::<u8>()), 1..8),
    ) {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/models/tiny-qwen2.gguf");
        let mut b = std::fs::read(p).unwrap();
        for (i, v) in edits {
            let i = i % b.len();
            b[i] = v;
        }
        let f = tmp("fuzz-qwen2.gguf");
        std::fs::write(&f, &b).unwrap();
        if let Ok(header) = kvlab_model::gguf_model::read_gguf_config(&f)
            && let Ok((m, tok)) = kvlab_model::load_gguf(&f)
        {
            prop_assert_eq!(header, m.config);
            let ids = tok.encode("hi 123 <|im_end|>", true, true);
            let _ = tok.decode_all(&ids, false);
        }
    }
}
