// cache_write.cu — scatter T new K/V rows into their cache slots, quantizing on the way, and
// copy blocks (copy-on-write). Each encoder mirrors the scalar reference in
// crates/kvcache/src/format/{q8,q4,turbo,codec}.rs operation for operation (same rounding,
// same tie-breaks, sums in the same order), so the stored codes equal the host's.

// Index of the Lloyd–Max level nearest to y: the number of bounds below y.
template <int BITS>
__device__ __forceinline__ int lm_code(float y, const float* bounds) {
    int lo = 0, hi = (1 << BITS) - 1;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (bounds[mid] < y) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// For the f16 scale sh of a group (one lane per value, v = 0 and live = false past its end):
// returns Σ (v − s·ℓ)² and sets *refit = Σ v·ℓ / Σ ℓ², sums in butterfly order — as
// turbo::search_scale's eval on the host (kvcache::format::turbo::lane_sum).
__device__ float turbo_eval(float v, bool live, u16 sh, const float* bounds, const float* levels, int bits,
                            float* refit) {
    const float s = f16_to_f32(sh);
    const float inv = s > 0.0f ? __fdiv_rn(1.0f, s) : 0.0f;
    float e2 = 0.0f, yl = 0.0f, ll = 0.0f;
    if (live) {
        const float y = __fmul_rn(v, inv);
        int code;
        if (bits == 2) code = lm_code<2>(y, bounds);
        else if (bits == 3) code = lm_code<3>(y, bounds);
        else code = lm_code<4>(y, bounds);
        const float l = levels[code];
        const float e = __fsub_rn(v, __fmul_rn(s, l));
        e2 = __fmul_rn(e, e);
        yl = __fmul_rn(v, l);
        ll = __fmul_rn(l, l);
    }
    e2 = warp_sum(e2);
    yl = warp_sum(yl);
    ll = warp_sum(ll);
    *refit = ll > 0.0f ? __fdiv_rn(yl, ll) : s;
    return e2;
}

// Encodes x (PK_D values in shared memory, already rotated for rotated formats) into one head
// vector's codes and scales. Block: one thread per value (blockDim.x = round_up(PK_D, 32)).
template <int C, int BITS>
__device__ void encode_head(const float* x, u8* packed /* smem [PK_D] */, u8* __restrict__ codes,
                            u16* __restrict__ scales, const float* bounds, const float* levels) {
    const int d = threadIdx.x;
    const int lane = d & 31, g = d >> 5;
    const bool live = d < PK_D;
    const float v = live ? x[d] : 0.0f;
    if constexpr (C == CODEC_F32) {
        if (live) ((float*)codes)[d] = v;
    } else if constexpr (C == CODEC_F16) {
        if (live) ((u16*)codes)[d] = f32_to_f16(v);
    } else if constexpr (C == CODEC_BF16) {
        if (live) ((u16*)codes)[d] = f32_to_bf16(v);
    } else if constexpr (C == CODEC_Q8) {
        // d = max|x| / 127 (as f16), q = round(x / d) clamped to ±127.
        const float amax = warp_max(fabsf(v));
        const u16 sh = f32_to_f16(__fdiv_rn(amax, 127.0f));
        const float s = f16_to_f32(sh);
        const float inv = s > 0.0f ? __fdiv_rn(1.0f, s) : 0.0f;
        const float q = fminf(fmaxf(roundf(__fmul_rn(v, inv)), -127.0f), 127.0f);
        codes[d] = (u8)(signed char)(int)q;
        if (lane == 0) scales[g] = sh;
    } else if constexpr (C == CODEC_Q4) {
        // m = the value of largest magnitude (first one on ties), d = m / −8,
        // q = clamp(round(x / d), −8, 7) + 8; byte j = q[j] | q[j + 16] << 4.
        float best = fabsf(v);
        int at = lane;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(0xffffffffu, best, o);
            const int oa = __shfl_xor_sync(0xffffffffu, at, o);
            if (ob > best || (ob == best && oa < at)) {
                best = ob;
                at = oa;
            }
        }
        const float m = __shfl_sync(0xffffffffu, v, at);
        const u16 sh = f32_to_f16(__fdiv_rn(m, -8.0f));
        const float s = f16_to_f32(sh);
        const float inv = s != 0.0f ? __fdiv_rn(1.0f, s) : 0.0f;
        const int q = (int)fminf(fmaxf(roundf(__fmul_rn(v, inv)), -8.0f), 7.0f) + 8;
        const int hi = __shfl_down_sync(0xffffffffu, q, 16);
        if (lane < 16) codes[g * 16 + lane] = (u8)(q | (hi << 4));
        if (lane == 0) scales[g] = sh;
    } else { // Lloyd–Max: s₀ = sqrt(mean(x²)) of the group (summed in index order); at ≤ 4 bits
             // the scale search of kvcache::format::turbo; code = #bounds < x/s
        __shared__ float group_scale[PK_D / 32];
        __shared__ float group_rms[PK_D / 32];
        if (lane == 0 && live) {
            float ms = 0.0f;
            for (int i = 0; i < 32; i++) ms = __fadd_rn(ms, __fmul_rn(x[g * 32 + i], x[g * 32 + i]));
            ms = __fdiv_rn(ms, 32.0f);
            const float rms = __fsqrt_rn(ms);
            group_rms[g] = rms;
            group_scale[g] = f16_to_f32(f32_to_f16(rms));
        }
        __syncthreads();
        if constexpr (BITS <= 4) {
            // Every lane of the group's warp takes part (sums are warp-wide, so the branch
            // below is uniform per warp); lanes past PK_D add zeros.
            if (g < PK_D / 32) {
                const float rms = group_rms[g];
                const float mult[5] = {1.0f, 0.8f, 0.9f, 1.1f, 1.2f};
                float best_err = __int_as_float(0x7f800000); // +inf
                u16 best = f32_to_f16(rms);
                for (int c = 0; c < 5; c++) {
                    float refit;
                    u16 sh = f32_to_f16(__fmul_rn(rms, mult[c]));
                    float err = turbo_eval(v, live, sh, bounds, levels, BITS, &refit);
                    if (err < best_err) { best_err = err; best = sh; }
                    sh = f32_to_f16(refit);
                    err = turbo_eval(v, live, sh, bounds, levels, BITS, &refit);
                    if (err < best_err) { best_err = err; best = sh; }
                }
                if (lane == 0) group_scale[g] = f16_to_f32(best);
                if (lane == 0) scales[g] = best;
            }
        } else {
            if (lane == 0 && live) scales[g] = f32_to_f16(group_rms[g]);
        }
        __syncthreads();
        if (live) {
            const float s = group_scale[g];
            const float inv = s > 0.0f ? __fdiv_rn(1.0f, s) : 0.0f;
            const float y = __fmul_rn(v, inv);
            packed[d] = (u8)lm_code<BITS>(y, bounds);
        }
        __syncthreads();
        // One thread per output byte gathers the codes whose bits fall in it.
        constexpr int NB = PK_D * BITS / 8;
        for (int b = d; b < NB; b += blockDim.x) {
            u32 byte = 0;
            const int first = (8 * b) / BITS, last = (8 * b + 7) / BITS;
            for (int i = first; i <= last; i++) {
                const int shift = i * BITS - 8 * b;
                const u32 c = packed[i];
                byte |= shift >= 0 ? (c << shift) : (c >> -shift);
            }
            codes[b] = (u8)(byte & 0xff);
        }
    }
}

// grid (num_tokens, num_kv_heads), block round_up(PK_D, 32).
// keys/values [num_tokens, num_kv_heads, PK_D] f32 (un-rotated); slots [num_tokens].
// signs: [PK_D] rotation signs, or null for unrotated formats.
// In the model step a programmatic dependent launch after pk_qkv_rope (DevicePages::
// write_device): the slot (uploaded before the step, written by no kernel) is read before
// pdl_wait; the keys/values (the previous kernel's results) and every page write after it.
extern "C" __global__ void pk_cache_write(u8* __restrict__ k_codes, u8* __restrict__ k_scales,
                                          u8* __restrict__ v_codes, u8* __restrict__ v_scales,
                                          const float* __restrict__ keys, const float* __restrict__ values,
                                          const u32* __restrict__ slots, u32 num_kv_heads,
                                          const float* __restrict__ signs, float rot_norm) {
    typedef Codec<PK_KC, PK_KBITS, PK_D> KC;
    typedef Codec<PK_VC, PK_VBITS, PK_D> VC;
    __shared__ float x[PK_D];
    __shared__ u8 packed[PK_D];
    // The decode kernel after this one may be scheduled now; it waits for this grid's writes.
    pdl_trigger();
    const u32 t = blockIdx.x, h = blockIdx.y;
    const u64 src = ((u64)t * num_kv_heads + h) * PK_D;
    const u64 sh = (u64)slots[t] * num_kv_heads + h; // (slot, head) index in the planes
    pdl_wait();
    for (int side = 0; side < 2; side++) {
        const float* in = side == 0 ? keys : values;
        for (int i = threadIdx.x; i < PK_D; i += blockDim.x) x[i] = in[src + i];
        __syncthreads();
        if (signs != nullptr) rotate_smem(x, 1, signs, rot_norm, false);
        if (side == 0) {
            encode_head<PK_KC, PK_KBITS>(x, packed, k_codes + sh * KC::CODE_BYTES,
                                         (u16*)k_scales + sh * KC::NS, pk_k_bounds, pk_k_levels);
        } else {
            encode_head<PK_VC, PK_VBITS>(x, packed, v_codes + sh * VC::CODE_BYTES,
                                         (u16*)v_scales + sh * VC::NS, pk_v_bounds, pk_v_levels);
        }
        __syncthreads();
    }
}
