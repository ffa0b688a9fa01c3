//! The quantized-weight kernels (`kernels/qmatrix.cu`, [`pagekv_cuda::QuantOps`]) against the
//! CPU's scalar GGUF reference (`pagekv_cpu::quant::dequantize_row`) on fresh random blocks of
//! every [`QuantType`], outputs poisoned with NaN first:
//! - dequantization into bf16 tiles equals the reference rounded to bf16 (equal values, ±0 alike; a row
//!   range of the matrix, into a tile with more rows);
//! - row lookups into f32 equal the reference (equal values);
//! - the decode product (1..=QGEMV_MAX_N token rows, a first-row offset, written into a column range of a
//!   wider output, overwrite and accumulate, every prologue — conversion, RMSNorm of gathered
//!   rows, SiLU·mul, GELU·mul) is within the bound its int8 input allows: the sum over a row of
//!   |weight| · (the input block's amax / 254), plus float rounding;
//! - a tile times bf16 inputs through cuBLAS into a column range (`ModelOps::matmul_cols`), the
//!   large-batch path, within bf16 rounding;
//! - a weight of two K-quant parts multiplied by one paired launch equals a launch per part, bit
//!   for bit;
//! - the tensor-core product (`QuantOps::mma`: every type, one and many stages, split and whole
//!   reductions, partial row and token tiles, overwrite and accumulate into a column range)
//!   equals bf16 inputs times the reference rounded to bf16, within f32 accumulation.
//!
//! Without a CUDA device (or without the `cuda` feature) every test prints
//! `SKIPPED <test>: <reason>` on stderr and passes.

mod common;

#[cfg(not(feature = "cuda"))]
#[test]
fn gpu_qmatrix_needs_the_cuda_feature() {
    common::skip("gpu_qmatrix", "pagekv-cuda was built without the `cuda` feature");
}

#[cfg(feature = "cuda")]
mod gpu {
    use std::sync::OnceLock;

    use half::{bf16, f16};
    use pagekv_cpu::quant::{dequantize_row, WeightType};
    use pagekv_cuda::{CudaError, DType, DeviceMatrix, ModelOps, Prologue, QuantMatrix, QuantType, QGEMV_MAX_N};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use crate::common::{down, normal, skip, up};

    fn normals(rng: &mut StdRng, n: usize) -> Vec<f32> {
        (0..n).map(|_| normal(rng)).collect()
    }

    fn ops(test: &str) -> Option<&'static ModelOps> {
        static OPS: OnceLock<Result<ModelOps, CudaError>> = OnceLock::new();
        let r = OPS.get_or_init(|| crate::common::open(0).map(|d| ModelOps::new(d).expect("kernels load")));
        match r {
            Ok(o) => Some(o),
            Err(e) => {
                skip(test, &format!("no usable CUDA device ({e})"));
                None
            }
        }
    }

    fn weight_type(qt: QuantType) -> WeightType {
        match qt {
            QuantType::Q4_0 => WeightType::Q4_0,
            QuantType::Q4_1 => WeightType::Q4_1,
            QuantType::Q5_0 => WeightType::Q5_0,
            QuantType::Q5_1 => WeightType::Q5_1,
            QuantType::Q8_0 => WeightType::Q8_0,
            QuantType::Q4_K => WeightType::Q4K,
            QuantType::Q5_K => WeightType::Q5K,
            QuantType::Q6_K => WeightType::Q6K,
        }
    }

    /// `rows` rows of random blocks of `qt` over `cols` columns: random code bytes, f16 scale
    /// fields of random sign and size around 1/64 (mins too), as in the file.
    fn random_blocks(rng: &mut StdRng, qt: QuantType, rows: usize, cols: usize) -> Vec<u8> {
        let (bb, blocks) = (qt.block_bytes(), rows * cols / qt.block_values());
        let mut out: Vec<u8> = (0..bb * blocks).map(|_| rng.gen()).collect();
        for b in out.chunks_exact_mut(bb) {
            let mut f = |at: usize| {
                let v = f16::from_f32(rng.gen_range(-1.0f32..1.0) / 64.0).to_le_bytes();
                b[at..at + 2].copy_from_slice(&v);
            };
            match qt {
                QuantType::Q6_K => f(208),
                QuantType::Q4_1 | QuantType::Q5_1 | QuantType::Q4_K | QuantType::Q5_K => {
                    f(0);
                    f(2);
                }
                _ => f(0),
            }
        }
        out
    }

    /// The reference values `[rows, cols]` of `bytes`.
    fn reference(qt: QuantType, bytes: &[u8], rows: usize, cols: usize) -> Vec<f32> {
        let rb = bytes.len() / rows;
        let mut out = vec![0f32; rows * cols];
        for r in 0..rows {
            dequantize_row(weight_type(qt), &bytes[r * rb..(r + 1) * rb], &mut out[r * cols..(r + 1) * cols]).unwrap();
        }
        out
    }

    /// Shapes per type: odd row counts, one and several blocks per row, and a row of 12
    /// K-quant lane units (served by 4 lanes in 3 slices, not 16 lanes with 4 idle).
    fn shapes(qt: QuantType) -> [(usize, usize); 3] {
        let b = qt.block_values();
        [(37, b), (70, 3 * b.max(64)), (19, 1536)]
    }

    #[test]
    fn dequantized_tiles_and_rows_equal_the_reference() {
        let Some(o) = ops("dequantized_tiles_and_rows_equal_the_reference") else { return };
        let dev = o.device();
        let mut rng = StdRng::seed_from_u64(41);
        for qt in QuantType::ALL {
            for (rows, cols) in shapes(qt) {
                let bytes = random_blocks(&mut rng, qt, rows, cols);
                let want = reference(qt, &bytes, rows, cols);
                let w = QuantMatrix::upload(dev, qt, rows, cols, &bytes).unwrap();
                assert_eq!(w.bytes(), bytes.len());
                // Rows 5..5 + count into a tile of count + 3 rows.
                let count = rows - 9;
                let tile =
                    DeviceMatrix::from_f32(dev, count + 3, cols, DType::Bf16, &vec![f32::NAN; (count + 3) * cols])
                        .unwrap();
                o.quant().dequantize(&tile, &w, 5, count).unwrap();
                let got = tile.to_f32(dev).unwrap();
                for (i, (g, v)) in got[..count * cols].iter().zip(&want[5 * cols..(5 + count) * cols]).enumerate() {
                    assert_eq!(*g, bf16::from_f32(*v).to_f32(), "{qt:?} [{rows}, {cols}] value {i}");
                }
                assert!(got[count * cols..].iter().all(|v| v.is_nan()), "{qt:?}: rows past the range written");
                // Row lookups (the embedding).
                let ids: Vec<u32> = vec![0, (rows - 1) as u32, 7, 7];
                let mut out = up(dev, &vec![f32::NAN; ids.len() * cols]);
                o.quant().rows_f32(&mut out, &w, &up(dev, &ids), ids.len()).unwrap();
                let got = down(dev, &out);
                for (i, &id) in ids.iter().enumerate() {
                    let r = id as usize;
                    for c in 0..cols {
                        assert_eq!(got[i * cols + c], want[r * cols + c], "{qt:?} row {r} col {c}");
                    }
                }
                // Bad ranges are errors.
                assert!(o.quant().dequantize(&tile, &w, rows - 2, 3).is_err());
            }
        }
        assert!(QuantMatrix::upload(dev, QuantType::Q4_K, 2, 100, &[0; 10]).is_err());
        assert!(QuantMatrix::upload(dev, QuantType::Q8_0, 2, 32, &[0; 67]).is_err());
    }

    /// x' of each prologue on the host (f64 norm as the kernel), `[n, cols]`.
    fn prologue_ref(mode: u32, x: &[f32], nw: &[f32], rows: &[u32], n: usize, cols: usize, eps: f32) -> Vec<f32> {
        let mut out = vec![0f32; n * cols];
        for i in 0..n {
            let o = &mut out[i * cols..(i + 1) * cols];
            match mode {
                0 => o.copy_from_slice(&x[i * cols..(i + 1) * cols]),
                1 => {
                    let r = &x[rows[i] as usize * cols..(rows[i] as usize + 1) * cols];
                    let ss: f64 = r.iter().map(|&v| (v * v) as f64).sum();
                    let inv = 1.0 / ((ss / cols as f64) as f32 + eps).sqrt();
                    for c in 0..cols {
                        o[c] = r[c] * inv * nw[c];
                    }
                }
                2 => {
                    let r = &x[i * 2 * cols..(i + 1) * 2 * cols];
                    for c in 0..cols {
                        let g = r[c];
                        o[c] = g / (1.0 + (-g).exp()) * r[cols + c];
                    }
                }
                _ => {
                    // GELU, tanh approximation (the CPU's `gelu_tanh` in f32).
                    let r = &x[i * 2 * cols..(i + 1) * 2 * cols];
                    for c in 0..cols {
                        let g = r[c];
                        let gelu = if g <= -10.0 {
                            0.0
                        } else if g >= 10.0 {
                            g
                        } else {
                            0.5 * g * (1.0 + (0.797_884_6 * g * (0.044_715 * g).mul_add(g, 1.0)).tanh())
                        };
                        o[c] = gelu * r[cols + c];
                    }
                }
            }
        }
        out
    }

    #[test]
    fn decode_products_are_within_the_int8_input_bound() {
        let Some(o) = ops("decode_products_are_within_the_int8_input_bound") else { return };
        let dev = o.device();
        let mut rng = StdRng::seed_from_u64(42);
        let eps = 1e-5f32;
        for qt in QuantType::ALL {
            for (rows, cols) in shapes(qt) {
                let bytes = random_blocks(&mut rng, qt, rows, cols);
                let wv = reference(qt, &bytes, rows, cols);
                let w = QuantMatrix::upload(dev, qt, rows, cols, &bytes).unwrap();
                for mode in 0..4u32 {
                    for n in 1..=QGEMV_MAX_N {
                        let (first, total) = (2usize, n + 3);
                        let (col, ldo) = (5usize, rows + 9);
                        let width = if mode >= 2 { 2 * cols } else { cols };
                        let x = normals(&mut rng, total * width);
                        let nw: Vec<f32> = (0..cols).map(|_| 1.0 + 0.2 * normal(&mut rng)).collect();
                        // Gathered rows (RMSNorm mode): a permutation-like pick of x's rows.
                        let gather: Vec<u32> = (0..total).map(|i| ((i * 5 + 1) % total) as u32).collect();
                        let nw_d = up(dev, &nw);
                        let prologue = match mode {
                            0 => Prologue::Convert,
                            1 => Prologue::RmsNorm { w: &nw_d, eps },
                            2 => Prologue::SiluMul,
                            _ => Prologue::GeluMul,
                        };
                        let rows_d = up(dev, &gather);
                        let gathered = if mode == 1 { Some(&rows_d) } else { None };
                        for accumulate in [false, true] {
                            let init: Vec<f32> = normals(&mut rng, total * ldo);
                            let out = up(dev, &init);
                            o.quant()
                                .gemv(&out, col, ldo, &up(dev, &x), &w, prologue, gathered, first, n, accumulate, false)
                                .unwrap();
                            let got = down(dev, &out);
                            // x' of rows first..first + n.
                            let xs: Vec<f32> = if mode == 1 {
                                prologue_ref(1, &x, &nw, &gather[first..first + n], n, cols, eps)
                            } else {
                                prologue_ref(mode, &x[first * width..(first + n) * width], &nw, &[], n, cols, eps)
                            };
                            for t in 0..total {
                                for r in 0..ldo {
                                    let g = got[t * ldo + r];
                                    let inside = t >= first && t < first + n && r >= col && r < col + rows;
                                    if !inside {
                                        assert_eq!(g.to_bits(), init[t * ldo + r].to_bits(), "{qt:?}: wrote outside");
                                        continue;
                                    }
                                    let (i, wr) = (t - first, r - col);
                                    let xr = &xs[i * cols..(i + 1) * cols];
                                    let wrow = &wv[wr * cols..(wr + 1) * cols];
                                    let mut dot = 0f64;
                                    let mut bound = 0f64;
                                    for (xb, wb) in xr.chunks(32).zip(wrow.chunks(32)) {
                                        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                                        for (a, b) in xb.iter().zip(wb) {
                                            dot += *a as f64 * *b as f64;
                                            bound += (*b as f64).abs() * amax / 254.0;
                                        }
                                    }
                                    let base = if accumulate { init[t * ldo + r] as f64 } else { 0.0 };
                                    let want = base + dot;
                                    let tol = bound * 1.01 + 1e-4 * (1.0 + want.abs());
                                    assert!(
                                        ((g as f64) - want).abs() <= tol,
                                        "{qt:?} [{rows}, {cols}] mode {mode} n {n} acc {accumulate} row {t} col {r}: {g} vs {want} (bound {tol})"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// A weight stacked from a Q4_K and a Q6_K part (as Q4_K_M's q|k and v) multiplies an input
    /// the launch just before produced; its second part's launch is a sibling of the first (does
    /// not wait before reading the input). Eight rounds back to back, each with a new input, must
    /// give what the same launches give when every one waits: a sibling reading the input early
    /// would see the previous round's.
    #[test]
    fn sibling_launches_see_the_input_their_first_part_waited_for() {
        let Some(o) = ops("sibling_launches_see_the_input_their_first_part_waited_for") else { return };
        let dev = o.device();
        let q = o.quant();
        let mut rng = StdRng::seed_from_u64(7);
        let (cols, rb, rc, rounds) = (2048usize, 1000usize, 260usize, 8usize);
        let upload = |rng: &mut StdRng, qt: QuantType, rows: usize| {
            QuantMatrix::upload(dev, qt, rows, cols, &random_blocks(rng, qt, rows, cols)).unwrap()
        };
        let (wa, wb, wc) = (
            upload(&mut rng, QuantType::Q4_K, cols),
            upload(&mut rng, QuantType::Q4_K, rb),
            upload(&mut rng, QuantType::Q6_K, rc),
        );
        let x0: Vec<_> = (0..rounds).map(|_| up(dev, &normals(&mut rng, cols))).collect();
        let run = |sibling: bool| -> Vec<Vec<f32>> {
            let xa = up(dev, &vec![0f32; cols]);
            let outs: Vec<_> = (0..rounds).map(|_| up(dev, &vec![0f32; rb + rc])).collect();
            for (x, out) in x0.iter().zip(&outs) {
                q.gemv(&xa, 0, cols, x, &wa, Prologue::Convert, None, 0, 1, false, false).unwrap();
                q.gemv(out, 0, rb + rc, &xa, &wb, Prologue::Convert, None, 0, 1, false, false).unwrap();
                q.gemv(out, rb, rb + rc, &xa, &wc, Prologue::Convert, None, 0, 1, false, sibling).unwrap();
            }
            outs.iter().map(|out| down(dev, out)).collect()
        };
        let (waited, siblings) = (run(false), run(true));
        for (r, (a, b)) in waited.iter().zip(&siblings).enumerate() {
            assert!(a.iter().any(|v| *v != 0.0), "round {r}: no output");
            let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "round {r}: the sibling launch saw another input");
        }
    }

    /// A weight stacked from two K-quant parts of different types, multiplied by one paired
    /// launch (`QuantOps::gemv_pair`), gives the bits of a launch per part — every ordered pair of
    /// types, every prologue, overwrite and accumulate, into a column range of a wider output
    /// from a first-row offset — and writes nothing else.
    #[test]
    fn paired_launches_equal_a_launch_per_part() {
        let Some(o) = ops("paired_launches_equal_a_launch_per_part") else { return };
        let (dev, q) = (o.device(), o.quant());
        if !dev.tuning().qgemv_pair {
            skip("paired_launches_equal_a_launch_per_part", "PAGEKV_DEV_CUDA_QGEMV_PAIR is off");
            return;
        }
        let mut rng = StdRng::seed_from_u64(44);
        let k_quants = [QuantType::Q4_K, QuantType::Q5_K, QuantType::Q6_K];
        let eps = 1e-5f32;
        for (ta, tb) in k_quants.iter().flat_map(|&a| k_quants.iter().filter(move |&&b| b != a).map(move |&b| (a, b))) {
            // Odd row counts; 12 lane units a row (4 lanes, 3 slices) and 2 (2 lanes, 1 slice).
            for (ra, rb, cols) in [(301usize, 77usize, 1536usize), (40, 263, 256)] {
                let upload = |rng: &mut StdRng, qt: QuantType, rows: usize| {
                    QuantMatrix::upload(dev, qt, rows, cols, &random_blocks(rng, qt, rows, cols)).unwrap()
                };
                let (wa, wb) = (upload(&mut rng, ta, ra), upload(&mut rng, tb, rb));
                assert!(q.gemv_pair_serves(&wa, &wb, 1), "{ta:?} + {tb:?} [{cols}]: not served");
                for mode in 0..4u32 {
                    let (first, total, col) = (1usize, 3usize, 5usize);
                    let ldo = ra + rb + 9;
                    let width = if mode >= 2 { 2 * cols } else { cols };
                    let x = up(dev, &normals(&mut rng, total * width));
                    let nw: Vec<f32> = (0..cols).map(|_| 1.0 + 0.2 * normal(&mut rng)).collect();
                    let nw_d = up(dev, &nw);
                    let gather: Vec<u32> = (0..total).map(|i| ((i + 2) % total) as u32).collect();
                    let rows_d = up(dev, &gather);
                    let (prologue, gathered) = match mode {
                        0 => (Prologue::Convert, None),
                        1 => (Prologue::RmsNorm { w: &nw_d, eps }, Some(&rows_d)),
                        2 => (Prologue::SiluMul, None),
                        _ => (Prologue::GeluMul, None),
                    };
                    for accumulate in [false, true] {
                        let init = normals(&mut rng, total * ldo);
                        let (per_part, paired) = (up(dev, &init), up(dev, &init));
                        q.gemv(&per_part, col, ldo, &x, &wa, prologue, gathered, first, 1, accumulate, false).unwrap();
                        q.gemv(&per_part, col + ra, ldo, &x, &wb, prologue, gathered, first, 1, accumulate, false)
                            .unwrap();
                        q.gemv_pair(&paired, col, ldo, &x, &wa, &wb, prologue, gathered, first, 1, accumulate).unwrap();
                        let (want, got) = (down(dev, &per_part), down(dev, &paired));
                        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                            assert_eq!(
                                w.to_bits(),
                                g.to_bits(),
                                "{ta:?} + {tb:?} [{ra} + {rb}, {cols}] mode {mode} acc {accumulate}: element {i}, {g} vs {w}"
                            );
                        }
                        let changed = (0..total * ldo).filter(|&i| got[i].to_bits() != init[i].to_bits()).count();
                        assert!(changed > 0, "{ta:?} + {tb:?}: the paired launch wrote nothing");
                        // Outside row `first`'s columns col..col + ra + rb nothing moved.
                        for (i, g) in got.iter().enumerate() {
                            let (t, r) = (i / ldo, i % ldo);
                            if t != first || r < col || r >= col + ra + rb {
                                assert_eq!(g.to_bits(), init[i].to_bits(), "{ta:?} + {tb:?}: wrote outside at {i}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn tiles_multiply_into_a_column_range() {
        let Some(o) = ops("tiles_multiply_into_a_column_range") else { return };
        let dev = o.device();
        let mut rng = StdRng::seed_from_u64(43);
        let (qt, rows, cols, n) = (QuantType::Q4_K, 300, 512, 40);
        let bytes = random_blocks(&mut rng, qt, rows, cols);
        let wv = reference(qt, &bytes, rows, cols);
        let w = QuantMatrix::upload(dev, qt, rows, cols, &bytes).unwrap();
        let x = normals(&mut rng, n * cols);
        let xm = DeviceMatrix::from_f32(dev, n, cols, DType::Bf16, &x).unwrap();
        let tile = DeviceMatrix::zeros(dev, 128, cols, DType::Bf16).unwrap();
        let ldo = rows + 20;
        let out = up(dev, &vec![0f32; n * ldo]);
        // Rows in tiles of 128 into columns 20.. of out.
        let mut r = 0;
        while r < rows {
            let k = 128.min(rows - r);
            o.quant().dequantize(&tile, &w, r, k).unwrap();
            o.matmul_cols(&out, 20 + r, ldo, &xm, &tile, k, n, false).unwrap();
            r += k;
        }
        let got = down(dev, &out);
        let mut worst = 0f64;
        for t in 0..n {
            assert!(got[t * ldo..t * ldo + 20].iter().all(|&v| v == 0.0), "columns before the range written");
            for c in 0..rows {
                let want: f64 = (0..cols)
                    .map(|j| {
                        bf16::from_f32(x[t * cols + j]).to_f32() as f64
                            * bf16::from_f32(wv[c * cols + j]).to_f32() as f64
                    })
                    .sum();
                let scale: f64 = (0..cols).map(|j| (x[t * cols + j] * wv[c * cols + j]).abs() as f64).sum();
                worst = worst.max((got[t * ldo + 20 + c] as f64 - want).abs() / scale.max(1e-9));
            }
        }
        assert!(worst < 1e-3, "tile product relative error {worst}");
    }

    #[test]
    fn tensor_core_products_equal_bf16_products_of_the_reference() {
        let Some(o) = ops("tensor_core_products_equal_bf16_products_of_the_reference") else { return };
        let dev = o.device();
        let q = o.quant();
        let mut rng = StdRng::seed_from_u64(47);
        for qt in QuantType::ALL {
            let stage = if qt.block_values() == 256 { 256 } else { 128 };
            // (rows, stages, tokens): a partial tile; split reductions; token tiles past the
            // first; tall matrices whose CTAs fill the SMs unsplit (one and three stages).
            for (rows, stages, n) in
                [(37, 1, 1), (300, 5, 17), (130, 16, 64), (200, 2, 130), (17_000, 1, 3), (17_000, 3, 2)]
            {
                let cols = stages * stage;
                assert!(q.mma_serves(&QuantMatrix::zeros(dev, qt, 1, cols).unwrap(), n), "{qt:?} {cols} {n}");
                let bytes = random_blocks(&mut rng, qt, rows, cols);
                let wv: Vec<f64> =
                    reference(qt, &bytes, rows, cols).iter().map(|&v| bf16::from_f32(v).to_f32() as f64).collect();
                let w = QuantMatrix::upload(dev, qt, rows, cols, &bytes).unwrap();
                let x = normals(&mut rng, n * cols);
                let xb: Vec<f64> = x.iter().map(|&v| bf16::from_f32(v).to_f32() as f64).collect();
                let xm = DeviceMatrix::from_f32(dev, n, cols, DType::Bf16, &x).unwrap();
                let (col, ldo) = (5, rows + 9);
                for accumulate in [false, true] {
                    let init: Vec<f32> = if accumulate { normals(&mut rng, n * ldo) } else { vec![f32::NAN; n * ldo] };
                    let out = up(dev, &init);
                    q.mma(&out, col, ldo, &xm, &w, n, accumulate).unwrap();
                    let got = down(dev, &out);
                    let mut worst = 0f64;
                    for t in 0..n {
                        for c in 0..ldo {
                            let (g, i) = (got[t * ldo + c], init[t * ldo + c]);
                            if c < col || c >= col + rows {
                                assert!(g.to_bits() == i.to_bits(), "{qt:?}: column {c} of token {t} written");
                                continue;
                            }
                            let r = c - col;
                            let (xr, wr) = (&xb[t * cols..(t + 1) * cols], &wv[r * cols..(r + 1) * cols]);
                            let before = if accumulate { i as f64 } else { 0.0 };
                            let want: f64 = xr.iter().zip(wr).map(|(a, b)| a * b).sum::<f64>() + before;
                            let scale: f64 = xr.iter().zip(wr).map(|(a, b)| (a * b).abs()).sum::<f64>() + before.abs();
                            assert!(g.is_finite(), "{qt:?}: token {t} row {r} is {g}");
                            worst = worst.max((g as f64 - want).abs() / scale.max(1e-9));
                        }
                    }
                    assert!(worst < 5e-4, "{qt:?} [{rows}, {cols}] × {n} (accumulate {accumulate}): error {worst}");
                }
            }
        }
        // Inputs that do not fit are errors.
        let w = QuantMatrix::zeros(dev, QuantType::Q4_K, 8, 256).unwrap();
        let out = up(dev, &vec![0f32; 64 * 8]);
        let f32x = DeviceMatrix::zeros(dev, 4, 256, DType::F32).unwrap();
        let narrow = DeviceMatrix::zeros(dev, 4, 128, DType::Bf16).unwrap();
        let x = DeviceMatrix::zeros(dev, 4, 256, DType::Bf16).unwrap();
        assert!(q.mma(&out, 0, 8, &f32x, &w, 4, false).is_err());
        assert!(q.mma(&out, 0, 8, &narrow, &w, 4, false).is_err());
        assert!(q.mma(&out, 0, 8, &x, &w, 5, false).is_err());
        assert!(q.mma(&out, 1, 8, &x, &w, 4, false).is_err());
        assert!(q.mma(&out, 0, 8, &x, &w, 0, false).is_err());
        assert!(!q.mma_serves(&QuantMatrix::zeros(dev, QuantType::Q8_0, 8, 96).unwrap(), 4));
    }
}
