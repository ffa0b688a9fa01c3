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

/// `gate[i] ← gelu(gate[i]) · up[i]`, with ggml's f16 table in `(-10, 10)`.
pub fn gelu_mul(gate: &mut [f32], up: &[f32]) {
    debug_assert_eq!(gate.len(), up.len());
    let table = gelu_table();
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x * u
        } else {
            table[f16::from_f32(x).to_bits() as usize].to_f32() * u
        };
    }
}

/// `f16(gelu_tanh(x))` for every f16 bit pattern `x` (`[65536]`, 128 KiB, built once).
fn gelu_table() -> &'static [f16] {
    static TABLE: OnceLock<Vec<f16>> = OnceLock::new();
    TABLE.get_or_init(|| (0..=u16::MAX).map(|bits| f16::from_f32(gelu_tanh(f16::from_bits(bits).to_f32()))).collect())
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
