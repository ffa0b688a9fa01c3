//! A tiny random Gemma 3 written as a GGUF file in memory ([`tiny_gemma`]), random GGUF blocks of
//! the types the GPU multiplies in place ([`random_blocks`]), and the lock-step run the Gemma
//! tests compare backends with ([`run`]). Nothing here touches a device: any [`Forward`] runs it.

use std::sync::Arc;

use kvcache::{CacheConfig, KvFormat, KvPool, SequenceCache, SequencePolicy};
use pagekv_model::backend::argmax;
use pagekv_model::gguf::{GgmlType, GgufFile, GgufWriter};
use pagekv_model::{Batch, Forward, Logits, ModelConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

/// The tiny Gemma's shape: 6 layers, every third global (`sliding_window_pattern` 3: layers 2
/// and 5), a window of 16 tokens on the others; hidden 256, 4 query heads and 1 kv head of
/// head_dim 256 (Gemma 3 270M's head shape and grouping), MLP 512, vocabulary 512.
pub const LAYERS: u32 = 6;
pub const WINDOW: u32 = 16;
const HIDDEN: u64 = 256;
const HEADS: u32 = 4;
const KV_HEADS: u32 = 1;
const HEAD_DIM: u64 = 256;
const FFN: u64 = 512;
pub const VOCAB: u64 = 512;

/// Random GGUF blocks of `ty` for a `[rows, cols]` matrix (GGUF dims `[cols, rows]`): random code
/// bytes, each block's f16 scale fields set so its values stay within about `±scale` (the min of
/// the types that have one smaller). Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K.
pub fn random_blocks(rng: &mut StdRng, cols: u64, rows: u64, ty: GgmlType, scale: f32) -> Vec<u8> {
    // (bytes per block, values per block, offsets of the f16 scale fields, the largest
    // |code · sub-block scale|).
    let (bb, bv, fields, span): (usize, u64, &[usize], f32) = match ty {
        GgmlType::Q4_0 => (18, 32, &[0], 8.0),
        GgmlType::Q4_1 => (20, 32, &[0, 2], 16.0),
        GgmlType::Q5_0 => (22, 32, &[0], 16.0),
        GgmlType::Q5_1 => (24, 32, &[0, 2], 32.0),
        GgmlType::Q8_0 => (34, 32, &[0], 128.0),
        GgmlType::Q4K => (144, 256, &[0, 2], 15.0 * 63.0),
        GgmlType::Q5K => (176, 256, &[0, 2], 31.0 * 63.0),
        GgmlType::Q6K => (210, 256, &[208], 32.0 * 128.0),
        other => panic!("no random blocks for {other:?}"),
    };
    let blocks = (rows * cols / bv) as usize;
    let mut data: Vec<u8> = (0..bb * blocks).map(|_| rng.gen()).collect();
    for b in data.chunks_exact_mut(bb) {
        for (k, &at) in fields.iter().enumerate() {
            // d of random sign and size; the min (second field of Q4_1/Q5_1/K) smaller.
            let v = rng.gen_range(0.5f32..1.0) * scale / span * if k == 0 { 1.0 } else { 8.0 };
            let v = if rng.gen::<bool>() { v } else { -v };
            b[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
    }
    data
}

/// The tiny Gemma 3 with random weights: F32 matrices (`quant` false: the CPU's products are
/// plain f32 dot products), or the types of Gemma 3 270M's Q4_K_M file (`quant`: `attn_q`,
/// `attn_k`, `ffn_gate`, `ffn_up` Q5_0; `attn_v` Q8_0; `attn_output` Q4_K; `ffn_down` Q6_K; the
/// embedding, tied to the output, Q8_0). Norm weights are F32 around 1 (the file holds `1 + w`,
/// as Gemma's GGUF files do); the q/k norms are per head.
pub fn tiny_gemma(seed: u64, quant: bool) -> Arc<GgufFile> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut w = GgufWriter::new();
    let arch = "gemma3";
    w.set("general.architecture", arch);
    w.set("general.name", "tiny-gemma3");
    let k = |s: &str| format!("{arch}.{s}");
    w.set(&k("block_count"), LAYERS);
    w.set(&k("embedding_length"), HIDDEN as u32);
    w.set(&k("feed_forward_length"), FFN as u32);
    w.set(&k("attention.head_count"), HEADS);
    w.set(&k("attention.head_count_kv"), KV_HEADS);
    w.set(&k("attention.key_length"), HEAD_DIM as u32);
    w.set(&k("attention.value_length"), HEAD_DIM as u32);
    w.set(&k("context_length"), 4096u32);
    w.set(&k("vocab_size"), VOCAB as u32);
    w.set(&k("attention.layer_norm_rms_epsilon"), 1e-6f32);
    w.set(&k("rope.freq_base"), 1_000_000.0f32);
    w.set(&k("rope.freq_base_swa"), 10_000.0f32);
    w.set(&k("attention.sliding_window"), WINDOW);
    w.set(&k("attention.sliding_window_pattern"), 3u32);
    let (qd, kvd) = (HEADS as u64 * HEAD_DIM, KV_HEADS as u64 * HEAD_DIM);
    let s = |c: u64| 1.0 / (c as f32).sqrt();
    let matrix = |w: &mut GgufWriter, rng: &mut StdRng, name: &str, cols: u64, rows: u64, ty: GgmlType, scale| {
        if quant {
            let data = random_blocks(rng, cols, rows, ty, scale);
            w.add_tensor(name, &[cols, rows], ty, data).unwrap();
        } else {
            let v: Vec<f32> = (0..rows * cols).map(|_| scale * rng.sample::<f32, _>(StandardNormal)).collect();
            w.add_f32_tensor(name, &[cols, rows], &v).unwrap();
        }
    };
    let vector = |w: &mut GgufWriter, rng: &mut StdRng, name: &str, len: u64| {
        let v: Vec<f32> = (0..len).map(|_| 1.0 + 0.2 * rng.sample::<f32, _>(StandardNormal)).collect();
        w.add_f32_tensor(name, &[len], &v).unwrap();
    };
    // The embedding (tied to the output) small enough that the residual stream is not just the
    // input token's row scaled by √hidden (the greedy choice would be the input token, whatever
    // attention does), the output norm large enough that logits spread over about ±25.
    matrix(&mut w, &mut rng, "token_embd.weight", HIDDEN, VOCAB, GgmlType::Q8_0, 0.06);
    for i in 0..LAYERS {
        let n = |s: &str| format!("blk.{i}.{s}");
        matrix(&mut w, &mut rng, &n("attn_q.weight"), HIDDEN, qd, GgmlType::Q5_0, s(HIDDEN));
        matrix(&mut w, &mut rng, &n("attn_k.weight"), HIDDEN, kvd, GgmlType::Q5_0, s(HIDDEN));
        matrix(&mut w, &mut rng, &n("attn_v.weight"), HIDDEN, kvd, GgmlType::Q8_0, s(HIDDEN));
        matrix(&mut w, &mut rng, &n("attn_output.weight"), qd, HIDDEN, GgmlType::Q4K, s(qd));
        matrix(&mut w, &mut rng, &n("ffn_gate.weight"), HIDDEN, FFN, GgmlType::Q5_0, s(HIDDEN));
        matrix(&mut w, &mut rng, &n("ffn_up.weight"), HIDDEN, FFN, GgmlType::Q5_0, s(HIDDEN));
        matrix(&mut w, &mut rng, &n("ffn_down.weight"), FFN, HIDDEN, GgmlType::Q6K, s(FFN));
        for (name, len) in [
            ("attn_norm.weight", HIDDEN),
            ("attn_q_norm.weight", HEAD_DIM),
            ("attn_k_norm.weight", HEAD_DIM),
            ("post_attention_norm.weight", HIDDEN),
            ("ffn_norm.weight", HIDDEN),
            ("post_ffw_norm.weight", HIDDEN),
        ] {
            vector(&mut w, &mut rng, &n(name), len);
        }
    }
    let v: Vec<f32> = (0..HIDDEN).map(|_| 4.0 * (1.0 + 0.2 * rng.sample::<f32, _>(StandardNormal))).collect();
    w.add_f32_tensor("output_norm.weight", &[HIDDEN], &v).unwrap();
    Arc::new(GgufFile::from_bytes(w.to_bytes()).unwrap())
}

/// A pool of blocks of 16 that grows on demand, in `format`; `hybrid`: the layer groups of the
/// model's windows (`CacheConfig::set_layer_windows`: for the tiny Gemma two sliding groups and
/// one full group of 2 layers, 2 page planes), else one group (windows by masking alone).
pub fn gemma_cache(c: &ModelConfig, format: KvFormat, hybrid: bool) -> CacheConfig {
    let mut cc = CacheConfig::new(c.num_layers, c.num_kv_heads, c.head_dim);
    cc.format = format;
    cc.num_blocks = 64;
    cc.block_size = 16;
    cc.dynamic_growth = true;
    cc.hybrid = hybrid;
    cc.set_layer_windows(&c.layer_windows).unwrap();
    cc
}

/// One backend's rows of a [`run`]: every logit row in order; the argmax of each row after which
/// a token was fed (the backend's greedy choice at that point) and that row's gap between its
/// largest and second-largest logit (how near the choice is to a tie).
pub struct Run {
    pub logits: Vec<f32>,
    pub choices: Vec<u32>,
    pub gaps: Vec<f32>,
}

/// Runs the same steps on a backend: sequence A's prompt prefilled in `chunks` (every row's
/// logits), then one step of A (one token) together with a fresh sequence B (a 3-token prompt),
/// then A alone one token a step. The tokens A is fed after its prompt are `feed` when given
/// (teacher forcing: another backend's greedy choices), else its own greedy choices, `steps` of
/// them. Sliding groups free their blocks on the way (checked: a sliding group never holds more
/// than `⌈window / 16⌉ + 1` blocks).
pub fn run<M: Forward>(
    m: &mut M,
    cache: &CacheConfig,
    prompt: &[u32],
    chunks: &[usize],
    steps: usize,
    feed: Option<&[u32]>,
) -> Run {
    let mut pool: KvPool<M::Pages> = m.new_pool(cache.clone()).unwrap();
    let policy = SequencePolicy::from_config(cache);
    let mut a = SequenceCache::new(&mut pool, policy, 0).unwrap();
    let mut b = SequenceCache::new(&mut pool, policy, 0).unwrap();
    let v = m.config().vocab_size;
    let mut out = Run { logits: Vec::new(), choices: Vec::new(), gaps: Vec::new() };
    let mut batch = Batch::default();
    let mut at = 0;
    for &len in chunks {
        let chunk = &prompt[at..at + len];
        at += len;
        a.begin_append(&mut pool, len).unwrap();
        batch.clear();
        batch.push_groups(chunk, a.offset() + len, a.pending_slots(), a.block_tables(), Logits::All);
        out.logits.extend_from_slice(m.forward(&batch, &mut pool).unwrap());
        a.commit_append(&mut pool);
    }
    assert_eq!(at, prompt.len(), "chunks cover the prompt");
    let next = |out: &mut Run, row: &[f32], i: usize| -> u32 {
        out.choices.push(argmax(row));
        out.gaps.push(top2_gap(row));
        feed.map_or(out.choices[i], |f| f[i])
    };
    let last = out.logits[out.logits.len() - v..].to_vec();
    let mut tok = next(&mut out, &last, 0);
    // A decodes while B prefills.
    a.begin_append(&mut pool, 1).unwrap();
    b.begin_append(&mut pool, 3).unwrap();
    batch.clear();
    batch.push_groups(&[tok], a.offset() + 1, a.pending_slots(), a.block_tables(), Logits::Last);
    batch.push_groups(&[5, 6, 7], b.offset() + 3, b.pending_slots(), b.block_tables(), Logits::All);
    let step = m.forward(&batch, &mut pool).unwrap().to_vec();
    a.commit_append(&mut pool);
    b.commit_append(&mut pool);
    out.logits.extend_from_slice(&step);
    tok = next(&mut out, &step[..v], 1);
    let mut ids = Vec::new();
    for i in 0..steps {
        a.begin_append(&mut pool, 1).unwrap();
        batch.clear();
        batch.push_groups(&[tok], a.offset() + 1, a.pending_slots(), a.block_tables(), Logits::Last);
        // The backend's own greedy choice (on the GPU: the device argmax), then the row itself.
        m.forward_greedy(&batch, &mut pool, &mut ids).unwrap();
        // (The CPU's rows are the head of its scratch buffer: one row here.)
        let row = m.fetch_logits().unwrap()[..v].to_vec();
        a.commit_append(&mut pool);
        assert_eq!(ids[0], argmax(&row), "step {i}: forward_greedy's choice is its row's argmax");
        out.logits.extend_from_slice(&row);
        tok = next(&mut out, &row, i + 2);
        let groups = a.layer_groups().clone();
        for g in 0..groups.num_groups() {
            if let Some(w) = groups.kind(g).window() {
                let held = a.group_table(g).iter().filter(|&&id| id != kvcache::NULL_BLOCK).count();
                assert!(held <= w.div_ceil(16) + 1, "step {i}: sliding group {g} holds {held} blocks");
            }
        }
    }
    out
}

/// The largest `|a - b|` over two runs' logits, and the largest `|b|` (at least 1).
pub fn max_diff(got: &[f32], want: &[f32]) -> (f32, f32) {
    assert_eq!(got.len(), want.len(), "logit rows");
    let scale = want.iter().fold(1f32, |m, x| m.max(x.abs()));
    let err = got.iter().zip(want).fold(0f32, |m, (g, w)| m.max((g - w).abs()));
    (err, scale)
}

/// The gap between the largest and the second-largest value of a row.
pub fn top2_gap(row: &[f32]) -> f32 {
    let best = argmax(row) as usize;
    let second = row.iter().enumerate().filter(|(i, _)| *i != best).fold(f32::MIN, |m, (_, &x)| m.max(x));
    row[best] - second
}
