//! Element types on the device: `f32` (parity mode) and `f16` (fast mode, IEEE half via the
//! `half` crate). Kernel entry points carry the type's [`DType::NAME`] as a suffix, and cuBLAS
//! gets its [`DType::CUDA`] data type.

use cudarc::cublas::sys::cudaDataType_t;
use cudarc::driver::{DeviceRepr, ValidAsZeroBits};
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
    fn to_f32(self) -> f32;
    /// A whole f32 tensor in this type: borrowed for f32, converted for f16.
    fn from_f32_slice(x: &[f32]) -> std::borrow::Cow<'_, [Self]> {
        std::borrow::Cow::Owned(x.iter().map(|&v| Self::from_f32(v)).collect())
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
}
