//! Scalar reference dequantizers, written from each format's definition (ggml
//! `dequantize_row_*`). They are the oracle for every fast kernel and also serve cold paths
//! such as embedding lookups.

// Kernels and references index several parallel arrays by the same lane or row.
#![allow(clippy::needless_range_loop)]

use super::blocks::*;
use super::types::{QuantError, WeightType};
use bytemuck::pod_read_unaligned;
use half::{bf16, f16};

/// Q4_0: `x[j] = d * (lo(qs[j]) - 8)`, `x[j + 16] = d * (hi(qs[j]) - 8)`.
pub fn dequantize_q4_0(b: &BlockQ4_0, out: &mut [f32; QK]) {
    let d = b.d.to_f32();
    for j in 0..QK / 2 {
        out[j] = d * ((b.qs[j] & 0xF) as i32 - 8) as f32;
        out[j + QK / 2] = d * ((b.qs[j] >> 4) as i32 - 8) as f32;
    }
}

/// Q4_1: `x[j] = d * lo(qs[j]) + m`, `x[j + 16] = d * hi(qs[j]) + m`.
pub fn dequantize_q4_1(b: &BlockQ4_1, out: &mut [f32; QK]) {
    let (d, m) = (b.d.to_f32(), b.m.to_f32());
    for j in 0..QK / 2 {
        out[j] = d * (b.qs[j] & 0xF) as f32 + m;
        out[j + QK / 2] = d * (b.qs[j] >> 4) as f32 + m;
    }
}

/// The 5-bit codes of a Q5_0/Q5_1 block: `q[j] = lo(qs[j]) | bit_j(qh) << 4`,
/// `q[j + 16] = hi(qs[j]) | bit_{j+16}(qh) << 4`.
pub fn q5_codes(qh: &[u8; 4], qs: &[u8; QK / 2]) -> [u8; QK] {
    let h = u32::from_le_bytes(*qh);
    let mut q = [0u8; QK];
    for j in 0..QK / 2 {
        q[j] = (qs[j] & 0xF) | ((((h >> j) & 1) as u8) << 4);
        q[j + QK / 2] = (qs[j] >> 4) | ((((h >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

/// Q5_0: `x = d * (q - 16)` (codes by [`q5_codes`]).
pub fn dequantize_q5_0(b: &BlockQ5_0, out: &mut [f32; QK]) {
    let d = b.d.to_f32();
    for (o, q) in out.iter_mut().zip(q5_codes(&b.qh, &b.qs)) {
        *o = d * (q as i32 - 16) as f32;
    }
}

/// Q5_1: `x = d * q + m` (codes by [`q5_codes`]).
pub fn dequantize_q5_1(b: &BlockQ5_1, out: &mut [f32; QK]) {
    let (d, m) = (b.d.to_f32(), b.m.to_f32());
    for (o, q) in out.iter_mut().zip(q5_codes(&b.qh, &b.qs)) {
        *o = d * q as f32 + m;
    }
}

/// IQ4_NL: `x[j] = d * KVALUES_IQ4NL[lo(qs[j])]`, `x[j + 16] = d * KVALUES_IQ4NL[hi(qs[j])]`.
pub fn dequantize_iq4_nl(b: &BlockIQ4NL, out: &mut [f32; QK]) {
    let d = b.d.to_f32();
    for j in 0..QK / 2 {
        out[j] = d * KVALUES_IQ4NL[(b.qs[j] & 0xF) as usize] as f32;
        out[j + QK / 2] = d * KVALUES_IQ4NL[(b.qs[j] >> 4) as usize] as f32;
    }
}

/// The 2-bit codes of a Q2_K block and the low 2 bits of a Q3_K block's codes, in value
/// order: value `128 n + 32 j + l` is `(qs[32 n + l] >> 2 j) & 3`.
pub fn two_bit_codes(qs: &[u8; QK_K / 4]) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for n in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                q[128 * n + 32 * j + l] = (qs[32 * n + l] >> (2 * j)) & 3;
            }
        }
    }
    q
}

/// Q2_K: `x = d * sc_g * q - dmin * mn_g` over 16 groups of 16 (see [`BlockQ2K`]).
pub fn dequantize_q2_k(b: &BlockQ2K, out: &mut [f32; QK_K]) {
    let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
    let q = two_bit_codes(&b.qs);
    for (i, o) in out.iter_mut().enumerate() {
        let sc = b.scales[i / 16];
        *o = d * (sc & 0xF) as f32 * q[i] as f32 - dmin * (sc >> 4) as f32;
    }
}

/// The codes of a Q3_K block in value order, `-4..3` (see [`BlockQ3K`]).
pub fn q3_k_codes(b: &BlockQ3K) -> [i8; QK_K] {
    let low = two_bit_codes(&b.qs);
    let mut q = [0i8; QK_K];
    for (i, v) in q.iter_mut().enumerate() {
        let (n, j, l) = (i / 128, (i % 128) / 32, i % 32);
        let high = (b.hmask[l] >> (4 * n + j)) & 1;
        *v = low[i] as i8 - if high == 1 { 0 } else { 4 };
    }
    q
}

/// Q3_K: `x = d * sc_g * q` over 16 groups of 16 (see [`BlockQ3K`], [`scales_q3k`]).
pub fn dequantize_q3_k(b: &BlockQ3K, out: &mut [f32; QK_K]) {
    let d = b.d.to_f32();
    let sc = scales_q3k(&b.scales);
    for (i, (o, q)) in out.iter_mut().zip(q3_k_codes(b)).enumerate() {
        *o = d * sc[i / 16] as f32 * q as f32;
    }
}

/// IQ4_XS: `x = d * sc_b * KVALUES_IQ4NL[code]` over 8 sub-blocks of 32 (see [`BlockIQ4XS`]).
pub fn dequantize_iq4_xs(b: &BlockIQ4XS, out: &mut [f32; QK_K]) {
    let d = b.d.to_f32();
    for sb in 0..8 {
        let dl = d * b.scale(sb) as f32;
        for j in 0..16 {
            let q = b.qs[16 * sb + j];
            out[32 * sb + j] = dl * KVALUES_IQ4NL[(q & 0xF) as usize] as f32;
            out[32 * sb + j + 16] = dl * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
        }
    }
}

/// Q8_0: `x[j] = d * qs[j]`.
pub fn dequantize_q8_0(b: &BlockQ8_0, out: &mut [f32; QK]) {
    let d = b.d.to_f32();
    for j in 0..QK {
        out[j] = d * b.qs[j] as f32;
    }
}

/// Q4_K: for each 64-value chunk `c` (0..4), sub-blocks `2c` (low nibbles of
/// `qs[32c..32c+32]`) and `2c+1` (high nibbles): `x = d * sc * q - dmin * mn`.
pub fn dequantize_q4_k(b: &BlockQ4K, out: &mut [f32; QK_K]) {
    let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
    for c in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * c, &b.scales);
        let (sc2, m2) = scale_min_k4(2 * c + 1, &b.scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        for l in 0..32 {
            let q = b.qs[32 * c + l];
            out[64 * c + l] = d1 * (q & 0xF) as f32 - m1;
            out[64 * c + 32 + l] = d2 * (q >> 4) as f32 - m2;
        }
    }
}

/// Q5_K: as Q4_K with `q = nibble + 16 * ((qh[l] >> j) & 1)` for sub-block `j`.
pub fn dequantize_q5_k(b: &BlockQ5K, out: &mut [f32; QK_K]) {
    let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
    for c in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * c, &b.scales);
        let (sc2, m2) = scale_min_k4(2 * c + 1, &b.scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        for l in 0..32 {
            let q = b.qs[32 * c + l];
            let h1 = ((b.qh[l] >> (2 * c)) & 1) << 4;
            let h2 = ((b.qh[l] >> (2 * c + 1)) & 1) << 4;
            out[64 * c + l] = d1 * ((q & 0xF) | h1) as f32 - m1;
            out[64 * c + 32 + l] = d2 * ((q >> 4) | h2) as f32 - m2;
        }
    }
}

/// Q6_K: two halves of 128 values; in half `h`, with `ql = ql[64h..]`, `qh = qh[32h..]`,
/// `sc = scales[8h..]` and `l < 32`:
/// `q(l)     = lo(ql[l])      | ((qh[l] >> 0) & 3) << 4`, scale `sc[l/16]`
/// `q(l+32)  = lo(ql[l + 32]) | ((qh[l] >> 2) & 3) << 4`, scale `sc[l/16 + 2]`
/// `q(l+64)  = hi(ql[l])      | ((qh[l] >> 4) & 3) << 4`, scale `sc[l/16 + 4]`
/// `q(l+96)  = hi(ql[l + 32]) | ((qh[l] >> 6) & 3) << 4`, scale `sc[l/16 + 6]`
/// and `x = d * scale * (q - 32)`.
pub fn dequantize_q6_k(b: &BlockQ6K, out: &mut [f32; QK_K]) {
    let d = b.d.to_f32();
    for h in 0..2 {
        let (ql, qh, sc) = (&b.ql[64 * h..], &b.qh[32 * h..], &b.scales[8 * h..]);
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            let base = 128 * h;
            out[base + l] = d * sc[is] as f32 * q1 as f32;
            out[base + l + 32] = d * sc[is + 2] as f32 * q2 as f32;
            out[base + l + 64] = d * sc[is + 4] as f32 * q3 as f32;
            out[base + l + 96] = d * sc[is + 6] as f32 * q4 as f32;
        }
    }
}

/// Q8_K (activations): `x = d * qs`.
pub fn dequantize_q8_k(b: &BlockQ8K, out: &mut [f32; QK_K]) {
    for j in 0..QK_K {
        out[j] = b.d * b.qs[j] as f32;
    }
}

fn blocks<const B: usize, const N: usize, T: bytemuck::Pod>(row: &[u8], out: &mut [f32], deq: fn(&T, &mut [f32; N])) {
    for (bytes, o) in row.chunks_exact(B).zip(out.chunks_exact_mut(N)) {
        let block: T = pod_read_unaligned(bytes);
        deq(&block, o.try_into().expect("chunk of N"));
    }
}

/// Dequantizes one row: `row` holds `out.len()` values of type `ty` (any alignment).
pub fn dequantize_row(ty: WeightType, row: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let expected = ty.row_bytes(out.len())?;
    if row.len() != expected {
        return Err(QuantError::Length { what: "row bytes", expected, actual: row.len() });
    }
    match ty {
        WeightType::F32 => {
            for (b, o) in row.chunks_exact(4).zip(out.iter_mut()) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        WeightType::F16 => {
            for (b, o) in row.chunks_exact(2).zip(out.iter_mut()) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        WeightType::BF16 => {
            for (b, o) in row.chunks_exact(2).zip(out.iter_mut()) {
                *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        WeightType::Q4_0 => blocks::<18, QK, BlockQ4_0>(row, out, dequantize_q4_0),
        WeightType::Q4_1 => blocks::<20, QK, BlockQ4_1>(row, out, dequantize_q4_1),
        WeightType::Q5_0 => blocks::<22, QK, BlockQ5_0>(row, out, dequantize_q5_0),
        WeightType::Q5_1 => blocks::<24, QK, BlockQ5_1>(row, out, dequantize_q5_1),
        WeightType::IQ4NL => blocks::<18, QK, BlockIQ4NL>(row, out, dequantize_iq4_nl),
        WeightType::Q8_0 => blocks::<34, QK, BlockQ8_0>(row, out, dequantize_q8_0),
        WeightType::Q2K => blocks::<84, QK_K, BlockQ2K>(row, out, dequantize_q2_k),
        WeightType::Q3K => blocks::<110, QK_K, BlockQ3K>(row, out, dequantize_q3_k),
        WeightType::IQ4XS => blocks::<136, QK_K, BlockIQ4XS>(row, out, dequantize_iq4_xs),
        WeightType::Q4K => blocks::<144, QK_K, BlockQ4K>(row, out, dequantize_q4_k),
        WeightType::Q5K => blocks::<176, QK_K, BlockQ5K>(row, out, dequantize_q5_k),
        WeightType::Q6K => blocks::<210, QK_K, BlockQ6K>(row, out, dequantize_q6_k),
    }
    Ok(())
}
