//! Golden-data checks of a registry model against llama.cpp (`tests/data/<model>/llamacpp.json`,
//! made by that folder's `make_reference.py` with llama-cpp-python 0.3.36): tokenizer ids,
//! teacher-forced top-1 agreement and perplexity, greedy continuations, with the default
//! attention numerics. Each check skips, with a visible `skipped:` line, when the model file is
//! absent (always in CI, which fetches only the default model).

// Each test binary uses what it needs of this module.
#![allow(dead_code)]

/// Most tokens a check puts in one sequence (the pool is sized for it).
const MAX_TOKENS: usize = 4096;

use std::path::PathBuf;
use std::sync::Arc;

use kvcache::{CacheConfig, KvFormat, KvPool, SequenceCache, SequencePolicy};
use pagekv_cpu::attention::{AttentionConfig, AttnNumerics};
use pagekv_model::gguf::GgufFile;
use pagekv_model::tokenizer::Tokenizer;
use pagekv_model::{Batch, Logits, Model};
use serde_json::Value;

/// A registry model, its golden data and the bounds it must meet.
pub struct Spec {
    /// Short name in messages (`qwen`, `gemma3`).
    pub name: &'static str,
    /// File name under `$PAGEKV_HOME/models`.
    pub model_file: &'static str,
    /// Folder under `tests/data` holding `llamacpp.json`.
    pub data_dir: &'static str,
    /// Teacher-forced positions compared.
    pub positions: usize,
    /// Top-1 agreement with llama.cpp's argmax over those positions.
    pub min_agreement: f64,
    /// Perplexity over all teacher-forced positions, relative to llama.cpp's.
    pub max_ppl_diff: f64,
    /// Greedy tokens per prompt, and prompts whose tokens must all equal llama.cpp's.
    pub greedy_tokens: usize,
    pub min_greedy_matches: usize,
}

fn golden(spec: &Spec) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(spec.data_dir).join("llamacpp.json");
    serde_json::from_str(&std::fs::read_to_string(p).expect("golden data")).unwrap()
}

/// A JSON array of token ids.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("id array").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

fn open(spec: &Spec, test: &str) -> Option<Arc<GgufFile>> {
    let p = pagekv_testkit::dev::registry_model(test, spec.model_file)?;
    Some(Arc::new(GgufFile::open(&p).expect("open model")))
}

/// A model with a pool of [`MAX_TOKENS`] in one KV format, fed one step at a time.
pub struct Runner {
    pub model: Model,
    pub pool: KvPool,
}

impl Runner {
    /// `spec`'s model with an f16 pool, or `None` (skipped) when its file is absent.
    fn open(spec: &Spec, test: &str) -> Option<Runner> {
        let model = Model::from_file(open(spec, test)?, AttentionConfig::default()).unwrap();
        Some(Runner::new(model, KvFormat::F16))
    }

    pub fn new(model: Model, format: KvFormat) -> Runner {
        let c = &model.config;
        let mut cc = CacheConfig::new(c.num_layers, c.num_kv_heads, c.head_dim);
        cc.format = format;
        cc.num_blocks = MAX_TOKENS / 16;
        let pool = KvPool::new(cc).unwrap();
        Runner { model, pool }
    }

    /// A fresh sequence of blocks of 16 that may grow to [`MAX_TOKENS`].
    pub fn sequence(&mut self) -> SequenceCache {
        let policy = SequencePolicy {
            dynamic_growth: true,
            context_window: Some(MAX_TOKENS),
            sliding_window: None,
            debug_blocks: false,
            trim_margin: 0,
        };
        SequenceCache::new(&mut self.pool, policy, 16).unwrap()
    }

    /// Feeds `tokens` to `seq` in one step, returns the logits asked for.
    pub fn step(&mut self, seq: &mut SequenceCache, tokens: &[u32], logits: Logits) -> Vec<f32> {
        seq.begin_append(&mut self.pool, tokens.len()).unwrap();
        let mut batch = Batch::default();
        batch.push(tokens, seq.offset() + tokens.len(), seq.pending_slots(), seq.block_table(), logits);
        let out = self.model.forward(&batch, &mut self.pool).unwrap().to_vec();
        seq.commit_append(&mut self.pool);
        out
    }
}

/// The first index of the largest value.
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// `log softmax(x)[i]`, in f64.
pub fn log_softmax_at(x: &[f32], i: usize) -> f64 {
    let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln() + m;
    x[i] as f64 - lse
}

/// (a) The tokenizer: every string's ids, every greedy prompt's ids (as a prompt: BOS if the
/// vocabulary asks for one) and the teacher-forced text's first ids equal llama.cpp's.
pub fn tokenizer_matches_llama_cpp(spec: &Spec, test: &str) {
    let Some(file) = open(spec, test) else { return };
    let tok = Tokenizer::from_gguf(file.metadata()).expect("tokenizer from metadata");
    let g = golden(spec);
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
    eprintln!("{} tokenizer: {}/{} strings identical to llama.cpp", spec.name, cases.len() - failed.len(), cases.len());
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

/// (b) Teacher-forced top-1 agreement over the first `spec.positions` positions, the text
/// prefilled in chunks of 256 (each chunk one causal prefill step); perplexity within
/// `spec.max_ppl_diff`. `DBG=1` prints every position where the argmax differs;
/// `FIRST_LOGITS=FILE` (llama.cpp's logits after the first id, a little-endian f32 .npy, e.g.
/// from `llm.scores[0]`) prints how far the first position's logits are from them.
pub fn teacher_forced_agreement(spec: &Spec, test: &str) {
    let Some(mut r) = Runner::open(spec, test) else { return };
    let g = golden(spec);
    let positions = spec.positions;
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
    for i in 0..positions {
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
    let agreement = agree as f64 / positions as f64;
    let ppl = (-lp.iter().sum::<f64>() / n as f64).exp();
    let want_ppl = tf["perplexity"].as_f64().unwrap();
    let max_lp_diff = lp.iter().zip(&want_lp).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    if let Some(p) = std::env::var_os("FIRST_LOGITS") {
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
        "{} teacher-forced ({numerics} attention numerics): top-1 agreement {:.2}% ({agree}/{positions}; all {n} positions: {all_agree}), \
         ppl {ppl:.4} vs llama.cpp {want_ppl:.4} ({:+.3}%), max log-prob diff {max_lp_diff:.3e}, first-position argmax \
         {} vs {}, {seconds:.1} s",
        spec.name,
        agreement * 100.0,
        (ppl / want_ppl - 1.0) * 100.0,
        argmax(&first_rows),
        want_argmax[0],
    );
    assert!(agreement >= spec.min_agreement, "top-1 agreement {agreement} over {positions} positions");
    assert!((ppl / want_ppl - 1.0).abs() <= spec.max_ppl_diff, "perplexity {ppl} vs llama.cpp {want_ppl}");
}

/// (c) Greedy continuations of `spec.greedy_tokens` tokens (argmax, no stop) equal llama.cpp's
/// on at least `spec.min_greedy_matches` prompts; a differing one prints where it diverges,
/// with llama.cpp's top two there.
pub fn greedy_matches_llama_cpp(spec: &Spec, test: &str) {
    let Some(mut r) = Runner::open(spec, test) else { return };
    let g = golden(spec);
    let (name_, tokens) = (spec.name, spec.greedy_tokens);
    let cases = g["greedy"].as_array().unwrap();
    let mut matched = 0;
    for case in cases {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["greedy_ids"]);
        let mut seq = r.sequence();
        let mut logits = r.step(&mut seq, &prompt, Logits::Last);
        let mut got = Vec::new();
        for _ in 0..tokens {
            let t = argmax(&logits);
            got.push(t);
            logits = r.step(&mut seq, &[t], Logits::Last);
        }
        seq.release(&mut r.pool);
        let name = case["name"].as_str().unwrap();
        if got[..] == want[..tokens] {
            matched += 1;
            eprintln!("{name_} greedy {name}: match");
        } else {
            let k = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
            eprintln!(
                "{name_} greedy {name}: DIFFERENT from token {k}: llama.cpp's top two there {}\n  got  {got:?}\n  want {want:?}",
                case["top2_per_step"][k]
            );
        }
    }
    eprintln!("{name_} greedy: {matched} of {} prompts match llama.cpp for {tokens} tokens", cases.len());
    assert!(matched >= spec.min_greedy_matches, "only {matched} of {} greedy continuations match", cases.len());
}
