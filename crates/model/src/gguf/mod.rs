//! GGUF: the model file format of llama.cpp — a reader hardened against hostile files, and
//! a small writer for tests and tools.
//!
//! - [`GgufFile`] (reader.rs) maps a file, parses the header, metadata and tensor infos,
//!   and checks every tensor's data range; tensor bytes are read on demand from the
//!   mapping. Versions 2 and 3, little-endian.
//! - [`Metadata`], [`MetaValue`], [`MetaArray`] (metadata.rs): the ordered key → value map
//!   with typed getters (`get_u32`, `get_str_array`, …) whose errors name the key.
//! - [`GgmlType`] (types.rs): tensor element types with block and type sizes.
//! - [`GgufWriter`] (writer.rs): builds a valid v3 file in memory, for synthetic models in
//!   tests and for tools.
//! - [`GgufError`] (error.rs): what is wrong and where (key or tensor name, file offset).
//!
//! Limits that bound what a hostile file can make us allocate: strings up to
//! [`MAX_STRING_LEN`] bytes, arrays up to [`MAX_ARRAY_LEN`] elements nested up to
//! [`MAX_ARRAY_DEPTH`] deep, at most [`MAX_TENSORS`] tensors of at most [`MAX_DIMS`] dims,
//! and every count checked against the bytes left before anything is reserved.
//!
//! This module uses only `std`, `thiserror` and `memmap2`, and refers to its own items
//! through `super::`, so the fuzz crate (fuzz/) can compile it on its own.

mod error;
mod metadata;
mod reader;
mod types;
mod writer;

pub use error::GgufError;
pub use metadata::{MetaArray, MetaValue, Metadata};
pub use reader::{GgufFile, TensorInfo, GGUF_MAGIC};
pub use types::GgmlType;
pub use writer::GgufWriter;

/// Longest string (key, value, tensor name) accepted: 64 MiB.
pub const MAX_STRING_LEN: u64 = 64 << 20;
/// Most elements in one metadata array: 16 Mi.
pub const MAX_ARRAY_LEN: u64 = 16 << 20;
/// Deepest nesting of arrays inside arrays (an array of arrays has depth 2).
pub const MAX_ARRAY_DEPTH: u32 = 4;
/// Most tensors in one file.
pub const MAX_TENSORS: u64 = 1 << 20;
/// Most dimensions of one tensor (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: u32 = 4;
/// Alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
