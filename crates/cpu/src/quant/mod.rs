//! Quantized weight formats (GGML/GGUF block layouts) and the matrix kernels that use them.
//!
//! - [`blocks`]: `#[repr(C)]` block types, bit-exact with ggml.
//! - [`reference`]: scalar dequantizers written from each format's definition (the oracle).
//! - [`quantize`]: scalar reference quantizers (Q8_0, Q8_1, Q8_K for activations, as
//!   llama.cpp's ggml-cpu makes them on x86; Q4_0, Q4_1, Q8_0 for weight test data).
//! - [`hugepage`]: [`HugePageBuf`](hugepage::HugePageBuf), weight storage in transparent huge pages.
//! - [`activations`]: [`QuantScratch`], the reusable buffer holding quantized activations.
//! - [`matmul`]: `out[n, m] = x[n, k] · W[m, k]ᵀ` (and [`matmul_fused`] for several matrices
//!   over the same `x`), threads over output rows, dispatching to per-ISA tile kernels
//!   ([`dot_scalar`]; `dot_avx2` for Q4_0/Q4_1/Q8_0, `dot_avx2_k` for the K-quants,
//!   `dot_avx2_float` for F32/F16/BF16; `dot_avx512` for Q4_0/Q4_1/Q8_0 and `dot_avx512_k` for the
//!   K-quants with AVX-512 VNNI, bit-identical to their AVX2 counterparts).
//!
//! A weight tensor is a GGUF tensor with dims `[k, m]`: `m` rows of `k` values, `k` fastest,
//! each row a whole number of blocks.

pub mod activations;
pub mod blocks;
pub mod dot_scalar;
pub mod hugepage;
pub mod matmul;
pub mod quantize;
pub mod reference;

#[cfg(target_arch = "x86_64")]
mod activations_avx2;
#[cfg(target_arch = "x86_64")]
mod dot_avx2;
#[cfg(target_arch = "x86_64")]
mod dot_avx2_float;
#[cfg(target_arch = "x86_64")]
mod dot_avx2_k;
#[cfg(target_arch = "x86_64")]
mod dot_avx512;
#[cfg(target_arch = "x86_64")]
mod dot_avx512_k;

pub use activations::{Q8Kind, QuantScratch};
pub use matmul::{fusable, matmul, matmul_fused, matmul_fused_with_isa, matmul_with_isa, Isa, MatmulPart};
pub use reference::dequantize_row;

/// Errors from the quantized kernels: all are bad input (shapes, lengths, types).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// A GGML type id that this crate has no kernel for.
    #[error("unsupported ggml tensor type id {0} (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K)")]
    UnsupportedType(u32),
    /// A row length that is not a whole number of blocks.
    #[error("{ty:?} rows need a multiple of {block} values, got {cols}")]
    RaggedRow { ty: WeightType, cols: usize, block: usize },
    /// A buffer whose length does not match the shape.
    #[error("{what}: expected {expected} elements/bytes, got {actual}")]
    Length { what: &'static str, expected: usize, actual: usize },
    /// A format without a reference quantizer (the K-quants).
    #[error("no reference quantizer for {0:?}")]
    NoQuantizer(WeightType),
    /// Matrices that cannot share one [`matmul_fused`] call.
    #[error("cannot fuse these matrices: {0}")]
    Fusion(&'static str),
    /// A kernel family this CPU cannot run.
    #[error("instruction set {0:?} is not available on this CPU")]
    IsaUnavailable(Isa),
}

/// The weight formats with matrix kernels. Discriminants are the GGML type ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WeightType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q8_0 = 8,
    Q4K = 12,
    Q5K = 13,
    Q6K = 14,
    BF16 = 30,
}

impl WeightType {
    /// Every supported type, for tests and tables.
    pub const ALL: [WeightType; 9] = [
        WeightType::F32,
        WeightType::F16,
        WeightType::BF16,
        WeightType::Q8_0,
        WeightType::Q4_0,
        WeightType::Q4_1,
        WeightType::Q4K,
        WeightType::Q5K,
        WeightType::Q6K,
    ];

    /// The type for a GGML/GGUF type id.
    pub fn from_ggml_id(id: u32) -> Result<WeightType, QuantError> {
        WeightType::ALL.into_iter().find(|t| *t as u32 == id).ok_or(QuantError::UnsupportedType(id))
    }

    /// The GGML/GGUF type id.
    pub fn ggml_id(self) -> u32 {
        self as u32
    }

    /// Values per block.
    pub fn block_elems(self) -> usize {
        match self {
            WeightType::F32 | WeightType::F16 | WeightType::BF16 => 1,
            WeightType::Q8_0 | WeightType::Q4_0 | WeightType::Q4_1 => blocks::QK,
            WeightType::Q4K | WeightType::Q5K | WeightType::Q6K => blocks::QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        use std::mem::size_of;
        match self {
            WeightType::F32 => 4,
            WeightType::F16 | WeightType::BF16 => 2,
            WeightType::Q8_0 => size_of::<blocks::BlockQ8_0>(),
            WeightType::Q4_0 => size_of::<blocks::BlockQ4_0>(),
            WeightType::Q4_1 => size_of::<blocks::BlockQ4_1>(),
            WeightType::Q4K => size_of::<blocks::BlockQ4K>(),
            WeightType::Q5K => size_of::<blocks::BlockQ5K>(),
            WeightType::Q6K => size_of::<blocks::BlockQ6K>(),
        }
    }

    /// Bytes of one row of `cols` values; an error when `cols` is not a whole number of blocks.
    pub fn row_bytes(self, cols: usize) -> Result<usize, QuantError> {
        let block = self.block_elems();
        if !cols.is_multiple_of(block) {
            return Err(QuantError::RaggedRow { ty: self, cols, block });
        }
        Ok(cols / block * self.block_bytes())
    }
}

/// A borrowed weight matrix: `rows` (m) rows of `cols` (k) values, row-major, in format `ty`.
/// This is a GGUF tensor with dims `[cols, rows]`.
#[derive(Debug, Clone, Copy)]
pub struct WeightView<'a> {
    pub ty: WeightType,
    /// m: output features.
    pub rows: usize,
    /// k: input features (the reduction dimension).
    pub cols: usize,
    /// `rows * row_bytes(cols)` bytes.
    pub data: &'a [u8],
}

impl<'a> WeightView<'a> {
    /// A checked view: `data` must hold exactly `rows` rows of `cols` values.
    pub fn new(ty: WeightType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self, QuantError> {
        let view = WeightView { ty, rows, cols, data };
        view.check()?;
        Ok(view)
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> Result<usize, QuantError> {
        self.ty.row_bytes(self.cols)
    }

    /// Checks that `data` holds exactly `rows` rows.
    pub fn check(&self) -> Result<(), QuantError> {
        let expected = self.row_bytes()? * self.rows;
        if self.data.len() != expected {
            return Err(QuantError::Length { what: "weight bytes", expected, actual: self.data.len() });
        }
        Ok(())
    }

    /// The bytes of row `r`.
    pub fn row(&self, r: usize) -> Result<&'a [u8], QuantError> {
        let rb = self.row_bytes()?;
        self.data.get(r * rb..(r + 1) * rb).ok_or(QuantError::Length {
            what: "weight row",
            expected: (r + 1) * rb,
            actual: self.data.len(),
        })
    }
}
