//! The subcommands.

pub mod anchors;
pub mod bench;
pub mod bench_decode_cuda;
pub mod bench_serve;
pub mod bench_speculative;
pub mod chat;
pub mod cuda;
pub mod decode;
pub mod eval;
pub mod generation;
pub mod inspect;
pub mod models;
pub mod run;
pub mod serve;

use anyhow::{bail, Result};
use kvcache::KvFormat;

/// What `pagekv bench attention` measures (its flags besides `--json` and the device).
pub struct AttentionOpts<'a> {
    /// Comma-separated KV formats; `None`: all.
    pub formats: Option<&'a str>,
    /// Comma-separated `BATCHxCONTEXT` shapes; `None`: the default cases.
    pub shapes: Option<&'a str>,
    /// Comma-separated paths (CPU: reference, primitive, partitioned, auto; CUDA: primitive,
    /// partitioned, stream-k); `None`: the device's default set.
    pub impls: Option<&'a str>,
    pub runs: usize,
    /// CUDA: launch the tensor-core decode as a programmatic dependent launch (rows `<route>-pdl`).
    pub programmatic: bool,
    /// CUDA: idle pause (ms) before each timed row; `None`: the benchmark's default.
    pub cooldown_ms: Option<u64>,
}

/// Every KV format, in the order tables list them.
pub fn all_formats() -> Vec<KvFormat> {
    vec![
        KvFormat::F32,
        KvFormat::F16,
        KvFormat::Bf16,
        KvFormat::Q8,
        KvFormat::Q4 { rotate: false },
        KvFormat::Q4 { rotate: true },
        KvFormat::TURBO_DEFAULT,
    ]
}

/// `f16,q8,q4r` → formats (the names `--kv-quant` accepts; `off` is f16).
pub fn parse_formats(list: &str) -> Result<Vec<KvFormat>> {
    list.split(',').map(|s| Ok(KvFormat::parse(s.trim(), KvFormat::F16)?)).collect()
}

/// `1x4096,16x4096` → `(batch, context)` pairs.
pub fn parse_shapes(list: &str) -> Result<Vec<(usize, usize)>> {
    list.split(',')
        .map(|s| {
            let bad = || anyhow::anyhow!("invalid shape {s:?}: expected BATCHxCONTEXT, e.g. 16x4096");
            let (b, c) = s.trim().split_once('x').ok_or_else(bad)?;
            let (b, c): (usize, usize) = (b.parse().map_err(|_| bad())?, c.parse().map_err(|_| bad())?);
            if b == 0 || c == 0 {
                bail!("invalid shape {s:?}: batch and context must be positive");
            }
            Ok((b, c))
        })
        .collect()
}

/// One line about a pool: format, blocks, bytes, appends, growth, attention routes.
pub fn cache_summary(s: &kvcache::CacheStats) -> String {
    let routes = s.attention_calls.iter().map(|(r, n)| format!("{}={n}", r.name())).collect::<Vec<_>>().join(" ");
    let fallbacks: u64 = s.fallbacks.iter().map(|(_, n)| n).sum();
    format!(
        "KV {}: blocks {} used / {} free / {} total, {:.2} MiB used ({:.2} MiB codes + {:.2} MiB scales), {} tokens written, {} grow events, {} trims; attention {routes}, {fallbacks} fallbacks",
        s.format,
        s.blocks_used,
        s.blocks_free,
        s.blocks_total,
        (s.code_bytes_used + s.scale_bytes_used) as f64 / (1 << 20) as f64,
        s.code_bytes_used as f64 / (1 << 20) as f64,
        s.scale_bytes_used as f64 / (1 << 20) as f64,
        s.tokens_written,
        s.grow_events,
        s.trims
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_and_format_lists_parse_or_say_why() {
        assert_eq!(parse_shapes("1x4096, 16x512").unwrap(), vec![(1, 4096), (16, 512)]);
        for bad in ["", "4096", "1x", "x2", "0x5", "2x0", "1x4096,banana"] {
            assert!(parse_shapes(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_formats("f16,q4r").unwrap(), vec![KvFormat::F16, KvFormat::Q4 { rotate: true }]);
        let e = parse_formats("f16,q5").unwrap_err().to_string();
        assert!(e.contains("q5") && e.contains("q8"), "{e}");
    }
}
