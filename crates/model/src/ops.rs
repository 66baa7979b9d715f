//! Scalar reference operations, written for clarity. The CPU engine's fast kernels are tested
//! against these; the naive engine has its own ndarray versions so that the two engines share no
//! arithmetic beyond the model definition.

use crate::{Activation, RopeLayout};

/// RMSNorm (Zhang & Sennrich 2019): y_i = x_i / sqrt(mean(x²) + eps) · w_i.
/// `x`, `w`, `out`: (n,)
pub fn rmsnorm(out: &mut [f32], x: &[f32], w: &[f32], eps: f32) {
    let ss = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ss + eps).sqrt();
    for ((o, &xi), &wi) in out.iter_mut().zip(x).zip(w) {
        *o = xi * inv * wi;
    }
}

/// RMSNorm in place.
pub fn rmsnorm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let ss = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ss + eps).sqrt();
    for (xi, &wi) in x.iter_mut().zip(w) {
        *xi *= inv * wi;
    }
}

/// RoPE (Su et al. 2021) on every head of `x`: (n_heads, head_dim) row-major, at position `pos`.
/// Pair j (0 ≤ j < head_dim/2) is rotated by the angle pos · theta^(-2j/head_dim):
/// (a, b) ← (a·cos − b·sin, a·sin + b·cos). Which dimensions form pair j depends on `layout`.
/// The angle is computed in f32 the way llama2.c's run.c computes it.
pub fn rope(x: &mut [f32], pos: usize, head_dim: usize, theta: f32, layout: RopeLayout) {
    let half = head_dim / 2;
    for head in x.chunks_exact_mut(head_dim) {
        for j in 0..half {
            let freq = 1.0 / theta.powf((2 * j) as f32 / head_dim as f32);
            let (sin, cos) = (pos as f32 * freq).sin_cos();
            let (ia, ib) = match layout {
                RopeLayout::Interleaved => (2 * j, 2 * j + 1),
                RopeLayout::Neox => (j, j + half),
            };
            let (a, b) = (head[ia], head[ib]);
            head[ia] = a * cos - b * sin;
            head[ib] = a * sin + b * cos;
        }
    }
}

/// softmax(x)_i = exp(x_i − max x) / Σ_j exp(x_j − max x), in place.
pub fn softmax(x: &mut [f32]) {
    crate::sampler::softmax_in_place(x);
}

/// silu(x) = x·σ(x) = x / (1 + e^−x)
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU, tanh approximation: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) (Hendrycks & Gimpel 2016;
/// `gelu_pytorch_tanh` in Hugging Face, `ggml_gelu` in llama.cpp).
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
}

/// The gated FFN's elementwise step: gate ← act(gate) ⊙ up.
pub fn glu(gate: &mut [f32], up: &[f32], act: Activation) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = match act {
            Activation::Silu => silu(*g),
            Activation::GeluTanh => gelu_tanh(*g),
        } * u;
    }
}

/// Σ a_i b_i, accumulated left to right.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// y ← y + a·x
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

/// out = W @ x with W (rows, cols) row-major, x (cols,), out (rows,).
pub fn matvec(out: &mut [f32], w: &[f32], x: &[f32]) {
    let cols = x.len();
    for (o, row) in out.iter_mut().zip(w.chunks_exact(cols)) {
        *o = dot(row, x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use approx::assert_relative_eq;

    #[test]
    fn rmsnorm_of_a_constant_vector_is_the_gain() {
        let mut out = [0.0; 4];
        rmsnorm(&mut out, &[3.0; 4], &[1.0, 2.0, 3.0, 4.0], 0.0);
        assert_relative_eq!(&out[..], &[1.0, 2.0, 3.0, 4.0][..], epsilon = 1e-6);
    }

    #[test]
    fn rope_rotates_pairs_by_the_position_angle() {
        // head_dim 4, theta 100: pair 0 angle = pos, pair 1 angle = pos/10.
        let mut x = [1.0, 0.0, 1.0, 0.0];
        rope(&mut x, 2, 4, 100.0, RopeLayout::Interleaved);
        assert_relative_eq!(
            &x[..],
            &[2f32.cos(), 2f32.sin(), 0.2f32.cos(), 0.2f32.sin()][..],
            epsilon = 1e-6
        );
        let mut y = [1.0, 1.0, 0.0, 0.0];
        rope(&mut y, 2, 4, 100.0, RopeLayout::Neox);
        assert_relative_eq!(
            &y[..],
            &[2f32.cos(), 0.2f32.cos(), 2f32.sin(), 0.2f32.sin()][..],
            epsilon = 1e-6
        );
        // Position 0 is the identity, and rotation keeps the norm.
        let mut z = [0.3, -1.2, 0.7, 2.0];
        rope(&mut z, 0, 4, 10_000.0, RopeLayout::Neox);
        assert_eq!(z, [0.3, -1.2, 0.7, 2.0]);
    }

    #[test]
    fn qk_norm_normalises_each_head_separately() {
        // Two heads of head_dim 2, shared gain (1, 2): each head is scaled by its own RMS.
        let mut q = [3.0f32, 4.0, 0.0, 2.0];
        let gain = [1.0, 2.0];
        for head in q.chunks_exact_mut(2) {
            rmsnorm_in_place(head, &gain, 0.0);
        }
        // head 0: rms = sqrt((9 + 16) / 2) = 3.5355; head 1: rms = sqrt(4 / 2) = 1.4142.
        assert_relative_eq!(
            &q[..],
            &[
                3.0 / 3.535_534,
                2.0 * 4.0 / 3.535_534,
                0.0,
                2.0 * 2.0 / std::f32::consts::SQRT_2
            ][..],
            epsilon = 1e-5
        );
    }

    #[test]
    fn geglu_gates_the_up_projection() {
        let mut gate = [1.0f32, -3.0];
        glu(&mut gate, &[2.0, 10.0], Activation::GeluTanh);
        assert_relative_eq!(
            &gate[..],
            &[2.0 * 0.841_192, 10.0 * -0.003_637_392][..],
            epsilon = 1e-5
        );
        let mut gate = [1.0f32];
        glu(&mut gate, &[3.0], Activation::Silu);
        assert_relative_eq!(gate[0], 3.0 * 0.731_058_6, epsilon = 1e-6);
    }

    #[test]
    fn activations_match_hand_values() {
        assert_relative_eq!(silu(0.0), 0.0);
        assert_relative_eq!(silu(1.0), 1.0 / (1.0 + (-1f32).exp()), epsilon = 1e-7);
        // gelu_tanh(1) = 0.5·(1 + tanh(0.7978846·1.044715)) = 0.8411920
        assert_relative_eq!(gelu_tanh(1.0), 0.841_192, epsilon = 1e-6);
        assert_relative_eq!(gelu_tanh(-3.0), -0.003_637_392, epsilon = 1e-6);
    }
}
