//! `pagekv-cuda` — the CUDA backend: device page storage and paged attention kernels.
//!
//! Everything CUDA sits behind the `cuda` cargo feature (the optional `cudarc` dependency, whose
//! driver and NVRTC libraries are loaded at run time), so the workspace builds and runs without a
//! GPU; without the feature [`cuda_available`] is `false` and [`probe`] returns
//! [`CudaError::NotCompiled`].
//!
//! Main types (feature `cuda`):
//! - [`CudaTuning`]: the backend's kernel shapes, variants and launch options as one value
//!   (`tuning.rs`), parsed from the developer switches by [`dev`]; a device carries one.
//! - [`CudaDevice`]: a context and stream on one GPU; compiles the CUDA C++ kernels in
//!   `kernels/` ([`ModuleSpec`]: which files and `-D` options, the kernel shapes from
//!   [`shapes`]) with NVRTC for the device's architecture at first use and caches the cubins
//!   on disk ([`compile`]).
//! - [`DevicePages`]: implements [`kvcache::PageStore`] in device memory with the host's layout
//!   and formats (f32, f16, bf16, q8, q4 with or without rotation, turbo); the cache-write kernel
//!   quantizes on the way in, bit-identical to the kvcache reference codecs.
//! - [`DecodeAttention`]: paged decode attention, `primitive` and `partitioned` (split-K + merge)
//!   routes, every format with dequantization fused, GQA, sliding window; a tensor-core kernel
//!   for f16/bf16/q8/q4 pages and a SIMT kernel for everything ([`DecodeKernel`]).
//! - [`ModelOps`]: the kernels of the model forward pass (embedding, RMSNorm, QKV + RoPE,
//!   SiLU·mul and GELU·mul, Gemma's post-norms and embedding scale, argmax) and its matrix
//!   products through cuBLAS over [`DeviceMatrix`] weights (bf16 or f32, `matrix.rs`); the
//!   forward pass itself is `pagekv-model`'s `CudaModel`.
//! - [`mod@bench`]: the attention benchmark ([`bench::bench_attention`] → [`bench::Row`]s, JSON
//!   lines via [`bench::Row::to_json`]) with its roofline rows; measured figures in
//!   `docs/performance.md`.
//! - [`TopK`]: each logit row's `k` best entries (ids, values) selected on the device.
//!
//! No device is touched before [`CudaDevice::new`]; it checks that the driver library exists
//! and initializes, and returns one typed [`CudaError`] otherwise — never a panic.

mod error;
mod qformat;
pub use error::CudaError;
pub use qformat::{split_blocks, QuantType};

#[cfg(feature = "cuda")]
mod attention;
#[cfg(feature = "cuda")]
pub mod bench;
#[cfg(feature = "cuda")]
pub mod compile;
#[cfg(feature = "cuda")]
pub mod dev;
#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod matrix;
#[cfg(feature = "cuda")]
mod model_ops;
#[cfg(feature = "cuda")]
mod pages;
#[cfg(feature = "cuda")]
mod prefill;
#[cfg(feature = "cuda")]
mod qmatrix;
#[cfg(feature = "cuda")]
mod rope;
#[cfg(feature = "cuda")]
pub mod shapes;
#[cfg(feature = "cuda")]
mod spec;
#[cfg(feature = "cuda")]
mod topk;
#[cfg(feature = "cuda")]
mod tuning;

#[cfg(feature = "cuda")]
pub use attention::{
    auto_partition_size, tc_partition_size, DecodeAttention, DecodeBatch, DecodeKernel, DecodeRoute, MAX_GROUP,
};
/// A typed device buffer (cudarc's `CudaSlice`), named here so crates above need no cudarc.
#[cfg(feature = "cuda")]
pub use cudarc::driver::CudaSlice as DeviceVec;
/// Element types a [`DeviceVec`] can hold (cudarc's bounds).
#[cfg(feature = "cuda")]
pub use cudarc::driver::{DeviceRepr, ValidAsZeroBits};
#[cfg(feature = "cuda")]
pub use device::{CudaDevice, DeviceGraph};
#[cfg(feature = "cuda")]
pub use matrix::{DType, DeviceMatrix};
#[cfg(feature = "cuda")]
pub use model_ops::{ModelOps, Prologue, GEMV_MAX_N};
#[cfg(feature = "cuda")]
pub use pages::{DevicePages, HostLayerCopy};
#[cfg(feature = "cuda")]
pub use prefill::{prefill_tiles, PrefillAttention, PrefillBatch};
#[cfg(feature = "cuda")]
pub use qmatrix::{QuantMatrix, QuantOps, QGEMV_MAX_N};
#[cfg(feature = "cuda")]
pub use rope::{QkvRope, RopeParams};
#[cfg(feature = "cuda")]
pub use shapes::prefill_supported;
#[cfg(feature = "cuda")]
pub use spec::ModuleSpec;
#[cfg(feature = "cuda")]
pub use topk::{TopK, TopKPlan, TOP_K_CHUNKS, TOP_K_MAX, TOP_K_MERGE_CAP, TOP_K_NONE};
#[cfg(feature = "cuda")]
pub use tuning::{CudaTuning, DecodeGrid, GemvShape, TcTuning, GEMV_ROWS_PER_WARP, INVARIANT_PARTITION};

/// Number of CUDA devices, or why there is no usable CUDA (no feature, no driver, init failed).
pub fn probe() -> Result<usize, CudaError> {
    #[cfg(feature = "cuda")]
    {
        device::device_count()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(CudaError::NotCompiled)
    }
}

/// Whether at least one CUDA device can be used.
pub fn cuda_available() -> bool {
    matches!(probe(), Ok(n) if n > 0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn probe_never_panics_and_agrees_with_cuda_available() {
        let available = super::cuda_available();
        match super::probe() {
            Ok(n) => assert_eq!(available, n > 0),
            Err(e) => {
                assert!(!available);
                assert!(!e.to_string().is_empty());
            }
        }
        #[cfg(not(feature = "cuda"))]
        assert_eq!(super::probe(), Err(super::CudaError::NotCompiled));
    }
}
