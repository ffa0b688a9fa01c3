//! What the whole-row tasks and the split decode share: one call's arguments ([`Call`]), how it
//! is cut ([`Plan`]), and the steps both run per 16-position block (the page row of a position,
//! the f16 queries, a block's keys and scores).

use kvcache::{LayerView, PlaneView};

use super::kernels::{block_partials, block_scores, partial_scores, stage_keys};
use super::lanes::Lanes16;
use crate::attention::params::AttentionParams;
use crate::attention::workspace::SyncPtr;

/// How one call is cut into tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Plan {
    /// One task per (sequence, kv head, run of `tokens` query tokens).
    Whole { runs: usize, tokens: usize },
    /// Decode in `shares` shares of the 16-position blocks (see [`decode`]).
    Shares { shares: usize },
}

/// What every task of a call reads.
pub(super) struct Call<'a> {
    pub(super) layer: &'a LayerView<'a>,
    pub(super) p: &'a AttentionParams<'a>,
    pub(super) d: usize,
    pub(super) group: usize,
    /// `ggml_vec_dot_f16`'s order (q_len 1) or tinyBLAS's.
    pub(super) vec_dot: bool,
    /// `V·p` lanes: 64 or 16.
    pub(super) lanes: usize,
    pub(super) plan: Plan,
    pub(super) out: SyncPtr,
}

/// f16 code row of (`t`, `kv_head`) in `plane`, through the sequence's block table.
#[inline(always)]
pub(super) fn row(plane: &PlaneView, table: &[u32], bs: usize, kv_head: usize, t: usize) -> *const u16 {
    // Block sizes are powers of two (8, 16, 32): a shift and a mask, not a division.
    let slot = if bs.is_power_of_two() {
        table[t >> bs.trailing_zeros()] as usize * bs + (t & (bs - 1))
    } else {
        table[t / bs] as usize * bs + t % bs
    };
    // Validated: every block the call reads is in the pool, so the row is inside `codes`.
    plane.codes[(slot * plane.num_kv_heads + kv_head) * plane.code_bytes..].as_ptr().cast()
}

/// Rows `(i − i0) · group + h` of `q` ← query (token `i`, head `kv_head · group + h`) of `seq`,
/// rounded to f16, for tokens `i0..i1`.
#[inline(always)]
pub(super) unsafe fn prepare_queries<V: Lanes16>(
    c: &Call,
    seq: usize,
    kv_head: usize,
    i0: usize,
    i1: usize,
    q: *mut f32,
) {
    let (p, d, g) = (c.p, c.d, c.group);
    for i in i0..i1 {
        for h in 0..g {
            let src = ((seq * p.q_len + i) * p.num_heads + kv_head * g + h) * d;
            let dst = ((i - i0) * g + h) * d;
            for k in 0..d / 16 {
                // SAFETY: `src` is a validated query row; `q` holds the task's rows.
                unsafe { V::load(p.queries[src + 16 * k..].as_ptr()).round_f16().store(q.add(dst + 16 * k)) };
            }
        }
    }
}

/// Whether `head_dim` takes [`block_partials`] (key rows held in registers; 64 or 128).
#[inline(always)]
pub(super) fn key_rows_in_registers(d: usize) -> bool {
    d == 64 || d == 128
}

/// The keys of the block at `t0` for positions of `u0..u1`: their f16 page rows (null
/// elsewhere), or, when `staged` (several query tokens share the block) or the head size
/// needs [`block_scores`], their f32 rows staged in `kf` (zeros elsewhere).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn block_keys<V: Lanes16>(
    c: &Call,
    seq: usize,
    kv_head: usize,
    t0: usize,
    u0: usize,
    u1: usize,
    staged: bool,
    kf: *mut f32,
) -> [*const u8; 16] {
    let (layer, table) = (c.layer, c.p.block_tables[seq]);
    let mut rows = [std::ptr::null::<u16>(); 16];
    for (j, r) in rows.iter_mut().enumerate() {
        let t = t0 + j;
        if (u0..u1).contains(&t) {
            *r = row(&layer.keys, table, layer.block_size, kv_head, t);
        }
    }
    if !staged && key_rows_in_registers(c.d) {
        return rows.map(|r| r.cast());
    }
    // SAFETY: non-null rows are f16 rows of head_dim values; `kf` holds 16 rows.
    unsafe { stage_keys::<V>(&rows, c.d, kf) };
    std::array::from_fn(|j| kf.wrapping_add(j * c.d).cast_const().cast())
}

/// The scores of one query token's `group` rows `q` (seeing keys `lo..hi`) for the block at
/// `t0` whose keys [`block_keys`] gave (`staged` as passed to it): `dst(h)` ← row `h`'s 16
/// scores, −∞ at positions outside `lo..hi`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn score_block<V: Lanes16>(
    c: &Call,
    keys: &[*const u8; 16],
    staged: bool,
    q: *const f32,
    xs: *mut f32,
    t0: usize,
    lo: usize,
    hi: usize,
    dst: impl Fn(usize) -> *mut f32,
) {
    let (d, g) = (c.d, c.group);
    // SAFETY: caller's buffers: `q` holds the rows, `xs` 256 floats per row, `dst(h)` 16.
    unsafe {
        match d {
            64 => block_partials::<V, 4>(c.vec_dot, staged, keys, q, g, xs),
            128 => block_partials::<V, 8>(c.vec_dot, staged, keys, q, g, xs),
            _ => {}
        }
        for h in 0..g {
            let out = dst(h);
            if key_rows_in_registers(d) {
                partial_scores::<V>(xs.add(h * 256), c.p.scale, out);
            } else {
                block_scores::<V>(c.vec_dot, q.add(h * d), keys[0].cast(), d, c.p.scale, out);
            }
            if t0 < lo || t0 + 16 > hi {
                for j in 0..16 {
                    if !(lo..hi).contains(&(t0 + j)) {
                        *out.add(j) = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }
}
