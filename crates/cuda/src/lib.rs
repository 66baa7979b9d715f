//! kvlab-cuda: the paged KV cache engine on an NVIDIA GPU.
//!
//! cudarc with dynamic loading (libcuda, libnvrtc, libcublas are opened at run time, so the
//! crate builds and its CPU tests pass on machines without CUDA); CUDA C kernels in
//! `kernels/*.cu` compiled at run time by NVRTC for the GPU at hand; cuBLAS GEMMs; all block
//! bookkeeping (allocator, block tables, slot mapping, prefix cache, copy-on-write, scheduler)
//! from kvlab-paged, exactly as the paged CPU engine uses it.
//!
//! Files in data-flow order: [`error`], [`device`] (probe, context, stream), [`dtype`],
//! [`kernels`] (the embedded sources), [`nvrtc`] (compile, PTX cache), [`launch`] (grids and
//! argument packing, pure), [`gemm`], [`ops`] (typed kernel launches), [`weights`], [`pool`],
//! [`rope`], [`workspace`], [`forward`] (`DeviceModel`: the engine's state on the device and
//! its batched step),
//! [`engine`] (`Engine` + `StepExecutor`), [`bench`]. The kernels' CPU references live beside
//! their tests, in `tests/common/reference.rs`.
//!
//! Without a GPU, [`probe`] and [`CudaEngine::new`] return errors that say so; nothing panics.

pub mod bench;
pub mod device;
pub mod dtype;
pub mod engine;
pub mod error;
pub mod forward;
pub mod gemm;
pub mod kernels;
pub mod launch;
pub mod nvrtc;
pub mod ops;
pub mod pool;
pub mod residual;
pub mod rope;
pub mod weights;
pub mod workspace;

pub use device::{DeviceInfo, probe};
pub use dtype::Precision;
pub use engine::{CudaEngine, CudaOptions};
pub use error::CudaError;
pub use launch::DecodeAttention;
pub use pool::PoolPlan;

/// Whether `KVLAB_REQUIRE_CUDA=1` asks for a missing GPU to be a failure rather than a skip.
pub fn require_cuda() -> bool {
    std::env::var("KVLAB_REQUIRE_CUDA").as_deref() == Ok("1")
}
