//! Lloyd–Max scalar quantizers for the standard normal distribution N(0, 1).
//!
//! After a random rotation every coordinate of a head vector is close to Gaussian, so the
//! MSE-optimal scalar codebook for N(0,1), scaled by the group's RMS, is near-optimal for
//! every coordinate (TurboQuant). Codebooks are computed once per bit width by Lloyd's
//! iteration on the exact density (boundaries at midpoints, levels at conditional means)
//! and cached for the life of the process.

use std::sync::OnceLock;

/// A symmetric scalar codebook with `2^bits` levels, ascending.
#[derive(Debug)]
pub struct Codebook {
    /// `[2^bits]` reconstruction levels, ascending.
    pub levels: Vec<f32>,
    /// `[2^bits - 1]` decision boundaries (midpoints between consecutive levels).
    pub bounds: Vec<f32>,
    /// `[GUESS_CELLS]` for wide codebooks: `guess[c]` = the number of bounds below the start of
    /// cell `c − 1` of a uniform grid over `±GUESS_SPAN` (0 for the first two cells), a lower
    /// bound on the code of any `x` that maps to cell `c` — see [`Codebook::encode`].
    guess: Vec<u16>,
}

/// Cells of the encode guess grid, and the half-width it covers.
const GUESS_CELLS: usize = 1024;
const GUESS_SPAN: f32 = 5.0;

impl Codebook {
    fn new(levels: Vec<f32>, bounds: Vec<f32>) -> Codebook {
        let guess = if bounds.len() > 15 {
            let w = 2.0 * GUESS_SPAN / GUESS_CELLS as f32;
            (0..GUESS_CELLS)
                .map(|c| {
                    if c < 2 {
                        return 0;
                    }
                    let start = -GUESS_SPAN + (c - 1) as f32 * w;
                    bounds.partition_point(|&b| b < start) as u16
                })
                .collect()
        } else {
            Vec::new()
        };
        Codebook { levels, bounds, guess }
    }

    /// Index of the nearest level to `x`: the number of bounds below `x` (bounds ascending).
    /// Narrow codebooks count them (branch-free); wide ones start from the guess of `x`'s grid
    /// cell, which is at most that count (the cell before `x`'s starts below `x`, whatever the
    /// rounding of the cell index), and step up — one or two steps for 8 bits. NaN gives 0.
    #[inline]
    pub fn encode(&self, x: f32) -> u8 {
        if self.guess.is_empty() {
            return self.bounds.iter().filter(|&&b| b < x).count() as u8;
        }
        let cell = ((x + GUESS_SPAN) * (GUESS_CELLS as f32 / (2.0 * GUESS_SPAN))) as isize; // NaN → 0
        let mut c = self.guess[cell.clamp(0, GUESS_CELLS as isize - 1) as usize] as usize;
        while c < self.bounds.len() && self.bounds[c] < x {
            c += 1;
        }
        debug_assert_eq!(c, self.bounds.partition_point(|&b| b < x));
        c as u8
    }
}

/// The cached Lloyd–Max codebook for N(0,1) at `bits` ∈ {2, 3, 4, 8}.
pub fn codebook(bits: u8) -> &'static Codebook {
    static BOOKS: [OnceLock<Codebook>; 4] = [OnceLock::new(), OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let slot = match bits {
        2 => 0,
        3 => 1,
        4 => 2,
        8 => 3,
        _ => panic!("Lloyd-Max codebook for {bits} bits is not supported (2, 3, 4, 8); validated at config time"),
    };
    BOOKS[slot].get_or_init(|| lloyd_max_normal(1usize << bits))
}

fn lloyd_max_normal(levels: usize) -> Codebook {
    // Start from uniform quantiles over ±3.5σ, then iterate to the fixed point.
    let span = 3.5 + (levels as f64).log2() * 0.15;
    let mut lv: Vec<f64> = (0..levels).map(|i| -span + (2.0 * span) * (i as f64 + 0.5) / levels as f64).collect();
    let mut bounds = vec![0.0f64; levels - 1];
    for _ in 0..2000 {
        for i in 0..levels - 1 {
            bounds[i] = 0.5 * (lv[i] + lv[i + 1]);
        }
        let mut delta: f64 = 0.0;
        for i in 0..levels {
            let a = if i == 0 { f64::NEG_INFINITY } else { bounds[i - 1] };
            let b = if i == levels - 1 { f64::INFINITY } else { bounds[i] };
            let mass = normal_cdf(b) - normal_cdf(a);
            let new = if mass > 1e-300 { (normal_pdf(a) - normal_pdf(b)) / mass } else { lv[i] };
            delta = delta.max((new - lv[i]).abs());
            lv[i] = new;
        }
        if delta < 1e-12 {
            break;
        }
    }
    for i in 0..levels - 1 {
        bounds[i] = 0.5 * (lv[i] + lv[i + 1]);
    }
    Codebook::new(lv.iter().map(|&v| v as f32).collect(), bounds.iter().map(|&v| v as f32).collect())
}

fn normal_pdf(x: f64) -> f64 {
    if x.is_infinite() {
        return 0.0;
    }
    (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

fn normal_cdf(x: f64) -> f64 {
    if x == f64::INFINITY {
        return 1.0;
    }
    if x == f64::NEG_INFINITY {
        return 0.0;
    }
    0.5 * erfc(-x / std::f64::consts::SQRT_2)
}

/// Complementary error function, W. J. Cody's rational approximations (relative error < 1e-15
/// in double precision is not claimed; < 1e-13 is ample for codebook design).
fn erfc(x: f64) -> f64 {
    // Use the continued-fraction-free Chebyshev fit from Numerical Recipes (erfccheb),
    // accurate to ~1.2e-16 relative for x >= 0; reflect for x < 0.
    if x < 0.0 {
        return 2.0 - erfc(-x);
    }
    const COF: [f64; 28] = [
        -1.3026537197817094,
        6.419_697_923_564_902e-1,
        1.9476473204185836e-2,
        -9.561_514_786_808_63e-3,
        -9.46595344482036e-4,
        3.66839497852761e-4,
        4.2523324806907e-5,
        -2.0278578112534e-5,
        -1.624290004647e-6,
        1.303655835580e-6,
        1.5626441722e-8,
        -8.5238095915e-8,
        6.529054439e-9,
        5.059343495e-9,
        -9.91364156e-10,
        -2.27365122e-10,
        9.6467911e-11,
        2.394038e-12,
        -6.886027e-12,
        8.94487e-13,
        3.13092e-13,
        -1.12708e-13,
        3.81e-16,
        7.106e-15,
        -1.523e-15,
        -9.4e-17,
        1.21e-16,
        -2.8e-17,
    ];
    let t = 2.0 / (2.0 + x);
    let ty = 4.0 * t - 2.0;
    let (mut d, mut dd) = (0.0f64, 0.0f64);
    for &c in COF[1..].iter().rev() {
        let tmp = d;
        d = ty * d - dd + c;
        dd = tmp;
    }
    t * (-x * x + 0.5 * (COF[0] + ty * d) - dd).exp()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erfc_matches_known_values() {
        for (x, want) in [
            (0.0, 1.0),
            (0.5, 0.4795001221869535),
            (1.0, 0.15729920705028513),
            (2.0, 0.004677734981047266),
            (-1.0, 1.8427007929497148),
        ] {
            assert!((erfc(x) - want).abs() < 1e-12, "erfc({x}) = {} want {want}", erfc(x));
        }
    }

    #[test]
    fn codebooks_match_published_lloyd_max_values() {
        // Max (1960): 2-bit levels ±0.4528, ±1.510; 3-bit outermost level 2.152; MSE 0.1175 / 0.03454.
        let b2 = codebook(2);
        assert!((b2.levels[3] - 1.510).abs() < 1e-3 && (b2.levels[2] - 0.4528).abs() < 1e-3, "{:?}", b2.levels);
        let b3 = codebook(3);
        assert!((b3.levels[7] - 2.152).abs() < 1e-3, "{:?}", b3.levels);
        for bits in [2u8, 3, 4, 8] {
            let b = codebook(bits);
            assert_eq!(b.levels.len(), 1 << bits);
            assert!(b.levels.windows(2).all(|w| w[0] < w[1]));
            // Symmetric around zero.
            let n = b.levels.len();
            for i in 0..n {
                assert!((b.levels[i] + b.levels[n - 1 - i]).abs() < 1e-4);
            }
        }
        assert_eq!(b3.encode(0.01), 4);
        // encode is the count of bounds below x, for every width, at and around every bound,
        // far outside the guess grid, and on fresh values.
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        for bits in [2u8, 3, 4, 8] {
            let b = codebook(bits);
            let count = |x: f32| b.bounds.iter().filter(|&&v| v < x).count() as u8;
            let mut xs = vec![-1e30f32, -6.0, -5.0, -4.99, 0.0, -0.0, 4.99, 5.0, 6.0, 1e30, f32::NAN, f32::INFINITY];
            for &v in &b.bounds {
                xs.extend([
                    v,
                    f32::from_bits(v.to_bits().wrapping_add(1)),
                    f32::from_bits(v.to_bits().wrapping_sub(1)),
                    -v,
                ]);
            }
            for _ in 0..20000 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                xs.push(((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 12.0);
            }
            for x in xs {
                assert_eq!(b.encode(x), count(x), "bits {bits} x {x}");
            }
        }
        assert_eq!(b3.encode(-100.0), 0);
        assert_eq!(b3.encode(100.0), 7);
    }
}
