//! Layer groups (the hybrid cache): exact block counts per group as a sliding window moves,
//! and a model-based property test — random append / trim / fork / release on several
//! sequences over one pool of layer-sliced blocks, checked after every step against a dense
//! history of every layer: each full layer reads back everything, each sliding layer its
//! window, sliding groups never hold more than `⌈W / block_size⌉ + 1` blocks, and every block
//! reference is accounted for.

mod common;

use std::collections::HashMap;

use common::random_rows;
use kvcache::{CacheConfig, CacheError, GroupKind, KvFormat, KvPool, SequenceCache, SequencePolicy, NULL_BLOCK};
use proptest::prelude::*;

const HEADS: usize = 1;
const DIM: usize = 8;
const ROW: usize = HEADS * DIM;

/// Six layers, windows `[W, W, full, W, W, full]`: two sliding groups and one full group of two
/// layers each.
fn windows(w: usize) -> Vec<Option<usize>> {
    (0..6).map(|l| if l % 3 == 2 { None } else { Some(w) }).collect()
}

fn pool(w: usize, block_size: usize, model_blocks: usize) -> KvPool {
    let mut c = CacheConfig::new(6, HEADS, DIM);
    c.format = KvFormat::F32;
    c.block_size = block_size;
    c.num_blocks = model_blocks;
    c.set_layer_windows(&windows(w)).unwrap();
    KvPool::new(c).unwrap()
}

fn policy(dynamic: bool) -> SequencePolicy {
    SequencePolicy {
        dynamic_growth: dynamic,
        context_window: None,
        sliding_window: None,
        debug_blocks: false,
        trim_margin: 0,
    }
}

/// Appends `t` tokens through every layer (the values do not matter here).
fn append(s: &mut SequenceCache, pool: &mut KvPool, t: usize) -> Result<(), CacheError> {
    let rows = vec![0.5f32; t * ROW];
    for layer in 0..6 {
        s.append(pool, layer, &rows, &rows)?;
    }
    Ok(())
}

fn held(table: &[u32]) -> usize {
    table.iter().filter(|&&b| b != NULL_BLOCK).count()
}

#[test]
fn pools_slice_blocks_by_layer_and_keep_their_bytes() {
    let p = pool(32, 16, 100);
    assert_eq!((p.geometry().num_layers, p.geometry().num_blocks), (2, 300));
    let g = p.groups();
    assert_eq!(g.kinds(), &[GroupKind::Sliding { window: 32 }, GroupKind::Sliding { window: 32 }, GroupKind::Full]);
    let one = {
        let mut c = CacheConfig::new(6, HEADS, DIM);
        c.num_blocks = 100;
        c.format = KvFormat::F32;
        KvPool::new(c).unwrap()
    };
    assert_eq!(p.stats().bytes_total, one.stats().bytes_total, "same bytes, sliced 3 ways");
}

#[test]
fn sliding_groups_hold_a_window_of_blocks_while_the_full_group_grows() {
    // Gemma 3's shape at 16 tokens a block: window 512, so at most 33 blocks per sliding group.
    let mut p = pool(512, 16, 4096);
    let mut s = SequenceCache::new(&mut p, policy(true), 16).unwrap();
    append(&mut s, &mut p, 100).unwrap();
    for step in 0..4000 {
        append(&mut s, &mut p, 1).unwrap();
        let len = s.offset();
        let blocks: Vec<usize> = s.group_blocks().collect();
        assert!(blocks[0] <= 33 && blocks[1] <= 33, "step {step}: {blocks:?}");
        assert_eq!(blocks[0], held(s.group_table(0)));
        // The full group holds every position (and growth's spare blocks).
        assert!(blocks[2] >= len.div_ceil(16), "step {step}");
        assert_eq!(s.group_live_start(2), 0);
        // The sliding groups still hold the next query's window.
        assert!(s.group_live_start(0) <= (len + 1).saturating_sub(512));
    }
    assert_eq!(s.group_blocks().take(2).collect::<Vec<_>>(), vec![33, 33]);
    let used = p.blocks().num_used();
    assert_eq!(used, s.allocated_blocks());
    s.release(&mut p);
    assert_eq!(p.blocks().num_used(), 0);
}

#[test]
fn a_long_prefill_chunk_returns_to_the_bound_when_it_commits() {
    let mut p = pool(64, 16, 256);
    let mut s = SequenceCache::new(&mut p, policy(true), 0).unwrap();
    append(&mut s, &mut p, 1000).unwrap();
    let blocks: Vec<usize> = s.group_blocks().collect();
    assert_eq!(blocks[..2], [5, 5], "⌈64/16⌉ + 1");
    assert_eq!(blocks[2], 1000usize.div_ceil(16));
    // Cutting back to the last block boundary keeps every window whole (the bank's fork point),
    // further back does not.
    assert!(s.can_cut_to(992));
    assert!(!s.can_cut_to(900));
    assert!(matches!(s.trim(&mut p, 100), Err(CacheError::TrimTooFar { .. })));
    s.trim(&mut p, 8).unwrap();
    assert_eq!(s.offset(), 992);
}

#[test]
fn forks_share_every_group_and_copy_on_write() {
    let mut p = pool(32, 8, 64);
    let mut a = SequenceCache::new(&mut p, policy(true), 0).unwrap();
    append(&mut a, &mut p, 60).unwrap();
    let used = p.blocks().num_used();
    let mut b = a.fork(&mut p).unwrap();
    assert_eq!(p.blocks().num_used(), used, "a fork of full blocks takes none");
    for g in 0..3 {
        assert_eq!(a.group_table(g)[..7], b.group_table(g)[..7]);
    }
    // Appending into the shared partial block copies it in every group.
    append(&mut b, &mut p, 1).unwrap();
    for g in 0..3 {
        assert_ne!(a.group_table(g)[7], b.group_table(g)[7], "group {g}");
    }
    a.release(&mut p);
    b.release(&mut p);
    p.blocks().check_invariants();
    assert_eq!(p.blocks().num_used(), 0);
}

#[test]
fn growth_off_refuses_in_the_full_group_and_changes_nothing() {
    let mut p = pool(16, 8, 64);
    let mut s = SequenceCache::new(&mut p, policy(false), 40).unwrap();
    assert_eq!(s.group_blocks().collect::<Vec<_>>(), vec![3, 3, 5], "sliding groups reserve ⌈16/8⌉ + 1");
    append(&mut s, &mut p, 40).unwrap();
    let before: Vec<Vec<u32>> = s.block_tables().map(<[u32]>::to_vec).collect();
    let err = append(&mut s, &mut p, 1).unwrap_err();
    assert!(matches!(err, CacheError::Capacity { available: 0, .. }), "{err}");
    assert_eq!(before, s.block_tables().map(<[u32]>::to_vec).collect::<Vec<_>>());
}

#[test]
fn from_dense_and_gather_go_through_each_layers_group() {
    let mut p = pool(16, 8, 64);
    let n = 40;
    let keys = random_rows(1, 6 * n * ROW, 1.0);
    let values = random_rows(2, 6 * n * ROW, 1.0);
    let s = SequenceCache::from_dense(&mut p, policy(true), &keys, &values, n).unwrap();
    for layer in 0..6 {
        let from = if layer % 3 == 2 { 0 } else { s.group_live_start(p.groups().locate(layer).0) };
        let (k, v) = s.gather(&p, layer, from..n).unwrap();
        let r = (layer * n + from) * ROW..(layer + 1) * n * ROW;
        assert_eq!((k, v), (keys[r.clone()].to_vec(), values[r].to_vec()), "layer {layer}");
    }
    assert!(s.gather(&p, 0, 0..n).is_err(), "a sliding layer's old positions are gone");
    let text = s.to_string();
    assert!(text.contains("g0 w16 |  --  |") && text.contains("g2 full |"), "{text}");
}

#[derive(Clone, Debug)]
enum Op {
    Append { seq: usize, t: usize },
    Trim { seq: usize, n: usize },
    Fork { seq: usize },
    Release { seq: usize },
    New { reserve: usize, dynamic: bool },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..4usize, prop_oneof![3 => 1..4usize, 1 => 1..40usize]).prop_map(|(seq, t)| Op::Append { seq, t }),
        2 => (0..4usize, 0..20usize).prop_map(|(seq, n)| Op::Trim { seq, n }),
        1 => (0..4usize).prop_map(|seq| Op::Fork { seq }),
        1 => (0..4usize).prop_map(|seq| Op::Release { seq }),
        1 => (0..64usize, any::<bool>()).prop_map(|(reserve, dynamic)| Op::New { reserve, dynamic }),
    ]
}

/// Every token ever written to a sequence, per layer (`[layer][position * ROW ..]`).
#[derive(Clone, Debug, Default)]
struct Dense {
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

struct World {
    pool: KvPool,
    window: usize,
    seqs: Vec<(SequenceCache, Dense)>,
    step: u64,
}

impl World {
    fn add(&mut self, reserve: usize, dynamic: bool) {
        let free = self.pool.blocks().num_free();
        match SequenceCache::new(&mut self.pool, policy(dynamic), reserve) {
            Ok(s) => self.seqs.push((s, Dense { keys: vec![Vec::new(); 6], values: vec![Vec::new(); 6] })),
            Err(CacheError::PoolExhausted { needed, .. }) => assert!(needed > free),
            Err(e) => panic!("unexpected {e}"),
        }
    }

    fn apply(&mut self, op: &Op) {
        self.step += 1;
        let n = self.seqs.len();
        match *op {
            Op::New { reserve, dynamic } => {
                if n < 6 {
                    self.add(reserve, dynamic);
                }
            }
            _ if n == 0 => {}
            Op::Append { seq, t } => self.append(seq % n, t),
            Op::Trim { seq, n: k } => {
                let (s, d) = &mut self.seqs[seq % n];
                let before: Vec<Vec<u32>> = s.block_tables().map(<[u32]>::to_vec).collect();
                let (offset, cuttable) = (s.offset(), k <= s.offset() && s.can_cut_to(s.offset() - k));
                match s.trim(&mut self.pool, k) {
                    Ok(()) => {
                        assert!(cuttable);
                        for layer in 0..6 {
                            d.keys[layer].truncate((offset - k) * ROW);
                            d.values[layer].truncate((offset - k) * ROW);
                        }
                    }
                    Err(CacheError::TrimTooFar { .. }) => {
                        assert!(!cuttable, "trim of {k} from {offset} refused but could cut");
                        assert_eq!(before, s.block_tables().map(<[u32]>::to_vec).collect::<Vec<_>>());
                    }
                    Err(e) => panic!("unexpected {e}"),
                }
            }
            Op::Fork { seq } => {
                if n < 6 {
                    let (s, d) = &self.seqs[seq % n];
                    match s.fork(&mut self.pool) {
                        Ok(f) => {
                            let d = d.clone();
                            self.seqs.push((f, d));
                        }
                        Err(CacheError::PoolExhausted { .. }) => {}
                        Err(e) => panic!("unexpected {e}"),
                    }
                }
            }
            Op::Release { seq } => {
                let (s, _) = self.seqs.remove(seq % n);
                s.release(&mut self.pool);
            }
        }
    }

    fn append(&mut self, i: usize, t: usize) {
        let step = self.step;
        let (s, d) = &mut self.seqs[i];
        let before: Vec<Vec<u32>> = s.block_tables().map(<[u32]>::to_vec).collect();
        let rows: Vec<(Vec<f32>, Vec<f32>)> = (0..6u64)
            .map(|l| (random_rows(step * 31 + l, t * ROW, 2.0), random_rows(step * 37 + l + 1000, t * ROW, 2.0)))
            .collect();
        for (layer, (k, v)) in rows.iter().enumerate() {
            match s.append(&mut self.pool, layer, k, v) {
                Ok(()) => {}
                Err(e @ (CacheError::Capacity { .. } | CacheError::PoolExhausted { .. })) => {
                    assert_eq!(layer, 0, "only the opening layer may refuse: {e}");
                    let after: Vec<Vec<u32>> = s.block_tables().map(<[u32]>::to_vec).collect();
                    assert_eq!(before, after, "refused append changed the cache: {e}");
                    return;
                }
                Err(e) => panic!("unexpected {e}"),
            }
        }
        for (layer, (k, v)) in rows.into_iter().enumerate() {
            d.keys[layer].extend(k);
            d.values[layer].extend(v);
        }
    }

    fn check(&self) {
        let blocks = self.pool.blocks();
        blocks.check_invariants();
        let groups = self.pool.groups();
        let bs = self.pool.geometry().block_size;
        let cap = self.window.div_ceil(bs) + 1;
        let mut refs: HashMap<u32, u32> = HashMap::new();
        for (s, d) in &self.seqs {
            let offset = s.offset();
            assert_eq!(d.keys[0].len(), offset * ROW);
            for (g, table) in s.block_tables().enumerate() {
                assert!(table.len() * bs >= offset);
                let first_live = table.iter().position(|&b| b != NULL_BLOCK).unwrap_or(table.len());
                assert!(table[first_live..].iter().all(|&b| b != NULL_BLOCK), "group {g}: holes after the window");
                if let GroupKind::Sliding { window } = groups.kind(g) {
                    assert!(held(table) <= cap, "group {g} holds {} > {cap}", held(table));
                    assert!(first_live <= (offset + 1).saturating_sub(window) / bs, "group {g} lost its window");
                } else {
                    assert_eq!(first_live, 0);
                }
                for &b in table.iter().filter(|&&b| b != NULL_BLOCK) {
                    *refs.entry(b).or_default() += 1;
                }
            }
            assert_eq!(s.allocated_blocks(), s.group_blocks().sum::<usize>());
            for layer in 0..6 {
                let (g, _) = groups.locate(layer);
                let from = match groups.kind(g) {
                    // The next query, at `offset`, sees `[offset + 1 - W, offset]`.
                    GroupKind::Sliding { window } => (offset + 1).saturating_sub(window),
                    GroupKind::Full => 0,
                };
                let (k, v) = s.gather(&self.pool, layer, from..offset).unwrap();
                assert_eq!(k, d.keys[layer][from * ROW..], "keys differ in layer {layer}");
                assert_eq!(v, d.values[layer][from * ROW..], "values differ in layer {layer}");
            }
        }
        assert_eq!(refs.len(), blocks.num_used(), "leaked or double-held blocks");
        for (b, n) in refs {
            assert_eq!(blocks.ref_count(b), n, "ref count of block {b}");
        }
    }
}

fn run(window: usize, block_size: usize, model_blocks: usize, ops: &[Op]) {
    let pool = pool(window, block_size, model_blocks);
    let total = pool.blocks().num_blocks();
    let mut w = World { pool, window, seqs: Vec::new(), step: 0 };
    w.add(20, true);
    w.add(8, false);
    w.check();
    for op in ops {
        w.apply(op);
        w.check();
    }
    for (s, _) in w.seqs.drain(..) {
        s.release(&mut w.pool);
    }
    assert_eq!(w.pool.blocks().num_free(), total, "blocks leaked after releasing every sequence");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    #[test]
    fn groups_match_the_dense_model(window in 4..48usize, bs in prop::sample::select(vec![8usize, 16]), blocks in 8..40usize, ops in prop::collection::vec(op(), 1..60)) {
        run(window, bs, blocks, &ops);
    }
}

/// With a trim margin `m` (speculative decoding), every step of `1 + k` tokens (k ≤ m drafted)
/// can be trimmed back by up to `k` tokens with every window still whole, and a sliding group
/// never holds more than `⌈W / block_size⌉ + ⌈m / block_size⌉ + 1` blocks. Without the margin the same
/// trims are refused once the window has moved.
#[test]
fn a_trim_margin_keeps_windows_whole_for_trims_up_to_it() {
    let (w, bs) = (40, 16);
    for m in [1usize, 8, 16, 20] {
        let mut p = pool(w, bs, 4096);
        let mut margin = policy(true);
        margin.trim_margin = m;
        let mut s = SequenceCache::new(&mut p, margin, 16).unwrap();
        append(&mut s, &mut p, 30).unwrap();
        let cap = w.div_ceil(bs) + m.div_ceil(bs) + 1;
        for step in 0..300 {
            // A verification step of 1 + k tokens, then its rejected draft tokens trimmed (the
            // trim itself checks that every window is still whole).
            let k = 1 + step % m;
            let rejected = (step * 7) % (k + 1);
            append(&mut s, &mut p, 1 + k).unwrap();
            s.trim(&mut p, rejected).unwrap_or_else(|e| panic!("m {m} step {step}: trim {rejected} of {k}: {e}"));
            let blocks: Vec<usize> = s.group_blocks().collect();
            assert!(blocks[0] <= cap && blocks[1] <= cap, "m {m} step {step}: {blocks:?} > {cap}");
        }
    }
    // No margin: a trim across a block boundary the window already left is refused.
    let mut p = pool(w, bs, 4096);
    let mut s = SequenceCache::new(&mut p, policy(true), 16).unwrap();
    append(&mut s, &mut p, 70).unwrap();
    append(&mut s, &mut p, 20).unwrap();
    assert!(matches!(s.trim(&mut p, 20), Err(CacheError::TrimTooFar { .. })));
}
