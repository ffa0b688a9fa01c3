// decode.cu — paged decode attention (one query token per sequence) with dequantization fused.
//
// pk_decode: one CTA per (kv head, sequence, partition) serves all PK_G query heads of the
// group, so each page is read once. Tiles of TT tokens stream through a STAGES-deep cp.async
// pipeline into shared memory (16-byte copies, one K and one V row per token and kv head, each
// contiguous in the pages); per tile:
//   QK  4 lanes per token, each over every 4th unit of 8 values; queries (pre-rotated,
//       pre-scaled by scale·log2 e) read from shared memory; per-group scales applied once per unit.
//   softmax  one warp per query head: tile max, exp2, running (m, l) — online softmax in fp32.
//   PV  NU = D/8 lanes per token row, each owning one unit × PK_G accumulators in registers;
//       the unit's scale (its group's, or D·q of its sub-group for sub-scaled values) once per unit.
// With gridDim.z == 1 (the `primitive` route) the CTA covers the whole visible context and writes
// the normalized output (un-rotated for rotated formats). Otherwise (`partitioned`, split-K) it
// writes its unnormalized accumulator and (m, l) and pk_merge combines the partitions exactly.
//
// Visibility: the query of a sequence with context C sees keys [lo, C), lo = C − W with a sliding
// window W (else 0); partition p covers [lo + p·P, lo + (p+1)·P).

#if PK_G > 0

typedef Codec<PK_KC, PK_KBITS, PK_D> KCod;
typedef Codec<PK_VC, PK_VBITS, PK_D> VCod;

constexpr int TT = 32;        // tokens per tile
constexpr int THREADS = 128;  // 4 warps
constexpr int STAGES = 3;     // tiles in the pipeline
constexpr int NU = PK_D / 8;  // units per head vector

// Shared-memory row stride of a token's codes + scales: padded so that the QK read pattern
// (4 lanes × unit bytes per token, 8 tokens per warp) hits distinct banks.
__host__ __device__ constexpr int round_up(int x, int m) { return (x + m - 1) / m * m; }
__host__ __device__ constexpr int row_stride(int row, int ub) {
    return (4 * ub) % 16 == 0 && 4 * ub < 128 ? round_up(row, 128) + 4 * ub
         : 4 * ub >= 128                      ? round_up(row, 128) + 16
                                              : round_up(row, 16);
}
constexpr int KROW = KCod::CODE_BYTES + 2 * KCod::NS;
constexpr int VROW = VCod::CODE_BYTES + 2 * VCod::NS;
constexpr int KS = row_stride(KROW, KCod::UB);
constexpr int VS = row_stride(VROW, VCod::UB);
constexpr int STAGE_BYTES = TT * (KS + VS);
// Copy granularity of the code bytes and of the scales of one row.
__host__ __device__ constexpr int chunk_of(int bytes) { return bytes % 16 == 0 ? 16 : bytes % 8 == 0 ? 8 : bytes % 4 == 0 ? 4 : 2; }
constexpr int KCC = chunk_of(KCod::CODE_BYTES), VCC = chunk_of(VCod::CODE_BYTES);
// A scale run starts CODE_BYTES into the row, so its chunks divide that offset too (sub-scaled
// values at head_dim 96: 36 code bytes, then 8 bytes of scales — 4-byte chunks, not 8).
constexpr int KSC = KCod::NS ? chunk_of(2 * KCod::NS | KCod::CODE_BYTES) : 16;
constexpr int VSC = VCod::NS ? chunk_of(2 * VCod::NS | VCod::CODE_BYTES) : 16;
constexpr int KNC = KCod::CODE_BYTES / KCC, VNC = VCod::CODE_BYTES / VCC;          // code chunks per row
constexpr int KNSC = 2 * KCod::NS / KSC, VNSC = 2 * VCod::NS / VSC;                // scale chunks per row
// Floats after the stages: queries [G][D], probabilities [G][TT], m, l, corr [G], level tables.
constexpr int SMEM_FLOATS = PK_G * PK_D + PK_G * TT + 3 * PK_G + KCod::NLEVELS + VCod::NLEVELS;
constexpr int SMEM_BYTES = STAGES * STAGE_BYTES + 4 * SMEM_FLOATS;
static_assert(NU <= THREADS, "head_dim too large for one CTA");
static_assert(PK_KC != CODEC_LMS, "keys are never sub-scaled: QK applies per-group scales");
static_assert(KCC >= 4 && VCC >= 4, "code rows must be a multiple of 4 bytes");

template <int N>
__device__ __forceinline__ void copy_chunk(u8* dst, const u8* src) {
    if constexpr (N >= 4) {
        cp_async<N>(dst, src);
    } else {
        *(u16*)dst = *(const u16*)src; // 2-byte scale runs (head_dim 96, 160, …): plain copy
    }
}

// Copies token row `t` (slot `slot`) of K and V into one stage; 4 threads per row.
__device__ __forceinline__ void issue_row(u8* stage, int t, int part, u64 slot_head,
                                          const u8* __restrict__ kc, const u8* __restrict__ ks,
                                          const u8* __restrict__ vc, const u8* __restrict__ vs) {
    u8* krow = stage + t * KS;
    u8* vrow = stage + TT * KS + t * VS;
    const u8* kcs = kc + slot_head * KCod::CODE_BYTES;
    const u8* vcs = vc + slot_head * VCod::CODE_BYTES;
    for (int c = part; c < KNC; c += 4) copy_chunk<KCC>(krow + c * KCC, kcs + c * KCC);
    for (int c = part; c < VNC; c += 4) copy_chunk<VCC>(vrow + c * VCC, vcs + c * VCC);
    if constexpr (KCod::NS > 0) {
        const u8* kss = ks + slot_head * 2 * KCod::NS;
        for (int c = part; c < KNSC; c += 4) copy_chunk<KSC>(krow + KCod::CODE_BYTES + c * KSC, kss + c * KSC);
    }
    if constexpr (VCod::NS > 0) {
        const u8* vss = vs + slot_head * 2 * VCod::NS;
        for (int c = part; c < VNSC; c += 4) copy_chunk<VSC>(vrow + VCod::CODE_BYTES + c * VSC, vss + c * VSC);
    }
}

// grid (num_kv_heads, num_seqs, num_partitions), block THREADS, dynamic smem SMEM_BYTES.
extern "C" __global__ void __launch_bounds__(THREADS)
pk_decode(float* __restrict__ out,          // [num_seqs, num_heads, D]            (1 partition)
          float* __restrict__ part_acc,     // [num_seqs, num_heads, max_parts, D] (partitions)
          float* __restrict__ part_ml,      // [num_seqs, num_heads, max_parts, 2] (m, l)
          const float* __restrict__ q,      // [num_seqs, num_heads, D]
          const u8* __restrict__ kc, const u8* __restrict__ ks,
          const u8* __restrict__ vc, const u8* __restrict__ vs,
          const u32* __restrict__ tables,   // [num_seqs, max_blocks]
          u32 max_blocks,
          const u32* __restrict__ ctx_lens, // [num_seqs]
          const float* __restrict__ signs,  // [D] or null
          float rot_norm, float qk_scale_log2, u32 window, u32 log2_bs, u32 part_size) {
    const int h = blockIdx.x, seq = blockIdx.y, part = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int num_kv_heads = gridDim.x, num_heads = num_kv_heads * PK_G;
    const bool direct = gridDim.z == 1;
    const u32 ctx = ctx_lens[seq];
    const u32 lo = (window != 0 && ctx > window) ? ctx - window : 0;
    const u32 start = direct ? lo : lo + (u32)part * part_size;
    const u32 end = direct ? ctx : min(ctx, start + part_size);
    pdl_trigger(); // pk_merge may launch now; it waits for this grid's results
    if (start >= end) return; // partition past this sequence's context: pk_merge skips it

    extern __shared__ __align__(16) u8 smem[];
    {
        u32 dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < (u32)SMEM_BYTES) __trap(); // host/kernel layout mismatch
    }
    u8* stages = smem;
    float* qs = (float*)(smem + STAGES * STAGE_BYTES); // [G][D]
    float* P = qs + PK_G * PK_D;                       // [G][TT]
    float* Mx = P + PK_G * TT;                         // [G] running max (log2 domain)
    float* Lx = Mx + PK_G;                             // [G] running sum
    float* Cx = Lx + PK_G;                             // [G] this tile's correction
    float* klev = Cx + PK_G;                           // [NLEVELS]
    float* vlev = klev + KCod::NLEVELS;                // [NLEVELS]

    // Queries of the group; rotated like the keys, then scaled.
    const u64 qbase = ((u64)seq * num_heads + (u64)h * PK_G) * PK_D;
    for (int i = tid; i < PK_G * PK_D; i += THREADS) qs[i] = q[qbase + i];
    for (int i = tid; i < KCod::NLEVELS; i += THREADS) klev[i] = pk_k_levels[i];
    for (int i = tid; i < VCod::NLEVELS; i += THREADS) vlev[i] = pk_v_levels[i];
    if (tid < PK_G) {
        Mx[tid] = PK_NEG_INF;
        Lx[tid] = 0.0f;
    }
    __syncthreads();
    if (signs != nullptr) rotate_smem(qs, PK_G, signs, rot_norm, false);
    for (int i = tid; i < PK_G * PK_D; i += THREADS) qs[i] *= qk_scale_log2;

    // Copy role: 4 threads per token row; the block id of the row's next tile is loaded a tile ahead.
    const int ct = tid >> 2, cpart = tid & 3;
    const u32 bs_mask = (1u << log2_bs) - 1;
    const u32* table = tables + (u64)seq * max_blocks;
    const int ntiles = (int)((end - start + TT - 1) / TT);
    auto block_of = [&](int tile) -> u32 {
        const u32 pos = start + (u32)tile * TT + ct;
        return pos < end ? table[pos >> log2_bs] : 0u;
    };
    auto issue = [&](int tile, u32 blk) {
        const u32 pos = start + (u32)tile * TT + ct;
        if (pos < end) {
            const u64 slot = ((u64)blk << log2_bs) | (pos & bs_mask);
            issue_row(stages + (tile % STAGES) * STAGE_BYTES, ct, cpart, slot * num_kv_heads + h, kc, ks, vc, vs);
        }
    };
    u32 next_blk = block_of(0);
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < ntiles) {
            issue(s, next_blk);
            next_blk = block_of(s + 1);
        }
        cp_async_commit();
    }

    // PV role: unit pu of token rows pr, pr + PROWS, …
    constexpr int PROWS = THREADS / NU;
    const int pu = tid % NU, pr = tid / NU;
    float acc[PK_G][8];
#pragma unroll
    for (int g = 0; g < PK_G; g++)
#pragma unroll
        for (int i = 0; i < 8; i++) acc[g][i] = 0.0f;

    for (int tile = 0; tile < ntiles; tile++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads(); // tile's rows landed; everyone is done with tile − 1
        if (tile + STAGES - 1 < ntiles) {
            issue(tile + STAGES - 1, next_blk);
            next_blk = block_of(tile + STAGES);
        }
        cp_async_commit();
        const u8* stage = stages + (tile % STAGES) * STAGE_BYTES;
        const u8* krows = stage;
        const u8* vrows = stage + TT * KS;
        const int valid = (int)min((u32)TT, end - (start + (u32)tile * TT));

        // QK: token t = warp·8 + lane/4, quarter k = lane % 4.
        {
            const int t = warp * 8 + (lane >> 2), k4 = lane & 3;
            float s[PK_G];
#pragma unroll
            for (int g = 0; g < PK_G; g++) s[g] = 0.0f;
            if (t < valid) {
                const u8* row = krows + t * KS;
#pragma unroll 2
                for (int u = k4; u < NU; u += 4) {
                    float v[8];
                    KCod::unit(row, u, klev, v);
                    const float sc = KCod::scale(row + KCod::CODE_BYTES, u >> 2);
                    const int d0 = KCod::dim(u, 0), d4 = KCod::dim(u, 4);
#pragma unroll
                    for (int g = 0; g < PK_G; g++) {
                        const float4 qa = *(const float4*)(qs + g * PK_D + d0);
                        const float4 qb = *(const float4*)(qs + g * PK_D + d4);
                        float dot = qa.x * v[0];
                        dot = fmaf(qa.y, v[1], dot);
                        dot = fmaf(qa.z, v[2], dot);
                        dot = fmaf(qa.w, v[3], dot);
                        dot = fmaf(qb.x, v[4], dot);
                        dot = fmaf(qb.y, v[5], dot);
                        dot = fmaf(qb.z, v[6], dot);
                        dot = fmaf(qb.w, v[7], dot);
                        s[g] = fmaf(sc, dot, s[g]);
                    }
                }
            }
#pragma unroll
            for (int g = 0; g < PK_G; g++) {
                s[g] += __shfl_xor_sync(0xffffffffu, s[g], 1);
                s[g] += __shfl_xor_sync(0xffffffffu, s[g], 2);
            }
            if (k4 == 0) {
#pragma unroll
                for (int g = 0; g < PK_G; g++) P[g * TT + t] = t < valid ? s[g] : PK_NEG_INF;
            }
        }
        __syncthreads();

        // Online softmax: one warp per query head, lane = token.
        for (int g = warp; g < PK_G; g += THREADS / 32) {
            const float sv = P[g * TT + lane];
            const float m_old = Mx[g];
            const float m_new = fmaxf(m_old, warp_max(sv)); // finite: every tile has a valid token
            const float p = sv == PK_NEG_INF ? 0.0f : exp2f(sv - m_new);
            const float sum = warp_sum(p);
            P[g * TT + lane] = p;
            if (lane == 0) {
                const float corr = m_old == PK_NEG_INF ? 0.0f : exp2f(m_old - m_new);
                Lx[g] = Lx[g] * corr + sum;
                Mx[g] = m_new;
                Cx[g] = corr;
            }
        }
        __syncthreads();

        // PV
        if (pr < PROWS) {
#pragma unroll
            for (int g = 0; g < PK_G; g++) {
                const float c = Cx[g];
#pragma unroll
                for (int i = 0; i < 8; i++) acc[g][i] *= c;
            }
            for (int t = pr; t < valid; t += PROWS) {
                const u8* row = vrows + t * VS;
                float v[8];
                VCod::unit(row, pu, vlev, v);
                const float sc = VCod::unit_scale(row + VCod::CODE_BYTES, pu);
#pragma unroll
                for (int g = 0; g < PK_G; g++) {
                    const float w = P[g * TT + t] * sc;
#pragma unroll
                    for (int i = 0; i < 8; i++) acc[g][i] = fmaf(w, v[i], acc[g][i]);
                }
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();

    // Sum the PROWS partial accumulators of each unit (stage memory is free now) into qs.
    float* red = (float*)stages; // [PROWS][D]
#pragma unroll
    for (int g = 0; g < PK_G; g++) {
        if (pr < PROWS) {
#pragma unroll
            for (int i = 0; i < 8; i++) red[pr * PK_D + VCod::dim(pu, i)] = acc[g][i];
        }
        __syncthreads();
        for (int d = tid; d < PK_D; d += THREADS) {
            float sum = 0.0f;
            for (int r = 0; r < PROWS; r++) sum += red[r * PK_D + d];
            qs[g * PK_D + d] = sum;
        }
        __syncthreads();
    }

    if (direct) {
        for (int i = tid; i < PK_G * PK_D; i += THREADS) qs[i] = qs[i] / Lx[i / PK_D];
        __syncthreads();
        if (signs != nullptr) rotate_smem(qs, PK_G, signs, rot_norm, true);
        for (int i = tid; i < PK_G * PK_D; i += THREADS) out[qbase + i] = qs[i];
    } else {
        const int max_parts = gridDim.z;
        for (int i = tid; i < PK_G * PK_D; i += THREADS) {
            const int g = i / PK_D, d = i % PK_D;
            part_acc[(((u64)seq * num_heads + h * PK_G + g) * max_parts + part) * PK_D + d] = qs[i];
        }
        if (tid < PK_G) {
            const u64 at = ((u64)seq * num_heads + h * PK_G + tid) * max_parts + part;
            part_ml[at * 2] = Mx[tid];
            part_ml[at * 2 + 1] = Lx[tid];
        }
    }
}

// grid (num_heads, num_seqs), block 128, dynamic smem 4·(D + max_parts + 8) bytes.
// out [num_seqs, num_heads, D] ← Σ_p 2^(m_p − M) acc_p / Σ_p 2^(m_p − M) l_p, un-rotated.
// A programmatic dependent launch (see pdl_wait). Up to 32 partitions (16 at head_dim 256) of
// unrotated pages: each thread reads every (m, l) and its dims' accumulators in one round trip
// and merges in registers. Otherwise every partition's (m, l) is read once, by one thread, and
// reduced across the block; each thread sums its dims over the partitions with its loads in
// flight together (issued with the (m, l) loads when there are at most 16 partitions).
extern "C" __global__ void __launch_bounds__(128)
pk_merge(float* __restrict__ out, const float* __restrict__ part_acc, const float* __restrict__ part_ml,
         const u32* __restrict__ ctx_lens, u32 max_parts, u32 window, u32 part_size,
         const float* __restrict__ signs, float rot_norm) {
    extern __shared__ __align__(16) u8 smem[];
    float* o = (float*)smem;    // [D]
    float* w = o + PK_D;        // [max_parts] 2^(m_p − M)
    float* red = w + max_parts; // [8] per-warp maxima, then per-warp sums
    const int head = blockIdx.x, seq = blockIdx.y, num_heads = gridDim.x;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u32 ctx = ctx_lens[seq]; // not written by the decode kernel: read before waiting for it
    const u32 lo = (window != 0 && ctx > window) ? ctx - window : 0;
    const int nparts = (int)((ctx - lo + part_size - 1) / part_size);
    const u64 base = ((u64)seq * num_heads + head) * max_parts;
    // No pdl_trigger here: the launch after this one (in the model step, the o-projection's GEMV,
    // one block per SM) starts when this grid ends. Triggering it first thing cost the batch-1
    // model step 4 % at context 128 and 2 % at 1024 on the H200 (alternated `pagekv bench decode --device cuda --model synthetic:llama3-8b`).
    pdl_wait();
    constexpr int PRE = 16;
    // Few partitions, unrotated pages (the small batches this route serves): every thread loads
    // all the (m, l) pairs itself (one address per warp: broadcast) together with its dims'
    // accumulators and reduces them in registers — one round trip, no shared memory, no barrier.
    constexpr int DPT = (PK_D + 127) / 128;   // dims per thread: tid + 128·k
    constexpr int LEAN = PK_D <= 128 ? 32 : 16; // partitions held in registers
    if (nparts <= LEAN && signs == nullptr) {
        float2 ml[LEAN];
        float x[LEAN][DPT];
#pragma unroll
        for (int p = 0; p < LEAN; p++) {
            ml[p] = p < nparts ? *(const float2*)(part_ml + (base + p) * 2)
                               : make_float2(PK_NEG_INF, 0.0f);
#pragma unroll
            for (int k = 0; k < DPT; k++) {
                const int d = tid + 128 * k;
                x[p][k] = p < nparts && d < PK_D ? part_acc[(base + p) * PK_D + d] : 0.0f;
            }
        }
        float m = ml[0].x; // partition 0 is live: every call has a visible token
#pragma unroll
        for (int p = 1; p < LEAN; p++) m = fmaxf(m, ml[p].x);
        float den = 0.0f, a[DPT];
#pragma unroll
        for (int k = 0; k < DPT; k++) a[k] = 0.0f;
#pragma unroll
        for (int p = 0; p < LEAN; p++) {
            const float f = p < nparts ? exp2f(ml[p].x - m) : 0.0f;
            den = fmaf(f, ml[p].y, den);
#pragma unroll
            for (int k = 0; k < DPT; k++) a[k] = fmaf(f, x[p][k], a[k]);
        }
#pragma unroll
        for (int k = 0; k < DPT; k++) {
            const int d = tid + 128 * k;
            if (d < PK_D) out[((u64)seq * num_heads + head) * PK_D + d] = a[k] / den;
        }
        return;
    }
    // Few partitions and head_dim ≤ 128, rotated pages: each thread's accumulators are loaded
    // together with the (m, l) pairs, one round trip for both.
    const bool pre = PK_D <= 128 && nparts <= PRE && tid < PK_D;
    float x[PRE];
    if (pre) {
#pragma unroll
        for (int p = 0; p < PRE; p++) x[p] = p < nparts ? part_acc[(base + p) * PK_D + tid] : 0.0f;
    }
    float m = PK_NEG_INF;
    for (int p = tid; p < nparts; p += blockDim.x) m = fmaxf(m, part_ml[(base + p) * 2]);
    m = warp_max(m);
    if (lane == 0) red[warp] = m;
    __syncthreads();
    m = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
    float den = 0.0f;
    for (int p = tid; p < nparts; p += blockDim.x) {
        const float2 ml = *(const float2*)(part_ml + (base + p) * 2);
        const float f = exp2f(ml.x - m);
        w[p] = f;
        den = fmaf(f, ml.y, den);
    }
    den = warp_sum(den);
    if (lane == 0) red[4 + warp] = den;
    __syncthreads();
    den = (red[4] + red[5]) + (red[6] + red[7]);
    if (pre) {
        float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
        for (int p = 0; p < PRE; p += 2) {
            if (p < nparts) a0 = fmaf(w[p], x[p], a0);
            if (p + 1 < nparts) a1 = fmaf(w[p + 1], x[p + 1], a1);
        }
        o[tid] = (a0 + a1) / den;
    } else {
        for (int d = tid; d < PK_D; d += blockDim.x) {
            const float* src = part_acc + base * PK_D + d;
            float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
            int p = 0;
            for (; p + 4 <= nparts; p += 4) {
                const float x0 = src[(u64)p * PK_D], x1 = src[(u64)(p + 1) * PK_D];
                const float x2 = src[(u64)(p + 2) * PK_D], x3 = src[(u64)(p + 3) * PK_D];
                a0 = fmaf(w[p], x0, a0);
                a1 = fmaf(w[p + 1], x1, a1);
                a2 = fmaf(w[p + 2], x2, a2);
                a3 = fmaf(w[p + 3], x3, a3);
            }
            for (; p < nparts; p++) a0 = fmaf(w[p], src[(u64)p * PK_D], a0);
            o[d] = ((a0 + a1) + (a2 + a3)) / den;
        }
    }
    __syncthreads();
    if (signs != nullptr) rotate_smem(o, 1, signs, rot_norm, true);
    for (int d = threadIdx.x; d < PK_D; d += blockDim.x) out[((u64)seq * num_heads + head) * PK_D + d] = o[d];
}

#endif // PK_G > 0
