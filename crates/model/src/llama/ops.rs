//! Small element-wise operations of the forward pass (norms, RoPE, activations). They are
//! memory-light next to the matrix products, so plain loops the compiler vectorizes suffice.

use super::config::RopeStyle;

/// `out[i] = x[i] / sqrt(mean(x²) + eps) · w[i]` for one row.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    debug_assert!(x.len() == w.len() && x.len() == out.len());
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ms + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * inv * g;
    }
}

/// In-place [`rms_norm`] of each `w.len()`-sized chunk of `x` (per-head q/k norms).
pub fn rms_norm_chunks(x: &mut [f32], w: &[f32], eps: f32) {
    for chunk in x.chunks_exact_mut(w.len()) {
        let ms = chunk.iter().map(|v| v * v).sum::<f32>() / chunk.len() as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for (v, &g) in chunk.iter_mut().zip(w) {
            *v *= inv * g;
        }
    }
}

/// `x += y`.
pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// `gate ← silu(gate) · up`.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// Rotary position embedding tables.
#[derive(Clone, Debug)]
pub struct Rope {
    style: RopeStyle,
    head_dim: usize,
    /// `[rope_dims / 2]` angular frequency of each rotated pair.
    inv_freq: Vec<f64>,
    /// `[rope_dims / 2]` scratch cos and sin for the current position.
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Rope {
    /// `freq_i = base^(-2i / rope_dims) / factor_i / linear_scale`.
    pub fn new(style: RopeStyle, head_dim: usize, rope_dims: usize, base: f32, linear_scale: f32, factors: Option<&[f32]>) -> Rope {
        let half = rope_dims / 2;
        let inv_freq = (0..half)
            .map(|i| {
                let f = (base as f64).powf(-2.0 * i as f64 / rope_dims as f64);
                let factor = factors.map_or(1.0, |fs| fs[i] as f64);
                f / factor / linear_scale as f64
            })
            .collect();
        Rope { style, head_dim, inv_freq, cos: vec![0.0; half], sin: vec![0.0; half] }
    }

    /// Rotates every head of `x` (`[heads, head_dim]`) for position `pos`.
    pub fn apply(&mut self, x: &mut [f32], pos: usize) {
        for (i, f) in self.inv_freq.iter().enumerate() {
            let (s, c) = (pos as f64 * f).sin_cos();
            self.cos[i] = c as f32;
            self.sin[i] = s as f32;
        }
        self.apply_cached(x);
    }

    /// Rotates with the cos/sin of the last [`Self::apply`] (the same position for q and k).
    pub fn apply_cached(&self, x: &mut [f32]) {
        let half = self.inv_freq.len();
        for head in x.chunks_exact_mut(self.head_dim) {
            match self.style {
                RopeStyle::Norm => {
                    for i in 0..half {
                        let (a, b) = (head[2 * i], head[2 * i + 1]);
                        head[2 * i] = a * self.cos[i] - b * self.sin[i];
                        head[2 * i + 1] = a * self.sin[i] + b * self.cos[i];
                    }
                }
                RopeStyle::Neox => {
                    for i in 0..half {
                        let (a, b) = (head[i], head[i + half]);
                        head[i] = a * self.cos[i] - b * self.sin[i];
                        head[i + half] = a * self.sin[i] + b * self.cos[i];
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_matches_definition() {
        let x = [1.0f32, -2.0, 3.0, 0.5];
        let w = [1.0f32, 2.0, 0.5, 1.0];
        let mut out = [0.0; 4];
        rms_norm(&x, &w, 1e-6, &mut out);
        let ms = (1.0 + 4.0 + 9.0 + 0.25) / 4.0f32;
        for i in 0..4 {
            assert!((out[i] - x[i] / (ms + 1e-6).sqrt() * w[i]).abs() < 1e-6);
        }
    }

    #[test]
    fn rope_preserves_norm_and_is_identity_at_zero() {
        for style in [RopeStyle::Norm, RopeStyle::Neox] {
            let mut r = Rope::new(style, 8, 8, 10000.0, 1.0, None);
            let x: Vec<f32> = (0..16).map(|i| i as f32 * 0.1 - 0.7).collect();
            let mut y = x.clone();
            r.apply(&mut y, 0);
            assert_eq!(x, y);
            r.apply(&mut y, 123);
            let n = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
            assert!((n(&x) - n(&y)).abs() < 1e-4);
            // Relative property: <R(p) q, R(p) k> depends only on the position offset.
            let q: Vec<f32> = (0..8).map(|i| (i as f32).sin()).collect();
            let k: Vec<f32> = (0..8).map(|i| (i as f32).cos()).collect();
            let dot_at = |r: &mut Rope, pq: usize, pk: usize| {
                let (mut a, mut b) = (q.clone(), k.clone());
                r.apply(&mut a, pq);
                r.apply(&mut b, pk);
                a.iter().zip(&b).map(|(x, y)| x * y).sum::<f32>()
            };
            assert!((dot_at(&mut r, 10, 7) - dot_at(&mut r, 103, 100)).abs() < 1e-4);
        }
    }

    #[test]
    fn norm_style_rotates_adjacent_pairs() {
        let mut r = Rope::new(RopeStyle::Norm, 4, 4, 10000.0, 1.0, None);
        let mut x = vec![1.0f32, 0.0, 1.0, 0.0];
        r.apply(&mut x, 1);
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[1] - 1f32.sin()).abs() < 1e-6);
    }
}
