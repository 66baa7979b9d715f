//! Hugging Face folders: the safetensors header (its 8-byte length, then JSON naming every
//! tensor's dtype, shape and byte range), `config.json` and `tokenizer.json`. On any bytes in
//! one of them, `hf::read_hf_config` (what `kvlab info` runs) and `hf::load_hf_dir` give a value
//! or a typed error, never a panic or an allocation sized by an unchecked field; a tokenizer
//! that loads encodes and decodes. The stable twin is `hf_folder_loader_never_panics` in
//! crates/model/tests/fuzz.rs.
//!
//! The first input byte picks the file, taken from the shipped tiny-qwen2 folder (biases,
//! byte-level BPE, tied embeddings): (0) `model.safetensors`'s header and the first tensor
//! bytes, (1) `config.json`, (2) `tokenizer.json`; the rest of the input mutates it (1–8 bytes
//! overwritten, maybe cut or extended), or, when the second byte says so, replaces it outright.

#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use kvlab_fuzz::{mutate, tmp};
use kvlab_model::hf::{load_hf_dir, read_hf_config};
use libfuzzer_sys::arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;

const FILES: [&str; 4] = [
    "model.safetensors",
    "config.json",
    "tokenizer.json",
    "generation_config.json",
];

/// The tiny-qwen2 folder's files, read once.
fn folder() -> &'static [Vec<u8>; 4] {
    static FILES_READ: OnceLock<[Vec<u8>; 4]> = OnceLock::new();
    FILES_READ.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/models/tiny-qwen2");
        FILES.map(|f| std::fs::read(dir.join(f)).expect("the shipped tiny-qwen2 folder"))
    })
}

fn scratch() -> PathBuf {
    let dir = tmp("hf-folder");
    std::fs::create_dir_all(&dir).expect("temp folder");
    dir
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let which = u.int_in_range(0..=2u8).unwrap_or(0) as usize;
    let replace = u.arbitrary::<bool>().unwrap_or(false);
    let files = folder();
    let bytes = &files[which];
    let changed = if replace {
        u.take_rest().to_vec()
    } else if which == 0 {
        // Mutate the header (and the first tensor bytes), not the weights.
        let header = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize + 64;
        let head = header.min(bytes.len());
        let mut b = mutate(&bytes[..head], &mut u);
        b.extend_from_slice(&bytes[head..]);
        b
    } else {
        mutate(bytes, &mut u)
    };
    let dir = scratch();
    for (i, (name, good)) in FILES.iter().zip(files).enumerate() {
        let out = if i == which { &changed } else { good };
        std::fs::write(dir.join(name), out).expect("temp file");
    }
    let _ = read_hf_config(&dir);
    if let Ok((model, tok, _)) = load_hf_dir(&dir) {
        assert_eq!(
            model.weights.token_embedding.len(),
            model.config.vocab_size * model.config.dim
        );
        let ids = tok.encode_special("<|im_start|>user\nhi 123<|im_end|>", true, true);
        let _ = tok.decode_all(&ids);
    }
});
