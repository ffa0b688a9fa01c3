// decode_tc_partitioned.cu — the partitioned grid of the tensor-core decode kernel: pk_decode_tc
// (one CTA per group of kv heads, sequence and partition; see decode_tc.cuh for the work split and
// the mma formulation), pk_decode_tc_vreg (V rows in registers) and pk_decode_tc_base (the kernel
// before packed columns, for comparisons). Built on the shared header decode_tc.cuh.

#ifdef PK_HAS_TC

// (The partitioned kernel keeps its tile loop and query fragments inline, as measured: the q4
// kernel is sensitive to ptxas's scheduling, and the same code through tc::attend_tile /
// tc::query_fragments measured q4 64 × 16384 about 10 % slower (`pagekv bench attention --device cuda --formats q4`, 2026-12-02). The
// stream-K kernel (decode_tc_stream_k.cu) uses those functions.)
// The kernel body (pk_decode_tc below). PACK (groups of at most 4 heads): the split parts share
// the mma columns with the heads (tc::GP, tc::PPT), one n-tile per set of PPT parts instead of one
// per part: bf16 QK 24 → 16 mma per tile, PV 24 → 16 (f16 and quantized pages 16 → 8 each). QX:
// the query is split unscaled (the scale multiplies the scores) and, where every part past the
// first is zero for the warp's queries (queries already rounded to the mma type — the GPU model
// rounds them for f16/bf16 caches, `q_round`), the QK mma of those parts is skipped: the same
// sums, one n-tile per k-step. EF: the page copies carry an L2 evict-first policy. VR (tc::VREG):
// the V rows go to registers (v_load, one tile ahead: tile i + 1's are loaded once tile i's PV is
// done), the stages hold K only, the query fragments are read from shared memory per k-step.
template <bool PACK, bool QX, bool EF, bool VR>
__device__ __forceinline__ void decode_tc_body(float* __restrict__ out,          // [num_seqs, num_heads, D]            (1 partition)
                                               float* __restrict__ part_acc,     // [num_seqs, num_heads, max_parts, D] (partitions)
                                               float* __restrict__ part_ml,      // [num_seqs, num_heads, max_parts, 2] (m, l)
                                               const float* __restrict__ q,      // [num_seqs, num_heads, D]
                                               const u8* __restrict__ kc, const u8* __restrict__ ks,
                                               const u8* __restrict__ vc, const u8* __restrict__ vs,
                                               const u32* __restrict__ tables,   // [num_seqs, max_blocks]
                                               u32 max_blocks,
                                               const u32* __restrict__ ctx_lens, // [num_seqs]
                                               const float* __restrict__ signs,  // [D] rotation signs, or null
                                               float rot_norm, float qk_scale_log2, u32 window, u32 log2_bs, u32 part_size,
                                               u32 num_kv_heads,
                                               u32* __restrict__ counters) { // [num_seqs, gridDim.x] zeros, or null
    using namespace tc;
    constexpr int NS = PACK ? 1 : NT;      // head n-tiles of the softmax state (s, m, l, o)
    constexpr int QP = PACK ? PACKQ : SQ;  // B-fragment sets of q per head n-tile, one mma chain
    constexpr int PP = PACK ? PACKP : SP;  // B-fragment sets of p per head n-tile
    static_assert(!VR || (VREG && PACK == (PK_G <= 4)), "V in registers: float pages, 2 stages, D % 64 == 0");
    constexpr int KST = VR ? KSTAGE : STAGE;             // stage bytes
    constexpr int SMEM = VR ? VREG_SMEM_BYTES : TC_SMEM_BYTES;
    const int quad = threadIdx.x & 3;      // C fragments: columns 2·quad, 2·quad + 1
    const int seq = blockIdx.y, part = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int hpc = (int)num_kv_heads / (int)gridDim.x, wph = NW / hpc;
    const int head_local = warp / wph, sub = warp % wph;
    const int h = blockIdx.x * hpc + head_local;
    const int num_heads = (int)num_kv_heads * PK_G;
    const int heads = hpc * PK_G; // query heads of this CTA
    const bool direct = gridDim.z == 1;
    const u32* table = tables + (u64)seq * max_blocks;
    const u32 ctx = ctx_lens[seq];
    // Without a window the partition's first token does not depend on the context length: look
    // up the block ids of this warp's first ST tiles now, while ctx is still in flight (entries
    // past the context are read but not used; reads stay inside the table row).
    u32 first_blk[ST];
    if (window == 0) {
        const u32 s0 = direct ? 0u : (u32)part * part_size;
#pragma unroll
        for (int s = 0; s < ST; s++) {
            const u32 pos = s0 + (u32)(sub + s * wph) * 16 + (lane & 15);
            first_blk[s] = (pos >> log2_bs) < max_blocks ? table[pos >> log2_bs] : 0u;
        }
    }
    const u32 lo = (window != 0 && ctx > window) ? ctx - window : 0;
    const u32 start = direct ? lo : lo + (u32)part * part_size;
    const u32 end = direct ? ctx : min(ctx, start + part_size);
    pdl_trigger(); // pk_merge may launch now; it waits for this grid's results
    // In the model step a programmatic dependent launch after pk_cache_write (DecodeAttention::
    // set_programmatic): the block table and context length above are uploaded before the step
    // and written by no kernel; the pages and queries (the previous kernels' results) are read,
    // and the outputs written, only after this. Every CTA waits, also one that returns below, so
    // this grid never completes before the kernels it depends on.
    pdl_wait();
    if (start >= end) return; // partition past this sequence's context: pk_merge skips it

    extern __shared__ __align__(16) u8 smem[];
    {
        u32 dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < (u32)SMEM) __trap(); // host/kernel layout mismatch
    }

    // The queries as B fragments: head nt·8 + lane/4 of this warp's kv head, the dims qk_dim
    // gives, scaled by scale·log2 e and split. Rotated formats take the CTA's queries [heads][D]
    // (contiguous in q) through shared memory, rotated like the keys, before the stages are
    // used; others read theirs from global memory after the first copies are in flight.
    const u64 qcta = ((u64)seq * num_heads + (u64)blockIdx.x * heads) * D;
    const bool rotated = signs != nullptr;
    // bq[nt][kk][j]: head n-tile nt (PACK: the packed columns), k-step kk, part j (PACK: part
    // set j, column n holding part PPT·j + n / GP of head n % GP).
    u32 bq[NS][KSTEPS][QP][2];
    bool q_exact = false; // QX: every part past the first is zero for this warp's queries
    auto build_bq = [&](const float* qw) { // qw: [PK_G][D], this warp's kv head
        PK_QUERY_FRAGMENTS(qw)
        q_exact = QX && __all_sync(0xffffffffu, exact);
    };
    if (rotated) {
        float* qs = (float*)smem;
        for (int i = threadIdx.x; i < heads * D; i += blockDim.x) qs[i] = q[qcta + i];
        __syncthreads();
        rotate_smem(qs, heads, signs, rot_norm, false);
        build_bq(qs + head_local * PK_G * D);
        __syncthreads(); // the stages below reuse qs
    }

    // Tiles of this head's warp: sub, sub + wph, …; lane & 15 looks up the block of token
    // lane & 15 of a tile (lanes 16–31 repeat it).
    const u32 ntiles = (end - start + 15) / 16;
    const int my_n = ntiles > (u32)sub ? (int)((ntiles - sub + wph - 1) / wph) : 0;
    u8* wst = smem + warp * (ST * KST);
    const u32 bs_mask = (1u << log2_bs) - 1;
    auto tile_start = [&](int i) -> u32 { return start + (u32)(sub + i * wph) * 16; };
    auto block_of = [&](int i) -> u32 {
        const u32 pos = tile_start(i) + (lane & 15);
        return (i < my_n && pos < end) ? table[pos >> log2_bs] : 0u;
    };
    const u64 pol = EF ? l2_evict_first() : 0;
    auto issue = [&](int i, u32 blk) {
        u8* st = wst + (i % ST) * KST;
        const u32 pos = tile_start(i) + (lane & 15);
        const bool ok = pos < end;
        const u64 slot = ((u64)blk << log2_bs) | (pos & bs_mask);
        // (slot, head) index of token lane & 15 (0 with n = 0: zero-filled past the context).
        const u64 my_sh = ok ? slot * num_kv_heads + h : 0;
        const u32 my_n = ok ? 16u : 0u;
        const int r = lane / CPR, c = lane % CPR;
#pragma unroll
        for (int j = 0; j < 16 / RPI; j++) {
            const int t = j * RPI + r;
            const u64 sh = __shfl_sync(0xffffffffu, my_sh, t);
            const u32 n = __shfl_sync(0xffffffffu, my_n, t);
            cp_async_zfill<16, EF>(st + t * CROW + c * 16, kc + sh * CB + c * 16, n, pol);
            if constexpr (!VR) cp_async_zfill<16, EF>(st + (16 + t) * CROW + c * 16, vc + sh * CB + c * 16, n, pol);
        }
        if constexpr (QUANT) {
            // Scales: lanes 0–15 the K scales of token lane, lanes 16–31 the V scales.
            const u8* src = (lane < 16 ? ks : vs) + my_sh * SB;
            cp_async_zfill<SB, EF>(st + 32 * CROW + lane * SB, src, my_n == 0 ? 0u : (u32)SB, pol);
        }
    };
    // Prologue: the block ids of the first ST tiles (looked up above, or now, together, with a
    // window), then ST − 1 tiles' copies issued; the queries' loads (unrotated formats) overlap.
    // Eager (a warp with at most ST tiles, as in the short partitions of small batches): all of
    // them, one group each, so the warp waits for one round trip to the pages instead of one per
    // tile; nothing is issued in the loop.
    if (window != 0) {
#pragma unroll
        for (int s = 0; s < ST; s++) first_blk[s] = block_of(s);
    }
    const bool eager = !VR && PK_TC_EAGER != 0 && my_n <= ST; // warp-uniform
    if (eager) {
#pragma unroll
        for (int s = 0; s < ST; s++) {
            if (s < my_n) {
                issue(s, first_blk[s]);
                cp_async_commit();
            }
        }
    } else {
#pragma unroll
        for (int s = 0; s < ST - TS; s++) {
            if (s < my_n) issue(s, first_blk[s]);
            cp_async_commit();
        }
    }
    u32 next_blk = first_blk[ST - TS];
    // VR: (slot, head) of token lane & 15 of a tile (~0 past the context; issue computes the same
    // index inline — routing it through this lambda grows every kernel's SASS, measured ones
    // included), and the V registers of the tile to attend next (tile 0's loads overlap the queries').
    auto v_slot = [&](int i, u32 blk) -> u64 {
        const u32 pos = tile_start(i) + (lane & 15);
        return pos < end ? (((u64)blk << log2_bs) | (pos & bs_mask)) * num_kv_heads + h : ~0ull;
    };
    uint4 vb[VR ? 4 * VC : 1];
    if constexpr (VR) v_load(vc, v_slot(0, first_blk[0]), lane, vb);
    if (!rotated) build_bq(q + qcta + head_local * PK_G * D);
    // VR: the query fragments into this warp's slice after the stages, bqs[((nt·KSTEPS + kk)·QP + j)·32 + lane].
    uint2* bqs = (uint2*)(smem + NW * ST * KST) + warp * (BQ_WORDS / 2);
    if constexpr (VR) {
#pragma unroll
        for (int nt = 0; nt < NS; nt++)
#pragma unroll
            for (int kk = 0; kk < KSTEPS; kk++)
#pragma unroll
                for (int j = 0; j < QP; j++)
                    bqs[((nt * KSTEPS + kk) * QP + j) * 32 + lane] = make_uint2(bq[nt][kk][j][0], bq[nt][kk][j][1]);
        __syncwarp();
    }

    float o[NS][KSTEPS][4]; // PACK: lanes of a quad hold different parts, summed after the loop
    float m[NS][2], l[NS][2];
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
    // ldmatrix row addresses: K (A, row-major [token][dim]) and V (A = V^T, via .trans).
    const int k_row = (lane & 7) + ((lane >> 3) & 1) * 8, k_col = (lane >> 4) * 8;
    const int v_row = (lane & 7) + (lane >> 4) * 8, v_col = ((lane >> 3) & 1) * 8;
    const int r0 = lane >> 2; // this thread's S^T rows: tokens r0 and r0 + 8 of the tile

    for (int i = 0; i < my_n; i += TS) {
        u64 v_next = ~0ull; // VR (ST = 2): tile i + 1's, whose K copies are issued now
        if constexpr (TS == 1) {
            if (eager) {
                cp_async_wait_n(my_n - 1 - i); // tiles i + 1 … my_n − 1 may still be in flight
            } else {
                cp_async_wait<ST - 2>();
            }
            __syncwarp(); // every lane's copies of tile i landed; every lane is done with tile i − 1
            if (!eager) {
                if (i + ST - 1 < my_n) {
                    if constexpr (VR) v_next = v_slot(i + 1, next_blk);
                    issue(i + ST - 1, next_blk);
                    next_blk = block_of(i + ST);
                }
                cp_async_commit();
            }
        } else {
            // TS tiles per step (ST ≥ 2·TS): the stages of the previous step's tiles (every lane
            // is past their PV) take tiles i + ST − TS …, one group each; then tiles i … i + TS − 1
            // must have landed, the TS just issued may still be in flight.
            if (!eager) {
                __syncwarp();
#pragma unroll
                for (int tt = 0; tt < TS; tt++) {
                    const int n = i + ST - TS + tt;
                    if (n < my_n) {
                        issue(n, next_blk);
                        next_blk = block_of(n + 1);
                    }
                    cp_async_commit();
                }
                cp_async_wait<TS>();
            } else {
                cp_async_wait_n(max(my_n - i - TS, 0));
            }
            __syncwarp();
        }
        // Tile i + tt of this step lies in stage (i + tt) % ST; has[tt]: it exists (tile i always
        // does; a missing last tile of an odd count reads a stale stage, its scores masked below
        // and its V scales zeroed, so that nothing of it reaches o or l).
        const u8* krows[TS]; // K rows (CROW stride)
        const u8* vrows[TS]; // V rows
        const u16* ksc[TS];  // quantized: [16][D/32] K scales
        const u16* vsc[TS];  // quantized: [16][D/32] V scales
        u32 t0[TS];
        bool has[TS];
#pragma unroll
        for (int tt = 0; tt < TS; tt++) {
            const u8* st = wst + ((i + tt) % ST) * KST;
            t0[tt] = tile_start(i + tt);
            has[tt] = tt == 0 || i + tt < my_n;
            krows[tt] = st;
            vrows[tt] = st + 16 * CROW;
            ksc[tt] = (const u16*)(st + 32 * CROW);
            vsc[tt] = ksc[tt] + 16 * (SB / 2);
        }

        // Quantized: the K and V scales of this thread's two tokens (rows r0, r0 + 8) of each tile.
        constexpr int NSC = QUANT ? D / 32 : 2;
        u32 ks0[TS][NSC / 2], ks1[TS][NSC / 2], vs0[TS][NSC / 2], vs1[TS][NSC / 2];
        if constexpr (QUANT) {
#pragma unroll
            for (int tt = 0; tt < TS; tt++) {
                load_scales<NSC>(ksc[tt] + r0 * (SB / 2), ks0[tt]);
                load_scales<NSC>(ksc[tt] + (r0 + 8) * (SB / 2), ks1[tt]);
                load_scales<NSC>(vsc[tt] + r0 * (SB / 2), vs0[tt]);
                load_scales<NSC>(vsc[tt] + (r0 + 8) * (SB / 2), vs1[tt]);
                if (!has[tt]) {
#pragma unroll
                    for (int w = 0; w < NSC / 2; w++) vs0[tt][w] = vs1[tt][w] = 0u;
                }
            }
        }

        // QK: every group of KG k-steps accumulates its parts (smallest first) in a fresh
        // fragment, added to s (quantized: times the group's K scale of the row's token).
        float s[TS][NS][4];
#pragma unroll
        for (int tt = 0; tt < TS; tt++) {
#pragma unroll
            for (int nt = 0; nt < NS; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[tt][nt][e] = 0.0f;
            const int qparts = q_exact ? 1 : QP; // warp-uniform
            u32 kraw[4]; // q4: the raw registers of two groups
#pragma unroll
            for (int g0 = 0; g0 < KSTEPS; g0 += KG) {
                float t[NS][4];
#pragma unroll
                for (int nt = 0; nt < NS; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) t[nt][e] = 0.0f;
                u32 a[KG][4];
                if constexpr (QUANT) {
                    const int grp = g0 / 2;
                    if constexpr (Q4) {
                        if ((grp & 1) == 0) k_raw(krows[tt], grp * 16, lane, kraw);
                        q4_k_fragments(kraw[2 * (grp & 1)], kraw[2 * (grp & 1) + 1], a);
                    } else {
                        k_raw(krows[tt], grp * 32, lane, kraw);
                        q8_k_fragments(kraw, a);
                    }
                } else {
                    ldsm_x4(a[0], krows[tt] + k_row * FROW + (g0 * 16 + k_col) * 2);
                }
#pragma unroll
                for (int k = 0; k < KG; k++)
#pragma unroll
                    for (int nt = 0; nt < NS; nt++)
#pragma unroll
                        for (int j = QP - 1; j >= 0; j--)
                            if (j < qparts) {
                                if constexpr (VR) {
                                    const uint2 b = bqs[((nt * KSTEPS + g0 + k) * QP + j) * 32 + lane];
                                    mma(t[nt], a[k], b.x, b.y);
                                } else {
                                    mma(t[nt], a[k], bq[nt][g0 + k][j][0], bq[nt][g0 + k][j][1]);
                                }
                            }
                float sc0 = 1.0f, sc1 = 1.0f;
                if constexpr (QUANT) {
                    sc0 = scale_at(ks0[tt], g0 / 2);
                    sc1 = scale_at(ks1[tt], g0 / 2);
                }
#pragma unroll
                for (int nt = 0; nt < NS; nt++) {
                    s[tt][nt][0] = fmaf(sc0, t[nt][0], s[tt][nt][0]);
                    s[tt][nt][1] = fmaf(sc0, t[nt][1], s[tt][nt][1]);
                    s[tt][nt][2] = fmaf(sc1, t[nt][2], s[tt][nt][2]);
                    s[tt][nt][3] = fmaf(sc1, t[nt][3], s[tt][nt][3]);
                }
            }
        }
        // PACK: the parts of each head summed over the quad; QX: the scale applied here.
#pragma unroll
        for (int tt = 0; tt < TS; tt++) {
#pragma unroll
            for (int nt = 0; nt < NS; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    if constexpr (PACK) s[tt][nt][e] = sum_parts(s[tt][nt][e]);
                    if constexpr (QX) s[tt][nt][e] *= qk_scale_log2;
                }
        }
        // Rows of S^T: tokens t0 + r0 (e = 0, 1) and t0 + r0 + 8 (e = 2, 3).
        bool ok0[TS], ok1[TS];
#pragma unroll
        for (int tt = 0; tt < TS; tt++) {
            ok0[tt] = t0[tt] + r0 < end;
            ok1[tt] = t0[tt] + r0 + 8 < end;
        }
        float corr[NS][2];
        bool rescale = false;
#pragma unroll
        for (int nt = 0; nt < NS; nt++) {
#pragma unroll
            for (int tt = 0; tt < TS; tt++) {
                if (!ok0[tt]) s[tt][nt][0] = s[tt][nt][1] = PK_NEG_INF;
                if (!ok1[tt]) s[tt][nt][2] = s[tt][nt][3] = PK_NEG_INF;
            }
#pragma unroll
            for (int j = 0; j < 2; j++) {
                float mx = fmaxf(s[0][nt][j], s[0][nt][2 + j]);
#pragma unroll
                for (int tt = 1; tt < TS; tt++) mx = fmaxf(mx, fmaxf(s[tt][nt][j], s[tt][nt][2 + j]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
                const float mn = fmaxf(m[nt][j], mx); // finite: tile i has a visible token
                corr[nt][j] = exp2f(m[nt][j] - mn);
                rescale |= mn != m[nt][j];
                m[nt][j] = mn;
                float sum = 0.0f; // (p0 + p1) of tile i, then of the others
#pragma unroll
                for (int tt = 0; tt < TS; tt++) {
                    const float p0 = exp2f(s[tt][nt][j] - mn), p1 = exp2f(s[tt][nt][2 + j] - mn);
                    sum = tt == 0 ? p0 + p1 : sum + (p0 + p1);
                    s[tt][nt][j] = p0;
                    s[tt][nt][2 + j] = p1;
                }
                l[nt][j] = l[nt][j] * corr[nt][j] + sum;
            }
        }
        // The accumulators change only where a running max moved (corr = 1 elsewhere): once
        // the maxima settle, whole tiles skip the rescale.
        if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
            for (int nt = 0; nt < NS; nt++)
#pragma unroll
                for (int mt = 0; mt < KSTEPS; mt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) o[nt][mt][e] *= corr[nt][e & 1];
        }
        // PV, per group of KG m-tiles: P^T (quantized: times the group's V scale of each token)
        // as B fragments, split into exact parts and transposed by movmatrix; the TS tiles of a
        // step accumulate in one fresh fragment per m-tile.
        // bp[tt][nt][j]: PACK: part set j (columns of the quad's lanes: part PPT·j + 2·quad / GP).
        u32 bp[TS][NS][PP][2];
#pragma unroll
        for (int g0 = 0; g0 < KSTEPS; g0 += KG) {
            u32 a[TS][KG][4];
#pragma unroll
            for (int tt = 0; tt < TS; tt++) {
                float sc0 = 1.0f, sc1 = 1.0f;
                if constexpr (QUANT) {
                    sc0 = scale_at(vs0[tt], g0 / 2);
                    sc1 = scale_at(vs1[tt], g0 / 2);
                }
                if (QUANT || g0 == 0) { // float pages: one set of B fragments serves every m-tile
#pragma unroll
                    for (int nt = 0; nt < NS; nt++) {
                        u32 x0[SP], x1[SP];
                        split2<SP>(s[tt][nt][0] * sc0, s[tt][nt][1] * sc0, x0);
                        split2<SP>(s[tt][nt][2] * sc1, s[tt][nt][3] * sc1, x1);
#pragma unroll
                        for (int j = 0; j < PP; j++) {
                            bp[tt][nt][j][0] = movtrans(PACK ? pick<SP>(x0, PPT * j + 2 * quad / GP) : x0[j]);
                            bp[tt][nt][j][1] = movtrans(PACK ? pick<SP>(x1, PPT * j + 2 * quad / GP) : x1[j]);
                        }
                    }
                }
                if constexpr (QUANT) {
                    pv_fragments(vrows[tt], g0 / 2, lane, a[tt]);
                } else if constexpr (VR) {
                    v_fragments(vb, g0, a[tt][0]);
                } else {
                    ldsm_x4_trans(a[tt][0], vrows[tt] + v_row * FROW + (g0 * 16 + v_col) * 2);
                }
            }
#pragma unroll
            for (int k = 0; k < KG; k++) {
                const int mt = g0 + k;
#pragma unroll
                for (int nt = 0; nt < NS; nt++) {
                    float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                    for (int tt = 0; tt < TS; tt++)
#pragma unroll
                        for (int j = PP - 1; j >= 0; j--) mma(t, a[tt][k], bp[tt][nt][j][0], bp[tt][nt][j][1]);
#pragma unroll
                    for (int e = 0; e < 4; e++) o[nt][mt][e] += t[e];
                }
            }
        }
        if constexpr (VR) v_load(vc, v_next, lane, vb); // in flight through the next tile's QK
    }
    cp_async_wait<0>();
#pragma unroll
    for (int nt = 0; nt < NS; nt++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            l[nt][j] += __shfl_xor_sync(0xffffffffu, l[nt][j], 4);
            l[nt][j] += __shfl_xor_sync(0xffffffffu, l[nt][j], 8);
            l[nt][j] += __shfl_xor_sync(0xffffffffu, l[nt][j], 16);
        }
    if constexpr (PACK) { // the parts of each head's output, summed over the quad (m, l agree)
#pragma unroll
        for (int mt = 0; mt < KSTEPS; mt++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[0][mt][e] = sum_parts(o[0][mt][e]);
    }
    // Lanes whose columns hold heads (PACK: part 0 of heads 2·quad, 2·quad + 1).
    const bool writer = !PACK || 2 * quad < GP;
    __syncthreads(); // all warps are done with their stages: reuse them for the merge

    // Merge the warps of each head: mw, lw [NW][HP], ow [NW][HP][D]; res [heads][D].
    float* mw = (float*)smem;
    float* lw = mw + NW * HP;
    float* ow = lw + NW * HP;
    float* res = ow + NW * HP * D;
    if (lane < 4 && writer) {
#pragma unroll
        for (int nt = 0; nt < NS; nt++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int g = nt * 8 + lane * 2 + j;
                mw[warp * HP + g] = m[nt][j];
                lw[warp * HP + g] = l[nt][j];
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
                    ow[(warp * HP + g) * D + (VR ? v_dim(mt, e >> 1, lane >> 2) : pv_dim(mt, e >> 1, lane >> 2))] = o[nt][mt][e];
                }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < heads * D; idx += blockDim.x) {
        const int hl = idx / (PK_G * D), g = (idx / D) % PK_G, dim = idx % D;
        const int w0 = hl * wph;
        float mx = PK_NEG_INF;
        for (int w = w0; w < w0 + wph; w++) mx = fmaxf(mx, mw[w * HP + g]);
        float acc = 0.0f, sum = 0.0f;
        for (int w = w0; w < w0 + wph; w++) {
            const float f = exp2f(mw[w * HP + g] - mx); // 0 for a warp without tiles
            acc = fmaf(f, ow[(w * HP + g) * D + dim], acc);
            sum = fmaf(f, lw[w * HP + g], sum);
        }
        if (direct) {
            res[idx] = acc / sum;
        } else {
            const int max_parts = gridDim.z;
            const u64 row = ((u64)seq * num_heads + (u64)blockIdx.x * heads + hl * PK_G + g) * max_parts + part;
            part_acc[row * D + dim] = acc; // rotated domain: the merge rotates back
            if (dim == 0) {
                part_ml[row * 2] = mx;
                part_ml[row * 2 + 1] = sum;
            }
        }
    }
    if (direct) {
        __syncthreads();
        if (signs != nullptr) rotate_smem(res, heads, signs, rot_norm, true);
        for (int idx = threadIdx.x; idx < heads * D; idx += blockDim.x) out[qcta + idx] = res[idx];
        return;
    }
    if (counters == nullptr) return;

    // Fused merge (split-K without a second launch): the last CTA of this (sequence, head group)
    // to finish combines every partition's partials. Classic threadfence reduction: each CTA
    // publishes its partials, then counts itself; the CTA that sees the count reach the number
    // of live partitions reads them all, writes the output and resets the counter to 0.
    __shared__ u32 is_last;
    __threadfence();
    __syncthreads();
    const u32 nparts = (ctx - lo + part_size - 1) / part_size;
    if (threadIdx.x == 0) {
        u32* counter = counters + (u64)seq * gridDim.x + blockIdx.x;
        const u32 prev = atomicAdd(counter, 1u);
        is_last = prev + 1 == nparts;
        if (is_last) *counter = 0; // every other CTA of the group has counted already
    }
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    const int max_parts = gridDim.z;
    const u64 row_base = ((u64)seq * num_heads + (u64)blockIdx.x * heads) * max_parts;
    // Weights w[head][p] = 2^(m_p − M) into shared memory (the stages are free), in chunks of
    // partitions that fit, with running maxima and denominators per head; each thread then sums
    // its (head, dim) pairs over the chunk with independent loads in flight.
    constexpr int MAXH = NW * PK_G;                    // heads per CTA: hpc ≤ NW
    constexpr int PER = (PK_G * D + 31) / 32;          // (head, dim) pairs per thread, at most
    constexpr int TOTAL = SMEM / 4;
    float* hm = (float*)smem + (TOTAL - 2 * MAXH);     // [heads] running max
    float* hs = hm + MAXH;                             // [heads] running denominator
    res = hm - heads * D;                              // [heads][D] result
    float* wts = (float*)smem;                         // [heads][chunk]
    const u32 chunk = (u32)((TOTAL - 2 * MAXH - heads * D) / heads);
    float acc[PER];  // this thread's pairs threadIdx.x + k·blockDim.x
    float mrun[PER];
#pragma unroll
    for (int k = 0; k < PER; k++) {
        acc[k] = 0.0f;
        mrun[k] = PK_NEG_INF;
    }
    if (threadIdx.x < (u32)heads) hs[threadIdx.x] = 0.0f;
    for (u32 p0 = 0; p0 < nparts; p0 += chunk) {
        const u32 np = min(chunk, nparts - p0);
        __syncthreads();
        // Chunk maxima per head (one warp per head), folded into the running max.
        for (int hd = warp; hd < heads; hd += NW) {
            float mx = PK_NEG_INF;
            for (u32 p = lane; p < np; p += 32) mx = fmaxf(mx, __ldcg(part_ml + (row_base + (u64)hd * max_parts + p0 + p) * 2));
            mx = warp_max(mx);
            const float m_old = p0 == 0 ? PK_NEG_INF : hm[hd];
            const float m_new = fmaxf(m_old, mx);
            float den = 0.0f;
            for (u32 p = lane; p < np; p += 32) {
                const u64 r = row_base + (u64)hd * max_parts + p0 + p;
                const float f = exp2f(__ldcg(part_ml + r * 2) - m_new);
                wts[hd * chunk + p] = f;
                den = fmaf(f, __ldcg(part_ml + r * 2 + 1), den);
            }
            den = warp_sum(den);
            if (lane == 0) {
                hs[hd] = hs[hd] * exp2f(m_old - m_new) + den; // exp2(−inf) = 0 on the first chunk
                hm[hd] = m_new;
            }
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < PER; k++) {
            const int idx = threadIdx.x + k * blockDim.x;
            if (idx >= heads * D) break;
            const int hd = idx / D, dim = idx % D;
            const float m_new = hm[hd];
            float a = acc[k] * exp2f(mrun[k] - m_new);
            const float* src = part_acc + (row_base + (u64)hd * max_parts + p0) * D + dim;
            const float* w = wts + hd * chunk;
            u32 p = 0;
            for (; p + 4 <= np; p += 4) {
                const float x0 = __ldcg(src + (u64)p * D), x1 = __ldcg(src + (u64)(p + 1) * D);
                const float x2 = __ldcg(src + (u64)(p + 2) * D), x3 = __ldcg(src + (u64)(p + 3) * D);
                a = fmaf(w[p], x0, a);
                a = fmaf(w[p + 1], x1, a);
                a = fmaf(w[p + 2], x2, a);
                a = fmaf(w[p + 3], x3, a);
            }
            for (; p < np; p++) a = fmaf(w[p], __ldcg(src + (u64)p * D), a);
            acc[k] = a;
            mrun[k] = m_new;
        }
    }
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int idx = threadIdx.x + k * blockDim.x;
        if (idx >= heads * D) break;
        res[idx] = acc[k] / hs[idx / D];
    }
    __syncthreads();
    if (signs != nullptr) rotate_smem(res, heads, signs, rot_norm, true);
    for (int idx = threadIdx.x; idx < heads * D; idx += blockDim.x) out[qcta + idx] = res[idx];
}


// grid (num_kv_heads / HPC, num_seqs, num_partitions), block 32·NW, dynamic smem
// tc::TC_SMEM_BYTES; HPC divides both num_kv_heads and NW.
#define PK_DECODE_TC_KERNEL(NAME, BOUNDS, VR)                                                                     \
    extern "C" __global__ void BOUNDS NAME(                                                                      \
        float* __restrict__ out,          /* [num_seqs, num_heads, D]            (1 partition) */               \
        float* __restrict__ part_acc,     /* [num_seqs, num_heads, max_parts, D] (partitions) */                \
        float* __restrict__ part_ml,      /* [num_seqs, num_heads, max_parts, 2] (m, l) */                      \
        const float* __restrict__ q,      /* [num_seqs, num_heads, D] */                                        \
        const u8* __restrict__ kc, const u8* __restrict__ ks, const u8* __restrict__ vc,                         \
        const u8* __restrict__ vs, const u32* __restrict__ tables, /* [num_seqs, max_blocks] */                  \
        u32 max_blocks, const u32* __restrict__ ctx_lens,          /* [num_seqs] */                              \
        const float* __restrict__ signs,                           /* [D] rotation signs, or null */             \
        float rot_norm, float qk_scale_log2, u32 window, u32 log2_bs, u32 part_size, u32 num_kv_heads,         \
        u32* __restrict__ counters) { /* [num_seqs, gridDim.x] zeros, or null: pk_merge follows */             \
        decode_tc_body<PK_G <= 4, true, PK_TC_EF != 0, VR>(out, part_acc, part_ml, q, kc, ks, vc, vs, tables,    \
                                                           max_blocks, ctx_lens, signs, rot_norm, qk_scale_log2, \
                                                           window, log2_bs, part_size, num_kv_heads, counters);  \
    }
PK_DECODE_TC_KERNEL(pk_decode_tc, PK_TC_BOUNDS, false)
#if PK_TC_VREG
// The same with V in registers (tc::VREG; dynamic smem tc::VREG_SMEM_BYTES), the compiler held to
// 16 warps per SM (128 registers with 8 warps) unless PK_TC_MINB says otherwise. The host routes
// the calls whose grid has more CTAs than the device has SMs to it (shapes::tc_vreg_call).
#if PK_TC_MINB == 0
#define PK_TC_VREG_BOUNDS __launch_bounds__(32 * PK_TC_WARPS, PK_TC_WARPS >= 16 ? 1 : 16 / PK_TC_WARPS)
#else
#define PK_TC_VREG_BOUNDS PK_TC_BOUNDS
#endif
static_assert(tc::VREG, "PK_TC_VREG needs float pages, head_dim a multiple of 64 and 2 stages");
PK_DECODE_TC_KERNEL(pk_decode_tc_vreg, PK_TC_VREG_BOUNDS, true)
#endif

// The kernel before packed columns and the rounded-query shortcut (one n-tile per part, query
// pre-scaled): same arguments and results; kept for same-call comparisons
// (PAGEKV_DEV_CUDA_TC_BASE=1).
extern "C" __global__ void PK_TC_BOUNDS
pk_decode_tc_base(float* __restrict__ out,          // [num_seqs, num_heads, D]            (1 partition)
             float* __restrict__ part_acc,     // [num_seqs, num_heads, max_parts, D] (partitions)
             float* __restrict__ part_ml,      // [num_seqs, num_heads, max_parts, 2] (m, l)
             const float* __restrict__ q,      // [num_seqs, num_heads, D]
             const u8* __restrict__ kc, const u8* __restrict__ ks,
             const u8* __restrict__ vc, const u8* __restrict__ vs,
             const u32* __restrict__ tables,   // [num_seqs, max_blocks]
             u32 max_blocks,
             const u32* __restrict__ ctx_lens, // [num_seqs]
             const float* __restrict__ signs,  // [D] rotation signs, or null
             float rot_norm, float qk_scale_log2, u32 window, u32 log2_bs, u32 part_size,
             u32 num_kv_heads,
             u32* __restrict__ counters) {       // [num_seqs, gridDim.x] zeros, or null: pk_merge follows
    decode_tc_body<false, false, false, false>(out, part_acc, part_ml, q, kc, ks, vc, vs, tables, max_blocks, ctx_lens, signs,
                                 rot_norm, qk_scale_log2, window, log2_bs, part_size, num_kv_heads, counters);
}

#endif // PK_HAS_TC
