//! Unit tests of the block pool: allocation, slot mapping, padded tables, copy-on-write and
//! sliding-window freeing.

use kvlab_paged::{
    BlockAllocator, BlockCopy, BlockTable, PAD_BLOCK, PAD_SLOT, PaddedBlockTables, PagedError,
    max_window_blocks, window_start,
};

fn pool(num_blocks: usize, block_size: usize) -> BlockAllocator {
    BlockAllocator::new(num_blocks, block_size).expect("valid pool")
}

#[test]
fn new_rejects_zero_sizes() {
    assert!(matches!(
        BlockAllocator::new(0, 16),
        Err(PagedError::InvalidConfig(_))
    ));
    assert!(matches!(
        BlockAllocator::new(4, 0),
        Err(PagedError::InvalidConfig(_))
    ));
}

#[test]
fn allocate_and_free_blocks() {
    let mut a = pool(4, 16);
    assert!(a.can_allocate(4));
    assert!(!a.can_allocate(5));
    let got = a.allocate(3).unwrap();
    assert_eq!(got, vec![0, 1, 2]);
    assert_eq!(a.num_free_blocks(), 1);
    assert_eq!(a.num_used_blocks(), 3);
    // Too many: error, and nothing was taken.
    assert_eq!(
        a.allocate(2),
        Err(PagedError::OutOfBlocks { needed: 2, free: 1 })
    );
    assert_eq!(a.num_free_blocks(), 1);
    a.free_block(1).unwrap();
    assert_eq!(a.ref_count(1), 0);
    assert!(matches!(
        a.free_block(1),
        Err(PagedError::InvalidBlock { block: 1, .. })
    ));
    assert!(matches!(
        a.free_block(99),
        Err(PagedError::InvalidBlock { .. })
    ));
}

#[test]
fn slot_mapping_follows_the_block_table() {
    let mut a = pool(8, 4);
    let mut x = BlockTable::new(4);
    let mut y = BlockTable::new(4);
    // Interleave two sequences so their blocks are not contiguous: x gets 0, y 1, x 2.
    a.append_slots(&mut x, 4, 0).unwrap();
    a.append_slots(&mut y, 3, 0).unwrap();
    a.append_slots(&mut x, 3, 0).unwrap();
    assert_eq!(x.blocks(), &[Some(0), Some(2)]);
    assert_eq!(x.num_tokens(), 7);
    // slot = block · 4 + pos % 4.
    assert_eq!(x.slot_mapping(0..7), vec![0, 1, 2, 3, 8, 9, 10]);
    assert_eq!(y.slot_mapping(0..3), vec![4, 5, 6]);
    // Positions without a reserved slot are PAD.
    assert_eq!(x.slot(7), None);
    assert_eq!(x.slot_mapping(6..9), vec![10, PAD_SLOT, PAD_SLOT]);
    assert_eq!(x.to_row(), vec![0, 2]);
}

#[test]
fn padded_block_tables_are_row_major_with_pad() {
    let padded = PaddedBlockTables::from_rows(&[vec![3, 1], vec![7], vec![2, PAD_BLOCK, 5]]);
    assert_eq!(padded.num_seqs, 3);
    assert_eq!(padded.max_blocks_per_seq, 3);
    assert_eq!(padded.data, vec![3, 1, -1, 7, -1, -1, 2, -1, 5]);
    assert_eq!(padded.row(1), Some(&[7, -1, -1][..]));
    assert_eq!(padded.row(3), None);
    let empty = PaddedBlockTables::from_rows::<Vec<i32>>(&[]);
    assert_eq!((empty.num_seqs, empty.max_blocks_per_seq), (0, 0));
    assert!(empty.data.is_empty());
}

#[test]
fn append_slot_takes_a_block_only_at_boundaries() {
    let mut a = pool(2, 4);
    let mut t = BlockTable::new(4);
    for i in 0..8 {
        assert!(a.can_append(&t), "token {i}");
        assert_eq!(a.append_slot(&mut t).unwrap(), None);
        assert_eq!(a.num_used_blocks(), i / 4 + 1);
    }
    assert!(!a.can_append(&t));
    assert_eq!(
        a.append_slot(&mut t),
        Err(PagedError::OutOfBlocks { needed: 1, free: 0 })
    );
    assert_eq!(t.num_tokens(), 8, "a failed append changes nothing");
    a.free(&mut t).unwrap();
    assert_eq!(a.num_free_blocks(), 2);
    assert_eq!(t.num_tokens(), 0);
}

#[test]
fn table_of_another_block_size_is_rejected() {
    let mut a = pool(2, 4);
    let mut t = BlockTable::new(8);
    assert_eq!(
        a.append_slot(&mut t),
        Err(PagedError::BlockSizeMismatch {
            table: 8,
            allocator: 4
        })
    );
}

#[test]
fn fork_shares_blocks_and_first_write_copies() {
    let mut a = pool(8, 4);
    let mut parent = BlockTable::new(4);
    a.append_slots(&mut parent, 6, 0).unwrap(); // blocks 0 (full), 1 (2 of 4)
    let mut child = a.fork(&parent).unwrap();
    assert_eq!(child.blocks(), parent.blocks());
    assert_eq!((a.ref_count(0), a.ref_count(1)), (2, 2));

    // The parent writes position 6 into shared block 1: it must copy first.
    assert_eq!(a.blocks_needed_to_append(&parent, 1, 0), Ok(1));
    let copy = a.append_slot(&mut parent).unwrap();
    assert_eq!(copy, Some(BlockCopy { src: 1, dst: 2 }));
    assert_eq!(parent.blocks(), &[Some(0), Some(2)]);
    assert_eq!((a.ref_count(1), a.ref_count(2)), (1, 1));

    // The child is now the only holder of block 1 and writes in place.
    assert_eq!(a.append_slot(&mut child).unwrap(), None);
    assert_eq!(child.blocks(), &[Some(0), Some(1)]);
    // The full block 0 stays shared: nobody writes into it again.
    assert_eq!(a.ref_count(0), 2);
    assert_eq!(a.stats().num_cow_copies, 1);

    a.free(&mut parent).unwrap();
    a.free(&mut child).unwrap();
    assert_eq!(a.num_free_blocks(), 8);
}

#[test]
fn fork_at_a_block_boundary_needs_no_copy() {
    let mut a = pool(8, 4);
    let mut parent = BlockTable::new(4);
    a.append_slots(&mut parent, 4, 0).unwrap();
    let mut child = a.fork(&parent).unwrap();
    assert_eq!(a.append_slot(&mut parent).unwrap(), None);
    assert_eq!(a.append_slot(&mut child).unwrap(), None);
    assert_eq!(parent.blocks(), &[Some(0), Some(1)]);
    assert_eq!(child.blocks(), &[Some(0), Some(2)]);
}

#[test]
fn copy_on_write_fails_cleanly_without_a_free_block() {
    let mut a = pool(1, 4);
    let mut parent = BlockTable::new(4);
    a.append_slots(&mut parent, 2, 0).unwrap();
    let child = a.fork(&parent).unwrap();
    assert!(!a.can_append(&parent));
    assert!(matches!(
        a.append_slot(&mut parent),
        Err(PagedError::OutOfBlocks { .. })
    ));
    assert_eq!(parent.blocks(), child.blocks());
    assert_eq!(a.ref_count(0), 2);
}

#[test]
fn window_start_and_bound() {
    // Query at position 10 with W = 4 attends to 7..=10.
    assert_eq!(window_start(10, 4), 7);
    assert_eq!(window_start(2, 4), 0);
    assert_eq!(max_window_blocks(512, 16), 33);
    assert_eq!(max_window_blocks(6, 4), 3);
}

#[test]
fn free_outside_window_leaves_holes() {
    let mut a = pool(8, 4);
    let mut t = BlockTable::new(4);
    a.append_slots(&mut t, 20, 0).unwrap(); // blocks 0..5 hold positions 0..20
    // Next query at 20, W = 6: keys 15..=20 needed, so blocks 0..3 (positions 0..12) go.
    let freed = a.free_outside_window(&mut t, 20, 6).unwrap();
    assert_eq!(freed, vec![0, 1, 2]);
    assert_eq!(t.blocks(), &[None, None, None, Some(3), Some(4)]);
    assert_eq!(t.to_row(), vec![PAD_BLOCK, PAD_BLOCK, PAD_BLOCK, 3, 4]);
    assert_eq!(t.slot_mapping(11..14), vec![PAD_SLOT, 12, 13]);
    assert_eq!(a.num_free_blocks(), 6);
    // Idempotent.
    assert_eq!(
        a.free_outside_window(&mut t, 20, 6).unwrap(),
        Vec::<u32>::new()
    );
    assert_eq!(
        a.free_outside_window(&mut t, 20, 0),
        Err(PagedError::InvalidWindow { window: 0 })
    );
}

#[test]
fn sliding_window_decode_holds_a_bounded_number_of_blocks() {
    let (w, bs) = (10, 4);
    let mut a = pool(max_window_blocks(w, bs), bs);
    let mut t = BlockTable::new(bs);
    // Prefill 3 tokens, then decode 200 tokens, trimming before each step as the scheduler does.
    a.append_slots(&mut t, 3, window_start(3, w)).unwrap();
    for computed in 3..203 {
        a.free_outside_window(&mut t, computed, w).unwrap();
        a.append_slots(&mut t, 1, window_start(computed + 1, w))
            .unwrap();
        assert!(t.num_held_blocks() <= max_window_blocks(w, bs));
        // Every key the query at `computed` attends to has a slot.
        for j in window_start(computed, w)..=computed {
            assert!(t.slot(j).is_some(), "key {j} of query {computed}");
        }
    }
    assert_eq!(
        t.blocks().len(),
        203usize.div_ceil(bs),
        "logical indices stay stable"
    );
}

#[test]
fn sliding_window_prefill_skips_keys_nobody_reads() {
    let (w, bs) = (6, 4);
    let mut a = pool(8, bs);
    let mut t = BlockTable::new(bs);
    // A 30-token prompt: after the step only keys 25..30 are read (query 30 sees 25..=30).
    a.append_slots(&mut t, 30, window_start(30, w)).unwrap();
    assert_eq!(t.num_held_blocks(), 2, "blocks 6 (24..28) and 7 (28..30)");
    let slots = t.slot_mapping(0..30);
    assert!(slots[..24].iter().all(|&s| s == PAD_SLOT));
    assert!(slots[24..].iter().all(|&s| s >= 0));
}

#[test]
fn truncate_returns_the_blocks_past_the_cut_and_writes_there_next() {
    let mut a = pool(8, 4);
    let mut t = BlockTable::new(4);
    a.append_slots(&mut t, 14, 0).unwrap(); // blocks 0..4 hold positions 0..14
    assert_eq!(a.num_free_blocks(), 4);
    // Cut to 6 positions: blocks 0 and 1 stay (position 5 is block 1, offset 1).
    assert!(a.truncate(&mut t, 6, None).unwrap());
    assert_eq!(t.num_tokens(), 6);
    assert_eq!(t.blocks(), &[Some(0), Some(1)]);
    assert_eq!(a.num_free_blocks(), 6);
    // The next slot is position 6's: block 1, offset 2.
    a.append_slots(&mut t, 1, 0).unwrap();
    assert_eq!(t.slot_mapping(6..7), vec![6]);
    // Beyond its length, or with a window whose keys are gone, nothing changes.
    assert!(!a.truncate(&mut t, 9, None).unwrap());
    assert_eq!(t.num_tokens(), 7);
    assert!(a.truncate(&mut t, 0, None).unwrap());
    assert_eq!((t.num_tokens(), a.num_free_blocks()), (0, 8));
}

#[test]
fn truncate_under_a_window_needs_the_keys_the_next_query_reads() {
    let mut a = pool(8, 4);
    let mut t = BlockTable::new(4);
    a.append_slots(&mut t, 20, 0).unwrap();
    a.free_outside_window(&mut t, 20, 6).unwrap(); // blocks 0..3 are holes
    // The query at 16 reads keys 11..=16: block 2 (positions 8..12) is gone.
    assert!(!a.can_truncate(&t, 16, Some(6)));
    assert!(!a.truncate(&mut t, 16, Some(6)).unwrap());
    assert_eq!(t.num_tokens(), 20);
    // The query at 18 reads keys 13..=18: blocks 3 and 4 are held.
    assert!(a.truncate(&mut t, 18, Some(6)).unwrap());
    assert_eq!(t.blocks(), &[None, None, None, Some(3), Some(4)]);
}
