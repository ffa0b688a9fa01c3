//! `q8`: symmetric int8 codes with one f16 scale per group of 32 values.
//!
//! Encode: `d = max|x| / 127`, `q = round(x / d)` ∈ [-127, 127]; decode: `x̂ = d · q`.
//! In the pages the codes of one head vector are `D` contiguous bytes (group `g` at
//! `[32g, 32g + 32)`) and the scales are `ceil(D/32)` contiguous f16.

use half::f16;

/// The codes of one 32-value group, as laid out in the code plane.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Q8Group {
    pub codes: [i8; 32],
}
const _: () = assert!(std::mem::size_of::<Q8Group>() == 32);

/// Encodes one group (`x.len()` ≤ 32) into `codes` (same length); returns its scale.
pub(crate) fn encode_group(x: &[f32], codes: &mut [u8]) -> f16 {
    debug_assert_eq!(x.len(), codes.len());
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let scale = f16::from_f32(amax / 127.0);
    let d = scale.to_f32();
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = ((v * inv).round().clamp(-127.0, 127.0) as i8) as u8;
    }
    scale
}

/// Decodes one group of codes with its scale into `out`.
pub(crate) fn decode_group(codes: &[u8], scale: f16, out: &mut [f32]) {
    let d = scale.to_f32();
    for (o, &c) in out.iter_mut().zip(codes) {
        *o = d * (c as i8) as f32;
    }
}
