//! A tiny llama or qwen2 GGUF with next-token-prediction (`nextn`) layers, written in memory,
//! and a naive reference of its forward and of its MTP step (plain f64 loops over the f32
//! weights, from the formulas). Shared by the model's and the engine's tests
//! (`crates/engine/tests` include this file by path).
//!
//! Two kinds:
//! - [`Kind::Random`]: every weight random; drafts are mostly wrong.
//! - [`Kind::Predictable`]: the main blocks' output projections are zero, so the residual stream
//!   carries the token's embedding and the output matrix makes the next token `π(token)` (a fixed
//!   permutation); the MTP layer's `eh_proj` passes the `enorm(embed(next token))` half through
//!   and its block's output projections are zero, so it predicts `π(next token)`: the token
//!   after next. Its drafts are the model's greedy choices. `logit_scale` sets the margin of the
//!   right token (large: greedy far from ties; small: sampling varies).
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Arc;

use pagekv_model::gguf::{GgufFile, GgufWriter};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub const VOCAB: usize = 96;
pub const HIDDEN: usize = 64;
pub const FFN: usize = 128;
pub const HEADS: usize = 2;
pub const KV_HEADS: usize = 1;
pub const HEAD_DIM: usize = 32;
/// Main layers.
pub const LAYERS: usize = 2;
pub const CONTEXT: usize = 1024;
const EPS: f32 = 1e-5;
const ROPE_BASE: f32 = 10000.0;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    Random,
    Predictable { logit_scale: f32 },
}

/// The permutation of the predictable kind: the main model's next token after `t`.
pub fn pi(t: u32) -> u32 {
    (5 * t + 7) % VOCAB as u32
}

/// A written model and its tensors (`[rows, cols]` row-major values by name, as multiplied).
pub struct TinyMtp {
    /// The GGUF file's bytes (with a SentencePiece-style vocabulary: `<unk>`, `<s>`, `</s>`,
    /// then `▁w3` …, so the binary can run it).
    pub bytes: Vec<u8>,
    pub file: Arc<GgufFile>,
    pub arch: String,
    pub tensors: HashMap<String, Vec<f32>>,
}

/// A tiny `arch` (`llama` or `qwen2`) model of `kind` from `seed` with one nextn layer
/// (`blk.2`), its metadata saying `nextn` next-token-prediction layers; `skip` leaves one
/// tensor out of the file.
pub fn tiny_mtp(arch: &str, seed: u64, kind: Kind, nextn: u32, skip: Option<&str>) -> TinyMtp {
    let mut rng = StdRng::seed_from_u64(seed);
    let (h, f, v) = (HIDDEN, FFN, VOCAB);
    let (qd, kvd) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    let mut w = GgufWriter::new();
    w.set("general.architecture", arch);
    w.set("general.name", format!("tiny-mtp-{arch}").as_str());
    let key = |k: &str| format!("{arch}.{k}");
    w.set(&key("block_count"), (LAYERS + 1) as u32);
    if nextn > 0 {
        w.set(&key("nextn_predict_layers"), nextn);
    }
    w.set(&key("embedding_length"), h as u32);
    w.set(&key("feed_forward_length"), f as u32);
    w.set(&key("attention.head_count"), HEADS as u32);
    w.set(&key("attention.head_count_kv"), KV_HEADS as u32);
    w.set(&key("context_length"), CONTEXT as u32);
    w.set(&key("vocab_size"), v as u32);
    w.set(&key("attention.layer_norm_rms_epsilon"), EPS);
    w.set(&key("rope.freq_base"), ROPE_BASE);
    let mut vocab: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    vocab.extend((3..VOCAB).map(|i| format!("\u{2581}w{i}")));
    w.set("tokenizer.ggml.model", "llama");
    w.set("tokenizer.ggml.tokens", vocab);
    let mut tensors: HashMap<String, Vec<f32>> = HashMap::new();
    // `[rows, cols]` uniform values of unit variance times `scale`, plus `offset`.
    let mut random = |rows: usize, cols: usize, scale: f32, offset: f32| -> Vec<f32> {
        (0..rows * cols).map(|_| offset + scale * 1.732 * rng.gen_range(-1.0f32..1.0)).collect()
    };
    let predictable = matches!(kind, Kind::Predictable { .. });
    let mut put = |name: String, rows: usize, cols: usize, values: Vec<f32>| {
        assert_eq!(values.len(), rows * cols, "{name}");
        tensors.insert(name, values);
    };
    let embd = random(v, h, 1.0, 0.0);
    put("token_embd.weight".into(), v, h, embd.clone());
    for i in 0..=LAYERS {
        let n = |s: &str| format!("blk.{i}.{s}");
        let zero_out = predictable;
        put(n("attn_norm.weight"), 1, h, random(1, h, 0.2, 1.0));
        put(n("attn_q.weight"), qd, h, random(qd, h, 1.0 / (h as f32).sqrt(), 0.0));
        put(n("attn_k.weight"), kvd, h, random(kvd, h, 1.0 / (h as f32).sqrt(), 0.0));
        put(n("attn_v.weight"), kvd, h, random(kvd, h, 1.0 / (h as f32).sqrt(), 0.0));
        let wo = if zero_out { vec![0.0; h * qd] } else { random(h, qd, 1.0 / (qd as f32).sqrt(), 0.0) };
        put(n("attn_output.weight"), h, qd, wo);
        if arch == "qwen2" {
            put(n("attn_q.bias"), 1, qd, random(1, qd, 0.3, 0.0));
            put(n("attn_k.bias"), 1, kvd, random(1, kvd, 0.3, 0.0));
            put(n("attn_v.bias"), 1, kvd, random(1, kvd, 0.3, 0.0));
        }
        put(n("ffn_norm.weight"), 1, h, random(1, h, 0.2, 1.0));
        put(n("ffn_gate.weight"), f, h, random(f, h, 1.0 / (h as f32).sqrt(), 0.0));
        put(n("ffn_up.weight"), f, h, random(f, h, 1.0 / (h as f32).sqrt(), 0.0));
        let down = if zero_out { vec![0.0; h * f] } else { random(h, f, 1.0 / (f as f32).sqrt(), 0.0) };
        put(n("ffn_down.weight"), h, f, down);
    }
    // The nextn tensors of blk.2.
    let n = |s: &str| format!("blk.{LAYERS}.nextn.{s}");
    let ones = vec![1.0f32; h];
    let (eh, enorm, hnorm, head_norm) = match kind {
        Kind::Random => (
            random(h, 2 * h, 1.0 / (2.0 * h as f32).sqrt(), 0.0),
            random(1, h, 0.2, 1.0),
            random(1, h, 0.2, 1.0),
            random(1, h, 0.2, 1.0),
        ),
        Kind::Predictable { .. } => {
            // [I | 0]: the embedding half passes through.
            let mut eh = vec![0.0f32; h * 2 * h];
            for r in 0..h {
                eh[r * 2 * h + r] = 1.0;
            }
            (eh, ones.clone(), ones.clone(), ones.clone())
        }
    };
    put(n("eh_proj.weight"), h, 2 * h, eh);
    put(n("enorm.weight"), 1, h, enorm);
    put(n("hnorm.weight"), 1, h, hnorm);
    put(n("shared_head_norm.weight"), 1, h, head_norm);
    let (output_norm, output) = match kind {
        Kind::Random => (random(1, h, 0.2, 1.0), random(v, h, 4.0 / (h as f32).sqrt(), 0.0)),
        Kind::Predictable { logit_scale } => {
            // Row π(t) is t's embedding: the logit of π(t) after t is about `logit_scale`, the
            // others about `logit_scale / √hidden` times a unit normal.
            let mut out = vec![0.0f32; v * h];
            for t in 0..v {
                let row = pi(t as u32) as usize;
                for k in 0..h {
                    out[row * h + k] = logit_scale / h as f32 * embd[t * h + k];
                }
            }
            (ones.clone(), out)
        }
    };
    put("output_norm.weight".into(), 1, h, output_norm);
    put("output.weight".into(), v, h, output);
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    for name in names {
        if Some(name.as_str()) == skip {
            continue;
        }
        let values = &tensors[name];
        let rows_cols = shape(name);
        // GGUF dims: [cols, rows], vectors [cols].
        let dims: Vec<u64> =
            if rows_cols.0 == 1 { vec![rows_cols.1 as u64] } else { vec![rows_cols.1 as u64, rows_cols.0 as u64] };
        w.add_f32_tensor(name, &dims, values).unwrap();
    }
    let bytes = w.to_bytes();
    let file = Arc::new(GgufFile::from_bytes(bytes.clone()).unwrap());
    TinyMtp { bytes, file, arch: arch.to_string(), tensors }
}

/// `(rows, cols)` of a tensor of the tiny model by name.
fn shape(name: &str) -> (usize, usize) {
    let (h, f, v) = (HIDDEN, FFN, VOCAB);
    let (qd, kvd) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    let stem = name.rsplit_once("blk.").map_or(name, |(_, rest)| rest.split_once('.').map_or(rest, |(_, s)| s));
    match stem {
        "token_embd.weight" | "output.weight" => (v, h),
        "attn_q.weight" => (qd, h),
        "attn_k.weight" | "attn_v.weight" => (kvd, h),
        "attn_output.weight" => (h, qd),
        "attn_q.bias" => (1, qd),
        "attn_k.bias" | "attn_v.bias" => (1, kvd),
        "ffn_gate.weight" | "ffn_up.weight" => (f, h),
        "ffn_down.weight" => (h, f),
        "nextn.eh_proj.weight" => (h, 2 * h),
        _ => (1, h),
    }
}

/// The naive reference: f64 loops over the f32 weights.
pub struct Reference<'a> {
    pub m: &'a TinyMtp,
}

fn rms_norm(x: &[f64], w: &[f32]) -> Vec<f64> {
    let mean = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (mean + EPS as f64).sqrt();
    x.iter().zip(w).map(|(v, &g)| v * inv * g as f64).collect()
}

impl Reference<'_> {
    fn t(&self, name: &str) -> &[f32] {
        &self.m.tensors[name]
    }

    /// `W · x` for the `[rows, cols]` tensor `name`.
    fn mv(&self, name: &str, x: &[f64]) -> Vec<f64> {
        let w = self.t(name);
        let cols = x.len();
        w.chunks_exact(cols).map(|row| row.iter().zip(x).map(|(&a, b)| a as f64 * b).sum()).collect()
    }

    /// Token `t`'s embedding.
    pub fn embed(&self, t: u32) -> Vec<f64> {
        let h = HIDDEN;
        self.t("token_embd.weight")[t as usize * h..(t as usize + 1) * h].iter().map(|&v| v as f64).collect()
    }

    /// Rotates one head at `pos` (llama: adjacent pairs; qwen2: halves).
    fn rope(&self, x: &mut [f64], pos: usize) {
        let d = HEAD_DIM;
        for i in 0..d / 2 {
            let theta = pos as f64 * (ROPE_BASE as f64).powf(-2.0 * i as f64 / d as f64);
            let (c, s) = (theta.cos(), theta.sin());
            let (a, b) = if self.m.arch == "qwen2" { (i, i + d / 2) } else { (2 * i, 2 * i + 1) };
            let (xa, xb) = (x[a], x[b]);
            x[a] = xa * c - xb * s;
            x[b] = xa * s + xb * c;
        }
    }

    /// Block `layer` over the inputs `xs` at positions `0..xs.len()` (causal), from scratch.
    pub fn block(&self, layer: usize, xs: &[Vec<f64>]) -> Vec<Vec<f64>> {
        let n = |s: &str| format!("blk.{layer}.{s}");
        let (d, g) = (HEAD_DIM, HEADS / KV_HEADS);
        let bias = |name: &str, mut v: Vec<f64>| {
            if let Some(b) = self.m.tensors.get(&n(name)) {
                v.iter_mut().zip(b).for_each(|(x, &b)| *x += b as f64);
            }
            v
        };
        let mut qs = Vec::new();
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        for (p, x) in xs.iter().enumerate() {
            let xn = rms_norm(x, self.t(&n("attn_norm.weight")));
            let mut q = bias("attn_q.bias", self.mv(&n("attn_q.weight"), &xn));
            let mut k = bias("attn_k.bias", self.mv(&n("attn_k.weight"), &xn));
            let v = bias("attn_v.bias", self.mv(&n("attn_v.weight"), &xn));
            q.chunks_exact_mut(d).for_each(|head| self.rope(head, p));
            k.chunks_exact_mut(d).for_each(|head| self.rope(head, p));
            qs.push(q);
            ks.push(k);
            vs.push(v);
        }
        let scale = 1.0 / (d as f64).sqrt();
        let mut out = Vec::new();
        for (p, x) in xs.iter().enumerate() {
            let mut attn = vec![0.0f64; HEADS * d];
            for head in 0..HEADS {
                let kv = head / g;
                let q = &qs[p][head * d..(head + 1) * d];
                let scores: Vec<f64> = (0..=p)
                    .map(|j| q.iter().zip(&ks[j][kv * d..(kv + 1) * d]).map(|(a, b)| a * b).sum::<f64>() * scale)
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let z: f64 = e.iter().sum();
                for (j, ej) in e.iter().enumerate() {
                    for c in 0..d {
                        attn[head * d + c] += ej / z * vs[j][kv * d + c];
                    }
                }
            }
            let mut y: Vec<f64> = x.iter().zip(self.mv(&n("attn_output.weight"), &attn)).map(|(a, b)| a + b).collect();
            let yn = rms_norm(&y, self.t(&n("ffn_norm.weight")));
            let gate = self.mv(&n("ffn_gate.weight"), &yn);
            let up = self.mv(&n("ffn_up.weight"), &yn);
            let act: Vec<f64> = gate.iter().zip(&up).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
            y.iter_mut().zip(self.mv(&n("ffn_down.weight"), &act)).for_each(|(a, b)| *a += b);
            out.push(y);
        }
        out
    }

    /// The main model's last hidden states (before the final norm) of `tokens`, and logits.
    pub fn main(&self, tokens: &[u32]) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
        let mut xs: Vec<Vec<f64>> = tokens.iter().map(|&t| self.embed(t)).collect();
        for l in 0..LAYERS {
            xs = self.block(l, &xs);
        }
        let logits = xs.iter().map(|x| self.mv("output.weight", &rms_norm(x, self.t("output_norm.weight")))).collect();
        (xs, logits)
    }

    /// The MTP layer over entries `0..next.len()`: entry `e` combines `hidden[e]` with token
    /// `next[e]`. Returns each entry's block output `g_e` and logits.
    pub fn mtp(&self, next: &[u32], hidden: &[Vec<f64>]) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
        let l = LAYERS;
        let nx = |s: &str| format!("blk.{l}.nextn.{s}");
        let ins: Vec<Vec<f64>> = next
            .iter()
            .zip(hidden)
            .map(|(&t, h)| {
                let mut cat = rms_norm(&self.embed(t), self.t(&nx("enorm.weight")));
                cat.extend(rms_norm(h, self.t(&nx("hnorm.weight"))));
                self.mv(&nx("eh_proj.weight"), &cat)
            })
            .collect();
        let gs = self.block(l, &ins);
        let logits =
            gs.iter().map(|g| self.mv("output.weight", &rms_norm(g, self.t(&nx("shared_head_norm.weight"))))).collect();
        (gs, logits)
    }
}

/// The largest absolute difference between `got` and `want`, relative to `want`'s largest
/// magnitude.
pub fn rel_diff(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-6);
    got.iter().zip(want).map(|(&a, b)| (a as f64 - b).abs()).fold(0.0, f64::max) / scale
}
