//! Error types of the cache. Running out of blocks is a status (`None`, [`crate::Reserve`]),
//! not an error; errors are refused operations and invalid configuration.

use thiserror::Error;

/// An operation the cache refused; the cache is unchanged when one is returned.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CacheError {
    #[error("KV cache capacity exceeded: {required} tokens required, {available} available ({reason})")]
    Capacity { required: usize, available: usize, reason: CapacityReason },
    #[error("KV pool exhausted: {needed} more blocks needed, {free} free")]
    PoolExhausted { needed: usize, free: usize },
    #[error("append to layer {layer} out of order: expected layer {expected} with {expected_tokens} tokens")]
    LayerOrder { layer: usize, expected: usize, expected_tokens: usize },
    #[error("shape mismatch: {what}: expected {expected} values, got {got}")]
    Shape { what: &'static str, expected: usize, got: usize },
    #[error("layer {layer} out of range (the cache has {num_layers} layers)")]
    LayerOutOfRange { layer: usize, num_layers: usize },
    #[error("positions {start}..{end} are not readable: stored range is {live_start}..{offset}")]
    NotResident { start: usize, end: usize, live_start: usize, offset: usize },
    #[error("cannot trim {requested} tokens: only {stored} stored")]
    TrimTooFar { requested: usize, stored: usize },
    #[error("cannot restore a snapshot of {offset} tokens: {reason}")]
    Restore { offset: usize, reason: String },
    #[error("operation not allowed while an append is in progress (layers {done} of {num_layers} written)")]
    AppendInProgress { done: usize, num_layers: usize },
    #[error("snapshot geometry does not match this cache: {0}")]
    Geometry(String),
}

/// Why an append did not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapacityReason {
    /// Dynamic growth is off and the reservation is full.
    GrowthDisabled,
    /// The context window caps the sequence.
    ContextWindow,
}

impl std::fmt::Display for CapacityReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CapacityReason::GrowthDisabled => "dynamic growth is off; enable PAGEKV_DYNAMIC_KV=1 or reserve more",
            CapacityReason::ContextWindow => "the context window is reached",
        })
    }
}

/// Invalid configuration (flags, environment, geometry).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ConfigError {
    #[error("invalid {what} {value:?}: accepted values are {accepted}")]
    Invalid { what: String, value: String, accepted: String },
    #[error("invalid geometry: {0}")]
    Geometry(String),
}

impl ConfigError {
    pub(crate) fn invalid(what: &str, value: &str, accepted: &str) -> ConfigError {
        ConfigError::Invalid { what: what.to_string(), value: value.to_string(), accepted: accepted.to_string() }
    }
}
