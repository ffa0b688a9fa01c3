//! The real default model against llama.cpp's golden data (tests/data/smollm2, a copy of
//! ../shared/reference/smollm2 plus two logit rows made by `make_logits.py`): teacher-forced
//! top-1 agreement and perplexity, first-step logits, greedy continuations, with the default
//! attention numerics (`auto`: ggml's for this f16 cache on a CPU with AVX2), with the fast
//! attention kernels and with ggml's attention numerics (`PAGEKV_ATTN_NUMERICS=ggml`).
//! Skipped (with a visible message) when the model file is absent, unless PAGEKV_REQUIRE_MODEL=1.
//!
//! Where the bounds stand and why. Every op outside attention follows ggml-cpu's rounding, so
//! the first-step logits equal llama.cpp's bit for bit. The golden data was made with flash
//! attention off (regenerating it with llama-cpp-python 0.3.36 reproduces every argmax and the
//! perplexity to 1e-15 with `flash_attn=False`; with `flash_attn=True` llama.cpp itself agrees
//! with it on only 96.68 % of the argmaxes and 4 of 6 greedy prompts). With ggml's attention
//! numerics (f16 queries, tinyBLAS / ggml_vec_dot_f16 summation orders, ggml_v_expf, the
//! softmax denominator per 16 then f64, f16 probabilities) all 1,024 teacher-forced logit rows
//! are bit-identical to llama.cpp's: 100 % agreement, the same perplexity, 6 of 6 greedy.
//!
//! The fast kernels differ from that in several roundings (f32 query·key sums in their own
//! order, a Cephes `exp`, online softmax with f32 probabilities divided at the end). Switching
//! off any single one of ggml's steps (`attention_step_ablation`) costs the bit-exactness from
//! the second position on and lands anywhere between 95.7 % and 97.6 % agreement: the 8-bit
//! activation quantization of every matrix product turns a 1-ulp difference into flipped codes,
//! and 30 layers amplify those into logit differences of up to ~2 on this text, so near-ties
//! flip whichever step differs. The fast path measures 96.48 % and 4 of 6 — inside that band;
//! no rounding change short of reproducing all of ggml's steps reaches the issue's 97 % / 5 of 6
//! reliably, so its bounds stay where they were (96 %, 4 of 6) and the ggml mode's bounds hold
//! the issue's targets (and more). Since ggml's numerics run vectorized (f16 decode at 0.96× /
//! 0.81× of the fast kernels' speed at 128 / 4096 tokens, docs/performance.md), they are what the
//! default `auto` picks for an f16 cache, so the engine as a user runs it meets the issue's
//! targets (`default_numerics_meet_the_issues_targets`).

mod golden;
use golden::{argmax, ids, log_softmax_at, Runner};

use std::path::PathBuf;

use kvcache::KvFormat;
use pagekv_cpu::attention::ggml::GgmlSteps;
use pagekv_cpu::attention::{AttentionConfig, AttnImpl, AttnNumerics};
use pagekv_model::{Batch, Forward, Logits, Model};
use serde_json::Value;

/// Fast attention: top-1 agreement with llama.cpp's argmax over the 1023 teacher-forced
/// positions (measured 96.48 %; the issue asks 97 %, see the module docs).
const MIN_AGREEMENT: f64 = 0.96;
/// Fast attention: greedy prompts whose first 16 tokens equal llama.cpp's (measured 4 of 6).
const MIN_GREEDY_MATCHES: usize = 4;
/// The issue's targets, which the default numerics must meet: top-1 agreement, perplexity
/// within 2 %, greedy prompts matched, first-step logits within 0.5.
const TARGET_AGREEMENT: f64 = 0.97;
const TARGET_PPL_DIFF: f64 = 0.02;
const TARGET_GREEDY_MATCHES: usize = 5;
const TARGET_FIRST_LOGITS_DIFF: f32 = 0.5;
/// ggml numerics: measured 1023 of 1023 (every logit row bit-identical).
const GGML_MIN_AGREEMENT: f64 = 1.0;
/// ggml numerics: perplexity and log-probabilities of the true tokens (measured equal to the
/// golden data's; the log-probabilities measured within 5e-6, the golden file's own rounding).
const GGML_MAX_PPL_DIFF: f64 = 1e-6;
const GGML_MAX_LP_DIFF: f64 = 1e-5;
/// ggml numerics: measured 6 of 6.
const GGML_MIN_GREEDY_MATCHES: usize = 6;

fn model_path() -> Option<PathBuf> {
    pagekv_testkit::default_model("model_golden")
}

fn golden() -> Value {
    serde_json::from_str(&std::fs::read_to_string(data("llamacpp.json")).expect("golden data")).unwrap()
}

/// SmolLM2 with an attention numerics and a pool of `format`, or `None` when the model is absent.
fn runner(format: KvFormat, numerics: AttnNumerics) -> Option<Runner> {
    let mut model = Model::load(&model_path()?, AttentionConfig::default()).unwrap();
    model.set_attn_numerics(numerics);
    Some(Runner::new(model, format))
}

/// llama.cpp's full first-step logits (`logits_apache2_first.npy`: a little-endian f32 array).
fn first_step_logits() -> Vec<f32> {
    read_npy(&data("logits_apache2_first.npy"))
}

/// The data of a little-endian f32 .npy file (version 1 header).
fn read_npy(p: &std::path::Path) -> Vec<f32> {
    let npy = std::fs::read(p).expect("npy file");
    let header_len = u16::from_le_bytes([npy[8], npy[9]]) as usize;
    npy[10 + header_len..].chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// What a teacher-forced run over the `apache2` ids reached against llama.cpp.
struct TeacherForced {
    /// Positions whose argmax equals llama.cpp's, of `n`.
    agree: usize,
    n: usize,
    ppl: f64,
    want_ppl: f64,
    /// Largest |Δ log p(next token)| against llama.cpp's.
    max_lp_diff: f64,
    /// Largest |Δ logit| of the first position against `logits_apache2_first.npy`.
    first_max_diff: f32,
    /// `[positions, vocab]` all logits (for comparisons with a full llama.cpp dump).
    logits: Vec<f32>,
    /// Wall time of the 4 prefill steps (a rough figure: the machine is shared).
    seconds: f64,
}

impl TeacherForced {
    fn agreement(&self) -> f64 {
        self.agree as f64 / self.n as f64
    }

    fn print(&self, what: &str) {
        eprintln!(
            "{what}: top-1 agreement {:.2}% ({}/{}), ppl {:.4} vs llama.cpp {:.4} ({:+.3}%), max log-prob diff {:.2e}, \
             first-step max |Δlogit| {:.4}, {:.1} s",
            self.agreement() * 100.0,
            self.agree,
            self.n,
            self.ppl,
            self.want_ppl,
            (self.ppl / self.want_ppl - 1.0) * 100.0,
            self.max_lp_diff,
            self.first_max_diff,
            self.seconds
        );
    }
}

/// Feeds the `apache2` ids in chunks of 256 (each chunk one causal prefill step) and compares
/// with the golden data. Set `DBG=1` to print every position where the argmax differs from
/// llama.cpp's, with the two logits and the difference in the log-probability of the true next
/// token.
fn teacher_forced(r: &mut Runner) -> TeacherForced {
    let g = golden();
    let tf = &g["teacher_forced"][0];
    let tokens = ids(&tf["ids"]);
    let want_argmax = ids(&tf["argmax"]);
    let want_lp: Vec<f64> = tf["next_token_logprob"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    let vocab = r.model.config.vocab_size;
    let mut seq = r.sequence();
    let mut logits = Vec::new();
    let start = std::time::Instant::now();
    for chunk in tokens.chunks(256) {
        logits.extend(r.step(&mut seq, chunk, Logits::All));
    }
    let seconds = start.elapsed().as_secs_f64();
    seq.release(&mut r.pool);
    let n = tokens.len() - 1; // positions with a next token
    let row = |i: usize| &logits[i * vocab..(i + 1) * vocab];
    let lp: Vec<f64> = (0..n).map(|i| log_softmax_at(row(i), tokens[i + 1] as usize)).collect();
    let mut agree = 0;
    for i in 0..n {
        let a = argmax(row(i));
        if a == want_argmax[i] {
            agree += 1;
        } else if std::env::var_os("DBG").is_some() {
            let w = want_argmax[i];
            eprintln!(
                "pos {i}: ours {a} ({:.4}) llama.cpp {w} ({:.4}), log-prob diff {:+.4}",
                row(i)[a as usize],
                row(i)[w as usize],
                lp[i] - want_lp[i]
            );
        }
    }
    let max_lp_diff = lp.iter().zip(&want_lp).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    let ppl = (-lp.iter().sum::<f64>() / n as f64).exp();
    let want_ppl = tf["perplexity"].as_f64().unwrap();
    let want = first_step_logits();
    assert_eq!(want.len(), vocab);
    let first_max_diff = want.iter().zip(row(0)).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    TeacherForced { agree, n, ppl, want_ppl, max_lp_diff, first_max_diff, logits, seconds }
}

/// The greedy prompts whose first 16 tokens equal llama.cpp's, of 6.
fn greedy_matches(r: &mut Runner) -> usize {
    let g = golden();
    let mut matched = 0;
    let cases = g["greedy"].as_array().unwrap();
    for case in cases {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["greedy_ids"]);
        let mut seq = r.sequence();
        let mut logits = r.step(&mut seq, &prompt, Logits::Last);
        let mut got = Vec::new();
        for _ in 0..16 {
            let t = argmax(&logits);
            got.push(t);
            logits = r.step(&mut seq, &[t], Logits::Last);
        }
        let ok = got[..] == want[..16];
        eprintln!("{:?}: {}", case["prompt"].as_str().unwrap(), if ok { "match" } else { "DIFFERENT" });
        if !ok {
            eprintln!("  got  {got:?}\n  want {:?}", &want[..16]);
        }
        matched += ok as usize;
        seq.release(&mut r.pool);
    }
    matched
}

#[test]
fn teacher_forced_agreement_perplexity_and_first_logits() {
    let Some(mut r) = runner(KvFormat::F16, AttnNumerics::Fast) else { return };
    let t = teacher_forced(&mut r);
    t.print("fast attention");
    assert!(t.agreement() >= MIN_AGREEMENT, "top-1 agreement {}", t.agreement());
    assert!((t.ppl / t.want_ppl - 1.0).abs() <= 0.02, "perplexity {} vs {}", t.ppl, t.want_ppl);
    assert!(t.first_max_diff <= 1e-3, "first-step logits differ by {}", t.first_max_diff);
}

#[test]
fn greedy_matches_llama_cpp_for_most_prompts() {
    let Some(mut r) = runner(KvFormat::F16, AttnNumerics::Fast) else { return };
    let matched = greedy_matches(&mut r);
    assert!(matched >= MIN_GREEDY_MATCHES, "only {matched} of 6 greedy continuations match");
}

#[test]
fn ggml_numerics_agree_with_llama_cpp() {
    let Some(mut r) = runner(KvFormat::F16, AttnNumerics::Ggml(GgmlSteps::ALL)) else { return };
    let t = teacher_forced(&mut r);
    t.print("ggml attention numerics");
    let matched = greedy_matches(&mut r);
    eprintln!("ggml attention numerics: greedy {matched} of 6");
    assert!(t.agreement() >= GGML_MIN_AGREEMENT, "top-1 agreement {}", t.agreement());
    assert!((t.ppl / t.want_ppl - 1.0).abs() <= GGML_MAX_PPL_DIFF, "perplexity {} vs {}", t.ppl, t.want_ppl);
    assert!(t.max_lp_diff <= GGML_MAX_LP_DIFF, "log-probabilities differ by {}", t.max_lp_diff);
    assert_eq!(t.first_max_diff, 0.0, "first-step logits differ");
    // The last of the 1,024 rows, after 4 chunked prefill steps: every bit as llama.cpp's.
    let vocab = r.model.config.vocab_size;
    let last = read_npy(&data("logits_apache2_last.npy"));
    assert_eq!(max_abs_diff(&t.logits[t.logits.len() - vocab..], &last), 0.0, "last teacher-forced row");
    assert!(matched >= GGML_MIN_GREEDY_MATCHES, "only {matched} of 6 greedy continuations match");
}

/// The default numerics (`auto`, what `pagekv run|chat|serve` use) on this f16 cache: ggml's
/// where the CPU has the SIMD kernel, so the engine as it runs meets the issue's targets; the
/// fast kernels for other formats (a q8 cache runs, no error).
#[test]
fn default_numerics_meet_the_issues_targets() {
    let Some(mut r) = runner(KvFormat::F16, AttnNumerics::default()) else { return };
    assert_eq!(r.model.attn_numerics(), AttnNumerics::Auto);
    assert_eq!(r.model.attn_numerics_for(KvFormat::Q8), AttnNumerics::Fast);
    if r.model.attn_numerics_for(KvFormat::F16) == AttnNumerics::Fast {
        // No SIMD ggml kernel on this CPU (no AVX2): `auto` is the fast kernels, whose bounds
        // the tests above hold.
        eprintln!("default_numerics_meet_the_issues_targets: skipped, auto runs the fast kernels on this CPU");
        return;
    }
    assert_eq!(r.model.attn_numerics_for(KvFormat::F16), AttnNumerics::Ggml(GgmlSteps::ALL));
    let t = teacher_forced(&mut r);
    t.print("default (auto) attention numerics");
    let matched = greedy_matches(&mut r);
    eprintln!("default (auto) attention numerics: greedy {matched} of 6");
    assert!(t.agreement() >= TARGET_AGREEMENT, "top-1 agreement {}", t.agreement());
    assert!((t.ppl / t.want_ppl - 1.0).abs() <= TARGET_PPL_DIFF, "perplexity {} vs {}", t.ppl, t.want_ppl);
    assert!(t.first_max_diff <= TARGET_FIRST_LOGITS_DIFF, "first-step logits differ by {}", t.first_max_diff);
    assert!(matched >= TARGET_GREEDY_MATCHES, "only {matched} of 6 greedy continuations match");

    let Some(mut q8) = runner(KvFormat::Q8, AttnNumerics::default()) else { return };
    let mut seq = q8.sequence();
    let logits = q8.step(&mut seq, &[1, 2, 3], Logits::Last);
    assert!(logits.iter().all(|x| x.is_finite()), "q8 cache under auto");

    // An attention setting that picks among the fast kernels (here the path) is honoured:
    // `auto` then runs them, not the ggml kernel.
    let picked = AttentionConfig { impl_: AttnImpl::Partitioned, ..AttentionConfig::default() };
    let mut m = Model::load(&model_path().unwrap(), picked).unwrap();
    m.set_attn_numerics(AttnNumerics::Auto);
    assert_eq!(m.attn_numerics_for(KvFormat::F16), AttnNumerics::Fast);

    // The serving engine asks for numerics that do not depend on a call's shape: `auto` turns
    // to `fast` there, an explicit `ggml` stays.
    Forward::ensure_path_invariance(&mut r.model);
    assert_eq!(r.model.attn_numerics_for(KvFormat::F16), AttnNumerics::Fast);
    q8.model.set_attn_numerics(AttnNumerics::Ggml(GgmlSteps::ALL));
    Forward::ensure_path_invariance(&mut q8.model);
    assert_eq!(q8.model.attn_numerics(), AttnNumerics::Ggml(GgmlSteps::ALL));
}

/// Decode steps (one token per forward, ggml's one-row matmul order) are bit-identical too:
/// a 4-token prompt, then 296 single tokens of the text, against llama.cpp evaluating the same.
#[test]
fn ggml_numerics_decode_steps_match_llama_cpp_bit_for_bit() {
    let Some(mut r) = runner(KvFormat::F16, AttnNumerics::Ggml(GgmlSteps::ALL)) else { return };
    let tokens = ids(&golden()["teacher_forced"][0]["ids"]);
    let mut seq = r.sequence();
    let mut logits = r.step(&mut seq, &tokens[..4], Logits::Last);
    for &t in &tokens[4..300] {
        logits = r.step(&mut seq, &[t], Logits::Last);
    }
    let want = read_npy(&data("logits_apache2_decode300.npy"));
    let d = max_abs_diff(&logits, &want);
    eprintln!("ggml numerics, 296 decode steps: max |Δlogit| {d}");
    assert_eq!(d, 0.0, "logits after 296 decode steps differ from llama.cpp's");
}

/// ggml's numerics are defined for an f16 cache only: any other format is an error naming the
/// setting, not a silent fallback.
#[test]
fn ggml_numerics_refuse_other_kv_formats() {
    let Some(mut r) = runner(KvFormat::Q8, AttnNumerics::Ggml(GgmlSteps::ALL)) else { return };
    let mut seq = r.sequence();
    seq.begin_append(&mut r.pool, 2).unwrap();
    let mut batch = Batch::default();
    batch.push(&[1, 2], seq.offset() + 2, seq.pending_slots(), seq.block_table(), Logits::Last);
    let e = r.model.forward(&batch, &mut r.pool).unwrap_err().to_string();
    assert!(e.contains("PAGEKV_ATTN_NUMERICS") && e.contains("f16 KV cache") && e.contains("q8"), "{e}");
    r.model.set_attn_numerics(AttnNumerics::Fast);
    assert!(r.model.forward(&batch, &mut r.pool).is_ok());
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)
}

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/smollm2").join(name)
}

/// Which attention rounding step accounts for how much disagreement: the teacher-forced run
/// with each of ggml's steps switched off in turn (from all on), and on in turn (from none),
/// beside the fast kernels. With `PAGEKV_GOLDEN_LOGITS=FILE` (all `[1024, vocab]` logits of
/// llama.cpp over the same ids, f32 .npy) it also prints the largest logit difference per run.
/// A measurement, not a check: `cargo test --release --test model_golden -- --ignored`.
#[test]
#[ignore]
fn attention_step_ablation() {
    let Some(mut r) = runner(KvFormat::F16, AttnNumerics::Fast) else { return };
    let full = std::env::var_os("PAGEKV_GOLDEN_LOGITS").map(|p| read_npy(&PathBuf::from(p)));
    let mut runs: Vec<(String, AttnNumerics)> = vec![
        ("fast".into(), AttnNumerics::Fast),
        ("ggml: all steps".into(), AttnNumerics::Ggml(GgmlSteps::ALL)),
        ("ggml: no step".into(), AttnNumerics::Ggml(GgmlSteps::NONE)),
        // The steps that lose no precision (orders and expf), without the two f16 roundings.
        (
            "ggml: orders and expf only".into(),
            AttnNumerics::Ggml(GgmlSteps { f16_query: false, f16_probs: false, ..GgmlSteps::ALL }),
        ),
    ];
    for (k, name) in GgmlSteps::NAMES.iter().enumerate() {
        let mut off = GgmlSteps::ALL.flags();
        off[k] = false;
        runs.push((format!("ggml: all but {name}"), AttnNumerics::Ggml(GgmlSteps::from_flags(off))));
        let mut on = GgmlSteps::NONE.flags();
        on[k] = true;
        runs.push((format!("ggml: only {name}"), AttnNumerics::Ggml(GgmlSteps::from_flags(on))));
    }
    for (what, numerics) in runs {
        r.model.set_attn_numerics(numerics);
        let t = teacher_forced(&mut r);
        t.print(&what);
        let greedy = greedy_matches(&mut r);
        eprintln!("  greedy {greedy} of 6");
        if let Some(full) = &full {
            let d = t.logits.iter().zip(full).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            let vocab = r.model.config.vocab_size;
            let exact = t.logits.chunks(vocab).zip(full.chunks(vocab)).take_while(|(a, b)| a == b).count();
            eprintln!("  max |Δlogit| over all positions {d:.4}; first {exact} positions bit-identical");
        }
    }
}
