//! The emulator's checks can fail: kernels with planted bugs (crates/cuda/emu/planted/planted.cu)
//! run on it. A missing `__syncthreads` shows in every run; an out-of-bounds write is caught by
//! AddressSanitizer when scripts/cuda/emu-sanitize.sh builds the emulator with it.

mod common;

use common::backend::{Backend, Emu};
use common::up;
use cudarc::driver::LaunchConfig;
use kvlab_cuda::ops::{Arg, Launcher};

fn block(threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

#[test]
fn emu_planted_missing_sync_reads_a_slot_not_yet_written() {
    let b = Backend::Emu(Emu);
    let n = 128;
    let x: Vec<f32> = (1..=n).map(|i| i as f32).collect();
    let buf = up::<f32>(&b, &x);
    let d = b.dev(&buf);
    // SAFETY: planted_missing_sync_v1(float* x) reads and writes x[0..blockDim.x], 128 floats.
    unsafe {
        b.launch_kernel(
            "planted_missing_sync_v1",
            block(n as u32),
            &[Arg::Ptr(d.need(n, "x").unwrap())],
        )
    }
    .unwrap();
    let got = common::down::<f32>(&b, &buf);
    let reversed: Vec<f32> = x.iter().rev().copied().collect();
    let stale = got.iter().zip(&reversed).filter(|(g, w)| g != w).count();
    eprintln!("missing __syncthreads: {stale} of {n} threads read a slot not yet written");
    assert!(stale > 0, "the planted race went unseen: {got:?}");
}

#[test]
fn emu_planted_out_of_bounds_write_is_caught_under_asan() {
    if std::env::var("KVLAB_EMU_PLANTED_OOB").as_deref() != Ok("1") {
        eprintln!(
            "SKIPPED: emu_planted_out_of_bounds_write_is_caught_under_asan writes past a buffer on \
             purpose; scripts/cuda/emu-sanitize.sh runs it under AddressSanitizer \
             (KVLAB_EMU_PLANTED_OOB=1) and requires ASan's heap-buffer-overflow report"
        );
        return;
    }
    let b = Backend::Emu(Emu);
    let n = 100;
    let buf = up::<f32>(&b, &vec![0.0; n]);
    let d = b.dev(&buf);
    // SAFETY: deliberately not: the kernel writes x[n], one past the end. Only run with
    // AddressSanitizer watching, which stops the process at that write.
    unsafe {
        b.launch_kernel(
            "planted_out_of_bounds_v1",
            block(128),
            &[Arg::Ptr(d.need(n, "x").unwrap()), Arg::I32(n as i32)],
        )
    }
    .unwrap();
    panic!(
        "the out-of-bounds write was not caught: is the emulator built with KVLAB_EMU_SANITIZE=address?"
    );
}
