//! The CUDA backend's developer switches (`PAGEKV_DEV_CUDA_*`, `PAGEKV_DEV_NVRTC_VERBOSE`), the
//! batch-invariant mode (`PAGEKV_BATCH_INVARIANT`, the binary's `--batch-invariant`) and the
//! kernel cache's directory (`PAGEKV_HOME`), parsed into one [`CudaTuning`]: kernel choices
//! kept for same-process comparisons and tuning runs. Each switch has one parser here, so a
//! value outside the accepted ones is an error naming them — never a silent default. An empty
//! value counts as unset.
//!
//! The binary calls [`tuning_from_lookup`] with its configuration's lookup; [`tuning_from_env`]
//! (the process environment) is for this crate's tests and examples.

use std::path::PathBuf;

use crate::topk::TOP_K_CHUNKS;
use crate::tuning::{CudaTuning, DecodeGrid, GemvShape, TcTuning, GEMV_ROWS_PER_WARP};
use crate::CudaError;

/// The accepted spellings of an on/off switch (pagekv's one boolean grammar).
pub const SWITCH_VALUES: &str = "1, 0, true, false, on, off, yes, no";

/// The tuning `lookup` (a variable's text, `None` when unset) asks for: [`CudaTuning::default`]
/// with every switch that is set applied; the first bad value is the error.
pub fn tuning_from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<CudaTuning, CudaError> {
    let v = Vars(&lookup);
    let d = CudaTuning::default();
    Ok(CudaTuning {
        tc: tc_tuning(&v)?,
        gemv: gemv_shape(&v)?,
        gemv_max_bytes: if v.switch("PAGEKV_DEV_CUDA_GEMV", true)? {
            v.count("PAGEKV_DEV_CUDA_GEMV_MAX_BYTES", d.gemv_max_bytes, |_| true, "a byte count")?
        } else {
            0
        },
        qgemv_items: v.count("PAGEKV_DEV_CUDA_QGEMV_ITEMS", d.qgemv_items, |n| (1..=2).contains(&n), "1, 2")?,
        qgemv_prefetch: v.count("PAGEKV_DEV_CUDA_QGEMV_PREFETCH", d.qgemv_prefetch, |n| n <= 8, "0..=8")?,
        qgemv_preload: v.switch("PAGEKV_DEV_CUDA_QGEMV_PRELOAD", d.qgemv_preload)?,
        qgemv_pair: v.switch("PAGEKV_DEV_CUDA_QGEMV_PAIR", d.qgemv_pair)?,
        qmma_max_rows: v.count("PAGEKV_DEV_CUDA_QMMA_MAX_ROWS", d.qmma_max_rows, |_| true, "a token count")?,
        tc_direct_max: v.count("PAGEKV_DEV_CUDA_TC_DIRECT_MAX", d.tc_direct_max, |_| true, "a token count")?,
        prefill_min_tokens: if v.switch("PAGEKV_DEV_CUDA_PREFILL", true)? {
            v.count("PAGEKV_DEV_CUDA_PREFILL_MIN", d.prefill_min_tokens, |n| n >= 1, "a token count ≥ 1")?
        } else {
            usize::MAX
        },
        attention_pdl: v.switch("PAGEKV_DEV_CUDA_ATTN_PDL", d.attention_pdl)?,
        qkv_write: v.switch("PAGEKV_DEV_CUDA_QKV_WRITE", d.qkv_write)?,
        graphs: v.switch("PAGEKV_DEV_CUDA_GRAPH", d.graphs)?,
        topk_chunk: match v.count("PAGEKV_DEV_CUDA_TOPK_CHUNK", 0, |c| TOP_K_CHUNKS.contains(&c), "1024, 2048, 4096")? {
            0 => None,
            c => Some(c),
        },
        kernel_cache: kernel_cache_dir(&v),
        nvrtc_verbose: v.switch("PAGEKV_DEV_NVRTC_VERBOSE", d.nvrtc_verbose)?,
        batch_invariant: v.switch("PAGEKV_BATCH_INVARIANT", d.batch_invariant)?,
    })
}

/// [`tuning_from_lookup`] over the process environment (tests and examples).
pub fn tuning_from_env() -> Result<CudaTuning, CudaError> {
    tuning_from_lookup(|name| std::env::var(name).ok())
}

/// The tensor-core decode kernel's switches: `PAGEKV_DEV_CUDA_TC_WARPS`, `…_TC_STAGES` (float
/// pages), `…_TC_QWARPS`, `…_TC_QSTAGES`, `…_TC_MINB` (quantized pages), `…_TC_HPC`,
/// `…_FUSED_MERGE`, `…_PDL` (`pk_merge`'s launch), `…_TC_L2`, `…_TC_EAGER`, `…_TC_VREG`,
/// `…_TC_PAIR`, `…_TC_BASE`, `…_TC_GRID` (`partitioned`, `stream-k`) and `…_TC_SK_CTAS`.
fn tc_tuning(v: &Vars) -> Result<TcTuning, CudaError> {
    let d = TcTuning::DEFAULT;
    let pow2 = |n: usize| n.is_power_of_two() && n <= 16;
    let stages = |n: usize| (2..=8).contains(&n);
    Ok(TcTuning {
        warps: v.count("PAGEKV_DEV_CUDA_TC_WARPS", d.warps, pow2, "1, 2, 4, 8, 16")?,
        stages: v.count("PAGEKV_DEV_CUDA_TC_STAGES", d.stages, stages, "2..=8")?,
        max_heads_per_cta: v.count(
            "PAGEKV_DEV_CUDA_TC_HPC",
            d.max_heads_per_cta,
            |n| n == 0 || pow2(n),
            "0 (the measured rule), 1, 2, 4, 8, 16",
        )?,
        quant_warps: v.count("PAGEKV_DEV_CUDA_TC_QWARPS", d.quant_warps, pow2, "1, 2, 4, 8, 16")?,
        quant_stages: v.count("PAGEKV_DEV_CUDA_TC_QSTAGES", d.quant_stages, stages, "2..=8")?,
        quant_min_blocks: v.count("PAGEKV_DEV_CUDA_TC_MINB", d.quant_min_blocks, |n| n <= 8, "0..=8")?,
        fused_merge: v.switch("PAGEKV_DEV_CUDA_FUSED_MERGE", d.fused_merge)?,
        pdl: v.switch("PAGEKV_DEV_CUDA_PDL", d.pdl)?,
        l2: v.choice("PAGEKV_DEV_CUDA_TC_L2", d.l2, &["auto", "normal", "evict-first"])?,
        eager: v.choice("PAGEKV_DEV_CUDA_TC_EAGER", d.eager, &["auto", "0", "1"])?,
        vreg: v.choice("PAGEKV_DEV_CUDA_TC_VREG", d.vreg, &["auto", "0", "1"])?,
        pair: v.choice("PAGEKV_DEV_CUDA_TC_PAIR", d.pair, &["auto", "0", "1"])?,
        base: v.switch("PAGEKV_DEV_CUDA_TC_BASE", d.base)?,
        grid: match v.choice("PAGEKV_DEV_CUDA_TC_GRID", "partitioned", &["partitioned", "stream-k"])? {
            "stream-k" => DecodeGrid::StreamK,
            _ => DecodeGrid::Partitioned,
        },
        stream_k_ctas_per_sm: v.count(
            "PAGEKV_DEV_CUDA_TC_SK_CTAS",
            d.stream_k_ctas_per_sm,
            |n| n <= 32,
            "0 (as many as fit) or 1..=32",
        )?,
    })
}

/// The decode product's switches: `PAGEKV_DEV_CUDA_GEMV_KERNEL` (`split|rows`),
/// `…_GEMV_WARPS` (16, 32), `…_GEMV_R` (1, 2, 4), `…_GEMV_BPS` (1..=32) and `…_GEMV_PDL`; the
/// defaults are [`GemvShape::DEFAULT`], or [`GemvShape::ROWS_DEFAULT`] for the earlier kernel.
fn gemv_shape(v: &Vars) -> Result<GemvShape, CudaError> {
    let split = v.choice("PAGEKV_DEV_CUDA_GEMV_KERNEL", "split", &["split", "rows"])? == "split";
    let d = if split { GemvShape::DEFAULT } else { GemvShape::ROWS_DEFAULT };
    let pdl = v.switch("PAGEKV_DEV_CUDA_GEMV_PDL", d.pdl)?;
    let warps = v.count(
        "PAGEKV_DEV_CUDA_GEMV_WARPS",
        GemvShape::DEFAULT.split_warps.unwrap_or(32),
        |n| GemvShape::SPLIT_WARPS.contains(&n),
        "16, 32",
    )?;
    Ok(GemvShape {
        split_warps: split.then_some(warps),
        rows_per_warp: v.count(
            "PAGEKV_DEV_CUDA_GEMV_R",
            d.rows_per_warp,
            |n| GEMV_ROWS_PER_WARP.contains(&n),
            "1, 2, 4",
        )?,
        blocks_per_sm: v.count("PAGEKV_DEV_CUDA_GEMV_BPS", d.blocks_per_sm, |n| (1..=32).contains(&n), "1..=32")?,
        pdl,
    })
}

/// Directory of the on-disk kernel cache: `$PAGEKV_HOME/kernels`, else
/// `$HOME/.cache/pagekv/kernels`; `None` when neither is set.
fn kernel_cache_dir(v: &Vars) -> Option<PathBuf> {
    if let Some(home) = v.get("PAGEKV_HOME") {
        return Some(PathBuf::from(home).join("kernels"));
    }
    v.get("HOME").map(|h| PathBuf::from(h).join(".cache/pagekv/kernels"))
}

/// The variables of one parse, read through the caller's lookup.
struct Vars<'a>(&'a dyn Fn(&str) -> Option<String>);

fn invalid(name: &str, value: &str, accepted: &str) -> CudaError {
    CudaError::Invalid(format!("{name}={value:?}: accepted values are {accepted}"))
}

impl Vars<'_> {
    /// The trimmed value of `name`, `None` when unset or empty.
    fn get(&self, name: &str) -> Option<String> {
        (self.0)(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
    }

    /// `name` as an on/off switch: unset → `default`; else one of [`SWITCH_VALUES`] (any case).
    fn switch(&self, name: &str, default: bool) -> Result<bool, CudaError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => match v.to_ascii_lowercase().as_str() {
                "1" | "true" | "on" | "yes" => Ok(true),
                "0" | "false" | "off" | "no" => Ok(false),
                _ => Err(invalid(name, &v, SWITCH_VALUES)),
            },
        }
    }

    /// `name` as a count: unset → `default`; else a decimal number that `ok` accepts (`accepted`
    /// describes them for the error).
    fn count(
        &self,
        name: &str,
        default: usize,
        ok: impl Fn(usize) -> bool,
        accepted: &str,
    ) -> Result<usize, CudaError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v.parse().ok().filter(|&n| ok(n)).ok_or_else(|| invalid(name, &v, accepted)),
        }
    }

    /// `name` as one of `accepted` words: unset → `default`.
    fn choice(&self, name: &str, default: &'static str, accepted: &[&'static str]) -> Result<&'static str, CudaError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => {
                accepted.iter().find(|&&a| a == v).copied().ok_or_else(|| invalid(name, &v, &accepted.join(", ")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)]) -> Result<CudaTuning, CudaError> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        tuning_from_lookup(|name| map.get(name).cloned())
    }

    #[test]
    fn nothing_set_is_the_default() {
        assert_eq!(parse(&[]).unwrap(), CudaTuning::default());
        let t = parse(&[("PAGEKV_HOME", "/x"), ("HOME", "/h")]).unwrap();
        assert_eq!(t.kernel_cache, Some(PathBuf::from("/x/kernels")));
        let t = parse(&[("PAGEKV_HOME", " "), ("HOME", "/h")]).unwrap();
        assert_eq!(t.kernel_cache, Some(PathBuf::from("/h/.cache/pagekv/kernels")));
    }

    #[test]
    fn bad_values_are_errors_naming_the_accepted_ones() {
        let e = parse(&[("PAGEKV_DEV_CUDA_GRAPH", "enabled")]).unwrap_err().to_string();
        assert!(e.contains("PAGEKV_DEV_CUDA_GRAPH") && e.contains(SWITCH_VALUES), "{e}");
        assert!(!parse(&[("PAGEKV_DEV_CUDA_GRAPH", " 0 ")]).unwrap().graphs);
        assert!(!parse(&[("PAGEKV_DEV_CUDA_GRAPH", "Off")]).unwrap().graphs);
        assert!(parse(&[("PAGEKV_DEV_CUDA_GRAPH", "")]).unwrap().graphs);
        assert!(parse(&[("PAGEKV_DEV_CUDA_TC_BASE", "yes")]).unwrap().tc.base);
        assert!(parse(&[("PAGEKV_BATCH_INVARIANT", "on")]).unwrap().batch_invariant);
        assert!(!parse(&[]).unwrap().batch_invariant);
        let e = parse(&[("PAGEKV_BATCH_INVARIANT", "exact")]).unwrap_err().to_string();
        assert!(e.contains("PAGEKV_BATCH_INVARIANT") && e.contains(SWITCH_VALUES), "{e}");

        let e = parse(&[("PAGEKV_DEV_CUDA_PREFILL_MIN", "12x")]).unwrap_err().to_string();
        assert!(e.contains("\"12x\"") && e.contains("a token count ≥ 1"), "{e}");
        assert!(parse(&[("PAGEKV_DEV_CUDA_PREFILL_MIN", "0")]).is_err());
        assert_eq!(parse(&[("PAGEKV_DEV_CUDA_PREFILL_MIN", "7")]).unwrap().prefill_min_tokens, 7);
        assert_eq!(parse(&[("PAGEKV_DEV_CUDA_PREFILL", "0")]).unwrap().prefill_min_tokens, usize::MAX);
        assert_eq!(parse(&[("PAGEKV_DEV_CUDA_GEMV", "off")]).unwrap().gemv_max_bytes, 0);
        assert!(parse(&[("PAGEKV_DEV_CUDA_TOPK_CHUNK", "3000")]).is_err());
        assert_eq!(parse(&[("PAGEKV_DEV_CUDA_TOPK_CHUNK", "2048")]).unwrap().topk_chunk, Some(2048));

        let e = parse(&[("PAGEKV_DEV_CUDA_TC_GRID", "fast")]).unwrap_err().to_string();
        assert!(e.contains("partitioned, stream-k"), "{e}");
        assert_eq!(parse(&[("PAGEKV_DEV_CUDA_TC_GRID", "stream-k")]).unwrap().tc.grid, DecodeGrid::StreamK);
    }

    #[test]
    fn the_earlier_product_kernel_has_its_own_defaults() {
        let t = parse(&[("PAGEKV_DEV_CUDA_GEMV_KERNEL", "rows")]).unwrap();
        assert_eq!(t.gemv, GemvShape::ROWS_DEFAULT);
        let t = parse(&[("PAGEKV_DEV_CUDA_GEMV_WARPS", "16"), ("PAGEKV_DEV_CUDA_GEMV_PDL", "0")]).unwrap();
        assert_eq!(t.gemv, GemvShape { split_warps: Some(16), pdl: false, ..GemvShape::DEFAULT });
    }
}
