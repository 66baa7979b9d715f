//! Buffers that a decode step reads from end to end (the KV cache) in memory Linux is asked to
//! back with 2 MiB transparent huge pages (`madvise(MADV_HUGEPAGE)`, before the buffer is
//! written). The kernel's default policy, `madvise`, gives huge pages only to memory that asks.
//! A decode step reads every cached key and value once, in order: with 4 KiB pages each 4 KiB
//! costs a TLB miss, with 2 MiB pages each 2 MiB. Measured on this project's 2-vCPU Xeon
//! (`kvlab depth`): Gemma 3 270M's f16 cache at 32,768 positions, a decode step ~0.8 ms sooner
//! of ~19 ms. Where the advice is refused, or THP is off, or the OS is not Linux, the buffers
//! are the same, in ordinary pages.
//!
//! The weights need no such advice where they are read in place from a file's memory map on a
//! kernel that caches files in large folios (Linux 6.18 with ext4 maps this project's
//! checkpoints with 2 MiB entries: `FilePmdMapped` in `/proc/PID/smaps_rollup`).

/// n zeros of `T` in a buffer advised for huge pages ([`advise`]). The buffer comes zeroed from
/// the allocator (`calloc`: a large one is fresh pages of the OS, not yet touched), so a store
/// sized for a long context takes memory only as it fills, 2 MiB at a time. A buffer smaller
/// than [`PREFAULT_BELOW_BYTES`] is touched here instead, page by page ([`prefault`]): it holds
/// at most one aligned huge page, so it would otherwise take most of its 4 KiB pages one fault
/// at a time in the middle of decoding (llama.cpp clears its whole KV buffer when it allocates
/// it).
pub fn zeroed<T: bytemuck::Zeroable>(n: usize) -> Vec<T> {
    let mut v = bytemuck::zeroed_vec(n);
    advise(&mut v);
    if std::mem::size_of_val(v.as_slice()) < PREFAULT_BELOW_BYTES {
        prefault(&mut v);
    }
    v
}

/// Buffers below this many bytes (4 MiB: room for one aligned 2 MiB page at most) are faulted
/// in when [`zeroed`] allocates them. The 256-position f32 cache of the stories15M shape (1.8
/// MiB of keys, as much of values) otherwise took ~860 page faults during its first 256
/// decode steps: 4 to 20 ms of ~300 ms on this project's 2-vCPU Xeon VM, where a fault costs 5
/// to 20 µs. Larger stores (a paged pool, a long context) keep taking memory as they fill.
pub const PREFAULT_BELOW_BYTES: usize = 4 << 20;

/// Writes a zero into every 4 KiB of `buf`, which holds zeros, so that the OS backs it now.
fn prefault<T: bytemuck::Zeroable>(buf: &mut [T]) {
    const PAGE: usize = 4096;
    let (p, len) = (buf.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(buf));
    for at in (0..len).step_by(PAGE) {
        // SAFETY: `at < len`, so the byte lies inside `buf`, which the caller holds exclusively;
        // it holds a zero already (every `T` of `buf` is all-zero bytes: `Zeroable`). The write
        // is volatile so that it is not dropped as a store of the value already there.
        unsafe { p.add(at).write_volatile(0) };
    }
}

/// Asks Linux to back the whole pages inside `buf` with transparent huge pages, where a
/// 2 MiB-aligned 2 MiB page fits (a smaller buffer gains nothing and is left alone). Pages
/// touched before the advice stay small until the kernel's khugepaged merges them, so advise
/// memory before writing it. `buf` holds only zeros: nothing that the advice could change.
fn advise<T>(buf: &mut [T]) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        // madvise takes whole pages of the system's size (4 KiB on x86-64; 16 or 64 KiB on
        // some arm64 kernels).
        // SAFETY: sysconf only reads a system constant.
        let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
            p if p > 0 => p as usize,
            _ => return,
        };
        let (start, len) = (buf.as_mut_ptr() as usize, std::mem::size_of_val(buf));
        let (lo, hi) = (start.next_multiple_of(page), (start + len) / page * page);
        if hi >= lo + HUGE {
            // SAFETY: [lo, hi) lies inside `buf`, memory the caller holds exclusively
            // (`&mut`), rounded inwards to whole pages; MADV_HUGEPAGE changes only how the
            // kernel backs those pages, never their contents, and a refusal (an error return)
            // is harmless, so it is ignored.
            unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = buf;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The buffers hold n zeros, small, large (advised) and empty, and can be written.
    #[test]
    fn buffers_hold_zeros() {
        for n in [0, 1, 1000, 3 << 20] {
            assert_eq!(zeroed::<f32>(n), vec![0.0f32; n]);
            let mut h = zeroed::<half::f16>(n);
            assert!(h.iter().all(|x| x.to_bits() == 0));
            h.iter_mut().for_each(|x| *x = half::f16::ONE);
            assert!(h.iter().all(|x| *x == half::f16::ONE));
        }
    }
}
