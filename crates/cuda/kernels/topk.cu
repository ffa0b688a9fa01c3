// topk.cu — each logit row's k best entries (ids u32, values f32), by the rule of pagekv-model's
// `backend::top_k`: larger value first in IEEE order (-0.0 == 0.0), the lower index among equal
// values, NaN never; a row with fewer than k non-NaN values is padded with (0xffffffff, NaN).
//
// Every entry becomes one 64-bit key, larger = better, all keys of a row distinct:
//   key = ord(value) << 32 | (0xffffffff - index)
// with ord a monotone map of the non-NaN floats onto u32 >= 0x007fffff and ord(-0.0) == ord(0.0);
// NaN (and padding) is key 0, never selected. A row's top-k is then the set of its k largest
// keys — no tie cases — found by a radix select over the keys (8 bits a round, most significant
// first, done as soon as the bucket holding the k-th key holds exactly the keys still needed),
// after a first select over the threads' own maxima has dropped the keys that cannot be among
// the k best.
//
// Two launches (the host side is src/topk.rs):
//   pk_topk_partial_{4,8,16}: grid (chunks, rows), block 256; each CTA selects the k best keys of
//     a chunk of 256·ITEMS entries of one row (keys in registers), unordered, zero-padded:
//     part [rows, chunks, k] u64.
//   pk_topk_merge: grid (rows), block 512; selects the k best of a row's chunks·k keys (at most
//     512·16), orders them by rank and writes ids [rows, k] and values [rows, k] — the values read
//     back from the logits by id, so their bits are the row's (-0.0 stays -0.0).

namespace topk {

constexpr u32 NONE = 0xffffffffu;
constexpr u32 MAX_K = 128;
constexpr int PART_THREADS = 256;
constexpr int MERGE_THREADS = 512;
constexpr int MERGE_ITEMS = 16;
constexpr u32 FULL = 0xffffffffu;

__device__ __forceinline__ u64 key_of(float x, u32 i) {
    if (isnan(x)) return 0;
    u32 b = __float_as_uint(x);
    if ((b << 1) == 0) b = 0;  // -0.0 orders as 0.0
    const u32 ord = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((u64)ord << 32) | (u64)(NONE - i);
}

__device__ __forceinline__ u32 index_of(u64 key) { return NONE - (u32)key; }

struct Shared {
    u32 hist[256];  // [256] one radix round's histogram
    u32 digit;      // the round's result: the bucket holding the k-th key,
    u32 need;       //   how many keys of that bucket are still to be taken,
    u32 count;      //   how many keys the bucket holds,
    u32 all;        //   1 when fewer than k keys are valid (all of them are taken)
    u32 taken;      // keys collected into sel
    u64 sel[MAX_K]; // [≤ k] the selected keys, unordered
};

// The smallest key the block selects among the ITEMS keys each thread holds (0 = NaN/padding,
// never selected): the k-th largest key, or a value between it and the next smaller key, or 1
// when at most k keys are valid. Uniform across the block; every thread must call it.
template <int ITEMS>
__device__ u64 threshold(const u64 (&keys)[ITEMS], u32 k, Shared& s) {
    const u32 lane = threadIdx.x & 31;
    u64 prefix = 0, mask = 0;
    u32 need = k;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (u32 i = threadIdx.x; i < 256; i += blockDim.x) s.hist[i] = 0;
        __syncthreads();
#pragma unroll
        for (int j = 0; j < ITEMS; j++) {
            const u64 key = keys[j];
            const bool in = key != 0 && (key & mask) == prefix;
            const u32 act = __ballot_sync(FULL, in);
            if (in) {
                // Lanes with the same digit add once (the first rounds put most keys in a few bins).
                const u32 bin = (u32)(key >> shift) & 255u;
                const u32 peers = __match_any_sync(act, bin);
                if ((int)lane == __ffs(peers) - 1) atomicAdd(&s.hist[bin], (u32)__popc(peers));
            }
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            // Lane l holds bins 255-8l down to 248-8l; counts accumulate from the top bin down.
            u32 c[8], sum = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                c[i] = s.hist[255 - 8 * lane - i];
                sum += c[i];
            }
            u32 incl = sum;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const u32 t = __shfl_up_sync(FULL, incl, o);
                if ((int)lane >= o) incl += t;
            }
            const u32 excl = incl - sum;
            if (excl < need && need <= incl) {
                // The first bin (from the top) where the running count reaches `need`; unrolled
                // so c stays in registers.
                u32 acc = excl, found = 8, count = 0, rest = 0;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    if (found == 8 && acc + c[i] >= need) {
                        found = i;
                        count = c[i];
                        rest = need - acc;
                    }
                    if (found == 8) acc += c[i];
                }
                s.digit = 255 - 8 * lane - found;
                s.need = rest;
                s.count = count;
                s.all = 0;
            }
            // Only in the first round: fewer valid keys than k.
            if (lane == 31 && incl < need) s.all = 1;
        }
        __syncthreads();
        // (Read before anyone can reach the next round's writes: two barriers lie between.)
        const u32 all = s.all, digit = s.digit, count = s.count;
        if (all) return 1;
        need = s.need;
        prefix |= (u64)digit << shift;
        mask |= 0xffull << shift;
        // Every key of the bucket is taken: the threshold is its smallest possible key. (The
        // last round always ends here: keys are distinct, so its bucket holds one key.)
        if (count == need) break;
    }
    return prefix;
}

// The threshold of the block's k best keys (as `threshold`); with `prefilter`, after dropping
// (zeroing) every key below a bound: the k-th largest of the threads' own maxima. k threads hold
// a key at least that large, so the k best keys all stay; for small k few keys remain and the
// rounds over all keys (most lanes idle) cost little — for k near 64 the bound is loose and the
// extra select costs more than it saves. (Needs k ≤ blockDim.x.)
template <int ITEMS>
__device__ u64 select_threshold(u64 (&keys)[ITEMS], u32 k, u32 prefilter, Shared& s) {
    if (!prefilter) return threshold<ITEMS>(keys, k, s);
    u64 own[1] = {0};
#pragma unroll
    for (int j = 0; j < ITEMS; j++) own[0] = keys[j] > own[0] ? keys[j] : own[0];
    const u64 bound = threshold<1>(own, k, s);
#pragma unroll
    for (int j = 0; j < ITEMS; j++) keys[j] = keys[j] >= bound ? keys[j] : 0;
    return threshold<ITEMS>(keys, k, s);
}

// Collects the keys >= t into s.sel (unordered); returns how many (min(k, valid keys)).
template <int ITEMS>
__device__ u32 collect(const u64 (&keys)[ITEMS], u64 t, Shared& s) {
#pragma unroll
    for (int j = 0; j < ITEMS; j++) {
        if (keys[j] != 0 && keys[j] >= t) {
            const u32 p = atomicAdd(&s.taken, 1u);
            if (p < MAX_K) s.sel[p] = keys[j];
        }
    }
    __syncthreads();
    return min(s.taken, MAX_K);
}

template <int ITEMS>
__device__ void partial(u64* __restrict__ part, const float* __restrict__ logits, u32 vocab, u32 k, u32 vec4,
                        u32 prefilter) {
    __shared__ Shared s;
    const u32 chunk = blockIdx.x, row = blockIdx.y;
    const float* x = logits + (u64)row * vocab;
    const u32 base = chunk * (u32)(PART_THREADS * ITEMS);
    u64 keys[ITEMS];
    if (vec4) {
        // Rows of a multiple of 4 floats on a 16-byte boundary: 16-byte loads (i < vocab implies
        // i + 3 < vocab).
#pragma unroll
        for (int j = 0; j < ITEMS / 4; j++) {
            const u32 i = base + (u32)(j * PART_THREADS + threadIdx.x) * 4;
            if (i < vocab) {
                const float4 v = *reinterpret_cast<const float4*>(x + i);
                keys[4 * j] = key_of(v.x, i);
                keys[4 * j + 1] = key_of(v.y, i + 1);
                keys[4 * j + 2] = key_of(v.z, i + 2);
                keys[4 * j + 3] = key_of(v.w, i + 3);
            } else {
                keys[4 * j] = keys[4 * j + 1] = keys[4 * j + 2] = keys[4 * j + 3] = 0;
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < ITEMS; j++) {
            const u32 i = base + (u32)(j * PART_THREADS) + threadIdx.x;
            keys[j] = i < vocab ? key_of(x[i], i) : 0;
        }
    }
    if (threadIdx.x == 0) s.taken = 0;
    const u64 t = select_threshold(keys, k, prefilter, s);
    const u32 n = collect(keys, t, s);
    u64* out = part + ((u64)row * gridDim.x + chunk) * k;
    for (u32 i = threadIdx.x; i < k; i += blockDim.x) out[i] = i < n ? s.sel[i] : 0;
}

}  // namespace topk

// part [rows, chunks, k] u64 ← the k best keys of each chunk of 256·ITEMS entries of each row of
// logits [rows, vocab] f32 (unordered, 0-padded). Grid (chunks, rows), block 256. vec4: rows are
// 16-byte aligned multiples of 4 floats; prefilter: see select_threshold.
extern "C" __global__ void __launch_bounds__(topk::PART_THREADS)
    pk_topk_partial_4(u64* part, const float* logits, u32 vocab, u32 k, u32 vec4, u32 prefilter) {
    topk::partial<4>(part, logits, vocab, k, vec4, prefilter);
}
extern "C" __global__ void __launch_bounds__(topk::PART_THREADS)
    pk_topk_partial_8(u64* part, const float* logits, u32 vocab, u32 k, u32 vec4, u32 prefilter) {
    topk::partial<8>(part, logits, vocab, k, vec4, prefilter);
}
extern "C" __global__ void __launch_bounds__(topk::PART_THREADS)
    pk_topk_partial_16(u64* part, const float* logits, u32 vocab, u32 k, u32 vec4, u32 prefilter) {
    topk::partial<16>(part, logits, vocab, k, vec4, prefilter);
}

// ids [rows, k], values [rows, k] ← the k best of each row's chunks·k keys of part (chunks·k ≤
// 512·16), best first; values read from logits [rows, vocab]; (0xffffffff, NaN) past a row's
// valid entries. Grid (rows), block 512.
extern "C" __global__ void __launch_bounds__(topk::MERGE_THREADS)
    pk_topk_merge(u32* __restrict__ ids, float* __restrict__ values, const u64* __restrict__ part,
                  const float* __restrict__ logits, u32 vocab, u32 chunks, u32 k, u32 prefilter) {
    using namespace topk;
    __shared__ Shared s;
    const u32 row = blockIdx.x, n = chunks * k;
    const u64* in = part + (u64)row * n;
    u64 keys[MERGE_ITEMS];
#pragma unroll
    for (int j = 0; j < MERGE_ITEMS; j++) {
        const u32 i = (u32)(j * MERGE_THREADS) + threadIdx.x;
        keys[j] = i < n ? in[i] : 0;
    }
    if (threadIdx.x == 0) s.taken = 0;
    const u64 t = select_threshold(keys, k, prefilter, s);
    const u32 cnt = collect(keys, t, s);
    u32* out_i = ids + (u64)row * k;
    float* out_v = values + (u64)row * k;
    for (u32 i = threadIdx.x; i < k; i += blockDim.x) {
        if (i < cnt) {
            // Rank = keys above this one (distinct keys: a permutation of 0..cnt).
            const u64 key = s.sel[i];
            u32 r = 0;
            for (u32 j = 0; j < cnt; j++) r += s.sel[j] > key;
            const u32 id = index_of(key);
            out_i[r] = id;
            out_v[r] = logits[(u64)row * vocab + id];
        } else {
            out_i[i] = NONE;
            out_v[i] = __int_as_float(0x7fc00000);
        }
    }
}
