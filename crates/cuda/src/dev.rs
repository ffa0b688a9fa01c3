//! The CUDA backend's developer switches (`PAGEKV_DEV_CUDA_*`), the one module of the crate that
//! reads the environment: kernel choices kept for same-process comparisons and tuning runs, the
//! NVRTC log switch and where compiled kernels are cached on disk. Each has one parser here, so a value outside the accepted ones is
//! an error naming them — never a silent default. [`check_environment`] parses all of them;
//! [`crate::CudaDevice::new`] calls it first, so the readers that cache a switch once per process
//! deep inside a launcher (where no error can be returned) only ever see values already
//! accepted. An empty value counts as unset.

use crate::CudaError;

/// The trimmed value of `name`, `None` when unset or empty.
fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

fn invalid(name: &str, value: &str, accepted: &str) -> CudaError {
    CudaError::Invalid(format!("{name}={value:?}: accepted values are {accepted}"))
}

/// The accepted spellings of an on/off switch (pagekv's one boolean grammar).
pub const SWITCH_VALUES: &str = "1, 0, true, false, on, off, yes, no";

/// `name` as an on/off switch: unset → `default`; else one of [`SWITCH_VALUES`] (any case).
pub fn switch(name: &str, default: bool) -> Result<bool, CudaError> {
    match var(name) {
        None => Ok(default),
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "1" | "true" | "on" | "yes" => Ok(true),
            "0" | "false" | "off" | "no" => Ok(false),
            _ => Err(invalid(name, &v, SWITCH_VALUES)),
        },
    }
}

/// `PAGEKV_DEV_NVRTC_VERBOSE`: print NVRTC's log (ptxas register and spill counts) for every
/// kernel module compiled.
pub fn nvrtc_verbose() -> Result<bool, CudaError> {
    switch("PAGEKV_DEV_NVRTC_VERBOSE", false)
}

/// Directory of the on-disk kernel cache: `$PAGEKV_HOME/kernels`, else
/// `$HOME/.cache/pagekv/kernels`; `None` when neither is set (kernels are then compiled in every
/// process).
pub fn kernel_cache_dir() -> Option<std::path::PathBuf> {
    if let Some(home) = var("PAGEKV_HOME") {
        return Some(std::path::PathBuf::from(home).join("kernels"));
    }
    var("HOME").map(|h| std::path::PathBuf::from(h).join(".cache/pagekv/kernels"))
}

/// `name` as a count: unset → `default`; else a decimal number that `ok` accepts (`accepted`
/// describes them for the error).
pub fn count(name: &str, default: usize, ok: impl Fn(usize) -> bool, accepted: &str) -> Result<usize, CudaError> {
    match var(name) {
        None => Ok(default),
        Some(v) => v.parse().ok().filter(|&n| ok(n)).ok_or_else(|| invalid(name, &v, accepted)),
    }
}

/// `name` as one of `accepted` words: unset → `default`.
pub fn choice(name: &str, default: &'static str, accepted: &[&'static str]) -> Result<&'static str, CudaError> {
    match var(name) {
        None => Ok(default),
        Some(v) => accepted.iter().find(|&&a| a == v).copied().ok_or_else(|| invalid(name, &v, &accepted.join(", "))),
    }
}

/// `PAGEKV_DEV_CUDA_GRAPH` (default 1): capture and replay the model's decode steps as CUDA graphs.
pub fn graphs_enabled() -> Result<bool, CudaError> {
    switch("PAGEKV_DEV_CUDA_GRAPH", true)
}

/// The largest matrix (bytes) the model multiplies with the fused decode product rather than
/// cuBLAS: `PAGEKV_DEV_CUDA_GEMV=0` means 0 (cuBLAS only); `PAGEKV_DEV_CUDA_GEMV_MAX_BYTES` caps it (the
/// earlier row-per-warp kernel was routed ≤ 64 MiB); unset: no cap — measured on the H200
/// (`pagekv bench decode --device cuda --model synthetic:llama3-8b`), the split kernel streams Llama 3 8B's 235 MB
/// gate|up, 117 MB down and 1 GB output matrices faster than cuBLAS, besides saving the separate
/// norm/SiLU/conversion launches.
pub fn gemv_max_bytes() -> Result<usize, CudaError> {
    if !switch("PAGEKV_DEV_CUDA_GEMV", true)? {
        return Ok(0);
    }
    count("PAGEKV_DEV_CUDA_GEMV_MAX_BYTES", usize::MAX, |_| true, "a byte count")
}

/// `PAGEKV_DEV_CUDA_PREFILL=0` (no prefill kernel: `usize::MAX`) or `PAGEKV_DEV_CUDA_PREFILL_MIN`
/// (default 96, at least 1): new tokens of a sequence from which a step takes the prefill kernel.
pub fn prefill_min_tokens() -> Result<usize, CudaError> {
    if !switch("PAGEKV_DEV_CUDA_PREFILL", true)? {
        return Ok(usize::MAX);
    }
    count("PAGEKV_DEV_CUDA_PREFILL_MIN", 96, |n| n >= 1, "a token count ≥ 1")
}

/// `PAGEKV_DEV_CUDA_ATTN_PDL` (default 1): inside the model step, the cache write (`pk_cache_write`,
/// after `pk_qkv_rope`) and the tensor-core decode kernel (`pk_decode_tc`, after the cache write)
/// are programmatic dependent launches — scheduled while the kernel before them still runs, they
/// read block tables and context lengths, then wait for its results in-kernel (`pdl_wait`) —
/// which hides two launch gaps per layer. `0`: plain launches (same-process comparisons).
/// (`PAGEKV_DEV_CUDA_PDL` is `pk_merge`'s, `PAGEKV_DEV_CUDA_GEMV_PDL` the products' and `pk_qkv_rope`'s.)
pub fn attention_pdl() -> Result<bool, CudaError> {
    switch("PAGEKV_DEV_CUDA_ATTN_PDL", true)
}

/// `PAGEKV_DEV_CUDA_TC_GRID` (default `partitioned`): the grid of the tensor-core decode kernel when
/// the caller leaves it to the launcher ([`crate::DecodeGrid::Auto`]) — `partitioned` (one CTA per
/// (kv head, sequence, partition), the route's partitions) or `stream-k` (a persistent grid of
/// about one CTA per SM over balanced shares of all tiles, `pk_decode_tc_sk`).
pub fn decode_grid() -> Result<&'static str, CudaError> {
    choice("PAGEKV_DEV_CUDA_TC_GRID", "partitioned", &["partitioned", "stream-k"])
}

/// `PAGEKV_DEV_CUDA_TC_SK_CTAS` (default 0): CTAs per SM of the stream-K grid — 0 as many as fit
/// (the occupancy of `pk_decode_tc_sk`), else at most that many.
pub fn stream_k_ctas_per_sm() -> Result<usize, CudaError> {
    count("PAGEKV_DEV_CUDA_TC_SK_CTAS", 0, |n| n <= 32, "0 (as many as fit) or 1..=32")
}

/// Parses every `PAGEKV_DEV_CUDA_*` switch the backend reads; the first bad one is the error.
pub fn check_environment() -> Result<(), CudaError> {
    graphs_enabled()?;
    gemv_max_bytes()?;
    prefill_min_tokens()?;
    attention_pdl()?;
    crate::model_ops::GemvShape::from_env()?;
    crate::compile::TcTuning::from_env()?;
    crate::topk::forced_chunk_from_env()?;
    crate::attention::tc_base_from_env()?;
    decode_grid()?;
    stream_k_ctas_per_sm()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Variables of this test only (the process environment is shared by the crate's tests).
    #[test]
    fn bad_values_are_errors_naming_the_accepted_ones() {
        std::env::set_var("PAGEKV_DEV_CUDA_KNOBS_TEST_SWITCH", "enabled");
        let e = switch("PAGEKV_DEV_CUDA_KNOBS_TEST_SWITCH", true).unwrap_err().to_string();
        assert!(e.contains("PAGEKV_DEV_CUDA_KNOBS_TEST_SWITCH") && e.contains(SWITCH_VALUES), "{e}");
        std::env::set_var("PAGEKV_DEV_CUDA_KNOBS_TEST_SWITCH", " 0 ");
        assert!(!switch("PAGEKV_DEV_CUDA_KNOBS_TEST_SWITCH", true).unwrap());
        std::env::set_var("PAGEKV_DEV_CUDA_KNOBS_TEST_SWITCH", "Off");
        assert!(!switch("PAGEKV_DEV_CUDA_KNOBS_TEST_SWITCH", true).unwrap());
        std::env::set_var("PAGEKV_DEV_CUDA_KNOBS_TEST_SWITCH", "yes");
        assert!(switch("PAGEKV_DEV_CUDA_KNOBS_TEST_SWITCH", false).unwrap());
        std::env::set_var("PAGEKV_DEV_CUDA_KNOBS_TEST_SWITCH", "");
        assert!(switch("PAGEKV_DEV_CUDA_KNOBS_TEST_SWITCH", true).unwrap());

        std::env::set_var("PAGEKV_DEV_CUDA_KNOBS_TEST_COUNT", "12x");
        let e = count("PAGEKV_DEV_CUDA_KNOBS_TEST_COUNT", 3, |n| n > 0, "a count ≥ 1").unwrap_err().to_string();
        assert!(e.contains("\"12x\"") && e.contains("a count ≥ 1"), "{e}");
        std::env::set_var("PAGEKV_DEV_CUDA_KNOBS_TEST_COUNT", "0");
        assert!(count("PAGEKV_DEV_CUDA_KNOBS_TEST_COUNT", 3, |n| n > 0, "a count ≥ 1").is_err());
        std::env::set_var("PAGEKV_DEV_CUDA_KNOBS_TEST_COUNT", "7");
        assert_eq!(count("PAGEKV_DEV_CUDA_KNOBS_TEST_COUNT", 3, |n| n > 0, "a count ≥ 1").unwrap(), 7);
        assert_eq!(count("PAGEKV_DEV_CUDA_KNOBS_TEST_UNSET", 3, |n| n > 0, "a count ≥ 1").unwrap(), 3);

        std::env::set_var("PAGEKV_DEV_CUDA_KNOBS_TEST_CHOICE", "fast");
        let e = choice("PAGEKV_DEV_CUDA_KNOBS_TEST_CHOICE", "split", &["split", "rows"]).unwrap_err().to_string();
        assert!(e.contains("split, rows"), "{e}");
        std::env::set_var("PAGEKV_DEV_CUDA_KNOBS_TEST_CHOICE", "rows");
        assert_eq!(choice("PAGEKV_DEV_CUDA_KNOBS_TEST_CHOICE", "split", &["split", "rows"]).unwrap(), "rows");
    }
}
