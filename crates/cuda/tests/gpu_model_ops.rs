//! The model kernels (`kernels/model.cu`) and the cuBLAS products of [`pagekv_cuda::ModelOps`]
//! against scalar CPU references on fresh random inputs, outputs poisoned with NaN before each
//! run: embedding, RMSNorm (plain and gathering rows), the fused QKV split with bias, q/k norms
//! and RoPE (both pair styles, frequency factors, query scale and rounding; Gemma 3's head_dim
//! 256), SiLU·mul and GELU·mul, Gemma's post-norm added to the residual and its embedding scale,
//! conversions, products (bf16 and f32, overwrite and accumulate), the fused decode products
//! (both kernels, every prologue, 1..=4 token rows, Llama-3-8B-like widths), argmax with ties
//! and NaN, synthetic fills.
//! The RoPE reference here restates the CPU's formula; `pagekv-model`'s CUDA tests compare the
//! kernel with the CPU `Rope` itself.
//!
//! Without a CUDA device (or without the `cuda` feature) every test prints
//! `SKIPPED <test>: <reason>` on stderr, uncaptured so `cargo test` shows it, and passes.

mod common;

#[cfg(not(feature = "cuda"))]
#[test]
fn gpu_model_ops_need_the_cuda_feature() {
    common::skip("gpu_model_ops", "pagekv-cuda was built without the `cuda` feature");
    assert!(!pagekv_cuda::cuda_available());
}

#[cfg(feature = "cuda")]
mod gpu {
    use std::sync::{Arc, OnceLock};

    use half::{bf16, f16};
    use pagekv_cuda::{
        CudaDevice, CudaError, DType, DeviceMatrix, DeviceVec, GemvShape, ModelOps, Prologue, QkvRope, RopeParams,
        GEMV_MAX_N, GEMV_ROWS_PER_WARP,
    };
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use rand_distr::StandardNormal;

    use crate::common::skip;

    /// The kernels on device 0, or `None` (after printing why) when there is no device. A
    /// device whose kernels or cuBLAS fail to load is a failure, not a skip.
    fn ops(test: &str) -> Option<&'static ModelOps> {
        static OPS: OnceLock<Result<ModelOps, CudaError>> = OnceLock::new();
        let r = OPS.get_or_init(|| crate::common::open(0).map(|d| ModelOps::new(d).expect("model kernels load")));
        match r {
            Ok(o) => Some(o),
            Err(e) => {
                skip(test, &format!("no usable CUDA device ({e})"));
                None
            }
        }
    }

    fn dev(o: &ModelOps) -> &Arc<CudaDevice> {
        o.device()
    }

    fn normal(rng: &mut StdRng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.sample::<f32, _>(StandardNormal)).collect()
    }

    fn up<T: pagekv_cuda::DeviceRepr>(o: &ModelOps, x: &[T]) -> DeviceVec<T> {
        dev(o).stream().clone_htod(x).expect("upload")
    }

    fn down<T: pagekv_cuda::DeviceRepr + Default + Clone>(o: &ModelOps, x: &DeviceVec<T>) -> Vec<T> {
        dev(o).stream().clone_dtoh(x).expect("download")
    }

    fn nan_f32(o: &ModelOps, n: usize) -> DeviceVec<f32> {
        up(o, &vec![f32::NAN; n])
    }

    fn nan_matrix(o: &ModelOps, rows: usize, cols: usize, t: DType) -> DeviceMatrix {
        DeviceMatrix::from_f32(dev(o), rows, cols, t, &vec![f32::NAN; rows * cols]).expect("matrix")
    }

    fn round(t: DType, x: f32) -> f32 {
        match t {
            DType::Bf16 => bf16::from_f32(x).to_f32(),
            DType::F32 => x,
        }
    }

    /// `|a - b| ≤ tol · max(1, |b|)` for every element, with a message naming the first miss.
    fn close(what: &str, got: &[f32], want: &[f32], tol: f32) {
        assert_eq!(got.len(), want.len(), "{what}: lengths");
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= tol * w.abs().max(1.0), "{what}: element {i}: got {g}, want {w}");
        }
    }

    #[test]
    fn embedding_copies_rows() {
        let Some(o) = ops("embedding_copies_rows") else { return };
        let mut rng = StdRng::seed_from_u64(1);
        let (vocab, h, n) = (301, 72, 9);
        let table = normal(&mut rng, vocab * h);
        let tokens: Vec<u32> = (0..n).map(|_| rng.gen_range(0..vocab as u32)).collect();
        for t in [DType::Bf16, DType::F32] {
            let m = DeviceMatrix::from_f32(dev(o), vocab, h, t, &table).unwrap();
            let mut out = nan_f32(o, n * h);
            o.embed(&mut out, &m, &up(o, &tokens), n).unwrap();
            let want: Vec<f32> = tokens
                .iter()
                .flat_map(|&k| table[k as usize * h..(k as usize + 1) * h].iter().map(|&v| round(t, v)))
                .collect();
            assert_eq!(down(o, &out), want, "{t:?}");
        }
    }

    /// The CPU's RMSNorm: squares summed in f64, mean rounded to f32, `x · inv · w`.
    fn rms_ref(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
        let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
        let inv = 1.0 / ((sum / x.len() as f64) as f32 + eps).sqrt();
        x.iter().zip(w).map(|(&v, &g)| v * inv * g).collect()
    }

    #[test]
    fn rms_norm_matches_the_cpu_formula_plain_and_gathered() {
        let Some(o) = ops("rms_norm_matches_the_cpu_formula_plain_and_gathered") else { return };
        let mut rng = StdRng::seed_from_u64(2);
        for (n, h) in [(1usize, 576usize), (7, 4096), (5, 100)] {
            let x: Vec<f32> = normal(&mut rng, n * h).iter().map(|v| v * 3.0).collect();
            let w = normal(&mut rng, h);
            let want: Vec<f32> = x.chunks(h).flat_map(|r| rms_ref(r, &w, 1e-5)).collect();
            let (xd, wd) = (up(o, &x), up(o, &w));
            for t in [DType::F32, DType::Bf16] {
                let mut out = nan_matrix(o, n, h, t);
                o.rms_norm(&mut out, &xd, &wd, None, n, 1e-5).unwrap();
                let got = out.to_f32(dev(o)).unwrap();
                let want_t: Vec<f32> = want.iter().map(|&v| round(t, v)).collect();
                // f32: the sum's order differs (tree vs sequential in f64): a last-bit change of
                // inv at most. bf16: the same, seen through one rounding.
                let tol = if t == DType::F32 { 1e-6 } else { 8e-3 };
                close(&format!("rms_norm {t:?} [{n}, {h}]"), &got, &want_t, tol);
            }
            // Gathered: rows picked out of order, one twice.
            let rows: Vec<u32> = (0..3).map(|i| ((i * 5 + 1) % n) as u32).collect();
            let mut out = nan_matrix(o, 3, h, DType::F32);
            o.rms_norm(&mut out, &xd, &wd, Some(&up(o, &rows)), 3, 1e-5).unwrap();
            let want: Vec<f32> =
                rows.iter().flat_map(|&r| want[r as usize * h..(r as usize + 1) * h].to_vec()).collect();
            close("rms_norm gathered", &out.to_f32(dev(o)).unwrap(), &want, 1e-6);
        }
    }

    /// The CPU Rope (crates/model/src/llama/ops.rs) restated: angles by repeated f32
    /// multiplication, pairs rotated with the first product fused.
    #[allow(clippy::too_many_arguments)]
    fn rope_ref(head: &mut [f32], pos: u32, rope_dims: usize, neox: bool, ts: f32, fs: f32, factors: Option<&[f32]>) {
        let half = rope_dims / 2;
        let mut theta = pos as f32;
        for i in 0..half {
            let f = factors.map_or(1.0, |f| f[i]);
            let angle = fs * (theta / f);
            let (c, s) = (angle.cos(), angle.sin());
            let (a_i, b_i) = if neox { (i, i + half) } else { (2 * i, 2 * i + 1) };
            let (a, b) = (head[a_i], head[b_i]);
            head[a_i] = a.mul_add(c, -(b * s));
            head[b_i] = a.mul_add(s, b * c);
            theta *= ts;
        }
    }

    #[test]
    fn qkv_rope_splits_biases_norms_rotates_and_rounds() {
        let Some(o) = ops("qkv_rope_splits_biases_norms_rotates_and_rounds") else { return };
        let mut rng = StdRng::seed_from_u64(3);
        // (heads, kv heads, head_dim, rope_dims, neox, bias, norms, factors, q_round, q_scale,
        // centered keys); Qwen2's heads (biases, keys centered for a quantized cache) and, the
        // last two, Gemma 3's (q/k norms, queries scaled by 1/16 before rounding).
        let cases = [
            (9usize, 3usize, 64usize, 64usize, false, false, false, false, 1u32, 1.0f32, false),
            (32, 8, 128, 128, false, false, false, true, 2, 1.0, false),
            (4, 2, 128, 64, true, true, true, false, 0, 1.0, false),
            (6, 6, 32, 32, true, true, false, false, 2, 1.0, false),
            (12, 2, 128, 128, true, true, false, false, 0, 1.0, true),
            (12, 2, 128, 128, true, true, false, false, 0, 1.0, false),
            (4, 1, 256, 256, true, false, true, false, 1, 0.0625, false),
            (4, 1, 256, 256, true, false, true, false, 0, 0.0625, false),
        ];
        for (nh, nkv, d, rd, neox, with_bias, with_norms, with_factors, q_round, q_scale, center) in cases {
            let n = 5;
            let width = (nh + 2 * nkv) * d;
            let qkv = normal(&mut rng, n * width);
            let bias = normal(&mut rng, width);
            let (qn, kn) = (normal(&mut rng, d), normal(&mut rng, d));
            let factors: Vec<f32> = (0..rd / 2).map(|_| rng.gen_range(1.0f32..8.0)).collect();
            let positions: Vec<u32> = (0..n).map(|_| rng.gen_range(0..5000)).collect();
            let p = RopeParams {
                num_heads: nh,
                num_kv_heads: nkv,
                head_dim: d,
                rope_dims: rd,
                neox,
                theta_scale: 100000f32.powf(-2.0 / rd as f32),
                freq_scale: 0.5,
                eps: 1e-6,
                q_round,
                q_scale,
            };
            let (qkv_d, bias_d, qn_d, kn_d, f_d, pos_d) =
                (up(o, &qkv), up(o, &bias), up(o, &qn), up(o, &kn), up(o, &factors), up(o, &positions));
            let a = QkvRope {
                qkv: &qkv_d,
                bias: with_bias.then_some(&bias_d),
                q_norm: with_norms.then_some(&qn_d),
                k_norm: with_norms.then_some(&kn_d),
                factors: with_factors.then_some(&f_d),
                positions: &pos_d,
                center_keys: center,
            };
            let (mut q, mut k, mut v) = (nan_f32(o, n * nh * d), nan_f32(o, n * nkv * d), nan_f32(o, n * nkv * d));
            o.qkv_rope(&mut q, &mut k, &mut v, &a, &p, n).unwrap();
            let (mut wq, mut wk, mut wv) = (Vec::new(), Vec::new(), Vec::new());
            for i in 0..n {
                for hh in 0..nh + 2 * nkv {
                    let mut head: Vec<f32> = qkv[i * width + hh * d..i * width + (hh + 1) * d].to_vec();
                    if with_bias {
                        for (x, b) in head.iter_mut().zip(&bias[hh * d..(hh + 1) * d]) {
                            *x += b;
                        }
                    }
                    let kind = if hh < nh {
                        0
                    } else if hh < nh + nkv {
                        1
                    } else {
                        2
                    };
                    if with_norms && kind < 2 {
                        head = rms_ref(&head, if kind == 0 { &qn } else { &kn }, p.eps);
                    }
                    if kind < 2 {
                        let f = with_factors.then_some(&factors[..]);
                        rope_ref(&mut head, positions[i], rd, neox, p.theta_scale, p.freq_scale, f);
                    }
                    if kind == 0 {
                        head.iter_mut().for_each(|x| *x *= q_scale);
                    }
                    if kind == 1 && center && with_bias {
                        for (x, b) in head.iter_mut().zip(&bias[hh * d..(hh + 1) * d]) {
                            *x -= b;
                        }
                    }
                    if kind == 0 && q_round == 1 {
                        head.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32());
                    }
                    if kind == 0 && q_round == 2 {
                        head.iter_mut().for_each(|x| *x = bf16::from_f32(*x).to_f32());
                    }
                    [&mut wq, &mut wk, &mut wv][kind].extend(head);
                }
            }
            // cos/sin of the GPU's libdevice and Rust's libm differ by an ulp or two, and the
            // norms' sums differ in order; a rounded q may land one f16/bf16 step away.
            let qtol = match q_round {
                1 => 2e-3,
                2 => 1.6e-2,
                _ => 2e-5,
            };
            let what = format!("nh {nh} nkv {nkv} d {d} rd {rd} neox {neox} q_scale {q_scale} center {center}");
            close(&format!("q, {what}"), &down(o, &q), &wq, qtol);
            close(&format!("k, {what}"), &down(o, &k), &wk, 2e-5);
            assert_eq!(down(o, &v), wv, "v, {what}");
        }
    }

    #[test]
    fn silu_mul_and_convert_match_the_scalar_formula() {
        let Some(o) = ops("silu_mul_and_convert_match_the_scalar_formula") else { return };
        let mut rng = StdRng::seed_from_u64(4);
        let (n, f) = (3, 1536);
        let gu: Vec<f32> = normal(&mut rng, n * 2 * f).iter().map(|v| v * 4.0).collect();
        let want: Vec<f32> = (0..n * f)
            .map(|e| {
                let (i, j) = (e / f, e % f);
                let (g, u) = (gu[i * 2 * f + j], gu[i * 2 * f + f + j]);
                g / (1.0 + (0.0 - g).exp()) * u
            })
            .collect();
        let gu_d = up(o, &gu);
        for t in [DType::F32, DType::Bf16] {
            let mut out = nan_matrix(o, n, f, t);
            o.silu_mul(&mut out, &gu_d, n).unwrap();
            let tol = if t == DType::F32 { 1e-6 } else { 8e-3 };
            close(&format!("silu_mul {t:?}"), &out.to_f32(dev(o)).unwrap(), &want, tol);

            let x = normal(&mut rng, 1000);
            let mut out = nan_matrix(o, 10, 100, t);
            o.convert(&mut out, &up(o, &x), 1000).unwrap();
            let want_c: Vec<f32> = x.iter().map(|&v| round(t, v)).collect();
            assert_eq!(out.to_f32(dev(o)).unwrap(), want_c, "convert {t:?}");
        }
    }

    /// GELU, tanh approximation, as the CPU's `gelu_tanh` (crates/model/src/llama/gelu.rs)
    /// computes it in f32 — the function the kernels compute (the CPU forward then rounds it
    /// through ggml's f16 table, a llama.cpp detail the GPU does not copy).
    fn gelu_ref(x: f32) -> f32 {
        if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x
        } else {
            0.5 * x * (1.0 + (0.797_884_6 * x * (0.044_715 * x).mul_add(x, 1.0)).tanh())
        }
    }

    #[test]
    fn gelu_mul_post_norm_add_and_scale_match_the_scalar_formulas() {
        let Some(o) = ops("gelu_mul_post_norm_add_and_scale_match_the_scalar_formulas") else { return };
        let mut rng = StdRng::seed_from_u64(8);
        // GeGLU over inputs of either sign up to and past the ±10 limits.
        let (n, f) = (3, 2048);
        let gu: Vec<f32> = normal(&mut rng, n * 2 * f).iter().map(|v| v * 5.0).collect();
        let want: Vec<f32> = (0..n * f)
            .map(|e| {
                let (i, j) = (e / f, e % f);
                gelu_ref(gu[i * 2 * f + j]) * gu[i * 2 * f + f + j]
            })
            .collect();
        let gu_d = up(o, &gu);
        for t in [DType::F32, DType::Bf16] {
            let mut out = nan_matrix(o, n, f, t);
            o.gelu_mul(&mut out, &gu_d, n).unwrap();
            // tanhf of libdevice and Rust's libm differ by an ulp or two.
            let tol = if t == DType::F32 { 2e-6 } else { 8e-3 };
            close(&format!("gelu_mul {t:?}"), &out.to_f32(dev(o)).unwrap(), &want, tol);
        }

        // x += rms_norm(y) · w, per row (Gemma 3 270M's width 640 and a ragged one).
        for (n, h) in [(1usize, 640usize), (6, 640), (5, 100)] {
            let x = normal(&mut rng, n * h);
            let y: Vec<f32> = normal(&mut rng, n * h).iter().map(|v| v * 7.0).collect();
            let w: Vec<f32> = normal(&mut rng, h).iter().map(|v| 1.0 + 0.3 * v).collect();
            let want: Vec<f32> = x
                .chunks(h)
                .zip(y.chunks(h))
                .flat_map(|(xr, yr)| xr.iter().zip(rms_ref(yr, &w, 1e-6)).map(|(a, b)| a + b).collect::<Vec<_>>())
                .collect();
            let mut xd = up(o, &x);
            o.rms_norm_add(&mut xd, &up(o, &y), &up(o, &w), n, h, 1e-6).unwrap();
            // The sum of squares in another order: a last-bit change of the scale at most.
            close(&format!("rms_norm_add [{n}, {h}]"), &down(o, &xd), &want, 1e-6);
        }
        let bad = o.rms_norm_add(&mut up(o, &[0f32; 8]), &up(o, &[0f32; 16]), &up(o, &[1f32; 8]), 2, 8, 1e-6);
        assert!(matches!(bad, Err(CudaError::Invalid(_))), "x shorter than n · h");

        // x *= s over a prefix of the buffer (the rest untouched); exact in f32.
        let x = normal(&mut rng, 1000);
        let mut xd = up(o, &x);
        o.scale(&mut xd, 700, 25.298_22).unwrap();
        let want: Vec<f32> = x.iter().enumerate().map(|(i, &v)| if i < 700 { v * 25.298_22 } else { v }).collect();
        assert_eq!(down(o, &xd), want, "scale");
        assert!(matches!(o.scale(&mut xd, 1001, 2.0), Err(CudaError::Invalid(_))));
    }

    #[test]
    fn matmul_matches_f64_dot_products_overwriting_and_accumulating() {
        let Some(o) = ops("matmul_matches_f64_dot_products_overwriting_and_accumulating") else { return };
        let mut rng = StdRng::seed_from_u64(5);
        for (n, rows, cols) in [(1usize, 300usize, 576usize), (7, 129, 256), (33, 64, 1000)] {
            for t in [DType::F32, DType::Bf16] {
                let w = normal(&mut rng, rows * cols);
                let x = normal(&mut rng, n * cols);
                let init = normal(&mut rng, n * rows);
                let wm = DeviceMatrix::from_f32(dev(o), rows, cols, t, &w).unwrap();
                let xm = DeviceMatrix::from_f32(dev(o), n, cols, t, &x).unwrap();
                let dot = |i: usize, r: usize| -> f64 {
                    (0..cols).map(|c| round(t, x[i * cols + c]) as f64 * round(t, w[r * cols + c]) as f64).sum()
                };
                for accumulate in [false, true] {
                    let mut out = if accumulate { up(o, &init) } else { nan_f32(o, n * rows) };
                    o.matmul(&mut out, &xm, &wm, n, accumulate).unwrap();
                    let want: Vec<f32> = (0..n * rows)
                        .map(|e| {
                            let base = if accumulate { init[e] as f64 } else { 0.0 };
                            (base + dot(e / rows, e % rows)) as f32
                        })
                        .collect();
                    // f32 accumulation over `cols` products of values of order one.
                    let tol = 2e-6 * (cols as f32).sqrt() * 4.0;
                    close(&format!("matmul {t:?} n {n} [{rows}, {cols}] acc {accumulate}"), &down(o, &out), &want, tol);
                }
            }
        }
        // Mismatched types are an error, not a launch.
        let a = DeviceMatrix::zeros(dev(o), 2, 8, DType::F32).unwrap();
        let b = DeviceMatrix::zeros(dev(o), 4, 8, DType::Bf16).unwrap();
        let mut out = nan_f32(o, 8);
        assert!(matches!(o.matmul(&mut out, &a, &b, 2, false), Err(CudaError::Invalid(_))));
    }

    #[test]
    fn fused_gemv_matches_its_unfused_ops_for_every_prologue() {
        let Some(shared) = ops("fused_gemv_matches_its_unfused_ops_for_every_prologue") else { return };
        // The earlier row-per-warp kernel.
        for r in GEMV_ROWS_PER_WARP {
            for bps in [1, 8] {
                let mut o = ModelOps::new(dev(shared).clone()).unwrap();
                let shape = GemvShape { split_warps: None, rows_per_warp: r, blocks_per_sm: bps, pdl: false };
                o.set_gemv_shape(shape);
                gemv_cases(&o);
            }
        }
        // The split kernel: both block sizes, one and two blocks per SM, with and without the
        // programmatic dependent launch (here after a host copy or the previous product).
        for (warps, bps, pdl) in [(32, 1, true), (32, 1, false), (16, 2, true), (16, 1, false), (32, 2, true)] {
            let mut o = ModelOps::new(dev(shared).clone()).unwrap();
            let shape = GemvShape { split_warps: Some(warps), rows_per_warp: 1, blocks_per_sm: bps, pdl };
            o.set_gemv_shape(shape);
            gemv_cases(&o);
        }
    }

    fn gemv_cases(o: &ModelOps) {
        let shape = o.gemv_shape();
        let mut rng = StdRng::seed_from_u64(7);
        // (rows, cols): odd row counts (the last warp's group half empty), SmolLM2-like widths;
        // for the split kernel: many rows per block (4000), seven 256-word slices per row
        // (Llama 3 8B's down product, 14336), a last slice of one word (2056), one word a row (8).
        let shapes =
            [(1usize, 64usize), (301, 576), (1536, 1536), (77, 4096), (4000, 64), (200, 14336), (33, 2056), (5, 8)];
        for (rows, cols) in shapes {
            let w = normal(&mut rng, rows * cols);
            let wm = DeviceMatrix::from_f32(dev(o), rows, cols, DType::Bf16, &w).unwrap();
            let wb: Vec<f64> = w.iter().map(|&v| round(DType::Bf16, v) as f64).collect();
            let norm_w: Vec<f32> = normal(&mut rng, cols).iter().map(|v| 1.0 + 0.3 * v).collect();
            let norm_d = up(o, &norm_w);
            for n in 1..=GEMV_MAX_N {
                let total = n + 2; // spare rows for the gather
                let x: Vec<f32> = normal(&mut rng, total * 2 * cols).iter().map(|v| v * 2.0).collect();
                let xd = up(o, &x);
                let gather: Vec<u32> = (0..n).map(|i| ((i * 3 + 1) % total) as u32).collect();
                let gather_d = up(o, &gather);
                let init = normal(&mut rng, n * rows);
                for (name, pro, rows_idx) in [
                    ("convert", Prologue::Convert, None),
                    ("rms_norm", Prologue::RmsNorm { w: &norm_d, eps: 1e-5 }, None),
                    ("rms_norm gathered", Prologue::RmsNorm { w: &norm_d, eps: 1e-5 }, Some(&gather_d)),
                    ("silu_mul", Prologue::SiluMul, None),
                    ("gelu_mul", Prologue::GeluMul, None),
                ] {
                    // The product's input as the unfused kernels make it.
                    let mut xin = nan_matrix(o, total, cols, DType::Bf16);
                    match pro {
                        Prologue::Convert => o.convert(&mut xin, &xd, n * cols).unwrap(),
                        Prologue::RmsNorm { w: nw, eps } => o.rms_norm(&mut xin, &xd, nw, rows_idx, n, eps).unwrap(),
                        Prologue::SiluMul => o.silu_mul(&mut xin, &xd, n).unwrap(),
                        Prologue::GeluMul => o.gelu_mul(&mut xin, &xd, n).unwrap(),
                    }
                    let xin = xin.to_f32(dev(o)).unwrap();
                    // [n, rows] f64 dot products of the unfused input with the bf16 weights.
                    let dots: Vec<f64> = (0..n * rows)
                        .map(|e| {
                            let (i, r) = (e / rows, e % rows);
                            (0..cols).map(|c| xin[i * cols + c] as f64 * wb[r * cols + c]).sum()
                        })
                        .collect();
                    for accumulate in [false, true] {
                        let mut out = if accumulate { up(o, &init) } else { nan_f32(o, n * rows) };
                        assert!(o.gemv_serves(&wm, n));
                        o.gemv(&mut out, &xd, &wm, pro, rows_idx, n, accumulate).unwrap();
                        let want: Vec<f32> = (0..n * rows)
                            .map(|e| (dots[e] + if accumulate { init[e] as f64 } else { 0.0 }) as f32)
                            .collect();
                        let tol = 2e-6 * (cols as f32).sqrt() * 8.0;
                        close(
                            &format!("gemv {shape:?} {name} n {n} [{rows}, {cols}] acc {accumulate}"),
                            &down(o, &out),
                            &want,
                            tol,
                        );
                    }
                }
            }
        }
        // f32 weights and too many rows are not served; asking anyway is an error.
        let wf = DeviceMatrix::zeros(dev(o), 8, 64, DType::F32).unwrap();
        assert!(!o.gemv_serves(&wf, 1));
        let wb = DeviceMatrix::zeros(dev(o), 8, 64, DType::Bf16).unwrap();
        assert!(!o.gemv_serves(&wb, GEMV_MAX_N + 1));
        // An input wider than shared memory holds is not served either.
        let wide = DeviceMatrix::zeros(dev(o), 1, 32768, DType::Bf16).unwrap();
        assert!(!o.gemv_serves(&wide, GEMV_MAX_N));
        let mut out = nan_f32(o, 64);
        let x = nan_f32(o, 64 * 8);
        assert!(matches!(o.gemv(&mut out, &x, &wf, Prologue::Convert, None, 1, false), Err(CudaError::Invalid(_))));
    }

    /// The argmax (slices of a row on many blocks, then the best slice) takes the first maximum
    /// and skips NaN: ties in slices far apart, NaN rows, the maximum at the last index; more
    /// rows than one pair of launches serves, a vocabulary that is not a whole number of slices,
    /// and one shorter than a slice.
    #[test]
    fn argmax_takes_the_first_maximum_and_skips_nan() {
        let Some(o) = ops("argmax_takes_the_first_maximum_and_skips_nan") else { return };
        let mut rng = StdRng::seed_from_u64(6);
        for (rows, vocab) in [(6usize, 49152usize), (70, 151_937), (3, 100)] {
            let mut logits = normal(&mut rng, rows * vocab);
            let r = |i: usize, j: usize| i * vocab + j;
            if vocab > 40000 {
                // Row 1: a tie between two indices far apart; row 2: NaN everywhere but two values;
                // row 3: all NaN; row 4: the maximum at the last index; row 5: -inf only.
                logits[r(1, 40000)] = 100.0;
                logits[r(1, 123)] = 100.0;
                logits[r(2, 0)..r(3, 0)].fill(f32::NAN);
                logits[r(2, 777)] = -3.0;
                logits[r(2, 778)] = -2.0;
                logits[r(3, 0)..r(4, 0)].fill(f32::NAN);
                logits[r(4, vocab - 1)] = 50.0;
                logits[r(5, 0)..r(6, 0)].fill(f32::NEG_INFINITY);
            } else {
                logits[r(1, 0)..r(2, 0)].fill(f32::NAN);
                logits[r(2, 97)] = 9.0;
                logits[r(2, 99)] = 9.0;
            }
            let host = |row: &[f32]| -> u32 {
                let mut best: Option<(usize, f32)> = None;
                for (i, &l) in row.iter().enumerate() {
                    if !l.is_nan() && best.is_none_or(|(_, b)| l > b) {
                        best = Some((i, l));
                    }
                }
                best.map_or(0, |(i, _)| i as u32)
            };
            let want: Vec<u32> = logits.chunks(vocab).map(host).collect();
            if vocab > 40000 {
                assert_eq!(want[1..5], [123, 778, 0, vocab as u32 - 1]);
            } else {
                assert_eq!(want[1..3], [0, 97]);
            }
            let mut ids = up(o, &vec![u32::MAX; rows]);
            o.argmax(&mut ids, &up(o, &logits), rows, vocab).unwrap();
            assert_eq!(down(o, &ids), want, "{rows} rows of {vocab}");
        }
    }

    #[test]
    fn synthetic_fill_is_uniform_in_range_and_the_read_kernel_runs() {
        let Some(o) = ops("synthetic_fill_is_uniform_in_range_and_the_read_kernel_runs") else { return };
        for t in [DType::Bf16, DType::F32] {
            let mut m = nan_matrix(o, 256, 1024, t);
            o.fill_uniform(&mut m, 0.25, 7).unwrap();
            let v = m.to_f32(dev(o)).unwrap();
            assert!(v.iter().all(|x| (-0.25..=0.25).contains(x)), "{t:?}: out of range");
            let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
            let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64;
            assert!(mean.abs() < 2e-3, "{t:?}: mean {mean}");
            assert!((var - 0.25f64.powi(2) / 3.0).abs() < 1e-3, "{t:?}: variance {var}");
            o.read_all(&[&m], &[]).unwrap();
        }
        dev(o).synchronize().unwrap();
    }
}
