//! Elementwise steps of the cached forward pass over all of a step's rows, split across the
//! engine's threads when the step is large enough to pay for it (a prompt, a big batch), on the
//! calling thread otherwise (a decode token). The maths is `kvlab_model::ops`'.
//!
//! In a 100-token prefill the gated activation is 100 × hidden_dim exps between two matrix
//! products; on one thread it kept the other one waiting, long enough to park.

use kvlab_model::{Activation, ops};

use crate::threads;

/// Below this many elements a step's elementwise work runs on the calling thread.
const PAR_MIN_ELEMENTS: usize = 1 << 14;

/// gate ← act(gate) ⊙ up (SwiGLU / GeGLU), gate and up (rows, hidden_dim) row-major.
pub fn glu(gate: &mut [f32], up: &[f32], act: Activation) {
    let threads = threads::num_threads();
    if gate.len() < PAR_MIN_ELEMENTS || threads == 1 {
        ops::glu(gate, up, act);
        return;
    }
    // One contiguous share per thread, a multiple of 16 elements.
    let per = gate.len().div_ceil(threads).next_multiple_of(16);
    threads::for_each_chunk_mut(gate, per, |i, g| ops::glu(g, &up[i * per..], act));
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
