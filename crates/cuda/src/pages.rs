//! [`DevicePages`]: the KV pages in device memory, behind [`kvcache::PageStore`].
//!
//! Same geometry, layout and formats as [`kvcache::HostPages`]: per layer a K and a V plane,
//! each `codes [num_blocks, block_size, num_kv_heads, code_bytes]` plus f16
//! `scales [num_blocks, block_size, num_kv_heads, n_scales]`; rotated formats store `R·k`,
//! `R·v` with the same randomized Hadamard rotation (signs from [`kvcache::Rotation::signs`]).
//! The bookkeeping (block pool, tables, growth, window, trim) stays in `kvcache`; this type only
//! stores and copies.
//!
//! `PageStore`'s methods cannot return errors, so a failure there is kept (the first one) and
//! returned by [`DevicePages::take_error`]; the `try_*` methods return it directly.

use std::sync::Arc;

use cudarc::driver::{result, CudaSlice, DevicePtr, LaunchConfig};
use half::f16;
use kvcache::{Codec, LayerView, PageGeometry, PageStore, PlaneView, Rotation};

use crate::device::{arg, launch_kernel, CudaDevice, KernelModule};
use crate::rope::{QkvRope, RopeArgs, RopeParams};
use crate::spec::ModuleSpec;
use crate::CudaError;

/// One plane (K or V) of one layer in device memory.
struct DevicePlane {
    /// `[num_blocks, block_size, num_kv_heads, code_bytes]`
    codes: CudaSlice<u8>,
    /// `[num_blocks, block_size, num_kv_heads, n_scales]` f16 as bytes (16 unused bytes when
    /// the format has no scales).
    scales: CudaSlice<u8>,
}

/// Raw device pointers of one layer, as the kernels take them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LayerPtrs {
    pub k_codes: u64,
    pub k_scales: u64,
    pub v_codes: u64,
    pub v_scales: u64,
}

/// Device pointer of a slice (the device's stream orders all work; event tracking is off).
pub(crate) fn dptr<T>(s: &CudaSlice<T>, dev: &CudaDevice) -> u64 {
    let (p, _sync) = s.device_ptr(dev.stream());
    p
}

/// Reusable upload buffers for host-side writes.
struct Staging {
    slots: CudaSlice<u32>,  // [cap]
    keys: CudaSlice<f32>,   // [cap, num_kv_heads, head_dim]
    values: CudaSlice<f32>, // [cap, num_kv_heads, head_dim]
    cap: usize,
}

/// KV pages in device memory.
pub struct DevicePages {
    device: Arc<CudaDevice>,
    geometry: PageGeometry,
    key_codec: Codec,
    value_codec: Codec,
    rotation: Option<Rotation>,
    /// `1/sqrt(hadamard block)`, computed as the host's rotation does.
    rot_norm: f32,
    /// `[head_dim]` ±1 rotation signs (rotated formats only).
    signs: Option<CudaSlice<f32>>,
    /// `[num_layers]` (K plane, V plane).
    layers: Vec<(DevicePlane, DevicePlane)>,
    module: Arc<KernelModule>,
    staging: Option<Staging>,
    /// [`Self::write_device`] launches `pk_cache_write` as a programmatic dependent launch
    /// ([`Self::set_programmatic_writes`]; off by default).
    programmatic_writes: bool,
    error: Option<CudaError>,
    /// Unique among the `DevicePages` of this process ([`DevicePages::id`]).
    id: u64,
}

/// The next [`DevicePages::id`].
static NEXT_PAGES_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl DevicePages {
    /// Allocates zeroed pages of `geometry` on `device` and loads the cache-write kernel.
    pub fn new(device: Arc<CudaDevice>, geometry: PageGeometry) -> Result<DevicePages, CudaError> {
        let (d, format) = (geometry.head_dim, geometry.format);
        if geometry.num_layers == 0 || geometry.num_blocks == 0 || geometry.num_kv_heads == 0 {
            return Err(CudaError::Invalid(format!("empty page geometry {geometry:?}")));
        }
        if !geometry.block_size.is_power_of_two() {
            return Err(CudaError::Invalid(format!("block_size {} is not a power of two", geometry.block_size)));
        }
        if geometry.slots().checked_mul(geometry.num_kv_heads).is_none_or(|n| n > u32::MAX as usize) {
            return Err(CudaError::Invalid(format!(
                "{} slots × {} heads overflow 32-bit slot ids",
                geometry.slots(),
                geometry.num_kv_heads
            )));
        }
        let module = device.module(&ModuleSpec::Kv { format, head_dim: d, group: 0 })?;
        let (kc, vc) = (format.key_codec(), format.value_codec());
        let heads = geometry.slots() * geometry.num_kv_heads;
        let stream = device.stream().clone();
        let alloc = |n: usize| stream.alloc_zeros::<u8>(n.max(16)).map_err(|e| CudaError::driver("cuMemAlloc", e));
        let mut layers = Vec::with_capacity(geometry.num_layers);
        for _ in 0..geometry.num_layers {
            let plane = |c: Codec| -> Result<DevicePlane, CudaError> {
                Ok(DevicePlane { codes: alloc(heads * c.code_bytes(d))?, scales: alloc(heads * c.scales(d) * 2)? })
            };
            layers.push((plane(kc)?, plane(vc)?));
        }
        let rotation = format.rotation(d, geometry.rotation_seed);
        let signs = match &rotation {
            Some(r) => Some(stream.clone_htod(r.signs()).map_err(|e| CudaError::driver("cuMemcpyHtoD", e))?),
            None => None,
        };
        let rot_norm = rotation.as_ref().map_or(1.0, |r| 1.0 / (r.block() as f32).sqrt());
        Ok(DevicePages {
            device,
            key_codec: kc,
            value_codec: vc,
            rotation,
            rot_norm,
            signs,
            layers,
            module,
            staging: None,
            programmatic_writes: false,
            error: None,
            id: NEXT_PAGES_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            geometry,
        })
    }

    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// The rotation K and V are stored under (rotated formats).
    pub fn rotation(&self) -> Option<&Rotation> {
        self.rotation.as_ref()
    }

    /// Identifies these pages for as long as the process runs: a CUDA graph that captured
    /// writes into them and reads of them is valid for these pages only. (Addresses do not
    /// identify them: a pool made after another was dropped may get the same allocations, and
    /// then the other format's captured kernels would run on it.)
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Device address of the first layer's K codes.
    pub fn base_address(&self) -> u64 {
        self.layers.first().map_or(0, |(k, _)| dptr(&k.codes, &self.device))
    }

    /// Total bytes of all planes.
    pub fn total_bytes(&self) -> usize {
        self.layers.iter().map(|(k, v)| k.codes.len() + k.scales.len() + v.codes.len() + v.scales.len()).sum()
    }

    /// The first error a `PageStore` method hit since the last call, if any.
    pub fn take_error(&mut self) -> Option<CudaError> {
        self.error.take()
    }

    pub(crate) fn layer_ptrs(&self, layer: usize) -> Result<LayerPtrs, CudaError> {
        let (k, v) = self.layers.get(layer).ok_or_else(|| {
            CudaError::Invalid(format!("layer {layer} out of range ({} layers)", self.geometry.num_layers))
        })?;
        let dev = &self.device;
        Ok(LayerPtrs {
            k_codes: dptr(&k.codes, dev),
            k_scales: dptr(&k.scales, dev),
            v_codes: dptr(&v.codes, dev),
            v_scales: dptr(&v.scales, dev),
        })
    }

    /// `(signs pointer or 0, norm)` for the kernels.
    pub(crate) fn rotation_args(&self) -> (u64, f32) {
        (self.signs.as_ref().map_or(0, |s| dptr(s, &self.device)), self.rot_norm)
    }

    /// Makes [`Self::write_device`] launch `pk_cache_write` as a programmatic dependent launch:
    /// it may be scheduled while the kernel before it on the stream still runs, reads its slots,
    /// then waits for that kernel's results in-kernel (`pdl_wait`) before it reads keys and
    /// values or writes a page. For the model step, whose slots are uploaded before its kernels
    /// (`CudaTuning::attention_pdl`). Host-side writes ([`Self::try_write`]) stay plain launches.
    pub fn set_programmatic_writes(&mut self, on: bool) {
        self.programmatic_writes = on;
    }

    /// Encodes `n` tokens already in device memory into their slots of `layer`:
    /// `slots [n]`, `keys`/`values [n, num_kv_heads, head_dim]` f32, un-rotated.
    /// Slots must be < `geometry().slots()` (checked on the host side by [`Self::try_write`];
    /// the caller guarantees it here).
    pub fn write_device(
        &mut self,
        layer: usize,
        slots: &CudaSlice<u32>,
        keys: &CudaSlice<f32>,
        values: &CudaSlice<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        let row = self.geometry.num_kv_heads * self.geometry.head_dim;
        if slots.len() < n || keys.len() < n * row || values.len() < n * row {
            return Err(CudaError::Invalid(format!(
                "write of {n} tokens: slots {}, keys {}, values {} elements",
                slots.len(),
                keys.len(),
                values.len()
            )));
        }
        let dev = self.device.clone();
        let programmatic = self.programmatic_writes;
        self.launch_write(layer, dptr(slots, &dev), dptr(keys, &dev), dptr(values, &dev), n, programmatic)
    }

    /// The attention input of `n` tokens from their fused QKV product, in one launch
    /// (`pk_qkv_rope_write`): `q [n, num_heads, head_dim]` ← the finished queries, and the
    /// finished keys and values encoded into `slots [n]` of `layer` — the same values as
    /// [`crate::ModelOps::qkv_rope`] followed by [`Self::write_device`] of its keys and values,
    /// without the f32 keys and values between them. A programmatic dependent launch when
    /// writes are ([`Self::set_programmatic_writes`]). Slots as in [`Self::write_device`].
    pub fn write_qkv(
        &mut self,
        layer: usize,
        slots: &CudaSlice<u32>,
        q: &mut CudaSlice<f32>,
        a: &QkvRope,
        p: &RopeParams,
        n: usize,
    ) -> Result<(), CudaError> {
        let g = &self.geometry;
        if p.head_dim != g.head_dim || p.num_kv_heads != g.num_kv_heads || slots.len() < n {
            return Err(CudaError::Invalid(format!(
                "write_qkv of {n} tokens: {} kv heads of {} dims and {} slots for pages of {} kv heads of {}",
                p.num_kv_heads,
                p.head_dim,
                slots.len(),
                g.num_kv_heads,
                g.head_dim
            )));
        }
        let r = RopeArgs::new(&self.device, a, p, q, n, "write_qkv")?;
        if n == 0 {
            return Ok(());
        }
        let dev = self.device.clone();
        let lp = self.layer_ptrs(layer)?;
        let (signs, norm) = self.rotation_args();
        let (qp, sp) = (dptr(q, &dev), dptr(slots, &dev));
        let f = self.module.function("pk_qkv_rope_write")?;
        // Block z = 0 of (token, kv head) writes the key and value, blocks 1.. the group's
        // query heads, one a warp.
        let warps = g.head_dim.div_ceil(32);
        let q_blocks = (p.num_heads / p.num_kv_heads).div_ceil(warps);
        let cfg = LaunchConfig {
            grid_dim: (n as u32, g.num_kv_heads as u32, 1 + q_blocks as u32),
            block_dim: (warps as u32 * 32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut args = [std::ptr::null_mut(); 24];
        args[..8].copy_from_slice(&[
            arg(&qp),
            arg(&lp.k_codes),
            arg(&lp.k_scales),
            arg(&lp.v_codes),
            arg(&lp.v_scales),
            arg(&sp),
            arg(&signs),
            arg(&norm),
        ]);
        args[8..].copy_from_slice(&r.tail());
        // SAFETY: `args` points at pk_qkv_rope_write's parameters, in order, of their types, alive
        // for the call (`r`'s fields and the locals above); buffer sizes checked above and by
        // `RopeArgs::new`; slots are in range (the caller's contract); a programmatic launch
        // waits for the previous kernel (pdl_wait) before it reads the product or writes.
        unsafe { launch_kernel(&dev, &f, cfg, &mut args, self.programmatic_writes) }
            .map_err(|e| CudaError::driver("cuLaunchKernelEx(pk_qkv_rope_write)", e))
    }

    /// Launches `pk_cache_write` over `n` tokens: `slots [n]`, `keys`/`values [n, num_kv_heads,
    /// head_dim]` f32 (device pointers); `programmatic`: as a programmatic dependent launch.
    fn launch_write(
        &mut self,
        layer: usize,
        slots: u64,
        keys: u64,
        values: u64,
        n: usize,
        programmatic: bool,
    ) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        let p = self.layer_ptrs(layer)?;
        let (signs, norm) = self.rotation_args();
        let heads = self.geometry.num_kv_heads as u32;
        let f = self.module.function("pk_cache_write")?;
        let cfg = LaunchConfig {
            grid_dim: (n as u32, heads, 1),
            block_dim: (self.geometry.head_dim.div_ceil(32) as u32 * 32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut args = [
            arg(&p.k_codes),
            arg(&p.k_scales),
            arg(&p.v_codes),
            arg(&p.v_scales),
            arg(&keys),
            arg(&values),
            arg(&slots),
            arg(&heads),
            arg(&signs),
            arg(&norm),
        ];
        // SAFETY: `args` points at values of pk_cache_write's parameter types, in order, alive for
        // the call; buffers hold n tokens; slots are in range; a programmatic launch waits for
        // the previous kernel (pdl_wait) before it reads keys/values or writes pages.
        unsafe { launch_kernel(&self.device, &f, cfg, &mut args, programmatic) }
            .map_err(|e| CudaError::driver("cuLaunchKernelEx(pk_cache_write)", e))
    }

    /// [`PageStore::write`] with its error returned.
    pub fn try_write(&mut self, layer: usize, slots: &[u32], keys: &[f32], values: &[f32]) -> Result<(), CudaError> {
        let g = &self.geometry;
        let row = g.num_kv_heads * g.head_dim;
        let n = slots.len();
        if keys.len() != n * row || values.len() != n * row {
            return Err(CudaError::Invalid(format!(
                "write of {n} tokens needs {} keys and values, got {} and {}",
                n * row,
                keys.len(),
                values.len()
            )));
        }
        if let Some(&bad) = slots.iter().find(|&&s| s as usize >= g.slots()) {
            return Err(CudaError::Invalid(format!("slot {bad} out of range ({} slots)", g.slots())));
        }
        if layer >= g.num_layers {
            return Err(CudaError::Invalid(format!("layer {layer} out of range ({} layers)", g.num_layers)));
        }
        if n == 0 {
            return Ok(());
        }
        let stream = self.device.stream().clone();
        if self.staging.as_ref().is_none_or(|s| s.cap < n) {
            let cap = n.next_power_of_two().max(16);
            let alloc_err = |e| CudaError::driver("cuMemAlloc", e);
            self.staging = Some(Staging {
                slots: stream.alloc_zeros::<u32>(cap).map_err(alloc_err)?,
                keys: stream.alloc_zeros::<f32>(cap * row).map_err(alloc_err)?,
                values: stream.alloc_zeros::<f32>(cap * row).map_err(alloc_err)?,
                cap,
            });
        }
        let st = self.staging.as_mut().expect("allocated above");
        let up = |e| CudaError::driver("cuMemcpyHtoD", e);
        stream.memcpy_htod(slots, &mut st.slots.slice_mut(..n)).map_err(up)?;
        stream.memcpy_htod(keys, &mut st.keys.slice_mut(..n * row)).map_err(up)?;
        stream.memcpy_htod(values, &mut st.values.slice_mut(..n * row)).map_err(up)?;
        let dev = self.device.clone();
        let (s, k, v) = (dptr(&st.slots, &dev), dptr(&st.keys, &dev), dptr(&st.values, &dev));
        self.launch_write(layer, s, k, v, n, false)
    }

    /// [`PageStore::copy_block`] with its error returned.
    pub fn try_copy_block(&mut self, src: u32, dst: u32) -> Result<(), CudaError> {
        let g = &self.geometry;
        if src as usize >= g.num_blocks || dst as usize >= g.num_blocks {
            return Err(CudaError::Invalid(format!("copy_block {src} → {dst}: {} blocks", g.num_blocks)));
        }
        if src == dst {
            return Ok(());
        }
        let slot_heads = g.block_size * g.num_kv_heads;
        let d = g.head_dim;
        let stream = self.device.stream();
        self.device.bind()?;
        for (k, v) in &self.layers {
            for (plane, codec) in [(k, self.key_codec), (v, self.value_codec)] {
                for (buf, per) in [(&plane.codes, codec.code_bytes(d)), (&plane.scales, codec.scales(d) * 2)] {
                    let n = slot_heads * per;
                    if n == 0 {
                        continue;
                    }
                    let base = dptr(buf, &self.device);
                    // SAFETY: both ranges lie inside `buf` (block ids checked above) and do not overlap.
                    unsafe {
                        result::memcpy_dtod_async(
                            base + (dst as usize * n) as u64,
                            base + (src as usize * n) as u64,
                            n,
                            stream.cu_stream(),
                        )
                    }
                    .map_err(|e| CudaError::driver("cuMemcpyDtoDAsync", e))?;
                }
            }
        }
        Ok(())
    }

    /// Copies one layer's planes to the host (tests, diagnostics).
    pub fn download_layer(&self, layer: usize) -> Result<HostLayerCopy, CudaError> {
        let g = &self.geometry;
        let (k, v) = self
            .layers
            .get(layer)
            .ok_or_else(|| CudaError::Invalid(format!("layer {layer} out of range ({} layers)", g.num_layers)))?;
        let heads = g.slots() * g.num_kv_heads;
        let stream = self.device.stream();
        let down = |s: &CudaSlice<u8>, n: usize| -> Result<Vec<u8>, CudaError> {
            stream.clone_dtoh(&s.slice(..n)).map_err(|e| CudaError::driver("cuMemcpyDtoH", e))
        };
        let scales = |b: Vec<u8>| -> Vec<f16> { b.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]])).collect() };
        let d = g.head_dim;
        Ok(HostLayerCopy {
            k_codes: down(&k.codes, heads * self.key_codec.code_bytes(d))?,
            k_scales: scales(down(&k.scales, heads * self.key_codec.scales(d) * 2)?),
            v_codes: down(&v.codes, heads * self.value_codec.code_bytes(d))?,
            v_scales: scales(down(&v.scales, heads * self.value_codec.scales(d) * 2)?),
            geometry: g.clone(),
            rotation: self.rotation.clone(),
        })
    }

    fn try_read(&self, layer: usize, slot: u32, keys: &mut [f32], values: &mut [f32]) -> Result<(), CudaError> {
        let g = &self.geometry;
        let (h, d) = (g.num_kv_heads, g.head_dim);
        if slot as usize >= g.slots() || keys.len() != h * d || values.len() != h * d {
            return Err(CudaError::Invalid(format!(
                "read of slot {slot} into {} / {} values",
                keys.len(),
                values.len()
            )));
        }
        let (kp, vp) = self
            .layers
            .get(layer)
            .ok_or_else(|| CudaError::Invalid(format!("layer {layer} out of range ({} layers)", g.num_layers)))?;
        let stream = self.device.stream();
        for (plane, codec, out) in [(kp, self.key_codec, keys), (vp, self.value_codec, values)] {
            let (cb, ns) = (codec.code_bytes(d), codec.scales(d));
            let s = slot as usize * h;
            let codes = stream
                .clone_dtoh(&plane.codes.slice(s * cb..(s + h) * cb))
                .map_err(|e| CudaError::driver("cuMemcpyDtoH", e))?;
            let scale_bytes = if ns > 0 {
                stream
                    .clone_dtoh(&plane.scales.slice(s * ns * 2..(s + h) * ns * 2))
                    .map_err(|e| CudaError::driver("cuMemcpyDtoH", e))?
            } else {
                Vec::new()
            };
            let scales: Vec<f16> = scale_bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]])).collect();
            for head in 0..h {
                let o = &mut out[head * d..(head + 1) * d];
                codec.decode(&codes[head * cb..(head + 1) * cb], &scales[head * ns..(head + 1) * ns], o);
                if let Some(r) = &self.rotation {
                    r.apply_inverse(o);
                }
            }
        }
        Ok(())
    }

    fn keep(&mut self, r: Result<(), CudaError>) {
        if let Err(e) = r {
            self.error.get_or_insert(e);
        }
    }
}

impl PageStore for DevicePages {
    fn geometry(&self) -> &PageGeometry {
        &self.geometry
    }

    fn write(&mut self, layer: usize, slots: &[u32], keys: &[f32], values: &[f32]) {
        let r = self.try_write(layer, slots, keys, values);
        self.keep(r);
    }

    fn copy_block(&mut self, src: u32, dst: u32) {
        let r = self.try_copy_block(src, dst);
        self.keep(r);
    }

    fn read(&self, layer: usize, slot: u32, keys: &mut [f32], values: &mut [f32]) {
        if let Err(e) = self.try_read(layer, slot, keys, values) {
            // `read` is diagnostics only and takes &self: report, and leave NaN so nothing
            // mistakes the output for data.
            eprintln!("pagekv-cuda: read of slot {slot} failed: {e}");
            keys.fill(f32::NAN);
            values.fill(f32::NAN);
        }
    }
}

/// A host copy of one layer's device pages; [`HostLayerCopy::view`] reads it exactly as the
/// CPU kernels read host pages.
pub struct HostLayerCopy {
    pub k_codes: Vec<u8>,
    pub k_scales: Vec<f16>,
    pub v_codes: Vec<u8>,
    pub v_scales: Vec<f16>,
    pub geometry: PageGeometry,
    pub rotation: Option<Rotation>,
}

impl HostLayerCopy {
    pub fn view(&self) -> LayerView<'_> {
        let g = &self.geometry;
        fn plane<'a>(codes: &'a [u8], scales: &'a [f16], codec: Codec, g: &PageGeometry) -> PlaneView<'a> {
            PlaneView {
                codes,
                scales,
                codec,
                code_bytes: codec.code_bytes(g.head_dim),
                n_scales: codec.scales(g.head_dim),
                num_kv_heads: g.num_kv_heads,
            }
        }
        LayerView {
            keys: plane(&self.k_codes, &self.k_scales, g.format.key_codec(), g),
            values: plane(&self.v_codes, &self.v_scales, g.format.value_codec(), g),
            num_kv_heads: g.num_kv_heads,
            head_dim: g.head_dim,
            block_size: g.block_size,
            format: g.format,
            rotation: self.rotation.as_ref(),
        }
    }
}
