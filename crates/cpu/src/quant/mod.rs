//! Quantized weight formats (GGML/GGUF block layouts) and the matrix kernels that use them.
//!
//! - [`blocks`]: `#[repr(C)]` block types, bit-exact with ggml.
//! - [`reference`]: scalar dequantizers written from each format's definition (the oracle).
//! - [`reference_q4k`]: llama.cpp's float order for Q4_K × Q8_K (its repacked x86 kernels),
//!   which every Q4_K kernel follows bit for bit; [`reference_q6k`], the same for Q6_K.
//! - [`quantize`]: scalar reference quantizers (Q8_0, Q8_1, Q8_K for activations, as
//!   llama.cpp's ggml-cpu makes them on x86; Q4_0, Q4_1, Q8_0 for weight test data).
//! - [`hugepage`]: [`HugePageBuf`](hugepage::HugePageBuf), weight storage in transparent huge pages.
//! - [`interleave`]: Q4_K rows interleaved in groups of 16 ([`RowLayout::Q4kX16`]), the layout
//!   the AVX-512 Q4_K kernels read without transposing.
//! - [`activations`]: [`QuantScratch`], the reusable buffer holding quantized activations.
//! - [`matmul`]: `out[n, m] = x[n, k] · W[m, k]ᵀ` (and [`matmul_fused`] for several matrices
//!   over the same `x`), threads over output rows, dispatching to per-ISA tile kernels
//!   ([`dot_scalar`]; `dot_avx2` for Q4_0/Q4_1/Q8_0, `dot_avx2_k` for the K-quants,
//!   `dot_avx2_float` for F32/F16/BF16; `dot_avx512` for Q4_0/Q4_1/Q8_0 and `dot_avx512_k` for the
//!   K-quants with AVX-512 VNNI, bit-identical to their AVX2 counterparts; `dot_avx512_q4k`,
//!   Q4_K tiles of 16 weight rows × 32 activation rows; `dot_avx512_q4k_gemv`, Q4_K with up
//!   to 4 + 3 activation rows (decode, draft verification); `dot_avx512_q6k`, Q6_K tiles of
//!   16 × 16).
//!
//! A weight tensor is a GGUF tensor with dims `[k, m]`: `m` rows of `k` values, `k` fastest,
//! each row a whole number of blocks.

pub mod activations;
pub mod blocks;
pub mod dot_scalar;
pub mod hugepage;
pub mod interleave;
pub mod matmul;
pub mod quantize;
pub mod reference;
pub mod reference_q4k;
pub mod reference_q5k;
pub mod reference_q6k;
pub mod types;

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
#[cfg(target_arch = "x86_64")]
mod dot_avx512_q4k;
#[cfg(target_arch = "x86_64")]
mod dot_avx512_q4k_gemv;
#[cfg(target_arch = "x86_64")]
mod dot_avx512_q6k;

pub use activations::QuantScratch;
pub use matmul::{
    fusable, matmul, matmul_fused, matmul_fused_ordered, matmul_fused_with_isa, matmul_with_isa, MatmulPart,
};
pub use reference::dequantize_row;
pub use types::Isa;
pub use types::{isa_cap, set_isa_cap, IsaCap, Q8Kind, QuantError, RowLayout, SumOrder, WeightType, WeightView};
