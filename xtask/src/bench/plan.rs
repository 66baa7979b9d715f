//! What a run measures: the models, the context each runs at, and the sizes and repetitions of
//! every workload, for `--quick` (CI smoke, < 2 minutes on a 2-core machine) and the full mode.

use serde::Serialize;

/// The fixed seed of every prompt and trace (token ids are drawn from it; decoding is greedy).
pub const SEED: u64 = 0x6b_766c_6162; // "kvlab" in ASCII

/// Sizes of the workloads of one model.
#[derive(Clone, Debug, Serialize)]
pub struct ModelPlan {
    pub name: String,
    /// Run the model at this context (`None`: its own max_seq_len).
    pub context: Option<usize>,
    /// Only GPU engines (a shape too large for the CPU engines' f32 weights in RAM).
    pub gpu_only: bool,
    /// Positions of the per-position decode generation (BOS + positions − 1 steps), and the
    /// smaller number the naive engine runs to (its generation costs O(N²)).
    pub decode_positions: usize,
    pub naive_decode_positions: usize,
    pub decode_reps: usize,
    pub naive_decode_reps: usize,
    /// Prompt lengths 16, 32, … up to this; the naive engine stops at its own cap.
    pub prefill_max: usize,
    pub naive_prefill_max: usize,
    pub prefill_reps: usize,
    /// Request latency: prompt tokens, generated tokens, repetitions.
    pub latency_prompt: usize,
    pub latency_generate: usize,
    pub latency_reps: usize,
    /// Batched decode: batch sizes, the naive engine's largest, prompt, decode steps, repetitions.
    pub batch_sizes: Vec<usize>,
    pub naive_batch_max: usize,
    pub batch_prompt: usize,
    pub batch_generate: usize,
    pub batch_reps: usize,
    /// Continuous batching trace: number of requests (0: none).
    pub continuous_requests: usize,
    /// Peak RSS per engine in a child process (which rebuilds the model: skipped for big ones).
    pub rss_per_engine: bool,
}

/// The run's plan.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub mode: String,
    /// Warm-up generation positions run untimed on every engine before its model's timings.
    pub warmup_positions: usize,
    /// Bandwidth: bytes of each buffer, timed passes.
    pub bandwidth_buffer_bytes: usize,
    pub bandwidth_passes: usize,
    pub models: Vec<ModelPlan>,
}

fn powers(lo: usize, hi: usize) -> Vec<usize> {
    (0..).map(|k| lo << k).take_while(|&b| b <= hi).collect()
}

impl Plan {
    pub fn quick() -> Plan {
        Plan {
            mode: "quick".into(),
            warmup_positions: 16,
            bandwidth_buffer_bytes: 512 << 20,
            bandwidth_passes: 3,
            models: vec![
                ModelPlan {
                    name: "stories260K".into(),
                    context: Some(256),
                    gpu_only: false,
                    decode_positions: 256,
                    naive_decode_positions: 256,
                    decode_reps: 3,
                    naive_decode_reps: 3,
                    prefill_max: 256,
                    naive_prefill_max: 256,
                    prefill_reps: 3,
                    latency_prompt: 32,
                    latency_generate: 32,
                    latency_reps: 5,
                    batch_sizes: powers(1, 8),
                    naive_batch_max: 4,
                    batch_prompt: 16,
                    batch_generate: 16,
                    batch_reps: 2,
                    continuous_requests: 16,
                    rss_per_engine: true,
                },
                ModelPlan {
                    name: "stories15M-shape".into(),
                    context: Some(128),
                    gpu_only: false,
                    decode_positions: 128,
                    naive_decode_positions: 128,
                    decode_reps: 2,
                    naive_decode_reps: 2,
                    prefill_max: 128,
                    naive_prefill_max: 64,
                    prefill_reps: 2,
                    latency_prompt: 16,
                    latency_generate: 16,
                    latency_reps: 3,
                    batch_sizes: powers(1, 8),
                    naive_batch_max: 2,
                    batch_prompt: 8,
                    batch_generate: 8,
                    batch_reps: 1,
                    continuous_requests: 8,
                    rss_per_engine: false,
                },
            ],
        }
    }

    pub fn full(gpu: bool) -> Plan {
        let mut models = vec![
            ModelPlan {
                name: "stories260K".into(),
                context: None,
                gpu_only: false,
                decode_positions: 512,
                naive_decode_positions: 512,
                decode_reps: 5,
                naive_decode_reps: 5,
                prefill_max: 512,
                naive_prefill_max: 512,
                prefill_reps: 5,
                latency_prompt: 64,
                latency_generate: 64,
                latency_reps: 20,
                batch_sizes: powers(1, 64),
                naive_batch_max: 8,
                batch_prompt: 32,
                batch_generate: 32,
                batch_reps: 3,
                continuous_requests: 64,
                rss_per_engine: true,
            },
            // The stories15M shape at 1,024 positions (its checkpoint has 256): synthetic weights,
            // so a longer context is only a longer RoPE table, and it gives the 1,024-position
            // generation the issue asks about.
            ModelPlan {
                name: "stories15M-shape".into(),
                context: Some(1024),
                gpu_only: false,
                decode_positions: 1024,
                naive_decode_positions: 1024,
                decode_reps: 3,
                naive_decode_reps: 2,
                prefill_max: 1024,
                naive_prefill_max: 512,
                prefill_reps: 3,
                latency_prompt: 64,
                latency_generate: 64,
                latency_reps: 10,
                batch_sizes: powers(1, 64),
                naive_batch_max: 4,
                batch_prompt: 32,
                batch_generate: 16,
                batch_reps: 2,
                continuous_requests: 24,
                rss_per_engine: true,
            },
            // 1.2 B f32 parameters (4.9 GB): every decode step streams all of it, so a short
            // context and few repetitions; the naive engine only a few positions.
            ModelPlan {
                name: "llama-3.2-1b-shape".into(),
                context: Some(128),
                gpu_only: false,
                decode_positions: 128,
                naive_decode_positions: 16,
                decode_reps: 2,
                naive_decode_reps: 1,
                prefill_max: 64,
                naive_prefill_max: 16,
                prefill_reps: 2,
                latency_prompt: 16,
                latency_generate: 8,
                latency_reps: 3,
                batch_sizes: powers(1, 8),
                naive_batch_max: 0,
                batch_prompt: 8,
                batch_generate: 4,
                batch_reps: 1,
                continuous_requests: 0,
                rss_per_engine: false,
            },
        ];
        if gpu {
            models.push(ModelPlan {
                name: "llama-3-8b-shape".into(),
                context: Some(2048),
                gpu_only: true,
                decode_positions: 2048,
                naive_decode_positions: 0,
                decode_reps: 3,
                naive_decode_reps: 0,
                prefill_max: 2048,
                naive_prefill_max: 0,
                prefill_reps: 3,
                latency_prompt: 128,
                latency_generate: 64,
                latency_reps: 10,
                batch_sizes: powers(1, 64),
                naive_batch_max: 0,
                batch_prompt: 128,
                batch_generate: 32,
                batch_reps: 2,
                continuous_requests: 64,
                rss_per_engine: false,
            });
        }
        Plan {
            mode: "full".into(),
            warmup_positions: 32,
            bandwidth_buffer_bytes: 512 << 20,
            bandwidth_passes: 5,
            models,
        }
    }
}

/// 16, 32, 64, … up to `max` (and `max` itself when it is not a power of two).
pub fn prefill_lens(max: usize) -> Vec<usize> {
    let mut v = powers(16, max);
    if v.last() != Some(&max) && max >= 16 {
        v.push(max);
    }
    v
}
