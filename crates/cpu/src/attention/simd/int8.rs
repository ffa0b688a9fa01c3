//! K·Q in integers for q8 and q4 keys (AVX-512 VNNI, head_dim a multiple of 64): the query
//! is already rounded to int8 codes with one scale per 8 values (`queries::quantize_query`),
//! so a key chunk of 64 values against a query row is one `vpdpbusd` (64 byte products summed
//! four to a 32-bit lane) instead of decoding the key to f32 and 8 FMAs.
//!
//! `vpdpbusd` multiplies unsigned by signed bytes, so keys enter unsigned ([`IntKeys`]): q8
//! codes XOR 0x80 (`c + 128`), q4 nibbles as stored (`c + 8`). Each row's lanes
//! (`queries::int8_lanes`) carry, per 32-bit lane of 4 values, the correction `-offset · Σ
//! codes` (the accumulator's start value) and the query scale. A lane's integer sum is then
//! exact, and the score is `Σ_lanes f32(sum) · q_scale · k_scale`: the f32 dot product of the
//! int8-rounded query with the decoded key, up to the order of the f32 sums — what every other
//! route computes with the same rounded query.
//!
//! Blocking: four tokens × up to four rows of 16-lane f32 accumulators (16 registers), summed
//! into `sc`'s `[token][4]` layout by one 16-vector transpose-add tree ([`reduce16`]).

use std::arch::x86_64::*;

use super::kernels::step_tokens;
use crate::attention::tile::{NextRows, MAX_GROUPS, TILE};

/// A key codec whose codes enter `vpdpbusd` as unsigned bytes in head-dimension order.
pub(crate) trait IntKeys: Copy {
    /// The 64 values of chunk `c` (head dimensions `64c .. 64c + 64`) of the row at `row`, as
    /// `code + offset` bytes.
    ///
    /// # Safety
    /// `row` points to a whole stored head vector with more than `64c` values; AVX-512F/VL.
    unsafe fn chunk(&self, row: *const u8, c: usize) -> __m512i;
}

/// q8 codes (one signed byte per value, groups of 32 in order): XOR 0x80 is `c + 128`.
#[derive(Clone, Copy)]
pub(crate) struct Q8Keys;

impl IntKeys for Q8Keys {
    #[inline(always)]
    unsafe fn chunk(&self, row: *const u8, c: usize) -> __m512i {
        // SAFETY: 64 code bytes at 64c lie in the row (caller's contract).
        unsafe { _mm512_xor_si512(_mm512_loadu_si512(row.add(64 * c).cast()), _mm512_set1_epi8(-128)) }
    }
}

/// q4 nibbles (a group of 32 values in 16 bytes: byte `j` holds value `j` low and `j + 16`
/// high), as stored: `c + 8`. A chunk is two groups, 32 bytes, unpacked into value order.
#[derive(Clone, Copy)]
pub(crate) struct Q4Keys;

impl IntKeys for Q4Keys {
    #[inline(always)]
    unsafe fn chunk(&self, row: *const u8, c: usize) -> __m512i {
        // SAFETY: the 32 bytes of groups 2c and 2c + 1 lie in the row.
        unsafe {
            let b = _mm256_loadu_si256(row.add(32 * c).cast());
            let nib = _mm256_set1_epi8(0x0F);
            let lo = _mm256_and_si256(b, nib); // [g0 values 0..16 | g1 values 0..16]
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(b), nib); // [g0 16..32 | g1 16..32]
            let z = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
            // 128-bit quarters [lo.0, lo.1, hi.0, hi.1] → [lo.0, hi.0, lo.1, hi.1]: value order.
            _mm512_shuffle_i64x2::<0b11_01_10_00>(z, z)
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
/// AVX-512F/VL and AVX-512 VNNI; `d` a multiple of 64 (at most `MAX_FAST_HEAD_DIM`);
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
        let row_floats = 3 * d / 4;
        let (scales_at, corr_at) = (d / 4, d / 2);
        // Lanes 8..16 of a chunk read the second of its two key groups.
        let halves = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
        let mut t = t0;
        while t < t1 {
            let (tok, rows) = step_tokens::<TOK>(krows, t, t1, next);
            let mut f = [_mm512_setzero_ps(); 16]; // [token · 4 + row]
            for c in 0..d / 64 {
                // Key lanes 0..8 belong to group 2c, lanes 8..16 to group 2c + 1.
                let pick = _mm512_add_epi32(halves, _mm512_set1_epi32(2 * c as i32));
                let mut kx = [_mm512_setzero_si512(); TOK];
                let mut ks = [_mm512_setzero_ps(); TOK];
                for j in 0..TOK {
                    kx[j] = keys.chunk(rows[j], c);
                    // MAX_GROUPS = 16: the token's whole scale row in one vector.
                    let group_scales = _mm512_loadu_ps(kscale.as_ptr().add(tok[j] * MAX_GROUPS));
                    ks[j] = _mm512_permutexvar_ps(pick, group_scales);
                }
                for r in 0..R {
                    let row = lanes.add(r * row_floats);
                    let codes = _mm512_loadu_si512(row.add(16 * c).cast());
                    let qs = _mm512_loadu_ps(row.add(scales_at + 16 * c));
                    let corr = _mm512_loadu_si512(row.add(corr_at + 16 * c).cast());
                    for j in 0..TOK {
                        let sum = _mm512_dpbusd_epi32(corr, kx[j], codes);
                        let x = _mm512_mul_ps(_mm512_cvtepi32_ps(sum), qs);
                        f[4 * j + r] = _mm512_fmadd_ps(x, ks[j], f[4 * j + r]);
                    }
                }
            }
            _mm512_storeu_ps(sc.add(4 * t), reduce16(&f));
            t += TOK;
        }
    }
}

#[cfg(test)]
mod tests {
    //! The kernel against the f64 dot products of the decoded keys with the int8-rounded
    //! queries, on fresh random rows, both codecs, every row count, head_dims 64 to 256.

    use super::*;
    use crate::attention::queries::{int8_key_offset, int8_lane_floats, int8_lanes, quantize_query};
    use crate::attention::tile::SC_LEN;
    use half::f16;
    use kvcache::{Codec, KvFormat};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use rand_distr::StandardNormal;

    #[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2,fma,f16c")]
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

    #[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2,fma,f16c")]
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
                            let mut qc = vec![0i8; d];
                            let mut qs = vec![0f32; d / 8];
                            quantize_query(row, Some(&mut qc), Some(&mut qs));
                            int8_lanes(&qc, &qs, int8_key_offset(format), &mut lanes[r * lf..(r + 1) * lf]);
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
