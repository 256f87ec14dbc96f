//! cuDNN, loaded at run time, for the step's convolutions ([`ingot_compiler::lower::cuda::DeviceOp::Conv`]).
//!
//! Finding the library: [`super::libsearch`] looks for `libcudnn.so.9` in `INGOT_CUDNN_DIR`,
//! every directory of `LD_LIBRARY_PATH`, Python's site-packages joined with `nvidia/cudnn/lib`
//! (where PyTorch's CUDA wheels install cuDNN), then the system library directories; where it
//! is in none, the dynamic loader's own search (`dlopen("libcudnn.so.9")`, its cache). The file
//! found is opened with `RTLD_GLOBAL`, so that the sub-libraries cuDNN 9 opens by name
//! (`libcudnn_cnn.so.9`, the engines) resolve beside it, and the functions used here are bound
//! from that handle (as [`super::nccl`] binds NCCL's): cudarc's own cuDNN loader tries the
//! names `libcudnn.so`, `libcudnn.so.13`, ... first, and could pick another cuDNN than the one
//! found, and it panics where there is none. Only cuDNN 9 is taken (the bindings' version).
//! Statuses and the heuristics' results are read as plain integers, so a value this build does
//! not know is an error, never undefined behaviour; cudarc's `cudnn::sys` enums are only
//! passed in.
//!
//! The default ([`ConvSetting::Auto`]): the compiler stores a CUDA step's bf16 convolutions
//! channels-last on any compiling machine (`ingot_compiler::layout::pays`; a stem
//! over fewer than 8 channels keeps NCHW; f32 and tf32 steps keep NCHW, where im2col was
//! faster), and such a step runs its channels-last convolutions here but for the depthwise
//! ones, which run their fallback (Ingot's direct kernels), and its NCHW ones as their
//! fallback (im2col + cuBLAS) but for a bf16 one over few channels whose planned workspace
//! holds the room cuDNN's fast algorithm asks, which runs here too
//! (`ingot_compiler::lower::cuda::Conv::default_route`); `INGOT_CONV=im2col` compiles every convolution NCHW and
//! runs the fallback, `INGOT_CONV=cudnn` compiles every precision channels-last and runs every
//! convolution here, NCHW ones too. History: NCHW through cuDNN, as the `_v7` heuristics rank it, measured
//! 507.8 ms against 77.2 ms through im2col (H200, 2026-11-29, resnet50 224, batch 128, bf16:
//! in NCHW bf16 the first deterministic algorithms are not tensor-core ones); channels-last
//! took resnet50 to 35.6 ms against 66.3 ms through im2col (2026-11-30).
//!
//! Choosing, deterministically: when a step is loaded, each convolution asks cuDNN's
//! heuristics (`cudnnGetConvolution{Forward,BackwardData,BackwardFilter}Algorithm_v7`, which
//! rank by a model of the GPU, not by running anything) for its algorithms, and takes the
//! first that succeeds, is deterministic (the same bits on every run) and whose workspace fits
//! the planned one ([`Conv::workspace`]) ([`choose`], its rule [`first_eligible`]). So the
//! algorithm is a function of the executable, the GPU model and the cuDNN version alone, and
//! two runs of one executable compute the same bits. Timing the candidates at load (the
//! fastest kept, which differed from run to run) is opt-in: `INGOT_CONV_TIMING=1`
//! ([`timing`]), said on stderr when used; it times cuDNN's candidates against the
//! convolution's fallback where it has one (im2col + cuBLAS, or a depthwise one's direct
//! kernels, which it times by default route too). A strict f32 step runs with the FMA math type (no
//! TF32); a tf32 step allows TF32 tensor cores; bf16 tensors accumulate in f32 on tensor cores.
//! Where no algorithm fits or runs, or cuDNN is missing, a convolution runs its fallback
//! ([`Conv::fallback`], [`ConvPath::fallback`]): an NCHW one im2col + cuBLAS, a channels-last
//! depthwise one Ingot's direct kernels (`ingot_compiler::lower::cuda::depthwise`). Any other
//! channels-last convolution has none (im2col reads NCHW images), and its step is refused at
//! load, naming cuDNN and the two ways out.

use super::libsearch::{self, Library};
use cudarc::cudnn::sys as dnn;
use ingot_compiler::ir::{ConvLayout, DType, NodeId};
use ingot_compiler::lower::cuda::{Compute, Conv, ConvPass};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

/// cuDNN 9 as PyTorch's wheels ship it.
pub const CUDNN: Library = Library {
    file: "libcudnn.so.9",
    env_dir: "INGOT_CUDNN_DIR",
    python_subdirs: &["nvidia/cudnn/lib"],
    install_hint: "install cuDNN 9 (`pip install nvidia-cudnn-cu12`, which PyTorch's CUDA wheels \
                   bring) or set INGOT_CUDNN_DIR to the directory holding libcudnn.so.9",
};

/// The environment variable that picks the convolutions' path: unset (or `auto`) for the
/// default, `im2col` or `cudnn` ([`ConvSetting`]).
pub const CONV_PATH: &str = "INGOT_CONV";

/// The environment variable that, set to `1`, makes loading time each convolution's
/// candidates and keep the fastest, instead of cuDNN's heuristic order: faster at times, but
/// another run may choose otherwise and compute other bits.
pub const CONV_TIMING: &str = "INGOT_CONV_TIMING";

/// The environment variable that makes loading print each convolution's choice.
pub const LOG: &str = "INGOT_LOG";

/// Which path the convolutions take ([`CONV_PATH`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvSetting {
    /// The default: on CUDA, a bf16 step compiled channels-last (whether or not cuDNN loads
    /// on the compiling machine: the plan is the options'); the channels-last convolutions
    /// run through cuDNN but for the depthwise ones (Ingot's direct kernels), the NCHW ones as
    /// im2col + cuBLAS (a few-channel bf16 one in its room through cuDNN).
    Auto,
    /// Every convolution through cuDNN (NCHW ones too), where it loads.
    Cudnn,
    /// Every convolution NCHW, as im2col + cuBLAS; cuDNN is not loaded.
    Im2col,
}

/// [`CONV_PATH`]'s value read: unset, empty or `auto` is the default; anything but `auto`,
/// `cudnn` or `im2col` is an error naming them.
pub fn conv_setting(value: Option<&str>) -> Result<ConvSetting, String> {
    match value.map(str::trim) {
        None | Some("") | Some("auto") => Ok(ConvSetting::Auto),
        Some("im2col") => Ok(ConvSetting::Im2col),
        Some("cudnn") => Ok(ConvSetting::Cudnn),
        Some(v) => Err(format!(
            "{CONV_PATH}={v:?}: the convolutions' path is `auto` (the default: cuDNN for \
             channels-last convolutions), `cudnn` or `im2col`"
        )),
    }
}

/// Whether [`CONV_TIMING`] asks for the convolutions' candidates to be timed at load.
pub fn timing() -> bool {
    std::env::var_os(CONV_TIMING).is_some_and(|v| !v.is_empty() && v != "0")
}

/// The path set by [`set_conv_path`]: 0 none (read [`CONV_PATH`]), 1 cuDNN, 2 im2col, 3 auto.
static CHOSEN: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Sets the convolutions' path for the steps this process loads from now on, over
/// [`CONV_PATH`] (a program's or a test's choice).
pub fn set_conv_path(setting: ConvSetting) {
    let v = match setting {
        ConvSetting::Cudnn => 1,
        ConvSetting::Im2col => 2,
        ConvSetting::Auto => 3,
    };
    CHOSEN.store(v, std::sync::atomic::Ordering::SeqCst);
}

/// The convolutions' path a step loaded now takes: [`set_conv_path`]'s, else [`CONV_PATH`]'s.
pub fn conv_path() -> Result<ConvSetting, String> {
    match CHOSEN.load(std::sync::atomic::Ordering::SeqCst) {
        1 => Ok(ConvSetting::Cudnn),
        2 => Ok(ConvSetting::Im2col),
        3 => Ok(ConvSetting::Auto),
        _ => conv_setting(std::env::var(CONV_PATH).ok().as_deref()),
    }
}

type Status = u32;
const SUCCESS: Status = 0;
type Handle_ = *mut c_void;
type Desc = *mut c_void;

/// One of the heuristics' results (`cudnnConvolution*AlgoPerf_t`: the three share this
/// layout), read as plain integers.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Perf {
    algo: u32,
    status: u32,
    time: f32,
    memory: usize,
    determinism: u32,
    math_type: u32,
    reserved: [c_int; 3],
}

const DETERMINISTIC: u32 = dnn::cudnnDeterminism_t::CUDNN_DETERMINISTIC as u32;

impl Perf {
    fn offer(&self) -> Offer {
        let tensor_ops = [
            dnn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH as u32,
            dnn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION as u32,
        ];
        Offer {
            runs: self.status == SUCCESS,
            deterministic: self.determinism == DETERMINISTIC,
            tensor_ops: tensor_ops.contains(&self.math_type),
            workspace: self.memory,
        }
    }
}

/// What cuDNN's heuristics say of one algorithm for a convolution, as the choice reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offer {
    /// cuDNN can run the convolution with it (its status is success).
    pub runs: bool,
    /// It gives the same bits on every run.
    pub deterministic: bool,
    /// It computes on tensor cores (TF32 for f32 tensors, refused in a strict step).
    pub tensor_ops: bool,
    /// The workspace it needs, in bytes.
    pub workspace: usize,
}

/// The indices of the `offers` (in the heuristics' order, best first) a convolution may run
/// with: those that run, are deterministic, need at most the `planned` workspace and, in a
/// `strict` (f32 or f64) step, do not compute on tensor cores. The first is the choice
/// ([`first_eligible`]); the others are what `INGOT_CONV_TIMING` times.
pub fn eligible(
    offers: &[Offer],
    planned: usize,
    strict: bool,
) -> impl Iterator<Item = usize> + '_ {
    offers.iter().enumerate().filter_map(move |(i, o)| {
        let ok = o.runs && o.deterministic && o.workspace <= planned && !(strict && o.tensor_ops);
        ok.then_some(i)
    })
}

/// The algorithm a convolution runs: the first of [`eligible`], by cuDNN's own ranking; a
/// pure function of what the heuristics offer (itself a function of the convolution, the GPU
/// model and the cuDNN version) and the planned workspace. `None` where none may run.
pub fn first_eligible(offers: &[Offer], planned: usize, strict: bool) -> Option<usize> {
    eligible(offers, planned, strict).next()
}

type Format = dnn::cudnnTensorFormat_t;
type Data = dnn::cudnnDataType_t;
type Mode = dnn::cudnnConvolutionMode_t;
/// `cudnnSetTensor4dDescriptor(desc, format, type, n, c, h, w)`.
type SetTensor = unsafe extern "C" fn(Desc, Format, Data, c_int, c_int, c_int, c_int) -> Status;
/// `cudnnSetFilter4dDescriptor(desc, type, format, k, c, h, w)`.
type SetFilter = unsafe extern "C" fn(Desc, Data, Format, c_int, c_int, c_int, c_int) -> Status;
/// `cudnnSetConvolution2dDescriptor(desc, pad h, pad w, stride h, stride w, dilation h,
/// dilation w, mode, compute type)`.
type SetConv =
    unsafe extern "C" fn(Desc, c_int, c_int, c_int, c_int, c_int, c_int, Mode, Data) -> Status;
type GetAlgorithms =
    unsafe extern "C" fn(Handle_, Desc, Desc, Desc, Desc, c_int, *mut c_int, *mut Perf) -> Status;
type Convolve = unsafe extern "C" fn(
    Handle_,
    *const c_void,
    Desc,
    *const c_void,
    Desc,
    *const c_void,
    Desc,
    u32,
    *mut c_void,
    usize,
    *const c_void,
    Desc,
    *mut c_void,
) -> Status;

/// The functions of the loaded library.
pub struct Cudnn {
    /// Where it was loaded from.
    pub path: String,
    /// `cudnnGetVersion()`, e.g. 90100 for 9.1.0.
    pub version: usize,
    error_string: unsafe extern "C" fn(Status) -> *const c_char,
    create: unsafe extern "C" fn(*mut Handle_) -> Status,
    destroy: unsafe extern "C" fn(Handle_) -> Status,
    set_stream: unsafe extern "C" fn(Handle_, *mut c_void) -> Status,
    create_tensor: unsafe extern "C" fn(*mut Desc) -> Status,
    set_tensor: SetTensor,
    destroy_tensor: unsafe extern "C" fn(Desc) -> Status,
    create_filter: unsafe extern "C" fn(*mut Desc) -> Status,
    set_filter: SetFilter,
    destroy_filter: unsafe extern "C" fn(Desc) -> Status,
    create_conv: unsafe extern "C" fn(*mut Desc) -> Status,
    set_conv: SetConv,
    set_groups: unsafe extern "C" fn(Desc, c_int) -> Status,
    set_math: unsafe extern "C" fn(Desc, u32) -> Status,
    destroy_conv: unsafe extern "C" fn(Desc) -> Status,
    forward_algorithms: GetAlgorithms,
    data_algorithms: GetAlgorithms,
    filter_algorithms: GetAlgorithms,
    forward: Convolve,
    data: Convolve,
    filter: Convolve,
}

// SAFETY: function pointers into a library loaded for the process's life; cuDNN's functions
// may be called from any thread.
unsafe impl Send for Cudnn {}
// SAFETY: as above; nothing in it changes after loading.
unsafe impl Sync for Cudnn {}

impl Cudnn {
    fn check(&self, what: &str, status: Status) -> Result<(), String> {
        if status == SUCCESS {
            return Ok(());
        }
        // SAFETY: cuDNN returns a static string for any status value.
        let text = unsafe {
            let p = (self.error_string)(status);
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        Err(format!("{what}: cuDNN status {status} ({text})"))
    }
}

/// cuDNN, loaded once per process (see the module docs for where it is looked for); the error
/// says where it was looked for, or why the file found could not be used.
pub fn load() -> Result<&'static Cudnn, String> {
    static LIB: OnceLock<Result<Cudnn, String>> = OnceLock::new();
    LIB.get_or_init(open).as_ref().map_err(Clone::clone)
}

fn open() -> Result<Cudnn, String> {
    let (lib, path): (&'static libloading::Library, String) = match libsearch::find(&CUDNN) {
        Ok(path) => {
            check_parts(&path, &|p| p.exists())?;
            (libsearch::preload(&path)?, path.display().to_string())
        }
        Err(not_found) => {
            // The loader's own search (its cache, the default directories) last.
            // SAFETY: cuDNN's initialisers, found by its soname.
            match unsafe { libloading::Library::new(CUDNN.file) } {
                Ok(l) => (&*Box::leak(Box::new(l)), CUDNN.file.to_string()),
                Err(_) => return Err(not_found.to_string()),
            }
        }
    };
    // SAFETY: each symbol is bound to the signature cuDNN 9's headers give it (enums as the
    // 32-bit integers they are); the library stays loaded for the process's life.
    unsafe {
        macro_rules! bind {
            ($name:literal) => {
                *lib.get(concat!($name, "\0").as_bytes())
                    .map_err(|e| format!("{path}: has no {}: {e}", $name))?
            };
        }
        let get_version: unsafe extern "C" fn() -> usize = bind!("cudnnGetVersion");
        let version = get_version();
        if !(90000..100000).contains(&version) {
            return Err(format!(
                "{path} is cuDNN {version}, not cuDNN 9 (the version Ingot's bindings are for)"
            ));
        }
        Ok(Cudnn {
            path: path.clone(),
            version,
            error_string: bind!("cudnnGetErrorString"),
            create: bind!("cudnnCreate"),
            destroy: bind!("cudnnDestroy"),
            set_stream: bind!("cudnnSetStream"),
            create_tensor: bind!("cudnnCreateTensorDescriptor"),
            set_tensor: bind!("cudnnSetTensor4dDescriptor"),
            destroy_tensor: bind!("cudnnDestroyTensorDescriptor"),
            create_filter: bind!("cudnnCreateFilterDescriptor"),
            set_filter: bind!("cudnnSetFilter4dDescriptor"),
            destroy_filter: bind!("cudnnDestroyFilterDescriptor"),
            create_conv: bind!("cudnnCreateConvolutionDescriptor"),
            set_conv: bind!("cudnnSetConvolution2dDescriptor"),
            set_groups: bind!("cudnnSetConvolutionGroupCount"),
            set_math: bind!("cudnnSetConvolutionMathType"),
            destroy_conv: bind!("cudnnDestroyConvolutionDescriptor"),
            forward_algorithms: bind!("cudnnGetConvolutionForwardAlgorithm_v7"),
            data_algorithms: bind!("cudnnGetConvolutionBackwardDataAlgorithm_v7"),
            filter_algorithms: bind!("cudnnGetConvolutionBackwardFilterAlgorithm_v7"),
            forward: bind!("cudnnConvolutionForward"),
            data: bind!("cudnnConvolutionBackwardData"),
            filter: bind!("cudnnConvolutionBackwardFilter"),
        })
    }
}

/// The libraries `libcudnn.so.9` loads on its first call (cuDNN 9 is split: the file found is
/// a dispatcher). Where one is missing the dispatcher aborts the process ("Cannot load symbol
/// cudnnGetVersion"), which no caller can catch, so they are looked for first.
const CUDNN_PARTS: [&str; 3] = [
    "libcudnn_graph.so.9",
    "libcudnn_ops.so.9",
    "libcudnn_cnn.so.9",
];

/// An error naming the parts of cuDNN missing beside `path` (`exists` answers for a file).
fn check_parts(
    path: &std::path::Path,
    exists: &dyn Fn(&std::path::Path) -> bool,
) -> Result<(), String> {
    let dir = path.parent().unwrap_or(std::path::Path::new("."));
    let missing: Vec<&str> = CUDNN_PARTS
        .into_iter()
        .filter(|part| !exists(&dir.join(part)))
        .collect();
    match missing.is_empty() {
        true => Ok(()),
        false => Err(format!(
            "{} is there but {} beside it {} missing (a partial cuDNN install): {}",
            path.display(),
            missing.join(", "),
            if missing.len() == 1 { "is" } else { "are" },
            CUDNN.install_hint
        )),
    }
}

/// A cuDNN handle bound to the step's stream (its convolutions are captured from it).
pub struct Handle {
    lib: &'static Cudnn,
    raw: Handle_,
}

impl Handle {
    /// A handle on `stream` (the step's) in the current context.
    pub fn new(lib: &'static Cudnn, stream: &cudarc::driver::CudaStream) -> Result<Handle, String> {
        let stream = stream.cu_stream() as *mut c_void;
        let mut raw = std::ptr::null_mut();
        // SAFETY: an out-pointer; the context is current on this thread (the caller's).
        lib.check("creating a cuDNN handle", unsafe { (lib.create)(&mut raw) })?;
        let h = Handle { lib, raw };
        // SAFETY: a live handle and the step's stream.
        lib.check("setting cuDNN's stream", unsafe {
            (lib.set_stream)(raw, stream)
        })?;
        Ok(h)
    }

    pub fn library(&self) -> &'static Cudnn {
        self.lib
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once, after the work on its stream.
        let _ = unsafe { (self.lib.destroy)(self.raw) };
    }
}

/// What a convolution runs as, once the step is loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvChoice {
    pub node: NodeId,
    pub pass: ConvPass,
    pub path: ConvPath,
    /// What each candidate took when timed at load (empty where the choice came from an
    /// earlier one of the same shape, [`remembered`]).
    pub timings: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConvPath {
    /// cuDNN's algorithm (its name in cuDNN's enum), the workspace it needs and the planned
    /// workspace it may use.
    Cudnn {
        algo: String,
        workspace: usize,
        planned: usize,
    },
    /// The fallback's im2col ops, and why.
    Im2col { reason: String },
    /// The fallback of a channels-last depthwise convolution, Ingot's direct kernels
    /// (`ingot_compiler::lower::cuda::depthwise`), and why.
    Direct { reason: String },
}

impl ConvPath {
    /// Convolution `c` run as its fallback, for `reason`: Ingot's direct kernels where it is
    /// channels-last (only a depthwise one has a fallback there), else im2col + cuBLAS.
    pub fn fallback(c: &Conv, reason: String) -> ConvPath {
        match c.layout {
            ConvLayout::Nhwc if !c.fallback.is_empty() => ConvPath::Direct { reason },
            _ => ConvPath::Im2col { reason },
        }
    }

    /// What `c`'s fallback is, in a word, as the timings under [`CONV_TIMING`] name it:
    /// `direct` (a channels-last depthwise convolution's kernels), `im2col`, or `none` (a
    /// channels-last one that only cuDNN runs).
    pub fn fallback_name(c: &Conv) -> &'static str {
        match (c.fallback.is_empty(), Self::fallback(c, String::new())) {
            (true, _) => "none",
            (false, ConvPath::Direct { .. }) => "direct",
            (false, _) => "im2col",
        }
    }
}

impl std::fmt::Display for ConvChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "convolution %{} ({}): ",
            self.node.index(),
            self.pass.name()
        )?;
        match &self.path {
            ConvPath::Cudnn {
                algo,
                workspace,
                planned,
            } => write!(
                f,
                "cuDNN {algo}, workspace {workspace} of the {planned} bytes planned"
            ),
            ConvPath::Im2col { reason } => write!(f, "im2col + cuBLAS ({reason})"),
            ConvPath::Direct { reason } => write!(f, "direct depthwise kernels ({reason})"),
        }?;
        if !self.timings.is_empty() {
            write!(f, "; timed: {}", self.timings)?;
        }
        Ok(())
    }
}

/// What a convolution of one shape (pass, sizes, dtype, compute type, planned workspace)
/// chose when timed: cuDNN's algorithm, or `None` for the fallback. Kept for the process's
/// life, so that every later one of the same shape (a ResNet's repeated layers, the next
/// load of the same step) takes the same path without timing again, and two loads in one
/// process compute the same bits.
pub fn remembered(c: &Conv) -> Option<Option<u32>> {
    let key = shape_key(c);
    let timed = TIMED.lock().ok()?;
    timed.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

/// Records what a convolution shaped as `c` chose ([`remembered`]); the first record stays.
pub fn remember(c: &Conv, algo: Option<u32>) {
    let key = shape_key(c);
    if let Ok(mut timed) = TIMED.lock() {
        if !timed.iter().any(|(k, _)| *k == key) {
            timed.push((key, algo));
        }
    }
}

/// [`remember`]'s records: (shape, choice), in the order first timed.
static TIMED: std::sync::Mutex<Vec<(String, Option<u32>)>> = std::sync::Mutex::new(Vec::new());

fn shape_key(c: &Conv) -> String {
    format!(
        "{:?} {:?} {:?} {:?} {:?} {}",
        c.pass, c.dims, c.layout, c.dtype, c.compute, c.workspace.bytes
    )
}

impl ConvRun {
    /// cuDNN's value of the algorithm this runs.
    pub fn algo(&self) -> u32 {
        self.algo
    }
}

/// A convolution's descriptors and chosen algorithm, ready to enqueue.
pub struct ConvRun {
    lib: &'static Cudnn,
    pass: ConvPass,
    x: Desc,
    y: Desc,
    w: Desc,
    conv: Desc,
    algo: u32,
    double: bool,
    pub choice: ConvChoice,
}

impl Drop for ConvRun {
    fn drop(&mut self) {
        let l = self.lib;
        // SAFETY: each made once in `choose` (null where creation failed), destroyed once.
        unsafe {
            for d in [self.x, self.y] {
                if !d.is_null() {
                    (l.destroy_tensor)(d);
                }
            }
            if !self.w.is_null() {
                (l.destroy_filter)(self.w);
            }
            if !self.conv.is_null() {
                (l.destroy_conv)(self.conv);
            }
        }
    }
}

fn int(x: usize, what: &str) -> Result<c_int, String> {
    c_int::try_from(x).map_err(|_| format!("{what} {x} exceeds cuDNN's 32-bit sizes"))
}

/// The data type of the tensors and of the arithmetic, and the math type a strict step
/// runs with (`None`: the heuristics' own choice per algorithm).
fn types(
    dtype: DType,
    compute: Compute,
) -> Result<
    (
        dnn::cudnnDataType_t,
        dnn::cudnnDataType_t,
        dnn::cudnnMathType_t,
    ),
    String,
> {
    use dnn::cudnnDataType_t as T;
    use dnn::cudnnMathType_t as M;
    Ok(match (dtype, compute) {
        (DType::F32, Compute::F32) => (T::CUDNN_DATA_FLOAT, T::CUDNN_DATA_FLOAT, M::CUDNN_FMA_MATH),
        (DType::F32, Compute::Tf32) => (
            T::CUDNN_DATA_FLOAT,
            T::CUDNN_DATA_FLOAT,
            M::CUDNN_DEFAULT_MATH,
        ),
        (DType::F64, Compute::F64) => (
            T::CUDNN_DATA_DOUBLE,
            T::CUDNN_DATA_DOUBLE,
            M::CUDNN_DEFAULT_MATH,
        ),
        (DType::BF16, Compute::Bf16F32) => (
            T::CUDNN_DATA_BFLOAT16,
            T::CUDNN_DATA_FLOAT,
            M::CUDNN_TENSOR_OP_MATH,
        ),
        (d, c) => {
            return Err(format!(
                "no cuDNN convolution of {d} tensors computing {c:?}"
            ))
        }
    })
}

/// The algorithm names of each pass, by value (cuDNN 9's enums).
fn algo_name(pass: ConvPass, algo: u32) -> String {
    let names: &[&str] = match pass {
        ConvPass::Forward => &[
            "IMPLICIT_GEMM",
            "IMPLICIT_PRECOMP_GEMM",
            "GEMM",
            "DIRECT",
            "FFT",
            "FFT_TILING",
            "WINOGRAD",
            "WINOGRAD_NONFUSED",
        ],
        ConvPass::Data => &[
            "ALGO_0",
            "ALGO_1",
            "FFT",
            "FFT_TILING",
            "WINOGRAD",
            "WINOGRAD_NONFUSED",
        ],
        ConvPass::Filter => &[
            "ALGO_0",
            "ALGO_1",
            "FFT",
            "ALGO_3",
            "WINOGRAD",
            "WINOGRAD_NONFUSED",
            "FFT_TILING",
        ],
    };
    names
        .get(algo as usize)
        .map_or_else(|| format!("algorithm {algo}"), |n| n.to_string())
}

/// The descriptors of `c` and the first of cuDNN's algorithms that succeeds, is
/// deterministic and fits the planned workspace ([`first_eligible`]); the error says why none
/// is taken.
pub fn choose(h: &Handle, c: &Conv) -> Result<ConvRun, String> {
    nth(h, c, 0).map(|r| r.expect("the first eligible algorithm"))
}

/// Every algorithm [`choose`] could take (deterministic, within the planned workspace), in
/// cuDNN's order, each with descriptors of its own; the error says why there is none.
pub fn candidates(h: &Handle, c: &Conv) -> Result<Vec<ConvRun>, String> {
    let mut out = vec![choose(h, c)?];
    while let Some(run) = nth(h, c, out.len())? {
        out.push(run);
    }
    Ok(out)
}

/// The `n`th algorithm [`choose`] could take; `None` past the last (an error when there is
/// none at all).
fn nth(h: &Handle, c: &Conv, n: usize) -> Result<Option<ConvRun>, String> {
    let l = h.lib;
    let (data, compute, strict_math) = types(c.dtype, c.compute)?;
    let d = c.dims;
    let mut run = ConvRun {
        lib: l,
        pass: c.pass,
        x: std::ptr::null_mut(),
        y: std::ptr::null_mut(),
        w: std::ptr::null_mut(),
        conv: std::ptr::null_mut(),
        algo: 0,
        double: c.dtype == DType::F64,
        choice: ConvChoice {
            node: c.node,
            pass: c.pass,
            path: ConvPath::Im2col {
                reason: String::new(),
            },
            timings: String::new(),
        },
    };
    // The dims are NCHW's either way; the format says how the bytes are ordered (a
    // channels-last filter is `[K, R, S, C]`, cuDNN's NHWC filter format).
    let nchw = match c.layout {
        ConvLayout::Nchw => dnn::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
        ConvLayout::Nhwc => dnn::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC,
    };
    // SAFETY: out-pointers for the descriptors, which `run` destroys when dropped; sizes
    // checked to fit cuDNN's ints.
    unsafe {
        for (create, desc, kind) in [
            (l.create_tensor, &mut run.x, "tensor"),
            (l.create_tensor, &mut run.y, "tensor"),
            (l.create_filter, &mut run.w, "filter"),
            (l.create_conv, &mut run.conv, "convolution"),
        ] {
            l.check(&format!("creating a {kind} descriptor"), create(desc))?;
        }
        let n = int(d.batch, "the batch")?;
        let (c_in, k) = (int(d.in_ch, "in channels")?, int(d.out_ch, "out channels")?);
        let groups = int(d.groups, "the groups")?;
        // An image descriptor: `n` images of `ch` channels of `[h, w]` (`names` for errors).
        let image = |t, what, ch, [h, w]: [usize; 2], names: [&str; 2]| {
            let (h, w) = (int(h, names[0])?, int(w, names[1])?);
            l.check(what, (l.set_tensor)(t, nchw, data, n, ch, h, w))
        };
        let (in_names, out_names) = (
            ["the height", "the width"],
            ["the output height", "the output width"],
        );
        image(run.x, "describing x", c_in, d.in_hw, in_names)?;
        image(run.y, "describing y", k, d.out_hw, out_names)?;
        l.check(
            "describing w",
            (l.set_filter)(
                run.w,
                data,
                nchw,
                k,
                int(d.in_ch / d.groups.max(1), "channels per group")?,
                int(d.kernel[0], "the kernel height")?,
                int(d.kernel[1], "the kernel width")?,
            ),
        )?;
        l.check(
            "describing the convolution",
            (l.set_conv)(
                run.conv,
                int(d.padding[0], "the padding")?,
                int(d.padding[1], "the padding")?,
                int(d.stride[0], "the stride")?,
                int(d.stride[1], "the stride")?,
                int(d.dilation[0], "the dilation")?,
                int(d.dilation[1], "the dilation")?,
                dnn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                compute,
            ),
        )?;
        l.check("setting the groups", (l.set_groups)(run.conv, groups))?;
        l.check(
            "setting the math type",
            (l.set_math)(run.conv, strict_math as u32),
        )?;
    }
    let mut perf = [Perf::default(); 16];
    let mut count: c_int = 0;
    let (get, a, b, cc, e) = match c.pass {
        ConvPass::Forward => (l.forward_algorithms, run.x, run.w, run.conv, run.y),
        ConvPass::Data => (l.data_algorithms, run.w, run.y, run.conv, run.x),
        ConvPass::Filter => (l.filter_algorithms, run.x, run.y, run.conv, run.w),
    };
    // SAFETY: live descriptors; `perf` holds the 16 results asked for at most.
    l.check("asking cuDNN's heuristics", unsafe {
        get(
            h.raw,
            a,
            b,
            cc,
            e,
            perf.len() as c_int,
            &mut count,
            perf.as_mut_ptr(),
        )
    })?;
    let results = &perf[..(count.max(0) as usize).min(perf.len())];
    let strict = matches!(c.compute, Compute::F32 | Compute::F64);
    let granted = c.workspace.bytes;
    let offers: Vec<Offer> = results.iter().map(Perf::offer).collect();
    let Some(p) = eligible(&offers, granted, strict)
        .nth(n)
        .map(|i| &results[i])
    else {
        if n > 0 {
            return Ok(None);
        }
        let offered: Vec<String> = results
            .iter()
            .map(|p| {
                format!(
                    "{} (status {}, {}, {} bytes)",
                    algo_name(c.pass, p.algo),
                    p.status,
                    if p.determinism == DETERMINISTIC {
                        "deterministic"
                    } else {
                        "not deterministic"
                    },
                    p.memory
                )
            })
            .collect();
        return Err(format!(
            "cuDNN offers no deterministic algorithm within the {granted} bytes planned: {}",
            if offered.is_empty() {
                "none at all".to_string()
            } else {
                offered.join(", ")
            }
        ));
    };
    // A strict step keeps the FMA math type; the others run each algorithm with the math
    // type the heuristics gave it.
    if !strict && p.math_type <= 3 {
        // SAFETY: a live descriptor; a math type cuDNN itself reported.
        l.check("setting the math type", unsafe {
            (l.set_math)(run.conv, p.math_type)
        })?;
    }
    run.algo = p.algo;
    run.choice.path = ConvPath::Cudnn {
        algo: algo_name(c.pass, p.algo),
        workspace: p.memory,
        planned: granted,
    };
    Ok(Some(run))
}

impl ConvRun {
    /// Enqueues the convolution on the handle's stream (`y`, `dx` or `dw` replaced, not
    /// accumulated), its tensors and workspace at their offsets from `base`.
    ///
    /// # Safety
    /// `base` is the step's allocation, which holds every byte `c` names ([`Conv::tensors`],
    /// checked when the program was lowered and loaded); `c` is the operation `self` was made
    /// for.
    pub unsafe fn enqueue(&self, h: &Handle, c: &Conv, base: u64) -> Result<(), String> {
        let l = self.lib;
        let at = |o: usize| (base + o as u64) as *mut c_void;
        let (one32, zero32, one64, zero64) = (1f32, 0f32, 1f64, 0f64);
        let (alpha, beta): (*const c_void, *const c_void) = if self.double {
            (&one64 as *const f64 as _, &zero64 as *const f64 as _)
        } else {
            (&one32 as *const f32 as _, &zero32 as *const f32 as _)
        };
        let ws = (at(c.workspace.offset), c.workspace.bytes);
        // Every pass is `out = conv(a, b)` through one signature; only the roles differ.
        let (convolve, (ad, a), (bd, b), (od, o)) = match self.pass {
            ConvPass::Forward => (l.forward, (self.x, c.x), (self.w, c.w), (self.y, c.y)),
            ConvPass::Data => (l.data, (self.w, c.w), (self.y, c.y), (self.x, c.x)),
            ConvPass::Filter => (l.filter, (self.x, c.x), (self.y, c.y), (self.w, c.w)),
        };
        let (conv, algo) = (self.conv, self.algo);
        // SAFETY: live descriptors made for `c`; every address inside the allocation (the
        // caller's promise); alpha and beta are read during the call.
        let status = unsafe {
            convolve(
                h.raw,
                alpha,
                ad,
                at(a),
                bd,
                at(b),
                conv,
                algo,
                ws.0,
                ws.1,
                beta,
                od,
                at(o),
            )
        };
        l.check("a cuDNN convolution", status)
    }
}

/// Says `message` on stderr, once per process for each distinct `key`.
pub fn say_once(key: &str, message: &str) {
    static SAID: OnceLock<std::sync::Mutex<std::collections::HashSet<String>>> = OnceLock::new();
    let said = SAID.get_or_init(Default::default);
    if said
        .lock()
        .map(|mut s| s.insert(key.to_string()))
        .unwrap_or(false)
    {
        eprintln!("{message}");
    }
}

/// Whether [`LOG`] asks for each convolution's choice on stderr.
pub fn logging() -> bool {
    std::env::var_os(LOG).is_some_and(|v| !v.is_empty() && v != "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_conv_path_is_auto_unless_cudnn_or_im2col_is_asked_for_and_anything_else_is_refused() {
        assert_eq!(conv_setting(None), Ok(ConvSetting::Auto));
        assert_eq!(conv_setting(Some("")), Ok(ConvSetting::Auto));
        assert_eq!(conv_setting(Some(" auto ")), Ok(ConvSetting::Auto));
        assert_eq!(conv_setting(Some("cudnn")), Ok(ConvSetting::Cudnn));
        assert_eq!(conv_setting(Some("im2col")), Ok(ConvSetting::Im2col));
        let e = conv_setting(Some("fft")).unwrap_err();
        assert!(e.contains("INGOT_CONV") && e.contains("im2col"), "{e}");
    }

    /// A partial install (two of cuDNN's files copied to a directory of their own) made
    /// `ingot compile` die by SIGABRT inside cuDNN's dispatcher; the parts are now looked for first.
    #[test]
    fn a_partial_cudnn_install_is_refused_naming_the_missing_parts() {
        let path = std::path::Path::new("/lib/x/libcudnn.so.9");
        let all = |_: &std::path::Path| true;
        assert_eq!(check_parts(path, &all), Ok(()));
        let only_graph = |p: &std::path::Path| p.ends_with("libcudnn_graph.so.9");
        let e = check_parts(path, &only_graph).unwrap_err();
        assert!(
            e.contains("libcudnn_ops.so.9, libcudnn_cnn.so.9")
                && e.contains("/lib/x/libcudnn.so.9"),
            "{e}"
        );
        assert!(!e.contains("libcudnn_graph"), "{e}");
    }

    /// A stand-in for the heuristics' answer, best first.
    fn offers() -> Vec<Offer> {
        let o = |runs, deterministic, tensor_ops, workspace| Offer {
            runs,
            deterministic,
            tensor_ops,
            workspace,
        };
        vec![
            o(true, false, true, 0),       // fastest, but not deterministic
            o(true, true, true, 64 << 20), // deterministic, 64 MiB of workspace
            o(false, true, false, 0),      // cannot run this convolution
            o(true, true, true, 1 << 20),  // deterministic, 1 MiB
            o(true, true, false, 4 << 20), // deterministic, no tensor cores, 4 MiB
        ]
    }

    #[test]
    fn the_choice_is_the_first_deterministic_algorithm_that_runs_within_the_planned_workspace() {
        let offers = offers();
        // Enough workspace: the heuristics' first deterministic one that runs.
        assert_eq!(first_eligible(&offers, 64 << 20, false), Some(1));
        // The same inputs, the same choice, every time.
        for _ in 0..3 {
            assert_eq!(first_eligible(&offers, 64 << 20, false), Some(1));
        }
        // Less planned than it needs: the next within the bound, never one above it.
        assert_eq!(first_eligible(&offers, (64 << 20) - 1, false), Some(3));
        for planned in [0, 1 << 20, 4 << 20, 64 << 20] {
            for i in eligible(&offers, planned, false) {
                assert!(offers[i].workspace <= planned && offers[i].deterministic);
            }
        }
        // A strict step takes no tensor-core algorithm.
        assert_eq!(first_eligible(&offers, 64 << 20, true), Some(4));
        // None fits, or none is offered: no choice (the convolution runs its fallback).
        assert_eq!(first_eligible(&offers, 1 << 19, false), None);
        assert_eq!(first_eligible(&offers, 1 << 19, true), None);
        assert_eq!(first_eligible(&[], 1 << 30, false), None);
        // The candidates timed under INGOT_CONV_TIMING, in the heuristics' order.
        assert_eq!(
            eligible(&offers, 64 << 20, false).collect::<Vec<_>>(),
            [1, 3, 4]
        );
    }

    #[test]
    fn cudnn_is_looked_for_in_its_own_variable_then_the_loader_path_then_pythons_packages() {
        let env = |v: &str| match v {
            "INGOT_CUDNN_DIR" => Some("/own".to_string()),
            "LD_LIBRARY_PATH" => Some("/ld".to_string()),
            _ => None,
        };
        let dirs =
            libsearch::directories(&CUDNN, &env, &|| vec![std::path::PathBuf::from("/site")]);
        assert_eq!(dirs[0], std::path::Path::new("/own"));
        assert_eq!(dirs[1], std::path::Path::new("/ld"));
        assert!(dirs.contains(&std::path::PathBuf::from("/site/nvidia/cudnn/lib")));
    }

    #[test]
    fn the_heuristics_results_have_cudnn_9s_layout() {
        // cudnnConvolutionFwdAlgoPerf_t: algo, status, time, memory (size_t), determinism,
        // mathType, reserved[3].
        assert_eq!(
            std::mem::size_of::<Perf>(),
            std::mem::size_of::<dnn::cudnnConvolutionFwdAlgoPerf_t>()
        );
        assert_eq!(
            std::mem::size_of::<Perf>(),
            std::mem::size_of::<dnn::cudnnConvolutionBwdFilterAlgoPerf_t>()
        );
    }
}
