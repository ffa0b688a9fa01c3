//! pagekv-model: everything that turns a model file into logits.
//!
//! - [`gguf`]: the GGUF reader (metadata first, tensors on demand over mmap) and a writer
//!   for tests and tools.
//! - [`tokenizer`]: byte-level BPE and SentencePiece vocabularies from GGUF metadata,
//!   streaming detokenization.
//! - [`template`]: the chat template, rendered with minijinja.
//! - [`llama`]: model configuration, weights and the forward pass over the paged cache.
//! - [`Batch`]: the plain arrays one forward step consumes.
//! - [`backend::Forward`]: one forward step over a backend's pages (the CPU [`Model`]; with the
//!   `cuda` feature, `cuda::CudaModel` on a GPU).
pub mod backend;
pub mod batch;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod error;
pub mod gguf;
pub mod llama;
pub mod template;
pub mod tokenizer;

pub use backend::Forward;
pub use batch::{Batch, BatchSeq, Logits};
pub use error::ModelError;
pub use llama::{LoadOptions, Model, ModelConfig};
