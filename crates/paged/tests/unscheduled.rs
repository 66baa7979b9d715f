//! Unscheduled (one sequence at a time) bookkeeping: sliding-window groups stay bounded, a full
//! pool refuses a step without reserving anything, and freeing returns every block.

use kvlab_paged::{KvCacheConfig, PagedError, UnscheduledPools, max_window_blocks};

/// A prefill then 300 decodes with a global and a 40-token window group: slots agree with the
/// tables, the window group never holds more than max_window_blocks, freeing returns everything.
#[test]
fn windowed_steps_stay_bounded_and_free_everything() {
    let mut pools = UnscheduledPools::new(&KvCacheConfig::new([None, Some(40)], 64, 16)).unwrap();
    let mut seq = pools.new_seq(1024);
    let mut tokens: Vec<u32> = (0..70).map(|i| i % 900 + 1).collect();
    for step in 0..301 {
        let s = pools.step(&mut seq, &tokens).unwrap();
        assert_eq!(s.positions[0], seq.len as i64);
        assert_eq!(s.groups.len(), 2);
        for g in &s.groups {
            assert_eq!(g.slot_mapping.len(), tokens.len(), "step {step}");
        }
        // The global group stores every position at the slot its block table gives.
        let bs = 16;
        let table = s.groups[0].block_tables.row(0).unwrap();
        for (i, &slot) in s.groups[0].slot_mapping.iter().enumerate() {
            let pos = s.positions[i] as usize;
            assert_eq!(slot, (table[pos / bs] as usize * bs + pos % bs) as i64);
        }
        s.validate(pools.kv_cache(), 1000, 4096)
            .unwrap_or_else(|e| panic!("step {step}: {e}"));
        seq.len += tokens.len();
        assert!(
            pools.used_blocks(1) <= max_window_blocks(40, 16),
            "step {step}"
        );
        assert_eq!(pools.used_blocks(0), seq.len.div_ceil(16));
        tokens = vec![5];
    }
    pools.free(&mut seq);
    assert_eq!((pools.used_blocks(0), pools.used_blocks(1)), (0, 0));
}

#[test]
fn a_full_pool_is_refused_without_reserving() {
    let mut pools = UnscheduledPools::new(&KvCacheConfig::new([None], 2, 16)).unwrap();
    let mut a = pools.new_seq(64);
    pools.step(&mut a, &[1; 20]).unwrap();
    a.len = 20;
    let mut b = pools.new_seq(64);
    let e = pools.step(&mut b, &[1; 17]).unwrap_err();
    assert!(
        matches!(e, PagedError::OutOfBlocks { needed: 2, free: 0 }),
        "{e}"
    );
    assert_eq!(pools.used_blocks(0), 2);
    assert!(b.tables[0].blocks().is_empty());
}
