//! Attention, before any cache (docs/src/attention.md): the first layer's queries, keys and
//! values for a prompt, and one head's scores `QKᵀ / √head_dim` under the causal mask, their
//! softmax, and what each row reads from V, printed as matrices (rows: query positions,
//! columns: key positions).
//!
//! Run it: `cargo run --release -p kvlab-build-up --bin attention` (`-p TEXT` for another
//! prompt). It shows layer 0, query head 0; every layer and head computes the same way.

use kvlab_build_up::{Lesson, embed, matvec, rmsnorm};
use kvlab_model::ops;

/// The layer and query head shown.
const LAYER: usize = 0;
const HEAD: usize = 0;

fn main() -> anyhow::Result<()> {
    let lesson = Lesson::load()?;
    let (model, c) = (&lesson.model, &lesson.model.config);
    let (hd, lw) = (c.head_dim, &model.weights.layers[LAYER]);
    let theta = c.rope_theta_for(LAYER);
    let tokens = &lesson.prompt; // BOS + the prompt
    let t = tokens.len();

    // Every row's q (n_heads, head_dim), k and v (n_kv_heads, head_dim), as step 1 computes them.
    let (mut qs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
    for (i, &tok) in tokens.iter().enumerate() {
        let xn = rmsnorm(&embed(model, tok), &lw.attn_norm, c.norm_eps); // (dim,)
        let mut q = matvec(&lw.wq, &xn, c.q_dim());
        let mut k = matvec(&lw.wk, &xn, c.kv_dim());
        ops::rope(&mut q, i, hd, theta, c.rope_layout);
        ops::rope(&mut k, i, hd, theta, c.rope_layout);
        qs.push(q);
        ks.push(k);
        vs.push(matvec(&lw.wv, &xn, c.kv_dim()));
    }
    let g = HEAD / c.kv_mul(); // the KV head query head HEAD reads
    let head = |row: &[f32], h: usize| row[h * hd..(h + 1) * hd].to_vec();

    // Scores (t, t): row i, column j is q_i · k_j / √head_dim, for j ≤ i; above the diagonal,
    // the causal mask: a position never sees the ones after it.
    let scores: Vec<Vec<Option<f32>>> = (0..t)
        .map(|i| {
            (0..t)
                .map(|j| {
                    (j <= i).then(|| ops::dot(&head(&qs[i], HEAD), &head(&ks[j], g)) * c.attn_scale)
                })
                .collect()
        })
        .collect();
    // Each row's softmax over the keys it sees: weights that sum to 1.
    let weights: Vec<Vec<f32>> = scores
        .iter()
        .map(|row| {
            let mut seen: Vec<f32> = row.iter().flatten().copied().collect();
            ops::softmax(&mut seen);
            seen.resize(t, 0.0); // the masked keys get weight 0
            seen
        })
        .collect();

    // Each position's token as it prints (BOS prints nothing unless asked for).
    let names: Vec<String> = tokens
        .iter()
        .enumerate()
        .map(|(i, &tok)| {
            let prev = if i == 0 { u32::MAX } else { tokens[i - 1] };
            let text = lesson.tokenizer.decode(prev, tok, true);
            format!("{tok} {:?}", String::from_utf8_lossy(&text))
        })
        .collect();
    println!(
        "{} on {}: {t} positions; layer {LAYER}, query head {HEAD} of {} (it reads KV head {g} of {}: {} query heads share each KV head)",
        env!("CARGO_BIN_NAME"),
        lesson.name,
        c.n_heads,
        c.n_kv_heads,
        c.kv_mul()
    );
    println!(
        "shapes: x ({t}, dim {}) -> q ({t}, n_heads {} x head_dim {hd}), k and v ({t}, n_kv_heads {} x head_dim {hd})",
        c.dim, c.n_heads, c.n_kv_heads
    );
    for (i, n) in names.iter().enumerate() {
        println!("  position {i}: {n}");
    }
    let matrix = |title: &str, cell: &dyn Fn(usize, usize) -> String| {
        println!("{title}");
        print!("{:>10}", "q \\ k");
        (0..t).for_each(|j| print!("{j:>8}"));
        println!();
        for i in 0..t {
            print!("{i:>10}");
            (0..t).for_each(|j| print!("{:>8}", cell(i, j)));
            println!();
        }
    };
    matrix(
        &format!(
            "scores = q·k / sqrt({hd}) = q·k x {:.4}, masked above the diagonal:",
            c.attn_scale
        ),
        &|i, j| scores[i][j].map_or("-inf".to_string(), |s| format!("{s:.3}")),
    );
    matrix(
        "softmax of each row (what each query position reads of each value row):",
        &|i, j| {
            if j > i {
                "0".to_string()
            } else {
                format!("{:.3}", weights[i][j])
            }
        },
    );
    for (i, w) in weights.iter().enumerate() {
        println!("  row {i}: weights sum to {:.6}", w.iter().sum::<f32>());
    }
    // The output of the last row: its weights times the value rows it sees.
    let mut out = vec![0.0; hd];
    for (j, w) in weights[t - 1].iter().enumerate().take(t) {
        ops::axpy(&mut out, *w, &head(&vs[j], g));
    }
    let shown: Vec<String> = out.iter().take(4).map(|x| format!("{x:.4}")).collect();
    println!(
        "row {}'s output = sum_j weight_j x v_j: ({}, ...) of {hd}; a new row {t} would read k and v of rows 0..={} exactly as computed here, plus its own: what a KV cache keeps",
        t - 1,
        shown.join(", "),
        t - 1
    );
    Ok(())
}
