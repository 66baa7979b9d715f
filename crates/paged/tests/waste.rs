//! The waste calculator on hand-computed cases, its closed forms against brute force, and the
//! seeded workload generators.

use kvlab_paged::waste::TABLE_BLOCK_SIZES;
use kvlab_paged::{
    LongTail, PagedError, RequestLen, Reservation, compute_waste, long_tail_requests,
    uniform_requests, waste_table,
};

const EPS: f64 = 1e-12;

fn req(prompt_len: usize, output_len: usize) -> RequestLen {
    RequestLen {
        prompt_len,
        output_len,
    }
}

#[test]
fn hand_computed_single_request() {
    // prompt 3, output 2, max_seq_len 8: len 5. After step 1 it holds 4 tokens, after step 2, 5.
    let r = [req(3, 2)];
    let w = compute_waste(&r, 8, Reservation::MaxLength).unwrap();
    assert_eq!((w.used_slots, w.reserved_slots), (5, 8));
    assert!((w.final_waste_frac - 3.0 / 8.0).abs() < EPS);
    // Over time: used 4 + 5 = 9 of 8 + 8 = 16 reserved.
    assert_eq!((w.used_slot_steps, w.reserved_slot_steps), (9, 16));
    assert!((w.time_avg_waste_frac - 7.0 / 16.0).abs() < EPS);

    let w = compute_waste(&r, 8, Reservation::Paged { block_size: 4 }).unwrap();
    assert_eq!(w.reserved_slots, 8); // ceil(5 / 4) · 4
    assert_eq!(w.reserved_slot_steps, 4 + 8); // 4 tokens fit one block, 5 need two
    assert!((w.time_avg_waste_frac - 0.25).abs() < EPS);

    let w = compute_waste(&r, 8, Reservation::Paged { block_size: 2 }).unwrap();
    assert_eq!((w.reserved_slots, w.reserved_slot_steps), (6, 4 + 6));
    assert!((w.final_waste_frac - 1.0 / 6.0).abs() < EPS);
    assert!((w.time_avg_waste_frac - 0.1).abs() < EPS);
}

#[test]
fn hand_computed_pair_and_truncation() {
    // (2, 1) and (1, 5) with max_seq_len 4: the second is truncated to output 3 (len 4).
    let r = [req(2, 1), req(1, 5)];
    let w = compute_waste(&r, 4, Reservation::MaxLength).unwrap();
    assert_eq!((w.used_slots, w.reserved_slots), (3 + 4, 8));
    // Steps: first holds 3 (1 step); second holds 2, 3, 4 (3 steps).
    assert_eq!((w.used_slot_steps, w.reserved_slot_steps), (3 + 9, 4 * 4));
}

#[test]
fn block_size_one_wastes_nothing() {
    let r = uniform_requests(50, 3);
    let w = compute_waste(&r, 2048, Reservation::Paged { block_size: 1 }).unwrap();
    assert_eq!(w.final_waste_frac, 0.0);
    assert_eq!(w.time_avg_waste_frac, 0.0);
}

#[test]
fn closed_forms_match_brute_force() {
    let r = uniform_requests(40, 11)
        .into_iter()
        .map(|r| req(r.prompt_len / 10 + 1, r.output_len / 10 + 1))
        .collect::<Vec<_>>();
    for b in [1usize, 3, 8, 16, 32] {
        let w = compute_waste(&r, 300, Reservation::Paged { block_size: b }).unwrap();
        let (mut used, mut reserved) = (0u64, 0u64);
        for x in &r {
            let o = x.output_len.min(300 - x.prompt_len);
            for s in 1..=o {
                let len = (x.prompt_len + s) as u64;
                used += len;
                reserved += len.div_ceil(b as u64) * b as u64;
            }
        }
        assert_eq!(
            (w.used_slot_steps, w.reserved_slot_steps),
            (used, reserved),
            "b = {b}"
        );
    }
}

#[test]
fn paging_wastes_far_less_than_preallocation() {
    let r = uniform_requests(1000, 0);
    let rows = waste_table("uniform", &r, 2048, &TABLE_BLOCK_SIZES).unwrap();
    assert_eq!(rows.len(), 4);
    assert_eq!(rows[0].scheme, "max-length");
    assert_eq!(rows[0].block_size, None);
    assert_eq!(rows[1].block_size, Some(8));
    // Max-length reserves 2048 for a mean length of ~1124 and more while growing.
    assert!(
        rows[0].final_waste_frac > 0.4 && rows[0].time_avg_waste_frac > rows[0].final_waste_frac
    );
    for row in &rows[1..] {
        let b = row.block_size.unwrap() as f64;
        assert!(row.final_waste_frac < b / 200.0, "{row:?}");
        assert!(row.time_avg_waste_frac < b / 100.0, "{row:?}");
    }
    assert!(rows[1].final_waste_frac < rows[2].final_waste_frac);
    assert!(rows[2].final_waste_frac < rows[3].final_waste_frac);
    assert!(
        serde_json::to_string(&rows)
            .unwrap()
            .contains("time_avg_waste_frac")
    );
}

#[test]
fn generators_are_seeded_and_in_range() {
    assert_eq!(uniform_requests(20, 5), uniform_requests(20, 5));
    assert_ne!(uniform_requests(20, 5), uniform_requests(20, 6));
    assert!(
        uniform_requests(500, 1).iter().all(|r| {
            (100..=1024).contains(&r.prompt_len) && (100..=1024).contains(&r.output_len)
        })
    );
    let shape = LongTail::default();
    let a = long_tail_requests(2000, 9, shape).unwrap();
    assert_eq!(a, long_tail_requests(2000, 9, shape).unwrap());
    assert!(a.iter().all(|r| r.prompt_len >= 1
        && r.output_len >= 1
        && r.prompt_len + r.output_len <= shape.max_seq_len));
    // Log-normal: the median is near 256 while the mean is pulled up by the tail.
    let mut prompts: Vec<usize> = a.iter().map(|r| r.prompt_len).collect();
    prompts.sort_unstable();
    let median = prompts[prompts.len() / 2] as f64;
    let mean = prompts.iter().sum::<usize>() as f64 / prompts.len() as f64;
    assert!((200.0..320.0).contains(&median), "median {median}");
    assert!(mean > median * 1.3, "mean {mean} median {median}");
    assert!(waste_table("long-tail", &a, shape.max_seq_len, &TABLE_BLOCK_SIZES).is_ok());
}

#[test]
fn bad_workloads_are_errors() {
    let bad = |r: &[RequestLen], m, res| {
        matches!(
            compute_waste(r, m, res),
            Err(PagedError::InvalidWorkload(_))
        )
    };
    assert!(bad(&[], 8, Reservation::MaxLength));
    assert!(bad(&[req(0, 1)], 8, Reservation::MaxLength));
    assert!(bad(&[req(1, 0)], 8, Reservation::MaxLength));
    assert!(bad(&[req(8, 1)], 8, Reservation::MaxLength));
    assert!(bad(&[req(1, 1)], 8, Reservation::Paged { block_size: 0 }));
    let shape = LongTail {
        prompt_sigma: f64::NAN,
        ..LongTail::default()
    };
    assert!(long_tail_requests(3, 0, shape).is_err());
}
