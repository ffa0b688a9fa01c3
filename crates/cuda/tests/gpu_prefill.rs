//! The tensor-core causal prefill kernel (`pk_prefill_tc`, [`pagekv_cuda::PrefillAttention`])
//! against a scalar f64 oracle run over a host copy of the *same* device pages, on fresh random
//! inputs: f16 and bf16 pages, head_dim 64 and 128, GQA groups 1/3/4/8, several sequences per
//! call whose chunks end inside a block or on a block boundary, chunks after an existing prefix
//! (context > chunk), one-token chunks, block sizes 8/16/32, sliding windows on and off, pages
//! scattered over a pool whose spare blocks hold huge values, outputs poisoned with NaN.
//! Unsupported formats are a typed error.
//!
//! Without a CUDA device (or without the `cuda` feature) every test prints
//! `SKIPPED <test>: <reason>` on stderr and passes.

mod common;

#[cfg(not(feature = "cuda"))]
#[test]
fn gpu_prefill_tests_need_the_cuda_feature() {
    common::skip("gpu_prefill", "pagekv-cuda was built without the `cuda` feature");
}

#[cfg(feature = "cuda")]
mod gpu {
    use std::sync::Arc;

    use kvcache::{KvFormat, LayerView, PageGeometry, NULL_BLOCK};
    use pagekv_cuda::{prefill_tiles, CudaDevice, CudaError, DevicePages, PrefillAttention, PrefillBatch};
    use rand::rngs::StdRng;
    use rand::seq::SliceRandom;
    use rand::SeedableRng;

    use crate::common::{device, normal, rel_error, up};
    use std::io::Write;

    /// The oracle, one query row per token: row `t` (`queries`/`out` `[tokens, num_heads, d]`)
    /// sees keys `[max(0, C_t − W), C_t)` of its sequence's table, decoded with kvcache's codecs,
    /// two-pass softmax in f64.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        layer: &LayerView,
        queries: &[f32],
        num_heads: usize,
        tables: &[&[u32]],
        contexts: &[usize],
        scale: f32,
        window: Option<usize>,
        out: &mut [f32],
    ) {
        let (d, hkv, bs) = (layer.head_dim, layer.num_kv_heads, layer.block_size);
        let group = num_heads / hkv;
        let (mut k, mut v) = (vec![0f32; d], vec![0f32; d]); // [d]
        for (t, &ctx) in contexts.iter().enumerate() {
            let lo = window.map_or(0, |w| ctx.saturating_sub(w));
            for h in 0..hkv {
                let mut keys = Vec::with_capacity((ctx - lo) * d); // [ctx − lo, d]
                let mut values = Vec::with_capacity((ctx - lo) * d); // [ctx − lo, d]
                for pos in lo..ctx {
                    let slot = tables[t][pos / bs] as usize * bs + pos % bs;
                    layer.keys.decode(slot, h, &mut k);
                    layer.values.decode(slot, h, &mut v);
                    keys.extend_from_slice(&k);
                    values.extend_from_slice(&v);
                }
                for g in 0..group {
                    let row = (t * num_heads + h * group + g) * d;
                    let q = &queries[row..row + d];
                    let s: Vec<f64> = keys
                        .chunks(d)
                        .map(|k| q.iter().zip(k).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * scale as f64)
                        .collect();
                    let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let w: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
                    let sum: f64 = w.iter().sum();
                    for i in 0..d {
                        out[row + i] =
                            (w.iter().zip(values.chunks(d)).map(|(w, v)| w * v[i] as f64).sum::<f64>() / sum) as f32;
                    }
                }
            }
        }
    }

    /// One call: sequences given as (prefix already in the cache, new tokens of this chunk).
    #[derive(Clone, Debug)]
    struct Case {
        format: KvFormat,
        head_dim: usize,
        num_kv_heads: usize,
        group: usize,
        seqs: Vec<(usize, usize)>,
        window: Option<usize>,
        block_size: usize,
        seed: u64,
    }

    /// Relative error bound against the oracle over the same pages (the decode tests' bound).
    const BOUND: f32 = 1e-5;

    /// Runs `case`; returns the kernel's relative error.
    fn run_case(dev: &Arc<CudaDevice>, case: &Case) -> f32 {
        let mut rng = StdRng::seed_from_u64(case.seed);
        let (d, hkv, bs) = (case.head_dim, case.num_kv_heads, case.block_size);
        let needed: usize = case.seqs.iter().map(|&(p, n)| (p + n).div_ceil(bs)).sum();
        let num_blocks = needed + 5;
        let g = PageGeometry {
            num_layers: 1,
            num_blocks,
            block_size: bs,
            num_kv_heads: hkv,
            head_dim: d,
            format: case.format,
            rotation_seed: 0xFEED ^ case.seed,
        };
        let mut pages = DevicePages::new(dev.clone(), g).expect("device pages");
        let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
        ids.shuffle(&mut rng);
        let row = hkv * d;
        let spare: Vec<u32> =
            ids[needed..].iter().flat_map(|&b| (0..bs as u32).map(move |i| b * bs as u32 + i)).collect();
        let junk: Vec<f32> = (0..spare.len() * row).map(|_| 1e3 * normal(&mut rng)).collect();
        pages.try_write(0, &spare, &junk, &junk).expect("write junk");
        let mb = case.seqs.iter().map(|&(p, n)| (p + n).div_ceil(bs)).max().unwrap_or(1);
        let num_heads = hkv * case.group;
        let per_cta = PrefillAttention::tokens_per_tile(case.group);
        let (mut next, mut tok) = (0, 0);
        let mut tables = Vec::new(); // per sequence, mb entries
        let mut contexts = Vec::new(); // per token
        let mut token_seq = Vec::new(); // per token
        let mut tiles = Vec::new();
        for (s, &(prefix, n)) in case.seqs.iter().enumerate() {
            let ctx = prefix + n;
            let nb = ctx.div_ceil(bs);
            let mut table = ids[next..next + nb].to_vec();
            next += nb;
            let k: Vec<f32> = (0..ctx * row).map(|_| normal(&mut rng)).collect();
            let v: Vec<f32> = (0..ctx * row).map(|_| normal(&mut rng)).collect();
            let slots: Vec<u32> = (0..ctx).map(|p| table[p / bs] * bs as u32 + (p % bs) as u32).collect();
            pages.try_write(0, &slots, &k, &v).expect("write");
            if let Some(w) = case.window {
                // Blocks before the first query token's window are gone.
                let lo = (prefix + 1).saturating_sub(w);
                for e in table.iter_mut().take(lo / bs) {
                    *e = NULL_BLOCK;
                }
            }
            table.resize(mb, NULL_BLOCK);
            tables.push(table);
            prefill_tiles(tok, n, per_cta, &mut tiles);
            for p in prefix..ctx {
                contexts.push(p + 1);
                token_seq.push(s);
            }
            tok += n;
        }
        let num_tokens = tok;
        let queries: Vec<f32> = (0..num_tokens * num_heads * d).map(|_| 3.0 * normal(&mut rng)).collect();
        let scale = 1.0 / (d as f32).sqrt();
        let host = pages.download_layer(0).expect("download");
        let view = host.view();
        let token_tables: Vec<&[u32]> = token_seq.iter().map(|&s| &tables[s][..]).collect();
        let mut want = vec![f32::NAN; queries.len()];
        reference(&view, &queries, num_heads, &token_tables, &contexts, scale, case.window, &mut want);
        assert!(want.iter().all(|x| x.is_finite()), "{case:?}: reference not finite");

        let flat: Vec<u32> = token_seq.iter().flat_map(|&s| tables[s].iter().copied()).collect(); // [tokens, mb]
        let lens: Vec<u32> = contexts.iter().map(|&c| c as u32).collect();
        let (tables_d, lens_d, tiles_d, q_d) = (up(dev, &flat), up(dev, &lens), up(dev, &tiles), up(dev, &queries));
        let mut out = up(dev, &vec![f32::NAN; queries.len()]);
        let mut attn = PrefillAttention::new(dev.clone());
        assert!(attn.serves(&pages, num_heads), "{case:?}");
        let b = PrefillBatch {
            queries: &q_d,
            num_tokens,
            num_heads,
            block_tables: &tables_d,
            max_blocks_per_seq: mb,
            context_lens: &lens_d,
            tiles: &tiles_d,
            num_tiles: tiles.len() / 2,
            scale,
            sliding_window: case.window,
        };
        attn.forward(&pages, 0, &b, &mut out).unwrap_or_else(|e| panic!("{case:?}: {e}"));
        dev.synchronize().unwrap_or_else(|e| panic!("{case:?}: {e}"));
        let got = dev.stream().clone_dtoh(&out).expect("download");
        rel_error(&got, &want, d)
    }

    fn check_all(test: &str, dev: &Arc<CudaDevice>, cases: &[Case]) {
        let mut failures = Vec::new();
        let mut worst = std::collections::BTreeMap::<String, f32>::new();
        for case in cases {
            let err = run_case(dev, case);
            let key = format!("{} d={} g={} w={:?}", case.format, case.head_dim, case.group, case.window.is_some());
            let w = worst.entry(key).or_insert(0.0);
            *w = w.max(err);
            if err.is_nan() || err > BOUND {
                failures.push(format!("{case:?}: relative error {err:e} > {BOUND:e}"));
            }
        }
        let mut report = format!("{test}: {} cases; worst relative error:", cases.len());
        for (k, v) in &worst {
            report.push_str(&format!("\n  {k:<32} {v:.2e}"));
        }
        let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("{report}\n").as_bytes());
        assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    }

    #[test]
    fn prefill_matches_the_reference() {
        let Some(dev) = device("prefill_matches_the_reference") else { return };
        let mut cases = Vec::new();
        let mut seed = 1;
        for format in [KvFormat::Bf16, KvFormat::F16] {
            for (d, hkv, groups) in [(128usize, 2usize, &[1usize, 4, 8][..]), (64, 3, &[1, 3, 4, 8][..])] {
                for &group in groups {
                    for window in [None, Some(40)] {
                        for bs in [16usize, 8, 32] {
                            seed += 1;
                            cases.push(Case {
                                format,
                                head_dim: d,
                                num_kv_heads: hkv,
                                group,
                                // Ends inside a block; on a block boundary; after a prefix
                                // (context > chunk); a one-token chunk; a long chunk.
                                seqs: vec![(0, 37), (0, 64), (100, 29), (5, 1), (19, 150)],
                                window,
                                block_size: bs,
                                seed,
                            });
                        }
                    }
                }
            }
        }
        check_all("prefill_matches_the_reference", &dev, &cases);
    }

    /// Kernel timing, not a check (run with `PAGEKV_PREFILL_BENCH=1`): one chunk of 8–512 tokens
    /// of Llama-3-8B's attention shape (32 q / 8 kv heads × 128, bf16, block 16) ending at
    /// context 1024 or 4096, the prefill kernel vs the decode kernel with one row per token (the
    /// path before it, with its automatic route); medians of 20 launches, one JSON line each.
    /// The crossover sets `CudaTuning::prefill_min_tokens`.
    #[test]
    fn prefill_kernel_timing() {
        if std::env::var("PAGEKV_PREFILL_BENCH").map_or(true, |v| v != "1") {
            return;
        }
        let Some(dev) = device("prefill_kernel_timing") else { return };
        use pagekv_cuda::{DecodeAttention, DecodeBatch};
        let (d, hkv, group, bs) = (128usize, 8usize, 4usize, 16usize);
        let num_heads = hkv * group;
        for (ctx, chunk) in
            [1024usize, 4096].into_iter().flat_map(|c| [8usize, 16, 32, 64, 128, 512].map(move |n| (c, n)))
        {
            let blocks = ctx / bs;
            let g = PageGeometry {
                num_layers: 1,
                num_blocks: blocks,
                block_size: bs,
                num_kv_heads: hkv,
                head_dim: d,
                format: KvFormat::Bf16,
                rotation_seed: 0,
            };
            let mut rng = StdRng::seed_from_u64(ctx as u64);
            let mut pages = DevicePages::new(dev.clone(), g).expect("pages");
            let mut table: Vec<u32> = (0..blocks as u32).collect();
            table.shuffle(&mut rng);
            let slots: Vec<u32> = (0..ctx).map(|p| table[p / bs] * bs as u32 + (p % bs) as u32).collect();
            let kv: Vec<f32> = (0..ctx * hkv * d).map(|_| normal(&mut rng)).collect();
            pages.try_write(0, &slots, &kv, &kv).expect("write");
            let flat: Vec<u32> = (0..chunk).flat_map(|_| table.iter().copied()).collect();
            let lens: Vec<u32> = (ctx - chunk..ctx).map(|p| p as u32 + 1).collect();
            let mut tiles = Vec::new();
            prefill_tiles(0, chunk, PrefillAttention::tokens_per_tile(group), &mut tiles);
            let q: Vec<f32> = (0..chunk * num_heads * d).map(|_| normal(&mut rng)).collect();
            let (tables_d, lens_d, tiles_d, q_d) = (up(&dev, &flat), up(&dev, &lens), up(&dev, &tiles), up(&dev, &q));
            let mut out = up(&dev, &vec![0f32; q.len()]);
            let mut pre = PrefillAttention::new(dev.clone());
            let mut dec = DecodeAttention::new(dev.clone());
            let scale = 1.0 / (d as f32).sqrt();
            let route = dec.auto_route(&pages, num_heads, chunk, ctx);
            let time = |f: &mut dyn FnMut()| {
                let mut ts = Vec::new();
                for i in 0..23 {
                    dev.synchronize().expect("sync");
                    let t = std::time::Instant::now();
                    f();
                    dev.synchronize().expect("sync");
                    if i >= 3 {
                        ts.push(t.elapsed().as_secs_f64() * 1e6);
                    }
                }
                ts.sort_by(f64::total_cmp);
                ts[ts.len() / 2]
            };
            let t_pre = time(&mut || {
                let b = PrefillBatch {
                    queries: &q_d,
                    num_tokens: chunk,
                    num_heads,
                    block_tables: &tables_d,
                    max_blocks_per_seq: blocks,
                    context_lens: &lens_d,
                    tiles: &tiles_d,
                    num_tiles: tiles.len() / 2,
                    scale,
                    sliding_window: None,
                };
                pre.forward(&pages, 0, &b, &mut out).expect("prefill");
            });
            let t_dec = time(&mut || {
                let b = DecodeBatch {
                    queries: &q_d,
                    num_seqs: chunk,
                    num_heads,
                    block_tables: &tables_d,
                    max_blocks_per_seq: blocks,
                    context_lens: &lens_d,
                    max_context_len: ctx,
                    scale,
                    sliding_window: None,
                };
                dec.forward(&pages, 0, &b, route, &mut out).expect("decode");
            });
            // Useful attention flops (QK and PV over the causal triangle of the chunk).
            let pairs: f64 = lens.iter().map(|&c| c as f64).sum();
            let flops = 4.0 * pairs * (num_heads * d) as f64;
            let _ = writeln!(
                std::io::stderr(),
                "{{\"bench\": \"prefill_kernel\", \"context\": {ctx}, \"chunk\": {chunk}, \"prefill_us\": {t_pre:.1}, \"decode_rows_us\": {t_dec:.1}, \"prefill_tflops\": {:.1}, \"decode_rows_tflops\": {:.1}}}",
                flops / t_pre / 1e6,
                flops / t_dec / 1e6
            );
        }
    }

    #[test]
    fn prefill_of_unsupported_formats_is_a_typed_error() {
        let Some(dev) = device("prefill_of_unsupported_formats_is_a_typed_error") else { return };
        let g = PageGeometry {
            num_layers: 1,
            num_blocks: 4,
            block_size: 16,
            num_kv_heads: 2,
            head_dim: 128,
            format: KvFormat::Q8,
            rotation_seed: 0,
        };
        let pages = DevicePages::new(dev.clone(), g).expect("pages");
        let mut attn = PrefillAttention::new(dev.clone());
        assert!(!attn.serves(&pages, 8));
        let x = up(&dev, &vec![0f32; 8 * 128]);
        let u = up(&dev, &[0u32; 4]);
        let b = PrefillBatch {
            queries: &x,
            num_tokens: 1,
            num_heads: 8,
            block_tables: &u,
            max_blocks_per_seq: 1,
            context_lens: &u,
            tiles: &u,
            num_tiles: 1,
            scale: 1.0,
            sliding_window: None,
        };
        let mut out = up(&dev, &vec![0f32; 8 * 128]);
        assert!(matches!(attn.forward(&pages, 0, &b, &mut out), Err(CudaError::Unsupported(_))));
    }
}
