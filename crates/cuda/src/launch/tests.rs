use kvlab_paged::{KvCacheConfig, PaddedBlockTables, Scheduler, SchedulerConfig, StopConditions};

use super::*;

fn geometry(num_blocks: usize, windows: Vec<Option<usize>>) -> PackGeometry {
    PackGeometry {
        vocab_size: 100,
        max_positions: 256,
        kv_cache: KvCacheConfig::new(windows, num_blocks, 4),
    }
}

fn scheduler(num_blocks: usize, windows: &[Option<usize>]) -> Scheduler {
    let kv_cache = KvCacheConfig::new(windows.iter().copied(), num_blocks, 4);
    Scheduler::new(SchedulerConfig::new(kv_cache, 64)).unwrap()
}

#[test]
fn launch_shapes_follow_the_kernels_conventions() {
    assert_eq!(row_threads(8, 1024), 32);
    assert_eq!(row_threads(33, 1024), 64);
    assert_eq!(row_threads(4096, 1024), 1024);
    assert_eq!(row_threads(0, 1024), 32);
    let c = rmsnorm_config(7, 288).unwrap();
    assert_eq!((c.grid_dim, c.block_dim), ((7, 1, 1), (288, 1, 1)));
    let c = row_copy_config(3, 4096).unwrap();
    assert_eq!(c.block_dim.0, 256);
    assert!(rmsnorm_config(0, 8).is_err());

    let c = elementwise_config(1000);
    assert_eq!(c.grid_dim.0, 4);
    assert_eq!(elementwise_config(0).grid_dim.0, 1);
    assert_eq!(
        elementwise_config(1 << 40).grid_dim.0 as usize,
        MAX_ELEMENTWISE_BLOCKS
    );

    // RoPE covers every (token, head, pair) exactly: 5 tokens · 4 heads · 4 pairs = 80 threads.
    let c = rope_config(5, 4, 8).unwrap();
    assert_eq!(c.grid_dim.0, 1);
    let c = rope_config(100, 32, 128).unwrap();
    assert_eq!(c.grid_dim.0 as usize, (100 * 32 * 64usize).div_ceil(256));

    let c = decode_v1_config(3, 32).unwrap();
    assert_eq!((c.grid_dim, c.block_dim.0), ((3, 32, 1), ATTN_THREADS));
    let c = decode_v2_config(1, 32, 64).unwrap();
    assert_eq!(c.grid_dim, (1, 32, 64));
    assert!(decode_v2_config(1, 32, 70_000).is_err());
    assert_eq!(prefill_config(17, 8).unwrap().grid_dim, (17, 8, 1));
    assert_eq!(argmax_config(4).unwrap().block_dim.0, ARGMAX_THREADS);
    assert!(ARGMAX_THREADS.is_power_of_two());
    assert_eq!(copy_blocks_config(2).unwrap().grid_dim.0, 2);
}

#[test]
fn partitions_and_decode_kernel_choice() {
    assert_eq!(num_partitions(1, 512), 1);
    assert_eq!(num_partitions(512, 512), 1);
    assert_eq!(num_partitions(513, 512), 2);
    assert_eq!(num_partitions(32 * 1024, 512), 64);
    assert_eq!(v2_workspace_floats(2, 4, 3, 8), 2 * 4 * 3 * 10);

    let (big, auto, v1) = (usize::MAX, DecodeAttention::Auto, DecodeKernel::V1);
    let v2 = |max_partitions| DecodeKernel::V2 { max_partitions };
    // (choice, n_decode, max_keys, workspace floats) at 32 heads of 128 on 132 SMs.
    for (choice, n_decode, keys, ws, want) in [
        // Batch 1, 32 heads, 32k keys: v1 would run 32 blocks; v2 runs 32 · 64.
        (auto, 1, 32 * 1024, big, v2(64)),
        // One partition: nothing to split.
        (auto, 1, 512, big, v1),
        // Batch 64 · 32 heads = 2048 blocks ≥ 4 per SM: v1 fills the GPU.
        (auto, 64, 32 * 1024, big, v1),
        // The workspace does not fit: v1, even when forced.
        (auto, 1, 32 * 1024, 10, v1),
        (DecodeAttention::V2, 1, 32 * 1024, 10, v1),
        (DecodeAttention::V2, 64, 600, big, v2(2)),
        (DecodeAttention::V1, 1, 32 * 1024, big, v1),
    ] {
        let got = choose_decode_kernel(choice, n_decode, 32, keys, 128, 132, ws);
        assert_eq!(
            got, want,
            "{choice:?}: {n_decode} seqs, {keys} keys, {ws} floats"
        );
    }
}

#[test]
fn head_dims_and_i32_limits() {
    assert!(check_head_dim(8).is_ok());
    assert!(check_head_dim(256).is_ok());
    assert!(check_head_dim(512).is_err());
    assert!(check_head_dim(7).is_err());
    assert_eq!(i32_of("x", 5).unwrap(), 5);
    assert!(
        i32_of("x", 1 << 31)
            .unwrap_err()
            .to_string()
            .contains("x = 2147483648")
    );
    assert_eq!(first_key(10, None), 0);
    assert_eq!(first_key(10, Some(4)), 7);
    assert_eq!(first_key(2, Some(4)), 0);
}

#[test]
fn packs_a_scheduled_prefill_then_decode_step() {
    let mut sched = scheduler(32, &[None]);
    sched
        .add_request(vec![1, 2, 3, 4, 5, 6], StopConditions::max_tokens(4))
        .unwrap();
    sched
        .add_request(vec![7, 8, 9], StopConditions::max_tokens(4))
        .unwrap();
    let batch = sched.schedule().unwrap();
    let input = batch.model_input();
    let p = pack_step(&input, &geometry(32, vec![None])).unwrap();
    assert_eq!((p.n_tokens, p.n_seqs, p.n_decode), (9, 2, 0));
    assert_eq!(&p.ints[p.input_ids.clone()], &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
    assert_eq!(&p.ints[p.positions.clone()], &[0, 1, 2, 3, 4, 5, 0, 1, 2]);
    assert_eq!(&p.ints[p.query_start_loc.clone()], &[0, 6, 9]);
    assert_eq!(&p.ints[p.context_lens.clone()], &[6, 3]);
    assert_eq!(&p.ints[p.token_seq.clone()], &[0, 0, 0, 0, 0, 0, 1, 1, 1]);
    assert_eq!(&p.ints[p.logits_indices.clone()], &[5, 8]);
    let g = &p.groups[0];
    let slots: Vec<i64> = input.groups[0].slot_mapping.to_vec();
    let packed: Vec<i64> = p.ints[g.slot_mapping.clone()]
        .iter()
        .map(|&s| s as i64)
        .collect();
    assert_eq!(packed, slots);
    assert_eq!(g.max_blocks, 2);
    assert_eq!(g.block_tables.len(), 2 * 2);
    assert_eq!(g.n_copies, 0);

    sched
        .update(&[(batch.seqs[0].seq_id, 10), (batch.seqs[1].seq_id, 11)])
        .unwrap();
    let batch = sched.schedule().unwrap();
    let p = pack_step(&batch.model_input(), &geometry(32, vec![None])).unwrap();
    assert_eq!((p.n_tokens, p.n_seqs, p.n_decode), (2, 2, 2));
    assert_eq!(&p.ints[p.positions.clone()], &[6, 3]);
    assert_eq!(&p.ints[p.context_lens.clone()], &[7, 4]);
    assert_eq!(p.groups[0].max_decode_keys, 7);
}

#[test]
fn sliding_window_groups_pack_holes_and_window_limited_keys() {
    let windows = vec![None, Some(4)];
    // Without prefix caching a prefill writes only the window's keys (with it, the whole prompt,
    // to cache its blocks: kvlab-paged's try_admit).
    let kv_cache = KvCacheConfig::new(windows.iter().copied(), 32, 4);
    let mut config = SchedulerConfig::new(kv_cache, 64);
    config.enable_prefix_caching = false;
    let mut sched = Scheduler::new(config).unwrap();
    let prompt: Vec<u32> = (1..=13).collect();
    sched
        .add_request(prompt, StopConditions::max_tokens(8))
        .unwrap();
    let batch = sched.schedule().unwrap();
    let input = batch.model_input();
    let p = pack_step(&input, &geometry(32, windows.clone())).unwrap();
    // The local group keeps only blocks holding a key that a later query reads (positions
    // >= 13 + 1 - 4 = 10, in block 2 = positions 8..12, and block 3): earlier ones get -1.
    let local = &p.ints[p.groups[1].slot_mapping.clone()];
    assert!(local[..8].iter().all(|&s| s == -1), "{local:?}");
    assert!(local[8..].iter().all(|&s| s >= 0), "{local:?}");
    let mut id = batch.seqs[0].seq_id;
    for step in 0..4 {
        sched.update(&[(id, 20 + step)]).unwrap();
        let batch = sched.schedule().unwrap();
        id = batch.seqs[0].seq_id;
        let p = pack_step(&batch.model_input(), &geometry(32, windows.clone())).unwrap();
        assert_eq!(p.n_decode, 1);
        assert_eq!(p.groups[1].max_decode_keys, 4);
        assert_eq!(p.groups[0].max_decode_keys, 14 + step as usize);
    }
}

#[test]
fn bad_metadata_is_refused_with_the_reason() {
    let mut sched = scheduler(32, &[None]);
    sched
        .add_request(vec![1, 2, 3, 4, 5], StopConditions::max_tokens(2))
        .unwrap();
    let input = sched.schedule().unwrap().model_input();
    let geom = geometry(32, vec![None]);

    // The same malformed steps the paged CPU engine refuses (crates/cpu/tests/paged.rs).
    let variants = input.malformed_variants(&geom.kv_cache, geom.vocab_size);
    assert!(variants.len() >= 9, "{}", variants.len());
    for (reason, bad) in variants {
        let err = pack_step(&bad, &geom).unwrap_err().to_string();
        assert!(err.contains(reason), "{reason}: {err}");
    }

    let mut small = geom.clone();
    small.max_positions = 3;
    assert!(
        pack_step(&input, &small)
            .unwrap_err()
            .to_string()
            .contains("RoPE")
    );

    assert!(pack_step(&input, &geometry(32, vec![None, Some(4)])).is_err());
    assert!(pack_step(&ModelInput::default(), &geom).is_err());
}

#[test]
fn cached_keys_without_a_block_are_refused() {
    // A decode at position 8 (context 9) whose table has a hole at logical block 0 while the
    // global group must read keys 0..8 from the pool.
    let input = ModelInput {
        input_ids: vec![3],
        positions: vec![8],
        query_start_loc: vec![0, 1],
        context_lens: vec![9],
        logits_indices: vec![0],
        groups: vec![kvlab_paged::GroupInput {
            slot_mapping: vec![2 * 4],
            block_tables: PaddedBlockTables::from_rows(&[vec![-1, 1, 2]]),
            block_copies: vec![],
        }],
    };
    let err = pack_step(&input, &geometry(32, vec![None])).unwrap_err();
    assert!(err.to_string().contains("logical block 0"), "{err}");
    // With a window of 4 the query at 8 reads only keys 5..=8: no hole is touched.
    let p = pack_step(&input, &geometry(32, vec![Some(4)])).unwrap();
    assert_eq!(p.groups[0].max_decode_keys, 4);
}

/// The unscheduled (single-sequence) path packs: a prefill then 300 decodes with a global and a
/// 40-token window group, every step valid for the kernels, the window group bounded.
#[test]
fn unscheduled_windowed_steps_pack() {
    let kv_cache = KvCacheConfig::new([None, Some(40)], 64, 16);
    let mut pools = kvlab_paged::UnscheduledPools::new(&kv_cache).unwrap();
    let mut seq = pools.new_seq(1024);
    let geom = PackGeometry {
        vocab_size: 1000,
        max_positions: 4096,
        kv_cache,
    };
    let mut tokens: Vec<u32> = (0..70).map(|i| i % 900 + 1).collect();
    for step in 0..301 {
        let input = pools.step(&mut seq, &tokens).unwrap();
        let p = pack_step(&input, &geom).unwrap_or_else(|e| panic!("step {step}: {e}"));
        assert_eq!(p.n_decode, usize::from(step > 0));
        seq.len += tokens.len();
        assert!(
            pools.used_blocks(1) <= kvlab_paged::max_window_blocks(40, 16),
            "step {step}"
        );
        tokens = vec![5];
    }
}
