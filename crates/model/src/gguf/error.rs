//! `GgufError`: everything that can be wrong with a GGUF file or a metadata lookup.
//!
//! Each variant names the item at fault (a key, a tensor, a header field) and, where the
//! fault is in the bytes, the file offset where reading it started.

use std::path::PathBuf;

/// An error from reading a GGUF file or from a typed metadata lookup.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened or mapped.
    #[error("cannot read GGUF file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic bytes {found:02x?}, expected \"GGUF\"")]
    BadMagic { found: Vec<u8> },
    /// Only versions 2 and 3 are read. A big-endian file shows up here with its version
    /// byte-swapped (e.g. 50331648 for 3).
    #[error("unsupported GGUF version {0} (supported: 2 and 3, little-endian)")]
    UnsupportedVersion(u32),
    /// The file ends before `what`, which starts at `offset`, is complete.
    #[error("file truncated: {what} at offset {offset} runs past the end of the file")]
    Truncated { what: String, offset: u64 },
    /// A declared length is above a fixed cap or above what the rest of the file can hold.
    #[error("{what}: declared length {len} exceeds the limit {cap}")]
    TooLarge { what: String, len: u64, cap: u64 },
    /// A string (key, value or tensor name) is not valid UTF-8.
    #[error("{what} at offset {offset} is not valid UTF-8")]
    InvalidUtf8 { what: String, offset: u64 },
    /// A ggml tensor type id that this reader does not know.
    #[error("unknown ggml tensor type id {0}")]
    UnknownType(u32),
    /// A metadata value type id outside 0..=12.
    #[error("{what} at offset {offset}: unknown metadata value type id {id}")]
    UnknownValueType { what: String, id: u32, offset: u64 },
    /// A value that is well-formed but not allowed (a bool byte other than 0/1, too deep
    /// array nesting, a duplicate key).
    #[error("{what} at offset {offset}: {reason}")]
    BadValue { what: String, offset: u64, reason: String },
    /// `general.alignment` is zero or not a power of two.
    #[error("general.alignment must be a nonzero power of two, found {0}")]
    BadAlignment(String),
    /// A tensor info that cannot describe data in this file.
    #[error("tensor '{name}': {reason}")]
    BadTensor { name: String, reason: String },
    /// A metadata lookup for a key the file does not have.
    #[error("metadata key '{0}' is missing")]
    MissingKey(String),
    /// A metadata lookup for a key whose value has another type.
    #[error("metadata key '{key}': expected {expected}, found {found}")]
    WrongType { key: String, expected: &'static str, found: &'static str },
    /// A metadata integer or float that does not fit the requested type.
    #[error("metadata key '{key}': value {value} does not fit in {expected}")]
    OutOfRange { key: String, value: String, expected: &'static str },
}
