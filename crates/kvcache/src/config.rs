//! Cache configuration: geometry of the pages and the policy of each sequence, with the
//! documented defaults and the `PAGEKV_*` environment variables.
//!
//! | variable | field | accepted |
//! | --- | --- | --- |
//! | `PAGEKV_KV_QUANT` | `format` | `off|f32|f16|bf16|q8|q4|q4r|turbo` |
//! | `PAGEKV_TURBO_K_BITS`, `PAGEKV_TURBO_V_BITS` | turbo bit widths | 2, 3, 4, 8 |
//! | `PAGEKV_BLOCK_SIZE` | `block_size` | 8, 16, 32 |
//! | `PAGEKV_NUM_BLOCKS` | `num_blocks` | integer ≥ 1 |
//! | `PAGEKV_DYNAMIC_KV` | `dynamic_growth` | 1/0, true/false, on/off, yes/no |
//! | `PAGEKV_CONTEXT_WINDOW` | `context_window` | integer ≥ 1, or `off` |
//! | `PAGEKV_SLIDING_WINDOW` | `sliding_window` | integer ≥ 1, or `off` |
//! | `PAGEKV_DEBUG_BLOCKS` | `debug_blocks` | as `DYNAMIC_KV` |
//! | `PAGEKV_HYBRID_KV` | `hybrid` | as `DYNAMIC_KV` |
//!
//! An invalid value is an error naming the variable and the accepted values; nothing falls
//! back silently. Parsing takes a lookup function so tests need not touch the process env.

use crate::error::ConfigError;
use crate::format::{KvFormat, DEFAULT_ROTATION_SEED, TURBO_BITS};
use crate::groups::LayerGroups;

/// Block sizes (tokens per block) the cache supports.
pub const BLOCK_SIZES: [usize; 3] = [8, 16, 32];

/// Everything needed to build a pool and the policy of its sequences.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheConfig {
    pub num_layers: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Tokens per block: 8, 16 (default) or 32.
    pub block_size: usize,
    /// Blocks in the pool (default 1024).
    pub num_blocks: usize,
    pub format: KvFormat,
    /// Seed of the randomized Hadamard rotation of rotated formats.
    pub rotation_seed: u64,
    /// Take more blocks when an append does not fit (default off).
    pub dynamic_growth: bool,
    /// Cap on positions of a sequence without a sliding window, and on what a windowed
    /// sequence may see (default: none).
    pub context_window: Option<usize>,
    /// Default sliding window: attention sees the last W tokens; older blocks are reclaimed.
    pub sliding_window: Option<usize>,
    /// Print block tables as ASCII on growth, trim and fork (`PAGEKV_DEBUG_BLOCKS=1`).
    pub debug_blocks: bool,
    /// Give layers with a sliding window their own block tables, which free blocks as the
    /// window slides (default on). Off: every layer is in one group and per-layer windows are
    /// applied by masking alone (every block kept). Read by [`Self::set_layer_windows`].
    pub hybrid: bool,
    /// The layer groups (default: one group of every layer). Set through
    /// [`Self::set_layer_windows`], which keeps the pool's bytes unchanged.
    pub groups: LayerGroups,
}

impl CacheConfig {
    /// A configuration with the documented defaults for the given model geometry.
    pub fn new(num_layers: usize, num_kv_heads: usize, head_dim: usize) -> CacheConfig {
        CacheConfig {
            num_layers,
            num_kv_heads,
            head_dim,
            block_size: 16,
            num_blocks: 1024,
            format: KvFormat::F16,
            rotation_seed: DEFAULT_ROTATION_SEED,
            dynamic_growth: false,
            context_window: None,
            sliding_window: None,
            debug_blocks: false,
            hybrid: true,
            groups: LayerGroups::single(num_layers),
        }
    }

    /// Sets the layer groups from each layer's window (`None`: full attention), as
    /// [`LayerGroups::from_layer_windows`] builds them when `hybrid` is on, or one group when
    /// it is off. `num_layers` becomes `windows.len()`. `num_blocks` counts blocks spanning
    /// [`LayerGroups::planes`] layers, so it is scaled to keep the pool's bytes: 1024 blocks of
    /// 18 layers become 6144 blocks of 3.
    pub fn set_layer_windows(&mut self, windows: &[Option<usize>]) -> Result<(), ConfigError> {
        if self.groups.num_layers() != windows.len() {
            self.num_layers = windows.len();
            self.groups = LayerGroups::single(windows.len());
        }
        let groups =
            if self.hybrid { LayerGroups::from_layer_windows(windows)? } else { LayerGroups::single(windows.len()) };
        self.num_blocks = self.num_blocks * self.groups.planes() / groups.planes();
        self.groups = groups;
        Ok(())
    }

    /// Overlays the `PAGEKV_*` settings read through `lookup` (the binary passes its flags over
    /// the environment; tests pass a map).
    pub fn with_env_from(mut self, lookup: impl Fn(&str) -> Option<String>) -> Result<CacheConfig, ConfigError> {
        let var = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        if let Some(v) = var("PAGEKV_KV_QUANT") {
            self.format = KvFormat::parse(&v, KvFormat::F16).map_err(|e| rename(e, "PAGEKV_KV_QUANT"))?;
        }
        if let KvFormat::Turbo { k_bits, v_bits } = self.format {
            let k = match var("PAGEKV_TURBO_K_BITS") {
                Some(v) => parse_bits(&v, "PAGEKV_TURBO_K_BITS")?,
                None => k_bits,
            };
            let vb = match var("PAGEKV_TURBO_V_BITS") {
                Some(v) => parse_bits(&v, "PAGEKV_TURBO_V_BITS")?,
                None => v_bits,
            };
            self.format = KvFormat::Turbo { k_bits: k, v_bits: vb };
        } else {
            // Validate them anyway: a bad value is an error even when turbo is not selected.
            for name in ["PAGEKV_TURBO_K_BITS", "PAGEKV_TURBO_V_BITS"] {
                if let Some(v) = var(name) {
                    parse_bits(&v, name)?;
                }
            }
        }
        if let Some(v) = var("PAGEKV_BLOCK_SIZE") {
            self.block_size = parse_block_size(&v, "PAGEKV_BLOCK_SIZE")?;
        }
        if let Some(v) = var("PAGEKV_NUM_BLOCKS") {
            self.num_blocks = parse_positive(&v, "PAGEKV_NUM_BLOCKS")?;
        }
        if let Some(v) = var("PAGEKV_DYNAMIC_KV") {
            self.dynamic_growth = parse_bool(&v, "PAGEKV_DYNAMIC_KV")?;
        }
        if let Some(v) = var("PAGEKV_CONTEXT_WINDOW") {
            self.context_window = parse_optional(&v, "PAGEKV_CONTEXT_WINDOW")?;
        }
        if let Some(v) = var("PAGEKV_SLIDING_WINDOW") {
            self.sliding_window = parse_optional(&v, "PAGEKV_SLIDING_WINDOW")?;
        }
        if let Some(v) = var("PAGEKV_DEBUG_BLOCKS") {
            self.debug_blocks = parse_bool(&v, "PAGEKV_DEBUG_BLOCKS")?;
        }
        if let Some(v) = var("PAGEKV_HYBRID_KV") {
            self.hybrid = parse_bool(&v, "PAGEKV_HYBRID_KV")?;
        }
        self.validate()?;
        Ok(self)
    }

    /// Checks the geometry and policy.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !BLOCK_SIZES.contains(&self.block_size) {
            return Err(ConfigError::invalid("block size", &self.block_size.to_string(), "8, 16, 32"));
        }
        if self.num_layers == 0 || self.num_kv_heads == 0 || self.num_blocks == 0 {
            return Err(ConfigError::Geometry(format!(
                "layers ({}), kv heads ({}) and blocks ({}) must be at least 1",
                self.num_layers, self.num_kv_heads, self.num_blocks
            )));
        }
        if self.num_blocks >= crate::pool::NULL_BLOCK as usize {
            return Err(ConfigError::Geometry(format!(
                "{} blocks is more than a u32 block id can name",
                self.num_blocks
            )));
        }
        if self.groups.num_layers() != self.num_layers {
            return Err(ConfigError::Geometry(format!(
                "layer groups cover {} layers but the cache has {}",
                self.groups.num_layers(),
                self.num_layers
            )));
        }
        self.format.validate(self.head_dim)?;
        if let (Some(w), Some(c)) = (self.sliding_window, self.context_window) {
            if w > c {
                return Err(ConfigError::Geometry(format!("sliding window {w} exceeds the context window {c}")));
            }
        }
        Ok(())
    }

    /// The most tokens one sequence holds when it takes the whole pool: its full groups share
    /// what its sliding groups' window-sized tables leave (`num_blocks × block_size` for one
    /// group).
    pub fn whole_pool_tokens(&self) -> usize {
        let kinds = self.groups.kinds();
        let sliding: usize =
            kinds.iter().filter_map(|k| k.window()).map(|w| LayerGroups::sliding_cap(w, self.block_size)).sum();
        let full = kinds.iter().filter(|k| k.window().is_none()).count().max(1);
        self.num_blocks.saturating_sub(sliding) / full * self.block_size
    }

    /// Bytes one token occupies across all layers.
    pub fn bytes_per_token(&self) -> usize {
        self.num_layers * self.format.bytes_per_token(self.num_kv_heads, self.head_dim)
    }
}

fn rename(e: ConfigError, var: &str) -> ConfigError {
    match e {
        ConfigError::Invalid { value, accepted, .. } => ConfigError::Invalid { what: var.to_string(), value, accepted },
        other => other,
    }
}

/// Parses a boolean flag value: 1/0, true/false, on/off, yes/no (any case).
pub fn parse_bool(v: &str, what: &str) -> Result<bool, ConfigError> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Ok(true),
        "0" | "false" | "off" | "no" => Ok(false),
        _ => Err(ConfigError::invalid(what, v, "1, 0, true, false, on, off, yes, no")),
    }
}

/// Parses an integer ≥ 1.
pub fn parse_positive(v: &str, what: &str) -> Result<usize, ConfigError> {
    match v.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(ConfigError::invalid(what, v, "an integer of at least 1")),
    }
}

/// Parses an integer ≥ 1 or `off`/`none`/`0` (no limit).
pub fn parse_optional(v: &str, what: &str) -> Result<Option<usize>, ConfigError> {
    match v.trim().to_ascii_lowercase().as_str() {
        "off" | "none" | "0" => Ok(None),
        s => match s.parse::<usize>() {
            Ok(n) => Ok(Some(n)),
            Err(_) => Err(ConfigError::invalid(what, v, "an integer of at least 1, or off")),
        },
    }
}

/// Parses a block size (8, 16 or 32).
pub fn parse_block_size(v: &str, what: &str) -> Result<usize, ConfigError> {
    match v.trim().parse::<usize>() {
        Ok(n) if BLOCK_SIZES.contains(&n) => Ok(n),
        _ => Err(ConfigError::invalid(what, v, "8, 16, 32")),
    }
}

fn parse_bits(v: &str, what: &str) -> Result<u8, ConfigError> {
    match v.trim().parse::<u8>() {
        Ok(n) if TURBO_BITS.contains(&n) => Ok(n),
        _ => Err(ConfigError::invalid(what, v, "2, 3, 4, 8")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    fn base() -> CacheConfig {
        CacheConfig::new(2, 8, 128)
    }

    #[test]
    fn defaults_are_documented_values() {
        let c = base().with_env_from(env(&[])).unwrap();
        assert_eq!((c.block_size, c.num_blocks, c.format, c.dynamic_growth), (16, 1024, KvFormat::F16, false));
        assert_eq!((c.context_window, c.sliding_window, c.debug_blocks), (None, None, false));
    }

    #[test]
    fn every_variable_accepts_valid_values() {
        let c = base()
            .with_env_from(env(&[
                ("PAGEKV_KV_QUANT", "turbo"),
                ("PAGEKV_TURBO_K_BITS", "4"),
                ("PAGEKV_TURBO_V_BITS", "2"),
                ("PAGEKV_BLOCK_SIZE", "32"),
                ("PAGEKV_NUM_BLOCKS", "77"),
                ("PAGEKV_DYNAMIC_KV", "1"),
                ("PAGEKV_CONTEXT_WINDOW", "4096"),
                ("PAGEKV_SLIDING_WINDOW", "512"),
                ("PAGEKV_DEBUG_BLOCKS", "yes"),
                ("PAGEKV_HYBRID_KV", "off"),
            ]))
            .unwrap();
        assert_eq!(c.format, KvFormat::Turbo { k_bits: 4, v_bits: 2 });
        assert_eq!((c.block_size, c.num_blocks, c.dynamic_growth), (32, 77, true));
        assert_eq!((c.context_window, c.sliding_window, c.debug_blocks), (Some(4096), Some(512), true));
        assert!(!c.hybrid);
        let c = base()
            .with_env_from(env(&[
                ("PAGEKV_KV_QUANT", "q8"),
                ("PAGEKV_DYNAMIC_KV", "off"),
                ("PAGEKV_SLIDING_WINDOW", "off"),
            ]))
            .unwrap();
        assert_eq!((c.format, c.dynamic_growth, c.sliding_window), (KvFormat::Q8, false, None));
    }

    #[test]
    fn every_variable_rejects_invalid_values_naming_it() {
        let cases = [
            ("PAGEKV_KV_QUANT", "q3"),
            ("PAGEKV_TURBO_K_BITS", "5"),
            ("PAGEKV_TURBO_V_BITS", "x"),
            ("PAGEKV_BLOCK_SIZE", "12"),
            ("PAGEKV_NUM_BLOCKS", "0"),
            ("PAGEKV_NUM_BLOCKS", "-3"),
            ("PAGEKV_DYNAMIC_KV", "maybe"),
            ("PAGEKV_CONTEXT_WINDOW", "big"),
            ("PAGEKV_SLIDING_WINDOW", "-1"),
            ("PAGEKV_DEBUG_BLOCKS", "2"),
            ("PAGEKV_HYBRID_KV", "sometimes"),
        ];
        for (k, v) in cases {
            let err = base().with_env_from(env(&[(k, v)])).unwrap_err().to_string();
            assert!(err.contains(k) && err.contains(v) && err.contains("accepted"), "{k}={v}: {err}");
        }
    }

    #[test]
    fn sliding_window_larger_than_context_is_rejected() {
        let err = base()
            .with_env_from(env(&[("PAGEKV_CONTEXT_WINDOW", "100"), ("PAGEKV_SLIDING_WINDOW", "200")]))
            .unwrap_err();
        assert!(matches!(err, ConfigError::Geometry(_)));
    }

    #[test]
    fn layer_windows_set_groups_and_keep_the_pool_bytes() {
        let windows: Vec<Option<usize>> = (0..6).map(|l| if l % 3 == 2 { None } else { Some(64) }).collect();
        let mut c = CacheConfig::new(6, 1, 64);
        c.num_blocks = 100;
        c.set_layer_windows(&windows).unwrap();
        assert_eq!((c.groups.num_groups(), c.groups.planes(), c.num_blocks), (3, 2, 300));
        c.validate().unwrap();
        // Two sliding groups of ⌈64/16⌉ + 1 blocks; the full group takes the rest.
        assert_eq!(c.whole_pool_tokens(), (300 - 2 * 5) * 16);
        c.hybrid = false;
        c.set_layer_windows(&windows).unwrap();
        assert_eq!((c.groups.num_groups(), c.num_blocks), (1, 100));
        // A different layer count starts over from one group.
        c.hybrid = true;
        c.set_layer_windows(&[None, Some(8)]).unwrap();
        assert_eq!((c.num_layers, c.groups.num_groups(), c.num_blocks), (2, 2, 200));
        let mut bad = CacheConfig::new(6, 1, 64);
        bad.num_layers = 5;
        assert!(bad.validate().unwrap_err().to_string().contains("layer groups cover 6"));
    }
}
