// decode_tc.cuh — the shared header of the tensor-core decode kernels, whose grids are in
// decode_tc_partitioned.cu (pk_decode_tc, pk_decode_tc_vreg, pk_decode_tc_base) and
// decode_tc_stream_k.cu (pk_decode_tc_sk): its shape constants (namespace tc), fragment
// helpers, the tile loop and the query fragments both grids use.
//
// Paged decode attention on the tensor cores (mma.sync m16n8k16), for pages
// stored as f16 or bf16 (head_dim 32, 64, 128 or 256) or as q8 / q4 / rotated q4 (head_dim 64,
// 128 or 256), up to 16 query heads per kv head. Other shapes and formats use decode.cu.
//
// Same contract as pk_decode in decode.cu (arguments, visibility, partial outputs for pk_merge),
// plus two trailing arguments: num_kv_heads, and a counter array with which the partitioned
// route merges its partitions inside this launch (no pk_merge). The host picks this kernel when
// the format allows it (shapes::tc_supported).
//
// Work split: one CTA per (group of HPC kv heads, sequence, partition), NW warps, WPH = NW / HPC
// per kv head (HPC = num_kv_heads / gridDim.x, chosen by the host). The partition is cut into
// tiles of 16 tokens; the warps of a head take tiles sub, sub + WPH, … and each runs on its own:
// its own cp.async pipeline (ST stages of 16 K rows + 16 V rows, zero-filled past the context,
// whole rows per copy instruction), its own online softmax, its own accumulators — no
// block-wide barrier until the final merge of the warps of each head. pk_decode_tc_vreg (f16/bf16
// pages, PK_TC_VREG) stages the K rows only and loads each lane's share of the V rows into
// registers one tile ahead, so that two CTAs of 8 warps fit an SM (see tc::VREG).
//
// Per tile, in the transposed form so the 8 columns of the mma are the query heads:
//   S^T [16 tokens × 8 heads] = K [16 × D] · Q^T [D × 8]      (A = K via ldmatrix, B = Q in registers)
//   O^T [D × 8 heads]        += V^T [D × 16] · P^T [16 × 8]   (A = V via ldmatrix.trans, B = P via movmatrix)
// The C fragment of S^T holds, per thread, the same two heads as the C fragments of O^T, so the
// running max / sum rescaling needs no data exchange.
//
// Quantized pages (q8, q4): the codes go from the stage straight into mma fragments, no f16
// tile in between. K: ldmatrix of the raw code bytes (16 tokens × 32 bytes = one q8 group, or
// two q4 groups), each register turned into f16 pairs by PRMT / LOP3 with the 0x6400
// magic exponent (1024 + code, exact) and one HSUB2/HFMA2 — the dims inside a k-step come out
// permuted, and the query's B fragments are built with the same permutation (qk_dim). V (the A
// operand of PV is V^T: pairs of tokens per dim): 32-bit loads of 4 tokens' codes, PRMT to
// interleave two tokens' bytes, the same magic conversion; each m-tile holds the dims of one
// 32-value group, in a permuted order (pv_dim) that the output store undoes. The per-group
// scales are applied in f32 — to each group's partial scores (QK) and to the probabilities
// that meet each group of V dims (PV) — so integer codes stay exact in f16.
// Precision: the mma operands that come from f32 are split into parts that are each exact in the
// mma type (q = q0 + q1 + q2 for bf16, q0 + q1 for f16; p likewise), and every k-step (QK) or
// tile (PV) accumulates in a fresh fragment that is added to the running sums with f32
// round-to-nearest — the tensor cores' own f32 accumulation truncates, which biases long chains.
// Scores and weights so carry about f32 precision: the SIMT kernel's error bounds hold.

#if PK_G > 0 && PK_KC == PK_VC &&                                                              \
    (((PK_KC == CODEC_F16 || PK_KC == CODEC_BF16) &&                                           \
      (PK_D == 32 || PK_D == 64 || PK_D == 128 || PK_D == 256)) ||                              \
     ((PK_KC == CODEC_Q8 || PK_KC == CODEC_Q4) && (PK_D == 64 || PK_D == 128 || PK_D == 256)))
#define PK_HAS_TC 1

#ifndef PK_TC_WARPS
#define PK_TC_WARPS 4
#endif
#ifndef PK_TC_STAGES
#define PK_TC_STAGES 3
#endif
#ifndef PK_TC_EF
#define PK_TC_EF 0 // 1: the page copies carry an L2 evict-first policy
#endif
#ifndef PK_TC_EAGER
#define PK_TC_EAGER 0 // 1: a warp whose tiles all fit in its stages issues every copy at once
#endif
#ifndef PK_TC_MINB
#define PK_TC_MINB 0 // __launch_bounds__ minimum blocks per SM (caps registers); 0: none given
#endif
#ifndef PK_TC_PAIR
#define PK_TC_PAIR 0 // 1: quantized pages attend two tiles per step of pk_decode_tc's loop (tc::TS, tiles per step)
#endif
#ifndef PK_TC_VREG
#define PK_TC_VREG 0 // 1: the module also holds pk_decode_tc_vreg (V rows in registers; float pages)
#endif
#if PK_TC_MINB > 0
#define PK_TC_BOUNDS __launch_bounds__(32 * PK_TC_WARPS, PK_TC_MINB)
#else
#define PK_TC_BOUNDS __launch_bounds__(32 * PK_TC_WARPS)
#endif

namespace tc {
constexpr int NW = PK_TC_WARPS;          // warps per CTA
constexpr int ST = PK_TC_STAGES;         // pipeline stages per warp
constexpr int D = PK_D;
constexpr int KSTEPS = D / 16;           // k-steps of QK = m-tiles of PV
constexpr int NT = (PK_G + 7) / 8;       // n-tiles (8 heads each)
constexpr bool QUANT = PK_KC == CODEC_Q8 || PK_KC == CODEC_Q4;
constexpr bool Q4 = PK_KC == CODEC_Q4;
constexpr bool BF = PK_KC == CODEC_BF16; // mma type: bf16, else f16
constexpr int SQ = BF ? 3 : 2;           // parts of q
constexpr int SP = BF ? 3 : 2;           // parts of p
constexpr int KG = QUANT ? 2 : 1;        // k-steps per scale group (32 values) / per fresh fragment
constexpr int FROW = 2 * D + 16;         // f16/bf16 row stride in smem: ldmatrix rows hit distinct banks
// Code bytes and scale bytes of one head vector in the pages.
constexpr int CB = QUANT ? (Q4 ? D / 2 : D) : 2 * D;
constexpr int SB = QUANT ? 2 * (D / 32) : 0;
// Stage row stride of the codes: rows 16 bytes longer than the codes, so that 8 rows read by
// ldmatrix (or the 32 lanes' 32-bit V loads) hit distinct banks.
constexpr int CROW = QUANT ? CB + 16 : FROW;
// Stage of one warp: 16 K rows then 16 V rows of CROW bytes; quantized: then K scales [16][SB],
// V scales [16][SB].
constexpr int STAGE = 32 * CROW + 32 * SB;
constexpr int WARP_BYTES = ST * STAGE;
// Copy: CPR 16-byte chunks per code row; CPR consecutive lanes copy one row, RPI rows per
// instruction (whole 128-byte lines per request).
constexpr int CPR = CB / 16;
constexpr int RPI = 32 / CPR;
static_assert(CPR >= 1 && CPR <= 32 && (CPR & (CPR - 1)) == 0, "code rows of 16·2^k bytes");
static_assert(STAGE % 16 == 0 && WARP_BYTES % 16 == 0, "16-byte aligned stages");
constexpr int HP = NT * 8;               // heads of the mma columns (padded)
// Packed columns (groups of at most 4 heads): the 8 columns of an n-tile hold GP heads (the
// group padded to 2 or 4) × PPT split parts, column n = head n % GP, part PPT·j + n / GP of
// n-tile j; the parts of a head are summed across lanes after the mma (lanes c, c ^ GP/2, …
// of a quad hold the same heads). PACKQ / PACKP n-tiles carry the SQ / SP parts.
constexpr int GP = PK_G <= 2 ? 2 : 4;
constexpr int PPT = 8 / GP;
constexpr int PACKQ = (SQ + PPT - 1) / PPT;
constexpr int PACKP = (SP + PPT - 1) / PPT;
constexpr int MERGE_FLOATS = NW * HP * (D + 2) + NW * PK_G * D;
// Dynamic shared memory: the warps' stages, or the merge scratch where that is larger (the host
// mirror is shapes::decode_tc_smem_bytes).
constexpr int TC_SMEM_BYTES = NW * WARP_BYTES > 4 * MERGE_FLOATS ? NW * WARP_BYTES : 4 * MERGE_FLOATS;
// V rows in registers (PK_TC_VREG: pk_decode_tc_vreg, f16/bf16 pages, head_dim a multiple of 64,
// 2 stages): the stages hold the 16 K rows of a tile only, each lane loads the V chunks its PV
// A fragments need (VC = D / 64 chunks of 16 bytes from each of 4 token rows, see v_load), and
// the query's B fragments live in shared memory after the stages ([NS][KSTEPS][QP][32 lanes] u32
// pairs per warp), so that the registers fit 16 warps per SM. The host mirror is
// shapes::tc_vreg_smem_bytes.
constexpr bool VREG = PK_TC_VREG != 0 && !QUANT && D % 64 == 0 && ST == 2;
// Tiles per step of pk_decode_tc's loop (PK_TC_PAIR, quantized pages, groups of at most 4 — wider
// ones would leave the 128 registers): a step of two tiles runs their QK chains side by side, one
// softmax reduction and one rescale for 32 tokens, and their PV into one fresh fragment per
// m-tile; its pipeline keeps a step's tiles in flight (ST ≥ 2·TS).
constexpr int TS = PK_TC_PAIR != 0 && QUANT && PK_G <= 4 ? 2 : 1;
static_assert(TS == 1 || ST >= 2 * TS, "two tiles per step need at least 4 stages");
constexpr int VC = D >= 64 ? D / 64 : 1; // (D 32: no V in registers; sizes only)
constexpr int KSTAGE = 16 * CROW;
constexpr int BQ_WORDS = (PK_G <= 4 ? PACKQ : NT * SQ) * KSTEPS * 64; // u32 per warp (PACK as pk_decode_tc)
constexpr int VREG_SMEM_BYTES = NW * (ST * KSTAGE + 4 * BQ_WORDS) > 4 * MERGE_FLOATS
                                    ? NW * (ST * KSTAGE + 4 * BQ_WORDS) : 4 * MERGE_FLOATS;

// (x0, x1) rounded to the mma type and packed, x0 in the low half: one CVT for the pair.
__device__ __forceinline__ u32 pack_t(float x0, float x1) {
    u32 r;
    if constexpr (BF) {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(x1), "f"(x0));
    } else {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(x1), "f"(x0));
    }
    return r;
}
// The two values of a packed pair of the mma type, exactly.
__device__ __forceinline__ void unpack_t(u32 v, float& x0, float& x1) {
    if constexpr (BF) {
        x0 = __uint_as_float(v << 16);
        x1 = __uint_as_float(v & 0xffff0000u);
    } else {
        asm("{.reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;}\n"
            : "=f"(x0), "=f"(x1) : "r"(v));
    }
}

// Splits (x0, x1) into N packed pairs whose sum is (x0, x1) to ~f32 precision (each part the
// round-to-nearest of what the previous parts left).
template <int N>
__device__ __forceinline__ void split2(float x0, float x1, u32 out[N]) {
#pragma unroll
    for (int j = 0; j < N; j++) {
        out[j] = pack_t(x0, x1);
        if (j + 1 < N) {
            float r0, r1;
            unpack_t(out[j], r0, r1);
            x0 -= r0;
            x1 -= r1;
        }
    }
}

// p[i] (0 when i ≥ N), with a runtime i and no local-memory indexing.
template <int N>
__device__ __forceinline__ u32 pick(const u32 p[N], int i) {
    u32 r = 0;
#pragma unroll
    for (int j = 0; j < N; j++) r = i == j ? p[j] : r;
    return r;
}
// x summed over the lanes of a quad that hold the other parts of the same heads (packed
// columns: lanes c ^ GP/2, …).
__device__ __forceinline__ float sum_parts(float x) {
#pragma unroll
    for (int off = GP / 2; off < 4; off <<= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

// The NSC = D / 32 f16 scales of one head vector in the stage (SB bytes, SB-aligned), packed
// in pairs: one shared-memory load; scale_at converts one where it is used.
template <int NSC>
__device__ __forceinline__ void load_scales(const u16* p, u32 w[NSC / 2]) {
    if constexpr (NSC == 2) {
        w[0] = *(const u32*)p;
    } else if constexpr (NSC == 4) {
        const uint2 v = *(const uint2*)p;
        w[0] = v.x; w[1] = v.y;
    } else {
        static_assert(NSC == 8, "head_dim 64, 128 or 256");
        const uint4 v = *(const uint4*)p;
        w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
    }
}
__device__ __forceinline__ float scale_at(const u32* w, int g) {
    return f16_to_f32((u16)(g & 1 ? w[g >> 1] >> 16 : w[g >> 1] & 0xffffu));
}

__device__ __forceinline__ void ldsm_x4(u32 r[4], const u8* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(u32 r[4], const u8* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ u32 movtrans(u32 x) {
    u32 y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}
__device__ __forceinline__ void mma(float c[4], const u32 a[4], u32 b0, u32 b1) {
    if constexpr (BF) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}
// N-byte (4, 8 or 16) global→shared copy that writes zeros when `bytes` is 0; EF: with the L2
// cache policy `pol` (l2_evict_first).
template <int N, bool EF = false>
__device__ __forceinline__ void cp_async_zfill(u8* dst, const u8* src, u32 bytes, u64 pol = 0) {
    if constexpr (EF && N == 16) {
        asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(smem_addr(dst)), "l"(src),
                     "r"(bytes), "l"(pol));
    } else if constexpr (EF) {
        asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], %2, %3, %4;\n" ::"r"(smem_addr(dst)), "l"(src),
                     "n"(N), "r"(bytes), "l"(pol));
    } else if constexpr (N == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes));
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_addr(dst)), "l"(src), "n"(N), "r"(bytes));
    }
}
// cp.async.wait_group with a run-time count (0 ≤ n < 8): every group but the n newest landed.
__device__ __forceinline__ void cp_async_wait_n(int n) {
    switch (n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    case 6: cp_async_wait<6>(); break;
    default: cp_async_wait<7>(); break;
    }
}
// An L2 policy that marks the streamed pages first to be evicted: each page is read once per call,
// and the L2 is better left to the partial results, tables and queries.
__device__ __forceinline__ u64 l2_evict_first() {
    u64 pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
    return pol;
}
__device__ __forceinline__ u32 hsub2(u32 a, u32 b) {
    u32 d;
    asm("sub.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
// (a & b) | c in one LOP3.
__device__ __forceinline__ u32 and_or(u32 a, u32 b, u32 c) {
    u32 d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ u32 hfma2(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
// q8: bytes b0..b3 of w (int8 codes) as the f16 pairs (b0, b1) and (b2, b3), exactly: the sign
// flip biases them to 0..255, PRMT puts them under the f16 exponent of 1024 (0x64XX = 1024 +
// XX), HSUB2 removes 1024 + 128.
__device__ __forceinline__ void q8_pairs(u32 w, u32& lo, u32& hi) {
    w ^= 0x80808080u;
    lo = hsub2(__byte_perm(w, 0x64646464u, 0x5140), 0x64806480u);
    hi = hsub2(__byte_perm(w, 0x64646464u, 0x5342), 0x64806480u);
}
// q4: the nibbles of bytes 0 and 2 of w as f16 pairs minus 8, exactly: low nibbles (LOP3 under
// the 1024 exponent, HSUB2 of 1032) and high nibbles (1024 + 16·n, HFMA2 by 1/16 minus 72).
__device__ __forceinline__ u32 q4_lo_pair(u32 w) {
    return hsub2(and_or(w, 0x000f000fu, 0x64006400u), 0x64086408u);
}
__device__ __forceinline__ u32 q4_hi_pair(u32 w) {
    return hfma2(and_or(w, 0x00f000f0u, 0x64006400u), 0x2c002c00u, 0xd480d480u);
}

// Dim of the query that meets element e (0, 1) of B-fragment register `half` (0: mma k 2c + e,
// 1: mma k 8 + 2c + e; c = lane % 4) in k-step kk — the order in which the A fragments of K hold
// the dims (see qk_fragments).
__device__ __forceinline__ int qk_dim(int kk, int half, int e, int c) {
    if constexpr (!QUANT) {
        return kk * 16 + 2 * c + 8 * half + e;
    } else if constexpr (Q4) {
        return kk * 16 + 4 * c + half + 2 * e; // kk = 2·group + (0: low nibbles, 1: high)
    } else {
        return kk * 16 + 4 * c + 2 * half + e;
    }
}

// A fragments of K, 32 code bytes at a time: ldmatrix.x4 of rows 0–15 × bytes [off, off + 32) of
// the stage's K rows (lane addresses: row (lane & 7) + 8·((lane >> 3) & 1), 16-byte column
// lane >> 4); registers: rows g / g + 8 × bytes 0–15, then rows g / g + 8 × bytes 16–31.
// q8: those 32 bytes are one group, its two k-steps: k-step s holds dims 16s + 4c + {0, 1}
// (a0 / a1) and 16s + 4c + {2, 3} (a2 / a3).
// q4: they are two groups (16 bytes each); k-step 0 of a group holds the low nibbles (dims
// 4c, 4c + 2 | 4c + 1, 4c + 3), k-step 1 the high ones (+ 16).
__device__ __forceinline__ void k_raw(const u8* krows, int off, int lane, u32 r[4]) {
    const int row = (lane & 7) + ((lane >> 3) & 1) * 8, col = (lane >> 4) * 16;
    ldsm_x4(r, krows + row * CROW + off + col);
}
__device__ __forceinline__ void q8_k_fragments(const u32 r[4], u32 a[2][4]) {
#pragma unroll
    for (int s = 0; s < 2; s++) {
        q8_pairs(r[2 * s], a[s][0], a[s][2]);
        q8_pairs(r[2 * s + 1], a[s][1], a[s][3]);
    }
}
__device__ __forceinline__ void q4_k_fragments(u32 rg, u32 rg8, u32 a[2][4]) {
    const u32 sg = rg >> 8, sg8 = rg8 >> 8;
    a[0][0] = q4_lo_pair(rg);
    a[0][1] = q4_lo_pair(rg8);
    a[0][2] = q4_lo_pair(sg);
    a[0][3] = q4_lo_pair(sg8);
    a[1][0] = q4_hi_pair(rg);
    a[1][1] = q4_hi_pair(rg8);
    a[1][2] = q4_hi_pair(sg);
    a[1][3] = q4_hi_pair(sg8);
}

// A fragments of V^T for the two m-tiles of group grp (dims 32·grp …): tokens 2c, 2c + 1 (a0,
// a1) and 2c + 8, 2c + 9 (a2, a3) of the stage's V rows; rows g / g + 8 of the m-tiles are the
// dims pv_dim gives.
__device__ __forceinline__ void pv_fragments(const u8* vrows, int grp, int lane, u32 a[2][4]) {
    const int g = lane >> 2, c = lane & 3;
    const u8* base = vrows + 2 * c * CROW;
    if constexpr (Q4) {
        // One word per token holds bytes 2g, 2g + 1 of the group (dims 2g, 2g + 1 low nibbles,
        // + 16 high); PRMT picks that half of two tokens' words: [A_j, A_j+1, B_j, B_j+1].
        const int off = grp * 16 + 4 * (g >> 1);
        const u32 sel = (g & 1) ? 0x7632u : 0x5410u;
        const u32 wa = *(const u32*)(base + off), wb = *(const u32*)(base + CROW + off);
        const u32 wc = *(const u32*)(base + 8 * CROW + off), wd = *(const u32*)(base + 9 * CROW + off);
        const u32 ab = __byte_perm(wa, wb, sel), cd = __byte_perm(wc, wd, sel);
        const u32 ab8 = ab >> 8, cd8 = cd >> 8;
        // m-tile 0: rows g, g + 8 = dims 2g, 2g + 1; m-tile 1: dims 16 + 2g, 17 + 2g.
        a[0][0] = q4_lo_pair(ab);
        a[0][1] = q4_lo_pair(ab8);
        a[0][2] = q4_lo_pair(cd);
        a[0][3] = q4_lo_pair(cd8);
        a[1][0] = q4_hi_pair(ab);
        a[1][1] = q4_hi_pair(ab8);
        a[1][2] = q4_hi_pair(cd);
        a[1][3] = q4_hi_pair(cd8);
    } else {
        // One word per token: dims 4g .. 4g + 3 of the group; PRMT interleaves two tokens.
        const int off = grp * 32 + 4 * g;
        const u32 wa = *(const u32*)(base + off), wb = *(const u32*)(base + CROW + off);
        const u32 wc = *(const u32*)(base + 8 * CROW + off), wd = *(const u32*)(base + 9 * CROW + off);
        u32 ab0, ab1, ab2, ab3, cd0, cd1, cd2, cd3;
        q8_pairs(__byte_perm(wa, wb, 0x5140), ab0, ab1); // dims 4g, 4g + 1 of tokens (A, B)
        q8_pairs(__byte_perm(wa, wb, 0x7362), ab2, ab3); // dims 4g + 2, 4g + 3
        q8_pairs(__byte_perm(wc, wd, 0x5140), cd0, cd1);
        q8_pairs(__byte_perm(wc, wd, 0x7362), cd2, cd3);
        // m-tile 0: rows g, g + 8 = dims 4g, 4g + 1; m-tile 1: dims 4g + 2, 4g + 3.
        a[0][0] = ab0; a[0][1] = ab1; a[0][2] = cd0; a[0][3] = cd1;
        a[1][0] = ab2; a[1][1] = ab3; a[1][2] = cd2; a[1][3] = cd3;
    }
}

// Dim of output row `half` (0: row g, 1: row g + 8; g = lane / 4) of PV m-tile mt.
__device__ __forceinline__ int pv_dim(int mt, int half, int g) {
    if constexpr (!QUANT) {
        return mt * 16 + g + 8 * half;
    } else if constexpr (Q4) {
        return (mt >> 1) * 32 + (mt & 1) * 16 + 2 * g + half;
    } else {
        return (mt >> 1) * 32 + 4 * g + 2 * (mt & 1) + half;
    }
}

// V in registers (VREG): lane (g = lane / 4, c = lane % 4) holds, of the tile's tokens 2c, 2c + 1,
// 2c + 8, 2c + 9 (b[t·VC + j], t = 0 … 3), the 16-byte chunks g + 8j (dims 64j + 8g … + 7),
// j < VC; zeros for a token past the context (sh = ~0). sh: (slot, head) index of token lane & 15.
__device__ __forceinline__ void v_load(const u8* __restrict__ vc, u64 sh, int lane, uint4 b[4 * VC]) {
#pragma unroll
    for (int t = 0; t < 4; t++) {
        const u64 s = __shfl_sync(0xffffffffu, sh, 2 * (lane & 3) + (t & 1) + 8 * (t >> 1));
#pragma unroll
        for (int j = 0; j < VC; j++)
            b[t * VC + j] = s != ~0ull ? __ldcg((const uint4*)(vc + s * CB) + (lane >> 2) + 8 * j) : make_uint4(0, 0, 0, 0);
    }
}

__device__ __forceinline__ u32 word_of(const uint4& v, int w) {
    return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
}

// A fragments of V^T for m-tile mt from the registers v_load filled: rows g / g + 8 are the two
// dims of word mt % 4 of chunk mt / 4 (PRMT pairs the tokens 2c, 2c + 1 and 2c + 8, 2c + 9).
__device__ __forceinline__ void v_fragments(const uint4 b[4 * VC], int mt, u32 a[4]) {
    const int j = mt >> 2, w = mt & 3;
    const u32 x0 = word_of(b[j], w), x1 = word_of(b[VC + j], w);
    const u32 x2 = word_of(b[2 * VC + j], w), x3 = word_of(b[3 * VC + j], w);
    a[0] = __byte_perm(x0, x1, 0x5410);
    a[1] = __byte_perm(x0, x1, 0x7632);
    a[2] = __byte_perm(x2, x3, 0x5410);
    a[3] = __byte_perm(x2, x3, 0x7632);
}

// pv_dim for the fragments of v_fragments.
__device__ __forceinline__ int v_dim(int mt, int half, int g) {
    return 64 * (mt >> 2) + 8 * g + 2 * (mt & 3) + half;
}

// One tile of one warp (the stage st holds its 16 K and 16 V rows; tokens t0 … t0 + 15, those
// at or past end masked): S^T = K·Q^T against the query fragments bq, the online-softmax update
// of (m, l), and O^T += V^T·P^T. The stream-K kernel's tile step: the same code as the loop
// body of decode_tc_body, which keeps its own inline copy (see the note there).
template <bool PACK, bool QX>
__device__ __forceinline__ void attend_tile(const u8* st, u32 t0, u32 end, int lane,
                                            const u32 (&bq)[PACK ? 1 : NT][KSTEPS][PACK ? PACKQ : SQ][2],
                                            bool q_exact, float qk_scale_log2,
                                            float (&o)[PACK ? 1 : NT][KSTEPS][4], float (&m)[PACK ? 1 : NT][2],
                                            float (&l)[PACK ? 1 : NT][2]) {
    constexpr int NS = PACK ? 1 : NT;
    constexpr int QP = PACK ? PACKQ : SQ;
    constexpr int PP = PACK ? PACKP : SP;
    const int quad = lane & 3;
    // ldmatrix row addresses: K (A, row-major [token][dim]) and V (A = V^T, via .trans).
    const int k_row = (lane & 7) + ((lane >> 3) & 1) * 8, k_col = (lane >> 4) * 8;
    const int v_row = (lane & 7) + (lane >> 4) * 8, v_col = ((lane >> 3) & 1) * 8;
    const int r0 = lane >> 2; // this thread's S^T rows: tokens r0 and r0 + 8 of the tile

    const u8* krows = st;              // K rows (CROW stride)
    const u8* vrows = st + 16 * CROW;  // V rows
    const u16* ksc = (const u16*)(st + 32 * CROW); // quantized: [16][D/32] K scales
    const u16* vsc = ksc + 16 * (SB / 2);          // quantized: [16][D/32] V scales

    // Quantized: the K and V scales of this thread's two tokens (rows r0, r0 + 8).
    constexpr int NSC = QUANT ? D / 32 : 2;
    u32 ks0[NSC / 2], ks1[NSC / 2], vs0[NSC / 2], vs1[NSC / 2];
    if constexpr (QUANT) {
        load_scales<NSC>(ksc + r0 * (SB / 2), ks0);
        load_scales<NSC>(ksc + (r0 + 8) * (SB / 2), ks1);
        load_scales<NSC>(vsc + r0 * (SB / 2), vs0);
        load_scales<NSC>(vsc + (r0 + 8) * (SB / 2), vs1);
    }

    // QK: every group of KG k-steps accumulates its parts (smallest first) in a fresh
    // fragment, added to s (quantized: times the group's K scale of the row's token).
    float s[NS][4];
#pragma unroll
    for (int nt = 0; nt < NS; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[nt][e] = 0.0f;
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
                if ((grp & 1) == 0) k_raw(krows, grp * 16, lane, kraw);
                q4_k_fragments(kraw[2 * (grp & 1)], kraw[2 * (grp & 1) + 1], a);
            } else {
                k_raw(krows, grp * 32, lane, kraw);
                q8_k_fragments(kraw, a);
            }
        } else {
            ldsm_x4(a[0], krows + k_row * FROW + (g0 * 16 + k_col) * 2);
        }
#pragma unroll
        for (int k = 0; k < KG; k++)
#pragma unroll
            for (int nt = 0; nt < NS; nt++)
#pragma unroll
                for (int j = QP - 1; j >= 0; j--)
                    if (j < qparts) mma(t[nt], a[k], bq[nt][g0 + k][j][0], bq[nt][g0 + k][j][1]);
        float sc0 = 1.0f, sc1 = 1.0f;
        if constexpr (QUANT) {
            sc0 = scale_at(ks0, g0 / 2);
            sc1 = scale_at(ks1, g0 / 2);
        }
#pragma unroll
        for (int nt = 0; nt < NS; nt++) {
            s[nt][0] = fmaf(sc0, t[nt][0], s[nt][0]);
            s[nt][1] = fmaf(sc0, t[nt][1], s[nt][1]);
            s[nt][2] = fmaf(sc1, t[nt][2], s[nt][2]);
            s[nt][3] = fmaf(sc1, t[nt][3], s[nt][3]);
        }
    }
    // PACK: the parts of each head summed over the quad; QX: the scale applied here.
#pragma unroll
    for (int nt = 0; nt < NS; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            if constexpr (PACK) s[nt][e] = sum_parts(s[nt][e]);
            if constexpr (QX) s[nt][e] *= qk_scale_log2;
        }
    // Rows of S^T: tokens t0 + r0 (e = 0, 1) and t0 + r0 + 8 (e = 2, 3).
    const bool ok0 = t0 + r0 < end, ok1 = t0 + r0 + 8 < end;
    float corr[NS][2];
    bool rescale = false;
#pragma unroll
    for (int nt = 0; nt < NS; nt++) {
        if (!ok0) s[nt][0] = s[nt][1] = PK_NEG_INF;
        if (!ok1) s[nt][2] = s[nt][3] = PK_NEG_INF;
#pragma unroll
        for (int j = 0; j < 2; j++) {
            float mx = fmaxf(s[nt][j], s[nt][2 + j]);
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
            const float mn = fmaxf(m[nt][j], mx); // finite: every tile has a visible token
            corr[nt][j] = exp2f(m[nt][j] - mn);
            rescale |= mn != m[nt][j];
            m[nt][j] = mn;
            const float p0 = exp2f(s[nt][j] - mn), p1 = exp2f(s[nt][2 + j] - mn);
            l[nt][j] = l[nt][j] * corr[nt][j] + (p0 + p1);
            s[nt][j] = p0;
            s[nt][2 + j] = p1;
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
    // as B fragments, split into exact parts and transposed by movmatrix.
    // bp[nt][j]: PACK: part set j (columns of the quad's lanes: part PPT·j + 2·quad / GP).
    u32 bp[NS][PP][2];
#pragma unroll
    for (int g0 = 0; g0 < KSTEPS; g0 += KG) {
        float sc0 = 1.0f, sc1 = 1.0f;
        if constexpr (QUANT) {
            sc0 = scale_at(vs0, g0 / 2);
            sc1 = scale_at(vs1, g0 / 2);
        }
        if (QUANT || g0 == 0) { // float pages: one set of B fragments serves every m-tile
#pragma unroll
            for (int nt = 0; nt < NS; nt++) {
                u32 x0[SP], x1[SP];
                split2<SP>(s[nt][0] * sc0, s[nt][1] * sc0, x0);
                split2<SP>(s[nt][2] * sc1, s[nt][3] * sc1, x1);
#pragma unroll
                for (int j = 0; j < PP; j++) {
                    bp[nt][j][0] = movtrans(PACK ? pick<SP>(x0, PPT * j + 2 * quad / GP) : x0[j]);
                    bp[nt][j][1] = movtrans(PACK ? pick<SP>(x1, PPT * j + 2 * quad / GP) : x1[j]);
                }
            }
        }
        u32 a[KG][4];
        if constexpr (QUANT) {
            pv_fragments(vrows, g0 / 2, lane, a);
        } else {
            ldsm_x4_trans(a[0], vrows + v_row * FROW + (g0 * 16 + v_col) * 2);
        }
#pragma unroll
        for (int k = 0; k < KG; k++) {
            const int mt = g0 + k;
#pragma unroll
            for (int nt = 0; nt < NS; nt++) {
                float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int j = PP - 1; j >= 0; j--) mma(t, a[k], bp[nt][j][0], bp[nt][j][1]);
#pragma unroll
                for (int e = 0; e < 4; e++) o[nt][mt][e] += t[e];
            }
        }
    }
}

// The query of one kv head (qw: [PK_G][D]) as this lane's B fragments of QK, bq[nt][kk][j]
// (heads nt·8 + lane/4; PACK: the packed columns), the dims qk_dim gives, scaled by scale·log2 e
// (QX: not scaled) and split into exact parts; leaves `exact`: whether every part past the first
// is zero for this lane. Expanded by tc::query_fragments and, inline as measured, by
// decode_tc_body's build_bq, so the two cannot drift apart.
#define PK_QUERY_FRAGMENTS(qw)                                                                                                            \
    const float qs = QX ? 1.0f : qk_scale_log2;                                                                                           \
    bool exact = true;                                                                                                                    \
    _Pragma("unroll") for (int nt = 0; nt < NS; nt++) {                                                                                   \
        const int n = lane >> 2;                                                                                                          \
        const int g = PACK ? n % GP : nt * 8 + n;                                                                                         \
        _Pragma("unroll") for (int kk = 0; kk < KSTEPS; kk++) {                                                                           \
            _Pragma("unroll") for (int half = 0; half < 2; half++) {                                                                      \
                float2 v = make_float2(0.0f, 0.0f);                                                                                       \
                if (g < PK_G) {                                                                                                           \
                    const float* qh = qw + g * D;                                                                                         \
                    if constexpr (QUANT) {                                                                                                \
                        v.x = qh[qk_dim(kk, half, 0, lane & 3)];                                                                          \
                        v.y = qh[qk_dim(kk, half, 1, lane & 3)];                                                                          \
                    } else {                                                                                                              \
                        v = *(const float2*)(qh + qk_dim(kk, half, 0, lane & 3));                                                         \
                    }                                                                                                                     \
                }                                                                                                                         \
                u32 parts[SQ];                                                                                                            \
                split2<SQ>(v.x * qs, v.y * qs, parts);                                                                                    \
                _Pragma("unroll") for (int j = 1; j < SQ; j++) exact &= (parts[j] & 0x7fff7fffu) == 0;                                    \
                _Pragma("unroll") for (int j = 0; j < QP; j++) bq[nt][kk][j][half] = PACK ? pick<SQ>(parts, PPT * j + n / GP) : parts[j]; \
            }                                                                                                                             \
        }                                                                                                                                 \
    }

// The query of one kv head (qw: [PK_G][D]) as the B fragments of QK for this lane: heads
// nt·8 + lane/4 (PACK: the packed columns), the dims qk_dim gives, scaled by scale·log2 e (QX: not
// scaled) and split into exact parts. Returns (QX) whether every part past the first is zero for
// the whole warp, so that the QK mma of those parts may be skipped.
template <bool PACK, bool QX>
__device__ __forceinline__ bool query_fragments(const float* qw, int lane, float qk_scale_log2,
                                                u32 (&bq)[PACK ? 1 : NT][KSTEPS][PACK ? PACKQ : SQ][2]) {
    constexpr int NS = PACK ? 1 : NT;
    constexpr int QP = PACK ? PACKQ : SQ;
    PK_QUERY_FRAGMENTS(qw)
    return QX && __all_sync(0xffffffffu, exact);
}
} // namespace tc

#endif // PK_HAS_TC
