//! The rounding of the queries the fast numerics ask for.
//!
//! - f16 and bf16 caches ([`round_to_cache`], before scaling): ggml multiplies a K cache of type
//!   T by Q converted to T's dot-product type, which for f16 and bf16 caches is f16 and bf16, so
//!   the fast kernels see the queries at that precision too. The ggml kernels round their
//!   queries themselves, as their steps say.
//! - q8 and q4 caches (rotated or not) ([`quantize_query`], after scaling and rotation): the
//!   query row becomes 16-bit fixed point, two int8 codes a value — `hi` at the row's step
//!   `s = amax / 127` (rounded down), `lo ∈ [0, 255]` the remainder at `s / 256` — so K·Q can
//!   run as integer dot products (`simd::int8`). One int8 code with one scale per 8 values (as
//!   llama.cpp converts Q to `q8_0` for its quantized caches, with one per 32) left SmolLM2's
//!   teacher-forced top-1 below the 99 % bound (figures in `docs/kv-formats.md`). Every route —
//!   reference, both fast paths, either instruction set — sees the same rounded query, so they
//!   agree as before.
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

/// Steps of a row's `lo` code per step of its `hi` code ([`quantize_query`]).
pub const INT8_QUERY_LO_STEPS: i32 = 256;

/// Whether the fast numerics round queries to int8 over a K cache of `format`: q8 and q4
/// (rotated or not), whose keys are integer codes.
pub fn int8_queries(format: KvFormat) -> bool {
    matches!(format, KvFormat::Q8 | KvFormat::Q4 { .. })
}

/// Where [`quantize_query`] writes a row's codes: `hi` (signed) and `lo` (unsigned), `[d]`
/// each, and `step`, the value of one `lo` step (`s / 256`).
pub struct Int8Query<'a> {
    pub hi: &'a mut [i8],
    pub lo: &'a mut [u8],
    pub step: &'a mut f32,
}

/// Rounds a scaled, rotated query row `q` (`[d]`) to 16-bit fixed point, two int8 codes a value:
/// with the row's `s = amax / 127` and `step = s / 256`, `hi = floor(x / s)` (in -127..=127)
/// and `lo = round((x - hi · s) / step)` (in 0..=255, the remainder is never negative), then
/// `x ← (256 · hi + lo) · step` (a row of zeros stays zero). With `codes`, writes them: `q` then
/// equals `(256 · hi + lo) · step` element by element, the integer exact in f32 (|·| < 2^15)
/// and `step` exact (a power-of-two fraction of `s`).
pub fn quantize_query(q: &mut [f32], codes: Option<Int8Query<'_>>) {
    let lo_steps = INT8_QUERY_LO_STEPS as f32;
    let amax = q.iter().fold(0f32, |a, v| a.max(v.abs()));
    let s = amax / 127.0;
    let step = s / lo_steps;
    let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    let mut codes = codes;
    for (i, v) in q.iter_mut().enumerate() {
        let hi = floor_small((*v * inv).clamp(-127.0, 127.0));
        let lo = round_small(((*v - hi * s) * inv * lo_steps).clamp(0.0, 255.0));
        *v = (hi * lo_steps + lo) * step;
        if let Some(c) = codes.as_mut() {
            c.hi[i] = hi as i8;
            c.lo[i] = lo as u8;
        }
    }
    if let Some(c) = codes {
        *c.step = step;
    }
}

/// `x.floor()` for |x| < 2^23 through a truncating conversion: a call into libm otherwise on
/// the baseline x86-64 target, and this runs for every value of every query row.
#[inline(always)]
fn floor_small(x: f32) -> f32 {
    let t = (x as i32) as f32;
    if t > x {
        t - 1.0
    } else {
        t
    }
}

/// `x.round()` (half away from zero) for |x| < 2^23, as [`floor_small`]: `|x| - trunc(|x|)` is
/// exact in f32 there.
#[inline(always)]
fn round_small(x: f32) -> f32 {
    let a = x.abs();
    let t = (a as i32) as f32;
    let r = if a - t >= 0.5 { t + 1.0 } else { t };
    r.copysign(x)
}

/// f32 slots of one query row's lanes for the integer K·Q kernel ([`int8_lanes`]), head_dim `d`
/// (a multiple of 64, so rows stay 64-byte aligned).
pub(crate) const fn int8_lane_floats(d: usize) -> usize {
    3 * d / 4 + 16
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
/// `[hi codes: d bytes | lo codes: d bytes | lane corrections: d/4 i32 | step: 16 f32]`. A lane
/// is 4 consecutive values, one 32-bit lane of `vpdpbusd`: its correction `-offset · Σ hi`
/// removes what the key's offset ([`int8_key_offset`]) adds to the `hi` sum (the `lo` codes
/// meet the keys' signed codes, see `simd::int8`).
///
/// The scalar definition of that layout: the model's route lays rows out with
/// `simd::int8::query_lanes`, which is tested bit for bit against this.
#[cfg(test)]
pub(crate) fn int8_lanes(hi: &[i8], lo: &[u8], step: f32, offset: i32, out: &mut [f32]) {
    let d = hi.len();
    debug_assert!(d.is_multiple_of(4) && lo.len() == d && out.len() >= int8_lane_floats(d));
    let (hi_slots, rest) = out.split_at_mut(d / 4);
    let (lo_slots, rest) = rest.split_at_mut(d / 4);
    let (corrections, steps) = rest.split_at_mut(d / 4);
    for lane in 0..d / 4 {
        let (h, l) = (&hi[4 * lane..4 * lane + 4], &lo[4 * lane..4 * lane + 4]);
        hi_slots[lane] = f32::from_bits(u32::from_le_bytes([h[0] as u8, h[1] as u8, h[2] as u8, h[3] as u8]));
        lo_slots[lane] = f32::from_bits(u32::from_le_bytes([l[0], l[1], l[2], l[3]]));
        let sum: i32 = h.iter().map(|&c| c as i32).sum();
        corrections[lane] = f32::from_bits((-offset * sum) as u32);
    }
    steps[..16].fill(step);
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

    /// `quantize_query` with codes, into fresh buffers.
    fn codes_of(q: &mut [f32]) -> (Vec<i8>, Vec<u8>, f32) {
        let (mut hi, mut lo, mut step) = (vec![0i8; q.len()], vec![0u8; q.len()], 0f32);
        quantize_query(q, Some(Int8Query { hi: &mut hi, lo: &mut lo, step: &mut step }));
        (hi, lo, step)
    }

    #[test]
    fn int8_queries_are_fixed_point_codes_times_the_row_step() {
        let mut q: Vec<f32> = (0..64).map(|i| (i as f32 * 1.37).sin() * (1.0 + i as f32)).collect();
        q[8..16].fill(0.0);
        let orig = q.clone();
        let (hi, lo, step) = codes_of(&mut q);
        let amax = orig.iter().fold(0f32, |a, v| a.max(v.abs()));
        assert_eq!(step, amax / 127.0 / 256.0);
        for (j, &x) in orig.iter().enumerate() {
            let code = 256 * hi[j] as i32 + lo[j] as i32;
            assert_eq!(q[j], code as f32 * step, "element {j}");
            // Within half a lo step of the input (and a little f32 rounding): 16-bit fixed point.
            assert!((q[j] - x).abs() <= 0.5 * step * 1.01 + 1e-6 * amax, "element {j}: {} vs {x}", q[j]);
            // hi rounds down, lo takes the non-negative rest.
            assert!(hi[j] as f32 * 256.0 * step <= x + 1e-6 * amax, "element {j}");
            if x.abs() == amax {
                assert_eq!((hi[j].unsigned_abs(), lo[j]), (127, 0));
            }
        }
        assert!(
            q[8..16].iter().all(|&v| v == 0.0)
                && hi[8..16].iter().all(|&c| c == 0)
                && lo[8..16].iter().all(|&c| c == 0)
        );
        // A rounded row rounds to the same codes.
        assert_eq!(codes_of(&mut q.clone()), (hi, lo, step));
        let mut zeros = vec![0f32; 64];
        assert_eq!(codes_of(&mut zeros), (vec![0; 64], vec![0; 64], 0.0));
        assert!(int8_queries(KvFormat::Q8) && int8_queries(KvFormat::Q4 { rotate: true }));
        assert!(!int8_queries(KvFormat::F16) && !int8_queries(KvFormat::TURBO_DEFAULT));
    }

    #[test]
    fn the_fixed_point_query_is_far_closer_than_one_int8_code_per_8_values() {
        // Against one int8 code per 8 values (llama.cpp's q8_0 Q with smaller groups), on a row
        // whose groups span two orders of magnitude: the rounding error falls by over 30×.
        let q: Vec<f32> =
            (0..256).map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * (1.0 + (i % 97) as f32)).collect();
        let mut two = q.clone();
        quantize_query(&mut two, None);
        let (mut err_one, mut err_two) = (0f64, 0f64);
        for (g, x) in q.chunks_exact(8).enumerate() {
            let s = x.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
            for (i, &v) in x.iter().enumerate() {
                let one = if s > 0.0 { (v / s).round() * s } else { 0.0 };
                err_one += ((one - v) as f64).powi(2);
                err_two += ((two[g * 8 + i] - v) as f64).powi(2);
            }
        }
        assert!(err_two * 30.0 < err_one, "{err_two} vs {err_one}");
    }

    #[test]
    fn the_small_floor_and_round_equal_the_std_ones() {
        let mut x = -300.0f32;
        while x <= 300.0 {
            for v in [x, x + 0.5, x - 0.5, x + 1e-4, x - 1e-4, f32::from_bits(x.to_bits() + 1)] {
                assert_eq!(floor_small(v), v.floor(), "{v}");
                assert_eq!(round_small(v).to_bits(), v.round().to_bits(), "{v}");
            }
            x += 0.25;
        }
        for v in [0.49999997f32, -0.49999997, 0.5, -0.5, 1.5, -2.5, 8388607.0, -0.0] {
            assert_eq!(round_small(v).to_bits(), v.round().to_bits(), "{v}");
            assert_eq!(floor_small(v), v.floor(), "{v}");
        }
    }

    #[test]
    fn lanes_carry_both_codes_the_offset_correction_and_the_step() {
        let mut q: Vec<f32> = (0..64).map(|i| (i as f32 - 27.3) * 0.37).collect();
        let (hi, lo, step) = codes_of(&mut q);
        let mut out = vec![f32::NAN; int8_lane_floats(64)];
        int8_lanes(&hi, &lo, step, 128, &mut out);
        for lane in 0..16 {
            let bytes = |f: f32| f.to_bits().to_le_bytes();
            assert_eq!(bytes(out[lane]), [0, 1, 2, 3].map(|i| hi[4 * lane + i] as u8));
            assert_eq!(bytes(out[16 + lane]), [0, 1, 2, 3].map(|i| lo[4 * lane + i]));
            let sum: i32 = (0..4).map(|i| hi[4 * lane + i] as i32).sum();
            assert_eq!(out[32 + lane].to_bits() as i32, -128 * sum);
        }
        assert!(out[48..64].iter().all(|&s| s == step));
    }
}
