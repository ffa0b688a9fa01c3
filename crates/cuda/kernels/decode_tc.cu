// decode_tc.cu — paged decode attention on the tensor cores (mma.sync m16n8k16), for pages
// stored as f16 or bf16 (head_dim 32, 64, 128 or 256) or as q8 / q4 / rotated q4 (head_dim 64,
// 128 or 256), up to 16 query heads per kv head. Other shapes and formats use decode.cu.
//
// Same contract as pk_decode in decode.cu (arguments, visibility, partial outputs for pk_merge),
// plus two trailing arguments: num_kv_heads, and a counter array with which the partitioned
// route merges its partitions inside this launch (no pk_merge). The host picks this kernel when
// the format allows it (compile::tc_supported).
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
// mirror is compile::decode_tc_smem_bytes).
constexpr int TC_SMEM_BYTES = NW * WARP_BYTES > 4 * MERGE_FLOATS ? NW * WARP_BYTES : 4 * MERGE_FLOATS;
// V rows in registers (PK_TC_VREG: pk_decode_tc_vreg, f16/bf16 pages, head_dim a multiple of 64,
// 2 stages): the stages hold the 16 K rows of a tile only, each lane loads the V chunks its PV
// A fragments need (VC = D / 64 chunks of 16 bytes from each of 4 token rows, see v_load), and
// the query's B fragments live in shared memory after the stages ([NS][KSTEPS][QP][32 lanes] u32
// pairs per warp), so that the registers fit 16 warps per SM. The host mirror is
// compile::tc_vreg_smem_bytes.
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

// (The partitioned kernel keeps its tile loop and query fragments inline, as measured: the q4
// kernel is sensitive to ptxas's scheduling, and the same code through tc::attend_tile /
// tc::query_fragments measured q4 64 × 16384 about 10 % slower (`pagekv bench attention --device cuda --formats q4`, 2026-12-02). The
// stream-K kernel below uses those functions.)
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
// compile::decode_tc_sk_smem_bytes.
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

// The stream-K kernel body (pk_decode_tc_sk below); PACK, QX, EF as for decode_tc_body.
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
// the calls whose grid has more CTAs than the device has SMs to it (compile::tc_vreg_call).
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

#endif // tensor-core decode
