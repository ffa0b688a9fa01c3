//! [`CudaDevice`]: one GPU's context and stream, its properties, the [`CudaTuning`] its kernels
//! are compiled and launched with, and the kernel modules loaded on it (compiled on first use
//! through [`crate::compile`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::CUdevice_attribute as Attr;
use cudarc::driver::{result, CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;
use kvcache::format::lloyd_max::codebook;
use kvcache::Codec;

use crate::compile;
use crate::shapes::{
    check_supported, decode_smem_bytes, decode_tc_smem_bytes, prefill_smem_bytes, prefill_supported, tc_supported,
    tc_vreg, tc_vreg_smem_bytes,
};
use crate::spec::ModuleSpec;
use crate::tuning::CudaTuning;
use crate::CudaError;

/// Number of CUDA devices; checks the driver library before calling into it.
pub(crate) fn device_count() -> Result<usize, CudaError> {
    // SAFETY: only tries to dlopen libcuda.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(CudaError::NoDriver);
    }
    result::init().map_err(|e| CudaError::Init(format!("{e:?}")))?;
    let n = result::device::get_count().map_err(|e| CudaError::driver("cuDeviceGetCount", e))?;
    Ok(n.max(0) as usize)
}

/// A loaded kernel module and its functions.
pub(crate) struct KernelModule {
    module: Arc<CudaModule>,
}

impl KernelModule {
    pub(crate) fn function(&self, name: &str) -> Result<CudaFunction, CudaError> {
        self.module.load_function(name).map_err(|e| CudaError::driver("cuModuleGetFunction", e))
    }
}

/// Work recorded by [`CudaDevice::capture_graph`], replayed on the device's stream by
/// [`DeviceGraph::launch`] with the same kernel arguments (device addresses included).
pub struct DeviceGraph {
    graph: cudarc::driver::CudaGraph,
}

impl DeviceGraph {
    pub fn launch(&self) -> Result<(), CudaError> {
        self.graph.launch().map_err(|e| CudaError::driver("cuGraphLaunch", e))
    }
}

/// A context and stream on one GPU.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    ordinal: usize,
    name: String,
    arch: (u32, u32),
    sm_count: usize,
    /// Largest dynamic shared memory one block may opt into, bytes.
    smem_optin: usize,
    tuning: CudaTuning,
    modules: Mutex<HashMap<ModuleSpec, Arc<KernelModule>>>,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaDevice(cuda {}: {}, sm_{}{}, {} SMs)",
            self.ordinal, self.name, self.arch.0, self.arch.1, self.sm_count
        )
    }
}

impl CudaDevice {
    /// Opens device `ordinal`, whose kernels are compiled and launched with `tuning`. Errors
    /// (never panics) when the driver library is missing, the driver does not initialize, or the
    /// device does not exist.
    pub fn new(ordinal: usize, tuning: CudaTuning) -> Result<Arc<CudaDevice>, CudaError> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(CudaError::NoDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| CudaError::driver("cuDevicePrimaryCtxRetain", e))?;
        // One stream orders all work: per-buffer event tracking would only add launches.
        // SAFETY: no buffers exist yet on this context.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(|e| CudaError::driver("cuStreamCreate", e))?;
        let attr = |a: Attr| ctx.attribute(a).map_err(|e| CudaError::driver("cuDeviceGetAttribute", e));
        let arch = (
            attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? as u32,
            attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)? as u32,
        );
        if arch.0 < 8 {
            return Err(CudaError::Unsupported(format!(
                "compute capability {}.{}: the kernels need 8.0 or newer (cp.async, bf16)",
                arch.0, arch.1
            )));
        }
        let sm_count = attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as usize;
        let smem_optin = attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as usize;
        let name = ctx.name().unwrap_or_else(|_| "unknown".into());
        Ok(Arc::new(CudaDevice {
            ctx,
            stream,
            ordinal,
            name,
            arch,
            sm_count,
            smem_optin,
            tuning,
            modules: Mutex::new(HashMap::new()),
        }))
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Compute capability (major, minor); kernels are compiled for `sm_{major}{minor}`.
    pub fn arch(&self) -> (u32, u32) {
        self.arch
    }

    pub fn sm_count(&self) -> usize {
        self.sm_count
    }

    /// Largest dynamic shared memory one block may opt into, bytes.
    pub fn smem_optin(&self) -> usize {
        self.smem_optin
    }

    /// The tuning this device's kernels are compiled and launched with.
    pub fn tuning(&self) -> &CudaTuning {
        &self.tuning
    }

    /// Free and total device memory in bytes.
    pub fn memory(&self) -> Result<(usize, usize), CudaError> {
        self.ctx.mem_get_info().map_err(|e| CudaError::driver("cuMemGetInfo", e))
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Makes this device's context current on the calling thread (needed before raw driver
    /// calls; cudarc's safe wrappers do it themselves).
    pub fn bind(&self) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(|e| CudaError::driver("cuCtxSetCurrent", e))
    }

    /// Waits for all work queued on the stream; surfaces asynchronous kernel errors.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.stream.synchronize().map_err(|e| CudaError::driver("cuStreamSynchronize", e))
    }

    /// Records the work `f` queues on this device's stream as a CUDA graph instead of running
    /// it (relaxed capture mode). The outer error is the capture's; the inner one `f`'s (the
    /// capture is ended either way, and nothing was run).
    pub fn capture_graph<E>(&self, f: impl FnOnce() -> Result<(), E>) -> Result<Result<DeviceGraph, E>, CudaError> {
        use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(|e| CudaError::driver("cuStreamBeginCapture", e))?;
        let r = f();
        let graph = self.stream.end_capture(CUgraphInstantiate_flags(0));
        if let Err(e) = r {
            return Ok(Err(e));
        }
        match graph.map_err(|e| CudaError::driver("cuStreamEndCapture", e))? {
            Some(g) => Ok(Ok(DeviceGraph { graph: g })),
            None => Err(CudaError::Invalid("the capture recorded no work".into())),
        }
    }

    /// The module of `spec`, compiled or loaded from the disk cache on first use.
    pub(crate) fn module(&self, spec: &ModuleSpec) -> Result<Arc<KernelModule>, CudaError> {
        let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = modules.get(spec) {
            return Ok(m.clone());
        }
        let tc = &self.tuning.tc;
        if let ModuleSpec::Kv { format, head_dim, group } = spec {
            check_supported(*format, *head_dim)?;
            let smem = decode_smem_bytes(*format, *head_dim, *group);
            if *group > 0 && smem > self.smem_optin {
                return Err(CudaError::Unsupported(format!(
                    "{format} at head_dim {head_dim} with {group} query heads per kv head needs {smem} bytes of \
                     shared memory per block; this device allows {}",
                    self.smem_optin
                )));
            }
        }
        let bin = compile::cubin(spec, self.arch, &self.tuning)?;
        let module =
            self.ctx.load_module(Ptx::from_binary(bin)).map_err(|e| CudaError::driver("cuModuleLoadData", e))?;
        let km = Arc::new(KernelModule { module });
        if let ModuleSpec::Kv { format, head_dim, group } = spec {
            self.upload_codebooks(&km, format.key_codec(), "pk_k")?;
            self.upload_codebooks(&km, format.value_codec(), "pk_v")?;
            if *group > 0 {
                let (f, d, g) = (*format, *head_dim, *group);
                let mut kernels = vec![("pk_decode", decode_smem_bytes(f, d, g))];
                if tc_supported(f, d, g) && decode_tc_smem_bytes(tc, f, d) <= self.smem_optin {
                    kernels.push(("pk_decode_tc", decode_tc_smem_bytes(tc, f, d)));
                    if tc_vreg(tc, f, d, g) {
                        kernels.push(("pk_decode_tc_vreg", tc_vreg_smem_bytes(tc, f, d, g)));
                    }
                    // The stream-K grid's need grows with the batch (its per-sequence tables):
                    // the device's limit, checked per call (`shapes::decode_tc_sk_smem_bytes`).
                    kernels.push(("pk_decode_tc_sk", self.smem_optin));
                }
                if prefill_supported(f, d, g) && prefill_smem_bytes(f, d) <= self.smem_optin {
                    kernels.push(("pk_prefill_tc", prefill_smem_bytes(f, d)));
                }
                self.bind()?;
                for (name, bytes) in kernels {
                    set_max_dynamic_smem(&km.function(name)?, bytes)?;
                }
            }
        }
        modules.insert(spec.clone(), km.clone());
        Ok(km)
    }

    /// Uploads the Lloyd–Max levels and bounds of a codec (per-group or sub-scaled) into the
    /// module's constants.
    fn upload_codebooks(&self, km: &KernelModule, codec: Codec, prefix: &str) -> Result<(), CudaError> {
        let (Codec::LloydMax { bits } | Codec::LloydMaxSub { bits }) = codec else { return Ok(()) };
        let book = codebook(bits);
        for (name, values) in [("levels", &book.levels), ("bounds", &book.bounds)] {
            let sym = format!("{prefix}_{name}");
            let mut table = [0f32; 256];
            table[..values.len()].copy_from_slice(values);
            let mut global =
                km.module.get_global(&sym, &self.stream).map_err(|e| CudaError::driver("cuModuleGetGlobal", e))?;
            let bytes: &[u8] = bytemuck_f32(&table);
            self.stream.memcpy_htod(bytes, &mut global).map_err(|e| CudaError::driver("cuMemcpyHtoD", e))?;
        }
        Ok(())
    }
}

fn bytemuck_f32(x: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and any byte pattern is a valid u8.
    unsafe { std::slice::from_raw_parts(x.as_ptr() as *const u8, std::mem::size_of_val(x)) }
}

/// A kernel argument slot for [`launch_kernel`]: the address of `v`.
pub(crate) fn arg<T>(v: &T) -> *mut std::ffi::c_void {
    v as *const T as *mut std::ffi::c_void
}

/// The error of a failed launch of kernel `name`.
pub(crate) fn launch_err(name: &'static str) -> impl Fn(cudarc::driver::DriverError) -> CudaError {
    move |e| CudaError::driver(name, e)
}

/// Dynamic shared memory a product kernel may take: the device's opt-in limit less the kernels'
/// static shared memory (a norm's partial sums), rounded down to a KiB.
pub(crate) fn product_smem_limit(device: &CudaDevice) -> usize {
    device.smem_optin().saturating_sub(1024)
}

/// Lets `f` take up to `bytes` of dynamic shared memory per CTA (at most the device's opt-in
/// limit, `CudaDevice::smem_optin`).
pub(crate) fn set_max_dynamic_smem(f: &CudaFunction, bytes: usize) -> Result<(), CudaError> {
    // SAFETY: a valid function handle of a loaded module; the driver checks the size.
    unsafe {
        result::function::set_function_attribute(
            f.cu_function(),
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes as i32,
        )
    }
    .map_err(|e| CudaError::driver("cuFuncSetAttribute", e))
}

/// Launches `f` on the device's stream (`cuLaunchKernelEx`), with programmatic stream
/// serialization when `programmatic` (programmatic dependent launch, sm_90+): the kernel may then
/// be scheduled while the previous kernel of the stream still runs, and must call `pdl_wait()`
/// (kernels/common.cuh) before it reads that kernel's results or writes what it reads. Used with
/// it for `pk_merge` after the decode kernel, the decode kernels after the cache write, and the
/// model's decode products and QKV/RoPE (the launch gaps between them); without it, a plain
/// launch. One argument list serves both.
///
/// # Safety
/// `args` must point at one value per kernel parameter, of the parameter's type, in order.
pub(crate) unsafe fn launch_kernel(
    dev: &CudaDevice,
    f: &CudaFunction,
    cfg: cudarc::driver::LaunchConfig,
    args: &mut [*mut std::ffi::c_void],
    programmatic: bool,
) -> Result<(), cudarc::driver::DriverError> {
    use cudarc::driver::sys;
    dev.ctx.bind_to_thread()?;
    // SAFETY: a zeroed attribute is a valid value of the C union; id and value are set below.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: dev.stream().cu_stream(),
        attrs: &mut attr,
        numAttrs: programmatic as u32,
    };
    // SAFETY: the caller's contract on `args`; config and attr outlive the call.
    unsafe { sys::cuLaunchKernelEx(&config, f.cu_function(), args.as_mut_ptr(), std::ptr::null_mut()) }.result()
}
