//! The quantization module's shared vocabulary, a leaf that the kernel files all use and that
//! uses only [`blocks`](super::blocks): errors ([`QuantError`]), weight formats ([`WeightType`],
//! [`WeightView`]), instruction-set families ([`Isa`], [`IsaCap`]), activation layouts
//! ([`Q8Kind`], [`Acts`]) and the tile result type ([`TileOut`]).

use super::blocks::{self, BlockQ8K};
use std::sync::OnceLock;

/// Errors from the quantized kernels: all are bad input (shapes, lengths, types).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// A GGML type id that this crate has no kernel for.
    #[error("unsupported ggml tensor type id {0} (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS)")]
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
    /// A bad `PAGEKV_DEV_ISA` value.
    #[error("{var}={value:?} is not valid (accepted: scalar, avx2, avx512, auto)")]
    BadIsaCap { var: &'static str, value: String },
    /// A kernel family this CPU cannot run.
    #[error("instruction set {0:?} is not available on this CPU")]
    IsaUnavailable(Isa),
    /// A row layout the matrix's type or shape does not allow, or an operation that needs
    /// plain rows.
    #[error("a {ty:?} matrix of {rows}x{cols} cannot be used in the {layout:?} layout here")]
    Layout { layout: RowLayout, ty: WeightType, rows: usize, cols: usize },
}

/// How a matrix's rows lie in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RowLayout {
    /// Row after row, as in a GGUF file.
    Rows,
    /// Q4_K rows interleaved word by word in groups of 16
    /// ([`interleave`](super::interleave)).
    Q4kX16,
}

/// The weight formats with matrix kernels. Discriminants are the GGML type ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WeightType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q2K = 10,
    Q3K = 11,
    Q4K = 12,
    Q5K = 13,
    Q6K = 14,
    IQ4NL = 20,
    IQ4XS = 23,
    BF16 = 30,
}

impl WeightType {
    /// Every supported type, for tests and tables.
    pub const ALL: [WeightType; 15] = [
        WeightType::F32,
        WeightType::F16,
        WeightType::BF16,
        WeightType::Q8_0,
        WeightType::Q4_0,
        WeightType::Q4_1,
        WeightType::Q5_0,
        WeightType::Q5_1,
        WeightType::IQ4NL,
        WeightType::Q2K,
        WeightType::Q3K,
        WeightType::Q4K,
        WeightType::Q5K,
        WeightType::Q6K,
        WeightType::IQ4XS,
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
            WeightType::Q8_0
            | WeightType::Q4_0
            | WeightType::Q4_1
            | WeightType::Q5_0
            | WeightType::Q5_1
            | WeightType::IQ4NL => blocks::QK,
            WeightType::Q2K
            | WeightType::Q3K
            | WeightType::Q4K
            | WeightType::Q5K
            | WeightType::Q6K
            | WeightType::IQ4XS => blocks::QK_K,
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
            WeightType::Q5_0 => size_of::<blocks::BlockQ5_0>(),
            WeightType::Q5_1 => size_of::<blocks::BlockQ5_1>(),
            WeightType::IQ4NL => size_of::<blocks::BlockIQ4NL>(),
            WeightType::Q2K => size_of::<blocks::BlockQ2K>(),
            WeightType::Q3K => size_of::<blocks::BlockQ3K>(),
            WeightType::IQ4XS => size_of::<blocks::BlockIQ4XS>(),
            WeightType::Q4K => size_of::<blocks::BlockQ4K>(),
            WeightType::Q5K => size_of::<blocks::BlockQ5K>(),
            WeightType::Q6K => size_of::<blocks::BlockQ6K>(),
        }
    }

    /// Byte offsets of the f16 scale fields in a block (`d`, then `m` or `dmin` where the format
    /// has one); empty for the float types. Test data generators set these to sane values
    /// in otherwise random blocks.
    pub fn f16_scale_offsets(self) -> &'static [usize] {
        match self {
            WeightType::F32 | WeightType::F16 | WeightType::BF16 => &[],
            WeightType::Q4_0 | WeightType::Q5_0 | WeightType::Q8_0 | WeightType::IQ4NL | WeightType::IQ4XS => &[0],
            WeightType::Q4_1 | WeightType::Q5_1 | WeightType::Q4K | WeightType::Q5K => &[0, 2],
            WeightType::Q2K => &[80, 82],
            WeightType::Q3K => &[108],
            WeightType::Q6K => &[208],
        }
    }

    /// Whether the K-quant activations (Q8_K super-blocks) feed this type's kernels.
    pub fn reads_q8k(self) -> bool {
        self.block_elems() == blocks::QK_K
    }

    /// The name llama.cpp gives the type (`Q4_K`, `IQ4_NL`, …).
    pub fn ggml_name(self) -> &'static str {
        match self {
            WeightType::F32 => "F32",
            WeightType::F16 => "F16",
            WeightType::BF16 => "BF16",
            WeightType::Q4_0 => "Q4_0",
            WeightType::Q4_1 => "Q4_1",
            WeightType::Q5_0 => "Q5_0",
            WeightType::Q5_1 => "Q5_1",
            WeightType::Q8_0 => "Q8_0",
            WeightType::IQ4NL => "IQ4_NL",
            WeightType::Q2K => "Q2_K",
            WeightType::Q3K => "Q3_K",
            WeightType::Q4K => "Q4_K",
            WeightType::Q5K => "Q5_K",
            WeightType::Q6K => "Q6_K",
            WeightType::IQ4XS => "IQ4_XS",
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
    /// How the rows lie in `data`.
    pub layout: RowLayout,
}

impl<'a> WeightView<'a> {
    /// A checked view of plain rows: `data` must hold exactly `rows` rows of `cols` values.
    pub fn new(ty: WeightType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self, QuantError> {
        Self::with_layout(ty, rows, cols, data, RowLayout::Rows)
    }

    /// A checked view of `rows` rows of `cols` values lying in `data` as `layout` says.
    pub fn with_layout(
        ty: WeightType,
        rows: usize,
        cols: usize,
        data: &'a [u8],
        layout: RowLayout,
    ) -> Result<Self, QuantError> {
        let view = WeightView { ty, rows, cols, data, layout };
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
        if self.layout == RowLayout::Q4kX16 && !super::interleave::interleavable(self.ty, self.rows, self.cols) {
            return Err(self.layout_error());
        }
        Ok(())
    }

    fn layout_error(&self) -> QuantError {
        QuantError::Layout { layout: self.layout, ty: self.ty, rows: self.rows, cols: self.cols }
    }

    /// The bytes of row `r` (plain rows only: an interleaved row is not contiguous).
    pub fn row(&self, r: usize) -> Result<&'a [u8], QuantError> {
        if self.layout != RowLayout::Rows {
            return Err(self.layout_error());
        }
        let rb = self.row_bytes()?;
        self.data.get(r * rb..(r + 1) * rb).ok_or(QuantError::Length {
            what: "weight row",
            expected: (r + 1) * rb,
            actual: self.data.len(),
        })
    }
}

/// Instruction-set families with tile kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust, any CPU.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// x86-64 AVX-512 F/BW/VL with VNNI, plus everything of [`Isa::Avx2`] (whose kernels it
    /// uses for the types without AVX-512 ones).
    Avx512Vnni,
}

impl Isa {
    /// Whether this CPU can run the family.
    pub fn is_available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 =
                is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
            match self {
                Isa::Scalar => true,
                Isa::Avx2 => avx2,
                Isa::Avx512Vnni => {
                    avx2 && is_x86_feature_detected!("avx512f")
                        && is_x86_feature_detected!("avx512bw")
                        && is_x86_feature_detected!("avx512vl")
                        && is_x86_feature_detected!("avx512vnni")
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Isa::Scalar
        }
    }

    /// Whether the family includes AVX2 + FMA + F16C (so their kernels may run).
    pub fn has_avx2(self) -> bool {
        matches!(self, Isa::Avx2 | Isa::Avx512Vnni)
    }

    /// The best available family within the process's [`IsaCap`] (see [`set_isa_cap`]),
    /// detected once per process.
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| isa_cap().best())
    }

    fn rank(self) -> u8 {
        match self {
            Isa::Scalar => 0,
            Isa::Avx2 => 1,
            Isa::Avx512Vnni => 2,
        }
    }

    /// Every family this CPU can run, for tests and benches.
    pub fn available() -> Vec<Isa> {
        [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni].into_iter().filter(|i| i.is_available()).collect()
    }
}

/// The most capable [`Isa`] family the kernels may use: a developer switch for comparing and
/// testing the slower paths (`PAGEKV_DEV_ISA`). `Auto` takes the best one available.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum IsaCap {
    Scalar,
    Avx2,
    Avx512,
    #[default]
    Auto,
}

/// The environment variable [`IsaCap::from_lookup`] reads.
pub const ISA_CAP_ENV: &str = "PAGEKV_DEV_ISA";

impl IsaCap {
    /// Parses `scalar|avx2|avx512|auto` (case-insensitive, trimmed).
    pub fn parse(v: &str) -> Result<IsaCap, QuantError> {
        match v.trim().to_ascii_lowercase().as_str() {
            "scalar" => Ok(IsaCap::Scalar),
            "avx2" => Ok(IsaCap::Avx2),
            "avx512" => Ok(IsaCap::Avx512),
            "auto" => Ok(IsaCap::Auto),
            _ => Err(QuantError::BadIsaCap { var: ISA_CAP_ENV, value: v.to_string() }),
        }
    }

    /// The cap named by `PAGEKV_DEV_ISA` in `lookup` (`Auto` when unset). Pure: the caller
    /// supplies the variables.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<IsaCap, QuantError> {
        lookup(ISA_CAP_ENV).map_or(Ok(IsaCap::Auto), |v| IsaCap::parse(&v))
    }

    /// The best available family within the cap.
    pub fn best(self) -> Isa {
        let cap = match self {
            IsaCap::Scalar => Isa::Scalar,
            IsaCap::Avx2 => Isa::Avx2,
            IsaCap::Avx512 | IsaCap::Auto => Isa::Avx512Vnni,
        };
        [Isa::Avx512Vnni, Isa::Avx2, Isa::Scalar]
            .into_iter()
            .find(|i| i.rank() <= cap.rank() && i.is_available())
            .unwrap_or(Isa::Scalar)
    }
}

static ISA_CAP: OnceLock<IsaCap> = OnceLock::new();

/// Sets the process's [`IsaCap`] (the binary's configuration does this once, before the first
/// kernel runs). Returns `false`, changing nothing, when a cap was already fixed (set before,
/// or read by [`Isa::best`]) with a different value.
pub fn set_isa_cap(cap: IsaCap) -> bool {
    *ISA_CAP.get_or_init(|| cap) == cap
}

/// The process's [`IsaCap`] (`Auto` unless [`set_isa_cap`] said otherwise).
pub fn isa_cap() -> IsaCap {
    *ISA_CAP.get_or_init(IsaCap::default)
}

/// Which ggml activation block the Q8 layout holds (ggml's `vec_dot_type` of the weights).
/// The codes and `d` are the same for both; they differ in the offset sum `s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Q8Kind {
    /// `block_q8_0`, the activations of Q4_0, Q5_0, IQ4_NL and Q8_0 weights: `s = 0`. No
    /// kernel reads it (Q4_0 and Q5_0 subtract their code offset inside the integer sums, as
    /// ggml does), so it is not computed; the slot keeps the layout's `(d, s)` pairs one shape
    /// for both kinds.
    Q8_0,
    /// `block_q8_1`, the activations of Q4_1 weights: `s = f16(d · Σqs)` with the unrounded
    /// `d`, as ggml stores it (its Q4_1 dot product takes the offset `m_w · s` from that f16).
    Q8_1,
}

impl Q8Kind {
    /// The activation block ggml pairs with weights of type `ty`, if it is a Q8 one.
    pub fn for_weights(ty: WeightType) -> Option<Q8Kind> {
        match ty {
            WeightType::Q4_0 | WeightType::Q5_0 | WeightType::IQ4NL | WeightType::Q8_0 => Some(Q8Kind::Q8_0),
            WeightType::Q4_1 | WeightType::Q5_1 => Some(Q8Kind::Q8_1),
            _ => None,
        }
    }
}

/// Most weight rows of a tile.
pub const TILE_MAX_ROWS: usize = 16;
/// Most activation rows of a tile.
pub const TILE_MAX_ACTS: usize = 32;
/// A tile of results, `[weight row][activation row]`.
pub type TileOut = [[f32; TILE_MAX_ACTS]; TILE_MAX_ROWS];

/// The summation order of the K-quant products.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SumOrder {
    /// llama.cpp's (ggml-cpu's): which order an activation row sums in depends on how many rows
    /// the call has (Q4_K: its repacked gemm order for the first multiple of 4 rows, its gemv
    /// order for the rest; Q5_K/Q6_K: the tiled order from 8 rows on), so results match
    /// llama.cpp's for the same call shapes.
    #[default]
    LlamaCpp,
    /// Every activation row in the order of a one-row call (a decode step), whatever the row
    /// count: a token's product does not depend on the tokens beside it — what batching,
    /// chunked prefill and the verification of drafts need. The other weight types sum the
    /// same way in both.
    RowInvariant,
}

/// Activations in the layout the row kernel of a weight type expects; the unused fields are
/// empty. All are row-major with `k` values per row.
#[derive(Debug, Clone, Copy)]
pub struct Acts<'a> {
    /// Values per activation row.
    pub k: usize,
    /// Q8 codes `[n, k]`.
    pub q8_qs: &'a [i8],
    /// Q8 `(d, s)` per block `[n, k / 32]` (`s` as [`Q8Kind`] defines it).
    pub q8_ds: &'a [[f32; 2]],
    /// Per Q8_0 block `[n, k / 32]`, the eight negated sums of four consecutive codes,
    /// `-(y[4l] + y[4l+1] + y[4l+2] + y[4l+3])`: the exact integer a kernel whose weight codes
    /// carry a fixed offset `o` (a power of two) starts lane `l` from, shifted (`-o Σ y`).
    /// Empty for Q8_1 activations.
    pub q8_neg_sums: &'a [[i32; 8]],
    /// Q8_K super-blocks `[n, k / 256]`.
    pub q8k: &'a [BlockQ8K],
    /// Raw f32 activations `[n, k]` (float weight types).
    pub x: &'a [f32],
    /// Activation rows `0..gemm_acts` sum Q4_K products in llama.cpp's gemm order, the rest in
    /// its gemv order ([`gemm_rows`](super::reference_q4k::gemm_rows) of the row count; see
    /// [`reference_q4k`](super::reference_q4k)). A multiple of 4.
    pub gemm_acts: usize,
    /// Every row sums Q5_K and Q6_K products in llama.cpp's tiled-matmul order, not its
    /// dot-product order ([`tiled_order`](super::reference_q6k::tiled_order) of the row count; see
    /// [`reference_q5k`](super::reference_q5k) and [`reference_q6k`](super::reference_q6k)).
    pub tiled: bool,
}

/// Raw pointer that may be shared with pool tasks writing disjoint parts.
#[derive(Clone, Copy)]
pub(crate) struct SyncPtr<T>(pub(crate) *mut T);
// SAFETY: users write disjoint index ranges from different tasks (documented at each use).
unsafe impl<T> Sync for SyncPtr<T> {}
unsafe impl<T> Send for SyncPtr<T> {}

impl<T> SyncPtr<T> {
    /// The pointer (a method, so closures capture the whole `Sync` wrapper).
    #[inline(always)]
    pub(crate) fn get(&self) -> *mut T {
        self.0
    }
}
