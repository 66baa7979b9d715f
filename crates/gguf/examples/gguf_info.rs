//! Prints a GGUF file's summary, its metadata (arrays abbreviated) and its first tensors.
//!
//! `cargo run --release -p kvlab-gguf --example gguf_info -- $KVLAB_MODELS/gemma-3-270m-q4_k_m.gguf`

use kvlab_gguf::GgufFile;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: gguf_info FILE.gguf [N_TENSORS]")?;
    let n: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(16);
    let f = GgufFile::open(&path)?;
    print!("{}", f.summary());
    println!("\nmetadata:");
    for (k, v) in f.metadata().iter() {
        println!("  {k} ({}) = {v}", v.type_name());
    }
    println!("\ntensors (ne in GGUF order; shape row-major):");
    for t in f.tensors().iter().take(n) {
        println!(
            "  {:<32} {:<5} ne={:?} shape={:?} {} bytes",
            t.name,
            t.ggml_type,
            t.ne,
            t.shape(),
            t.n_bytes
        );
    }
    Ok(())
}
