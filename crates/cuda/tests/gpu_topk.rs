//! The device top-k ([`pagekv_cuda::TopK`], `kernels/topk.cu`) against a scalar reference of
//! `pagekv-model`'s `backend::top_k` rule (every non-NaN entry sorted by value, larger first with
//! `-0.0 == 0.0`, then lower index; the first `k`; padded with ([`TOP_K_NONE`], NaN)) on fresh
//! random rows: normal values, many ties, ±0, ±inf, NaNs, all-NaN rows, rows with fewer non-NaN
//! values than `k`, the best entries in a row's last partial chunk; vocabularies that are no
//! multiple of any chunk (1, 3, 1000, 4097, 50257) beside SmolLM2's and Llama 3's; k from 1 to
//! [`TOP_K_MAX`]; the automatic launch shape and every chunk size, with and without the
//! prefilter; up to 256 rows. Ids must be
//! equal and values bit-identical (the row's own bits, `-0.0` kept); outputs are poisoned before
//! each run. `k = 1` is also checked against `pk_argmax`. `pagekv-model`'s `cuda_forward` checks
//! the kernel against `backend::top_k` itself.
//!
//! Without a CUDA device (or without the `cuda` feature) every test prints
//! `SKIPPED <test>: <reason>` on stderr, uncaptured so `cargo test` shows it, and passes.

mod common;

#[cfg(not(feature = "cuda"))]
#[test]
fn gpu_topk_needs_the_cuda_feature() {
    common::skip("gpu_topk", "pagekv-cuda was built without the `cuda` feature");
    assert!(!pagekv_cuda::cuda_available());
}

#[cfg(feature = "cuda")]
mod gpu {
    use std::sync::{Arc, Mutex, OnceLock};

    use pagekv_cuda::{
        CudaDevice, CudaError, DeviceVec, ModelOps, TopK, TopKPlan, TOP_K_CHUNKS, TOP_K_MAX, TOP_K_MERGE_CAP,
        TOP_K_NONE,
    };
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use rand_distr::StandardNormal;

    use crate::common::skip;

    /// The kernels on device 0 (one instance behind a lock: the workspace is shared), or `None`
    /// (after printing why) when there is no device. Kernels that fail to load are a failure.
    fn kernels(test: &str) -> Option<&'static Mutex<(TopK, ModelOps)>> {
        static K: OnceLock<Result<Mutex<(TopK, ModelOps)>, CudaError>> = OnceLock::new();
        let r = K.get_or_init(|| {
            crate::common::open(0).map(|d| {
                let t = TopK::new(d.clone()).expect("top-k kernels load");
                Mutex::new((t, ModelOps::new(d).expect("model kernels load")))
            })
        });
        match r {
            Ok(k) => Some(k),
            Err(e) => {
                skip(test, &format!("no usable CUDA device ({e})"));
                None
            }
        }
    }

    fn dev(t: &TopK) -> &Arc<CudaDevice> {
        t.device()
    }

    /// Reference: every non-NaN entry ordered by (value desc, `-0.0 == 0.0`; index asc), the
    /// first `k`, padded with (NONE, NaN). Values as the row's bits.
    fn reference(row: &[f32], k: usize) -> (Vec<u32>, Vec<u32>) {
        let mut all: Vec<(u32, f32)> =
            row.iter().enumerate().filter(|(_, l)| !l.is_nan()).map(|(i, &l)| (i as u32, l)).collect();
        let order = |a: &(u32, f32), b: &(u32, f32)| b.1.partial_cmp(&a.1).unwrap().then(a.0.cmp(&b.0));
        if all.len() > k {
            all.select_nth_unstable_by(k, order);
            all.truncate(k);
        }
        all.sort_by(order);
        let mut ids: Vec<u32> = all.iter().map(|e| e.0).collect();
        let mut bits: Vec<u32> = all.iter().map(|e| e.1.to_bits()).collect();
        ids.resize(k, TOP_K_NONE);
        bits.resize(k, f32::NAN.to_bits());
        (ids, bits)
    }

    /// Row kinds the cases cycle through.
    const KINDS: usize = 9;

    fn make_row(rng: &mut StdRng, kind: usize, vocab: usize, k: usize) -> Vec<f32> {
        let specials = [0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1.5, -1.5];
        let normal = |rng: &mut StdRng| 4.0 * rng.sample::<f32, _>(StandardNormal);
        let mut row: Vec<f32> = match kind {
            // Plain random logits.
            0 => (0..vocab).map(|_| normal(rng)).collect(),
            // Many ties: halves in [-8, 8].
            1 => (0..vocab).map(|_| (rng.gen_range(-8.0f32..8.0) * 2.0).round() / 2.0).collect(),
            // A few distinct values only, ±0 among them (ties across chunks).
            2 => (0..vocab).map(|_| [1.0f32, 1.0, 0.0, -0.0, -3.0][rng.gen_range(0..5)]).collect(),
            // Specials: ±0, ±inf, NaN mixed into halves.
            3 => (0..vocab)
                .map(|_| match rng.gen_range(0..3) {
                    0 => specials[rng.gen_range(0..specials.len())],
                    _ => (normal(rng) * 2.0).round() / 2.0,
                })
                .collect(),
            // Mostly NaN: fewer non-NaN values than k (when k > 1).
            4 => {
                let mut r = vec![f32::NAN; vocab];
                for _ in 0..k / 2 {
                    let i = rng.gen_range(0..vocab);
                    r[i] = normal(rng);
                }
                r
            }
            // All NaN.
            5 => vec![f32::NAN; vocab],
            // Every value the same, signs of zero alternating: the lowest indices win.
            6 => (0..vocab).map(|i| if i % 3 == 0 { -0.0 } else { 0.0 }).collect(),
            // -inf everywhere, a few +inf and NaN.
            7 => (0..vocab)
                .map(|_| match rng.gen_range(0..50) {
                    0 => f32::INFINITY,
                    1 => f32::NAN,
                    _ => f32::NEG_INFINITY,
                })
                .collect(),
            // Random, with the best values in the row's last (partial) chunk.
            _ => (0..vocab).map(|_| normal(rng)).collect(),
        };
        if kind == 8 {
            let n = k.min(vocab);
            for (j, x) in row[vocab - n..].iter_mut().enumerate() {
                *x = 100.0 + (j % 3) as f32;
            }
        }
        row
    }

    /// Runs `rows` through the kernel with `plan` (or the automatic one), poisoned output first;
    /// checks every row against the reference.
    fn check(t: &mut TopK, rows: &[Vec<f32>], k: usize, plan: Option<TopKPlan>, what: &str) {
        let vocab = rows[0].len();
        let flat: Vec<f32> = rows.concat();
        let s = dev(t).stream().clone();
        let logits = s.clone_htod(&flat).unwrap();
        let mut out: DeviceVec<u32> = s.clone_htod(&vec![0x7fa5_a5a5u32; 2 * rows.len() * k]).unwrap();
        let took = t.run_packed(&mut out, &logits, rows.len(), vocab, k, plan).unwrap().unwrap();
        if let Some(p) = plan {
            assert_eq!(took, p);
        }
        let got = s.clone_dtoh(&out).unwrap();
        let (ids, bits) = got.split_at(rows.len() * k);
        for (r, row) in rows.iter().enumerate() {
            let (want_ids, want_bits) = reference(row, k);
            let g = r * k..(r + 1) * k;
            assert_eq!(ids[g.clone()], want_ids[..], "{what}: row {r}, plan {took:?}: ids");
            // NaN compares by class (the kernel writes the canonical quiet NaN for padding).
            let norm = |b: &[u32]| {
                b.iter().map(|&x| if f32::from_bits(x).is_nan() { u32::MAX } else { x }).collect::<Vec<_>>()
            };
            assert_eq!(norm(&bits[g]), norm(&want_bits), "{what}: row {r}, plan {took:?}: values");
        }
    }

    #[test]
    fn top_k_matches_the_reference_on_every_kind_of_row() {
        let test = "top_k_matches_the_reference_on_every_kind_of_row";
        let Some(k) = kernels(test) else { return };
        let mut guard = k.lock().unwrap_or_else(|p| p.into_inner());
        let t = &mut guard.0;
        let mut rng = StdRng::seed_from_u64(61);
        let mut cases = 0;
        for vocab in [1usize, 3, 1000, 4097, 49152, 50257, 128256] {
            for k in [1usize, 7, 64, 65, TOP_K_MAX] {
                // Every kind once, in a shuffled order, plus two plain rows.
                let rows: Vec<Vec<f32>> =
                    (0..KINDS + 2).map(|i| make_row(&mut rng, (i + vocab + k) % KINDS, vocab, k)).collect();
                check(t, &rows, k, None, &format!("vocab {vocab} k {k} auto"));
                for chunk in TOP_K_CHUNKS {
                    if vocab.div_ceil(chunk) * k > TOP_K_MERGE_CAP {
                        continue;
                    }
                    for prefilter in [false, true] {
                        let plan = TopKPlan { chunk, chunks: vocab.div_ceil(chunk), prefilter };
                        check(t, &rows, k, Some(plan), &format!("vocab {vocab} k {k} chunk {chunk}"));
                    }
                }
                cases += 1;
            }
        }
        assert_eq!(cases, 35);
    }

    #[test]
    fn top_k_of_many_rows_matches_the_reference() {
        let test = "top_k_of_many_rows_matches_the_reference";
        let Some(k) = kernels(test) else { return };
        let mut guard = k.lock().unwrap_or_else(|p| p.into_inner());
        let t = &mut guard.0;
        let mut rng = StdRng::seed_from_u64(62);
        for (vocab, nrows, k) in [(49152usize, 256usize, 65usize), (128256, 256, 65), (128256, 64, 8)] {
            let rows: Vec<Vec<f32>> = (0..nrows).map(|i| make_row(&mut rng, i % KINDS, vocab, k)).collect();
            check(t, &rows, k, None, &format!("{nrows} rows of {vocab}, k {k}"));
            // And with the other choice of prefilter.
            let mut plan = t.plan(nrows, vocab, k).unwrap();
            plan.prefilter = !plan.prefilter;
            check(t, &rows, k, Some(plan), &format!("{nrows} rows of {vocab}, k {k}, {plan:?}"));
        }
    }

    #[test]
    fn top_1_is_the_argmax_and_both_outputs_agree() {
        let test = "top_1_is_the_argmax_and_both_outputs_agree";
        let Some(kk) = kernels(test) else { return };
        let mut guard = kk.lock().unwrap_or_else(|p| p.into_inner());
        let (t, ops) = &mut *guard;
        let mut rng = StdRng::seed_from_u64(63);
        let (vocab, k) = (50257usize, 5usize);
        let rows: Vec<Vec<f32>> = (0..2 * KINDS).map(|i| make_row(&mut rng, i % KINDS, vocab, k)).collect();
        let n = rows.len();
        let s = dev(t).stream().clone();
        let logits = s.clone_htod(&rows.concat()).unwrap();
        let mut argmax = s.clone_htod(&vec![u32::MAX - 1; n]).unwrap();
        ops.argmax(&mut argmax, &logits, n, vocab).unwrap();
        let argmax = s.clone_dtoh(&argmax).unwrap();
        // The separate outputs and the packed one agree.
        let mut ids = s.clone_htod(&vec![7u32; n * k]).unwrap();
        let mut values = s.clone_htod(&vec![7f32; n * k]).unwrap();
        t.run(&mut ids, &mut values, &logits, n, vocab, k).unwrap();
        let (ids, values) = (s.clone_dtoh(&ids).unwrap(), s.clone_dtoh(&values).unwrap());
        let mut packed = s.clone_htod(&vec![9u32; 2 * n * k]).unwrap();
        t.run_packed(&mut packed, &logits, n, vocab, k, None).unwrap();
        let packed = s.clone_dtoh(&packed).unwrap();
        assert_eq!(packed[..n * k], ids[..]);
        let bits: Vec<u32> = values.iter().map(|v| if v.is_nan() { u32::MAX } else { v.to_bits() }).collect();
        let pbits: Vec<u32> =
            packed[n * k..].iter().map(|&b| if f32::from_bits(b).is_nan() { u32::MAX } else { b }).collect();
        assert_eq!(pbits, bits);
        let mut with_value = 0;
        for (r, row) in rows.iter().enumerate() {
            if row.iter().all(|x| x.is_nan()) {
                assert_eq!(ids[r * k], TOP_K_NONE, "row {r}: all NaN");
                assert_eq!(argmax[r], 0, "row {r}: argmax of all NaN");
                continue;
            }
            with_value += 1;
            assert_eq!(ids[r * k], argmax[r], "row {r}: the first entry is the argmax");
        }
        // Two rows of each kind: only the two all-NaN rows have no value.
        assert_eq!(with_value, n - 2);
    }

    #[test]
    fn bad_arguments_are_typed_errors() {
        let test = "bad_arguments_are_typed_errors";
        let Some(k) = kernels(test) else { return };
        let mut guard = k.lock().unwrap_or_else(|p| p.into_inner());
        let t = &mut guard.0;
        let s = dev(t).stream().clone();
        let logits = s.clone_htod(&vec![1f32; 4 * 100]).unwrap();
        let mut out = s.clone_htod(&vec![5u32; 2 * 4 * 8]).unwrap();
        // k = 0 and rows = 0 queue nothing.
        assert_eq!(t.run_packed(&mut out, &logits, 4, 100, 0, None).unwrap(), None);
        assert_eq!(t.run_packed(&mut out, &logits, 0, 100, 8, None).unwrap(), None);
        assert!(s.clone_dtoh(&out).unwrap().iter().all(|&x| x == 5));
        assert!(matches!(t.run_packed(&mut out, &logits, 4, 100, 9, None), Err(CudaError::Invalid(_))));
        let mut big = s.clone_htod(&vec![0u32; 2 * 4 * 200]).unwrap();
        assert!(matches!(t.run_packed(&mut big, &logits, 4, 100, 129, None), Err(CudaError::Unsupported(_))));
        assert!(matches!(t.run_packed(&mut out, &logits, 4, 101, 8, None), Err(CudaError::Invalid(_))));
        let wrong = TopKPlan { chunk: 1024, chunks: 2, prefilter: false };
        assert!(matches!(t.run_packed(&mut out, &logits, 4, 100, 8, Some(wrong)), Err(CudaError::Invalid(_))));
        let odd = TopKPlan { chunk: 1000, chunks: 1, prefilter: true };
        assert!(matches!(t.run_packed(&mut out, &logits, 4, 100, 8, Some(odd)), Err(CudaError::Invalid(_))));
    }
}
