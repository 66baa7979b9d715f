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
//! | `int4` keys | ⌈head_dim / 2⌉ + 8·head_dim / G | KIVI: per channel over a group of G tokens, round((x − min) / s) in 0..=15, s = (max − min) / 15, f32 s and min per (group, channel) |
//! | `int4` values | ⌈head_dim / 2⌉ + 8·⌈head_dim / 32⌉ | KIVI: per token, the same 4-bit code over groups of 32 channels of a KV head, f32 s and min per (token, group) |
//!
//! int4 follows KIVI (Liu et al., 2024, "KIVI: A Tuning-Free Asymmetric 2bit Quantization for
//! KV Cache", §3): keys have a few outlier channels, so they are quantized per channel across
//! tokens; values have no such channels and are quantized per token. A key group can only be
//! quantized once its G tokens are there, so the rows of an unfinished group stay in f32 (KIVI's
//! full-precision residual) and are quantized when the group's last row is written. G is
//! [`KvDtype::INT4_GROUP`] (32, KIVI's) in the contiguous cache and the block size in the paged
//! pool, so that a group never spans two sequences' blocks. The f32 residual is at most one
//! group per sequence and layer, and is not counted in the bytes above.
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
    /// IEEE half precision, 2 bytes per element, no scale.
    F16,
    /// bfloat16 (f32's exponent, 8 mantissa bits), 2 bytes per element, no scale.
    Bf16,
    /// FP8 E4M3 with a scale per (token, KV head).
    Fp8E4m3,
    /// Symmetric int8 with a scale per (token, KV head).
    Int8,
    /// 4-bit, KIVI's way: keys per channel over groups of tokens, values per token.
    Int4,
}

impl KvDtype {
    /// Every dtype, f32 first, then by bytes per element.
    pub const ALL: [KvDtype; 6] = [
        Self::F32,
        Self::F16,
        Self::Bf16,
        Self::Fp8E4m3,
        Self::Int8,
        Self::Int4,
    ];

    /// Tokens whose int4 keys share a scale and minimum per channel in the contiguous cache
    /// (KIVI's group size G); the paged pool's group is its block.
    pub const INT4_GROUP: usize = 32;

    /// Channels of one token's int4 values (within a KV head) that share a scale and minimum.
    pub const INT4_VALUE_GROUP: usize = 32;

    /// The name on the command line and in reports.
    pub const fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
            Self::Fp8E4m3 => "fp8-e4m3",
            Self::Int8 => "int8",
            Self::Int4 => "int4",
        }
    }

    /// Tokens that share stored scales: a key group of int4 (`group`), one token otherwise.
    pub const fn group(self, group: usize) -> usize {
        match self {
            Self::Int4 => group,
            _ => 1,
        }
    }

    /// Bytes `tokens` tokens' keys take in one KV head of `head_dim` elements, scales included
    /// (the module's table), with int4 key groups of `group` tokens (a partial group costs a
    /// whole one's scales).
    pub const fn key_bytes(self, head_dim: usize, tokens: usize, group: usize) -> usize {
        match self {
            Self::Int4 => tokens * head_dim.div_ceil(2) + tokens.div_ceil(group) * 8 * head_dim,
            _ => self.value_bytes(head_dim, tokens),
        }
    }

    /// Bytes `tokens` tokens' values take in one KV head of `head_dim` elements, scales
    /// included (the module's table).
    pub const fn value_bytes(self, head_dim: usize, tokens: usize) -> usize {
        tokens
            * match self {
                Self::F32 => 4 * head_dim,
                Self::F16 | Self::Bf16 => 2 * head_dim,
                Self::Fp8E4m3 | Self::Int8 => head_dim + 4,
                Self::Int4 => head_dim.div_ceil(2) + 8 * head_dim.div_ceil(Self::INT4_VALUE_GROUP),
            }
    }

    /// Bytes `tokens` tokens' keys and values take together in one KV head:
    /// [`KvDtype::key_bytes`] + [`KvDtype::value_bytes`].
    pub const fn kv_head_bytes(self, head_dim: usize, tokens: usize, group: usize) -> usize {
        self.key_bytes(head_dim, tokens, group) + self.value_bytes(head_dim, tokens)
    }

    /// KV bytes per token: n_layers × n_kv_heads × [`KvDtype::kv_head_bytes`] of one token
    /// (2 × n_layers × n_kv_heads × head_dim × bytes per element for the plain types). For int4,
    /// a group of [`KvDtype::INT4_GROUP`] tokens' bytes over its tokens, rounded up.
    pub fn bytes_per_token(self, c: &Config) -> usize {
        let g = self.group(Self::INT4_GROUP);
        (c.n_layers * c.n_kv_heads * self.kv_head_bytes(c.head_dim, g, g)).div_ceil(g)
    }

    /// KV bytes of one paged block of `block_size` tokens over all layers (exact: an int4 key
    /// group is the block).
    pub fn bytes_per_block(self, c: &Config, block_size: usize) -> usize {
        c.n_layers * c.n_kv_heads * self.kv_head_bytes(c.head_dim, block_size, block_size)
    }

    /// KV bytes for a context of `positions` when sliding-window layers keep only their window
    /// (`Config::cache_positions`): Σ_layers n_kv_heads × the bytes of the positions kept.
    pub fn bytes_windowed(self, c: &Config, positions: usize) -> usize {
        let g = self.group(Self::INT4_GROUP);
        (0..c.n_layers)
            .map(|l| {
                c.n_kv_heads * self.kv_head_bytes(c.head_dim, c.cache_positions(l, positions), g)
            })
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
        // int4 at head_dim 128: keys 64 B + per group of 32 tokens 128 channels × 8 B, i.e.
        // 32 B per token; values 64 B + 4 groups of 32 channels × 8 B. 192 B per head.
        assert_eq!(
            KvDtype::Int4.bytes_per_token(&c),
            32 * 32 * (64 + 32 + 64 + 32)
        );
        assert_eq!(
            KvDtype::Int4.bytes_per_block(&c, 16),
            32 * 32 * (16 * (64 + 64 + 32) + 128 * 8)
        );
        for d in KvDtype::ALL {
            assert_eq!(d.bytes_per_block(&c, 32), 32 * d.bytes_per_token(&c), "{d}");
        }
    }
}
