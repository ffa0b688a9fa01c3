//! GeGLU's activation: `gate[i] ← gelu(gate[i]) · up[i]` with GELU's tanh approximation,
//! `gelu(x) = x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))` (Gemma's `gelu_pytorch_tanh`).
//!
//! Computed as ggml-cpu computes it (`ggml_vec_geglu_f32` with `GGML_GELU_FP16`, its default):
//! inputs at or beyond ±10 take the limits (0 below, `x` above); in between the input is
//! rounded to f16 and the activation read from a table of `f16(gelu(x))` over every f16 `x`,
//! then widened and multiplied by `up` in f32. The f16 rounding moves each activation by up to
//! 2⁻¹¹ relative; matching it is what makes Gemma 3's layers agree with llama.cpp's
//! (`gemma3_golden`). [`gelu_tanh`] is the f32 function the table is built from, with the one
//! fused multiply-add ggml-cpu's build forms in it (C compilers contract `1 + c·x·x` by default
//! and ggml-cpu is built for the host's FMA): `fma(c·x, x, 1)`.

use std::sync::OnceLock;

use half::f16;
#[cfg(target_arch = "x86_64")]
use pagekv_cpu::quant::Isa;

/// `gate[i] ← gelu(gate[i]) · up[i]`, with ggml's f16 table in `(-10, 10)`, by the fastest
/// kernel of this CPU (all bit-exact with [`gelu_mul_scalar`]).
pub fn gelu_mul(gate: &mut [f32], up: &[f32]) {
    debug_assert_eq!(gate.len(), up.len());
    #[cfg(target_arch = "x86_64")]
    if Isa::best().has_avx2() {
        // SAFETY: has_avx2 means AVX2, FMA and F16C were detected on this CPU.
        unsafe { avx2::gelu_mul(gate, up, gelu_table()) };
        return;
    }
    gelu_mul_scalar(gate, up);
}

/// The scalar reference of [`gelu_mul`].
pub fn gelu_mul_scalar(gate: &mut [f32], up: &[f32]) {
    let table = gelu_table();
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x * u
        } else {
            table[f16::from_f32(x).to_bits() as usize] * u
        };
    }
}

/// `f16(gelu_tanh(x))` widened to f32, for every f16 bit pattern `x` (`[65536]`, 256 KiB, built
/// once; f32 entries so the vector kernel can gather them).
fn gelu_table() -> &'static [f32] {
    static TABLE: OnceLock<Vec<f32>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX).map(|bits| f16::from_f32(gelu_tanh(f16::from_bits(bits).to_f32())).to_f32()).collect()
    })
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// AVX2 [`gelu_mul`](super::gelu_mul): eight lanes at a time. `vcvtps2ph` with round to
    /// nearest even is `f16::from_f32` on every input of `(-10, 10)` (no overflow, no
    /// subnormal difference: both round the same binary value); the table entry is gathered by
    /// its bits; lanes at or beyond ±10 take the limits. The tail (fewer than 8) runs the scalar
    /// code.
    ///
    /// # Safety
    /// The CPU must support AVX2 and F16C, and `table` must hold 65,536 entries.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn gelu_mul(gate: &mut [f32], up: &[f32], table: &[f32]) {
        debug_assert_eq!(table.len(), 1 << 16);
        let n = gate.len().min(up.len());
        let main = n - n % 8;
        let (gp, up_p) = (gate.as_mut_ptr(), up.as_ptr());
        let (lo, hi) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0));
        for i in (0..main).step_by(8) {
            let x = _mm256_loadu_ps(gp.add(i));
            let u = _mm256_loadu_ps(up_p.add(i));
            let bits = _mm256_cvtepu16_epi32(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x));
            let act = _mm256_i32gather_ps::<4>(table.as_ptr(), bits);
            // x >= 10: x (the product gives x · up); x <= -10: +0 (not 0 · up, which can be -0).
            let act = _mm256_blendv_ps(act, x, _mm256_cmp_ps::<_CMP_GE_OQ>(x, hi));
            let out = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(x, lo), _mm256_mul_ps(act, u));
            _mm256_storeu_ps(gp.add(i), out);
        }
        super::gelu_mul_scalar(&mut gate[main..n], &up[main..n]);
    }
}

/// GELU, tanh approximation, in f32 (the limits beyond ±10 as ggml).
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF: f32 = 0.044_715;
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (COEF * x).mul_add(x, 1.0)).tanh())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        // gelu_tanh(1) = 0.841192, gelu_tanh(-1) = -0.158808, gelu_tanh(0) = 0.
        assert!((gelu_tanh(1.0) - 0.841_192).abs() < 1e-6);
        assert!((gelu_tanh(-1.0) + 0.158_808).abs() < 1e-6);
        assert_eq!(gelu_tanh(0.0), 0.0);
        assert_eq!(gelu_tanh(12.0), 12.0);
        assert_eq!(gelu_tanh(-12.0), 0.0);
        let mut g = [1.0, -1.0, 11.0, -11.0];
        gelu_mul(&mut g, &[2.0, 3.0, 0.5, 4.0]);
        // 1 and -1 are f16 values: the table holds f16(gelu(±1)).
        assert_eq!(g[0], f16::from_f32(0.841_192).to_f32() * 2.0);
        assert_eq!(g[1], f16::from_f32(-0.158_808).to_f32() * 3.0);
        assert_eq!((g[2], g[3]), (5.5, 0.0));
    }

    /// The vector kernel equals the scalar reference bit for bit on fresh random data: typical
    /// gates, the ±10 limits and values around them, f16's subnormal range, lengths with tails.
    #[test]
    fn gelu_mul_kernels_agree_bit_for_bit() {
        use rand::{Rng, SeedableRng};
        let seed =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for len in [1usize, 7, 8, 13, 2048] {
            let gate: Vec<f32> = (0..len)
                .map(|i| match i % 6 {
                    0 => rng.gen_range(-20.0..20.0),
                    1 => [-10.0, 10.0, -9.999_999, 9.999_999, -10.000_001, 10.000_001][i / 6 % 6],
                    2 => rng.gen_range(-5e-7..5e-7),
                    _ => rng.gen_range(-8.0..8.0),
                })
                .collect();
            let up: Vec<f32> = (0..len).map(|_| rng.gen_range(-4.0..4.0)).collect();
            let mut want = gate.clone();
            gelu_mul_scalar(&mut want, &up);
            let mut got = gate.clone();
            gelu_mul(&mut got, &up);
            for i in 0..len {
                assert_eq!(got[i].to_bits(), want[i].to_bits(), "seed {seed} len {len} i {i}: gate {}", gate[i]);
            }
        }
    }

    #[test]
    fn the_table_rounds_input_and_output_to_f16() {
        // Random inputs in (-10, 10): the result is f16(gelu(f16(x))) · up, within f16's
        // relative step of the exact activation.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..10_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let x = (state >> 40) as f32 / (1u64 << 24) as f32 * 20.0 - 10.0;
            let mut g = [x];
            gelu_mul(&mut g, &[1.5]);
            let want = f16::from_f32(gelu_tanh(f16::from_f32(x).to_f32())).to_f32() * 1.5;
            assert_eq!(g[0].to_bits(), want.to_bits(), "x = {x}");
            let exact = gelu_tanh(x) * 1.5;
            assert!((g[0] - exact).abs() <= 2e-3 * exact.abs() + 1e-3, "x = {x}: {} vs {exact}", g[0]);
        }
    }
}
