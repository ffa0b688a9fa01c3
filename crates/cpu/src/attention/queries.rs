//! The rounding of the queries the fast numerics ask for.
//!
//! - f16 and bf16 caches ([`round_to_cache`], before scaling): ggml multiplies a K cache of type
//!   T by Q converted to T's dot-product type, which for f16 and bf16 caches is f16 and bf16, so
//!   the fast kernels see the queries at that precision too. The ggml kernels round their
//!   queries themselves, as their steps say.
//! - q8 and q4 caches (rotated or not) ([`quantize_query`], after scaling and rotation): the
//!   query is rounded to int8 codes with one scale per [`INT8_QUERY_GROUP`] values, as llama.cpp
//!   converts Q to `q8_0` for its quantized caches, so K·Q can run as integer dot products
//!   (`simd::int8`). Every route — reference, both fast paths, either instruction set — sees
//!   the same rounded query, so they agree as before. Groups of 8 rather than llama.cpp's 32
//!   cost the integer kernel nothing and add less error (figures in
//!   `docs/kv-formats.md`).
//! - f32 and turbo caches: queries as they are.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use kvcache::KvFormat;

/// Rounds the queries `q` to the precision ggml gives them in the K·Q product over a K cache
/// of `format`.
pub fn round_to_cache(format: KvFormat, q: &mut [f32]) {
    match format {
        KvFormat::F16 => round_through::<f16>(q),
        KvFormat::Bf16 => round_through::<bf16>(q),
        _ => {}
    }
}

/// Values per query scale of the int8 queries ([`quantize_query`]).
pub const INT8_QUERY_GROUP: usize = 8;

/// Whether the fast numerics round queries to int8 over a K cache of `format`: q8 and q4
/// (rotated or not), whose keys are integer codes.
pub fn int8_queries(format: KvFormat) -> bool {
    matches!(format, KvFormat::Q8 | KvFormat::Q4 { .. })
}

/// Rounds a scaled, rotated query row `q` (`[d]`, `d` a multiple of [`INT8_QUERY_GROUP`]) to
/// int8: per group of [`INT8_QUERY_GROUP`] values `s = amax / 127`, `c = round(x / s)` (half away
/// from zero), `x ← c · s` (a group of zeros stays zero). Writes the codes (`[d]`) and scales
/// (`[d / INT8_QUERY_GROUP]`) when given: `q` then equals `codes · scale` element by element.
pub fn quantize_query(q: &mut [f32], mut codes: Option<&mut [i8]>, mut scales: Option<&mut [f32]>) {
    debug_assert!(q.len().is_multiple_of(INT8_QUERY_GROUP));
    for (g, x) in q.chunks_exact_mut(INT8_QUERY_GROUP).enumerate() {
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        let s = amax / 127.0;
        let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        for (i, v) in x.iter_mut().enumerate() {
            let c = (*v * inv).round().clamp(-127.0, 127.0);
            *v = c * s;
            if let Some(codes) = codes.as_deref_mut() {
                codes[g * INT8_QUERY_GROUP + i] = c as i8;
            }
        }
        if let Some(scales) = scales.as_deref_mut() {
            scales[g] = s;
        }
    }
}

/// f32 slots of one query row's lanes for the integer K·Q kernel ([`int8_lanes`]), head_dim `d`.
pub(crate) const fn int8_lane_floats(d: usize) -> usize {
    3 * d / 4
}

/// What the integer K·Q kernel adds to a key code of `format` to make it unsigned: 128 for q8
/// (its codes are XOR-ed with 0x80), 8 for q4 (its nibbles are `code + 8` already).
pub(crate) fn int8_key_offset(format: KvFormat) -> i32 {
    match format {
        KvFormat::Q4 { .. } => 8,
        _ => 128,
    }
}

/// Lays out one int8 query row for the integer K·Q kernel: `out` (`[int8_lane_floats(d)]`) =
/// `[codes: d bytes | lane scales: d/4 f32 | lane corrections: d/4 i32]`. A lane is 4
/// consecutive values, one 32-bit lane of `vpdpbusd`: its scale is its group's, its correction
/// `-offset · Σ codes`, which removes what the key's offset ([`int8_key_offset`]) added.
pub(crate) fn int8_lanes(codes: &[i8], scales: &[f32], offset: i32, out: &mut [f32]) {
    let d = codes.len();
    debug_assert!(d.is_multiple_of(INT8_QUERY_GROUP) && out.len() >= int8_lane_floats(d));
    let (code_slots, rest) = out.split_at_mut(d / 4);
    let (lane_scales, corrections) = rest.split_at_mut(d / 4);
    for (lane, (slot, four)) in code_slots.iter_mut().zip(codes.chunks_exact(4)).enumerate() {
        *slot = f32::from_bits(u32::from_le_bytes([four[0] as u8, four[1] as u8, four[2] as u8, four[3] as u8]));
        lane_scales[lane] = scales[4 * lane / INT8_QUERY_GROUP];
        let sum: i32 = four.iter().map(|&c| c as i32).sum();
        corrections[lane] = f32::from_bits((-offset * sum) as u32);
    }
}

/// `x ← T(x)` widened back to f32, through a stack buffer (the slice conversions use F16C
/// where the CPU has it).
fn round_through<T: Copy + Default>(x: &mut [f32])
where
    [T]: HalfFloatSliceExt,
{
    let mut buf = [T::default(); 64];
    for chunk in x.chunks_mut(64) {
        let b = &mut buf[..chunk.len()];
        b.convert_from_f32_slice(chunk);
        b.convert_to_f32_slice(chunk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_round_to_the_k_cache_precision() {
        let q: Vec<f32> = (0..100).map(|i| (i as f32 * 0.731).sin() * 3.3 + 1e-3).collect();
        for (format, round) in [
            (KvFormat::F16, (|v: f32| f16::from_f32(v).to_f32()) as fn(f32) -> f32),
            (KvFormat::Bf16, |v| bf16::from_f32(v).to_f32()),
            (KvFormat::F32, |v| v),
        ] {
            let mut got = q.clone();
            round_to_cache(format, &mut got);
            let want: Vec<f32> = q.iter().map(|&v| round(v)).collect();
            assert_eq!(got, want, "{format:?}");
        }
    }

    #[test]
    fn int8_queries_are_codes_times_group_scales() {
        let mut q: Vec<f32> = (0..64).map(|i| (i as f32 * 1.37).sin() * (1.0 + i as f32)).collect();
        q[8..16].fill(0.0);
        let orig = q.clone();
        let mut codes = vec![0i8; 64];
        let mut scales = vec![0f32; 8];
        quantize_query(&mut q, Some(&mut codes), Some(&mut scales));
        for g in 0..8 {
            let x = &orig[g * 8..(g + 1) * 8];
            let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
            assert_eq!(scales[g], amax / 127.0);
            for (i, &xi) in x.iter().enumerate() {
                let j = g * 8 + i;
                assert_eq!(q[j], codes[j] as f32 * scales[g], "element {j}");
                // Within half a step of the input, the group's largest value exact in code.
                assert!((q[j] - xi).abs() <= 0.5 * scales[g] * 1.0001, "element {j}");
                if xi.abs() == amax && amax > 0.0 {
                    assert_eq!(codes[j].unsigned_abs(), 127);
                }
            }
        }
        assert!(q[8..16].iter().all(|&v| v == 0.0) && codes[8..16].iter().all(|&c| c == 0));
        // A rounded row rounds to the same codes.
        let mut again = vec![0i8; 64];
        quantize_query(&mut q, Some(&mut again), None);
        assert_eq!(again, codes);
        assert!(int8_queries(KvFormat::Q8) && int8_queries(KvFormat::Q4 { rotate: true }));
        assert!(!int8_queries(KvFormat::F16) && !int8_queries(KvFormat::TURBO_DEFAULT));
    }
}
