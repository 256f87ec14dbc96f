//! NCCL, loaded at run time: the collective library every data-parallel trainer on NVIDIA GPUs
//! uses (PyTorch's DDP among them).
//!
//! The library is found by [`super::libsearch`] (`INGOT_NCCL_DIR`, `LD_LIBRARY_PATH`, Python's
//! `nvidia/nccl/lib` as PyTorch installs it, the system directories), loaded by absolute path,
//! and its functions bound from that handle. Not cudarc's `nccl` feature: cudarc 0.19 opens
//! NCCL by the names `libnccl.so`, `libnccl.so.{10,11,12,13,9,1}` only, and the pip package
//! ships `libnccl.so.2` alone, so its loader would not find the library even after it is
//! loaded (a `dlopen` by name matches a loaded library's soname, `libnccl.so.2`), and it
//! panics when it does not. Binding the few functions used here from the handle found avoids
//! both.

use super::libsearch::{self, Library};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::PathBuf;
use std::sync::OnceLock;

/// NCCL as PyTorch's wheels ship it.
pub const NCCL: Library = Library {
    file: "libnccl.so.2",
    env_dir: "INGOT_NCCL_DIR",
    python_subdirs: &["nvidia/nccl/lib"],
    install_hint: "install NCCL (`pip install nvidia-nccl-cu12`, which PyTorch's CUDA wheels \
                   bring) or set INGOT_NCCL_DIR to the directory holding libnccl.so.2",
};

/// An NCCL communicator handle (`ncclComm_t`).
pub type RawComm = *mut c_void;

/// `ncclUniqueId`: 128 opaque bytes rank 0 makes and every rank passes to its init.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    pub internal: [c_char; 128],
}

/// `ncclDataType_t` values used here (NCCL 2.10 and later).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub enum DataType {
    /// Bytes: what an all-gather copies, whatever the elements are.
    Uint8 = 1,
    Float32 = 7,
    Float64 = 8,
    Bfloat16 = 9,
}

/// `ncclRedOp_t`'s `ncclSum`. Every rank's gradients are of its share of the loss
/// (`autodiff::step::rank_share`), so the sum is the mean; NCCL's symmetric-memory kernels
/// implement the sum of floats, not `ncclAvg` (a pre-multiplied sum for floats).
pub const SUM: c_int = 0;

/// `ncclCommWindowRegister`'s `NCCL_WIN_COLL_SYMMETRIC`: every rank passes its collectives
/// buffers at the same offsets into its window, so NCCL may run its symmetric kernels.
pub const WIN_COLL_SYMMETRIC: c_int = 1;

/// The environment variable that turns NCCL's symmetric memory off (`0`): each rank's
/// allocation then comes from the CUDA driver and is not registered with NCCL.
pub const SYMMETRIC: &str = "INGOT_NCCL_SYMMETRIC";

/// Whether a rank's allocation is NCCL symmetric memory, given [`SYMMETRIC`]'s value: yes
/// unless it is `0`.
pub fn symmetric_setting(value: Option<&std::ffi::OsStr>) -> bool {
    value.is_none_or(|v| v != "0")
}

/// An NCCL window handle (`ncclWindow_t`).
pub type RawWindow = *mut c_void;

type Res = c_int;

/// The functions of the loaded library.
pub struct Nccl {
    pub path: PathBuf,
    get_version: unsafe extern "C" fn(*mut c_int) -> Res,
    get_error_string: unsafe extern "C" fn(Res) -> *const c_char,
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> Res,
    comm_init_rank: unsafe extern "C" fn(*mut RawComm, c_int, UniqueId, c_int) -> Res,
    comm_init_all: unsafe extern "C" fn(*mut RawComm, c_int, *const c_int) -> Res,
    comm_destroy: unsafe extern "C" fn(RawComm) -> Res,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        RawComm,
        *mut c_void,
    ) -> Res,
    all_gather:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, RawComm, *mut c_void) -> Res,
    /// `ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream)`.
    reduce_scatter: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        RawComm,
        *mut c_void,
    ) -> Res,
    group_start: unsafe extern "C" fn() -> Res,
    group_end: unsafe extern "C" fn() -> Res,
    /// NCCL 2.27's symmetric memory, where the library has it.
    symmetric: Option<Symmetric>,
}

/// The functions of NCCL's symmetric memory (2.27 and later): memory NCCL allocates through
/// CUDA's virtual memory API and maps for its peers, registered as a window each rank sees
/// at the same offsets, on which NCCL runs kernels that read and write the peers' buffers
/// directly (no copy through its own buffers, fewer SMs).
struct Symmetric {
    mem_alloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> Res,
    mem_free: unsafe extern "C" fn(*mut c_void) -> Res,
    window_register:
        unsafe extern "C" fn(RawComm, *mut c_void, usize, *mut RawWindow, c_int) -> Res,
    window_deregister: unsafe extern "C" fn(RawComm, RawWindow) -> Res,
}

/// What Ingot tells NCCL through its environment before loading it, each unless the user has
/// set the variable (theirs is kept): `(variable, value)`.
///
/// - `NCCL_GRAPH_MIXING_SUPPORT=0`: Ingot's use of a communicator is stream ordered: its
///   operations are captured in the graphs of one rank (the training step, the evaluation
///   step), which that rank launches one after another on its own stream, or (a profile) run on
///   that same stream outside a graph. NCCL's default supports graphs of one communicator
///   launched in parallel, at the cost of more synchronisation on every launch; stream
///   ordered, it does without (NCCL 2.28: `graphUsageMode` stream-ordered instead of mixed).
///   On gpt2 in bf16 on two H200 the step is about 0.15 ms shorter (docs/benchmarks.md,
///   session 19).
/// - `NCCL_SYM_CTAS=16`: the CTAs of NCCL's symmetric-memory kernels (each rank's memory is a
///   symmetric window, see [`SYMMETRIC`]). NCCL's own model picks 7 for a 25 MB all-reduce,
///   charging each SM it takes 2.5% of the time; but the step's all-reduces run beside the
///   backward pass, where finishing sooner is worth more SMs: gpt2's two-GPU bf16 step is
///   0.12 ms shorter with 16 (4: 0.15 ms longer; 24 and 32 between; session 20).
pub const SETTINGS: [(&str, &str); 2] = [(GRAPH_MIXING, "0"), (SYM_CTAS, "16")];

/// The environment variable that tells NCCL whether a communicator's operations may come from
/// CUDA graphs launched side by side, or mixed with uncaptured calls ("graph mixing").
pub const GRAPH_MIXING: &str = "NCCL_GRAPH_MIXING_SUPPORT";

/// The environment variable that sets the CTAs of NCCL's symmetric kernels.
pub const SYM_CTAS: &str = "NCCL_SYM_CTAS";

/// What a variable of [`SETTINGS`] is set to before NCCL is loaded, given its value in the
/// environment: `value`, unless the user set it.
pub fn setting(current: Option<&std::ffi::OsStr>, value: &'static str) -> Option<&'static str> {
    current.is_none().then_some(value)
}

/// NCCL, found and loaded once per process; the error says where it was looked for. Sets
/// the variables of [`SETTINGS`] first ([`setting`]); every caller loads NCCL from the thread
/// that then starts the ranks, before any rank thread exists.
pub fn load() -> Result<&'static Nccl, String> {
    static LOADED: OnceLock<Result<Nccl, String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            for (name, value) in SETTINGS {
                if let Some(v) = setting(std::env::var_os(name).as_deref(), value) {
                    std::env::set_var(name, v);
                }
            }
            let path = libsearch::find(&NCCL).map_err(|e| e.to_string())?;
            let lib = libsearch::preload(&path)?;
            bind(lib, path)
        })
        .as_ref()
        .map_err(Clone::clone)
}

fn bind(lib: &'static libloading::Library, path: PathBuf) -> Result<Nccl, String> {
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol is NCCL's, of the C signature declared in the field.
            *unsafe { lib.get($name) }.map_err(|e| {
                format!(
                    "{}: no symbol {}: {e}",
                    path.display(),
                    String::from_utf8_lossy(&$name[..$name.len() - 1])
                )
            })?
        };
    }
    Ok(Nccl {
        get_version: sym!(b"ncclGetVersion\0"),
        get_error_string: sym!(b"ncclGetErrorString\0"),
        get_unique_id: sym!(b"ncclGetUniqueId\0"),
        comm_init_rank: sym!(b"ncclCommInitRank\0"),
        comm_init_all: sym!(b"ncclCommInitAll\0"),
        comm_destroy: sym!(b"ncclCommDestroy\0"),
        all_reduce: sym!(b"ncclAllReduce\0"),
        all_gather: sym!(b"ncclAllGather\0"),
        reduce_scatter: sym!(b"ncclReduceScatter\0"),
        group_start: sym!(b"ncclGroupStart\0"),
        group_end: sym!(b"ncclGroupEnd\0"),
        symmetric: symmetric(lib),
        path,
    })
}

/// The symmetric-memory functions, when the library has all four (NCCL 2.27 and later).
fn symmetric(lib: &'static libloading::Library) -> Option<Symmetric> {
    // SAFETY: each symbol is NCCL's, of the C signature declared in the field.
    unsafe {
        Some(Symmetric {
            mem_alloc: *lib.get(b"ncclMemAlloc\0").ok()?,
            mem_free: *lib.get(b"ncclMemFree\0").ok()?,
            window_register: *lib.get(b"ncclCommWindowRegister\0").ok()?,
            window_deregister: *lib.get(b"ncclCommWindowDeregister\0").ok()?,
        })
    }
}

impl Nccl {
    fn check(&self, what: &str, r: Res) -> Result<(), String> {
        if r == 0 {
            return Ok(());
        }
        // SAFETY: NCCL returns a static string for any result code.
        let msg = unsafe { CStr::from_ptr((self.get_error_string)(r)) };
        Err(format!("NCCL {what}: {} (code {r})", msg.to_string_lossy()))
    }

    /// NCCL's version as `major.minor.patch`.
    pub fn version(&self) -> Result<String, String> {
        let mut v: c_int = 0;
        // SAFETY: writes one int.
        self.check("version", unsafe { (self.get_version)(&mut v) })?;
        Ok(format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100))
    }

    /// A new unique id (rank 0 makes it; every rank of a multi-process group passes it on).
    pub fn unique_id(&self) -> Result<UniqueId, String> {
        let mut id = UniqueId { internal: [0; 128] };
        // SAFETY: writes the 128 bytes of `id`.
        self.check("unique id", unsafe { (self.get_unique_id)(&mut id) })?;
        Ok(id)
    }

    /// Whether the library has symmetric memory (NCCL 2.27 and later).
    pub fn has_symmetric_memory(&self) -> bool {
        self.symmetric.is_some()
    }

    /// `bytes` of device memory on the calling thread's current device, from NCCL's
    /// allocator (`ncclMemAlloc`: CUDA virtual memory, mapped for the peers), which a window
    /// can register ([`Comm::register_symmetric`]); freed by [`Nccl::free`].
    pub fn alloc(&self, bytes: usize) -> Result<u64, String> {
        let s = self.symmetric.as_ref().ok_or_else(no_symmetric)?;
        let mut p = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        self.check("allocating symmetric memory", unsafe {
            (s.mem_alloc)(&mut p, bytes)
        })?;
        Ok(p as u64)
    }

    /// Frees memory from [`Nccl::alloc`].
    ///
    /// # Safety
    /// `ptr` must come from [`Nccl::alloc`], be freed once, with no work left on it and no
    /// window registered over it.
    pub unsafe fn free(&self, ptr: u64) -> Result<(), String> {
        let s = self.symmetric.as_ref().ok_or_else(no_symmetric)?;
        self.check("freeing symmetric memory", (s.mem_free)(ptr as *mut c_void))
    }

    /// One communicator per device of `devices` (ranks in that order), in this process
    /// (`ncclCommInitAll`).
    pub fn init_all(&'static self, devices: &[i32]) -> Result<Vec<Comm>, String> {
        let mut raw = vec![std::ptr::null_mut(); devices.len()];
        // SAFETY: `raw` holds one slot per device.
        self.check("init", unsafe {
            (self.comm_init_all)(raw.as_mut_ptr(), devices.len() as c_int, devices.as_ptr())
        })?;
        Ok(raw
            .into_iter()
            .map(|raw| Comm {
                nccl: self,
                raw,
                ranks: devices.len(),
            })
            .collect())
    }

    /// This process's rank `rank` of `ranks` (`ncclCommInitRank`), on the CUDA device current
    /// on the calling thread.
    pub fn init_rank(
        &'static self,
        ranks: usize,
        id: UniqueId,
        rank: usize,
    ) -> Result<Comm, String> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one handle.
        self.check("init", unsafe {
            (self.comm_init_rank)(&mut raw, ranks as c_int, id, rank as c_int)
        })?;
        Ok(Comm {
            nccl: self,
            raw,
            ranks,
        })
    }

    /// Runs `f` between `ncclGroupStart` and `ncclGroupEnd` (several communicators driven from
    /// one thread).
    pub fn group<T>(&self, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
        // SAFETY: no arguments.
        self.check("group start", unsafe { (self.group_start)() })?;
        let out = f();
        // SAFETY: as above; ended even when `f` failed, so the group is not left open.
        let end = self.check("group end", unsafe { (self.group_end)() });
        let out = out?;
        end.map(|_| out)
    }
}

fn no_symmetric() -> String {
    "this NCCL has no symmetric memory (ncclMemAlloc, ncclCommWindowRegister: NCCL 2.27 and \
     later)"
        .into()
}

/// One rank's communicator; destroyed on drop.
pub struct Comm {
    nccl: &'static Nccl,
    raw: RawComm,
    ranks: usize,
}

// SAFETY: an NCCL communicator may be used from any one thread at a time.
unsafe impl Send for Comm {}

impl Comm {
    /// How many ranks the communicator's group has.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Registers `bytes` at `ptr` (from [`Nccl::alloc`]) as this rank's window of symmetric
    /// memory (`NCCL_WIN_COLL_SYMMETRIC`). Collective: every rank registers its window of the
    /// same size at once, and passes its collectives buffers at the same offsets into it.
    pub fn register_symmetric(&self, ptr: u64, bytes: usize) -> Result<RawWindow, String> {
        let s = self.nccl.symmetric.as_ref().ok_or_else(no_symmetric)?;
        let mut w = std::ptr::null_mut();
        // SAFETY: the range is NCCL memory of this rank's device; writes one handle.
        let r = unsafe {
            (s.window_register)(
                self.raw,
                ptr as *mut c_void,
                bytes,
                &mut w,
                WIN_COLL_SYMMETRIC,
            )
        };
        self.nccl.check("registering the symmetric window", r)?;
        Ok(w)
    }

    /// Deregisters a window of [`Comm::register_symmetric`].
    ///
    /// # Safety
    /// `window` must be this communicator's, deregistered once, with no work left on it.
    pub unsafe fn deregister(&self, window: RawWindow) -> Result<(), String> {
        let s = self.nccl.symmetric.as_ref().ok_or_else(no_symmetric)?;
        self.nccl.check(
            "deregistering the symmetric window",
            (s.window_deregister)(self.raw, window),
        )
    }

    /// The library this communicator is of.
    pub fn nccl(&self) -> &'static Nccl {
        self.nccl
    }

    /// Queues the in-place sum over the ranks of `count` elements of `dtype` at device address
    /// `ptr`, on `stream` (a `CUstream`).
    ///
    /// # Safety
    /// `ptr` must address `count` elements of `dtype` of device memory live until the stream
    /// has run the operation, and `stream` a stream of the communicator's device.
    pub unsafe fn all_reduce_sum(
        &self,
        ptr: u64,
        count: usize,
        dtype: DataType,
        stream: *mut c_void,
    ) -> Result<(), String> {
        let p = ptr as *mut c_void;
        self.nccl.check(
            "all-reduce",
            (self.nccl.all_reduce)(p, p, count, dtype as c_int, SUM, self.raw, stream),
        )
    }
}

impl Comm {
    /// Queues the all-gather of `bytes` bytes at device address `from` on every rank into the
    /// `ranks * bytes` bytes at `to`, rank 0's first, on `stream` (a `CUstream`).
    ///
    /// # Safety
    /// `from` must address `bytes` bytes and `to` `ranks * bytes` bytes of device memory, apart,
    /// live until the stream has run the operation, and `stream` a stream of the
    /// communicator's device.
    pub unsafe fn all_gather(
        &self,
        from: u64,
        to: u64,
        bytes: usize,
        stream: *mut c_void,
    ) -> Result<(), String> {
        self.nccl.check(
            "all-gather",
            (self.nccl.all_gather)(
                from as *const c_void,
                to as *mut c_void,
                bytes,
                DataType::Uint8 as c_int,
                self.raw,
                stream,
            ),
        )
    }

    /// Queues this rank's part of a reduce-scatter: its `count` elements of `dtype` of the sum
    /// over the ranks of the `ranks * count` elements at device address `from` on every rank,
    /// into `to` (rank `r` gets elements `r * count .. (r + 1) * count`), on `stream`.
    ///
    /// # Safety
    /// `from` must address `ranks * count` and `to` `count` elements of `dtype` of device
    /// memory, apart, live until the stream has run the operation, and `stream` a stream of
    /// the communicator's device.
    pub unsafe fn reduce_scatter_sum(
        &self,
        from: u64,
        to: u64,
        count: usize,
        dtype: DataType,
        stream: *mut c_void,
    ) -> Result<(), String> {
        self.nccl.check(
            "reduce-scatter",
            (self.nccl.reduce_scatter)(
                from as *const c_void,
                to as *mut c_void,
                count,
                dtype as c_int,
                SUM,
                self.raw,
                stream,
            ),
        )
    }

    /// Runs `f` (this communicator's calls) as one NCCL group ([`Nccl::group`]), so they
    /// launch together as one operation.
    pub fn group<T>(&self, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
        self.nccl.group(f)
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // SAFETY: the handle came from init and is destroyed once.
        unsafe { (self.nccl.comm_destroy)(self.raw) };
    }
}

/// The NCCL element type of a gradient dtype.
pub fn data_type(dtype: ingot_compiler::ir::DType) -> Option<DataType> {
    use ingot_compiler::ir::DType;
    match dtype {
        DType::F32 => Some(DataType::Float32),
        DType::F64 => Some(DataType::Float64),
        DType::BF16 => Some(DataType::Bfloat16),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_use_symmetric_memory_unless_the_user_turns_it_off() {
        assert!(symmetric_setting(None));
        assert!(symmetric_setting(Some(std::ffi::OsStr::new("1"))));
        assert!(!symmetric_setting(Some(std::ffi::OsStr::new("0"))));
    }

    #[test]
    fn nccl_is_told_its_operations_are_stream_ordered_unless_the_user_said_otherwise() {
        let (name, value) = SETTINGS[0];
        assert_eq!((name, value), (GRAPH_MIXING, "0"));
        assert_eq!(setting(None, value), Some("0"));
        assert_eq!(setting(Some(std::ffi::OsStr::new("1")), value), None);
        assert_eq!(setting(Some(std::ffi::OsStr::new("0")), value), None);
    }

    #[test]
    fn nccl_symmetric_kernels_get_sixteen_ctas_unless_the_user_said_otherwise() {
        let (name, value) = SETTINGS[1];
        assert_eq!((name, value), (SYM_CTAS, "16"));
        assert_eq!(setting(None, value), Some("16"));
        assert_eq!(setting(Some(std::ffi::OsStr::new("0")), value), None);
    }
}
