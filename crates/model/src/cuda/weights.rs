//! The model's weights in device memory ([`Weight`]): each matrix either stays in its GGUF
//! block type ([`GpuWeights::Gguf`], the default, for the types `pagekv_cuda::QuantType` has
//! kernels for) or is dequantized once, at load, to a dense product type (bf16, or f32 for exact
//! comparisons). Matrices that share an input are stacked by rows into one weight
//! (`wq|wk|wv`, `w_gate|w_up`): one dense matrix, or quantized parts of possibly different
//! types. Or random weights of a model's shape generated on the device
//! ([`DeviceWeights::synthetic`], dense or in Q4_K_M's mix of types).

use pagekv_cpu::quant::dequantize_row;
use pagekv_cuda::{CudaDevice, DType, DeviceMatrix, DeviceVec as Slice, ModelOps, QuantMatrix, QuantType};

use super::buffers::{dev, upload_f32};
use crate::error::ModelError;
use crate::llama::weights::{Tensor, Weights};
use crate::llama::ModelConfig;

/// How a loaded model's weight matrices go to the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuWeights {
    /// In their GGUF block type where the GPU has kernels for it (`pagekv_cuda::QuantType`),
    /// bf16 otherwise; products in bf16 / int8 with f32 accumulation.
    Gguf,
    /// Every matrix dequantized to one dense type.
    Dense(DType),
}

impl From<DType> for GpuWeights {
    fn from(d: DType) -> Self {
        GpuWeights::Dense(d)
    }
}

impl GpuWeights {
    /// `gguf`, `bf16` or `f32`; anything else is an error naming the accepted values.
    pub fn parse(s: &str) -> Result<GpuWeights, ModelError> {
        match s {
            "gguf" => Ok(GpuWeights::Gguf),
            "bf16" => Ok(GpuWeights::Dense(DType::Bf16)),
            "f32" => Ok(GpuWeights::Dense(DType::F32)),
            _ => Err(ModelError::Device(format!("weight format {s:?}: accepted values are gguf, bf16, f32"))),
        }
    }

    /// The type of the products' dense inputs (activations, dequantized tiles).
    pub fn product_type(self) -> DType {
        match self {
            GpuWeights::Gguf => DType::Bf16,
            GpuWeights::Dense(d) => d,
        }
    }
}

/// One weight on the device, `[rows, cols]` as multiplied (`out = x · Wᵀ`): a dense matrix in
/// the product type, or GGUF blocks in parts stacked by rows (each part of one type).
pub(crate) enum Weight {
    Dense(DeviceMatrix),
    Quant(Vec<QuantMatrix>),
}

impl Weight {
    pub fn rows(&self) -> usize {
        match self {
            Weight::Dense(m) => m.rows(),
            Weight::Quant(parts) => parts.iter().map(QuantMatrix::rows).sum(),
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Weight::Dense(m) => m.cols(),
            Weight::Quant(parts) => parts[0].cols(),
        }
    }

    /// Bytes a product streams.
    pub fn bytes(&self) -> usize {
        match self {
            Weight::Dense(m) => m.bytes(),
            Weight::Quant(parts) => parts.iter().map(QuantMatrix::bytes).sum(),
        }
    }
}

/// One layer's tensors on the device. Shapes `[rows, cols]` as multiplied (`out = x · Wᵀ`).
pub(crate) struct DeviceLayer {
    pub attn_norm: Slice<f32>,      // [hidden]
    pub wqkv: Weight,               // [q_dim + 2·kv_dim, hidden]
    pub bqkv: Option<Slice<f32>>,   // [q_dim + 2·kv_dim]
    pub q_norm: Option<Slice<f32>>, // [head_dim]
    pub k_norm: Option<Slice<f32>>, // [head_dim]
    pub wo: Weight,                 // [hidden, q_dim]
    /// Gemma 3: RMSNorm weights of the attention output before the residual add.
    pub post_attn_norm: Option<Slice<f32>>, // [hidden]
    pub ffn_norm: Slice<f32>,       // [hidden]
    /// Gemma 3: RMSNorm weights of the MLP output before the residual add.
    pub post_ffn_norm: Option<Slice<f32>>, // [hidden]
    pub w_gate_up: Weight,          // [2·ffn, hidden]
    pub w_down: Weight,             // [hidden, ffn]
}

/// Elements of one bf16 tile that a quantized matrix is dequantized into, a range of rows at a
/// time, for products of more tokens than the matrix-vector kernel serves (64 MiB).
const TILE_ELEMS: usize = 32 << 20;

/// All tensors on the device.
pub(crate) struct DeviceWeights {
    pub token_embd: Weight, // [vocab, hidden]
    /// `[vocab, hidden]`; `None` when tied to the embedding.
    pub output: Option<Weight>,
    pub output_norm: Slice<f32>,          // [hidden]
    pub rope_factors: Option<Slice<f32>>, // [rope_dims / 2]
    pub layers: Vec<DeviceLayer>,
    /// The products' dense input type.
    pub dtype: DType,
    /// bf16 tiles `[rows, cols]`, one per column count of the quantized matrices (none without
    /// them), that [`Weight::Quant`] parts are dequantized into for large products.
    pub tiles: Vec<DeviceMatrix>,
}

impl DeviceWeights {
    /// The output projection (the embedding when tied).
    pub fn output(&self) -> &Weight {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }

    /// The weights one decode step streams, each once.
    pub fn streamed(&self) -> Vec<&Weight> {
        let mut v: Vec<&Weight> = Vec::new();
        for l in &self.layers {
            v.extend([&l.wqkv, &l.wo, &l.w_gate_up, &l.w_down]);
        }
        v.push(self.output());
        v
    }

    /// Bytes one decode step reads from the weights.
    pub fn decode_bytes(&self) -> usize {
        self.streamed().iter().map(|m| m.bytes()).sum()
    }

    /// Whether any matrix is quantized.
    pub fn quantized(&self) -> bool {
        self.streamed().iter().any(|w| matches!(w, Weight::Quant(_)))
    }

    /// The bf16 tile for matrices of `cols` columns.
    pub fn tile(&self, cols: usize) -> Option<&DeviceMatrix> {
        self.tiles.iter().find(|t| t.cols() == cols)
    }

    /// Allocates [`Self::tiles`]: for each column count of a quantized matrix, as many rows as
    /// its largest part has, up to [`TILE_ELEMS`] elements.
    fn make_tiles(&mut self, device: &CudaDevice) -> Result<(), ModelError> {
        let mut need: Vec<(usize, usize)> = Vec::new();
        let all: Vec<&Weight> = self.streamed().into_iter().chain([&self.token_embd]).collect();
        for w in all {
            if let Weight::Quant(parts) = w {
                for p in parts {
                    let rows = p.rows().min((TILE_ELEMS / p.cols()).max(1));
                    match need.iter_mut().find(|(c, _)| *c == p.cols()) {
                        Some((_, r)) => *r = (*r).max(rows),
                        None => need.push((p.cols(), rows)),
                    }
                }
            }
        }
        self.tiles = need
            .into_iter()
            .map(|(cols, rows)| DeviceMatrix::zeros(device, rows, cols, DType::Bf16).map_err(dev))
            .collect::<Result<_, _>>()?;
        Ok(())
    }

    /// Uploads the weights of a loaded GGUF model (`format` says which stay quantized).
    pub fn upload(device: &CudaDevice, w: &Weights, c: &ModelConfig, format: GpuWeights) -> Result<Self, ModelError> {
        let dtype = format.product_type();
        let quant = format == GpuWeights::Gguf;
        let (h, qd, kvd, f) = (c.hidden, c.q_dim(), c.kv_dim(), c.ffn);
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            let bqkv = match (&l.bq, &l.bk, &l.bv) {
                (None, None, None) => None,
                (bq, bk, bv) => {
                    let mut b = Vec::with_capacity(qd + 2 * kvd);
                    for (t, n) in [(bq, qd), (bk, kvd), (bv, kvd)] {
                        match t {
                            Some(t) => b.extend_from_slice(w.f32s(t)),
                            None => b.extend(std::iter::repeat_n(0.0, n)),
                        }
                    }
                    Some(upload_f32(device, &b)?)
                }
            };
            layers.push(DeviceLayer {
                attn_norm: upload_f32(device, w.f32s(&l.attn_norm))?,
                wqkv: weight(device, w, &[&l.wq, &l.wk, &l.wv], dtype, quant)?,
                bqkv,
                q_norm: l.q_norm.as_ref().map(|t| upload_f32(device, &dense(w, t)?)).transpose()?,
                k_norm: l.k_norm.as_ref().map(|t| upload_f32(device, &dense(w, t)?)).transpose()?,
                wo: weight(device, w, &[&l.wo], dtype, quant)?,
                post_attn_norm: l.post_attn_norm.as_ref().map(|t| upload_f32(device, w.f32s(t))).transpose()?,
                ffn_norm: upload_f32(device, w.f32s(&l.ffn_norm))?,
                post_ffn_norm: l.post_ffn_norm.as_ref().map(|t| upload_f32(device, w.f32s(t))).transpose()?,
                w_gate_up: weight(device, w, &[&l.w_gate, &l.w_up], dtype, quant)?,
                w_down: weight(device, w, &[&l.w_down], dtype, quant)?,
            });
        }
        debug_assert!(layers.iter().all(|l| l.wqkv.rows() == qd + 2 * kvd && l.w_gate_up.rows() == 2 * f));
        let token_embd = weight(device, w, &[&w.token_embd], dtype, quant)?;
        let output = if w.tied_embeddings { None } else { Some(weight(device, w, &[&w.output], dtype, quant)?) };
        debug_assert_eq!(token_embd.cols(), h);
        let mut weights = DeviceWeights {
            token_embd,
            output,
            output_norm: upload_f32(device, &dense(w, &w.output_norm)?)?,
            rope_factors: w.rope_freqs.as_ref().map(|t| upload_f32(device, &dense(w, t)?)).transpose()?,
            layers,
            dtype,
            tiles: Vec::new(),
        };
        weights.make_tiles(device)?;
        Ok(weights)
    }

    /// Random weights of `c`'s shape generated on the device: values uniform in about
    /// `±1/sqrt(cols)` (activations stay of order one through the layers), norms 1, tied output
    /// when `tied`. Dense in `dtype`, or with `q4km` in the types llama.cpp's Q4_K_M preset
    /// gives each matrix (Q4_K; Q6_K for the output and, in the layers it favours, `attn_v` and
    /// `ffn_down`; the embedding Q4_K; rows too narrow for a K-quant's 256-value blocks take
    /// llama.cpp's fallback, `q4km_fallback`). For throughput measurements only — not a model.
    #[allow(clippy::too_many_arguments)]
    pub fn synthetic(
        device: &CudaDevice,
        ops: &ModelOps,
        c: &ModelConfig,
        dtype: DType,
        tied: bool,
        q4km: bool,
        seed: u32,
    ) -> Result<Self, ModelError> {
        let (h, qd, kvd, f) = (c.hidden, c.q_dim(), c.kv_dim(), c.ffn);
        let dtype = if q4km { DType::Bf16 } else { dtype };
        let mut n = 0u32;
        let mut random = |parts: &[(usize, QuantType)], cols: usize| -> Result<Weight, ModelError> {
            let scale = 1.0 / (cols as f32).sqrt();
            let rows: usize = parts.iter().map(|p| p.0).sum();
            n += 1;
            let s = seed.wrapping_mul(7919).wrapping_add(n);
            if !q4km {
                let mut m = DeviceMatrix::zeros(device, rows, cols, dtype).map_err(dev)?;
                ops.fill_uniform(&mut m, scale, s).map_err(dev)?;
                return Ok(Weight::Dense(m));
            }
            let mut out: Vec<QuantMatrix> = Vec::new();
            for (i, &(r, qt)) in q4km_parts(parts, cols).iter().enumerate() {
                let mut m = QuantMatrix::zeros(device, qt, r, cols).map_err(dev)?;
                ops.quant().fill_random(&mut m, scale, s.wrapping_add(1000 * i as u32)).map_err(dev)?;
                out.push(m);
            }
            Ok(Weight::Quant(out))
        };
        let ones = |len: usize| upload_f32(device, &vec![1.0f32; len]);
        let (q4, q6) = (QuantType::Q4_K, QuantType::Q6_K);
        let mut layers = Vec::with_capacity(c.num_layers);
        for li in 0..c.num_layers {
            let more = q4km_more_bits(li, c.num_layers);
            let wide = if more { q6 } else { q4 };
            layers.push(DeviceLayer {
                attn_norm: ones(h)?,
                wqkv: random(&[(qd + kvd, q4), (kvd, wide)], h)?,
                bqkv: None,
                q_norm: None,
                k_norm: None,
                wo: random(&[(h, q4)], qd)?,
                post_attn_norm: None,
                ffn_norm: ones(h)?,
                post_ffn_norm: None,
                w_gate_up: random(&[(2 * f, q4)], h)?,
                w_down: random(&[(h, wide)], f)?,
            });
        }
        let token_embd = random(&[(c.vocab_size, q4)], h)?;
        let output = if tied { None } else { Some(random(&[(c.vocab_size, q6)], h)?) };
        let mut weights = DeviceWeights {
            token_embd,
            output,
            output_norm: ones(h)?,
            rope_factors: None,
            layers,
            dtype,
            tiles: Vec::new(),
        };
        weights.make_tiles(device)?;
        Ok(weights)
    }
}

/// The index ranges of the runs of consecutive equal types in `types`: the parts of a stacked
/// weight that become one matrix.
fn runs_of_one_type(types: &[QuantType]) -> Vec<std::ops::Range<usize>> {
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    for (i, t) in types.iter().enumerate() {
        match runs.last_mut() {
            Some(r) if types[r.start] == *t => r.end = i + 1,
            _ => runs.push(i..i + 1),
        }
    }
    runs
}

/// The `(rows, type)` matrices of a synthetic Q4_K_M weight stacked from `parts` over rows of
/// `cols` values: each type after [`q4km_fallback`], consecutive parts of one type as one
/// matrix ([`runs_of_one_type`], as [`weight`] loads a file's).
fn q4km_parts(parts: &[(usize, QuantType)], cols: usize) -> Vec<(usize, QuantType)> {
    let types: Vec<QuantType> = parts.iter().map(|p| q4km_fallback(p.1, cols)).collect();
    runs_of_one_type(&types).into_iter().map(|r| (parts[r.clone()].iter().map(|p| p.0).sum(), types[r.start])).collect()
}

/// The type llama.cpp's quantizer writes instead of K-quant `qt` for rows of `cols` values that
/// its 256-value blocks do not divide (SmolLM2's 576): Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0.
fn q4km_fallback(qt: QuantType, cols: usize) -> QuantType {
    if cols.is_multiple_of(qt.block_values()) {
        return qt;
    }
    match qt {
        QuantType::Q4_K => QuantType::Q5_0,
        QuantType::Q5_K => QuantType::Q5_1,
        QuantType::Q6_K => QuantType::Q8_0,
        other => other,
    }
}

/// Whether llama.cpp's Q4_K_M preset gives layer `i` of `n` the larger type for `attn_v` and
/// `ffn_down` (its `use_more_bits`: the first and last eighth, and every third layer between).
fn q4km_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The f32 values of a (small) tensor of any type.
fn dense(w: &Weights, t: &Tensor) -> Result<Vec<f32>, ModelError> {
    let mut out = vec![0.0f32; t.rows * t.cols];
    let view = w.file_view(t);
    for r in 0..t.rows {
        let bad = |e| ModelError::Kernel { name: t.name.clone(), source: e };
        dequantize_row(t.ty, view.row(r).map_err(bad)?, &mut out[r * t.cols..(r + 1) * t.cols]).map_err(bad)?;
    }
    Ok(out)
}

/// Matrices over the same input stacked by rows into one weight: with `quant`, when every part's
/// type has GPU kernels, the parts' GGUF blocks as they are (consecutive parts of one type as
/// one matrix); otherwise one dense matrix of `dtype`.
fn weight(
    device: &CudaDevice,
    w: &Weights,
    parts: &[&Tensor],
    dtype: DType,
    quant: bool,
) -> Result<Weight, ModelError> {
    let types: Option<Vec<QuantType>> = parts.iter().map(|t| QuantType::from_ggml(t.ty as u32)).collect();
    let cols = parts[0].cols;
    let fits = |qt: &QuantType| cols.is_multiple_of(qt.block_values());
    match types {
        Some(types) if quant && parts.iter().all(|t| t.cols == cols) && types.iter().all(fits) => {
            let mut out: Vec<QuantMatrix> = Vec::new();
            for run in runs_of_one_type(&types) {
                let qt = types[run.start];
                let rows: usize = parts[run.clone()].iter().map(|t| t.rows).sum();
                let mut bytes = Vec::with_capacity(rows * qt.block_bytes() * cols / qt.block_values());
                for t in &parts[run] {
                    bytes.extend_from_slice(w.bytes(t));
                }
                out.push(QuantMatrix::upload(device, qt, rows, cols, &bytes).map_err(dev)?);
            }
            Ok(Weight::Quant(out))
        }
        _ => Ok(Weight::Dense(fused(device, w, parts, dtype)?)),
    }
}

/// Matrices over the same input stacked by rows into one device matrix of `dtype`, dequantized
/// on the host in pieces of about 16 MiB of f32.
fn fused(device: &CudaDevice, w: &Weights, parts: &[&Tensor], dtype: DType) -> Result<DeviceMatrix, ModelError> {
    let cols = parts[0].cols;
    if let Some(t) = parts.iter().find(|t| t.cols != cols) {
        return Err(ModelError::Tensor {
            name: t.name.clone(),
            reason: format!("{} columns, expected {cols}", t.cols),
        });
    }
    let rows: usize = parts.iter().map(|t| t.rows).sum();
    let mut m = DeviceMatrix::zeros(device, rows, cols, dtype).map_err(dev)?;
    let chunk_rows = ((4 << 20) / cols.max(1)).max(1);
    let mut buf = vec![0.0f32; chunk_rows * cols];
    let mut first = 0;
    for t in parts {
        let view = w.file_view(t);
        let bad = |e| ModelError::Kernel { name: t.name.clone(), source: e };
        let mut r = 0;
        while r < t.rows {
            let k = chunk_rows.min(t.rows - r);
            for i in 0..k {
                dequantize_row(t.ty, view.row(r + i).map_err(bad)?, &mut buf[i * cols..(i + 1) * cols]).map_err(bad)?;
            }
            m.write_rows(device, first + r, &buf[..k * cols]).map_err(dev)?;
            r += k;
        }
        first += t.rows;
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrow_rows_take_llama_cpps_fallback_types() {
        assert_eq!(q4km_fallback(QuantType::Q4_K, 4096), QuantType::Q4_K);
        assert_eq!(q4km_fallback(QuantType::Q6_K, 14336), QuantType::Q6_K);
        assert_eq!(q4km_fallback(QuantType::Q4_K, 576), QuantType::Q5_0);
        assert_eq!(q4km_fallback(QuantType::Q5_K, 576), QuantType::Q5_1);
        assert_eq!(q4km_fallback(QuantType::Q6_K, 576), QuantType::Q8_0);
        for qt in [QuantType::Q4_K, QuantType::Q5_K, QuantType::Q6_K] {
            assert!(576 % q4km_fallback(qt, 576).block_values() == 0);
        }
    }

    #[test]
    fn synthetic_parts_of_one_type_are_one_matrix() {
        let (q4, q6) = (QuantType::Q4_K, QuantType::Q6_K);
        // Llama 3 8B's wq|wk|wv: v in Q6_K (a layer with more bits) or Q4_K like q|k.
        assert_eq!(q4km_parts(&[(5120, q4), (1024, q6)], 4096), [(5120, q4), (1024, q6)]);
        assert_eq!(q4km_parts(&[(5120, q4), (1024, q4)], 4096), [(6144, q4)]);
        // SmolLM2's 576-wide rows: the fallback types, merged after the fallback.
        assert_eq!(q4km_parts(&[(640, q4), (64, q6)], 576), [(640, QuantType::Q5_0), (64, QuantType::Q8_0)]);
        assert_eq!(q4km_parts(&[(640, q4), (64, q4), (64, q6)], 576), [(704, QuantType::Q5_0), (64, QuantType::Q8_0)]);
        assert_eq!(runs_of_one_type(&[q4, q4, q6, q4]), [0..2, 2..3, 3..4]);
        assert!(runs_of_one_type(&[]).is_empty());
    }
}
