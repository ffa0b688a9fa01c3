//! ggml's vector `expf` (`ggml_v_expf`, adapted from Arm's optimized-routines: range
//! reduction by `ln 2`, a degree-5 polynomial, within 2.2 ulp) as one scalar lane, its
//! constants for vector kernels built on it (SwiGLU in the model, ggml-numerics attention), and
//! two vector forms lane-exact to the scalar one ([`expf_avx512`], [`expf_avx2`]).
//!
//! ggml has one `ggml_v_expf` per instruction set, and they round differently: the AVX2 one
//! returns `k + k·p` (`k = 2^n`), the AVX-512 one `scalef(1 + p, n)`. This is the AVX-512 form,
//! which the golden data in ../shared/reference was produced with (llama.cpp built with
//! `-march=native` on an AVX-512 host); a llama.cpp built for AVX2 only differs from it by one
//! ulp in about one value in eight. Why not libm: llama.cpp quantizes the next matrix product's
//! input to 8 bits, so a 1-ulp difference in a tenth of the values flips a few codes per layer,
//! and 30 layers amplify that into logit differences that change argmax on near-ties.

// Constants of ggml_v_expf (the C source writes them as hex floats).
/// `0x1.8p23`: adding it rounds to an integer in the low mantissa bits.
pub const SHIFT: f32 = f32::from_bits(0x4b40_0000);
/// `0x1.715476p+0` ≈ 1 / ln 2.
pub const INV_LN2: f32 = f32::from_bits(0x3fb8_aa3b);
/// `0x1.62e4p-1` and `0x1.7f7d1cp-20`: ln 2 split in a high and a low part.
pub const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
pub const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
/// Polynomial coefficients `0x1.0e4020p-7`, `0x1.573e2ep-5`, `0x1.555e66p-3`, `0x1.fffdb6p-2`,
/// `0x1.ffffecp-1`.
pub const C5: f32 = f32::from_bits(0x3c07_2010);
pub const C4: f32 = f32::from_bits(0x3d2b_9f17);
pub const C3: f32 = f32::from_bits(0x3e2a_af33);
pub const C2: f32 = f32::from_bits(0x3eff_fedb);
pub const C1: f32 = f32::from_bits(0x3f7f_fff6);

/// ggml's AVX-512 `ggml_v_expf` for one lane: `e^x = 2^n · (1 + p(b))`, `n = round(x / ln 2)`,
/// `b = x − n ln 2`, the scaling by `2^n` rounded once (`vscalefps`); 0 or ∞ past `|n| > 192`.
/// Within about 2 ulp of `e^x`.
#[inline(always)]
pub fn expf(x: f32) -> f32 {
    let z = x.mul_add(INV_LN2, SHIFT);
    let n = z - SHIFT;
    let b = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let u = b * b;
    let j = C5.mul_add(b, C4).mul_add(u, C3.mul_add(b, C2)).mul_add(u, C1.mul_add(b, 1.0));
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    // j · 2^n rounded once: exact in f64, then one rounding to f32 (subnormals included).
    (j as f64 * 2f64.powi(n as i32)) as f32
}

/// [`expf`] on the 16 lanes of an AVX-512 register: ggml's `ggml_v_expf` (AVX-512 form) with
/// the same intrinsics, lane for lane bit-identical to [`expf`].
///
/// # Safety
/// The CPU has AVX-512F, and the caller is compiled with it (this inlines into it).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn expf_avx512(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let r = _mm512_set1_ps(SHIFT);
    let z = _mm512_fmadd_ps(x, _mm512_set1_ps(INV_LN2), r);
    let n = _mm512_sub_ps(z, r);
    let b = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x));
    let big = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
    let u = _mm512_mul_ps(b, b);
    let j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(
            _mm512_fmadd_ps(_mm512_set1_ps(C5), b, _mm512_set1_ps(C4)),
            u,
            _mm512_fmadd_ps(_mm512_set1_ps(C3), b, _mm512_set1_ps(C2)),
        ),
        u,
        _mm512_fmadd_ps(_mm512_set1_ps(C1), b, _mm512_set1_ps(1.0)),
    );
    let res = _mm512_scalef_ps(j, n);
    let alt = _mm512_mask_blend_ps(
        _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, _mm512_setzero_ps()),
        _mm512_set1_ps(f32::INFINITY),
        _mm512_setzero_ps(),
    );
    _mm512_mask_blend_ps(big, res, alt)
}

/// [`expf`] on the 8 lanes of an AVX2 register, lane for lane bit-identical to it (so to the
/// AVX-512 form, not to ggml's own AVX2 `ggml_v_expf`, which rounds `k + k·p` instead): AVX2
/// has no `vscalefps`, so `j · 2^n` is taken as `(j · 2^n1) · 2^n2` with `n1 + n2 = n`, both
/// powers normal and the first product exact (`n2` = 0 for `-126 ≤ n ≤ 127`, 96 above, −100
/// below), which rounds once as `vscalefps` does, subnormal and overflowing results included.
///
/// # Safety
/// The CPU has AVX2 and FMA, and the caller is compiled with them (this inlines into it).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn expf_avx2(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let r = _mm256_set1_ps(SHIFT);
    let z = _mm256_fmadd_ps(x, _mm256_set1_ps(INV_LN2), r);
    let n = _mm256_sub_ps(z, r);
    let b = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x));
    let u = _mm256_mul_ps(b, b);
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(_mm256_set1_ps(C5), b, _mm256_set1_ps(C4)),
            u,
            _mm256_fmadd_ps(_mm256_set1_ps(C3), b, _mm256_set1_ps(C2)),
        ),
        u,
        _mm256_fmadd_ps(_mm256_set1_ps(C1), b, _mm256_set1_ps(1.0)),
    );
    // n is an integer here (lanes past |n| > 192, NaN included, are replaced below).
    let ni = _mm256_cvtps_epi32(n);
    let above = _mm256_cmpgt_epi32(ni, _mm256_set1_epi32(127));
    let below = _mm256_cmpgt_epi32(_mm256_set1_epi32(-126), ni);
    let n2 = _mm256_or_si256(
        _mm256_and_si256(above, _mm256_set1_epi32(96)),
        _mm256_and_si256(below, _mm256_set1_epi32(-100)),
    );
    // 2^e for -126 <= e <= 127: the biased exponent alone (no closure: it would not inline
    // with the caller's target features).
    let bias = _mm256_set1_epi32(127);
    let pow_n1 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_sub_epi32(ni, n2), bias)));
    let pow_n2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n2, bias)));
    let res = _mm256_mul_ps(_mm256_mul_ps(j, pow_n1), pow_n2);
    let abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
    let big = _mm256_cmp_ps::<_CMP_GT_OQ>(abs, _mm256_set1_ps(192.0));
    let alt = _mm256_blendv_ps(
        _mm256_set1_ps(f32::INFINITY),
        _mm256_setzero_ps(),
        _mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps()),
    );
    _mm256_blendv_ps(res, alt, big)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};

    fn fresh_seed() -> u64 {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
        t.as_nanos() as u64 ^ (std::process::id() as u64) << 32
    }

    #[test]
    fn expf_is_within_three_ulps_of_exp() {
        // Arm's routine is within 1.95 ulp; ggml's AVX-512 form adds the rounding of `1 + p`
        // (2.2 ulp at worst over a sweep of every 97th f32 in the range).
        let seed = fresh_seed();
        let mut rng = StdRng::seed_from_u64(seed);
        for _ in 0..100_000 {
            let x: f32 = rng.gen_range(-87.0..88.0);
            let (got, want) = (expf(x), (x as f64).exp());
            let ulp = f32::from_bits((want as f32).to_bits() + 1) as f64 - want as f32 as f64;
            assert!(((got as f64 - want) / ulp).abs() <= 3.0, "seed {seed}: expf({x}) = {got}, exp = {want}");
        }
        assert_eq!(expf(0.0), 1.0);
        // Past the normal range: subnormal results, then overflow and saturation.
        for x in [-90.0f32, -95.5, -100.0, -103.0] {
            let want = (x as f64).exp();
            assert!(expf(x) > 0.0 && expf(x) < f32::MIN_POSITIVE);
            assert!((expf(x) as f64 - want).abs() <= 2.0 * 1.4e-45, "expf({x}) = {}, exp = {want}", expf(x));
        }
        assert_eq!(expf(89.0), f32::INFINITY);
        assert_eq!(expf(-200.0), 0.0);
        assert_eq!(expf(200.0), f32::INFINITY);
    }

    /// ggml's AVX-512 `ggml_v_expf`, transcribed from vec.h with the same intrinsics.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    fn ggml_v_expf_avx512(x: &[f32; 16]) -> [f32; 16] {
        use std::arch::x86_64::*;
        let x = unsafe { _mm512_loadu_ps(x.as_ptr()) };
        let r = _mm512_set1_ps(SHIFT);
        let z = _mm512_fmadd_ps(x, _mm512_set1_ps(INV_LN2), r);
        let n = _mm512_sub_ps(z, r);
        let b = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x));
        let d = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
        let u = _mm512_mul_ps(b, b);
        let j = _mm512_fmadd_ps(
            _mm512_fmadd_ps(
                _mm512_fmadd_ps(_mm512_set1_ps(C5), b, _mm512_set1_ps(C4)),
                u,
                _mm512_fmadd_ps(_mm512_set1_ps(C3), b, _mm512_set1_ps(C2)),
            ),
            u,
            _mm512_fmadd_ps(_mm512_set1_ps(C1), b, _mm512_set1_ps(1.0)),
        );
        let res = _mm512_scalef_ps(j, n);
        let alt = _mm512_mask_blend_ps(
            _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, _mm512_setzero_ps()),
            _mm512_set1_ps(f32::INFINITY),
            _mm512_setzero_ps(),
        );
        let out = _mm512_mask_blend_ps(d, res, alt);
        let mut o = [0f32; 16];
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), out) };
        o
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn expf_is_bit_identical_to_the_avx512_kernel() {
        if !std::is_x86_feature_detected!("avx512f") {
            eprintln!("skipped: no AVX-512 on this CPU");
            return;
        }
        let mut rng = StdRng::seed_from_u64(11);
        for round in 0..20_000 {
            let mut x = [0f32; 16];
            for v in x.iter_mut() {
                // Softmax inputs (≤ 0) down into the subnormal and flushed range, a few above.
                *v = if round % 8 == 0 { rng.gen_range(-140.0..100.0) } else { rng.gen_range(-30.0..0.0) };
            }
            // SAFETY: AVX-512F was detected.
            let want = unsafe { ggml_v_expf_avx512(&x) };
            for (xi, w) in x.iter().zip(want) {
                assert_eq!(expf(*xi).to_bits(), w.to_bits(), "x {xi}");
            }
        }
    }

    /// Inputs over every branch of the vector forms: softmax inputs, the subnormal and flushed
    /// range, overflow, the |n| = 192 edges, the 2^n split points (n = -126, 127) and specials.
    fn vector_inputs(rng: &mut StdRng) -> Vec<f32> {
        let mut v: Vec<f32> = (0..200_000)
            .map(|i| match i % 4 {
                0 => rng.gen_range(-30.0..0.0),
                1 => rng.gen_range(-140.0..-80.0),
                2 => rng.gen_range(80.0..140.0),
                _ => rng.gen_range(-200.0..200.0),
            })
            .collect();
        for n in [-193.0f32, -192.0, -127.0, -126.0, -125.0, 127.0, 128.0, 192.0, 193.0] {
            let x = n * std::f32::consts::LN_2;
            for k in -40..=40 {
                v.push(f32::from_bits((x.to_bits() as i32 + k) as u32));
            }
        }
        v.extend([0.0, -0.0, f32::NEG_INFINITY, f32::INFINITY, f32::MIN, f32::MAX, -1e-30, 1e-30]);
        v
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    fn expf_avx512_lanes(x: &[f32; 16]) -> [f32; 16] {
        use std::arch::x86_64::*;
        let mut o = [0f32; 16];
        // SAFETY: AVX-512F is enabled here (callers check the CPU); 16 floats each side.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), expf_avx512(_mm512_loadu_ps(x.as_ptr()))) };
        o
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn expf_avx2_lanes(x: &[f32; 8]) -> [f32; 8] {
        use std::arch::x86_64::*;
        let mut o = [0f32; 8];
        // SAFETY: AVX2 and FMA are enabled here (callers check the CPU); 8 floats each side.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), expf_avx2(_mm256_loadu_ps(x.as_ptr()))) };
        o
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn vector_forms_are_lane_exact() {
        let seed = fresh_seed();
        let mut rng = StdRng::seed_from_u64(seed);
        let mut v = vector_inputs(&mut rng);
        v.shuffle(&mut rng);
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            for c in v.chunks_exact(8) {
                let x: [f32; 8] = c.try_into().unwrap();
                // SAFETY: AVX2 and FMA were detected.
                let got = unsafe { expf_avx2_lanes(&x) };
                for (xi, g) in x.iter().zip(got) {
                    assert!(same(g, expf(*xi)), "seed {seed}: avx2 expf({xi}) = {g}, scalar {}", expf(*xi));
                }
            }
        } else {
            eprintln!("skipped AVX2: not on this CPU");
        }
        if std::is_x86_feature_detected!("avx512f") {
            for c in v.chunks_exact(16) {
                let x: [f32; 16] = c.try_into().unwrap();
                // SAFETY: AVX-512F was detected.
                let got = unsafe { expf_avx512_lanes(&x) };
                for (xi, g) in x.iter().zip(got) {
                    assert!(same(g, expf(*xi)), "seed {seed}: avx512 expf({xi}) = {g}, scalar {}", expf(*xi));
                }
            }
        } else {
            eprintln!("skipped AVX-512: not on this CPU");
        }
    }

    #[test]
    fn expf_is_within_two_ulp_and_flushes_like_ggml() {
        let mut rng = StdRng::seed_from_u64(9);
        for _ in 0..200_000 {
            let x: f32 = rng.gen_range(-103.0..88.0);
            let want = (x as f64).exp() as f32;
            let got = expf(x);
            let ulp = want.to_bits().abs_diff(got.to_bits());
            assert!(ulp <= 2, "x {x}: {got} vs {want}");
        }
        assert_eq!(expf(0.0), 1.0);
        // |n| > 192: flushed to 0 below (masked positions, -inf, give exact zeros), ∞ above.
        assert_eq!(expf(-140.0), 0.0);
        assert_eq!(expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(expf(140.0), f32::INFINITY);
        assert!(expf(-95.0) > 0.0, "subnormal results are kept, not flushed");
    }
}
