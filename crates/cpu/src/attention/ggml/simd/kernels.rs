//! The ggml-order kernels, written once over [`Lanes16`] (see `super` for how a call is cut
//! into them). Each one computes exactly what a step of the scalar `ggml::group_body` computes,
//! with every sum in the same order:
//!
//! - [`stage_keys`] / [`block_scores`]: the scores of 16 consecutive positions (a block aligned
//!   to absolute positions) for one query row. Each position's partial vector is built in ggml's
//!   accumulator order (`ggml_vec_dot_f16`: four accumulators over steps of 64, folded
//!   `(a0 + a2) + (a1 + a3)`; tinyBLAS: one accumulator over steps of 16), then the 16 vectors
//!   are reduced together, transposed, so the scores come out as one vector.
//! - [`softmax_row`]: max, `expf`, the denominator per block of 16 positions (`reduce16`, then
//!   f64 in block order), probabilities rounded to f16, 16 positions at a time.
//! - [`list_rows`] / [`lane_passes`] / [`fold_lanes`]: `V·p`. Position `t` belongs to lane
//!   `t mod L` (64 for `ggml_vec_dot_f16`, 16 for tinyBLAS) and each lane accumulates its
//!   positions in order by FMA, for every output dimension at once. The value rows' addresses
//!   are first listed lane-major (`[L][positions / L]`) so a lane walks its positions in order
//!   straight from the pages; a lane pass keeps the accumulators of up to 4 heads × 4 vectors
//!   of 16 dimensions in registers;
//!   the fold adds the lanes as the kernel does (`(l, l+32) + (l+16, l+48)`, then `reduce16`),
//!   vertically, 16 dimensions at a time.
//! - [`position_pass`]: the same lane sums for long decode rows, walked in position order
//!   (position `t` adds into lane `t mod 64`'s accumulators, kept in L1), so the value pages are
//!   read front to back; each lane still sums its positions in increasing order.

use super::lanes::Lanes16;

/// Copies the keys of a block's 16 positions as f32 into `kf` (`[16, d]`); a null row is a
/// position the block does not read (zeros, its score is masked).
///
/// # Safety
/// Non-null rows hold `d` f16 values; `kf` holds `16·d` floats; `d % 16 == 0`; the ISA of `V`.
#[inline(always)]
pub(crate) unsafe fn stage_keys<V: Lanes16>(rows: &[*const u16; 16], d: usize, kf: *mut f32) {
    unsafe {
        for (j, &row) in rows.iter().enumerate() {
            let dst = kf.add(j * d);
            for c in 0..d / 16 {
                let x = if row.is_null() { V::zero() } else { V::load_f16(row.add(16 * c)) };
                x.store(dst.add(16 * c));
            }
        }
    }
}

/// `out[j] = scale · (q · k_j)` for the 16 staged keys `kf` (`[16, d]`), each dot product in
/// `ggml_vec_dot_f16`'s order (`vec_dot`; elements past the last step of 64 added in f64) or
/// tinyBLAS's (`d % 16 == 0` either way).
///
/// # Safety
/// `q` holds `d` floats, `kf` `16·d`, `out` 16; the ISA of `V`.
#[inline(always)]
pub(crate) unsafe fn block_scores<V: Lanes16>(
    vec_dot: bool,
    q: *const f32,
    kf: *const f32,
    d: usize,
    scale: f32,
    out: *mut f32,
) {
    unsafe {
        let mut x = [V::zero().fold_half(); 16];
        let np = if vec_dot { d & !63 } else { d };
        if vec_dot {
            for (j, xj) in x.iter_mut().enumerate() {
                let k = kf.add(j * d);
                let mut a = [V::zero(); 4];
                let mut i = 0;
                while i < np {
                    for (c, ac) in a.iter_mut().enumerate() {
                        *ac = V::fma(V::load(q.add(i + 16 * c)), V::load(k.add(i + 16 * c)), *ac);
                    }
                    i += 64;
                }
                *xj = a[0].add(a[2]).add(a[1].add(a[3])).fold_half();
            }
        } else {
            for (j, xj) in x.iter_mut().enumerate() {
                let k = kf.add(j * d);
                let mut a = V::zero();
                for c in 0..d / 16 {
                    a = V::fma(V::load(q.add(16 * c)), V::load(k.add(16 * c)), a);
                }
                *xj = a.fold_half();
            }
        }
        let s = V::reduce_transposed(&x);
        if np < d {
            // ggml_vec_dot_f16's leftovers: added one by one in f64 after the vector sum.
            let mut t = [0f32; 16];
            s.store(t.as_mut_ptr());
            for (j, tj) in t.iter_mut().enumerate() {
                let mut acc = *tj as f64;
                for i in np..d {
                    acc += (*q.add(i) * *kf.add(j * d + i)) as f64;
                }
                *tj = acc as f32;
            }
            V::load(t.as_ptr()).mul(V::splat(scale)).store(out);
        } else {
            s.mul(V::splat(scale)).store(out);
        }
    }
}

/// The partial vectors of a block's 16 positions for `g` query rows `q` (`[g, 16·NV]`), when
/// `head_dim = 16·NV` is a multiple of 64 (so `ggml_vec_dot_f16` has no leftovers): each key row
/// is converted once into registers and serves every row. `keys[j]`: position `j`'s f16 key row
/// (`staged` false) or its staged f32 row (`staged` true); null: a position the block does not
/// read (zeros). `xs[(h·16 + j)·16..]` ← row `h`, position `j` (see [`partial_scores`]).
///
/// # Safety
/// Non-null rows hold `16·NV` values; `q` holds `g` rows, `xs` `g·256` floats; the ISA of `V`.
#[inline(always)]
pub(crate) unsafe fn block_partials<V: Lanes16, const NV: usize>(
    vec_dot: bool,
    staged: bool,
    keys: &[*const u8; 16],
    q: *const f32,
    g: usize,
    xs: *mut f32,
) {
    debug_assert!(!vec_dot || NV.is_multiple_of(4));
    unsafe {
        for (j, &row) in keys.iter().enumerate() {
            if row.is_null() {
                for h in 0..g {
                    V::store_half(V::zero().fold_half(), xs.add((h * 16 + j) * 16));
                }
                continue;
            }
            let mut k = [V::zero(); NV];
            for (c, kc) in k.iter_mut().enumerate() {
                *kc = if staged {
                    V::load(row.cast::<f32>().add(16 * c))
                } else {
                    V::load_f16(row.cast::<u16>().add(16 * c))
                };
            }
            for h in 0..g {
                let qh = q.add(h * 16 * NV);
                let x = if vec_dot {
                    // Accumulator c mod 4 takes vector c (steps of 64 in order).
                    let mut a = [V::zero(); 4];
                    for (c, &kc) in k.iter().enumerate() {
                        a[c % 4] = V::fma(V::load(qh.add(16 * c)), kc, a[c % 4]);
                    }
                    a[0].add(a[2]).add(a[1].add(a[3]))
                } else {
                    let mut a = V::zero();
                    for (c, &kc) in k.iter().enumerate() {
                        a = V::fma(V::load(qh.add(16 * c)), kc, a);
                    }
                    a
                };
                V::store_half(x.fold_half(), xs.add((h * 16 + j) * 16));
            }
        }
    }
}

/// `out[j] = scale · reduce16(partial j)` for the 16 partials [`block_partials`] left at `xs`
/// for one row.
///
/// # Safety
/// `xs` holds 256 floats, `out` 16; the ISA of `V`.
#[inline(always)]
pub(crate) unsafe fn partial_scores<V: Lanes16>(xs: *const f32, scale: f32, out: *mut f32) {
    unsafe {
        let mut x = [V::zero().fold_half(); 16];
        for (j, xj) in x.iter_mut().enumerate() {
            *xj = V::load_half(xs.add(16 * j));
        }
        V::reduce_transposed(&x).mul(V::splat(scale)).store(out);
    }
}

/// One query row's softmax over `blocks` blocks of 16 scaled scores `src` (positions outside
/// the row's keys hold −∞): `dst` ← the probabilities rounded to f16 (0 outside). `src` may be
/// `dst`.
///
/// # Safety
/// `src` and `dst` hold `16·blocks` floats (`blocks ≥ 1`, some score finite); the ISA of `V`.
#[inline(always)]
pub(crate) unsafe fn softmax_row<V: Lanes16>(src: *const f32, dst: *mut f32, blocks: usize) {
    unsafe {
        let mut m = V::splat(f32::NEG_INFINITY);
        for b in 0..blocks {
            m = m.max(V::load(src.add(16 * b)));
        }
        let neg_max = V::splat(-m.max_lane());
        let mut sum = 0f64;
        for b in 0..blocks {
            let e = V::load(src.add(16 * b)).add(neg_max).expf();
            e.store(dst.add(16 * b));
            sum += e.reduce() as f64;
        }
        let inv = V::splat((1.0 / sum) as f32);
        for b in 0..blocks {
            V::load(dst.add(16 * b)).mul(inv).round_f16().store(dst.add(16 * b));
        }
    }
}

/// Lists value rows lane-major: `list[(t mod lanes) · ns + (t − s0) / lanes]` ← `row(t)` (as
/// an address) for `t` in `t0..t1`, where `s0 ≤ t0` is a multiple of `lanes`: a lane's
/// positions are then consecutive entries, read in order by [`lane_passes`] straight from the
/// pages.
///
/// # Safety
/// `list` holds `lanes · ns` entries covering `t0..t1`.
#[inline(always)]
pub(crate) unsafe fn list_rows(
    row: impl Fn(usize) -> *const u16,
    t0: usize,
    t1: usize,
    s0: usize,
    lanes: usize,
    ns: usize,
    list: *mut usize,
) {
    debug_assert!(s0 <= t0 && s0.is_multiple_of(lanes) && lanes.is_power_of_two());
    for t in t0..t1 {
        // SAFETY: inside the list (caller's contract).
        unsafe { *list.add((t & (lanes - 1)) * ns + (t - s0) / lanes) = row(t) as usize };
    }
}

/// One lane of one row group: `out[h][c] = Σ_k v_k[c] · p[h][k · step]` accumulated by FMA in
/// order of `k`, from 0, for `NH` heads and `NV` vectors of 16 dimensions. `v[k]` is the
/// address of the lane's `k`-th value row (read from dimension `col`), `p[h]` head `h`'s
/// probability of the lane's first position.
///
/// # Safety
/// `count` rows listed in `v`, each with `col + 16·NV` values; `p[h]` readable at `k · step`
/// for `k < count`; `out[h]` holds `16·NV` floats; the ISA of `V`.
#[inline(always)]
unsafe fn lane_pass<V: Lanes16, const NH: usize, const NV: usize>(
    v: *const usize,
    col: usize,
    count: usize,
    p: &[*const f32; 4],
    step: usize,
    out: &[*mut f32; 4],
) {
    unsafe {
        let mut acc = [[V::zero(); NV]; NH];
        for k in 0..count {
            let row = (*v.add(k) as *const u16).add(col);
            let mut x = [V::zero(); NV];
            for (c, xc) in x.iter_mut().enumerate() {
                *xc = V::load_f16(row.add(16 * c));
            }
            for (h, acc) in acc.iter_mut().enumerate() {
                let w = V::splat(*p[h].add(k * step));
                for (a, &xc) in acc.iter_mut().zip(&x) {
                    *a = V::fma(xc, w, *a);
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            for (c, a) in acc.iter().enumerate() {
                a.store(out[h].add(16 * c));
            }
        }
    }
}

/// [`lane_pass`] for every head and every vector of the staged dimensions of one lane, in
/// passes of at most 4 heads × `max_nv` vectors (the register budget of the ISA).
/// `v`: the lane's row addresses, each row read from dimension `col` for `dc` values;
/// `p[h]`: head `h`'s first probability; `out[h]`: head `h`'s lane accumulators (`dc` floats).
///
/// # Safety
/// As [`lane_pass`] for each pass; `p` and `out` hold `heads` pointers.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn lane_passes<V: Lanes16>(
    max_nv: usize,
    heads: usize,
    v: *const usize,
    col: usize,
    dc: usize,
    count: usize,
    p: &[*const f32],
    step: usize,
    out: &[*mut f32],
) {
    let nvec = dc / 16;
    let mut h0 = 0;
    while h0 < heads {
        let nh = (heads - h0).min(4);
        let mut pp = [std::ptr::null::<f32>(); 4];
        pp[..nh].copy_from_slice(&p[h0..h0 + nh]);
        let mut c0 = 0;
        while c0 < nvec {
            let nv = [4, 2, 1].into_iter().find(|&n| n <= max_nv && c0 + n <= nvec).unwrap_or(1);
            let mut oo = [std::ptr::null_mut::<f32>(); 4];
            for (o, &dst) in oo.iter_mut().zip(&out[h0..h0 + nh]) {
                // SAFETY: inside head h's `dc` floats.
                *o = unsafe { dst.add(16 * c0) };
            }
            // SAFETY: forwarded contract; `col + 16·c0` starts the pass's columns of each row.
            unsafe {
                let col = col + 16 * c0;
                macro_rules! go {
                    ($($nh:literal, $nv:literal);*) => {
                        match (nh, nv) {
                            $(($nh, $nv) => lane_pass::<V, $nh, $nv>(v, col, count, &pp, step, &oo),)*
                            _ => unreachable!("passes are 1..=4 heads × 1, 2 or 4 vectors"),
                        }
                    };
                }
                go!(1, 1; 2, 1; 3, 1; 4, 1; 1, 2; 2, 2; 3, 2; 4, 2; 1, 4; 2, 4; 3, 4; 4, 4);
            }
            c0 += nv;
        }
        h0 += nh;
    }
}

/// Folds the `lanes` (16 or 64) lane accumulators of one head into `out` (`nvec` vectors of 16
/// dimensions): 64 lanes as `(l + (l+32)) + ((l+16) + (l+48))` first, then `reduce16` across
/// the 16 lanes left, vertically. Lane `l`'s vector `c` is at `acc + l · lane_stride + 16c`.
///
/// # Safety
/// Those vectors are readable; `out` holds `16·nvec` floats; the ISA of `V`.
#[inline(always)]
pub(crate) unsafe fn fold_lanes<V: Lanes16>(
    acc: *const f32,
    lane_stride: usize,
    lanes: usize,
    nvec: usize,
    out: *mut f32,
) {
    debug_assert!(lanes == 16 || lanes == 64);
    unsafe {
        for c in 0..nvec {
            let at = acc.add(16 * c);
            let mut x = [V::zero(); 16];
            for (l, xl) in x.iter_mut().enumerate() {
                let a = V::load(at.add(l * lane_stride));
                *xl = if lanes == 64 {
                    let a32 = V::load(at.add((l + 32) * lane_stride));
                    let a16 = V::load(at.add((l + 16) * lane_stride));
                    let a48 = V::load(at.add((l + 48) * lane_stride));
                    a.add(a32).add(a16.add(a48))
                } else {
                    a
                };
            }
            let mut y = [V::zero(); 8];
            for i in 0..8 {
                y[i] = x[i].add(x[i + 8]);
            }
            let z = [y[0].add(y[4]), y[1].add(y[5]), y[2].add(y[6]), y[3].add(y[7])];
            z[0].add(z[2]).add(z[1].add(z[3])).store(out.add(16 * c));
        }
    }
}

/// Positions ahead whose value rows [`position_pass`] prefetches (in the model at 4096
/// positions, decode on 2 threads: 8, 32, 64 and 128 ahead measured alike within noise, ~84–86
/// tok/s; no prefetch ~75–78).
const PREFETCH_POSITIONS: usize = 32;

/// `V·p` of the 64-lane (`ggml_vec_dot_f16`) order, walked in position order: for each listed
/// position `k` (`list[k]`: its value row's address; lane `(l0 + k) mod 64`), `acc[lane][h] +=
/// v_k[col..col + 16·NV] · p[h · pstride + k]` by FMA for each of `g` heads. Each lane's sum is still the
/// FMA chain over its positions in increasing order, from 0 (the caller zeroes `acc`), exactly
/// as [`lane_pass`] builds it; only the interleaving of the lanes changes, so the pages are
/// read front to back (the hardware prefetchers follow; rows `PREFETCH_POSITIONS` ahead are
/// also prefetched). `acc` is `[64, g, 16·NV]`.
///
/// # Safety
/// `count` rows listed, each with `col + 16·NV` values; `p + h · pstride` (`h < g`) holds
/// `count` floats;
/// `acc` holds `64·g·16·NV` floats; the ISA of `V`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn position_pass<V: Lanes16, const NV: usize>(
    list: *const usize,
    col: usize,
    count: usize,
    l0: usize,
    p: *const f32,
    pstride: usize,
    g: usize,
    acc: *mut f32,
) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let lane_stride = g * 16 * NV;
    unsafe {
        for k in 0..count {
            if k + PREFETCH_POSITIONS < count {
                let ahead = (*list.add(k + PREFETCH_POSITIONS) as *const u16).add(col);
                _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
            }
            let row = (*list.add(k) as *const u16).add(col);
            let mut x = [V::zero(); NV];
            for (c, xc) in x.iter_mut().enumerate() {
                *xc = V::load_f16(row.add(16 * c));
            }
            let a = acc.add(((l0 + k) & 63) * lane_stride);
            for h in 0..g {
                let w = V::splat(*p.add(h * pstride + k));
                let ah = a.add(h * 16 * NV);
                for (c, &xc) in x.iter().enumerate() {
                    V::fma(xc, w, V::load(ah.add(16 * c))).store(ah.add(16 * c));
                }
            }
        }
    }
}
