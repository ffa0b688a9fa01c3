//! Shared helpers for the cache tests: deterministic random rows and the reference round trip.

#![allow(dead_code)]

use half::f16;
use kvcache::{KvFormat, Rotation};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// `[n]` values, uniform in ±`scale`, never all zero.
pub fn random_rows(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(-scale..scale) + 1e-3).collect()
}

/// What reading back `x` (`[.., head_dim]`) from pages of `format` must give: rotate, encode,
/// decode, un-rotate — through the reference codec.
pub fn roundtrip(format: KvFormat, seed: u64, head_dim: usize, x: &[f32], side_is_key: bool) -> Vec<f32> {
    let codec = if side_is_key { format.key_codec() } else { format.value_codec() };
    let rot: Option<Rotation> = format.rotation(head_dim, seed);
    let mut out = Vec::with_capacity(x.len());
    let mut codes = vec![0u8; codec.code_bytes(head_dim)];
    let mut scales = vec![f16::ZERO; codec.scales(head_dim)];
    for row in x.chunks_exact(head_dim) {
        let mut v = row.to_vec();
        if let Some(r) = &rot {
            r.apply(&mut v);
        }
        codec.encode(&v, &mut codes, &mut scales);
        codec.decode(&codes, &scales, &mut v);
        if let Some(r) = &rot {
            r.apply_inverse(&mut v);
        }
        out.extend_from_slice(&v);
    }
    out
}

pub const ALL_FORMATS: [KvFormat; 8] = [
    KvFormat::F32,
    KvFormat::F16,
    KvFormat::Bf16,
    KvFormat::Q8,
    KvFormat::Q4 { rotate: false },
    KvFormat::Q4 { rotate: true },
    KvFormat::Turbo { k_bits: 8, v_bits: 3 },
    KvFormat::Turbo { k_bits: 4, v_bits: 2 },
];
