//! The forward pass's element-wise steps over a batch's rows (norms, bias and residual adds,
//! RoPE, the gated activations), split across the thread pool.
//!
//! In a prefill these steps are a tenth to a fifth of the work; run on the calling thread alone
//! they leave the other threads idle between the matrix products. Each step splits its rows into
//! tasks of at least [`MIN_TASK_VALUES`] values, so a decode step (one row) runs inline, without
//! a dispatch. The per-row arithmetic is [`super::ops`]'s (and `silu.rs`/`gelu.rs`'s), unchanged:
//! results do not depend on how the rows are split.

use pagekv_cpu::threadpool::ThreadPool;

use super::config::Activation;
use super::gelu::gelu_mul;
use super::ops::{add_in_place, rms_norm, rms_norm_chunks, Rope};
use super::silu::silu_mul;

/// The fewest values one task handles: below this a dispatch to the pool costs more than the
/// work it spreads (a few microseconds against a few nanoseconds per value).
const MIN_TASK_VALUES: usize = 16 * 1024;

/// Rows of `width` values per task for `n` rows: about four tasks per thread (so a late thread
/// still finds work), never under [`MIN_TASK_VALUES`] values, never zero.
fn rows_per_task(pool: &ThreadPool, n: usize, width: usize) -> usize {
    let by_size = MIN_TASK_VALUES.div_ceil(width.max(1));
    let by_threads = n.div_ceil(4 * pool.n_threads());
    by_size.max(by_threads).max(1)
}

/// `out[r] = rms_norm(x[r]) · w` for each row `r` of `x` (`[n, w.len()]`); `out` is `[n, w.len()]`.
pub fn norm_rows(pool: &ThreadPool, x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let width = w.len();
    debug_assert!(x.len() == out.len() && x.len().is_multiple_of(width));
    let rows = rows_per_task(pool, x.len() / width, width);
    pool.for_each_chunk_mut(out, rows * width, |t, out| {
        let x = &x[t * rows * width..][..out.len()];
        for (o, xr) in out.chunks_exact_mut(width).zip(x.chunks_exact(width)) {
            rms_norm(xr, w, eps, o);
        }
    });
}

/// In place, each `w.len()`-sized chunk of `x` (`[n, width]`, `width` a multiple of `w.len()`)
/// RMS-normed and scaled by `w` (per-head q/k norms, Gemma's post-norms).
pub fn norm_chunks(pool: &ThreadPool, x: &mut [f32], width: usize, w: &[f32], eps: f32) {
    debug_assert!(width.is_multiple_of(w.len()) && x.len().is_multiple_of(width));
    let rows = rows_per_task(pool, x.len() / width, width);
    pool.for_each_chunk_mut(x, rows * width, |_, x| rms_norm_chunks(x, w, eps));
}

/// `x += y`, element-wise.
pub fn add(pool: &ThreadPool, x: &mut [f32], y: &[f32]) {
    debug_assert_eq!(x.len(), y.len());
    let chunk = rows_per_task(pool, x.len(), 1);
    pool.for_each_chunk_mut(x, chunk, |t, x| add_in_place(x, &y[t * chunk..][..x.len()]));
}

/// `f(row)` for each row of `x` (`[n, width]`), rows split over the pool's threads.
fn each_row(pool: &ThreadPool, x: &mut [f32], width: usize, f: impl Fn(&mut [f32]) + Sync) {
    debug_assert!(x.len().is_multiple_of(width));
    let rows = rows_per_task(pool, x.len() / width, width);
    pool.for_each_chunk_mut(x, rows * width, |_, x| x.chunks_exact_mut(width).for_each(&f));
}

/// `x[r] += bias` for each row `r` of `x` (`[n, bias.len()]`).
pub fn add_bias(pool: &ThreadPool, x: &mut [f32], bias: &[f32]) {
    each_row(pool, x, bias.len(), |row| add_in_place(row, bias));
}

/// `x[r] -= bias` for each row `r` of `x` (`[n, bias.len()]`).
pub fn sub_bias(pool: &ThreadPool, x: &mut [f32], bias: &[f32]) {
    each_row(pool, x, bias.len(), |row| row.iter_mut().zip(bias).for_each(|(v, b)| *v -= b));
}

/// `x *= s`, element-wise.
pub fn scale(pool: &ThreadPool, x: &mut [f32], s: f32) {
    let chunk = rows_per_task(pool, x.len(), 1);
    pool.for_each_chunk_mut(x, chunk, |_, x| x.iter_mut().for_each(|v| *v *= s));
}

/// `gate ← act(gate) · up`, element-wise ([`silu_mul`] or [`gelu_mul`]).
pub fn gated(pool: &ThreadPool, act: Activation, gate: &mut [f32], up: &[f32]) {
    debug_assert_eq!(gate.len(), up.len());
    let chunk = rows_per_task(pool, gate.len(), 1);
    pool.for_each_chunk_mut(gate, chunk, |t, g| {
        let u = &up[t * chunk..][..g.len()];
        match act {
            Activation::Silu => silu_mul(g, u),
            Activation::GeluTanh => gelu_mul(g, u),
        }
    });
}

/// Rotates the heads of each row of `q` (`[n, q_width]`) and `k` (`[n, k_width]`) by the
/// position of its row (`positions: [n]`). `table` is scratch: it holds each row's angles
/// (`[n, rope.angles_len()]`), computed once and used for both.
pub fn rope(pool: &ThreadPool, rope: &Rope, positions: &[u32], q: &mut [f32], k: &mut [f32], table: &mut Vec<f32>) {
    let n = positions.len();
    let per = rope.angles_len();
    debug_assert!(q.len().is_multiple_of(n.max(1)) && k.len().is_multiple_of(n.max(1)));
    table.resize(n * per, 0.0);
    let rows = rows_per_task(pool, n, per + q.len() / n.max(1));
    pool.for_each_chunk_mut(&mut table[..n * per], rows * per, |t, cs| {
        for (i, row) in cs.chunks_exact_mut(per).enumerate() {
            rope.angles(positions[t * rows + i] as usize, row);
        }
    });
    let table = &table[..n * per];
    for x in [q, k] {
        let width = x.len() / n.max(1);
        let rows = rows_per_task(pool, n, width);
        pool.for_each_chunk_mut(x, rows * width, |t, x| {
            for (i, row) in x.chunks_exact_mut(width).enumerate() {
                rope.rotate(row, &table[(t * rows + i) * per..][..per]);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llama::config::RopeStyle;

    /// Values that exercise every step: signs, magnitudes over several octaves.
    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32 - 0.5) * 8.0
            })
            .collect()
    }

    /// Every step equals its one-thread, row-by-row form bit for bit, for row counts around the
    /// task sizes (one row, a partial task, several tasks with a short last one).
    #[test]
    fn parallel_steps_equal_the_row_by_row_ones() {
        let pool = ThreadPool::new(3);
        let width = 640;
        for n in [1, 7, 26, 27, 100] {
            let x = values(n * width, n as u32);
            let w = values(width, 99);
            let mut got = vec![0.0; n * width];
            norm_rows(&pool, &x, &w, 1e-6, &mut got);
            let mut want = vec![0.0; n * width];
            for r in 0..n {
                rms_norm(&x[r * width..][..width], &w, 1e-6, &mut want[r * width..][..width]);
            }
            assert_eq!(got, want, "norm_rows, {n} rows");

            let hw = &w[..64];
            let (mut got, mut want) = (x.clone(), x.clone());
            norm_chunks(&pool, &mut got, width, hw, 1e-6);
            rms_norm_chunks(&mut want, hw, 1e-6);
            assert_eq!(got, want, "norm_chunks, {n} rows");

            let y = values(n * width, 7);
            let (mut got, mut want) = (x.clone(), x.clone());
            add(&pool, &mut got, &y);
            add_in_place(&mut want, &y);
            assert_eq!(got, want, "add, {n} rows");

            let (mut got, mut want) = (x.clone(), x.clone());
            add_bias(&pool, &mut got, &w);
            want.chunks_exact_mut(width).for_each(|r| add_in_place(r, &w));
            assert_eq!(got, want, "add_bias, {n} rows");

            for act in [Activation::Silu, Activation::GeluTanh] {
                let (mut got, mut want) = (x.clone(), x.clone());
                gated(&pool, act, &mut got, &y);
                match act {
                    Activation::Silu => silu_mul(&mut want, &y),
                    Activation::GeluTanh => gelu_mul(&mut want, &y),
                }
                assert_eq!(got, want, "{act:?}, {n} rows");
            }

            let r = Rope::new(RopeStyle::Neox, 64, 64, 10000.0, 1.0, None);
            let positions: Vec<u32> = (0..n as u32).map(|i| 3 * i + 5).collect();
            let k0 = values(n * 128, 3);
            let (mut q, mut k, mut table) = (x.clone(), k0.clone(), Vec::new());
            rope(&pool, &r, &positions, &mut q, &mut k, &mut table);
            let (mut wq, mut wk) = (x.clone(), k0.clone());
            for (i, &p) in positions.iter().enumerate() {
                r.apply(&mut wq[i * width..][..width], p as usize);
                r.apply(&mut wk[i * 128..][..128], p as usize);
            }
            assert_eq!((q, k), (wq, wk), "rope, {n} rows");
        }
    }
}
