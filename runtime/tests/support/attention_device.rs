//! A minimal raw-kernel harness for the fused-attention kernels on GPU 0 (`#[path]`-included
//! by runtime/tests/cuda_attention.rs and runtime/examples/attention_bench.rs): NVRTC-compiles
//! generated kernels (the prelude first, as the runtime does, several modules compiled in
//! parallel), allocates, copies, launches and times them with CUDA events.

#![allow(dead_code)]

use cudarc::driver::{result, sys};
use ingot_kernels::cuda::{CudaKernel, PRELUDE, PRELUDE_BF16};
use std::collections::HashMap;
use std::ffi::{c_void, CString};

pub type Res<T> = Result<T, String>;

fn driver<T>(what: &str, r: Result<T, result::DriverError>) -> Res<T> {
    r.map_err(|e| format!("{what}: {e:?}"))
}

/// GPU 0 made current; its name and NVRTC architecture (`compute_XY`).
pub fn init() -> Res<(String, &'static str)> {
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver".into());
    }
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err("no NVRTC".into());
    }
    driver("cuInit", result::init())?;
    let dev = driver("cuDeviceGet", result::device::get(0))?;
    let name = driver("device name", result::device::get_name(dev))?;
    let attr = |a| {
        driver("attribute", unsafe {
            result::device::get_attribute(dev, a)
        })
    };
    let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let ctx = driver("context", unsafe { result::primary_ctx::retain(dev) })?;
    driver("context", unsafe { result::ctx::set_current(ctx) })?;
    let arch: &'static str = Box::leak(format!("compute_{major}{minor}").into_boxed_str());
    Ok((name, arch))
}

/// Loaded kernels by name.
pub struct Modules {
    functions: HashMap<String, sys::CUfunction>,
}

/// Compiles `kernels` (each once) in `chunks` modules, in parallel, and loads them.
pub fn compile(kernels: &[&CudaKernel], arch: &'static str, chunks: usize) -> Res<Modules> {
    let mut distinct: Vec<&CudaKernel> = Vec::new();
    for k in kernels {
        if !distinct.iter().any(|d| d.name == k.name) {
            distinct.push(k);
        }
    }
    let per = distinct.len().div_ceil(chunks.max(1)).max(1);
    let groups: Vec<Vec<&CudaKernel>> = distinct.chunks(per).map(|c| c.to_vec()).collect();
    let ptxs: Vec<Res<(String, Vec<String>)>> = std::thread::scope(|s| {
        let hs: Vec<_> = groups
            .iter()
            .map(|g| {
                s.spawn(move || {
                    let mut src = format!("{PRELUDE}{PRELUDE_BF16}");
                    for k in g {
                        src.push_str(&k.source);
                    }
                    let opts = cudarc::nvrtc::CompileOptions {
                        arch: Some(arch),
                        ..Default::default()
                    };
                    let ptx =
                        cudarc::nvrtc::compile_ptx_with_opts(&src, opts).map_err(|e| match e {
                            cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                                let _ = std::fs::write("/tmp/attention_failed.cu", &src);
                                format!("NVRTC rejects: {}", log.to_string_lossy())
                            }
                            e => format!("NVRTC: {e:?}"),
                        })?;
                    Ok((ptx.to_src(), g.iter().map(|k| k.name.clone()).collect()))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut functions = HashMap::new();
    for r in ptxs {
        let (ptx, names) = r?;
        let image = CString::new(ptx).map_err(|e| e.to_string())?;
        let module = driver("loading a module", unsafe {
            result::module::load_data(image.as_ptr() as *const c_void)
        })?;
        for n in names {
            let f = driver("cuModuleGetFunction", unsafe {
                result::module::get_function(module, CString::new(n.as_str()).unwrap())
            })?;
            functions.insert(n, f);
        }
    }
    Ok(Modules { functions })
}

impl Modules {
    /// Registers a thread and local (spilled) bytes a thread of `k`.
    pub fn resources(&self, k: &CudaKernel) -> String {
        use sys::CUfunction_attribute_enum as A;
        let f = self.functions[&k.name];
        let get = |a| unsafe { result::function::get_function_attribute(f, a) }.unwrap_or(-1);
        format!(
            "{} regs, {} B local",
            get(A::CU_FUNC_ATTRIBUTE_NUM_REGS),
            get(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)
        )
    }

    /// Launches `k` on `args` (asynchronously).
    pub fn launch(&self, k: &CudaKernel, args: &[&Buf]) -> Res<()> {
        let ptrs: Vec<sys::CUdeviceptr> = args.iter().map(|b| b.at(0)).collect();
        self.launch_at(k, &ptrs)
    }

    /// Launches `k` with its pointer parameters at `args`: device addresses, which may lie
    /// inside a buffer ([`Buf::at`]), as packed k and v lie in q's buffer.
    pub fn launch_at(&self, k: &CudaKernel, args: &[sys::CUdeviceptr]) -> Res<()> {
        let f = self.functions[&k.name];
        let mut vals: Vec<u64> = args.to_vec();
        let mut params: Vec<*mut c_void> = vals
            .iter_mut()
            .map(|v| v as *mut u64 as *mut c_void)
            .collect();
        let l = k.launch;
        driver("cuLaunchKernel", unsafe {
            result::launch_kernel(
                f,
                (l.grid[0], l.grid[1], l.grid[2]),
                (l.block[0], l.block[1], l.block[2]),
                l.shared_bytes,
                std::ptr::null_mut(),
                &mut params,
            )
        })
    }
}

/// A device buffer, freed on drop.
pub struct Buf {
    pub ptr: sys::CUdeviceptr,
    pub bytes: usize,
}

impl Buf {
    /// The address `bytes` into the buffer (at most its end).
    pub fn at(&self, bytes: usize) -> sys::CUdeviceptr {
        assert!(
            bytes <= self.bytes,
            "{bytes} bytes into a buffer of {}",
            self.bytes
        );
        self.ptr + bytes as sys::CUdeviceptr
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        unsafe {
            let _ = result::free_sync(self.ptr);
        }
    }
}

/// A buffer holding `bytes`.
pub fn upload(bytes: &[u8]) -> Res<Buf> {
    let b = filled(bytes.len(), 0)?;
    driver("upload", unsafe { result::memcpy_htod_sync(b.ptr, bytes) })?;
    Ok(b)
}

/// A buffer of `n` bytes, each `byte`.
pub fn filled(n: usize, byte: u8) -> Res<Buf> {
    let ptr = driver("cuMemAlloc", unsafe { result::malloc_sync(n.max(1)) })?;
    driver("memset", unsafe { result::memset_d8_sync(ptr, byte, n) })?;
    Ok(Buf { ptr, bytes: n })
}

/// The buffer's bytes (after every launch has finished).
pub fn download(b: &Buf) -> Res<Vec<u8>> {
    sync()?;
    let mut v = vec![0u8; b.bytes];
    driver("download", unsafe {
        result::memcpy_dtoh_sync(&mut v, b.ptr)
    })?;
    Ok(v)
}

pub fn sync() -> Res<()> {
    driver("kernel execution", result::ctx::synchronize())
}

/// Median milliseconds of `reps` runs of `f` after 3 warm-ups (CUDA events around each run).
pub fn time_ms(reps: usize, mut f: impl FnMut() -> Res<()>) -> Res<f64> {
    let ev = || {
        driver(
            "event",
            result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT),
        )
    };
    let (start, end) = (ev()?, ev()?);
    for _ in 0..3 {
        f()?;
    }
    sync()?;
    let mut ms = Vec::new();
    for _ in 0..reps {
        unsafe {
            driver("record", result::event::record(start, std::ptr::null_mut()))?;
            f()?;
            driver("record", result::event::record(end, std::ptr::null_mut()))?;
            driver("event sync", result::event::synchronize(end))?;
            ms.push(f64::from(driver(
                "elapsed",
                result::event::elapsed(start, end),
            )?));
        }
    }
    unsafe {
        let _ = result::event::destroy(start);
        let _ = result::event::destroy(end);
    }
    ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    Ok(ms[ms.len() / 2])
}
