// prefill_tc.cu — causal prefill attention over the paged cache on the tensor cores
// (FlashAttention-2 style), for f16 / bf16 pages with head_dim 32, 64, 128 or 256 and up to 16
// query heads per kv head. Other formats take the decode kernel row by row (the host routes).
//
// A CTA takes one kv head and a tile of up to TQ = ROWS / G consecutive query tokens of one
// sequence: ROWS = 64 query rows (token, head of the group), 16 per warp (the m dimension of the
// mma). It walks the keys [lo, C_last) of its sequence in tiles of BK tokens — C_last the context
// of its last token, lo the window start of its first — through a 2-stage cp.async pipeline
// shared by the 4 warps (K rows then V rows, zero-filled past C_last), and per tile:
//   S [16 rows × BK keys] = Q [16 × D] · K^T [D × BK]   (A = Q parts from smem, B = K via ldmatrix)
//   O [16 rows × D]      += P [16 × BK] · V [BK × D]    (A = P from S's registers, B = V via ldmatrix.trans)
// with an online softmax per row. Row r (token t, head g) sees keys [lo_t, C_t): C_t = that
// token's context (position + 1), lo_t = C_t − W with a sliding window W, else 0 — the mask is
// applied to S per element, so rows of one CTA may see different key ranges.
//
// Precision as in decode_tc.cuh: the f32 queries and probabilities are split into parts exact in
// the mma type (3 for bf16, 2 for f16), and every k-step of QK and every 16-key step of PV
// accumulates in a fresh fragment added to the running sums in f32 round-to-nearest.

#if defined(PK_HAS_TC) && (PK_KC == CODEC_F16 || PK_KC == CODEC_BF16) && PK_G <= 16
#define PK_HAS_PREFILL_TC 1

namespace pf {
constexpr int NW = 4;                     // warps per CTA
constexpr int ROWS = 16 * NW;             // query rows per CTA
constexpr int TQ = ROWS / PK_G;           // query tokens per CTA (host: shapes::prefill_tokens_per_cta)
constexpr int BK = 32;                    // keys per tile
constexpr int ST = 2;                     // pipeline stages
constexpr int D = PK_D;
constexpr int KSTEPS = D / 16;            // k-steps of QK
constexpr int NKT = BK / 8;               // key n-tiles of S
constexpr int NDT = D / 8;                // dim n-tiles of O
constexpr int FROW = 2 * D + 16;          // smem row stride (bytes): ldmatrix rows hit distinct banks
constexpr int SQ = tc::SQ, SP = tc::SP;   // parts of q and of p
constexpr int CPR = 2 * D / 16;           // 16-byte chunks per K or V row
constexpr int KV_STAGE = 2 * BK * FROW;   // BK K rows, then BK V rows
// Dynamic shared memory (host mirror: shapes::prefill_smem_bytes): the stages, then the query
// parts [SQ][ROWS][FROW].
constexpr int SMEM_BYTES = ST * KV_STAGE + SQ * ROWS * FROW;
static_assert(TQ >= 1 && NKT % 2 == 0 && NDT % 2 == 0, "tile shape");
} // namespace pf

// grid (num_kv_heads, num_tiles), block 128, dynamic smem pf::SMEM_BYTES.
extern "C" __global__ void __launch_bounds__(128)
pk_prefill_tc(float* __restrict__ out,          // [num_tokens, num_heads, D]
              const float* __restrict__ q,      // [num_tokens, num_heads, D]
              const u8* __restrict__ kc,        // K codes [num_blocks, block_size, num_kv_heads, 2·D]
              const u8* __restrict__ vc,        // V codes, same layout
              const u32* __restrict__ tables,   // [num_tokens, max_blocks] each token's sequence's table
              u32 max_blocks,
              const u32* __restrict__ ctx_lens, // [num_tokens] keys visible to each token (position + 1)
              const u32* __restrict__ tiles,    // [num_tiles, 2] (first token, tokens ≤ TQ), one sequence each
              float qk_scale_log2, u32 window, u32 log2_bs, u32 num_kv_heads) {
    using pf::NW, pf::ROWS, pf::TQ, pf::BK, pf::ST, pf::D, pf::KSTEPS, pf::NKT, pf::NDT, pf::FROW, pf::SQ, pf::SP,
        pf::CPR, pf::KV_STAGE;
    const int h = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 t0 = tiles[2 * blockIdx.y], nt = min(tiles[2 * blockIdx.y + 1], (u32)TQ);
    if (nt == 0) return;
    const int num_heads = (int)num_kv_heads * PK_G;
    const u32* table = tables + (u64)t0 * max_blocks;
    const u32 ctx_first = ctx_lens[t0], hi = ctx_lens[t0 + nt - 1];
    const u32 lo = (window != 0 && ctx_first > window) ? ctx_first - window : 0;

    extern __shared__ __align__(16) u8 smem[];
    {
        u32 dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < (u32)pf::SMEM_BYTES) __trap(); // host/kernel layout mismatch
    }
    u8* qs = smem + ST * KV_STAGE; // [SQ][ROWS][FROW] query parts, scaled by scale·log2 e

    const u32 bs_mask = (1u << log2_bs) - 1;
    const u32 ntiles = (hi - lo + BK - 1) / BK;
    // Copies key tile i (keys lo + i·BK …) into its stage, zeros past hi.
    auto issue = [&](u32 i) {
        u8* st = smem + (i % ST) * KV_STAGE;
        const u32 base = lo + i * BK;
        for (int c = threadIdx.x; c < BK * CPR; c += 32 * NW) {
            const int t = c / CPR, ch = c % CPR;
            const u32 pos = base + t;
            const bool ok = pos < hi;
            u64 sh = 0;
            if (ok) sh = ((((u64)table[pos >> log2_bs]) << log2_bs) | (pos & bs_mask)) * num_kv_heads + h;
            tc::cp_async_zfill<16>(st + t * FROW + ch * 16, kc + sh * (2 * D) + ch * 16, ok ? 16u : 0u);
            tc::cp_async_zfill<16>(st + (BK + t) * FROW + ch * 16, vc + sh * (2 * D) + ch * 16, ok ? 16u : 0u);
        }
    };
    issue(0);
    cp_async_commit();

    // Queries: row r = token r / G, head r % G of kv head h; rows past the tile are zeros.
    for (int i = threadIdx.x; i < ROWS * (D / 2); i += 32 * NW) {
        const int r = i / (D / 2), d2 = (i % (D / 2)) * 2;
        const u32 tok = (u32)(r / PK_G);
        float2 v = make_float2(0.0f, 0.0f);
        if (tok < nt) v = *(const float2*)(q + (((u64)(t0 + tok)) * num_heads + h * PK_G + r % PK_G) * D + d2);
        u32 parts[SQ];
        tc::split2<SQ>(v.x * qk_scale_log2, v.y * qk_scale_log2, parts);
#pragma unroll
        for (int j = 0; j < SQ; j++) *(u32*)(qs + (j * ROWS + r) * FROW + d2 * 2) = parts[j];
    }

    // This thread's two rows (g, g + 8 of the warp's 16) and their visible keys [lo_r, hi_r).
    const int g = lane >> 2, c = lane & 3;
    u32 row_lo[2], row_hi[2];
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const u32 tok = (u32)((warp * 16 + g + 8 * j) / PK_G);
        const u32 cx = tok < nt ? ctx_lens[t0 + tok] : 0u; // 0: a padding row sees nothing
        row_hi[j] = cx;
        row_lo[j] = (window != 0 && cx > window) ? cx - window : 0u;
    }

    float o[NDT][4];
#pragma unroll
    for (int dt = 0; dt < NDT; dt++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[dt][e] = 0.0f;
    float m[2] = {PK_NEG_INF, PK_NEG_INF}, l[2] = {0.0f, 0.0f};
    // ldmatrix lane addresses: Q (A, [row][dim]), K (B, [key][dim]), V (B, [key][dim], .trans).
    const int q_row = (lane & 7) + ((lane >> 3) & 1) * 8, q_col = (lane >> 4) * 8;
    const int k_row = (lane & 7) + (lane >> 4) * 8, k_col = ((lane >> 3) & 1) * 8;
    const int v_row = (lane & 7) + ((lane >> 3) & 1) * 8, v_col = (lane >> 4) * 8;

    for (u32 i = 0; i < ntiles; i++) {
        if (i + 1 < ntiles) issue(i + 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads(); // tile i landed (and, on i = 0, the query parts are written)
        const u8* ks = smem + (i % ST) * KV_STAGE;
        const u8* vs = ks + BK * FROW;
        const u32 kb = lo + i * BK;

        // S = Q K^T: per k-step, the parts (smallest first) into a fresh fragment.
        float s[NKT][4];
#pragma unroll
        for (int kt = 0; kt < NKT; kt++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[kt][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KSTEPS; kk++) {
            u32 aq[SQ][4];
#pragma unroll
            for (int j = 0; j < SQ; j++) tc::ldsm_x4(aq[j], qs + (j * ROWS + warp * 16 + q_row) * FROW + (kk * 16 + q_col) * 2);
#pragma unroll
            for (int kp = 0; kp < NKT / 2; kp++) {
                u32 b[4]; // keys 16kp + 0..7: b[0], b[1]; keys 16kp + 8..15: b[2], b[3]
                tc::ldsm_x4(b, ks + (kp * 16 + k_row) * FROW + (kk * 16 + k_col) * 2);
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                    for (int j = SQ - 1; j >= 0; j--) tc::mma(t, aq[j], b[2 * half], b[2 * half + 1]);
#pragma unroll
                    for (int e = 0; e < 4; e++) s[2 * kp + half][e] += t[e];
                }
            }
        }
        // Mask, online softmax. Element e of key n-tile kt: row g + 8·(e >> 1), key 8kt + 2c + (e & 1).
        float mx[2] = {PK_NEG_INF, PK_NEG_INF};
#pragma unroll
        for (int kt = 0; kt < NKT; kt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const u32 key = kb + kt * 8 + 2 * c + (e & 1);
                const int j = e >> 1;
                if (key < row_lo[j] || key >= row_hi[j]) s[kt][e] = PK_NEG_INF;
                mx[j] = fmaxf(mx[j], s[kt][e]);
            }
        float corr[2], base[2];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 1));
            mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 2));
            const float mn = fmaxf(m[j], mx[j]);
            base[j] = mn == PK_NEG_INF ? 0.0f : mn; // a row that has seen nothing yet stays at 0
            corr[j] = exp2f(m[j] - base[j]);
            m[j] = mn;
        }
        float sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int kt = 0; kt < NKT; kt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = exp2f(s[kt][e] - base[e >> 1]);
                s[kt][e] = p;
                sum[e >> 1] += p;
            }
#pragma unroll
        for (int j = 0; j < 2; j++) l[j] = l[j] * corr[j] + sum[j];
#pragma unroll
        for (int dt = 0; dt < NDT; dt++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[dt][e] *= corr[e >> 1];

        // O += P V, per 16 keys: P's A fragment straight from S's registers, split into parts.
#pragma unroll
        for (int k16 = 0; k16 < BK / 16; k16++) {
            u32 ap[SP][4];
            {
                u32 x[4][SP];
                tc::split2<SP>(s[2 * k16][0], s[2 * k16][1], x[0]);         // row g, keys 2c, 2c + 1
                tc::split2<SP>(s[2 * k16][2], s[2 * k16][3], x[1]);         // row g + 8
                tc::split2<SP>(s[2 * k16 + 1][0], s[2 * k16 + 1][1], x[2]); // row g, keys 8 + 2c, …
                tc::split2<SP>(s[2 * k16 + 1][2], s[2 * k16 + 1][3], x[3]); // row g + 8
#pragma unroll
                for (int j = 0; j < SP; j++)
#pragma unroll
                    for (int r = 0; r < 4; r++) ap[j][r] = x[r][j];
            }
#pragma unroll
            for (int dp = 0; dp < NDT / 2; dp++) {
                u32 b[4]; // dims 16dp + 0..7: b[0], b[1]; dims 16dp + 8..15: b[2], b[3]
                tc::ldsm_x4_trans(b, vs + (k16 * 16 + v_row) * FROW + (dp * 16 + v_col) * 2);
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                    for (int j = SP - 1; j >= 0; j--) tc::mma(t, ap[j], b[2 * half], b[2 * half + 1]);
#pragma unroll
                    for (int e = 0; e < 4; e++) o[2 * dp + half][e] += t[e];
                }
            }
        }
        __syncthreads(); // every warp is done with this stage before it is refilled
    }
    cp_async_wait<0>();

#pragma unroll
    for (int j = 0; j < 2; j++) {
        l[j] += __shfl_xor_sync(0xffffffffu, l[j], 1);
        l[j] += __shfl_xor_sync(0xffffffffu, l[j], 2);
    }
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int r = warp * 16 + g + 8 * j;
        const u32 tok = (u32)(r / PK_G);
        if (tok >= nt) continue;
        const float inv = 1.0f / l[j];
        float* dst = out + (((u64)(t0 + tok)) * num_heads + h * PK_G + r % PK_G) * D + 2 * c;
#pragma unroll
        for (int dt = 0; dt < NDT; dt++)
            *(float2*)(dst + dt * 8) = make_float2(o[dt][2 * j] * inv, o[dt][2 * j + 1] * inv);
    }
}

#endif // tensor-core prefill
