//! Qwen2.5-Coder-1.5B-Instruct Q4_K_M (a registry model: qwen2 architecture, byte-level BPE
//! with the `qwen2` pre-tokenizer, ChatML) against llama.cpp's golden data in
//! tests/data/qwen2.5-coder-1.5b (made by its `make_reference.py`, llama-cpp-python 0.3.36):
//! tokenizer ids on varied strings, teacher-forced top-1 agreement over a Python source text,
//! greedy continuations of 24 tokens, with the default attention numerics.
//!
//! Finds the model at `$PAGEKV_HOME/models/qwen2.5-coder-1.5b.gguf` and skips, with a visible
//! `skipped:` line, when it is absent (always: CI fetches only the default model).
//!
//! Measured (2 threads, ggml attention numerics by default): top-1 agreement 98.50 % (985 of
//! 1,000), perplexity 0.29 % below llama.cpp's, greedy 3 of 4 (`digits` parts at step 10, where
//! llama.cpp's two best logits are 0.05 apart). Unlike SmolLM2's Q4_1, the first position's logits
//! are not bit-identical to llama.cpp's (max |Δ| 0.08): llama.cpp repacks this file's Q4_K
//! tensors (`q4_K_8x8`) and its own run without the repack (`use_extra_bufts=false`) is as far
//! from it (max |Δ| 0.10 on the first position, 97.8 % top-1 agreement over the 1,000).

use std::path::PathBuf;
use std::sync::Arc;

use kvcache::{CacheConfig, KvFormat, KvPool, SequenceCache, SequencePolicy};
use pagekv_cpu::attention::ggml::AttnNumerics;
use pagekv_cpu::attention::AttentionConfig;
use pagekv_model::gguf::GgufFile;
use pagekv_model::tokenizer::Tokenizer;
use pagekv_model::{Batch, Logits, Model};
use serde_json::Value;

const MODEL_FILE: &str = "qwen2.5-coder-1.5b.gguf";
/// Teacher-forced positions compared (of the 1,099 with a next token in the golden data).
const POSITIONS: usize = 1000;
/// Top-1 agreement with llama.cpp's argmax over those positions.
const MIN_AGREEMENT: f64 = 0.97;
/// Perplexity over all teacher-forced positions, relative to llama.cpp's.
const MAX_PPL_DIFF: f64 = 0.02;
/// Greedy tokens per prompt, and prompts whose tokens must all equal llama.cpp's (of 4).
const GREEDY_TOKENS: usize = 24;
const MIN_GREEDY_MATCHES: usize = 3;

fn golden() -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/qwen2.5-coder-1.5b/llamacpp.json");
    serde_json::from_str(&std::fs::read_to_string(p).expect("golden data")).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("id array").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

fn open(test: &str) -> Option<Arc<GgufFile>> {
    let p = pagekv_testkit::dev::registry_model(test, MODEL_FILE)?;
    Some(Arc::new(GgufFile::open(&p).expect("open model")))
}

struct Runner {
    model: Model,
    pool: KvPool,
}

impl Runner {
    fn new(test: &str) -> Option<Runner> {
        let model = Model::from_file(open(test)?, AttentionConfig::default()).unwrap();
        let c = &model.config;
        let mut cc = CacheConfig::new(c.num_layers, c.num_kv_heads, c.head_dim);
        cc.format = KvFormat::F16;
        cc.num_blocks = 128; // 2,048 tokens of 16
        let pool = KvPool::new(cc).unwrap();
        Some(Runner { model, pool })
    }

    fn sequence(&mut self) -> SequenceCache {
        let policy = SequencePolicy {
            dynamic_growth: true,
            context_window: Some(2048),
            sliding_window: None,
            debug_blocks: false,
        };
        SequenceCache::new(&mut self.pool, policy, 16).unwrap()
    }

    /// Feeds `tokens` to `seq` in one step, returns the logits asked for.
    fn step(&mut self, seq: &mut SequenceCache, tokens: &[u32], logits: Logits) -> Vec<f32> {
        seq.begin_append(&mut self.pool, tokens.len()).unwrap();
        let mut batch = Batch::default();
        batch.push(tokens, seq.offset() + tokens.len(), seq.pending_slots(), seq.block_table(), logits);
        let out = self.model.forward(&batch, &mut self.pool).unwrap().to_vec();
        seq.commit_append(&mut self.pool);
        out
    }
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

fn log_softmax_at(x: &[f32], i: usize) -> f64 {
    let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln() + m;
    x[i] as f64 - lse
}

/// (a) The tokenizer: every string's ids, every greedy prompt's ids (as a prompt: BOS if the
/// vocabulary asks for one, none here) and the teacher-forced text's first ids equal llama.cpp's.
#[test]
fn qwen_tokenizer_matches_llama_cpp() {
    let Some(file) = open("qwen_tokenizer_matches_llama_cpp") else { return };
    let tok = Tokenizer::from_gguf(file.metadata()).expect("tokenizer from metadata");
    let g = golden();
    assert_eq!(tok.add_bos(), g["add_bos"].as_bool().unwrap(), "add_bos as llama.cpp");
    let cases = g["tokenize"].as_array().unwrap();
    let mut failed = Vec::new();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let got = tok.encode(text, true).unwrap();
        let want = ids(&case["ids"]);
        if got != want {
            eprintln!("DIFFERENT {text:?}\n  got  {got:?}\n  want {want:?}");
            failed.push(text);
        }
        assert_eq!(tok.decode(&got, false).unwrap(), text, "round trip of {text:?}");
    }
    eprintln!("qwen tokenizer: {}/{} strings identical to llama.cpp", cases.len() - failed.len(), cases.len());
    assert!(failed.is_empty(), "tokenizer differs from llama.cpp on {failed:?}");
    for case in g["greedy"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        assert_eq!(tok.encode_with_bos(prompt, true).unwrap(), ids(&case["prompt_ids"]), "prompt {prompt:?}");
        let out = ids(&case["greedy_ids"]);
        assert_eq!(tok.decode(&out, false).unwrap(), case["greedy_text"].as_str().unwrap(), "prompt {prompt:?}");
    }
    let tf = &g["teacher_forced"][0];
    let want = ids(&tf["ids"]);
    let got = tok.encode_with_bos(tf["text"].as_str().unwrap(), true).unwrap();
    assert_eq!(got[..want.len()], want[..], "teacher-forced text");
}

/// (b) Teacher-forced top-1 agreement over the first 1,000 positions, the text prefilled in
/// chunks of 256 (each chunk one causal prefill step); perplexity within 2 %. `DBG=1` prints
/// every position where the argmax differs; `QWEN_FIRST_LOGITS=FILE` (llama.cpp's logits after
/// the first id, a little-endian f32 .npy, e.g. from `llm.scores[0]`) prints how far the first
/// position's logits are from them.
#[test]
fn qwen_teacher_forced_agreement() {
    let Some(mut r) = Runner::new("qwen_teacher_forced_agreement") else { return };
    let g = golden();
    let tf = &g["teacher_forced"][0];
    let tokens = ids(&tf["ids"]);
    let want_argmax = ids(&tf["argmax"]);
    let want_lp: Vec<f64> = tf["next_token_logprob"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    let vocab = r.model.config.vocab_size;
    let n = tokens.len() - 1; // positions with a next token
    let mut seq = r.sequence();
    let (mut got_argmax, mut lp, mut first_rows) = (Vec::new(), Vec::new(), Vec::new());
    let start = std::time::Instant::now();
    for chunk in tokens.chunks(256) {
        let logits = r.step(&mut seq, chunk, Logits::All);
        for row in logits.chunks_exact(vocab) {
            let i = got_argmax.len();
            got_argmax.push(argmax(row));
            if i < n {
                lp.push(log_softmax_at(row, tokens[i + 1] as usize));
            }
            if i == 0 {
                first_rows.extend_from_slice(row);
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    seq.release(&mut r.pool);
    let mut agree = 0;
    for i in 0..POSITIONS {
        if got_argmax[i] == want_argmax[i] {
            agree += 1;
        } else if std::env::var_os("DBG").is_some() {
            eprintln!(
                "pos {i}: ours {} llama.cpp {}, log p(next) ours {:.4} llama.cpp {:.4}",
                got_argmax[i], want_argmax[i], lp[i], want_lp[i]
            );
        }
    }
    let all_agree = (0..n).filter(|&i| got_argmax[i] == want_argmax[i]).count();
    let agreement = agree as f64 / POSITIONS as f64;
    let ppl = (-lp.iter().sum::<f64>() / n as f64).exp();
    let want_ppl = tf["perplexity"].as_f64().unwrap();
    let max_lp_diff = lp.iter().zip(&want_lp).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    if let Some(p) = std::env::var_os("QWEN_FIRST_LOGITS") {
        let npy = std::fs::read(p).expect("npy file");
        let header_len = u16::from_le_bytes([npy[8], npy[9]]) as usize;
        let want: Vec<f32> =
            npy[10 + header_len..].chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        assert_eq!(want.len(), vocab);
        let d: Vec<f32> = want.iter().zip(&first_rows).map(|(a, b)| (a - b).abs()).collect();
        let exact = d.iter().filter(|&&x| x == 0.0).count();
        let mean = d.iter().map(|&x| x as f64).sum::<f64>() / vocab as f64;
        let max = d.iter().cloned().fold(0f32, f32::max);
        eprintln!("first position against llama.cpp: max |Δlogit| {max:.4}, mean {mean:.4}, {exact} of {vocab} equal");
    }
    let numerics = match r.model.attn_numerics_for(KvFormat::F16) {
        AttnNumerics::Fast => "fast",
        _ => "ggml",
    };
    eprintln!(
        "qwen teacher-forced ({numerics} attention numerics): top-1 agreement {:.2}% ({agree}/{POSITIONS}; all {n} positions: {all_agree}), \
         ppl {ppl:.4} vs llama.cpp {want_ppl:.4} ({:+.3}%), max log-prob diff {max_lp_diff:.3e}, first-position argmax \
         {} vs {}, {seconds:.1} s",
        agreement * 100.0,
        (ppl / want_ppl - 1.0) * 100.0,
        argmax(&first_rows),
        want_argmax[0],
    );
    assert!(agreement >= MIN_AGREEMENT, "top-1 agreement {agreement} over {POSITIONS} positions");
    assert!((ppl / want_ppl - 1.0).abs() <= MAX_PPL_DIFF, "perplexity {ppl} vs llama.cpp {want_ppl}");
}

/// (c) Greedy continuations of 24 tokens (argmax, no stop) equal llama.cpp's on at least 3 of
/// the 4 prompts; a differing one prints where it diverges, with llama.cpp's top two there.
#[test]
fn qwen_greedy_matches_llama_cpp() {
    let Some(mut r) = Runner::new("qwen_greedy_matches_llama_cpp") else { return };
    let g = golden();
    let cases = g["greedy"].as_array().unwrap();
    let mut matched = 0;
    for case in cases {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["greedy_ids"]);
        let mut seq = r.sequence();
        let mut logits = r.step(&mut seq, &prompt, Logits::Last);
        let mut got = Vec::new();
        for _ in 0..GREEDY_TOKENS {
            let t = argmax(&logits);
            got.push(t);
            logits = r.step(&mut seq, &[t], Logits::Last);
        }
        seq.release(&mut r.pool);
        let name = case["name"].as_str().unwrap();
        if got[..] == want[..GREEDY_TOKENS] {
            matched += 1;
            eprintln!("qwen greedy {name}: match");
        } else {
            let k = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
            eprintln!(
                "qwen greedy {name}: DIFFERENT from token {k}: llama.cpp's top two there {}\n  got  {got:?}\n  want {want:?}",
                case["top2_per_step"][k]
            );
        }
    }
    eprintln!("qwen greedy: {matched} of {} prompts match llama.cpp for {GREEDY_TOKENS} tokens", cases.len());
    assert!(matched >= MIN_GREEDY_MATCHES, "only {matched} of {} greedy continuations match", cases.len());
}
