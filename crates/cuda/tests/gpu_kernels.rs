//! The CUDA kernels against the CPU references, on fresh random inputs:
//! - cache write: the codes and scales the GPU stores equal, byte for byte, what
//!   [`kvcache::HostPages`] stores for the same tokens (every format, rotated ones too);
//!   `copy_block` and `PageStore::read` agree with the host as well; the model step's
//!   one-launch attention input (`DevicePages::write_qkv`) equals `ModelOps::qkv_rope` followed
//!   by a cache write;
//! - decode attention: `primitive` and `partitioned`, on every kernel that serves the format
//!   (tensor-core and SIMT), against a scalar f64 reference ([`gpu::reference`], keys and values
//!   decoded by kvcache's codecs) run over a host copy of the *same* device pages, for every
//!   format, GQA groups 1/3/4/8, sliding windows, odd context lengths, block sizes 8/16/32,
//!   pages scattered over a pool whose spare blocks hold huge values, outputs poisoned with NaN
//!   before each run;
//! - turbo's sub-scaled values (`Codec::LloydMaxSub`): every code and scale slot as the host's,
//!   at the edges of the scales too (zero, near-zero and huge sub-groups), and decode over them;
//! - bad input is a typed error, never a panic.
//!
//! Without a CUDA device (or without the `cuda` feature) every test prints
//! `SKIPPED <test>: <reason>` on stderr, uncaptured so `cargo test` shows it, and passes.

mod common;

#[cfg(not(feature = "cuda"))]
#[test]
fn gpu_tests_need_the_cuda_feature() {
    common::skip("gpu_kernels", "pagekv-cuda was built without the `cuda` feature");
    assert!(!pagekv_cuda::cuda_available());
}

#[cfg(feature = "cuda")]
mod gpu {
    use std::sync::Arc;

    use kvcache::format::turbo_sub;
    use kvcache::{HostPages, KvFormat, LayerView, PageGeometry, PageStore, NULL_BLOCK};
    use pagekv_cuda::{
        CudaDevice, CudaError, DecodeAttention, DecodeBatch, DecodeGrid, DecodeKernel, DecodeRoute, DevicePages,
        ModelOps, QkvRope, RopeParams,
    };
    use rand::rngs::StdRng;
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};

    use crate::common::{device, down, normal, rel_error, up};

    /// Every codec on both sides: floats, q8, q4 with and without rotation, and turbo at every
    /// bit width for K and V.
    const FORMATS: [KvFormat; 10] = [
        KvFormat::F32,
        KvFormat::F16,
        KvFormat::Bf16,
        KvFormat::Q8,
        KvFormat::Q4 { rotate: false },
        KvFormat::Q4 { rotate: true },
        KvFormat::Turbo { k_bits: 8, v_bits: 3 },
        KvFormat::Turbo { k_bits: 4, v_bits: 2 },
        KvFormat::Turbo { k_bits: 2, v_bits: 4 },
        KvFormat::Turbo { k_bits: 3, v_bits: 8 },
    ];

    /// turbo's sub-scaled values (V at 2–4 bits, `Codec::LloydMaxSub`: one f16 `D` per head
    /// vector and a 4-bit multiplier per 8 values) beside its unchanged paths (K at every width,
    /// V at 8 bits).
    const TURBO: [KvFormat; 4] = [
        KvFormat::Turbo { k_bits: 8, v_bits: 3 },
        KvFormat::Turbo { k_bits: 4, v_bits: 4 },
        KvFormat::Turbo { k_bits: 2, v_bits: 2 },
        KvFormat::Turbo { k_bits: 8, v_bits: 8 },
    ];

    /// Head vectors with a mix of magnitudes per group (so scales differ), a few outliers,
    /// exact ties of magnitude (q4's first-max rule) and one all-zero head vector.
    fn tokens(rng: &mut StdRng, n: usize, row: usize, d: usize) -> Vec<f32> {
        let mut x: Vec<f32> = (0..n * row).map(|_| normal(rng) * (0.1 + 2.0 * rng.gen::<f32>())).collect();
        for _ in 0..n.max(1) {
            let i = rng.gen_range(0..n * row);
            x[i] *= 40.0;
        }
        if n * row >= 2 * d {
            // A tie of magnitude inside a group: +a then −a.
            let g = rng.gen_range(0..n * row / 32) * 32;
            x[g + 3] = 5.5;
            x[g + 17] = -5.5;
            // One head vector of zeros (scale 0).
            let h = rng.gen_range(0..n * row / d) * d;
            x[h..h + d].fill(0.0);
        }
        x
    }

    fn geometry(
        format: KvFormat,
        layers: usize,
        blocks: usize,
        bs: usize,
        heads: usize,
        d: usize,
        seed: u64,
    ) -> PageGeometry {
        PageGeometry {
            num_layers: layers,
            num_blocks: blocks,
            block_size: bs,
            num_kv_heads: heads,
            head_dim: d,
            format,
            rotation_seed: 0xC0DA ^ seed,
        }
    }

    /// Asserts that device layer `layer` holds exactly the host's bytes.
    fn assert_same_pages(dev_pages: &DevicePages, host: &HostPages, layer: usize, what: &str) {
        let got = dev_pages.download_layer(layer).expect("download layer");
        let want = host.layer(layer);
        for (side, g_codes, w_codes, g_scales, w_scales) in [
            ("K", &got.k_codes, want.keys.codes, &got.k_scales, want.keys.scales),
            ("V", &got.v_codes, want.values.codes, &got.v_scales, want.values.scales),
        ] {
            assert_eq!(g_codes.len(), w_codes.len(), "{what}: {side} code length");
            if let Some(i) = g_codes.iter().zip(w_codes).position(|(a, b)| a != b) {
                panic!(
                    "{what}: {side} codes differ first at byte {i}: gpu {:#04x}, host {:#04x}",
                    g_codes[i], w_codes[i]
                );
            }
            assert_eq!(g_scales.len(), w_scales.len(), "{what}: {side} scale count");
            if let Some(i) = g_scales.iter().zip(w_scales).position(|(a, b)| a.to_bits() != b.to_bits()) {
                panic!("{what}: {side} scales differ first at {i}: gpu {}, host {}", g_scales[i], w_scales[i]);
            }
        }
    }

    #[test]
    fn cache_write_stores_the_host_codes_bit_for_bit() {
        let Some(dev) = device("cache_write_stores_the_host_codes_bit_for_bit") else { return };
        let mut rng = StdRng::seed_from_u64(0xCAC4E);
        let mut checked = 0;
        for format in FORMATS {
            for d in [64usize, 80, 96, 128, 256] {
                if pagekv_cuda::shapes::check_supported(format, d).is_err() {
                    continue; // quantized formats need a multiple of 32 on the GPU
                }
                let (bs, heads, blocks) = (16, 3, 7);
                let g = geometry(format, 2, blocks, bs, heads, d, checked);
                let mut host = HostPages::new(g.clone());
                let mut gpu = DevicePages::new(dev.clone(), g.clone()).expect("device pages");
                let row = heads * d;
                // Two writes per layer into scattered slots (the second overwrites some).
                for layer in 0..2 {
                    for _ in 0..2 {
                        let mut slots: Vec<u32> = (0..g.slots() as u32).collect();
                        slots.shuffle(&mut rng);
                        slots.truncate(rng.gen_range(1..=g.slots() / 2));
                        let n = slots.len();
                        let (k, v) = (tokens(&mut rng, n, row, d), tokens(&mut rng, n, row, d));
                        host.write(layer, &slots, &k, &v);
                        gpu.try_write(layer, &slots, &k, &v).expect("write");
                    }
                }
                // Copy-on-write of a block, then a read back through PageStore::read.
                host.copy_block(2, 5);
                gpu.try_copy_block(2, 5).expect("copy_block");
                for layer in 0..2 {
                    assert_same_pages(&gpu, &host, layer, &format!("{format} d={d} layer {layer}"));
                }
                let (mut hk, mut hv) = (vec![0f32; row], vec![0f32; row]);
                let (mut gk, mut gv) = (vec![f32::NAN; row], vec![f32::NAN; row]);
                let slot = (5 * bs + 3) as u32;
                host.read(1, slot, &mut hk, &mut hv);
                gpu.read(1, slot, &mut gk, &mut gv);
                assert_eq!(hk, gk, "{format} d={d}: read keys");
                assert_eq!(hv, gv, "{format} d={d}: read values");
                assert!(gpu.take_error().is_none());
                checked += 1;
            }
        }
        // 10 formats × {64, 96, 128, 256} + 3 float formats × {80}.
        assert_eq!(checked, 43);
    }

    #[test]
    fn cache_write_from_device_buffers_matches_host_writes() {
        let Some(dev) = device("cache_write_from_device_buffers_matches_host_writes") else { return };
        let mut rng = StdRng::seed_from_u64(77);
        for format in [KvFormat::Bf16, KvFormat::Q8, KvFormat::TURBO_DEFAULT] {
            let g = geometry(format, 2, 9, 8, 2, 128, 5);
            let mut host = HostPages::new(g.clone());
            let mut gpu = DevicePages::new(dev.clone(), g.clone()).expect("device pages");
            let mut slots: Vec<u32> = (0..g.slots() as u32).collect();
            slots.shuffle(&mut rng);
            slots.truncate(29);
            let (k, v) = (tokens(&mut rng, 29, 256, 128), tokens(&mut rng, 29, 256, 128));
            host.write(0, &slots, &k, &v);
            let (ds, dk, dv) = (up(&dev, &slots), up(&dev, &k), up(&dev, &v));
            gpu.write_device(0, &ds, &dk, &dv, 29).expect("write_device");
            assert_same_pages(&gpu, &host, 0, &format!("{format} write_device"));
            // The same through the programmatic launch (the model step's), into layer 1.
            host.write(1, &slots, &k, &v);
            gpu.set_programmatic_writes(true);
            gpu.write_device(1, &ds, &dk, &dv, 29).expect("programmatic write_device");
            assert_same_pages(&gpu, &host, 1, &format!("{format} programmatic write_device"));
        }
    }

    /// The model step's one-launch attention input (`DevicePages::write_qkv`) equals its two
    /// launches: the queries bit for bit those of `ModelOps::qkv_rope`, the pages byte for byte
    /// the host's writes of its keys and values — every format, Llama 3's, SmolLM2's, Qwen2's
    /// (biases, centred keys) and Gemma 3's (q/k norms, scaled queries, head_dim 256) heads,
    /// both pair styles, frequency factors, plain and programmatic launches, scattered slots.
    /// Mismatched shapes are errors.
    #[test]
    fn one_launch_qkv_write_equals_qkv_rope_then_cache_write() {
        let Some(dev) = device("one_launch_qkv_write_equals_qkv_rope_then_cache_write") else { return };
        let ops = ModelOps::new(dev.clone()).expect("model kernels load");
        let mut rng = StdRng::seed_from_u64(0xB0B);
        // (heads, kv heads, head_dim, rope_dims, neox, bias, norms, factors, q_scale, centred keys)
        let cases = [
            (32usize, 8usize, 128usize, 128usize, false, false, false, true, 1.0f32, false),
            (9, 3, 64, 64, false, false, false, false, 1.0, false),
            (12, 2, 128, 128, true, true, false, false, 1.0, true),
            (4, 1, 256, 256, true, false, true, false, 0.0625, false),
            (4, 2, 128, 64, true, true, true, false, 1.0, false),
        ];
        let mut checked = 0;
        for format in FORMATS {
            for (ci, &(nh, nkv, d, rd, neox, with_bias, with_norms, with_factors, q_scale, center)) in
                cases.iter().enumerate()
            {
                let (n, width) = (7, (nh + 2 * nkv) * d);
                let normals = |rng: &mut StdRng, len: usize| -> Vec<f32> { (0..len).map(|_| normal(rng)).collect() };
                let qkv = normals(&mut rng, n * width);
                let bias = normals(&mut rng, width);
                let (qn, kn) = (normals(&mut rng, d), normals(&mut rng, d));
                let factors: Vec<f32> = (0..rd / 2).map(|_| rng.gen_range(1.0f32..8.0)).collect();
                let positions: Vec<u32> = (0..n).map(|_| rng.gen_range(0..40_000)).collect();
                let p = RopeParams {
                    num_heads: nh,
                    num_kv_heads: nkv,
                    head_dim: d,
                    rope_dims: rd,
                    neox,
                    theta_scale: 500000f32.powf(-2.0 / rd as f32),
                    freq_scale: 1.0,
                    eps: 1e-6,
                    q_round: [0, 1, 2][ci % 3],
                    q_scale,
                };
                let (qkv_d, bias_d, qn_d, kn_d, f_d, pos_d) = (
                    up(&dev, &qkv),
                    up(&dev, &bias),
                    up(&dev, &qn),
                    up(&dev, &kn),
                    up(&dev, &factors),
                    up(&dev, &positions),
                );
                let a = QkvRope {
                    qkv: &qkv_d,
                    bias: with_bias.then_some(&bias_d),
                    q_norm: with_norms.then_some(&qn_d),
                    k_norm: with_norms.then_some(&kn_d),
                    factors: with_factors.then_some(&f_d),
                    positions: &pos_d,
                    center_keys: center,
                };
                // The two launches: the f32 heads, then the host's write of the keys and values.
                let nan = |len: usize| up(&dev, &vec![f32::NAN; len]);
                let (mut q2, mut k2, mut v2) = (nan(n * nh * d), nan(n * nkv * d), nan(n * nkv * d));
                ops.qkv_rope(&mut q2, &mut k2, &mut v2, &a, &p, n).expect("qkv_rope");
                let g = geometry(format, 2, 6, 8, nkv, d, ci as u64);
                let mut slots: Vec<u32> = (0..g.slots() as u32).collect();
                slots.shuffle(&mut rng);
                slots.truncate(n);
                let mut host = HostPages::new(g.clone());
                host.write(ci % 2, &slots, &down(&dev, &k2), &down(&dev, &v2));
                // The one launch.
                let mut gpu = DevicePages::new(dev.clone(), g.clone()).expect("device pages");
                gpu.set_programmatic_writes(ci % 2 == 1);
                let mut q1 = nan(n * nh * d);
                gpu.write_qkv(ci % 2, &up(&dev, &slots), &mut q1, &a, &p, n).expect("write_qkv");
                let what = format!("{format} case {ci}");
                let (q1, q2) = (down(&dev, &q1), down(&dev, &q2));
                if let Some(i) = q1.iter().zip(&q2).position(|(a, b)| a.to_bits() != b.to_bits()) {
                    panic!("{what}: query value {i} differs: one launch {}, two launches {}", q1[i], q2[i]);
                }
                assert_same_pages(&gpu, &host, ci % 2, &what);
                assert!(gpu.take_error().is_none());
                // A head shape that does not fit the pages, an odd rope_dims.
                let ds = up(&dev, &slots);
                let mut q = nan(n * nh * d);
                for bad in
                    [RopeParams { head_dim: d / 2, rope_dims: d / 2, ..p }, RopeParams { rope_dims: rd - 1, ..p }]
                {
                    let r = gpu.write_qkv(0, &ds, &mut q, &a, &bad, n);
                    assert!(matches!(r, Err(CudaError::Invalid(_))), "{what}: {bad:?} gave {r:?}");
                }
                checked += 1;
            }
        }
        assert_eq!(checked, FORMATS.len() * cases.len());
    }

    /// turbo's values: the GPU stores every code and every scale slot (`D` and the packed
    /// multipliers of sub-scaled values) as the host does, at head_dim 64, 96 and 128, over
    /// three writes into scattered slots; and the multipliers chosen are not all alike.
    #[test]
    fn turbo_values_write_the_host_codes_and_every_scale_slot() {
        let Some(dev) = device("turbo_values_write_the_host_codes_and_every_scale_slot") else { return };
        let mut rng = StdRng::seed_from_u64(0x5CA1E);
        for (i, format) in TURBO.into_iter().enumerate() {
            for d in [64usize, 96, 128] {
                let KvFormat::Turbo { v_bits, .. } = format else { unreachable!() };
                let sub = v_bits <= 4;
                let vc = format.value_codec();
                assert_eq!(vc.scales(d), if sub { 1 + d / 32 } else { d / 32 }, "{format} d={d}: V slots");
                let (bs, heads, blocks) = (16, 3, 7);
                let g = geometry(format, 1, blocks, bs, heads, d, 40 + i as u64);
                let mut host = HostPages::new(g.clone());
                let mut gpu = DevicePages::new(dev.clone(), g.clone()).expect("device pages");
                let row = heads * d;
                for _ in 0..3 {
                    let mut slots: Vec<u32> = (0..g.slots() as u32).collect();
                    slots.shuffle(&mut rng);
                    slots.truncate(rng.gen_range(g.slots() / 4..=g.slots() / 2));
                    let n = slots.len();
                    let (k, v) = (tokens(&mut rng, n, row, d), tokens(&mut rng, n, row, d));
                    host.write(0, &slots, &k, &v);
                    gpu.try_write(0, &slots, &k, &v).expect("write");
                }
                assert_same_pages(&gpu, &host, 0, &format!("{format} d={d}"));
                if sub {
                    let values = host.layer(0).values;
                    let mut seen = [false; 16];
                    for head in values.scales.chunks(values.n_scales) {
                        for j in 0..d / turbo_sub::SUB {
                            seen[turbo_sub::multiplier(head, j) as usize] = true;
                        }
                    }
                    let distinct = seen.iter().filter(|&&s| s).count();
                    assert!(distinct >= 6, "{format} d={d}: only {distinct} distinct multipliers");
                }
            }
        }
    }

    /// Rotated value vectors (the sub-scaled encoder's input) at the edges of the scales:
    /// `[kind][head_dim]`, each to be written as its inverse rotation. At head_dim 64 the rotation
    /// (norm 1/8) is exact, so zeros stay zeros; at 128 they come back as ~1e-7 of the vector.
    fn edge_vectors(rng: &mut StdRng, d: usize) -> Vec<Vec<f32>> {
        let live = [1.0f32, -2.0, 0.5, 3.0, -1.0, 0.25, -0.75, 2.0];
        let mut out = Vec::new();
        // 0: one live sub-group among all-zero ones (they take q = 0).
        let mut y = vec![0f32; d];
        y[8..16].copy_from_slice(&live);
        out.push(y);
        // 1: one huge sub-group (D clamped to 65504) beside tiny and zero ones.
        let mut y = vec![0f32; d];
        for i in 0..8 {
            y[i] = 2e6 * live[i];
            y[16 + i] = 1e-3 * live[i];
        }
        out.push(y);
        // 2: near-zero everywhere (D an f16 subnormal).
        out.push((0..d).map(|_| 1e-6 * normal(rng)).collect());
        // 3: below f16's range (D = 0: every value decodes to 0).
        out.push((0..d).map(|_| 1e-10 * normal(rng)).collect());
        // 4: magnitudes stepping by 10 from sub-group to sub-group.
        out.push((0..d).map(|i| 10f32.powi((i / 8 % 8) as i32 - 4) * normal(rng)).collect());
        // 5: a constant sub-group, one with a lone spike, the rest normal.
        let mut y: Vec<f32> = (0..d).map(|_| normal(rng)).collect();
        y[..8].fill(0.75);
        y[8..16].fill(0.0);
        y[11] = -30.0;
        out.push(y);
        // 6: a value whose square overflows f32 (every error of its sub-group infinite: q = 0).
        let mut y = vec![0f32; d];
        y[5] = 1e20;
        y[40] = -3.0;
        out.push(y);
        out
    }

    /// Sub-scaled values at the edges of their scales ([`edge_vectors`]): the GPU stores the
    /// host's codes and slots byte for byte, the edges land where meant (head_dim 64: q = 0 for
    /// zero sub-groups, D = 65504 when clamped, D = 0 below f16), and decode attention over pages
    /// full of them matches the reference on both routes.
    #[test]
    fn turbo_sub_scaled_values_at_zero_tiny_and_huge_magnitudes() {
        let Some(dev) = device("turbo_sub_scaled_values_at_zero_tiny_and_huge_magnitudes") else { return };
        let mut rng = StdRng::seed_from_u64(0xED6E);
        let mut worst = 0f32;
        for (i, format) in TURBO[..3].iter().copied().enumerate() {
            for d in [64usize, 128] {
                let heads = 2;
                let g = geometry(format, 1, 4, 16, heads, d, 70 + i as u64);
                let mut host = HostPages::new(g.clone());
                let mut gpu = DevicePages::new(dev.clone(), g.clone()).expect("device pages");
                let edges = edge_vectors(&mut rng, d);
                let rotation = host.layer(0).rotation.expect("turbo is rotated").clone();
                // Token t, head h holds edge (t + h) % kinds; keys are plain normals.
                let n = 2 * edges.len();
                let mut v = vec![0f32; n * heads * d];
                for (c, chunk) in v.chunks_mut(d).enumerate() {
                    chunk.copy_from_slice(&edges[(c / heads + c % heads) % edges.len()]);
                    rotation.apply_inverse(chunk);
                }
                let k: Vec<f32> = (0..n * heads * d).map(|_| normal(&mut rng)).collect();
                let mut slots: Vec<u32> = (0..g.slots() as u32).collect();
                slots.shuffle(&mut rng);
                slots.truncate(n);
                host.write(0, &slots, &k, &v);
                gpu.try_write(0, &slots, &k, &v).expect("write");
                assert_same_pages(&gpu, &host, 0, &format!("{format} d={d} edges"));
                if d == 64 {
                    let values = host.layer(0).values;
                    let at = |kind: usize| {
                        let t = (0..n).find(|t| t % edges.len() == kind).expect("token");
                        values.head_scales(slots[t] as usize, 0)
                    };
                    let q = |s: &[half::f16]| (0..8).map(|j| turbo_sub::multiplier(s, j)).collect::<Vec<_>>();
                    let zeros = q(at(0)).iter().enumerate().filter(|&(j, &m)| j != 1 && m == 0).count();
                    assert_eq!(zeros, 7, "{format}: zero sub-groups take q = 0 ({:?})", q(at(0)));
                    assert_eq!(at(1)[0], half::f16::MAX, "{format}: D clamped");
                    assert_eq!(at(3)[0].to_f32(), 0.0, "{format}: D below f16");
                    assert_eq!(q(at(6))[0], 0, "{format}: an overflowing sub-group takes q = 0");
                }
                // Decode over pages whose visible values are all edges (two sequences, GQA 4,
                // a window), against the reference over the same pages.
                let case = Case {
                    format,
                    head_dim: d,
                    num_kv_heads: heads,
                    group: 4,
                    contexts: vec![45, 23],
                    window: Some(40),
                    block_size: 16,
                    seed: 90 + i as u64 + d as u64,
                    rounded_queries: false,
                };
                let mut built = build(&dev, &case);
                for (seq, &ctx) in case.contexts.iter().enumerate() {
                    let table = &built.tables[seq];
                    let pos: Vec<usize> = (0..ctx).filter(|p| table[p / 16] != NULL_BLOCK).collect();
                    let slots: Vec<u32> = pos.iter().map(|&p| table[p / 16] * 16 + (p % 16) as u32).collect();
                    let mut v = vec![0f32; pos.len() * heads * d];
                    for (c, chunk) in v.chunks_mut(d).enumerate() {
                        chunk.copy_from_slice(&edges[(c / heads + c % heads + seq) % edges.len()]);
                        rotation.apply_inverse(chunk);
                    }
                    let k: Vec<f32> = (0..v.len()).map(|_| normal(&mut rng)).collect();
                    built.pages.try_write(0, &slots, &k, &v).expect("write edges");
                }
                for (kernel, label, err) in run_built(&dev, &case, &built, &[DecodeRoute::Primitive, PART(16)]) {
                    assert!(err <= bound(format), "{format} d={d} {kernel} {label}: relative error {err:e}");
                    worst = worst.max(err);
                }
            }
        }
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            format!("turbo_sub_edges: worst decode relative error {worst:.2e}\n").as_bytes(),
        );
    }

    #[test]
    fn bad_page_calls_are_typed_errors() {
        let Some(dev) = device("bad_page_calls_are_typed_errors") else { return };
        let g = geometry(KvFormat::Q8, 1, 4, 16, 2, 64, 0);
        let mut gpu = DevicePages::new(dev.clone(), g.clone()).expect("device pages");
        let row = 2 * 64;
        let x = vec![1.0f32; row];
        assert!(matches!(gpu.try_write(0, &[64], &x, &x), Err(CudaError::Invalid(_))), "slot out of range");
        assert!(matches!(gpu.try_write(1, &[0], &x, &x), Err(CudaError::Invalid(_))), "layer out of range");
        assert!(matches!(gpu.try_write(0, &[0, 1], &x, &x), Err(CudaError::Invalid(_))), "short keys");
        assert!(matches!(gpu.try_copy_block(0, 4), Err(CudaError::Invalid(_))), "block out of range");
        // Through PageStore the first error is kept for take_error.
        gpu.write(0, &[99], &x, &x);
        assert!(matches!(gpu.take_error(), Some(CudaError::Invalid(_))));
        assert!(gpu.take_error().is_none());
        let (mut k, mut v) = (vec![0f32; row], vec![0f32; row]);
        gpu.read(0, 1000, &mut k, &mut v);
        assert!(k.iter().all(|x| x.is_nan()), "a failed read leaves NaN");
        let bad = PageGeometry { block_size: 12, ..g.clone() };
        assert!(matches!(DevicePages::new(dev.clone(), bad), Err(CudaError::Invalid(_))));
        let bad = PageGeometry { head_dim: 80, ..g.clone() };
        assert!(matches!(DevicePages::new(dev.clone(), bad), Err(CudaError::Unsupported(_))));
        let count = pagekv_cuda::probe().expect("probe");
        assert!(matches!(CudaDevice::new(count + 3, dev.tuning().clone()), Err(CudaError::NoDevice { .. })));
    }

    /// One decode case: several sequences of different lengths over one scattered pool.
    #[derive(Clone, Debug)]
    struct Case {
        format: KvFormat,
        head_dim: usize,
        num_kv_heads: usize,
        group: usize,
        contexts: Vec<usize>,
        window: Option<usize>,
        block_size: usize,
        seed: u64,
        /// Queries rounded to the mma type of the pages (f16 or bf16; f16 for quantized pages),
        /// as the GPU model passes them for f16/bf16 caches: the tensor-core kernel's shortcut.
        rounded_queries: bool,
    }

    /// Relative error bound against the reference over the same pages (the CPU's bounds:
    /// both compute in f32 against an f64 oracle).
    fn bound(format: KvFormat) -> f32 {
        match format {
            KvFormat::F32 | KvFormat::F16 | KvFormat::Bf16 => 1e-5,
            _ => 1e-4,
        }
    }

    /// The oracle: decode attention of one query token per sequence over `layer`, in f64 —
    /// every visible key and value decoded with kvcache's reference codecs (rotated formats:
    /// the query rotated with the layer's rotation, the output rotated back), a two-pass softmax.
    /// `queries`/`out` `[num_seqs, num_heads, head_dim]`; sequence `s` sees keys
    /// `[max(0, C − W), C)` of its context `C` with a sliding window `W`.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        layer: &LayerView,
        queries: &[f32],
        num_heads: usize,
        tables: &[Vec<u32>],
        contexts: &[usize],
        scale: f32,
        window: Option<usize>,
        out: &mut [f32],
    ) {
        let (d, hkv, bs) = (layer.head_dim, layer.num_kv_heads, layer.block_size);
        let group = num_heads / hkv;
        let mut q = vec![0f32; d]; // [head_dim]
        let mut o = vec![0f32; d]; // [head_dim]
        for (seq, &ctx) in contexts.iter().enumerate() {
            let lo = window.map_or(0, |w| ctx.saturating_sub(w));
            let n = ctx - lo;
            for h in 0..hkv {
                let mut keys = vec![0f32; n * d]; // [n, head_dim] rotated domain
                let mut values = vec![0f32; n * d]; // [n, head_dim] rotated domain
                for (t, pos) in (lo..ctx).enumerate() {
                    let slot = tables[seq][pos / bs] as usize * bs + pos % bs;
                    layer.keys.decode(slot, h, &mut keys[t * d..(t + 1) * d]);
                    layer.values.decode(slot, h, &mut values[t * d..(t + 1) * d]);
                }
                for g in 0..group {
                    let row = (seq * num_heads + h * group + g) * d;
                    q.copy_from_slice(&queries[row..row + d]);
                    if let Some(r) = layer.rotation {
                        r.apply(&mut q);
                    }
                    let scores: Vec<f64> = keys
                        .chunks(d)
                        .map(|k| q.iter().zip(k).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * scale as f64)
                        .collect();
                    let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let w: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
                    let sum: f64 = w.iter().sum();
                    for (i, oi) in o.iter_mut().enumerate() {
                        *oi = (w.iter().zip(values.chunks(d)).map(|(w, v)| w * v[i] as f64).sum::<f64>() / sum) as f32;
                    }
                    if let Some(r) = layer.rotation {
                        r.apply_inverse(&mut o);
                    }
                    out[row..row + d].copy_from_slice(&o);
                }
            }
        }
    }

    /// The oracle itself, on the CPU (no GPU needed): equal keys average the values, a window
    /// of 1 returns the last value, GQA heads and sequences land in their rows.
    #[test]
    fn reference_oracle_sanity() {
        let mut rng = StdRng::seed_from_u64(3);
        let (d, hkv, bs) = (64usize, 2usize, 4usize);
        let mut host = HostPages::new(geometry(KvFormat::F32, 1, 8, bs, hkv, d, 0));
        let ctx = 6usize;
        let key: Vec<f32> = (0..hkv * d).map(|_| normal(&mut rng)).collect();
        let keys: Vec<f32> = (0..ctx).flat_map(|_| key.clone()).collect();
        let values: Vec<f32> = (0..ctx * hkv * d).map(|_| normal(&mut rng)).collect();
        let table = vec![5u32, 2];
        let slots: Vec<u32> = (0..ctx).map(|p| table[p / bs] * bs as u32 + (p % bs) as u32).collect();
        host.write(0, &slots, &keys, &values);
        let num_heads = 2 * hkv;
        let queries: Vec<f32> = (0..2 * num_heads * d).map(|_| normal(&mut rng)).collect();
        let tables = vec![table.clone(), table];
        let mut out = vec![f32::NAN; queries.len()];
        reference(&host.layer(0), &queries, num_heads, &tables, &[ctx, 3], 0.125, None, &mut out);
        for (seq, n) in [(0usize, ctx), (1, 3)] {
            for head in 0..num_heads {
                let h = head / 2;
                for i in 0..d {
                    let mean = (0..n).map(|t| values[(t * hkv + h) * d + i]).sum::<f32>() / n as f32;
                    let got = out[(seq * num_heads + head) * d + i];
                    assert!((got - mean).abs() < 1e-5, "seq {seq} head {head} dim {i}: {got} vs {mean}");
                }
            }
        }
        reference(&host.layer(0), &queries, num_heads, &tables, &[ctx, 3], 0.125, Some(1), &mut out);
        for head in 0..num_heads {
            let h = head / 2;
            assert_eq!(out[head * d..(head + 1) * d], values[((ctx - 1) * hkv + h) * d..((ctx - 1) * hkv + h + 1) * d]);
        }
    }

    struct Built {
        pages: DevicePages,
        /// `[num_seqs][blocks]`; `NULL_BLOCK` for blocks wholly before the window.
        tables: Vec<Vec<u32>>,
        /// `[num_seqs, num_heads, head_dim]`
        queries: Vec<f32>,
        num_heads: usize,
    }

    fn build(dev: &Arc<CudaDevice>, case: &Case) -> Built {
        let mut rng = StdRng::seed_from_u64(case.seed);
        let (hkv, d, bs) = (case.num_kv_heads, case.head_dim, case.block_size);
        let needed: usize = case.contexts.iter().map(|c| c.div_ceil(bs)).sum();
        let num_blocks = 2 * needed + 3;
        let g = geometry(case.format, 1, num_blocks, bs, hkv, d, case.seed);
        let mut pages = DevicePages::new(dev.clone(), g).expect("device pages");
        let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
        ids.shuffle(&mut rng);
        let row = hkv * d;
        // Spare blocks hold huge values: reading a wrong block shows.
        let spare: Vec<u32> =
            ids[needed..].iter().flat_map(|&b| (0..bs as u32).map(move |i| b * bs as u32 + i)).collect();
        let junk: Vec<f32> = (0..spare.len() * row).map(|_| 1e3 * normal(&mut rng)).collect();
        pages.try_write(0, &spare, &junk, &junk).expect("write junk");
        let mut next = 0;
        let mut tables = Vec::new();
        for &ctx in &case.contexts {
            let n = ctx.div_ceil(bs);
            let mut table = ids[next..next + n].to_vec();
            next += n;
            let k: Vec<f32> = (0..ctx * row).map(|_| normal(&mut rng)).collect();
            let v: Vec<f32> = (0..ctx * row).map(|_| normal(&mut rng)).collect();
            let slots: Vec<u32> = (0..ctx).map(|p| table[p / bs] * bs as u32 + (p % bs) as u32).collect();
            pages.try_write(0, &slots, &k, &v).expect("write");
            if let Some(w) = case.window {
                let lo = ctx.saturating_sub(w);
                for entry in table.iter_mut().take(lo / bs) {
                    *entry = NULL_BLOCK;
                }
            }
            tables.push(table);
        }
        let num_heads = hkv * case.group;
        // Queries ~ 3·N(0,1): peaky enough that softmax outputs are O(1).
        let round = |x: f32| -> f32 {
            match case.format {
                _ if !case.rounded_queries => x,
                KvFormat::Bf16 => half::bf16::from_f32(x).to_f32(),
                KvFormat::F32 | KvFormat::Turbo { .. } => x,
                _ => half::f16::from_f32(x).to_f32(), // f16, q8, q4: f16 mma
            }
        };
        let queries = (0..case.contexts.len() * num_heads * d).map(|_| round(3.0 * normal(&mut rng))).collect();
        Built { pages, tables, queries, num_heads }
    }

    /// Runs `case` through the reference and the given routes, on every kernel that serves the
    /// format (tensor-core and SIMT for f16/bf16), the routes on the default grid
    /// (`PAGEKV_DEV_CUDA_TC_GRID`), then once on the stream-K grid where it serves the case; returns
    /// (kernel, route or "stream-k", error) triples.
    fn run_case(dev: &Arc<CudaDevice>, case: &Case, routes: &[DecodeRoute]) -> Vec<(&'static str, &'static str, f32)> {
        run_built(dev, case, &build(dev, case), routes)
    }

    /// [`run_case`] over pages already built (and maybe overwritten) for `case`.
    fn run_built(
        dev: &Arc<CudaDevice>,
        case: &Case,
        built: &Built,
        routes: &[DecodeRoute],
    ) -> Vec<(&'static str, &'static str, f32)> {
        let n_seqs = case.contexts.len();
        let d = case.head_dim;
        let scale = 1.0 / (d as f32).sqrt();
        // Reference over a host copy of the device pages.
        let host = built.pages.download_layer(0).expect("download");
        let view = host.view();
        let mut want = vec![f32::NAN; built.queries.len()];
        reference(&view, &built.queries, built.num_heads, &built.tables, &case.contexts, scale, case.window, &mut want);
        assert!(want.iter().all(|x| x.is_finite()), "{case:?}: reference not finite");
        // Device inputs.
        let max_blocks = built.tables.iter().map(Vec::len).max().unwrap_or(1);
        let mut flat = vec![NULL_BLOCK; n_seqs * max_blocks];
        for (s, t) in built.tables.iter().enumerate() {
            flat[s * max_blocks..s * max_blocks + t.len()].copy_from_slice(t);
        }
        let tables = up(dev, &flat);
        let lens: Vec<u32> = case.contexts.iter().map(|&c| c as u32).collect();
        let lens_d = up(dev, &lens);
        let queries = up(dev, &built.queries);
        let poison = vec![f32::NAN; built.queries.len()];
        let mut out = up(dev, &poison);
        let mut attn = DecodeAttention::new(dev.clone());
        let mut results = Vec::new();
        let mut kernels = vec![DecodeKernel::Simt];
        if DecodeKernel::Auto.resolve(dev, case.format, d, case.group) != "simt" {
            kernels.push(DecodeKernel::Auto);
        }
        let mut runs: Vec<(DecodeKernel, DecodeGrid, DecodeRoute)> =
            kernels.iter().flat_map(|&k| routes.iter().map(move |&r| (k, DecodeGrid::Auto, r))).collect();
        attn.set_grid(DecodeGrid::StreamK);
        let max_context = *case.contexts.iter().max().expect("contexts");
        if attn.takes_stream_k(&built.pages, built.num_heads, n_seqs, max_context) {
            runs.push((DecodeKernel::Auto, DecodeGrid::StreamK, DecodeRoute::Primitive));
        }
        for (kernel, grid, route) in runs {
            attn.set_kernel(kernel);
            attn.set_grid(grid);
            let label = if grid == DecodeGrid::StreamK { "stream-k" } else { route.name() };
            let kname = kernel.resolve(dev, case.format, d, case.group);
            dev.stream().memcpy_htod(&poison, &mut out).expect("poison");
            let b = DecodeBatch {
                queries: &queries,
                num_seqs: n_seqs,
                num_heads: built.num_heads,
                block_tables: &tables,
                max_blocks_per_seq: max_blocks,
                context_lens: &lens_d,
                max_context_len: *case.contexts.iter().max().expect("contexts"),
                scale,
                sliding_window: case.window,
            };
            let vreg_before = attn.vreg_launches();
            attn.forward(&built.pages, 0, &b, route, &mut out)
                .unwrap_or_else(|e| panic!("{case:?} {kname} {label} {route:?}: {e}"));
            dev.synchronize().unwrap_or_else(|e| panic!("{case:?} {kname} {label} {route:?}: {e}"));
            let got = down(dev, &out);
            // The tensor-core kernel with the V rows in registers reports as its own kernel.
            let kname = if attn.vreg_launches() > vreg_before { "tc-vreg" } else { kname };
            results.push((kname, label, rel_error(&got, &want, d)));
        }
        results
    }

    #[allow(non_snake_case)]
    fn PART(partition_size: usize) -> DecodeRoute {
        DecodeRoute::Partitioned { partition_size }
    }

    /// Runs every case, prints one line per (case, route) with its error, then asserts all.
    fn check_all(test: &str, dev: &Arc<CudaDevice>, cases: &[Case], routes: &[DecodeRoute]) {
        let mut failures = Vec::new();
        let mut worst = std::collections::BTreeMap::<String, f32>::new();
        for case in cases {
            for (kernel, label, err) in run_case(dev, case, routes) {
                let w = worst.entry(format!("{} {kernel} {label}", case.format)).or_insert(0.0);
                *w = w.max(err);
                if err.is_nan() || err > bound(case.format) {
                    failures
                        .push(format!("{case:?} {kernel} {label}: relative error {err:e} > {:e}", bound(case.format)));
                }
            }
        }
        let mut report = format!("{test}: {} cases × {} routes; worst relative error:", cases.len(), routes.len());
        for (k, v) in &worst {
            report.push_str(&format!("\n  {k:<29} {v:.2e}"));
        }
        let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("{report}\n").as_bytes());
        assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    }

    #[test]
    fn decode_every_format_matches_the_reference() {
        let Some(dev) = device("decode_every_format_matches_the_reference") else { return };
        let mut cases = Vec::new();
        for (i, format) in FORMATS.into_iter().enumerate() {
            for d in [64usize, 128] {
                cases.push(Case {
                    format,
                    head_dim: d,
                    num_kv_heads: 2,
                    group: 4,
                    contexts: vec![1, 17, 300 + i, 1025],
                    window: None,
                    block_size: 16,
                    seed: 100 + i as u64 * 7 + d as u64,
                    rounded_queries: false,
                });
            }
        }
        check_all("decode_every_format", &dev, &cases, &[DecodeRoute::Primitive, PART(64), PART(100), PART(512)]);
    }

    #[test]
    fn decode_gqa_windows_block_sizes_and_odd_lengths() {
        let Some(dev) = device("decode_gqa_windows_block_sizes_and_odd_lengths") else { return };
        let formats =
            [KvFormat::F32, KvFormat::Bf16, KvFormat::Q8, KvFormat::Q4 { rotate: true }, KvFormat::TURBO_DEFAULT];
        let mut cases = Vec::new();
        let mut seed = 1000;
        for format in formats {
            for group in [1usize, 3, 8] {
                for (window, bs) in [(None, 8usize), (Some(37), 16), (Some(700), 32), (Some(1), 16)] {
                    seed += 1;
                    cases.push(Case {
                        format,
                        head_dim: 128,
                        num_kv_heads: 3,
                        group,
                        contexts: vec![2999, 15, 16, 33, 511, 513],
                        window,
                        block_size: bs,
                        seed,
                        rounded_queries: false,
                    });
                }
            }
        }
        check_all("decode_gqa_windows", &dev, &cases, &[DecodeRoute::Primitive, PART(32), PART(256)]);
    }

    /// turbo with sub-scaled values (and K8/V8, whose values keep one scale per 32) at head_dim
    /// 64 and 128 (and 96, 224): GQA groups 1–8, windows, block sizes 8/16/32, both routes.
    #[test]
    fn decode_turbo_values_gqa_and_windows() {
        let Some(dev) = device("decode_turbo_values_gqa_and_windows") else { return };
        let mut cases = Vec::new();
        let mut seed = 9000;
        for format in TURBO {
            for (d, group, window, bs) in [
                (128usize, 1usize, None, 16usize),
                (128, 4, Some(37), 8),
                (128, 8, Some(700), 32),
                (64, 3, Some(1), 16),
                (64, 4, None, 32),
                // Scale runs that start at a code length not aligned to their copy size
                // (V3 at 96: 36 code bytes then 8 of scales; V2 at 224: 56 then 16).
                (96, 2, Some(100), 16),
                (224, 4, None, 16),
            ] {
                seed += 1;
                cases.push(Case {
                    format,
                    head_dim: d,
                    num_kv_heads: 2,
                    group,
                    contexts: vec![1, 17, 300 + group, 1025],
                    window,
                    block_size: bs,
                    seed,
                    rounded_queries: false,
                });
            }
        }
        check_all("decode_turbo_values", &dev, &cases, &[DecodeRoute::Primitive, PART(64), PART(256)]);
    }

    #[test]
    fn decode_other_head_dims_and_wide_groups() {
        let Some(dev) = device("decode_other_head_dims_and_wide_groups") else { return };
        let mut cases = Vec::new();
        let shapes: [(KvFormat, usize, usize); 13] = [
            (KvFormat::F16, 80, 4),
            (KvFormat::Bf16, 96, 2),
            (KvFormat::F32, 256, 8),
            (KvFormat::Bf16, 256, 16),
            (KvFormat::Q8, 96, 4),
            (KvFormat::Q8, 256, 2),
            (KvFormat::Q4 { rotate: false }, 256, 4),
            (KvFormat::Q4 { rotate: true }, 96, 5),
            (KvFormat::TURBO_DEFAULT, 256, 4),
            (KvFormat::Turbo { k_bits: 4, v_bits: 2 }, 96, 16),
            // Gemma 3's attention (head_dim 256) in the rotated and TurboQuant formats.
            (KvFormat::Q4 { rotate: true }, 256, 4),
            (KvFormat::Q8, 256, 4),
            (KvFormat::Turbo { k_bits: 4, v_bits: 2 }, 256, 1),
        ];
        for (seed, (format, d, group)) in (5001..).zip(shapes) {
            cases.push(Case {
                format,
                head_dim: d,
                num_kv_heads: 2,
                group,
                contexts: vec![777, 1, 64, 129],
                window: Some(500),
                block_size: 16,
                seed,
                rounded_queries: false,
            });
        }
        check_all("decode_head_dims", &dev, &cases, &[DecodeRoute::Primitive, PART(96)]);
    }

    /// Queries already rounded to the pages' mma type (the GPU model's f16/bf16 caches), which
    /// the tensor-core kernel detects per warp and serves with one QK part; groups 1–4 (split
    /// parts packed into the mma columns beside the heads, 1 and 3 padded) and 8 (one n-tile per
    /// part), windows, odd contexts, block sizes 8 and 16, both routes. Same bounds as f32
    /// queries: the shortcut drops only parts that are zero. (Shapes whose kernel modules the
    /// prebuild example compiles, plus group 2 at head_dim 128.)
    #[test]
    fn decode_rounded_queries_every_group() {
        let Some(dev) = device("decode_rounded_queries_every_group") else { return };
        let formats = [
            KvFormat::F16,
            KvFormat::Bf16,
            KvFormat::Q8,
            KvFormat::Q4 { rotate: false },
            KvFormat::Q4 { rotate: true },
        ];
        let mut cases = Vec::new();
        let mut seed = 7000;
        for (i, format) in formats.into_iter().enumerate() {
            for group in [1usize, 2, 3, 4, 8] {
                for (window, bs) in [(None, 16usize), (Some(300), 8)] {
                    seed += 1;
                    cases.push(Case {
                        format,
                        head_dim: if group == 3 || (group == 4 && i % 2 == 1) { 64 } else { 128 },
                        num_kv_heads: 2,
                        group,
                        contexts: vec![1, 33, 1000 + group, 2047],
                        window,
                        block_size: bs,
                        seed,
                        rounded_queries: true,
                    });
                }
            }
        }
        check_all("decode_rounded_queries", &dev, &cases, &[DecodeRoute::Primitive, PART(64), PART(448)]);
    }

    /// Grids of more CTAs than SMs take `pk_decode_tc_vreg` (the V rows in registers, query
    /// fragments in shared memory, V^T fragments built by PRMT with their own dim order): f16 and
    /// bf16, head_dim 64 and 128, groups 1–4, f32 and rounded queries, windows, block sizes 8 and
    /// 16, odd lengths and 1-token contexts, both routes; the test asserts that every tensor-core
    /// run of these cases took it and matched the reference.
    #[test]
    fn decode_v_in_registers_on_full_grids() {
        let Some(dev) = device("decode_v_in_registers_on_full_grids") else { return };
        let mut rng = StdRng::seed_from_u64(31);
        // 8 kv heads per sequence: two CTAs per SM on the primitive route (more than one per SM takes it).
        let seqs = (2 * dev.sm_count()).div_ceil(8) + 1;
        let mut cases = Vec::new();
        let mut seed = 9100;
        for format in [KvFormat::F16, KvFormat::Bf16] {
            for (d, group) in [(128usize, 1usize), (128, 2), (128, 4), (64, 3), (64, 4)] {
                for (window, bs, rounded) in [(None, 16usize, false), (Some(90), 8, true)] {
                    seed += 1;
                    let mut contexts: Vec<usize> = (0..seqs).map(|_| rng.gen_range(1..400)).collect();
                    contexts[..4].copy_from_slice(&[1, 16, 17, 399]);
                    cases.push(Case {
                        format,
                        head_dim: d,
                        num_kv_heads: 8,
                        group,
                        contexts,
                        window,
                        block_size: bs,
                        seed,
                        rounded_queries: rounded,
                    });
                }
            }
        }
        let routes = [DecodeRoute::Primitive, PART(64)];
        // check_all's checks, plus the route of every tensor-core run (stream-K aside).
        let expect = if dev.tuning().tc.vreg == "0" { "tc" } else { "tc-vreg" };
        let mut failures = Vec::new();
        let mut worst = 0.0f32;
        for case in &cases {
            for (kernel, label, err) in run_case(&dev, case, &routes) {
                if kernel.starts_with("tc") && label != "stream-k" && kernel != expect {
                    failures.push(format!("{case:?} {label}: ran {kernel}, not {expect}"));
                }
                if err.is_nan() || err > bound(case.format) {
                    failures
                        .push(format!("{case:?} {kernel} {label}: relative error {err:e} > {:e}", bound(case.format)));
                }
                if kernel == expect {
                    worst = worst.max(err);
                }
            }
        }
        // As check_all: straight to stderr, past the harness's capture.
        let report = format!(
            "decode_v_in_registers: {} cases × {} routes; worst relative error of {expect}: {worst:.2e}\n",
            cases.len(),
            routes.len()
        );
        let _ = std::io::Write::write_all(&mut std::io::stderr(), report.as_bytes());
        assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    }

    #[test]
    fn decode_auto_partitioning_of_a_large_batch() {
        let Some(dev) = device("decode_auto_partitioning_of_a_large_batch") else { return };
        let mut rng = StdRng::seed_from_u64(9);
        let contexts: Vec<usize> = (0..37).map(|_| rng.gen_range(1..2500)).collect();
        let max = *contexts.iter().max().expect("contexts");
        let ps = pagekv_cuda::auto_partition_size(contexts.len(), 8, max, dev.sm_count());
        let cases: Vec<Case> = [KvFormat::Bf16, KvFormat::Q4 { rotate: false }]
            .into_iter()
            .map(|format| Case {
                format,
                head_dim: 128,
                num_kv_heads: 8,
                group: 4,
                contexts: contexts.clone(),
                window: None,
                block_size: 16,
                seed: 4242,
                rounded_queries: false,
            })
            .collect();
        check_all("decode_auto_partitioning", &dev, &cases, &[DecodeRoute::Primitive, PART(ps)]);
    }

    /// The stream-K grid where its shares cut units apart: a batch of very different lengths
    /// (units of 1 to 313 tiles, so a CTA's share holds many short units and the long ones are
    /// split across several CTAs), one sequence whose 8 units are each split across ~17 CTAs,
    /// a batch of 150 short sequences (many units per CTA), windows, block sizes 8 and 32,
    /// groups 1 to 16, f16, bf16 and q4 (q8, whose pages are rotated, runs on the partitioned
    /// grid only). run_case compares both grids with the reference.
    #[test]
    fn decode_stream_k_splits_units_across_ctas() {
        let Some(dev) = device("decode_stream_k_splits_units_across_ctas") else { return };
        let mut rng = StdRng::seed_from_u64(77);
        let short: Vec<usize> = (0..150).map(|_| rng.gen_range(1..600)).collect();
        let mixed = vec![1usize, 5000, 17, 16, 3001, 33, 2, 900];
        let mut cases = Vec::new();
        let mut seed = 8000;
        // (format, head_dim, group, contexts, window, block_size)
        type Shape = (KvFormat, usize, usize, Vec<usize>, Option<usize>, usize);
        let shapes: [Shape; 9] = [
            (KvFormat::Bf16, 128, 4, mixed.clone(), None, 16),
            (KvFormat::Bf16, 128, 4, vec![4096], None, 16),
            (KvFormat::F16, 128, 1, short.clone(), None, 8),
            (KvFormat::Q8, 128, 4, mixed.clone(), Some(700), 16),
            (KvFormat::Q4 { rotate: false }, 128, 4, mixed.clone(), None, 32),
            (KvFormat::Q4 { rotate: false }, 64, 3, short.clone(), Some(37), 16),
            (KvFormat::Bf16, 64, 8, short, Some(1), 16),
            (KvFormat::Bf16, 128, 16, mixed.clone(), Some(300), 16),
            (KvFormat::Bf16, 256, 16, mixed, None, 16),
        ];
        for (format, head_dim, group, contexts, window, block_size) in shapes {
            seed += 1;
            cases.push(Case {
                format,
                head_dim,
                num_kv_heads: 8,
                group,
                contexts,
                window,
                block_size,
                seed,
                rounded_queries: seed % 2 == 0,
            });
        }
        check_all("decode_stream_k", &dev, &cases, &[DecodeRoute::Primitive, PART(256)]);
    }

    /// The partitioned route captured in a CUDA graph (as the model runtime does) and replayed:
    /// `pk_merge` is a programmatic dependent launch, which the capture must keep as an edge
    /// that still waits for the decode kernel. Its own device: a capture on the shared stream
    /// would swallow other tests' work.
    #[test]
    fn decode_partitioned_replays_from_a_cuda_graph() {
        let Some(shared) = device("decode_partitioned_replays_from_a_cuda_graph") else { return };
        let dev = CudaDevice::new(shared.ordinal(), shared.tuning().clone()).expect("own device");
        for format in [KvFormat::Bf16, KvFormat::Q4 { rotate: true }] {
            let case = Case {
                format,
                head_dim: 128,
                num_kv_heads: 2,
                group: 4,
                contexts: vec![1500, 77, 640],
                window: None,
                block_size: 16,
                seed: 31337,
                rounded_queries: false,
            };
            let built = build(&dev, &case);
            let d = case.head_dim;
            let scale = 1.0 / (d as f32).sqrt();
            let host = built.pages.download_layer(0).expect("download");
            let mut want = vec![f32::NAN; built.queries.len()];
            let view = host.view();
            reference(&view, &built.queries, built.num_heads, &built.tables, &case.contexts, scale, None, &mut want);
            let max_blocks = built.tables.iter().map(Vec::len).max().expect("tables");
            let mut flat = vec![NULL_BLOCK; case.contexts.len() * max_blocks];
            for (s, t) in built.tables.iter().enumerate() {
                flat[s * max_blocks..s * max_blocks + t.len()].copy_from_slice(t);
            }
            let tables = up(&dev, &flat);
            let lens: Vec<u32> = case.contexts.iter().map(|&c| c as u32).collect();
            let lens_d = up(&dev, &lens);
            let queries = up(&dev, &built.queries);
            let poison = vec![f32::NAN; built.queries.len()];
            let mut out = up(&dev, &poison);
            let b = DecodeBatch {
                queries: &queries,
                num_seqs: case.contexts.len(),
                num_heads: built.num_heads,
                block_tables: &tables,
                max_blocks_per_seq: max_blocks,
                context_lens: &lens_d,
                max_context_len: 1500,
                scale,
                sliding_window: None,
            };
            // Both grids (stream-K: its arrival counters must be back at zero after each replay).
            for grid in [DecodeGrid::Partitioned, DecodeGrid::StreamK] {
                let mut attn = DecodeAttention::new(dev.clone());
                attn.set_grid(grid);
                let route = PART(128);
                // Once outside the capture: allocates the partial buffers.
                attn.forward(&built.pages, 0, &b, route, &mut out).expect("forward");
                dev.synchronize().expect("sync");
                let graph = dev
                    .capture_graph(|| attn.forward(&built.pages, 0, &b, route, &mut out))
                    .expect("capture")
                    .expect("forward in capture");
                for round in 0..3 {
                    dev.stream().memcpy_htod(&poison, &mut out).expect("poison");
                    graph.launch().expect("graph launch");
                    dev.synchronize().expect("sync");
                    let err = rel_error(&down(&dev, &out), &want, d);
                    assert!(err <= bound(format), "{format} {grid:?} replay {round}: relative error {err:e}");
                }
            }
        }
    }

    #[test]
    fn decode_rejects_bad_batches() {
        let Some(dev) = device("decode_rejects_bad_batches") else { return };
        let case = Case {
            format: KvFormat::Bf16,
            head_dim: 64,
            num_kv_heads: 2,
            group: 2,
            contexts: vec![20],
            window: None,
            block_size: 16,
            seed: 1,
            rounded_queries: false,
        };
        let built = build(&dev, &case);
        let queries = up(&dev, &built.queries);
        let tables = up(&dev, &built.tables[0]);
        let lens = up(&dev, &[20u32]);
        let mut out = up(&dev, &vec![0f32; built.queries.len()]);
        let good = DecodeBatch {
            queries: &queries,
            num_seqs: 1,
            num_heads: 4,
            block_tables: &tables,
            max_blocks_per_seq: 2,
            context_lens: &lens,
            max_context_len: 20,
            scale: 0.125,
            sliding_window: None,
        };
        let mut attn = DecodeAttention::new(dev.clone());
        attn.forward(&built.pages, 0, &good, DecodeRoute::Primitive, &mut out).expect("good batch");
        let cases: [(DecodeBatch, usize, DecodeRoute); 6] = [
            (DecodeBatch { num_heads: 3, ..good }, 0, DecodeRoute::Primitive),
            (DecodeBatch { num_heads: 2 * 32, ..good }, 0, DecodeRoute::Primitive),
            (DecodeBatch { max_context_len: 33, ..good }, 0, DecodeRoute::Primitive),
            (DecodeBatch { num_seqs: 2, ..good }, 0, DecodeRoute::Primitive),
            (good, 1, DecodeRoute::Primitive),
            (good, 0, DecodeRoute::Partitioned { partition_size: 0 }),
        ];
        for (i, (b, layer, route)) in cases.iter().enumerate() {
            let r = attn.forward(&built.pages, *layer, b, *route, &mut out);
            assert!(matches!(r, Err(CudaError::Invalid(_)) | Err(CudaError::Unsupported(_))), "case {i}: {r:?}");
        }
        dev.synchronize().expect("no asynchronous error");
    }
}
