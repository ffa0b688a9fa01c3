//! One side (K or V) of a format: how a head vector of `head_dim` values becomes code bytes
//! and f16 scales, and back. These are the scalar reference encoder and decoder; rotation
//! (for rotated formats) is applied by the caller before `encode` and after `decode`.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::{group_len, groups, q4, q8, turbo, turbo_sub, GROUP};

/// The element codec of one side of a [`super::KvFormat`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Codec {
    F32,
    F16,
    Bf16,
    Q8,
    Q4,
    /// Lloyd–Max codes for N(0,1), `bits` ∈ {2, 3, 4, 8}.
    LloydMax {
        bits: u8,
    },
    /// Lloyd–Max codes, `bits` ∈ {2, 3, 4}, scaled per 8 values by one f16 per head vector
    /// times a 4-bit multiplier (turbo's value side; [`turbo_sub`]).
    LloydMaxSub {
        bits: u8,
    },
}

impl Codec {
    /// Whether this codec stores values as floats (f32, f16, bf16) rather than quantized codes.
    pub fn is_float(&self) -> bool {
        matches!(self, Codec::F32 | Codec::F16 | Codec::Bf16)
    }

    /// Code bytes of one head vector.
    pub fn code_bytes(&self, head_dim: usize) -> usize {
        match *self {
            Codec::F32 => 4 * head_dim,
            Codec::F16 | Codec::Bf16 => 2 * head_dim,
            Codec::Q8 => head_dim,
            Codec::Q4 => head_dim / 2,
            Codec::LloydMax { bits } | Codec::LloydMaxSub { bits } => head_dim * bits as usize / 8,
        }
    }

    /// f16 scale slots of one head vector (0 for the float formats; for [`Codec::LloydMaxSub`]
    /// the head's scale and the packed 4-bit multipliers).
    pub fn scales(&self, head_dim: usize) -> usize {
        match self {
            Codec::F32 | Codec::F16 | Codec::Bf16 => 0,
            Codec::LloydMaxSub { .. } => turbo_sub::scale_slots(head_dim),
            _ => groups(head_dim),
        }
    }

    /// Encodes `x` (`[head_dim]`) into `codes` (`[code_bytes]`) and `scales` (`[scales]`).
    pub fn encode(&self, x: &[f32], codes: &mut [u8], scales: &mut [f16]) {
        let d = x.len();
        debug_assert_eq!(codes.len(), self.code_bytes(d));
        debug_assert_eq!(scales.len(), self.scales(d));
        match *self {
            Codec::F32 => {
                for (c, v) in codes.chunks_exact_mut(4).zip(x) {
                    c.copy_from_slice(&v.to_le_bytes());
                }
            }
            Codec::F16 => match bytemuck::try_cast_slice_mut::<u8, f16>(codes) {
                // Pages are aligned: convert straight into them (`half` uses F16C when present).
                Ok(dst) if cfg!(target_endian = "little") => dst.convert_from_f32_slice(x),
                _ => {
                    for (c, v) in codes.chunks_exact_mut(2).zip(x) {
                        c.copy_from_slice(&f16::from_f32(*v).to_le_bytes());
                    }
                }
            },
            Codec::Bf16 => {
                for (c, v) in codes.chunks_exact_mut(2).zip(x) {
                    c.copy_from_slice(&bf16::from_f32(*v).to_le_bytes());
                }
            }
            Codec::Q8 => {
                for (g, scale) in scales.iter_mut().enumerate().take(groups(d)) {
                    let r = g * GROUP..g * GROUP + group_len(d, g);
                    *scale = q8::encode_group(&x[r.clone()], &mut codes[r]);
                }
            }
            Codec::Q4 => {
                for (g, scale) in scales.iter_mut().enumerate().take(groups(d)) {
                    let n = group_len(d, g);
                    let start = g * GROUP;
                    *scale = q4::encode_group(&x[start..start + n], &mut codes[start / 2..(start + n) / 2]);
                }
            }
            Codec::LloydMax { bits } => {
                codes.fill(0);
                for (g, scale) in scales.iter_mut().enumerate().take(groups(d)) {
                    let n = group_len(d, g);
                    let start = g * GROUP;
                    *scale = turbo::encode_group(&x[start..start + n], bits, start, codes);
                }
            }
            Codec::LloydMaxSub { bits } => turbo_sub::encode(x, bits, codes, scales),
        }
    }

    /// Decodes `codes` and `scales` into `out` (`[head_dim]`).
    pub fn decode(&self, codes: &[u8], scales: &[f16], out: &mut [f32]) {
        let d = out.len();
        debug_assert_eq!(codes.len(), self.code_bytes(d));
        debug_assert_eq!(scales.len(), self.scales(d));
        match *self {
            Codec::F32 => {
                for (o, c) in out.iter_mut().zip(codes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            Codec::F16 => {
                for (o, c) in out.iter_mut().zip(codes.chunks_exact(2)) {
                    *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
            Codec::Bf16 => {
                for (o, c) in out.iter_mut().zip(codes.chunks_exact(2)) {
                    *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
            Codec::Q8 => {
                for (g, &scale) in scales.iter().enumerate().take(groups(d)) {
                    let r = g * GROUP..g * GROUP + group_len(d, g);
                    q8::decode_group(&codes[r.clone()], scale, &mut out[r]);
                }
            }
            Codec::Q4 => {
                for (g, &scale) in scales.iter().enumerate().take(groups(d)) {
                    let n = group_len(d, g);
                    let start = g * GROUP;
                    q4::decode_group(&codes[start / 2..(start + n) / 2], scale, &mut out[start..start + n]);
                }
            }
            Codec::LloydMax { bits } => {
                for (g, &scale) in scales.iter().enumerate().take(groups(d)) {
                    let n = group_len(d, g);
                    let start = g * GROUP;
                    turbo::decode_group(codes, bits, start, scale, &mut out[start..start + n]);
                }
            }
            Codec::LloydMaxSub { bits } => turbo_sub::decode(codes, scales, bits, out),
        }
    }
}

/// Reads the `bits`-wide Lloyd–Max code of value `i` from a head vector's code bytes.
pub fn lloyd_max_code(codes: &[u8], bits: u8, i: usize) -> u8 {
    turbo::get_bits(codes, i * bits as usize, bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f16 encoder converts whole slices (F16C when present); it must round exactly as
    /// `f16::from_f32` does, subnormals, ties, infinities and overflow included, aligned or not.
    #[test]
    fn f16_slice_encoding_matches_the_scalar_conversion() {
        let mut seed = 0x1234_5678_9ABC_DEF1u64;
        let mut x: Vec<f32> = (0..4096)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                f32::from_bits((seed >> 32) as u32)
            })
            .filter(|v| !v.is_nan())
            .take(2048)
            .collect();
        x.extend([
            0.0,
            -0.0,
            1e-8,
            -6.1e-5,
            65504.0,
            65520.0,
            1e6,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1.0 + 1.0 / 2048.0,
        ]);
        x.truncate(x.len() / 32 * 32);
        let want: Vec<u8> = x.iter().flat_map(|v| f16::from_f32(*v).to_le_bytes()).collect();
        let mut backing = vec![0u8; want.len() + 1];
        for offset in [0, 1] {
            let codes = &mut backing[offset..offset + want.len()];
            Codec::F16.encode(&x, codes, &mut []);
            assert_eq!(codes, &want[..], "offset {offset}");
        }
    }
}
