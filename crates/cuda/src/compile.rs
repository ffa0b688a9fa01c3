//! Kernel compilation: a module's source and options ([`ModuleSpec`]) are compiled by NVRTC
//! straight to a cubin for the device's architecture (`--gpu-architecture=sm_XY`, from its
//! compute capability) and cached on disk in the tuning's `kernel_cache` directory
//! (`$PAGEKV_HOME/kernels`, or `~/.cache/pagekv/kernels`), keyed by a hash of source + options +
//! architecture, so the second run loads in milliseconds.
//!
//! NVRTC needs no GPU: [`prebuild`] fills the cache on a machine without one.

use std::ffi::{CStr, CString};

use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};

use crate::shapes::check_supported;
use crate::spec::ModuleSpec;
use crate::tuning::CudaTuning;
use crate::CudaError;

/// FNV-1a 64: a stable hash for cache keys (std's hasher may change between Rust versions).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The cubin of `spec` for `arch` under `tuning`: from the disk cache, else compiled (and
/// cached).
pub(crate) fn cubin(spec: &ModuleSpec, arch: (u32, u32), tuning: &CudaTuning) -> Result<Vec<u8>, CudaError> {
    let src = spec.source();
    let opts = spec.options(arch, tuning);
    let key = fnv1a(&[src.as_bytes(), opts.join(" ").as_bytes()]);
    let file = tuning.kernel_cache.as_ref().map(|d| d.join(format!("{key:016x}-sm{}{}.cubin", arch.0, arch.1)));
    if let Some(f) = &file {
        if let Ok(bytes) = std::fs::read(f) {
            if !bytes.is_empty() {
                return Ok(bytes);
            }
        }
    }
    let bin = compile_cubin(&src, &opts, arch, tuning.nvrtc_verbose)?;
    if let Some(f) = &file {
        // A cache that cannot be written only costs a recompile next time; say so once.
        if let Err(e) = store(f, &bin) {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| eprintln!("pagekv-cuda: warning: {e}"));
        }
    }
    Ok(bin)
}

fn store(path: &std::path::Path, bytes: &[u8]) -> Result<(), CudaError> {
    let io = |e: std::io::Error| CudaError::CacheIo { path: path.display().to_string(), msg: e.to_string() };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    // A temporary name of its own per call: threads of one process that compile the same module
    // at once must not write into (and rename) each other's half-written file — a reader could
    // then load a truncated cubin.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp{}-{n}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Whether libnvrtc can be loaded.
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { nvrtc_sys::is_culib_present() }
}

/// Compiles `src` to a cubin with NVRTC; `verbose` prints NVRTC's log (ptxas register and spill
/// counts).
fn compile_cubin(src: &str, opts: &[String], arch: (u32, u32), verbose: bool) -> Result<Vec<u8>, CudaError> {
    if !nvrtc_available() {
        return Err(CudaError::NoNvrtc);
    }
    let arch_s = format!("sm_{}{}", arch.0, arch.1);
    let csrc = CString::new(src).map_err(|_| CudaError::Invalid("kernel source contains NUL".into()))?;
    let name = CString::new("pagekv.cu").expect("no NUL");
    let nv = |op: &'static str| move |e: nvrtc::NvrtcError| CudaError::Driver { op, msg: format!("{e:?}") };
    let prog = nvrtc::create_program(&csrc, Some(&name)).map_err(nv("nvrtcCreateProgram"))?;
    // SAFETY: prog is a live program until destroy_program below; buffers are sized by NVRTC.
    let result = unsafe {
        let mut all: Vec<String> = opts.to_vec();
        if verbose {
            all.push("--ptxas-options=-v".into());
        }
        let compiled = nvrtc::compile_program(prog, &all);
        if verbose {
            if let Ok(l) = nvrtc::get_program_log(prog) {
                eprintln!("{}", CStr::from_ptr(l.as_ptr()).to_string_lossy());
            }
        }
        match compiled {
            Err(_) => {
                let log = nvrtc::get_program_log(prog)
                    .map(|l| CStr::from_ptr(l.as_ptr()).to_string_lossy().into_owned())
                    .unwrap_or_default();
                Err(CudaError::Compile { arch: arch_s, options: opts.join(" "), log })
            }
            Ok(()) => {
                let mut size = 0usize;
                let r = nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size);
                if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
                    Err(CudaError::Driver { op: "nvrtcGetCUBINSize", msg: format!("{r:?}") })
                } else {
                    let mut bin = vec![0u8; size];
                    let r = nvrtc_sys::nvrtcGetCUBIN(prog, bin.as_mut_ptr() as *mut std::ffi::c_char);
                    if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
                        Err(CudaError::Driver { op: "nvrtcGetCUBIN", msg: format!("{r:?}") })
                    } else {
                        Ok(bin)
                    }
                }
            }
        }
    };
    // SAFETY: prog was created above and is destroyed once.
    let _ = unsafe { nvrtc::destroy_program(prog) };
    result
}

/// Compiles (or finds in the cache) the module of `spec` for `arch` under `tuning` without
/// touching a GPU; returns the cubin's size. For filling the cache ahead of time
/// (`examples/prebuild.rs`).
pub fn prebuild(spec: &ModuleSpec, arch: (u32, u32), tuning: &CudaTuning) -> Result<usize, CudaError> {
    if let ModuleSpec::Kv { format, head_dim, .. } = spec {
        check_supported(*format, *head_dim)?;
    }
    cubin(spec, arch, tuning).map(|b| b.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_key_changes_with_source_and_options() {
        let a = fnv1a(&[b"src", b"-DPK_D=128"]);
        assert_ne!(a, fnv1a(&[b"src", b"-DPK_D=64"]));
        assert_ne!(a, fnv1a(&[b"src2", b"-DPK_D=128"]));
        assert_eq!(a, fnv1a(&[b"src", b"-DPK_D=128"]));
    }

    #[test]
    fn concurrent_stores_of_one_module_leave_one_whole_cubin() {
        // Threads of one process compiling the same module store it at once (the kernel tests
        // do): each writes a file of its own before the rename, so the cache holds one writer's
        // bytes whole, never a mix or a truncation.
        let dir = std::env::temp_dir().join(format!("pagekv-store-{}", std::process::id()));
        let path = dir.join("module.cubin");
        for round in 0..8u8 {
            std::thread::scope(|s| {
                for t in 0..8u8 {
                    let path = &path;
                    s.spawn(move || store(path, &vec![round * 8 + t; 1 << 20]).expect("store"));
                }
            });
            let got = std::fs::read(&path).expect("read");
            assert_eq!(got.len(), 1 << 20, "round {round}");
            assert!(got.iter().all(|&b| b == got[0]), "round {round}: bytes of two writers");
            assert_eq!(got[0] / 8, round);
        }
        let left: Vec<_> = std::fs::read_dir(&dir).expect("dir").map(|e| e.expect("entry").file_name()).collect();
        assert_eq!(left, vec![std::ffi::OsString::from("module.cubin")], "temporary files left behind");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
