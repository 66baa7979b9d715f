//! Buffers that a decode step reads from end to end (the KV cache) in memory Linux is asked to
//! back with 2 MiB transparent huge pages (`madvise(MADV_HUGEPAGE)`, before any page is
//! touched). The kernel's default policy, `madvise`, gives huge pages only to memory that asks.
//! A decode step reads every cached key and value once, in order: with 4 KiB pages each 4 KiB
//! costs a TLB miss, with 2 MiB pages each 2 MiB. Measured on this project's 2-vCPU Xeon
//! (`kvlab depth`): Gemma 3 270M's f16 cache at 32,768 positions, a decode step ~0.8 ms sooner
//! of ~19 ms. Where the advice is refused, or THP is off, or the OS is not Linux, the buffers
//! are the same, in ordinary pages.
//!
//! The weights need no such advice where they are read in place from a file's memory map on a
//! kernel that caches files in large folios (Linux 6.18 with ext4 maps this project's
//! checkpoints with 2 MiB entries: `FilePmdMapped` in `/proc/PID/smaps_rollup`).

/// n copies of `value` in a buffer advised for huge pages ([`advise`]) before it is written.
pub fn filled<T: Clone>(n: usize, value: T) -> Vec<T> {
    let mut v = Vec::with_capacity(n);
    advise(v.spare_capacity_mut());
    v.resize(n, value);
    v
}

/// Asks Linux to back the whole 4 KiB pages inside `buf` with transparent huge pages, where a
/// 2 MiB-aligned 2 MiB page fits (a smaller buffer gains nothing and is left alone). Pages
/// touched before the advice stay small until the kernel's khugepaged merges them, so advise
/// memory before writing it.
fn advise<T>(buf: &mut [T]) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        const PAGE: usize = 4 << 10; // madvise takes whole pages
        let (start, len) = (buf.as_mut_ptr() as usize, std::mem::size_of_val(buf));
        let (lo, hi) = (start.next_multiple_of(PAGE), (start + len) / PAGE * PAGE);
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

    /// The buffers hold what they were given, small, large (advised) and empty.
    #[test]
    fn buffers_hold_their_values() {
        for n in [0, 1, 1000, 3 << 20] {
            assert_eq!(filled(n, 7u16), vec![7u16; n]);
            assert_eq!(filled(n, 0.5f32), vec![0.5f32; n]);
        }
    }
}
