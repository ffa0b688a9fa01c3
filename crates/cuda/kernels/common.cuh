// common.cuh — types, conversions and the KV codecs shared by every pagekv kernel.
//
// The host prepends this file to each kernel source (src/spec.rs) and compiles the whole with
// NVRTC for the device's architecture (src/compile.rs). Compile-time configuration comes from
// -D defines:
//   PK_KC, PK_KBITS   codec of the K side (CODEC_* below; bits for Lloyd-Max codes)
//   PK_VC, PK_VBITS   codec of the V side
//   PK_D              head_dim
//   PK_G              query heads per kv head (0: no attention kernels in this module)
//   PK_ROT_BLOCK      Hadamard block of the rotation (largest power of two dividing PK_D)
// Layout of one plane (K or V) of one layer, as in kvcache::pages:
//   codes  [num_blocks, block_size, num_kv_heads, CODE_BYTES]
//   scales [num_blocks, block_size, num_kv_heads, NS] f16 (one per 32 values; none for floats;
//          CODEC_LMS: slot 0 the head vector's D, then 4-bit multipliers, four per slot)

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define CODEC_F32 0
#define CODEC_F16 1
#define CODEC_BF16 2
#define CODEC_Q8 3
#define CODEC_Q4 4
#define CODEC_LM 5
#define CODEC_LMS 6 // Lloyd-Max codes scaled per 8 values by D·q (kvcache::format::turbo_sub)

#define PK_NEG_INF (__int_as_float(0xff800000))

__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float bf16_to_f32(u16 h) { return __uint_as_float(((u32)h) << 16); }
// Byte i of w (0..255) as a float, via the 2^23 magic number: one PRMT and one FADD.
__device__ __forceinline__ float byte_as_float(u32 w, int i, float bias) {
    return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440 + i)) - bias;
}

__device__ __forceinline__ u32 smem_addr(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}
// Asynchronous global→shared copy of N bytes (4, 8 or 16; both addresses N-aligned).
template <int N>
__device__ __forceinline__ void cp_async(void* dst, const void* src) {
    if constexpr (N == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(smem_addr(dst)), "l"(src), "n"(N));
    }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// One side's codec. Head vectors are handled in *units* of 8 values: unit u holds values
// dim(u, 0..7) — contiguous except for q4, whose nibble packing puts values j and j+16 of a
// 32-value group in one byte, so unit u = 4g+k holds group g's values 4k..4k+3 and 16+4k..16+4k+3
// (its 4 code bytes are contiguous either way). Every unit lies in one 32-value group (u >> 2);
// for CODEC_LMS a unit is one sub-group of the scale D·q.
template <int C, int BITS, int D>
struct Codec {
    static constexpr int CODE_BYTES = C == CODEC_F32 ? 4 * D
                                    : (C == CODEC_F16 || C == CODEC_BF16) ? 2 * D
                                    : C == CODEC_Q8 ? D
                                    : C == CODEC_Q4 ? D / 2
                                    : D * BITS / 8;
    static constexpr int NS = (C == CODEC_F32 || C == CODEC_F16 || C == CODEC_BF16) ? 0
                            : C == CODEC_LMS ? 1 + (D / 8 + 3) / 4 // D, then the multipliers
                            : D / 32;
    static constexpr int NU = D / 8;                      // units per head vector
    static constexpr int UB = CODE_BYTES / NU;            // code bytes per unit
    static constexpr bool LEVELS = C == CODEC_LM || C == CODEC_LMS; // decodes through a level table
    static constexpr int NLEVELS = LEVELS ? (1 << BITS) : 0;

    __device__ static __forceinline__ int dim(int u, int i) {
        if constexpr (C == CODEC_Q4) {
            return (u >> 2) * 32 + (i < 4 ? 4 * (u & 3) + i : 16 + 4 * (u & 3) + (i - 4));
        } else {
            return u * 8 + i;
        }
    }

    // Values of unit u (without the group scale) from a head vector's code bytes `row`
    // (shared or global memory, 16-byte aligned).
    __device__ static __forceinline__ void unit(const u8* row, int u, const float* levels, float v[8]) {
        if constexpr (C == CODEC_F32) {
            float4 a = *(const float4*)(row + u * 32);
            float4 b = *(const float4*)(row + u * 32 + 16);
            v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
            v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
        } else if constexpr (C == CODEC_F16) {
            uint4 w = *(const uint4*)(row + u * 16);
            u32 ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                v[2 * k] = f16_to_f32((u16)(ws[k] & 0xffff));
                v[2 * k + 1] = f16_to_f32((u16)(ws[k] >> 16));
            }
        } else if constexpr (C == CODEC_BF16) {
            uint4 w = *(const uint4*)(row + u * 16);
            u32 ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                v[2 * k] = __uint_as_float(ws[k] << 16);
                v[2 * k + 1] = __uint_as_float(ws[k] & 0xffff0000u);
            }
        } else if constexpr (C == CODEC_Q8) {
            uint2 w = *(const uint2*)(row + u * 8);
            u32 a = w.x ^ 0x80808080u, b = w.y ^ 0x80808080u; // int8 → biased uint8
#pragma unroll
            for (int i = 0; i < 4; i++) {
                v[i] = byte_as_float(a, i, 8388736.0f);
                v[4 + i] = byte_as_float(b, i, 8388736.0f);
            }
        } else if constexpr (C == CODEC_Q4) {
            u32 w = *(const u32*)(row + u * 4);
            u32 lo = w & 0x0f0f0f0fu, hi = (w >> 4) & 0x0f0f0f0fu;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                v[i] = byte_as_float(lo, i, 8388616.0f); // nibble − 8
                v[4 + i] = byte_as_float(hi, i, 8388616.0f);
            }
        } else { // Lloyd–Max bit stream: value i of the head vector at bits [i·BITS, (i+1)·BITS)
            if constexpr (BITS == 8) {
                uint2 w = *(const uint2*)(row + u * 8);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    v[i] = levels[(w.x >> (8 * i)) & 0xff];
                    v[4 + i] = levels[(w.y >> (8 * i)) & 0xff];
                }
            } else if constexpr (BITS == 4) {
                u32 w = *(const u32*)(row + u * 4);
#pragma unroll
                for (int i = 0; i < 8; i++) v[i] = levels[(w >> (4 * i)) & 0xf];
            } else if constexpr (BITS == 2) {
                u32 w = *(const u16*)(row + u * 2);
#pragma unroll
                for (int i = 0; i < 8; i++) v[i] = levels[(w >> (2 * i)) & 0x3];
            } else { // 3 bits: 8 values in 3 bytes
                const u8* p = row + u * 3;
                u32 w = (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16);
#pragma unroll
                for (int i = 0; i < 8; i++) v[i] = levels[(w >> (3 * i)) & 0x7];
            }
        }
    }

    // Scale of group g (1 for the float formats); `scales` points at the head vector's scales.
    // CODEC_LMS has no group scales: unit_scale.
    __device__ static __forceinline__ float scale(const u8* scales, int g) {
        if constexpr (NS == 0) {
            return 1.0f;
        } else {
            return f16_to_f32(((const u16*)scales)[g]);
        }
    }

    // Scale of unit u: for CODEC_LMS D·q of sub-group u (D in slot 0; q bits 4·(u % 4) of slot
    // 1 + u/4; the product is exact in f32), else the scale of u's group u >> 2.
    __device__ static __forceinline__ float unit_scale(const u8* scales, int u) {
        if constexpr (C == CODEC_LMS) {
            const u16* s = (const u16*)scales;
            const u32 q = ((u32)s[1 + (u >> 2)] >> (4 * (u & 3))) & 0xfu;
            return f16_to_f32(s[0]) * (float)q;
        } else {
            return scale(scales, u >> 2);
        }
    }
};

// Randomized Hadamard rotation of `nvec` head vectors of PK_D values in shared memory, with the
// same operation order as kvcache::Rotation (signs, butterflies h = 1, 2, 4, …, then the norm;
// the inverse: butterflies, norm, signs), so a rotation here equals the host's bit for bit.
// Every thread of the block must call it.
__device__ void rotate_smem(float* x, int nvec, const float* __restrict__ signs, float norm, bool inverse) {
    const int n = nvec * PK_D;
    if (!inverse) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = __fmul_rn(x[i], signs[i % PK_D]);
        __syncthreads();
    }
    for (int h = 1; h < PK_ROT_BLOCK; h <<= 1) {
        for (int p = threadIdx.x; p < n / 2; p += blockDim.x) {
            const int i = (p / h) * 2 * h + (p % h);
            const float a = x[i], b = x[i + h];
            x[i] = __fadd_rn(a, b);
            x[i + h] = __fsub_rn(a, b);
        }
        __syncthreads();
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float y = __fmul_rn(x[i], norm);
        if (inverse) y = __fmul_rn(y, signs[i % PK_D]);
        x[i] = y;
    }
    __syncthreads();
}

// Programmatic dependent launch (sm_90+; no-ops below, and for kernels launched without the
// attribute): the host launches pk_merge with programmatic stream serialization, so it may start
// while the decode kernel before it still runs. pdl_trigger (in the decode kernels) lets that
// launch proceed once every decode CTA has started; pdl_wait (first thing in pk_merge) blocks
// until the decode grid has completed and its writes are visible.
__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::);
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// 64-bit mix (MurmurHash3's finalizer) to 32 bits: random fills of synthetic weights and pages.
__device__ __forceinline__ u32 pk_hash(u64 x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return (u32)x;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// GeGLU's activation (Gemma): gelu(g) · u with GELU's tanh approximation in f32,
//   gelu(x) = x/2 · (1 + tanh(√(2/π) · x · (1 + 0.044715 x²))), 0 at or below −10, x at or above 10,
// rounded as the CPU's `gelu_tanh` (crates/model/src/llama/gelu.rs: its one fused multiply-add,
// products left to right). The CPU forward reads the activation from ggml's f16 table (input and
// output rounded to f16, a llama.cpp detail); here it is computed in f32 with tanhf, so the two
// differ by those roundings (2⁻¹¹ relative each). Shared by the model kernels and the quantized
// products' prologue.
__device__ __forceinline__ float pk_gelu_tanh(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    const float inner = __fmul_rn(__fmul_rn(0.7978846f, x), fmaf(__fmul_rn(0.044715f, x), x, 1.0f));
    return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(inner)));
}
__device__ __forceinline__ float pk_gelu_mul1(float g, float u) { return __fmul_rn(pk_gelu_tanh(g), u); }

// Lloyd–Max tables (kvcache::format::lloyd_max::codebook), uploaded by the host after loading
// the module: levels ascending, bounds the midpoints (2^bits − 1 of them).
__constant__ float pk_k_levels[256];
__constant__ float pk_k_bounds[256];
__constant__ float pk_v_levels[256];
__constant__ float pk_v_bounds[256];
