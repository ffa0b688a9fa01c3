//! Reference dequantizers against hand-built blocks with values worked out by hand from each
//! format's definition, and reference quantizers against their defining properties.

// Kernels and references index several parallel arrays by the same lane or row.
#![allow(clippy::needless_range_loop)]

use half::{bf16, f16};
use pagekv_cpu::quant::blocks::*;
use pagekv_cpu::quant::quantize::*;
use pagekv_cpu::quant::reference::*;
use pagekv_cpu::quant::{dequantize_row, QuantError, WeightType};

fn h(v: f32) -> f16 {
    f16::from_f32(v)
}

#[test]
fn q4_0_known_values() {
    let mut qs = [0u8; 16];
    for j in 0..16 {
        qs[j] = j as u8 | ((15 - j as u8) << 4);
    }
    let mut out = [0.0; 32];
    dequantize_q4_0(&BlockQ4_0 { d: h(0.5), qs }, &mut out);
    for j in 0..16 {
        assert_eq!(out[j], 0.5 * (j as f32 - 8.0));
        assert_eq!(out[j + 16], 0.5 * (7.0 - j as f32));
    }
}

#[test]
fn q4_1_known_values() {
    let mut qs = [0u8; 16];
    for j in 0..16 {
        qs[j] = j as u8 | (3 << 4);
    }
    let mut out = [0.0; 32];
    dequantize_q4_1(&BlockQ4_1 { d: h(0.25), m: h(-1.0), qs }, &mut out);
    for j in 0..16 {
        assert_eq!(out[j], 0.25 * j as f32 - 1.0);
        assert_eq!(out[j + 16], 0.25 * 3.0 - 1.0);
    }
}

#[test]
fn q8_0_known_values() {
    let qs: [i8; 32] = std::array::from_fn(|j| (j as i32 * 8 - 127) as i8);
    let mut out = [0.0; 32];
    dequantize_q8_0(&BlockQ8_0 { d: h(2.0), qs }, &mut out);
    for j in 0..32 {
        assert_eq!(out[j], 2.0 * (j as f32 * 8.0 - 127.0));
    }
}

#[test]
fn scale_min_k4_literal_bytes() {
    let q = [0x41, 0, 0, 0, 0x02, 0, 0, 0, 0x35, 0, 0, 0];
    assert_eq!(scale_min_k4(0, &q), (1, 2));
    // sub-block 4: low 4 bits from q[8] (scale 5, min 3), high 2 bits from q[0] >> 6 = 1 (scale).
    assert_eq!(scale_min_k4(4, &q), (5 | 16, 3));
    assert_eq!(scale_min_k4(7, &[0xFF; 12]), (63, 63));
}

/// Packs eight 6-bit (scale, min) pairs the way ggml's Q4_K/Q5_K quantizer does.
fn pack_scales(sc: [u8; 8], mn: [u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..4 {
        q[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        q[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
        q[j + 8] = (sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4);
    }
    q
}

const SC: [u8; 8] = [1, 7, 13, 63, 17, 33, 48, 5];
const MN: [u8; 8] = [2, 60, 0, 9, 31, 16, 63, 40];

#[test]
fn q4_k_known_values() {
    // Every code byte 0x5A: even sub-blocks read the low nibble 10, odd ones the high nibble 5.
    let b = BlockQ4K { d: h(0.5), dmin: h(0.25), scales: pack_scales(SC, MN), qs: [0x5A; 128] };
    let mut out = [0.0; 256];
    dequantize_q4_k(&b, &mut out);
    for i in 0..256 {
        let j = i / 32;
        let q = if j % 2 == 0 { 10.0 } else { 5.0 };
        assert_eq!(out[i], 0.5 * SC[j] as f32 * q - 0.25 * MN[j] as f32, "i={i}");
    }
}

#[test]
fn q5_k_known_values() {
    // qh = 0xA5: the fifth bit of sub-block j is bit j of 0b1010_0101.
    let b = BlockQ5K { d: h(0.5), dmin: h(0.25), scales: pack_scales(SC, MN), qh: [0xA5; 32], qs: [0x5A; 128] };
    let mut out = [0.0; 256];
    dequantize_q5_k(&b, &mut out);
    for i in 0..256 {
        let j = i / 32;
        let q = if j % 2 == 0 { 10.0 } else { 5.0 } + 16.0 * ((0xA5 >> j) & 1) as f32;
        assert_eq!(out[i], 0.5 * SC[j] as f32 * q - 0.25 * MN[j] as f32, "i={i}");
    }
}

#[test]
fn q6_k_known_values() {
    // ql 0x21: low nibble 1, high nibble 2; qh 0xE4 = fields (0, 1, 2, 3) from the low bits.
    // So the 32-value quarters of each 128-half hold q = 1, 1+16, 2+32, 2+48, minus 32.
    let scales: [i8; 16] = std::array::from_fn(|g| g as i8 + 1);
    let b = BlockQ6K { ql: [0x21; 128], qh: [0xE4; 64], scales, d: h(0.5) };
    let mut out = [0.0; 256];
    dequantize_q6_k(&b, &mut out);
    let quarter = [-31.0, -15.0, 2.0, 18.0];
    for i in 0..256 {
        assert_eq!(out[i], 0.5 * (i / 16 + 1) as f32 * quarter[(i % 128) / 32], "i={i}");
    }
}

#[test]
fn q6_k_code_layout() {
    // One nonzero code at a time: value 128h + 32·quarter + l comes from ql[64h + l (+32)] and
    // the 2-bit field `quarter` of qh[32h + l].
    for (h_, quarter, l) in [(0, 0, 3), (0, 1, 17), (0, 2, 31), (1, 3, 0), (1, 1, 9)] {
        let mut b = BlockQ6K { ql: [0; 128], qh: [0; 64], scales: [1; 16], d: h(1.0) };
        let ql_index = 64 * h_ + l + if quarter % 2 == 1 { 32 } else { 0 };
        b.ql[ql_index] = if quarter < 2 { 0x07 } else { 0x70 };
        b.qh[32 * h_ + l] = 2 << (2 * quarter);
        let mut out = [0.0; 256];
        dequantize_q6_k(&b, &mut out);
        let target = 128 * h_ + 32 * quarter + l;
        for i in 0..256 {
            // Codes are 0 (→ -32) except the target, 7 + 32 = 39 (→ 7).
            let want = if i == target { 7.0 } else { -32.0 };
            // Other values sharing the target's ql byte get its other nibble (0) → -32 unless
            // their qh field is set, which it is not.
            assert_eq!(out[i], want, "target {target}, i {i}");
        }
    }
}

#[test]
fn float_rows_known_values() {
    let mut out = [0.0; 3];
    let vals = [1.5f32, -2.0, 65504.0];
    let f32_bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    dequantize_row(WeightType::F32, &f32_bytes, &mut out).unwrap();
    assert_eq!(out, vals);
    let f16_bytes: Vec<u8> = vals.iter().flat_map(|v| f16::from_f32(*v).to_le_bytes()).collect();
    dequantize_row(WeightType::F16, &f16_bytes, &mut out).unwrap();
    assert_eq!(out, vals);
    // bf16 0x3FC0 = 1.5, 0xC000 = -2, 0x4780 = 65536.
    dequantize_row(WeightType::BF16, &[0xC0, 0x3F, 0x00, 0xC0, 0x80, 0x47], &mut out).unwrap();
    assert_eq!(out, [1.5, -2.0, 65536.0]);
    assert_eq!(bf16::from_f32(1.5).to_bits(), 0x3FC0);
}

#[test]
fn dequantize_row_checks_lengths() {
    let mut out = [0.0; 32];
    assert!(matches!(dequantize_row(WeightType::Q4_1, &[0; 19], &mut out), Err(QuantError::Length { .. })));
    let mut out = [0.0; 31];
    assert!(matches!(dequantize_row(WeightType::Q4_1, &[0; 20], &mut out), Err(QuantError::RaggedRow { .. })));
    assert_eq!(WeightType::from_ggml_id(3), Ok(WeightType::Q4_1));
    assert_eq!(WeightType::from_ggml_id(16), Err(QuantError::UnsupportedType(16)));
    for ty in WeightType::ALL {
        assert_eq!(WeightType::from_ggml_id(ty.ggml_id()), Ok(ty));
    }
}

fn ramp() -> [f32; 32] {
    std::array::from_fn(|j| (j as f32 - 11.3) * 0.37)
}

#[test]
fn q8_0_quantizer_properties() {
    let x = ramp();
    let b = quantize_q8_0(&x);
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    assert_eq!(b.d, h(amax / 127.0));
    assert_eq!(b.qs.iter().map(|q| q.unsigned_abs()).max(), Some(127));
    let d = amax / 127.0;
    for j in 0..32 {
        assert_eq!(b.qs[j], (x[j] / d).round() as i8, "j={j}");
    }
    assert_eq!(quantize_q8_0(&[0.0; 32]).qs, [0; 32]);
}

#[test]
fn q8_activation_quantizers_follow_ggml_x86() {
    // amax 127: d = 1 and id = 127 / amax = 1, so these land on exact .5 ties, which ggml-cpu's
    // x86 quantizer rounds to even where `quantize_row_q8_0_ref` rounds away from zero.
    let mut x = [0.0f32; 32];
    x[..7].copy_from_slice(&[2.5, 3.5, -2.5, -3.5, 0.5, -0.5, 127.0]);
    for (j, v) in x.iter_mut().enumerate().skip(7) {
        *v = j as f32 * 0.3 - 4.05; // no ties: x · 1 is never within 0.05 of k + 0.5
    }
    let act = quantize_q8_0_act(&x);
    let reference = quantize_q8_0(&x);
    assert_eq!(act.d, h(1.0));
    assert_eq!(act.qs[..7], [2, 4, -2, -4, 0, 0, 127]);
    assert_eq!(reference.qs[..7], [3, 4, -3, -4, 1, -1, 127]);
    assert_eq!(act.qs[7..], reference.qs[7..]);
    let q81 = quantize_q8_1_act(&x);
    assert_eq!((q81.d, q81.qs), (act.d, act.qs));
    let sum: i32 = act.qs.iter().map(|&q| q as i32).sum();
    assert_eq!(q81.s, h(sum as f32));

    // Codes within half a step of x · 127 / amax; s from the unrounded d.
    let x = ramp();
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let b = quantize_q8_1_act(&x);
    for j in 0..32 {
        assert!((b.qs[j] as f32 - x[j] * (127.0 / amax)).abs() <= 0.5, "j={j}");
    }
    let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
    assert_eq!(b.s, h(amax / 127.0 * sum as f32));
    assert_eq!(b.d, h(amax / 127.0));
    let z = quantize_q8_1_act(&[0.0; 32]);
    assert_eq!((z.d, z.s, z.qs), (h(0.0), h(0.0), [0; 32]));
}

#[test]
fn q4_quantizers_round_trip() {
    let x = ramp();
    let mut out = [0.0; 32];
    let b = quantize_q4_1(&x);
    dequantize_q4_1(&b, &mut out);
    let d = b.d.to_f32();
    for j in 0..32 {
        assert!((out[j] - x[j]).abs() <= 0.5 * d + 0.01, "q4_1 j={j}: {} vs {}", out[j], x[j]);
    }
    let b = quantize_q4_0(&x);
    dequantize_q4_0(&b, &mut out);
    let d = b.d.to_f32().abs();
    // max = x[31]; the code range -8..7 reaches 7·d short of +max on the other side.
    for j in 0..32 {
        assert!((out[j] - x[j]).abs() <= d + 0.01, "q4_0 j={j}: {} vs {}", out[j], x[j]);
    }
}

#[test]
fn q8_k_quantizer_properties() {
    let x: [f32; 256] = std::array::from_fn(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013);
    let b = quantize_q8_k(&x);
    let max = x.iter().fold(0.0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
    assert_eq!(b.d, 1.0 / (-127.0 / max));
    for g in 0..16 {
        assert_eq!(b.bsums[g], b.qs[16 * g..16 * g + 16].iter().map(|&q| q as i16).sum::<i16>());
    }
    let mut out = [0.0; 256];
    dequantize_q8_k(&b, &mut out);
    for i in 0..256 {
        assert!((out[i] - x[i]).abs() <= 0.5 * b.d.abs() * 1.0001, "i={i}");
    }
    let z = quantize_q8_k(&[0.0; 256]);
    assert_eq!((z.d, z.qs, z.bsums), (0.0, [0; 256], [0; 16]));
}

/// The formats without a reference quantizer against the values llama.cpp's own `gguf` Python
/// package dequantizes hand-made blocks to (`data/gguf_dequant.json`, made by
/// `data/make_gguf_dequant.py`).
#[test]
fn dequantizers_match_the_gguf_package() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/gguf_dequant.json")).unwrap();
    let data: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut seen = std::collections::HashSet::new();
    for case in data["cases"].as_array().unwrap() {
        let name = case["type"].as_str().unwrap();
        let ty = WeightType::ALL.into_iter().find(|t| t.ggml_name() == name).unwrap_or_else(|| panic!("{name}"));
        let hex = case["block_hex"].as_str().unwrap();
        let block: Vec<u8> =
            (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
        let want: Vec<f32> = case["values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        let mut got = vec![f32::NAN; ty.block_elems()];
        dequantize_row(ty, &block, &mut got).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // Both compute in f32 from the same f16 fields; allow one rounding of difference.
            assert!((g - w).abs() <= 1e-6 * w.abs().max(1e-3), "{name} value {i}: {g} vs gguf {w}");
        }
        seen.insert(ty);
    }
    assert!(seen.len() >= 9, "every format of the data file is checked");
}
