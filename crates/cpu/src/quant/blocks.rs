//! GGML/GGUF quantized block layouts, bit-exact with ggml (`ggml-common.h`).
//!
//! Each block type is `#[repr(C)]`, `Pod`, and has a compile-time size assert. Values are
//! little-endian on disk; these types are only ever read from byte slices with
//! `bytemuck::pod_read_unaligned` or through raw pointers with unaligned loads, so tensor data
//! needs no particular alignment.
//!
//! | type   | elements | bytes | fields                                                    |
//! | ------ | -------- | ----- | --------------------------------------------------------- |
//! | Q4_0   | 32       | 18    | `d: f16, qs: [u8; 16]` (two 4-bit codes per byte)         |
//! | Q4_1   | 32       | 20    | `d: f16, m: f16, qs: [u8; 16]`                            |
//! | Q5_0   | 32       | 22    | `d: f16, qh: [u8; 4], qs: [u8; 16]` (fifth bits in `qh`)  |
//! | Q5_1   | 32       | 24    | `d: f16, m: f16, qh: [u8; 4], qs: [u8; 16]`               |
//! | IQ4_NL | 32       | 18    | `d: f16, qs: [u8; 16]` (codes index [`KVALUES_IQ4NL`])    |
//! | Q8_0   | 32       | 34    | `d: f16, qs: [i8; 32]`                                    |
//! | Q8_1   | 32       | 36    | `d: f16, s: f16, qs: [i8; 32]` (activations of Q4_1)       |
//! | Q2_K   | 256      | 84    | `scales: [u8; 16], qs: [u8; 64], d, dmin: f16`            |
//! | Q3_K   | 256      | 110   | `hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: f16` |
//! | IQ4_XS | 256      | 136   | `d: f16, scales_h: u16, scales_l: [u8; 4], qs: [u8; 128]` |
//! | Q4_K   | 256      | 144   | `d, dmin: f16, scales: [u8; 12], qs: [u8; 128]`           |
//! | Q5_K   | 256      | 176   | `d, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]` |
//! | Q6_K   | 256      | 210   | `ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16`   |
//! | Q8_K   | 256      | 292   | `d: f32, qs: [i8; 256], bsums: [i16; 16]` (activations)   |

use bytemuck::{Pod, Zeroable};
use half::f16;
use std::mem::size_of;

/// Elements per block of the "legacy" formats (Q4_0, Q4_1, Q8_0).
pub const QK: usize = 32;
/// Elements per super-block of the K-quants (Q4_K, Q5_K, Q6_K, Q8_K).
pub const QK_K: usize = 256;
/// Bytes of packed 6-bit scales and mins in Q4_K / Q5_K.
pub const K_SCALE_SIZE: usize = 12;

/// `x[j] = d * ((qs[j] & 0xF) - 8)`, `x[j + 16] = d * ((qs[j] >> 4) - 8)` for `j < 16`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ4_0>() == 18);

/// `x[j] = d * (qs[j] & 0xF) + m`, `x[j + 16] = d * (qs[j] >> 4) + m` for `j < 16`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ4_1>() == 20);

/// `x[j] = d * (q_j - 16)` with the 5-bit `q_j = lo(qs[j]) | bit_j(qh) << 4` and
/// `q_{j+16} = hi(qs[j]) | bit_{j+16}(qh) << 4` for `j < 16` (`qh` a little-endian u32).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ5_0>() == 22);

/// As [`BlockQ5_0`] with an offset instead of the `-16`: `x[j] = d * q_j + m`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5_1 {
    pub d: f16,
    pub m: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ5_1>() == 24);

/// The 16 levels of the non-linear 4-bit formats (IQ4_NL, IQ4_XS), ggml's `kvalues_iq4nl`.
pub const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// `x[j] = d * KVALUES_IQ4NL[lo(qs[j])]`, `x[j + 16] = d * KVALUES_IQ4NL[hi(qs[j])]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIQ4NL {
    pub d: f16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockIQ4NL>() == 18);

/// `x[j] = d * qs[j]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK],
}
const _: () = assert!(size_of::<BlockQ8_0>() == 34);

/// Activation block for the Q4_1 dot product: `x = d * qs`, and `s = d * sum(qs)` (computed
/// with the unrounded `d`, then stored as f16) so the weight minimum `m` costs one multiply.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8_1 {
    pub d: f16,
    pub s: f16,
    pub qs: [i8; QK],
}
const _: () = assert!(size_of::<BlockQ8_1>() == 36);

/// 16 groups of 16 with a 4-bit scale (low nibble of `scales[g]`) and 4-bit min (high nibble):
/// `x = d * sc_g * q - dmin * mn_g`, `q` 2 bits. Value `128 n + 32 j + l` (`n < 2`, `j < 4`,
/// `l < 32`) is `(qs[32 n + l] >> 2 j) & 3`, in group `8 n + 2 j + l / 16`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: f16,
    pub dmin: f16,
}
const _: () = assert!(size_of::<BlockQ2K>() == 84);

/// 16 groups of 16 with a signed 6-bit scale ([`scales_q3k`]): `x = d * sc_g * q`, `q` in
/// -4..3. Value `128 n + 32 j + l` is `((qs[32 n + l] >> 2 j) & 3) - 4` plus 4 when bit
/// `4 n + j` of `hmask[l]` is set, in group `8 n + 2 j + l / 16`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; K_SCALE_SIZE],
    pub d: f16,
}
const _: () = assert!(size_of::<BlockQ3K>() == 110);

/// 8 sub-blocks of 32 with a signed 6-bit scale ([`BlockIQ4XS::scale`]):
/// `x[32 b + j] = d * sc_b * KVALUES_IQ4NL[lo(qs[16 b + j])]`, `x[32 b + j + 16]` the same
/// with the high nibble, for `j < 16`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIQ4XS {
    pub d: f16,
    pub scales_h: u16,
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockIQ4XS>() == 136);

impl BlockIQ4XS {
    /// The scale of sub-block `b` (0..8), `-32..31`: 4 low bits from a nibble of
    /// `scales_l[b / 2]`, 2 high bits from `scales_h`.
    #[inline]
    pub fn scale(&self, b: usize) -> i32 {
        iq4xs_scale(self.scales_h, &self.scales_l, b)
    }
}

/// [`BlockIQ4XS::scale`] from the raw fields.
#[inline]
pub fn iq4xs_scale(scales_h: u16, scales_l: &[u8; 4], b: usize) -> i32 {
    debug_assert!(b < 8);
    let ls = ((scales_l[b / 2] >> (4 * (b % 2))) & 0xF) as i32 | ((((scales_h >> (2 * b)) & 3) as i32) << 4);
    ls - 32
}

/// The 16 signed scales (`-32..31`) of a Q3_K block: scale `g` keeps its 4 low bits in a nibble
/// of `p[g % 8]` (low nibble for `g < 8`) and its 2 high bits in bits `2 (g / 4)..` of
/// `p[8 + g % 4]`.
#[inline]
pub fn scales_q3k(p: &[u8; K_SCALE_SIZE]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (g, o) in out.iter_mut().enumerate() {
        let low = if g < 8 { p[g] & 0xF } else { p[g - 8] >> 4 };
        let high = (p[8 + g % 4] >> (2 * (g / 4))) & 3;
        *o = ((low | (high << 4)) as i32 - 32) as i8;
    }
    out
}

/// 8 sub-blocks of 32 with 6-bit scale `sc[j]` and min `mn[j]` (see [`scale_min_k4`]):
/// `x[32 j + l] = d * sc[j] * q - dmin * mn[j]`, where the 4-bit `q` of sub-block `2c` is the
/// low nibble of `qs[32 c + l]` and of sub-block `2c + 1` the high nibble.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ4K>() == 144);

/// As [`BlockQ4K`] with a fifth bit: for sub-block `j = 2c + h`, `q = nibble + 16 * bit`,
/// where bit = `(qh[l] >> j) & 1`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ5K>() == 176);

/// 16 sub-blocks of 16 with an 8-bit signed scale each: `x = d * scales[i / 16] * (q - 32)`,
/// `q` 6 bits: 4 low bits from `ql`, 2 high bits from `qh` (layout in `reference.rs`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: f16,
}
const _: () = assert!(size_of::<BlockQ6K>() == 210);

/// Activation super-block for the K-quant dot products: `x = d * qs`,
/// `bsums[g] = sum(qs[16 g .. 16 g + 16])`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}
const _: () = assert!(size_of::<BlockQ8K>() == 292);

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K/Q5_K block (ggml
/// `get_scale_min_k4`): sub-blocks 0..4 keep their 6 bits in the low bits of `q[j]` and
/// `q[j + 4]`; sub-blocks 4..8 keep 4 low bits in a nibble of `q[j + 4]` and their 2 high bits
/// in the top bits of `q[j - 4]` (scale) and `q[j]` (min).
#[inline]
pub fn scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    debug_assert!(j < 8);
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}
