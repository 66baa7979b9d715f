//! Element types on the device: `f32` (parity mode) and `f16` (fast mode, IEEE half via the
//! `half` crate) for weights and activations ([`DType`]); those two and bf16, fp8-e4m3 codes,
//! int8 codes and pairs of int4 codes for the KV pool ([`CacheElem`], the `--kv-dtype` formats of
//! `kvlab_model::KvDtype`). Kernel entry points carry the type's `NAME` as a suffix, and cuBLAS
//! gets a [`DType::CUDA`] data type.

use cudarc::cublas::sys::cudaDataType_t;
use cudarc::driver::{DeviceRepr, ValidAsZeroBits};
use kvlab_model::KvDtype;
use serde::Serialize;

/// A storage type of weights, activations or the KV cache. Arithmetic is always f32.
pub trait DType:
    DeviceRepr + ValidAsZeroBits + Copy + Default + Send + Sync + std::fmt::Debug + 'static
{
    /// Suffix of kernel names: "f32" or "f16".
    const NAME: &'static str;
    /// cuBLAS data type.
    const CUDA: cudaDataType_t;
    /// Bytes per element.
    const BYTES: usize;
    /// Round-to-nearest-even conversion from f32.
    fn from_f32(x: f32) -> Self;
    /// Exact conversion to f32.
    fn to_f32(self) -> f32;
    /// A whole f32 tensor in this type: borrowed for f32, converted for f16.
    fn from_f32_slice(x: &[f32]) -> std::borrow::Cow<'_, [Self]> {
        std::borrow::Cow::Owned(x.iter().map(|&v| Self::from_f32(v)).collect())
    }
}

/// An element of the KV pool: the value itself (f32, f16, bf16) or the code of a scaled 8-bit
/// format (`u8` holds fp8-e4m3 bits, `i8` int8), whose (token, KV head) rows also have an f32
/// scale, or two int4 codes ([`Int4x2`]). The formats, and why their bits equal kvlab-cpu's, are in `kernels/common.cuh`
/// (`KvCodec`).
pub trait CacheElem:
    DeviceRepr + ValidAsZeroBits + Copy + Default + Send + Sync + std::fmt::Debug + 'static
{
    /// Suffix of the cache kernels' names: "f32", "f16", "bf16", "fp8" or "i8".
    const NAME: &'static str;
    /// The `--kv-dtype` it stores.
    const KV_DTYPE: KvDtype;
    /// Bytes per element (scales not included).
    const BYTES: usize;
    /// Whether each (token, KV head) row of elements has an f32 scale beside it.
    const SCALED: bool;
    /// Whether it is [`Int4x2`]: two codes a byte, with int4's own (s, min) layout and f32
    /// residual (`kernels/cache.cu`).
    const INT4: bool = false;
    /// The element's bits, little-endian (`BYTES` of them), for a block moved to a tier.
    fn to_le(self, out: &mut Vec<u8>);
    /// The element whose bits `to_le` wrote (`bytes.len() == BYTES`).
    fn from_le(bytes: &[u8]) -> Self;
}

macro_rules! cache_elem {
    ($t:ty, $name:literal, $dtype:expr, $scaled:literal, $bits:ty, $to:expr, $from:expr) => {
        impl CacheElem for $t {
            const NAME: &'static str = $name;
            const KV_DTYPE: KvDtype = $dtype;
            const BYTES: usize = std::mem::size_of::<$t>();
            const SCALED: bool = $scaled;
            fn to_le(self, out: &mut Vec<u8>) {
                let bits: $bits = $to(self);
                out.extend_from_slice(&bits.to_le_bytes());
            }
            fn from_le(bytes: &[u8]) -> Self {
                let mut b = [0u8; std::mem::size_of::<$t>()];
                b.copy_from_slice(bytes);
                $from(<$bits>::from_le_bytes(b))
            }
        }
    };
}
cache_elem!(
    f32,
    "f32",
    KvDtype::F32,
    false,
    u32,
    f32::to_bits,
    f32::from_bits
);
cache_elem!(
    half::f16,
    "f16",
    KvDtype::F16,
    false,
    u16,
    half::f16::to_bits,
    half::f16::from_bits
);
cache_elem!(
    half::bf16,
    "bf16",
    KvDtype::Bf16,
    false,
    u16,
    half::bf16::to_bits,
    half::bf16::from_bits
);
cache_elem!(u8, "fp8", KvDtype::Fp8E4m3, true, u8, |x| x, |x| x);
cache_elem!(i8, "i8", KvDtype::Int8, true, i8, |x| x, |x| x);

/// Two int4 codes of the KV pool in one byte, element 2i in the low nibble (`kvlab_int4x2` in
/// `kernels/common.cuh`): a head of head_dim elements is ⌈head_dim / 2⌉ of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct Int4x2(pub u8);

// SAFETY: a plain byte (repr(transparent) over u8), passed to kernels by value or as device
// memory of bytes, as u8 is; all zero bits are two zero codes.
unsafe impl DeviceRepr for Int4x2 {}
// SAFETY: as above; zeroed memory is a valid Int4x2.
unsafe impl ValidAsZeroBits for Int4x2 {}

impl CacheElem for Int4x2 {
    const NAME: &'static str = "i4";
    const KV_DTYPE: KvDtype = KvDtype::Int4;
    const BYTES: usize = 1;
    const SCALED: bool = false;
    const INT4: bool = true;
    fn to_le(self, out: &mut Vec<u8>) {
        out.push(self.0);
    }
    fn from_le(bytes: &[u8]) -> Self {
        Int4x2(bytes[0])
    }
}

/// Elements of `C` one token's (n_kv_heads, head_dim) keys or values take in the pool: kv_dim,
/// or n_kv_heads × ⌈head_dim / 2⌉ bytes of int4 codes.
pub fn row_elems<C: CacheElem>(n_kv_heads: usize, head_dim: usize) -> usize {
    if C::INT4 {
        n_kv_heads * head_dim.div_ceil(2)
    } else {
        n_kv_heads * head_dim
    }
}

impl DType for f32 {
    const NAME: &'static str = "f32";
    const CUDA: cudaDataType_t = cudaDataType_t::CUDA_R_32F;
    const BYTES: usize = 4;
    fn from_f32(x: f32) -> Self {
        x
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32_slice(x: &[f32]) -> std::borrow::Cow<'_, [Self]> {
        std::borrow::Cow::Borrowed(x)
    }
}

impl DType for half::f16 {
    const NAME: &'static str = "f16";
    const CUDA: cudaDataType_t = cudaDataType_t::CUDA_R_16F;
    const BYTES: usize = 2;
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
}

/// A run-time choice of element type (options, reports).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum Precision {
    /// IEEE single: the parity mode, token-identical with the CPU engines.
    #[default]
    F32,
    /// IEEE half: the fast mode (half the bytes; GEMMs on tensor cores with f32 accumulation).
    F16,
}

impl Precision {
    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            Precision::F32 => 4,
            Precision::F16 => 2,
        }
    }

    /// "f32" or "f16".
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::F16 => "f16",
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(Precision::F32),
            "f16" => Ok(Precision::F16),
            other => Err(format!("unknown precision {other:?}; use f32 or f16")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_rounds_to_nearest_even_and_names_match_kernels() {
        assert_eq!(
            <half::f16 as DType>::from_f32(1.0 + 1.0 / 4096.0).to_f32(),
            1.0
        );
        assert_eq!(<half::f16 as DType>::from_f32(65504.0).to_f32(), 65504.0);
        assert_eq!(<f32 as DType>::NAME, "f32");
        assert_eq!(<half::f16 as DType>::BYTES, 2);
        assert_eq!("f16".parse::<Precision>(), Ok(Precision::F16));
        assert!("bf16".parse::<Precision>().is_err());
    }

    /// A block's elements go to a tier as their bits and come back the same bits, NaN and
    /// subnormals included.
    #[test]
    fn elements_round_trip_through_their_bytes() {
        fn round_trip<C: CacheElem + PartialEq>(xs: &[C]) -> Vec<C> {
            let mut out = Vec::new();
            xs.iter().for_each(|x| x.to_le(&mut out));
            assert_eq!(out.len(), xs.len() * C::BYTES);
            out.chunks_exact(C::BYTES).map(C::from_le).collect()
        }
        let f = [1.5f32, -0.0, f32::MIN_POSITIVE / 4.0, f32::MAX, f32::NAN];
        let back = round_trip(&f);
        assert!(f.iter().zip(&back).all(|(a, b)| a.to_bits() == b.to_bits()));
        let h: Vec<half::f16> = [0x3c00u16, 0x8000, 0x0001, 0x7bff, 0x7e01]
            .into_iter()
            .map(half::f16::from_bits)
            .collect();
        let back = round_trip(&h);
        assert!(h.iter().zip(&back).all(|(a, b)| a.to_bits() == b.to_bits()));
        let b: Vec<half::bf16> = [0x3f80u16, 0x8000, 0x0001, 0x7f7f, 0x7fc1]
            .into_iter()
            .map(half::bf16::from_bits)
            .collect();
        let back = round_trip(&b);
        assert!(b.iter().zip(&back).all(|(a, b)| a.to_bits() == b.to_bits()));
        let codes: Vec<u8> = (0..=255).collect();
        assert_eq!(round_trip(&codes), codes);
        let codes: Vec<i8> = (-128..=127).collect();
        assert_eq!(round_trip(&codes), codes);
    }

    /// Each cache type names the kernels and the `--kv-dtype` it stores; only the 8-bit codes
    /// carry scales.
    #[test]
    fn cache_elements_match_their_kv_dtypes() {
        let all = [
            (
                <f32 as CacheElem>::KV_DTYPE,
                <f32 as CacheElem>::BYTES,
                <f32 as CacheElem>::SCALED,
            ),
            (
                half::f16::KV_DTYPE,
                <half::f16 as CacheElem>::BYTES,
                half::f16::SCALED,
            ),
            (half::bf16::KV_DTYPE, half::bf16::BYTES, half::bf16::SCALED),
            (u8::KV_DTYPE, u8::BYTES, u8::SCALED),
            (i8::KV_DTYPE, i8::BYTES, i8::SCALED),
        ];
        assert_eq!(Int4x2::KV_DTYPE, KvDtype::Int4);
        const { assert!(Int4x2::INT4 && !<u8 as CacheElem>::INT4) };
        assert_eq!(row_elems::<Int4x2>(2, 7), 8);
        assert_eq!(row_elems::<u8>(2, 7), 14);
        for (dtype, bytes, scaled) in all {
            // KvDtype's bytes per (token, KV head) of head_dim 64: the element, plus the scale.
            assert_eq!(
                dtype.value_bytes(64, 1),
                64 * bytes + if scaled { 4 } else { 0 },
                "{dtype}"
            );
        }
    }
}
