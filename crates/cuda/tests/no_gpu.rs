//! On a machine without CUDA (CI, the 2-core build box) the engine's entry points return typed
//! errors that say what is missing; nothing panics. On a GPU machine these tests check the same
//! calls succeed.

// Test code may unwrap: a failed unwrap is a failed test (clippy.toml allows it in #[test]
// functions; this covers the helpers too).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use kvlab_cuda::{CudaEngine, CudaOptions, probe};

fn tiny_model() -> Arc<kvlab_model::Model> {
    Arc::new(
        kvlab_model::SyntheticSpec::new(32, 64, 1, 2, 2, 64, 32, 5)
            .build()
            .unwrap(),
    )
}

#[test]
fn probe_and_engine_never_panic_and_say_what_is_missing() {
    match probe() {
        Ok(info) => {
            eprintln!("probe found {info}");
            assert!(info.total_mem > 0);
        }
        Err(e) => {
            eprintln!("probe: {e}");
            assert!(e.is_unavailable(), "{e}");
            let engine = CudaEngine::new(tiny_model(), CudaOptions::default());
            let err = engine.err().expect("no GPU, yet the engine was built");
            let msg = err.to_string();
            assert!(msg.starts_with("cuda engine: "), "{msg}");
            assert!(
                msg.contains("no CUDA driver found") || msg.contains("no usable GPU"),
                "{msg}"
            );
            if !kvlab_cuda::device::driver_loadable() {
                assert!(msg.contains("libcuda.so.1 not loadable"), "{msg}");
            }
        }
    }
}

/// Every `--kv-dtype` gets past the pool's checks, int4 included (its keys wait in f32
/// residuals until their block is complete); without a GPU the error is the device's, never the
/// dtype's.
#[test]
fn every_kv_dtype_gets_past_the_pool_checks() {
    use kvlab_model::KvDtype;
    for kv_dtype in KvDtype::ALL {
        let opts = CudaOptions {
            kv_dtype,
            num_blocks: Some(8),
            ..CudaOptions::default()
        };
        match CudaEngine::new(tiny_model(), opts) {
            Ok(e) => assert_eq!(e.pool_plan().kv_dtype, kv_dtype),
            Err(e) => assert!(!e.to_string().contains("kv"), "{kv_dtype}: {e}"),
        }
    }
}
