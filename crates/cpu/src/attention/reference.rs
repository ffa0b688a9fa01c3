//! The reference attention: plain scalar code, obviously correct, the oracle of every test
//! and the fallback of the router.
//!
//! Keys and values are decoded with the cache's own scalar decoder
//! ([`kvcache::PlaneView::decode`]), scores and the online softmax are accumulated in f64.
//! Queries over q8 and q4 keys are rounded to int8 first, as every route takes them
//! ([`super::queries`]).
//! Each (sequence, kv head) decodes each visible position once and updates every query row of
//! the group that sees it. Single-threaded; it allocates its small buffers per call (it is not
//! the hot path).

use kvcache::LayerView;

use super::group::QueryBounds;
use super::params::AttentionParams;
use super::queries::{int8_queries, quantize_query};

/// `out` (`[num_seqs, q_len, num_heads, head_dim]`) ← attention of `p` over `layer`.
/// Shapes and block tables must have been validated.
pub fn attention(layer: &LayerView, p: &AttentionParams, out: &mut [f32]) {
    let d = layer.head_dim;
    let g = p.num_heads / layer.num_kv_heads;
    let rows = p.q_len * g;
    let bs = layer.block_size;
    // Integer-coded keys take the query rounded to int8, as the fast paths do (`queries`).
    let int8 = int8_queries(layer.format);
    let mut q = vec![0f32; d]; // [head_dim] one query, scaled later
    let mut qs = vec![0f64; rows * d]; // [rows, head_dim] rotated queries
    let mut acc = vec![0f64; rows * d]; // [rows, head_dim]
    let mut m = vec![f64::NEG_INFINITY; rows]; // [rows]
    let mut l = vec![0f64; rows]; // [rows]
    let mut k = vec![0f32; d]; // [head_dim] decoded key (rotated domain)
    let mut v = vec![0f32; d]; // [head_dim] decoded value (rotated domain)
    let mut o = vec![0f32; d]; // [head_dim]
    for seq in 0..p.num_seqs {
        let bounds = QueryBounds::of(p, seq);
        let table = p.block_tables[seq];
        for kv_head in 0..layer.num_kv_heads {
            for i in 0..p.q_len {
                for h in 0..g {
                    let src = ((seq * p.q_len + i) * p.num_heads + kv_head * g + h) * d;
                    q.copy_from_slice(&p.queries[src..src + d]);
                    if int8 {
                        // As the fast paths: scaled, rotated, rounded to int8.
                        for x in q.iter_mut() {
                            *x *= p.scale;
                        }
                    }
                    if let Some(r) = layer.rotation {
                        r.apply(&mut q);
                    }
                    if int8 {
                        quantize_query(&mut q, None);
                    }
                    let row = i * g + h;
                    for (dst, x) in qs[row * d..(row + 1) * d].iter_mut().zip(&q) {
                        *dst = *x as f64;
                    }
                }
            }
            acc.fill(0.0);
            m.fill(f64::NEG_INFINITY);
            l.fill(0.0);
            for pos in bounds.read_range() {
                let slot = table[pos / bs] as usize * bs + pos % bs;
                layer.keys.decode(slot, kv_head, &mut k);
                layer.values.decode(slot, kv_head, &mut v);
                for i in 0..p.q_len {
                    let (lo, hi) = bounds.keys_of(i);
                    if pos < lo || pos >= hi {
                        continue;
                    }
                    for row in i * g..(i + 1) * g {
                        let qr = &qs[row * d..(row + 1) * d];
                        let dot: f64 = qr.iter().zip(&k).map(|(a, b)| a * *b as f64).sum();
                        let s = if int8 { dot } else { dot * p.scale as f64 };
                        let m_new = m[row].max(s);
                        let corr = (m[row] - m_new).exp(); // 0 for the first key (m = -inf)
                        let w = (s - m_new).exp();
                        l[row] = l[row] * corr + w;
                        for (a, x) in acc[row * d..(row + 1) * d].iter_mut().zip(&v) {
                            *a = *a * corr + w * *x as f64;
                        }
                        m[row] = m_new;
                    }
                }
            }
            for i in 0..p.q_len {
                for h in 0..g {
                    let row = i * g + h;
                    for (dst, a) in o.iter_mut().zip(&acc[row * d..(row + 1) * d]) {
                        *dst = (a / l[row]) as f32;
                    }
                    if let Some(r) = layer.rotation {
                        r.apply_inverse(&mut o);
                    }
                    let dst = ((seq * p.q_len + i) * p.num_heads + kv_head * g + h) * d;
                    out[dst..dst + d].copy_from_slice(&o);
                }
            }
        }
    }
}
