//! The GGUF reader as a fuzz target on stable: random bytes and valid files with bytes
//! overwritten or cut short must open to a value or a typed error, and every tensor of a file
//! that opens must dequantize or fail with a typed error, never panic. 256 cases per property by
//! default (`PROPTEST_CASES` raises it).

use kvlab_gguf::{GgmlType, GgufBuilder, GgufFile, MetadataArray, MetadataValue};
use proptest::prelude::*;

/// A small valid file: metadata of several types, F32 tensors and one Q8_0 block.
fn valid() -> Vec<u8> {
    let mut q8 = vec![0x00, 0x38]; // f16 0.5
    q8.extend(std::iter::repeat_n(3u8, 32));
    GgufBuilder::new()
        .kv(
            "general.architecture",
            MetadataValue::String("gemma3".into()),
        )
        .kv("gemma3.block_count", MetadataValue::U32(2))
        .kv(
            "tokenizer.ggml.tokens",
            MetadataValue::Array(MetadataArray::String(vec!["<pad>".into(), "▁a".into()])),
        )
        .kv(
            "tokenizer.ggml.scores",
            MetadataValue::Array(MetadataArray::F32(vec![0.0, -1.5])),
        )
        .tensor_f32("norm.weight", &[3], &[1.0, 2.0, 3.0])
        .tensor_f32("w.weight", &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        .tensor("q.weight", &[32], GgmlType::Q8_0, q8)
        .build()
}

fn exercise(bytes: Vec<u8>) {
    if let Ok(f) = GgufFile::from_bytes(bytes) {
        let _ = f.summary();
        let names: Vec<String> = f.tensor_names().map(str::to_owned).collect();
        for n in names {
            let _ = f.dequantize(&n);
            let _ = f.dequantize_rows(&n, 0..1);
        }
    }
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        exercise(bytes);
    }

    #[test]
    fn valid_files_with_bytes_overwritten_or_cut_never_panic(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut b = valid();
        for (i, v) in edits {
            let at = i.index(b.len());
            b[at] = v;
        }
        let len = cut.index(b.len() + 1);
        b.truncate(len);
        exercise(b);
    }
}

#[test]
fn the_valid_file_opens() {
    let f = GgufFile::from_bytes(valid()).unwrap();
    assert_eq!(
        f.dequantize("w.weight").unwrap(),
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    );
}
