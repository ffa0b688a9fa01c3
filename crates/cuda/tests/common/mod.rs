//! Helpers shared by the GPU test binaries: the visible skip line, the shared device, fresh
//! normal values, uploads/downloads, and the relative error the kernel tests bound.
//! (Each test binary uses a part of them.)
#![allow(dead_code)]

use std::io::Write;

/// Prints `SKIPPED <test>: <reason>` to the real stderr (not through eprintln!, which the test
/// harness captures), so `cargo test` shows why a GPU test passed without running.
pub fn skip(test: &str, reason: &str) {
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {reason}");
}

#[cfg(feature = "cuda")]
mod gpu {
    use std::sync::{Arc, OnceLock};

    use cudarc::driver::CudaSlice;
    use pagekv_cuda::{CudaDevice, CudaError, CudaTuning};
    use rand::rngs::StdRng;
    use rand::Rng;
    use rand_distr::StandardNormal;

    /// The tuning the tests run with: the defaults with the `PAGEKV_DEV_CUDA_*` switches of the
    /// environment applied (tuning runs); a bad value fails the test.
    pub fn tuning() -> CudaTuning {
        pagekv_cuda::dev::tuning_from_env().expect("PAGEKV_DEV_CUDA_* switches")
    }

    /// Device 0 opened with [`tuning`], or why there is none.
    pub fn open(ordinal: usize) -> Result<Arc<CudaDevice>, CudaError> {
        CudaDevice::new(ordinal, tuning())
    }

    /// The process's device 0, opened once, or `None` (after printing why) when there is none.
    pub fn device(test: &str) -> Option<Arc<CudaDevice>> {
        static DEVICE: OnceLock<Result<Arc<CudaDevice>, CudaError>> = OnceLock::new();
        match DEVICE.get_or_init(|| open(0)) {
            Ok(d) => Some(d.clone()),
            Err(e) => {
                super::skip(test, &format!("no usable CUDA device ({e})"));
                None
            }
        }
    }

    pub fn normal(rng: &mut StdRng) -> f32 {
        rng.sample::<f32, _>(StandardNormal)
    }

    pub fn up<T: cudarc::driver::DeviceRepr>(dev: &CudaDevice, x: &[T]) -> CudaSlice<T> {
        dev.stream().clone_htod(x).expect("upload")
    }

    pub fn down<T: cudarc::driver::DeviceRepr + Default + Clone>(dev: &CudaDevice, x: &CudaSlice<T>) -> Vec<T> {
        dev.stream().clone_dtoh(x).expect("download")
    }

    /// Max over head vectors (`d` values each) of `‖a − b‖∞ / ‖b‖∞`; NaN (an unwritten output)
    /// is infinite.
    pub fn rel_error(a: &[f32], b: &[f32], d: usize) -> f32 {
        let mut worst = 0f32;
        for (ra, rb) in a.chunks(d).zip(b.chunks(d)) {
            let scale = rb.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
            let err = ra
                .iter()
                .zip(rb)
                .fold(0f32, |m, (x, y)| if (x - y).is_nan() { f32::INFINITY } else { m.max((x - y).abs()) });
            worst = worst.max(err / scale);
        }
        worst
    }
}
#[cfg(feature = "cuda")]
#[allow(unused_imports)]
pub use gpu::*;
