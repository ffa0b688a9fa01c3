// qmatrix.cu — products against GGUF-quantized weights kept quantized on the device
// (src/qmatrix.rs): the decode matrix-vector product with int8 activations (dp4a), the
// dequantization of rows into bf16 tiles for cuBLAS (large batches) or f32 rows (embedding
// lookups), and random blocks of each type for synthetic models.
//
// Device layout of a matrix [rows, cols] of type QT (blocks of 32 values, or super-blocks of 256
// for the K-quants): `data` holds each row's blocks, every block without its f16 header fields
// where those would break 4-byte alignment; those fields sit in `hdr` (u16, per block, in order):
//   QT        GGUF block               data bytes / block   hdr halves / block
//   Q4_0      d, qs[16]                16 (qs)               1 (d)
//   Q4_1      d, m, qs[16]             16 (qs)               2 (d, m)
//   Q5_0      d, qh[4], qs[16]         20 (qh, qs)           1 (d)
//   Q5_1      d, m, qh[4], qs[16]      20 (qh, qs)           2 (d, m)
//   Q8_0      d, qs[32]                32 (qs)               1 (d)
//   Q4_K      d, dmin, sc[12], qs[128] 144 (as in the file)  0
//   Q5_K      d, dmin, sc[12], qh[32], qs[128]  176 (as in the file)  0
//   Q6_K      ql[128], qh[64], sc[16], d        208 (ql, qh, sc)      1 (d)
// Values and their order are exactly GGUF's (crates/cpu/src/quant/reference.rs); only the bytes
// are regrouped, so every load of `data` is 4-byte aligned (16-byte for whole 16-byte runs).
//
// A "unit" is 32 consecutive values of a row (one block, or one sub-block of a super-block):
// `q_unit` yields its codes as eight words of four signed bytes (values 4k..4k+3 in word k) and
// value = a0·code + b for values 0..15, a1·code + b for 16..31.

#define QT_Q4_0 0
#define QT_Q4_1 1
#define QT_Q5_0 2
#define QT_Q5_1 3
#define QT_Q8_0 4
#define QT_Q4_K 5
#define QT_Q5_K 6
#define QT_Q6_K 7

template <int QT>
struct QTraits;
template <> struct QTraits<QT_Q4_0> { enum { VALUES = 32, DATA = 16, HDR = 1 }; };
template <> struct QTraits<QT_Q4_1> { enum { VALUES = 32, DATA = 16, HDR = 2 }; };
template <> struct QTraits<QT_Q5_0> { enum { VALUES = 32, DATA = 20, HDR = 1 }; };
template <> struct QTraits<QT_Q5_1> { enum { VALUES = 32, DATA = 20, HDR = 2 }; };
template <> struct QTraits<QT_Q8_0> { enum { VALUES = 32, DATA = 32, HDR = 1 }; };
template <> struct QTraits<QT_Q4_K> { enum { VALUES = 256, DATA = 144, HDR = 0 }; };
template <> struct QTraits<QT_Q5_K> { enum { VALUES = 256, DATA = 176, HDR = 0 }; };
template <> struct QTraits<QT_Q6_K> { enum { VALUES = 256, DATA = 208, HDR = 1 }; };

struct QUnit {
    int w[8];
    float a0, a1, b;
};

// Bits 0..3 of `b` to bit 0 of bytes 0..3.
__device__ __forceinline__ u32 spread4(u32 b) { return (b * 0x00204081u) & 0x01010101u; }

// Bytes v − b of four bytes v, each in 0..2b (b = 8, 16, 32: the codes' offset), as signed bytes:
// v + 128 − b stays within its byte (no carry into the next), and flipping bit 7 subtracts 128
// modulo 256. Two instructions where __vsub4 takes several on GPUs without SIMD byte arithmetic.
template <u32 B>
__device__ __forceinline__ u32 sub_offset4(u32 v) { return (v + (128u - B) * 0x01010101u) ^ 0x80808080u; }

// c + the dot product of a's four unsigned bytes with b's four signed bytes.
__device__ __forceinline__ int dp4a_us(u32 a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// The K-quants' 6-bit scale and min of sub-block j from their 12 packed bytes (s0..s2 as words):
// bytes 0..3 hold the scales of 0..3 (and bits 4..5 of those of 4..7), bytes 4..7 the mins of
// 0..3 (likewise), bytes 8..11 the low 4 bits of both for 4..7. Byte k = j % 4 of each word, by
// shifts (an array indexed by j would live in local memory).
__device__ __forceinline__ void scale_min_k4(u32 j, u32 s0, u32 s1, u32 s2, u32& sc, u32& m) {
    const u32 sh = 8 * (j & 3);
    const u32 b0 = (s0 >> sh) & 0xffu, b1 = (s1 >> sh) & 0xffu, b2 = (s2 >> sh) & 0xffu;
    if (j < 4) {
        sc = b0 & 63;
        m = b1 & 63;
    } else {
        sc = (b2 & 0xf) | ((b0 >> 6) << 4);
        m = (b2 >> 4) | ((b1 >> 6) << 4);
    }
}

__device__ __forceinline__ uint4 ld_stream(const u8* p) { return __ldcs((const uint4*)p); }

// Loads of a block's bytes: streaming loads from global memory (G), plain loads otherwise (a
// block staged in shared memory).
template <bool G>
__device__ __forceinline__ uint4 ld_q4(const u8* p) { return G ? ld_stream(p) : *(const uint4*)p; }
template <bool G>
__device__ __forceinline__ u32 ld_q1(const u32* p) { return G ? __ldcs(p) : *p; }

// Unit j of the block whose data bytes start at p and whose header halves start at h (d, then m
// for the `_1` types; unused by Q4_K / Q5_K).
template <int QT, bool G>
__device__ __forceinline__ void q_unit_at(QUnit& r, const u8* __restrict__ p, const u16* __restrict__ h, u32 j) {
    if (QT == QT_Q8_0) {
        const uint4 a = ld_q4<G>(p), c = ld_q4<G>(p + 16);
        const u32 v[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
#pragma unroll
        for (int k = 0; k < 8; k++) r.w[k] = (int)v[k];
        r.a0 = r.a1 = f16_to_f32(h[0]);
        r.b = 0.0f;
    } else if (QT == QT_Q4_0 || QT == QT_Q4_1) {
        const uint4 a = ld_q4<G>(p);
        const u32 v[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const u32 lo = v[k] & 0x0f0f0f0fu, hi = (v[k] >> 4) & 0x0f0f0f0fu;
            r.w[k] = (int)(QT == QT_Q4_0 ? sub_offset4<8>(lo) : lo);
            r.w[k + 4] = (int)(QT == QT_Q4_0 ? sub_offset4<8>(hi) : hi);
        }
        r.a0 = r.a1 = f16_to_f32(h[0]);
        r.b = QT == QT_Q4_1 ? f16_to_f32(h[1]) : 0.0f;
    } else if (QT == QT_Q5_0 || QT == QT_Q5_1) {
        const u32* q = (const u32*)p;
        const u32 qh = ld_q1<G>(q);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const u32 qs = ld_q1<G>(q + 1 + k);
            const u32 lo = (qs & 0x0f0f0f0fu) | (spread4((qh >> (4 * k)) & 0xf) << 4);
            const u32 hi = ((qs >> 4) & 0x0f0f0f0fu) | (spread4((qh >> (16 + 4 * k)) & 0xf) << 4);
            r.w[k] = (int)(QT == QT_Q5_0 ? sub_offset4<16>(lo) : lo);
            r.w[k + 4] = (int)(QT == QT_Q5_0 ? sub_offset4<16>(hi) : hi);
        }
        r.a0 = r.a1 = f16_to_f32(h[0]);
        r.b = QT == QT_Q5_1 ? f16_to_f32(h[1]) : 0.0f;
    } else if (QT == QT_Q4_K || QT == QT_Q5_K) {
        const u32* h = (const u32*)p;
        const u32 dd = h[0];
        u32 sc, m;
        scale_min_k4(j, h[1], h[2], h[3], sc, m);
        const float d = f16_to_f32((u16)(dd & 0xffff)), dmin = f16_to_f32((u16)(dd >> 16));
        const u32 qs_off = (QT == QT_Q4_K ? 16 : 48) + 32 * (j / 2), shift = 4 * (j & 1);
        const uint4 a = ld_q4<G>(p + qs_off), c = ld_q4<G>(p + qs_off + 16);
        const u32 v[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
        if (QT == QT_Q4_K) {
#pragma unroll
            for (int k = 0; k < 8; k++) r.w[k] = (int)((v[k] >> shift) & 0x0f0f0f0fu);
        } else {
            const uint4 ha = ld_q4<G>(p + 16), hc = ld_q4<G>(p + 32);
            const u32 hv[8] = {ha.x, ha.y, ha.z, ha.w, hc.x, hc.y, hc.z, hc.w};
#pragma unroll
            for (int k = 0; k < 8; k++) r.w[k] = (int)(((v[k] >> shift) & 0x0f0f0f0fu) | (((hv[k] >> j) & 0x01010101u) << 4));
        }
        r.a0 = r.a1 = __fmul_rn(d, (float)sc);
        r.b = -__fmul_rn(dmin, (float)m);
    } else {  // QT_Q6_K
        const u32 n = j / 4, k4 = j % 4;
        const uint4 la = ld_q4<G>(p + 64 * n + 32 * (k4 & 1)), lc = ld_q4<G>(p + 64 * n + 32 * (k4 & 1) + 16);
        const uint4 ha = ld_q4<G>(p + 128 + 32 * n), hc = ld_q4<G>(p + 128 + 32 * n + 16);
        const u32 lv[8] = {la.x, la.y, la.z, la.w, lc.x, lc.y, lc.z, lc.w};
        const u32 hv[8] = {ha.x, ha.y, ha.z, ha.w, hc.x, hc.y, hc.z, hc.w};
        const u32 ls = 4 * (k4 >> 1), hs = 2 * k4;
#pragma unroll
        for (int k = 0; k < 8; k++)
            r.w[k] = (int)sub_offset4<32>(((lv[k] >> ls) & 0x0f0f0f0fu) | (((hv[k] >> hs) & 0x03030303u) << 4));
        const u32 s = *(const u16*)(p + 192 + 8 * n + 2 * k4);
        const float d = f16_to_f32(h[0]);
        r.a0 = __fmul_rn(d, (float)(signed char)(s & 0xff));
        r.a1 = __fmul_rn(d, (float)(signed char)(s >> 8));
        r.b = 0.0f;
    }
}

// Unit u of row `row` (bpr blocks per row) in global memory.
template <int QT>
__device__ __forceinline__ void q_unit(QUnit& r, const u8* __restrict__ data, const u16* __restrict__ hdr, u64 row,
                                       u32 u, u32 bpr) {
    typedef QTraits<QT> T;
    const u32 upb = T::VALUES / 32;
    const u64 blk = row * bpr + u / upb;
    q_unit_at<QT, true>(r, data + blk * T::DATA, hdr + T::HDR * blk, u % upb);
}

// Code i (0..31) of a unit as an int.
__device__ __forceinline__ int unit_code(const QUnit& r, int i) {
    return (int)(signed char)((u32)r.w[i >> 2] >> (8 * (i & 3)));
}

// Values i0 and i0 + 1 (i0 even) of a unit as two bf16 in one word, value i0 in the low half:
// a · code + b in f32, each rounded to nearest. The codes become floats through the 2^23 magic
// number (a PRMT and an FADD each: full-rate, where an I2F is quarter-rate).
__device__ __forceinline__ u32 unit_bf16x2(const QUnit& q, int i0) {
    const float a = i0 < 16 ? q.a0 : q.a1;
    const u32 w = (u32)q.w[i0 >> 2] ^ 0x80808080u;  // code + 128 per byte
    const float c0 = byte_as_float(w, i0 & 3, 8388736.0f), c1 = byte_as_float(w, (i0 & 3) + 1, 8388736.0f);
    const float v0 = __fadd_rn(__fmul_rn(a, c0), q.b), v1 = __fadd_rn(__fmul_rn(a, c1), q.b);
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(v1), "f"(v0));
    return r;
}

// Values 8k .. 8k + 7 of a unit as eight bf16 (one 16-byte store).
__device__ __forceinline__ uint4 unit_bf16x8(const QUnit& q, int k) {
    return make_uint4(unit_bf16x2(q, 8 * k), unit_bf16x2(q, 8 * k + 2), unit_bf16x2(q, 8 * k + 4),
                      unit_bf16x2(q, 8 * k + 6));
}

__device__ __forceinline__ float q_silu_mul(float g, float u) {
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(0.0f - g))), u);
}

// ---- Decode product: y [n, ldy] (columns 0..rows) (+)= x' [n, cols] · Wᵀ, n = N ≤ 4 token rows.
// x' is the prologue of `mode` on x, as model.cu's matrix-vector kernels define it (0: x,
// 1: rms_norm(x[xrows[i] or i]) · nw, 2: silu(x[:, :cols]) · x[:, cols:], 3: gelu(x[:, :cols])
// · x[:, cols:]), quantized per 32 values to int8 (round(x · 127 / amax)) with one f32 scale
// (amax / 127) and the f32 sum of the 32 values (for the types with a min); each unit's dot
// product is four dp4a per token row and half of the unit.
// One block of QG_WARPS warps per SM; a warp owns a row at a time, its lanes take units in
// turn. Dynamic shared memory: N · cols (codes) + 8 · N · cols / 32 (scales and sums) bytes.
#define QG_WARPS 32

// x' of `mode` (see above) quantized into xq [N, cols / 4] (int8 × 4), xd [N, cols / 32] (scales)
// and xs [N, cols / 32] (sums), by the whole block (QG_WARPS warps). A thread takes 4 consecutive
// values at a time (one 16-byte load of each input), 8 lanes a 32-value group, and issues the
// loads of QP_STEPS such steps before it uses any: the prologue is a few dependent L2 round
// trips, not one per group. Within a token row the layout is by lane unit (UW consecutive values,
// U = cols / UW units) so that lanes reading the same part of consecutive units hit consecutive
// shared-memory words (no bank conflicts): the 16-value group j of unit u is int4 number j · U + u,
// and the 32-value block b of unit u has its scale and sum at b · U + u.
#define QP_STEPS 4
template <int N, int UW>
__device__ void qgemv_prologue(int* __restrict__ xq, float* __restrict__ xd, float* __restrict__ xs,
                               const float* __restrict__ x, const float* __restrict__ nw,
                               const u32* __restrict__ xrows, u32 cols, u32 mode, float eps) {
    __shared__ double red[QG_WARPS];
    __shared__ float inv_s;
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nb = cols / 32, c4 = cols / 4, U = cols / UW;
    const u32 T = 32 * QG_WARPS;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int i = 0; i < N; i++) {
        const u32 src = xrows ? xrows[i] : (u32)i;
        const float4* xr = (const float4*)(x + (u64)src * cols * (mode >= 2 ? 2 : 1));
        float inv = 1.0f;
        if (mode == 1) {
            // Squares summed in f64 (as the CPU and pk_rms_norm), the mean rounded to f32.
            double s = 0.0;
            for (u32 q0 = threadIdx.x; q0 < c4; q0 += QP_STEPS * T) {
                float4 a[QP_STEPS];
#pragma unroll
                for (int k = 0; k < QP_STEPS; k++) a[k] = q0 + k * T < c4 ? xr[q0 + k * T] : zero;
#pragma unroll
                for (int k = 0; k < QP_STEPS; k++)
                    s += (double)__fmul_rn(a[k].x, a[k].x) + (double)__fmul_rn(a[k].y, a[k].y) +
                         (double)__fmul_rn(a[k].z, a[k].z) + (double)__fmul_rn(a[k].w, a[k].w);
            }
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if (lane == 0) red[warp] = s;
            __syncthreads();
            if (warp == 0) {
                double t = lane < QG_WARPS ? red[lane] : 0.0;
                for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
                if (lane == 0) inv_s = 1.0f / sqrtf((float)(t / (double)cols) + eps);
            }
            __syncthreads();
            inv = inv_s;
        }
        // Warp-uniform trip count: every lane reaches the group shuffles (c4 is a multiple of 8,
        // so a group's 8 lanes are all in range or all out).
        for (u32 b0 = warp * 32; b0 < c4; b0 += QP_STEPS * T) {
            float4 v[QP_STEPS];
#pragma unroll
            for (int k = 0; k < QP_STEPS; k++) {
                const u32 q = b0 + k * T + lane;
                if (q >= c4) {
                    v[k] = zero;
                } else if (mode >= 2) {
                    const float4 g = xr[q], u = xr[c4 + q];
                    v[k] = mode == 3 ? make_float4(pk_gelu_mul1(g.x, u.x), pk_gelu_mul1(g.y, u.y),
                                                   pk_gelu_mul1(g.z, u.z), pk_gelu_mul1(g.w, u.w))
                                     : make_float4(q_silu_mul(g.x, u.x), q_silu_mul(g.y, u.y),
                                                   q_silu_mul(g.z, u.z), q_silu_mul(g.w, u.w));
                } else {
                    v[k] = xr[q];
                    if (mode == 1) {
                        const float4 w = ((const float4*)nw)[q];
                        v[k] = make_float4(__fmul_rn(__fmul_rn(v[k].x, inv), w.x), __fmul_rn(__fmul_rn(v[k].y, inv), w.y),
                                           __fmul_rn(__fmul_rn(v[k].z, inv), w.z), __fmul_rn(__fmul_rn(v[k].w, inv), w.w));
                    }
                }
            }
#pragma unroll
            for (int k = 0; k < QP_STEPS; k++) {
                const u32 q = b0 + k * T + lane;
                float amax = fmaxf(fmaxf(fabsf(v[k].x), fabsf(v[k].y)), fmaxf(fabsf(v[k].z), fabsf(v[k].w)));
                float sum = ((v[k].x + v[k].y) + v[k].z) + v[k].w;
#pragma unroll
                for (int o = 1; o < 8; o <<= 1) {
                    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
                    sum += __shfl_xor_sync(0xffffffffu, sum, o);
                }
                // Codes round(x · 127 / amax), ties to even, one division a group: the rounding
                // of the CPU's Q8_0/Q8_1 activations (llama.cpp's x86 quantize_row_q8_0; the
                // CPU's K-quant activations are 256-value Q8_K blocks, the GPU's are 32-value).
                const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
                const u32 c0 = (u32)__float2int_rn(__fmul_rn(v[k].x, id)) & 0xffu;
                const u32 c1 = (u32)__float2int_rn(__fmul_rn(v[k].y, id)) & 0xffu;
                const u32 c2 = (u32)__float2int_rn(__fmul_rn(v[k].z, id)) & 0xffu;
                const u32 c3 = (u32)__float2int_rn(__fmul_rn(v[k].w, id)) & 0xffu;
                if (q < c4) {
                    const u32 c = 4 * q, u = c / UW, j = (c % UW) / 16, bi = (c % UW) / 32;
                    xq[(u64)i * c4 + 4 * (j * U + u) + (c % 16) / 4] = (int)(c0 | (c1 << 8) | (c2 << 16) | (c3 << 24));
                    if ((lane & 7) == 0) {
                        xd[i * nb + bi * U + u] = d;
                        xs[i * nb + bi * U + u] = sum;
                    }
                }
            }
        }
        __syncthreads();  // `red` and `inv_s` are reused by the next row's norm
    }
}

template <int QT, int N>
__device__ void qgemv(float* __restrict__ y, u32 ldy, const u8* __restrict__ data, const u16* __restrict__ hdr,
                      const float* __restrict__ x, const float* __restrict__ nw, const u32* __restrict__ xrows,
                      u32 rows, u32 cols, u32 mode, float eps, u32 accumulate, u32 sibling) {
    extern __shared__ __align__(16) unsigned char qg_smem[];
    const u32 nb = cols / 32, bpr = cols / QTraits<QT>::VALUES;
    int* xq = (int*)qg_smem;                                    // [N, cols / 4]
    float* xd = (float*)(qg_smem + (u64)N * cols);              // [N, nb]
    float* xs = xd + N * nb;                                    // [N, nb]
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (!sibling) pdl_wait();
    pdl_trigger();
    qgemv_prologue<N, 32>(xq, xd, xs, x, nw, xrows, cols, mode, eps);
    for (u32 row = blockIdx.x * QG_WARPS + warp; row < rows; row += gridDim.x * QG_WARPS) {
        float acc[N];
#pragma unroll
        for (int i = 0; i < N; i++) acc[i] = 0.0f;
#pragma unroll 2
        for (u32 u = lane; u < nb; u += 32) {
            QUnit q;
            q_unit<QT>(q, data, hdr, row, u, bpr);
#pragma unroll
            for (int i = 0; i < N; i++) {
                // Unit u's two 16-value groups (the prologue's layout with 32-value units).
                const int4* xw = (const int4*)(xq + (u64)i * (cols / 4));
                const int4 x0 = xw[u], x1 = xw[nb + u];
                int s0 = __dp4a(q.w[0], x0.x, 0);
                s0 = __dp4a(q.w[1], x0.y, s0);
                s0 = __dp4a(q.w[2], x0.z, s0);
                s0 = __dp4a(q.w[3], x0.w, s0);
                int s1 = __dp4a(q.w[4], x1.x, 0);
                s1 = __dp4a(q.w[5], x1.y, s1);
                s1 = __dp4a(q.w[6], x1.z, s1);
                s1 = __dp4a(q.w[7], x1.w, s1);
                const float dot = fmaf(q.a0, (float)s0, q.a1 * (float)s1);
                acc[i] = fmaf(xd[i * nb + u], dot, fmaf(q.b, xs[i * nb + u], acc[i]));
            }
        }
#pragma unroll
        for (int i = 0; i < N; i++) acc[i] = warp_sum(acc[i]);
        if (lane == 0) {
#pragma unroll
            for (int i = 0; i < N; i++) {
                float* o = y + (u64)i * ldy + row;
                *o = accumulate ? *o + acc[i] : acc[i];
            }
        }
    }
    if (sibling) pdl_wait();  // done only once the launch before is (see PK_QGEMV)
}


// ---- Decode product for the K-quants (Q4_K, Q5_K, Q6_K): the same contract and prologue as
// qgemv, laid out so each lane keeps 80–112 bytes of one row's weights in flight. A lane unit is
// half a super-block (128 values, four 32-value sub-blocks); a row of U = cols / 128 units is
// served by LPR lanes (the power of two ≥ U, at most 32; narrow rows pack 32 / LPR rows into a
// warp). Rows are split evenly over the blocks (one per SM); a block's items (row group, slice
// of LPR units) go to its warps in turn, each item's per-row sums land in shared memory and are
// added in slice order at the end (deterministic). Dynamic shared memory: as qgemv, plus
// ceil(rows / blocks) · ceil(U / LPR) · N · 4 bytes.
// The raw words of one lane unit (half super-block h of block `blk`) of a K-quant.
struct KRaw {
    u32 q[16];  // Q4_K/Q5_K: qs of the half; Q6_K: ql of the half
    u32 e[8];   // Q5_K: qh (all 32 bytes); Q6_K: qh of the half
    uint4 hd;   // Q4_K/Q5_K: d, dmin, 12 scale bytes; Q6_K: .x, .y the half's 8 scales, .z d
};

template <int QT>
__device__ __forceinline__ void k_load(KRaw& r, const u8* __restrict__ p, const u16* __restrict__ hdr, u64 blk,
                                       u32 h) {
    uint4 v[4];
    if (QT == QT_Q6_K) {
#pragma unroll
        for (int k = 0; k < 4; k++) v[k] = ld_stream(p + 64 * h + 16 * k);
        const uint4 a = ld_stream(p + 128 + 32 * h), b = ld_stream(p + 128 + 32 * h + 16);
        r.e[0] = a.x, r.e[1] = a.y, r.e[2] = a.z, r.e[3] = a.w, r.e[4] = b.x, r.e[5] = b.y, r.e[6] = b.z, r.e[7] = b.w;
        const uint2 sc8 = *(const uint2*)(p + 192 + 8 * h);
        r.hd = make_uint4(sc8.x, sc8.y, (u32)hdr[blk], 0);
    } else {
        const u32 qs_off = (QT == QT_Q4_K ? 16 : 48) + 64 * h;
        r.hd = *(const uint4*)p;
#pragma unroll
        for (int k = 0; k < 4; k++) v[k] = ld_stream(p + qs_off + 16 * k);
        if (QT == QT_Q5_K) {
            const uint4 a = ld_stream(p + 16), b = ld_stream(p + 32);
            r.e[0] = a.x, r.e[1] = a.y, r.e[2] = a.z, r.e[3] = a.w, r.e[4] = b.x, r.e[5] = b.y, r.e[6] = b.z, r.e[7] = b.w;
        }
    }
#pragma unroll
    for (int k = 0; k < 4; k++) r.q[4 * k] = v[k].x, r.q[4 * k + 1] = v[k].y, r.q[4 * k + 2] = v[k].z, r.q[4 * k + 3] = v[k].w;
}

// acc[i] += the lane unit's 128 weights · token row i's input (unit u of the prologue's layout
// with 128-value units, U = cols / 128 a row).
template <int QT, int N>
__device__ __forceinline__ void k_dot(float (&acc)[N], const KRaw& r, u32 h, const int* __restrict__ xq,
                                      const float* __restrict__ xd, const float* __restrict__ xs, u32 cols, u32 nb,
                                      u32 u) {
    const u32 U = cols / 128;
    if (QT == QT_Q6_K) {
        const float d = f16_to_f32((u16)r.hd.z);
        const u32 scw[2] = {r.hd.x, r.hd.y};
#pragma unroll
        for (int t = 0; t < 4; t++) {
            // Quarter t: ql words 8·(t & 1).., nibble 4·(t >> 1); qh bits 2t; scales 2t, 2t + 1.
            int w[8];
#pragma unroll
            for (int k = 0; k < 8; k++)
                w[k] = (int)sub_offset4<32>(((r.q[8 * (t & 1) + k] >> (4 * (t >> 1))) & 0x0f0f0f0fu) |
                                            (((r.e[k] >> (2 * t)) & 0x03030303u) << 4));
            const float a0 = __fmul_rn(d, (float)(signed char)(scw[t >> 1] >> (16 * (t & 1))));
            const float a1 = __fmul_rn(d, (float)(signed char)(scw[t >> 1] >> (16 * (t & 1) + 8)));
#pragma unroll
            for (int i = 0; i < N; i++) {
                const int4* xw = (const int4*)(xq + (u64)i * (cols / 4));
                const int4 x0 = xw[(2 * t) * U + u], x1 = xw[(2 * t + 1) * U + u];
                int s0 = __dp4a(w[0], x0.x, 0);
                s0 = __dp4a(w[1], x0.y, s0);
                s0 = __dp4a(w[2], x0.z, s0);
                s0 = __dp4a(w[3], x0.w, s0);
                int s1 = __dp4a(w[4], x1.x, 0);
                s1 = __dp4a(w[5], x1.y, s1);
                s1 = __dp4a(w[6], x1.z, s1);
                s1 = __dp4a(w[7], x1.w, s1);
                acc[i] = fmaf(xd[i * nb + t * U + u], fmaf(a0, (float)s0, a1 * (float)s1), acc[i]);
            }
        }
    } else {
        const float d = f16_to_f32((u16)(r.hd.x & 0xffff)), dmin = f16_to_f32((u16)(r.hd.x >> 16));
        const float d16 = __fmul_rn(d, 0.0625f);  // exact: d / 16 is a normal f32 for every f16 d
        // The 6-bit scales and mins of sub-blocks 4h..4h + 3, four bytes per word.
        const u32 sc4 = h == 0 ? (r.hd.y & 0x3f3f3f3fu) : ((r.hd.w & 0x0f0f0f0fu) | ((r.hd.y >> 2) & 0x30303030u));
        const u32 m4 =
            h == 0 ? (r.hd.z & 0x3f3f3f3fu) : (((r.hd.w >> 4) & 0x0f0f0f0fu) | ((r.hd.z >> 2) & 0x30303030u));
#pragma unroll
        for (int t = 0; t < 4; t++) {
            // Sub-block 4h + t: qs words 8·(t >> 1).., nibble 4·(t & 1); Q5_K's high bit 4h + t.
            // Q4_K's high nibbles stay in place (codes · 16, unsigned bytes) with the scale / 16:
            // the product is the same float (an exact scaling by 16 of both factors), one shift
            // a word less.
            const bool in_place = QT == QT_Q4_K && (t & 1);
            u32 w[8];
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const u32 q = r.q[8 * (t >> 1) + k];
                u32 v = in_place ? q & 0xf0f0f0f0u : (q >> (4 * (t & 1))) & 0x0f0f0f0fu;
                if (QT == QT_Q5_K) v |= ((r.e[k] >> (4 * h + t)) & 0x01010101u) << 4;
                w[k] = v;
            }
            const float a = __fmul_rn(in_place ? d16 : d, (float)((sc4 >> (8 * t)) & 0xff));
            const float b = -__fmul_rn(dmin, (float)((m4 >> (8 * t)) & 0xff));
#pragma unroll
            for (int i = 0; i < N; i++) {
                const int4* xw = (const int4*)(xq + (u64)i * (cols / 4));
                const int4 x0 = xw[(2 * t) * U + u], x1 = xw[(2 * t + 1) * U + u];
                int s = dp4a_us(w[0], x0.x, 0);
                s = dp4a_us(w[1], x0.y, s);
                s = dp4a_us(w[2], x0.z, s);
                s = dp4a_us(w[3], x0.w, s);
                s = dp4a_us(w[4], x1.x, s);
                s = dp4a_us(w[5], x1.y, s);
                s = dp4a_us(w[6], x1.z, s);
                s = dp4a_us(w[7], x1.w, s);
                acc[i] = fmaf(xd[i * nb + t * U + u], a * (float)s, fmaf(b, xs[i * nb + t * U + u], acc[i]));
            }
        }
    }
}

// Lanes per row of the K-quant product for U units per row: the power of two ≥ U (at most 32),
// or, where that leaves lanes idle, the widest power of two ≥ 4 dividing U when one does
// (a 14,336-wide row, U = 112: 16 lanes and 7 slices, not 32 lanes and 4 slices of which the
// last is half idle). Mirrored by `QuantOps::gemv_launch`.
__device__ __forceinline__ u32 k_lanes_per_row(u32 units) {
    u32 l = 32;
    while (l > 1 && l / 2 >= units) l /= 2;
    for (u32 m = l; m >= 4; m /= 2)
        if (units % m == 0) return m;
    return l;
}

// Starts fetching item `it`'s weights into L2 without waiting for them (Hopper's bulk prefetch;
// nothing on earlier GPUs): the first lane of each of the item's rows asks for that row's slice,
// whole super-blocks and so one contiguous, 16-byte-aligned run of `data`.
template <int QT>
__device__ __forceinline__ void k_prefetch(const u8* __restrict__ data, u32 bpr, u32 r_lo, u32 nrows, u32 units,
                                           u32 lpr, u32 rpi, u32 S, u32 items, u32 it, u32 lane) {
#if __CUDA_ARCH__ >= 900
    const u32 r = it / S * rpi + lane / lpr, u0 = it % S * lpr;
    if (it >= items || lane % lpr != 0 || r >= nrows) return;
    const u32 u1 = min(u0 + lpr, units);  // u0 and u1 even: lpr and units are
    const u8* p = data + ((u64)(r_lo + r) * bpr + u0 / 2) * QTraits<QT>::DATA;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"((u1 - u0) / 2 * QTraits<QT>::DATA)
                 : "memory");
#endif
}

// From the module's options (spec.rs, CudaTuning): QK_PREFETCH, rounds of items (one item a
// warp) a K-quant product fetches into L2 ahead of the one it multiplies, the first rounds before
// it waits on the previous kernel (PDL); QK_REGLOAD 1: each warp also loads its first items into
// registers before that wait, so their latency overlaps the input's prologue.
#if !defined(QK_PREFETCH) || !defined(QK_REGLOAD)
#error "QK_PREFETCH and QK_REGLOAD are set by the Quant module's options (spec.rs)"
#endif

// Block `blk` of the `nblk` blocks serving this matrix (the launch's own blocks, or its share of
// a paired launch: qgemv_k_pair).
template <int QT, int N, int ITEMS>
__device__ void qgemv_k(float* __restrict__ y, u32 ldy, const u8* __restrict__ data, const u16* __restrict__ hdr,
                        const float* __restrict__ x, const float* __restrict__ nw, const u32* __restrict__ xrows,
                        u32 rows, u32 cols, u32 mode, float eps, u32 accumulate, u32 sibling, u32 blk, u32 nblk) {
    extern __shared__ __align__(16) unsigned char qg_smem[];
    const u32 nb = cols / 32, units = cols / 128, bpr = cols / 256;
    int* xq = (int*)qg_smem;                        // [N, cols / 4]
    float* xd = (float*)(qg_smem + (u64)N * cols);  // [N, nb]
    float* xs = xd + N * nb;                        // [N, nb]
    float* part = xs + N * nb;                      // [rows of the block, S, N]
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const u32 lpr = k_lanes_per_row(units), rpi = 32 / lpr, S = (units + lpr - 1) / lpr;
    const u32 r_lo = (u32)((u64)blk * rows / nblk);
    const u32 r_hi = (u32)((u64)(blk + 1) * rows / nblk);
    const u32 nrows = r_hi - r_lo, items = (nrows + rpi - 1) / rpi * S;
    // The weights do not depend on the previous kernel: their first rounds stream into L2 while
    // it drains and while the prologue runs.
#pragma unroll
    for (u32 d = 0; d < QK_PREFETCH; d++)
        k_prefetch<QT>(data, bpr, r_lo, nrows, units, lpr, rpi, S, items, warp + d * QG_WARPS, lane);
    KRaw raw[ITEMS];
    u32 rr[ITEMS], uu[ITEMS];
    bool ok[ITEMS];
    // Loads item it0 + j · QG_WARPS's weights into raw[j] (j < ITEMS).
    auto load = [&](u32 it0) {
#pragma unroll
        for (int j = 0; j < ITEMS; j++) {
            const u32 it = it0 + j * QG_WARPS, g = it / S, sl = it % S;
            rr[j] = g * rpi + lane / lpr;
            uu[j] = sl * lpr + lane % lpr;
            ok[j] = it < items && rr[j] < nrows && uu[j] < units;
            if (ok[j]) {
                const u64 blk = (u64)(r_lo + rr[j]) * bpr + uu[j] / 2;
                k_load<QT>(raw[j], data + blk * QTraits<QT>::DATA, hdr, blk, uu[j] & 1);
            }
        }
    };
#if QK_REGLOAD
    load(warp);
#endif
    if (!sibling) pdl_wait();
    pdl_trigger();
    qgemv_prologue<N, 128>(xq, xd, xs, x, nw, xrows, cols, mode, eps);
    // ITEMS items a warp at a time: every item's weights are loaded before any is multiplied.
    for (u32 it0 = warp; it0 < items; it0 += ITEMS * QG_WARPS) {
#pragma unroll
        for (int j = 0; j < ITEMS; j++)
            if (QK_PREFETCH > 0)
                k_prefetch<QT>(data, bpr, r_lo, nrows, units, lpr, rpi, S, items,
                               it0 + (QK_PREFETCH + j) * QG_WARPS, lane);
        if (!QK_REGLOAD || it0 != warp) load(it0);
#pragma unroll
        for (int j = 0; j < ITEMS; j++) {
            const u32 it = it0 + j * QG_WARPS;
            if (it >= items) break;  // warp-uniform
            float acc[N];
#pragma unroll
            for (int i = 0; i < N; i++) acc[i] = 0.0f;
            if (ok[j]) k_dot<QT, N>(acc, raw[j], uu[j] & 1, xq, xd, xs, cols, nb, uu[j]);
            for (u32 o = lpr / 2; o > 0; o >>= 1) {
#pragma unroll
                for (int i = 0; i < N; i++) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o);
            }
            if (lane % lpr == 0 && rr[j] < nrows) {
#pragma unroll
                for (int i = 0; i < N; i++) part[((u64)rr[j] * S + it % S) * N + i] = acc[i];
            }
        }
    }
    __syncthreads();
    for (u32 t = threadIdx.x; t < nrows * N; t += blockDim.x) {
        const u32 rl = t / N, i = t % N;
        float s = 0.0f;
        for (u32 k = 0; k < S; k++) s += part[((u64)rl * S + k) * N + i];
        float* o = y + (u64)i * ldy + r_lo + rl;
        *o = accumulate ? *o + s : s;
    }
    if (sibling) pdl_wait();  // done only once the launch before is (see PK_QGEMV)
}

// The K-quant product as a launch of its own: the launch's blocks serve the whole matrix.
template <int QT, int N, int ITEMS>
__device__ __forceinline__ void qgemv_k_grid(float* __restrict__ y, u32 ldy, const u8* __restrict__ data,
                                             const u16* __restrict__ hdr, const float* __restrict__ x,
                                             const float* __restrict__ nw, const u32* __restrict__ xrows, u32 rows,
                                             u32 cols, u32 mode, float eps, u32 accumulate, u32 sibling) {
    qgemv_k<QT, N, ITEMS>(y, ldy, data, hdr, x, nw, xrows, rows, cols, mode, eps, accumulate, sibling, blockIdx.x,
                          gridDim.x);
}

// ---- A weight stacked from two K-quant parts of different types (Q4_K_M's q|k and v) in one
// launch: blocks 0..blocks_a serve part a into columns 0..rows_a of y, the others part b into
// columns col_b..col_b + rows_b; both parts read the same x (each block runs its own prologue, as
// in every product). One wait, ramp and tail per weight instead of a launch and its sibling. A
// row's sum does not depend on which block serves it, so the outputs are the sibling launches'
// bits.
template <int QA, int QB, int N>
__device__ void qgemv_k_pair(float* __restrict__ y, u32 ldy, const u8* __restrict__ da, const u16* __restrict__ ha,
                             u32 rows_a, const u8* __restrict__ db, const u16* __restrict__ hb, u32 rows_b, u32 col_b,
                             u32 blocks_a, const float* __restrict__ x, const float* __restrict__ nw,
                             const u32* __restrict__ xrows, u32 cols, u32 mode, float eps, u32 accumulate) {
    if (blockIdx.x < blocks_a)
        qgemv_k<QA, N, 1>(y, ldy, da, ha, x, nw, xrows, rows_a, cols, mode, eps, accumulate, 0, blockIdx.x, blocks_a);
    else
        qgemv_k<QB, N, 1>(y + col_b, ldy, db, hb, x, nw, xrows, rows_b, cols, mode, eps, accumulate, 0,
                          blockIdx.x - blocks_a, gridDim.x - blocks_a);
}

// ---- Dequantization. out [nrows, cols] bf16 ← rows first_row.. of W: one thread per unit; a
// warp's 32 units are contiguous in `out` (2 KiB), staged in shared memory and stored 16 bytes
// per lane and instruction. Block QD_THREADS threads.
#define QD_THREADS 256
template <int QT>
__device__ void qdequant_bf16(u16* __restrict__ out, const u8* __restrict__ data, const u16* __restrict__ hdr,
                              u32 first_row, u32 nrows, u32 cols) {
    __shared__ __align__(16) uint4 stage[QD_THREADS / 32][32 * 4];
    const u32 nb = cols / 32, bpr = cols / QTraits<QT>::VALUES, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const u64 total = (u64)nrows * nb;
    uint4* ws = stage[warp];
    for (u64 t0 = ((u64)blockIdx.x * blockDim.x + warp * 32); t0 < total; t0 += (u64)gridDim.x * blockDim.x) {
        const u64 t = t0 + lane;
        if (t < total) {
            const u32 rl = (u32)(t / nb), u = (u32)(t % nb);
            QUnit q;
            q_unit<QT>(q, data, hdr, (u64)first_row + rl, u, bpr);
            // Rotated by the lane so the 16-byte stores of a warp spread over the banks.
#pragma unroll
            for (int k = 0; k < 4; k++) ws[lane * 4 + ((k + lane) & 3)] = unit_bf16x8(q, k);
        }
        __syncwarp();
        // Unit t0 + c / 4's chunk c % 4 goes to out + (t0 · 32 + c · 8) bf16 values.
        uint4* dst = (uint4*)(out + t0 * 32);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const u32 c = k * 32 + lane, unit = c / 4, chunk = c % 4;
            if (t0 + unit < total) dst[c] = ws[unit * 4 + ((chunk + unit) & 3)];
        }
        __syncwarp();
    }
}

// out [n, cols] f32 ← rows ids[i] of W (the embedding lookup). Grid (n), any block size.
template <int QT>
__device__ void qrows_f32(float* __restrict__ out, const u8* __restrict__ data, const u16* __restrict__ hdr,
                          const u32* __restrict__ ids, u32 cols) {
    const u32 nb = cols / 32, bpr = cols / QTraits<QT>::VALUES;
    const u32 i = blockIdx.x;
    for (u32 u = threadIdx.x; u < nb; u += blockDim.x) {
        QUnit q;
        q_unit<QT>(q, data, hdr, ids[i], u, bpr);
        float* o = out + (u64)i * cols + (u64)u * 32;
#pragma unroll
        for (int k = 0; k < 32; k++) o[k] = __fadd_rn(__fmul_rn(k < 16 ? q.a0 : q.a1, (float)unit_code(q, k)), q.b);
    }
}

// Random blocks (synthetic weights): random codes, scales that keep every value within about
// ±scale. One thread per block.
template <int QT>
__device__ void qfill(u8* __restrict__ data, u16* __restrict__ hdr, u64 blocks, float scale, u32 seed) {
    typedef QTraits<QT> T;
    for (u64 b = (u64)blockIdx.x * blockDim.x + threadIdx.x; b < blocks; b += (u64)gridDim.x * blockDim.x) {
        u32* w = (u32*)(data + b * T::DATA);
        for (int k = 0; k < T::DATA / 4; k++) w[k] = pk_hash((b * 64 + k) * 0x9E3779B97F4A7C15ull + seed);
        // Largest |code| · |sub-block scale| of the type: value = d · that at most.
        const float span = QT == QT_Q8_0 ? 128.0f : QT == QT_Q6_K ? 32.0f * 128.0f
                         : (QT == QT_Q4_K || QT == QT_Q5_K) ? 31.0f * 63.0f : 16.0f;
        const u16 d = f32_to_f16(scale / span);
        if (QT == QT_Q4_K || QT == QT_Q5_K) {
            w[0] = (u32)d | ((u32)f32_to_f16(scale / 63.0f) << 16);
        } else if (T::HDR == 2) {
            hdr[2 * b] = d;
            hdr[2 * b + 1] = f32_to_f16(-0.5f * scale);
        } else {
            hdr[b] = d;
        }
    }
}

// pk_qgemv_T_nN: the decode product of N token rows (qgemv_k for the K-quants, qgemv otherwise);
// pk_qgemv_T_nN_i2: the K-quant product taking two items a warp at a time.
// Launched as programmatic dependents, the products wait for the kernel before them (pdl_wait)
// and only then let the next one be scheduled (pdl_trigger), so a launch that follows a product
// finds that product's own inputs complete. A `sibling` launch relies on that: it follows
// another product over the same input x writing other outputs (the next part of a weight
// stacked from parts of different types, or the next rows of tokens), so it does not wait
// before reading x and runs beside that product's tail; it waits at its end instead, so the
// kernel after it still finds both complete.
#define PK_QGEMV(QT, NAME, N, F, SUFFIX, ...)                                                                  \
    extern "C" __global__ void __launch_bounds__(32 * QG_WARPS, 1)                                             \
        pk_qgemv_##NAME##_n##N##SUFFIX(float* y, u32 ldy, const u8* data, const u16* hdr, const float* x,      \
                                       const float* nw, const u32* xrows, u32 rows, u32 cols, u32 mode,       \
                                       float eps, u32 acc, u32 sibling) {                                     \
        F<QT, N __VA_ARGS__>(y, ldy, data, hdr, x, nw, xrows, rows, cols, mode, eps, acc, sibling);            \
    }
#define PK_QGEMV_N(QT, NAME, F, SUFFIX, ...)                                                                   \
    PK_QGEMV(QT, NAME, 1, F, SUFFIX, __VA_ARGS__) PK_QGEMV(QT, NAME, 2, F, SUFFIX, __VA_ARGS__)                \
    PK_QGEMV(QT, NAME, 3, F, SUFFIX, __VA_ARGS__) PK_QGEMV(QT, NAME, 4, F, SUFFIX, __VA_ARGS__)
// 5..=8 token rows (QGEMV_MAX_N): a verification step of up to 7 draft tokens in one pass.
#define PK_QGEMV_N8(QT, NAME, F, SUFFIX, ...)                                                                  \
    PK_QGEMV(QT, NAME, 5, F, SUFFIX, __VA_ARGS__) PK_QGEMV(QT, NAME, 6, F, SUFFIX, __VA_ARGS__)                \
    PK_QGEMV(QT, NAME, 7, F, SUFFIX, __VA_ARGS__) PK_QGEMV(QT, NAME, 8, F, SUFFIX, __VA_ARGS__)
#define PK_QMATRIX(QT, NAME)                                                                                   \
    extern "C" __global__ void __launch_bounds__(QD_THREADS) pk_qdequant_##NAME(u16* out, const u8* data, const u16* hdr, u32 first_row,      \
                                                  u32 nrows, u32 cols) {                                       \
        qdequant_bf16<QT>(out, data, hdr, first_row, nrows, cols);                                             \
    }                                                                                                          \
    extern "C" __global__ void pk_qrows_##NAME(float* out, const u8* data, const u16* hdr, const u32* ids,       \
                                               u32 cols) {                                                     \
        qrows_f32<QT>(out, data, hdr, ids, cols);                                                              \
    }                                                                                                          \
    extern "C" __global__ void pk_qfill_##NAME(u8* data, u16* hdr, u64 blocks, float scale, u32 seed) {          \
        qfill<QT>(data, hdr, blocks, scale, seed);                                                             \
    }

PK_QMATRIX(QT_Q4_0, q4_0) PK_QGEMV_N(QT_Q4_0, q4_0, qgemv, ) PK_QGEMV_N8(QT_Q4_0, q4_0, qgemv, )
PK_QMATRIX(QT_Q4_1, q4_1) PK_QGEMV_N(QT_Q4_1, q4_1, qgemv, ) PK_QGEMV_N8(QT_Q4_1, q4_1, qgemv, )
PK_QMATRIX(QT_Q5_0, q5_0) PK_QGEMV_N(QT_Q5_0, q5_0, qgemv, ) PK_QGEMV_N8(QT_Q5_0, q5_0, qgemv, )
PK_QMATRIX(QT_Q5_1, q5_1) PK_QGEMV_N(QT_Q5_1, q5_1, qgemv, ) PK_QGEMV_N8(QT_Q5_1, q5_1, qgemv, )
PK_QMATRIX(QT_Q8_0, q8_0) PK_QGEMV_N(QT_Q8_0, q8_0, qgemv, ) PK_QGEMV_N8(QT_Q8_0, q8_0, qgemv, )
PK_QMATRIX(QT_Q4_K, q4_k) PK_QGEMV_N(QT_Q4_K, q4_k, qgemv_k_grid, , , 1) PK_QGEMV_N8(QT_Q4_K, q4_k, qgemv_k_grid, , , 1) PK_QGEMV_N(QT_Q4_K, q4_k, qgemv_k_grid, _i2, , 2)
PK_QMATRIX(QT_Q5_K, q5_k) PK_QGEMV_N(QT_Q5_K, q5_k, qgemv_k_grid, , , 1) PK_QGEMV_N8(QT_Q5_K, q5_k, qgemv_k_grid, , , 1) PK_QGEMV_N(QT_Q5_K, q5_k, qgemv_k_grid, _i2, , 2)
PK_QMATRIX(QT_Q6_K, q6_k) PK_QGEMV_N(QT_Q6_K, q6_k, qgemv_k_grid, , , 1) PK_QGEMV_N8(QT_Q6_K, q6_k, qgemv_k_grid, , , 1) PK_QGEMV_N(QT_Q6_K, q6_k, qgemv_k_grid, _i2, , 2)

// pk_qgemv_pair_A_B_nN: qgemv_k_pair of parts of types A and B, N token rows (QGEMV_PAIR_MAX_N in
// src/qmatrix.rs).
#define PK_QGEMV_PAIR(QA, A, QB, B, N)                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * QG_WARPS, 1)                                             \
        pk_qgemv_pair_##A##_##B##_n##N(float* y, u32 ldy, const u8* da, const u16* ha, u32 rows_a,            \
                                       const u8* db, const u16* hb, u32 rows_b, u32 col_b, u32 blocks_a,      \
                                       const float* x, const float* nw, const u32* xrows, u32 cols, u32 mode, \
                                       float eps, u32 acc) {                                                  \
        qgemv_k_pair<QA, QB, N>(y, ldy, da, ha, rows_a, db, hb, rows_b, col_b, blocks_a, x, nw, xrows, cols,  \
                                mode, eps, acc);                                                              \
    }
#define PK_QGEMV_PAIR_N(QA, A, QB, B) PK_QGEMV_PAIR(QA, A, QB, B, 1)
PK_QGEMV_PAIR_N(QT_Q4_K, q4_k, QT_Q5_K, q5_k) PK_QGEMV_PAIR_N(QT_Q4_K, q4_k, QT_Q6_K, q6_k)
PK_QGEMV_PAIR_N(QT_Q5_K, q5_k, QT_Q4_K, q4_k) PK_QGEMV_PAIR_N(QT_Q5_K, q5_k, QT_Q6_K, q6_k)
PK_QGEMV_PAIR_N(QT_Q6_K, q6_k, QT_Q4_K, q4_k) PK_QGEMV_PAIR_N(QT_Q6_K, q6_k, QT_Q5_K, q5_k)
