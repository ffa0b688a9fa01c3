//! AVX-512 kernels ([`Avx512Ops`]): 16-lane vectors, 32 registers (AVX-512F with the AVX2,
//! FMA and F16C the tile driver uses). Chosen at run time where the CPU has them.
//!
//! [`attend_range`] picks the codec pair of the layer and runs the shared tile driver
//! ([`super::tile::run`]) with these kernels.

mod codecs;
mod kernels;

use kvcache::Codec;

use self::codecs::{Bf16Row, F16Row, F32Row, LloydMax8Row, LloydMaxRow, Q4Row, Q8Row, RowCodec512};
use super::group::RowState;
use super::tile::{self, RangeInput, TileOps, TileScratch, TILE};

/// The AVX-512 kernels for key codec `K` and value codec `V`.
pub(crate) struct Avx512Ops<K, V> {
    k: K,
    v: V,
}

macro_rules! by_rows {
    ($f:ident::<$c:ty>, $rows:expr, ($($arg:expr),*)) => {
        match $rows {
            1 => kernels::$f::<$c, 1>($($arg),*),
            2 => kernels::$f::<$c, 2>($($arg),*),
            3 => kernels::$f::<$c, 3>($($arg),*),
            _ => kernels::$f::<$c, 4>($($arg),*),
        }
    };
}

impl<K: RowCodec512, V: RowCodec512> TileOps for Avx512Ops<K, V> {
    const K_SCALED: bool = K::SCALED;
    const V_SCALED: bool = V::SCALED;

    #[inline]
    unsafe fn scores(
        &self,
        rows: usize,
        krows: &[*const u8; TILE],
        kscale: &[f32],
        t0: usize,
        t1: usize,
        q: *const f32,
        d: usize,
        sc: *mut f32,
    ) {
        // SAFETY: forwarded contract (AVX2 available, rows and buffers valid).
        unsafe { by_rows!(scores::<K>, rows, (&self.k, krows, kscale, t0, t1, q, d, sc)) }
    }

    #[inline]
    unsafe fn accumulate(
        &self,
        rows: usize,
        vrows: &[*const u8; TILE],
        t0: usize,
        t1: usize,
        w: *const f32,
        wt: usize,
        corr: &[f32; 4],
        d: usize,
        acc: *mut f32,
    ) {
        // SAFETY: forwarded contract.
        unsafe { by_rows!(accumulate::<V>, rows, (&self.v, vrows, t0, t1, w, wt, corr, d, acc)) }
    }
}

/// [`tile::run`] with the AVX-512 kernels of the layer's codecs.
///
/// # Safety
/// As [`tile::run`], with AVX-512F, AVX2, FMA and F16C available.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn attend_range(
    inp: &RangeInput,
    start: usize,
    end: usize,
    state: &mut RowState,
    scratch: &mut TileScratch,
) {
    let d = inp.layer.head_dim;
    // SAFETY: forwarded contract; the codec pairs below are the only ones a validated layer
    // holds (K and V share the codec except for turbo, whose two sides are Lloyd–Max).
    unsafe {
        match (inp.layer.keys.codec, inp.layer.values.codec) {
            (Codec::F32, Codec::F32) => run(F32Row, F32Row, inp, start, end, state, scratch),
            (Codec::F16, Codec::F16) => run(F16Row, F16Row, inp, start, end, state, scratch),
            (Codec::Bf16, Codec::Bf16) => run(Bf16Row, Bf16Row, inp, start, end, state, scratch),
            (Codec::Q8, Codec::Q8) => run(Q8Row, Q8Row, inp, start, end, state, scratch),
            (Codec::Q4, Codec::Q4) => run(Q4Row::new(d), Q4Row::new(d), inp, start, end, state, scratch),
            (Codec::LloydMax { bits: kb }, Codec::LloydMax { bits: vb }) => match kb {
                2 => lloyd_max_values(LloydMaxRow::<2>::new(d), vb, inp, start, end, state, scratch),
                3 => lloyd_max_values(LloydMaxRow::<3>::new(d), vb, inp, start, end, state, scratch),
                4 => lloyd_max_values(LloydMaxRow::<4>::new(d), vb, inp, start, end, state, scratch),
                _ => lloyd_max_values(LloydMax8Row::new(), vb, inp, start, end, state, scratch),
            },
            (k, v) => unreachable!("validated layers never pair codecs {k:?} and {v:?}"),
        }
    }
}

/// Dispatches the value side of a Lloyd–Max (turbo) layer.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn lloyd_max_values<K: RowCodec512>(
    k: K,
    v_bits: u8,
    inp: &RangeInput,
    start: usize,
    end: usize,
    state: &mut RowState,
    scratch: &mut TileScratch,
) {
    let d = inp.layer.head_dim;
    // SAFETY: forwarded contract.
    unsafe {
        match v_bits {
            2 => run(k, LloydMaxRow::<2>::new(d), inp, start, end, state, scratch),
            3 => run(k, LloydMaxRow::<3>::new(d), inp, start, end, state, scratch),
            4 => run(k, LloydMaxRow::<4>::new(d), inp, start, end, state, scratch),
            _ => run(k, LloydMax8Row::new(), inp, start, end, state, scratch),
        }
    }
}

#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn run<K: RowCodec512, V: RowCodec512>(
    k: K,
    v: V,
    inp: &RangeInput,
    start: usize,
    end: usize,
    state: &mut RowState,
    scratch: &mut TileScratch,
) {
    // SAFETY: forwarded contract.
    unsafe { tile::run(&Avx512Ops { k, v }, inp, start, end, state, scratch) }
}
