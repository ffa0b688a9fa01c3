//! Small element-wise operations of the forward pass (norms, RoPE; SwiGLU is in
//! [`super::silu`]). They are memory-light next to the matrix products, so plain
//! loops the compiler vectorizes suffice.
//!
//! Where the f32 rounding of an operation is a choice, it follows ggml-cpu (what llama.cpp
//! computes): the model's activations are quantized to 8 bits before every matrix product, so
//! a last-bit difference anywhere flips a few codes, and 30 layers amplify those flips into
//! logit differences of tenths — enough to change llama.cpp's argmax on near-ties.

use pagekv_cpu::quant::Isa;

use super::config::RopeStyle;

/// `1 / sqrt(mean(x²) + eps)` as ggml's `rms_norm`: the squares (in f32) summed in f64, the
/// mean rounded to f32.
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// `out[i] = x[i] / sqrt(mean(x²) + eps) · w[i]` for one row.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    debug_assert!(x.len() == w.len() && x.len() == out.len());
    let inv = rms_scale(x, eps);
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * inv * g;
    }
}

/// In-place [`rms_norm`] of each `w.len()`-sized chunk of `x` (per-head q/k norms).
pub fn rms_norm_chunks(x: &mut [f32], w: &[f32], eps: f32) {
    for chunk in x.chunks_exact_mut(w.len()) {
        let inv = rms_scale(chunk, eps);
        for (v, &g) in chunk.iter_mut().zip(w) {
            *v = *v * inv * g;
        }
    }
}

/// `x += y`.
pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Rotary position embedding: per position, the cos/sin of each rotated pair's angle.
///
/// Angles as ggml's `rope` computes them, in f32: `theta_scale = base^(-2 / rope_dims)`, and
/// for pair `i` at position `p`, `theta_i = p · theta_scale^i` built by repeated
/// multiplication, then `freq_scale · theta_i / factor_i`, then `cosf`/`sinf`. These differ from
/// exactly computed angles by the rounding of the running product (up to 3e-5 rad at position
/// 1000 for SmolLM2's base 1e5).
#[derive(Clone, Debug)]
pub struct Rope {
    style: RopeStyle,
    head_dim: usize,
    /// Rotated pairs per head (`rope_dims / 2`).
    half: usize,
    /// `base^(-2 / rope_dims)`: the ratio of consecutive pairs' frequencies.
    theta_scale: f32,
    /// `1 / linear_scale` (ggml's `freq_scale`).
    freq_scale: f32,
    /// `[rope_dims / 2]` frequency divisors (Llama 3.1 `rope_freqs`), if any.
    factors: Option<Vec<f32>>,
}

impl Rope {
    /// `freq_i = base^(-2i / rope_dims) / factor_i / linear_scale`.
    pub fn new(
        style: RopeStyle,
        head_dim: usize,
        rope_dims: usize,
        base: f32,
        linear_scale: f32,
        factors: Option<&[f32]>,
    ) -> Rope {
        let half = rope_dims / 2;
        debug_assert!(factors.is_none_or(|f| f.len() >= half));
        Rope {
            style,
            head_dim,
            half,
            theta_scale: base.powf(-2.0 / rope_dims as f32),
            freq_scale: 1.0 / linear_scale,
            factors: factors.map(|f| f[..half].to_vec()),
        }
    }

    /// Values one position's angles take in a table: `[cos × half, sin × half]`.
    pub fn angles_len(&self) -> usize {
        2 * self.half
    }

    /// Writes position `pos`'s cos and sin into `cs` (`[cos × half, sin × half]`).
    pub fn angles(&self, pos: usize, cs: &mut [f32]) {
        debug_assert_eq!(cs.len(), self.angles_len());
        let (cos, sin) = cs.split_at_mut(self.half);
        let mut theta = pos as f32;
        for i in 0..self.half {
            let factor = self.factors.as_ref().map_or(1.0, |f| f[i]);
            let angle = self.freq_scale * (theta / factor);
            cos[i] = angle.cos();
            sin[i] = angle.sin();
            theta *= self.theta_scale;
        }
    }

    /// Rotates every head of `x` (`[heads, head_dim]`) for position `pos`.
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        let mut cs = vec![0.0; self.angles_len()];
        self.angles(pos, &mut cs);
        self.rotate(x, &cs);
    }

    /// Rotates every head of `x` (`[heads, head_dim]`) by the angles `cs` of [`Self::angles`].
    pub fn rotate(&self, x: &mut [f32], cs: &[f32]) {
        debug_assert_eq!(cs.len(), self.angles_len());
        #[cfg(target_arch = "x86_64")]
        if Isa::best().has_avx2() {
            // SAFETY: has_avx2 means AVX2, FMA and F16C were detected on this CPU.
            unsafe { self.rotate_fma(x, cs) };
            return;
        }
        self.rotate_plain(x, cs);
    }

    /// [`Self::rotate_plain`] compiled with FMA instructions (elsewhere `mul_add` is a libm call).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "fma")]
    unsafe fn rotate_fma(&self, x: &mut [f32], cs: &[f32]) {
        self.rotate_plain(x, cs)
    }

    /// Rotates each pair `(a, b)` to `(a cos - b sin, a sin + b cos)` with the first product
    /// fused, `a.mul_add(cos, -(b sin))` and `a.mul_add(sin, b cos)`: ggml writes the plain
    /// expression, which C compilers contract to exactly these FMAs on FMA targets (GCC and
    /// Clang contract by default), so this is what llama.cpp computes.
    #[inline(always)]
    fn rotate_plain(&self, x: &mut [f32], cs: &[f32]) {
        let half = self.half;
        let (cos, sin) = cs.split_at(half);
        let rot = |a: f32, b: f32, c: f32, s: f32| (a.mul_add(c, -(b * s)), a.mul_add(s, b * c));
        for head in x.chunks_exact_mut(self.head_dim) {
            match self.style {
                RopeStyle::Norm => {
                    for i in 0..half {
                        (head[2 * i], head[2 * i + 1]) = rot(head[2 * i], head[2 * i + 1], cos[i], sin[i]);
                    }
                }
                RopeStyle::Neox => {
                    for i in 0..half {
                        (head[i], head[i + half]) = rot(head[i], head[i + half], cos[i], sin[i]);
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
    fn rms_norm_sums_squares_in_f64() {
        // 1 + 4096 · (2^-12)² = 1.000244140625 is exact in f64 but, summed in f32 one square
        // at a time, every 2^-24 is lost against the running sum of 1.
        let mut x = vec![2f32.powi(-12); 4097];
        x[0] = 1.0;
        let w = vec![1.0f32; x.len()];
        let mut out = vec![0.0; x.len()];
        rms_norm(&x, &w, 0.0, &mut out);
        let mean = ((1.0 + 4096.0 * 2f64.powi(-24)) / 4097.0) as f32;
        assert_eq!(out[0], 1.0 / mean.sqrt());
    }

    #[test]
    fn rope_angles_follow_ggml() {
        // theta_i = p · theta_scale^i by repeated f32 multiplication; cos/sin in f32.
        let r = Rope::new(RopeStyle::Neox, 8, 8, 100000.0, 2.0, Some(&[1.0, 1.5, 2.0, 4.0]));
        let mut x = vec![1.0f32, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0];
        r.apply(&mut x, 777);
        let scale = 100000f32.powf(-2.0 / 8.0);
        let mut theta = 777.0f32;
        for (i, ff) in [1.0f32, 1.5, 2.0, 4.0].into_iter().enumerate() {
            let angle = 0.5 * (theta / ff);
            assert_eq!((x[i], x[i + 4]), (angle.cos(), angle.sin()), "pair {i}");
            theta *= scale;
        }
    }

    #[test]
    fn rope_preserves_norm_and_is_identity_at_zero() {
        for style in [RopeStyle::Norm, RopeStyle::Neox] {
            let r = Rope::new(style, 8, 8, 10000.0, 1.0, None);
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
            let dot_at = |r: &Rope, pq: usize, pk: usize| {
                let (mut a, mut b) = (q.clone(), k.clone());
                r.apply(&mut a, pq);
                r.apply(&mut b, pk);
                a.iter().zip(&b).map(|(x, y)| x * y).sum::<f32>()
            };
            assert!((dot_at(&r, 10, 7) - dot_at(&r, 103, 100)).abs() < 1e-4);
        }
    }

    #[test]
    fn norm_style_rotates_adjacent_pairs() {
        let r = Rope::new(RopeStyle::Norm, 4, 4, 10000.0, 1.0, None);
        let mut x = vec![1.0f32, 0.0, 1.0, 0.0];
        r.apply(&mut x, 1);
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[1] - 1f32.sin()).abs() < 1e-6);
    }
}
