//! AVX2 + FMA + F16C row kernels for F32, F16 and BF16 weights × f32 activations: widen 8
//! weights to f32 (F16C `vcvtph2ps`; BF16 is the top half of an f32), FMA into two
//! accumulators per activation row (16 values per step hide the FMA latency); a scalar tail
//! handles `k % 16`.

use super::dot_avx2::{dispatch_nj, hsum};
use super::types::Acts;
use half::{bf16, f16};
use std::arch::x86_64::*;

/// Weight element type: how to load 8 values as f32 and one value for the tail.
trait Elem {
    const SIZE: usize;
    unsafe fn load8(p: *const u8) -> __m256;
    fn one(b: &[u8]) -> f32;
}

struct F32;
struct F16;
struct Bf16;

impl Elem for F32 {
    const SIZE: usize = 4;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        _mm256_loadu_ps(p as *const f32)
    }
    fn one(b: &[u8]) -> f32 {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

impl Elem for F16 {
    const SIZE: usize = 2;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
    fn one(b: &[u8]) -> f32 {
        f16::from_le_bytes([b[0], b[1]]).to_f32()
    }
}

impl Elem for Bf16 {
    const SIZE: usize = 2;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
        _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16))
    }
    fn one(b: &[u8]) -> f32 {
        bf16::from_le_bytes([b[0], b[1]]).to_f32()
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn float_rows<const NJ: usize, E: Elem>(w: &[u8], a: &Acts, j0: usize, out: &mut [f32; 4]) {
    let k = a.k;
    debug_assert!(w.len() == k * E::SIZE && a.x.len() >= (j0 + NJ) * k);
    let xs = a.x.as_ptr().add(j0 * k);
    let mut acc0 = [_mm256_setzero_ps(); NJ];
    let mut acc1 = [_mm256_setzero_ps(); NJ];
    let main = k / 16 * 16;
    for c in (0..main).step_by(16) {
        let w0 = E::load8(w.as_ptr().add(c * E::SIZE));
        let w1 = E::load8(w.as_ptr().add((c + 8) * E::SIZE));
        for t in 0..NJ {
            acc0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xs.add(t * k + c)), acc0[t]);
            acc1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xs.add(t * k + c + 8)), acc1[t]);
        }
    }
    for t in 0..NJ {
        let mut s = hsum(_mm256_add_ps(acc0[t], acc1[t]));
        for c in main..k {
            s += E::one(&w[c * E::SIZE..]) * a.x[(j0 + t) * k + c];
        }
        out[t] = s;
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f32_n<const NJ: usize>(w: &[u8], a: &Acts, j0: usize, out: &mut [f32; 4]) {
    float_rows::<NJ, F32>(w, a, j0, out)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_n<const NJ: usize>(w: &[u8], a: &Acts, j0: usize, out: &mut [f32; 4]) {
    float_rows::<NJ, F16>(w, a, j0, out)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bf16_n<const NJ: usize>(w: &[u8], a: &Acts, j0: usize, out: &mut [f32; 4]) {
    float_rows::<NJ, Bf16>(w, a, j0, out)
}

dispatch_nj!(f32_row, f32_n);
dispatch_nj!(f16_row, f16_n);
dispatch_nj!(bf16_row, bf16_n);
