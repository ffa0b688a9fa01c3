//! Errors of the model runtime: a bad file, an unsupported architecture, a failed kernel.

use thiserror::Error;

use crate::gguf::GgufError;

#[derive(Debug, Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("unsupported architecture {0:?} (supported: llama, mistral, qwen2, qwen3, gemma3)")]
    UnsupportedArchitecture(String),
    /// `{arch}.nextn_predict_layers` leaves no main layer.
    #[error(
        "{arch}.nextn_predict_layers is {nextn} but {arch}.block_count is {block_count}: the next-token-prediction layers must be fewer than all blocks"
    )]
    NextnLayers { arch: String, nextn: usize, block_count: usize },
    #[error("invalid model: {0}")]
    Invalid(String),
    #[error("tensor {name}: {reason}")]
    Tensor { name: String, reason: String },
    #[error("matrix kernel failed on {name}: {source}")]
    Kernel { name: String, source: pagekv_cpu::quant::QuantError },
    #[error("attention failed: {0}")]
    Attention(String),
    #[error("invalid batch: {0}")]
    Batch(String),
    #[error("token id {id} is out of range (vocabulary of {vocab})")]
    TokenOutOfRange { id: u32, vocab: usize },
    /// A device backend (CUDA) failed or refused.
    #[error("device: {0}")]
    Device(String),
    #[error(transparent)]
    Cache(#[from] kvcache::CacheError),
    #[error(transparent)]
    Config(#[from] kvcache::ConfigError),
}
