//! What the fast kernels are built for: the instruction sets, detected at run time, and the
//! largest head size.

/// Largest head_dim the fast kernels serve (their tile buffers are sized by it).
pub const MAX_FAST_HEAD_DIM: usize = 512;

/// Instruction set of the fast kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelIsa {
    /// AVX2 + FMA + F16C: 8 lanes, 16 registers.
    Avx2,
    /// AVX-512F/VL (with AVX2, FMA, F16C): the same 8-lane kernels with 32 registers and
    /// wider blocking.
    Avx512,
}

impl KernelIsa {
    /// Every instruction set the kernels are built for, weakest first.
    pub const ALL: [KernelIsa; 2] = [KernelIsa::Avx2, KernelIsa::Avx512];

    pub fn name(&self) -> &'static str {
        match self {
            KernelIsa::Avx2 => "avx2",
            KernelIsa::Avx512 => "avx512",
        }
    }

    /// Whether this CPU runs these kernels.
    pub fn is_available(&self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c");
            match self {
                KernelIsa::Avx2 => avx2,
                KernelIsa::Avx512 => {
                    avx2 && std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512vl")
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// The strongest instruction set this CPU runs, if any.
    pub fn detect() -> Option<KernelIsa> {
        KernelIsa::ALL.into_iter().rev().find(KernelIsa::is_available)
    }
}
