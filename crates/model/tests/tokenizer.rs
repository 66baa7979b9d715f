//! The llama2.c tokenizer against run.c's known encodings.

mod common;

use common::tok512;
use kvlab_model::Tokenizer;

#[test]
fn once_upon_a_time_encodes_as_run_c_does() {
    let Some(t) = tok512() else { return };
    // llama2.c run.c (temperature 0) encodes this prompt to 1 403 407 261 378.
    assert_eq!(
        t.encode("Once upon a time", true, false),
        vec![1, 403, 407, 261, 378]
    );
    assert_eq!(
        t.encode("Once upon a time", false, true),
        vec![403, 407, 261, 378, 2]
    );
}

#[test]
fn empty_text_is_just_bos() {
    let Some(t) = tok512() else { return };
    assert_eq!(t.encode("", true, false), vec![1]);
    assert_eq!(t.encode("", false, false), Vec::<u32>::new());
}

#[test]
fn non_ascii_falls_back_to_byte_tokens() {
    let Some(t) = tok512() else { return };
    // tok512 has no emoji: each UTF-8 byte b becomes token b + 3.
    let ids = t.encode("🌞", false, false);
    let bytes: Vec<u32> = "🌞".bytes().map(|b| b as u32 + 3).collect();
    assert!(
        ids.ends_with(&bytes),
        "{ids:?} should end with the byte tokens {bytes:?}"
    );
    assert_eq!(t.decode_all(&t.encode("🌞", true, false), false), "🌞");
}

#[test]
fn round_trip_restores_the_text() {
    let Some(t) = tok512() else { return };
    for text in [
        "Once upon a time, there was a little girl named Lily.",
        "Café déjà vu 日本語 🎈!",
        "a\nb\tc  d",
        "1 2 3",
    ] {
        let ids = t.encode(text, true, false);
        assert_eq!(t.decode_all(&ids, false), text, "ids {ids:?}");
    }
}

#[test]
fn decode_drops_the_space_after_bos_only() {
    let Some(t) = tok512() else { return };
    let ids = t.encode("Once upon", true, false);
    assert_eq!(t.decode(1, ids[1], false), b"Once");
    assert_eq!(t.decode(ids[1], ids[2], false), b" upon");
}

#[test]
#[ignore = "needs tokenizer.bin (the Llama 2 vocabulary): set KVLAB_MODELS"]
fn llama2_vocab_encodes_like_run_c() {
    let Some(p) = common::model_file("tokenizer.bin") else {
        return;
    };
    let t = Tokenizer::load_llama2c(&p, 32000).unwrap();
    // run.c with tokenizer.bin: "Once upon a time" → 1 9038 2501 263 931 (Llama 2 SentencePiece).
    assert_eq!(
        t.encode("Once upon a time", true, false),
        vec![1, 9038, 2501, 263, 931]
    );
    assert_eq!(
        t.decode_all(&t.encode("naïve café ☕", true, false), false),
        "naïve café ☕"
    );
}

#[test]
fn bad_tokenizer_files_are_errors_not_panics() {
    let p = common::tmp("bad.bin");
    // max_token_length 4, one token of length 10.
    let mut b = 4i32.to_le_bytes().to_vec();
    b.extend(0f32.to_le_bytes());
    b.extend(10i32.to_le_bytes());
    std::fs::write(&p, &b).unwrap();
    assert!(
        Tokenizer::load_llama2c(&p, 1)
            .unwrap_err()
            .to_string()
            .contains("length 10")
    );
    // Too many tokens for the file.
    assert!(Tokenizer::load_llama2c(&p, 1000).is_err());
    // Truncated.
    std::fs::write(&p, &b[..6]).unwrap();
    assert!(Tokenizer::load_llama2c(&p, 1).is_err());
    assert!(Tokenizer::load_llama2c(&common::tmp("missing.bin"), 1).is_err());
}
