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
    use pagekv_cpu::expf::expf_avx2;
    use std::arch::x86_64::*;

    /// AVX2 [`silu_mul`](super::silu_mul): eight lanes at a time with ggml's vector `expf`
    /// ([`expf_avx2`], lane-exact with the scalar [`expf`] everywhere, huge `|gate|` included);
    /// the tail (fewer than 8 values) runs the scalar code.
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
            let e = expf_avx2(_mm256_sub_ps(_mm256_setzero_ps(), x));
            let silu = _mm256_div_ps(x, _mm256_add_ps(one, e));
            _mm256_storeu_ps(gp.add(i), _mm256_mul_ps(silu, _mm256_loadu_ps(up_p.add(i))));
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
