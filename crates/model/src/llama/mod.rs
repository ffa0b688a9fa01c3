//! The llama family (Llama 2/3, SmolLM2, Mistral, Qwen2, Qwen3) and Gemma 3 as found in GGUF
//! files.

pub mod config;
pub mod gelu;
mod model;
mod mtp;
pub mod ops;
mod rows;
pub mod silu;
pub mod weights;

pub use config::{Activation, Architecture, ModelConfig, RopeStyle};
pub use model::Model;
pub use mtp::MTP_POOL_LAYERS;
pub use weights::{LoadOptions, MtpLayerWeights};

use kvcache::KvFormat;

/// Whether a cache of `format` stores a layer's keys less its key bias (`k − b_k` after RoPE,
/// the bias unrotated) — the rule of both the CPU forward and the GPU step. Qwen2's bias puts
/// hundreds into a few channels that barely vary between tokens; a quantized code's error,
/// relative to the key's length, would swamp the part that tells tokens apart. Every score of a
/// query moves by the same `q·b_k`, which softmax cancels, so attention is unchanged up to
/// rounding. Float caches store `k` as is (bit-identical to llama.cpp).
pub(crate) fn centres_keys(format: KvFormat) -> bool {
    !format.key_codec().is_float()
}
