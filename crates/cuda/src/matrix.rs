//! [`DeviceMatrix`]: a row-major `[rows, cols]` matrix in device memory in a [`DType`] (bf16 or
//! f32) — the weights of dense products and the activations that feed them ([`crate::ModelOps`]
//! multiplies them).

use cudarc::cublas::sys as blas_sys;
use cudarc::driver::CudaSlice;
use half::bf16;

use crate::device::CudaDevice;
use crate::pages::dptr;
use crate::CudaError;

/// Element type of a [`DeviceMatrix`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    Bf16,
    F32,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::Bf16 => 2,
            DType::F32 => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::Bf16 => "bf16",
            DType::F32 => "f32",
        }
    }

    /// `bf16` or `f32`; anything else is an error naming the accepted values.
    pub fn parse(s: &str) -> Result<DType, CudaError> {
        match s {
            "bf16" => Ok(DType::Bf16),
            "f32" => Ok(DType::F32),
            _ => Err(CudaError::Invalid(format!("weight type {s:?}: accepted values are bf16, f32"))),
        }
    }

    pub(crate) fn suffix(self) -> &'static str {
        self.name()
    }

    pub(crate) fn cuda(self) -> blas_sys::cudaDataType {
        match self {
            DType::Bf16 => blas_sys::cudaDataType::CUDA_R_16BF,
            DType::F32 => blas_sys::cudaDataType::CUDA_R_32F,
        }
    }
}

/// A row-major `[rows, cols]` matrix (weights, or activations that feed a product) in device
/// memory.
pub struct DeviceMatrix {
    /// `[rows, cols]` elements of `dtype`, as bytes.
    data: CudaSlice<u8>,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) dtype: DType,
}

impl DeviceMatrix {
    /// A zeroed matrix.
    pub fn zeros(device: &CudaDevice, rows: usize, cols: usize, dtype: DType) -> Result<DeviceMatrix, CudaError> {
        let n = rows
            .checked_mul(cols)
            .and_then(|n| n.checked_mul(dtype.size()))
            .ok_or_else(|| CudaError::Invalid(format!("matrix [{rows}, {cols}] overflows")))?;
        let data = device.stream().alloc_zeros::<u8>(n.max(16)).map_err(|e| CudaError::driver("cuMemAlloc", e))?;
        Ok(DeviceMatrix { data, rows, cols, dtype })
    }

    /// A matrix holding `values` (`[rows, cols]` f32, rounded to `dtype` to nearest even).
    pub fn from_f32(
        device: &CudaDevice,
        rows: usize,
        cols: usize,
        dtype: DType,
        values: &[f32],
    ) -> Result<DeviceMatrix, CudaError> {
        let mut m = DeviceMatrix::zeros(device, rows, cols, dtype)?;
        m.write_rows(device, 0, values)?;
        Ok(m)
    }

    /// Overwrites rows `first..first + values.len() / cols` with `values` (f32, rounded to the
    /// matrix's type).
    pub fn write_rows(&mut self, device: &CudaDevice, first: usize, values: &[f32]) -> Result<(), CudaError> {
        if self.cols == 0 || !values.len().is_multiple_of(self.cols) || first + values.len() / self.cols > self.rows {
            return Err(CudaError::Invalid(format!(
                "{} values at row {first} of a [{}, {}] matrix",
                values.len(),
                self.rows,
                self.cols
            )));
        }
        let bytes: Vec<u8> = match self.dtype {
            DType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            DType::Bf16 => values.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect(),
        };
        let off = first * self.cols * self.dtype.size();
        let mut dst = self.data.slice_mut(off..off + bytes.len());
        device.stream().memcpy_htod(&bytes, &mut dst).map_err(|e| CudaError::driver("cuMemcpyHtoD", e))
    }

    /// The matrix as f32 values on the host (tests).
    pub fn to_f32(&self, device: &CudaDevice) -> Result<Vec<f32>, CudaError> {
        let n = self.rows * self.cols;
        let bytes = device
            .stream()
            .clone_dtoh(&self.data.slice(..n * self.dtype.size()))
            .map_err(|e| CudaError::driver("cuMemcpyDtoH", e))?;
        Ok(match self.dtype {
            DType::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            DType::Bf16 => bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Bytes of the matrix's elements.
    pub fn bytes(&self) -> usize {
        self.rows * self.cols * self.dtype.size()
    }

    /// The matrix's device address (for kernels outside this module).
    pub(crate) fn device_ptr(&self, device: &CudaDevice) -> u64 {
        dptr(&self.data, device)
    }

    pub(crate) fn ptr(&self, device: &CudaDevice) -> u64 {
        self.device_ptr(device)
    }
}
