//! Scalar reference quantizers, bit-exact with ggml.
//!
//! - Weights (test data, small synthetic models): Q4_0, Q4_1, Q8_0 as ggml's
//!   `quantize_row_*_ref`. The K-quant weight formats have no quantizer here: tests build
//!   those blocks from random packed fields and sane scales.
//! - Activations of the integer dot products: Q8_0 and Q8_1 as ggml-cpu quantizes them on x86
//!   ([`quantize_q8_0_act`], [`quantize_q8_1_act`]), Q8_K as `quantize_row_q8_K_ref` (which
//!   is also what ggml-cpu runs on x86).

use super::blocks::*;
use super::types::{QuantError, WeightType};
use half::{bf16, f16};

/// Q8_0 weights (ggml `quantize_row_q8_0_ref`): `d = amax / 127`, `qs = round(x / d)` (ties away
/// from zero), `d` stored as f16.
pub fn quantize_q8_0(x: &[f32; QK]) -> BlockQ8_0 {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; QK];
    for (q, v) in qs.iter_mut().zip(x) {
        *q = (v * id).round() as i8;
    }
    BlockQ8_0 { d: f16::from_f32(d), qs }
}

/// The codes of Q8 activations as ggml-cpu's x86 `quantize_row_q8_0`/`quantize_row_q8_1`
/// (the AVX/AVX2 path llama.cpp runs on these CPUs) make them: `id = 127 / amax` and
/// `round_ties_even(x · id)`. Returns the codes and the unrounded `d = amax / 127`.
///
/// This differs from `quantize_row_q8_0_ref` ([`quantize_q8_0`]: `x · (1 / d)`, ties away from
/// zero) in about one code per thousand. One code moves a dot product by `d_x · w`, about
/// 1e-3 relative to a typical projection output, which is enough to flip llama.cpp's argmax
/// on near-ties; so the activations follow the path llama.cpp actually takes.
fn q8_act_codes(x: &[f32; QK]) -> ([i8; QK], f32) {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut qs = [0i8; QK];
    for (q, v) in qs.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8;
    }
    (qs, d)
}

/// Q8_0 activations (ggml-cpu x86 `quantize_row_q8_0`): the codes of [`q8_act_codes`] and
/// `d` stored as f16. The activations of Q4_0 and Q8_0 weights.
pub fn quantize_q8_0_act(x: &[f32; QK]) -> BlockQ8_0 {
    let (qs, d) = q8_act_codes(x);
    BlockQ8_0 { d: f16::from_f32(d), qs }
}

/// Q8_1 activations (ggml-cpu x86 `quantize_row_q8_1`): as [`quantize_q8_0_act`], plus
/// `s = f16(d · Σqs)` with the unrounded `d`. The activations of Q4_1 weights, whose offset
/// term `m_w · s` ggml takes from this f16 `s`.
pub fn quantize_q8_1_act(x: &[f32; QK]) -> BlockQ8_1 {
    let (qs, d) = q8_act_codes(x);
    let sum: i32 = qs.iter().map(|&q| q as i32).sum();
    BlockQ8_1 { d: f16::from_f32(d), s: f16::from_f32(d * sum as f32), qs }
}

/// Q4_0 (ggml `quantize_row_q4_0_ref`): `max` = the value of largest magnitude,
/// `d = max / -8`, `q = min(15, trunc(x / d + 8.5))`.
pub fn quantize_q4_0(x: &[f32; QK]) -> BlockQ4_0 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let code = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
    let mut qs = [0u8; QK / 2];
    for j in 0..QK / 2 {
        qs[j] = code(x[j]) | (code(x[j + QK / 2]) << 4);
    }
    BlockQ4_0 { d: f16::from_f32(d), qs }
}

/// Q4_1 (ggml `quantize_row_q4_1_ref`): `d = (max - min) / 15`, `m = min`,
/// `q = min(15, trunc((x - min) / d + 0.5))`.
pub fn quantize_q4_1(x: &[f32; QK]) -> BlockQ4_1 {
    let min = x.iter().fold(f32::MAX, |a, &v| a.min(v));
    let max = x.iter().fold(-f32::MAX, |a, &v| a.max(v));
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let code = |v: f32| (((v - min) * id + 0.5) as i8).min(15) as u8;
    let mut qs = [0u8; QK / 2];
    for j in 0..QK / 2 {
        qs[j] = code(x[j]) | (code(x[j + QK / 2]) << 4);
    }
    BlockQ4_1 { d: f16::from_f32(d), m: f16::from_f32(min), qs }
}

/// Q8_K (ggml `quantize_row_q8_K_ref`): `max` = the value of largest magnitude,
/// `iscale = -127 / max`, `qs = min(127, round_ties_even(iscale * x))`, `d = 1 / iscale`,
/// `bsums` the sums of 16 consecutive codes. An all-zero block has `d = 0`.
pub fn quantize_q8_k(x: &[f32; QK_K]) -> BlockQ8K {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    let mut b = BlockQ8K { d: 0.0, qs: [0; QK_K], bsums: [0; QK_K / 16] };
    if amax == 0.0 {
        return b;
    }
    let iscale = -127.0 / max;
    for (q, &v) in b.qs.iter_mut().zip(x) {
        *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
    }
    for (g, s) in b.bsums.iter_mut().enumerate() {
        *s = b.qs[16 * g..16 * g + 16].iter().map(|&q| q as i16).sum();
    }
    b.d = 1.0 / iscale;
    b
}

/// Quantizes one row of `x` into `ty`'s bytes, appended to `out`. Supported: F32, F16, BF16,
/// Q8_0, Q4_0, Q4_1 (the 5-bit, K- and non-linear formats have no reference quantizer here:
/// their kernels are tested on random blocks).
pub fn quantize_row(ty: WeightType, x: &[f32], out: &mut Vec<u8>) -> Result<(), QuantError> {
    ty.row_bytes(x.len())?;
    match ty {
        WeightType::F32 => x.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        WeightType::F16 => x.iter().for_each(|v| out.extend_from_slice(&f16::from_f32(*v).to_le_bytes())),
        WeightType::BF16 => x.iter().for_each(|v| out.extend_from_slice(&bf16::from_f32(*v).to_le_bytes())),
        WeightType::Q8_0 => blocks32(x, out, quantize_q8_0),
        WeightType::Q4_0 => blocks32(x, out, quantize_q4_0),
        WeightType::Q4_1 => blocks32(x, out, quantize_q4_1),
        WeightType::Q5_0
        | WeightType::Q5_1
        | WeightType::IQ4NL
        | WeightType::Q2K
        | WeightType::Q3K
        | WeightType::Q4K
        | WeightType::Q5K
        | WeightType::Q6K
        | WeightType::IQ4XS => return Err(QuantError::NoQuantizer(ty)),
    }
    Ok(())
}

fn blocks32<T: bytemuck::Pod>(x: &[f32], out: &mut Vec<u8>, q: fn(&[f32; QK]) -> T) {
    for chunk in x.chunks_exact(QK) {
        out.extend_from_slice(bytemuck::bytes_of(&q(chunk.try_into().expect("chunk of QK"))));
    }
}
