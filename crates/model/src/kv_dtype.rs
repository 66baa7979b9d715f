//! The element type a KV cache stores keys and values in (`--kv-dtype`), and what it costs in
//! bytes. The engines quantize a row when they write it and dequantize inside attention; the
//! formats themselves are in kvlab-cpu's `kv_store.rs`.
//!
//! Bytes one token's keys (or values) take in one KV head of `head_dim` elements:
//!
//! | dtype | bytes per KV head | scheme |
//! | --- | --- | --- |
//! | `f32` | 4·head_dim | as computed |
//! | `f16` | 2·head_dim | IEEE half: 11-bit mantissa, range ±65,504 |
//! | `bf16` | 2·head_dim | bfloat16: f32's range, 8-bit mantissa |
//! | `fp8-e4m3` | head_dim + 4 | OCP FP8 E4M3 (range ±448, 3-bit mantissa) of x / s, one f32 scale s = amax / 448 per (token, KV head) |
//! | `int8` | head_dim + 4 | round(x / s) in −127..=127, one f32 scale s = amax / 127 per (token, KV head) |
//!
//! vLLM's fp8 cache keeps one scale per tensor (k_scale, v_scale: calibrated, or 1.0); without a
//! calibration pass kvlab takes the scale per (token, KV head) when it writes, as llama.cpp's
//! q8_0 cache does per block of 32 (there with an f16 scale). KV bytes per token are
//! `2 (K and V) × n_layers × n_kv_heads × bytes per KV head`.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::Config;

/// The type keys and values are stored in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(into = "&'static str")]
pub enum KvDtype {
    /// As computed: the identity suite's cache.
    #[default]
    F32,
    F16,
    Bf16,
    /// FP8 E4M3 with a scale per (token, KV head).
    Fp8E4m3,
    /// Symmetric int8 with a scale per (token, KV head).
    Int8,
}

impl KvDtype {
    /// Every dtype, f32 first, then by bytes per element.
    pub const ALL: [KvDtype; 5] = [Self::F32, Self::F16, Self::Bf16, Self::Fp8E4m3, Self::Int8];

    /// The name on the command line and in reports.
    pub const fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
            Self::Fp8E4m3 => "fp8-e4m3",
            Self::Int8 => "int8",
        }
    }

    /// Bytes one token's keys (or values) take in one KV head of `head_dim` elements, scales
    /// included (see the module's table).
    pub const fn head_bytes(self, head_dim: usize) -> usize {
        match self {
            Self::F32 => 4 * head_dim,
            Self::F16 | Self::Bf16 => 2 * head_dim,
            Self::Fp8E4m3 | Self::Int8 => head_dim + 4,
        }
    }

    /// Bytes of one cache row: one token's keys (or values) for every KV head of `c`.
    pub fn row_bytes(self, c: &Config) -> usize {
        c.n_kv_heads * self.head_bytes(c.head_dim)
    }

    /// KV bytes per token: 2 (K and V) × n_layers × n_kv_heads × [`KvDtype::head_bytes`].
    pub fn bytes_per_token(self, c: &Config) -> usize {
        2 * c.n_layers * self.row_bytes(c)
    }

    /// KV bytes for a context of `positions` when sliding-window layers keep only their window
    /// (`Config::cache_positions`): Σ_layers 2 × row bytes × positions kept.
    pub fn bytes_windowed(self, c: &Config, positions: usize) -> usize {
        (0..c.n_layers)
            .map(|l| 2 * self.row_bytes(c) * c.cache_positions(l, positions))
            .sum()
    }
}

impl fmt::Display for KvDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl From<KvDtype> for &'static str {
    fn from(d: KvDtype) -> &'static str {
        d.name()
    }
}

impl FromStr for KvDtype {
    type Err = String;

    /// A dtype by name; the error lists the known ones.
    fn from_str(s: &str) -> Result<KvDtype, String> {
        KvDtype::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown KV cache dtype {s:?}; known: {}",
                    KvDtype::ALL.map(KvDtype::name).join(", ")
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_ones_are_listed() {
        for d in KvDtype::ALL {
            assert_eq!(d.name().parse::<KvDtype>(), Ok(d));
        }
        let e = "int3".parse::<KvDtype>().unwrap_err();
        assert!(e.contains("int3") && e.contains("fp8-e4m3"), "{e}");
    }

    /// Llama 2 7B (32 layers, 32 KV heads of 128): 1 MiB per token in f32, 512 KiB in bf16, and
    /// 2 × 32 × 32 × 132 bytes = 264 KiB in int8 with its scales.
    #[test]
    fn bytes_per_token_follow_the_formula() {
        let c = Config::llama(4096, 11008, 32, 32, 32, 32000, 4096, false);
        assert_eq!(KvDtype::F32.bytes_per_token(&c), 1 << 20);
        assert_eq!(KvDtype::Bf16.bytes_per_token(&c), 512 << 10);
        assert_eq!(KvDtype::Int8.bytes_per_token(&c), 2 * 32 * 32 * 132);
        assert_eq!(KvDtype::F32.bytes_per_token(&c), c.kv_bytes_per_token(4));
    }
}
