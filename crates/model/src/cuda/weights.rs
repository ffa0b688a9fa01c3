//! The model's weights in device memory: every matrix dequantized from the GGUF file once, at
//! load, to the product type ([`DType`]: bf16 by default, f32 for exact comparisons), with
//! the matrices that share an input fused into one (`wq|wk|wv`, `w_gate|w_up`); or random
//! weights of a model's shape generated on the device ([`DeviceWeights::synthetic`]).

use pagekv_cpu::quant::dequantize_row;
use pagekv_cuda::{CudaDevice, DType, DeviceMatrix, DeviceVec as Slice, ModelOps};

use super::buffers::{dev, upload_f32};
use crate::error::ModelError;
use crate::llama::weights::{Tensor, Weights};
use crate::llama::ModelConfig;

/// One layer's tensors on the device. Shapes `[rows, cols]` as multiplied (`out = x · Wᵀ`).
pub(crate) struct DeviceLayer {
    pub attn_norm: Slice<f32>,      // [hidden]
    pub wqkv: DeviceMatrix,         // [q_dim + 2·kv_dim, hidden]
    pub bqkv: Option<Slice<f32>>,   // [q_dim + 2·kv_dim]
    pub q_norm: Option<Slice<f32>>, // [head_dim]
    pub k_norm: Option<Slice<f32>>, // [head_dim]
    pub wo: DeviceMatrix,           // [hidden, q_dim]
    pub ffn_norm: Slice<f32>,       // [hidden]
    pub w_gate_up: DeviceMatrix,    // [2·ffn, hidden]
    pub w_down: DeviceMatrix,       // [hidden, ffn]
}

/// All tensors on the device.
pub(crate) struct DeviceWeights {
    pub token_embd: DeviceMatrix, // [vocab, hidden]
    /// `[vocab, hidden]`; `None` when tied to the embedding.
    pub output: Option<DeviceMatrix>,
    pub output_norm: Slice<f32>,          // [hidden]
    pub rope_factors: Option<Slice<f32>>, // [rope_dims / 2]
    pub layers: Vec<DeviceLayer>,
    pub dtype: DType,
}

impl DeviceWeights {
    /// The output projection (the embedding when tied).
    pub fn output(&self) -> &DeviceMatrix {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }

    /// The matrices one decode step streams, each once.
    pub fn streamed(&self) -> Vec<&DeviceMatrix> {
        let mut v: Vec<&DeviceMatrix> = Vec::new();
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

    /// Dequantizes and uploads the weights of a loaded GGUF model.
    pub fn upload(device: &CudaDevice, w: &Weights, c: &ModelConfig, dtype: DType) -> Result<Self, ModelError> {
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
                wqkv: fused(device, w, &[&l.wq, &l.wk, &l.wv], dtype)?,
                bqkv,
                q_norm: l.q_norm.as_ref().map(|t| upload_f32(device, &dense(w, t)?)).transpose()?,
                k_norm: l.k_norm.as_ref().map(|t| upload_f32(device, &dense(w, t)?)).transpose()?,
                wo: fused(device, w, &[&l.wo], dtype)?,
                ffn_norm: upload_f32(device, w.f32s(&l.ffn_norm))?,
                w_gate_up: fused(device, w, &[&l.w_gate, &l.w_up], dtype)?,
                w_down: fused(device, w, &[&l.w_down], dtype)?,
            });
        }
        debug_assert!(layers.iter().all(|l| l.wqkv.rows() == qd + 2 * kvd && l.w_gate_up.rows() == 2 * f));
        let token_embd = fused(device, w, &[&w.token_embd], dtype)?;
        let output = if w.tied_embeddings { None } else { Some(fused(device, w, &[&w.output], dtype)?) };
        debug_assert_eq!(token_embd.cols(), h);
        Ok(DeviceWeights {
            token_embd,
            output,
            output_norm: upload_f32(device, &dense(w, &w.output_norm)?)?,
            rope_factors: w.rope_freqs.as_ref().map(|t| upload_f32(device, &dense(w, t)?)).transpose()?,
            layers,
            dtype,
        })
    }

    /// Random weights of `c`'s shape generated on the device: matrices uniform in
    /// `±1/sqrt(cols)` (activations stay of order one through the layers), norms 1, tied
    /// output when `tied`. For throughput measurements only — not a model.
    pub fn synthetic(
        device: &CudaDevice,
        ops: &ModelOps,
        c: &ModelConfig,
        dtype: DType,
        tied: bool,
        seed: u32,
    ) -> Result<Self, ModelError> {
        let (h, qd, kvd, f) = (c.hidden, c.q_dim(), c.kv_dim(), c.ffn);
        let mut n = 0u32;
        let mut random = |rows: usize, cols: usize| -> Result<DeviceMatrix, ModelError> {
            let mut m = DeviceMatrix::zeros(device, rows, cols, dtype).map_err(dev)?;
            n += 1;
            ops.fill_uniform(&mut m, 1.0 / (cols as f32).sqrt(), seed.wrapping_mul(7919).wrapping_add(n))
                .map_err(dev)?;
            Ok(m)
        };
        let ones = |len: usize| upload_f32(device, &vec![1.0f32; len]);
        let mut layers = Vec::with_capacity(c.num_layers);
        for _ in 0..c.num_layers {
            layers.push(DeviceLayer {
                attn_norm: ones(h)?,
                wqkv: random(qd + 2 * kvd, h)?,
                bqkv: None,
                q_norm: None,
                k_norm: None,
                wo: random(h, qd)?,
                ffn_norm: ones(h)?,
                w_gate_up: random(2 * f, h)?,
                w_down: random(h, f)?,
            });
        }
        let token_embd = random(c.vocab_size, h)?;
        let output = if tied { None } else { Some(random(c.vocab_size, h)?) };
        Ok(DeviceWeights { token_embd, output, output_norm: ones(h)?, rope_factors: None, layers, dtype })
    }
}

/// The f32 values of a (small) tensor of any type.
fn dense(w: &Weights, t: &Tensor) -> Result<Vec<f32>, ModelError> {
    let mut out = vec![0.0f32; t.rows * t.cols];
    let view = w.view(t);
    for r in 0..t.rows {
        let bad = |e| ModelError::Kernel { name: t.name.clone(), source: e };
        dequantize_row(t.ty, view.row(r).map_err(bad)?, &mut out[r * t.cols..(r + 1) * t.cols]).map_err(bad)?;
    }
    Ok(out)
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
        let view = w.view(t);
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
