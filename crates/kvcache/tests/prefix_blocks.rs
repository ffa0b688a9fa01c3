//! `PrefixBlocks`: a sequence's blocks kept as bare ids (what the session bank holds), and
//! sequences started from them — on a hybrid pool (two sliding groups, one full group), with
//! every token's K/V checked where the new sequence reads it and every reference accounted for.

use kvcache::{CacheConfig, KvFormat, KvPool, PrefixBlocks, SequenceCache, SequencePolicy, NULL_BLOCK};

const DIM: usize = 8;
const BS: usize = 8;
const W: usize = 12;

/// Six layers `[W, W, full, W, W, full]`.
fn pool(blocks: usize) -> KvPool {
    let mut c = CacheConfig::new(6, 1, DIM);
    c.format = KvFormat::F32;
    c.block_size = BS;
    c.num_blocks = blocks;
    c.set_layer_windows(&(0..6).map(|l| if l % 3 == 2 { None } else { Some(W) }).collect::<Vec<_>>()).unwrap();
    KvPool::new(c).unwrap()
}

fn template(p: &KvPool) -> SequenceCache {
    let policy = SequencePolicy {
        dynamic_growth: true,
        context_window: None,
        sliding_window: None,
        debug_blocks: false,
        trim_margin: 0,
    };
    SequenceCache::reserving(p, policy, 0)
}

/// K of (layer, position): distinct everywhere. V is its negation.
fn row(layer: usize, pos: usize) -> Vec<f32> {
    (0..DIM).map(|i| (layer * 10_000 + pos * 10 + i) as f32).collect()
}

/// Appends positions `[s.offset(), s.offset() + t)` one token at a time.
fn append(s: &mut SequenceCache, p: &mut KvPool, t: usize) {
    for _ in 0..t {
        let pos = s.offset();
        for layer in 0..6 {
            let k = row(layer, pos);
            let v: Vec<f32> = k.iter().map(|x| -x).collect();
            s.append(p, layer, &k, &v).unwrap();
        }
    }
}

/// Every position a query at `s.offset()` reads holds what was written there.
fn check_reads(s: &SequenceCache, p: &KvPool) {
    let end = s.offset();
    for layer in 0..6 {
        let from = if layer % 3 == 2 { 0 } else { (end + 1).saturating_sub(W) };
        let (k, v) = s.gather(p, layer, from..end).unwrap();
        for (i, pos) in (from..end).enumerate() {
            assert_eq!(k[i * DIM..(i + 1) * DIM], row(layer, pos)[..], "layer {layer} pos {pos}");
            assert_eq!(v[i * DIM], -row(layer, pos)[0]);
        }
    }
}

fn banked(p: &mut KvPool, tokens: usize) -> PrefixBlocks {
    let mut s = template(p).fork(p).unwrap();
    append(&mut s, p, tokens);
    s.into_prefix(p)
}

#[test]
fn a_prefix_keeps_exactly_its_tokens_blocks_and_a_new_sequence_reads_them() {
    let mut p = pool(64);
    let prefix = banked(&mut p, 42); // 6 blocks, the last one partly filled
    assert_eq!(prefix.tokens(), 42);
    let tables: Vec<Vec<u32>> = prefix.tables().map(|t| t.to_vec()).collect();
    assert!(tables.iter().all(|t| t.len() == 6), "one id per block of the tokens: {tables:?}");
    // The sliding groups hold only their window's blocks, the full group all of them.
    assert!(tables[0][..3].iter().all(|&b| b == NULL_BLOCK) && tables[0][3..].iter().all(|&b| b != NULL_BLOCK));
    assert!(tables[2].iter().all(|&b| b != NULL_BLOCK));
    assert_eq!(p.blocks().num_used(), prefix.blocks().count(), "growth's spare blocks went back");

    // Continue from block 5 (40 tokens): the new sequence shares blocks and computes the rest.
    let t = template(&p);
    let mut s = t.start_from(&mut p, &prefix, 40).unwrap();
    assert_eq!(s.offset(), 40);
    check_reads(&s, &p);
    for &b in &s.group_table(2)[..5] {
        assert_eq!(p.blocks().ref_count(b), 2, "shared with the prefix");
    }
    append(&mut s, &mut p, 18);
    check_reads(&s, &p);
    // Past the prefix's tokens, or where a window was reclaimed, is refused.
    assert!(t.start_from(&mut p, &prefix, 48).is_err());
    assert!(
        t.start_from(&mut p, &prefix, 32).is_err(),
        "a query at 32 reaches block 2, which the sliding groups dropped"
    );
    s.release(&mut p);
    prefix.release(&mut p);
    assert_eq!(p.blocks().num_used(), 0);
    p.blocks().check_invariants();
}

#[test]
fn resume_takes_over_the_references_and_continues_exactly() {
    let mut p = pool(64);
    let prefix = banked(&mut p, 26);
    let used = p.blocks().num_used();
    let mut s = template(&p).resume(&mut p, prefix).unwrap();
    assert_eq!((s.offset(), p.blocks().num_used()), (26, used), "no block gained or lost");
    check_reads(&s, &p);
    append(&mut s, &mut p, 40);
    check_reads(&s, &p);
    s.release(&mut p);
    assert_eq!(p.blocks().num_used(), 0);
}

#[test]
fn trimming_the_tail_block_returns_its_references_until_a_window_would_be_lost() {
    let mut p = pool(64);
    let mut prefix = banked(&mut p, 28); // blocks 0..4; sliding groups hold from block 1
    let before = p.blocks().num_used();
    let released = prefix.trim_tail_block(&mut p).unwrap();
    assert_eq!((prefix.tokens(), released.len()), (24, 3), "one block per group");
    assert_eq!(p.blocks().num_used(), before - 3);
    // A query at 16 needs positions 5.. of the sliding layers (block 0): reclaimed, so refused.
    let tables: Vec<Vec<u32>> = prefix.tables().map(|t| t.to_vec()).collect();
    assert!(prefix.trim_tail_block(&mut p).is_err());
    assert_eq!(prefix.tables().map(|t| t.to_vec()).collect::<Vec<_>>(), tables, "a refused trim changes nothing");
    let s = template(&p).start_from(&mut p, &prefix, 24).unwrap();
    check_reads(&s, &p);
    s.release(&mut p);
    prefix.release(&mut p);
    assert_eq!(p.blocks().num_used(), 0);
}
