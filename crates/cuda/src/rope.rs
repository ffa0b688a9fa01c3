//! The attention input of a model step from its fused QKV product — bias, per-head q/k norms,
//! RoPE, query scale and rounding, key centring (`kernels/rope.cuh`) — as the two launches that
//! compute it share it: [`crate::ModelOps::qkv_rope`] (q, k and v to f32 buffers) and
//! [`crate::DevicePages::write_qkv`] (q to its buffer, k and v encoded straight into the cache).
//! Their arguments, checked once here, and the kernel parameters they become.

use cudarc::driver::CudaSlice;

use crate::device::{arg, CudaDevice};
use crate::pages::dptr;
use crate::CudaError;

/// How the heads of a step's QKV product are finished, beyond the buffers ([`QkvRope`]).
#[derive(Clone, Copy, Debug)]
pub struct RopeParams {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Dimensions of each head that are rotated (even, ≤ head_dim).
    pub rope_dims: usize,
    /// `false`: adjacent pairs (2i, 2i+1) (llama); `true`: (i, i + rope_dims/2) (neox, qwen).
    pub neox: bool,
    /// `base^(-2 / rope_dims)`.
    pub theta_scale: f32,
    /// `1 / linear scale`.
    pub freq_scale: f32,
    /// Epsilon of the per-head q/k norms.
    pub eps: f32,
    /// Round q to the K cache's precision: 0 none, 1 f16, 2 bf16.
    pub q_round: u32,
    /// Multiplies q after RoPE, before the rounding (Gemma 3's attention scale, applied to the
    /// queries; 1 for models that scale the scores).
    pub q_scale: f32,
}

/// The input buffers of a step's attention input. Shapes in comments.
pub struct QkvRope<'a> {
    /// `[n, (num_heads + 2·num_kv_heads)·head_dim]` the fused QKV product.
    pub qkv: &'a CudaSlice<f32>,
    /// `[(num_heads + 2·num_kv_heads)·head_dim]` optional bias.
    pub bias: Option<&'a CudaSlice<f32>>,
    /// `[head_dim]` optional per-head norms.
    pub q_norm: Option<&'a CudaSlice<f32>>,
    pub k_norm: Option<&'a CudaSlice<f32>>,
    /// `[rope_dims / 2]` optional frequency divisors.
    pub factors: Option<&'a CudaSlice<f32>>,
    /// `[n]` positions.
    pub positions: &'a CudaSlice<u32>,
    /// Subtract the key bias again after RoPE, so the keys written to the cache are `k − b_k`
    /// (every score of a query moves by the same `q·b_k`, which softmax cancels; the model
    /// decides when, for quantized caches). No effect without a bias.
    pub center_keys: bool,
}

/// The parameters `pk_qkv_rope` and `pk_qkv_rope_write` share, as values whose addresses are
/// the launch's arguments.
pub(crate) struct RopeArgs {
    qkv: u64,
    bias: u64,
    q_norm: u64,
    k_norm: u64,
    positions: u64,
    factors: u64,
    nh: u32,
    nkv: u32,
    d: u32,
    rope_dims: u32,
    style: u32,
    theta_scale: f32,
    freq_scale: f32,
    eps: f32,
    q_round: u32,
    q_scale: f32,
    k_center: u32,
}

impl RopeArgs {
    /// Checks `a` and `p` for `n` tokens with `q` holding `[n, num_heads, head_dim]` (`what`
    /// names the call in the error).
    pub(crate) fn new(
        dev: &CudaDevice,
        a: &QkvRope,
        p: &RopeParams,
        q: &CudaSlice<f32>,
        n: usize,
        what: &str,
    ) -> Result<RopeArgs, CudaError> {
        let (nh, nkv, d) = (p.num_heads, p.num_kv_heads, p.head_dim);
        let width = (nh + 2 * nkv) * d;
        let bad = nkv == 0
            || !nh.is_multiple_of(nkv)
            || a.qkv.len() < n * width
            || q.len() < n * nh * d
            || a.positions.len() < n
            || a.bias.is_some_and(|b| b.len() < width)
            || a.q_norm.is_some_and(|b| b.len() < d)
            || a.k_norm.is_some_and(|b| b.len() < d)
            || a.factors.is_some_and(|f| f.len() < p.rope_dims / 2)
            || p.rope_dims > d
            || !p.rope_dims.is_multiple_of(2);
        if bad {
            return Err(CudaError::Invalid(format!("{what} of {n} tokens: buffer sizes or {p:?}")));
        }
        let opt = |s: Option<&CudaSlice<f32>>| s.map_or(0u64, |s| dptr(s, dev));
        Ok(RopeArgs {
            qkv: dptr(a.qkv, dev),
            bias: opt(a.bias),
            q_norm: opt(a.q_norm),
            k_norm: opt(a.k_norm),
            positions: dptr(a.positions, dev),
            factors: opt(a.factors),
            nh: nh as u32,
            nkv: nkv as u32,
            d: d as u32,
            rope_dims: p.rope_dims as u32,
            style: p.neox as u32,
            theta_scale: p.theta_scale,
            freq_scale: p.freq_scale,
            eps: p.eps,
            q_round: p.q_round,
            q_scale: p.q_scale,
            k_center: a.center_keys as u32,
        })
    }

    /// `d` (head_dim) for the kernel that takes it (`pk_qkv_rope`; `pk_qkv_rope_write` has it
    /// compiled in).
    pub(crate) fn head_dim(&self) -> &u32 {
        &self.d
    }

    /// The kernels' last parameters, `qkv, bias, q_norm, k_norm, positions, factors, nh, nkv,
    /// rope_dims, style, theta_scale, freq_scale, eps, q_round, q_scale, k_center`.
    pub(crate) fn tail(&self) -> [*mut std::ffi::c_void; 16] {
        [
            arg(&self.qkv),
            arg(&self.bias),
            arg(&self.q_norm),
            arg(&self.k_norm),
            arg(&self.positions),
            arg(&self.factors),
            arg(&self.nh),
            arg(&self.nkv),
            arg(&self.rope_dims),
            arg(&self.style),
            arg(&self.theta_scale),
            arg(&self.freq_scale),
            arg(&self.eps),
            arg(&self.q_round),
            arg(&self.q_scale),
            arg(&self.k_center),
        ]
    }
}
