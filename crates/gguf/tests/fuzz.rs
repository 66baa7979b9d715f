//! The GGUF reader as a fuzz target on stable: random bytes and valid files with bytes
//! overwritten or cut short must open to a value or a typed error, and every tensor of a file
//! that opens must dequantize or fail with a typed error, never panic. 256 cases per property by
//! default (`PROPTEST_CASES` raises it).

mod common;

use common::good;
use kvlab_gguf::GgufFile;
use proptest::prelude::*;

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
        let mut b = good().build();
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
    let f = GgufFile::from_bytes(good().build()).unwrap();
    assert_eq!(
        f.dequantize("w.weight").unwrap(),
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    );
}
