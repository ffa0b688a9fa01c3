//! [`CudaModel`]: the llama-family and Gemma 3 forward pass on one GPU (feature `cuda`), over
//! device pages (`KvPool<DevicePages>`: the bookkeeping stays in kvcache, the pages live on the
//! device).
//!
//! One path, as on the CPU: embed → per layer (RMSNorm, fused QKV product, bias + q/k norms +
//! RoPE in one kernel, cache write, paged attention, output product accumulated into the
//! residual, RMSNorm, fused gate|up product, SiLU·mul, down product accumulated into the
//! residual) → final RMSNorm of the rows whose logits are wanted → output product (`step.rs`).
//! Gemma 3's differences are steps of the same path, switched by the `ModelConfig`: the
//! embedding scaled by √hidden, the queries (not the scores) scaled after RoPE, RoPE base and
//! sliding window per layer (`layer_windows`, `rope_base_local`), the attention and MLP outputs
//! RMS-normed before the residual add (`ModelOps::rms_norm_add`, one kernel), GELU·mul (tanh
//! approximation, in f32) instead of SiLU·mul, the output tied to the embedding.
//!
//! Layer groups (`kvcache::LayerGroups`, the hybrid cache): each group has its own slots and
//! block tables (staged and uploaded per group); a layer writes through its group's slots into
//! its page plane and attends over its group's tables with its own window. A sliding group's
//! reclaimed entries are `NULL_BLOCK`, always before the window, where no kernel reads. A
//! one-group pool (every other model, or `hybrid` off) is the step as before.
//! Weights (`weights.rs`) stay in their GGUF block types where the GPU has kernels for them
//! (`GpuWeights::Gguf`, the default: Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K; other types bf16)
//! or are dequantized once to bf16 or f32 (`PAGEKV_DEV_CUDA_WEIGHTS`). `step.rs` routes each
//! product: quantized matrices in steps of at most 16 token rows go through the int8 matrix-vector
//! kernel (`pagekv_cuda::QuantOps::gemv`, 4 rows a launch, the op before the product — RMSNorm,
//! SiLU·mul, the attention output — in its prologue); larger steps dequantize the matrix into a
//! bf16 tile a range of rows at a time and multiply with cuBLAS (f32 accumulation). Dense bf16
//! matrices in steps of at most [`pagekv_cuda::GEMV_MAX_N`] tokens (up to the device tuning's
//! `gemv_max_bytes`, `PAGEKV_DEV_CUDA_GEMV_MAX_BYTES`) use the fused bf16 matrix-vector kernel,
//! others cuBLAS.
//!
//! Attention: a sequence that brings at least the device tuning's `prefill_min_tokens` new
//! tokens (96 by default, `PAGEKV_DEV_CUDA_PREFILL_MIN`; `PAGEKV_DEV_CUDA_PREFILL=0` turns it
//! off) goes through the tiled causal prefill kernel (`pagekv_cuda::PrefillAttention`: one CTA
//! per tile of query tokens and kv head reads the prefix once per tile, tensor cores) where the
//! pages' format allows it (f16, bf16); every other token (decode, short chunks, other formats —
//! counted as a fallback) is one query row of the paged decode kernel with its own context
//! length (`position + 1`) and its sequence's block table. In a step with both, the decode
//! kernel runs first with the prefill rows' context lengths set to 0 (those rows are skipped),
//! then the prefill kernel writes its rows.
//!
//! Reduced sampling inputs: `Forward::forward_greedy` (`pk_argmax`) and
//! `Forward::forward_top_k` (`top_k.rs`, each row's `k` best entries) run after the step and
//! copy only their `[rows]` / `[rows, k]` results to the host; the step's logits stay on the
//! device until `Forward::fetch_logits` asks for them.
//!
//! Buffers are allocated up front (`scratch.rs`) and grow only when a larger batch arrives.
//!
//! A step's launches are captured as a CUDA graph the second time its shape (tokens, logit
//! rows, table width, context rounded up to 256, attention route, pages) is seen, and replayed
//! from then on (`graphs.rs`; `PAGEKV_DEV_CUDA_GRAPH=0` turns this off). While a step runs, the
//! device's stream must be this model's thread's alone: work another thread queued on it during
//! a capture would be recorded into the graph. Give each concurrently used model its own
//! `CudaDevice` (each has its own stream).
//!
//! Files: `model.rs` (the model and its `Forward`), `step.rs` (one step's launches), `graphs.rs`
//! (the graph cache), `scratch.rs` (buffers), `top_k.rs` (device top-k), `weights.rs`,
//! `synthetic.rs` (random-weight models of real shapes), `buffers.rs` (helpers).

mod buffers;
mod graphs;
mod model;
mod scratch;
mod step;
mod synthetic;
mod top_k;
mod weights;

pub use model::CudaModel;
pub use synthetic::{synthetic_config, SYNTHETIC_MODELS};
pub use weights::GpuWeights;
