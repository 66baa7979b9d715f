//! Fuzz targets run on stable as bounded random-input tests (proptest): the llama2.c loader, the
//! tokenizer loader with encode/decode, and the sampler. Every input must give a value or a
//! typed error, never a panic, a hang or an allocation sized by an unchecked field. Each
//! `proptest!` runs 256 cases by default (`PROPTEST_CASES` raises it for a longer campaign).

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
            let _ = t.decode_all(&ids);
        }
    }

    #[test]
    fn tok512_round_trips_any_text(text in "\\PC{0,200}") {
        let t = common::tok512().expect("tok512.bin is shipped");
        let ids = t.encode(&text, true, false);
        prop_assert!(ids.iter().all(|&i| (i as usize) < t.vocab_size()));
        prop_assert_eq!(t.decode_all(&ids), text);
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
