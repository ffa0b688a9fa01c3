//! The cache benchmark behind `pagekv bench cache`: per format, the exact bytes a token costs
//! and how fast appends write into the pages (the encoders run on the way in).
//!
//! Two append shapes are measured on one sequence over its own pool:
//! - decode: one token at a time into every layer (`begin_append(1)`, `write_layer` × layers);
//! - prefill: `prefill_tokens` at a time into every layer.
//!
//! `append_gbps` counts the f32 input bytes (K and V) appended per second — what a model
//! hands to the cache. Timing is the median of `runs` runs after one warm-up.

use std::time::Instant;

use crate::{CacheConfig, CacheError, ConfigError, KvFormat, KvPool, SequenceCache, SequencePolicy};

/// Why the benchmark could not run (an invalid configuration).
#[derive(Debug, thiserror::Error)]
pub enum CacheBenchError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Cache(#[from] CacheError),
}

/// What to measure. [`CacheBenchConfig::default`] is the shape.
#[derive(Clone, Debug)]
pub struct CacheBenchConfig {
    pub num_layers: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub formats: Vec<KvFormat>,
    /// Tokens appended one at a time per decode run.
    pub decode_tokens: usize,
    /// Tokens per prefill append (one append per layer).
    pub prefill_tokens: usize,
    /// Timed runs per measurement; the median is reported.
    pub runs: usize,
}

impl Default for CacheBenchConfig {
    fn default() -> Self {
        CacheBenchConfig {
            num_layers: 32,
            num_kv_heads: 8,
            head_dim: 128,
            block_size: 16,
            formats: vec![
                KvFormat::F32,
                KvFormat::F16,
                KvFormat::Bf16,
                KvFormat::Q8,
                KvFormat::Q4 { rotate: false },
                KvFormat::Q4 { rotate: true },
                KvFormat::TURBO_DEFAULT,
            ],
            decode_tokens: 256,
            prefill_tokens: 512,
            runs: 7,
        }
    }
}

/// One format's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheBenchRow {
    pub format: String,
    /// Bytes one token costs in one layer (K and V, codes and scales).
    pub bytes_per_token: usize,
    /// Of which scales.
    pub scale_bytes_per_token: usize,
    /// `bytes_per_token / f16 bytes_per_token`.
    pub ratio_vs_f16: f64,
    /// f32 input GB/s appended one token at a time.
    pub append_gbps_decode: f64,
    /// f32 input GB/s appended `prefill_tokens` at a time.
    pub append_gbps_prefill: f64,
    /// Microseconds to append one decode token into all `num_layers` layers.
    pub decode_append_us: f64,
}

/// Runs the benchmark. Errors only if the configuration itself is invalid.
pub fn bench_cache(cfg: &CacheBenchConfig) -> Result<Vec<CacheBenchRow>, CacheBenchError> {
    let f16 = KvFormat::F16.bytes_per_token(cfg.num_kv_heads, cfg.head_dim);
    let row_len = cfg.num_kv_heads * cfg.head_dim;
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    // [prefill_tokens, num_kv_heads, head_dim] inputs, fresh Gaussian-ish values (never zeros).
    let mut fill = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
            })
            .collect()
    };
    let keys = fill(cfg.prefill_tokens * row_len);
    let values = fill(cfg.prefill_tokens * row_len);
    let mut rows = Vec::new();
    for &format in &cfg.formats {
        let bytes = format.bytes_per_token(cfg.num_kv_heads, cfg.head_dim);
        let codes = format.key_codec().code_bytes(cfg.head_dim) * cfg.num_kv_heads
            + format.value_codec().code_bytes(cfg.head_dim) * cfg.num_kv_heads;
        let tokens = cfg.decode_tokens.max(cfg.prefill_tokens);
        let mut config = CacheConfig::new(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim);
        config.format = format;
        config.block_size = cfg.block_size;
        config.num_blocks = tokens.div_ceil(cfg.block_size) + 1;
        let mut pool = KvPool::new(config)?;
        let policy = SequencePolicy {
            dynamic_growth: false,
            context_window: None,
            sliding_window: None,
            debug_blocks: false,
            trim_margin: 0,
        };

        let decode_s = median(cfg.runs, || -> Result<f64, CacheError> {
            let mut seq = SequenceCache::new(&mut pool, policy, tokens)?;
            let start = Instant::now();
            for t in 0..cfg.decode_tokens {
                let (k, v) = (
                    &keys[(t % cfg.prefill_tokens) * row_len..][..row_len],
                    &values[(t % cfg.prefill_tokens) * row_len..][..row_len],
                );
                seq.begin_append(&mut pool, 1)?;
                for layer in 0..cfg.num_layers {
                    seq.write_layer(&mut pool, layer, k, v)?;
                }
            }
            let s = start.elapsed().as_secs_f64();
            seq.release(&mut pool);
            Ok(s)
        })?;
        let prefill_s = median(cfg.runs, || -> Result<f64, CacheError> {
            let mut seq = SequenceCache::new(&mut pool, policy, tokens)?;
            let start = Instant::now();
            seq.begin_append(&mut pool, cfg.prefill_tokens)?;
            for layer in 0..cfg.num_layers {
                seq.write_layer(&mut pool, layer, &keys, &values)?;
            }
            let s = start.elapsed().as_secs_f64();
            seq.release(&mut pool);
            Ok(s)
        })?;
        let input_bytes = |t: usize| (2 * t * row_len * 4 * cfg.num_layers) as f64;
        rows.push(CacheBenchRow {
            format: format.name(),
            bytes_per_token: bytes,
            scale_bytes_per_token: bytes - codes,
            ratio_vs_f16: bytes as f64 / f16 as f64,
            append_gbps_decode: input_bytes(cfg.decode_tokens) / decode_s / 1e9,
            append_gbps_prefill: input_bytes(cfg.prefill_tokens) / prefill_s / 1e9,
            decode_append_us: decode_s / cfg.decode_tokens as f64 * 1e6,
        });
    }
    Ok(rows)
}

/// Median of `runs` timed runs of `f` (after one untimed warm-up).
fn median(runs: usize, mut f: impl FnMut() -> Result<f64, CacheError>) -> Result<f64, CacheError> {
    f()?;
    let mut t = (0..runs.max(1)).map(|_| f()).collect::<Result<Vec<_>, _>>()?;
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_exact_about_bytes_and_positive_about_speed() {
        let cfg =
            CacheBenchConfig { num_layers: 2, decode_tokens: 20, prefill_tokens: 33, runs: 1, ..Default::default() };
        let rows = bench_cache(&cfg).unwrap();
        assert_eq!(rows.len(), cfg.formats.len());
        let by = |name: &str| rows.iter().find(|r| r.format == name).unwrap();
        assert_eq!(by("f16").bytes_per_token, 4096);
        assert_eq!(by("f32").bytes_per_token, 8192);
        // q8: 128 codes + 4 f16 scales per head, K and V, 8 heads.
        assert_eq!(by("q8").bytes_per_token, 2 * 8 * (128 + 4 * 2));
        assert_eq!(by("q8").scale_bytes_per_token, 2 * 8 * 4 * 2);
        assert!((by("f16").ratio_vs_f16 - 1.0).abs() < 1e-12);
        for r in &rows {
            assert!(r.append_gbps_decode > 0.0 && r.append_gbps_prefill > 0.0 && r.decode_append_us > 0.0, "{r:?}");
        }
    }
}
