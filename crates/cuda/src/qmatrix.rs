//! Weights that stay in their GGUF block format on the device ([`QuantMatrix`]) and the kernels
//! that multiply with them ([`QuantOps`], `kernels/qmatrix.cu`): a fused matrix-vector product
//! for decode steps (the input quantized to int8 per 32 values in the kernel's prologue, dp4a
//! dot products against the weights' codes), a tensor-core product for more token rows that
//! dequantizes each tile of the weight in shared memory (`kernels/qmma.cu`), and the
//! dequantization of row ranges into bf16 tiles (cuBLAS's operand where the tensor-core
//! product does not serve) or of single rows into f32 (embedding lookups).
//!
//! The device layout regroups each block's bytes so every load is aligned: the f16 fields that
//! would break 4-byte alignment (`d`, and `m` of the `_1` types) move to a separate array, in
//! block order ([`split_blocks`](crate::split_blocks)); values are exactly GGUF's.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};

use crate::device::{arg, launch_err, launch_kernel, product_smem_limit, set_max_dynamic_smem, CudaDevice};
use crate::matrix::{DType, DeviceMatrix};
use crate::model_ops::Prologue;
use crate::pages::dptr;
use crate::qformat::QuantType;
use crate::spec::ModuleSpec;
use crate::CudaError;

/// A row-major `[rows, cols]` matrix of GGUF blocks of one [`QuantType`] on the device.
pub struct QuantMatrix {
    /// `[rows, cols / block_values, data_bytes]` bytes.
    data: CudaSlice<u8>,
    /// `[rows, cols / block_values, hdr_halves]` f16 (at least one element).
    hdr: CudaSlice<u16>,
    rows: usize,
    cols: usize,
    qt: QuantType,
}

impl QuantMatrix {
    fn check_shape(qt: QuantType, rows: usize, cols: usize) -> Result<usize, CudaError> {
        if rows == 0 || cols == 0 || !cols.is_multiple_of(qt.block_values()) || rows > u32::MAX as usize {
            return Err(CudaError::Invalid(format!("a [{rows}, {cols}] {qt:?} matrix")));
        }
        rows.checked_mul(cols / qt.block_values())
            .filter(|b| b.checked_mul(qt.block_bytes()).is_some())
            .ok_or_else(|| CudaError::Invalid(format!("a [{rows}, {cols}] {qt:?} matrix overflows")))
    }

    /// The matrix whose rows are `bytes` (`rows` rows of GGUF blocks, as in the file).
    pub fn upload(
        device: &CudaDevice,
        qt: QuantType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<QuantMatrix, CudaError> {
        let blocks = Self::check_shape(qt, rows, cols)?;
        if bytes.len() != blocks * qt.block_bytes() {
            return Err(CudaError::Invalid(format!(
                "{} bytes for a [{rows}, {cols}] {qt:?} matrix (expected {})",
                bytes.len(),
                blocks * qt.block_bytes()
            )));
        }
        let (data, mut hdr) = crate::qformat::split_blocks(qt, bytes)?;
        if hdr.is_empty() {
            hdr.push(0);
        }
        let s = device.stream();
        let data = s.clone_htod(&data).map_err(|e| CudaError::driver("cuMemcpyHtoD", e))?;
        let hdr = s.clone_htod(&hdr).map_err(|e| CudaError::driver("cuMemcpyHtoD", e))?;
        Ok(QuantMatrix { data, hdr, rows, cols, qt })
    }

    /// A zeroed matrix (for [`QuantOps::fill_random`]).
    pub fn zeros(device: &CudaDevice, qt: QuantType, rows: usize, cols: usize) -> Result<QuantMatrix, CudaError> {
        let blocks = Self::check_shape(qt, rows, cols)?;
        let s = device.stream();
        let alloc = |e| CudaError::driver("cuMemAlloc", e);
        let data = s.alloc_zeros::<u8>(blocks * qt.data_bytes()).map_err(alloc)?;
        let hdr = s.alloc_zeros::<u16>((blocks * qt.hdr_halves()).max(1)).map_err(alloc)?;
        Ok(QuantMatrix { data, hdr, rows, cols, qt })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn qtype(&self) -> QuantType {
        self.qt
    }

    /// `(device address, bytes)` of the data and header arrays.
    pub(crate) fn buffers(&self, device: &CudaDevice) -> [(u64, usize); 2] {
        [(dptr(&self.data, device), self.data.len()), (dptr(&self.hdr, device), 2 * self.hdr.len())]
    }

    /// Bytes a product streams (the file's size of the matrix).
    pub fn bytes(&self) -> usize {
        self.rows * self.cols / self.qt.block_values() * self.qt.block_bytes()
    }
}

/// Most token rows one [`QuantOps::gemv`] launch serves: a verification step of up to 7 draft
/// tokens reads the weights once.
pub const QGEMV_MAX_N: usize = 8;

/// Most token rows one [`QuantOps::gemv_pair`] launch serves (`PK_QGEMV_PAIR_N` in
/// `kernels/qmatrix.cu`); more rows take a launch per part.
pub const QGEMV_PAIR_MAX_N: usize = 1;

/// Weight rows, token rows and threads of one tensor-core product CTA (`QM_BM`, `QM_BN`,
/// `QM_THREADS` in `kernels/qmma.cu`).
const QM_BM: usize = 128;
const QM_BN: usize = 64;
const QM_THREADS: usize = 256;

/// Most splits of a tensor-core product's reduction, and the f32 workspace their partial sums
/// share (`[splits, n, rows]`, 16 MiB): products too large for it take fewer splits.
const QMMA_MAX_SPLITS: usize = 16;
const QMMA_WS_FLOATS: usize = 4 << 20;

/// Values of one stage of the tensor-core product (`QmmaShape::BK`): a K-quant super-block, or
/// four blocks of 32.
fn qmma_bk(qt: QuantType) -> usize {
    if qt.block_values() == 256 {
        256
    } else {
        128
    }
}

/// Dynamic shared memory of a tensor-core product CTA (`QmmaShape::SMEM`): two stages of raw
/// blocks, their header halves and the x tile, and the bf16 weight tile.
fn qmma_smem(qt: QuantType) -> usize {
    let bk = qmma_bk(qt);
    let sb = bk / qt.block_values();
    let raw = sb * qt.data_bytes();
    let raws = if (raw / 16) % 2 == 1 { raw } else { raw + 16 };
    let hb = if qt == QuantType::Q6_K { 4 } else { sb * qt.hdr_halves() * 2 };
    let row = 2 * bk + 16;
    let stage = QM_BM * raws + QM_BM * hb + QM_BN * row;
    2 * stage + QM_BM * row
}

/// The reduction split of a tensor-core product over `stages` stages for `tiles` CTAs a split,
/// `slots` CTAs resident at once and at most `max_splits` splits: `(stages a split, splits)`
/// minimizing waves × (stages a split + one, as a CTA's first copy is not overlapped), plus one
/// stage's worth for the reduce launch when split; the fewest splits on ties.
fn qmma_split(tiles: usize, stages: usize, slots: usize, max_splits: usize) -> (usize, usize) {
    let slots = slots.max(1);
    let mut best = (usize::MAX, stages, 1);
    for s in 1..=max_splits.clamp(1, stages.max(1)) {
        let per = stages.div_ceil(s);
        let splits = stages.div_ceil(per);
        let cost = (tiles * splits).div_ceil(slots) * (per + 1) + usize::from(splits > 1);
        if cost < best.0 {
            best = (cost, per, splits);
        }
    }
    (best.1, best.2)
}

/// Warps per block of the decode product (`QG_WARPS` in `kernels/qmatrix.cu`).
const QG_WARPS: usize = 32;

/// Lanes per row of the K-quant decode product for `units` 128-value units a row
/// (`k_lanes_per_row` in `kernels/qmatrix.cu`): the power of two ≥ `units` (at most 32), or,
/// where that leaves lanes idle, the widest power of two ≥ 4 dividing `units` when one does.
fn k_lanes_per_row(units: usize) -> usize {
    let mut lanes = 32;
    while lanes > 1 && lanes / 2 >= units {
        lanes /= 2;
    }
    let mut m = lanes;
    while m >= 4 {
        if units.is_multiple_of(m) {
            return m;
        }
        m /= 2;
    }
    lanes
}

/// Dynamic shared memory of a decode product's int8 input: `[n, cols]` codes and `[n, cols / 32]`
/// scales and sums.
fn input_smem(cols: usize, n: usize) -> usize {
    n * cols + 8 * n * (cols / 32)
}

/// Dynamic shared memory of a K-quant product block's per-slice row sums when `blocks` blocks
/// share `w`'s rows: `[ceil(rows / blocks), slices, n]` f32.
fn k_sums_smem(w: &QuantMatrix, blocks: usize, n: usize) -> usize {
    let units = w.cols / 128;
    let slices = units.div_ceil(k_lanes_per_row(units));
    w.rows.div_ceil(blocks) * slices * n * 4
}

/// The kernels of one type.
struct Kernels {
    /// `[n - 1]` decode products for 1..=QGEMV_MAX_N token rows.
    gemv: Vec<CudaFunction>,
    /// The K-quants' one-row product taking two items a warp at a time
    /// (`CudaTuning::qgemv_items`).
    gemv_i2: Option<CudaFunction>,
    /// The tensor-core product (`pk_qmma_T`) and how many of its CTAs an SM holds.
    mma: CudaFunction,
    mma_per_sm: usize,
    dequant: CudaFunction,
    rows: CudaFunction,
    fill: CudaFunction,
}

/// The quantized-weight kernels on one device.
pub struct QuantOps {
    device: Arc<CudaDevice>,
    /// In [`QuantType::ALL`]'s order.
    kernels: Vec<Kernels>,
    /// The paired K-quant products ([`QuantOps::gemv_pair`]): `(a, b, [n - 1])` for every
    /// ordered pair of different K-quant types, 1..=QGEMV_PAIR_MAX_N token rows.
    pairs: Vec<(QuantType, QuantType, Vec<CudaFunction>)>,
    /// `pk_qmma_reduce` and the split partial sums' workspace (`QMMA_WS_FLOATS`).
    mma_reduce: CudaFunction,
    mma_ws: CudaSlice<f32>,
    smem_limit: usize,
}

impl QuantOps {
    /// Loads (compiling on first use) the kernels of every [`QuantType`].
    pub fn new(device: Arc<CudaDevice>) -> Result<QuantOps, CudaError> {
        let module = device.module(&ModuleSpec::Quant)?;
        device.bind()?;
        let smem_limit = product_smem_limit(&device);
        let mut kernels = Vec::new();
        for qt in QuantType::ALL {
            let s = qt.suffix();
            let gemv = (1..=QGEMV_MAX_N)
                .map(|n| {
                    let f = module.function(&format!("pk_qgemv_{s}_n{n}"))?;
                    set_max_dynamic_smem(&f, smem_limit)?;
                    Ok(f)
                })
                .collect::<Result<Vec<_>, CudaError>>()?;
            let gemv_i2 = if qt.block_values() == 256 {
                let f = module.function(&format!("pk_qgemv_{s}_n1_i2"))?;
                set_max_dynamic_smem(&f, smem_limit)?;
                Some(f)
            } else {
                None
            };
            let mma = module.function(&format!("pk_qmma_{s}"))?;
            let mma_smem = qmma_smem(qt);
            let mma_per_sm = if mma_smem <= smem_limit {
                set_max_dynamic_smem(&mma, mma_smem)?;
                mma.occupancy_max_active_blocks_per_multiprocessor(QM_THREADS as u32, mma_smem, None)
                    .map_err(|e| CudaError::driver("cuOccupancyMaxActiveBlocksPerMultiprocessor", e))?
                    as usize
            } else {
                0
            };
            kernels.push(Kernels {
                gemv,
                gemv_i2,
                mma,
                mma_per_sm,
                dequant: module.function(&format!("pk_qdequant_{s}"))?,
                rows: module.function(&format!("pk_qrows_{s}"))?,
                fill: module.function(&format!("pk_qfill_{s}"))?,
            });
        }
        let k_quants: Vec<QuantType> = QuantType::ALL.into_iter().filter(|t| t.block_values() == 256).collect();
        let mut pairs = Vec::new();
        for &a in &k_quants {
            for &b in k_quants.iter().filter(|&&b| b != a) {
                let fs = (1..=QGEMV_PAIR_MAX_N)
                    .map(|n| {
                        let f = module.function(&format!("pk_qgemv_pair_{}_{}_n{n}", a.suffix(), b.suffix()))?;
                        set_max_dynamic_smem(&f, smem_limit)?;
                        Ok(f)
                    })
                    .collect::<Result<Vec<_>, CudaError>>()?;
                pairs.push((a, b, fs));
            }
        }
        let mma_reduce = module.function("pk_qmma_reduce")?;
        let mma_ws =
            device.stream().alloc_zeros::<f32>(QMMA_WS_FLOATS).map_err(|e| CudaError::driver("cuMemAlloc", e))?;
        Ok(QuantOps { device, kernels, pairs, mma_reduce, mma_ws, smem_limit })
    }

    fn k(&self, qt: QuantType) -> &Kernels {
        &self.kernels[QuantType::ALL.iter().position(|&t| t == qt).expect("every type has kernels")]
    }

    fn p<T>(&self, s: &CudaSlice<T>) -> u64 {
        dptr(s, &self.device)
    }

    /// `(grid blocks, dynamic shared memory bytes)` of the decode product of `n` token rows
    /// against `w`: the int8 input with its scales and sums; for the K-quants (`qgemv_k` in
    /// `kernels/qmatrix.cu`: one block per SM, rows split evenly) also each block's per-slice row
    /// sums; otherwise blocks of 32 warps over the rows.
    fn gemv_launch(&self, w: &QuantMatrix, n: usize) -> (usize, usize) {
        let sms = self.device.sm_count().max(1);
        if w.qt.block_values() == 256 {
            let blocks = w.rows.clamp(1, sms);
            (blocks, input_smem(w.cols, n) + k_sums_smem(w, blocks, n))
        } else {
            (w.rows.div_ceil(QG_WARPS).clamp(1, sms), input_smem(w.cols, n))
        }
    }

    /// `(blocks of a, blocks of b, dynamic shared memory bytes)` of the paired product
    /// (`qgemv_k_pair`): the SMs split between the parts in proportion to their bytes (at
    /// least one block each, at most one per row), so every block streams about as many bytes.
    fn pair_launch(&self, a: &QuantMatrix, b: &QuantMatrix, n: usize) -> (usize, usize, usize) {
        let sms = self.device.sm_count().max(2);
        let share = a.bytes() as f64 / (a.bytes() + b.bytes()) as f64;
        let blocks_a = ((sms as f64 * share).round() as usize).clamp(1, sms - 1).min(a.rows);
        let blocks_b = (sms - blocks_a).min(b.rows);
        let sums = k_sums_smem(a, blocks_a, n).max(k_sums_smem(b, blocks_b, n));
        (blocks_a, blocks_b, input_smem(a.cols, n) + sums)
    }

    /// The paired kernels of parts `a` then `b` (`None`: no such pair).
    fn pair_kernels(&self, a: QuantType, b: QuantType) -> Option<&[CudaFunction]> {
        self.pairs.iter().find(|(x, y, _)| (*x, *y) == (a, b)).map(|(_, _, fs)| fs.as_slice())
    }

    /// Whether [`Self::gemv_pair`] serves `n` token rows against parts `a` then `b`: K-quants
    /// of different types and the same width, `1 ≤ n ≤ QGEMV_PAIR_MAX_N`, the shared memory
    /// fits, and pairing is on (`CudaTuning::qgemv_pair`).
    pub fn gemv_pair_serves(&self, a: &QuantMatrix, b: &QuantMatrix, n: usize) -> bool {
        self.device.tuning().qgemv_pair
            && a.cols == b.cols
            && (1..=QGEMV_PAIR_MAX_N).contains(&n)
            && self.pair_kernels(a.qt, b.qt).is_some()
            && self.pair_launch(a, b, n).2 <= self.smem_limit
    }

    /// [`Self::gemv`] of a weight stacked from parts `a` (columns `col..col + a.rows` of `out`)
    /// and `b` (the next `b.rows` columns) in one launch, without `sibling`: the same sums, bit
    /// for bit, as a launch per part.
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_pair(
        &self,
        out: &CudaSlice<f32>,
        col: usize,
        ldo: usize,
        x: &CudaSlice<f32>,
        a: &QuantMatrix,
        b: &QuantMatrix,
        prologue: Prologue,
        rows: Option<&CudaSlice<u32>>,
        first: usize,
        n: usize,
        accumulate: bool,
    ) -> Result<(), CudaError> {
        let in_width = prologue.in_width(a.cols);
        let end = first + n;
        let width = a.rows + b.rows;
        let bad = !self.gemv_pair_serves(a, b, n)
            || col + width > ldo
            || out.len() < (end - 1) * ldo + col + width
            || ldo > u32::MAX as usize
            || width > u32::MAX as usize
            || (rows.is_none() && x.len() < end * in_width)
            || rows.is_some_and(|r| r.len() < end)
            || matches!(prologue, Prologue::RmsNorm { w: nw, .. } if nw.len() < a.cols);
        if bad {
            return Err(CudaError::Invalid(format!(
                "paired quantized gemv of {n} rows against [{}, {}] {:?} and [{}, {}] {:?} into columns {col}.. of [{n}, {ldo}]",
                a.rows, a.cols, a.qt, b.rows, b.cols, b.qt
            )));
        }
        let (mode, nw, eps) = prologue.mode(&self.device);
        let y = self.p(out) + 4 * (first * ldo + col) as u64;
        let (xp, rp) = match rows {
            Some(r) => (self.p(x), self.p(r) + 4 * first as u64),
            None => (self.p(x) + 4 * (first * in_width) as u64, 0),
        };
        let (da, ha, db, hb) = (self.p(&a.data), self.p(&a.hdr), self.p(&b.data), self.p(&b.hdr));
        let (blocks_a, blocks_b, smem) = self.pair_launch(a, b, n);
        let (ld, ra, rb, col_b, ba) = (ldo as u32, a.rows as u32, b.rows as u32, a.rows as u32, blocks_a as u32);
        let (c32, acc) = (a.cols as u32, accumulate as u32);
        let cfg = LaunchConfig {
            grid_dim: ((blocks_a + blocks_b) as u32, 1, 1),
            block_dim: ((32 * QG_WARPS) as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let mut args: [*mut std::ffi::c_void; 17] = [
            arg(&y),
            arg(&ld),
            arg(&da),
            arg(&ha),
            arg(&ra),
            arg(&db),
            arg(&hb),
            arg(&rb),
            arg(&col_b),
            arg(&ba),
            arg(&xp),
            arg(&nw),
            arg(&rp),
            arg(&c32),
            arg(&mode),
            arg(&eps),
            arg(&acc),
        ];
        let Some(fs) = self.pair_kernels(a.qt, b.qt) else {
            return Err(CudaError::Invalid(format!("no paired kernel for {:?} and {:?}", a.qt, b.qt)));
        };
        let f = &fs[n - 1];
        // SAFETY: `args` are pk_qgemv_pair_A_B_nN's parameters in order and type, alive for the
        // call; sizes checked above; the caller keeps out and x apart and gathered rows in range.
        unsafe { launch_kernel(&self.device, f, cfg, &mut args, self.device.tuning().gemv.pdl) }
            .map_err(launch_err("cuLaunchKernelEx(pk_qgemv_pair)"))
    }

    /// Whether [`Self::gemv`] serves `n` token rows against `w` (`1 ≤ n ≤ QGEMV_MAX_N` and the
    /// kernel's shared memory fits).
    pub fn gemv_serves(&self, w: &QuantMatrix, n: usize) -> bool {
        (1..=QGEMV_MAX_N).contains(&n) && self.gemv_launch(w, n).1 <= self.smem_limit
    }

    /// The decode product for token rows `first..first + n`: columns `col..col + w.rows` of
    /// those rows of `out [·, ldo]` (+)= `x' · wᵀ`, with `x'` the result of `prologue` on `x`
    /// (rows `rows[first..first + n]` of `x` when given, else `first..first + n`) quantized to
    /// int8 per 32 values; f32 accumulation. `out` must not overlap `x`.
    ///
    /// `sibling`: the launch directly before this one on the stream is another of these products
    /// over the same `x` (and `rows`) writing other outputs of `out` — an earlier part of a weight
    /// stacked from parts, or earlier token rows. The launch then does not wait for that one
    /// before reading `x` and runs beside its tail (see `PK_QGEMV` in `kernels/qmatrix.cu`).
    #[allow(clippy::too_many_arguments)]
    pub fn gemv(
        &self,
        out: &CudaSlice<f32>,
        col: usize,
        ldo: usize,
        x: &CudaSlice<f32>,
        w: &QuantMatrix,
        prologue: Prologue,
        rows: Option<&CudaSlice<u32>>,
        first: usize,
        n: usize,
        accumulate: bool,
        sibling: bool,
    ) -> Result<(), CudaError> {
        let in_width = prologue.in_width(w.cols);
        let end = first + n;
        let bad = !self.gemv_serves(w, n)
            || col + w.rows > ldo
            || out.len() < (end - 1) * ldo + col + w.rows
            || ldo > u32::MAX as usize
            || (rows.is_none() && x.len() < end * in_width)
            || rows.is_some_and(|r| r.len() < end)
            || matches!(prologue, Prologue::RmsNorm { w: nw, .. } if nw.len() < w.cols);
        if bad {
            return Err(CudaError::Invalid(format!(
                "quantized gemv of {n} rows against [{}, {}] into columns {col}.. of [{n}, {ldo}]",
                w.rows, w.cols
            )));
        }
        let (mode, nw, eps) = prologue.mode(&self.device);
        let y = self.p(out) + 4 * (first * ldo + col) as u64;
        // Gathered rows start at rows[first]; otherwise x starts at row `first`.
        let (xp, rp) = match rows {
            Some(r) => (self.p(x), self.p(r) + 4 * first as u64),
            None => (self.p(x) + 4 * (first * in_width) as u64, 0),
        };
        let (dp, hp) = (self.p(&w.data), self.p(&w.hdr));
        let (ld, r32, c32, acc, sib) = (ldo as u32, w.rows as u32, w.cols as u32, accumulate as u32, sibling as u32);
        let (blocks, smem) = self.gemv_launch(w, n);
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: ((32 * QG_WARPS) as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let mut args: [*mut std::ffi::c_void; 13] = [
            arg(&y),
            arg(&ld),
            arg(&dp),
            arg(&hp),
            arg(&xp),
            arg(&nw),
            arg(&rp),
            arg(&r32),
            arg(&c32),
            arg(&mode),
            arg(&eps),
            arg(&acc),
            arg(&sib),
        ];
        // A programmatic dependent launch when the tuning says so (`CudaTuning::gemv.pdl`): its
        // blocks may be scheduled while the previous kernel drains; the kernel waits for that
        // kernel's results (pdl_wait) before it reads x or y.
        let programmatic = self.device.tuning().gemv.pdl;
        let k = self.k(w.qt);
        let f = match (&k.gemv_i2, n, self.device.tuning().qgemv_items) {
            (Some(f), 1, 2) => f,
            _ => &k.gemv[n - 1],
        };
        // SAFETY: `args` are pk_qgemv_T_nN's parameters in order and type, alive for the call;
        // sizes checked above; the caller keeps out and x apart and gathered rows in range.
        unsafe { launch_kernel(&self.device, f, cfg, &mut args, programmatic) }
            .map_err(launch_err("cuLaunchKernelEx(pk_qgemv)"))
    }

    /// Whether [`Self::mma`] serves `n` token rows against `w`: `1 ≤ n ≤
    /// CudaTuning::qmma_max_rows`, rows of whole stages (`qmma_bk` values), and an SM holds a
    /// CTA of it.
    pub fn mma_serves(&self, w: &QuantMatrix, n: usize) -> bool {
        n >= 1
            && n <= self.device.tuning().qmma_max_rows
            && w.cols.is_multiple_of(qmma_bk(w.qt))
            && self.k(w.qt).mma_per_sm > 0
    }

    /// `(row tiles, token tiles, stages a split, splits)` of the tensor-core product.
    fn mma_grid(&self, w: &QuantMatrix, n: usize) -> (usize, usize, usize, usize) {
        let (tm, tn) = (w.rows.div_ceil(QM_BM), n.div_ceil(QM_BN));
        let slots = self.device.sm_count().max(1) * self.k(w.qt).mma_per_sm;
        let max_splits = QMMA_MAX_SPLITS.min(QMMA_WS_FLOATS / (n * w.rows).max(1));
        let (per, splits) = qmma_split(tm * tn, w.cols / qmma_bk(w.qt), slots, max_splits);
        (tm, tn, per, splits)
    }

    /// The product of many token rows on the tensor cores: columns `col..col + w.rows` of rows
    /// `0..n` of `out [·, ldo]` (+)= `x [n, w.cols] · wᵀ`, `x` bf16, each weight tile dequantized
    /// to bf16 in shared memory (the values of [`Self::dequantize`]), f32 accumulation. The sums
    /// do not depend on timing: a reduction split into parts adds them in a fixed order.
    #[allow(clippy::too_many_arguments)]
    pub fn mma(
        &self,
        out: &CudaSlice<f32>,
        col: usize,
        ldo: usize,
        x: &DeviceMatrix,
        w: &QuantMatrix,
        n: usize,
        accumulate: bool,
    ) -> Result<(), CudaError> {
        let bad = !self.mma_serves(w, n)
            || x.dtype() != DType::Bf16
            || x.cols() != w.cols
            || x.rows() < n
            || col + w.rows > ldo
            || out.len() < (n - 1) * ldo + col + w.rows
            || ldo > u32::MAX as usize;
        if bad {
            return Err(CudaError::Invalid(format!(
                "tensor-core quantized product of [{}, {}] {} rows against [{}, {}] {:?} into columns {col}.. of [{n}, {ldo}]",
                x.rows(),
                x.cols(),
                x.dtype().name(),
                w.rows,
                w.cols,
                w.qt
            )));
        }
        let (tm, tn, per, splits) = self.mma_grid(w, n);
        let y = self.p(out) + 4 * col as u64;
        let (xp, dp, hp, ws) = (x.device_ptr(&self.device), self.p(&w.data), self.p(&w.hdr), self.p(&self.mma_ws));
        let (ld, ldx, r32, c32, n32) = (ldo as u32, w.cols as u32, w.rows as u32, w.cols as u32, n as u32);
        let (acc, per32, s32) = (accumulate as u32, per as u32, splits as u32);
        let cfg = LaunchConfig {
            grid_dim: (tm as u32, tn as u32, splits as u32),
            block_dim: (QM_THREADS as u32, 1, 1),
            shared_mem_bytes: qmma_smem(w.qt) as u32,
        };
        let mut b = self.device.stream().launch_builder(&self.k(w.qt).mma);
        b.arg(&y)
            .arg(&ld)
            .arg(&dp)
            .arg(&hp)
            .arg(&xp)
            .arg(&ldx)
            .arg(&r32)
            .arg(&c32)
            .arg(&n32)
            .arg(&acc)
            .arg(&ws)
            .arg(&per32);
        // SAFETY: pk_qmma_T(float*, u32, const u8*, const u16*, const u16*, u32, u32, u32, u32,
        // u32, float*, u32); sizes checked above, the workspace holds splits · n · rows floats
        // (mma_grid), and out does not overlap x (f32 and bf16 buffers).
        unsafe { b.launch(cfg) }.map_err(launch_err("cuLaunchKernel(pk_qmma)"))?;
        if splits > 1 {
            let total = n * w.rows;
            let blocks = total.div_ceil(256).clamp(1, 8 * self.device.sm_count().max(1));
            let cfg = LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            let mut b = self.device.stream().launch_builder(&self.mma_reduce);
            b.arg(&y).arg(&ld).arg(&ws).arg(&r32).arg(&n32).arg(&s32).arg(&acc);
            // SAFETY: pk_qmma_reduce(float*, u32, const float*, u32, u32, u32, u32) over the
            // splits · n · rows partial sums the launch above wrote.
            unsafe { b.launch(cfg) }.map_err(launch_err("cuLaunchKernel(pk_qmma_reduce)"))?;
        }
        Ok(())
    }

    /// Rows `first..first + count` of `w` into the first `count` rows of `out` (bf16,
    /// `[≥ count, w.cols]`).
    pub fn dequantize(&self, out: &DeviceMatrix, w: &QuantMatrix, first: usize, count: usize) -> Result<(), CudaError> {
        if out.dtype() != DType::Bf16 || out.cols() != w.cols || out.rows() < count || first + count > w.rows {
            return Err(CudaError::Invalid(format!(
                "dequantize rows {first}..{} of [{}, {}] into [{}, {}] {}",
                first + count,
                w.rows,
                w.cols,
                out.rows(),
                out.cols(),
                out.dtype().name()
            )));
        }
        if count == 0 {
            return Ok(());
        }
        let (o, d, h) = (out.device_ptr(&self.device), self.p(&w.data), self.p(&w.hdr));
        let (f32_, n32, c32) = (first as u32, count as u32, w.cols as u32);
        let units = count * (w.cols / 32);
        // QD_THREADS threads a block, as many blocks as fit 8 per SM.
        let blocks = units.div_ceil(256).clamp(1, 8 * self.device.sm_count().max(1));
        let cfg = LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.device.stream().launch_builder(&self.k(w.qt).dequant);
        b.arg(&o).arg(&d).arg(&h).arg(&f32_).arg(&n32).arg(&c32);
        // SAFETY: pk_qdequant_T(u16*, const u8*, const u16*, u32, u32, u32); sizes checked above.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(launch_err("cuLaunchKernel(pk_qdequant)"))
    }

    /// `out [n, w.cols]` f32 ← rows `ids [n]` of `w` (ids < w.rows; the caller validates them).
    pub fn rows_f32(
        &self,
        out: &mut CudaSlice<f32>,
        w: &QuantMatrix,
        ids: &CudaSlice<u32>,
        n: usize,
    ) -> Result<(), CudaError> {
        if out.len() < n * w.cols || ids.len() < n {
            return Err(CudaError::Invalid(format!("{n} rows of [{}, {}]", w.rows, w.cols)));
        }
        if n == 0 {
            return Ok(());
        }
        let (o, d, h, i, c32) = (self.p(out), self.p(&w.data), self.p(&w.hdr), self.p(ids), w.cols as u32);
        let cfg = LaunchConfig { grid_dim: (n as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.device.stream().launch_builder(&self.k(w.qt).rows);
        b.arg(&o).arg(&d).arg(&h).arg(&i).arg(&c32);
        // SAFETY: pk_qrows_T(float*, const u8*, const u16*, const u32*, u32); sizes checked above.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(launch_err("cuLaunchKernel(pk_qrows)"))
    }

    /// Random blocks whose values stay within about `±scale` (synthetic weights).
    pub fn fill_random(&self, w: &mut QuantMatrix, scale: f32, seed: u32) -> Result<(), CudaError> {
        let blocks = (w.rows * (w.cols / w.qt.block_values())) as u64;
        let (d, h) = (self.p(&w.data), self.p(&w.hdr));
        let grid = (blocks as usize).div_ceil(256).clamp(1, 8 * self.device.sm_count().max(1));
        let cfg = LaunchConfig { grid_dim: (grid as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.device.stream().launch_builder(&self.k(w.qt).fill);
        b.arg(&d).arg(&h).arg(&blocks).arg(&scale).arg(&seed);
        // SAFETY: pk_qfill_T(u8*, u16*, u64, float, u32) over the matrix's blocks.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(launch_err("cuLaunchKernel(pk_qfill)"))
    }
}

#[cfg(test)]
mod tests {
    use super::{k_lanes_per_row, qmma_smem, qmma_split};
    use crate::qformat::QuantType;

    #[test]
    fn tensor_core_splits_fill_the_sms_without_idle_splits() {
        // (CTAs a split, stages, slots, most splits) → (stages a split, splits); 132 SMs.
        // 8B gate|up at 64 tokens: 224 tiles of 16 stages — two waves of whole rows (34 stage
        // times) beat 4 splits of 4 stages in 7 waves (35, plus the reduce).
        assert_eq!(qmma_split(224, 16, 132, 16), (16, 1));
        // wo: 32 tiles of 16 stages — 4 splits fill 128 SMs.
        assert_eq!(qmma_split(32, 16, 132, 16), (4, 4));
        // One stage, or a tile count that fills the SMs already: no split.
        assert_eq!(qmma_split(8, 1, 132, 16), (1, 1));
        assert_eq!(qmma_split(132, 16, 132, 16), (16, 1));
        // The workspace caps the splits.
        assert_eq!(qmma_split(8, 56, 132, 2).1, 2);
        for tiles in [1, 7, 40, 131, 500] {
            for stages in [1, 3, 16, 56, 112] {
                let (per, splits) = qmma_split(tiles, stages, 132, 16);
                // Every split has work, and together they cover every stage once.
                assert!(per * (splits - 1) < stages && per * splits >= stages, "{tiles} {stages}");
            }
        }
    }

    #[test]
    fn tensor_core_tiles_fit_an_h100s_shared_memory() {
        // 227 KiB opt-in on sm_90; the largest stage is Q6_K's (208 data bytes a row).
        for qt in QuantType::ALL {
            assert!(qmma_smem(qt) <= 227 * 1024 - 1024, "{qt:?}: {}", qmma_smem(qt));
        }
        assert_eq!(qmma_smem(QuantType::Q6_K), 2 * (128 * 208 + 128 * 4 + 64 * 528) + 128 * 528);
    }

    #[test]
    fn lanes_per_row_leave_no_lane_idle_where_a_divisor_allows() {
        // (units a row, lanes): 4096, 14336, 1536, 640, 896 and 4864 values a row.
        for (units, lanes) in [(32, 32), (112, 16), (12, 4), (5, 8), (7, 8), (38, 32), (2, 2), (64, 32)] {
            assert_eq!(k_lanes_per_row(units), lanes, "{units} units");
        }
        for units in 1..=512 {
            let l = k_lanes_per_row(units);
            assert!(l.is_power_of_two() && l <= 32, "{units}: {l}");
            // Never more lanes than the narrow-row rule's, and no idle lanes when it changed.
            assert!(l >= units.min(32) || units % l == 0, "{units}: {l}");
        }
    }
}
