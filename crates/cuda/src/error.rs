//! [`CudaError`]: every way the CUDA backend can refuse or fail, as one typed error. It exists
//! with or without the `cuda` feature, so callers can report "no CUDA" the same way either way.

use thiserror::Error;

/// An error of the CUDA backend. Nothing in this crate panics on a missing driver, a missing
/// device or bad input: it returns one of these.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CudaError {
    /// The crate was built without the `cuda` feature.
    #[error("CUDA support is not compiled in (build pagekv with --features cuda)")]
    NotCompiled,
    /// libcuda (the driver library) could not be loaded.
    #[error("no CUDA driver: libcuda.so could not be loaded (is an NVIDIA driver installed?)")]
    NoDriver,
    /// `cuInit` failed (driver present, but unusable: no GPU, version mismatch, …).
    #[error("CUDA driver initialisation failed: {0}")]
    Init(String),
    /// The requested ordinal does not exist.
    #[error("no CUDA device {ordinal}: {count} device(s) present")]
    NoDevice { ordinal: usize, count: usize },
    /// libnvrtc (the run-time compiler) could not be loaded.
    #[error("NVRTC not found: libnvrtc.so could not be loaded (add the CUDA toolkit's lib64 to LD_LIBRARY_PATH)")]
    NoNvrtc,
    /// NVRTC rejected a kernel source.
    #[error("kernel compilation for {arch} failed ({options}):\n{log}")]
    Compile { arch: String, options: String, log: String },
    /// A driver call failed.
    #[error("CUDA driver error in {op}: {msg}")]
    Driver { op: &'static str, msg: String },
    /// The kernels do not serve this configuration (the caller may fall back to the CPU).
    #[error("not supported by the CUDA kernels: {0}")]
    Unsupported(String),
    /// Bad arguments (shapes, slots, block ids).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The on-disk kernel cache could not be written (reading failures just recompile).
    #[error("kernel cache at {path}: {msg}")]
    CacheIo { path: String, msg: String },
}

impl CudaError {
    #[cfg(feature = "cuda")]
    pub(crate) fn driver(op: &'static str, e: cudarc::driver::DriverError) -> CudaError {
        CudaError::Driver { op, msg: format!("{e:?}") }
    }
}
