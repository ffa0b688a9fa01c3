// qmma.cu — products of many token rows with a GGUF-quantized weight on the tensor cores
// (QuantOps::mma in src/qmatrix.rs): y [n, ldy] (columns 0..rows) (+)= x [n, cols] · Wᵀ, x bf16,
// W of type QT in the device layout of qmatrix.cu, f32 accumulation. The weight never exists
// as a bf16 matrix in global memory: each CTA copies the raw blocks of its tile into shared
// memory, dequantizes them there into bf16 — the same values as pk_qdequant_T (a · code + b in
// f32, rounded to bf16) — and multiplies with mma.sync m16n8k16.
//
// Tile: QM_BM weight rows × QM_BN token rows per CTA, the reduction in stages of BK values (one
// super-block of a K-quant, four blocks otherwise); grid (row tiles, token tiles, splits). A
// split takes a contiguous range of stages; with one split the CTA writes y, otherwise its
// partial sums go to ws [splits, n, rows] and pk_qmma_reduce adds them in split order (the
// result does not depend on timing).
// Per stage: cp.async of the raw blocks, their header halves and the x tile into one of two
// stage buffers (the next stage's copy runs during this stage's work); the 8 warps dequantize
// the raw tile into the bf16 tile (a thread a unit of 32 values, rows fastest so that the
// stores of 8 lanes fall in distinct banks); then each warp multiplies its 32 rows × 32 tokens:
// per 16 values, two ldmatrix.x4 of W (A, row-major) and two of x (B, "col": x's rows are B's
// columns), eight mma. C fragments: rows lane / 4 (+ 8), tokens 2 · (lane % 4) (+ 1).
#define QM_BM 128
#define QM_BN 64
#define QM_THREADS 256

template <int QT>
struct QmmaShape {
    typedef QTraits<QT> T;
    enum {
        BK = T::VALUES == 256 ? 256 : 128,
        SB = BK / T::VALUES,  // blocks of a row in a stage
        RAW = SB * T::DATA,   // their data bytes (a multiple of 16: stage offsets stay aligned)
        // Staged row stride: an odd number of 16-byte chunks, so 8 consecutive rows read at the
        // same offset hit distinct banks.
        RAWS = (RAW / 16) % 2 == 1 ? RAW : RAW + 16,
        // Header bytes of a row in a stage: Q6_K's one half is copied as the aligned 4-byte pair
        // holding it (cp.async copies 4, 8 or 16 bytes).
        HB = QT == QT_Q6_K ? 4 : SB * T::HDR * 2,
        ROW = 2 * BK + 16,  // bf16 row stride of the W and x tiles: ldmatrix rows in distinct banks
        OFF_HDR = QM_BM * RAWS,
        OFF_X = OFF_HDR + QM_BM * HB,
        STAGE = OFF_X + QM_BN * ROW,
        SMEM = 2 * STAGE + QM_BM * ROW,  // two stages and the bf16 W tile
    };
    static_assert(RAW % 16 == 0 && OFF_X % 16 == 0 && STAGE % 16 == 0, "16-byte aligned stage parts");
};

// cp.async of 16 bytes, zero-filling the destination when `bytes` is 0.
__device__ __forceinline__ void qm_cp16(void* dst, const void* src, u32 bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes));
}

__device__ __forceinline__ void qm_ldmatrix_x4(u32 (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void qm_mma(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Copies stage kb (values kb·BK ..) of rows r0.. and tokens t0.. into the stage buffer st. Rows
// past the matrix copy its last row (their sums are never stored); tokens past n are zeros.
template <int QT>
__device__ __forceinline__ void qmma_load(u8* st, const u8* __restrict__ data, const u16* __restrict__ hdr,
                                          const u16* __restrict__ x, u32 ldx, u32 r0, u32 t0, u32 rows, u32 n,
                                          u32 bpr, u32 kb) {
    typedef QTraits<QT> T;
    typedef QmmaShape<QT> S;
    constexpr int CPR = S::RAW / 16;
    for (int i = threadIdx.x; i < QM_BM * CPR; i += QM_THREADS) {
        const u32 rl = i / CPR, c = i % CPR, r = min(r0 + rl, rows - 1);
        cp_async<16>(st + rl * S::RAWS + 16 * c, data + ((u64)r * bpr + (u64)kb * S::SB) * T::DATA + 16 * c);
    }
    if constexpr (S::HB > 0) {
        for (int rl = threadIdx.x; rl < QM_BM; rl += QM_THREADS) {
            const u32 r = min(r0 + rl, rows - 1);
            const u64 blk = (u64)r * bpr + (u64)kb * S::SB;
            if constexpr (QT == QT_Q6_K) {
                cp_async<4>(st + S::OFF_HDR + 4 * rl, hdr + (blk & ~1ull));
            } else {
                cp_async<S::HB>(st + S::OFF_HDR + S::HB * rl, hdr + blk * T::HDR);
            }
        }
    }
    constexpr int CPX = S::BK / 8;
    for (int i = threadIdx.x; i < QM_BN * CPX; i += QM_THREADS) {
        const u32 t = i / CPX, c = i % CPX, ok = t0 + t < n;
        const u16* src = x + (u64)(ok ? t0 + t : 0) * ldx + (u64)kb * S::BK + 8 * c;
        qm_cp16(st + S::OFF_X + t * S::ROW + 16 * c, src, ok ? 16u : 0u);
    }
}

// The raw tile of stage buffer st (stage kb of rows r0..) into the bf16 tile wt.
template <int QT>
__device__ __forceinline__ void qmma_dequant(u8* wt, const u8* st, u32 r0, u32 rows, u32 bpr, u32 kb) {
    typedef QTraits<QT> T;
    typedef QmmaShape<QT> S;
    constexpr int UPB = T::VALUES / 32, UNITS = S::BK / 32;
    for (int i = threadIdx.x; i < QM_BM * UNITS; i += QM_THREADS) {
        const u32 rl = i % QM_BM, u = i / QM_BM, ub = u / UPB;
        const u16* h;
        if constexpr (QT == QT_Q6_K) {
            const u32 r = min(r0 + rl, rows - 1);
            h = (const u16*)(st + S::OFF_HDR + 4 * rl) + (((u64)r * bpr + kb) & 1);
        } else {
            h = (const u16*)(st + S::OFF_HDR + S::HB * rl) + ub * T::HDR;
        }
        QUnit q;
        q_unit_at<QT, false>(q, st + rl * S::RAWS + ub * T::DATA, h, u % UPB);
        uint4* dst = (uint4*)(wt + rl * S::ROW + 64 * u);
#pragma unroll
        for (int k = 0; k < 4; k++) dst[k] = unit_bf16x8(q, k);
    }
}

template <int QT>
__device__ void qmma(float* __restrict__ y, u32 ldy, const u8* __restrict__ data, const u16* __restrict__ hdr,
                     const u16* __restrict__ x, u32 ldx, u32 rows, u32 cols, u32 n, u32 acc, float* __restrict__ ws,
                     u32 per_split) {
    typedef QmmaShape<QT> S;
    extern __shared__ __align__(16) u8 qm_smem[];
    u8* wt = qm_smem + 2 * S::STAGE;
    const u32 r0 = blockIdx.x * QM_BM, t0 = blockIdx.y * QM_BN;
    const u32 bpr = cols / QTraits<QT>::VALUES, stages = cols / S::BK;
    const u32 kb0 = blockIdx.z * per_split, kb1 = min(stages, kb0 + per_split);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wm = 32 * (warp & 3), wn = 32 * (warp >> 2);
    float c[2][4][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) c[m][j][e] = 0.0f;

    qmma_load<QT>(qm_smem, data, hdr, x, ldx, r0, t0, rows, n, bpr, kb0);
    cp_async_commit();
    for (u32 kb = kb0; kb < kb1; kb++) {
        u8* st = qm_smem + ((kb - kb0) & 1) * S::STAGE;
        if (kb + 1 < kb1) {
            qmma_load<QT>(qm_smem + ((kb + 1 - kb0) & 1) * S::STAGE, data, hdr, x, ldx, r0, t0, rows, n, bpr, kb + 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        qmma_dequant<QT>(wt, st, r0, rows, bpr, kb);
        __syncthreads();
        const u8* xt = st + S::OFF_X;
        // ldmatrix lane addresses: A rows wm + lane % 16 at +8 values for lanes 16..31; B tokens
        // wn + 8 · (lane / 16) + lane % 8 at +8 values for lanes 8..15 and 24..31.
        const u8* pa = wt + (wm + (lane & 15)) * S::ROW + 16 * (lane >> 4);
        const u8* pb = xt + (wn + 8 * (lane >> 4) + (lane & 7)) * S::ROW + 16 * ((lane >> 3) & 1);
#pragma unroll 4
        for (int ks = 0; ks < S::BK / 16; ks++) {
            u32 a[2][4], b[2][4];
            qm_ldmatrix_x4(a[0], pa + 32 * ks);
            qm_ldmatrix_x4(a[1], pa + 16 * S::ROW + 32 * ks);
            qm_ldmatrix_x4(b[0], pb + 32 * ks);
            qm_ldmatrix_x4(b[1], pb + 16 * S::ROW + 32 * ks);
#pragma unroll
            for (int m = 0; m < 2; m++)
#pragma unroll
                for (int j = 0; j < 4; j++) qm_mma(c[m][j], a[m], b[j >> 1][2 * (j & 1)], b[j >> 1][2 * (j & 1) + 1]);
        }
        __syncthreads();
    }

    // Row wm + 16·m + lane/4 (+8), token wn + 8·j + 2·(lane%4) (+1).
    const bool split = gridDim.z > 1;
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const u32 r = r0 + wm + 16 * m + (lane >> 2) + 8 * (e >> 1);
                const u32 t = t0 + wn + 8 * j + 2 * (lane & 3) + (e & 1);
                if (r >= rows || t >= n) continue;
                if (split) {
                    ws[((u64)blockIdx.z * n + t) * rows + r] = c[m][j][e];
                } else {
                    float* o = y + (u64)t * ldy + r;
                    *o = acc ? __fadd_rn(*o, c[m][j][e]) : c[m][j][e];
                }
            }
}

// y [n, ldy] (columns 0..rows) (+)= Σ over splits s of ws [s, n, rows], s in order.
extern "C" __global__ void pk_qmma_reduce(float* y, u32 ldy, const float* ws, u32 rows, u32 n, u32 splits, u32 acc) {
    const u64 total = (u64)n * rows;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        float s = ws[i];
        for (u32 k = 1; k < splits; k++) s = __fadd_rn(s, ws[(u64)k * total + i]);
        float* o = y + (i / rows) * ldy + i % rows;
        *o = acc ? __fadd_rn(*o, s) : s;
    }
}

#define PK_QMMA(QT, NAME)                                                                                      \
    extern "C" __global__ void __launch_bounds__(QM_THREADS)                                                   \
        pk_qmma_##NAME(float* y, u32 ldy, const u8* data, const u16* hdr, const u16* x, u32 ldx, u32 rows,     \
                       u32 cols, u32 n, u32 acc, float* ws, u32 per_split) {                                   \
        qmma<QT>(y, ldy, data, hdr, x, ldx, rows, cols, n, acc, ws, per_split);                                \
    }
PK_QMMA(QT_Q4_0, q4_0) PK_QMMA(QT_Q4_1, q4_1) PK_QMMA(QT_Q5_0, q5_0) PK_QMMA(QT_Q5_1, q5_1)
PK_QMMA(QT_Q8_0, q8_0) PK_QMMA(QT_Q4_K, q4_k) PK_QMMA(QT_Q5_K, q5_k) PK_QMMA(QT_Q6_K, q6_k)
