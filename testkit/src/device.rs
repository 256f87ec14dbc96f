//! The raw CUDA driver calls that the GPU harnesses share: GPU 0 made current, generated kernels
//! loaded from PTX and launched on the default stream, buffers, timing with CUDA events. Used
//! by the kernel check (`kernel_check`) and the fused-attention harness
//! (runtime/tests/support/attention_device.rs), which includes this file by path: the runtime
//! may not depend on the test kit, a layer above it (runtime/tests/layers.rs). So this file
//! names nothing of the test kit, only cudarc and the kernels' description. The runtime's own
//! executor does not use it: it owns its contexts, streams and one allocation
//! (runtime/src/cuda/).
//!
//! What does not need a GPU (the argument packing of a launch, the median of the timings, the
//! refusal without a driver) is tested on any machine (the tests below).

use cudarc::driver::{result, sys};
use ingot_kernels::cuda::CudaKernel;
use std::collections::HashMap;
use std::ffi::{c_void, CString};

/// A result whose error says which driver call failed and why.
pub type Res<T> = Result<T, String>;

/// `r` with its error named by `what`.
pub fn driver<T>(what: &str, r: Result<T, result::DriverError>) -> Res<T> {
    r.map_err(|e| format!("{what}: {e:?}"))
}

/// GPU 0, made current on this thread (its primary context, retained for the process).
#[derive(Clone, Debug)]
pub struct Gpu {
    pub name: String,
    /// Compute capability (major, minor).
    pub compute: (i32, i32),
    /// NVRTC's architecture for it (`compute_90`).
    pub arch: &'static str,
    /// The device, whose primary context [`init`] retained: released by the caller that wants
    /// it released (`result::primary_ctx::release`), kept for the process otherwise.
    pub device: sys::CUdevice,
}

/// Makes GPU 0 current; an error where there is no driver, no NVRTC or no GPU.
pub fn init() -> Res<Gpu> {
    // SAFETY: only tries to open the driver library; nothing of it is called.
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver (libcuda.so could not be loaded)".into());
    }
    // SAFETY: only tries to open the NVRTC library; nothing of it is called.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err("the CUDA driver is present but NVRTC is not; install NVRTC".into());
    }
    driver("cuInit", result::init())?;
    let dev = driver("cuDeviceGet", result::device::get(0))?;
    let name = driver("device name", result::device::get_name(dev))?;
    let attr = |a| {
        // SAFETY: `dev` is device 0, obtained above; the attribute is written into the
        // returned value only.
        driver("attribute", unsafe {
            result::device::get_attribute(dev, a)
        })
    };
    let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    // SAFETY: `dev` is a valid device (obtained above); its primary context stays retained
    // until the caller releases it ([`Gpu::device`]), after its last use of the context.
    let ctx = driver("context", unsafe { result::primary_ctx::retain(dev) })?;
    // SAFETY: `ctx` was retained just above and is released only by the caller, after use.
    driver("context", unsafe { result::ctx::set_current(ctx) })?;
    let arch: &'static str = Box::leak(format!("compute_{major}{minor}").into_boxed_str());
    Ok(Gpu {
        name,
        compute: (major, minor),
        arch,
        device: dev,
    })
}

/// A function of a module [`load`]ed: only `load` makes one, so a launch of it names a live
/// function for as long as the module stays loaded (the callers unload a module, if ever, only
/// after their last launch: `kernel_check` at its end).
#[derive(Clone, Copy, Debug)]
pub struct Function(sys::CUfunction);

/// Loads the module `ptx` (in the current context) and looks up the functions `names`.
pub fn load<'a>(
    ptx: String,
    names: impl IntoIterator<Item = &'a str>,
) -> Res<(sys::CUmodule, HashMap<String, Function>)> {
    let image = CString::new(ptx).map_err(|e| e.to_string())?;
    // SAFETY: `image` is a NUL-terminated PTX text that outlives the call, and [`init`] made a
    // context current on this thread.
    let module = driver("loading a module", unsafe {
        result::module::load_data(image.as_ptr() as *const c_void)
    })?;
    let mut functions = HashMap::new();
    for name in names {
        let c = CString::new(name).map_err(|e| e.to_string())?;
        // SAFETY: `module` was loaded just above and is never unloaded; the name is a
        // NUL-terminated C string.
        let f = driver("cuModuleGetFunction", unsafe {
            result::module::get_function(module, c)
        })?;
        functions.insert(name.to_string(), Function(f));
    }
    Ok((module, functions))
}

/// The kernel parameter array of a launch whose arguments are all device pointers: one
/// pointer to each of `values` (which must outlive the launch).
pub fn pointer_params(values: &mut [u64]) -> Vec<*mut c_void> {
    values
        .iter_mut()
        .map(|v| v as *mut u64 as *mut c_void)
        .collect()
}

/// Launches `k` (its function `f`, of a module [`load`]ed) on the default stream with its
/// pointer parameters at `args`, device addresses (which may lie inside a buffer, as packed
/// k and v lie in q's); asynchronously.
pub fn launch(f: Function, k: &CudaKernel, args: &[sys::CUdeviceptr]) -> Res<()> {
    let mut values: Vec<u64> = args.to_vec();
    let mut params = pointer_params(&mut values);
    let l = k.launch;
    // SAFETY: `params` holds one pointer per kernel argument, each to a live `u64` device
    // pointer of `values` (alive until the call returns, when the driver has copied them), as
    // the generated kernel's signature takes them; `f` is a function of a loaded module
    // ([`Function`]); the null stream is the current context's default.
    driver("cuLaunchKernel", unsafe {
        result::launch_kernel(
            f.0,
            (l.grid[0], l.grid[1], l.grid[2]),
            (l.block[0], l.block[1], l.block[2]),
            l.shared_bytes,
            std::ptr::null_mut(),
            &mut params,
        )
    })
}

/// Registers a thread and local (spilled) bytes a thread of function `f` (-1 where the driver
/// does not say).
pub fn resources(f: Function) -> (i32, i32) {
    use sys::CUfunction_attribute_enum as A;
    // SAFETY: `f` is a function of a loaded module ([`Function`]); reading an attribute
    // writes only the returned value.
    let get = |a| unsafe { result::function::get_function_attribute(f.0, a) }.unwrap_or(-1);
    (
        get(A::CU_FUNC_ATTRIBUTE_NUM_REGS),
        get(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES),
    )
}

/// Waits for every launch in the current context.
pub fn sync() -> Res<()> {
    driver("kernel execution", result::ctx::synchronize())
}

/// A device allocation of `bytes` (at least one) in the current context; the caller frees it
/// ([`free`]).
pub fn alloc(bytes: usize) -> Res<sys::CUdeviceptr> {
    // SAFETY: a plain device allocation in the current context; the caller frees it.
    driver("cuMemAlloc", unsafe { result::malloc_sync(bytes.max(1)) })
}

/// Frees `ptr`, an allocation of [`alloc`] no pending launch uses.
pub fn free(ptr: sys::CUdeviceptr) {
    // SAFETY: the caller passes a pointer from `alloc`, once, with no launch pending on it
    // (every use ends in `sync`).
    let _ = unsafe { result::free_sync(ptr) };
}

/// Sets the `bytes` bytes at `ptr` to `byte`.
pub fn memset(ptr: sys::CUdeviceptr, byte: u8, bytes: usize) -> Res<()> {
    // SAFETY: the callers pass a buffer of at least `bytes` bytes ([`alloc`]); the copy is
    // synchronous.
    driver("memset", unsafe {
        result::memset_d8_sync(ptr, byte, bytes)
    })
}

/// Copies `bytes` to `ptr`.
pub fn upload(ptr: sys::CUdeviceptr, bytes: &[u8]) -> Res<()> {
    // SAFETY: the callers pass a buffer of at least `bytes.len()` bytes ([`alloc`]); the copy
    // is synchronous, so `bytes` need live only for the call.
    driver("upload", unsafe { result::memcpy_htod_sync(ptr, bytes) })
}

/// Copies the `into.len()` bytes at `ptr` into `into`, after every launch has finished.
pub fn download(ptr: sys::CUdeviceptr, into: &mut [u8]) -> Res<()> {
    sync()?;
    // SAFETY: the callers pass a buffer of at least `into.len()` bytes ([`alloc`]); no launch
    // writes it any more (`sync` above); the copy is synchronous.
    driver("download", unsafe { result::memcpy_dtoh_sync(into, ptr) })
}

/// The median of `ms` (the upper one of an even count), sorted in place.
pub fn median(ms: &mut [f64]) -> f64 {
    ms.sort_by(f64::total_cmp);
    ms[ms.len() / 2]
}

/// Median milliseconds of `reps` runs of `run` after 3 warm-ups (CUDA events around each run,
/// on the default stream).
pub fn time_ms(reps: usize, mut run: impl FnMut() -> Res<()>) -> Res<f64> {
    let event = || {
        driver(
            "event",
            result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT),
        )
    };
    let (start, end) = (event()?, event()?);
    for _ in 0..3 {
        run()?;
    }
    sync()?;
    let mut ms = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        // SAFETY: `start` and `end` are events created above in the current context and
        // destroyed only after the loop; the null stream is the context's default.
        unsafe {
            driver("record", result::event::record(start, std::ptr::null_mut()))?;
            run()?;
            driver("record", result::event::record(end, std::ptr::null_mut()))?;
            driver("event sync", result::event::synchronize(end))?;
            ms.push(f64::from(driver(
                "elapsed",
                result::event::elapsed(start, end),
            )?));
        }
    }
    // SAFETY: the events are not used after this, and every record on them has completed
    // (`synchronize(end)` above).
    unsafe {
        let _ = result::event::destroy(start);
        let _ = result::event::destroy(end);
    }
    Ok(median(&mut ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_launch_passes_a_pointer_to_each_argument_value() {
        let mut values = [7u64, 0x1000, u64::MAX];
        let params = pointer_params(&mut values);
        assert_eq!(params.len(), 3);
        for (p, v) in params.iter().zip(values) {
            // SAFETY: each parameter points at an element of `values`, alive and unchanged.
            assert_eq!(unsafe { *(*p as *const u64) }, v);
        }
    }

    #[test]
    fn the_median_of_the_timings_is_the_middle_one() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 3.0);
        assert_eq!(median(&mut [5.0]), 5.0);
    }

    #[test]
    fn without_a_driver_init_says_so_and_does_not_panic() {
        // SAFETY: only tries to open the driver library.
        if unsafe { sys::is_culib_present() } {
            return; // a machine with a driver: nothing to check here
        }
        let e = init().unwrap_err();
        assert!(e.contains("no CUDA driver"), "{e}");
    }
}
