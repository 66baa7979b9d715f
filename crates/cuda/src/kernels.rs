//! The kernel sources, embedded in the binary (so a binary built here runs on a GPU machine with
//! no checkout and no compiler but NVRTC), with the entry points each one defines.
//!
//! One `.cu` file per kernel family, in data-flow order of the forward pass. Entry points are
//! named `<kernel>_v<version>_<types>`: the version is the llm.c-style numbered improvement (each
//! file's header comment says what each version changed), the types are the activation element
//! type, `f32` or `f16`, and for the KV pool's kernels the cache's (`f32`, `f16`, `bf16`, `fp8`
//! for fp8-e4m3 codes, `i8` for int8 codes, `i4` for packed int4 codes; `dtype::CacheElem::NAME`). The `nvrtc_compiles_every_kernel` test checks that each
//! file compiles and defines exactly the entries listed here.

/// A header that kernel files include with `#include "<name>"`; `nvrtc::expand_includes` pastes
/// it in (NVRTC gets no file system access to our sources).
pub struct Header {
    /// The file name in `kernels/`, as the `#include` spells it, e.g. "common.cuh".
    pub name: &'static str,
    /// Its CUDA C text.
    pub source: &'static str,
}

/// One kernel file and the `extern "C"` entry points it defines.
pub struct KernelFile {
    /// The file name in `kernels/`, e.g. "rope.cu".
    pub file: &'static str,
    /// Its CUDA C text, includes not yet expanded.
    pub source: &'static str,
    /// Its `extern "C"` entry points, `<kernel>_v<version>_<types>`.
    pub entries: &'static [&'static str],
}

/// Headers the kernel files may include.
pub const HEADERS: &[Header] = &[
    Header {
        name: "common.cuh",
        source: include_str!("../kernels/common.cuh"),
    },
    Header {
        name: "attention.cuh",
        source: include_str!("../kernels/attention.cuh"),
    },
];

/// Every kernel file, in forward-pass order.
pub const FILES: &[KernelFile] = &[
    KernelFile {
        file: "embedding.cu",
        source: include_str!("../kernels/embedding.cu"),
        entries: &["embedding_v1_f32", "embedding_v1_f16"],
    },
    KernelFile {
        file: "rmsnorm.cu",
        source: include_str!("../kernels/rmsnorm.cu"),
        entries: &[
            "rmsnorm_v1_f32_f32",
            "rmsnorm_v1_f32_f16",
            "rmsnorm_v1_f16_f16",
        ],
    },
    KernelFile {
        file: "rope.cu",
        source: include_str!("../kernels/rope.cu"),
        entries: &["rope_v1_f32", "rope_v1_f16"],
    },
    KernelFile {
        file: "cache.cu",
        source: include_str!("../kernels/cache.cu"),
        entries: &[
            "reshape_and_cache_v1_f32_f32",
            "reshape_and_cache_v1_f32_f16",
            "reshape_and_cache_v1_f32_bf16",
            "reshape_and_cache_v1_f32_fp8",
            "reshape_and_cache_v1_f32_i8",
            "reshape_and_cache_v1_f16_f32",
            "reshape_and_cache_v1_f16_f16",
            "reshape_and_cache_v1_f16_bf16",
            "reshape_and_cache_v1_f16_fp8",
            "reshape_and_cache_v1_f16_i8",
            "reshape_and_cache_v1_f32_i4",
            "reshape_and_cache_v1_f16_i4",
            "copy_blocks_v1_f32",
            "copy_blocks_v1_f16",
            "copy_blocks_v1_bf16",
            "copy_blocks_v1_fp8",
            "copy_blocks_v1_i8",
            "copy_blocks_v1_i4",
            "int4_close_keys_v1",
            "int4_open_keys_v1",
            "kv_read_back_v1_f32_f16",
            "kv_read_back_v1_f32_bf16",
            "kv_read_back_v1_f32_fp8",
            "kv_read_back_v1_f32_i8",
            "kv_read_back_v1_f32_i4",
            "kv_read_back_v1_f16_f16",
            "kv_read_back_v1_f16_bf16",
            "kv_read_back_v1_f16_fp8",
            "kv_read_back_v1_f16_i8",
            "kv_read_back_v1_f16_i4",
        ],
    },
    KernelFile {
        file: "paged_attention.cu",
        source: include_str!("../kernels/paged_attention.cu"),
        entries: &[
            "paged_attention_v1_f32_f32",
            "paged_attention_v1_f32_f16",
            "paged_attention_v1_f32_bf16",
            "paged_attention_v1_f32_fp8",
            "paged_attention_v1_f32_i8",
            "paged_attention_v1_f16_f32",
            "paged_attention_v1_f16_f16",
            "paged_attention_v1_f16_bf16",
            "paged_attention_v1_f16_fp8",
            "paged_attention_v1_f16_i8",
            "paged_attention_v1_f32_i4",
            "paged_attention_v1_f16_i4",
            "paged_attention_v2_f32_f32",
            "paged_attention_v2_f32_f16",
            "paged_attention_v2_f32_bf16",
            "paged_attention_v2_f32_fp8",
            "paged_attention_v2_f32_i8",
            "paged_attention_v2_f16_f32",
            "paged_attention_v2_f16_f16",
            "paged_attention_v2_f16_bf16",
            "paged_attention_v2_f16_fp8",
            "paged_attention_v2_f16_i8",
            "paged_attention_v2_f32_i4",
            "paged_attention_v2_f16_i4",
            "paged_attention_v2_reduce_f32",
            "paged_attention_v2_reduce_f16",
        ],
    },
    KernelFile {
        file: "prefill_attention.cu",
        source: include_str!("../kernels/prefill_attention.cu"),
        entries: &[
            "prefill_attention_v1_f32_f32",
            "prefill_attention_v1_f32_f16",
            "prefill_attention_v1_f32_bf16",
            "prefill_attention_v1_f32_fp8",
            "prefill_attention_v1_f32_i8",
            "prefill_attention_v1_f16_f32",
            "prefill_attention_v1_f16_f16",
            "prefill_attention_v1_f16_bf16",
            "prefill_attention_v1_f16_fp8",
            "prefill_attention_v1_f16_i8",
            "prefill_attention_v1_f32_i4",
            "prefill_attention_v1_f16_i4",
        ],
    },
    KernelFile {
        file: "activation.cu",
        source: include_str!("../kernels/activation.cu"),
        entries: &[
            "glu_silu_v1_f32",
            "glu_silu_v1_f16",
            "glu_gelu_tanh_v1_f32",
            "glu_gelu_tanh_v1_f16",
            "residual_add_v1_f32",
            "residual_add_v1_f16",
            "add_bias_v1_f32",
            "add_bias_v1_f16",
            "gather_rows_v1_f32",
        ],
    },
    KernelFile {
        file: "argmax.cu",
        source: include_str!("../kernels/argmax.cu"),
        entries: &["argmax_v1_f32"],
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names_are_unique_and_appear_in_their_source() {
        let mut all: Vec<&str> = FILES
            .iter()
            .flat_map(|f| f.entries.iter().copied())
            .collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "an entry point is listed twice");
        for f in FILES {
            for e in f.entries {
                // Macro-generated names appear as their prefix plus `##SUFFIX` or literally.
                let stem = e.rsplit_once("_v").map_or(*e, |(s, _)| s);
                assert!(f.source.contains(stem), "{e} not in {}", f.file);
            }
        }
    }
}
