//! Run-time compilation of `kernels/*.cu` with NVRTC, for the architecture of the GPU at hand.
//!
//! * Headers: our own (`common.cuh`, `attention.cuh`) are pasted in by [`expand_includes`];
//!   CUDA's (`cuda_fp16.h`) come from the first folder holding `cuda_fp16.h` among
//!   `$KVLAB_CUDA_INCLUDE`, `$CUDA_HOME/include`, `/usr/local/cuda/include`
//!   ([`resolve_include_dir`]).
//! * Architecture: a cubin (machine code) for the device's real architecture `sm_XY`
//!   ([`sm_arch_for`]), which any driver that knows the GPU loads as is; PTX for the virtual
//!   architecture `compute_XY` ([`arch_for`]) is the fallback, which the driver JIT-compiles, and
//!   which a driver older than the NVRTC refuses (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`): see
//!   `ops::load_module`. CI compiles every file both ways for sm_80 and sm_90 without a GPU.
//! * Cache: each (file, arch) is compiled once per process ([`compiled`]); engines and tests
//!   share it.
//! * Errors point into our files: pasted headers are bracketed by `#line` directives, so NVRTC's
//!   and the device's line numbers name `common.cuh:42`, not line 342 of the pasted source.
//!
//! No nvcc is needed anywhere: only libnvrtc.so.13 (toolkit or PyPI wheel) and the headers.

use std::collections::HashMap;
use std::ffi::{CStr, CString, OsString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

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

/// Replaces every line `#include "<header>"` naming one of our [`HEADERS`] by the header's text,
/// recursively (headers carry include guards, so repeats are harmless), between `#line`
/// directives that keep diagnostics pointing at `file` and the header's own lines. Other
/// includes (`<cuda_fp16.h>`) are left to NVRTC.
///
/// # Errors
/// [`CudaError::Unsupported`] for an unknown quoted header or includes nested over 8 deep.
pub fn expand_includes(file: &str, source: &str) -> Result<String> {
    fn expand(file: &str, source: &str, depth: usize, out: &mut String) -> Result<()> {
        if depth > 8 {
            return Err(CudaError::Unsupported(
                "kernel headers include each other more than 8 deep".into(),
            ));
        }
        for (i, line) in source.lines().enumerate() {
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
                    out.push_str(&format!("#line 1 \"{name}\"\n"));
                    expand(name, header.source, depth + 1, out)?;
                    out.push_str(&format!("#line {} \"{file}\"\n", i + 2));
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
    out.push_str(&format!("#line 1 \"{file}\"\n"));
    expand(file, source, 0, &mut out)?;
    Ok(out)
}

/// NVRTC's `--gpu-architecture` for PTX for compute capability (major, minor): the virtual
/// architecture `compute_<major><minor>`, so the PTX runs on that GPU and newer ones.
pub fn arch_for(compute_capability: (i32, i32)) -> String {
    format!("compute_{}{}", compute_capability.0, compute_capability.1)
}

/// NVRTC's `--gpu-architecture` for a cubin for compute capability (major, minor): the real
/// architecture `sm_<major><minor>`, machine code for exactly that GPU.
pub fn sm_arch_for(compute_capability: (i32, i32)) -> String {
    format!("sm_{}{}", compute_capability.0, compute_capability.1)
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
        // Source lines in the code, for compute-sanitizer's and the driver's reports.
        "--generate-line-info".into(),
    ]
}

/// The version of the libnvrtc this process loaded, (major, minor).
///
/// # Errors
/// [`CudaError::NoNvrtc`] when none can be loaded.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    if !crate::device::nvrtc_loadable() {
        return Err(CudaError::NoNvrtc("libnvrtc.so.13"));
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints through the pointers given, which live on this stack.
    let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    status
        .result()
        .map_err(|e| CudaError::Unsupported(format!("nvrtcVersion failed: {e:?}")))?;
    Ok((major, minor))
}

/// The CUDA major version kvlab's bindings are built for (cudarc's `cuda-13000` feature).
pub const CUDA_MAJOR: i32 = 13;

/// Checks that the loaded libnvrtc is CUDA 13's: cudarc opens the first of `libnvrtc.so`,
/// `libnvrtc.so.13`, `libnvrtc.so.12`, ... that loads, so an older toolkit earlier on the loader
/// path would otherwise be used silently.
///
/// # Errors
/// [`CudaError::NoNvrtc`]; [`CudaError::WrongVersion`] for another major version.
pub fn check_nvrtc_version() -> Result<(i32, i32)> {
    let v = nvrtc_version()?;
    if v.0 != CUDA_MAJOR {
        return Err(CudaError::WrongVersion {
            lib: "libnvrtc",
            found: format!("{}.{}", v.0, v.1),
        });
    }
    Ok(v)
}

/// What NVRTC is asked to produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Output {
    /// PTX text, for a virtual architecture `compute_XY`.
    Ptx,
    /// A cubin (ELF with machine code), for a real architecture `sm_XY`.
    Cubin,
}

/// Compiles one kernel file for `arch` ("compute_90" for [`Output::Ptx`], "sm_90" for
/// [`Output::Cubin`]), headers from `include`, and returns the image's bytes (PTX without its
/// trailing NUL).
///
/// # Errors
/// [`CudaError::NoNvrtc`] / [`CudaError::WrongVersion`] if no CUDA 13 libnvrtc can be loaded;
/// [`CudaError::Compile`] with NVRTC's log.
pub fn compile_image(
    file: &KernelFile,
    arch: &str,
    include: &Path,
    output: Output,
) -> Result<Vec<u8>> {
    use cudarc::nvrtc::{result, sys};
    check_nvrtc_version()?;
    let fail = |log: String| CudaError::Compile {
        file: file.file,
        arch: arch.to_string(),
        log,
    };
    let source = CString::new(expand_includes(file.file, file.source)?)
        .map_err(|_| fail("the source holds a NUL byte".into()))?;
    let name =
        CString::new(file.file).map_err(|_| fail("the file name holds a NUL byte".into()))?;
    let mut options = compile_flags(arch);
    options.push(format!("--include-path={}", include.display()));
    let prog = result::create_program(&source, Some(&name)).map_err(|e| fail(format!("{e:?}")))?;
    // SAFETY: `prog` was created above and is destroyed once, at the end of this block; the
    // source and name it refers to outlive it. The image buffers are sized by NVRTC's own size
    // query before NVRTC writes into them.
    unsafe {
        let compiled = result::compile_program(prog, &options);
        let image = match compiled {
            Err(e) => {
                let log = result::get_program_log(prog)
                    .map(|l| CStr::from_ptr(l.as_ptr()).to_string_lossy().into_owned())
                    .unwrap_or_else(|_| format!("{e:?} (no log)"));
                Err(fail(log))
            }
            Ok(()) => match output {
                Output::Ptx => result::get_ptx(prog)
                    .map(|p| {
                        p.into_iter()
                            .map(|c| c as u8)
                            .take_while(|&b| b != 0)
                            .collect()
                    })
                    .map_err(|e| fail(format!("nvrtcGetPTX: {e:?}"))),
                Output::Cubin => {
                    let mut size = 0usize;
                    sys::nvrtcGetCUBINSize(prog, &mut size)
                        .result()
                        .map_err(|e| fail(format!("nvrtcGetCUBINSize: {e:?}")))
                        .and_then(|()| {
                            let mut bytes = vec![0u8; size];
                            sys::nvrtcGetCUBIN(prog, bytes.as_mut_ptr().cast())
                                .result()
                                .map(|()| bytes)
                                .map_err(|e| fail(format!("nvrtcGetCUBIN: {e:?}")))
                        })
                }
            },
        };
        let _ = result::destroy_program(prog);
        image
    }
}

/// PTX of one kernel file for the virtual architecture `arch` (e.g. "compute_90").
///
/// # Errors
/// As [`compile_image`].
pub fn compile(file: &KernelFile, arch: &str, include: &Path) -> Result<String> {
    let bytes = compile_image(file, arch, include, Output::Ptx)?;
    String::from_utf8(bytes).map_err(|_| CudaError::Compile {
        file: file.file,
        arch: arch.to_string(),
        log: "NVRTC returned PTX that is not UTF-8".into(),
    })
}

type ImageCache = Mutex<HashMap<(&'static str, String, Output), Arc<[u8]>>>;

/// `file` compiled for `arch` as `output`, compiled at most once per process.
///
/// # Errors
/// As [`compile_image`] and [`include_dir`].
pub fn compiled(file: &KernelFile, arch: &str, output: Output) -> Result<Arc<[u8]>> {
    static CACHE: OnceLock<ImageCache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let key = (file.file, arch.to_string(), output);
    if let Some(p) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Ok(p.clone());
    }
    let image: Arc<[u8]> = compile_image(file, arch, &include_dir()?, output)?.into();
    cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, image.clone());
    Ok(image)
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
        assert_eq!(sm_arch_for((9, 0)), "sm_90");
        assert!(compile_flags("compute_90").contains(&"--gpu-architecture=compute_90".into()));
    }

    #[test]
    fn includes_are_expanded_once_per_line_and_unknown_ones_refused() {
        let src = "#include \"attention.cuh\"\n#include <cuda_fp16.h>\nint x;\n";
        let out = expand_includes("k.cu", src).unwrap();
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
        assert!(expand_includes("k.cu", "#include \"nope.cuh\"").is_err());
        // Diagnostics point into the right file: the header's lines, then the kernel's again.
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "#line 1 \"k.cu\"");
        assert!(lines.contains(&"#line 1 \"attention.cuh\""));
        assert!(lines.contains(&"#line 1 \"common.cuh\""));
        let back = lines.iter().position(|l| *l == "#line 2 \"k.cu\"").unwrap();
        assert_eq!(lines[back + 1], "#include <cuda_fp16.h>");
    }

    #[test]
    fn ptx_entries_are_parsed() {
        let ptx = "//\n.visible .entry embedding_v1_f32(\n\t.param .u64 a\n)\n.entry foo (\n";
        assert_eq!(ptx_entries(ptx), vec!["embedding_v1_f32", "foo"]);
    }
}
