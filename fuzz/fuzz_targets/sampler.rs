//! The sampler on any logits and any settings: `Sampler::new` and the `with_*` settings reject
//! values out of range with a typed error; a sampler that was built picks a token inside the
//! vocabulary when every logit is finite, and otherwise names a logit that is NaN or infinite.
//! Never a panic. The property of
//! `sampler_never_panics_and_picks_a_token_or_names_the_bad_logit` in
//! crates/model/tests/fuzz.rs, here with top-k, min-p, the repeat penalty and several steps too.

#![no_main]

use kvlab_model::Sampler;
use libfuzzer_sys::arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;

/// A float that is either one of the edge cases the CLI must handle (NaN, ±inf, 0, 1, tiny,
/// negative, just out of range) or any bit pattern.
fn float(u: &mut Unstructured<'_>) -> f32 {
    const EDGES: [f32; 12] = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1.0,
        -1.0,
        1e-38,
        0.5,
        1.5,
        100.0,
        f32::MAX,
    ];
    match u.int_in_range(0..=EDGES.len()).unwrap_or(0) {
        i if i < EDGES.len() => EDGES[i],
        _ => f32::from_bits(u.arbitrary().unwrap_or(0)),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let temperature = float(&mut u);
    let top_p = float(&mut u);
    let min_p = float(&mut u);
    let penalty = float(&mut u);
    let top_k = u.int_in_range(0..=80usize).unwrap_or(0);
    let seed: u64 = u.arbitrary().unwrap_or(0);
    let steps = u.int_in_range(1..=4u8).unwrap_or(1);
    let n_logits = u.int_in_range(1..=64usize).unwrap_or(1);
    let logits: Vec<f32> = (0..n_logits).map(|_| float(&mut u)).collect();
    let recent = u.int_in_range(0..=70usize).unwrap_or(0);

    let Ok(s) = Sampler::new(temperature, top_p, seed) else {
        return;
    };
    let Ok(s) = s.with_top_k(top_k).with_min_p(min_p) else {
        return;
    };
    let Ok(mut s) = s.with_repeat_penalty(penalty) else {
        return;
    };
    for _ in 0..recent {
        s.accept(u.int_in_range(0..=n_logits as u32 + 2).unwrap_or(0));
    }
    let finite = logits.iter().all(|v| v.is_finite());
    for _ in 0..steps {
        match s.sample(&mut logits.clone()) {
            Ok(id) => {
                assert!(finite, "a token from non-finite logits {logits:?}");
                assert!(
                    (id as usize) < logits.len(),
                    "token {id} of {}",
                    logits.len()
                );
                s.accept(id);
            }
            Err(e) => {
                assert!(!finite, "an error for finite logits: {e:?}");
                assert!(!logits[e.index].is_finite(), "{e:?} names a finite logit");
            }
        }
    }
});
