//! Phases 3 and 4 of the threaded decode: the denominators and `V·p` of each share's lanes
//! (`values`), then the fold of the shares' lane accumulators into the output rows (`fold`).
//! A child of `decode` so that it reads the call's [`Decode`] state and share buffers directly.

use super::super::call::row;
use super::super::kernels::fold_lanes;
use super::super::lanes::Lanes16;
use super::{lane_pairs, lane_tiles, own_blocks, prefetch, Decode, TILE_POSITIONS};
use crate::attention::group::QueryBounds;

/// Phase 3: the denominators, share `s`'s probabilities (f16-rounded), then `V·p` of its
/// lanes into its accumulators.
#[inline(always)]
pub(in super::super) unsafe fn values<V: Lanes16>(dec: &Decode, s: usize, max_nv: usize) {
    let (c, n) = (dec.c, dec.shares);
    let (d, g, p) = (c.d, c.group, c.p);
    let hkv = c.layer.num_kv_heads;
    let sp = dec.ptrs[s];
    let lanes = 64 / n;
    let per = TILE_POSITIONS / 64;
    let (layer, vplane) = (c.layer, &c.layer.values);
    let row_bytes = hkv * vplane.code_bytes;
    // SAFETY: phase 2 is done (every block sum written); this share writes its own buffers.
    unsafe {
        for seq in 0..p.num_seqs {
            let (lo, hi) = QueryBounds::of(p, seq).keys_of(0);
            let (b0, b1) = (lo / 16, hi.div_ceil(16));
            let (j0, j1) = own_blocks(s, n, b0, b1);
            for r in seq * p.num_heads..(seq + 1) * p.num_heads {
                let sums = dec.sums.add(r * dec.bstride);
                let mut sum = 0f64;
                for b in 0..b1 - b0 {
                    sum += *sums.add(b) as f64;
                }
                let inv = V::splat((1.0 / sum) as f32);
                let pr = sp.probs.add(r * dec.pstride);
                for k in 0..j1 - j0 {
                    V::load(pr.add(16 * k)).mul(inv).round_f16().store(pr.add(16 * k));
                }
            }
            let table = p.block_tables[seq];
            let vrow = |t: usize| row(vplane, table, layer.block_size, 0, t) as usize;
            // Own lane `ll` is absolute lane `la(ll)` (groups s, s + S, … of 16).
            let la = |ll: usize| ((ll / 16) * n + s) * 16 + ll % 16;
            // Position t's index in the share's probability rows.
            let pidx = |t: usize| ((t / 16 - s) / n - j0) * 16 + t % 16;
            let r0 = seq * p.num_heads;
            let w0 = lo & !63;
            // Lists the valid positions of lane `ll` in the tile from `ts` into `list`;
            // returns (count, first position).
            let list_lane = |ts: usize, ll: usize, list: *mut usize| -> (usize, usize) {
                let first = ts + la(ll);
                let mut m = 0;
                while m < per && first + 64 * m < lo {
                    m += 1;
                }
                let t_first = first + 64 * m;
                let mut k = 0;
                while m < per && first + 64 * m < hi {
                    *list.add(ll * per + k) = vrow(first + 64 * m);
                    k += 1;
                    m += 1;
                }
                (k, t_first)
            };
            let mut counts = [(0usize, 0usize); 64];
            let (mut cur, mut next) = (sp.list, sp.list.add(lanes * per));
            for (ll, cnt) in counts.iter_mut().enumerate().take(lanes) {
                *cnt = list_lane(w0, ll, cur);
            }
            if n == 2 && hi <= w0 + TILE_POSITIONS {
                // One tile: each lane pair's sums straight from registers into `part` (the
                // fold's first adds), no lane accumulators.
                for l in 0..16 {
                    let ((c1, t1), (c2, t2)) = (counts[l], counts[16 + l]);
                    let (p1, p2) = (if c1 > 0 { pidx(t1) } else { 0 }, if c2 > 0 { pidx(t2) } else { 0 });
                    for kv in 0..hkv {
                        let rk = r0 + kv * g;
                        lane_pairs::<V>(
                            max_nv,
                            g,
                            kv * d,
                            d / 16,
                            [
                                (cur.add(l * per), c1, sp.probs.add(rk * dec.pstride + p1)),
                                (cur.add((16 + l) * per), c2, sp.probs.add(rk * dec.pstride + p2)),
                            ],
                            dec.pstride,
                            64 / n,
                            sp.part.add((l * dec.rows + rk) * d),
                            d,
                        );
                    }
                }
                continue;
            }
            let mut ts = w0;
            while ts < hi {
                let tn = ts + TILE_POSITIONS;
                let mut next_counts = [(0usize, 0usize); 64];
                if tn < hi {
                    for (ll, cnt) in next_counts.iter_mut().enumerate().take(lanes) {
                        *cnt = list_lane(tn, ll, next);
                    }
                }
                let first_tile = ts == w0;
                for ll in 0..lanes {
                    let acc_lane = sp.acc.add(ll * dec.rows * d);
                    if tn < hi {
                        for k in 0..next_counts[ll].0 {
                            prefetch(*next.add(ll * per + k) as *const u8, row_bytes);
                        }
                    }
                    let (count, t_first) = counts[ll];
                    if count == 0 {
                        if first_tile {
                            std::ptr::write_bytes(acc_lane.add(r0 * d), 0, p.num_heads * d);
                        }
                        continue;
                    }
                    let pi = pidx(t_first);
                    for kv in 0..hkv {
                        let rk = r0 + kv * g;
                        lane_tiles::<V>(
                            max_nv,
                            g,
                            cur.add(ll * per),
                            kv * d,
                            d / 16,
                            count,
                            sp.probs.add(rk * dec.pstride + pi),
                            dec.pstride,
                            64 / n,
                            acc_lane.add(rk * d),
                            d,
                            !first_tile,
                        );
                    }
                }
                counts = next_counts;
                std::mem::swap(&mut cur, &mut next);
                ts = tn;
            }
            if n == 2 {
                // Lanes l and l + 32 of this share's groups (s, s + 2): the fold's first adds,
                // so the other share reads 16 lanes instead of 32.
                let stride = dec.rows * d;
                for l in 0..16 {
                    for i in (r0 * d..(r0 + p.num_heads) * d).step_by(16) {
                        let a = V::load(sp.acc.add(l * stride + i));
                        let b = V::load(sp.acc.add((l + 16) * stride + i));
                        a.add(b).store(sp.part.add(l * stride + i));
                    }
                }
            }
        }
    }
}

/// Phase 4: share `s`'s part of the rows: the 64 lanes folded (reading every share's
/// accumulators) into the output.
#[inline(always)]
pub(in super::super) unsafe fn fold<V: Lanes16>(dec: &Decode, s: usize, _max_nv: usize) {
    let (c, n) = (dec.c, dec.shares);
    let d = c.d;
    let (r0, r1) = (s * dec.rows / n, (s + 1) * dec.rows / n);
    let lane_stride = dec.rows * d;
    // SAFETY: phase 3 is done; rows r0..r1 of `out` belong to this item.
    unsafe {
        for r in r0..r1 {
            let out = c.out.get().add(r * d);
            if n == 1 {
                fold_lanes::<V>(dec.ptrs[0].acc.add(r * d), lane_stride, 64, d / 16, out);
                continue;
            }
            if n == 2 {
                let (a, b) = (dec.ptrs[0].part.add(r * d), dec.ptrs[1].part.add(r * d));
                for cv in 0..d / 16 {
                    let mut x = [V::zero(); 16];
                    for (l, xl) in x.iter_mut().enumerate() {
                        let at = |p: *mut f32| V::load(p.add(l * lane_stride + 16 * cv));
                        // (l + (l+32)) + ((l+16) + (l+48)).
                        *xl = at(a).add(at(b));
                    }
                    reduce_lanes::<V>(&x, out.add(16 * cv));
                }
                continue;
            }
            // Lane group q (lanes 16q…16q+15) lives in share q mod S, as its own group q / S.
            let base = |q: usize| dec.ptrs[q % n].acc.add(((q / n) * 16 * dec.rows + r) * d).cast_const();
            let groups = [base(0), base(1), base(2), base(3)];
            for cv in 0..d / 16 {
                let mut x = [V::zero(); 16];
                for (l, xl) in x.iter_mut().enumerate() {
                    let at = |q: usize| V::load(groups[q].add(l * lane_stride + 16 * cv));
                    *xl = at(0).add(at(2)).add(at(1).add(at(3)));
                }
                reduce_lanes::<V>(&x, out.add(16 * cv));
            }
        }
    }
}

/// `out` ← `reduce16` across the 16 vectors `x`, vertically (as `fold_lanes`).
#[inline(always)]
unsafe fn reduce_lanes<V: Lanes16>(x: &[V; 16], out: *mut f32) {
    let mut y = [x[0]; 8];
    for i in 0..8 {
        // SAFETY: the ISA of `V` (caller).
        y[i] = unsafe { x[i].add(x[i + 8]) };
    }
    // SAFETY: as above; `out` holds 16 floats (caller).
    unsafe {
        let z = [y[0].add(y[4]), y[1].add(y[5]), y[2].add(y[6]), y[3].add(y[7])];
        z[0].add(z[2]).add(z[1].add(z[3])).store(out);
    }
}
