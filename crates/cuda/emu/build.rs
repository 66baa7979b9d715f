//! Compiles every kernel file of `../kernels/` (the files NVRTC compiles, unmodified) as host C++
//! against `include/cuda_emu.h`, one translation unit per file, with a registry of the entry
//! points `../src/kernels.rs` lists for it, plus `src/runtime.cpp`. `-ffp-contract=off`: each
//! operation rounded on its own, as Rust computes the references. (The device may fuse `a*b+c`,
//! NVRTC's default `--fmad=true`; kernels use the `__f*_rn` intrinsics where bits must match.)
//!
//! `KVLAB_EMU_SANITIZE=address,undefined` (any of gcc's `-fsanitize=` lists) instruments the
//! kernels and the runtime (which then tells AddressSanitizer of every fiber switch) and links
//! the sanitizers' runtimes; scripts/cuda/emu-sanitize.sh runs the emulated tests so, and
//! shows that a planted out-of-bounds write (`planted/planted.cu`) is caught.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// (file, entries) of every `KernelFile { file: "...", ..., entries: &[...] }` in kernels.rs.
fn kernel_files(kernels_rs: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut rest = kernels_rs;
    while let Some(i) = rest.find("file: \"") {
        rest = &rest[i + 7..];
        let end = rest.find('"').expect("file name ends");
        let file = rest[..end].to_string();
        let start = rest
            .find("entries: &[")
            .expect("every KernelFile lists its entries")
            + 11;
        let stop = start + rest[start..].find(']').expect("entries end");
        let entries = rest[start..stop]
            .split('"')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect();
        out.push((file, entries));
        rest = &rest[stop..];
    }
    out
}

fn main() {
    let here = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let cuda = here
        .parent()
        .expect("emu lives in crates/cuda")
        .to_path_buf();
    let kernels_rs_path = cuda.join("src").join("kernels.rs");
    let kernels_rs = std::fs::read_to_string(&kernels_rs_path).expect("read src/kernels.rs");
    let mut files = kernel_files(&kernels_rs);
    assert!(
        !files.is_empty(),
        "no KernelFile found in {}",
        kernels_rs_path.display()
    );
    // Kernels with bugs planted on purpose (tests/emu_planted.rs shows the checks catch them).
    files.push((
        "../emu/planted/planted.cu".into(),
        vec![
            "planted_out_of_bounds_v1".into(),
            "planted_missing_sync_v1".into(),
        ],
    ));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        .opt_level(1)
        .warnings(false)
        .flag("-ffp-contract=off")
        .flag("-pthread")
        .include(here.join("include"))
        .include(here.join("src"))
        .file(here.join("src").join("runtime.cpp"));
    let sanitize = std::env::var("KVLAB_EMU_SANITIZE").unwrap_or_default();
    if !sanitize.is_empty() {
        build
            .flag(format!("-fsanitize={sanitize}"))
            .flag("-fno-sanitize-recover=all")
            .flag("-fno-omit-frame-pointer")
            .flag("-g");
        for (check, lib) in [("address", "asan"), ("undefined", "ubsan")] {
            if sanitize.split(',').any(|s| s == check) {
                println!("cargo:rustc-link-lib=dylib={lib}");
            }
        }
    }
    let mut registry =
        String::from("#include <cstring>\n#include \"kvlab_emu.h\"\nnamespace kvlab_emu {\n");
    let mut lookups = String::new();
    for (file, entries) in &files {
        let stem = Path::new(file)
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("a file name");
        let mut tu = format!(
            "#include \"cuda_emu.h\"\n#include \"{}\"\n#include \"kvlab_emu.h\"\nnamespace kvlab_emu {{\n\
             extern const KernelEntry entries_{stem}[] = {{\n",
            cuda.join("kernels").join(file).display()
        );
        for e in entries {
            writeln!(tu, "    {{\"{e}\", [](void** a) {{ call(&::{e}, a); }}}},")
                .expect("writing to a String");
        }
        writeln!(
            tu,
            "}};\nextern const std::size_t n_entries_{stem} = {};\n}}",
            entries.len()
        )
        .expect("writing to a String");
        let path = out.join(format!("emu_{stem}.cpp"));
        std::fs::write(&path, tu).expect("write a generated translation unit");
        build.file(&path);
        writeln!(
            registry,
            "extern const KernelEntry entries_{stem}[];\nextern const std::size_t n_entries_{stem};"
        )
        .expect("writing to a String");
        writeln!(
            lookups,
            "    for (std::size_t i = 0; i < n_entries_{stem}; ++i)\n        \
             if (std::strcmp(entries_{stem}[i].name, name) == 0) return &entries_{stem}[i];"
        )
        .expect("writing to a String");
        println!(
            "cargo:rerun-if-changed={}",
            cuda.join("kernels").join(file).display()
        );
    }
    write!(
        registry,
        "const KernelEntry* find_kernel(const char* name) {{\n{lookups}    return nullptr;\n}}\n}}\n"
    )
    .expect("writing to a String");
    let reg = out.join("emu_registry.cpp");
    std::fs::write(&reg, registry).expect("write the registry");
    build.file(&reg);
    build.compile("kvlab_cuda_emu");
    for dir in ["kernels", "emu/include", "emu/src"] {
        println!("cargo:rerun-if-changed={}", cuda.join(dir).display());
    }
    println!("cargo:rerun-if-changed={}", kernels_rs_path.display());
    println!("cargo:rerun-if-env-changed=KVLAB_EMU_SANITIZE");
}
