//! Every matmul kernel (every available instruction set × every weight type) against the
//! references, on fresh random data each run (the seed is printed on failure).
//!
//! Two oracles:
//! 1. **Exact integer reference.** The activations quantized by the reference quantizer (the
//!    test checks the scratch holds exactly those codes and scales) times the
//!    reference-dequantized weights, in f64; for Q4_1 the offset term takes the f16 sum `s` of
//!    the Q8_1 block, as the kernel does. The kernel differs only by float rounding:
//!    `|fast - exact| <= 2e-5 · Σ|w_i xq_i| + 1e-6`.
//! 2. **f32 reference.** Reference-dequantized weights times the original f32 activations, in
//!    f64. 8-bit activation quantization moves each value by at most `0.5 d + 127 |d - d16|
//!    <= 0.54 d` (`d = amax_block / 127`, f16-rounded for Q8_0), so
//!    `|fast - ref| <= Σ_i |w_i| · 0.54 · amax_block(i) / 127 + Σ_b |m_b| |s_b - d_b Σq_b|
//!    + 2e-5 · Σ|w_i x_i| + 1e-6` (the middle term: Q4_1's f16 offset sum).
//!    Float weight types do not quantize activations: `|fast - ref| <= 2e-5 · Σ|w_i x_i| + 1e-6`.

use half::f16;
use pagekv_cpu::quant::activations::quantize_q8_block;
use pagekv_cpu::quant::blocks::*;
use pagekv_cpu::quant::quantize::{quantize_q8_k, quantize_row};
use pagekv_cpu::quant::reference_q4k::{q4_k_dot, Q4KOrder};
use pagekv_cpu::quant::reference_q5k::{q5_k_dot, q5_k_dot_tiled};
use pagekv_cpu::quant::reference_q6k::{q6_k_dot, q6_k_dot_tiled, tiled_order};
use pagekv_cpu::quant::{
    dequantize_row, matmul, matmul_fused_ordered, matmul_fused_with_isa, matmul_with_isa, Isa, MatmulPart, Q8Kind,
    QuantError, QuantScratch, SumOrder, WeightType, WeightView,
};
use pagekv_cpu::threadpool::ThreadPool;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use rand_distr::{Distribution, Normal};

fn fresh_seed() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    t.as_nanos() as u64 ^ (std::process::id() as u64) << 32
}

fn normal_vec(rng: &mut StdRng, len: usize, scale: f32) -> Vec<f32> {
    let dist = Normal::new(0.0f32, scale).unwrap();
    (0..len)
        .map(|i| {
            let v = dist.sample(rng);
            // A few outliers, as real activations have.
            if i % 97 == 13 {
                v * 8.0
            } else {
                v
            }
        })
        .collect()
}

fn random_f16(rng: &mut StdRng, lo: f32, hi: f32) -> [u8; 2] {
    f16::from_f32(rng.gen_range(lo..hi)).to_le_bytes()
}

/// A format without a reference quantizer gets random blocks whose f16 scales (at
/// [`WeightType::f16_scale_offsets`]) are drawn from these ranges: `(offset, lo, hi)`.
fn scale_fields(ty: WeightType) -> Vec<(usize, f32, f32)> {
    if quantize_row(ty, &[0.0; QK_K], &mut Vec::new()).is_ok() {
        return vec![];
    }
    let range = |i: usize| match (ty, i) {
        (WeightType::Q5_1, 1) => (-0.05, 0.05),
        (WeightType::Q5_0 | WeightType::Q5_1 | WeightType::IQ4NL, _) => (1e-3, 2e-2),
        (WeightType::IQ4XS, _) => (1e-5, 2e-4),
        _ => (1e-4, 2e-3),
    };
    ty.f16_scale_offsets().iter().enumerate().map(|(i, &at)| (at, range(i).0, range(i).1)).collect()
}

/// Random weight bytes for `rows × cols` of `ty`: quantized normal data where a reference
/// quantizer exists, else random packed fields with sane f16 scales.
fn random_weights(rng: &mut StdRng, ty: WeightType, rows: usize, cols: usize) -> Vec<u8> {
    let mut data = Vec::new();
    match scale_fields(ty) {
        fields if !fields.is_empty() => {
            let n_blocks = rows * cols / ty.block_elems();
            for _ in 0..n_blocks {
                let mut block = vec![0u8; ty.block_bytes()];
                rng.fill_bytes(&mut block);
                for &(at, lo, hi) in &fields {
                    block[at..at + 2].copy_from_slice(&random_f16(rng, lo, hi));
                }
                data.extend_from_slice(&block);
            }
        }
        _ => {
            let w = normal_vec(rng, rows * cols, 0.05);
            for r in 0..rows {
                quantize_row(ty, &w[r * cols..(r + 1) * cols], &mut data).unwrap();
            }
        }
    }
    data
}

fn dequantize_all(w: &WeightView) -> Vec<f32> {
    let mut out = vec![0.0; w.rows * w.cols];
    for r in 0..w.rows {
        dequantize_row(w.ty, w.row(r).unwrap(), &mut out[r * w.cols..(r + 1) * w.cols]).unwrap();
    }
    out
}

/// The activations as the kernels see them after reference quantization (f32 values), the
/// per-value bound on the quantization error, and per 32-block `s - d Σq` (how far the
/// block's offset sum is from the dequantized codes' sum; read only for Q8_1 blocks, the
/// activations of Q4_1/Q5_1).
fn quantized_activations(ty: WeightType, x: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f64>) {
    if let Some(kind) = Q8Kind::for_weights(ty) {
        let mut xq = Vec::with_capacity(x.len());
        let mut err = Vec::with_capacity(x.len());
        let mut s_delta = Vec::with_capacity(x.len() / QK);
        for chunk in x.chunks_exact(QK) {
            let (qs, [d, s]) = quantize_q8_block(kind, chunk.try_into().unwrap());
            xq.extend(qs.iter().map(|&q| q as f32 * d));
            let sum: i32 = qs.iter().map(|&q| q as i32).sum();
            s_delta.push(s as f64 - d as f64 * sum as f64);
            let amax = chunk.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            err.extend(std::iter::repeat_n(0.54 * amax / 127.0, QK));
        }
        return (xq, err, s_delta);
    }
    match ty {
        ty if ty.reads_q8k() => {
            let mut xq = Vec::with_capacity(x.len());
            let mut err = Vec::with_capacity(x.len());
            for chunk in x.chunks_exact(QK_K) {
                let b = quantize_q8_k(chunk.try_into().unwrap());
                xq.extend(b.qs.iter().map(|&q| q as f32 * b.d));
                let amax = chunk.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                err.extend(std::iter::repeat_n(0.54 * amax / 127.0, QK_K));
            }
            (xq, err, vec![])
        }
        _ => (x.to_vec(), vec![0.0; x.len()], vec![]),
    }
}

/// Checks that the scratch holds exactly the reference quantization of `x`.
fn check_scratch(ty: WeightType, scratch: &QuantScratch, x: &[f32], seed: u64) {
    if let Some(kind) = Q8Kind::for_weights(ty) {
        let (qs, ds) = scratch.q8();
        for (b, chunk) in x.chunks_exact(QK).enumerate() {
            let (codes, scales) = quantize_q8_block(kind, chunk.try_into().unwrap());
            assert_eq!(&qs[b * QK..(b + 1) * QK], &codes, "seed {seed}: {kind:?} codes of block {b}");
            assert_eq!(ds[b], scales, "seed {seed}: {kind:?} scales of block {b}");
        }
        return;
    }
    match ty {
        ty if ty.reads_q8k() => {
            let blocks = scratch.q8k();
            for (b, chunk) in x.chunks_exact(QK_K).enumerate() {
                let r = quantize_q8_k(chunk.try_into().unwrap());
                assert_eq!(bytemuck::bytes_of(&blocks[b]), bytemuck::bytes_of(&r), "seed {seed}: Q8_K block {b}");
            }
        }
        _ => {}
    }
}

fn check_case(isa: Isa, ty: WeightType, m: usize, k: usize, n: usize, pool: &ThreadPool, scratch: &mut QuantScratch) {
    let seed = fresh_seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let data = random_weights(&mut rng, ty, m, k);
    let w = WeightView::new(ty, m, k, &data).unwrap();
    let x = normal_vec(&mut rng, n * k, 1.0);
    let mut out = vec![f32::NAN; n * m];
    matmul_with_isa(isa, w, &x, n, &mut out, scratch, pool).unwrap();
    check_scratch(ty, scratch, &x, seed);

    let wf = dequantize_all(&w);
    let (xq, xerr, s_delta) = quantized_activations(ty, &x);
    let nb = k / QK;
    for j in 0..n {
        for r in 0..m {
            let wr = &wf[r * k..(r + 1) * k];
            let (xj, xqj, ej) = (&x[j * k..(j + 1) * k], &xq[j * k..(j + 1) * k], &xerr[j * k..(j + 1) * k]);
            let got = out[j * m + r] as f64;
            // Q4_1/Q5_1: Σ_b m_b (s_b - d_b Σq_b), the offset term's departure from the codes'
            // sum (`m` is the second f16 of their blocks).
            let offset_delta: Vec<f64> = match ty {
                WeightType::Q4_1 | WeightType::Q5_1 => (0..nb)
                    .map(|b| {
                        let at = b * ty.block_bytes() + 2;
                        let m = f16::from_le_bytes([w.row(r).unwrap()[at], w.row(r).unwrap()[at + 1]]);
                        m.to_f32() as f64 * s_delta[j * nb + b]
                    })
                    .collect(),
                _ => vec![],
            };
            let exact: f64 =
                wr.iter().zip(xqj).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() + offset_delta.iter().sum::<f64>();
            let exact_mag: f64 = wr.iter().zip(xqj).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
            let ctx = format!("seed {seed} {isa:?} {ty:?} m={m} k={k} n={n} row {r} act {j}");
            assert!(got.is_finite(), "{ctx}: output not written ({got})");
            assert!((got - exact).abs() <= 2e-5 * exact_mag + 1e-6, "{ctx}: {got} vs exact {exact} (mag {exact_mag})");
            let reference: f64 = wr.iter().zip(xj).map(|(&a, &b)| a as f64 * b as f64).sum();
            let mag: f64 = wr.iter().zip(xj).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
            let quant_bound: f64 = wr.iter().zip(ej).map(|(&a, &e)| (a as f64).abs() * e as f64).sum::<f64>()
                + offset_delta.iter().map(|v| v.abs()).sum::<f64>();
            let bound = quant_bound + 2e-5 * mag + 1e-6;
            assert!((got - reference).abs() <= bound, "{ctx}: {got} vs f32 reference {reference}, bound {bound}");
        }
    }
}

fn shapes(ty: WeightType) -> Vec<(usize, usize, usize)> {
    // (m, k, n): m not a multiple of the thread count; n covers the 1..4 row tiles and panels.
    match ty.block_elems() {
        QK_K => vec![(37, 1536, 1), (13, 256, 5), (50, 512, 3), (9, 2304, 4), (19, 256, 70)],
        _ => vec![(37, 576, 1), (50, 1536, 3), (13, 32, 5), (9, 96, 4), (29, 576, 70), (5, 40, 2)],
    }
}

#[test]
fn every_kernel_matches_references() {
    let pools = [ThreadPool::new(1), ThreadPool::new(3)];
    let mut scratch = QuantScratch::new();
    for isa in Isa::available() {
        for ty in WeightType::ALL {
            for (m, k, n) in shapes(ty) {
                if k % ty.block_elems() != 0 {
                    continue;
                }
                for pool in &pools {
                    check_case(isa, ty, m, k, n, pool, &mut scratch);
                }
            }
        }
    }
}

#[test]
fn activation_quantizers_round_ties_like_the_reference() {
    // amax 127 makes 127 / amax = 1 exactly, so x · id lands on exact .5 ties (rounded to even
    // by the reference, as ggml-cpu's x86 quantizer does) and on values just below them.
    let pool = ThreadPool::new(1);
    let mut x = vec![0.0f32; 64];
    for (i, v) in x.iter_mut().enumerate() {
        let base = (i as f32 - 31.0) * 1.5;
        *v = if i % 3 == 0 {
            base + 0.5
        } else if i % 3 == 1 {
            base - 0.5
        } else {
            f32::from_bits((base + 0.5).to_bits() - 1)
        };
    }
    x[5] = 127.0;
    x[40] = -127.0;
    for ty in [WeightType::Q8_0, WeightType::Q4_1] {
        let data = vec![0u8; 2 * ty.block_bytes()];
        let w = WeightView::new(ty, 1, 64, &data).unwrap();
        for isa in Isa::available() {
            let mut scratch = QuantScratch::new();
            let mut out = [f32::NAN];
            matmul_with_isa(isa, w, &x, 1, &mut out, &mut scratch, &pool).unwrap();
            check_scratch(ty, &scratch, &x, 0);
            assert_eq!(out[0], 0.0);
        }
    }
    // Q8_K: ties of iscale · x on .5 and both signs of the largest magnitude, each first.
    for first_sign in [1.0f32, -1.0] {
        let mut x: Vec<f32> = (0..QK_K).map(|i| x[i % 64] * if i % 128 < 64 { 1.0 } else { -0.5 }).collect();
        x[5] = 127.0 * first_sign;
        x[200] = -127.0 * first_sign;
        let ty = WeightType::Q4K;
        let data = vec![0u8; ty.block_bytes()];
        let w = WeightView::new(ty, 1, QK_K, &data).unwrap();
        for isa in Isa::available() {
            let mut scratch = QuantScratch::new();
            let mut out = [f32::NAN];
            matmul_with_isa(isa, w, &x, 1, &mut out, &mut scratch, &pool).unwrap();
            check_scratch(ty, &scratch, &x, 0);
        }
    }
}

#[test]
fn fast_paths_are_tested_where_available() {
    // On x86-64 machines with AVX2 (and AVX-512 VNNI) the fast paths must be among the tested
    // families, and the best one is the one matmul uses.
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
        assert!(Isa::available().contains(&Isa::Avx2));
        let vnni = ["avx512f", "avx512bw", "avx512vl", "avx512vnni"];
        let has_vnni = is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni");
        assert_eq!(Isa::available().contains(&Isa::Avx512Vnni), has_vnni, "{vnni:?}");
        // No test sets a cap, so the process's cap is `Auto`.
        assert_eq!(Isa::best(), if has_vnni { Isa::Avx512Vnni } else { Isa::Avx2 });
    }
}

/// Shapes that cover every tile tail: odd and even row counts around the decode step (8) and
/// the tile height (4), activation counts around the tile width (4) and the panel (64).
fn tail_shapes() -> Vec<(usize, usize, usize)> {
    let mut v = Vec::new();
    for m in [1, 2, 3, 5, 7, 8, 9, 13, 16, 23, 40] {
        for n in [1, 2, 3, 4, 5, 6, 7, 9] {
            v.push((m, 96, n));
        }
    }
    v.extend([(37, 576, 1), (64, 1536, 1), (29, 576, 70), (24, 64, 67)]);
    // K-quant rows (multiples of 256 values).
    for (m, k) in [(1, 256), (3, 512), (7, 1536), (16, 2304)] {
        for n in [1, 2, 3, 4, 5, 9] {
            v.push((m, k, n));
        }
    }
    v
}

#[test]
fn avx512_kernels_are_bit_identical_to_avx2() {
    // The AVX-512 kernels promise the AVX2 kernels' float operations in the same order, so
    // the outputs must be equal bit for bit (not just close), on fresh random data.
    if !Isa::Avx512Vnni.is_available() {
        eprintln!("SKIPPED: no AVX-512 VNNI on this CPU");
        return;
    }
    let pools = [ThreadPool::new(1), ThreadPool::new(3)];
    let mut scratch = QuantScratch::new();
    for ty in WeightType::ALL {
        for (m, k, n) in tail_shapes() {
            if k % ty.block_elems() != 0 {
                continue;
            }
            let seed = fresh_seed();
            let mut rng = StdRng::seed_from_u64(seed);
            let data = random_weights(&mut rng, ty, m, k);
            let w = WeightView::new(ty, m, k, &data).unwrap();
            let x = normal_vec(&mut rng, n * k, 1.0);
            let mut want = vec![f32::NAN; n * m];
            matmul_with_isa(Isa::Avx2, w, &x, n, &mut want, &mut scratch, &pools[0]).unwrap();
            for pool in &pools {
                let mut got = vec![f32::NAN; n * m];
                matmul_with_isa(Isa::Avx512Vnni, w, &x, n, &mut got, &mut scratch, pool).unwrap();
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "seed {seed} {ty:?} m={m} k={k} n={n} threads {}",
                    pool.n_threads()
                );
            }
        }
    }
}

#[test]
fn fused_matmul_equals_separate_matmuls() {
    // Q/K/V-like and gate/up-like groups: each fused output bit-identical to its own matmul,
    // for every family, thread count and a range of activation rows.
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    let mut scratch = QuantScratch::new();
    let groups: [&[(WeightType, usize)]; 7] = [
        &[(WeightType::Q4_1, 64), (WeightType::Q4_1, 24), (WeightType::Q4_1, 24)],
        &[(WeightType::Q4_0, 37), (WeightType::Q8_0, 13)],
        &[(WeightType::Q5_0, 21), (WeightType::IQ4NL, 13), (WeightType::Q8_0, 6)],
        &[(WeightType::Q5_1, 17), (WeightType::Q4_1, 9)],
        &[(WeightType::Q4K, 19), (WeightType::Q6K, 9), (WeightType::Q5K, 8)],
        &[(WeightType::Q2K, 11), (WeightType::Q3K, 7), (WeightType::IQ4XS, 9), (WeightType::Q6K, 3)],
        &[(WeightType::F16, 11), (WeightType::F32, 5), (WeightType::BF16, 3), (WeightType::F16, 1)],
    ];
    for isa in Isa::available() {
        for group in groups {
            let k = if group[0].0.block_elems() == QK_K { 512 } else { 160 };
            for n in [1, 2, 5, 70] {
                let seed = fresh_seed();
                let mut rng = StdRng::seed_from_u64(seed);
                let data: Vec<Vec<u8>> = group.iter().map(|&(ty, m)| random_weights(&mut rng, ty, m, k)).collect();
                let views: Vec<WeightView> =
                    group.iter().zip(&data).map(|(&(ty, m), d)| WeightView::new(ty, m, k, d).unwrap()).collect();
                let x = normal_vec(&mut rng, n * k, 1.0);
                let want: Vec<Vec<f32>> = views
                    .iter()
                    .map(|&w| {
                        let mut out = vec![f32::NAN; n * w.rows];
                        matmul_with_isa(isa, w, &x, n, &mut out, &mut scratch, &pools[0]).unwrap();
                        out
                    })
                    .collect();
                for pool in &pools {
                    let mut outs: Vec<Vec<f32>> = views.iter().map(|w| vec![f32::NAN; n * w.rows]).collect();
                    let mut parts: Vec<MatmulPart> =
                        views.iter().zip(outs.iter_mut()).map(|(&w, out)| MatmulPart { w, out }).collect();
                    matmul_fused_with_isa(isa, &mut parts, &x, n, &mut scratch, pool).unwrap();
                    for (i, (got, want)) in outs.iter().zip(&want).enumerate() {
                        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(got), bits(want), "seed {seed} {isa:?} part {i} of {group:?} n={n}");
                    }
                }
            }
        }
    }
}

#[test]
fn fusion_errors_are_reported() {
    let pool = ThreadPool::new(2);
    let mut scratch = QuantScratch::new();
    let (a, b) = (vec![0u8; 2 * 20 * 2], vec![0u8; 2 * 34 * 2]);
    let q41 = WeightView::new(WeightType::Q4_1, 2, 64, &a).unwrap();
    let q80 = WeightView::new(WeightType::Q8_0, 2, 64, &b).unwrap();
    let (mut o1, mut o2) = (vec![0.0; 2], vec![0.0; 2]);
    let x = vec![0.5f32; 64];
    let mut parts = [MatmulPart { w: q41, out: &mut o1 }, MatmulPart { w: q80, out: &mut o2 }];
    let r = matmul_fused_with_isa(Isa::Scalar, &mut parts, &x, 1, &mut scratch, &pool);
    assert!(matches!(r, Err(QuantError::Fusion(_))), "{r:?}");
    let q41_short = WeightView::new(WeightType::Q4_1, 4, 32, &a).unwrap();
    let mut parts = [MatmulPart { w: q41, out: &mut o1 }, MatmulPart { w: q41_short, out: &mut o2 }];
    let r = matmul_fused_with_isa(Isa::Scalar, &mut parts, &x, 1, &mut scratch, &pool);
    assert!(matches!(r, Err(QuantError::Fusion(_))), "{r:?}");
}

#[test]
fn shape_errors_are_reported() {
    let pool = ThreadPool::new(2);
    let mut scratch = QuantScratch::new();
    let data = vec![0u8; 2 * 20 * 2];
    let w = WeightView::new(WeightType::Q4_1, 2, 64, &data).unwrap();
    let mut out = vec![0.0; 2];
    assert!(matches!(matmul(w, &[0.0; 63], 1, &mut out, &mut scratch, &pool), Err(QuantError::Length { .. })));
    assert!(matches!(matmul(w, &[0.0; 64], 1, &mut out[..1], &mut scratch, &pool), Err(QuantError::Length { .. })));
    let short = WeightView { data: &data[..79], ..w };
    assert!(matches!(matmul(short, &[0.0; 64], 1, &mut out, &mut scratch, &pool), Err(QuantError::Length { .. })));
    let ragged = WeightView { cols: 48, ..w };
    assert!(matches!(matmul(ragged, &[0.0; 48], 1, &mut out, &mut scratch, &pool), Err(QuantError::RaggedRow { .. })));
    assert!(matmul(w, &[], 0, &mut [], &mut scratch, &pool).is_ok());
}

/// llama.cpp's order for the 32-value formats × Q8 activations (ggml-cpu's AVX2 `vec_dot` and
/// tinyBLAS): per block, eight lanes each take the integer sum of four code × activation
/// products (codes signed: Q4_0 `q - 8`, Q5_0 `q - 16`, IQ4_NL its levels, Q8_0 as stored;
/// Q4_1/Q5_1 unsigned with their min apart), `lane = fma(d_w · d_x, lane sum, lane)`; the
/// lanes are folded `((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7))`, then the mins' `Σ m_w s_x`
/// (accumulated in f32 block by block) is added.
fn ggml_order_dot(ty: WeightType, row: &[u8], x: &[f32]) -> f32 {
    let kind = Q8Kind::for_weights(ty).expect("a 32-value format");
    let nibbles = |qs: &[u8; 16]| -> [i32; 32] {
        std::array::from_fn(|e| if e < 16 { qs[e] & 0xF } else { qs[e - 16] >> 4 } as i32)
    };
    let (mut lanes, mut summs) = ([0f32; 8], 0f32);
    for (b, xb) in x.chunks_exact(QK).enumerate() {
        let (y, [dx, sx]) = quantize_q8_block(kind, xb.try_into().unwrap());
        let (codes, d, m): ([i32; 32], f32, Option<f32>) = match ty {
            WeightType::Q4_0 => {
                let blk: BlockQ4_0 = bytemuck::pod_read_unaligned(&row[b * 18..][..18]);
                (nibbles(&blk.qs).map(|q| q - 8), blk.d.to_f32(), None)
            }
            WeightType::Q4_1 => {
                let blk: BlockQ4_1 = bytemuck::pod_read_unaligned(&row[b * 20..][..20]);
                (nibbles(&blk.qs), blk.d.to_f32(), Some(blk.m.to_f32()))
            }
            WeightType::Q5_0 => {
                let blk: BlockQ5_0 = bytemuck::pod_read_unaligned(&row[b * 22..][..22]);
                let q = pagekv_cpu::quant::reference::q5_codes(&blk.qh, &blk.qs);
                (q.map(|q| q as i32 - 16), blk.d.to_f32(), None)
            }
            WeightType::Q5_1 => {
                let blk: BlockQ5_1 = bytemuck::pod_read_unaligned(&row[b * 24..][..24]);
                let q = pagekv_cpu::quant::reference::q5_codes(&blk.qh, &blk.qs);
                (q.map(|q| q as i32), blk.d.to_f32(), Some(blk.m.to_f32()))
            }
            WeightType::Q8_0 => {
                let blk: BlockQ8_0 = bytemuck::pod_read_unaligned(&row[b * 34..][..34]);
                (blk.qs.map(|q| q as i32), blk.d.to_f32(), None)
            }
            WeightType::IQ4NL => {
                let blk: BlockIQ4NL = bytemuck::pod_read_unaligned(&row[b * 18..][..18]);
                (nibbles(&blk.qs).map(|q| KVALUES_IQ4NL[q as usize] as i32), blk.d.to_f32(), None)
            }
            other => panic!("{other:?} is not a 32-value format"),
        };
        let s = d * dx;
        for (l, lane) in lanes.iter_mut().enumerate() {
            let p: i32 = (4 * l..4 * l + 4).map(|e| codes[e] * y[e] as i32).sum();
            *lane = s.mul_add(p as f32, *lane);
        }
        if let Some(m) = m {
            summs += m * sx;
        }
    }
    let l = lanes;
    (((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))) + summs
}

/// One case of [`assert_bit_exact`]: fresh random blocks and activations.
struct Case {
    seed: u64,
    /// `[m, row_bytes]` blocks of the case's type.
    data: Vec<u8>,
    /// `[n, k]` activations.
    x: Vec<f32>,
    m: usize,
    k: usize,
    n: usize,
}

impl Case {
    fn row(&self, r: usize) -> &[u8] {
        let rb = self.data.len() / self.m;
        &self.data[r * rb..(r + 1) * rb]
    }

    /// Activation row `j` quantized to Q8_K blocks.
    fn q8k(&self, j: usize) -> Vec<BlockQ8K> {
        self.x[j * self.k..(j + 1) * self.k].chunks_exact(QK_K).map(|c| quantize_q8_k(c.try_into().unwrap())).collect()
    }
}

/// For each shape `(m, k, n)`, on fresh random blocks of `ty`: the product through every ISA of
/// `isas` and a pool of each of `threads` equals `want(case)` (`[n, m]`) bit for bit.
fn assert_bit_exact(
    ty: WeightType,
    isas: &[Isa],
    threads: &[usize],
    shapes: &[(usize, usize, usize)],
    want: impl Fn(&Case) -> Vec<f32>,
) {
    assert!(!isas.is_empty(), "no kernels to test on this CPU");
    let pools: Vec<ThreadPool> = threads.iter().map(|&t| ThreadPool::new(t)).collect();
    let mut scratch = QuantScratch::new();
    for &(m, k, n) in shapes {
        let seed = fresh_seed();
        let mut rng = StdRng::seed_from_u64(seed);
        let data = random_weights(&mut rng, ty, m, k);
        let x = normal_vec(&mut rng, n * k, 1.0);
        let case = Case { seed, data, x, m, k, n };
        let want = want(&case);
        let w = WeightView::new(ty, m, k, &case.data).unwrap();
        for &isa in isas {
            for pool in &pools {
                let mut got = vec![f32::NAN; n * m];
                matmul_with_isa(isa, w, &case.x, n, &mut got, &mut scratch, pool).unwrap();
                for (at, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        w.to_bits(),
                        "seed {seed} {ty:?} {isa:?} m={m} k={k} n={n} threads {} row {} act {}: {g} vs {w}",
                        pool.n_threads(),
                        at % m,
                        at / m
                    );
                }
            }
        }
    }
}

#[test]
fn legacy_formats_sum_in_llama_cpps_order() {
    // Bit for bit against ggml's order on fresh random data, decode (n = 1) and prefill
    // tiles, every SIMD instruction set: a last-bit difference here flips activation codes of
    // the next layer and moves a model's logits by tenths (found on Gemma 3's Q5_0 layers).
    let isas: Vec<Isa> = [Isa::Avx2, Isa::Avx512Vnni].into_iter().filter(|i| i.is_available()).collect();
    for ty in
        [WeightType::Q4_0, WeightType::Q4_1, WeightType::Q5_0, WeightType::Q5_1, WeightType::Q8_0, WeightType::IQ4NL]
    {
        assert_bit_exact(ty, &isas, &[2], &[(7, 640, 1), (9, 256, 5), (4, 2048, 14)], |c| {
            (0..c.n * c.m).map(|at| ggml_order_dot(ty, c.row(at % c.m), &c.x[at / c.m * c.k..][..c.k])).collect()
        });
    }
}

/// Asserts that two orders of the same products really differ somewhere in case `c` (so a test
/// tells them apart), counted over every output: one activation row's few outputs can round
/// alike in both orders. Cases of fewer than 32 outputs are exempt.
fn assert_orders_differ(c: &Case, a: impl Fn(&[u8], &[BlockQ8K]) -> f32, b: impl Fn(&[u8], &[BlockQ8K]) -> f32) {
    let differ = (0..c.n * c.m)
        .filter(|&at| {
            let (row, y) = (c.row(at % c.m), c.q8k(at / c.m));
            a(row, &y).to_bits() != b(row, &y).to_bits()
        })
        .count();
    assert!(differ > 0 || c.m * c.n < 32, "seed {}: both orders agree on all {} outputs", c.seed, c.m * c.n);
}

#[test]
fn q4_k_sums_in_llama_cpps_repacked_order() {
    // Bit for bit against llama.cpp's repacked Q4_K kernels (gemm order for the leading rows
    // in groups of 4, gemv order for the rest; see `reference_q4k`), on fresh random blocks:
    // every instruction set, decode and prefill shapes, odd row counts, 1 and 2 threads.
    let isas = Isa::available();
    let shapes = [
        (7, 512, 1),
        (9, 256, 5),
        (13, 512, 7),
        (23, 1536, 14),
        (16, 2304, 4),
        (33, 768, 70),
        (5, 256, 3),
        (40, 512, 2),
    ];
    assert_bit_exact(WeightType::Q4K, &isas, &[1, 2], &shapes, |c| {
        if c.n >= 4 {
            assert_orders_differ(c, |r, y| q4_k_dot(r, y, Q4KOrder::Gemm), |r, y| q4_k_dot(r, y, Q4KOrder::Gemv));
        }
        (0..c.n * c.m).map(|at| q4_k_dot(c.row(at % c.m), &c.q8k(at / c.m), Q4KOrder::of_row(at / c.m, c.n))).collect()
    });
}

#[test]
fn q6_k_sums_in_llama_cpps_order() {
    // Bit for bit against llama.cpp's orders (see `reference_q6k`) on fresh random blocks: the
    // dot product's below 8 activation rows, the tiled matmul's from 8; every instruction set,
    // decode and prefill shapes, 1 and 2 threads.
    let isas = Isa::available();
    // Tiles of 16 rows × 16 activation rows, full and partial (12 or more activation rows);
    // fewer take the row kernel (in both orders: 9 and 8 rows are tiled-order row kernels).
    let shapes = [
        (7, 512, 1),
        (9, 256, 5),
        (23, 1536, 14),
        (5, 768, 70),
        (16, 256, 16),
        (33, 512, 29),
        (40, 256, 12),
        (18, 256, 9),
        (17, 256, 2),
        (11, 2048, 8),
        (6, 1024, 7),
    ];
    assert_bit_exact(WeightType::Q6K, &isas, &[1, 2], &shapes, |c| {
        let dot = if tiled_order(c.n) { q6_k_dot_tiled } else { q6_k_dot };
        if tiled_order(c.n) {
            assert_orders_differ(c, q6_k_dot, q6_k_dot_tiled);
        }
        (0..c.n * c.m).map(|at| dot(c.row(at % c.m), &c.q8k(at / c.m))).collect()
    });
}

#[test]
fn q5_k_sums_in_llama_cpps_order() {
    // Bit for bit against llama.cpp's orders (see `reference_q5k`) on fresh random blocks: the
    // dot product's below 8 activation rows, the tiled matmul's from 8; every instruction set,
    // decode and prefill shapes, 1 and 2 threads.
    let isas = Isa::available();
    let shapes = [(7, 512, 1), (9, 256, 5), (23, 1536, 14), (5, 768, 70), (18, 256, 8), (6, 1024, 7), (17, 256, 2)];
    assert_bit_exact(WeightType::Q5K, &isas, &[1, 2], &shapes, |c| {
        let tiled = tiled_order(c.n);
        if tiled {
            assert_orders_differ(c, q5_k_dot, q5_k_dot_tiled);
        }
        let dot = if tiled { q5_k_dot_tiled } else { q5_k_dot };
        (0..c.n * c.m).map(|at| dot(c.row(at % c.m), &c.q8k(at / c.m))).collect()
    });
}

/// [`SumOrder::RowInvariant`]: every output of an n-row call equals, bit for bit, the one-row call
/// of its activation row — for every weight type, row count (verification steps, a prefill
/// chunk past a panel), instruction set and thread count. Under [`SumOrder::LlamaCpp`] the
/// K-quants' rows do depend on the row count (checked too, so the test tells the orders apart).
#[test]
fn row_invariant_order_gives_every_row_its_one_row_result() {
    let pools = [ThreadPool::new(1), ThreadPool::new(3)];
    let mut scratch = QuantScratch::new();
    let seed = fresh_seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut llama_differs = std::collections::HashSet::new();
    for isa in Isa::available() {
        for ty in WeightType::ALL {
            let (m, k) = (37, if ty.block_elems() == 256 { 1024 } else { 640 });
            let data = random_weights(&mut rng, ty, m, k);
            let w = WeightView::new(ty, m, k, &data).unwrap();
            for pool in &pools {
                for n in [2usize, 3, 5, 9, 17, 70] {
                    let x = normal_vec(&mut rng, n * k, 1.0);
                    for order in [SumOrder::RowInvariant, SumOrder::LlamaCpp] {
                        let mut all = vec![f32::NAN; n * m];
                        let mut parts = [MatmulPart { w, out: &mut all }];
                        matmul_fused_ordered(isa, order, &mut parts, &x, n, &mut scratch, pool).unwrap();
                        let mut differ = 0;
                        for j in 0..n {
                            let mut one = vec![f32::NAN; m];
                            matmul_with_isa(isa, w, &x[j * k..(j + 1) * k], 1, &mut one, &mut scratch, pool).unwrap();
                            differ += (0..m).filter(|&r| one[r].to_bits() != all[j * m + r].to_bits()).count();
                        }
                        match order {
                            SumOrder::RowInvariant => assert_eq!(
                                differ,
                                0,
                                "seed {seed} {isa:?} {ty:?} n={n} threads {}: rows differ from one-row calls",
                                pool.n_threads()
                            ),
                            SumOrder::LlamaCpp if differ > 0 => {
                                llama_differs.insert(ty);
                            }
                            SumOrder::LlamaCpp => {}
                        }
                    }
                }
            }
        }
    }
    for ty in [WeightType::Q4K, WeightType::Q6K] {
        assert!(
            llama_differs.contains(&ty),
            "seed {seed}: llama.cpp's {ty:?} orders no longer depend on the row count"
        );
    }
}

#[test]
fn interleaved_q4_k_gives_the_plain_rows_bits() {
    // RowLayout::Q4kX16 changes only where the bytes lie: every instruction set (AVX-512 with
    // its interleaved kernels, the others through plain copies of the rows), both K-quant
    // orders, decode and prefill row counts, alone and fused beside plain matrices.
    use pagekv_cpu::quant::interleave::{group_row, interleave, GROUP};
    use pagekv_cpu::quant::RowLayout;
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    let mut scratch = QuantScratch::new();
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for isa in Isa::available() {
        for (m, k) in [(16, 256), (48, 512), (160, 1536)] {
            for n in [1, 2, 3, 4, 5, 8, 9, 17, 33, 70] {
                let seed = fresh_seed();
                let mut rng = StdRng::seed_from_u64(seed);
                let data = random_weights(&mut rng, WeightType::Q4K, m, k);
                let mut packed = data.clone();
                interleave(&mut packed, WeightType::Q4K, m, k).unwrap();
                assert_ne!(packed, data, "seed {seed}");
                let rb = data.len() / m;
                let mut back = vec![0u8; data.len()];
                for (g, group) in packed.chunks_exact(GROUP * rb).enumerate() {
                    for i in 0..GROUP {
                        let r = g * GROUP + i;
                        group_row(group, k, i, &mut back[r * rb..(r + 1) * rb]);
                    }
                }
                assert_eq!(back, data, "seed {seed}");
                let plain = WeightView::new(WeightType::Q4K, m, k, &data).unwrap();
                let x16 = WeightView::with_layout(WeightType::Q4K, m, k, &packed, RowLayout::Q4kX16).unwrap();
                // A plain Q6_K matrix fused beside it, as a layer's V or down projection.
                let q6 = random_weights(&mut rng, WeightType::Q6K, 7, k);
                let q6 = WeightView::new(WeightType::Q6K, 7, k, &q6).unwrap();
                let x = normal_vec(&mut rng, n * k, 1.0);
                for order in [SumOrder::LlamaCpp, SumOrder::RowInvariant] {
                    let run = |w: WeightView, pool: &ThreadPool, scratch: &mut QuantScratch| {
                        let (mut out, mut side) = (vec![f32::NAN; n * m], vec![f32::NAN; n * 7]);
                        let mut parts = [MatmulPart { w: q6, out: &mut side }, MatmulPart { w, out: &mut out }];
                        matmul_fused_ordered(isa, order, &mut parts, &x, n, scratch, pool).unwrap();
                        (out, side)
                    };
                    let (want, want_side) = run(plain, &pools[0], &mut scratch);
                    for pool in &pools {
                        let (got, side) = run(x16, pool, &mut scratch);
                        let what =
                            format!("seed {seed} {isa:?} {order:?} m={m} k={k} n={n} threads {}", pool.n_threads());
                        assert_eq!(bits(&got), bits(&want), "{what}");
                        assert_eq!(bits(&side), bits(&want_side), "{what}");
                    }
                }
            }
        }
    }
}

#[test]
fn interleaved_layout_errors_are_reported() {
    use pagekv_cpu::quant::interleave::interleave;
    use pagekv_cpu::quant::RowLayout;
    let q4k = vec![0u8; 17 * 144];
    // Rows that are not whole groups of 16, and types other than Q4_K.
    let mut rows17 = q4k.clone();
    assert!(matches!(interleave(&mut rows17, WeightType::Q4K, 17, 256), Err(QuantError::Layout { .. })));
    assert_eq!(rows17, q4k, "a refused interleave leaves the bytes as they were");
    let r = WeightView::with_layout(WeightType::Q4K, 17, 256, &q4k, RowLayout::Q4kX16);
    assert!(matches!(r, Err(QuantError::Layout { .. })), "{r:?}");
    let q6k = vec![0u8; 16 * 210];
    let r = WeightView::with_layout(WeightType::Q6K, 16, 256, &q6k, RowLayout::Q4kX16);
    assert!(matches!(r, Err(QuantError::Layout { .. })), "{r:?}");
    let mut short = vec![0u8; 16 * 144 - 4];
    assert!(matches!(interleave(&mut short, WeightType::Q4K, 16, 256), Err(QuantError::Length { .. })));
    // An interleaved row is not contiguous, so row() refuses it rather than return other bytes.
    let x16 = WeightView::with_layout(WeightType::Q4K, 16, 256, &q4k[..16 * 144], RowLayout::Q4kX16).unwrap();
    assert!(matches!(x16.row(3), Err(QuantError::Layout { .. })));
}
