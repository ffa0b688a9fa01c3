//! The llama family (Llama 2/3, SmolLM2, Mistral, Qwen2, Qwen3) as found in GGUF files.

pub mod config;
mod model;
pub mod ops;
pub mod silu;
pub mod weights;

pub use config::{Architecture, ModelConfig, RopeStyle};
pub use model::Model;
pub use weights::LoadOptions;
