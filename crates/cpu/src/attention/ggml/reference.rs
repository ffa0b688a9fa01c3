//! The scalar ggml-numerics kernel: the reference the SIMD kernel (`simd/`) is compared with
//! bit for bit, and the kernel for what the SIMD one does not serve (ablation steps, head sizes
//! that are not a multiple of 16, CPUs without AVX2). One (sequence, kv head) group at a time,
//! each sum in the order the parent module's docs give.

use half::f16;
use kvcache::{KvFormat, LayerView};

use super::steps::GgmlSteps;
use crate::attention::config::ATTN_NUMERICS_ENV;
use crate::attention::error::AttentionError;
use crate::attention::group::QueryBounds;
use crate::attention::params::AttentionParams;
use crate::attention::validate::validate;
use crate::expf::expf;
use crate::threadpool::ThreadPool;

/// The scalar reference on the calling thread: `out` (`[num_seqs, q_len, num_heads,
/// head_dim]`) ← attention of `p` over `layer` (an f16 cache) rounded as `steps` say.
pub fn attention(
    layer: &LayerView,
    p: &AttentionParams,
    steps: GgmlSteps,
    out: &mut [f32],
) -> Result<(), AttentionError> {
    check_format(layer)?;
    validate(layer, p, out)?;
    let out_ptr = SharedOut(out.as_mut_ptr());
    for seq in 0..p.num_seqs {
        for kv_head in 0..layer.num_kv_heads {
            // SAFETY: `validate` sized `out`; one thread writes every group's rows in turn.
            unsafe { group(layer, p, steps, seq, kv_head, out_ptr) };
        }
    }
    Ok(())
}

/// [`attention`] with the (sequence, kv head) groups run in parallel on `pool`: the same bits.
/// The caller validated the call and ran [`check_format`].
pub(super) fn attention_on(
    pool: &ThreadPool,
    layer: &LayerView,
    p: &AttentionParams,
    steps: GgmlSteps,
    out: &mut [f32],
) {
    let hkv = layer.num_kv_heads;
    let out_ptr = SharedOut(out.as_mut_ptr());
    pool.run(p.num_seqs * hkv, |task, _thread| {
        let (seq, kv_head) = (task / hkv, task % hkv);
        // SAFETY: each (seq, kv_head) task writes only its own query heads' rows of `out`,
        // which `validate` sized to `[num_seqs, q_len, num_heads, head_dim]`.
        unsafe { group(layer, p, steps, seq, kv_head, out_ptr) };
    });
}

/// The output buffer shared by the tasks, each writing disjoint rows.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
// SAFETY: tasks write disjoint rows (see `attention_on`).
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

/// Checks the format: the ggml kernels serve f16 caches (unrotated) only.
pub(super) fn check_format(layer: &LayerView) -> Result<(), AttentionError> {
    if layer.format != KvFormat::F16 || layer.rotation.is_some() {
        return Err(AttentionError::Config {
            name: ATTN_NUMERICS_ENV,
            value: "ggml".into(),
            accepted: format!("fast (ggml numerics need an f16 KV cache; this one is {})", layer.format.name()),
        });
    }
    Ok(())
}

/// Attention of every query row of (`seq`, `kv_head`), written to its rows of `out`.
///
/// # Safety
/// `out` points to `[num_seqs, q_len, num_heads, head_dim]` floats that no other thread writes
/// in this group's rows; the call was validated and its format checked.
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
