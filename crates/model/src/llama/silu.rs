//! SwiGLU's `silu(gate) · up` as llama.cpp's ggml-cpu computes it (`ggml_vec_swiglu_f32`):
//! `x / (1 + e^-x)` with ggml's vector `expf` ([`pagekv_cpu::expf`], the AVX-512 form of
//! `ggml_v_expf`) instead of libm's correctly rounded `expf`.
//!
//! Why not libm: the product is quantized to 8 bits for the next matrix product, so a 1-ulp
//! difference in a tenth of the values flips a few codes per layer, and 30 layers
//! amplify that into logit differences of ~0.3 — enough to change llama.cpp's argmax on
//! near-ties. [`silu_mul_scalar`] is the reference (FMAs as `mul_add`, so it is bit-exact
//! with the vector code); [`silu_mul`] picks the AVX2 kernel where the CPU has it.

use pagekv_cpu::expf::expf;
use pagekv_cpu::quant::Isa;

/// `gate[i] ← silu(gate[i]) · up[i]` with the fastest kernel of this CPU (all bit-exact with
/// [`silu_mul_scalar`]).
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    debug_assert_eq!(gate.len(), up.len());
    #[cfg(target_arch = "x86_64")]
    if Isa::best().has_avx2() {
        // SAFETY: has_avx2 means AVX2, FMA and F16C were detected on this CPU.
        unsafe { avx2::silu_mul(gate, up) };
        return;
    }
    silu_mul_scalar(gate, up);
}

/// The scalar reference of [`silu_mul`].
pub fn silu_mul_scalar(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + expf(0.0 - *g)) * u;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use pagekv_cpu::expf::{C1, C2, C3, C4, C5, INV_LN2, LN2_HI, LN2_LO, SHIFT};
    use std::arch::x86_64::*;

    /// Eight lanes of [`expf`] for lanes with `|n| <= 126` (where `2^n` is a normal f32 and
    /// one multiply is exact up to the final rounding); `None` when a lane is outside, for the
    /// caller to take the scalar path.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn expf8(x: __m256) -> Option<__m256> {
        let r = _mm256_set1_ps(SHIFT);
        let z = _mm256_fmadd_ps(x, _mm256_set1_ps(INV_LN2), r);
        let n = _mm256_sub_ps(z, r);
        let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
        if _mm256_movemask_ps(_mm256_cmp_ps(abs_n, _mm256_set1_ps(126.0), _CMP_GT_OQ)) != 0 {
            return None;
        }
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
        // 2^n: n sits in the low mantissa bits of z; shifted into the exponent field and
        // added to 1.0's bits.
        let e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
        let k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1.0))));
        Some(_mm256_mul_ps(j, k))
    }

    /// AVX2 [`silu_mul`](super::silu_mul); the tail (fewer than 8 values) and any 8 values
    /// with a huge `|gate|` (> 87) run the scalar code, which is bit-exact with the vector lanes.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn silu_mul(gate: &mut [f32], up: &[f32]) {
        let n = gate.len().min(up.len());
        let main = n - n % 8;
        let (gp, up_p) = (gate.as_mut_ptr(), up.as_ptr());
        let one = _mm256_set1_ps(1.0);
        for i in (0..main).step_by(8) {
            let x = _mm256_loadu_ps(gp.add(i));
            match expf8(_mm256_sub_ps(_mm256_setzero_ps(), x)) {
                Some(e) => {
                    let silu = _mm256_div_ps(x, _mm256_add_ps(one, e));
                    _mm256_storeu_ps(gp.add(i), _mm256_mul_ps(silu, _mm256_loadu_ps(up_p.add(i))));
                }
                None => silu_mul_scalar(&mut gate[i..i + 8], &up[i..i + 8]),
            }
        }
        silu_mul_scalar(&mut gate[main..n], &up[main..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn fresh_seed() -> u64 {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
        t.as_nanos() as u64 ^ (std::process::id() as u64) << 32
    }

    #[test]
    fn silu_mul_kernels_agree_bit_for_bit() {
        let seed = fresh_seed();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for len in [1, 7, 8, 13, 1536] {
            // Typical gate values, plus the ranges where the exp takes its other branches.
            let gate: Vec<f32> = (0..len)
                .map(|i| match i % 5 {
                    0 => rng.gen_range(-95.0..-85.0),
                    1 => rng.gen_range(-150.0..150.0),
                    _ => rng.gen_range(-8.0..8.0),
                })
                .collect();
            let up: Vec<f32> = (0..len).map(|_| rng.gen_range(-4.0..4.0)).collect();
            let mut want = gate.clone();
            silu_mul_scalar(&mut want, &up);
            let mut got = gate.clone();
            silu_mul(&mut got, &up);
            for i in 0..len {
                assert_eq!(got[i].to_bits(), want[i].to_bits(), "seed {seed} len {len} i {i}: gate {}", gate[i]);
                let exact = gate[i] as f64 / (1.0 + (-gate[i] as f64).exp()) * up[i] as f64;
                assert!(
                    (want[i] as f64 - exact).abs() <= 1e-6 * exact.abs() + 1e-30,
                    "seed {seed}: {} vs {exact}",
                    want[i]
                );
            }
        }
    }
}
