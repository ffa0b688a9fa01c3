//! Randomized Hadamard rotation of one head vector.
//!
//! `R = H · D / sqrt(n)` applied block-diagonally: the head vector is cut into blocks of `n`
//! values (`n` = the largest power of two dividing `head_dim`: 64→64, 80→16, 96→32, 128→128,
//! 256→256), each block is multiplied by a random ±1 diagonal `D` (signs drawn from a seed)
//! and then by the normalized Walsh–Hadamard matrix. `R` is orthogonal, so
//! `dot(R q, R k) = dot(q, k)` and `Rᵀ Σ p·(R v) = Σ p·v`: attention kernels rotate the query
//! and un-rotate the output instead of un-rotating every key and value.

/// An orthogonal rotation of head vectors of one length. Cheap to clone (signs only).
#[derive(Clone, Debug, PartialEq)]
pub struct Rotation {
    head_dim: usize,
    block: usize,
    /// `[head_dim]` ±1.0 diagonal, applied before the Hadamard transform.
    signs: Vec<f32>,
}

impl Rotation {
    /// Rotation for `head_dim` values (a multiple of 8) with signs derived from `seed`.
    pub fn new(head_dim: usize, seed: u64) -> Rotation {
        debug_assert!(head_dim > 0 && head_dim.is_multiple_of(8), "head_dim {head_dim} must be a multiple of 8");
        let block = 1usize << head_dim.trailing_zeros();
        let signs = (0..head_dim)
            .map(
                |i| if splitmix64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)) & 1 == 0 { 1.0 } else { -1.0 },
            )
            .collect();
        Rotation { head_dim, block, signs }
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Size of the Hadamard blocks (a power of two dividing `head_dim`).
    pub fn block(&self) -> usize {
        self.block
    }

    /// `[head_dim]` the ±1.0 diagonal applied before the Hadamard transform (device backends
    /// upload it so their rotation matches this one bit for bit).
    pub fn signs(&self) -> &[f32] {
        &self.signs
    }

    /// `x ← R x` in place. `x`: `[head_dim]`.
    pub fn apply(&self, x: &mut [f32]) {
        debug_assert_eq!(x.len(), self.head_dim);
        for (v, s) in x.iter_mut().zip(&self.signs) {
            *v *= s;
        }
        let norm = 1.0 / (self.block as f32).sqrt();
        for chunk in x.chunks_exact_mut(self.block) {
            walsh_hadamard(chunk);
            for v in chunk.iter_mut() {
                *v *= norm;
            }
        }
    }

    /// `x ← Rᵀ x` in place (the inverse, since `R` is orthogonal). `x`: `[head_dim]`.
    pub fn apply_inverse(&self, x: &mut [f32]) {
        debug_assert_eq!(x.len(), self.head_dim);
        let norm = 1.0 / (self.block as f32).sqrt();
        for chunk in x.chunks_exact_mut(self.block) {
            walsh_hadamard(chunk);
            for v in chunk.iter_mut() {
                *v *= norm;
            }
        }
        for (v, s) in x.iter_mut().zip(&self.signs) {
            *v *= s;
        }
    }
}

/// Unnormalized in-place fast Walsh–Hadamard transform; `x.len()` is a power of two.
///
/// The butterflies and their operands are those of the textbook loop ([`tests`]' reference):
/// stages 1, 2 and 4 run on each run of eight values in registers, the wider stages as two
/// contiguous halves, which vectorize. Each output is the same sequence of additions, so the
/// result is bit-identical to the reference (and to the GPU's `rotate_smem`).
fn walsh_hadamard(x: &mut [f32]) {
    let n = x.len();
    debug_assert!(n.is_power_of_two());
    let mut h = 1;
    if n >= 8 {
        for c in x.chunks_exact_mut(8) {
            let mut v = [0.0f32; 8];
            v.copy_from_slice(c);
            for h in [1, 2, 4] {
                for start in (0..8).step_by(2 * h) {
                    for i in start..start + h {
                        let (a, b) = (v[i], v[i + h]);
                        v[i] = a + b;
                        v[i + h] = a - b;
                    }
                }
            }
            c.copy_from_slice(&v);
        }
        h = 8;
    }
    while h < n {
        for pair in x.chunks_exact_mut(2 * h) {
            let (lo, hi) = pair.split_at_mut(h);
            for (a, b) in lo.iter_mut().zip(hi.iter_mut()) {
                let (p, q) = (*a, *b);
                *a = p + q;
                *b = p - q;
            }
        }
        h *= 2;
    }
}

/// SplitMix64: a tiny, well-mixed, seedable hash used for reproducible signs.
pub(crate) fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_is_orthogonal_for_every_supported_head_dim() {
        for &d in &[64usize, 80, 96, 128, 256] {
            let r = Rotation::new(d, 7);
            let x: Vec<f32> = (0..d).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.3 + 0.1).collect();
            let mut y = x.clone();
            r.apply(&mut y);
            let nx: f32 = x.iter().map(|v| v * v).sum();
            let ny: f32 = y.iter().map(|v| v * v).sum();
            assert!((nx - ny).abs() < 1e-3 * nx, "norm changed for d={d}");
            assert_ne!(x, y);
            r.apply_inverse(&mut y);
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() < 1e-5, "d={d}: {a} vs {b}");
            }
        }
    }

    /// The textbook transform the fast one must equal bit for bit.
    fn walsh_hadamard_reference(x: &mut [f32]) {
        let n = x.len();
        let mut h = 1;
        while h < n {
            for start in (0..n).step_by(h * 2) {
                for i in start..start + h {
                    let (a, b) = (x[i], x[i + h]);
                    x[i] = a + b;
                    x[i + h] = a - b;
                }
            }
            h *= 2;
        }
    }

    #[test]
    fn fast_walsh_hadamard_is_bit_identical_to_the_reference() {
        let mut state = 0x1234_5678_9ABC_DEF1u64;
        for n in [1usize, 2, 4, 8, 16, 32, 64, 128, 256] {
            for _ in 0..50 {
                let x: Vec<f32> = (0..n)
                    .map(|_| {
                        state = splitmix64(state);
                        ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 10f32.powi((state % 7) as i32 - 3)
                    })
                    .collect();
                let (mut a, mut b) = (x.clone(), x);
                walsh_hadamard(&mut a);
                walsh_hadamard_reference(&mut b);
                assert_eq!(
                    a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "n = {n}"
                );
            }
        }
    }

    #[test]
    fn rotation_spreads_a_single_channel() {
        let r = Rotation::new(128, 1);
        let mut x = vec![0.0f32; 128];
        x[5] = 20.0;
        r.apply(&mut x);
        let expected = 20.0 / (128f32).sqrt();
        assert!(x.iter().all(|v| (v.abs() - expected).abs() < 1e-4));
    }
}
