//! The AVX2 QK and PV kernels of one tile for a block of up to four query rows
//! ([`super::super::tile`] drives them).
//!
//! QK ([`scores`]) keeps 2 tokens × R rows accumulators over the head dimension and reduces
//! those eight vectors with one transpose-add tree (6 `hadd` + 2 permutes + 1 add) into the
//! `sc` layout `[token][4]`: no horizontal sum per token. PV ([`accumulate`]) keeps R rows × 16
//! dimensions in registers while it walks the tile's tokens.

use std::arch::x86_64::*;

use super::codecs::RowCodec;
use crate::attention::tile::TILE;

/// `sc[t][r] = q_r · k_t` for tokens `t0 .. t1` (computed in pairs from `t0`, so `sc` may be
/// written one token past `t1`) and `R` rows; lanes of rows `R..4` are written as 0.
///
/// `q`: `[R, d]` rows; `krows[t]`: token `t`'s stored key row; `kscale`: `[TILE, ngp]` f32
/// group scales (read only for scaled codecs).
///
/// # Safety
/// AVX2/FMA/F16C; `krows[t0..t1]` valid rows of head_dim `d` (a multiple of 16);
/// `t1 ≤ TILE`; `sc` holds `SC_LEN` floats; `q` holds `R·d`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn scores<K: RowCodec, const R: usize>(
    codec: &K,
    krows: &[*const u8; TILE],
    kscale: &[f32],
    ngp: usize,
    t0: usize,
    t1: usize,
    q: *const f32,
    d: usize,
    sc: *mut f32,
) {
    unsafe {
        let mut t = t0;
        while t < t1 {
            let ka = krows[t];
            let kb = if t + 1 < t1 { krows[t + 1] } else { ka };
            let mut acc = [[_mm256_setzero_ps(); 2]; 4];
            for k in 0..d / 16 {
                let (oa, ob) = K::dims(k, d);
                let (mut a0, mut a1) = codec.chunk(ka, k);
                let (mut b0, mut b1) = codec.chunk(kb, k);
                if K::SCALED {
                    let g = oa / 32;
                    let sa = _mm256_broadcast_ss(kscale.get_unchecked(t * ngp + g));
                    let tb = if t + 1 < t1 { t + 1 } else { t };
                    let sb = _mm256_broadcast_ss(kscale.get_unchecked(tb * ngp + g));
                    a0 = _mm256_mul_ps(a0, sa);
                    a1 = _mm256_mul_ps(a1, sa);
                    b0 = _mm256_mul_ps(b0, sb);
                    b1 = _mm256_mul_ps(b1, sb);
                }
                for (r, acc) in acc.iter_mut().enumerate().take(R) {
                    let q0 = _mm256_loadu_ps(q.add(r * d + oa));
                    acc[0] = _mm256_fmadd_ps(q0, a0, acc[0]);
                    acc[1] = _mm256_fmadd_ps(q0, b0, acc[1]);
                }
                for (r, acc) in acc.iter_mut().enumerate().take(R) {
                    let q1 = _mm256_loadu_ps(q.add(r * d + ob));
                    acc[0] = _mm256_fmadd_ps(q1, a1, acc[0]);
                    acc[1] = _mm256_fmadd_ps(q1, b1, acc[1]);
                }
            }
            // Transpose-add: lanes [t: r0 r1 r2 r3 | t+1: r0 r1 r2 r3].
            let h0 = _mm256_hadd_ps(acc[0][0], acc[1][0]);
            let h1 = _mm256_hadd_ps(acc[2][0], acc[3][0]);
            let h2 = _mm256_hadd_ps(acc[0][1], acc[1][1]);
            let h3 = _mm256_hadd_ps(acc[2][1], acc[3][1]);
            let g0 = _mm256_hadd_ps(h0, h1);
            let g1 = _mm256_hadd_ps(h2, h3);
            let s = _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(g0, g1), _mm256_permute2f128_ps::<0x31>(g0, g1));
            _mm256_storeu_ps(sc.add(4 * t), s);
            t += 2;
        }
    }
}

/// `acc[r] = acc[r]·corr[r] + Σ_t w_t[r]·v_t` over tokens `t0 .. t1` for `R` rows.
///
/// `w`: weights, token `t`, row `r`, group `g` at `w[t·wt + g·4 + r]` (`wt = 4` and `g` unused
/// for unscaled codecs, whose weights are the probabilities `sc`); `acc`: `[R, d]`.
///
/// # Safety
/// AVX2/FMA/F16C; `vrows[t0..t1]` valid rows of head_dim `d`; buffers sized as documented.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn accumulate<V: RowCodec, const R: usize>(
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
        for k in 0..d / 16 {
            let (oa, ob) = V::dims(k, d);
            let wg = if V::SCALED { w.add(4 * (oa / 32)) } else { w };
            let mut a0 = [_mm256_setzero_ps(); 4];
            let mut a1 = [_mm256_setzero_ps(); 4];
            for r in 0..R {
                let c = _mm256_set1_ps(corr[r]);
                a0[r] = _mm256_mul_ps(_mm256_loadu_ps(acc.add(r * d + oa)), c);
                a1[r] = _mm256_mul_ps(_mm256_loadu_ps(acc.add(r * d + ob)), c);
            }
            for t in t0..t1 {
                let (x, y) = codec.chunk(vrows[t], k);
                let wr = wg.add(t * wt);
                for r in 0..R {
                    let p = _mm256_broadcast_ss(&*wr.add(r));
                    a0[r] = _mm256_fmadd_ps(p, x, a0[r]);
                    a1[r] = _mm256_fmadd_ps(p, y, a1[r]);
                }
            }
            for r in 0..R {
                _mm256_storeu_ps(acc.add(r * d + oa), a0[r]);
                _mm256_storeu_ps(acc.add(r * d + ob), a1[r]);
            }
        }
    }
}
