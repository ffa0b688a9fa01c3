// bench.cu — helpers of the attention benchmark: fill pages with valid random codes on the
// device (uploading gigabytes from the host would dominate the run), and a read-bandwidth
// kernel for the roofline row.

__device__ __forceinline__ u32 hash_u32(u64 x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return (u32)x;
}

// kind: 0 random bytes (any quantized code), 1 f16 values in [−1, 1), 2 bf16 values in [−1, 1),
// 3 f32 values in [−1, 1), 4 f16 scales in [0.02, 0.06).
extern "C" __global__ void pk_fill_random(u8* __restrict__ p, u64 n_bytes, u32 kind, u32 seed) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 w = (u64)blockIdx.x * blockDim.x + threadIdx.x; w * 4 < n_bytes; w += stride) {
        const u32 r = hash_u32(w * 0x9E3779B97F4A7C15ull + seed);
        const u32 r2 = hash_u32(w * 0xD1B54A32D192ED03ull + seed + 1);
        u32 word;
        const float a = (float)(r & 0xffff) / 32768.0f - 1.0f, b = (float)(r >> 16) / 32768.0f - 1.0f;
        if (kind == 0) {
            word = r;
        } else if (kind == 1) {
            word = (u32)f32_to_f16(a) | ((u32)f32_to_f16(b) << 16);
        } else if (kind == 2) {
            word = (u32)f32_to_bf16(a) | ((u32)f32_to_bf16(b) << 16);
        } else if (kind == 3) {
            word = __float_as_uint((float)r2 / 2147483648.0f - 1.0f);
        } else {
            word = (u32)f32_to_f16(0.04f + 0.02f * a) | ((u32)f32_to_f16(0.04f + 0.02f * b) << 16);
        }
        if (w * 4 + 4 <= n_bytes) {
            ((u32*)p)[w] = word;
        } else {
            for (u64 i = w * 4; i < n_bytes; i++) p[i] = (u8)(word >> (8 * (i - w * 4)));
        }
    }
}

// Reads n16 16-byte words (grid-stride, 4 loads in flight per thread) and folds them into one
// word per block so the loads cannot be elided.
extern "C" __global__ void __launch_bounds__(256) pk_read_bw(const uint4* __restrict__ src, u64 n16, u32* __restrict__ sink) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u32 acc = 0;
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        const uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n16; i += stride) {
        const uint4 a = src[i];
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    acc = __reduce_xor_sync(0xffffffffu, acc);
    if ((threadIdx.x & 31) == 0 && acc == 0x12345678u) sink[blockIdx.x] = acc; // practically never stored
}
