//! The rounding of the queries the fast numerics ask for: ggml multiplies a K cache of type T by
//! Q converted to T's dot-product type, which for f16 and bf16 caches is f16 and bf16, so the
//! fast kernels see the queries at that precision too. The other formats have no such step here
//! (f32 needs none; the quantized ones have no ggml counterpart this code follows). The ggml
//! kernels round their queries themselves, as their steps say.

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
}
