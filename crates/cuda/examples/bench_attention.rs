//! Decode-attention benchmark on one GPU: JSON lines on stdout (one per row of
//! [`pagekv_cuda::bench::bench_attention`]), a table on stderr.
//!
//! ```text
//! cargo run --release -p pagekv-cuda --features cuda --example bench_attention -- \
//!     [--formats bf16,q8,q4] [--cases 1x4096,64x16384] [--routes primitive,partitioned,stream-k] \
//!     [--partition-sizes 256,512] [--kernels auto,simt] [--runs 50] [--warmup 5] [--device 0]
//!     [--cooldown-ms 100] (idle pause before each timed row, so it starts from a rested power budget)
//!     [--contiguous]   (consecutive block ids per sequence instead of scattered pages)
//!     [--programmatic] (the tensor-core decode as a programmatic dependent launch, as in the
//!                       model step; rows named <route>-pdl)
//!     [--f32-queries]  (full f32 queries; default: rounded to the pages' mma type, as the GPU
//!                       model passes them for f16/bf16 caches)
//! ```
//! Defaults: the headline shapes (32 query heads, 8 kv heads, head_dim 128, block 16), cases
//! 1×4096, 1×32768, 16×4096, 64×4096, 64×16384, formats bf16 f16 f32 q8 q4 q4r turbo, both
//! routes with the automatic partition size.

use kvcache::KvFormat;
use pagekv_cuda::bench::{bench_attention, BenchConfig};
use pagekv_cuda::{CudaDevice, DecodeKernel};

fn list<T>(v: &str, parse: impl Fn(&str) -> Option<T>) -> Result<Vec<T>, String> {
    v.split(',').filter(|s| !s.is_empty()).map(|s| parse(s).ok_or_else(|| format!("bad value {s:?}"))).collect()
}

fn parse_args(args: &[String]) -> Result<(BenchConfig, usize), String> {
    let mut cfg = BenchConfig::default();
    let mut ordinal = 0;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if flag == "--contiguous" {
            cfg.scatter = false;
            continue;
        }
        if flag == "--programmatic" {
            cfg.programmatic = true;
            continue;
        }
        if flag == "--f32-queries" {
            cfg.round_queries = false;
            continue;
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--formats" => cfg.formats = list(value, |s| KvFormat::parse(s, KvFormat::Bf16).ok())?,
            "--cases" => {
                cfg.cases = list(value, |s| {
                    let (b, c) = s.split_once('x')?;
                    Some((b.parse().ok()?, c.parse().ok()?))
                })?
            }
            "--routes" => {
                cfg.routes = list(value, |s| match s {
                    "primitive" => Some("primitive"),
                    "partitioned" => Some("partitioned"),
                    "stream-k" => Some("stream-k"),
                    _ => None,
                })?
            }
            "--kernels" => {
                cfg.kernels = list(value, |s| match s {
                    "auto" => Some(DecodeKernel::Auto),
                    "simt" => Some(DecodeKernel::Simt),
                    _ => None,
                })?
            }
            "--partition-sizes" => cfg.partition_sizes = list(value, |s| s.parse().ok())?,
            "--runs" => cfg.runs = value.parse().map_err(|_| format!("--runs {value}"))?,
            "--warmup" => cfg.warmup = value.parse().map_err(|_| format!("--warmup {value}"))?,
            "--cooldown-ms" => cfg.cooldown_ms = value.parse().map_err(|_| format!("--cooldown-ms {value}"))?,
            "--device" => ordinal = value.parse().map_err(|_| format!("--device {value}"))?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if cfg.runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    Ok((cfg, ordinal))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cfg, ordinal) = match parse_args(&args) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("bench_attention: {e}");
            std::process::exit(2);
        }
    };
    let dev = match pagekv_cuda::dev::tuning_from_env().and_then(|t| CudaDevice::new(ordinal, t)) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("bench_attention: {e}");
            std::process::exit(1);
        }
    };
    eprintln!("{dev:?}");
    let rows = match bench_attention(&dev, &cfg) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bench_attention: {e}");
            std::process::exit(1);
        }
    };
    for r in &rows {
        println!("{}", r.to_json());
    }
    eprintln!(
        "{:<14} {:<11} {:>6} {:>8} {:>10} {:>8} {:>6} {:>6}",
        "impl", "format", "batch", "context", "us", "GB/s", "part", "MHz"
    );
    for r in &rows {
        eprintln!(
            "{:<14} {:<11} {:>6} {:>8} {:>10.2} {:>8.0} {:>6} {:>6.0}",
            r.impl_name,
            r.format,
            r.batch,
            r.context,
            r.ms * 1e3,
            r.gbps,
            r.partition_size,
            r.sm_mhz
        );
    }
}
