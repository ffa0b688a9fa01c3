//! Device-buffer helpers of the GPU model and the mapping of CUDA errors to [`ModelError`].

use pagekv_cuda::{CudaDevice, CudaError, DeviceVec};

use crate::error::ModelError;

/// A CUDA backend error as the model's.
pub(crate) fn dev(e: CudaError) -> ModelError {
    ModelError::Device(e.to_string())
}

/// A driver error of `op` (cudarc's own error types) as the model's.
pub(crate) fn drv<E: std::fmt::Debug>(op: &'static str) -> impl Fn(E) -> ModelError {
    move |e| ModelError::Device(format!("CUDA driver error in {op}: {e:?}"))
}

/// `values` copied into a new device buffer.
pub(crate) fn upload_f32(device: &CudaDevice, values: &[f32]) -> Result<DeviceVec<f32>, ModelError> {
    device.stream().clone_htod(values).map_err(drv("cuMemcpyHtoD"))
}

/// A zeroed device buffer of `n` elements (at least one).
pub(crate) fn zeros<T: pagekv_cuda::DeviceRepr + pagekv_cuda::ValidAsZeroBits>(
    device: &CudaDevice,
    n: usize,
) -> Result<DeviceVec<T>, ModelError> {
    device.stream().alloc_zeros::<T>(n.max(1)).map_err(drv("cuMemAlloc"))
}
