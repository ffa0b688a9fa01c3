//! Model-based property test: random append / trim / window / fork / snapshot / restore /
//! release on several sequences sharing one pool, checked after every step against a plain
//! dense model — bytes read back, offset, capacity, and the pool's exact accounting.

mod common;

use std::collections::HashMap;

use common::{random_rows, roundtrip};
use kvcache::{CacheConfig, CacheError, KvFormat, KvPool, SequenceCache, SequencePolicy, Snapshot, NULL_BLOCK};
use proptest::prelude::*;

const LAYERS: usize = 2;
const HEADS: usize = 2;
const DIM: usize = 16;
const ROW: usize = HEADS * DIM;

#[derive(Clone, Debug)]
enum Op {
    Append { seq: usize, t: usize },
    Trim { seq: usize, n: usize },
    Window { seq: usize, w: Option<usize> },
    Fork { seq: usize },
    Snapshot { seq: usize },
    Restore { seq: usize },
    Release { seq: usize },
    New { reserve: usize, dynamic: bool, window: Option<usize> },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..4usize, prop_oneof![3 => 1..4usize, 1 => 1..40usize]).prop_map(|(seq, t)| Op::Append { seq, t }),
        2 => (0..4usize, 0..20usize).prop_map(|(seq, n)| Op::Trim { seq, n }),
        1 => (0..4usize, prop::option::of(8..40usize)).prop_map(|(seq, w)| Op::Window { seq, w }),
        1 => (0..4usize).prop_map(|seq| Op::Fork { seq }),
        1 => (0..4usize).prop_map(|seq| Op::Snapshot { seq }),
        1 => (0..4usize).prop_map(|seq| Op::Restore { seq }),
        1 => (0..4usize).prop_map(|seq| Op::Release { seq }),
        1 => (0..64usize, any::<bool>(), prop::option::of(8..40usize)).prop_map(|(reserve, dynamic, window)| Op::New { reserve, dynamic, window }),
    ]
}

/// The dense model of one sequence: every token ever stored (reclaimed ones too), per layer.
#[derive(Clone, Debug)]
struct Dense {
    /// `[layer][position * ROW ..]` expected (already round-tripped) keys and values.
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    offset: usize,
    live_start: usize,
    /// Positions whose contents are still held (blocks not released since written).
    held: usize,
    snapshot: Option<(Snapshot, usize)>,
}

struct World {
    pool: KvPool,
    seqs: Vec<(SequenceCache, Dense)>,
    format: KvFormat,
    seed: u64,
    step: u64,
}

impl World {
    fn new(format: KvFormat, block_size: usize, num_blocks: usize) -> World {
        let mut c = CacheConfig::new(LAYERS, HEADS, DIM);
        c.format = format;
        c.block_size = block_size;
        c.num_blocks = num_blocks;
        let seed = c.rotation_seed;
        World { pool: KvPool::new(c).unwrap(), seqs: Vec::new(), format, seed, step: 0 }
    }

    fn add(&mut self, reserve: usize, dynamic: bool, window: Option<usize>) {
        let policy = SequencePolicy {
            dynamic_growth: dynamic,
            context_window: Some(200),
            sliding_window: window,
            debug_blocks: false,
            trim_margin: 0,
        };
        let free = self.pool.blocks().num_free();
        match SequenceCache::new(&mut self.pool, policy, reserve) {
            Ok(s) => self.seqs.push((
                s,
                Dense {
                    keys: vec![Vec::new(); LAYERS],
                    values: vec![Vec::new(); LAYERS],
                    offset: 0,
                    live_start: 0,
                    held: 0,
                    snapshot: None,
                },
            )),
            Err(CacheError::PoolExhausted { needed, .. }) => assert!(needed > free),
            Err(e) => panic!("unexpected {e}"),
        }
    }

    fn apply(&mut self, op: &Op) {
        self.step += 1;
        let n = self.seqs.len();
        match *op {
            Op::New { reserve, dynamic, window } => {
                if n < 6 {
                    self.add(reserve, dynamic, window);
                }
            }
            _ if n == 0 => {}
            Op::Append { seq, t } => self.append(seq % n, t),
            Op::Trim { seq, n: k } => {
                let (s, d) = &mut self.seqs[seq % n];
                let before = (s.offset(), s.block_table().to_vec());
                match s.trim(&mut self.pool, k) {
                    Ok(()) => {
                        d.offset -= k;
                        d.held = d.held.min(d.offset.div_ceil(s.block_size()) * s.block_size());
                    }
                    Err(CacheError::TrimTooFar { requested, stored }) => {
                        assert!(requested > stored && stored == d.offset - d.live_start);
                        assert_eq!(before, (s.offset(), s.block_table().to_vec()));
                    }
                    Err(e) => panic!("unexpected {e}"),
                }
            }
            Op::Window { seq, w } => {
                let (s, d) = &mut self.seqs[seq % n];
                s.set_sliding_window(&mut self.pool, w).unwrap();
                d.live_start = s.live_start();
            }
            Op::Fork { seq } => {
                if n < 6 {
                    let (s, d) = &self.seqs[seq % n];
                    match s.fork(&mut self.pool) {
                        Ok(f) => {
                            let mut d = d.clone();
                            d.snapshot = None;
                            self.seqs.push((f, d));
                        }
                        Err(CacheError::PoolExhausted { .. }) => {}
                        Err(e) => panic!("unexpected {e}"),
                    }
                }
            }
            Op::Snapshot { seq } => {
                let (s, d) = &mut self.seqs[seq % n];
                d.snapshot = Some((s.snapshot(), d.offset));
            }
            Op::Restore { seq } => {
                let (s, d) = &mut self.seqs[seq % n];
                if let Some((snap, off)) = d.snapshot {
                    // Tokens written since the snapshot overwrite the model's history at the
                    // same positions, so the dense model stays valid as long as the blocks do.
                    match s.restore(&snap) {
                        Ok(()) => {
                            assert!(
                                off <= d.held && off >= d.live_start,
                                "restored {off} but held {} live {}",
                                d.held,
                                d.live_start
                            );
                            d.offset = off;
                        }
                        Err(CacheError::Restore { .. }) => assert!(off > d.held || off < d.live_start),
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
        let before = (s.offset(), s.block_table().to_vec(), s.capacity());
        let mut rows = Vec::new();
        for layer in 0..LAYERS {
            let k = random_rows(step * 31 + layer as u64, t * ROW, 2.0);
            let v = random_rows(step * 37 + layer as u64 + 1000, t * ROW, 2.0);
            rows.push((k, v));
        }
        for (layer, (k, v)) in rows.iter().enumerate() {
            match s.append(&mut self.pool, layer, k, v) {
                Ok(()) => {}
                Err(e @ (CacheError::Capacity { .. } | CacheError::PoolExhausted { .. })) => {
                    assert_eq!(layer, 0, "only the opening layer may refuse: {e}");
                    // The cache is exactly as it was.
                    assert_eq!(
                        before,
                        (s.offset(), s.block_table().to_vec(), s.capacity()),
                        "refused append changed the cache: {e}"
                    );
                    return;
                }
                Err(e) => panic!("unexpected {e}"),
            }
        }
        // Accepted: the model stores the round-tripped rows at positions offset..offset+t.
        for (layer, (k, v)) in rows.iter().enumerate() {
            let kk = roundtrip(self.format, self.seed, DIM, k, true);
            let vv = roundtrip(self.format, self.seed, DIM, v, false);
            let at = d.offset * ROW;
            d.keys[layer].truncate(d.held * ROW);
            d.values[layer].truncate(d.held * ROW);
            for (hist, new) in [(&mut d.keys[layer], &kk), (&mut d.values[layer], &vv)] {
                let overlap = hist.len().saturating_sub(at).min(new.len());
                hist[at..at + overlap].copy_from_slice(&new[..overlap]);
                hist.extend_from_slice(&new[overlap..]);
            }
        }
        d.offset += t;
        d.held = d.held.max(d.offset);
        d.live_start = s.live_start();
    }

    fn check(&self) {
        let blocks = self.pool.blocks();
        blocks.check_invariants();
        let mut refs: HashMap<u32, u32> = HashMap::new();
        for (s, d) in &self.seqs {
            assert_eq!(s.offset(), d.offset);
            assert_eq!(s.live_start(), d.live_start);
            assert_eq!(s.capacity(), s.allocated_blocks() * s.block_size());
            assert!(s.block_table().len() * s.block_size() >= s.offset());
            let live: Vec<u32> = s.block_table().iter().copied().filter(|&b| b != NULL_BLOCK).collect();
            assert_eq!(live.len(), s.allocated_blocks());
            for b in live {
                *refs.entry(b).or_default() += 1;
            }
            if let Some(w) = s.policy().sliding_window {
                // A windowed sequence never keeps a block no future window reaches.
                let needed_from = (d.offset + 1).saturating_sub(w) / s.block_size();
                assert!(
                    s.block_table()[..needed_from.min(s.block_table().len())].iter().all(|&b| b == NULL_BLOCK)
                        || s.live_start() <= d.offset
                );
            }
            for layer in 0..LAYERS {
                let (k, v) = s.gather(&self.pool, layer, d.live_start..d.offset).unwrap();
                let r = d.live_start * ROW..d.offset * ROW;
                assert_eq!(k, d.keys[layer][r.clone()], "keys differ in layer {layer}");
                assert_eq!(v, d.values[layer][r], "values differ in layer {layer}");
            }
        }
        // Exact accounting: every used block is held by exactly its ref count of tables.
        assert_eq!(refs.len(), blocks.num_used(), "leaked or double-held blocks");
        for (b, n) in refs {
            assert_eq!(blocks.ref_count(b), n, "ref count of block {b}");
        }
        assert_eq!(blocks.num_used() + blocks.num_free(), blocks.num_blocks());
        let stats = self.pool.stats();
        assert_eq!(stats.blocks_used, blocks.num_used());
    }
}

fn run(format: KvFormat, block_size: usize, num_blocks: usize, ops: &[Op]) {
    let mut w = World::new(format, block_size, num_blocks);
    w.add(20, true, None);
    w.add(8, false, Some(24));
    w.check();
    for op in ops {
        w.apply(op);
        w.check();
    }
    let seqs: Vec<_> = w.seqs.drain(..).collect();
    for (s, _) in seqs {
        s.release(&mut w.pool);
    }
    assert_eq!(w.pool.blocks().num_free(), num_blocks, "blocks leaked after releasing every sequence");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    #[test]
    fn f32_pages_match_the_dense_model(bs in prop::sample::select(vec![8usize, 16, 32]), blocks in 6..40usize, ops in prop::collection::vec(op(), 1..50)) {
        run(KvFormat::F32, bs, blocks, &ops);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 120, ..ProptestConfig::default() })]

    #[test]
    fn every_format_pages_match_the_dense_model(fmt in prop::sample::select(common::ALL_FORMATS.to_vec()), bs in prop::sample::select(vec![8usize, 16, 32]), blocks in 6..40usize, ops in prop::collection::vec(op(), 1..40)) {
        run(fmt, bs, blocks, &ops);
    }
}

#[test]
fn regression_restore_after_trim_to_zero() {
    let ops = [
        Op::Append { seq: 0, t: 2 },
        Op::Append { seq: 0, t: 1 },
        Op::Snapshot { seq: 0 },
        Op::Append { seq: 0, t: 1 },
        Op::Trim { seq: 0, n: 4 },
        Op::Append { seq: 0, t: 1 },
        Op::Restore { seq: 0 },
    ];
    run(KvFormat::F32, 8, 6, &ops);
}
