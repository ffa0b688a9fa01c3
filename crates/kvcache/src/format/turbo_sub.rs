//! `turbo` value codes with sub-scales: Lloyd–Max indices for N(0,1) (`bits` ∈ {2, 3, 4}),
//! in *sub-groups* of [`SUB`] values, each scaled by `D · q` — one f16 `D` per head vector and
//! a 4-bit multiplier `q` ∈ 0..=15 per sub-group (k-quant style).
//!
//! Why: turbo's 3-bit values with one scale per 32 lose 2.9–3.9 % perplexity on SmolLM2; a
//! scale per 8 values follows the rotated vector's local magnitude (the RMS of 8 values varies
//! by about 25 % around the head's, as for Gaussian values) and cuts that to 0.6–1.6 %, for 6
//! bytes of scales per head vector of 64 instead of 4 (docs/kv-formats.md).
//!
//! Scale slots of one head vector (`1 + ceil(d/32)` f16 slots, [`scale_slots`]):
//! - slot 0: `D` (f16);
//! - slots 1..: the multipliers, four per slot — sub-group `j`'s `q` is bits `4·(j % 4) ..+4`
//!   of slot `1 + j/4` (so, as bytes, nibble `j % 2` of byte `j / 2`, low first); unused
//!   nibbles are 0.
//!
//! Decode: `ŷ = (D · q) · level[code]`; `D · q` (an 11-bit mantissa times a 4-bit integer) is
//! exact in f32, so every decoder computes the same product whatever its order.
//!
//! Encode a rotated head vector `y` (`d` a multiple of 8):
//! 1. per sub-group `j`: `rms_j = sqrt(Σ y² / 8)` (sum in [`sub_sum`] order);
//! 2. `D = f16(min(max_j rms_j · TOP / 15, 65504))` (`TOP` = 1.2);
//! 3. per sub-group: the `q` of all 16 whose scale `D·q` reconstructs with least squared
//!    error (codes as in step 4, error summed in [`sub_sum`] order), the first on ties;
//!    `q = 0` (all values decode to 0) wins for an all-zero sub-group;
//! 4. `code = nearest level of y · (1 / (D·q))`, the reciprocal rounded first (the level of 0
//!    when `D·q = 0`).
//!
//! Every sum runs in the order of an 8-lane xor butterfly (`v += shfl_xor(v, o)`, o = 4, 2, 1)
//! so the GPU encoder (crates/cuda/kernels/cache_write.cu), one lane per value, chooses the
//! same `D`, `q` and codes bit for bit.

// The encoder compares the N candidate multipliers lane by lane across parallel arrays.
#![allow(clippy::needless_range_loop)]

use half::f16;

use super::lloyd_max::{codebook, Codebook};
use super::turbo::{get_bits, put_bits};

/// Values per sub-group (one 4-bit multiplier each).
pub const SUB: usize = 8;

/// Largest multiplier.
const Q_MAX: u32 = 15;

/// `D = max rms · TOP / 15`: headroom for the largest sub-group, whose best scale lies above
/// its RMS about as often as below.
const TOP: f32 = 1.2;

/// f16 scale slots of one head vector of `head_dim` values: `D` and the packed multipliers.
pub fn scale_slots(head_dim: usize) -> usize {
    1 + (head_dim / SUB).div_ceil(4)
}

/// Sum of 8 lanes in the order of an xor butterfly over 8 lanes (every lane ends with it).
pub fn sub_sum(mut a: [f32; SUB]) -> f32 {
    let mut o = SUB / 2;
    while o > 0 {
        for i in 0..o {
            a[i] += a[i + o];
        }
        o /= 2;
    }
    a[0]
}

/// Multiplier `q` of sub-group `j` from a head vector's scale slots.
#[inline]
pub fn multiplier(scales: &[f16], j: usize) -> u32 {
    ((scales[1 + j / 4].to_bits() >> (4 * (j % 4))) & 0xF) as u32
}

/// Scale `D · q` of sub-group `j` (exact in f32).
#[inline]
pub fn sub_scale(scales: &[f16], j: usize) -> f32 {
    scales[0].to_f32() * multiplier(scales, j) as f32
}

/// Squared reconstruction error of sub-group `y` (`[SUB]`) at scale `s`, in [`sub_sum`] order
/// (the oracle of [`best_multiplier`]).
#[cfg(test)]
fn sub_error(y: &[f32], s: f32, book: &Codebook) -> f32 {
    let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
    let e2: [f32; SUB] = std::array::from_fn(|i| {
        let e = y[i] - s * book.levels[book.encode(y[i] * inv) as usize];
        e * e
    });
    sub_sum(e2)
}

/// The multiplier `q` ∈ 0..=15 whose scale `D · q` (`dv = D`) reconstructs sub-group `y`
/// (`[SUB]`) with least squared error, the first on ties. All 16 candidates are evaluated side
/// by side (`[16]` lanes, so the compiler vectorizes across them); a value's level is found by
/// walking the ascending bounds (`level[k + 1]` wherever `bound[k] < x`), which ends on
/// `level[#bounds below x]` = `level[Codebook::encode(x)]` exactly, and each candidate's errors
/// are summed in [`sub_sum`] order — the same figures as decoding and comparing one by one.
fn best_multiplier(y: &[f32], dv: f32, book: &Codebook) -> u32 {
    const N: usize = Q_MAX as usize + 1;
    let s: [f32; N] = std::array::from_fn(|q| dv * q as f32);
    let inv: [f32; N] = std::array::from_fn(|q| if s[q] > 0.0 { 1.0 / s[q] } else { 0.0 });
    let mut e2 = [[0.0f32; N]; SUB]; // [value][candidate]
    for (e2, &v) in e2.iter_mut().zip(y) {
        let x: [f32; N] = std::array::from_fn(|q| v * inv[q]);
        let mut l = [book.levels[0]; N];
        for (&b, &lv) in book.bounds.iter().zip(&book.levels[1..]) {
            for (l, &x) in l.iter_mut().zip(&x) {
                *l = if b < x { lv } else { *l };
            }
        }
        for q in 0..N {
            let e = v - s[q] * l[q];
            e2[q] = e * e;
        }
    }
    let mut best = (f32::INFINITY, 0u32);
    for q in 0..N {
        let err = sub_sum(std::array::from_fn(|i| e2[i][q]));
        if err < best.0 {
            best = (err, q as u32);
        }
    }
    best.1
}

/// Encodes the rotated head vector `y` (`[d]`, `d` a multiple of 8) into its code bit stream
/// `codes` (`[d · bits / 8]`) and its scale slots `scales` (`[scale_slots(d)]`).
pub(crate) fn encode(y: &[f32], bits: u8, codes: &mut [u8], scales: &mut [f16]) {
    let d = y.len();
    debug_assert!(d.is_multiple_of(SUB) && scales.len() == scale_slots(d));
    let book = codebook(bits);
    let mut top = 0.0f32;
    for g in y.chunks_exact(SUB) {
        let sq: [f32; SUB] = std::array::from_fn(|i| g[i] * g[i]);
        top = top.max((sub_sum(sq) / SUB as f32).sqrt());
    }
    // Clamped to f16's range, so no scale is infinite (an infinite D would decode 0·∞).
    let dh = f16::from_f32((top * TOP / Q_MAX as f32).min(f16::MAX.to_f32()));
    let dv = dh.to_f32();
    scales.fill(f16::ZERO);
    scales[0] = dh;
    codes.fill(0);
    for (j, g) in y.chunks_exact(SUB).enumerate() {
        let q = best_multiplier(g, dv, book);
        let slot = &mut scales[1 + j / 4];
        *slot = f16::from_bits(slot.to_bits() | ((q as u16) << (4 * (j % 4))));
        let s = dv * q as f32;
        let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
        for (i, &v) in g.iter().enumerate() {
            put_bits(codes, (j * SUB + i) * bits as usize, bits, book.encode(v * inv));
        }
    }
}

/// Decodes a head vector's codes and scale slots into `out` (`[d]`).
pub(crate) fn decode(codes: &[u8], scales: &[f16], bits: u8, out: &mut [f32]) {
    let book = codebook(bits);
    for (j, o) in out.chunks_exact_mut(SUB).enumerate() {
        let s = sub_scale(scales, j);
        for (i, v) in o.iter_mut().enumerate() {
            *v = s * book.levels[get_bits(codes, (j * SUB + i) * bits as usize, bits) as usize];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gaussian(n: usize, seed: &mut u64) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let mut s = 0.0;
                for _ in 0..4 {
                    *seed ^= *seed << 13;
                    *seed ^= *seed >> 7;
                    *seed ^= *seed << 17;
                    s += (*seed >> 11) as f32 / (1u64 << 53) as f32;
                }
                (s - 2.0) * 1.7
            })
            .collect()
    }

    #[test]
    fn slots_hold_d_and_four_multipliers_each() {
        assert_eq!(scale_slots(64), 3);
        assert_eq!(scale_slots(128), 5);
        assert_eq!(scale_slots(80), 4); // 10 sub-groups: slots 1, 2 full, slot 3 half
        let s = [f16::from_f32(0.5), f16::from_bits(0x4321), f16::from_bits(0x00F5)];
        assert_eq!((0..6).map(|j| multiplier(&s, j)).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5, 15]);
        assert_eq!(sub_scale(&s, 5), 7.5);
    }

    #[test]
    fn sub_sum_is_the_eight_lane_butterfly() {
        let a: [f32; 8] = std::array::from_fn(|i| 1.0 + i as f32 * 1e-7 * if i % 2 == 0 { 1.0 } else { -3.0 });
        let want = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
        assert_eq!(sub_sum(a).to_bits(), want.to_bits());
    }

    #[test]
    fn encode_picks_the_best_multiplier_and_decode_inverts_it() {
        let mut seed = 0x1357_9BDF_2468_ACE0u64;
        for bits in [2u8, 3, 4] {
            let book = codebook(bits);
            let (mut fine, mut coarse) = (0.0f64, 0.0f64);
            for trial in 0..200 {
                let mag = [1e-3f32, 1.0, 40.0][trial % 3];
                let mut y = gaussian(64, &mut seed);
                // Uneven magnitudes along the head, as in real rotated vectors.
                for (i, v) in y.iter_mut().enumerate() {
                    *v *= mag * (0.5 + (i / 8) as f32 * 0.15);
                }
                let mut codes = vec![0u8; 64 * bits as usize / 8];
                let mut scales = vec![f16::ZERO; scale_slots(64)];
                encode(&y, bits, &mut codes, &mut scales);
                let mut out = vec![0.0f32; 64];
                decode(&codes, &scales, bits, &mut out);
                let dv = scales[0].to_f32();
                for (j, g) in y.chunks_exact(SUB).enumerate() {
                    let q = multiplier(&scales, j);
                    let err: f32 = g.iter().zip(&out[j * SUB..]).map(|(a, b)| (a - b) * (a - b)).sum();
                    // The decoded error is the error the search saw for the chosen q, which no
                    // other q beats.
                    let chosen = sub_error(g, dv * q as f32, book);
                    assert!((err - chosen).abs() <= 1e-5 * chosen.max(1e-30), "bits {bits}: {err} vs {chosen}");
                    // No other q beats it, and it is the first of the best (the one-by-one
                    // search the encoder's side-by-side one stands for).
                    for other in 0..=Q_MAX {
                        let e = sub_error(g, dv * other as f32, book);
                        assert!(e >= chosen, "bits {bits}: q {other} beats {q}");
                        assert!(other >= q || e > chosen, "bits {bits}: q {other} ties {q} and comes first");
                    }
                }
                // Against turbo's one scale per 32 values on the same vector.
                let mut c32 = vec![0u8; 64 * bits as usize / 8];
                let mut s32 = [f16::ZERO; 2];
                let mut o32 = vec![0.0f32; 64];
                for g in 0..2 {
                    s32[g] = super::super::turbo::encode_group(&y[32 * g..32 * g + 32], bits, 32 * g, &mut c32);
                    super::super::turbo::decode_group(&c32, bits, 32 * g, s32[g], &mut o32[32 * g..32 * g + 32]);
                }
                let e = |o: &[f32]| y.iter().zip(o).map(|(a, b)| ((a - b) / mag) as f64).map(|x| x * x).sum::<f64>();
                fine += e(&out);
                coarse += e(&o32);
            }
            eprintln!("{bits}-bit: sub-scaled / per-32 squared error {:.3}", fine / coarse);
            assert!(fine < 0.9 * coarse, "bits {bits}: sub-scales gained too little ({fine} vs {coarse})");
        }
    }

    #[test]
    fn zero_and_tiny_vectors_decode_to_zero_or_near() {
        let y = vec![0.0f32; 64];
        let mut codes = vec![0u8; 24];
        let mut scales = vec![f16::ONE; 3];
        encode(&y, 3, &mut codes, &mut scales);
        let mut out = vec![1.0f32; 64];
        decode(&codes, &scales, 3, &mut out);
        assert!(out.iter().all(|&v| v == 0.0));
        // One live sub-group among zeros: the zero ones take q = 0.
        let mut y = vec![0.0f32; 64];
        y[8..16].copy_from_slice(&[1.0, -2.0, 0.5, 3.0, -1.0, 0.25, -0.75, 2.0]);
        encode(&y, 3, &mut codes, &mut scales);
        assert_eq!((0..8).map(|j| multiplier(&scales, j)).filter(|&q| q == 0).count(), 7);
        decode(&codes, &scales, 3, &mut out);
        assert!(out[..8].iter().chain(&out[16..]).all(|&v| v == 0.0));
        assert!(out[8..16].iter().zip(&y[8..16]).all(|(a, b)| (a - b).abs() < 1.0));
    }
}
