//! Subcommands on the CUDA device (feature `cuda`).

use anyhow::{bail, Result};

/// `pagekv bench attention --device cuda:N`.
pub fn bench_attention(
    device: usize,
    json_out: bool,
    formats: Option<&str>,
    shapes: Option<&str>,
    runs: usize,
) -> Result<()> {
    let _ = (device, json_out, formats, shapes, runs);
    #[cfg(not(feature = "cuda"))]
    bail!("this pagekv was built without CUDA; rebuild with `cargo build --release --features cuda`");
    #[cfg(feature = "cuda")]
    bail!("the CUDA attention benchmark is not wired into the CLI yet");
}
