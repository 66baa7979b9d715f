//! Elementwise steps of the cached forward pass over all of a step's rows, split across the
//! engine's threads when the step is large enough to pay for it (a prompt, a big batch), on the
//! calling thread otherwise (a decode token). The maths is `kvlab_model::ops`'.
//!
//! In a 100-token prefill the gated activation is 100 × hidden_dim exps between two matrix
//! products; on one thread it kept the other one waiting, long enough to park. A decode batch of
//! 32 sequences normalises 32 rows 13 times a step (stories15M's 6 layers), which on one thread
//! kept the other waiting too.

use kvlab_model::{Activation, ops};

use crate::threads;

/// Below this many elements a step's elementwise work runs on the calling thread.
const PAR_MIN_ELEMENTS: usize = 1 << 14;

/// gate ← act(gate) ⊙ up (SwiGLU / GeGLU), gate and up (rows, hidden_dim) row-major.
pub fn glu(gate: &mut [f32], up: &[f32], act: Activation) {
    if gate.len() < PAR_MIN_ELEMENTS {
        ops::glu(gate, up, act);
        return;
    }
    // One contiguous share per thread, a multiple of 16 elements.
    let per = gate
        .len()
        .div_ceil(threads::num_threads())
        .next_multiple_of(16);
    threads::for_each_chunk_mut(gate, per, |i, g| ops::glu(g, &up[i * per..], act));
}

/// RMSNorm of each row of x (rows, d) into out (rows, d), the rows shared among the engine's
/// threads when there are enough of them (a batch of 32 sequences normalises 13 times a step).
pub fn rmsnorm_rows(out: &mut [f32], x: &[f32], w: &[f32], d: usize, eps: f32) {
    let rows = out.len() / d;
    let norm = |o: &mut [f32], x: &[f32]| {
        for (o, r) in o.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
            ops::rmsnorm(o, r, w, eps);
        }
    };
    if rows < PAR_NORM_MIN_ROWS {
        norm(out, x);
        return;
    }
    let per = rows.div_ceil(threads::num_threads());
    threads::for_each_chunk_mut(out, per * d, |i, o| norm(o, &x[i * per * d..]));
}

/// Rows from which [`rmsnorm_rows`] shares them among threads.
const PAR_NORM_MIN_ROWS: usize = 8;

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn equals_the_reference_bit_for_bit_at_every_size() {
        for n in [
            1,
            100,
            PAR_MIN_ELEMENTS - 1,
            PAR_MIN_ELEMENTS,
            3 * PAR_MIN_ELEMENTS + 5,
        ] {
            let gate: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 4.0).collect();
            let up: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            for act in [Activation::Silu, Activation::GeluTanh] {
                let (mut got, mut want) = (gate.clone(), gate.clone());
                glu(&mut got, &up, act);
                ops::glu(&mut want, &up, act);
                assert_eq!(got, want, "n={n} {act:?}");
            }
        }
    }

    #[test]
    fn rmsnorm_rows_equals_the_reference_row_by_row() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(12);
        let d = 48;
        let w: Vec<f32> = (0..d).map(|_| rng.random_range(0.5..1.5)).collect();
        for rows in [1, PAR_NORM_MIN_ROWS - 1, PAR_NORM_MIN_ROWS, 33] {
            let x: Vec<f32> = (0..rows * d).map(|_| rng.random_range(-2.0..2.0)).collect();
            let mut got = vec![f32::NAN; rows * d];
            rmsnorm_rows(&mut got, &x, &w, d, 1e-5);
            for (r, row) in got.chunks_exact(d).enumerate() {
                let mut want = vec![0.0; d];
                ops::rmsnorm(&mut want, &x[r * d..(r + 1) * d], &w, 1e-5);
                assert_eq!(row, &want[..], "rows={rows} row {r}");
            }
        }
    }
}
