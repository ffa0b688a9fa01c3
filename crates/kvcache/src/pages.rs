//! Page storage: the bytes behind the block ids, and the read-only view kernels use.
//!
//! Per layer there are two planes (K and V). Each plane has
//! - `codes`: `[num_blocks, block_size, num_kv_heads, code_bytes]` (the head vector's values in
//!   the format's codec; `code_bytes` per [`crate::format::Codec::code_bytes`]), and
//! - `scales`: `[num_blocks, block_size, num_kv_heads, n_scales]` f16 (empty for f32/f16/bf16).
//!
//! so the codes of token position `pos` and kv head `h` are at slot
//! `block_table[pos / block_size] * block_size + pos % block_size`, byte offset
//! `(slot * num_kv_heads + h) * code_bytes`. Rotated formats store `R·k` and `R·v`.
//!
//! [`PageStore`] is the small trait the bookkeeping needs from any storage (host memory here,
//! device memory in the CUDA backend): write token rows into slots and copy a block.

use half::f16;

use crate::aligned::AlignedBuf;
use crate::format::{Codec, KvFormat, Rotation};

/// Fixed shape of a pool's pages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageGeometry {
    pub num_layers: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub format: KvFormat,
    pub rotation_seed: u64,
}

impl PageGeometry {
    pub fn slots(&self) -> usize {
        self.num_blocks * self.block_size
    }

    /// Bytes of one block in one layer (K and V, codes and scales).
    pub fn bytes_per_block_layer(&self) -> usize {
        self.block_size * self.format.bytes_per_token(self.num_kv_heads, self.head_dim)
    }

    /// (code bytes, scale bytes) of one block across all layers, K and V.
    pub fn block_bytes_by_category(&self) -> (usize, usize) {
        let (k, v) = (self.format.key_codec(), self.format.value_codec());
        let per_slot_codes = self.num_kv_heads * (k.code_bytes(self.head_dim) + v.code_bytes(self.head_dim));
        let per_slot_scales = self.num_kv_heads * 2 * (k.scales(self.head_dim) + v.scales(self.head_dim));
        let mul = self.num_layers * self.block_size;
        (per_slot_codes * mul, per_slot_scales * mul)
    }
}

/// What the bookkeeping needs from page storage.
pub trait PageStore {
    fn geometry(&self) -> &PageGeometry;
    /// Encodes `keys`/`values` (`[slots.len(), num_kv_heads, head_dim]` f32, un-rotated) into
    /// the given slots of `layer`, quantizing (and rotating) per the format.
    fn write(&mut self, layer: usize, slots: &[u32], keys: &[f32], values: &[f32]);
    /// Copies every layer's K and V of block `src` to block `dst` (copy-on-write).
    fn copy_block(&mut self, src: u32, dst: u32);
    /// Decodes one slot of `layer` into `keys`/`values` (`[num_kv_heads, head_dim]`,
    /// un-rotated). Diagnostics and tests only.
    fn read(&self, layer: usize, slot: u32, keys: &mut [f32], values: &mut [f32]);
}

/// One plane (K or V) of one layer in host memory.
struct Plane {
    /// `[num_blocks, block_size, num_kv_heads, code_bytes]`
    codes: AlignedBuf,
    /// `[num_blocks, block_size, num_kv_heads, n_scales]` f16 as bytes.
    scales: AlignedBuf,
}

/// Pages in host memory.
pub struct HostPages {
    geometry: PageGeometry,
    key_codec: Codec,
    value_codec: Codec,
    rotation: Option<Rotation>,
    /// `[num_layers]` (K plane, V plane).
    layers: Vec<(Plane, Plane)>,
    /// `[head_dim]` scratch for rotating one head vector.
    scratch: Vec<f32>,
}

impl HostPages {
    /// Allocates zeroed pages (lazily committed by the OS).
    pub fn new(geometry: PageGeometry) -> HostPages {
        let (k, v) = (geometry.format.key_codec(), geometry.format.value_codec());
        let heads = geometry.slots() * geometry.num_kv_heads;
        let plane = |c: Codec| Plane {
            codes: AlignedBuf::zeroed(heads * c.code_bytes(geometry.head_dim)),
            scales: AlignedBuf::zeroed(heads * c.scales(geometry.head_dim) * 2),
        };
        let layers = (0..geometry.num_layers).map(|_| (plane(k), plane(v))).collect();
        HostPages {
            rotation: geometry.format.rotation(geometry.head_dim, geometry.rotation_seed),
            key_codec: k,
            value_codec: v,
            scratch: vec![0.0; geometry.head_dim],
            layers,
            geometry,
        }
    }

    /// Read-only view of one layer for attention kernels.
    pub fn layer(&self, layer: usize) -> LayerView<'_> {
        let (k, v) = &self.layers[layer];
        let g = &self.geometry;
        fn plane<'p>(p: &'p Plane, codec: Codec, g: &PageGeometry) -> PlaneView<'p> {
            PlaneView {
                codes: p.codes.as_slice(),
                scales: bytemuck::cast_slice(p.scales.as_slice()),
                codec,
                code_bytes: codec.code_bytes(g.head_dim),
                n_scales: codec.scales(g.head_dim),
                num_kv_heads: g.num_kv_heads,
            }
        }
        LayerView {
            keys: plane(k, self.key_codec, g),
            values: plane(v, self.value_codec, g),
            num_kv_heads: g.num_kv_heads,
            head_dim: g.head_dim,
            block_size: g.block_size,
            format: g.format,
            rotation: self.rotation.as_ref(),
        }
    }

    /// Total bytes of all planes (what the pool reserves).
    pub fn total_bytes(&self) -> usize {
        self.layers.iter().map(|(k, v)| k.codes.len() + k.scales.len() + v.codes.len() + v.scales.len()).sum()
    }
}

fn encode_into(
    plane: &mut Plane,
    codec: Codec,
    rot: Option<&Rotation>,
    scratch: &mut [f32],
    slot_head: usize,
    x: &[f32],
) {
    let d = x.len();
    let (cb, ns) = (codec.code_bytes(d), codec.scales(d));
    let src = match rot {
        Some(r) => {
            scratch.copy_from_slice(x);
            r.apply(scratch);
            &*scratch
        }
        None => x,
    };
    let codes = &mut plane.codes.as_mut_slice()[slot_head * cb..(slot_head + 1) * cb];
    let scales: &mut [f16] =
        bytemuck::cast_slice_mut(&mut plane.scales.as_mut_slice()[slot_head * ns * 2..(slot_head + 1) * ns * 2]);
    codec.encode(src, codes, scales);
}

impl PageStore for HostPages {
    fn geometry(&self) -> &PageGeometry {
        &self.geometry
    }

    fn write(&mut self, layer: usize, slots: &[u32], keys: &[f32], values: &[f32]) {
        let (h, d) = (self.geometry.num_kv_heads, self.geometry.head_dim);
        debug_assert_eq!(keys.len(), slots.len() * h * d);
        debug_assert_eq!(values.len(), slots.len() * h * d);
        let (kc, vc) = (self.key_codec, self.value_codec);
        let (kp, vp) = &mut self.layers[layer];
        for (t, &slot) in slots.iter().enumerate() {
            debug_assert!((slot as usize) < self.geometry.slots(), "slot {slot} out of range");
            for head in 0..h {
                let row = (t * h + head) * d..(t * h + head + 1) * d;
                let sh = slot as usize * h + head;
                encode_into(kp, kc, self.rotation.as_ref(), &mut self.scratch, sh, &keys[row.clone()]);
                encode_into(vp, vc, self.rotation.as_ref(), &mut self.scratch, sh, &values[row]);
            }
        }
    }

    fn copy_block(&mut self, src: u32, dst: u32) {
        let g = &self.geometry;
        let slot_heads = g.block_size * g.num_kv_heads;
        for (k, v) in &mut self.layers {
            for (plane, codec) in [(k, self.key_codec), (v, self.value_codec)] {
                for (buf, per) in [
                    (&mut plane.codes, codec.code_bytes(g.head_dim)),
                    (&mut plane.scales, codec.scales(g.head_dim) * 2),
                ] {
                    let n = slot_heads * per;
                    buf.as_mut_slice().copy_within(src as usize * n..(src as usize + 1) * n, dst as usize * n);
                }
            }
        }
    }

    fn read(&self, layer: usize, slot: u32, keys: &mut [f32], values: &mut [f32]) {
        let view = self.layer(layer);
        let d = self.geometry.head_dim;
        for head in 0..self.geometry.num_kv_heads {
            let (ko, vo) = (&mut keys[head * d..(head + 1) * d], &mut values[head * d..(head + 1) * d]);
            view.keys.decode(slot as usize, head, ko);
            view.values.decode(slot as usize, head, vo);
            if let Some(r) = view.rotation {
                r.apply_inverse(ko);
                r.apply_inverse(vo);
            }
        }
    }
}

/// Read-only view of one plane (K or V) of one layer.
#[derive(Clone, Copy)]
pub struct PlaneView<'a> {
    /// `[num_blocks, block_size, num_kv_heads, code_bytes]`
    pub codes: &'a [u8],
    /// `[num_blocks, block_size, num_kv_heads, n_scales]`
    pub scales: &'a [f16],
    pub codec: Codec,
    /// Code bytes per head vector.
    pub code_bytes: usize,
    /// Scales per head vector.
    pub n_scales: usize,
    pub num_kv_heads: usize,
}

impl<'a> PlaneView<'a> {
    /// Code bytes of (slot, kv head).
    #[inline]
    pub fn head_codes(&self, slot: usize, head: usize) -> &'a [u8] {
        let i = (slot * self.num_kv_heads + head) * self.code_bytes;
        &self.codes[i..i + self.code_bytes]
    }

    /// Scales of (slot, kv head).
    #[inline]
    pub fn head_scales(&self, slot: usize, head: usize) -> &'a [f16] {
        let i = (slot * self.num_kv_heads + head) * self.n_scales;
        &self.scales[i..i + self.n_scales]
    }

    /// Reference decode of (slot, head) into `out` (`[head_dim]`), still rotated for rotated
    /// formats.
    pub fn decode(&self, slot: usize, head: usize, out: &mut [f32]) {
        self.codec.decode(self.head_codes(slot, head), self.head_scales(slot, head), out);
    }
}

/// Read-only view of one layer, as attention kernels receive it.
#[derive(Clone, Copy)]
pub struct LayerView<'a> {
    pub keys: PlaneView<'a>,
    pub values: PlaneView<'a>,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub format: KvFormat,
    /// The rotation K and V were stored under, for rotated formats.
    pub rotation: Option<&'a Rotation>,
}
