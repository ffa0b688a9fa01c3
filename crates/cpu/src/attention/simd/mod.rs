//! The fast tile kernels ([`SimdOps`]), 8-lane f32 vectors, built twice and chosen at run time:
//! - [`KernelIsa::Avx2`]: AVX2 + FMA + F16C, 16 registers: QK two tokens at a time, PV 16
//!   dimensions per pass.
//! - [`KernelIsa::Avx512`]: the same code compiled for AVX-512F/VL, which gives it 32 vector
//!   registers: QK four tokens at a time, PV 32 dimensions per pass. On Zen 4, 256-bit vectors
//!   with 32 registers measured faster than 512-bit ones (a 512-bit FMA issues once per cycle,
//!   and 512-bit shuffles and broadcasts cost more): QK 34 vs 40 cycles per token for four
//!   rows of head_dim 128, PV 33 vs 42 (`examples/attention_bench.rs`, single thread,
//!   cache-resident f16).
//!
//! Over q8 and q4 keys with head_dim a multiple of 64, on a CPU with AVX-512 VNNI, K·Q runs in
//! integers instead ([`Int8Ops`]: `int8.rs`, the int8-rounded queries against the key codes,
//! 64 values a row per `vpdpbusd`), and the value pass runs in 512-bit vectors (`wide.rs`,
//! 64 dimensions a pass).
//!
//! [`attend_range`] picks the layer's codec pair and runs the shared tile driver
//! ([`super::tile::run`]) with these kernels.

mod codecs;
pub(crate) mod int8;
mod kernels;
mod wide;

use std::marker::PhantomData;

use kvcache::{Codec, LayerView};

use self::codecs::{Bf16Row, F16Row, F32Row, LloydMax8Row, LloydMaxRow, Q4LutRow, Q4Row, Q8Row, RowCodec, SubScaled};
use self::int8::{IntKeys, Q4Keys, Q8Keys};
use self::wide::WideValues;
use super::group::HeadStates;
use super::isa::KernelIsa;
use super::queries::int8_queries;
use super::tile::{self, NextRows, RangeInput, TileOps, TileScratch, TILE};

/// AVX2 + FMA + F16C: QK two tokens at a time, PV one chunk (16 values) per pass.
pub(crate) struct Avx2;

/// AVX-512F/VL (32 registers) with AVX2 + FMA + F16C: QK four tokens at a time, PV two chunks
/// per pass.
pub(crate) struct Avx512;

/// The kernels of instruction set `I` for key codec `K` and value codec `V`.
pub(crate) struct SimdOps<I, K, V> {
    k: K,
    v: V,
    isa: PhantomData<I>,
}

/// Instantiates a kernel for rows 1..=4 with the ISA's blocking inside a function compiled for
/// that ISA.
macro_rules! kernel_fns {
    ($name:ident, $feat:literal, $scores:ident, $accumulate:ident, $tok:literal, $ch:literal) => {
        #[target_feature(enable = $feat)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $scores<K: RowCodec>(
            k: &K,
            rows: usize,
            krows: &[*const u8; TILE],
            kscale: &[f32],
            t0: usize,
            t1: usize,
            q: *const f32,
            d: usize,
            sc: *mut f32,
            next: &NextRows,
        ) {
            // SAFETY: forwarded contract.
            unsafe {
                match rows {
                    1 => kernels::scores::<K, 1, $tok>(k, krows, kscale, t0, t1, q, d, sc, next),
                    2 => kernels::scores::<K, 2, $tok>(k, krows, kscale, t0, t1, q, d, sc, next),
                    3 => kernels::scores::<K, 3, $tok>(k, krows, kscale, t0, t1, q, d, sc, next),
                    _ => kernels::scores::<K, 4, $tok>(k, krows, kscale, t0, t1, q, d, sc, next),
                }
            }
        }

        #[target_feature(enable = $feat)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $accumulate<V: RowCodec>(
            v: &V,
            rows: usize,
            vrows: &[*const u8; TILE],
            vscale: *const f32,
            t0: usize,
            t1: usize,
            w: *const f32,
            wt: usize,
            corr: &[f32; 4],
            d: usize,
            acc: *mut f32,
            next: &NextRows,
        ) {
            // SAFETY: forwarded contract.
            unsafe {
                match rows {
                    1 => kernels::accumulate::<V, 1, $ch>(v, vrows, vscale, t0, t1, w, wt, corr, d, acc, next),
                    2 => kernels::accumulate::<V, 2, $ch>(v, vrows, vscale, t0, t1, w, wt, corr, d, acc, next),
                    3 => kernels::accumulate::<V, 3, $ch>(v, vrows, vscale, t0, t1, w, wt, corr, d, acc, next),
                    _ => kernels::accumulate::<V, 4, $ch>(v, vrows, vscale, t0, t1, w, wt, corr, d, acc, next),
                }
            }
        }

        impl<K: RowCodec, V: RowCodec> TileOps for SimdOps<$name, K, V> {
            const K_SCALED: bool = K::SCALED;
            const V_SCALED: bool = V::SCALED;
            const V_SUB_SCALED: bool = V::SUB_SCALED;

            #[inline(always)]
            unsafe fn scores(
                &self,
                rows: usize,
                krows: &[*const u8; TILE],
                kscale: &[f32],
                t0: usize,
                t1: usize,
                q: *const f32,
                _lanes: *const f32,
                d: usize,
                sc: *mut f32,
                next: &NextRows,
            ) {
                // SAFETY: forwarded contract (the ISA is available).
                unsafe { $scores(&self.k, rows, krows, kscale, t0, t1, q, d, sc, next) }
            }

            #[inline(always)]
            unsafe fn accumulate(
                &self,
                rows: usize,
                vrows: &[*const u8; TILE],
                vscale: *const f32,
                t0: usize,
                t1: usize,
                w: *const f32,
                wt: usize,
                corr: &[f32; 4],
                d: usize,
                acc: *mut f32,
                next: &NextRows,
            ) {
                // SAFETY: forwarded contract.
                unsafe { $accumulate(&self.v, rows, vrows, vscale, t0, t1, w, wt, corr, d, acc, next) }
            }
        }
    };
}

kernel_fns!(Avx2, "avx2,fma,f16c", scores_avx2, accumulate_avx2, 2, 1);
kernel_fns!(Avx512, "avx512f,avx512vl,avx2,fma,f16c", scores_avx512, accumulate_avx512, 4, 2);

/// Whether calls over `layer` on `isa` compute K·Q in integers ([`int8`]): q8 and q4 keys
/// (whose queries are rounded to two int8 codes a value on every route), head_dim a multiple
/// of 64, the AVX-512 kernels on a CPU with AVX-512 VNNI and BW. The queries' int8 lanes must
/// then be prepared.
pub(crate) fn int8_keys(isa: KernelIsa, layer: &LayerView) -> bool {
    static VNNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let vnni =
        *VNNI.get_or_init(|| std::is_x86_feature_detected!("avx512vnni") && std::is_x86_feature_detected!("avx512bw"));
    isa == KernelIsa::Avx512 && vnni && int8_queries(layer.format) && layer.head_dim.is_multiple_of(64)
}

/// [`tile::run`] with `isa`'s kernels for the layer's codecs (the integer K·Q kernel where
/// the input carries int8 lanes, see [`int8_keys`]).
///
/// # Safety
/// As [`tile::run`], with `isa` available on this CPU; lanes only where [`int8_keys`] holds.
pub(crate) unsafe fn attend_range(
    isa: KernelIsa,
    inp: &RangeInput,
    start: usize,
    end: usize,
    states: &mut HeadStates,
    scratch: &mut TileScratch,
) {
    debug_assert_eq!(inp.lanes.is_some(), int8_keys(isa, inp.layer));
    // SAFETY: forwarded contract.
    unsafe {
        match isa {
            _ if inp.lanes.is_some() => by_codecs_int8(inp, start, end, states, scratch),
            KernelIsa::Avx2 => by_codecs_avx2(inp, start, end, states, scratch),
            KernelIsa::Avx512 => by_codecs_avx512(inp, start, end, states, scratch),
        }
    }
}

/// The integer K·Q kernel for keys `K` with the AVX-512 value kernels of codec `V`.
pub(crate) struct Int8Ops<K, V> {
    k: K,
    v: V,
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn scores_int8<K: IntKeys>(
    k: &K,
    rows: usize,
    krows: &[*const u8; TILE],
    kscale: &[f32],
    t0: usize,
    t1: usize,
    lanes: *const f32,
    d: usize,
    sc: *mut f32,
    next: &NextRows,
) {
    // SAFETY: forwarded contract.
    unsafe {
        match rows {
            1 => int8::scores::<K, 1>(k, krows, kscale, t0, t1, lanes, d, sc, next),
            2 => int8::scores::<K, 2>(k, krows, kscale, t0, t1, lanes, d, sc, next),
            3 => int8::scores::<K, 3>(k, krows, kscale, t0, t1, lanes, d, sc, next),
            _ => int8::scores::<K, 4>(k, krows, kscale, t0, t1, lanes, d, sc, next),
        }
    }
}

#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn accumulate_wide<V: WideValues>(
    v: &V,
    rows: usize,
    vrows: &[*const u8; TILE],
    t0: usize,
    t1: usize,
    w: *const f32,
    wt: usize,
    corr: &[f32; 4],
    d: usize,
    acc: *mut f32,
    next: &NextRows,
) {
    // SAFETY: forwarded contract.
    unsafe {
        match rows {
            1 => wide::accumulate::<V, 1>(v, vrows, t0, t1, w, wt, corr, d, acc, next),
            2 => wide::accumulate::<V, 2>(v, vrows, t0, t1, w, wt, corr, d, acc, next),
            3 => wide::accumulate::<V, 3>(v, vrows, t0, t1, w, wt, corr, d, acc, next),
            _ => wide::accumulate::<V, 4>(v, vrows, t0, t1, w, wt, corr, d, acc, next),
        }
    }
}

impl<K: IntKeys, V: WideValues> TileOps for Int8Ops<K, V> {
    const K_SCALED: bool = true;
    const V_SCALED: bool = V::SCALED;
    const V_SUB_SCALED: bool = V::SUB_SCALED;

    #[inline(always)]
    unsafe fn scores(
        &self,
        rows: usize,
        krows: &[*const u8; TILE],
        kscale: &[f32],
        t0: usize,
        t1: usize,
        _q: *const f32,
        lanes: *const f32,
        d: usize,
        sc: *mut f32,
        next: &NextRows,
    ) {
        debug_assert!(!lanes.is_null());
        // SAFETY: forwarded contract (VNNI checked by `int8_keys`).
        unsafe { scores_int8(&self.k, rows, krows, kscale, t0, t1, lanes, d, sc, next) }
    }

    #[inline(always)]
    unsafe fn accumulate(
        &self,
        rows: usize,
        vrows: &[*const u8; TILE],
        _vscale: *const f32, // q8 and q4 values are scaled per group through the weights
        t0: usize,
        t1: usize,
        w: *const f32,
        wt: usize,
        corr: &[f32; 4],
        d: usize,
        acc: *mut f32,
        next: &NextRows,
    ) {
        debug_assert!(!V::SUB_SCALED);
        // SAFETY: forwarded contract (head_dim a multiple of 64 on this route, `int8_keys`).
        unsafe { accumulate_wide(&self.v, rows, vrows, t0, t1, w, wt, corr, d, acc, next) }
    }
}

/// [`tile::run`] with the integer K·Q kernel over a q8 or q4 layer.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn by_codecs_int8(
    inp: &RangeInput,
    start: usize,
    end: usize,
    states: &mut HeadStates,
    scratch: &mut TileScratch,
) {
    // SAFETY: forwarded contract; the features are enabled here.
    unsafe {
        match (inp.layer.keys.codec, inp.layer.values.codec) {
            (Codec::Q8, Codec::Q8) => tile::run(&Int8Ops { k: Q8Keys, v: Q8Row }, inp, start, end, states, scratch),
            (Codec::Q4, Codec::Q4) => {
                tile::run(&Int8Ops { k: Q4Keys, v: Q4LutRow::new() }, inp, start, end, states, scratch)
            }
            (k, v) => unreachable!("integer K·Q serves q8 and q4 layers, not {k:?} / {v:?}"),
        }
    }
}

/// Runs the tile driver with instruction set `$isa`'s kernels for the layer's codec pair: K and
/// V share the codec except for turbo, whose two sides are Lloyd–Max codes of possibly
/// different widths, the values sub-scaled below 8 bits (the only pairs a validated layer holds).
macro_rules! by_codecs {
    ($name:ident, $isa:ty, $feat:literal, $q4:expr) => {
        #[target_feature(enable = $feat)]
        unsafe fn $name(
            inp: &RangeInput,
            start: usize,
            end: usize,
            states: &mut HeadStates,
            scratch: &mut TileScratch,
        ) {
            let d = inp.layer.head_dim;
            macro_rules! go {
                ($k:expr, $v:expr) => {
                    tile::run(
                        &SimdOps::<$isa, _, _> { k: $k, v: $v, isa: PhantomData },
                        inp,
                        start,
                        end,
                        states,
                        scratch,
                    )
                };
            }
            // Turbo's values: 8-bit codes scaled per 32, narrower ones per 8.
            macro_rules! lloyd_max_values {
                ($k:expr, $v:expr) => {
                    match $v {
                        Codec::LloydMaxSub { bits: 2 } => go!($k, SubScaled(LloydMaxRow::<2>::new(d))),
                        Codec::LloydMaxSub { bits: 3 } => go!($k, SubScaled(LloydMaxRow::<3>::new(d))),
                        Codec::LloydMaxSub { bits: 4 } => go!($k, SubScaled(LloydMaxRow::<4>::new(d))),
                        Codec::LloydMax { bits: 8 } => go!($k, LloydMax8Row::new()),
                        v => unreachable!("validated turbo layers never store values as {v:?}"),
                    }
                };
            }
            // SAFETY: forwarded contract; the ISA's features are enabled here.
            unsafe {
                match (inp.layer.keys.codec, inp.layer.values.codec) {
                    (Codec::F32, Codec::F32) => go!(F32Row, F32Row),
                    (Codec::F16, Codec::F16) => go!(F16Row, F16Row),
                    (Codec::Bf16, Codec::Bf16) => go!(Bf16Row, Bf16Row),
                    (Codec::Q8, Codec::Q8) => go!(Q8Row, Q8Row),
                    (Codec::Q4, Codec::Q4) => go!($q4, $q4),
                    (Codec::LloydMax { bits: kb }, v) => match kb {
                        2 => lloyd_max_values!(LloydMaxRow::<2>::new(d), v),
                        3 => lloyd_max_values!(LloydMaxRow::<3>::new(d), v),
                        4 => lloyd_max_values!(LloydMaxRow::<4>::new(d), v),
                        _ => lloyd_max_values!(LloydMax8Row::new(), v),
                    },
                    (k, v) => unreachable!("validated layers never pair codecs {k:?} and {v:?}"),
                }
            }
        }
    };
}

by_codecs!(by_codecs_avx2, Avx2, "avx2,fma,f16c", Q4Row);
by_codecs!(by_codecs_avx512, Avx512, "avx512f,avx512vl,avx2,fma,f16c", Q4LutRow::new());
