//! The llama2.c checkpoint loader on any file: `llama2c::load` and `llama2c::read_config` must
//! return a model or a typed error, never panic or allocate from an unchecked header field, and a
//! model that loads must come from a file of exactly the size its header implies. The same
//! property as `llama2c_loader_never_panics` in crates/model/tests/fuzz.rs.
//!
//! The first input byte picks how the rest becomes a file: (0) the bytes as they are; (1) a
//! header of small fields (some zero or negative) and a body of the size that header implies,
//! give or take 64 bytes; (2) a valid tiny checkpoint with a few bytes overwritten or the end
//! moved.

#![no_main]

use std::sync::OnceLock;

use kvlab_fuzz::{mutate, tmp};
use kvlab_model::{SyntheticSpec, llama2c};
use libfuzzer_sys::arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;

/// A valid checkpoint (dim 16, 2 layers, vocab 32), written once per process.
fn valid() -> &'static [u8] {
    static VALID: OnceLock<Vec<u8>> = OnceLock::new();
    VALID.get_or_init(|| {
        let spec = SyntheticSpec::new(16, 24, 2, 4, 2, 32, 8, 1);
        let p = tmp("valid.bin");
        llama2c::write(&spec.build().expect("a valid spec"), &p).expect("temp file");
        std::fs::read(&p).expect("temp file")
    })
}

/// A header of fields in -2..40 and a body sized from it.
fn checkpoint(u: &mut Unstructured<'_>) -> Vec<u8> {
    let mut h = [0i32; 7];
    for v in &mut h {
        *v = u.int_in_range(-2..=39).unwrap_or(0);
    }
    let slack = u.int_in_range(-64i64..=63).unwrap_or(0);
    let body = match llama2c::parse_header(h) {
        Ok(c) => llama2c::expected_file_bytes(&c) as i64 - 28,
        Err(_) => h
            .iter()
            .map(|&v| i64::from(v.unsigned_abs()))
            .product::<i64>(),
    }
    .min(1 << 18)
        + slack;
    let left = u.len();
    let fill = u.bytes(left).unwrap_or(&[]);
    let mut bytes: Vec<u8> = h.iter().flat_map(|v| v.to_le_bytes()).collect();
    bytes.extend(
        (0..body.max(0) as usize).map(|i| fill.get(i % fill.len().max(1)).map_or(0, |b| *b)),
    );
    bytes
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let bytes = match u.int_in_range(0..=2u8).unwrap_or(0) {
        0 => u.take_rest().to_vec(),
        1 => checkpoint(&mut u),
        _ => mutate(valid(), &mut u),
    };
    let p = tmp("fuzz.bin");
    std::fs::write(&p, &bytes).expect("temp file");
    if let Ok(m) = llama2c::load(&p) {
        assert_eq!(llama2c::expected_file_bytes(&m.config), bytes.len() as u64);
    }
    let _ = llama2c::read_config(&p);
});
