//! Tokenizer encode at 1k, 10k and 100k characters: BPE merges through a priority queue
//! (kvlab-model's `Tokenizer::encode`), so time grows near-linearly with the text. Throughput:
//! tokens produced per second (criterion's elements/s); the ids are checked against a second
//! encode of the same text before anything is timed. Measured on the shared 2-core machine
//! (2026-11-23, pieces in one arena with a table of ids): 100k characters in about 19 ms
//! (tok512) and 40 ms (Gemma 3; 30 and 65 ms with a map of owned pieces), where issue 13 measured the
//! rescanning BPE at 7.6 s for 25k characters.
//!
//! * `tok512/encode`: llama2.c's 512-token vocabulary (shipped in fixtures/models/);
//! * `gemma3/encode`: Gemma 3's 262,144-token vocabulary, when gemma-3-270m-q4_k_m.gguf is
//!   found where the CLI looks (`KVLAB_MODELS`, the user cache); left out otherwise.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvlab_model::Tokenizer;
use kvlab_model::registry;

const SIZES: [usize; 3] = [1_000, 10_000, 100_000];

/// `n` characters of TinyStories-like prose.
fn text(n: usize) -> String {
    const PARA: &str = "Once upon a time, there was a little girl named Lily. She loved to play \
                        outside in the park. One day, she saw a big, red ball. She wanted to play \
                        with it, but it was too high. Her mom said, \"Let's ask the tall man for \
                        help!\" ";
    PARA.chars().cycle().take(n).collect()
}

fn tokenizers() -> Vec<(&'static str, Tokenizer)> {
    let mut v = Vec::new();
    let file = |name: &str| {
        registry::entry(name)
            .and_then(|e| e.model.as_ref().or(e.tokenizer.as_ref()))
            .and_then(registry::find_file)
    };
    if let Some(tok) = registry::entry("stories260K")
        .and_then(|e| e.tokenizer.as_ref())
        .and_then(registry::find_file)
    {
        v.push((
            "tok512",
            Tokenizer::load_llama2c(&tok, 512).expect("tok512.bin loads"),
        ));
    }
    if let Some(gguf) = file("gemma-3-270m") {
        let f = kvlab_gguf::GgufFile::open(&gguf).expect("the Gemma GGUF opens");
        v.push((
            "gemma3",
            kvlab_model::tokenizer::tokenizer_from_gguf(&f, &gguf).expect("Gemma's tokenizer"),
        ));
    } else {
        eprintln!("gemma3/encode left out: gemma-3-270m-q4_k_m.gguf not found (set KVLAB_MODELS)");
    }
    v
}

fn bench(c: &mut Criterion) {
    for (name, tok) in tokenizers() {
        let mut g = c.benchmark_group(format!("{name}/encode"));
        g.sample_size(10);
        for n in SIZES {
            let t = text(n);
            let ids = tok.encode(&t, true, false);
            assert_eq!(ids, tok.encode(&t, true, false), "encode is deterministic");
            assert!(
                ids.len() > n / 20,
                "{name}: {n} chars gave {} ids",
                ids.len()
            );
            g.throughput(Throughput::Elements(ids.len() as u64));
            g.bench_function(BenchmarkId::from_parameter(format!("{n}_chars")), |b| {
                b.iter(|| tok.encode(std::hint::black_box(&t), true, false))
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
