// rope.cuh — the attention input of one token from the fused QKV product: the bias, the per-head
// q/k norms, RoPE, the query scale and rounding, the key centring. Used by pk_qkv_rope
// (model.cu: q, k and v to f32 buffers) and pk_qkv_rope_write (cache_write.cu: q to its buffer,
// k and v straight into their cache slots), so both compute the same bits.
//
//   qkv [n, (nh + 2·nkv)·d] f32 (q heads, then k heads, then v heads), bias [(nh + 2·nkv)·d]
//   (nullable), q_norm/k_norm [d] (nullable; per-head RMSNorm, qwen3, Gemma 3), positions [n],
//   factors [rope_dims / 2] (nullable).
// q and k are rotated over their first `rope_dims` dims, `style` 0: adjacent pairs (2i, 2i+1),
// 1: neox pairs (i, i + rope_dims/2). Pair i's angle at position p is freq_scale · (p ·
// theta_scale^i / factor_i) with theta_scale^i built by i repeated f32 multiplications (as ggml
// and the CPU Rope). q is then multiplied by `q_scale` (Gemma 3 scales the queries, not the
// scores, by its attention scale — before the rounding, as the CPU; 1 elsewhere). `q_round` 1: q
// rounded to f16, 2: to bf16 (the K·Q product sees q at the cache's precision, as on the CPU).
// `k_center` 1: the key bias is subtracted again after RoPE (k − b_k goes to the cache: every
// score of a query moves by the same q·b_k, which softmax cancels, and a quantized cache then
// codes the keys' varying part instead of a bias hundreds of times larger; as the CPU forward
// does for quantized key formats).
struct QkvRopeArgs {
    const float* qkv;
    const float* bias;
    const float* q_norm;
    const float* k_norm;
    const u32* positions;
    const float* factors;
    u32 nh, nkv, d, rope_dims, style;
    float theta_scale, freq_scale, eps;
    u32 q_round;
    float q_scale;
    u32 k_center;
};

// cs [rope_dims / 2][2] ← (cos, sin) of each pair's angle at token i's position, pairs split
// over `count` threads from `first` (the caller synchronizes before cs is read). Reads only
// positions and factors (uploaded or loaded before the step): callable before pdl_wait.
__device__ __forceinline__ void rope_angles(float* cs, const QkvRopeArgs& a, u32 i, u32 first, u32 count) {
    const float pos = (float)a.positions[i];
    for (u32 p = first; p < a.rope_dims / 2; p += count) {
        float theta = pos;
        for (u32 t = 0; t < p; t++) theta = __fmul_rn(theta, a.theta_scale);
        const float f = a.factors ? a.factors[p] : 1.0f;
        const float angle = __fmul_rn(a.freq_scale, __fdiv_rn(theta, f));
        cs[2 * p] = cosf(angle);
        cs[2 * p + 1] = sinf(angle);
    }
}

// head [d] (shared memory) ← head vector hh (0..nh: q, then k, then v) of token i, finished:
// biased, normed, rotated (cs from rope_angles), q scaled and rounded, k centred. One warp.
// Returns the kind: 0 q, 1 k, 2 v.
__device__ __forceinline__ int qkv_head(float* head, const float* cs, const QkvRopeArgs& a, u32 i, u32 hh,
                                        u32 lane) {
    const u32 d = a.d, width = (a.nh + 2 * a.nkv) * d;
    const float* src = a.qkv + (u64)i * width + (u64)hh * d;
    const float* b = a.bias ? a.bias + (u64)hh * d : nullptr;
    const int kind = hh < a.nh ? 0 : (hh < a.nh + a.nkv ? 1 : 2);
    for (u32 j = lane; j < d; j += 32) head[j] = b ? __fadd_rn(src[j], b[j]) : src[j];
    __syncwarp();
    const float* norm = kind == 0 ? a.q_norm : (kind == 1 ? a.k_norm : nullptr);
    if (norm) {
        double s = 0.0;
        for (u32 j = lane; j < d; j += 32) s += (double)__fmul_rn(head[j], head[j]);
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        const float inv = 1.0f / sqrtf((float)(s / (double)d) + a.eps);
        __syncwarp();
        for (u32 j = lane; j < d; j += 32) head[j] = __fmul_rn(__fmul_rn(head[j], inv), norm[j]);
        __syncwarp();
    }
    if (kind < 2) {
        const u32 half = a.rope_dims / 2;
        for (u32 p = lane; p < half; p += 32) {
            const float c = cs[2 * p], s = cs[2 * p + 1];
            const u32 a_i = a.style == 0 ? 2 * p : p, b_i = a.style == 0 ? 2 * p + 1 : p + half;
            const float x = head[a_i], y = head[b_i];
            head[a_i] = fmaf(x, c, -__fmul_rn(y, s));
            head[b_i] = fmaf(x, s, __fmul_rn(y, c));
        }
        __syncwarp();
    }
    for (u32 j = lane; j < d; j += 32) {
        float x = head[j];
        if (kind == 0) x = __fmul_rn(x, a.q_scale);
        if (kind == 0 && a.q_round == 1) x = f16_to_f32(f32_to_f16(x));
        if (kind == 0 && a.q_round == 2) x = bf16_to_f32(f32_to_bf16(x));
        if (kind == 1 && a.k_center && b) x = __fsub_rn(x, b[j]);
        head[j] = x;
    }
    __syncwarp();
    return kind;
}
