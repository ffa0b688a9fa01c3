//! [`DeviceTopK`]: the device top-k behind `Forward::forward_top_k` — each logit row's `k` best
//! entries selected by `pagekv_cuda::TopK` (`backend::top_k`'s rule) and only `[rows, k]` ids
//! and values copied to the host. Launched after the step, like the argmax: outside the
//! captured step graphs (its workspace grows on demand).

use std::sync::Arc;

use pagekv_cuda::{CudaDevice, DeviceVec, TopK};

use super::buffers::{dev, drv, zeros};
use crate::error::ModelError;

/// The top-k kernels, their output buffer and its host copy.
pub(crate) struct DeviceTopK {
    kernels: TopK,
    out: Option<DeviceVec<u32>>, // [2, rows, k] ids, then the values' bits (grown on demand)
    host: Vec<u32>,              // [2, rows, k] the copy of `out`
}

impl DeviceTopK {
    /// Loads (compiling on first use) the kernels on `device`.
    pub(crate) fn new(device: Arc<CudaDevice>) -> Result<DeviceTopK, ModelError> {
        Ok(DeviceTopK { kernels: TopK::new(device).map_err(dev)?, out: None, host: Vec::new() })
    }

    /// Whether the kernels serve `rows` rows of `vocab` entries at `k` (not past `TOP_K_MAX`,
    /// nor vocabularies past the merge's capacity).
    pub(crate) fn serves(&self, rows: usize, vocab: usize, k: usize) -> bool {
        self.kernels.plan(rows, vocab, k).is_ok()
    }

    /// Appends the `k` best entries of each row of `logits [rows, vocab]` (on the device) to
    /// `ids` and `values`, best first; sizes [`Self::serves`] accepts.
    pub(crate) fn select(
        &mut self,
        logits: &DeviceVec<f32>,
        rows: usize,
        vocab: usize,
        k: usize,
        ids: &mut Vec<u32>,
        values: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        let n = rows * k;
        let device = self.kernels.device().clone();
        if self.out.as_ref().is_none_or(|o| o.len() < 2 * n) {
            self.out = None;
            self.out = Some(zeros(&device, (2 * n).next_power_of_two())?);
        }
        let out = self.out.as_mut().expect("allocated above");
        self.kernels.run_packed(out, logits, rows, vocab, k, None).map_err(dev)?;
        self.host.resize(2 * n, 0);
        device.stream().memcpy_dtoh(&out.slice(..2 * n), &mut self.host[..]).map_err(drv("cuMemcpyDtoH"))?;
        ids.extend_from_slice(&self.host[..n]);
        values.extend(self.host[n..].iter().map(|&b| f32::from_bits(b)));
        Ok(())
    }
}
