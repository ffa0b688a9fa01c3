//! ggml-compatible attention numerics (`PAGEKV_ATTN_NUMERICS=ggml`, and what the default `auto`
//! picks for f16 caches the SIMD kernel serves): attention over an f16 KV cache rounded step by
//! step as llama.cpp's CPU backend rounds it, so a model run here can agree with llama.cpp to
//! the last bit instead of to the last few tenths of a logit.
//!
//! What llama.cpp computes (llama-cpp-python 0.3.36 as the golden data in ../shared/reference
//! was made: `flash_attn` off, an f16 cache with V stored transposed, ggml-cpu built with GCC for
//! AVX-512; its `llama-graph.cpp` `build_attn_mha`, ggml-cpu `ggml_compute_forward_mul_mat`,
//! `llamafile/sgemm.cpp` `tinyBLAS`, `vec.cpp` `ggml_vec_dot_f16` / `ggml_vec_soft_max_f32`,
//! `vec.h` `ggml_v_expf`, `ops.cpp` `ggml_compute_forward_soft_max_f32`):
//!
//! 1. `kq = mul_mat(K, Q)`: Q is converted to f16 (round to nearest even), each score is an f32
//!    dot product of f16 values (every product exact, so only the summation order rounds).
//! 2. `soft_max_ext(kq, mask, scale)`: `w = score · scale` in f32; `e = ggml_v_expf(w − max)`;
//!    the denominator sums `e` 16 positions at a time (an f32 tree per 16, then f64);
//!    `p = e · f32(1 / sum)`.
//! 3. `kqv = mul_mat(V, p)`: p is converted to f16 and each output is an f32 dot product over
//!    the positions (exact products again; only the order rounds).
//!
//! The summation order of both products depends on how many query tokens llama.cpp's ubatch
//! holds: with several (prefill), tinyBLAS accumulates 16 lanes, lane `i mod 16` taking element
//! `i`, then folds them (`_mm512_reduce_add_ps`); with one (decode), `ggml_vec_dot_f16` keeps
//! four 16-lane accumulators over steps of 64 and folds `(a0 + a2) + (a1 + a3)` first. Here the
//! order is chosen **per sequence**: a sequence with `q_len` 1 takes the decode order, one with
//! several query tokens the tinyBLAS order, whatever else the call holds, so a sequence's result
//! does not depend on what it is batched with (the engine's "alone == batched" guarantee). For
//! one sequence per call, as llama.cpp runs a single conversation, that is llama.cpp's choice.
//! Positions index the lanes from 0 (llama.cpp's cache cells, which for one sequence are its
//! positions), and masked positions add exact zeros, so the cache's padding (to 256 cells) does
//! not matter. Several sequences in one llama.cpp ubatch share cells in an order this kernel
//! does not model; one sequence per call is reproduced bit for bit (the golden tests check
//! 1,024 prefill rows and 296 decode steps of SmolLM2).
//!
//! [`GgmlSteps`] switches each rounding step on or off (off = that step computed in f64 and
//! rounded once, or not rounded at all): the golden tests use it to measure which step accounts
//! for how much of the disagreement with llama.cpp. Only f16 caches (unrotated) are served;
//! any other format is a configuration error.
//!
//! Two implementations: [`attention`] here is scalar, the reference (parallel over (sequence,
//! kv head) on the thread pool when run through [`GgmlAttention`] with no SIMD kernel);
//! `simd` (beside it) is the same computation vectorized (AVX-512 or AVX2, chosen at run time) and
//! threaded without splitting any sum, bit-identical to it (tests compare bit patterns).
//! [`GgmlAttention`] runs `simd` for [`GgmlSteps::ALL`] and `head_dim % 16 == 0`, the
//! scalar kernel otherwise (ablations, odd head sizes, CPUs without AVX2).

use crate::expf::expf;
use half::f16;
use kvcache::{AttentionRoute, CacheCounters, KvFormat, LayerView};

#[cfg(target_arch = "x86_64")]
use std::sync::Mutex;

#[cfg(target_arch = "x86_64")]
use self::simd::GgmlWorkspace;
use super::group::QueryBounds;
use super::{AttentionError, AttentionParams, KernelIsa, PoolHandle};

#[cfg(target_arch = "x86_64")]
mod simd;
#[cfg(test)]
mod tests;

/// Environment variable choosing the attention numerics.
pub const ATTN_NUMERICS_ENV: &str = "PAGEKV_ATTN_NUMERICS";
/// Accepted values of [`ATTN_NUMERICS_ENV`].
pub const ATTN_NUMERICS_VALUES: &str = "auto, fast, ggml";

/// Which rounding steps of llama.cpp's attention to reproduce; see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GgmlSteps {
    /// Q converted to f16 before `K·Q` (off: f32 queries).
    pub f16_query: bool,
    /// `K·Q` summed in ggml's f32 order (off: in f64, rounded once).
    pub kq_order: bool,
    /// `ggml_v_expf` (off: `exp` in f64, rounded once).
    pub expf: bool,
    /// The softmax denominator summed per 16 positions in f32, then in f64 (off: all in f64).
    pub sum_order: bool,
    /// Probabilities converted to f16 before `V·p` (off: kept in f32).
    pub f16_probs: bool,
    /// `V·p` summed in ggml's f32 order (off: in f64, rounded once).
    pub kqv_order: bool,
}

impl GgmlSteps {
    /// Every step as llama.cpp rounds it.
    pub const ALL: GgmlSteps =
        GgmlSteps { f16_query: true, kq_order: true, expf: true, sum_order: true, f16_probs: true, kqv_order: true };
    /// No step: f64 sums, exact `exp`, f32 queries and probabilities (normalized before `V·p`).
    pub const NONE: GgmlSteps = GgmlSteps {
        f16_query: false,
        kq_order: false,
        expf: false,
        sum_order: false,
        f16_probs: false,
        kqv_order: false,
    };
    /// The step names, in field order (for ablation tables).
    pub const NAMES: [&'static str; 6] = ["f16_query", "kq_order", "expf", "sum_order", "f16_probs", "kqv_order"];

    /// The steps as flags, in [`Self::NAMES`] order.
    pub fn flags(&self) -> [bool; 6] {
        [self.f16_query, self.kq_order, self.expf, self.sum_order, self.f16_probs, self.kqv_order]
    }

    /// The steps from flags in [`Self::NAMES`] order.
    pub fn from_flags(f: [bool; 6]) -> GgmlSteps {
        GgmlSteps { f16_query: f[0], kq_order: f[1], expf: f[2], sum_order: f[3], f16_probs: f[4], kqv_order: f[5] }
    }
}

/// How attention rounds: the fast kernels' own numerics, llama.cpp's, or whichever of the two
/// suits the cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AttnNumerics {
    /// llama.cpp's rounding where the SIMD ggml kernel serves the cache (f16, unrotated, head_dim
    /// a multiple of 16 up to 512, a CPU with AVX2; SmolLM2's f16 decode then runs at 0.96× /
    /// 0.81× of the fast kernels' speed at 128 / 4096 tokens); the fast kernels for every other
    /// cache (see [`GgmlAttention::serves_fast`]).
    #[default]
    Auto,
    /// The router's kernels (`PAGEKV_ATTN_IMPL`).
    Fast,
    /// llama.cpp's rounding with these steps ([`GgmlSteps::ALL`] for `ggml`; see [`GgmlAttention`]),
    /// for every call: a cache of another format is an error.
    Ggml(GgmlSteps),
}

impl AttnNumerics {
    /// Parses a `PAGEKV_ATTN_NUMERICS` / `--attn-numerics` value.
    pub fn parse(value: &str) -> Result<AttnNumerics, AttentionError> {
        match value.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(AttnNumerics::Auto),
            "fast" => Ok(AttnNumerics::Fast),
            "ggml" => Ok(AttnNumerics::Ggml(GgmlSteps::ALL)),
            _ => Err(AttentionError::Config {
                name: ATTN_NUMERICS_ENV,
                value: value.to_string(),
                accepted: ATTN_NUMERICS_VALUES.to_string(),
            }),
        }
    }

    /// Parses `PAGEKV_ATTN_NUMERICS` as `lookup` gives it (default [`AttnNumerics::Auto`]).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<AttnNumerics, AttentionError> {
        match lookup(ATTN_NUMERICS_ENV) {
            Some(v) => AttnNumerics::parse(&v),
            None => Ok(AttnNumerics::Auto),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            AttnNumerics::Auto => "auto",
            AttnNumerics::Fast => "fast",
            AttnNumerics::Ggml(_) => "ggml",
        }
    }
}

/// The ggml-numerics attention operator: its steps, the instruction set of its SIMD kernel (if
/// any), the thread pool it runs on and the SIMD kernel's buffers.
pub struct GgmlAttention {
    steps: GgmlSteps,
    isa: Option<KernelIsa>,
    pool: PoolHandle,
    #[cfg(target_arch = "x86_64")]
    workspace: Mutex<GgmlWorkspace>,
}

impl GgmlAttention {
    /// With the strongest SIMD kernel this CPU runs ([`KernelIsa::detect`]).
    pub fn new(steps: GgmlSteps, pool: impl Into<PoolHandle>) -> GgmlAttention {
        GgmlAttention {
            steps,
            isa: KernelIsa::detect(),
            pool: pool.into(),
            #[cfg(target_arch = "x86_64")]
            workspace: Mutex::new(GgmlWorkspace::default()),
        }
    }

    /// Pins the SIMD kernel's instruction set (`None`: the scalar kernel for every call). An
    /// instruction set this CPU lacks also means the scalar kernel.
    pub fn with_isa(mut self, isa: Option<KernelIsa>) -> GgmlAttention {
        self.isa = isa.filter(KernelIsa::is_available);
        self
    }

    pub fn steps(&self) -> GgmlSteps {
        self.steps
    }

    /// The SIMD kernel's instruction set, if calls with every step on use one.
    pub fn isa(&self) -> Option<KernelIsa> {
        self.isa
    }

    /// Whether calls over a cache of `format` with heads of `head_dim` run the SIMD kernel: every
    /// step on, an instruction set for it, an f16 cache (unrotated, as f16 always is) and a head
    /// size it takes (a multiple of 16 up to 512). Where not, [`Self::forward`] falls to the
    /// scalar kernel (or, for another format, an error), and [`AttnNumerics::Auto`] takes the
    /// fast kernels instead.
    pub fn serves_fast(&self, format: KvFormat, head_dim: usize) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            self.isa.is_some()
                && self.steps == GgmlSteps::ALL
                && format == KvFormat::F16
                && simd::serves_head_dim(head_dim)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (format, head_dim);
            false
        }
    }

    /// Computes attention for every query of `p` over `layer` (an f16 cache) into `out`
    /// (`[num_seqs, q_len, num_heads, head_dim]`), with the dequantized tokens every path
    /// counts. The SIMD kernel counts as primitive (one pass) or partitioned (a decode row split
    /// over threads), the scalar one as the reference.
    pub fn forward(
        &self,
        layer: &LayerView,
        p: &AttentionParams,
        counters: &CacheCounters,
        out: &mut [f32],
    ) -> Result<AttentionRoute, AttentionError> {
        check(layer, p, out)?;
        let hkv = layer.num_kv_heads;
        let read: usize = (0..p.num_seqs).map(|s| QueryBounds::of(p, s).read_range().len()).sum();
        CacheCounters::add(&counters.dequantized_tokens, (read * hkv) as u64);
        #[cfg(target_arch = "x86_64")]
        if let Some(isa) = self.isa.filter(|_| self.steps == GgmlSteps::ALL && simd::serves(layer)) {
            // A poisoned lock only means a panic in an earlier call; the buffers hold no state.
            let mut ws = self.workspace.lock().unwrap_or_else(|e| e.into_inner());
            let (route, parts) = simd::attention(isa, layer, p, &self.pool, &mut ws, out);
            counters.count_route(route);
            CacheCounters::add(&counters.partitions, parts as u64);
            return Ok(route);
        }
        let out_ptr = SharedOut(out.as_mut_ptr());
        let steps = self.steps;
        self.pool.run(p.num_seqs * hkv, |task, _thread| {
            let (seq, kv_head) = (task / hkv, task % hkv);
            // SAFETY: each (seq, kv_head) task writes only its own query heads' rows of `out`,
            // which `check` sized to `[num_seqs, q_len, num_heads, head_dim]`.
            unsafe { group(layer, p, steps, seq, kv_head, out_ptr) };
        });
        counters.count_route(AttentionRoute::Reference);
        Ok(AttentionRoute::Reference)
    }
}

/// The scalar reference: [`GgmlAttention::forward`]'s result on the calling thread, bit for bit
/// (tests, one-off use).
pub fn attention(
    layer: &LayerView,
    p: &AttentionParams,
    steps: GgmlSteps,
    out: &mut [f32],
) -> Result<(), AttentionError> {
    check(layer, p, out)?;
    let out_ptr = SharedOut(out.as_mut_ptr());
    for seq in 0..p.num_seqs {
        for kv_head in 0..layer.num_kv_heads {
            // SAFETY: as in `GgmlAttention::forward`, on one thread.
            unsafe { group(layer, p, steps, seq, kv_head, out_ptr) };
        }
    }
    Ok(())
}

/// The output buffer shared by the tasks, each writing disjoint rows.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
// SAFETY: tasks write disjoint rows (see `GgmlAttention::forward`).
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

/// Checks the format (f16, unrotated), then shapes and every block the call reads as the
/// fast paths do.
fn check(layer: &LayerView, p: &AttentionParams, out: &[f32]) -> Result<(), AttentionError> {
    if layer.format != KvFormat::F16 || layer.rotation.is_some() {
        return Err(AttentionError::Config {
            name: ATTN_NUMERICS_ENV,
            value: "ggml".into(),
            accepted: format!("fast (ggml numerics need an f16 KV cache; this one is {})", layer.format.name()),
        });
    }
    super::validate(layer, p, out)
}

/// Attention of every query row of (`seq`, `kv_head`), written to its rows of `out`.
///
/// # Safety
/// `out` points to `[num_seqs, q_len, num_heads, head_dim]` floats that no other thread writes
/// in this group's rows; `check` passed.
unsafe fn group(layer: &LayerView, p: &AttentionParams, steps: GgmlSteps, seq: usize, kv_head: usize, out: SharedOut) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("fma") {
        // SAFETY: FMA was detected on this CPU; the caller upholds the rest.
        unsafe { group_fma(layer, p, steps, seq, kv_head, out) };
        return;
    }
    // SAFETY: forwarded from the caller.
    unsafe { group_body(layer, p, steps, seq, kv_head, out) }
}

/// [`group_body`] compiled with FMA instructions (elsewhere `mul_add` is a libm call).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn group_fma(
    layer: &LayerView,
    p: &AttentionParams,
    steps: GgmlSteps,
    seq: usize,
    kv_head: usize,
    out: SharedOut,
) {
    // SAFETY: forwarded from the caller.
    unsafe { group_body(layer, p, steps, seq, kv_head, out) }
}

#[inline(always)]
unsafe fn group_body(
    layer: &LayerView,
    p: &AttentionParams,
    steps: GgmlSteps,
    seq: usize,
    kv_head: usize,
    out: SharedOut,
) {
    let (d, bs) = (layer.head_dim, layer.block_size);
    let g = p.num_heads / layer.num_kv_heads;
    let bounds = QueryBounds::of(p, seq);
    let table = p.block_tables[seq];
    let range = bounds.read_range();
    let (t0, n) = (range.start, range.len());
    // ggml picks tinyBLAS (16 lanes) for a batch of several query tokens, ggml_vec_dot_f16
    // (4 × 16 lanes) for one; tinyBLAS wants k % 16 == 0 (K·Q) and m % 4 == 0 (V·p). Chosen
    // per sequence (its q_len), never by what else the call holds (see the module docs).
    let batch = p.q_len > 1;
    let kq_tiny = batch && d % 16 == 0;
    let kqv_tiny = batch && d % 4 == 0;

    // Decoded keys and values of the positions read (f16 values, exact in f32).
    let mut keys = vec![0f32; n * d]; // [n, head_dim]
    let mut values = vec![0f32; n * d]; // [n, head_dim]
    for (j, pos) in range.clone().enumerate() {
        let slot = table[pos / bs] as usize * bs + pos % bs;
        layer.keys.decode(slot, kv_head, &mut keys[j * d..(j + 1) * d]);
        layer.values.decode(slot, kv_head, &mut values[j * d..(j + 1) * d]);
    }
    let mut q = vec![0f32; d]; // [head_dim]
    let mut e = vec![0f32; n]; // [n] scores, then exponentials, then probabilities
    let mut lanes = vec![0f32; 64 * d]; // [64, head_dim] V·p accumulators (lane-major)
    let mut wide = vec![0f64; d]; // [head_dim] f64 V·p (kqv_order off)
    let mut o = vec![0f32; d]; // [head_dim]
    for i in 0..p.q_len {
        let (lo, hi) = bounds.keys_of(i);
        for h in 0..g {
            let head = kv_head * g + h;
            let src = ((seq * p.q_len + i) * p.num_heads + head) * d;
            q.copy_from_slice(&p.queries[src..src + d]);
            if steps.f16_query {
                for x in q.iter_mut() {
                    *x = f16::from_f32(*x).to_f32();
                }
            }
            // Scores of the visible positions, scaled (ggml_vec_scale_f32 after the product).
            let vis = lo - t0..hi - t0;
            let mut max = f32::NEG_INFINITY;
            for j in vis.clone() {
                let k = &keys[j * d..(j + 1) * d];
                let s = match (steps.kq_order, kq_tiny) {
                    (true, true) => dot_tinyblas(&q, k),
                    (true, false) => dot_vec_f16(&q, k),
                    (false, _) => dot_f64(&q, k),
                };
                let w = s * p.scale;
                e[j] = w;
                max = max.max(w);
            }
            for j in vis.clone() {
                let x = e[j] - max;
                e[j] = if steps.expf { expf(x) } else { (x as f64).exp() as f32 };
            }
            let sum = if steps.sum_order {
                softmax_sum(&e[vis.clone()], lo)
            } else {
                e[vis.clone()].iter().map(|&v| v as f64).sum()
            };
            let inv = (1.0 / sum) as f32;
            for v in &mut e[vis.clone()] {
                *v *= inv;
                if steps.f16_probs {
                    *v = f16::from_f32(*v).to_f32();
                }
            }
            // V·p.
            let probs = &e[vis.clone()];
            let vals = &values[vis.start * d..vis.end * d];
            match (steps.kqv_order, kqv_tiny) {
                (true, true) => pv_lanes::<16>(probs, vals, lo, d, &mut lanes, &mut o),
                (true, false) => pv_lanes::<64>(probs, vals, lo, d, &mut lanes, &mut o),
                (false, _) => {
                    wide.fill(0.0);
                    for (&pr, v) in probs.iter().zip(vals.chunks_exact(d)) {
                        for (w, &x) in wide.iter_mut().zip(v) {
                            *w += pr as f64 * x as f64;
                        }
                    }
                    for (dst, &w) in o.iter_mut().zip(&wide) {
                        *dst = w as f32;
                    }
                }
            }
            // SAFETY: this row belongs to this group (see `group`).
            unsafe { std::ptr::copy_nonoverlapping(o.as_ptr(), out.0.add(src), d) };
        }
    }
}

/// GCC's `_mm512_reduce_add_ps`: halves folded pairwise, `(x[i] + x[i+8])`, then
/// `(y[i] + y[i+4])`, `(z[i] + z[i+2])`, `z[0] + z[1]`.
#[inline(always)]
pub fn reduce16(x: &[f32; 16]) -> f32 {
    let mut y = [0f32; 8];
    for i in 0..8 {
        y[i] = x[i + 8] + x[i];
    }
    let z = [y[4] + y[0], y[5] + y[1], y[6] + y[2], y[7] + y[3]];
    (z[0] + z[2]) + (z[1] + z[3])
}

/// tinyBLAS's f32 dot product (`KN = 16`, `a.len() % 16 == 0`): lane `l` accumulates
/// `a[l + 16c] · b[l + 16c]` by FMA in order of `c`, then [`reduce16`].
#[inline(always)]
pub fn dot_tinyblas(a: &[f32], b: &[f32]) -> f32 {
    debug_assert!(a.len() == b.len() && a.len().is_multiple_of(16));
    let mut acc = [0f32; 16];
    for (ca, cb) in a.chunks_exact(16).zip(b.chunks_exact(16)) {
        for l in 0..16 {
            acc[l] = ca[l].mul_add(cb[l], acc[l]);
        }
    }
    reduce16(&acc)
}

/// `ggml_vec_dot_f16` on AVX-512: four 16-lane accumulators over steps of 64 (element `i` in
/// accumulator `(i mod 64) / 16`, lane `i mod 16`), folded `(a0 + a2) + (a1 + a3)`, then
/// [`reduce16`]; the elements past the last whole step are added one by one in f64.
#[inline(always)]
pub fn dot_vec_f16(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len();
    let np = n & !63;
    let mut acc = [[0f32; 16]; 4];
    for (sa, sb) in a[..np].chunks_exact(64).zip(b[..np].chunks_exact(64)) {
        for j in 0..4 {
            for l in 0..16 {
                acc[j][l] = sa[16 * j + l].mul_add(sb[16 * j + l], acc[j][l]);
            }
        }
    }
    let mut x = [0f32; 16];
    for l in 0..16 {
        x[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    }
    let mut s = reduce16(&x) as f64;
    for i in np..n {
        s += (a[i] * b[i]) as f64;
    }
    s as f32
}

/// The dot product in f64, rounded once.
fn dot_f64(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum::<f64>() as f32
}

/// `ggml_vec_soft_max_f32`'s denominator for exponentials `e` of positions `first..`: positions
/// are grouped by 16 from 0, each group summed by [`reduce16`] (positions outside `e` count 0)
/// and the groups added in f64.
pub fn softmax_sum(e: &[f32], first: usize) -> f64 {
    let mut sum = 0f64;
    let mut j = 0;
    while j < e.len() {
        let lane0 = (first + j) % 16;
        let take = (16 - lane0).min(e.len() - j);
        let mut x = [0f32; 16];
        x[lane0..lane0 + take].copy_from_slice(&e[j..j + take]);
        sum += reduce16(&x) as f64;
        j += take;
    }
    sum
}

/// `V·p` in ggml's order with `L` accumulator lanes over positions (16: tinyBLAS; 64:
/// `ggml_vec_dot_f16`'s four 16-lane accumulators), position `t` in lane `t mod L`, each lane
/// accumulating by FMA in position order; then the lanes are folded as the kernel folds them.
/// `probs` `[n]` and `vals` `[n, d]` are positions `first..first + n`; `lanes` is `[64, d]`.
#[inline(always)]
fn pv_lanes<const L: usize>(probs: &[f32], vals: &[f32], first: usize, d: usize, lanes: &mut [f32], o: &mut [f32]) {
    let lanes = &mut lanes[..L * d];
    lanes.fill(0.0);
    for (j, (&pr, v)) in probs.iter().zip(vals.chunks_exact(d)).enumerate() {
        let l = (first + j) % L;
        for (a, &x) in lanes[l * d..(l + 1) * d].iter_mut().zip(v) {
            *a = x.mul_add(pr, *a);
        }
    }
    for (dim, dst) in o.iter_mut().enumerate() {
        let lane = |l: usize| lanes[l * d + dim];
        let mut x = [0f32; 16];
        for (l, xl) in x.iter_mut().enumerate() {
            *xl = if L == 16 { lane(l) } else { (lane(l) + lane(l + 32)) + (lane(l + 16) + lane(l + 48)) };
        }
        *dst = reduce16(&x);
    }
}
