//! The crate's one error type. Every message says what went wrong and what to do about it;
//! [`CudaError::is_unavailable`] tells "this machine has no usable CUDA" (callers report the
//! engine as SKIPPED) from a real failure.

use cudarc::cublas::result::CublasError;
use cudarc::driver::DriverError;

/// Errors of the CUDA engine, its kernels and its probes.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// libcuda could not be loaded: no NVIDIA driver on this machine.
    #[error(
        "no CUDA driver found (libcuda.so.1 not loadable): the cuda engine needs an NVIDIA GPU \
         and its driver; use --engine cpu-paged on this machine"
    )]
    NoDriver,
    /// The driver loaded but reports no device (or cannot initialise).
    #[error(
        "the CUDA driver is installed but found no usable GPU ({0}); check nvidia-smi and \
         CUDA_VISIBLE_DEVICES"
    )]
    NoDevice(String),
    /// libnvrtc could not be loaded.
    #[error(
        "NVRTC not found ({0} not loadable): install the CUDA toolkit, or the PyPI wheel \
         nvidia-cuda-nvrtc (scripts/cuda/setup-nvrtc.sh), and put its lib folder on \
         LD_LIBRARY_PATH"
    )]
    NoNvrtc(&'static str),
    /// libcublas could not be loaded.
    #[error(
        "cuBLAS not found (libcublas.so.13 not loadable): install the CUDA 13 toolkit or the \
         PyPI wheel nvidia-cublas and put its lib folder on LD_LIBRARY_PATH"
    )]
    NoCublas,
    /// A CUDA library of another major version than kvlab's bindings (13) was loaded first.
    #[error(
        "{lib} {found} was loaded, but kvlab is built for CUDA 13: put the CUDA 13 library's \
         folder first on LD_LIBRARY_PATH (the toolkit's lib64, or the PyPI wheel's nvidia/cu13/lib)"
    )]
    WrongVersion {
        /// The library loaded, e.g. "libnvrtc".
        lib: &'static str,
        /// Its version, "major.minor".
        found: String,
    },
    /// No folder with cuda_fp16.h was found.
    #[error(
        "CUDA headers not found (looked for cuda_fp16.h in {searched}); set KVLAB_CUDA_INCLUDE \
         to a folder holding cuda_fp16.h (e.g. <venv>/lib/python3.*/site-packages/nvidia/cu13/include \
         after scripts/cuda/setup-nvrtc.sh) or CUDA_HOME to the toolkit"
    )]
    NoHeaders {
        /// Every folder tried, comma-separated.
        searched: String,
    },
    /// NVRTC rejected a kernel source.
    #[error("NVRTC could not compile kernels/{file} for {arch}: {log}")]
    Compile {
        /// The source file, relative to `kernels/`.
        file: &'static str,
        /// The target: "sm_XY" (cubin) or "compute_XY" (PTX).
        arch: String,
        /// NVRTC's compile log.
        log: String,
    },
    /// A kernel name that no compiled module holds (a bug in kernels.rs).
    #[error("kernel {0} is not in any compiled module; kernels.rs and kernels/*.cu disagree")]
    MissingKernel(String),
    /// A CUDA driver call failed.
    #[error("CUDA driver error: {0:?}")]
    Driver(#[from] DriverError),
    /// A cuBLAS call failed.
    #[error("cuBLAS error: {0:?}")]
    Cublas(#[from] CublasError),
    /// A shape or value the kernels do not support.
    #[error("unsupported by the cuda engine: {0}")]
    Unsupported(String),
    /// Step metadata that does not fit the pool or the model (a scheduler/engine mismatch).
    #[error("invalid step input: {0}")]
    BadInput(String),
    /// Not enough device memory for the weights, the activations or a useful KV pool.
    #[error("not enough GPU memory: {0}")]
    OutOfMemory(String),
    /// The KV pool has no free block for a single-sequence step.
    #[error(
        "the KV pool is full ({num_blocks} blocks of {block_size} tokens): free sequences, or \
         raise gpu_memory_utilization / num_blocks"
    )]
    PoolFull {
        /// Blocks in the pool.
        num_blocks: usize,
        /// Token slots per block.
        block_size: usize,
    },
    /// Paged bookkeeping failed.
    #[error("paged KV bookkeeping: {0}")]
    Paged(#[from] kvlab_paged::PagedError),
}

impl CudaError {
    /// True when the machine simply has no usable CUDA (no driver, no device, no NVRTC, no
    /// cuBLAS, no headers): verify and bench report the engine as SKIPPED, not failed.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            CudaError::NoDriver
                | CudaError::NoDevice(_)
                | CudaError::NoNvrtc(_)
                | CudaError::NoCublas
                | CudaError::WrongVersion { .. }
                | CudaError::NoHeaders { .. }
        )
    }
}

impl From<CudaError> for kvlab_model::Error {
    fn from(e: CudaError) -> Self {
        kvlab_model::Error::Engine {
            engine: "cuda",
            reason: e.to_string(),
        }
    }
}

/// Result with [`CudaError`].
pub type Result<T, E = CudaError> = std::result::Result<T, E>;
