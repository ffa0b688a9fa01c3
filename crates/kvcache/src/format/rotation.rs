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
        debug_assert!(head_dim > 0 && head_dim % 8 == 0, "head_dim {head_dim} must be a multiple of 8");
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
fn walsh_hadamard(x: &mut [f32]) {
    let n = x.len();
    debug_assert!(n.is_power_of_two());
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
