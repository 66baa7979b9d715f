//! The llama2.c loader: every malformed file is a typed error, never a panic or an allocation
//! sized by an unchecked header; and a written checkpoint loads back bit for bit.

mod common;

use common::tmp;
use kvlab_model::{Error, SyntheticSpec, llama2c};

fn header(h: [i32; 7]) -> Vec<u8> {
    h.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[test]
fn write_then_load_round_trips_both_classifier_kinds() {
    for shared in [true, false] {
        let mut spec = SyntheticSpec::new(32, 48, 2, 4, 2, 40, 16, 3);
        spec.shared_classifier = shared;
        let m = spec.build().unwrap();
        let p = tmp(&format!("rt-{shared}.bin"));
        llama2c::write(&m, &p).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().len(),
            llama2c::expected_file_bytes(&m.config)
        );
        let back = llama2c::load(&p).unwrap();
        assert_eq!(back.config, m.config);
        assert_eq!(back.weights.layers[1].w2, m.weights.layers[1].w2);
        assert_eq!(back.weights.classifier(), m.weights.classifier());
    }
}

#[test]
fn missing_file() {
    assert!(matches!(
        llama2c::load(&tmp("nope.bin")),
        Err(Error::Open { .. })
    ));
}

#[test]
fn truncated_header_and_truncated_tensors() {
    let p = tmp("short.bin");
    std::fs::write(&p, [1u8, 2, 3]).unwrap();
    assert!(matches!(llama2c::load(&p), Err(Error::Truncated { .. })));
    let mut bytes = header([64, 172, 5, 8, 4, 512, 512]);
    bytes.extend(vec![0u8; 1000]);
    std::fs::write(&p, &bytes).unwrap();
    let e = llama2c::load(&p).unwrap_err();
    assert!(matches!(e, Error::Truncated { .. }), "{e}");
}

#[test]
fn size_mismatch_when_longer_than_the_header_implies() {
    let m = SyntheticSpec::new(16, 24, 1, 2, 2, 10, 8, 1)
        .build()
        .unwrap();
    let p = tmp("long.bin");
    llama2c::write(&m, &p).unwrap();
    let mut bytes = std::fs::read(&p).unwrap();
    bytes.extend([0u8; 4]);
    std::fs::write(&p, &bytes).unwrap();
    assert!(matches!(llama2c::load(&p), Err(Error::SizeMismatch { .. })));
}

#[test]
fn zero_negative_absurd_and_inconsistent_headers() {
    let p = tmp("bad.bin");
    for (h, needle) in [
        ([0, 172, 5, 8, 4, 512, 512], "dim"),
        ([64, -1, 5, 8, 4, 512, 512], "hidden_dim"),
        ([64, 172, 5, 8, 3, 512, 512], "multiple of n_kv_heads"),
        ([64, 172, 5, 6, 3, 512, 512], "not a multiple of n_heads"),
        ([64, 172, 5, 8, 4, 512, 0], "seq_len"),
        ([64, 172, i32::MAX, 8, 4, 512, 512], "absurd"),
        ([1 << 30, 172, 5, 8, 4, 512, 512], "absurd"),
        ([64, 172, 5, 8, 4, i32::MIN + 1, 512], "absurd"),
    ] {
        // Only a header: any allocation from these fields would be enormous.
        std::fs::write(&p, header(h)).unwrap();
        let e = llama2c::load(&p).unwrap_err().to_string();
        assert!(e.contains(needle), "{h:?}: {e}");
    }
}
