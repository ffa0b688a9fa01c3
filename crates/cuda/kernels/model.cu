// model.cu — the element-wise and small kernels of the llama-family forward pass on the GPU, and
// the fused matrix-vector products of decode steps (at the end). Other matrix products go through
// cuBLAS (src/model_ops.rs); attention and the cache write are the paged kernels of decode*.cu
// and cache_write.cu.
//
// Activations between kernels are f32 (the residual stream, q/k/v, logits). The inputs of the
// matrix products are in the weights' type, so every kernel that feeds a product comes in two
// instantiations: `_bf16` (u16 bf16 bits) and `_f32`.
//
// Where a rounding is a choice, it follows the CPU forward (crates/model/src/llama/ops.rs), so
// the two can be compared closely: RMSNorm sums squares in f64, RoPE builds its angles by
// repeated f32 multiplication and rotates with the first product fused.

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ u16 from_f32<u16>(float v) { return f32_to_bf16(v); }
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }

template <typename T>
__device__ __forceinline__ float to_f32(T v);
template <>
__device__ __forceinline__ float to_f32<u16>(u16 v) { return bf16_to_f32(v); }
template <>
__device__ __forceinline__ float to_f32<float>(float v) { return v; }

// out [n, h] f32 ← rows `tokens[i]` of table [vocab, h] (T). Grid (n), any block size.
template <typename T>
__device__ void embed(float* __restrict__ out, const T* __restrict__ table, const u32* __restrict__ tokens, u32 h) {
    const u32 i = blockIdx.x;
    const T* row = table + (u64)tokens[i] * h;
#pragma unroll 8
    for (u32 j = threadIdx.x; j < h; j += blockDim.x) out[(u64)i * h + j] = to_f32<T>(row[j]);
}

// 1 / sqrt(mean(xr²) + eps) of one row of h values, by the whole block (≤ 1024 threads): squares
// summed in f64 as the CPU does, the mean rounded to f32. Every thread returns the value.
__device__ __forceinline__ float block_inv_rms(const float* __restrict__ xr, u32 h, float eps) {
    __shared__ double partial[32];
    __shared__ float inv_s;
    double s = 0.0;
    // Unrolled so a thread's loads are in flight together (one row per block: latency-bound).
#pragma unroll 8
    for (u32 j = threadIdx.x; j < h; j += blockDim.x) {
        const float v = xr[j];
        s += (double)__fmul_rn(v, v);
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (u32 k = 0; k < (blockDim.x + 31) / 32; k++) t += partial[k];
        const float mean = (float)(t / (double)h);
        inv_s = 1.0f / sqrtf(mean + eps);
    }
    __syncthreads();
    return inv_s;
}

// out [n, h] (T) ← x[rows[i] or i] / sqrt(mean(x²) + eps) · w, per row. Grid (n), block ≤ 1024.
// `rows` (nullable) gathers: out row i normalizes x row rows[i] (the rows whose logits are
// wanted).
template <typename T>
__device__ void rms_norm(T* __restrict__ out, const float* __restrict__ x, const float* __restrict__ w,
                         const u32* __restrict__ rows, u32 h, float eps) {
    const u32 i = blockIdx.x;
    const u32 src = rows ? rows[i] : i;
    const float* xr = x + (u64)src * h;
    const float inv = block_inv_rms(xr, h, eps);
#pragma unroll 8
    for (u32 j = threadIdx.x; j < h; j += blockDim.x) {
        out[(u64)i * h + j] = from_f32<T>(__fmul_rn(__fmul_rn(xr[j], inv), w[j]));
    }
}

// gate·up: out [n, f] (T) ← silu(gu[:, :f]) · gu[:, f:] with gu [n, 2f] f32, as the CPU's
// `x / (1 + e^-x) · up` (libdevice expf here; the CPU uses ggml's polynomial expf).
template <typename T>
__device__ void silu_mul(T* __restrict__ out, const float* __restrict__ gu, u32 f, u32 n) {
    const u64 total = (u64)n * f;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (u64)gridDim.x * blockDim.x) {
        const u64 i = e / f, j = e % f;
        const float g = gu[i * 2 * f + j], u = gu[i * 2 * f + f + j];
        out[e] = from_f32<T>(__fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(0.0f - g))), u));
    }
}

// GeGLU: out [n, f] (T) ← gelu(gu[:, :f]) · gu[:, f:] with gu [n, 2f] f32 (`pk_gelu_mul1`, in
// common.cuh: GELU's tanh approximation in f32).
template <typename T>
__device__ void gelu_mul(T* __restrict__ out, const float* __restrict__ gu, u32 f, u32 n) {
    const u64 total = (u64)n * f;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (u64)gridDim.x * blockDim.x) {
        const u64 i = e / f, j = e % f;
        out[e] = from_f32<T>(pk_gelu_mul1(gu[i * 2 * f + j], gu[i * 2 * f + f + j]));
    }
}

// out [n] (T) ← in [n] f32.
template <typename T>
__device__ void convert(T* __restrict__ out, const float* __restrict__ in, u64 n) {
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (u64)gridDim.x * blockDim.x)
        out[e] = from_f32<T>(in[e]);
}

// Uniform values in [-scale, scale) from a hash of (index, seed) — synthetic weights.
template <typename T>
__device__ void fill_uniform(T* __restrict__ p, u64 n, float scale, u32 seed) {
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (u64)gridDim.x * blockDim.x) {
        const u32 r = pk_hash(e * 0x9E3779B97F4A7C15ull + seed);
        p[e] = from_f32<T>(((float)(r >> 8) * (1.0f / 8388608.0f) - 1.0f) * scale);
    }
}

#define PK_INSTANTIATE(NAME, T)                                                                                 \
    extern "C" __global__ void pk_embed_##NAME(float* out, const T* table, const u32* tokens, u32 h) {        \
        embed<T>(out, table, tokens, h);                                                                        \
    }                                                                                                           \
    extern "C" __global__ void pk_rms_norm_##NAME(T* out, const float* x, const float* w, const u32* rows,      \
                                                  u32 h, float eps) {                                           \
        rms_norm<T>(out, x, w, rows, h, eps);                                                                   \
    }                                                                                                           \
    extern "C" __global__ void pk_silu_mul_##NAME(T* out, const float* gu, u32 f, u32 n) {                      \
        silu_mul<T>(out, gu, f, n);                                                                             \
    }                                                                                                           \
    extern "C" __global__ void pk_gelu_mul_##NAME(T* out, const float* gu, u32 f, u32 n) {                      \
        gelu_mul<T>(out, gu, f, n);                                                                             \
    }                                                                                                           \
    extern "C" __global__ void pk_convert_##NAME(T* out, const float* in, u64 n) { convert<T>(out, in, n); }    \
    extern "C" __global__ void pk_fill_uniform_##NAME(T* p, u64 n, float scale, u32 seed) {                     \
        fill_uniform<T>(p, n, scale, seed);                                                                     \
    }

PK_INSTANTIATE(bf16, u16)
PK_INSTANTIATE(f32, float)

// Gemma 3's norms after a block: x [n, h] += y[i] / sqrt(mean(y[i]²) + eps) · w, per row — the
// attention or MLP output (y, f32) normalized with the post-norm weights w [h] before the residual
// add, rounded as the CPU's (the normalized value in f32, then the add). Grid (n), block ≤ 1024.
extern "C" __global__ void pk_rms_norm_add(float* __restrict__ x, const float* __restrict__ y,
                                           const float* __restrict__ w, u32 h, float eps) {
    const u64 base = (u64)blockIdx.x * h;
    const float* yr = y + base;
    const float inv = block_inv_rms(yr, h, eps);
#pragma unroll 8
    for (u32 j = threadIdx.x; j < h; j += blockDim.x) {
        x[base + j] = __fadd_rn(x[base + j], __fmul_rn(__fmul_rn(yr[j], inv), w[j]));
    }
}

// x [n] *= s (Gemma's embedding scale √hidden, in f32 as the CPU's).
extern "C" __global__ void pk_scale(float* __restrict__ x, u64 n, float s) {
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (u64)gridDim.x * blockDim.x)
        x[e] = __fmul_rn(x[e], s);
}

// The attention input of every token from the fused QKV product (rope.cuh): q [n, nh, d],
// k [n, nkv, d], v [n, nkv, d] f32 out. Grid (n, nh + 2·nkv), block 32: one warp per head
// vector. Dynamic shared memory: 4 · (d + rope_dims) bytes.
extern "C" __global__ void pk_qkv_rope(float* __restrict__ q, float* __restrict__ k, float* __restrict__ v, u32 d,
                                       const float* __restrict__ qkv, const float* __restrict__ bias,
                                       const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                                       const u32* __restrict__ positions, const float* __restrict__ factors,
                                       u32 nh, u32 nkv, u32 rope_dims, u32 style, float theta_scale,
                                       float freq_scale, float eps, u32 q_round, float q_scale, u32 k_center) {
    extern __shared__ float head[];  // [d], then the angles' (cos, sin) [rope_dims / 2][2]
    const QkvRopeArgs a = {qkv,  bias, q_norm,      k_norm,     positions, factors, nh,      nkv,     d,
                           rope_dims, style, theta_scale, freq_scale, eps,     q_round, q_scale, k_center};
    const u32 i = blockIdx.x, hh = blockIdx.y, lane = threadIdx.x;
    float* cs = head + d;
    rope_angles(cs, a, i, lane, 32);
    __syncwarp();
    // Launched as a programmatic dependent launch after the QKV product (ModelOps::qkv_rope).
    pdl_wait();
    const int kind = qkv_head(head, cs, a, i, hh, lane);
    float* dst = kind == 0 ? q + ((u64)i * nh + hh) * d
               : kind == 1 ? k + ((u64)i * nkv + (hh - nh)) * d
                           : v + ((u64)i * nkv + (hh - nh - nkv)) * d;
    for (u32 j = lane; j < d; j += 32) dst[j] = head[j];
}

// Argmax of logit rows: the index of the largest value, the first one on ties, NaN skipped, 0
// for a row of NaN (as the engine's host argmax). Two launches so that a 128K–256K vocabulary is
// read by many SMs, not one: pk_argmax_part takes the best (value, index) of each slice of `span`
// values, pk_argmax the best of a row's slices. "Best" is order-free (the larger value, the lower
// index on equal values, no index losing to any index), so the result is a single pass's.
#define PK_NO_INDEX 0xffffffffu

__device__ __forceinline__ void argmax_take(float& bv, u32& bi, float ov, u32 oi) {
    if (oi != PK_NO_INDEX && (bi == PK_NO_INDEX || ov > bv || (ov == bv && oi < bi))) {
        bv = ov;
        bi = oi;
    }
}

// The best (value, index) of the block's pairs, in thread 0 (any block size up to 1024).
__device__ __forceinline__ void argmax_block(float& bv, u32& bi) {
    __shared__ float best_v[32];
    __shared__ u32 best_i[32];
    for (int o = 16; o > 0; o >>= 1) argmax_take(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
    const u32 warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    if ((threadIdx.x & 31) == 0) {
        best_v[warp] = bv;
        best_i[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (u32 w = 1; w < nw; w++) argmax_take(bv, bi, best_v[w], best_i[w]);
}

// part [rows, parts, 2] (value bits, index; PK_NO_INDEX: no value that is not NaN) ← the best
// pair of values p·span .. (p + 1)·span of each row of logits [rows, vocab]. Grid (parts, rows).
extern "C" __global__ void pk_argmax_part(u32* __restrict__ part, const float* __restrict__ logits, u32 vocab,
                                          u32 span) {
    const float* row = logits + (u64)blockIdx.y * vocab;
    const u32 lo = blockIdx.x * span, hi = min(vocab, lo + span);
    float bv = PK_NEG_INF;
    u32 bi = PK_NO_INDEX;
#pragma unroll 4
    for (u32 j = lo + threadIdx.x; j < hi; j += blockDim.x) {
        const float x = row[j];
        if (!isnan(x)) argmax_take(bv, bi, x, j);
    }
    argmax_block(bv, bi);
    if (threadIdx.x == 0) {
        u32* o = part + ((u64)blockIdx.y * gridDim.x + blockIdx.x) * 2;
        o[0] = __float_as_uint(bv);
        o[1] = bi;
    }
}

// ids [rows] ← the best of each row's `parts` pairs in part [rows, parts, 2]. Grid (rows).
extern "C" __global__ void pk_argmax(u32* __restrict__ ids, const u32* __restrict__ part, u32 parts) {
    const u32* row = part + (u64)blockIdx.x * parts * 2;
    float bv = PK_NEG_INF;
    u32 bi = PK_NO_INDEX;
    for (u32 j = threadIdx.x; j < parts; j += blockDim.x) argmax_take(bv, bi, __uint_as_float(row[2 * j]), row[2 * j + 1]);
    argmax_block(bv, bi);
    if (threadIdx.x == 0) ids[blockIdx.x] = bi == PK_NO_INDEX ? 0 : bi;
}

// Reads n 16-byte words and sums them (weight-read roofline: every matrix once, as a decode
// step reads them). `sink` keeps the loads alive.
extern "C" __global__ void pk_read_sum(const uint4* __restrict__ p, u64 n, u32* __restrict__ sink) {
    u32 acc = 0;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (u64)gridDim.x * blockDim.x) {
        const uint4 w = __ldcs(p + e);
        acc ^= w.x ^ w.y ^ w.z ^ w.w;
    }
    if (acc == 0x9E3779B9u) sink[0] = acc;
}

// ---- Matrix-vector products for decode: y [n, rows] (+)= x' [n, cols] · Wᵀ, W bf16 [rows, cols]
// (cols a multiple of 8), n ≤ 4 token rows, f32 accumulation. Memory-bound: each weight row is
// streamed once with 16-byte loads, every warp on GEMV_R rows at a time. The input x' is built
// in shared memory as bf16 by a prologue that fuses the op before the product:
//   mode 0: x' = bf16(x)                               x [n, cols] f32 (attention output)
//   mode 1: x' = bf16(rms_norm(x) · nw), eps            x [*, cols] f32 (residual), rows picked
//           by `xrows` when given (the logit rows)
//   mode 2: x' = bf16(silu(x[:, :cols]) · x[:, cols:])  x [n, 2·cols] f32 (gate|up)
//   mode 3: x' = bf16(gelu(x[:, :cols]) · x[:, cols:])  x [n, 2·cols] f32 (gate|up, GeGLU)
// — the same values the unfused kernels (pk_rms_norm, pk_silu_mul, pk_gelu_mul, pk_convert)
// produce.
// Dynamic shared memory: n · cols · 2 bytes. Grid: any (grid-stride over groups of R rows, one
// group per warp at a time), block 32 · GEMV_WARPS.
#define GEMV_WARPS 8

__device__ __forceinline__ float dot8_bf16(uint4 w, uint4 x, float acc) {
    const u32 ws[4] = {w.x, w.y, w.z, w.w}, xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        acc = fmaf(__uint_as_float(ws[k] << 16), __uint_as_float(xs[k] << 16), acc);
        acc = fmaf(__uint_as_float(ws[k] & 0xffff0000u), __uint_as_float(xs[k] & 0xffff0000u), acc);
    }
    return acc;
}

// silu(g) · u, as pk_silu_mul computes it.
__device__ __forceinline__ float silu_mul1(float g, float u) {
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(0.0f - g))), u);
}

// The gated activation of prologue `mode` 2 (SiLU) or 3 (GELU, tanh approximation).
__device__ __forceinline__ float glu_mul1(float g, float u, u32 mode) {
    return mode == 3 ? pk_gelu_mul1(g, u) : silu_mul1(g, u);
}

template <int N, int GEMV_R>
__device__ void gemv_bf16(float* __restrict__ y, const u16* __restrict__ W, const float* __restrict__ x,
                          const float* __restrict__ nw, const u32* __restrict__ xrows, u32 rows, u32 cols,
                          u32 mode, float eps, u32 accumulate) {
    extern __shared__ __align__(16) u16 xs[];  // [N, cols]
    __shared__ double partial[GEMV_WARPS];
    __shared__ float inv_s;
    const u32 tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    for (int i = 0; i < N; i++) {
        const u32 src = xrows ? xrows[i] : (u32)i;
        if (mode == 0) {
            const float* xr = x + (u64)src * cols;
#pragma unroll 8
            for (u32 j = tid; j < cols; j += blockDim.x) xs[i * cols + j] = f32_to_bf16(xr[j]);
        } else if (mode == 1) {
            const float* xr = x + (u64)src * cols;
            double s = 0.0;
#pragma unroll 8
            for (u32 j = tid; j < cols; j += blockDim.x) s += (double)__fmul_rn(xr[j], xr[j]);
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if (lane == 0) partial[warp] = s;
            __syncthreads();
            if (tid == 0) {
                double t = 0.0;
                for (int k = 0; k < GEMV_WARPS; k++) t += partial[k];
                inv_s = 1.0f / sqrtf((float)(t / (double)cols) + eps);
            }
            __syncthreads();
            const float inv = inv_s;
#pragma unroll 8
            for (u32 j = tid; j < cols; j += blockDim.x) xs[i * cols + j] = f32_to_bf16(__fmul_rn(__fmul_rn(xr[j], inv), nw[j]));
            __syncthreads();
        } else {
            const float* xr = x + (u64)src * 2 * cols;
#pragma unroll 8
            for (u32 j = tid; j < cols; j += blockDim.x) {
                const float g = xr[j], u = xr[cols + j];
                xs[i * cols + j] = f32_to_bf16(glu_mul1(g, u, mode));
            }
        }
    }
    __syncthreads();
    const u32 c8 = cols / 8;
    const uint4* xv = (const uint4*)xs;
    const u32 groups = (rows + GEMV_R - 1) / GEMV_R;
    for (u32 g = blockIdx.x * GEMV_WARPS + warp; g < groups; g += gridDim.x * GEMV_WARPS) {
        const u32 r0 = g * GEMV_R;
        float acc[GEMV_R][N];
#pragma unroll
        for (int r = 0; r < GEMV_R; r++)
#pragma unroll
            for (int i = 0; i < N; i++) acc[r][i] = 0.0f;
        const uint4* wr[GEMV_R];
#pragma unroll
        for (int r = 0; r < GEMV_R; r++) wr[r] = (const uint4*)(W + (u64)min(r0 + r, rows - 1) * cols);
#pragma unroll 4
        for (u32 c = lane; c < c8; c += 32) {
            uint4 wv[GEMV_R];
#pragma unroll
            for (int r = 0; r < GEMV_R; r++) wv[r] = __ldcs(wr[r] + c);
#pragma unroll
            for (int i = 0; i < N; i++) {
                const uint4 xq = xv[i * c8 + c];
#pragma unroll
                for (int r = 0; r < GEMV_R; r++) acc[r][i] = dot8_bf16(wv[r], xq, acc[r][i]);
            }
        }
#pragma unroll
        for (int r = 0; r < GEMV_R; r++)
#pragma unroll
            for (int i = 0; i < N; i++) {
                float v = acc[r][i];
                for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
                acc[r][i] = v;
            }
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < GEMV_R; r++) {
                if (r0 + r >= rows) continue;
#pragma unroll
                for (int i = 0; i < N; i++) {
                    float* o = y + (u64)i * rows + r0 + r;
                    *o = accumulate ? *o + acc[r][i] : acc[r][i];
                }
            }
        }
    }
}

#define PK_GEMV(N, R)                                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS)                                              \
        pk_gemv_bf16_n##N##_r##R(float* y, const u16* W, const float* x, const float* nw, const u32* xrows,   \
                                 u32 rows, u32 cols, u32 mode, float eps, u32 accumulate) {                    \
        gemv_bf16<N, R>(y, W, x, nw, xrows, rows, cols, mode, eps, accumulate);                                \
    }
#define PK_GEMV_R(R) PK_GEMV(1, R) PK_GEMV(2, R) PK_GEMV(3, R) PK_GEMV(4, R)
PK_GEMV_R(1)
PK_GEMV_R(2)
PK_GEMV_R(4)

// ---- Split matrix-vector product for decode (the default; the kernel above is the earlier one,
// kept for comparison runs): same contract, y [n, rows] (+)= x' [n, cols] · Wᵀ with the same
// three prologues, but laid out so the weights stream at the full bandwidth on every SM:
//   - one block per SM (WARPS warps; launched with grid ≤ 1–2 × SMs), so the prologue runs once
//     per block, not once per 8 warps: the RMSNorm's two passes over x and SiLU·mul's 2·cols
//     inputs are read from L2 ~130 times per product instead of ~1000;
//   - block b owns the contiguous rows [b·rows/G, (b+1)·rows/G) (balanced to one row), cut into
//     items of (row, slice of 32·L 16-byte words); warps take items round-robin, every lane
//     keeping L independent 16-byte loads in flight; an item's partial dot products land in
//     shared memory and are summed in slice order at the end (deterministic);
//   - each warp loads the next item's weights right after using the current one's, before
//     reducing it;
//   - launched as a programmatic dependent launch: its blocks are scheduled while the previous
//     kernel drains, and wait for its results in `pdl_wait()`. (Prefetching the first items'
//     weights into L2 before the wait measured slower with `pagekv bench decode --device cuda`.)
// Dynamic shared memory: N · cols · 2 bytes (x') + ceil(rows / G) · ceil(cols / 8 / (32·L))
// · N · 4 bytes (partials). Block 32 · WARPS threads.

// Loads item `it`'s weights (row r_lo + it / S, 16-byte words s·32·L + lane + 32·j); words
// past the row's end read as zero (and are skipped by the product).
template <int L>
__device__ __forceinline__ void gemv_load_item(uint4 (&wv)[L], const uint4* __restrict__ W, u32 c8, u32 S, u32 r_lo,
                                               u32 it, u32 lane) {
    const uint4* row = W + (u64)(r_lo + it / S) * c8;
    const u32 c0 = (it % S) * (32 * L) + lane;
#pragma unroll
    for (int j = 0; j < L; j++) {
        const u32 c = c0 + 32 * j;
        wv[j] = c < c8 ? __ldcs(row + c) : make_uint4(0, 0, 0, 0);
    }
}

__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    return (u32)f32_to_bf16(lo) | ((u32)f32_to_bf16(hi) << 16);
}

// xs [N, cols] bf16 ← the prologue of `mode` on x (see above), 4 columns per thread and step
// (16-byte loads, an 8-byte store; few registers). `red` [WARPS] holds the norm's warp sums.
template <int N, int WARPS>
__device__ void gemv_prologue(u16* __restrict__ xs, const float* __restrict__ x, const float* __restrict__ nw,
                              const u32* __restrict__ xrows, u32 cols, u32 mode, float eps, double* red,
                              float* inv_s) {
    const u32 tid = threadIdx.x, c4 = cols / 4;
    for (int i = 0; i < N; i++) {
        const u32 src = xrows ? xrows[i] : (u32)i;
        uint2* dst = (uint2*)(xs + (u64)i * cols);
        if (mode >= 2) {
            const float4* g = (const float4*)(x + (u64)src * 2 * cols);
            const float4* u = g + c4;
            for (u32 q = tid; q < c4; q += 32 * WARPS) {
                const float4 a = g[q], b = u[q];
                dst[q] = make_uint2(pack_bf16x2(glu_mul1(a.x, b.x, mode), glu_mul1(a.y, b.y, mode)),
                                    pack_bf16x2(glu_mul1(a.z, b.z, mode), glu_mul1(a.w, b.w, mode)));
            }
            continue;
        }
        const float4* xr = (const float4*)(x + (u64)src * cols);
        float inv = 1.0f;
        if (mode == 1) {
            // Squares summed in f64 (as the CPU and pk_rms_norm), the mean rounded to f32.
            double s = 0.0;
            for (u32 q = tid; q < c4; q += 32 * WARPS) {
                const float4 a = xr[q];
                s += (double)__fmul_rn(a.x, a.x) + (double)__fmul_rn(a.y, a.y) + (double)__fmul_rn(a.z, a.z) +
                     (double)__fmul_rn(a.w, a.w);
            }
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if ((tid & 31) == 0) red[tid >> 5] = s;
            __syncthreads();
            if (tid == 0) {
                double t = 0.0;
                for (int k = 0; k < WARPS; k++) t += red[k];
                *inv_s = 1.0f / sqrtf((float)(t / (double)cols) + eps);
            }
            __syncthreads();
            inv = *inv_s;
        }
        const float4* wn = (const float4*)nw;
        for (u32 q = tid; q < c4; q += 32 * WARPS) {
            float4 a = xr[q];
            if (mode == 1) {
                const float4 w = wn[q];
                a = make_float4(__fmul_rn(__fmul_rn(a.x, inv), w.x), __fmul_rn(__fmul_rn(a.y, inv), w.y),
                                __fmul_rn(__fmul_rn(a.z, inv), w.z), __fmul_rn(__fmul_rn(a.w, inv), w.w));
            }
            dst[q] = make_uint2(pack_bf16x2(a.x, a.y), pack_bf16x2(a.z, a.w));
        }
        // (`red` and `inv_s` are rewritten by the next row's norm only after its first barrier,
        // which every thread reaches after reading them here.)
    }
}

template <int N, int WARPS, int L>
__device__ void gemv_split_bf16(float* __restrict__ y, const u16* __restrict__ W, const float* __restrict__ x,
                                const float* __restrict__ nw, const u32* __restrict__ xrows, u32 rows, u32 cols,
                                u32 mode, float eps, u32 accumulate) {
    extern __shared__ __align__(16) unsigned char gemv_smem[];
    u16* xs = (u16*)gemv_smem;                               // [N, cols]
    float* part = (float*)(gemv_smem + (u64)N * cols * 2);  // [rows of the block, S, N]
    __shared__ double red[WARPS];
    __shared__ float inv_s;
    // Dependents (the next product) may be scheduled as this grid's blocks finish.
    pdl_trigger();
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const u32 c8 = cols / 8, S = (c8 + 32 * L - 1) / (32 * L);
    const u32 r_lo = (u32)((u64)blockIdx.x * rows / gridDim.x);
    const u32 r_hi = (u32)((u64)(blockIdx.x + 1) * rows / gridDim.x);
    const u32 items = (r_hi - r_lo) * S;
    const uint4* Wv = (const uint4*)W;
    // x (and y, when accumulating) are the previous kernel's results.
    pdl_wait();
    gemv_prologue<N, WARPS>(xs, x, nw, xrows, cols, mode, eps, red, &inv_s);
    __syncthreads();
    const uint4* xv = (const uint4*)xs;
    uint4 wv[L];
    u32 it = warp;
    if (it < items) gemv_load_item<L>(wv, Wv, c8, S, r_lo, it, lane);
    for (; it < items; it += WARPS) {
        const u32 c0 = (it % S) * (32 * L) + lane;
        float acc[N];
#pragma unroll
        for (int i = 0; i < N; i++) acc[i] = 0.0f;
#pragma unroll
        for (int j = 0; j < L; j++) {
            const u32 c = c0 + 32 * j;
            if (c < c8) {
#pragma unroll
                for (int i = 0; i < N; i++) acc[i] = dot8_bf16(wv[j], xv[i * c8 + c], acc[i]);
            }
        }
        // The next item's loads go out before this one's reduction.
        if (it + WARPS < items) gemv_load_item<L>(wv, Wv, c8, S, r_lo, it + WARPS, lane);
#pragma unroll
        for (int i = 0; i < N; i++) {
            float v = acc[i];
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            acc[i] = v;
        }
        if (lane == 0) {
#pragma unroll
            for (int i = 0; i < N; i++) part[(u64)it * N + i] = acc[i];
        }
    }
    __syncthreads();
    for (u32 t = threadIdx.x; t < (r_hi - r_lo) * N; t += 32 * WARPS) {
        const u32 rl = t / N, i = t % N;
        float s = 0.0f;
        for (u32 k = 0; k < S; k++) s += part[((u64)rl * S + k) * N + i];
        float* o = y + (u64)i * rows + r_lo + rl;
        *o = accumulate ? *o + s : s;
    }
}

// pk_gemv_split_bf16_n{N}_w{WARPS}: 8 loads in flight per lane; MINB blocks per SM promised to
// the compiler (caps the registers at 65536 / (32 · WARPS · MINB) = 64, no spills). 32 warps: one
// block per SM; 16 warps: two blocks per SM (of this product, or one of it and one of the next).
#define PK_GEMV_SPLIT(N, WARPS, MINB)                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * WARPS, MINB)                                             \
        pk_gemv_split_bf16_n##N##_w##WARPS(float* y, const u16* W, const float* x, const float* nw,           \
                                           const u32* xrows, u32 rows, u32 cols, u32 mode, float eps,          \
                                           u32 accumulate) {                                                   \
        gemv_split_bf16<N, WARPS, 8>(y, W, x, nw, xrows, rows, cols, mode, eps, accumulate);                   \
    }
#define PK_GEMV_SPLIT_ALL_N(W, MINB) \
    PK_GEMV_SPLIT(1, W, MINB) PK_GEMV_SPLIT(2, W, MINB) PK_GEMV_SPLIT(3, W, MINB) PK_GEMV_SPLIT(4, W, MINB)
PK_GEMV_SPLIT_ALL_N(32, 1)
PK_GEMV_SPLIT_ALL_N(16, 2)
