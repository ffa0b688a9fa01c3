//! KV storage formats: what one head vector of K or V becomes in the pages.
//!
//! Every format stores, per token slot and kv head, a run of *code bytes* and (for the
//! quantized formats) a run of f16 *scales*, one per group of [`GROUP`] values along
//! `head_dim` (the last group may be shorter when `head_dim` is not a multiple of 32, e.g. 80):
//!
//! | format | K codes | V codes | scales per head vector |
//! | --- | --- | --- | --- |
//! | `f32` | 4·D | 4·D | 0 |
//! | `f16`, `bf16` | 2·D | 2·D | 0 |
//! | `q8` | D (int8) | D | ceil(D/32) each for K and V |
//! | `q4` | D/2 (packed int4) | D/2 | ceil(D/32) each |
//! | `turbo` Kb/Vb | D·Kb/8 | D·Vb/8 | K: ceil(D/32); V: 1 + ceil(D/32) at Vb ≤ 4, else ceil(D/32) |
//!
//! Turbo's values at 2–4 bits are scaled per 8 values: one f16 per head vector and 4-bit
//! multipliers packed four to a slot ([`turbo_sub`], [`Codec::LloydMaxSub`]).
//!
//! Bytes per token per layer = `num_kv_heads × (K codes + V codes + 2 × (K slots + V slots))`; see
//! [`KvFormat::bytes_per_token`]. The reference encoder/decoder for each codec lives in the
//! submodules and is the oracle for every fast kernel (CPU SIMD, CUDA).

mod codec;
pub mod lloyd_max;
mod q4;
mod q8;
pub mod rotation;
mod turbo;
pub mod turbo_sub;

pub use codec::{lloyd_max_code, Codec};
pub use q4::Q4Group;
pub use q8::Q8Group;
pub use rotation::Rotation;

use crate::error::ConfigError;

/// Values per quantization group (one f16 scale each), along `head_dim`.
pub const GROUP: usize = 32;

/// Seed of the randomized Hadamard rotation used by `turbo` and rotated `q4` unless configured.
pub const DEFAULT_ROTATION_SEED: u64 = 0x7061_6765_6b76; // "pagekv"

/// The format K and V are stored in. Chosen once per pool; paging logic is identical for all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvFormat {
    F32,
    F16,
    Bf16,
    /// int8 codes, one f16 scale per 32 values, symmetric, after the randomized Hadamard
    /// rotation of K and V (as `q4r` and `turbo`): the rotation spreads the outlier channels
    /// of K over the whole head, which cuts the 8-bit error on real models several-fold
    /// (SmolLM2 `pagekv eval --exact-weights`: KL to f16 4.2e-4, from 3.6e-3 unrotated in a
    /// scratch build; docs/kv-formats.md) for the cost of rotating the query and the output.
    Q8,
    /// packed int4 codes, one f16 scale per 32 values, symmetric; `rotate` applies a
    /// randomized Hadamard rotation to K and V before quantizing.
    Q4 {
        rotate: bool,
    },
    /// TurboQuant: randomized Hadamard rotation, then Lloyd–Max codes for N(0,1); keys scaled
    /// per 32 values, values at 2–4 bits per 8 ([`Codec::LloydMaxSub`]), at 8 bits per 32;
    /// `k_bits`/`v_bits` ∈ {2, 3, 4, 8}.
    Turbo {
        k_bits: u8,
        v_bits: u8,
    },
}

/// Accepted values of `PAGEKV_KV_QUANT` / `--kv-quant`.
pub const KV_QUANT_VALUES: &str = "off, f32, f16, bf16, q8 (rotated int8), q4, q4r (q4 with rotation), turbo";

/// Bit widths accepted for the turbo codebooks.
pub const TURBO_BITS: [u8; 4] = [2, 3, 4, 8];

impl KvFormat {
    /// The default turbo configuration: K 8-bit, V 3-bit.
    pub const TURBO_DEFAULT: KvFormat = KvFormat::Turbo { k_bits: 8, v_bits: 3 };

    /// Parses a `--kv-quant` value. `off` means unquantized storage in `unquantized`
    /// (f16 on CPU, bf16 on GPU).
    pub fn parse(value: &str, unquantized: KvFormat) -> Result<KvFormat, ConfigError> {
        match value.trim().to_ascii_lowercase().as_str() {
            "off" | "none" => Ok(unquantized),
            "f32" => Ok(KvFormat::F32),
            "f16" => Ok(KvFormat::F16),
            "bf16" => Ok(KvFormat::Bf16),
            "q8" => Ok(KvFormat::Q8),
            "q4" => Ok(KvFormat::Q4 { rotate: false }),
            "q4r" | "q4-rot" | "q4_rot" => Ok(KvFormat::Q4 { rotate: true }),
            "turbo" => Ok(KvFormat::TURBO_DEFAULT),
            _ => Err(ConfigError::invalid("kv quant", value, KV_QUANT_VALUES)),
        }
    }

    /// Short stable name (`f16`, `q4r`, `turbo-k8v3`, …) for tables, metrics and JSON.
    pub fn name(&self) -> String {
        match *self {
            KvFormat::F32 => "f32".into(),
            KvFormat::F16 => "f16".into(),
            KvFormat::Bf16 => "bf16".into(),
            KvFormat::Q8 => "q8".into(),
            KvFormat::Q4 { rotate: false } => "q4".into(),
            KvFormat::Q4 { rotate: true } => "q4r".into(),
            KvFormat::Turbo { k_bits, v_bits } => format!("turbo-k{k_bits}v{v_bits}"),
        }
    }

    /// Checks that this format can store head vectors of `head_dim` values.
    pub fn validate(&self, head_dim: usize) -> Result<(), ConfigError> {
        if head_dim == 0 || !head_dim.is_multiple_of(8) {
            return Err(ConfigError::Geometry(format!("head_dim {head_dim} must be a positive multiple of 8")));
        }
        if let KvFormat::Turbo { k_bits, v_bits } = *self {
            for (side, bits) in [("K", k_bits), ("V", v_bits)] {
                if !TURBO_BITS.contains(&bits) {
                    return Err(ConfigError::invalid(&format!("turbo {side} bits"), &bits.to_string(), "2, 3, 4, 8"));
                }
            }
        }
        Ok(())
    }

    /// Codec of the K side.
    pub fn key_codec(&self) -> Codec {
        match *self {
            KvFormat::F32 => Codec::F32,
            KvFormat::F16 => Codec::F16,
            KvFormat::Bf16 => Codec::Bf16,
            KvFormat::Q8 => Codec::Q8,
            KvFormat::Q4 { .. } => Codec::Q4,
            KvFormat::Turbo { k_bits, .. } => Codec::LloydMax { bits: k_bits },
        }
    }

    /// Codec of the V side.
    pub fn value_codec(&self) -> Codec {
        match *self {
            KvFormat::Turbo { v_bits: 8, .. } => Codec::LloydMax { bits: 8 },
            KvFormat::Turbo { v_bits, .. } => Codec::LloydMaxSub { bits: v_bits },
            _ => self.key_codec(),
        }
    }

    /// Whether K and V are rotated before encoding (then kernels rotate the query and
    /// un-rotate the output).
    pub fn is_rotated(&self) -> bool {
        matches!(self, KvFormat::Q8 | KvFormat::Q4 { rotate: true } | KvFormat::Turbo { .. })
    }

    /// The rotation for `head_dim`, if this format rotates.
    pub fn rotation(&self, head_dim: usize, seed: u64) -> Option<Rotation> {
        self.is_rotated().then(|| Rotation::new(head_dim, seed))
    }

    /// Exact bytes one token occupies in one layer (K and V, codes and scales):
    /// `num_kv_heads × (key_codes + value_codes + 2 bytes × (key_slots + value_slots))`.
    pub fn bytes_per_token(&self, num_kv_heads: usize, head_dim: usize) -> usize {
        let k = self.key_codec();
        let v = self.value_codec();
        num_kv_heads * (k.code_bytes(head_dim) + v.code_bytes(head_dim) + 2 * (k.scales(head_dim) + v.scales(head_dim)))
    }
}

impl std::fmt::Display for KvFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// Number of scale groups for `head_dim` values.
pub fn groups(head_dim: usize) -> usize {
    head_dim.div_ceil(GROUP)
}

/// Length of group `g` of a head vector of `head_dim` values (32, or less for the last one).
pub fn group_len(head_dim: usize, g: usize) -> usize {
    GROUP.min(head_dim - g * GROUP)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_per_token_match_the_documented_formula() {
        // kv_heads = 8, head_dim = 128, per layer.
        assert_eq!(KvFormat::F32.bytes_per_token(8, 128), 8192);
        assert_eq!(KvFormat::F16.bytes_per_token(8, 128), 4096);
        assert_eq!(KvFormat::Bf16.bytes_per_token(8, 128), 4096);
        assert_eq!(KvFormat::Q8.bytes_per_token(8, 128), 8 * (128 + 128 + 2 * 8));
        assert_eq!(KvFormat::Q4 { rotate: true }.bytes_per_token(8, 128), 8 * (64 + 64 + 2 * 8));
        // turbo K8/V3: K one scale per 32; V one f16 + 16 4-bit multipliers (4 slots).
        assert_eq!(KvFormat::TURBO_DEFAULT.bytes_per_token(8, 128), 8 * (128 + 48 + 2 * (4 + 5)));
        assert_eq!(KvFormat::TURBO_DEFAULT.bytes_per_token(3, 64), 3 * (64 + 24 + 2 * (2 + 3)));
        assert_eq!(KvFormat::Turbo { k_bits: 8, v_bits: 8 }.bytes_per_token(1, 64), 64 + 64 + 2 * (2 + 2));
        // head_dim 80: groups of 32, 32, 16.
        assert_eq!(KvFormat::Q8.bytes_per_token(1, 80), 80 + 80 + 2 * 6);
    }

    #[test]
    fn parse_accepts_documented_values_and_rejects_others() {
        assert_eq!(KvFormat::parse("off", KvFormat::F16).unwrap(), KvFormat::F16);
        assert_eq!(KvFormat::parse("Q8", KvFormat::F16).unwrap(), KvFormat::Q8);
        assert_eq!(KvFormat::parse("q4r", KvFormat::F16).unwrap(), KvFormat::Q4 { rotate: true });
        assert_eq!(KvFormat::parse("turbo", KvFormat::F16).unwrap(), KvFormat::TURBO_DEFAULT);
        let err = KvFormat::parse("q5", KvFormat::F16).unwrap_err().to_string();
        assert!(err.contains("q5") && err.contains("q8") && err.contains("turbo"), "{err}");
    }

    #[test]
    fn validate_rejects_bad_geometry_and_bits() {
        assert!(KvFormat::Q8.validate(12).is_err());
        assert!(KvFormat::Turbo { k_bits: 5, v_bits: 3 }.validate(128).is_err());
        assert!(KvFormat::Turbo { k_bits: 2, v_bits: 4 }.validate(80).is_ok());
    }
}
