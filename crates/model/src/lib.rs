//! pagekv-model: everything that turns a model file into logits.
//!
//! - [`gguf`]: the GGUF reader (metadata first, tensors on demand over mmap) and a writer
//!   for tests and tools.
pub mod gguf;
