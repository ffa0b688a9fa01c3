//! ggml-compatible attention numerics, the router's `ggml` route (`PAGEKV_ATTN_NUMERICS=ggml`,
//! and what the default `auto` picks for f16 caches the SIMD kernel serves): attention over an f16 KV cache rounded step by
//! step as llama.cpp's CPU backend rounds it, so a model run here can agree with llama.cpp to
//! the last bit instead of to the last few tenths of a logit.
//!
//! What llama.cpp computes (llama-cpp-python 0.3.36 as the golden data in ../shared/reference
//! was made: `flash_attn` off, an f16 cache with V stored transposed, ggml-cpu built with GCC for
//! AVX-512; its `llama-graph.cpp` `build_attn_mha`, ggml-cpu `ggml_compute_forward_mul_mat`,
//! `llamafile/sgemm.cpp` `tinyBLAS`, `vec.cpp` `ggml_vec_dot_f16` / `ggml_vec_soft_max_f32`,
//! `vec.h` `ggml_v_expf`, `ops.cpp` `ggml_compute_forward_soft_max_f32`):
//!
//! 1. `kq = mul_mat(K, Q)`: Q is converted to f16 (round to nearest even), each score is an f32
//!    dot product of f16 values (every product exact, so only the summation order rounds).
//! 2. `soft_max_ext(kq, mask, scale)`: `w = score · scale` in f32; `e = ggml_v_expf(w − max)`;
//!    the denominator sums `e` 16 positions at a time (an f32 tree per 16, then f64);
//!    `p = e · f32(1 / sum)`.
//! 3. `kqv = mul_mat(V, p)`: p is converted to f16 and each output is an f32 dot product over
//!    the positions (exact products again; only the order rounds).
//!
//! The summation order of both products depends on how many query tokens llama.cpp's ubatch
//! holds: with several (prefill), tinyBLAS accumulates 16 lanes, lane `i mod 16` taking element
//! `i`, then folds them (`_mm512_reduce_add_ps`); with one (decode), `ggml_vec_dot_f16` keeps
//! four 16-lane accumulators over steps of 64 and folds `(a0 + a2) + (a1 + a3)` first. Here the
//! order is chosen **per sequence**: a sequence with `q_len` 1 takes the decode order, one with
//! several query tokens the tinyBLAS order, whatever else the call holds, so a sequence's result
//! does not depend on what it is batched with (the engine's "alone == batched" guarantee). For
//! one sequence per call, as llama.cpp runs a single conversation, that is llama.cpp's choice.
//! Positions index the lanes from 0 (llama.cpp's cache cells, which for one sequence are its
//! positions), and masked positions add exact zeros, so the cache's padding (to 256 cells) does
//! not matter. Several sequences in one llama.cpp ubatch share cells in an order this kernel
//! does not model; one sequence per call is reproduced bit for bit (the golden tests check
//! 1,024 prefill rows and 296 decode steps of SmolLM2).
//!
//! [`GgmlSteps`] switches each rounding step on or off (off = that step computed in f64 and
//! rounded once, or not rounded at all): the golden tests use it to measure which step accounts
//! for how much of the disagreement with llama.cpp. Only f16 caches (unrotated) are served;
//! any other format is a configuration error.
//!
//! Two implementations, side by side in this folder: `reference.rs` ([`attention`]) is scalar,
//! the reference (parallel over (sequence, kv head) on the thread pool when run through
//! [`GgmlAttention`] with no SIMD kernel); `simd/` is the same computation vectorized (AVX-512
//! or AVX2, chosen at run time) and threaded without splitting any sum, bit-identical to it
//! (tests compare bit patterns). [`GgmlAttention`] runs `simd` for [`GgmlSteps::ALL`] and
//! `head_dim % 16 == 0`, the scalar kernel otherwise (ablations, odd head sizes, CPUs without
//! AVX2).

mod reference;
#[cfg(target_arch = "x86_64")]
mod simd;
pub mod steps;

use kvcache::{KvFormat, LayerView};

pub use self::reference::{attention, dot_tinyblas, dot_vec_f16, reduce16, softmax_sum};
#[cfg(target_arch = "x86_64")]
use self::simd::GgmlWorkspace;
pub use self::steps::GgmlSteps;
use super::error::AttentionError;
use super::isa::KernelIsa;
use super::params::AttentionParams;
use super::pool::PoolHandle;
use super::validate::validate;

/// Which ggml kernel served a call, and how it was cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlKernel {
    /// The scalar reference, one task per (sequence, kv head).
    Scalar,
    /// The SIMD kernel, one task per (sequence, kv head, run of query tokens).
    Whole,
    /// The SIMD kernel with decode rows split over threads: `partitions` (sequence, kv head,
    /// share) items.
    Shares { partitions: usize },
}

impl GgmlKernel {
    /// Partitions as the attention stats count them (the shares of a split decode row).
    pub fn partitions(&self) -> usize {
        match self {
            GgmlKernel::Shares { partitions } => *partitions,
            _ => 0,
        }
    }
}

/// The ggml-numerics attention operator: its steps, the instruction set of its SIMD kernel (if
/// any), the thread pool it runs on and the SIMD kernel's buffers.
pub struct GgmlAttention {
    steps: GgmlSteps,
    isa: Option<KernelIsa>,
    pool: PoolHandle,
    #[cfg(target_arch = "x86_64")]
    workspace: GgmlWorkspace,
}

impl GgmlAttention {
    /// With the strongest SIMD kernel this CPU runs ([`KernelIsa::detect`]).
    pub fn new(steps: GgmlSteps, pool: impl Into<PoolHandle>) -> GgmlAttention {
        GgmlAttention {
            steps,
            isa: KernelIsa::detect(),
            pool: pool.into(),
            #[cfg(target_arch = "x86_64")]
            workspace: GgmlWorkspace::default(),
        }
    }

    /// Pins the SIMD kernel's instruction set (`None`: the scalar kernel for every call). An
    /// instruction set this CPU lacks also means the scalar kernel.
    pub fn with_isa(mut self, isa: Option<KernelIsa>) -> GgmlAttention {
        self.isa = isa.filter(KernelIsa::is_available);
        self
    }

    pub fn steps(&self) -> GgmlSteps {
        self.steps
    }

    /// The SIMD kernel's instruction set, if calls with every step on use one.
    pub fn isa(&self) -> Option<KernelIsa> {
        self.isa
    }

    /// Whether calls over a cache of `format` with heads of `head_dim` run the SIMD kernel: every
    /// step on, an instruction set for it, an f16 cache (unrotated, as f16 always is) and a head
    /// size it takes (a multiple of 16 up to 512). Where not, [`Self::forward`] falls to the
    /// scalar kernel (or, for another format, an error), and the `auto` numerics take the fast
    /// kernels instead.
    pub fn serves_fast(&self, format: KvFormat, head_dim: usize) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            self.isa.is_some()
                && self.steps == GgmlSteps::ALL
                && format == KvFormat::F16
                && simd::serves_head_dim(head_dim)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (format, head_dim);
            false
        }
    }

    /// Computes attention for every query of `p` over `layer` (an f16 cache) into `out`
    /// (`[num_seqs, q_len, num_heads, head_dim]`) and says which kernel served it.
    pub fn forward(
        &mut self,
        layer: &LayerView,
        p: &AttentionParams,
        out: &mut [f32],
    ) -> Result<GgmlKernel, AttentionError> {
        reference::check_format(layer)?;
        validate(layer, p, out)?;
        self.run_validated(layer, p, out)
    }

    /// [`Self::forward`] for a call whose shapes and blocks the caller validated; checks the
    /// format.
    pub(crate) fn run_validated(
        &mut self,
        layer: &LayerView,
        p: &AttentionParams,
        out: &mut [f32],
    ) -> Result<GgmlKernel, AttentionError> {
        reference::check_format(layer)?;
        #[cfg(target_arch = "x86_64")]
        if let Some(isa) = self.isa.filter(|_| self.steps == GgmlSteps::ALL && simd::serves(layer)) {
            return Ok(match simd::attention(isa, layer, p, &self.pool, &mut self.workspace, out) {
                Some(partitions) => GgmlKernel::Shares { partitions },
                None => GgmlKernel::Whole,
            });
        }
        reference::attention_on(&self.pool, layer, p, self.steps, out);
        Ok(GgmlKernel::Scalar)
    }
}
