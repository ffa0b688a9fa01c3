//! The QK and PV kernels of one tile for a block of up to four query rows
//! ([`super::super::tile`] drives them), generic over the blocking:
//!
//! - [`scores`] keeps `TOK` tokens × `R` rows accumulators over the head dimension (`TOK` = 2
//!   with 16 registers, 4 with 32) and reduces each 2 tokens × 4 rows with one transpose-add
//!   tree (6 `hadd` + 2 permutes + 1 add) straight into the `sc` layout `[token][4]`: no
//!   horizontal sum per token.
//! - [`accumulate`] keeps `R` rows × `CH` codec chunks (16 dimensions each) in registers
//!   while it walks the tile's tokens (`CH` = 1 with 16 registers, 2 with 32).
//!
//! Both keep at least eight independent FMA chains (four-cycle latency, two FMAs per cycle).
//! The functions are `#[inline(always)]` and take the instruction set of their caller.

use std::arch::x86_64::*;

use super::codecs::RowCodec;
use crate::attention::tile::{NextRows, MAX_GROUPS, MAX_VALUE_GROUPS, TILE};

/// Sums each of eight vectors into `[a0 a1 a2 a3 | b0 b1 b2 b3]` (`a`: token t's rows,
/// `b`: token t+1's).
#[inline(always)]
unsafe fn reduce8(a: [__m256; 4], b: [__m256; 4]) -> __m256 {
    unsafe {
        let h0 = _mm256_hadd_ps(a[0], a[1]);
        let h1 = _mm256_hadd_ps(a[2], a[3]);
        let h2 = _mm256_hadd_ps(b[0], b[1]);
        let h3 = _mm256_hadd_ps(b[2], b[3]);
        let g0 = _mm256_hadd_ps(h0, h1);
        let g1 = _mm256_hadd_ps(h2, h3);
        _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(g0, g1), _mm256_permute2f128_ps::<0x31>(g0, g1))
    }
}

/// The tokens `t .. t + TOK` of a scores step and their key rows, tokens past `t1` repeating
/// the last one (their lanes are masked later); prefetches `next`'s rows at the real ones.
/// Plain loops, no closures: a closure would not carry the caller's target features.
///
/// # Safety
/// `t < t1 ≤ TILE`; `krows[..t1]` are valid row pointers.
#[inline(always)]
pub(crate) unsafe fn step_tokens<const TOK: usize>(
    krows: &[*const u8; TILE],
    t: usize,
    t1: usize,
    next: &NextRows,
) -> ([usize; TOK], [*const u8; TOK]) {
    let mut tok = [0usize; TOK];
    let mut rows = [std::ptr::null::<u8>(); TOK];
    for j in 0..TOK {
        tok[j] = (t + j).min(t1 - 1);
        // SAFETY: tok[j] < t1 ≤ TILE (caller's contract).
        rows[j] = unsafe { *krows.get_unchecked(tok[j]) };
        if t + j < t1 {
            next.row(t + j);
        }
    }
    (tok, rows)
}

/// `sc[t][r] = q_r · k_t` for tokens `t0 .. t1` (computed `TOK` at a time from `t0`, so up to
/// `TOK - 1` tokens past `t1` are written) and `R` rows; lanes of rows `R..4` are written as 0.
///
/// `q`: `[R, d]` rows; `krows[t]`: token `t`'s stored key row; `kscale`: `[TILE, MAX_GROUPS]`
/// f32 group scales (read only for scaled codecs).
///
/// # Safety
/// AVX2/FMA/F16C (and the registers `TOK` assumes); `krows[t0..t1]` valid rows of head_dim `d`
/// (a multiple of 16); `t1 ≤ TILE`; `sc` holds `SC_LEN` floats; `q` holds `R·d`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn scores<K: RowCodec, const R: usize, const TOK: usize>(
    codec: &K,
    krows: &[*const u8; TILE],
    kscale: &[f32],
    t0: usize,
    t1: usize,
    q: *const f32,
    d: usize,
    sc: *mut f32,
    next: &NextRows,
) {
    debug_assert!(TOK.is_multiple_of(2) && R <= 4);
    unsafe {
        let mut t = t0;
        while t < t1 {
            let (tok, rows) = step_tokens::<TOK>(krows, t, t1, next);
            let mut acc = [[_mm256_setzero_ps(); TOK]; 4]; // [row][token]
                                                           // Codecs that fold the scale: per token, the scale state of the group being read
                                                           // (chunks 2g and 2g+1 hold group g, the last chunk alone when d % 32 = 16),
                                                           // prepared on the group's first chunk.
            let mut scaled = [codec.scaled(kscale.as_ptr()); TOK];
            for k in 0..d / 16 {
                let (oa, ob) = K::dims(k, d);
                if K::FOLDS_SCALE && k % 2 == 0 {
                    for j in 0..TOK {
                        scaled[j] = codec.scaled(kscale.as_ptr().add(tok[j] * MAX_GROUPS + k / 2));
                    }
                }
                // Token by token: one decoded chunk live at a time keeps the 4·TOK accumulators
                // and the rows' query halves in registers.
                for j in 0..TOK {
                    let (x0, x1) = if K::FOLDS_SCALE {
                        codec.chunk_scaled(&scaled[j], rows[j], k)
                    } else if K::SCALED {
                        let s = _mm256_broadcast_ss(kscale.get_unchecked(tok[j] * MAX_GROUPS + oa / 32));
                        let (x0, x1) = codec.chunk(rows[j], k);
                        (_mm256_mul_ps(x0, s), _mm256_mul_ps(x1, s))
                    } else {
                        codec.chunk(rows[j], k)
                    };
                    for (r, acc) in acc.iter_mut().enumerate().take(R) {
                        let a = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(r * d + oa)), x0, acc[j]);
                        acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(r * d + ob)), x1, a);
                    }
                }
            }
            for pair in 0..TOK / 2 {
                let (ja, jb) = (2 * pair, 2 * pair + 1);
                let s = reduce8(
                    [acc[0][ja], acc[1][ja], acc[2][ja], acc[3][ja]],
                    [acc[0][jb], acc[1][jb], acc[2][jb], acc[3][jb]],
                );
                _mm256_storeu_ps(sc.add(4 * (t + ja)), s);
            }
            t += TOK;
        }
    }
}

/// `acc[r] = acc[r]·corr[r] + Σ_t w_t[r]·v_t` over tokens `t0 .. t1` for `R` rows and the
/// `N` codec chunks from `k0` (a multiple of `N`, so they share one scale group when `N = 2`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn accumulate_chunks<V: RowCodec, const R: usize, const N: usize>(
    codec: &V,
    vrows: &[*const u8; TILE],
    vscale: *const f32,
    k0: usize,
    t0: usize,
    t1: usize,
    w: *const f32,
    wt: usize,
    corr: &[f32; 4],
    d: usize,
    acc: *mut f32,
    next: &NextRows,
) {
    unsafe {
        // Bytes of the row this pass reads (codec chunks are consecutive in the row).
        let chunk_bytes = next.bytes / (d / 16);
        let (pf_from, pf_to) = (k0 * chunk_bytes, (k0 + N) * chunk_bytes);
        let mut dims = [(0usize, 0usize); N];
        for (c, dims) in dims.iter_mut().enumerate() {
            *dims = V::dims(k0 + c, d);
        }
        let wg = if V::SCALED && !V::SUB_SCALED { w.add(4 * (dims[0].0 / 32)) } else { w };
        // Sub-scaled values: the sub-groups of each chunk's two 8-value halves.
        let mut subs = [(0usize, 0usize); N];
        for (o, &(oa, ob)) in subs.iter_mut().zip(&dims) {
            *o = (oa / 8, ob / 8);
        }
        let mut a = [[[_mm256_setzero_ps(); 2]; N]; 4];
        for r in 0..R {
            let c = _mm256_set1_ps(corr[r]);
            for (i, &(oa, ob)) in dims.iter().enumerate() {
                a[r][i][0] = _mm256_mul_ps(_mm256_loadu_ps(acc.add(r * d + oa)), c);
                a[r][i][1] = _mm256_mul_ps(_mm256_loadu_ps(acc.add(r * d + ob)), c);
            }
        }
        for t in t0..t1 {
            next.lines(t, pf_from, pf_to);
            let row = *vrows.get_unchecked(t);
            let mut x = [(_mm256_setzero_ps(), _mm256_setzero_ps()); N];
            for (i, x) in x.iter_mut().enumerate() {
                *x = codec.chunk(row, k0 + i);
            }
            if V::SUB_SCALED {
                // Each half times its sub-group's `D · q`: the decoded values bit for bit, once
                // per token for all rows (their weights are the bare probabilities).
                let vs = vscale.add(t * MAX_VALUE_GROUPS);
                for (x, &(sa, sb)) in x.iter_mut().zip(&subs) {
                    x.0 = _mm256_mul_ps(x.0, _mm256_broadcast_ss(&*vs.add(sa)));
                    x.1 = _mm256_mul_ps(x.1, _mm256_broadcast_ss(&*vs.add(sb)));
                }
            }
            let wr = wg.add(t * wt);
            for (r, a) in a.iter_mut().enumerate().take(R) {
                let p = _mm256_broadcast_ss(&*wr.add(r));
                for (a, x) in a.iter_mut().zip(&x) {
                    a[0] = _mm256_fmadd_ps(p, x.0, a[0]);
                    a[1] = _mm256_fmadd_ps(p, x.1, a[1]);
                }
            }
        }
        for (r, a) in a.iter().enumerate().take(R) {
            for (a, &(oa, ob)) in a.iter().zip(&dims) {
                _mm256_storeu_ps(acc.add(r * d + oa), a[0]);
                _mm256_storeu_ps(acc.add(r * d + ob), a[1]);
            }
        }
    }
}

/// `acc[r] = acc[r]·corr[r] + Σ_t w_t[r]·v_t` over tokens `t0 .. t1` for `R` rows, `CH` codec
/// chunks per pass over the tile.
///
/// `w`: weights, token `t`, row `r`, group `g` at `w[t·wt + 4g + r]` (`g` unused for unscaled
/// and sub-scaled codecs, whose weights are the probabilities `sc`); `vscale`: `[TILE,
/// MAX_VALUE_GROUPS]` the tokens' sub-group scales `D · q` (read only for sub-scaled codecs, which
/// multiply the decoded values by them); `acc`: `[R, d]`.
///
/// # Safety
/// AVX2/FMA/F16C (and the registers `CH` assumes); `vrows[t0..t1]` valid rows of head_dim `d`;
/// buffers sized as documented.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn accumulate<V: RowCodec, const R: usize, const CH: usize>(
    codec: &V,
    vrows: &[*const u8; TILE],
    vscale: *const f32,
    t0: usize,
    t1: usize,
    w: *const f32,
    wt: usize,
    corr: &[f32; 4],
    d: usize,
    acc: *mut f32,
    next: &NextRows,
) {
    unsafe {
        let chunks = d / 16;
        let mut k = 0;
        if CH == 2 {
            while k + 2 <= chunks {
                accumulate_chunks::<V, R, 2>(codec, vrows, vscale, k, t0, t1, w, wt, corr, d, acc, next);
                k += 2;
            }
        }
        while k < chunks {
            accumulate_chunks::<V, R, 1>(codec, vrows, vscale, k, t0, t1, w, wt, corr, d, acc, next);
            k += 1;
        }
    }
}
