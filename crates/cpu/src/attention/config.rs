//! How attention is configured: which numerics (llama.cpp's or the fast kernels'), which path
//! among the fast kernels, the router's thresholds and the kernels' instruction set. The values
//! are typed; `from_lookup` parses them from `PAGEKV_*` names as a caller's lookup gives them.

use super::error::AttentionError;
use super::ggml::steps::GgmlSteps;
use super::isa::KernelIsa;

/// Environment variable choosing the implementation.
pub const ATTN_IMPL_ENV: &str = "PAGEKV_ATTN_IMPL";
/// Environment variable setting the partition size (tokens) of the partitioned path.
pub const PARTITION_SIZE_ENV: &str = "PAGEKV_PARTITION_SIZE";
/// Environment variable setting the context length from which `auto` considers partitioning.
pub const PARTITION_THRESHOLD_ENV: &str = "PAGEKV_DEV_PARTITION_THRESHOLD";
/// Accepted values of [`ATTN_IMPL_ENV`].
pub const ATTN_IMPL_VALUES: &str = "auto, reference, primitive, partitioned";
/// Environment variable pinning the instruction set of the fast kernels.
pub const ATTN_ISA_ENV: &str = "PAGEKV_DEV_ATTN_ISA";
/// Accepted values of [`ATTN_ISA_ENV`].
pub const ATTN_ISA_VALUES: &str = "auto, avx2, avx512";
/// Environment variable choosing the attention numerics.
pub const ATTN_NUMERICS_ENV: &str = "PAGEKV_ATTN_NUMERICS";
/// Accepted values of [`ATTN_NUMERICS_ENV`].
pub const ATTN_NUMERICS_VALUES: &str = "auto, fast, ggml";

/// Default partition size in tokens (`PAGEKV_PARTITION_SIZE`).
pub const DEFAULT_PARTITION_SIZE: usize = 512;

/// Default context length (tokens read) from which `auto` considers partitioning
/// (`PAGEKV_DEV_PARTITION_THRESHOLD`; the router's docs give the measurement).
pub const DEFAULT_PARTITION_THRESHOLD: usize = 1024;

/// Which fast path to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AttnImpl {
    /// Primitive or partitioned, chosen per call by the router's cost model.
    #[default]
    Auto,
    Reference,
    Primitive,
    Partitioned,
}

impl AttnImpl {
    /// Parses a `PAGEKV_ATTN_IMPL` / `--attn-impl` value.
    pub fn parse(value: &str) -> Result<AttnImpl, AttentionError> {
        match value.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(AttnImpl::Auto),
            "reference" => Ok(AttnImpl::Reference),
            "primitive" => Ok(AttnImpl::Primitive),
            "partitioned" => Ok(AttnImpl::Partitioned),
            _ => Err(AttentionError::Config {
                name: ATTN_IMPL_ENV,
                value: value.to_string(),
                accepted: ATTN_IMPL_VALUES.to_string(),
            }),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            AttnImpl::Auto => "auto",
            AttnImpl::Reference => "reference",
            AttnImpl::Primitive => "primitive",
            AttnImpl::Partitioned => "partitioned",
        }
    }
}

/// Which instruction set the fast kernels use (`PAGEKV_DEV_ATTN_ISA`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum IsaChoice {
    /// The strongest one the CPU has ([`KernelIsa::detect`]).
    #[default]
    Auto,
    /// This one; calls fall back to the reference (`unsupported_cpu`) if the CPU lacks it.
    Only(KernelIsa),
}

impl IsaChoice {
    /// Parses a `PAGEKV_DEV_ATTN_ISA` value.
    pub fn parse(value: &str) -> Result<IsaChoice, AttentionError> {
        match value.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(IsaChoice::Auto),
            "avx2" => Ok(IsaChoice::Only(KernelIsa::Avx2)),
            "avx512" => Ok(IsaChoice::Only(KernelIsa::Avx512)),
            _ => Err(AttentionError::Config {
                name: ATTN_ISA_ENV,
                value: value.to_string(),
                accepted: ATTN_ISA_VALUES.to_string(),
            }),
        }
    }

    /// The instruction set this choice resolves to on this CPU, if it can run.
    pub fn resolve(&self) -> Option<KernelIsa> {
        match self {
            IsaChoice::Auto => KernelIsa::detect(),
            IsaChoice::Only(isa) => isa.is_available().then_some(*isa),
        }
    }
}

/// How attention rounds: the fast kernels' own numerics, llama.cpp's, or whichever of the two
/// suits the cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AttnNumerics {
    /// llama.cpp's rounding where the SIMD ggml kernel serves the cache (f16, unrotated, head_dim
    /// a multiple of 16 up to 512, a CPU with AVX2) and no setting picks among the fast kernels
    /// ([`AttentionConfig::picks_fast_kernels`]); the fast kernels for every other cache.
    /// SmolLM2's f16 decode runs at 0.96× / 0.81× of the fast kernels' speed at 128 / 4096
    /// tokens on the ggml kernel.
    #[default]
    Auto,
    /// The fast kernels (`PAGEKV_ATTN_IMPL` picks among them).
    Fast,
    /// llama.cpp's rounding with these steps ([`GgmlSteps::ALL`] for `ggml`) for every call: a
    /// cache of another format than f16 is an error.
    Ggml(GgmlSteps),
}

impl AttnNumerics {
    /// Parses a `PAGEKV_ATTN_NUMERICS` / `--attn-numerics` value.
    pub fn parse(value: &str) -> Result<AttnNumerics, AttentionError> {
        match value.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(AttnNumerics::Auto),
            "fast" => Ok(AttnNumerics::Fast),
            "ggml" => Ok(AttnNumerics::Ggml(GgmlSteps::ALL)),
            _ => Err(AttentionError::Config {
                name: ATTN_NUMERICS_ENV,
                value: value.to_string(),
                accepted: ATTN_NUMERICS_VALUES.to_string(),
            }),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            AttnNumerics::Auto => "auto",
            AttnNumerics::Fast => "fast",
            AttnNumerics::Ggml(_) => "ggml",
        }
    }
}

/// Partition size and the `auto` threshold of the router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouterConfig {
    pub partition_size: usize,
    pub partition_threshold: usize,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig { partition_size: DEFAULT_PARTITION_SIZE, partition_threshold: DEFAULT_PARTITION_THRESHOLD }
    }
}

/// Router and kernel configuration of an [`Attention`](super::Attention).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttentionConfig {
    /// llama.cpp's numerics or the fast kernels'.
    pub numerics: AttnNumerics,
    /// Which fast path serves a call under the fast numerics.
    pub impl_: AttnImpl,
    pub router: RouterConfig,
    /// Instruction set of the fast kernels (the ggml kernel's too).
    pub isa: IsaChoice,
}

impl AttentionConfig {
    /// Whether a setting chooses among the fast kernels (a path, an instruction set or router
    /// thresholds other than the defaults): the default numerics (`auto`) then run those
    /// kernels rather than the ggml ones, so the choice is not silently ignored.
    pub fn picks_fast_kernels(&self) -> bool {
        AttentionConfig { numerics: AttnNumerics::default(), ..*self } != AttentionConfig::default()
    }

    /// Parses `PAGEKV_ATTN_NUMERICS`, `PAGEKV_ATTN_IMPL`, `PAGEKV_PARTITION_SIZE`,
    /// `PAGEKV_DEV_PARTITION_THRESHOLD` and `PAGEKV_DEV_ATTN_ISA` as `lookup` gives them (the
    /// binary's configuration module passes its settings; tests pass a map). Unset names keep
    /// the defaults.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<AttentionConfig, AttentionError> {
        let mut c = AttentionConfig::default();
        if let Some(v) = lookup(ATTN_NUMERICS_ENV) {
            c.numerics = AttnNumerics::parse(&v)?;
        }
        if let Some(v) = lookup(ATTN_IMPL_ENV) {
            c.impl_ = AttnImpl::parse(&v)?;
        }
        if let Some(v) = lookup(ATTN_ISA_ENV) {
            c.isa = IsaChoice::parse(&v)?;
        }
        let positive = |name: &'static str, v: String| -> Result<usize, AttentionError> {
            match v.trim().parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(AttentionError::Config { name, value: v, accepted: "a positive integer".into() }),
            }
        };
        if let Some(v) = lookup(PARTITION_SIZE_ENV) {
            c.router.partition_size = positive(PARTITION_SIZE_ENV, v)?;
        }
        if let Some(v) = lookup(PARTITION_THRESHOLD_ENV) {
            c.router.partition_threshold = positive(PARTITION_THRESHOLD_ENV, v)?;
        }
        Ok(c)
    }
}
