//! `pagekv-cpu` — the CPU backend's kernels; no scheduling, no HTTP.
//!
//! - [`attention`]: paged attention over every KV format — reference, primitive and
//!   partitioned paths, AVX2 and AVX-512 kernels chosen at run time, and the router.
//! - [`quant`]: GGML weight formats, activation quantization and the threaded matmul.
//! - [`expf`]: ggml's `expf` (one lane and its constants), shared by the kernels that
//!   reproduce llama.cpp's rounding.
//! - [`threadpool`]: the persistent pool every kernel runs on (`PAGEKV_THREADS`).
pub mod attention;
pub mod expf;
pub mod quant;
pub mod threadpool;
