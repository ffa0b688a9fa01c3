//! The rounding steps of llama.cpp's attention the ggml kernels reproduce, each switchable for
//! ablations (see the parent module's docs).

/// Which rounding steps of llama.cpp's attention to reproduce; see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GgmlSteps {
    /// Q converted to f16 before `K·Q` (off: f32 queries).
    pub f16_query: bool,
    /// `K·Q` summed in ggml's f32 order (off: in f64, rounded once).
    pub kq_order: bool,
    /// `ggml_v_expf` (off: `exp` in f64, rounded once).
    pub expf: bool,
    /// The softmax denominator summed per 16 positions in f32, then in f64 (off: all in f64).
    pub sum_order: bool,
    /// Probabilities converted to f16 before `V·p` (off: kept in f32).
    pub f16_probs: bool,
    /// `V·p` summed in ggml's f32 order (off: in f64, rounded once).
    pub kqv_order: bool,
}

impl GgmlSteps {
    /// Every step as llama.cpp rounds it.
    pub const ALL: GgmlSteps =
        GgmlSteps { f16_query: true, kq_order: true, expf: true, sum_order: true, f16_probs: true, kqv_order: true };
    /// No step: f64 sums, exact `exp`, f32 queries and probabilities (normalized before `V·p`).
    pub const NONE: GgmlSteps = GgmlSteps {
        f16_query: false,
        kq_order: false,
        expf: false,
        sum_order: false,
        f16_probs: false,
        kqv_order: false,
    };
    /// The step names, in field order (for ablation tables).
    pub const NAMES: [&'static str; 6] = ["f16_query", "kq_order", "expf", "sum_order", "f16_probs", "kqv_order"];

    /// The steps as flags, in [`Self::NAMES`] order.
    pub fn flags(&self) -> [bool; 6] {
        [self.f16_query, self.kq_order, self.expf, self.sum_order, self.f16_probs, self.kqv_order]
    }

    /// The steps from flags in [`Self::NAMES`] order.
    pub fn from_flags(f: [bool; 6]) -> GgmlSteps {
        GgmlSteps { f16_query: f[0], kq_order: f[1], expf: f[2], sum_order: f[3], f16_probs: f[4], kqv_order: f[5] }
    }
}
