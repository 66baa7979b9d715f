//! Finding the GPU: a cheap probe that never panics, and the context + stream the engine runs on.
//!
//! cudarc is built with `dynamic-loading`: libcuda, libnvrtc and libcublas are opened with
//! `dlopen` on first use, so this crate builds and its CPU tests run on machines without CUDA.
//! cudarc *panics* when it first calls into a library it cannot load, so every entry point here
//! asks cudarc's `is_culib_present()` (a plain `dlopen` attempt) before touching the library, and
//! turns absence into a typed [`CudaError`].

use std::sync::Arc;

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaStream};
use serde::Serialize;

use crate::error::{CudaError, Result};

/// What the probe found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceInfo {
    /// The device's index in the driver's numbering (0 for the probe).
    pub ordinal: usize,
    /// The driver's product name, e.g. "NVIDIA H100 80GB HBM3".
    pub name: String,
    /// (major, minor), e.g. (9, 0) for an H100.
    pub compute_capability: (i32, i32),
    /// Streaming multiprocessors (SMs), at least 1.
    pub multiprocessors: usize,
    /// Bytes of device memory, total and free at probe time.
    pub total_mem: usize,
    /// Bytes of device memory free at probe time.
    pub free_mem: usize,
}

impl std::fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GPU {}: {} (sm_{}{}, {} SMs, {:.1} GiB, {:.1} GiB free)",
            self.ordinal,
            self.name,
            self.compute_capability.0,
            self.compute_capability.1,
            self.multiprocessors,
            self.total_mem as f64 / GIB,
            self.free_mem as f64 / GIB
        )
    }
}

const GIB: f64 = (1u64 << 30) as f64;

/// Whether libcuda can be loaded.
pub fn driver_loadable() -> bool {
    // SAFETY: a dlopen of the vendor's driver library by its usual names; loading runs the
    // library's initialisers and nothing else. cudarc keeps no state from this call.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether libnvrtc (of the CUDA major version cudarc was built for, 13) can be loaded.
pub fn nvrtc_loadable() -> bool {
    // SAFETY: as in `driver_loadable`, for libnvrtc.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Whether libcublas can be loaded.
pub fn cublas_loadable() -> bool {
    // SAFETY: as in `driver_loadable`, for libcublas.
    unsafe { cudarc::cublas::sys::is_culib_present() }
}

/// Looks for GPU 0 and reports it, without panicking on machines with no driver or no GPU.
///
/// # Errors
/// [`CudaError::NoDriver`] when libcuda cannot be loaded; [`CudaError::NoDevice`] when the
/// driver finds no device. Does not check NVRTC or cuBLAS (see [`Device::open`]).
pub fn probe() -> Result<DeviceInfo> {
    let ctx = open_context(0)?;
    device_info(&ctx)
}

fn open_context(ordinal: usize) -> Result<Arc<CudaContext>> {
    if !driver_loadable() {
        return Err(CudaError::NoDriver);
    }
    let count = CudaContext::device_count().map_err(|e| CudaError::NoDevice(format!("{e:?}")))?;
    if count <= 0 {
        return Err(CudaError::NoDevice("cuDeviceGetCount returned 0".into()));
    }
    if ordinal >= count as usize {
        return Err(CudaError::NoDevice(format!(
            "device {ordinal} asked for, {count} present"
        )));
    }
    CudaContext::new(ordinal).map_err(|e| CudaError::NoDevice(format!("{e:?}")))
}

fn device_info(ctx: &Arc<CudaContext>) -> Result<DeviceInfo> {
    let (free_mem, total_mem) = ctx.mem_get_info()?;
    Ok(DeviceInfo {
        ordinal: ctx.ordinal(),
        name: ctx.name()?,
        compute_capability: ctx.compute_capability()?,
        multiprocessors: ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            .max(1) as usize,
        total_mem,
        free_mem,
    })
}

/// An open GPU: its context and the one stream every kernel, copy and GEMM of the engine runs on
/// (so work is ordered without events).
pub struct Device {
    /// The GPU's primary context (event tracking off: one stream orders everything).
    pub ctx: Arc<CudaContext>,
    /// The one stream every kernel, copy and GEMM is queued on.
    pub stream: Arc<CudaStream>,
    /// What the GPU is, as read when it was opened.
    pub info: DeviceInfo,
}

impl Device {
    /// Opens GPU `ordinal` and checks that NVRTC and cuBLAS can be loaded too.
    ///
    /// # Errors
    /// [`CudaError::NoDriver`], [`CudaError::NoDevice`], [`CudaError::NoNvrtc`],
    /// [`CudaError::NoCublas`], or a driver error.
    pub fn open(ordinal: usize) -> Result<Device> {
        let ctx = open_context(ordinal)?;
        if !nvrtc_loadable() {
            return Err(CudaError::NoNvrtc("libnvrtc.so.13"));
        }
        if !cublas_loadable() {
            return Err(CudaError::NoCublas);
        }
        // SAFETY: every buffer of this engine is used on the one stream created below, so
        // cudarc's per-buffer events (for cross-stream ordering) are not needed: stream order
        // already puts each use after the allocation and each free after the last use.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let info = device_info(&ctx)?;
        Ok(Device { ctx, stream, info })
    }

    /// Bytes of device memory (free, total) now.
    ///
    /// # Errors
    /// A driver error.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        Ok(self.ctx.mem_get_info()?)
    }

    /// Waits for all work queued on the stream.
    ///
    /// # Errors
    /// A driver error (including any asynchronous kernel fault).
    pub fn sync(&self) -> Result<()> {
        Ok(self.stream.synchronize()?)
    }
}
