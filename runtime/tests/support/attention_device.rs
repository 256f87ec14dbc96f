//! A minimal raw-kernel harness for the fused-attention kernels on GPU 0 (`#[path]`-included
//! by runtime/tests/cuda_attention.rs and runtime/examples/attention_bench.rs): NVRTC-compiles
//! generated kernels (the prelude first, as the runtime does, several modules compiled in
//! parallel), allocates, copies, launches and times them with CUDA events, through the driver
//! calls the GPU harnesses share (testkit/src/device.rs, `ingot_testkit::device`).

#![allow(dead_code)]

use cudarc::driver::sys;
use ingot_kernels::cuda::{CudaKernel, PRELUDE, PRELUDE_BF16};
use std::collections::HashMap;

/// The driver calls the GPU harnesses share, the test kit's own file: included by path, since
/// the runtime may not depend on the test kit, a layer above it (tests/layers.rs).
#[path = "../../../testkit/src/device.rs"]
mod driver_calls;
pub use device::Res;
use driver_calls as device;

/// GPU 0 made current; its name and NVRTC architecture (`compute_XY`).
pub fn init() -> Res<(String, &'static str)> {
    let gpu = device::init()?;
    Ok((gpu.name, gpu.arch))
}

/// Loaded kernels by name.
pub struct Modules {
    functions: HashMap<String, device::Function>,
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
        let (_, loaded) = device::load(ptx, names.iter().map(String::as_str))?;
        functions.extend(loaded);
    }
    Ok(Modules { functions })
}

impl Modules {
    /// Registers a thread and local (spilled) bytes a thread of `k`.
    pub fn resources(&self, k: &CudaKernel) -> String {
        let (regs, local) = device::resources(self.functions[&k.name]);
        format!("{regs} regs, {local} B local")
    }

    /// Launches `k` on `args` (asynchronously).
    pub fn launch(&self, k: &CudaKernel, args: &[&Buf]) -> Res<()> {
        let ptrs: Vec<sys::CUdeviceptr> = args.iter().map(|b| b.at(0)).collect();
        self.launch_at(k, &ptrs)
    }

    /// Launches `k` with its pointer parameters at `args`: device addresses, which may lie
    /// inside a buffer ([`Buf::at`]), as packed k and v lie in q's buffer.
    pub fn launch_at(&self, k: &CudaKernel, args: &[sys::CUdeviceptr]) -> Res<()> {
        device::launch(self.functions[&k.name], k, args)
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
        device::free(self.ptr);
    }
}

/// A buffer holding `bytes`.
pub fn upload(bytes: &[u8]) -> Res<Buf> {
    let b = filled(bytes.len(), 0)?;
    device::upload(b.ptr, bytes)?;
    Ok(b)
}

/// A buffer of `n` bytes, each `byte`.
pub fn filled(n: usize, byte: u8) -> Res<Buf> {
    let b = Buf {
        ptr: device::alloc(n)?,
        bytes: n,
    };
    device::memset(b.ptr, byte, n)?;
    Ok(b)
}

/// The buffer's bytes (after every launch has finished).
pub fn download(b: &Buf) -> Res<Vec<u8>> {
    let mut v = vec![0u8; b.bytes];
    device::download(b.ptr, &mut v)?;
    Ok(v)
}

pub fn sync() -> Res<()> {
    device::sync()
}

/// Median milliseconds of `reps` runs of `f` after 3 warm-ups (CUDA events around each run).
pub fn time_ms(reps: usize, f: impl FnMut() -> Res<()>) -> Res<f64> {
    device::time_ms(reps, f)
}
