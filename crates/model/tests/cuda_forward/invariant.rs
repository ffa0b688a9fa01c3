//! Batch invariance on the GPU (`CudaTuning::batch_invariant`): a token row's logits do not
//! depend on the rows that share its step. One run feeds a fixed token sequence one token per
//! step; another feeds the same tokens in steps of 1 to 20 rows (a verification step of drafted
//! tokens, past the 16 rows where products would go to cuBLAS), the prompt in other chunks, and
//! a second sequence in some of the steps. In batch-invariant mode every row's logits must be
//! equal bit for bit, for every KV format and weight kind; without it the difference is printed
//! (it is what makes speculative output differ from plain decoding on the GPU).

use std::sync::Arc;

use kvcache::{CacheConfig, KvFormat, KvPool, SequenceCache, SequencePolicy};
use pagekv_cuda::{CudaDevice, DType};
use pagekv_model::cuda::{CudaModel, GpuWeights};
use pagekv_model::gguf::{GgmlType, GgufFile, GgufWriter};
use pagekv_model::{Batch, Forward, Logits};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

use crate::gpu::{cpu_model, out};
use crate::skip;

/// A tiny llama of SmolLM2's head shape (head_dim 64, three query heads per kv head) with
/// SmolLM2's weight types: Q4_1 matrices, a Q8_0 embedding tied to the output.
fn tiny_smollm(seed: u64) -> Arc<GgufFile> {
    let (layers, h, nh, nkv, d, f, vocab) = (3u32, 384u64, 6u32, 2u32, 64u64, 512u64, 512u64);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut w = GgufWriter::new();
    w.set("general.architecture", "llama");
    w.set("general.name", "tiny-smollm");
    w.set("llama.block_count", layers);
    w.set("llama.embedding_length", h as u32);
    w.set("llama.feed_forward_length", f as u32);
    w.set("llama.attention.head_count", nh);
    w.set("llama.attention.head_count_kv", nkv);
    w.set("llama.context_length", 2048u32);
    w.set("llama.vocab_size", vocab as u32);
    w.set("llama.attention.layer_norm_rms_epsilon", 1e-5f32);
    w.set("llama.rope.freq_base", 100000.0f32);
    let (qd, kvd) = (nh as u64 * d, nkv as u64 * d);
    let mut q = |name: &str, cols: u64, rows: u64, ty: GgmlType, scale: f32| {
        let data = crate::tiny_gemma::random_blocks(&mut rng, cols, rows, ty, scale);
        w.add_tensor(name, &[cols, rows], ty, data).unwrap();
    };
    q("token_embd.weight", h, vocab, GgmlType::Q8_0, 1.0);
    let s = |c: u64| 1.0 / (c as f32).sqrt();
    let mut norms = vec!["output_norm.weight".to_string()];
    for i in 0..layers {
        let n = |s: &str| format!("blk.{i}.{s}");
        q(&n("attn_q.weight"), h, qd, GgmlType::Q4_1, s(h));
        q(&n("attn_k.weight"), h, kvd, GgmlType::Q4_1, s(h));
        q(&n("attn_v.weight"), h, kvd, GgmlType::Q4_1, s(h));
        q(&n("attn_output.weight"), qd, h, GgmlType::Q4_1, s(qd));
        q(&n("ffn_gate.weight"), h, f, GgmlType::Q4_1, s(h));
        q(&n("ffn_up.weight"), h, f, GgmlType::Q4_1, s(h));
        q(&n("ffn_down.weight"), f, h, GgmlType::Q4_1, s(f));
        norms.push(n("attn_norm.weight"));
        norms.push(n("ffn_norm.weight"));
    }
    for name in norms {
        let v: Vec<f32> = (0..h).map(|_| 1.0 + 0.2 * rng.sample::<f32, _>(StandardNormal)).collect();
        w.add_f32_tensor(&name, &[h], &v).unwrap();
    }
    Arc::new(GgufFile::from_bytes(w.to_bytes()).unwrap())
}

/// The model's pool: blocks of 16 growing on demand, the layer groups of its windows (one group
/// for the llamas; the tiny Gemma's sliding groups free blocks as the window moves).
fn cache(m: &CudaModel, format: KvFormat) -> CacheConfig {
    let mut cc = crate::tiny_gemma::gemma_cache(&m.config, format, true);
    cc.num_blocks = 96;
    cc
}

/// Feeds `prompt` in chunks of `chunk` tokens, then `tokens` in steps of `steps[i % len]`
/// tokens with every row's logits; in the steps where `with_other` says so a second sequence
/// feeds 3 tokens of its own beside them. Returns the logits of the rows of `tokens`
/// (`[tokens.len(), vocab]`).
fn feed(
    m: &mut CudaModel,
    cache: &CacheConfig,
    prompt: &[u32],
    chunk: usize,
    tokens: &[u32],
    steps: &[usize],
    with_other: impl Fn(usize) -> bool,
) -> Vec<f32> {
    let mut pool: KvPool<_> = m.new_pool(cache.clone()).unwrap();
    let policy = SequencePolicy::from_config(cache);
    let mut a = SequenceCache::new(&mut pool, policy, 0).unwrap();
    let mut b = SequenceCache::new(&mut pool, policy, 0).unwrap();
    let mut batch = Batch::default();
    for c in prompt.chunks(chunk) {
        a.begin_append(&mut pool, c.len()).unwrap();
        batch.clear();
        batch.push_groups(c, a.offset() + c.len(), a.pending_slots(), a.block_tables(), Logits::Last);
        m.forward(&batch, &mut pool).unwrap();
        a.commit_append(&mut pool);
    }
    let v = m.config.vocab_size;
    let mut rows = Vec::with_capacity(tokens.len() * v);
    let (mut at, mut i) = (0, 0);
    while at < tokens.len() {
        let k = steps[i % steps.len()].min(tokens.len() - at);
        let other = with_other(i);
        a.begin_append(&mut pool, k).unwrap();
        batch.clear();
        if other {
            // The other sequence first: a's rows do not start the batch.
            b.begin_append(&mut pool, 3).unwrap();
            let t = [7 + i as u32, 11, 13];
            batch.push_groups(&t, b.offset() + 3, b.pending_slots(), b.block_tables(), Logits::All);
        }
        let step = &tokens[at..at + k];
        batch.push_groups(step, a.offset() + k, a.pending_slots(), a.block_tables(), Logits::All);
        let logits = m.forward(&batch, &mut pool).unwrap();
        let skip = if other { 3 * v } else { 0 };
        rows.extend_from_slice(&logits[skip..skip + k * v]);
        a.commit_append(&mut pool);
        if other {
            b.commit_append(&mut pool);
        }
        at += k;
        i += 1;
    }
    rows
}

/// Largest |difference| between the row sets, and how many rows differ at all.
fn compare(a: &[f32], b: &[f32], vocab: usize) -> (f32, usize) {
    let max = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    let rows = a
        .chunks(vocab)
        .zip(b.chunks(vocab))
        .filter(|(x, y)| x.iter().zip(y.iter()).any(|(p, q)| p.to_bits() != q.to_bits()))
        .count();
    (max, rows)
}

fn device(test: &str, invariant: bool) -> Option<Arc<CudaDevice>> {
    let mut t = match pagekv_cuda::dev::tuning_from_env() {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    };
    t.batch_invariant = invariant;
    match CudaDevice::new(0, t) {
        Ok(d) => Some(d),
        Err(e) => {
            skip(test, &format!("no usable CUDA device ({e})"));
            None
        }
    }
}

#[test]
fn multi_token_steps_equal_one_token_steps_in_batch_invariant_mode() {
    let name = "multi_token_steps_equal_one_token_steps_in_batch_invariant_mode";
    // The CPU models (the GPU's weights come from them) load before any device is looked for.
    let models = [
        ("tiny SmolLM2-shaped Q4_1", cpu_model(tiny_smollm(41)), GpuWeights::Gguf),
        ("tiny SmolLM2-shaped, bf16", cpu_model(tiny_smollm(41)), GpuWeights::Dense(DType::Bf16)),
        (
            "tiny Gemma 3 (hybrid windows), Q5_0/Q8_0/Q4_K/Q6_K",
            cpu_model(crate::tiny_gemma::tiny_gemma(43, true)),
            GpuWeights::Gguf,
        ),
    ];
    let Some(inv) = device(name, true) else { return };
    let Some(plain) = device(name, false) else { return };
    let mut rng = StdRng::seed_from_u64(31);
    // 300 prompt tokens: the fed rows see 2 partitions of 256 (and the prefill kernel's route
    // without the mode); 40 fed tokens, steps of up to 20 rows.
    let prompt: Vec<u32> = (0..300).map(|_| rng.gen_range(0..512)).collect();
    let tokens: Vec<u32> = (0..40).map(|_| rng.gen_range(0..512)).collect();
    let steps = [3, 1, 5, 2, 9, 20];
    let mut failures = Vec::new();
    for (label, cpu, weights) in models {
        for format in [KvFormat::F16, KvFormat::Bf16, KvFormat::F32, KvFormat::Q8, KvFormat::Q4 { rotate: false }] {
            for (mode, dev) in [("invariant", &inv), ("default", &plain)] {
                let mut m = CudaModel::from_model(&cpu, dev.clone(), weights).unwrap();
                let cc = cache(&m, format);
                let v = m.config.vocab_size;
                let want = feed(&mut m, &cc, &prompt, 300, &tokens, &[1], |_| false);
                let got = feed(&mut m, &cc, &prompt, 64, &tokens, &steps, |i| i % 2 == 1);
                let (max, rows) = compare(&want, &got, v);
                out(&format!(
                    "{label}, {format} KV, {mode}: {rows} of {} rows differ, max |diff| {max:.3e}",
                    tokens.len()
                ));
                if mode == "invariant" && rows > 0 {
                    failures.push(format!("{label} {format}: {rows} rows differ (max {max:.3e})"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "batch-invariant mode is not: {failures:#?}");
}
