//! The CUDA backend's environment switches (`PAGEKV_CUDA_*`): kernel choices kept for same-process
//! comparisons and tuning runs. Each has one parser here, so a value outside the accepted ones is
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

/// `name` as an on/off switch: unset → `default`; `1` or `0`.
pub fn switch(name: &str, default: bool) -> Result<bool, CudaError> {
    match var(name).as_deref() {
        None => Ok(default),
        Some("1") => Ok(true),
        Some("0") => Ok(false),
        Some(v) => Err(invalid(name, v, "0, 1")),
    }
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

/// `PAGEKV_CUDA_GRAPH` (default 1): capture and replay the model's decode steps as CUDA graphs.
pub fn graphs_enabled() -> Result<bool, CudaError> {
    switch("PAGEKV_CUDA_GRAPH", true)
}

/// The largest matrix (bytes) the model multiplies with the fused decode product rather than
/// cuBLAS: `PAGEKV_CUDA_GEMV=0` means 0 (cuBLAS only); `PAGEKV_CUDA_GEMV_MAX_BYTES` caps it (the
/// earlier row-per-warp kernel was routed ≤ 64 MiB); unset: no cap — measured on the H200
/// (crates/cuda/RESULTS.md, split GEMV section), the split kernel streams Llama 3 8B's 235 MB
/// gate|up, 117 MB down and 1 GB output matrices faster than cuBLAS, besides saving the separate
/// norm/SiLU/conversion launches.
pub fn gemv_max_bytes() -> Result<usize, CudaError> {
    if !switch("PAGEKV_CUDA_GEMV", true)? {
        return Ok(0);
    }
    count("PAGEKV_CUDA_GEMV_MAX_BYTES", usize::MAX, |_| true, "a byte count")
}

/// `PAGEKV_CUDA_PREFILL=0` (no prefill kernel: `usize::MAX`) or `PAGEKV_CUDA_PREFILL_MIN`
/// (default 96, at least 1): new tokens of a sequence from which a step takes the prefill kernel.
pub fn prefill_min_tokens() -> Result<usize, CudaError> {
    if !switch("PAGEKV_CUDA_PREFILL", true)? {
        return Ok(usize::MAX);
    }
    count("PAGEKV_CUDA_PREFILL_MIN", 96, |n| n >= 1, "a token count ≥ 1")
}

/// `PAGEKV_CUDA_ATTN_PDL` (default 1): inside the model step, the cache write (`pk_cache_write`,
/// after `pk_qkv_rope`) and the tensor-core decode kernel (`pk_decode_tc`, after the cache write)
/// are programmatic dependent launches — scheduled while the kernel before them still runs, they
/// read block tables and context lengths, then wait for its results in-kernel (`pdl_wait`) —
/// which hides two launch gaps per layer. `0`: plain launches (same-process comparisons).
/// (`PAGEKV_CUDA_PDL` is `pk_merge`'s, `PAGEKV_CUDA_GEMV_PDL` the products' and `pk_qkv_rope`'s.)
pub fn attention_pdl() -> Result<bool, CudaError> {
    switch("PAGEKV_CUDA_ATTN_PDL", true)
}

/// `PAGEKV_CUDA_TC_GRID` (default `partitioned`): the grid of the tensor-core decode kernel when
/// the caller leaves it to the launcher ([`crate::DecodeGrid::Auto`]) — `partitioned` (one CTA per
/// (kv head, sequence, partition), the route's partitions) or `stream-k` (a persistent grid of
/// about one CTA per SM over balanced shares of all tiles, `pk_decode_tc_sk`).
pub fn decode_grid() -> Result<&'static str, CudaError> {
    choice("PAGEKV_CUDA_TC_GRID", "partitioned", &["partitioned", "stream-k"])
}

/// `PAGEKV_CUDA_TC_SK_CTAS` (default 0): CTAs per SM of the stream-K grid — 0 as many as fit
/// (the occupancy of `pk_decode_tc_sk`), else at most that many.
pub fn stream_k_ctas_per_sm() -> Result<usize, CudaError> {
    count("PAGEKV_CUDA_TC_SK_CTAS", 0, |n| n <= 32, "0 (as many as fit) or 1..=32")
}

/// Parses every `PAGEKV_CUDA_*` switch the backend reads; the first bad one is the error.
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
        std::env::set_var("PAGEKV_CUDA_KNOBS_TEST_SWITCH", "on");
        let e = switch("PAGEKV_CUDA_KNOBS_TEST_SWITCH", true).unwrap_err().to_string();
        assert!(e.contains("PAGEKV_CUDA_KNOBS_TEST_SWITCH") && e.contains("0, 1"), "{e}");
        std::env::set_var("PAGEKV_CUDA_KNOBS_TEST_SWITCH", " 0 ");
        assert!(!switch("PAGEKV_CUDA_KNOBS_TEST_SWITCH", true).unwrap());
        std::env::set_var("PAGEKV_CUDA_KNOBS_TEST_SWITCH", "");
        assert!(switch("PAGEKV_CUDA_KNOBS_TEST_SWITCH", true).unwrap());

        std::env::set_var("PAGEKV_CUDA_KNOBS_TEST_COUNT", "12x");
        let e = count("PAGEKV_CUDA_KNOBS_TEST_COUNT", 3, |n| n > 0, "a count ≥ 1").unwrap_err().to_string();
        assert!(e.contains("\"12x\"") && e.contains("a count ≥ 1"), "{e}");
        std::env::set_var("PAGEKV_CUDA_KNOBS_TEST_COUNT", "0");
        assert!(count("PAGEKV_CUDA_KNOBS_TEST_COUNT", 3, |n| n > 0, "a count ≥ 1").is_err());
        std::env::set_var("PAGEKV_CUDA_KNOBS_TEST_COUNT", "7");
        assert_eq!(count("PAGEKV_CUDA_KNOBS_TEST_COUNT", 3, |n| n > 0, "a count ≥ 1").unwrap(), 7);
        assert_eq!(count("PAGEKV_CUDA_KNOBS_TEST_UNSET", 3, |n| n > 0, "a count ≥ 1").unwrap(), 3);

        std::env::set_var("PAGEKV_CUDA_KNOBS_TEST_CHOICE", "fast");
        let e = choice("PAGEKV_CUDA_KNOBS_TEST_CHOICE", "split", &["split", "rows"]).unwrap_err().to_string();
        assert!(e.contains("split, rows"), "{e}");
        std::env::set_var("PAGEKV_CUDA_KNOBS_TEST_CHOICE", "rows");
        assert_eq!(choice("PAGEKV_CUDA_KNOBS_TEST_CHOICE", "split", &["split", "rows"]).unwrap(), "rows");
    }
}
