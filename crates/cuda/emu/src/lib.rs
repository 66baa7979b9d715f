//! Test-only: kvlab-cuda's kernels (`crates/cuda/kernels/*.cu`, the very files NVRTC compiles)
//! built as host C++ against `include/cuda_emu.h` and launched on the CPU, so `cargo test` runs
//! every kernel on machines without a GPU. One host thread per CUDA thread of a block, blocks one
//! after another, launches one at a time; device addresses are host addresses.
//!
//! kvlab-cuda's tests drive it through `kvlab_cuda::ops::Launcher` (tests/common/emu.rs), so the
//! same argument packing and bounds checks as on the GPU reach the same kernels.

use std::ffi::{CString, c_char, c_void};

unsafe extern "C" {
    fn kvlab_emu_launch(
        name: *const c_char,
        grid: *const u32,
        block: *const u32,
        args: *mut *mut c_void,
    ) -> i32;
}

/// Why a launch did not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EmuError {
    /// No kernel of that name was compiled in (kernels.rs and kernels/*.cu disagree).
    UnknownKernel(String),
    /// A grid dimension of 0, or a block of 0 or more than 1,024 threads.
    BadLaunch {
        /// (x, y, z) blocks in the grid.
        grid: [u32; 3],
        /// (x, y, z) threads in a block.
        block: [u32; 3],
    },
}

impl std::fmt::Display for EmuError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EmuError::UnknownKernel(n) => write!(f, "the emulator has no kernel {n}"),
            EmuError::BadLaunch { grid, block } => {
                write!(
                    f,
                    "bad launch: grid {grid:?}, block {block:?} (1..=1024 threads)"
                )
            }
        }
    }
}

impl std::error::Error for EmuError {}

/// Runs kernel `name` over `grid` blocks of `block` threads; `args[i]` points at the kernel's
/// i-th parameter, as `cuLaunchKernel` takes them. Returns when every block has run.
///
/// # Errors
/// [`EmuError::UnknownKernel`], [`EmuError::BadLaunch`].
///
/// # Safety
/// `args` match the kernel's parameter list in number and types, and every pointer argument
/// addresses host memory holding what the grid reads and writes.
pub unsafe fn launch(
    name: &str,
    grid: [u32; 3],
    block: [u32; 3],
    args: &mut [*mut c_void],
) -> Result<(), EmuError> {
    let c_name = CString::new(name).map_err(|_| EmuError::UnknownKernel(name.to_string()))?;
    // SAFETY: the strings and arrays outlive the call; the caller vouches for the arguments.
    let rc = unsafe {
        kvlab_emu_launch(
            c_name.as_ptr(),
            grid.as_ptr(),
            block.as_ptr(),
            args.as_mut_ptr(),
        )
    };
    match rc {
        0 => Ok(()),
        1 => Err(EmuError::UnknownKernel(name.to_string())),
        _ => Err(EmuError::BadLaunch { grid, block }),
    }
}
