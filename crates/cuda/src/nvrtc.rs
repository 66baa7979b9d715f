//! Run-time compilation of `kernels/*.cu` with NVRTC, for the architecture of the GPU at hand.
//!
//! * Headers: our own (`common.cuh`, `attention.cuh`) are pasted in by [`expand_includes`];
//!   CUDA's (`cuda_fp16.h`) come from the first folder holding `cuda_fp16.h` among
//!   `$KVLAB_CUDA_INCLUDE`, `$CUDA_HOME/include`, `/usr/local/cuda/include`
//!   ([`resolve_include_dir`]).
//! * Architecture: PTX for the virtual architecture `compute_XY` of the device's compute
//!   capability X.Y ([`arch_for`]); the driver JIT-compiles it to the exact GPU when the module is
//!   loaded. CI compiles every file for `compute_80` and `compute_90` without a GPU.
//! * Cache: each (file, arch) is compiled once per process ([`ptx`]); engines and tests share it.
//!
//! No nvcc is needed anywhere: only libnvrtc.so.13 (toolkit or PyPI wheel) and the headers.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::nvrtc::{CompileError, CompileOptions};

use crate::error::{CudaError, Result};
use crate::kernels::{HEADERS, KernelFile};

/// The header whose presence marks a usable CUDA include folder.
pub const MARKER_HEADER: &str = "cuda_fp16.h";

/// Where `cuda_fp16.h` is looked for, in order: `$KVLAB_CUDA_INCLUDE`, `$CUDA_HOME/include`,
/// `/usr/local/cuda/include`. Pure: the environment and the file test are passed in.
///
/// # Errors
/// [`CudaError::NoHeaders`] listing every place tried.
pub fn resolve_include_dir(
    kvlab_cuda_include: Option<OsString>,
    cuda_home: Option<OsString>,
    has_marker: impl Fn(&Path) -> bool,
) -> Result<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(dir) = kvlab_cuda_include.filter(|d| !d.is_empty()) {
        candidates.push(PathBuf::from(dir));
    }
    if let Some(home) = cuda_home.filter(|d| !d.is_empty()) {
        candidates.push(PathBuf::from(home).join("include"));
    }
    candidates.push(PathBuf::from("/usr/local/cuda/include"));
    if let Some(found) = candidates.iter().find(|d| has_marker(d)) {
        return Ok(found.clone());
    }
    Err(CudaError::NoHeaders {
        searched: candidates
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// [`resolve_include_dir`] over this process's environment and file system.
///
/// # Errors
/// [`CudaError::NoHeaders`].
pub fn include_dir() -> Result<PathBuf> {
    resolve_include_dir(
        std::env::var_os("KVLAB_CUDA_INCLUDE"),
        std::env::var_os("CUDA_HOME"),
        |d| d.join(MARKER_HEADER).is_file(),
    )
}

/// NVRTC's `--gpu-architecture` for compute capability (major, minor): the virtual
/// architecture `compute_<major><minor>`, so the PTX runs on that GPU and newer ones.
pub fn arch_for(compute_capability: (i32, i32)) -> String {
    format!("compute_{}{}", compute_capability.0, compute_capability.1)
}

/// Replaces every line `#include "<header>"` naming one of our [`HEADERS`] by the header's text,
/// recursively (headers carry include guards, so repeats are harmless). Other includes
/// (`<cuda_fp16.h>`) are left to NVRTC.
///
/// # Errors
/// [`CudaError::Unsupported`] for an unknown quoted header or includes nested over 8 deep.
pub fn expand_includes(source: &str) -> Result<String> {
    fn expand(source: &str, depth: usize, out: &mut String) -> Result<()> {
        if depth > 8 {
            return Err(CudaError::Unsupported(
                "kernel headers include each other more than 8 deep".into(),
            ));
        }
        for line in source.lines() {
            let quoted = line
                .trim()
                .strip_prefix("#include")
                .map(str::trim)
                .and_then(|r| r.strip_prefix('"'))
                .and_then(|r| r.strip_suffix('"'));
            match quoted {
                Some(name) => {
                    let header = HEADERS.iter().find(|h| h.name == name).ok_or_else(|| {
                        CudaError::Unsupported(format!(
                            "kernel source includes \"{name}\", which is not in kernels.rs HEADERS"
                        ))
                    })?;
                    expand(header.source, depth + 1, out)?;
                }
                None => {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        Ok(())
    }
    let mut out = String::with_capacity(source.len() * 2);
    expand(source, 0, &mut out)?;
    Ok(out)
}

/// The NVRTC options kvlab compiles with (before the include path).
pub fn compile_flags(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        // IEEE division and square root (NVRTC's default, stated): the f32 parity tolerance
        // (1e-5 relative) leaves no room for the approximate ones.
        "--prec-div=true".into(),
        "--prec-sqrt=true".into(),
    ]
}

/// Compiles one kernel file to PTX for `arch` (e.g. "compute_90"), headers from `include`.
///
/// # Errors
/// [`CudaError::NoNvrtc`] if libnvrtc cannot be loaded; [`CudaError::Compile`] with NVRTC's log.
pub fn compile(file: &KernelFile, arch: &str, include: &Path) -> Result<String> {
    if !crate::device::nvrtc_loadable() {
        return Err(CudaError::NoNvrtc("libnvrtc.so.13"));
    }
    let source = expand_includes(file.source)?;
    let opts = CompileOptions {
        include_paths: vec![include.display().to_string()],
        options: compile_flags(arch),
        name: Some(file.file.to_string()),
        ..CompileOptions::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(source, opts).map_err(|e| {
        let log = match e {
            CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => format!("{other:?}"),
        };
        CudaError::Compile {
            file: file.file,
            arch: arch.to_string(),
            log,
        }
    })?;
    Ok(ptx.to_src())
}

type PtxCache = Mutex<HashMap<(&'static str, String), Arc<str>>>;

/// PTX of `file` for `arch`, compiled at most once per process.
///
/// # Errors
/// As [`compile`] and [`include_dir`].
pub fn ptx(file: &KernelFile, arch: &str) -> Result<Arc<str>> {
    static CACHE: OnceLock<PtxCache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let key = (file.file, arch.to_string());
    if let Some(p) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Ok(p.clone());
    }
    let compiled: Arc<str> = compile(file, arch, &include_dir()?)?.into();
    cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, compiled.clone());
    Ok(compiled)
}

/// The entry points (`.entry NAME(`) that a PTX module defines, in order.
pub fn ptx_entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| {
            let rest = l.trim_start();
            let rest = rest.strip_prefix(".visible").map_or(rest, str::trim_start);
            let rest = rest.strip_prefix(".entry")?.trim_start();
            let end = rest.find(|c: char| c == '(' || c.is_whitespace())?;
            Some(rest[..end].to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn include_dir_prefers_kvlab_then_cuda_home_then_usr_local() {
        let all = |_: &Path| true;
        let dir = resolve_include_dir(Some("/a".into()), Some("/b".into()), all).unwrap();
        assert_eq!(dir, PathBuf::from("/a"));
        let dir = resolve_include_dir(None, Some("/b".into()), all).unwrap();
        assert_eq!(dir, PathBuf::from("/b/include"));
        let dir = resolve_include_dir(Some("".into()), None, all).unwrap();
        assert_eq!(dir, PathBuf::from("/usr/local/cuda/include"));
        // A set variable whose folder lacks the header falls through to the next place.
        let only_b = |d: &Path| d == Path::new("/b/include");
        let dir = resolve_include_dir(Some("/a".into()), Some("/b".into()), only_b).unwrap();
        assert_eq!(dir, PathBuf::from("/b/include"));
    }

    #[test]
    fn missing_headers_name_every_place_and_the_fix() {
        let e = resolve_include_dir(Some("/a".into()), Some("/b".into()), |_| false).unwrap_err();
        let msg = e.to_string();
        for s in [
            "/a",
            "/b/include",
            "/usr/local/cuda/include",
            "KVLAB_CUDA_INCLUDE",
        ] {
            assert!(msg.contains(s), "{msg}");
        }
        assert!(e.is_unavailable());
    }

    #[test]
    fn arch_is_the_virtual_architecture() {
        assert_eq!(arch_for((8, 0)), "compute_80");
        assert_eq!(arch_for((9, 0)), "compute_90");
        assert_eq!(arch_for((12, 0)), "compute_120");
        assert!(compile_flags("compute_90").contains(&"--gpu-architecture=compute_90".into()));
    }

    #[test]
    fn includes_are_expanded_once_per_line_and_unknown_ones_refused() {
        let src = "#include \"attention.cuh\"\n#include <cuda_fp16.h>\nint x;\n";
        let out = expand_includes(src).unwrap();
        assert!(out.contains("KVLAB_ATTENTION_CUH"));
        assert!(
            out.contains("block_sum"),
            "common.cuh pasted through attention.cuh"
        );
        assert!(
            !out.lines()
                .any(|l| l.trim_start().starts_with("#include \"")),
            "no quoted include is left for NVRTC"
        );
        assert!(out.contains("int x;"));
        assert!(expand_includes("#include \"nope.cuh\"").is_err());
    }

    #[test]
    fn ptx_entries_are_parsed() {
        let ptx = "//\n.visible .entry embedding_v1_f32(\n\t.param .u64 a\n)\n.entry foo (\n";
        assert_eq!(ptx_entries(ptx), vec!["embedding_v1_f32", "foo"]);
    }
}
