//! `turbo` codes: Lloyd–Max indices for N(0,1), `bits` ∈ {2, 3, 4, 8} per value, one f16
//! scale per group of 32 values (the group's RMS after rotation).
//!
//! Encode a rotated group `y`: `s = sqrt(mean(y²))`, `code = nearest level of y / s`;
//! decode: `ŷ = s · level[code]`. Codes of a head vector form one little-endian bit stream
//! (value `i` occupies bits `[i·bits, (i+1)·bits)`), so 8 values of 3 bits fill exactly 3
//! bytes and no value straddles a group of 8.

use half::f16;

use super::lloyd_max::codebook;

/// Encodes one group (`y` rotated, `y.len()` ≤ 32, starting at value index `first`) into the
/// head vector's bit stream `stream`; returns its scale.
pub(crate) fn encode_group(y: &[f32], bits: u8, first: usize, stream: &mut [u8]) -> f16 {
    let ms = y.iter().map(|v| v * v).sum::<f32>() / y.len() as f32;
    let scale = f16::from_f32(ms.sqrt());
    let s = scale.to_f32();
    let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
    let book = codebook(bits);
    for (i, &v) in y.iter().enumerate() {
        put_bits(stream, (first + i) * bits as usize, bits, book.encode(v * inv));
    }
    scale
}

/// Decodes one group (`out.len()` values starting at value index `first`) of the bit stream.
pub(crate) fn decode_group(stream: &[u8], bits: u8, first: usize, scale: f16, out: &mut [f32]) {
    let s = scale.to_f32();
    let book = codebook(bits);
    for (i, o) in out.iter_mut().enumerate() {
        *o = s * book.levels[get_bits(stream, (first + i) * bits as usize, bits) as usize];
    }
}

/// Reads the `bits`-wide code at bit offset `at` of a little-endian bit stream.
#[inline]
pub fn get_bits(stream: &[u8], at: usize, bits: u8) -> u8 {
    let byte = at / 8;
    let shift = at % 8;
    let lo = stream[byte] as u16;
    let hi = if shift + bits as usize > 8 { stream[byte + 1] as u16 } else { 0 };
    (((lo | (hi << 8)) >> shift) & ((1u16 << bits) - 1)) as u8
}

fn put_bits(stream: &mut [u8], at: usize, bits: u8, code: u8) {
    let byte = at / 8;
    let shift = at % 8;
    let word = (code as u16) << shift;
    let mask = ((1u16 << bits) - 1) << shift;
    stream[byte] = (stream[byte] & !(mask as u8)) | word as u8;
    if shift + bits as usize > 8 {
        stream[byte + 1] = (stream[byte + 1] & !((mask >> 8) as u8)) | (word >> 8) as u8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_stream_round_trips_every_width() {
        for bits in [2u8, 3, 4, 8] {
            let n = 40;
            let mut stream = vec![0u8; n * bits as usize / 8];
            let codes: Vec<u8> = (0..n).map(|i| ((i * 7 + 3) % (1 << bits)) as u8).collect();
            for (i, &c) in codes.iter().enumerate() {
                put_bits(&mut stream, i * bits as usize, bits, c);
            }
            for (i, &c) in codes.iter().enumerate() {
                assert_eq!(get_bits(&stream, i * bits as usize, bits), c, "bits={bits} i={i}");
            }
        }
    }
}
