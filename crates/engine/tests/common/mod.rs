//! Shared by the engine's integration tests: a tiny synthetic llama (random f32 weights, 2
//! layers, written with `GgufWriter`, so no file is needed) and a small SentencePiece-style
//! vocabulary in which every id decodes to text.

use std::sync::Arc;

use kvcache::CacheConfig;
use pagekv_cpu::attention::AttentionConfig;
use pagekv_engine::{BankConfig, EngineConfig};
use pagekv_model::gguf::{GgufFile, GgufWriter};
use pagekv_model::tokenizer::{Tokenizer, TokenizerModel, VocabSpec};
use pagekv_model::Model;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub const VOCAB: usize = 96;
pub const CONTEXT: usize = 512;

/// The tests' engine: `num_blocks` blocks of 8 tokens, a [`CONTEXT`] window, batches of up to 64
/// tokens and 16 sequences, the session bank on or off.
pub fn engine_config(num_blocks: usize, bank: bool) -> EngineConfig {
    let mut cache = CacheConfig::new(1, 1, 32);
    cache.block_size = 8;
    cache.num_blocks = num_blocks;
    cache.context_window = Some(CONTEXT);
    let mut c = EngineConfig::new(cache);
    c.max_batch_tokens = 64;
    c.max_seqs = 16;
    c.bank = BankConfig { enabled: bank, ..BankConfig::default() };
    c
}

/// A tiny llama named `name` with random f32 weights drawn from `seed`: 2 layers, 64 wide, 2
/// query heads and 1 kv head of 32.
pub fn tiny_model(seed: u64, name: &str) -> Model {
    let (layers, h, nh, nkv, d, f) = (2u32, 64u64, 2u32, 1u32, 32u64, 128u64);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut w = GgufWriter::new();
    w.set("general.architecture", "llama");
    w.set("general.name", name);
    w.set("llama.block_count", layers);
    w.set("llama.embedding_length", h as u32);
    w.set("llama.feed_forward_length", f as u32);
    w.set("llama.attention.head_count", nh);
    w.set("llama.attention.head_count_kv", nkv);
    w.set("llama.context_length", CONTEXT as u32);
    w.set("llama.vocab_size", VOCAB as u32);
    w.set("llama.attention.layer_norm_rms_epsilon", 1e-5f32);
    w.set("llama.rope.freq_base", 10000.0f32);
    let (qd, kvd) = (nh as u64 * d, nkv as u64 * d);
    let mut t = |name: &str, dims: &[u64], scale: f32, offset: f32| {
        let n: u64 = dims.iter().product();
        // Uniform in ±scale·√3: unit variance times `scale`.
        let v: Vec<f32> = (0..n).map(|_| offset + scale * 1.732 * rng.gen_range(-1.0f32..1.0)).collect();
        w.add_f32_tensor(name, dims, &v).unwrap();
    };
    t("token_embd.weight", &[h, VOCAB as u64], 1.0, 0.0);
    for i in 0..layers {
        let n = |s: &str| format!("blk.{i}.{s}");
        t(&n("attn_norm.weight"), &[h], 0.2, 1.0);
        t(&n("attn_q.weight"), &[h, qd], 1.0 / (h as f32).sqrt(), 0.0);
        t(&n("attn_k.weight"), &[h, kvd], 1.0 / (h as f32).sqrt(), 0.0);
        t(&n("attn_v.weight"), &[h, kvd], 1.0 / (h as f32).sqrt(), 0.0);
        t(&n("attn_output.weight"), &[qd, h], 1.0 / (qd as f32).sqrt(), 0.0);
        t(&n("ffn_norm.weight"), &[h], 0.2, 1.0);
        t(&n("ffn_gate.weight"), &[h, f], 1.0 / (h as f32).sqrt(), 0.0);
        t(&n("ffn_up.weight"), &[h, f], 1.0 / (h as f32).sqrt(), 0.0);
        t(&n("ffn_down.weight"), &[f, h], 1.0 / (f as f32).sqrt(), 0.0);
    }
    t("output_norm.weight", &[h], 0.2, 1.0);
    // Sharp logits, so greedy choices are far from ties.
    t("output.weight", &[h, VOCAB as u64], 4.0 / (h as f32).sqrt(), 0.0);
    let file = Arc::new(GgufFile::from_bytes(w.to_bytes()).unwrap());
    Model::from_file(file, AttentionConfig::default()).unwrap()
}

/// `<unk>`, `<s>`, `</s>`, then `▁w3` … : every id decodes to text.
pub fn tokenizer() -> Arc<Tokenizer> {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    tokens.extend((3..VOCAB).map(|i| format!("\u{2581}w{i}")));
    Arc::new(Tokenizer::from_spec(VocabSpec::new(TokenizerModel::Llama, tokens)).unwrap())
}
