//! [`ModelOps`]: the operations of a llama-family forward pass on one device, around the
//! kernels of `kernels/model.cu` and cuBLAS — embedding, RMSNorm (optionally gathering rows),
//! the fused QKV split with bias, q/k norms, RoPE and query scale, SiLU·mul and GELU·mul, Gemma's
//! post-norms with the residual add and embedding scale, conversions, matrix products, argmax,
//! and synthetic weights. Attention and the cache write are [`crate::DecodeAttention`]
//! and [`crate::DevicePages`].
//!
//! Matrices ([`DeviceMatrix`]) are row-major `[rows, cols]` in a [`DType`]: bf16 (the default:
//! half the bytes a decode step streams) or f32 (exact products, for comparisons with the CPU).
//! A product's input has the weights' type and its output is f32
//! ([`ModelOps::matmul`]: `out [n, rows] (+)= x [n, cols] · Wᵀ`, f32 accumulation), so the
//! residual stream, q/k/v and logits stay f32 and a residual add is the product's `beta = 1`.
//! Decode steps (≤ [`GEMV_MAX_N`] token rows, bf16 weights) use [`ModelOps::gemv`] instead: one
//! launch that computes the op before the product (RMSNorm, SiLU·mul, GELU·mul, conversion) once
//! per block and streams the weights once ([`GemvShape`], from the device's tuning, picks the
//! kernel; the split kernel is the default and a programmatic dependent launch, as is
//! [`ModelOps::qkv_rope`] after it).

use std::sync::Arc;

use cudarc::cublas::{result as blas, sys as blas_sys, CudaBlas};
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};

use crate::device::{arg, launch_err, launch_kernel, product_smem_limit, set_max_dynamic_smem, CudaDevice};
use crate::matrix::{DType, DeviceMatrix};
use crate::pages::dptr;
use crate::qmatrix::{QuantMatrix, QuantOps};
use crate::rope::{QkvRope, RopeArgs, RopeParams};
use crate::spec::ModuleSpec;
use crate::tuning::{GemvShape, GEMV_ROWS_PER_WARP};
use crate::CudaError;

/// What [`ModelOps::gemv`] does to its input before the product (fused into the same launch).
#[derive(Clone, Copy)]
pub enum Prologue<'a> {
    /// `x [n, cols]` f32, rounded to bf16 (the attention output).
    Convert,
    /// RMSNorm of `x` rows with weights `w [cols]` (the residual stream before a block, or the
    /// logit rows before the output product).
    RmsNorm { w: &'a CudaSlice<f32>, eps: f32 },
    /// `silu(x[:, :cols]) · x[:, cols:]` of `x [n, 2·cols]` f32 (the MLP's gate|up product).
    SiluMul,
    /// `gelu(x[:, :cols]) · x[:, cols:]` of `x [n, 2·cols]` f32, GELU's tanh approximation in f32
    /// (Gemma's GeGLU).
    GeluMul,
}

impl Prologue<'_> {
    /// The kernels' `mode` argument, the norm weights' address (0 without) and epsilon.
    pub(crate) fn mode(&self, device: &CudaDevice) -> (u32, u64, f32) {
        match *self {
            Prologue::Convert => (0, 0, 0.0),
            Prologue::RmsNorm { w, eps } => (1, dptr(w, device), eps),
            Prologue::SiluMul => (2, 0, 0.0),
            Prologue::GeluMul => (3, 0, 0.0),
        }
    }

    /// Input values per token row for a product of `cols` columns (the gated ones read gate|up).
    pub(crate) fn in_width(&self, cols: usize) -> usize {
        match self {
            Prologue::SiluMul | Prologue::GeluMul => 2 * cols,
            _ => cols,
        }
    }
}

/// Most token rows [`ModelOps::gemv`] serves.
pub const GEMV_MAX_N: usize = 4;

/// 16-byte words one item of the split product covers in a row (`GEMV_SLICE` in
/// `kernels/model.cu`: 32 lanes × 8 loads).
const GEMV_SLICE_WORDS: usize = 256;

/// Loaded kernels of one dtype.
struct Typed {
    embed: CudaFunction,
    rms_norm: CudaFunction,
    silu_mul: CudaFunction,
    gelu_mul: CudaFunction,
    convert: CudaFunction,
    fill: CudaFunction,
}

/// Most slices the argmax splits a logit row into (`pk_argmax_part`'s blocks a row), the fewest
/// values a slice holds, and the rows one pair of argmax launches serves.
const ARGMAX_PARTS: usize = 128;
const ARGMAX_MIN_SPAN: usize = 1024;
const ARGMAX_ROWS: usize = 64;

/// The model kernels and a cuBLAS handle on one device's stream.
pub struct ModelOps {
    device: Arc<CudaDevice>,
    blas: CudaBlas,
    bf16: Typed,
    f32: Typed,
    qkv_rope: CudaFunction,
    rms_norm_add: CudaFunction,
    scale: CudaFunction,
    /// `[rows per warp index][n - 1]` the earlier decode products for 1..=GEMV_MAX_N token rows
    /// and [`GEMV_ROWS_PER_WARP`] rows per warp.
    gemv: Vec<Vec<CudaFunction>>,
    /// `[warps index][n - 1]` the split decode products for [`GemvShape::SPLIT_WARPS`].
    gemv_split: Vec<Vec<CudaFunction>>,
    gemv_shape: GemvShape,
    argmax_part: CudaFunction,
    argmax: CudaFunction,
    /// `[ARGMAX_ROWS, ARGMAX_PARTS, 2]` the argmax's best (value bits, index) of each slice.
    argmax_parts: CudaSlice<u32>,
    read_sum: CudaFunction,
    /// `[4]` sink of the read kernel.
    sink: CudaSlice<u32>,
    /// Products with GGUF-quantized weights.
    quant: QuantOps,
}

impl ModelOps {
    /// Loads (compiling on first use) the model kernels and opens cuBLAS on `device`'s stream.
    pub fn new(device: Arc<CudaDevice>) -> Result<ModelOps, CudaError> {
        // SAFETY: only tries to dlopen the library.
        if !unsafe { blas_sys::is_culib_present() } {
            return Err(CudaError::Unsupported(
                "cuBLAS not found: libcublas.so could not be loaded (add the CUDA toolkit's lib64 to LD_LIBRARY_PATH)"
                    .into(),
            ));
        }
        let module = device.module(&ModuleSpec::Model)?;
        let typed = |t: DType| -> Result<Typed, CudaError> {
            let f = |n: &str| module.function(&format!("pk_{n}_{}", t.suffix()));
            Ok(Typed {
                embed: f("embed")?,
                rms_norm: f("rms_norm")?,
                silu_mul: f("silu_mul")?,
                gelu_mul: f("gelu_mul")?,
                convert: f("convert")?,
                fill: f("fill_uniform")?,
            })
        };
        let blas = CudaBlas::new(device.stream().clone())
            .map_err(|e| CudaError::Driver { op: "cublasCreate", msg: format!("{e:?}") })?;
        let sink = device.stream().alloc_zeros::<u32>(4).map_err(|e| CudaError::driver("cuMemAlloc", e))?;
        device.bind()?;
        // Every product kernel may take the device's whole opt-in shared memory.
        let product = |name: String| -> Result<CudaFunction, CudaError> {
            let f = module.function(&name)?;
            set_max_dynamic_smem(&f, product_smem_limit(&device))?;
            Ok(f)
        };
        let gemv = GEMV_ROWS_PER_WARP
            .iter()
            .map(|r| (1..=GEMV_MAX_N).map(|n| product(format!("pk_gemv_bf16_n{n}_r{r}"))).collect())
            .collect::<Result<Vec<Vec<_>>, _>>()?;
        let gemv_split = GemvShape::SPLIT_WARPS
            .iter()
            .map(|w| (1..=GEMV_MAX_N).map(|n| product(format!("pk_gemv_split_bf16_n{n}_w{w}"))).collect())
            .collect::<Result<Vec<Vec<_>>, _>>()?;
        Ok(ModelOps {
            gemv,
            gemv_split,
            gemv_shape: device.tuning().gemv,
            bf16: typed(DType::Bf16)?,
            f32: typed(DType::F32)?,
            qkv_rope: module.function("pk_qkv_rope")?,
            rms_norm_add: module.function("pk_rms_norm_add")?,
            scale: module.function("pk_scale")?,
            argmax_part: module.function("pk_argmax_part")?,
            argmax: module.function("pk_argmax")?,
            argmax_parts: device
                .stream()
                .alloc_zeros::<u32>(ARGMAX_ROWS * ARGMAX_PARTS * 2)
                .map_err(|e| CudaError::driver("cuMemAlloc", e))?,
            read_sum: module.function("pk_read_sum")?,
            quant: QuantOps::new(device.clone())?,
            blas,
            sink,
            device,
        })
    }

    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// The kernels for GGUF-quantized weights.
    pub fn quant(&self) -> &QuantOps {
        &self.quant
    }

    fn typed(&self, t: DType) -> &Typed {
        match t {
            DType::Bf16 => &self.bf16,
            DType::F32 => &self.f32,
        }
    }

    /// A grid-stride launch over `n` elements.
    fn stride_cfg(&self, n: usize) -> LaunchConfig {
        let blocks = n.div_ceil(256).clamp(1, 8 * self.device.sm_count().max(1));
        LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
    }

    fn p<T>(&self, s: &CudaSlice<T>) -> u64 {
        dptr(s, &self.device)
    }

    /// `out [n, h]` f32 ← rows `tokens [n]` of `table [vocab, h]`. Token ids must be < vocab
    /// (the caller validates them).
    pub fn embed(
        &self,
        out: &mut CudaSlice<f32>,
        table: &DeviceMatrix,
        tokens: &CudaSlice<u32>,
        n: usize,
    ) -> Result<(), CudaError> {
        let h = table.cols;
        if out.len() < n * h || tokens.len() < n {
            return Err(CudaError::Invalid(format!("embed of {n} tokens: out {}, tokens {}", out.len(), tokens.len())));
        }
        if n == 0 {
            return Ok(());
        }
        let f = &self.typed(table.dtype).embed;
        let (o, t, k, h32) = (self.p(out), table.ptr(&self.device), self.p(tokens), h as u32);
        let mut b = self.device.stream().launch_builder(f);
        b.arg(&o).arg(&t).arg(&k).arg(&h32);
        let cfg = LaunchConfig { grid_dim: (n as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: pk_embed_T(float*, const T*, const u32*, u32); sizes checked above.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(launch_err("cuLaunchKernel(pk_embed)"))
    }

    /// `out [n, h]` (out's dtype) ← RMSNorm of `x` rows (`rows [n]` picks them when given, else
    /// rows `0..n`) with weights `w [h]`.
    pub fn rms_norm(
        &self,
        out: &mut DeviceMatrix,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        rows: Option<&CudaSlice<u32>>,
        n: usize,
        eps: f32,
    ) -> Result<(), CudaError> {
        let h = out.cols;
        if w.len() < h || out.rows < n || (rows.is_none() && x.len() < n * h) || rows.is_some_and(|r| r.len() < n) {
            return Err(CudaError::Invalid(format!("rms_norm of {n} rows of {h}")));
        }
        if n == 0 {
            return Ok(());
        }
        let f = &self.typed(out.dtype).rms_norm;
        let (o, xp, wp, rp, h32) =
            (out.ptr(&self.device), self.p(x), self.p(w), rows.map_or(0, |r| self.p(r)), h as u32);
        let mut b = self.device.stream().launch_builder(f);
        b.arg(&o).arg(&xp).arg(&wp).arg(&rp).arg(&h32).arg(&eps);
        // One block per row: 1024 threads keep more of the row's loads in flight.
        let cfg = LaunchConfig { grid_dim: (n as u32, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: pk_rms_norm_T(T*, const float*, const float*, const u32*, u32, float); gathered row
        // ids are < x's rows (the caller's contract).
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(launch_err("cuLaunchKernel(pk_rms_norm)"))
    }

    /// Splits the fused QKV product of `n` tokens into `q [n, nh, d]`, `k`, `v [n, nkv, d]`,
    /// adding the bias, applying the q/k norms and RoPE, rounding q (see `kernels/model.cu`).
    pub fn qkv_rope(
        &self,
        q: &mut CudaSlice<f32>,
        k: &mut CudaSlice<f32>,
        v: &mut CudaSlice<f32>,
        a: &QkvRope,
        p: &RopeParams,
        n: usize,
    ) -> Result<(), CudaError> {
        let (nh, nkv, d) = (p.num_heads, p.num_kv_heads, p.head_dim);
        let r = RopeArgs::new(&self.device, a, p, q, n, "qkv_rope")?;
        if k.len() < n * nkv * d || v.len() < n * nkv * d {
            return Err(CudaError::Invalid(format!("qkv_rope of {n} tokens: k or v shorter than [{n}, {nkv}, {d}]")));
        }
        if n == 0 {
            return Ok(());
        }
        let (qp, kp, vp) = (self.p(q), self.p(k), self.p(v));
        let cfg = LaunchConfig {
            grid_dim: (n as u32, (nh + 2 * nkv) as u32, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: (4 * (d + p.rope_dims)) as u32,
        };
        // With programmatic launches pk_qkv_rope waits for the product before it in-kernel
        // (pdl_wait).
        let mut args = [std::ptr::null_mut(); 20];
        args[..4].copy_from_slice(&[arg(&qp), arg(&kp), arg(&vp), arg(r.head_dim())]);
        args[4..].copy_from_slice(&r.tail());
        // SAFETY: `args` points at pk_qkv_rope's parameters, in order, of their types, alive for
        // the call (`r`'s fields); sizes checked above.
        unsafe { launch_kernel(&self.device, &self.qkv_rope, cfg, &mut args, self.gemv_shape.pdl) }
            .map_err(launch_err("cuLaunchKernelEx(pk_qkv_rope)"))
    }

    /// `out [n, f]` (out's dtype) ← `silu(gu[:, :f]) · gu[:, f:]`, `gu [n, 2f]` f32.
    pub fn silu_mul(&self, out: &mut DeviceMatrix, gu: &CudaSlice<f32>, n: usize) -> Result<(), CudaError> {
        let func = &self.typed(out.dtype).silu_mul;
        self.gated_mul(func, ("silu_mul", "cuLaunchKernel(pk_silu_mul)"), out, gu, n)
    }

    /// `out [n, f]` (out's dtype) ← `gelu(gu[:, :f]) · gu[:, f:]`, `gu [n, 2f]` f32, GELU's tanh
    /// approximation in f32 (Gemma's GeGLU).
    pub fn gelu_mul(&self, out: &mut DeviceMatrix, gu: &CudaSlice<f32>, n: usize) -> Result<(), CudaError> {
        let func = &self.typed(out.dtype).gelu_mul;
        self.gated_mul(func, ("gelu_mul", "cuLaunchKernel(pk_gelu_mul)"), out, gu, n)
    }

    /// Launches a gated activation kernel `func(T* out, const float* gu, u32 f, u32 n)`:
    /// `out [n, f] ← act(gu[:, :f]) · gu[:, f:]`; `names` are the op's and its launch's, for errors.
    fn gated_mul(
        &self,
        func: &CudaFunction,
        (name, launch): (&str, &'static str),
        out: &mut DeviceMatrix,
        gu: &CudaSlice<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        let f = out.cols;
        if out.rows < n || gu.len() < n * 2 * f {
            return Err(CudaError::Invalid(format!("{name} of {n} rows of {f}")));
        }
        if n == 0 {
            return Ok(());
        }
        let (o, g, f32_, n32) = (out.ptr(&self.device), self.p(gu), f as u32, n as u32);
        let mut b = self.device.stream().launch_builder(func);
        b.arg(&o).arg(&g).arg(&f32_).arg(&n32);
        // SAFETY: both gated kernels take (T*, const float*, u32, u32); sizes checked above.
        unsafe { b.launch(self.stride_cfg(n * f)) }.map(|_| ()).map_err(launch_err(launch))
    }

    /// `x [n, h] += rms_norm(y) · w` per row, `y [n, h]` f32, `w [h]`: Gemma 3's norm of a block's
    /// output before the residual add, in one pass. `x` and `y` must not overlap.
    pub fn rms_norm_add(
        &self,
        x: &mut CudaSlice<f32>,
        y: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        n: usize,
        h: usize,
        eps: f32,
    ) -> Result<(), CudaError> {
        if x.len() < n * h || y.len() < n * h || w.len() < h || h > u32::MAX as usize {
            return Err(CudaError::Invalid(format!("rms_norm_add of {n} rows of {h}")));
        }
        if n == 0 || h == 0 {
            return Ok(());
        }
        let (xp, yp, wp, h32) = (self.p(x), self.p(y), self.p(w), h as u32);
        let mut b = self.device.stream().launch_builder(&self.rms_norm_add);
        b.arg(&xp).arg(&yp).arg(&wp).arg(&h32).arg(&eps);
        let cfg = LaunchConfig { grid_dim: (n as u32, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: pk_rms_norm_add(float*, const float*, const float*, u32, float); sizes checked
        // above; the caller keeps x and y apart.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(launch_err("cuLaunchKernel(pk_rms_norm_add)"))
    }

    /// The first `len` elements of `x` multiplied by `s` (f32; Gemma's embedding scale).
    pub fn scale(&self, x: &mut CudaSlice<f32>, len: usize, s: f32) -> Result<(), CudaError> {
        if x.len() < len {
            return Err(CudaError::Invalid(format!("scale of {len} values ({} held)", x.len())));
        }
        if len == 0 {
            return Ok(());
        }
        let (xp, n) = (self.p(x), len as u64);
        let mut b = self.device.stream().launch_builder(&self.scale);
        b.arg(&xp).arg(&n).arg(&s);
        // SAFETY: pk_scale(float*, u64, float); size checked above.
        unsafe { b.launch(self.stride_cfg(len)) }.map(|_| ()).map_err(launch_err("cuLaunchKernel(pk_scale)"))
    }

    /// The first `len` elements of `out` ← `x` (f32) in out's dtype.
    pub fn convert(&self, out: &mut DeviceMatrix, x: &CudaSlice<f32>, len: usize) -> Result<(), CudaError> {
        if out.rows * out.cols < len || x.len() < len {
            return Err(CudaError::Invalid(format!("convert of {len} values")));
        }
        if len == 0 {
            return Ok(());
        }
        let f = &self.typed(out.dtype).convert;
        let (o, xp, n) = (out.ptr(&self.device), self.p(x), len as u64);
        let mut b = self.device.stream().launch_builder(f);
        b.arg(&o).arg(&xp).arg(&n);
        // SAFETY: pk_convert_T(T*, const float*, u64); sizes checked above.
        unsafe { b.launch(self.stride_cfg(len)) }.map(|_| ()).map_err(launch_err("cuLaunchKernel(pk_convert)"))
    }

    /// `out [n, w.rows] = x [n, w.cols] · wᵀ`, or `+=` with `accumulate` (f32 accumulation,
    /// f32 output; x and w of the same dtype).
    pub fn matmul(
        &self,
        out: &mut CudaSlice<f32>,
        x: &DeviceMatrix,
        w: &DeviceMatrix,
        n: usize,
        accumulate: bool,
    ) -> Result<(), CudaError> {
        self.matmul_cols(out, 0, w.rows, x, w, w.rows, n, accumulate)
    }

    /// Columns `col..col + w_rows` of `out [n, ldo]` (+)= `x [n, w.cols] · w[..w_rows]ᵀ`: the
    /// product with the first `w_rows` rows of `w` (a tile of a larger matrix) written into its
    /// place in a wider output.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_cols(
        &self,
        out: &CudaSlice<f32>,
        col: usize,
        ldo: usize,
        x: &DeviceMatrix,
        w: &DeviceMatrix,
        w_rows: usize,
        n: usize,
        accumulate: bool,
    ) -> Result<(), CudaError> {
        let fits = w_rows <= w.rows && col + w_rows <= ldo && (n == 0 || out.len() >= (n - 1) * ldo + col + w_rows);
        if x.dtype != w.dtype || x.cols != w.cols || x.rows < n || !fits {
            return Err(CudaError::Invalid(format!(
                "matmul [{n}, {}] ({}) · [{w_rows} of {}, {}]ᵀ ({}) into columns {col}.. of [{n}, {ldo}] ({} values)",
                x.cols,
                x.dtype.name(),
                w.rows,
                w.cols,
                w.dtype.name(),
                out.len()
            )));
        }
        if n == 0 || w_rows == 0 {
            return Ok(());
        }
        let too_big = |v: usize| v > i32::MAX as usize;
        if too_big(n) || too_big(ldo) || too_big(w.cols) {
            return Err(CudaError::Unsupported("matrix dimension beyond i32".into()));
        }
        let (alpha, beta) = (1.0f32, if accumulate { 1.0f32 } else { 0.0f32 });
        let (wp, xp, op) = (w.ptr(&self.device), x.ptr(&self.device), self.p(out) + 4 * col as u64);
        // Column-major view: C [w_rows × n] (leading dimension ldo) = (W as [cols × w_rows])ᵀ ·
        // (x as [cols × n]).
        // SAFETY: pointers are live device buffers of the checked sizes on the handle's stream.
        unsafe {
            blas::gemm_ex(
                *self.blas.handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                w_rows as i32,
                n as i32,
                w.cols as i32,
                (&alpha) as *const f32 as *const _,
                wp as *const _,
                w.dtype.cuda(),
                w.cols as i32,
                xp as *const _,
                x.dtype.cuda(),
                x.cols as i32,
                (&beta) as *const f32 as *const _,
                op as *mut _,
                blas_sys::cudaDataType::CUDA_R_32F,
                ldo as i32,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| CudaError::Driver { op: "cublasGemmEx", msg: format!("{e:?}") })
    }

    /// The launch shape of [`Self::gemv`] (default: the device's tuning, `CudaTuning::gemv`).
    pub fn set_gemv_shape(&mut self, shape: GemvShape) {
        self.gemv_shape = shape;
    }

    pub fn gemv_shape(&self) -> GemvShape {
        self.gemv_shape
    }

    /// Whether [`Self::gemv`] serves `n` token rows against `w`: bf16 weights, columns a multiple
    /// of 8, `n ≤ GEMV_MAX_N`, and the kernel's shared memory (the bf16 input, and the split
    /// kernel's partial sums) fits.
    pub fn gemv_serves(&self, w: &DeviceMatrix, n: usize) -> bool {
        w.dtype == DType::Bf16
            && w.cols.is_multiple_of(8)
            && w.rows >= 1
            && w.rows <= u32::MAX as usize
            && w.cols <= u32::MAX as usize
            && (1..=GEMV_MAX_N).contains(&n)
            && self.gemv_launch(w, n).2 <= product_smem_limit(&self.device)
    }

    /// `(kernel, grid blocks, dynamic shared memory bytes)` of the product of `n` token rows
    /// against `w` (`w.rows ≥ 1`, `1 ≤ n ≤ GEMV_MAX_N`) with the current shape.
    fn gemv_launch(&self, w: &DeviceMatrix, n: usize) -> (&CudaFunction, usize, usize) {
        debug_assert!(w.rows >= 1 && (1..=GEMV_MAX_N).contains(&n));
        let shape = self.gemv_shape;
        let sms = self.device.sm_count().max(1);
        match shape.split_warps {
            Some(warps) => {
                let wi = GemvShape::SPLIT_WARPS.iter().position(|&v| v == warps).unwrap_or(1);
                // Rows split evenly over at most `blocks_per_sm` blocks per SM; each block keeps
                // [its rows, slices, n] partial sums besides x' [n, cols] bf16.
                let blocks = w.rows.clamp(1, shape.blocks_per_sm * sms);
                let slices = (w.cols / 8).div_ceil(GEMV_SLICE_WORDS);
                let smem = n * w.cols * 2 + w.rows.div_ceil(blocks) * slices * n * 4;
                (&self.gemv_split[wi][n - 1], blocks, smem)
            }
            None => {
                let ri = GEMV_ROWS_PER_WARP.iter().position(|&r| r == shape.rows_per_warp).unwrap_or(0);
                // Groups of `rows_per_warp` rows, 8 warps per block, at most `blocks_per_sm`
                // blocks per SM (each repeats the prologue).
                let groups = w.rows.div_ceil(GEMV_ROWS_PER_WARP[ri] * 8);
                let blocks = groups.clamp(1, shape.blocks_per_sm * sms);
                (&self.gemv[ri][n - 1], blocks, n * w.cols * 2)
            }
        }
    }

    /// The decode product: `out [n, w.rows] (+)= x' [n, w.cols] · wᵀ` with `x'` the bf16 result of
    /// `prologue` on `x` (rows `rows [n]` of `x` when given, else `0..n`), f32 accumulation, in
    /// one launch that streams the weights once (see `kernels/model.cu`). The caller checks
    /// [`Self::gemv_serves`] first; `out` must not overlap `x`.
    #[allow(clippy::too_many_arguments)]
    pub fn gemv(
        &self,
        out: &mut CudaSlice<f32>,
        x: &CudaSlice<f32>,
        w: &DeviceMatrix,
        prologue: Prologue,
        rows: Option<&CudaSlice<u32>>,
        n: usize,
        accumulate: bool,
    ) -> Result<(), CudaError> {
        self.gemv_rows(out, x, w, prologue, rows, 0, n, accumulate)
    }

    /// [`Self::gemv`] for token rows `first..first + n`: rows `first..first + n` of
    /// `out [·, w.rows]` (+)= `x' · wᵀ`, with `x'` the prologue of rows `rows[first..first + n]`
    /// of `x` when given, else rows `first..first + n`. Each output row is summed in the same
    /// order whatever `n` and `first` are (the row split over blocks depends on `w` alone).
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_rows(
        &self,
        out: &mut CudaSlice<f32>,
        x: &CudaSlice<f32>,
        w: &DeviceMatrix,
        prologue: Prologue,
        rows: Option<&CudaSlice<u32>>,
        first: usize,
        n: usize,
        accumulate: bool,
    ) -> Result<(), CudaError> {
        let in_width = prologue.in_width(w.cols);
        let end = first + n;
        let bad = !self.gemv_serves(w, n)
            || out.len() < end * w.rows
            || (rows.is_none() && x.len() < end * in_width)
            || rows.is_some_and(|r| r.len() < end)
            || matches!(prologue, Prologue::RmsNorm { w: nw, .. } if nw.len() < w.cols);
        if bad {
            return Err(CudaError::Invalid(format!("gemv of rows {first}..{end} against [{}, {}]", w.rows, w.cols)));
        }
        let (mode, nw, eps) = prologue.mode(&self.device);
        let y = self.p(out) + 4 * (first * w.rows) as u64;
        // Gathered rows start at rows[first]; otherwise x starts at row `first`.
        let (xp, rp) = match rows {
            Some(r) => (self.p(x), self.p(r) + 4 * first as u64),
            None => (self.p(x) + 4 * (first * in_width) as u64, 0),
        };
        let wp = w.ptr(&self.device);
        // The split kernel's prologue reads x and the norm weights 16 bytes at a time (device
        // allocations are 256-byte aligned; this guards against views).
        if !xp.is_multiple_of(16) || !nw.is_multiple_of(16) || !wp.is_multiple_of(16) {
            return Err(CudaError::Invalid("gemv: x, the norm weights and W must be 16-byte aligned".into()));
        }
        let (r32, c32, acc) = (w.rows as u32, w.cols as u32, accumulate as u32);
        let (f, blocks, smem) = self.gemv_launch(w, n);
        let threads = self.gemv_shape.split_warps.unwrap_or(8) * 32;
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let mut args: [*mut std::ffi::c_void; 10] =
            [arg(&y), arg(&wp), arg(&xp), arg(&nw), arg(&rp), arg(&r32), arg(&c32), arg(&mode), arg(&eps), arg(&acc)];
        // SAFETY: `args` points at the parameters of pk_gemv_bf16_nN_rR / pk_gemv_split_bf16_nN_wW,
        // in order, of their types, alive for the call; sizes checked above; the caller keeps out
        // and x apart and gathered row ids in range. A programmatic launch (the split kernel's)
        // waits for the previous kernel (pdl_wait) before it reads x or y.
        let programmatic = self.gemv_shape.split_warps.is_some() && self.gemv_shape.pdl;
        unsafe { launch_kernel(&self.device, f, cfg, &mut args, programmatic) }
            .map_err(launch_err("cuLaunchKernelEx(pk_gemv_bf16)"))
    }

    /// `ids [rows]` ← argmax of each row of `logits [rows, vocab]` (first maximum, NaN skipped).
    pub fn argmax(
        &self,
        ids: &mut CudaSlice<u32>,
        logits: &CudaSlice<f32>,
        rows: usize,
        vocab: usize,
    ) -> Result<(), CudaError> {
        if ids.len() < rows || logits.len() < rows * vocab || vocab == 0 {
            return Err(CudaError::Invalid(format!("argmax of {rows} rows of {vocab}")));
        }
        let span = vocab.div_ceil(ARGMAX_PARTS).max(ARGMAX_MIN_SPAN);
        let parts = vocab.div_ceil(span);
        let (v, s, np, pp) = (vocab as u32, span as u32, parts as u32, self.p(&self.argmax_parts));
        // ARGMAX_ROWS rows at a time: the slices' buffer holds that many.
        for r0 in (0..rows).step_by(ARGMAX_ROWS) {
            let n = (rows - r0).min(ARGMAX_ROWS);
            let (i, l) = (self.p(ids) + 4 * r0 as u64, self.p(logits) + 4 * (r0 * vocab) as u64);
            let mut b = self.device.stream().launch_builder(&self.argmax_part);
            b.arg(&pp).arg(&l).arg(&v).arg(&s);
            let cfg = LaunchConfig { grid_dim: (np, n as u32, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: pk_argmax_part(u32*, const float*, u32, u32) over rows r0.. of logits
            // (sizes checked above) into [n, parts, 2] of the slices' buffer (n ≤ ARGMAX_ROWS,
            // parts ≤ ARGMAX_PARTS).
            unsafe { b.launch(cfg) }.map_err(launch_err("cuLaunchKernel(pk_argmax_part)"))?;
            let mut b = self.device.stream().launch_builder(&self.argmax);
            b.arg(&i).arg(&pp).arg(&np);
            let cfg = LaunchConfig { grid_dim: (n as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: pk_argmax(u32*, const u32*, u32): ids r0..r0 + n, the slices just written.
            unsafe { b.launch(cfg) }.map_err(launch_err("cuLaunchKernel(pk_argmax)"))?;
        }
        Ok(())
    }

    /// Fills `m` with uniform values in `[-scale, scale)` from `seed` (synthetic weights).
    pub fn fill_uniform(&self, m: &mut DeviceMatrix, scale: f32, seed: u32) -> Result<(), CudaError> {
        let n = m.rows * m.cols;
        if n == 0 {
            return Ok(());
        }
        let f = &self.typed(m.dtype).fill;
        let (p, n64) = (m.ptr(&self.device), n as u64);
        let mut b = self.device.stream().launch_builder(f);
        b.arg(&p).arg(&n64).arg(&scale).arg(&seed);
        // SAFETY: pk_fill_uniform_T(T*, u64, float, u32) over the matrix's elements.
        unsafe { b.launch(self.stride_cfg(n)) }.map(|_| ()).map_err(launch_err("cuLaunchKernel(pk_fill_uniform)"))
    }

    /// Reads every byte of `mats` and `quant` once (16-byte loads, one launch per buffer): the
    /// weight traffic of one decode step with nothing computed. Queued on the stream; time it
    /// around a synchronize.
    pub fn read_all(&self, mats: &[&DeviceMatrix], quant: &[&QuantMatrix]) -> Result<(), CudaError> {
        let sink = self.p(&self.sink);
        let buffers = mats
            .iter()
            .map(|m| (m.ptr(&self.device), m.bytes()))
            .chain(quant.iter().flat_map(|q| q.buffers(&self.device)));
        for (p, bytes) in buffers {
            let words = (bytes / 16) as u64;
            if words == 0 {
                continue;
            }
            let mut b = self.device.stream().launch_builder(&self.read_sum);
            b.arg(&p).arg(&words).arg(&sink);
            let blocks = 4 * self.device.sm_count().max(1);
            let cfg = LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (512, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: pk_read_sum(const uint4*, u64, u32*) over the buffer's whole 16-byte words
            // (allocations are 256-byte aligned).
            unsafe { b.launch(cfg) }.map_err(launch_err("cuLaunchKernel(pk_read_sum)"))?;
        }
        Ok(())
    }
}
