//! The AVX-512 QK and PV kernels of one tile for a block of up to four query rows
//! ([`super::super::tile`] drives them). 16-lane vectors and 32 registers: on Zen 4 a 512-bit
//! FMA issues once per cycle (two 256-bit halves), so eight independent accumulators already
//! hide its latency twice over, which 256-bit code with 16 registers cannot.
//!
//! QK ([`scores`]) keeps 4 tokens × R rows accumulators over the head dimension and reduces the
//! sixteen vectors with one transpose-add tree (8 + 4 lane-block shuffles-and-adds, then a
//! 4×4 in-lane transpose-add: 45 instructions for 16 scores) straight into the `sc` layout
//! `[token][4]`. PV ([`accumulate`]) keeps R rows × 32 dimensions in registers while it walks
//! the tile's tokens.

use std::arch::x86_64::*;

use super::codecs::RowCodec512;
use crate::attention::tile::{MAX_GROUPS, TILE};

/// Sums each of sixteen vectors, `x[4n + c]` landing in lane `4c + n`.
#[inline(always)]
unsafe fn reduce16(x: &[__m512; 16]) -> __m512 {
    unsafe {
        // 16 → 8: 128-bit blocks 0,1 of y[m] hold x[2m] folded to 8 values, blocks 2,3 x[2m+1].
        let mut y = [_mm512_setzero_ps(); 8];
        for (m, y) in y.iter_mut().enumerate() {
            let (a, b) = (x[2 * m], x[2 * m + 1]);
            *y = _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(a, b), _mm512_shuffle_f32x4::<0xDD>(a, b));
        }
        // 8 → 4: block c of z[n] holds x[4n + c] folded to 4 values.
        let mut z = [_mm512_setzero_ps(); 4];
        for (n, z) in z.iter_mut().enumerate() {
            let (a, b) = (y[2 * n], y[2 * n + 1]);
            *z = _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(a, b), _mm512_shuffle_f32x4::<0xDD>(a, b));
        }
        // In-block 4×4 transpose-add: lane e of block c = total of z[e]'s block c.
        let u0 = _mm512_add_ps(_mm512_unpacklo_ps(z[0], z[1]), _mm512_unpackhi_ps(z[0], z[1]));
        let u1 = _mm512_add_ps(_mm512_unpacklo_ps(z[2], z[3]), _mm512_unpackhi_ps(z[2], z[3]));
        _mm512_add_ps(_mm512_shuffle_ps::<0x44>(u0, u1), _mm512_shuffle_ps::<0xEE>(u0, u1))
    }
}

/// `sc[t][r] = q_r · k_t` for tokens `t0 .. t1` (computed four at a time from `t0`, so up to
/// three tokens past `t1` are written) and `R` rows; lanes of rows `R..4` are written as 0.
///
/// `q`: `[R, d]` rows; `krows[t]`: token `t`'s stored key row; `kscale`: `[TILE, MAX_GROUPS]`
/// f32 group scales (read only for scaled codecs).
///
/// # Safety
/// AVX-512F/AVX2/FMA/F16C; `krows[t0..t1]` valid rows of head_dim `d` (a multiple of 16);
/// `t1 ≤ TILE`; `sc` holds `SC_LEN` floats; `q` holds `R·d`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn scores<K: RowCodec512, const R: usize>(
    codec: &K,
    krows: &[*const u8; TILE],
    kscale: &[f32],
    t0: usize,
    t1: usize,
    q: *const f32,
    d: usize,
    sc: *mut f32,
) {
    unsafe {
        let mut t = t0;
        while t < t1 {
            // Tokens past the range repeat the last one (their lanes are masked later).
            let tok = [t, (t + 1).min(t1 - 1), (t + 2).min(t1 - 1), (t + 3).min(t1 - 1)];
            let rows = tok.map(|j| krows[j]);
            let mut acc = [_mm512_setzero_ps(); 16]; // [row][token]
            for k in 0..d / 16 {
                let mut x = rows.map(|p| codec.chunk(p, k));
                if K::SCALED {
                    for (x, &j) in x.iter_mut().zip(&tok) {
                        *x = _mm512_mul_ps(*x, _mm512_set1_ps(*kscale.get_unchecked(j * MAX_GROUPS + k / 2)));
                    }
                }
                for r in 0..R {
                    let qv = _mm512_loadu_ps(q.add(r * d + 16 * k));
                    for (j, x) in x.iter().enumerate() {
                        acc[4 * r + j] = _mm512_fmadd_ps(qv, *x, acc[4 * r + j]);
                    }
                }
            }
            _mm512_storeu_ps(sc.add(4 * t), reduce16(&acc));
            t += 4;
        }
    }
}

/// `acc[r] = acc[r]·corr[r] + Σ_t w_t[r]·v_t` over tokens `t0 .. t1` for `R` rows, `N` chunks
/// (16 values each) from chunk `k0`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn accumulate_chunks<V: RowCodec512, const R: usize, const N: usize>(
    codec: &V,
    vrows: &[*const u8; TILE],
    k0: usize,
    t0: usize,
    t1: usize,
    w: *const f32,
    wt: usize,
    corr: &[f32; 4],
    d: usize,
    acc: *mut f32,
) {
    unsafe {
        // Chunks k0, k0 + 1 share scale group k0 / 2 (k0 is even).
        let wg = if V::SCALED { w.add(4 * (k0 / 2)) } else { w };
        let mut a = [[_mm512_setzero_ps(); N]; 4];
        for r in 0..R {
            let c = _mm512_set1_ps(corr[r]);
            for (i, a) in a[r].iter_mut().enumerate() {
                *a = _mm512_mul_ps(_mm512_loadu_ps(acc.add(r * d + 16 * (k0 + i))), c);
            }
        }
        for t in t0..t1 {
            let row = *vrows.get_unchecked(t);
            let mut x = [_mm512_setzero_ps(); N];
            for (i, x) in x.iter_mut().enumerate() {
                *x = codec.chunk(row, k0 + i);
            }
            let wr = wg.add(t * wt);
            for r in 0..R {
                let p = _mm512_set1_ps(*wr.add(r));
                for i in 0..N {
                    a[r][i] = _mm512_fmadd_ps(p, x[i], a[r][i]);
                }
            }
        }
        for r in 0..R {
            for (i, a) in a[r].iter().enumerate() {
                _mm512_storeu_ps(acc.add(r * d + 16 * (k0 + i)), *a);
            }
        }
    }
}

/// `acc[r] = acc[r]·corr[r] + Σ_t w_t[r]·v_t` over tokens `t0 .. t1` for `R` rows.
///
/// `w`: weights, token `t`, row `r`, group `g` at `w[t·wt + g·4 + r]` (`g` unused for unscaled
/// codecs, whose weights are the probabilities `sc`); `acc`: `[R, d]`.
///
/// # Safety
/// AVX-512F/AVX2/FMA/F16C; `vrows[t0..t1]` valid rows of head_dim `d`; buffers sized as
/// documented.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn accumulate<V: RowCodec512, const R: usize>(
    codec: &V,
    vrows: &[*const u8; TILE],
    t0: usize,
    t1: usize,
    w: *const f32,
    wt: usize,
    corr: &[f32; 4],
    d: usize,
    acc: *mut f32,
) {
    unsafe {
        let chunks = d / 16;
        let mut k = 0;
        while k + 2 <= chunks {
            accumulate_chunks::<V, R, 2>(codec, vrows, k, t0, t1, w, wt, corr, d, acc);
            k += 2;
        }
        if k < chunks {
            accumulate_chunks::<V, R, 1>(codec, vrows, k, t0, t1, w, wt, corr, d, acc);
        }
    }
}
