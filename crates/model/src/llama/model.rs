//! The llama-family forward pass over the paged cache.
//!
//! One readable path, as in llama2.c: embed → per layer (RMSNorm, QKV projections, optional
//! bias and q/k norms, RoPE, cache write, paged attention, output projection, residual,
//! RMSNorm, SwiGLU MLP, residual) → final norm → logits for the rows asked for; the last
//! hidden states of the sequences that ask (`BatchSeq::hidden`) leave before the final norm
//! ([`Model::last_hidden`]). The block is one function ([`block_forward`]) that the
//! next-token-prediction head (`mtp.rs`) runs too. Every buffer
//! is allocated up front in [`Scratch`] and grows only when a larger batch arrives, so a
//! decode step allocates nothing.
//!
//! Attention is one call per run of sequences into `pagekv_cpu::attention::Attention`, whose
//! router picks the route (reference, primitive, partitioned, or the ggml kernels that round as
//! llama.cpp does) from the attention configuration, including its numerics (`auto` unless the
//! caller chooses with [`Model::set_attn_numerics`] or in the [`AttentionConfig`] it loads with).

use std::path::Path;
use std::sync::Arc;

use kvcache::{KvFormat, KvPool, LayerView, PageStore};
use pagekv_cpu::attention::{Attention, AttentionConfig, AttentionParams, AttnNumerics};
use pagekv_cpu::quant::{dequantize_row, fusable, matmul_fused_ordered, Isa, MatmulPart, QuantScratch, SumOrder};
use pagekv_cpu::threadpool::ThreadPool;

use super::config::ModelConfig;
use super::ops::{rms_norm, Rope};
use super::rows;
use super::weights::{LayerWeights, LoadOptions, Tensor, Weights};
use crate::batch::{Batch, Logits};
use crate::error::ModelError;
use crate::gguf::GgufFile;

/// Working buffers, sized for `cap` tokens, `cap_logits` logit rows and `cap_hidden` hidden
/// rows.
#[derive(Default)]
pub(super) struct Scratch {
    pub(super) cap: usize,
    pub(super) cap_logits: usize,
    pub(super) cap_hidden: usize,
    pub(super) x: Vec<f32>,      // [cap, hidden] residual stream
    pub(super) xn: Vec<f32>,     // [cap, hidden] normed input of a block
    pub(super) q: Vec<f32>,      // [cap, q_dim]
    pub(super) k: Vec<f32>,      // [cap, kv_dim]
    pub(super) v: Vec<f32>,      // [cap, kv_dim]
    pub(super) attn: Vec<f32>,   // [cap, q_dim]
    pub(super) proj: Vec<f32>,   // [cap, hidden]
    pub(super) gate: Vec<f32>,   // [cap, ffn]
    pub(super) up: Vec<f32>,     // [cap, ffn]
    pub(super) rows: Vec<f32>,   // [cap_logits, hidden] normed rows whose logits are wanted
    pub(super) logits: Vec<f32>, // [cap_logits, vocab]
    /// `[cap_hidden, hidden]` the last hidden states handed out (`BatchSeq::hidden` rows of a
    /// forward, the logit rows of an MTP forward).
    pub(super) hidden: Vec<f32>,
    /// `[cap, 2 * hidden]` an MTP forward's `[enorm(embedding), hnorm(hidden)]` rows.
    pub(super) cat: Vec<f32>,
    /// `[cap, rope angles]` each row's RoPE cos/sin.
    pub(super) angles: Vec<f32>,
    /// `[kept rows]` the batch rows that go on after the last block's attention (those whose
    /// logits or hidden states are wanted), increasing.
    pub(super) out_rows: Vec<usize>,
    /// `[logit rows]` where each logit row is among the kept rows.
    pub(super) logit_at: Vec<usize>,
    /// `[hidden rows]` where each hidden row is among the kept rows.
    pub(super) hidden_at: Vec<usize>,
    pub(super) quant: QuantScratch,
    /// Recycled storage for the per-call block-table slice list.
    pub(super) tables: Vec<&'static [u32]>,
    /// `[sequences in one attention call]` context lengths.
    pub(super) lens: Vec<usize>,
}

impl Scratch {
    pub(super) fn ensure(&mut self, c: &ModelConfig, tokens: usize, logit_rows: usize, hidden_rows: usize) {
        if tokens > self.cap {
            let n = tokens.next_power_of_two();
            self.x.resize(n * c.hidden, 0.0);
            self.xn.resize(n * c.hidden, 0.0);
            self.q.resize(n * c.q_dim(), 0.0);
            self.k.resize(n * c.kv_dim(), 0.0);
            self.v.resize(n * c.kv_dim(), 0.0);
            self.attn.resize(n * c.q_dim(), 0.0);
            self.proj.resize(n * c.hidden, 0.0);
            self.gate.resize(n * c.ffn, 0.0);
            self.up.resize(n * c.ffn, 0.0);
            self.cap = n;
        }
        if logit_rows > self.cap_logits {
            let n = logit_rows.next_power_of_two();
            self.rows.resize(n * c.hidden, 0.0);
            self.logits.resize(n * c.vocab_size, 0.0);
            self.cap_logits = n;
        }
        if hidden_rows > self.cap_hidden {
            let n = hidden_rows.next_power_of_two();
            self.hidden.resize(n * c.hidden, 0.0);
            self.cap_hidden = n;
        }
    }
}

/// A loaded model, ready to run forward steps.
pub struct Model {
    pub config: ModelConfig,
    pub weights: Weights,
    pub(super) rope: Rope,
    /// The RoPE of the layers with a sliding window (`ModelConfig::rope_base_local`).
    rope_local: Rope,
    pub(super) attention: Attention,
    pub(super) threads: &'static ThreadPool,
    /// The K-quant products' summation order ([`Self::set_sum_order`]).
    pub(super) sum_order: SumOrder,
    pub(super) scratch: Scratch,
}

impl Model {
    /// Loads a GGUF file (mapped, not read) with the attention configuration given (its
    /// numerics included; [`Model::set_attn_numerics`] changes them).
    pub fn load(path: &Path, attention: AttentionConfig) -> Result<Model, ModelError> {
        let file = GgufFile::open(path)?;
        Model::from_file(Arc::new(file), attention)
    }

    pub fn from_file(file: Arc<GgufFile>, attention: AttentionConfig) -> Result<Model, ModelError> {
        Model::from_file_with(file, attention, LoadOptions::default())
    }

    /// [`Model::from_file`] with explicit [`LoadOptions`].
    pub fn from_file_with(
        file: Arc<GgufFile>,
        attention: AttentionConfig,
        options: LoadOptions,
    ) -> Result<Model, ModelError> {
        let config = ModelConfig::from_metadata(file.metadata())?;
        let weights = Weights::load_with(file, &config, options)?;
        let threads = ThreadPool::global().map_err(|e| ModelError::Invalid(e.to_string()))?;
        let factors = weights.rope_freqs.as_ref().map(|t| weights.f32s(t).to_vec());
        let rope_with_base = |base: f32| {
            Rope::new(
                config.rope_style,
                config.head_dim,
                config.rope_dims,
                base,
                config.rope_linear_scale,
                factors.as_deref(),
            )
        };
        let (rope, rope_local) = (rope_with_base(config.rope_base), rope_with_base(config.rope_base_local));
        Ok(Model {
            rope,
            rope_local,
            attention: Attention::new(attention, threads),
            threads,
            sum_order: SumOrder::LlamaCpp,
            scratch: Scratch::default(),
            weights,
            config,
        })
    }

    /// Chooses how attention rounds: the fast kernels, llama.cpp's numerics (f16 caches only; a
    /// forward over another format is then an error), or `auto` (llama.cpp's where the SIMD ggml
    /// kernel serves the cache and no attention setting picks among the fast kernels, the fast
    /// kernels elsewhere).
    pub fn set_attn_numerics(&mut self, numerics: AttnNumerics) {
        self.attention.set_numerics(numerics);
    }

    pub fn attn_numerics(&self) -> AttnNumerics {
        self.attention.config().numerics
    }

    /// Chooses the K-quant products' summation order: llama.cpp's (the default; it depends on
    /// a step's row count) or one that gives each token row its one-row result
    /// ([`SumOrder::RowInvariant`], what [`Forward::ensure_path_invariance`] asks for).
    pub fn set_sum_order(&mut self, order: SumOrder) {
        self.sum_order = order;
    }

    pub fn sum_order(&self) -> SumOrder {
        self.sum_order
    }

    /// The numerics a forward over a cache of `format` runs: `Fast` or `Ggml`, never `Auto`.
    pub fn attn_numerics_for(&self, format: KvFormat) -> AttnNumerics {
        self.attention.numerics_for(format, self.config.head_dim)
    }

    /// Runs one step: writes the batch's K/V into `pool` (every layer) and returns the logits
    /// asked for, `[batch.num_logit_rows(), vocab]`, in sequence order. The last hidden states of
    /// the sequences that ask for them (`BatchSeq::hidden`) are then in [`Self::last_hidden`].
    pub fn forward(&mut self, batch: &Batch, pool: &mut KvPool) -> Result<&[f32], ModelError> {
        batch.validate(&self.config, pool.geometry(), pool.groups())?;
        // Each layer reads and writes its group's block table, in its page plane.
        let groups = pool.groups().clone();
        let c = &self.config;
        let n = batch.num_tokens();
        let n_logits = batch.num_logit_rows();
        let n_hidden = batch.num_hidden_rows();
        self.scratch.ensure(c, n, n_logits, n_hidden);
        let counters = pool.counters().clone();
        let s = &mut self.scratch;
        let w = &self.weights;
        let pool_t = self.threads;
        let mx = Products { pool: self.threads, order: self.sum_order };
        let h = c.hidden;

        // The rows that go on after the last block's attention, in sequence order, and where the
        // logit and hidden rows are among them.
        s.out_rows.clear();
        s.logit_at.clear();
        s.hidden_at.clear();
        for seq in &batch.seqs {
            let end = seq.token_start + seq.num_tokens;
            let logits_from = match seq.logits {
                Logits::None => end,
                Logits::Last => end - 1,
                Logits::All => seq.token_start,
            };
            let from = if seq.hidden { seq.token_start } else { logits_from };
            for r in from..end {
                if r >= logits_from {
                    s.logit_at.push(s.out_rows.len());
                }
                if seq.hidden {
                    s.hidden_at.push(s.out_rows.len());
                }
                s.out_rows.push(r);
            }
        }
        debug_assert_eq!((s.logit_at.len(), s.hidden_at.len()), (n_logits, n_hidden));
        let last_layer = w.layers.len() - 1;

        // Embed.
        embed(w, &w.token_embd, &batch.tokens, c.embed_scale, &mut s.x[..n * h], pool_t)?;

        let parts = Parts { c, w, threads: pool_t, mx, rope: &self.rope, rope_local: &self.rope_local };
        // Taken out of the scratch while the blocks borrow it (put back below; a failed step
        // loses only the allocation).
        let kept = std::mem::take(&mut s.out_rows);
        let mut rows = n;
        for (li, lw) in w.layers.iter().enumerate() {
            // After the last layer's attention only the rows whose logits or hidden states are
            // wanted go on (as llama.cpp's graph does for its logit rows: the FFN's products then
            // have the same row counts, which choose their summation orders).
            let keep = (li == last_layer && kept.len() < n).then_some(&kept[..]);
            let (group, plane) = groups.locate(li);
            let window = c.layer_windows[li];
            debug_assert!(groups.kind(group).window().is_none_or(|gw| window.is_some_and(|lw| lw <= gw)));
            let block = Block { weights: lw, window, group, plane };
            rows = block_forward(&parts, &mut self.attention, s, &block, batch, pool, &counters, rows, keep)?;
        }
        debug_assert_eq!(rows, kept.len());
        s.out_rows = kept;

        // The hidden rows leave before the final norm.
        for (j, &k) in s.hidden_at.iter().enumerate() {
            s.hidden[j * h..(j + 1) * h].copy_from_slice(&s.x[k * h..(k + 1) * h]);
        }
        // Final norm of the rows whose logits are wanted, then the output projection.
        let norm = w.f32s(&w.output_norm);
        for (r, &k) in s.logit_at.iter().enumerate() {
            rms_norm(&s.x[k * h..(k + 1) * h], norm, c.rms_eps, &mut s.rows[r * h..(r + 1) * h]);
        }
        let v = c.vocab_size;
        if n_logits > 0 {
            mm(w, &w.output, &s.rows[..n_logits * h], n_logits, &mut s.logits[..n_logits * v], &mut s.quant, mx)?;
        }
        Ok(&self.scratch.logits[..n_logits * v])
    }

    /// The logits of the last [`Self::forward`] (`[rows, vocab]`, valid up to that call's rows).
    pub fn last_logits(&self) -> &[f32] {
        &self.scratch.logits
    }

    /// The last hidden states of the last [`Self::forward`] (the last main block's output,
    /// before the final norm): `[hidden rows, hidden]`, one row per token of each sequence that
    /// asked (`BatchSeq::hidden`), in batch order. After [`Self::forward_mtp`], its logit rows'
    /// (the MTP block's output before its head norm). Valid up to that call's rows.
    pub fn last_hidden(&self) -> &[f32] {
        &self.scratch.hidden
    }

    /// Bytes one decode step reads from the weights.
    pub fn weight_bytes_per_token(&self) -> usize {
        self.weights.decode_bytes()
    }
}

/// What a block reads besides its own weights: the model's configuration, weights, threads,
/// products and RoPE tables.
pub(super) struct Parts<'a> {
    pub c: &'a ModelConfig,
    pub w: &'a Weights,
    pub threads: &'static ThreadPool,
    /// The matrix products' threads and summation order.
    pub mx: Products<'a>,
    pub rope: &'a Rope,
    pub rope_local: &'a Rope,
}

/// One transformer block and where its K/V live: its layer group and page plane.
pub(super) struct Block<'a> {
    pub weights: &'a LayerWeights,
    /// The layer's own sliding window (Gemma 3), if any.
    pub window: Option<usize>,
    pub group: usize,
    pub plane: usize,
}

/// Embeds `tokens` from `table` (`[vocab, hidden]`) into `x` (`[tokens, hidden]`), scaled.
pub(super) fn embed(
    w: &Weights,
    table: &Tensor,
    tokens: &[u32],
    scale: f32,
    x: &mut [f32],
    threads: &ThreadPool,
) -> Result<(), ModelError> {
    let h = table.cols;
    debug_assert_eq!(x.len(), tokens.len() * h);
    // The file's rows whatever layout the products read (a lookup reads single rows).
    let embd = w.file_view(table);
    for (i, &tok) in tokens.iter().enumerate() {
        let row = embd.row(tok as usize).map_err(|e| kernel(table, e))?;
        dequantize_row(embd.ty, row, &mut x[i * h..(i + 1) * h]).map_err(|e| kernel(table, e))?;
    }
    if scale != 1.0 {
        rows::scale(threads, x, scale);
    }
    Ok(())
}

/// One block over the residual stream `s.x` (`[n, hidden]`): RMSNorm, QKV products (biases,
/// q/k norms), RoPE, cache write into `b.plane`, paged attention through `b.group`'s tables,
/// output projection and residual add, then the MLP and its residual add. With `keep`, only
/// those rows (increasing) go on after attention: they are moved to the front. Returns the rows
/// of `s.x` that hold the block's output.
#[allow(clippy::too_many_arguments)]
pub(super) fn block_forward(
    p: &Parts,
    attention: &mut Attention,
    s: &mut Scratch,
    b: &Block,
    batch: &Batch,
    pool: &mut KvPool,
    counters: &kvcache::CacheCounters,
    n: usize,
    keep: Option<&[usize]>,
) -> Result<usize, ModelError> {
    let (c, w, pool_t, lw) = (p.c, p.w, p.threads, b.weights);
    let (h, qd, kvd, f) = (c.hidden, c.q_dim(), c.kv_dim(), c.ffn);
    // Attention block.
    rows::norm_rows(pool_t, &s.x[..n * h], w.f32s(&lw.attn_norm), c.rms_eps, &mut s.xn[..n * h]);
    let xn = &s.xn[..n * h];
    mm_fused(
        w,
        [(&lw.wq, &mut s.q[..n * qd]), (&lw.wk, &mut s.k[..n * kvd]), (&lw.wv, &mut s.v[..n * kvd])],
        xn,
        n,
        &mut s.quant,
        p.mx,
    )?;
    for (bias, buf, width) in [(&lw.bq, &mut s.q, qd), (&lw.bk, &mut s.k, kvd), (&lw.bv, &mut s.v, kvd)] {
        if let Some(bias) = bias {
            rows::add_bias(pool_t, &mut buf[..n * width], w.f32s(bias));
        }
    }
    if let Some(qn) = &lw.q_norm {
        rows::norm_chunks(pool_t, &mut s.q[..n * qd], qd, w.f32s(qn), c.rms_eps);
    }
    if let Some(kn) = &lw.k_norm {
        rows::norm_chunks(pool_t, &mut s.k[..n * kvd], kvd, w.f32s(kn), c.rms_eps);
    }
    let rope = if b.window.is_some() { p.rope_local } else { p.rope };
    rows::rope(pool_t, rope, &batch.positions, &mut s.q[..n * qd], &mut s.k[..n * kvd], &mut s.angles);
    // Keys less their bias for a quantized cache (`centres_keys`). `s.k` is not read after the
    // write: attention reads the cache.
    if let Some(bk) = lw.bk.as_ref().filter(|_| super::centres_keys(pool.config().format)) {
        rows::sub_bias(pool_t, &mut s.k[..n * kvd], w.f32s(bk));
    }
    pool.pages_mut().write(b.plane, &batch.slots[b.group], &s.k[..n * kvd], &s.v[..n * kvd]);
    if c.scale_queries {
        rows::scale(pool_t, &mut s.q[..n * qd], c.attn_scale);
    }
    let layer = pool.layer(b.plane);
    attention.prepare_queries(&layer, &mut s.q[..n * qd]);
    attend(
        attention,
        &layer,
        batch,
        b.group,
        c,
        &s.q[..n * qd],
        b.window.or(batch.sliding_window),
        counters,
        &mut s.attn[..n * qd],
        &mut s.tables,
        &mut s.lens,
    )?;
    mm(w, &lw.wo, &s.attn[..n * qd], n, &mut s.proj[..n * h], &mut s.quant, p.mx)?;
    let n = match keep {
        Some(rows) => {
            keep_rows(&mut s.proj, rows, h);
            keep_rows(&mut s.x, rows, h);
            rows.len()
        }
        None => n,
    };
    if let Some(post) = &lw.post_attn_norm {
        rows::norm_chunks(pool_t, &mut s.proj[..n * h], h, w.f32s(post), c.rms_eps);
    }
    rows::add(pool_t, &mut s.x[..n * h], &s.proj[..n * h]);

    // MLP block.
    rows::norm_rows(pool_t, &s.x[..n * h], w.f32s(&lw.ffn_norm), c.rms_eps, &mut s.xn[..n * h]);
    let xn = &s.xn[..n * h];
    mm_fused(w, [(&lw.w_gate, &mut s.gate[..n * f]), (&lw.w_up, &mut s.up[..n * f])], xn, n, &mut s.quant, p.mx)?;
    rows::gated(pool_t, c.activation, &mut s.gate[..n * f], &s.up[..n * f]);
    mm(w, &lw.w_down, &s.gate[..n * f], n, &mut s.proj[..n * h], &mut s.quant, p.mx)?;
    if let Some(post) = &lw.post_ffn_norm {
        rows::norm_chunks(pool_t, &mut s.proj[..n * h], h, w.f32s(post), c.rms_eps);
    }
    rows::add(pool_t, &mut s.x[..n * h], &s.proj[..n * h]);
    Ok(n)
}

/// Moves rows `rows[i]` of `buf` (`[.., width]`) to row `i`. `rows` is increasing, so no row is
/// overwritten before it moves.
fn keep_rows(buf: &mut [f32], rows: &[usize], width: usize) {
    debug_assert!(rows.windows(2).all(|p| p[0] < p[1]));
    for (i, &r) in rows.iter().enumerate() {
        if r != i {
            buf.copy_within(r * width..(r + 1) * width, i * width);
        }
    }
}

pub(super) fn kernel(t: &Tensor, source: pagekv_cpu::quant::QuantError) -> ModelError {
    ModelError::Kernel { name: t.name.clone(), source }
}

/// How a step's matrix products run: on which threads, in which K-quant summation order.
#[derive(Clone, Copy)]
pub(super) struct Products<'a> {
    pub pool: &'a ThreadPool,
    pub order: SumOrder,
}

/// `out[n, rows] = x[n, cols] · Wᵀ`.
pub(super) fn mm(
    w: &Weights,
    t: &Tensor,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    q: &mut QuantScratch,
    mx: Products,
) -> Result<(), ModelError> {
    let mut parts = [MatmulPart { w: w.view(t), out }];
    matmul_fused_ordered(Isa::best(), mx.order, &mut parts, x, n, q, mx.pool).map_err(|e| kernel(t, e))
}

/// `out_i[n, rows_i] = x[n, cols] · W_iᵀ` for matrices over the same input, in one parallel
/// region when their types allow it (outputs bit-identical either way).
fn mm_fused<const N: usize>(
    w: &Weights,
    parts: [(&Tensor, &mut [f32]); N],
    x: &[f32],
    n: usize,
    q: &mut QuantScratch,
    mx: Products,
) -> Result<(), ModelError> {
    if !fusable(&parts.each_ref().map(|(t, _)| t.ty)) {
        for (t, out) in parts {
            mm(w, t, x, n, out, q, mx)?;
        }
        return Ok(());
    }
    let first = parts[0].0;
    let mut views = parts.map(|(t, out)| MatmulPart { w: w.view(t), out });
    matmul_fused_ordered(Isa::best(), mx.order, &mut views, x, n, q, mx.pool).map_err(|e| kernel(first, e))
}

/// Paged attention for every sequence: decodes (one new token) batched in one call, each
/// prefill chunk in its own causal call.
#[allow(clippy::too_many_arguments)]
fn attend(
    attention: &mut Attention,
    layer: &LayerView,
    batch: &Batch,
    group: usize,
    c: &ModelConfig,
    q: &[f32], // [n, q_dim]
    sliding_window: Option<usize>,
    counters: &kvcache::CacheCounters,
    out: &mut [f32], // [n, q_dim]
    tables_buf: &mut Vec<&'static [u32]>,
    lens_buf: &mut Vec<usize>,
) -> Result<(), ModelError> {
    let qd = c.q_dim();
    let scale = if c.scale_queries { 1.0 } else { c.attn_scale };
    let mut tables: Vec<&[u32]> = recycle(std::mem::take(tables_buf));
    let mut i = 0;
    let seqs = &batch.seqs;
    while i < seqs.len() {
        // A run of consecutive single-token sequences goes in one call.
        let mut j = i + 1;
        if seqs[i].num_tokens == 1 {
            while j < seqs.len() && seqs[j].num_tokens == 1 {
                j += 1;
            }
        }
        tables.clear();
        tables.extend(seqs[i..j].iter().map(|s| s.block_tables[group].as_slice()));
        lens_buf.clear();
        lens_buf.extend(seqs[i..j].iter().map(|s| s.context_len));
        let q_len = seqs[i].num_tokens;
        let t0 = seqs[i].token_start;
        let t1 = seqs[j - 1].token_start + seqs[j - 1].num_tokens;
        let params = AttentionParams {
            queries: &q[t0 * qd..t1 * qd],
            num_seqs: j - i,
            q_len,
            num_heads: c.num_heads,
            block_tables: &tables,
            context_lens: lens_buf,
            scale,
            sliding_window,
            causal: q_len > 1,
        };
        let out = &mut out[t0 * qd..t1 * qd];
        attention.forward(layer, &params, counters, out).map_err(|e| ModelError::Attention(e.to_string()))?;
        i = j;
    }
    *tables_buf = recycle(tables);
    Ok(())
}

/// Reuses a vector's allocation for references of another lifetime (it is emptied first,
/// so no reference outlives its borrow).
fn recycle<'a, 'b>(mut v: Vec<&'a [u32]>) -> Vec<&'b [u32]> {
    v.clear();
    v.into_iter().map(|_| -> &'b [u32] { unreachable!() }).collect()
}
