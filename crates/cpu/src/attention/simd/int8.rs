//! K·Q in integers for q8 and q4 keys (AVX-512 VNNI, head_dim a multiple of 64): the query
//! row is already 16-bit fixed point, `256 · hi + lo` steps a value (`queries::quantize_query`:
//! `hi` signed, `lo` in 0..=255), so a key chunk of 64 values against a query row is two
//! `vpdpbusd` (64 byte products summed four to a 32-bit lane, one for each code) instead of
//! decoding the key to f32 and 8 FMAs.
//!
//! `vpdpbusd` multiplies unsigned by signed bytes. Against `hi` the keys enter unsigned
//! ([`IntKeys`]): q8 codes XOR 0x80 (`c + 128`), q4 nibbles as stored (`c + 8`), and each row's
//! lanes (`queries::int8_lanes`) carry, per 32-bit lane of 4 values, the correction `-offset ·
//! Σ hi` (the accumulator's start value). Against the unsigned `lo` they enter signed, which
//! needs no correction. A lane's sum `256 · Σ hi · k + Σ lo · k` (the first sum shifted left by
//! 8, then the second accumulated onto it) is then exact (|·| < 2^26), and the score is
//! `step · Σ_lanes f32(sum) · k_scale`: the f32 dot product of the rounded query with the
//! decoded key, up to the order of the f32 sums — what every other route computes with the same
//! rounded query.
//!
//! Blocking: four tokens × up to four rows of 16-lane f32 accumulators (16 registers), summed
//! into `sc`'s `[token][4]` layout by one 16-vector transpose-add tree ([`reduce16`]).

use std::arch::x86_64::*;

use super::kernels::step_tokens;
use crate::attention::queries::int8_lane_floats;
use crate::attention::tile::{NextRows, MAX_GROUPS, TILE};

/// A key codec whose codes enter `vpdpbusd` as bytes in head-dimension order.
pub(crate) trait IntKeys: Copy {
    /// The 64 values of chunk `c` (head dimensions `64c .. 64c + 64`) of the row at `row`, as
    /// `code + offset` (unsigned) and as `code` (signed) bytes.
    ///
    /// # Safety
    /// `row` points to a whole stored head vector with more than `64c` values; AVX-512F/BW/VL.
    unsafe fn chunk(&self, row: *const u8, c: usize) -> (__m512i, __m512i);
}

/// q8 codes (one signed byte per value, groups of 32 in order): XOR 0x80 is `c + 128`.
#[derive(Clone, Copy)]
pub(crate) struct Q8Keys;

impl IntKeys for Q8Keys {
    #[inline(always)]
    unsafe fn chunk(&self, row: *const u8, c: usize) -> (__m512i, __m512i) {
        // SAFETY: 64 code bytes at 64c lie in the row (caller's contract).
        unsafe {
            let signed = _mm512_loadu_si512(row.add(64 * c).cast());
            (_mm512_xor_si512(signed, _mm512_set1_epi8(-128)), signed)
        }
    }
}

/// q4 nibbles (a group of 32 values in 16 bytes: byte `j` holds value `j` low and `j + 16`
/// high), as stored: `c + 8`. A chunk is two groups, 32 bytes, unpacked into value order.
#[derive(Clone, Copy)]
pub(crate) struct Q4Keys;

impl IntKeys for Q4Keys {
    #[inline(always)]
    unsafe fn chunk(&self, row: *const u8, c: usize) -> (__m512i, __m512i) {
        // SAFETY: the 32 bytes of groups 2c and 2c + 1 lie in the row.
        unsafe {
            let b = _mm256_loadu_si256(row.add(32 * c).cast());
            let nib = _mm256_set1_epi8(0x0F);
            let lo = _mm256_and_si256(b, nib); // [g0 values 0..16 | g1 values 0..16]
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(b), nib); // [g0 16..32 | g1 16..32]
            let z = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
            // 128-bit quarters [lo.0, lo.1, hi.0, hi.1] → [lo.0, hi.0, lo.1, hi.1]: value order.
            let unsigned = _mm512_shuffle_i64x2::<0b11_01_10_00>(z, z);
            (unsigned, _mm512_sub_epi8(unsigned, _mm512_set1_epi8(8)))
        }
    }
}

/// Sums each of the 16 vectors `v` into lane `j` of the result.
#[inline(always)]
unsafe fn reduce16(v: &[__m512; 16]) -> __m512 {
    unsafe {
        // Within each 128-bit quarter: pairs, then quads of vectors, fully summed over the quarter.
        let mut s = [_mm512_setzero_ps(); 8];
        for (i, s) in s.iter_mut().enumerate() {
            let (a, b) = (v[2 * i], v[2 * i + 1]);
            *s = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
        }
        let mut u = [_mm512_setzero_ps(); 4];
        for (i, u) in u.iter_mut().enumerate() {
            let (a, b) = (_mm512_castps_pd(s[2 * i]), _mm512_castps_pd(s[2 * i + 1]));
            // 64-bit moves of f32 pairs, summed as f32.
            *u = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
        }
        // Across quarters: u[i] holds vectors 4i..4i+4 in each quarter.
        let w0 = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(u[0], u[1]),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(u[0], u[1]),
        );
        let w1 = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(u[2], u[3]),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(u[2], u[3]),
        );
        _mm512_add_ps(_mm512_shuffle_f32x4::<0b10_00_10_00>(w0, w1), _mm512_shuffle_f32x4::<0b11_01_11_01>(w0, w1))
    }
}

/// Tokens per step of [`scores`].
const TOK: usize = 4;

/// `sc[t][r] = q_r · k_t` for tokens `t0 .. t1` (four at a time from `t0`, so up to three tokens
/// past `t1` are written) and `R` rows; lanes of rows `R..4` are written as 0.
///
/// `lanes`: `[R, int8_lane_floats(d)]` the rows' int8 lanes; `kscale`: `[TILE, MAX_GROUPS]`
/// f32 key group scales; `krows[t]`: token `t`'s stored key row.
///
/// # Safety
/// AVX-512F/BW/VL and AVX-512 VNNI; `d` a multiple of 64 (at most `MAX_FAST_HEAD_DIM`);
/// `krows[t0..t1]` valid rows; `t1 ≤ TILE`; `sc` holds `SC_LEN` floats.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn scores<K: IntKeys, const R: usize>(
    keys: &K,
    krows: &[*const u8; TILE],
    kscale: &[f32],
    t0: usize,
    t1: usize,
    lanes: *const f32,
    d: usize,
    sc: *mut f32,
    next: &NextRows,
) {
    const { assert!(MAX_GROUPS == 16) };
    debug_assert!(d.is_multiple_of(64) && R <= 4 && kscale.len() >= TILE * MAX_GROUPS);
    unsafe {
        let row_floats = int8_lane_floats(d);
        let (lo_at, corr_at, step_at) = (d / 4, d / 2, 3 * d / 4);
        // Each row's step, in its lanes of the [token · 4 + row] layout (0 past R).
        let mut steps = [0f32; 16];
        for r in 0..R {
            let step = *lanes.add(r * row_floats + step_at);
            for t in 0..TOK {
                steps[4 * t + r] = step;
            }
        }
        let steps = _mm512_loadu_ps(steps.as_ptr());
        // Lanes 8..16 of a chunk read the second of its two key groups.
        let halves = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
        let mut t = t0;
        while t < t1 {
            let (tok, rows) = step_tokens::<TOK>(krows, t, t1, next);
            let mut f = [_mm512_setzero_ps(); 16]; // [token · 4 + row]
            for c in 0..d / 64 {
                // Key lanes 0..8 belong to group 2c, lanes 8..16 to group 2c + 1.
                let pick = _mm512_add_epi32(halves, _mm512_set1_epi32(2 * c as i32));
                for j in 0..TOK {
                    let (ku, ks_) = keys.chunk(rows[j], c);
                    // MAX_GROUPS = 16: the token's whole scale row in one vector.
                    let group_scales = _mm512_loadu_ps(kscale.as_ptr().add(tok[j] * MAX_GROUPS));
                    let kscales = _mm512_permutexvar_ps(pick, group_scales);
                    for r in 0..R {
                        // The row's lanes are re-read per token (L1 hits, folded into the
                        // instructions), which keeps the 16 accumulators and the key in registers.
                        let row = lanes.add(r * row_floats);
                        let hi = _mm512_loadu_si512(row.add(16 * c).cast());
                        let lo = _mm512_loadu_si512(row.add(lo_at + 16 * c).cast());
                        let corr = _mm512_loadu_si512(row.add(corr_at + 16 * c).cast());
                        let h = _mm512_dpbusd_epi32(corr, ku, hi);
                        let sum = _mm512_dpbusd_epi32(_mm512_slli_epi32::<8>(h), lo, ks_);
                        f[4 * j + r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), kscales, f[4 * j + r]);
                    }
                }
            }
            _mm512_storeu_ps(sc.add(4 * t), _mm512_mul_ps(reduce16(&f), steps));
            t += TOK;
        }
    }
}

/// `queries::quantize_query` then `queries::int8_lanes` of one query row `q` (`[d]`, d a
/// multiple of 16) into `out` (`[int8_lane_floats(d)]`), in 16-lane vectors, bit for bit the
/// scalar definition's results (its operations in its order; `floor` and round-half-away are
/// exact here). The partitioned path prepares a sequence's rows once per partition, so this runs
/// for every value of every row many times a call.
///
/// # Safety
/// AVX-512F/BW/VL; `out` holds `int8_lane_floats(d)` floats.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn query_lanes(q: &mut [f32], offset: i32, out: &mut [f32]) {
    use crate::attention::queries::INT8_QUERY_LO_STEPS;
    let d = q.len();
    debug_assert!(d.is_multiple_of(16) && out.len() >= int8_lane_floats(d));
    unsafe {
        let p = q.as_mut_ptr();
        let mut m = _mm512_setzero_ps();
        for i in (0..d).step_by(16) {
            m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(p.add(i))));
        }
        let amax = _mm512_reduce_max_ps(m);
        let lo_steps = INT8_QUERY_LO_STEPS as f32;
        let s = amax / 127.0;
        let step = s / lo_steps;
        let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        let (sv, stepv, invv, lsv) =
            (_mm512_set1_ps(s), _mm512_set1_ps(step), _mm512_set1_ps(inv), _mm512_set1_ps(lo_steps));
        let (lim, half, one, zero, top) = (
            _mm512_set1_ps(127.0),
            _mm512_set1_ps(0.5),
            _mm512_set1_ps(1.0),
            _mm512_setzero_ps(),
            _mm512_set1_ps(255.0),
        );
        let o = out.as_mut_ptr();
        let (hi_bytes, lo_bytes, corr) = (o as *mut u8, o.add(d / 4) as *mut u8, o.add(d / 2) as *mut i32);
        let off = _mm512_set1_epi32(-offset);
        for i in (0..d).step_by(16) {
            let v = _mm512_loadu_ps(p.add(i));
            let x = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v, invv), _mm512_sub_ps(zero, lim)), lim);
            let hi = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(x);
            let r = _mm512_mul_ps(_mm512_mul_ps(_mm512_sub_ps(v, _mm512_mul_ps(hi, sv)), invv), lsv);
            let r = _mm512_min_ps(_mm512_max_ps(r, zero), top);
            let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(r);
            let up = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_sub_ps(r, t), half);
            let lo = _mm512_mask_add_ps(t, up, t, one);
            _mm512_storeu_ps(p.add(i), _mm512_mul_ps(_mm512_add_ps(_mm512_mul_ps(hi, lsv), lo), stepv));
            let hi_i = _mm512_cvtps_epi32(hi);
            _mm_storeu_si128(hi_bytes.add(i).cast(), _mm512_cvtepi32_epi8(hi_i));
            _mm_storeu_si128(lo_bytes.add(i).cast(), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(lo)));
            // Four lanes' corrections: -offset · (sum of each 4 consecutive hi codes).
            let pairs = _mm512_add_epi32(hi_i, _mm512_bsrli_epi128::<4>(hi_i));
            let quads = _mm512_add_epi32(pairs, _mm512_bsrli_epi128::<8>(pairs));
            let sums = _mm512_maskz_compress_epi32(0x1111, quads);
            _mm_storeu_si128(corr.add(i / 4).cast(), _mm512_castsi512_si128(_mm512_mullo_epi32(sums, off)));
        }
        let steps = o.add(3 * d / 4);
        _mm512_storeu_ps(steps, _mm512_set1_ps(step));
    }
}

#[cfg(test)]
mod tests {
    //! The kernel against the f64 dot products of the decoded keys with the rounded
    //! queries, on fresh random rows, both codecs, every row count, head_dims 64 to 256.

    use super::*;
    use crate::attention::queries::{int8_key_offset, int8_lanes, quantize_query, Int8Query};
    use crate::attention::tile::SC_LEN;
    use half::f16;
    use kvcache::{Codec, KvFormat};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use rand_distr::StandardNormal;

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn run<K: IntKeys>(
        keys: &K,
        rows: usize,
        krows: &[*const u8; TILE],
        kscale: &[f32],
        t1: usize,
        lanes: *const f32,
        d: usize,
        sc: *mut f32,
    ) {
        let next = NextRows { rows: [std::ptr::null(); TILE], n: 0, bytes: 0 };
        // SAFETY: forwarded contract.
        unsafe {
            match rows {
                1 => scores::<K, 1>(keys, krows, kscale, 0, t1, lanes, d, sc, &next),
                2 => scores::<K, 2>(keys, krows, kscale, 0, t1, lanes, d, sc, &next),
                3 => scores::<K, 3>(keys, krows, kscale, 0, t1, lanes, d, sc, &next),
                _ => scores::<K, 4>(keys, krows, kscale, 0, t1, lanes, d, sc, &next),
            }
        }
    }

    #[test]
    fn vector_query_lanes_equal_the_scalar_definition_bit_for_bit() {
        if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")) {
            eprintln!("skipped: this CPU has no AVX-512 BW");
            return;
        }
        let mut rng = StdRng::seed_from_u64(0x9e11);
        for d in [16, 64, 128, 256, 512] {
            for case in 0..200 {
                let amp: f32 = 10f32.powf(rng.gen_range(-6.0..4.0));
                let mut q: Vec<f32> = (0..d).map(|_| amp * rng.sample::<f32, _>(StandardNormal)).collect();
                match case % 5 {
                    0 => q.iter_mut().step_by(3).for_each(|v| *v = 0.0),
                    1 => q.iter_mut().for_each(|v| *v = (*v / amp * 4.0).round() * amp / 4.0), // ties
                    2 => q.fill(0.0),
                    3 => q[rng.gen_range(0..d)] *= 1e4, // one outlier
                    _ => {}
                }
                let offset = if case % 2 == 0 { 128 } else { 8 };
                let (mut want_q, mut got_q) = (q.clone(), q.clone());
                let (mut hi, mut lo, mut step) = (vec![0i8; d], vec![0u8; d], 0f32);
                quantize_query(&mut want_q, Some(Int8Query { hi: &mut hi, lo: &mut lo, step: &mut step }));
                let mut want = vec![0f32; int8_lane_floats(d)];
                int8_lanes(&hi, &lo, step, offset, &mut want);
                let mut got = vec![f32::NAN; int8_lane_floats(d)];
                // SAFETY: features checked above; `got` sized as documented.
                unsafe { query_lanes(&mut got_q, offset, &mut got) };
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got_q), bits(&want_q), "rounded row, d {d} case {case}");
                assert_eq!(bits(&got), bits(&want), "lanes, d {d} case {case}");
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn reduce_all(x: &[[f32; 16]; 16]) -> [f32; 16] {
        unsafe {
            let mut v = [_mm512_setzero_ps(); 16];
            for (v, x) in v.iter_mut().zip(x) {
                *v = _mm512_loadu_ps(x.as_ptr());
            }
            let mut out = [0f32; 16];
            _mm512_storeu_ps(out.as_mut_ptr(), reduce16(&v));
            out
        }
    }

    #[test]
    fn the_transpose_tree_sums_each_vector_into_its_lane() {
        if !is_x86_feature_detected!("avx512f") {
            return;
        }
        let mut x = [[0f32; 16]; 16];
        for (j, row) in x.iter_mut().enumerate() {
            for (i, v) in row.iter_mut().enumerate() {
                *v = (j * 100 + i) as f32;
            }
        }
        // SAFETY: AVX-512F checked.
        let got = unsafe { reduce_all(&x) };
        for (j, row) in x.iter().enumerate() {
            assert_eq!(got[j], row.iter().sum::<f32>(), "lane {j}: {got:?}");
        }
    }

    #[test]
    fn integer_scores_match_the_decoded_keys_times_the_rounded_queries() {
        if !(is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni"))
        {
            eprintln!("skipped: this CPU has no AVX-512 VNNI");
            return;
        }
        let mut rng = StdRng::seed_from_u64(0x1a7e5);
        for format in [KvFormat::Q8, KvFormat::Q4 { rotate: false }] {
            let codec = format.key_codec();
            for d in [64, 128, 192, 256, 512] {
                for rows in 1..=4 {
                    for t1 in [1, 3, 4, 17, TILE] {
                        let amp: f32 = rng.gen_range(0.01..50.0);
                        // Keys: encoded rows, f16 scales, their f32 decodings.
                        let mut codes = vec![0u8; TILE * codec.code_bytes(d)];
                        let mut kscale = vec![0f32; TILE * MAX_GROUPS];
                        let mut decoded = vec![0f32; TILE * d];
                        for t in 0..TILE {
                            let x: Vec<f32> = (0..d).map(|_| amp * rng.sample::<f32, _>(StandardNormal)).collect();
                            let row = &mut codes[t * codec.code_bytes(d)..(t + 1) * codec.code_bytes(d)];
                            let mut scales = vec![f16::ZERO; codec.scales(d)];
                            codec.encode(&x, row, &mut scales);
                            codec.decode(row, &scales, &mut decoded[t * d..(t + 1) * d]);
                            for (g, s) in scales.iter().enumerate() {
                                kscale[t * MAX_GROUPS + g] = s.to_f32();
                            }
                        }
                        let mut krows = [std::ptr::null::<u8>(); TILE];
                        for (t, r) in krows.iter_mut().enumerate() {
                            *r = codes[t * codec.code_bytes(d)..].as_ptr();
                        }
                        // Queries: rounded rows and their lanes.
                        let lf = int8_lane_floats(d);
                        let mut lanes = vec![0f32; rows * lf];
                        let mut q = vec![0f32; rows * d];
                        for r in 0..rows {
                            let row = &mut q[r * d..(r + 1) * d];
                            for v in row.iter_mut() {
                                *v = rng.sample::<f32, _>(StandardNormal) * rng.gen_range(0.1..3.0);
                            }
                            let (mut hi, mut lo, mut step) = (vec![0i8; d], vec![0u8; d], 0f32);
                            quantize_query(row, Some(Int8Query { hi: &mut hi, lo: &mut lo, step: &mut step }));
                            int8_lanes(&hi, &lo, step, int8_key_offset(format), &mut lanes[r * lf..(r + 1) * lf]);
                        }
                        let mut sc = vec![f32::NAN; SC_LEN];
                        // SAFETY: features checked above; rows and buffers sized as documented.
                        unsafe {
                            match codec {
                                Codec::Q8 => {
                                    run(&Q8Keys, rows, &krows, &kscale, t1, lanes.as_ptr(), d, sc.as_mut_ptr())
                                }
                                _ => run(&Q4Keys, rows, &krows, &kscale, t1, lanes.as_ptr(), d, sc.as_mut_ptr()),
                            }
                        }
                        for t in 0..t1 {
                            for r in 0..4 {
                                let got = sc[4 * t + r];
                                if r >= rows {
                                    assert_eq!(got, 0.0, "{format:?} d {d} row {r} past the block");
                                    continue;
                                }
                                let (qr, kt) = (&q[r * d..(r + 1) * d], &decoded[t * d..(t + 1) * d]);
                                let want: f64 = qr.iter().zip(kt).map(|(a, b)| *a as f64 * *b as f64).sum();
                                let mag: f64 = qr.iter().zip(kt).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                                assert!(
                                    (got as f64 - want).abs() <= 1e-5 * mag + 1e-30,
                                    "{format:?} d {d} rows {rows} t {t} r {r}: {got} vs {want} (Σ|·| {mag})"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
