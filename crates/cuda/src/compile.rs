//! Kernel compilation: the CUDA C++ sources in `kernels/` (embedded with `include_str!`) are
//! compiled by NVRTC straight to a cubin for the device's architecture (`--gpu-architecture=
//! sm_XY`, from its compute capability) and cached on disk under `$PAGEKV_HOME/kernels` (or
//! `~/.cache/pagekv/kernels`), keyed by a hash of source + options + architecture, so the
//! second run loads in milliseconds. A module is specialized per KV format, head_dim and group
//! size ([`ModuleSpec`]) so every loop over a head vector unrolls.
//!
//! NVRTC needs no GPU: [`prebuild`] fills the cache on a machine without one.

use std::ffi::{CStr, CString};
use std::path::PathBuf;

use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};
use kvcache::{Codec, KvFormat};

use crate::CudaError;

const COMMON: &str = include_str!("../kernels/common.cuh");
const CACHE_WRITE: &str = include_str!("../kernels/cache_write.cu");
const DECODE: &str = include_str!("../kernels/decode.cu");
const BENCH: &str = include_str!("../kernels/bench.cu");

/// Which kernels a module holds and how they are specialized.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ModuleSpec {
    /// Cache write (+ decode attention and merge when `group > 0`) for one format and head_dim.
    Kv { format: KvFormat, head_dim: usize, group: usize },
    /// Benchmark helpers (random fill, read bandwidth).
    Bench,
}

/// (codec id, bits) as the kernels' `CODEC_*` constants.
fn codec_id(c: Codec) -> (u32, u32) {
    match c {
        Codec::F32 => (0, 32),
        Codec::F16 => (1, 16),
        Codec::Bf16 => (2, 16),
        Codec::Q8 => (3, 8),
        Codec::Q4 => (4, 4),
        Codec::LloydMax { bits } => (5, bits as u32),
    }
}

/// Checks that the kernels serve `format` at `head_dim`.
pub fn check_supported(format: KvFormat, head_dim: usize) -> Result<(), CudaError> {
    format.validate(head_dim).map_err(|e| CudaError::Invalid(e.to_string()))?;
    let quantized = !matches!(format, KvFormat::F32 | KvFormat::F16 | KvFormat::Bf16);
    if quantized && head_dim % 32 != 0 {
        return Err(CudaError::Unsupported(format!(
            "{format} with head_dim {head_dim}: the GPU kernels need a multiple of 32 for quantized formats"
        )));
    }
    if head_dim > 1024 {
        return Err(CudaError::Unsupported(format!("head_dim {head_dim} > 1024")));
    }
    Ok(())
}

impl ModuleSpec {
    fn source(&self) -> String {
        match self {
            ModuleSpec::Kv { .. } => [COMMON, CACHE_WRITE, DECODE].join("\n"),
            ModuleSpec::Bench => [COMMON, BENCH].join("\n"),
        }
    }

    fn defines(&self) -> Vec<String> {
        let (format, d, g) = match *self {
            ModuleSpec::Kv { format, head_dim, group } => (format, head_dim, group),
            ModuleSpec::Bench => (KvFormat::F32, 128, 0),
        };
        let (kc, kb) = codec_id(format.key_codec());
        let (vc, vb) = codec_id(format.value_codec());
        let rot_block = 1usize << d.trailing_zeros();
        vec![
            format!("-DPK_KC={kc}"),
            format!("-DPK_KBITS={kb}"),
            format!("-DPK_VC={vc}"),
            format!("-DPK_VBITS={vb}"),
            format!("-DPK_D={d}"),
            format!("-DPK_G={g}"),
            format!("-DPK_ROT_BLOCK={rot_block}"),
        ]
    }

    fn options(&self, arch: (u32, u32)) -> Vec<String> {
        let mut o = vec![format!("--gpu-architecture=sm_{}{}", arch.0, arch.1), "-std=c++17".to_string()];
        o.extend(self.defines());
        o
    }
}

/// Directory of the on-disk kernel cache.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(home) = std::env::var_os("PAGEKV_HOME") {
        return Some(PathBuf::from(home).join("kernels"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/pagekv/kernels"))
}

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

/// The cubin of `spec` for `arch`: from the disk cache, else compiled (and cached).
pub(crate) fn cubin(spec: &ModuleSpec, arch: (u32, u32)) -> Result<Vec<u8>, CudaError> {
    let src = spec.source();
    let opts = spec.options(arch);
    let key = fnv1a(&[src.as_bytes(), opts.join(" ").as_bytes()]);
    let file = cache_dir().map(|d| d.join(format!("{key:016x}-sm{}{}.cubin", arch.0, arch.1)));
    if let Some(f) = &file {
        if let Ok(bytes) = std::fs::read(f) {
            if !bytes.is_empty() {
                return Ok(bytes);
            }
        }
    }
    let bin = compile_cubin(&src, &opts, arch)?;
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
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Whether libnvrtc can be loaded.
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { nvrtc_sys::is_culib_present() }
}

/// Compiles `src` to a cubin with NVRTC.
fn compile_cubin(src: &str, opts: &[String], arch: (u32, u32)) -> Result<Vec<u8>, CudaError> {
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
        let verbose = std::env::var_os("PAGEKV_NVRTC_VERBOSE").is_some();
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

/// Compiles (or finds in the cache) the module of `spec` for `arch` without touching a GPU;
/// returns the cubin's size. For filling the cache ahead of time (`examples/prebuild.rs`).
pub fn prebuild(spec: &ModuleSpec, arch: (u32, u32)) -> Result<usize, CudaError> {
    if let ModuleSpec::Kv { format, head_dim, .. } = spec {
        check_supported(*format, *head_dim)?;
    }
    cubin(spec, arch).map(|b| b.len())
}

/// Bytes of dynamic shared memory `pk_decode` needs — the host mirror of `SMEM_BYTES` in
/// `kernels/decode.cu` (the kernel traps if it gets less).
pub(crate) fn decode_smem_bytes(format: KvFormat, head_dim: usize, group: usize) -> usize {
    const TT: usize = 32;
    const STAGES: usize = 3;
    let side = |c: Codec| {
        let cb = c.code_bytes(head_dim);
        let ns = c.scales(head_dim);
        let ub = cb / (head_dim / 8);
        let row = cb + 2 * ns;
        let stride = if (4 * ub) % 16 == 0 && 4 * ub < 128 {
            row.div_ceil(128) * 128 + 4 * ub
        } else if 4 * ub >= 128 {
            row.div_ceil(128) * 128 + 16
        } else {
            row.div_ceil(16) * 16
        };
        let levels = if let Codec::LloydMax { bits } = c { 1usize << bits } else { 0 };
        (stride, levels)
    };
    let (ks, kl) = side(format.key_codec());
    let (vs, vl) = side(format.value_codec());
    let floats = group * head_dim + group * TT + 3 * group + kl + vl;
    STAGES * TT * (ks + vs) + 4 * floats
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
    fn decode_smem_matches_the_kernel_layout_for_bf16() {
        // bf16, D = 128: rows of 256 B padded to 320; 3 stages of 32 tokens × (K + V).
        assert_eq!(decode_smem_bytes(KvFormat::Bf16, 128, 4), 3 * 32 * 640 + 4 * (512 + 128 + 12));
    }

    #[test]
    fn unsupported_geometries_are_typed_errors() {
        assert!(matches!(check_supported(KvFormat::Q8, 80), Err(CudaError::Unsupported(_))));
        assert!(check_supported(KvFormat::F16, 80).is_ok());
        assert!(matches!(check_supported(KvFormat::Q8, 12), Err(CudaError::Invalid(_))));
    }
}
