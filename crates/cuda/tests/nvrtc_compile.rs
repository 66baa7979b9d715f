//! Every kernel file compiles through NVRTC for sm_80 and sm_90, to PTX and to a cubin (NVRTC
//! runs ptxas for the real architecture, so register and shared-memory limits are checked
//! too) — no GPU needed, only
//! libnvrtc.so.13 on the loader path and a folder with cuda_fp16.h (see
//! scripts/cuda/setup-nvrtc.sh). Without them the test prints SKIPPED, unless
//! KVLAB_REQUIRE_NVRTC=1, which turns the skip into a failure (CI sets it).

use kvlab_cuda::kernels::FILES;
use kvlab_cuda::{device, nvrtc};

/// The architectures CI compiles for: A100 (sm_80) and H100/H200 (sm_90).
const ARCHS: [&str; 2] = ["compute_80", "compute_90"];

fn skip_or_fail(why: &str) {
    if std::env::var("KVLAB_REQUIRE_NVRTC").as_deref() == Ok("1") {
        panic!("KVLAB_REQUIRE_NVRTC=1 but {why}");
    }
    eprintln!("SKIPPED: nvrtc_compiles_every_kernel: {why}");
}

#[test]
fn nvrtc_compiles_every_kernel() {
    if !device::nvrtc_loadable() {
        skip_or_fail(
            "libnvrtc.so.13 is not loadable (run scripts/cuda/setup-nvrtc.sh and export \
             the LD_LIBRARY_PATH it prints)",
        );
        return;
    }
    let include = match nvrtc::include_dir() {
        Ok(d) => d,
        Err(e) => {
            skip_or_fail(&e.to_string());
            return;
        }
    };
    let mut failures = Vec::new();
    for arch in ARCHS {
        for file in FILES {
            match nvrtc::compile(file, arch, &include) {
                Ok(ptx) => {
                    let mut got = nvrtc::ptx_entries(&ptx);
                    let mut want: Vec<String> =
                        file.entries.iter().map(|e| e.to_string()).collect();
                    got.sort();
                    want.sort();
                    if got != want {
                        failures.push(format!(
                            "{} for {arch}: PTX entries {got:?}, kernels.rs lists {want:?}",
                            file.file
                        ));
                    } else {
                        eprintln!("compiled {} for {arch}: {} entries", file.file, got.len());
                    }
                }
                Err(e) => failures.push(e.to_string()),
            }
            let sm = arch.replace("compute_", "sm_");
            match nvrtc::compile_image(file, &sm, &include, nvrtc::Output::Cubin) {
                // An ELF file: what cuModuleLoadData takes as machine code.
                Ok(cubin) if cubin.starts_with(b"\x7fELF") => {
                    eprintln!(
                        "compiled {} for {sm}: {} bytes of cubin",
                        file.file,
                        cubin.len()
                    );
                }
                Ok(cubin) => failures.push(format!(
                    "{} for {sm}: NVRTC's cubin is not an ELF file ({} bytes)",
                    file.file,
                    cubin.len()
                )),
                Err(e) => failures.push(e.to_string()),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn nvrtc_reports_compile_errors_with_the_log() {
    if !device::nvrtc_loadable() {
        skip_or_fail("libnvrtc.so.13 is not loadable");
        return;
    }
    let Ok(include) = nvrtc::include_dir() else {
        skip_or_fail("no CUDA headers");
        return;
    };
    let bad = kvlab_cuda::kernels::KernelFile {
        file: "broken.cu",
        source: "#include \"common.cuh\"\nextern \"C\" __global__ void k(float* x) { x[0] = y; }\n",
        entries: &["k"],
    };
    let e = nvrtc::compile(&bad, "compute_80", &include).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("broken.cu") && msg.contains("compute_80"),
        "{msg}"
    );
    assert!(msg.contains("identifier \"y\" is undefined"), "{msg}");
    // The error names the kernel file's own line, not a line of the pasted header.
    assert!(msg.contains("broken.cu(2)"), "{msg}");
}
