//! `q4`: symmetric 4-bit codes with one f16 scale per group of 32 values.
//!
//! Encode (as ggml's Q4_0): `m` = the value of largest magnitude (with its sign),
//! `d = m / -8`, `q = clamp(round(x / d), -8, 7)`, stored as the nibble `q + 8`; decode:
//! `x̂ = d · (nibble − 8)`. Using the signed extreme gives all 16 levels to the data.
//! (ggml divides by the unrounded `m / -8`, this encoder by the stored f16 scale: on SmolLM2's
//! K and V the two pick different codes for 3e-4 of the values, with the same error.)
//!
//! Packing of a group of `n` values (n = 32, or 16 for a short last group) into `n/2` bytes:
//! byte `j` holds value `j` in its low nibble and value `j + n/2` in its high nibble, so a
//! SIMD kernel splits a 16-byte load into values 0–15 (`& 0xF`) and 16–31 (`>> 4`).

use half::f16;

/// The packed codes of one 32-value group, as laid out in the code plane.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Q4Group {
    pub packed: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<Q4Group>() == 16);

/// Encodes one group (`x.len()` ∈ {16, 32}) into `x.len()/2` packed bytes; returns its scale.
pub(crate) fn encode_group(x: &[f32], packed: &mut [u8]) -> f16 {
    let n = x.len();
    debug_assert!(n.is_multiple_of(2) && packed.len() == n / 2);
    let mut m = 0.0f32;
    for &v in x {
        if v.abs() > m.abs() {
            m = v;
        }
    }
    let scale = f16::from_f32(m / -8.0);
    let d = scale.to_f32();
    let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
    let code = |v: f32| ((v * inv).round().clamp(-8.0, 7.0) as i32 + 8) as u8;
    let half = n / 2;
    for j in 0..half {
        packed[j] = code(x[j]) | (code(x[j + half]) << 4);
    }
    scale
}

/// Decodes one packed group with its scale into `out` (`out.len()` = 2 × `packed.len()`).
pub(crate) fn decode_group(packed: &[u8], scale: f16, out: &mut [f32]) {
    let d = scale.to_f32();
    let half = packed.len();
    for (j, &b) in packed.iter().enumerate() {
        out[j] = d * ((b & 0xF) as i32 - 8) as f32;
        out[j + half] = d * ((b >> 4) as i32 - 8) as f32;
    }
}
