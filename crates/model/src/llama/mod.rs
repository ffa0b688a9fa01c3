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
