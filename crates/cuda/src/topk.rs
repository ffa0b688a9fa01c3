//! [`TopK`]: each logit row's `k` best entries on the device (`kernels/topk.cu`), so a sampler
//! that needs only them copies `[rows, k]` ids and values to the host instead of `[rows, vocab]`
//! logits. The rule is `pagekv-model`'s `backend::top_k`: larger value first in IEEE order
//! (`-0.0 == 0.0`), the lower index among equal values, NaN never, rows with fewer than `k`
//! non-NaN values padded with ([`TOP_K_NONE`], NaN); the first entry is the row's argmax.
//!
//! Two launches: a partial selection of each chunk of [`TopKPlan::chunk`] entries of every row
//! (many CTAs per row), then one CTA per row merging the chunks' `k` best each into the ordered
//! result. Each entry is a distinct 64-bit key (value order, then lower index), and both steps
//! are exact radix selects over those keys, so no step has tie cases.
//!
//! The chunk workspace grows on demand: do not call [`TopK::run`] while a CUDA graph is being
//! captured on the stream.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};

use crate::device::{launch_err, CudaDevice};
use crate::pages::dptr;
use crate::spec::ModuleSpec;
use crate::CudaError;

/// Most entries per row [`TopK`] selects (the engine asks for at most a sampler's top-k + 1 = 65).
pub const TOP_K_MAX: usize = 128;

/// Padding id of a row with fewer than `k` non-NaN values (its value is NaN).
pub const TOP_K_NONE: u32 = u32::MAX;

/// Entries one CTA of the partial selection takes: 256 threads × 4, 8 or 16 entries.
pub const TOP_K_CHUNKS: [usize; 3] = [1024, 2048, 4096];

/// Most keys the merge of one row takes (512 threads × 16): `chunks · k` must not exceed it.
pub const TOP_K_MERGE_CAP: usize = 512 * 16;

/// Largest `k` for which both selections of a plan with 4096-entry chunks first drop the keys
/// below the k-th largest of the threads' own maxima (`prefilter`). Measured on the H200
/// (`bench_topk` example on the H200): at 256 rows of 128256 with 4096-entry chunks, k = 1 117.6
/// vs 149 µs without, k = 16 143 vs 160; at k = 41 and 65 it costs more than it saves (the bound
/// is loose when k nears a quarter of the threads), and with 1024-entry chunks it saves nothing.
pub const TOP_K_PREFILTER_MAX_K: usize = 16;

/// How a [`TopK::run`] cuts its rows: chunks of `chunk` entries, `chunks` per row; `prefilter`:
/// whether the selections first drop keys below the bound of the threads' maxima (by default
/// for 4096-entry chunks and `k <=` [`TOP_K_PREFILTER_MAX_K`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopKPlan {
    pub chunk: usize,
    pub chunks: usize,
    pub prefilter: bool,
}

impl TopKPlan {
    /// The launch shape for `rows` rows of `vocab` entries and `k` ≤ [`TOP_K_MAX`] on a device of
    /// `sm_count` SMs: the largest chunk that still gives every SM two CTAs, else the smallest
    /// whose merge fits [`TOP_K_MERGE_CAP`]; `forced` (one of [`TOP_K_CHUNKS`]) instead, if it
    /// fits. Errors when `k` or `vocab` is out of range or no chunk fits.
    pub fn new(
        rows: usize,
        vocab: usize,
        k: usize,
        sm_count: usize,
        forced: Option<usize>,
    ) -> Result<TopKPlan, CudaError> {
        if !(1..=TOP_K_MAX).contains(&k) {
            return Err(CudaError::Unsupported(format!("top-k with k = {k}: the kernel serves 1..={TOP_K_MAX}")));
        }
        if vocab == 0 || vocab >= u32::MAX as usize {
            return Err(CudaError::Invalid(format!("top-k of rows of {vocab} entries")));
        }
        if rows > 65535 {
            return Err(CudaError::Unsupported(format!("top-k of {rows} rows: at most 65535 a launch")));
        }
        let fits = |chunk: usize| vocab.div_ceil(chunk) * k <= TOP_K_MERGE_CAP;
        let plan = |chunk: usize| TopKPlan {
            chunk,
            chunks: vocab.div_ceil(chunk),
            prefilter: chunk == 4096 && k <= TOP_K_PREFILTER_MAX_K,
        };
        if let Some(c) = forced {
            if TOP_K_CHUNKS.contains(&c) && fits(c) {
                return Ok(plan(c));
            }
        }
        let target = 2 * sm_count.max(1);
        if let Some(&c) = TOP_K_CHUNKS.iter().rev().find(|&&c| fits(c) && rows * vocab.div_ceil(c) >= target) {
            return Ok(plan(c));
        }
        match TOP_K_CHUNKS.iter().find(|&&c| fits(c)) {
            Some(&c) => Ok(plan(c)),
            None => Err(CudaError::Unsupported(format!(
                "top-{k} of rows of {vocab} entries: more than {TOP_K_MERGE_CAP} candidates per row to merge"
            ))),
        }
    }
}

/// The top-k kernels on one device and their chunk workspace.
pub struct TopK {
    device: Arc<CudaDevice>,
    /// `pk_topk_partial_{4,8,16}`, one per [`TOP_K_CHUNKS`] entry.
    partial: [CudaFunction; 3],
    merge: CudaFunction,
    /// `[rows, chunks, k]` u64 keys of the partial selection (grown on demand).
    part: Option<CudaSlice<u64>>,
}

impl TopK {
    /// Loads (compiling on first use) the top-k kernels on `device`.
    pub fn new(device: Arc<CudaDevice>) -> Result<TopK, CudaError> {
        let module = device.module(&ModuleSpec::TopK)?;
        let partial = [
            module.function("pk_topk_partial_4")?,
            module.function("pk_topk_partial_8")?,
            module.function("pk_topk_partial_16")?,
        ];
        let merge = module.function("pk_topk_merge")?;
        Ok(TopK { device, partial, merge, part: None })
    }

    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// The launch shape [`Self::run`] takes for these sizes on this device (with the chunk its
    /// tuning fixes, `CudaTuning::topk_chunk`, if any).
    pub fn plan(&self, rows: usize, vocab: usize, k: usize) -> Result<TopKPlan, CudaError> {
        TopKPlan::new(rows, vocab, k, self.device.sm_count(), self.device.tuning().topk_chunk)
    }

    /// `ids [rows, k]` and `values [rows, k]` ← the `k` best entries of each row of `logits
    /// [rows, vocab]` f32, best first (the module's rule). Queued on the device's stream; returns
    /// the plan it took. `k == 0` or `rows == 0` queues nothing.
    pub fn run(
        &mut self,
        ids: &mut CudaSlice<u32>,
        values: &mut CudaSlice<f32>,
        logits: &CudaSlice<f32>,
        rows: usize,
        vocab: usize,
        k: usize,
    ) -> Result<Option<TopKPlan>, CudaError> {
        if ids.len() < rows * k || values.len() < rows * k {
            return Err(CudaError::Invalid(format!(
                "top-{k} of {rows} rows into {} ids and {} values",
                ids.len(),
                values.len()
            )));
        }
        let (i, v) = (dptr(ids, &self.device), dptr(values, &self.device));
        self.run_at(i, v, logits, rows, vocab, k, None)
    }

    /// As [`Self::run`], into one buffer `out [2, rows, k]`: the ids, then the values' bits (one
    /// copy brings both to the host); `plan` overrides the automatic launch shape (benchmarks).
    pub fn run_packed(
        &mut self,
        out: &mut CudaSlice<u32>,
        logits: &CudaSlice<f32>,
        rows: usize,
        vocab: usize,
        k: usize,
        plan: Option<TopKPlan>,
    ) -> Result<Option<TopKPlan>, CudaError> {
        if out.len() < 2 * rows * k {
            return Err(CudaError::Invalid(format!("top-{k} of {rows} rows into a buffer of {}", out.len())));
        }
        let i = dptr(out, &self.device);
        self.run_at(i, i + (rows * k * 4) as u64, logits, rows, vocab, k, plan)
    }

    /// The launches, writing to device addresses `ids` and `values` (`[rows, k]` each, checked by
    /// the callers).
    #[allow(clippy::too_many_arguments)]
    fn run_at(
        &mut self,
        ids: u64,
        values: u64,
        logits: &CudaSlice<f32>,
        rows: usize,
        vocab: usize,
        k: usize,
        plan: Option<TopKPlan>,
    ) -> Result<Option<TopKPlan>, CudaError> {
        if k == 0 || rows == 0 {
            return Ok(None);
        }
        if logits.len() < rows * vocab {
            return Err(CudaError::Invalid(format!("top-k of {rows} rows of {vocab} in {} logits", logits.len())));
        }
        let plan = match plan {
            Some(p) => {
                let ok = TOP_K_CHUNKS.contains(&p.chunk)
                    && p.chunks == vocab.div_ceil(p.chunk)
                    && p.chunks * k <= TOP_K_MERGE_CAP
                    && TopKPlan::new(rows, vocab, k, 1, None).is_ok();
                if !ok {
                    return Err(CudaError::Invalid(format!("top-{k} plan {p:?} for rows of {vocab}")));
                }
                p
            }
            None => self.plan(rows, vocab, k)?,
        };
        let need = rows * plan.chunks * k;
        if self.part.as_ref().is_none_or(|p| p.len() < need) {
            self.part = None;
            let n = need.next_power_of_two();
            self.part = Some(self.device.stream().alloc_zeros::<u64>(n).map_err(launch_err("cuMemAlloc"))?);
        }
        let part = dptr(self.part.as_ref().expect("allocated above"), &self.device);
        let l = dptr(logits, &self.device);
        let (v32, k32, c32, pre) = (vocab as u32, k as u32, plan.chunks as u32, plan.prefilter as u32);
        let vec4 = (vocab.is_multiple_of(4) && l.is_multiple_of(16)) as u32;
        let which = TOP_K_CHUNKS.iter().position(|&c| c == plan.chunk).expect("plans take a listed chunk");
        debug_assert!(plan.chunks * plan.chunk >= vocab && plan.chunks * k <= TOP_K_MERGE_CAP);

        let stream = self.device.stream();
        let mut b = stream.launch_builder(&self.partial[which]);
        b.arg(&part).arg(&l).arg(&v32).arg(&k32).arg(&vec4).arg(&pre);
        let cfg = LaunchConfig { grid_dim: (c32, rows as u32, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: pk_topk_partial_N(u64*, const float*, u32, u32, u32, u32); part holds rows·chunks·k
        // keys, logits rows·vocab floats (checked above); vec4 only for 16-byte aligned rows.
        unsafe { b.launch(cfg) }.map_err(launch_err("cuLaunchKernel(pk_topk_partial)"))?;

        let mut b = stream.launch_builder(&self.merge);
        b.arg(&ids).arg(&values).arg(&part).arg(&l).arg(&v32).arg(&c32).arg(&k32).arg(&pre);
        let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (512, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: pk_topk_merge(u32*, float*, const u64*, const float*, u32, u32, u32, u32); ids and
        // values hold rows·k entries (checked by the callers), chunks·k ≤ the merge's capacity.
        unsafe { b.launch(cfg) }.map_err(launch_err("cuLaunchKernel(pk_topk_merge)"))?;
        Ok(Some(plan))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_fill_the_device_and_fit_the_merge() {
        // One SmolLM2 row on 132 SMs: the smallest chunk (48 CTAs, still under 264).
        assert_eq!(
            TopKPlan::new(1, 49152, 65, 132, None).unwrap(),
            TopKPlan { chunk: 1024, chunks: 48, prefilter: false }
        );
        // 64 Llama 3 rows: 32 chunks of 4096 each already give 2048 CTAs.
        assert_eq!(
            TopKPlan::new(64, 128256, 65, 132, None).unwrap(),
            TopKPlan { chunk: 4096, chunks: 32, prefilter: false }
        );
        // k = 128 over 128256: 126 chunks of 1024 would be 16128 keys to merge; 2048 fits.
        assert_eq!(
            TopKPlan::new(1, 128256, 128, 132, None).unwrap(),
            TopKPlan { chunk: 2048, chunks: 63, prefilter: false }
        );
        // A forced chunk that does not fit falls back to the automatic one.
        assert_eq!(TopKPlan::new(1, 128256, 128, 132, Some(1024)).unwrap().chunk, 2048);
        assert_eq!(TopKPlan::new(1, 128256, 65, 132, Some(4096)).unwrap().chunk, 4096);
        assert_eq!(TopKPlan::new(3, 7, 5, 132, None).unwrap(), TopKPlan { chunk: 1024, chunks: 1, prefilter: false });
        // The prefilter: 4096-entry chunks and k <= 16 only.
        assert!(TopKPlan::new(64, 49152, 16, 132, None).unwrap().prefilter);
        assert!(!TopKPlan::new(64, 49152, 17, 132, None).unwrap().prefilter);
        assert!(!TopKPlan::new(1, 49152, 8, 132, None).unwrap().prefilter);
    }

    #[test]
    fn out_of_range_sizes_are_typed_errors() {
        assert!(matches!(TopKPlan::new(1, 1000, 0, 132, None), Err(CudaError::Unsupported(_))));
        assert!(matches!(TopKPlan::new(1, 1000, 129, 132, None), Err(CudaError::Unsupported(_))));
        assert!(matches!(TopKPlan::new(1, 0, 4, 132, None), Err(CudaError::Invalid(_))));
        assert!(matches!(TopKPlan::new(70000, 1000, 4, 132, None), Err(CudaError::Unsupported(_))));
        // 2M entries with k = 128: 512 chunks of 4096 × 128 keys is past the merge.
        assert!(matches!(TopKPlan::new(1, 2 << 20, 128, 132, None), Err(CudaError::Unsupported(_))));
    }
}
