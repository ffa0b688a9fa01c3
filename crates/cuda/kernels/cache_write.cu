// cache_write.cu — scatter T new K/V rows into their cache slots, quantizing on the way, and
// copy blocks (copy-on-write). Each encoder mirrors the scalar reference in
// crates/kvcache/src/format/{q8,q4,turbo,turbo_sub,codec}.rs operation for operation (same rounding,
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

// Sum over the 8 lanes of an aligned octet in the order of kvcache::format::turbo_sub::sub_sum
// (an xor butterfly, o = 4, 2, 1; every lane ends with the sum). All 32 lanes must call it.
__device__ __forceinline__ float octet_sum(float v) {
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Packs one code per value (packed[0..PK_D), shared memory) into the Lloyd–Max bit stream
// `codes` [PK_D·BITS/8]: one thread per output byte gathers the codes whose bits fall in it.
template <int BITS>
__device__ __forceinline__ void pack_codes(const u8* packed, u8* __restrict__ codes) {
    constexpr int NB = PK_D * BITS / 8;
    for (int b = threadIdx.x; b < NB; b += blockDim.x) {
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
        // A group is a warp (shapes::check_supported rejects quantized formats at other head_dims).
        static_assert(C != CODEC_Q8 || PK_D % 32 == 0, "q8 codes need head_dim % 32 == 0");
        // d = max|x| / 127 (as f16), q = round(x / d) clamped to ±127.
        const float amax = warp_max(fabsf(v));
        const u16 sh = f32_to_f16(__fdiv_rn(amax, 127.0f));
        const float s = f16_to_f32(sh);
        const float inv = s > 0.0f ? __fdiv_rn(1.0f, s) : 0.0f;
        const float q = fminf(fmaxf(roundf(__fmul_rn(v, inv)), -127.0f), 127.0f);
        codes[d] = (u8)(signed char)(int)q;
        if (lane == 0) scales[g] = sh;
    } else if constexpr (C == CODEC_Q4) {
        static_assert(C != CODEC_Q4 || PK_D % 32 == 0, "q4 codes need head_dim % 32 == 0");
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
    } else if constexpr (C == CODEC_LMS) {
        // kvcache::format::turbo_sub::encode. Sub-group j = values 8j..8j+7 = an aligned lane
        // octet; its sums are octet_sum's. rms_j = sqrt(Σ x² / 8); D = f16(min(max_j rms_j · 1.2
        // / 15, 65504)); per sub-group the q of 0..15 whose scale D·q reconstructs with least
        // squared error (the first on ties; q = 0 if every error is infinite); code = #bounds <
        // x · inv, inv = 1 / (D·q) (0 when D·q = 0).
        // Every lane of the block takes part (lanes past PK_D hold zeros and write nothing).
        static_assert(C != CODEC_LMS || PK_D % 8 == 0, "sub-scaled codes need head_dim % 8 == 0");
        __shared__ float warp_top[(PK_D + 31) / 32];
        const int j = d >> 3;
        const float rms = __fsqrt_rn(__fdiv_rn(octet_sum(__fmul_rn(v, v)), 8.0f));
        const float wtop = warp_max(rms);
        if (lane == 0) warp_top[g] = wtop;
        __syncthreads();
        float top = 0.0f;
        for (int w = 0; w < (PK_D + 31) / 32; w++) top = fmaxf(top, warp_top[w]);
        const u16 dh = f32_to_f16(fminf(__fdiv_rn(__fmul_rn(top, 1.2f), 15.0f), 65504.0f));
        const float dv = f16_to_f32(dh);
        float best_err = __int_as_float(0x7f800000); // +inf
        int best_q = 0;
        for (int q = 0; q < 16; q++) {
            const float s = __fmul_rn(dv, (float)q);
            const float inv = s > 0.0f ? __fdiv_rn(1.0f, s) : 0.0f;
            const int code = lm_code<BITS>(__fmul_rn(v, inv), bounds);
            const float e = __fsub_rn(v, __fmul_rn(s, levels[code]));
            const float err = octet_sum(__fmul_rn(e, e));
            if (err < best_err) {
                best_err = err;
                best_q = q;
            }
        }
        // The codes at the chosen scale, computed again as the host does.
        const float s = __fmul_rn(dv, (float)best_q);
        const float inv = s > 0.0f ? __fdiv_rn(1.0f, s) : 0.0f;
        const int code = lm_code<BITS>(__fmul_rn(v, inv), bounds);
        // Slot 1 + g packs the multipliers of the warp's four sub-groups, j % 4 = lane / 8.
        const int qj = j < PK_D / 8 ? best_q : 0;
        const int q1 = __shfl_down_sync(0xffffffffu, qj, 8);
        const int q2 = __shfl_down_sync(0xffffffffu, qj, 16);
        const int q3 = __shfl_down_sync(0xffffffffu, qj, 24);
        if (lane == 0) scales[1 + g] = (u16)(qj | (q1 << 4) | (q2 << 8) | (q3 << 12));
        if (d == 0) scales[0] = dh;
        if (live) packed[d] = (u8)code;
        __syncthreads();
        pack_codes<BITS>(packed, codes);
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
        pack_codes<BITS>(packed, codes);
    }
}

// Stores one finished head vector x (PK_D values in shared memory; the key for side 0, the value
// for side 1) into its (slot, head) entry sh of the planes: rotated in place first for rotated
// formats, then encoded. Every thread of the block calls it; it ends with a barrier, so x and
// packed may be reused after it.
__device__ __forceinline__ void store_head(int side, float* x, u8* packed, u8* __restrict__ k_codes,
                                           u8* __restrict__ k_scales, u8* __restrict__ v_codes,
                                           u8* __restrict__ v_scales, u64 sh, const float* __restrict__ signs,
                                           float rot_norm) {
    typedef Codec<PK_KC, PK_KBITS, PK_D> KC;
    typedef Codec<PK_VC, PK_VBITS, PK_D> VC;
    if (signs != nullptr) rotate_smem(x, 1, signs, rot_norm, false);
    if (side == 0) {
        encode_head<PK_KC, PK_KBITS>(x, packed, k_codes + sh * KC::CODE_BYTES, (u16*)k_scales + sh * KC::NS,
                                     pk_k_bounds, pk_k_levels);
    } else {
        encode_head<PK_VC, PK_VBITS>(x, packed, v_codes + sh * VC::CODE_BYTES, (u16*)v_scales + sh * VC::NS,
                                     pk_v_bounds, pk_v_levels);
    }
    __syncthreads();
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
        store_head(side, x, packed, k_codes, k_scales, v_codes, v_scales, sh, signs, rot_norm);
    }
}

// The attention input of the model step straight into the cache (rope.cuh's qkv_head): token t's
// query heads of kv head h to q [num_tokens, nh, PK_D] f32, its key and value heads encoded into
// their slot as pk_cache_write encodes them — the bits of pk_qkv_rope then pk_cache_write, in one
// launch instead of two (no f32 keys and values in between).
// Grid (num_tokens, nkv, 1 + ceil(group / warps)), block round_up(PK_D, 32) (`warps` warps,
// group = nh / nkv): block z = 0 finishes the key (warp 0) and the value (warp 1, or warp 0 after
// the key) and encodes them (rotated first for rotated formats); block z ≥ 1 finishes query heads
// (z − 1)·warps + w of the group, one a warp — every head vector on a warp of its own, as in
// pk_qkv_rope.
// In the model step a programmatic dependent launch after the QKV product: the slot and the
// angles (positions, uploaded before the step) are read before pdl_wait, the product after it.
extern "C" __global__ void pk_qkv_rope_write(float* __restrict__ q, u8* __restrict__ k_codes,
                                             u8* __restrict__ k_scales, u8* __restrict__ v_codes,
                                             u8* __restrict__ v_scales, const u32* __restrict__ slots,
                                             const float* __restrict__ signs, float rot_norm,
                                             const float* __restrict__ qkv, const float* __restrict__ bias,
                                             const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                                             const u32* __restrict__ positions, const float* __restrict__ factors,
                                             u32 nh, u32 nkv, u32 rope_dims, u32 style, float theta_scale,
                                             float freq_scale, float eps, u32 q_round, float q_scale,
                                             u32 k_center) {
    constexpr u32 WARPS = (PK_D + 31) / 32;
    __shared__ float heads[WARPS > 1 ? WARPS : 2][PK_D]; // the warps' head vectors (z = 0: key, value)
    __shared__ float cs[PK_D];                           // the angles' (cos, sin) [rope_dims / 2][2]
    __shared__ u8 packed[PK_D];
    const QkvRopeArgs a = {qkv,  bias, q_norm,      k_norm,     positions, factors, nh,      nkv,     PK_D,
                           rope_dims, style, theta_scale, freq_scale, eps,     q_round, q_scale, k_center};
    // The decode kernel after this one may be scheduled now; it waits for this grid's writes.
    pdl_trigger();
    const u32 t = blockIdx.x, h = blockIdx.y, z = blockIdx.z, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const u32 group = nh / nkv;
    rope_angles(cs, a, t, threadIdx.x, blockDim.x);
    __syncthreads();
    if (z > 0) {
        const u32 j = (z - 1) * WARPS + warp; // query head j of the group
        pdl_wait();
        if (j >= group) return;
        const u32 hh = h * group + j;
        qkv_head(heads[warp], cs, a, t, hh, lane);
        float* dst = q + ((u64)t * nh + hh) * PK_D;
        for (u32 i = lane; i < PK_D; i += 32) dst[i] = heads[warp][i];
        return;
    }
    const u64 sh = (u64)slots[t] * nkv + h; // (slot, head) index in the planes
    pdl_wait();
    for (u32 side = warp; side < 2; side += WARPS) qkv_head(heads[side], cs, a, t, nh + side * nkv + h, lane);
    __syncthreads();
    for (int side = 0; side < 2; side++)
        store_head(side, heads[side], packed, k_codes, k_scales, v_codes, v_scales, sh, signs, rot_norm);
}
