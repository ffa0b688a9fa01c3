//! Exact behaviour of sequences over a pool: block ids, growth, capacity errors, window
//! bounds, copy-on-write, stats.

mod common;

use common::random_rows;
use kvcache::{
    CacheConfig, CacheError, CapacityReason, KvFormat, KvPool, SequenceCache, SequencePolicy, StandaloneCache,
    NULL_BLOCK,
};

const HEADS: usize = 2;
const DIM: usize = 8;
const ROW: usize = HEADS * DIM;

fn config(layers: usize, blocks: usize) -> CacheConfig {
    let mut c = CacheConfig::new(layers, HEADS, DIM);
    c.num_blocks = blocks;
    c.format = KvFormat::F32;
    c
}

fn policy(dynamic: bool, window: Option<usize>) -> SequencePolicy {
    SequencePolicy {
        dynamic_growth: dynamic,
        context_window: None,
        sliding_window: window,
        debug_blocks: false,
        trim_margin: 0,
    }
}

fn append_all(seq: &mut SequenceCache, pool: &mut KvPool, t: usize, seed: u64) -> Result<(), CacheError> {
    for layer in 0..pool.config().num_layers {
        let k = random_rows(seed + layer as u64, t * ROW, 1.0);
        let v = random_rows(seed + 100 + layer as u64, t * ROW, 1.0);
        seq.append(pool, layer, &k, &v)?;
    }
    Ok(())
}

#[test]
fn sequences_take_blocks_in_pool_order_and_free_tail_first() {
    let mut pool = KvPool::new(config(1, 8)).unwrap();
    let mut a = SequenceCache::new(&mut pool, policy(false, None), 32).unwrap();
    let b = SequenceCache::new(&mut pool, policy(false, None), 17).unwrap();
    assert_eq!(a.block_table(), &[0, 1]);
    assert_eq!(b.block_table(), &[2, 3]);
    append_all(&mut a, &mut pool, 20, 1).unwrap();
    assert_eq!((a.offset(), a.capacity(), a.allocated_blocks()), (20, 32, 2));
    assert_eq!(a.slot(17), 16 + 1);
    a.release(&mut pool);
    assert_eq!(pool.blocks().free_order(), vec![4, 5, 6, 7, 1, 0], "tail block freed first");
    b.release(&mut pool);
    assert_eq!(pool.blocks().num_free(), 8);
}

#[test]
fn refused_append_leaves_the_cache_exactly_as_it_was() {
    let mut pool = KvPool::new(config(2, 8)).unwrap();
    let mut s = SequenceCache::new(&mut pool, policy(false, None), 32).unwrap();
    append_all(&mut s, &mut pool, 30, 1).unwrap();
    let (before_k, before_v) = s.gather(&pool, 1, 0..30).unwrap();
    let table = s.block_table().to_vec();
    let stats = pool.stats();
    let err = append_all(&mut s, &mut pool, 3, 9).unwrap_err();
    assert_eq!(err, CacheError::Capacity { required: 3, available: 2, reason: CapacityReason::GrowthDisabled });
    let msg = err.to_string();
    assert!(msg.contains("3 tokens required") && msg.contains("2 available"), "{msg}");
    assert_eq!((s.offset(), s.capacity(), s.block_table()), (30, 32, table.as_slice()));
    assert_eq!(s.gather(&pool, 1, 0..30).unwrap(), (before_k, before_v));
    let after = pool.stats();
    assert_eq!(
        (after.blocks_used, after.appends, after.tokens_written),
        (stats.blocks_used, stats.appends, stats.tokens_written)
    );
    assert_eq!(after.capacity_errors, stats.capacity_errors + 1);
    // Two more tokens still fit.
    append_all(&mut s, &mut pool, 2, 5).unwrap();
    assert_eq!(s.offset(), 32);
}

#[test]
fn growth_takes_about_one_and_a_half_times_and_never_copies() {
    let mut pool = KvPool::new(config(1, 64)).unwrap();
    let mut s = SequenceCache::new(&mut pool, policy(true, None), 16).unwrap();
    let mut counts = vec![s.allocated_blocks()];
    let mut first_blocks = Vec::new();
    for i in 0..20 {
        append_all(&mut s, &mut pool, 16, i).unwrap();
        if counts.last() != Some(&s.allocated_blocks()) {
            counts.push(s.allocated_blocks());
        }
        if i == 0 {
            first_blocks = s.block_table().to_vec();
        }
    }
    assert_eq!(counts, vec![1, 2, 3, 5, 8, 12, 18, 27]);
    assert_eq!(s.grow_events(), 7);
    assert_eq!(&s.block_table()[..first_blocks.len()], first_blocks.as_slice(), "existing blocks never move");
    assert_eq!(pool.stats().cow_copies, 0);
}

#[test]
fn growth_stops_at_the_context_window() {
    let mut pool = KvPool::new(config(1, 64)).unwrap();
    let mut p = policy(true, None);
    p.context_window = Some(40);
    let mut s = SequenceCache::new(&mut pool, p, 16).unwrap();
    append_all(&mut s, &mut pool, 17, 1).unwrap();
    append_all(&mut s, &mut pool, 23, 2).unwrap();
    assert_eq!(s.capacity(), 48, "capped at ceil(40/16) blocks");
    let err = append_all(&mut s, &mut pool, 1, 3).unwrap_err();
    assert_eq!(err, CacheError::Capacity { required: 1, available: 0, reason: CapacityReason::ContextWindow });
}

#[test]
fn pool_exhaustion_is_an_error_that_changes_nothing() {
    let mut pool = KvPool::new(config(1, 3)).unwrap();
    let mut s = SequenceCache::new(&mut pool, policy(true, None), 16).unwrap();
    let _other = SequenceCache::new(&mut pool, policy(false, None), 32).unwrap();
    append_all(&mut s, &mut pool, 16, 1).unwrap();
    let err = append_all(&mut s, &mut pool, 1, 2).unwrap_err();
    assert!(matches!(err, CacheError::PoolExhausted { needed: 1, free: 0 }), "{err}");
    assert_eq!((s.offset(), s.allocated_blocks()), (16, 1));
}

#[test]
fn sliding_window_bounds_held_blocks_forever() {
    for bs in [8usize, 16, 32] {
        for w in [1usize, 7, 16, 33, 100] {
            let mut c = config(2, 64);
            c.block_size = bs;
            let mut pool = KvPool::new(c).unwrap();
            let mut s = SequenceCache::new(&mut pool, policy(true, Some(w)), 1).unwrap();
            let bound = w.div_ceil(bs) + 1;
            for i in 0..1000u64 {
                append_all(&mut s, &mut pool, 1, i).unwrap();
                assert!(
                    s.allocated_blocks() <= bound,
                    "bs={bs} w={w} step {i}: {} blocks > {bound}",
                    s.allocated_blocks()
                );
                // Everything the window can see is still there.
                let range = s.visible_range(0, None);
                assert_eq!(range.len(), w.min(s.offset()));
                s.gather(&pool, 1, range).unwrap();
            }
            assert_eq!(pool.blocks().num_used(), s.allocated_blocks());
            assert!(s.block_table().iter().take_while(|&&b| b == NULL_BLOCK).count() > 0);
            assert!(pool.stats().reclaimed_blocks > 0);
        }
    }
}

#[test]
fn windowed_sequence_recycles_within_its_reservation_without_growth() {
    let mut pool = KvPool::new(config(1, 4)).unwrap();
    // W = 32, bs = 16: at most 3 blocks; reserve them and run with growth off.
    let mut s = SequenceCache::new(&mut pool, policy(false, Some(32)), 48).unwrap();
    for i in 0..500u64 {
        append_all(&mut s, &mut pool, 1, i).unwrap();
        assert!(s.allocated_blocks() <= 3);
    }
    assert_eq!(s.grow_events(), 0);
}

#[test]
fn per_call_window_never_reaches_reclaimed_tokens() {
    let mut pool = KvPool::new(config(1, 16)).unwrap();
    let mut s = SequenceCache::new(&mut pool, policy(true, Some(20)), 16).unwrap();
    append_all(&mut s, &mut pool, 100, 1).unwrap();
    append_all(&mut s, &mut pool, 1, 2).unwrap();
    assert_eq!(s.attention_window(Some(50)), Some(20));
    assert_eq!(s.attention_window(Some(5)), Some(5));
    assert_eq!(s.visible_range(0, Some(50)), 81..101);
    assert!(s.gather(&pool, 0, 0..10).is_err(), "reclaimed positions are not readable");
}

#[test]
fn trim_returns_whole_blocks_and_snapshot_restores() {
    let mut pool = KvPool::new(config(1, 8)).unwrap();
    let mut s = SequenceCache::new(&mut pool, policy(true, None), 16).unwrap();
    append_all(&mut s, &mut pool, 40, 1).unwrap();
    let snap = s.snapshot();
    let (k40, _) = s.gather(&pool, 0, 0..40).unwrap();
    s.trim(&mut pool, 5).unwrap();
    assert_eq!(s.offset(), 35);
    s.restore(&snap).unwrap();
    assert_eq!(s.gather(&pool, 0, 0..40).unwrap().0, k40, "rollback of a rollback keeps the data");
    s.trim(&mut pool, 30).unwrap();
    assert_eq!((s.offset(), s.allocated_blocks()), (10, 1));
    let err = s.restore(&snap).unwrap_err();
    assert!(matches!(err, CacheError::Restore { offset: 40, .. }), "{err}");
    assert!(matches!(s.trim(&mut pool, 11), Err(CacheError::TrimTooFar { requested: 11, stored: 10 })));
    assert_eq!(pool.blocks().num_used(), 1);
}

#[test]
fn fork_shares_blocks_and_copies_on_write() {
    let mut pool = KvPool::new(config(2, 16)).unwrap();
    let mut a = SequenceCache::new(&mut pool, policy(true, None), 16).unwrap();
    append_all(&mut a, &mut pool, 20, 1).unwrap();
    let mut b = a.fork(&mut pool).unwrap();
    let shared = a.block_table()[..2].to_vec();
    assert_eq!(&b.block_table()[..2], shared.as_slice());
    assert_eq!(pool.blocks().ref_count(shared[0]), 2);
    let (ka, va) = a.gather(&pool, 1, 0..20).unwrap();
    assert_eq!((pool.blocks().num_shared(), pool.stats().blocks_shared), (2, 2));
    assert_eq!(b.copy_on_write_blocks(&pool, 3), 1, "the partly filled block is shared");
    assert_eq!(b.copy_on_write_blocks(&pool, 0), 0);
    // b writes into the shared, partly filled block 1: it gets its own copy.
    append_all(&mut b, &mut pool, 3, 7).unwrap();
    assert_eq!(pool.blocks().num_shared(), 1, "only the full block stays shared");
    assert_eq!((a.copy_on_write_blocks(&pool, 1), b.copy_on_write_blocks(&pool, 1)), (0, 0));
    assert_eq!(b.block_table()[0], shared[0], "full block stays shared");
    assert_ne!(b.block_table()[1], shared[1], "written block was copied");
    assert_eq!(pool.stats().cow_copies, 1);
    assert_eq!(a.gather(&pool, 1, 0..20).unwrap(), (ka.clone(), va), "the original is untouched");
    assert_eq!(b.gather(&pool, 1, 0..20).unwrap().0, ka, "the copy kept the shared prefix");
    a.release(&mut pool);
    b.release(&mut pool);
    assert_eq!(pool.blocks().num_free(), 16);
}

#[test]
fn from_dense_imports_and_layers_must_follow_in_order() {
    let mut pool = KvPool::new(config(2, 8)).unwrap();
    let k = random_rows(1, 2 * 21 * ROW, 1.0);
    let v = random_rows(2, 2 * 21 * ROW, 1.0);
    let mut s = SequenceCache::from_dense(&mut pool, policy(true, None), &k, &v, 21).unwrap();
    assert_eq!(s.offset(), 21);
    assert_eq!(s.gather(&pool, 1, 0..21).unwrap().0, k[21 * ROW..].to_vec());
    let row = random_rows(3, ROW, 1.0);
    assert!(matches!(s.append(&mut pool, 1, &row, &row), Err(CacheError::LayerOrder { layer: 1, expected: 0, .. })));
    s.append(&mut pool, 0, &row, &row).unwrap();
    assert_eq!((s.context_len(0), s.context_len(1), s.offset()), (22, 21, 21));
    assert!(matches!(s.trim(&mut pool, 1), Err(CacheError::AppendInProgress { .. })));
    let two = random_rows(4, 2 * ROW, 1.0);
    assert!(matches!(s.append(&mut pool, 1, &two, &two), Err(CacheError::Shape { .. })));
    s.append(&mut pool, 1, &row, &row).unwrap();
    assert_eq!(s.offset(), 22);
    assert!(matches!(
        SequenceCache::from_dense(&mut pool, policy(true, None), &k[1..], &v, 21),
        Err(CacheError::Shape { .. })
    ));
}

#[test]
fn standalone_cache_defaults_and_display() {
    let mut c = CacheConfig::new(1, HEADS, DIM);
    c.format = KvFormat::Q8;
    let mut cache = StandaloneCache::new(c.clone()).unwrap();
    assert_eq!(cache.capacity(), 1024 * 16, "growth off: the whole pool is reserved");
    let k = random_rows(1, 5 * ROW, 1.0);
    cache.append(0, &k, &k).unwrap();
    let shown = cache.sequence().to_string();
    assert!(shown.starts_with("offset=5 cap=16384") && shown.contains("   0: 5|"), "{shown}");
    c.dynamic_growth = true;
    let cache = StandaloneCache::new(c).unwrap();
    assert_eq!(cache.capacity(), 16, "growth on: one block to start");
    let st = cache.stats();
    assert_eq!((st.blocks_total, st.blocks_used, st.format.as_str()), (1024, 1, "q8"));
    assert_eq!(st.code_bytes_used, 16 * 2 * HEADS * DIM);
    assert_eq!(st.scale_bytes_used, 16 * 2 * HEADS * 2);
}
