// decode_tc_stream_k.cu — the stream-K grid of the tensor-core decode kernel (pk_decode_tc_sk),
// built on the shared header decode_tc.cuh and its tile loop (tc::attend_tile) and query
// fragments (tc::query_fragments).

#ifdef PK_HAS_TC

// ---------------------------------------------------------------------------------------------
// Stream-K grid (pk_decode_tc_sk): a persistent grid of about one CTA per SM walks the flattened
// work of the call — units (sequence, kv head) in order, each cut into tiles of 16 visible tokens —
// in balanced contiguous shares: CTA c takes flat tiles [c·T/G, (c + 1)·T/G) of the T in all (G =
// min(gridDim.x, T / (2·NW)), at least 1: every CTA has at least one tile). Inside the CTA, tile r of its share goes to
// warp r % NW, and each warp runs one cp.async pipeline over all of its tiles, across unit
// boundaries: the copies of the next unit's first tile are in flight while the warps finish and
// merge the current one. Per unit segment (the part of a unit inside the share), the warps' states
// are merged in shared memory; a unit the CTA holds whole is written to out, a split one as a
// partial (m, l, acc) in slot unit + c, and the last of its CTAs to arrive (a counter per unit)
// merges the partials of all of them and writes out.
namespace sk {
using namespace tc;
// Merge scratch after the stages: mw, lw [NW][PK_G], ow [NW][PK_G][D] (floats); then CTL_WORDS
// control words (the scan's warp sums, the fixup's flag); then the per-sequence tables: tiles
// prefix [num_seqs + 1], context lengths [num_seqs] (u32). All of it dynamic (no static shared
// memory: the host sets the function's limit to the device's). The host mirror is
// shapes::decode_tc_sk_smem_bytes.
constexpr int SCRATCH_FLOATS = NW * PK_G * (D + 2);
constexpr int CTL_WORDS = 64;
static_assert(NW + 1 <= CTL_WORDS, "warp sums and the flag");
constexpr int FIXED_BYTES = NW * WARP_BYTES + 4 * SCRATCH_FLOATS + 4 * CTL_WORDS;

// The CTA of a G-CTA grid whose share holds flat tile x (of T): the largest c with c·T/G ≤ x.
__device__ __forceinline__ u32 cta_of(u32 x, u32 T, u32 G) {
    return (u32)((((u64)x + 1) * G + T - 1) / T) - 1;
}

// Walks the units of the flat tile space forward: the sequence holding a flat tile, the first
// flat tile of that sequence (its kv heads' tiles follow one another) and its tiles per head.
struct Cursor {
    u32 seq, base, nt;
    __device__ __forceinline__ void seek(const u32* prefix, u32 num_seqs, u32 kvh, u32 x) {
        u32 lo = 0, hi = num_seqs; // the last sequence whose first tile is ≤ x
        while (hi - lo > 1) {
            const u32 mid = (lo + hi) / 2;
            if (prefix[mid] * kvh <= x) lo = mid; else hi = mid;
        }
        seq = lo;
        base = prefix[lo] * kvh;
        nt = prefix[lo + 1] - prefix[lo];
    }
    __device__ __forceinline__ void advance(const u32* prefix, u32 kvh, u32 x) {
        while (x >= base + nt * kvh) {
            seq++;
            base = prefix[seq] * kvh;
            nt = prefix[seq + 1] - prefix[seq];
        }
    }
};

// Merges the n partials of one unit (slots slot0 … slot0 + n − 1: part_ml [slot][PK_G][2],
// part_acc [slot][PK_G][D]) into out_u [PK_G][D], with the whole CTA; scratch: SCRATCH_FLOATS.
__device__ __forceinline__ void merge_partials(float* __restrict__ out_u, const float* __restrict__ part_acc,
                                               const float* __restrict__ part_ml, u32 slot0, u32 n,
                                               float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float* hm = scratch;        // [PK_G] max over the partials
    float* hs = hm + PK_G;      // [PK_G] denominator
    float* wts = hs + PK_G;     // [PK_G][chunk] weights 2^(m_p − max)
    constexpr u32 CHUNK = (SCRATCH_FLOATS - 2 * PK_G) / PK_G;
    auto row = [&](int g, u32 p) -> u64 { return (u64)(slot0 + p) * PK_G + g; };
    for (int g = warp; g < PK_G; g += NW) {
        float mx = PK_NEG_INF;
        for (u32 p = lane; p < n; p += 32) mx = fmaxf(mx, __ldcg(part_ml + row(g, p) * 2));
        mx = warp_max(mx);
        float den = 0.0f;
        for (u32 p = lane; p < n; p += 32) den = fmaf(exp2f(__ldcg(part_ml + row(g, p) * 2) - mx), __ldcg(part_ml + row(g, p) * 2 + 1), den);
        den = warp_sum(den);
        if (lane == 0) {
            hm[g] = mx;
            hs[g] = den;
        }
    }
    constexpr int PER = (PK_G * D + 32 * NW - 1) / (32 * NW);
    float acc[PER];
#pragma unroll
    for (int k = 0; k < PER; k++) acc[k] = 0.0f;
    for (u32 p0 = 0; p0 < n; p0 += CHUNK) {
        const u32 np = min(CHUNK, n - p0);
        __syncthreads();
        for (u32 j = threadIdx.x; j < PK_G * np; j += blockDim.x) {
            const int g = j / np;
            const u32 p = j % np;
            wts[g * CHUNK + p] = exp2f(__ldcg(part_ml + row(g, p0 + p) * 2) - hm[g]);
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < PER; k++) {
            const int idx = threadIdx.x + k * blockDim.x;
            if (idx >= PK_G * D) break;
            const int g = idx / D, dim = idx % D;
            const float* w = wts + g * CHUNK;
            const float* src = part_acc + row(g, p0) * D + dim;
            constexpr u64 STEP = (u64)PK_G * D; // one slot further
            float a = acc[k];
            u32 p = 0;
            for (; p + 4 <= np; p += 4) {
                const float x0 = __ldcg(src + p * STEP), x1 = __ldcg(src + (p + 1) * STEP);
                const float x2 = __ldcg(src + (p + 2) * STEP), x3 = __ldcg(src + (p + 3) * STEP);
                a = fmaf(w[p], x0, a);
                a = fmaf(w[p + 1], x1, a);
                a = fmaf(w[p + 2], x2, a);
                a = fmaf(w[p + 3], x3, a);
            }
            for (; p < np; p++) a = fmaf(w[p], __ldcg(src + p * STEP), a);
            acc[k] = a;
        }
    }
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int idx = threadIdx.x + k * blockDim.x;
        if (idx < PK_G * D) out_u[idx] = acc[k] / hs[idx / D];
    }
}
} // namespace sk

// The stream-K kernel body (pk_decode_tc_sk below); PACK, QX, EF as for decode_tc_body
// (decode_tc_partitioned.cu).
// Unrotated formats only (the host routes rotated ones to the partitioned grid).
template <bool PACK, bool QX, bool EF>
__device__ __forceinline__ void decode_tc_sk_body(float* __restrict__ out,          // [num_seqs, num_heads, D]
                                                  float* __restrict__ part_acc,     // [units + G, PK_G, D]
                                                  float* __restrict__ part_ml,      // [units + G, PK_G, 2]
                                                  const float* __restrict__ q,      // [num_seqs, num_heads, D]
                                                  const u8* __restrict__ kc, const u8* __restrict__ ks,
                                                  const u8* __restrict__ vc, const u8* __restrict__ vs,
                                                  const u32* __restrict__ tables,   // [num_seqs, max_blocks]
                                                  u32 max_blocks,
                                                  const u32* __restrict__ ctx_lens, // [num_seqs]
                                                  u32 num_seqs, float qk_scale_log2, u32 window, u32 log2_bs,
                                                  u32 num_kv_heads,
                                                  u32* __restrict__ counters) {     // [units] zeros
    using namespace tc;
    constexpr int NS = PACK ? 1 : NT;
    constexpr int QP = PACK ? PACKQ : SQ;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int quad = lane & 3;
    const u32 kvh = num_kv_heads;
    const int num_heads = (int)kvh * PK_G;
    extern __shared__ __align__(16) u8 smem[];
    float* mw = (float*)(smem + NW * WARP_BYTES); // [NW][PK_G]
    float* lw = mw + NW * PK_G;                   // [NW][PK_G]
    float* ow = lw + NW * PK_G;                   // [NW][PK_G][D]
    u32* wsum = (u32*)(ow + NW * PK_G * D);      // [NW] the scan's warp sums
    u32& flag_s = wsum[NW];                       // the fixup: this CTA merges the unit
    u32* prefix = (u32*)(smem + sk::FIXED_BYTES); // [num_seqs + 1] visible tiles before each sequence
    u32* ctxs = prefix + num_seqs + 1;            // [num_seqs]
    {
        u32 dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < (u32)sk::FIXED_BYTES + 4u * (2u * num_seqs + 1u)) __trap(); // host/kernel layout mismatch
    }
    // The per-sequence tables (context lengths only: allowed before pdl_wait), by a block-wide
    // scan in chunks of blockDim.x sequences.
    u32 carry = 0;
    for (u32 b0 = 0; b0 < num_seqs; b0 += blockDim.x) {
        const u32 s = b0 + threadIdx.x;
        const u32 c = s < num_seqs ? ctx_lens[s] : 0u;
        const u32 vis = (window != 0 && c > window) ? window : c;
        u32 x = (vis + 15) / 16;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const u32 y = __shfl_up_sync(0xffffffffu, x, off);
            if (lane >= off) x += y;
        }
        if (lane == 31) wsum[warp] = x;
        __syncthreads();
        u32 before = 0, total = 0;
        for (int w = 0; w < NW; w++) {
            before += w < warp ? wsum[w] : 0u;
            total += wsum[w];
        }
        if (s < num_seqs) {
            ctxs[s] = c;
            prefix[s + 1] = carry + before + x;
        }
        carry += total;
        __syncthreads();
    }
    if (threadIdx.x == 0) prefix[0] = 0;
    __syncthreads();
    const u32 T = prefix[num_seqs] * kvh; // flat tiles in all
    // CTAs used: at most one per 2·NW tiles (each warp two tiles or more on average), so that
    // a small call does not split its units into more partials than it has tiles to amortise.
    const u32 G = max(1u, min((u32)gridDim.x, T / (2 * NW)));
    pdl_trigger();
    pdl_wait(); // as in decode_tc_body: pages and queries only after this
    if (blockIdx.x >= G) return;
    const u32 xb = (u32)((u64)blockIdx.x * T / G), xe = (u32)((u64)(blockIdx.x + 1) * T / G);

    // This warp's tiles: flat xb + warp + i·NW, i < my_n.
    const u32 span = xe - xb;
    const int my_n = span > (u32)warp ? (int)((span - warp + NW - 1) / NW) : 0;
    u8* wst = smem + warp * WARP_BYTES;
    const u32 bs_mask = (1u << log2_bs) - 1;
    const u64 pol = EF ? l2_evict_first() : 0;
    // The copy side's cursor and its next tile (index nxt): token position of this lane's row,
    // the context end, the kv head, the block id (looked up one tile before it is issued).
    sk::Cursor ic;
    ic.seek(prefix, num_seqs, kvh, xb);
    int nxt = 0;
    u32 n_pos = 0, n_end = 0, n_h = 0, n_blk = 0;
    auto look_up = [&]() {
        if (nxt >= my_n) return;
        const u32 x = xb + (u32)warp + (u32)nxt * NW;
        ic.advance(prefix, kvh, x);
        const u32 off = x - ic.base, h = off / ic.nt, t = off - h * ic.nt;
        const u32 c = ctxs[ic.seq];
        const u32 lo = (window != 0 && c > window) ? c - window : 0u;
        n_pos = lo + t * 16 + (lane & 15);
        n_end = c;
        n_h = h;
        n_blk = n_pos < c ? tables[(u64)ic.seq * max_blocks + (n_pos >> log2_bs)] : 0u;
    };
    auto issue_next = [&]() { // copies of tile nxt into its stage, then the next look-up
        if (nxt >= my_n) return;
        u8* st = wst + (nxt % ST) * STAGE;
        const bool ok = n_pos < n_end;
        const u64 slot = ((u64)n_blk << log2_bs) | (n_pos & bs_mask);
        const u64 my_sh = ok ? slot * kvh + n_h : 0;
        const u32 my_bytes = ok ? 16u : 0u;
        const int r = lane / CPR, c = lane % CPR;
#pragma unroll
        for (int j = 0; j < 16 / RPI; j++) {
            const int t = j * RPI + r;
            const u64 sh = __shfl_sync(0xffffffffu, my_sh, t);
            const u32 n = __shfl_sync(0xffffffffu, my_bytes, t);
            cp_async_zfill<16, EF>(st + t * CROW + c * 16, kc + sh * CB + c * 16, n, pol);
            cp_async_zfill<16, EF>(st + (16 + t) * CROW + c * 16, vc + sh * CB + c * 16, n, pol);
        }
        if constexpr (QUANT) {
            const u8* src = (lane < 16 ? ks : vs) + my_sh * SB;
            cp_async_zfill<SB, EF>(st + 32 * CROW + lane * SB, src, my_bytes == 0 ? 0u : (u32)SB, pol);
        }
        nxt++;
        look_up();
    };
    look_up();
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        issue_next();
        cp_async_commit();
    }

    u32 bq[NS][KSTEPS][QP][2];
    float o[NS][KSTEPS][4];
    float m[NS][2], l[NS][2];
    const bool writer = !PACK || 2 * quad < GP; // lanes whose columns hold heads
    // The units of the share, in order (CTA-uniform): segment [x0, x1) of unit (seq, h).
    sk::Cursor uc;
    uc.seek(prefix, num_seqs, kvh, xb);
    int i = 0; // this warp's next tile
    for (u32 x0 = xb; x0 < xe;) {
        uc.advance(prefix, kvh, x0);
        const u32 seq = uc.seq, h = (x0 - uc.base) / uc.nt;
        const u32 u0 = uc.base + h * uc.nt, u1 = u0 + uc.nt; // the unit's flat tiles
        const u32 x1 = min(u1, xe);
        const u32 c = ctxs[seq];
        const u32 lo = (window != 0 && c > window) ? c - window : 0u;
        // This warp's tiles of the segment: i … i_end − 1.
        const u32 rel_end = x1 - xb;
        const int i_end = rel_end > (u32)warp ? (int)((rel_end - warp + NW - 1) / NW) : 0;
        if (i < i_end) {
            const bool q_exact = query_fragments<PACK, QX>(q + ((u64)seq * num_heads + h * PK_G) * D, lane, qk_scale_log2, bq);
#pragma unroll
            for (int nt = 0; nt < NS; nt++) {
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    m[nt][j] = PK_NEG_INF;
                    l[nt][j] = 0.0f;
                }
#pragma unroll
                for (int mt = 0; mt < KSTEPS; mt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) o[nt][mt][e] = 0.0f;
            }
            for (; i < i_end; i++) {
                cp_async_wait<ST - 2>();
                __syncwarp(); // tile i landed for every lane; every lane is done with tile i − 1
                issue_next();
                cp_async_commit();
                const u32 t0 = lo + (xb + (u32)warp + (u32)i * NW - u0) * 16;
                attend_tile<PACK, QX>(wst + (i % ST) * STAGE, t0, c, lane, bq, q_exact, qk_scale_log2, o, m, l);
            }
#pragma unroll
            for (int nt = 0; nt < NS; nt++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    l[nt][j] += __shfl_xor_sync(0xffffffffu, l[nt][j], 4);
                    l[nt][j] += __shfl_xor_sync(0xffffffffu, l[nt][j], 8);
                    l[nt][j] += __shfl_xor_sync(0xffffffffu, l[nt][j], 16);
                }
            if constexpr (PACK) {
#pragma unroll
                for (int mt = 0; mt < KSTEPS; mt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) o[0][mt][e] = sum_parts(o[0][mt][e]);
            }
            if (lane < 4 && writer) {
#pragma unroll
                for (int nt = 0; nt < NS; nt++)
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        const int g = nt * 8 + lane * 2 + j;
                        if (g < PK_G) {
                            mw[warp * PK_G + g] = m[nt][j];
                            lw[warp * PK_G + g] = l[nt][j];
                        }
                    }
            }
            if (writer) {
#pragma unroll
                for (int nt = 0; nt < NS; nt++)
#pragma unroll
                    for (int mt = 0; mt < KSTEPS; mt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int g = nt * 8 + quad * 2 + (e & 1);
                            if (g < PK_G) ow[(warp * PK_G + g) * D + pv_dim(mt, e >> 1, lane >> 2)] = o[nt][mt][e];
                        }
            }
        } else if (lane < PK_G) { // no tile of this segment: an empty state
            mw[warp * PK_G + lane] = PK_NEG_INF;
            lw[warp * PK_G + lane] = 0.0f;
        }
        __syncthreads();
        // The segment's result from the warps' states: out (the whole unit is here) or the
        // partial of slot unit + blockIdx.x.
        const bool whole = u0 >= xb && u1 <= xe;
        const u32 unit = seq * kvh + h;
        for (int idx = threadIdx.x; idx < PK_G * D; idx += blockDim.x) {
            const int g = idx / D, dim = idx % D;
            float mx = PK_NEG_INF;
            for (int w = 0; w < NW; w++) mx = fmaxf(mx, mw[w * PK_G + g]);
            float acc = 0.0f, sum = 0.0f;
            for (int w = 0; w < NW; w++) {
                const float mwv = mw[w * PK_G + g];
                if (mwv == PK_NEG_INF) continue; // a warp without tiles here (its ow is stale)
                const float f = exp2f(mwv - mx);
                acc = fmaf(f, ow[(w * PK_G + g) * D + dim], acc);
                sum = fmaf(f, lw[w * PK_G + g], sum);
            }
            if (whole) {
                out[((u64)seq * num_heads + h * PK_G) * D + idx] = acc / sum;
            } else {
                const u64 r = (u64)(unit + blockIdx.x) * PK_G + g;
                part_acc[r * D + dim] = acc;
                if (dim == 0) {
                    part_ml[r * 2] = mx;
                    part_ml[r * 2 + 1] = sum;
                }
            }
        }
        if (!whole) {
            // Fixup: the last CTA of the unit to publish its partial merges all of them.
            __threadfence();
            __syncthreads();
            const u32 c0 = sk::cta_of(u0, T, G), n = sk::cta_of(u1 - 1, T, G) - c0 + 1;
            if (threadIdx.x == 0) {
                const u32 prev = atomicAdd(counters + unit, 1u);
                flag_s = prev + 1 == n;
                if (prev + 1 == n) counters[unit] = 0; // every other CTA of the unit has counted
            }
            __syncthreads();
            if (flag_s) {
                __threadfence();
                sk::merge_partials(out + ((u64)seq * num_heads + h * PK_G) * D, part_acc, part_ml, unit + c0, n, mw);
            }
        }
        __syncthreads(); // the scratch is free for the next segment
        x0 = x1;
    }
    cp_async_wait<0>();
}

extern "C" __global__ void PK_TC_BOUNDS
pk_decode_tc_sk(float* __restrict__ out, float* __restrict__ part_acc, float* __restrict__ part_ml,
                const float* __restrict__ q, const u8* __restrict__ kc, const u8* __restrict__ ks,
                const u8* __restrict__ vc, const u8* __restrict__ vs, const u32* __restrict__ tables,
                u32 max_blocks, const u32* __restrict__ ctx_lens, u32 num_seqs, float qk_scale_log2,
                u32 window, u32 log2_bs, u32 num_kv_heads, u32* __restrict__ counters) {
    decode_tc_sk_body<PK_G <= 4, true, PK_TC_EF != 0>(out, part_acc, part_ml, q, kc, ks, vc, vs, tables, max_blocks,
                                                     ctx_lens, num_seqs, qk_scale_log2, window, log2_bs, num_kv_heads,
                                                     counters);
}

#endif // PK_HAS_TC
