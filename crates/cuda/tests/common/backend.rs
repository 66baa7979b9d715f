//! Where the kernel tests run: the GPU (cudarc, `Ops`) or the CPU emulator (`kvlab-cuda-emu`,
//! the same `kernels/*.cu` compiled as host C++). Both are a [`Launcher`], so a test body calls
//! the same typed launches, with the same bounds checks and argument packing, on either; a
//! [`Buf`] is a device slice or a host allocation the emulated kernels address directly.

use std::ffi::c_void;

use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, ValidAsZeroBits};
use kvlab_cuda::CudaError;
use kvlab_cuda::device::Device;
use kvlab_cuda::error::Result;
use kvlab_cuda::ops::{Arg, Dev, Launcher, Ops};

/// Host memory for the emulator: `len` elements, freed on drop. Kernels write through raw
/// pointers, so the elements are never borrowed as a Rust slice while a launch may run.
pub struct HostBuf<T> {
    ptr: *mut T,
    len: usize,
}

impl<T: Copy> HostBuf<T> {
    fn from_slice(x: &[T]) -> HostBuf<T> {
        let b: Box<[T]> = x.to_vec().into_boxed_slice();
        let len = b.len();
        HostBuf {
            ptr: Box::into_raw(b).cast::<T>(),
            len,
        }
    }

    fn to_vec(&self) -> Vec<T> {
        // SAFETY: ptr addresses len initialised elements (from_slice) and no launch runs now
        // (the emulator returns when the grid is done).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }.to_vec()
    }
}

impl<T> Drop for HostBuf<T> {
    fn drop(&mut self) {
        // SAFETY: ptr and len came from Box::into_raw of a boxed slice of len elements.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

/// A buffer on the backend a test runs on.
pub enum Buf<T> {
    Gpu(CudaSlice<T>),
    Host(HostBuf<T>),
}

/// The CPU emulator of the kernels.
pub struct Emu;

impl Launcher for Emu {
    fn multiprocessors(&self) -> usize {
        // An H100's, so the v1/v2 choice is the one the GPU makes.
        132
    }

    unsafe fn launch_kernel(&self, name: &str, cfg: LaunchConfig, args: &[Arg]) -> Result<()> {
        // Each argument's value, addressed as cuLaunchKernel addresses them.
        let mut values: Vec<[u8; 8]> = args
            .iter()
            .map(|a| {
                let mut v = [0u8; 8];
                match *a {
                    Arg::Ptr(p) => v.copy_from_slice(&p.to_ne_bytes()),
                    Arg::I32(i) => v[..4].copy_from_slice(&i.to_ne_bytes()),
                    Arg::I64(i) => v.copy_from_slice(&i.to_ne_bytes()),
                    Arg::F32(f) => v[..4].copy_from_slice(&f.to_ne_bytes()),
                }
                v
            })
            .collect();
        let mut ptrs: Vec<*mut c_void> = values
            .iter_mut()
            .map(|v| v.as_mut_ptr().cast::<c_void>())
            .collect();
        let (g, b) = (cfg.grid_dim, cfg.block_dim);
        // SAFETY: the caller's contract (the arguments match the kernel, every address is a live
        // HostBuf holding what the grid touches); each value is 8-byte aligned storage.
        unsafe { kvlab_cuda_emu::launch(name, [g.0, g.1, g.2], [b.0, b.1, b.2], &mut ptrs) }
            .map_err(|e| match e {
                kvlab_cuda_emu::EmuError::UnknownKernel(n) => CudaError::MissingKernel(n),
                other => CudaError::Unsupported(other.to_string()),
            })
    }
}

/// The GPU (its device kept open while the test runs) or the emulator.
pub enum Backend {
    Gpu { _dev: Device, ops: Ops },
    Emu(Emu),
}

impl Backend {
    /// The buffer's address and length for the kernels.
    pub fn dev<T>(&self, b: &Buf<T>) -> Dev<T> {
        match (self, b) {
            (Backend::Gpu { ops, .. }, Buf::Gpu(s)) => ops.dev(s),
            // SAFETY: a live host allocation of h.len elements, alive while the test holds it.
            (Backend::Emu(_), Buf::Host(h)) => unsafe { Dev::from_raw_parts(h.ptr as u64, h.len) },
            _ => panic!("a buffer of one backend used on the other"),
        }
    }

    /// Uploads `x` as is.
    pub fn upload<T: DeviceRepr + Copy>(&self, x: &[T]) -> Buf<T> {
        match self {
            Backend::Gpu { ops, .. } => Buf::Gpu(ops.stream.clone_htod(x).expect("upload")),
            Backend::Emu(_) => Buf::Host(HostBuf::from_slice(x)),
        }
    }

    /// `n` zero elements.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits + Copy + Default>(&self, n: usize) -> Buf<T> {
        match self {
            Backend::Gpu { ops, .. } => Buf::Gpu(ops.stream.alloc_zeros(n).expect("alloc")),
            Backend::Emu(_) => Buf::Host(HostBuf::from_slice(&vec![T::default(); n])),
        }
    }

    /// Downloads after the work queued so far.
    pub fn to_vec<T: DeviceRepr + Copy + Default>(&self, b: &Buf<T>) -> Vec<T> {
        match (self, b) {
            (Backend::Gpu { ops, .. }, Buf::Gpu(s)) => {
                let v = ops.stream.clone_dtoh(s).expect("download");
                ops.stream.synchronize().expect("sync");
                v
            }
            (Backend::Emu(_), Buf::Host(h)) => h.to_vec(),
            _ => panic!("a buffer of one backend used on the other"),
        }
    }

    /// The GPU's `Ops` (cuBLAS tests only).
    pub fn ops(&self) -> Option<&Ops> {
        match self {
            Backend::Gpu { ops, .. } => Some(ops),
            Backend::Emu(_) => None,
        }
    }
}

impl Launcher for Backend {
    fn multiprocessors(&self) -> usize {
        match self {
            Backend::Gpu { ops, .. } => ops.multiprocessors(),
            Backend::Emu(e) => e.multiprocessors(),
        }
    }

    unsafe fn launch_kernel(&self, name: &str, cfg: LaunchConfig, args: &[Arg]) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe {
            match self {
                Backend::Gpu { ops, .. } => ops.launch_kernel(name, cfg, args),
                Backend::Emu(e) => e.launch_kernel(name, cfg, args),
            }
        }
    }
}
