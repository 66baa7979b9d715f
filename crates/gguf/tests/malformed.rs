//! Malformed and edge-case GGUF files, crafted in memory (or in a temp dir): every one must give
//! the right typed error, and none may panic.

// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;

use common::good;
use kvlab_gguf::{GgmlType, GgufBuilder, GgufError, GgufFile, MetadataArray, MetadataValue};

fn parse(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
    GgufFile::from_bytes(bytes)
}

/// Byte position just after the (length-prefixed) string `s` in `bytes`.
fn after_string(bytes: &[u8], s: &str) -> usize {
    let mut pat = (s.len() as u64).to_le_bytes().to_vec();
    pat.extend_from_slice(s.as_bytes());
    let at = bytes
        .windows(pat.len())
        .position(|w| w == pat.as_slice())
        .unwrap_or_else(|| panic!("{s} not in file"));
    at + pat.len()
}

/// Positions of (n_dims, ne[0], type id, offset) in tensor `name`'s info in `good()`.
fn tensor_fields(name: &str) -> (usize, usize, usize, usize) {
    let bytes = good().build();
    let p = after_string(&bytes, name);
    let n_dims = u32::from_le_bytes(bytes[p..p + 4].try_into().unwrap()) as usize;
    let ty = p + 4 + 8 * n_dims;
    (p, p + 4, ty, ty + 4)
}

/// The error from parsing `good()` with `patch` written over its bytes from `at` on.
fn error_with(at: usize, patch: &[u8]) -> GgufError {
    let mut b = good().build();
    b[at..at + patch.len()].copy_from_slice(patch);
    parse(b).unwrap_err()
}

fn temp_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("kvlab-gguf-test-{}-{tag}.gguf", std::process::id()))
}

#[test]
fn good_file_round_trips() {
    let f = parse(good().build()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    let md = f.metadata();
    assert_eq!(md.architecture().unwrap(), "gemma3");
    assert_eq!(md.get_u32("gemma3.block_count").unwrap(), 2);
    assert_eq!(&md.get_str_array("tokenizer.ggml.tokens").unwrap()[1], "▁a");
    assert_eq!(
        md.get_f32_array("tokenizer.ggml.scores").unwrap(),
        [0.0, -1.5]
    );
    assert_eq!(
        md.get_i32_array("tokenizer.ggml.token_type").unwrap(),
        [3, 1]
    );
    assert_eq!(
        f.tensor_names().collect::<Vec<_>>(),
        ["norm.weight", "w.weight", "q.weight"]
    );
    let w = f.tensor_info("w.weight").unwrap();
    assert_eq!(w.ne, [2, 3]);
    assert_eq!(w.shape(), [3, 2]);
    assert_eq!((w.row_len(), w.n_rows()), (2, 3));
    assert_eq!(w.offset % 32, 0);
    assert_eq!(
        f.dequantize("w.weight").unwrap(),
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    );
    assert_eq!(
        f.dequantize_rows("w.weight", 1..3).unwrap(),
        [3.0, 4.0, 5.0, 6.0]
    );
    assert_eq!(f.dequantize("q.weight").unwrap(), vec![0.5f32; 32]);
    let s = f.summary();
    assert_eq!(
        (s.n_tensors, s.n_elements, s.n_metadata),
        (3, 3 + 6 + 32, 6)
    );
    assert_eq!(s.by_type.len(), 2);
    assert!(s.to_string().contains("Q8_0"), "{s}");
}

#[test]
fn every_metadata_type_round_trips() {
    let values = vec![
        MetadataValue::U8(200),
        MetadataValue::I8(-100),
        MetadataValue::U16(60000),
        MetadataValue::I16(-30000),
        MetadataValue::U32(4_000_000_000),
        MetadataValue::I32(-2_000_000_000),
        MetadataValue::F32(-1.25),
        MetadataValue::Bool(true),
        MetadataValue::String("héllo 日本".into()),
        MetadataValue::U64(u64::MAX),
        MetadataValue::I64(i64::MIN),
        MetadataValue::F64(1e300),
        MetadataValue::Array(MetadataArray::U8(vec![1, 2])),
        MetadataValue::Array(MetadataArray::I8(vec![-1])),
        MetadataValue::Array(MetadataArray::U16(vec![7])),
        MetadataValue::Array(MetadataArray::I16(vec![-7])),
        MetadataValue::Array(MetadataArray::U32(vec![1, 2, 3])),
        MetadataValue::Array(MetadataArray::I32(vec![])),
        MetadataValue::Array(MetadataArray::F32(vec![0.5])),
        MetadataValue::Array(MetadataArray::Bool(vec![true, false])),
        MetadataValue::Array(MetadataArray::String(vec!["", "<0x0A>"].into())),
        MetadataValue::Array(MetadataArray::U64(vec![9])),
        MetadataValue::Array(MetadataArray::I64(vec![-9])),
        MetadataValue::Array(MetadataArray::F64(vec![2.5])),
    ];
    let mut b = GgufBuilder::new();
    for (i, v) in values.iter().enumerate() {
        b = b.kv(&format!("k{i}"), v.clone());
    }
    let f = parse(b.build()).unwrap();
    let got: Vec<MetadataValue> = f.metadata().iter().map(|(_, v)| v.clone()).collect();
    assert_eq!(got, values);
    assert_eq!(f.tensors().len(), 0);
    // Accessors that convert integers check the range.
    assert_eq!(f.metadata().get_u32("k0").unwrap(), 200);
    assert!(f.metadata().get_u32("k9").is_err()); // u64::MAX does not fit u32
    assert_eq!(f.metadata().get_u64("k9").unwrap(), u64::MAX);
    assert_eq!(f.metadata().get_f32("k11").unwrap(), f32::INFINITY); // 1e300 narrowed
}

#[test]
fn version_2_is_read_too() {
    let f = parse(good().version(2).build()).unwrap();
    assert_eq!(f.version(), 2);
    assert_eq!(f.dequantize("norm.weight").unwrap(), [1.0, 2.0, 3.0]);
}

#[test]
fn missing_file_says_where_to_look() {
    let e = GgufFile::open("/definitely/not/here.gguf").unwrap_err();
    assert!(matches!(e, GgufError::NotFound { .. }), "{e}");
    assert!(e.to_string().contains("KVLAB_MODELS"), "{e}");
}

#[test]
fn open_reads_a_file_through_mmap_and_an_empty_file_is_truncated() {
    let p = temp_path("good");
    std::fs::write(&p, good().build()).unwrap();
    let f = GgufFile::open(&p).unwrap();
    assert_eq!(f.path(), Some(p.as_path()));
    assert_eq!(f.dequantize("w.weight").unwrap()[5], 6.0);
    drop(f);
    std::fs::write(&p, b"").unwrap();
    let e = GgufFile::open(&p).unwrap_err();
    assert!(matches!(e, GgufError::Truncated { .. }), "{e}");
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn bad_magic() {
    let mut b = good().build();
    b[..4].copy_from_slice(b"GGML");
    let e = parse(b).unwrap_err();
    assert!(
        matches!(e, GgufError::BadMagic { found } if &found == b"GGML"),
        "{e}"
    );
    let e = parse(b"PK\x03\x04 a zip file".to_vec()).unwrap_err();
    assert!(e.to_string().contains("not a GGUF file"), "{e}");
}

#[test]
fn unsupported_versions() {
    for (v, hint) in [(1u32, "obsolete"), (4, ""), (0x0300_0000, "big-endian")] {
        let e = parse(good().version(v).build()).unwrap_err();
        assert!(
            matches!(e, GgufError::UnsupportedVersion { version, .. } if version == v),
            "{e}"
        );
        assert!(e.to_string().contains(hint), "{e}");
    }
}

#[test]
fn every_truncation_of_the_header_and_data_is_an_error() {
    let full = good().build();
    let f = parse(full.clone()).unwrap();
    let data_end = f.tensors().iter().map(|t| t.file_range.end).max().unwrap() as usize;
    for len in 0..data_end {
        match parse(full[..len].to_vec()) {
            Ok(_) => panic!("a file cut to {len} of {data_end} bytes parsed"),
            Err(GgufError::Truncated { .. } | GgufError::TensorOutOfBounds { .. }) => {}
            Err(e) => panic!("cut to {len}: unexpected error {e}"),
        }
    }
    // Cutting only the padding after the last tensor loses nothing.
    assert!(parse(full[..data_end].to_vec()).is_ok());
}

#[test]
fn cut_tensor_data_reports_out_of_bounds() {
    let full = good().build();
    // q.weight holds 34 bytes padded to 64: cutting 40 cuts into its data.
    let e = parse(full[..full.len() - 40].to_vec()).unwrap_err();
    assert!(
        matches!(e, GgufError::TensorOutOfBounds { ref tensor, .. } if tensor == "q.weight"),
        "{e}"
    );
    assert!(e.to_string().contains("sha256"), "{e}");
}

#[test]
fn huge_counts_are_rejected_before_allocating() {
    // n_tensors (bytes 8..16) and n_kv (16..24).
    for at in [8, 16] {
        for v in [u64::MAX, 1 << 40, 1 << 20] {
            let e = error_with(at, &v.to_le_bytes());
            assert!(
                matches!(e, GgufError::Truncated { .. }),
                "count {v} at {at}: {e}"
            );
        }
    }
    let g = good().build();
    // A string length (the first key's) of u64::MAX.
    let e = error_with(24, &u64::MAX.to_le_bytes());
    assert!(matches!(e, GgufError::Truncated { .. }));
    // An array length of u64::MAX (the scores array: after its key, type 9, elem type 6).
    let p = after_string(&g, "tokenizer.ggml.scores") + 8;
    let e = error_with(p, &u64::MAX.to_le_bytes());
    assert!(matches!(e, GgufError::Truncated { .. }), "{e}");
    // A string-array length that would fit as bytes but not as 8-byte string headers.
    let p = after_string(&g, "tokenizer.ggml.tokens") + 8;
    let remaining = (g.len() - p - 8) as u64;
    let e = error_with(p, &(remaining / 2).to_le_bytes());
    assert!(matches!(e, GgufError::Truncated { .. }));
}

#[test]
fn string_array_elements_are_bounds_and_utf8_checked() {
    let g = good().build();
    // tokenizer.ggml.tokens: after its key, value type 9 (4 bytes), element type 8 (4), count
    // (8), then each element's u64 length and bytes.
    let first = after_string(&g, "tokenizer.ggml.tokens") + 4 + 4 + 8;
    // The first element's length: absurd, or one byte more than the file holds after it. The
    // array's text buffer is sized from these lengths, so they must fail before allocating.
    for len in [u64::MAX, 1 << 40, (g.len() - first - 8 + 1) as u64] {
        let e = error_with(first, &len.to_le_bytes());
        assert!(
            matches!(e, GgufError::Truncated { .. }),
            "length {len}: {e}"
        );
    }
    // Invalid UTF-8 in the second element ("▁a"), after a valid first one.
    let e = error_with(after_string(&g, "<pad>") + 8, &[0xFF]);
    assert!(matches!(e, GgufError::InvalidUtf8 { .. }), "{e}");
}

#[test]
fn unknown_tensor_type() {
    let (_, _, ty, _) = tensor_fields("norm.weight");
    for id in [4u32, 31, 99, u32::MAX] {
        let e = error_with(ty, &id.to_le_bytes());
        assert!(
            matches!(e, GgufError::UnknownTensorType { type_id, .. } if type_id == id),
            "{e}"
        );
    }
}

#[test]
fn known_but_undequantizable_type_parses_and_then_errors() {
    let b = GgufBuilder::new()
        .tensor("iq.weight", &[256], GgmlType::IQ2_XXS, vec![0; 66])
        .build();
    let f = parse(b).unwrap();
    assert_eq!(f.tensor_bytes("iq.weight").unwrap().len(), 66);
    let e = f.dequantize("iq.weight").unwrap_err();
    assert!(matches!(e, GgufError::UnsupportedTensorType { .. }), "{e}");
    assert!(e.to_string().contains("IQ2_XXS"), "{e}");
}

#[test]
fn inconsistent_shapes() {
    // Row length not a multiple of the block size: a Q8_0 tensor with ne[0] = 31.
    let (_, ne0, _, _) = tensor_fields("q.weight");
    let e = error_with(ne0, &31u64.to_le_bytes());
    assert!(matches!(e, GgufError::BadShape { .. }), "{e}");
    assert!(e.to_string().contains("block size 32"), "{e}");

    // Dims whose product overflows int64.
    let b = GgufBuilder::new()
        .tensor("big", &[1 << 32, 1 << 32], GgmlType::F32, vec![])
        .build();
    let e = parse(b).unwrap_err();
    assert!(e.to_string().contains("overflow"), "{e}");
    // ... also when another dim is zero (row counts must not overflow either).
    let b = GgufBuilder::new()
        .tensor("big", &[0, 1 << 40, 1 << 40], GgmlType::F32, vec![])
        .build();
    assert!(matches!(parse(b).unwrap_err(), GgufError::BadShape { .. }));

    // Five dims, and zero dims.
    let (nd, _, _, _) = tensor_fields("norm.weight");
    for n in [5u32, 0] {
        let e = error_with(nd, &n.to_le_bytes());
        assert!(matches!(e, GgufError::BadShape { .. }), "{n} dims: {e}");
    }
}

#[test]
fn zero_element_tensor_is_allowed() {
    let b = GgufBuilder::new()
        .tensor("empty", &[0, 4], GgmlType::F32, vec![])
        .tensor_f32("x", &[1], &[7.0])
        .build();
    let f = parse(b).unwrap();
    assert_eq!(f.dequantize("empty").unwrap(), Vec::<f32>::new());
    assert_eq!(f.dequantize("x").unwrap(), [7.0]);
}

#[test]
fn tensor_out_of_bounds_overlap_and_misalignment() {
    let (_, _, _, off) = tensor_fields("q.weight");
    let offset = |v: u64| error_with(off, &v.to_le_bytes());
    // Offset far past the end.
    let e = offset(1 << 40);
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e}");
    // Offset that overflows u64 when added to the data start.
    let e = offset(u64::MAX - 31);
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e}");
    // Two tensors at the same offset.
    let e = offset(0);
    assert!(matches!(e, GgufError::TensorOverlap { .. }), "{e}");
    // An offset that is not a multiple of the alignment.
    let e = offset(33);
    assert!(
        matches!(
            e,
            GgufError::MisalignedTensor {
                offset: 33,
                alignment: 32,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn custom_and_bad_alignment() {
    let f = parse(
        good()
            .kv("general.alignment", MetadataValue::U32(64))
            .build(),
    )
    .unwrap();
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_start() % 64, 0);
    assert!(f.tensors().iter().all(|t| t.offset % 64 == 0));
    assert_eq!(f.dequantize("w.weight").unwrap()[0], 1.0);

    for v in [
        MetadataValue::U32(0),
        MetadataValue::U32(48),
        MetadataValue::U64(32),
        MetadataValue::String("32".into()),
    ] {
        let b = GgufBuilder::new()
            .kv("general.alignment", v.clone())
            .build();
        let e = parse(b).unwrap_err();
        assert!(matches!(e, GgufError::BadAlignment { .. }), "{v:?}: {e}");
    }
}

#[test]
fn duplicates() {
    let b = good()
        .kv("gemma3.block_count", MetadataValue::U32(3))
        .build();
    let e = parse(b).unwrap_err();
    assert!(matches!(e, GgufError::DuplicateKey { ref key } if key == "gemma3.block_count"));
    let b = good().tensor_f32("w.weight", &[1], &[0.0]).build();
    let e = parse(b).unwrap_err();
    assert!(matches!(e, GgufError::DuplicateTensor { ref name } if name == "w.weight"));
}

#[test]
fn bad_metadata_values() {
    let g = good().build();
    // A value type id outside the table.
    let e = error_with(after_string(&g, "gemma3.block_count"), &13u32.to_le_bytes());
    assert!(matches!(e, GgufError::BadMetadataValue { .. }), "{e}");
    // An array of arrays.
    let p = after_string(&g, "tokenizer.ggml.scores") + 4;
    let e = error_with(p, &9u32.to_le_bytes());
    assert!(e.to_string().contains("arrays of arrays"), "{e}");
    // Invalid UTF-8 in a key.
    let e = error_with(after_string(&g, "general.architecture") - 1, &[0xFF]);
    assert!(matches!(e, GgufError::InvalidUtf8 { .. }), "{e}");
}

#[test]
fn missing_key_wrong_type_missing_tensor_and_bad_rows() {
    let f = parse(good().build()).unwrap();
    let md = f.metadata();
    assert!(matches!(
        md.get_u32("gemma3.context_length").unwrap_err(),
        GgufError::MissingKey { .. }
    ));
    assert!(matches!(
        md.get_str("gemma3.block_count").unwrap_err(),
        GgufError::WrongType {
            expected: "string",
            ..
        }
    ));
    assert!(matches!(
        md.get_f32_array("tokenizer.ggml.token_type").unwrap_err(),
        GgufError::WrongType { .. }
    ));
    assert_eq!(md.opt_u32("gemma3.attention.sliding_window").unwrap(), None);
    let e = f.dequantize("output.weight").unwrap_err();
    assert!(matches!(e, GgufError::MissingTensor { .. }), "{e}");
    assert!(f.tensor_info("nope").is_err());
    let e = f.dequantize_rows("w.weight", 2..4).unwrap_err();
    assert!(
        matches!(e, GgufError::RowOutOfRange { n_rows: 3, .. }),
        "{e}"
    );
    let mut small = [0f32; 1];
    let e = f
        .dequantize_rows_into("w.weight", 0..1, &mut small)
        .unwrap_err();
    assert!(matches!(e, GgufError::BadShape { .. }), "{e}");
}

/// Random byte corruption of a valid file never panics (xorshift, fixed seed).
#[test]
fn random_corruption_never_panics() {
    let full = good().build();
    let header_len = parse(full.clone()).unwrap().data_start() as usize;
    let mut s: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut n_ok = 0;
    for _ in 0..3000 {
        let mut b = full.clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() as usize) % header_len;
            b[at] = match next() % 3 {
                0 => next() as u8,
                1 => 0xFF,
                _ => 0,
            };
        }
        let cut = if next() % 4 == 0 {
            (next() as usize) % b.len()
        } else {
            b.len()
        };
        b.truncate(cut);
        if let Ok(f) = parse(b) {
            n_ok += 1;
            for t in f.tensors() {
                let _ = f.dequantize(&t.name);
            }
            let _ = f.summary().to_string();
        }
    }
    assert!(n_ok < 3000);
}
