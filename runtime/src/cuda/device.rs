//! A planned step loaded on an NVIDIA GPU: one device allocation, every kernel compiled once,
//! and the whole step captured as one CUDA graph that each step replays.
//!
//! Loading, in order: the context (cudarc's per-slice event tracking off: nothing here uses
//! cudarc's slices, and events it records per slice would be allocations per step); a stream;
//! the module of every distinct kernel (NVRTC, PTX cached); a cuBLAS handle; then the free
//! device memory is read, the one allocation made (resident region and slab together, the plan's
//! total), and free memory read again, so the allocation's true device cost is measured rather
//! than assumed. Last, the step's operations are captured into a graph in global capture mode,
//! in which any call that could allocate or synchronise fails the capture instead of running.
//! Each operation is captured with exactly the dependencies the lowering computed
//! ([`ingot_compiler::lower::deps`]; the
//! stream's capture dependencies are set before each one), so the graph is the step's
//! dependency graph, not a chain, and the GPU overlaps operations that touch disjoint bytes.
//!
//! An offloaded step (its `offload` module) also holds its host region in page-locked memory, allocated
//! once with the stream, and captures its copies on a copy stream of their own, forked into the
//! capture at the first copy and joined back at the end, as a rank's collectives are.
//!
//! cuBLAS gets each matmul's workspace from the slab (`cublasSetWorkspace` before each call,
//! recorded into the graph with it), so it never allocates its own during a step.
//!
//! Convolutions ([`DeviceOp::Conv`]): by default a channels-last one runs through cuDNN (a
//! depthwise one as its fallback, Ingot's direct kernels), and an NCHW one as its im2col fallback unless the executable says cuDNN (a bf16 one over few
//! channels in the room cuDNN's fast algorithm asks: `Conv::default_route`) (`INGOT_CONV=cudnn` sends every one to cuDNN,
//! `INGOT_CONV=im2col` none: [`super::cudnn`]). Where one runs through cuDNN, a handle on the
//! step's stream is made with cuBLAS's, and once the allocation is made each such convolution
//! takes the first deterministic algorithm of cuDNN's heuristic order that fits its planned
//! workspace and runs it once on the zeroed allocation (which stays zero: a convolution of
//! zeros is zeros, and the allocation is zeroed again after), so cuDNN loads its kernels
//! outside the capture (`INGOT_CONV_TIMING=1` times the candidates instead). An NCHW
//! convolution cuDNN does not take, or every one where cuDNN is missing (said once on
//! stderr), runs its fallback's im2col ops (a channels-last depthwise one its direct kernels);
//! a step with any other channels-last convolution is refused at load without cuDNN. `INGOT_LOG=1` prints each choice.

use super::cudnn;
use super::ptx;
use crate::error::ExecError;
use crate::executor::StepExecutor;
use crate::tensor::Tensor;
use cudarc::cublas::sys as blas;
use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaFunction, CudaGraph, CudaStream};
use ingot_compiler::exe::{Executable, StepPair};
use ingot_compiler::ir::{DType, Graph, NodeId};
use ingot_compiler::lower::cuda::{Compute, DeviceOp, Gemm, Program};
use ingot_compiler::lower::{self, Target};
use ingot_compiler::plan::Location;
use ingot_compiler::plan::MemoryPlan;
use smallvec::SmallVec;
use std::ffi::c_void;
use std::sync::Arc;

/// How the step runs on the GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaOptions {
    /// Which GPU.
    pub ordinal: usize,
    /// Capture the operations as one chain in schedule order, each waiting for the one
    /// before, rather than as their dependency graph ([`lower::deps`]), where independent
    /// operations may run side by side. For measuring what the overlap gains.
    pub serial: bool,
}

/// Device memory as measured while loading, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceMemory {
    /// The GPU's memory.
    pub device_total: usize,
    /// In use before the step's allocation: the CUDA context, cuBLAS's handle, the loaded
    /// kernels, and anything else on the GPU (other processes).
    pub before_allocation: usize,
    /// Bytes asked of the driver for the one allocation (the plan's total).
    pub requested: usize,
    /// The drop in free memory the allocation caused (the driver rounds to its page size).
    pub allocation: usize,
    /// The drop in free memory capturing and instantiating the step's graph caused.
    pub graph: usize,
    /// The drop in free memory NCCL's connections to the other ranks caused, made at the
    /// step's first all-reduces while loading (0 for a step of one rank).
    pub collectives: usize,
    /// Bytes of page-locked host memory held for the offloaded leaves' homes (the plan's host
    /// region; 0 without offload).
    pub pinned_host: usize,
}

/// A step loaded on the GPU; optionally with a forward-only evaluation step planned into the
/// same allocation ([`StepPair`]), captured as a second graph over the same memory.
pub struct CudaStep {
    main: Part,
    eval: Option<Part>,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// A rank's stream for its collectives, at the GPU's highest priority: the step's graph
    /// is captured with each collective on it, and instantiated to keep each kernel node's
    /// priority (`CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`), so NCCL's kernels take the
    /// next free SMs ahead of the compute kernels queued beside them. `None` for one rank.
    collectives: Option<Arc<CudaStream>>,
    blas: cudarc::cublas::CudaBlas,
    /// A cuDNN handle on `stream`, where the program has convolutions and cuDNN loads.
    cudnn: Option<cudnn::Handle>,
    /// A cuBLASLt handle, where the program has GEMMs with epilogues ([`epilogue`]).
    lt: Option<epilogue::Handle>,
    base: sys::CUdeviceptr,
    bytes: usize,
    start: CudaEvent,
    stop: CudaEvent,
    last_seconds: Option<f64>,
    memory: DeviceMemory,
    ptx_source: ptx::Source,
    name: String,
    opts: CudaOptions,
    /// This rank's NCCL communicator, for a step compiled for several data-parallel ranks
    /// ([`DeviceOp::AllReduce`]); dropped after the graphs that use it.
    comm: Option<super::nccl::Comm>,
    /// Who made the one allocation: the CUDA driver, or (a rank of several) NCCL, as
    /// symmetric memory ([`super::nccl::Nccl::alloc`]).
    allocator: Allocator,
    /// The allocation registered as this rank's NCCL symmetric window, once loaded.
    window: Option<super::nccl::RawWindow>,
    /// The offloaded leaves' homes and their copies' stream ([`offload`]), if any.
    host: Option<host_region::HostRegion>,
}

/// Where a step's one allocation comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Allocator {
    Driver,
    /// NCCL's allocator, registered as a symmetric window: every rank's allocation holds the
    /// same plan, so every collective's buffers lie at the same offsets on every rank, as
    /// NCCL's symmetric kernels require. Its all-reduces then read and write the peers'
    /// buffers directly (session 20: about 0.1 ms off gpt2's two-GPU bf16 step).
    Nccl,
}

// SAFETY: the step's CUDA handles (the captured graphs, events, stream, cuBLAS handle and the
// allocation) belong to its context, which every method binds to the calling thread before
// using them, and `&mut self` keeps two threads from using one step at once. This is what lets
// the ranks of a data-parallel group each run on a thread of their own.
unsafe impl Send for CudaStep {}

/// Holds the ranks of a group loading side by side at one point until all have reached it
/// (`CudaStep::rank_with`), and tells each whether every rank got there without an error.
pub struct RankGate {
    barrier: std::sync::Barrier,
    failed: std::sync::atomic::AtomicBool,
}

impl RankGate {
    /// A gate for `ranks` ranks.
    pub fn new(ranks: usize) -> RankGate {
        RankGate {
            barrier: std::sync::Barrier::new(ranks),
            failed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Waits for every rank; true when all of them passed `ok`.
    pub fn pass(&self, ok: bool) -> bool {
        use std::sync::atomic::Ordering;
        if !ok {
            self.failed.store(true, Ordering::SeqCst);
        }
        self.barrier.wait();
        !self.failed.load(Ordering::SeqCst)
    }
}

/// One loaded program: its executable, its device operations, each node's bytes, its kernels
/// and its captured graph.
struct Part {
    exe: Executable,
    program: Program,
    location: Vec<Location>,
    functions: Vec<CudaFunction>,
    exec: Option<CudaGraph>,
    /// The convolutions that run through cuDNN, by node; the others run their fallback.
    convs: std::collections::HashMap<NodeId, cudnn::ConvRun>,
    /// What each convolution runs as, in program order.
    conv_choices: Vec<cudnn::ConvChoice>,
    /// The cuBLASLt calls of the GEMMs with epilogues, by node; the others run their fallback.
    epilogues: std::collections::HashMap<NodeId, epilogue::LtGemm>,
}

/// cuDNN where a GPU is there too, else why not: what the tools that need both
/// (`runtime/examples/cudnn_offers.rs`, `conv_probe.rs`) print before they skip.
pub fn cudnn_with_gpu() -> Result<&'static cudnn::Cudnn, String> {
    available().map_err(|e| e.to_string())?;
    cudnn::load()
}

/// Whether a CUDA driver and a GPU are there; the error says which is missing.
pub fn available() -> Result<usize, ExecError> {
    // SAFETY: only tries to open the driver library.
    if !unsafe { sys::is_culib_present() } {
        return Err(unavailable(
            "no CUDA driver was found (libcuda.so could not be loaded); --device cuda needs an \
             NVIDIA GPU with its driver installed, or run with --device cpu",
        ));
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => Ok(n as usize),
        Ok(_) => Err(unavailable(
            "the CUDA driver sees no GPU; run with --device cpu",
        )),
        Err(e) => Err(unavailable(&format!(
            "the CUDA driver could not list GPUs ({e}); run with --device cpu"
        ))),
    }
}

fn unavailable(reason: &str) -> ExecError {
    ExecError::Device {
        what: "no GPU".into(),
        reason: reason.into(),
    }
}

/// How each convolution runs: cuDNN's handle and the choice timed at load.
mod conv_choice;
mod conv_route;
/// GEMMs with a bias epilogue, through cuBLASLt.
pub mod epilogue;
use conv_route::cudnn_handle;
/// Per-operation timings and the timeline.
mod diagnostics;
/// The ExecErrors a failed driver or cuBLAS call becomes.
mod errors;
use errors::{cublas, driver};
/// The offloaded leaves' homes: one region of page-locked host memory.
mod host_region;
/// Reading, writing and copying the offloaded leaves.
mod offload;
/// The timeline's stamps: a kernel that writes a timestamp, captured after each operation.
mod stamps;
use stamps::Stamps;

impl CudaStep {
    /// Loads a CUDA executable: compiles its kernels (NVRTC, or the PTX cache), makes the one
    /// allocation (zeroed) and captures the step. Nothing is lowered or validated here: the
    /// executable carries its program, checked against its validated plan.
    pub fn new(exe: Executable, opts: CudaOptions) -> Result<CudaStep, ExecError> {
        let bytes = exe.plan().total_bytes;
        CudaStep::prepare(exe, None, bytes, opts, None)?.finish()
    }

    /// Loads one rank of a step compiled for several data-parallel ranks, with its end of an
    /// NCCL group (`comm`, made for `opts.ordinal`): each gradient bucket's all-reduce is
    /// captured into the step's graph on its own branch, so it overlaps the rest of the
    /// backward pass. Every rank of the group must be loaded at the same time, each on its own
    /// thread: loading runs each all-reduce once, before the capture, so that NCCL makes its
    /// connections (collective calls that would allocate) outside it.
    /// `gate` (called with whether this rank loaded so far) holds every rank at the point
    /// before the first collective until all have got there, and says whether all did; if one
    /// did not, all stop (a rank left out would leave the others waiting
    /// in NCCL for ever). `eval` (an evaluation step, which has no collective) goes beside
    /// the training step in the one allocation of `bytes`, as [`CudaStep::pair`] loads it.
    pub(super) fn rank_with(
        exe: Executable,
        eval: Option<Executable>,
        bytes: usize,
        opts: CudaOptions,
        comm: super::nccl::Comm,
        gate: &(dyn Fn(bool) -> bool + Sync),
    ) -> Result<CudaStep, ExecError> {
        let prepared = CudaStep::prepare(exe, eval, bytes, opts, Some(comm));
        if !gate(prepared.is_ok()) {
            return Err(prepared.err().unwrap_or_else(|| {
                unavailable("another rank of the group failed to load, so this one stops too")
            }));
        }
        prepared?.finish()
    }

    /// Loads a training step and its evaluation step against one allocation of the pair's size
    /// ([`StepPair::allocation_bytes`]: the larger plan total, not the sum), each captured as its
    /// own graph: [`StepExecutor::step`] replays the training step,
    /// [`StepExecutor::eval_with_inputs`] the evaluation step.
    pub fn pair(pair: StepPair, opts: CudaOptions) -> Result<CudaStep, ExecError> {
        let bytes = pair.allocation_bytes();
        let (train, eval, _) = pair.into_parts();
        CudaStep::prepare(train, Some(eval), bytes, opts, None)?.finish()
    }

    /// Everything of loading up to the collectives and the capture: the context, kernels,
    /// cuBLAS, and the one allocation, zeroed.
    fn prepare(
        exe: Executable,
        eval: Option<Executable>,
        total_bytes: usize,
        opts: CudaOptions,
        comm: Option<super::nccl::Comm>,
    ) -> Result<CudaStep, ExecError> {
        let program = cuda_program(&exe)?;
        let ranks = crate::collective::ranks::ranks_of(&exe);
        match &comm {
            None if ranks > 1 => {
                return Err(crate::collective::needs_collective(ranks, None));
            }
            Some(c) if c.ranks() != ranks => {
                return Err(crate::collective::needs_collective(ranks, Some(c.ranks())));
            }
            _ => {}
        }
        let eval_program = eval.as_ref().map(cuda_program).transpose()?;
        let host_region =
            |ctx: &Arc<CudaContext>| host_region::host_region(ctx, &exe, eval.as_ref());
        debug_assert_eq!(exe.target(), Target::Cuda);
        let count = available()?;
        if opts.ordinal >= count {
            return Err(unavailable(&format!(
                "GPU {} was asked for, but the driver sees {count}",
                opts.ordinal
            )));
        }
        let ctx = CudaContext::new(opts.ordinal).map_err(driver("creating the context"))?;
        // SAFETY: this step makes no cudarc slices; it orders its own work on one stream.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver("creating a stream"))?;
        let host = host_region(&ctx)?;
        let collectives = match comm {
            Some(_) => {
                let (_, highest) = result::stream::get_priority_range()
                    .map_err(driver("reading the stream priorities"))?;
                Some(
                    ctx.new_stream_with_priority(highest)
                        .map_err(driver("creating the collectives' stream"))?,
                )
            }
            None => None,
        };
        let name = format!(
            "cuda:{} {}",
            opts.ordinal,
            ctx.name().unwrap_or_else(|_| "unknown GPU".into())
        );
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver("reading the compute capability"))?;
        let options = vec![format!("--gpu-architecture=compute_{major}{minor}")];
        let (functions, ptx_source) = load_kernels(&ctx, &program, &options)?;
        let eval_functions = eval_program
            .as_ref()
            .map(|p| load_kernels(&ctx, p, &options).map(|(f, _)| f))
            .transpose()?;
        let blas =
            cudarc::cublas::CudaBlas::new(stream.clone()).map_err(|e| ExecError::Device {
                what: "creating the cuBLAS handle".into(),
                reason: format!("{e:?}"),
            })?;
        // bf16 GEMMs accumulate in f32 (`Compute::Bf16F32`) and split-K partial sums must too:
        // by default cuBLAS may reduce them in the output type, bf16. The flag alone is the
        // default math mode with it set; it changes nothing where the output is f32 or f64.
        // A step compiled in tf32 (its GEMMs' compute type `Tf32`, which
        // `GemmStridedBatchedEx` takes) runs with the TF32 math mode, as it always has.
        let tf32 = program
            .all_ops()
            .any(|op| matches!(op, DeviceOp::Gemm(g) if g.compute == Compute::Tf32));
        let mode = if tf32 {
            blas::cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH
        } else {
            blas::cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION
        };
        // SAFETY: a live handle.
        cublas("setting cuBLAS's math mode", unsafe {
            blas::cublasSetMathMode(*blas.handle(), mode)
        })?;
        let programs: Vec<&Program> = std::iter::once(&program).chain(&eval_program).collect();
        let cudnn = cudnn_handle(&stream, &programs)?;
        let lt = epilogue::handle(&programs);
        conv_route::check_channels_last(&programs, cudnn.is_some())?;
        let start = ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver("creating an event"))?;
        let stop = ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver("creating an event"))?;
        ctx.synchronize().map_err(driver("synchronizing"))?;

        let (free_before, device_total) =
            result::mem_get_info().map_err(driver("reading free memory"))?;
        let plan = exe.plan();
        let bytes = total_bytes.max(plan.total_bytes).max(1);
        if bytes > free_before {
            return Err(ExecError::Device {
                what: "allocating the step's memory".into(),
                reason: format!(
                    "the plan needs {bytes} bytes ({} resident + {} slab) in one allocation, but only {free_before} bytes of the GPU's {device_total} are free; lower the batch size, sequence length or model dimensions",
                    plan.resident_bytes, plan.slab_bytes
                ),
            });
        }
        let symmetric = comm.as_ref().filter(|c| {
            c.ranks() > 1
                && c.nccl().has_symmetric_memory()
                && super::nccl::symmetric_setting(
                    std::env::var_os(super::nccl::SYMMETRIC).as_deref(),
                )
        });
        let failed = |e: String| ExecError::Device {
            what: "allocating the step's memory".into(),
            reason: format!(
                "{e}: the plan needs {bytes} bytes and {free_before} bytes of the GPU's \
                 {device_total} are free"
            ),
        };
        let (base, allocator) = match symmetric {
            Some(c) => (c.nccl().alloc(bytes).map_err(failed)?, Allocator::Nccl),
            // SAFETY: a plain device allocation, freed in Drop.
            None => (
                unsafe { result::malloc_sync(bytes) }.map_err(|e| failed(e.to_string()))?,
                Allocator::Driver,
            ),
        };
        let (free_after, _) = result::mem_get_info().map_err(driver("reading free memory"))?;
        let part = |exe: Executable, program: Program, functions: Vec<CudaFunction>| {
            let (graph, plan) = (exe.graph(), exe.plan());
            let location = graph.ids().map(|id| plan.location(graph, id)).collect();
            let epilogues = epilogue::plans(lt.as_ref(), &program);
            Part {
                epilogues,
                exe,
                program,
                location,
                functions,
                exec: None,
                convs: Default::default(),
                conv_choices: Vec::new(),
            }
        };
        let main = part(exe, program, functions);
        let eval = match (eval, eval_program, eval_functions) {
            (Some(e), Some(p), Some(f)) => Some(part(e, p, f)),
            _ => None,
        };
        let step = CudaStep {
            main,
            eval,
            ctx,
            stream,
            collectives,
            blas,
            cudnn,
            lt,
            base,
            bytes,
            start,
            stop,
            last_seconds: None,
            memory: DeviceMemory {
                device_total,
                before_allocation: device_total - free_before,
                requested: bytes,
                allocation: free_before.saturating_sub(free_after),
                graph: 0,
                collectives: 0,
                pinned_host: host.as_ref().map_or(0, |h| h.len()),
            },
            ptx_source,
            name,
            opts,
            comm,
            allocator,
            window: None,
            host,
        };
        // SAFETY: the allocation is `bytes` long.
        unsafe { result::memset_d8_sync(base, 0, bytes) }.map_err(driver("zeroing memory"))?;
        let mut step = step;
        // Without cuDNN this only records each convolution's fallback and why.
        step.choose_convolutions()?;
        if step.cudnn.is_some() {
            // SAFETY: as above; the convolutions run on the zeroed allocation have finished.
            unsafe { result::memset_d8_sync(base, 0, bytes) }.map_err(driver("zeroing memory"))?;
        }
        Ok(step)
    }

    /// What each convolution of the training step runs as (cuDNN's algorithm and workspace,
    /// or the fallback and why), in program order; empty without convolutions.
    pub fn conv_choices(&self) -> &[cudnn::ConvChoice] {
        &self.main.conv_choices
    }

    /// The rest of loading: the allocation registered as the rank's symmetric window (where
    /// NCCL made it) and the collectives connected (a rank of several), then the training
    /// step captured (and the evaluation step), and the graphs' memory measured.
    fn finish(mut self) -> Result<CudaStep, ExecError> {
        let step = &mut self;
        step.ctx.bind_to_thread().map_err(driver("binding"))?;
        let (before, _) = result::mem_get_info().map_err(driver("reading free memory"))?;
        if let (Allocator::Nccl, Some(comm)) = (step.allocator, &step.comm) {
            let window = comm
                .register_symmetric(step.base, step.bytes)
                .map_err(|reason| ExecError::Device {
                    what: "registering the step's memory with NCCL".into(),
                    reason: format!(
                        "{reason}; {}=0 leaves the step's memory to the CUDA driver",
                        super::nccl::SYMMETRIC
                    ),
                })?;
            step.window = Some(window);
        }
        step.connect_collectives()?;
        let (free_after, _) = result::mem_get_info().map_err(driver("reading free memory"))?;
        step.memory.collectives = before.saturating_sub(free_after);
        let graph = step.capture_or_fall_back(false)?;
        step.main.exec = Some(graph);
        if step.eval.is_some() {
            let graph = step.capture_or_fall_back(true)?;
            step.eval.as_mut().expect("loaded").exec = Some(graph);
        }
        let (free_graph, _) = result::mem_get_info().map_err(driver("reading free memory"))?;
        step.memory.graph = free_after.saturating_sub(free_graph);
        Ok(self)
    }

    /// Runs each of the step's collectives (all-reduces, all-gathers, reduce-scatters) once,
    /// outside any capture, and waits: NCCL connects its ranks at a communicator's first
    /// collectives (allocating device memory for its channels), which a captured call must not
    /// do. The slab is all zeros here, so the sums change nothing. Every rank runs the same
    /// collectives in the same order.
    fn connect_collectives(&self) -> Result<(), ExecError> {
        let ops: Vec<&DeviceOp> = self
            .main
            .program
            .ops
            .iter()
            .filter(|op| op.is_collective())
            .collect();
        if ops.is_empty() {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(driver("binding"))?;
        for op in ops {
            self.enqueue(&self.main, op)
                .map_err(|e| ExecError::Device {
                    what: "connecting the ranks (the first all-reduces, before the capture)".into(),
                    reason: e.to_string(),
                })?;
        }
        self.stream
            .synchronize()
            .map_err(driver("connecting the ranks (the first all-reduces)"))
    }

    /// `len` bytes of page-locked host memory in this step's context (the data loader's
    /// staging buffers).
    pub fn pinned_buffer(&self, len: usize) -> Result<super::pinned::PinnedBuffer, ExecError> {
        super::pinned::PinnedBuffer::new(&self.ctx, len)
    }

    /// The executable this step runs.
    pub fn executable(&self) -> &Executable {
        &self.main.exe
    }

    /// Whether the step's memory is an NCCL symmetric window (a rank of several, NCCL 2.27
    /// or later, not turned off by [`super::nccl::SYMMETRIC`]).
    pub fn symmetric(&self) -> bool {
        self.window.is_some()
    }

    /// Device memory as measured while loading.
    pub fn memory(&self) -> DeviceMemory {
        self.memory
    }

    /// The GPU this step runs on (its CUDA ordinal).
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// Free device memory now (after synchronizing), to check that steps allocate nothing.
    pub fn free_memory(&self) -> Result<usize, ExecError> {
        self.ctx.bind_to_thread().map_err(driver("binding"))?;
        self.stream.synchronize().map_err(driver("synchronizing"))?;
        Ok(result::mem_get_info()
            .map_err(driver("reading free memory"))?
            .0)
    }

    /// The device operations each step runs.
    pub fn program(&self) -> &Program {
        &self.main.program
    }

    /// Whether the module came from NVRTC, or its PTX from the cache.
    pub fn ptx_source(&self) -> ptx::Source {
        self.ptx_source
    }

    pub fn options(&self) -> CudaOptions {
        self.opts
    }

    /// Captures the training step (the evaluation step where `eval`); where that fails with
    /// convolutions through cuDNN, says so and captures it again with every convolution on its
    /// fallback.
    fn capture_or_fall_back(&mut self, eval: bool) -> Result<CudaGraph, ExecError> {
        fn part(s: &CudaStep, eval: bool) -> &Part {
            match (eval, &s.eval) {
                (true, Some(e)) => e,
                _ => &s.main,
            }
        }
        // A channels-last convolution but a depthwise one has no fallback to capture instead.
        let can_fall_back = |p: &Part| {
            !p.convs.is_empty()
                && (p.program.ops.iter())
                    .all(|op| !matches!(op, DeviceOp::Conv(c) if c.fallback.is_empty()))
        };
        match self.capture(part(self, eval), None) {
            Err(e) if can_fall_back(part(self, eval)) => {
                eprintln!(
                    "warning: capturing the step with its convolutions through cuDNN failed \
                     ({e}); they run as their fallbacks instead (im2col + cuBLAS, a \
                     depthwise one's direct kernels)"
                );
                let p = if eval {
                    self.eval.as_mut().expect("an eval step")
                } else {
                    &mut self.main
                };
                p.convs.clear();
                // One choice for each convolution of the program, in its order.
                let convs = (p.program.ops.iter()).filter_map(|op| match op {
                    DeviceOp::Conv(c) => Some(c),
                    _ => None,
                });
                for (c, choice) in convs.zip(&mut p.conv_choices) {
                    choice.timings.clear();
                    choice.path =
                        cudnn::ConvPath::fallback(c, "the capture with cuDNN failed".into());
                }
                self.capture(part(self, eval), None)
            }
            other => other,
        }
    }

    /// Records every operation of `part` on the stream, in capture mode, into one graph; with
    /// `stamps`, a timestamp after each ([`super::timeline`]).
    fn capture(&self, part: &Part, stamps: Option<&Stamps>) -> Result<CudaGraph, ExecError> {
        self.ctx.bind_to_thread().map_err(driver("binding"))?;
        // Thread-local mode: a call that could allocate or synchronise fails the capture when
        // this thread makes it, as a step must make none. Other threads are not held to it:
        // the ranks of a data-parallel group capture side by side, NCCL's own threads keep
        // working, and a program may drive two sessions from two threads (global mode failed
        // the second one's cuBLAS calls while the first was capturing).
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        self.stream
            .begin_capture(mode)
            .map_err(driver("starting the step's graph capture"))?;
        // The events that fork streams into the capture and join them back, kept until it ends.
        let mut events = Vec::new();
        let recorded = self.record(part, stamps, &mut events);
        // The capture is ended whatever happened, so the stream is usable (and the error, the
        // first one, is what is reported). Kernel nodes keep the priority of the stream they
        // were captured from (the collectives' is the highest).
        let flags = match self.collectives.as_ref().or(stamps.map(|s| &s.stream)) {
            Some(_) => sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY,
            None => sys::CUgraphInstantiate_flags(0),
        };
        let ended = self
            .stream
            .end_capture(flags)
            .map_err(driver("ending the step's graph capture"));
        recorded?;
        let graph = ended?.ok_or_else(|| ExecError::Device {
            what: "capturing the step".into(),
            reason: "the capture produced no graph".into(),
        })?;
        graph
            .upload()
            .map_err(driver("uploading the step's graph"))?;
        self.stream.synchronize().map_err(driver("synchronizing"))?;
        Ok(graph)
    }

    /// Enqueues the step's operations on the stream (captured, never run directly), each
    /// depending on the graph nodes that its dependencies ended with. A rank's collectives go
    /// on its collectives' stream, forked into the capture at the first one and joined back at
    /// the end; `stamps`' stream the same way, from the start.
    fn record(
        &self,
        part: &Part,
        stamps: Option<&Stamps>,
        events: &mut Vec<CudaEvent>,
    ) -> Result<(), ExecError> {
        if self.opts.serial && stamps.is_none() {
            for op in &part.program.ops {
                self.enqueue(part, op)?;
            }
            return Ok(());
        }
        let s = self.stream.cu_stream();
        let collectives = self.collectives.as_ref();
        // Whether the collectives' stream, and the offload copies', joined the capture.
        let mut forked = [false; 2];
        if let Some(st) = stamps {
            // The stamps' stream joins the capture with no dependency; its first stamp is the
            // graph's start.
            self.follow(
                &self.stream,
                &st.stream,
                "forking the stamps' stream",
                events,
            )?;
            // SAFETY: the stamps' stream is capturing since the fork.
            unsafe { set_capture_dependencies(st.stream.cu_stream(), &mut []) }
                .map_err(driver("setting a stamp's dependencies in the capture"))?;
            st.stamp(0)?;
        }
        // The graph nodes each operation's capture ended with (a cuBLAS call may add several).
        let mut ends: Vec<SmallVec<[sys::CUgraphNode; 2]>> =
            Vec::with_capacity(part.program.ops.len());
        for (op, deps) in part.program.ops.iter().zip(&part.program.deps) {
            let mut wait: SmallVec<[sys::CUgraphNode; 8]> =
                deps.iter().flat_map(|&i| ends[i].iter().copied()).collect();
            // SAFETY: the stream is capturing; `wait` holds nodes of its graph, captured
            // earlier.
            unsafe { set_capture_dependencies(s, &mut wait) }
                .map_err(driver("setting an operation's dependencies in the capture"))?;
            // A collective goes on the collectives' stream, an offload copy on the copies'.
            let side = match (collectives, &self.host) {
                (Some(c), _) if op.is_collective() => Some((c, 0)),
                (_, Some(h)) if op.is_offload_copy() => Some((&h.copies, 1)),
                _ => None,
            };
            let on = match side {
                Some((c, k)) => {
                    if !forked[k] {
                        // The side stream joins the capture, waiting on what the main stream's
                        // dependencies are now (`wait`).
                        self.follow(&self.stream, c, "forking a side stream", events)?;
                        forked[k] = true;
                    }
                    // SAFETY: as above, on the side stream, capturing since the fork.
                    unsafe { set_capture_dependencies(c.cu_stream(), &mut wait) }
                        .map_err(driver("setting an operation's dependencies in the capture"))?;
                    c.cu_stream()
                }
                None => s,
            };
            self.enqueue_on(part, op, on)?;
            let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
            let mut nodes: *const sys::CUgraphNode = std::ptr::null();
            let mut count = 0usize;
            // SAFETY: out-pointers to locals; the node array the driver returns is read before
            // the next call on the stream.
            unsafe {
                sys::cuStreamGetCaptureInfo_v3(
                    on,
                    &mut status,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    &mut nodes,
                    std::ptr::null_mut(),
                    &mut count,
                )
            }
            .result()
            .map_err(driver("reading the capture's dependencies"))?;
            ends.push(if count == 0 || nodes.is_null() {
                SmallVec::new()
            } else {
                // SAFETY: the driver returned `count` nodes at `nodes`.
                unsafe { std::slice::from_raw_parts(nodes, count) }
                    .iter()
                    .copied()
                    .collect()
            });
            if let Some(st) = stamps {
                let mut after: SmallVec<[sys::CUgraphNode; 8]> =
                    ends.last().into_iter().flatten().copied().collect();
                // SAFETY: as above, on the stamps' stream, capturing since the fork.
                unsafe { set_capture_dependencies(st.stream.cu_stream(), &mut after) }
                    .map_err(driver("setting a stamp's dependencies in the capture"))?;
                st.stamp(ends.len())?;
            }
        }
        if let Some(st) = stamps {
            self.follow(
                &st.stream,
                &self.stream,
                "joining the stamps' stream",
                events,
            )?;
        }
        if let Some(c) = collectives.filter(|_| forked[0]) {
            self.follow(c, &self.stream, "joining the collectives' stream", events)?;
        }
        if let Some(h) = self.host.as_ref().filter(|_| forked[1]) {
            self.follow(
                &h.copies,
                &self.stream,
                "joining the copies' stream",
                events,
            )?;
        }
        Ok(())
    }

    /// Makes `to` wait for what `from` has enqueued so far, through an event kept in `events`
    /// (until the capture ends): in a capture, `to` joins it (a fork) or `from`'s branch joins
    /// back (a join).
    fn follow(
        &self,
        from: &CudaStream,
        to: &CudaStream,
        what: &str,
        events: &mut Vec<CudaEvent>,
    ) -> Result<(), ExecError> {
        let event = self
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(driver("creating an event"))?;
        event.record(from).map_err(driver(what))?;
        to.wait(&event).map_err(driver(what))?;
        events.push(event);
        Ok(())
    }

    /// Enqueues one operation on the stream.
    fn enqueue(&self, part: &Part, op: &DeviceOp) -> Result<(), ExecError> {
        self.enqueue_on(part, op, self.stream.cu_stream())
    }

    /// Enqueues one operation: a collective on stream `on`, anything else on the step's stream.
    fn enqueue_on(&self, part: &Part, op: &DeviceOp, on: sys::CUstream) -> Result<(), ExecError> {
        let s = self.stream.cu_stream();
        if matches!(op, DeviceOp::AllReduce { .. }) && skip_all_reduces() {
            return Ok(());
        }
        {
            match op {
                DeviceOp::Launch { node, kernel, args } => {
                    let k = &part.program.kernels[*kernel];
                    let mut addrs: Vec<u64> = args.iter().map(|&a| self.base + a as u64).collect();
                    let mut params: Vec<*mut c_void> = addrs
                        .iter_mut()
                        .map(|a| a as *mut u64 as *mut c_void)
                        .collect();
                    let l = k.launch;
                    // SAFETY: the kernel takes one device pointer per argument, in this
                    // order (codegen's convention); every address lies inside the allocation
                    // (the program's check), and the plan keeps what it writes disjoint from
                    // what other live values hold.
                    unsafe {
                        result::launch_kernel(
                            part.functions[*kernel].cu_function(),
                            (l.grid[0], l.grid[1], l.grid[2]),
                            (l.block[0], l.block[1], l.block[2]),
                            l.shared_bytes,
                            s,
                            &mut params,
                        )
                    }
                    .map_err(|e| self.at(part, *node, "launching", e.to_string()))?;
                }
                DeviceOp::Gemm(g) => match (g.epilogue.as_ref(), part.epilogues.get(&g.node)) {
                    (None, _) => self.gemm(part, g)?,
                    (Some(e), Some(call)) => {
                        let h = self.lt.as_ref().expect("a cuBLASLt handle made the calls");
                        // An f32 bias rounded to bf16 into the workspace's tail first.
                        if let Some(r) = &e.round {
                            let launch = DeviceOp::Launch {
                                node: e.node,
                                kernel: r.kernel,
                                args: r.args.clone(),
                            };
                            self.enqueue_on(part, &launch, on)?;
                        }
                        // SAFETY: `call` was planned for `g` with `h`; the program's check put
                        // every byte of `g` inside the allocation; the stream is `s`.
                        unsafe { epilogue::enqueue(h, call, g, self.base, s) }
                            .map_err(|e| self.at(part, g.node, "recording", e))?
                    }
                    // cuBLASLt refused it: the GEMM, then the kernel it would have absorbed.
                    (Some(e), None) => {
                        self.gemm(part, g)?;
                        let launch = DeviceOp::Launch {
                            node: e.node,
                            kernel: e.kernel,
                            args: e.args.clone(),
                        };
                        self.enqueue_on(part, &launch, on)?;
                    }
                },
                DeviceOp::Conv(c) => match (part.convs.get(&c.node), &self.cudnn) {
                    // SAFETY: the program's check put every byte of `c` inside the
                    // allocation; the handle's stream is `s`.
                    (Some(run), Some(h)) => unsafe { run.enqueue(h, c, self.base) }
                        .map_err(|e| self.at(part, c.node, "recording", e))?,
                    _ => {
                        for op in &c.fallback {
                            self.enqueue_on(part, op, s)?;
                        }
                    }
                },
                DeviceOp::Zero { offset, bytes } => {
                    // SAFETY: inside the allocation (checked by the program's check).
                    unsafe { result::memset_d8_async(self.base + *offset as u64, 0, *bytes, s) }
                        .map_err(driver("recording a memset"))?
                }
                DeviceOp::CopyIn { .. } | DeviceOp::CopyOut { .. } => {
                    self.enqueue_offload_copy(op, on)?
                }
                DeviceOp::Copy { from, to, bytes } => {
                    // SAFETY: inside the allocation (checked by the program's check).
                    unsafe {
                        result::memcpy_dtod_async(
                            self.base + *to as u64,
                            self.base + *from as u64,
                            *bytes,
                            s,
                        )
                    }
                    .map_err(driver("recording a copy"))?
                }
                DeviceOp::AllReduce {
                    node,
                    offset,
                    bytes,
                    dtype,
                    ..
                } => {
                    let comm = self.comm.as_ref().ok_or_else(|| {
                        self.at(
                            part,
                            *node,
                            "all-reducing",
                            "the step has no NCCL communicator".into(),
                        )
                    })?;
                    let ty = super::nccl::data_type(*dtype).ok_or_else(|| {
                        self.at(
                            part,
                            *node,
                            "all-reducing",
                            format!("NCCL has no {dtype:?} sum"),
                        )
                    })?;
                    // SAFETY: the bucket lies inside the allocation (the program's check),
                    // which lives as long as the graphs; the stream is this device's.
                    unsafe {
                        comm.all_reduce_sum(
                            self.base + *offset as u64,
                            bytes / dtype.size(),
                            ty,
                            on as *mut c_void,
                        )
                    }
                    .map_err(|e| self.at(part, *node, "all-reducing", e))?;
                }
                DeviceOp::AllGather {
                    node,
                    from,
                    to,
                    bytes,
                    ..
                } => {
                    let comm = self.comm.as_ref().ok_or_else(|| {
                        self.at(
                            part,
                            *node,
                            "all-gathering",
                            "the step has no NCCL communicator".into(),
                        )
                    })?;
                    // SAFETY: both regions lie inside the allocation, apart (the program's
                    // check), which lives as long as the graphs; the stream is this device's.
                    unsafe {
                        comm.all_gather(
                            self.base + *from as u64,
                            self.base + *to as u64,
                            *bytes,
                            on as *mut c_void,
                        )
                    }
                    .map_err(|e| self.at(part, *node, "all-gathering", e))?;
                }
                DeviceOp::ReduceScatter {
                    node, parts, dtype, ..
                } => {
                    let fail = |reason: String| self.at(part, *node, "reduce-scattering", reason);
                    let comm = self
                        .comm
                        .as_ref()
                        .ok_or_else(|| fail("the step has no NCCL communicator".into()))?;
                    let ty = super::nccl::data_type(*dtype)
                        .ok_or_else(|| fail(format!("NCCL has no {dtype:?} sum")))?;
                    // One group: NCCL runs the parts as one operation, as it would one bucket.
                    comm.group(|| {
                        for p in parts {
                            // SAFETY: every operand and output lies inside the allocation, each
                            // output apart from every operand (the program's check); the
                            // allocation lives as long as the graphs; the stream is this
                            // device's.
                            unsafe {
                                comm.reduce_scatter_sum(
                                    self.base + p.from as u64,
                                    self.base + p.to as u64,
                                    p.bytes / dtype.size(),
                                    ty,
                                    on as *mut c_void,
                                )
                            }?;
                        }
                        Ok(())
                    })
                    .map_err(fail)?;
                }
            }
        }
        Ok(())
    }

    fn gemm(&self, part: &Part, g: &Gemm) -> Result<(), ExecError> {
        let h = *self.blas.handle();
        // The lowering chose the types (`Gemm::compute`, from the compile's precision).
        let compute = g.compute;
        use blas::cublasComputeType_t as C;
        use blas::cudaDataType as D;
        // The operands' data type, the result's, and the compute type.
        let (ty, out_ty, compute_type) = match compute {
            Compute::F32 => (D::CUDA_R_32F, D::CUDA_R_32F, C::CUBLAS_COMPUTE_32F),
            Compute::Tf32 => (
                D::CUDA_R_32F,
                D::CUDA_R_32F,
                C::CUBLAS_COMPUTE_32F_FAST_TF32,
            ),
            Compute::F64 => (D::CUDA_R_64F, D::CUDA_R_64F, C::CUBLAS_COMPUTE_64F),
            Compute::Bf16F32 => (D::CUDA_R_16BF, D::CUDA_R_16BF, C::CUBLAS_COMPUTE_32F),
            // bf16 A and B, an f32 C (a bf16 product accumulated into an f32 sum).
            Compute::Bf16InF32Out => (D::CUDA_R_16BF, D::CUDA_R_32F, C::CUBLAS_COMPUTE_32F),
        };
        let (one32, one64) = (1f32, 1f64);
        // beta: 1 adds the product to what `out` holds (`Gemm::accumulate`), 0 replaces it.
        let (beta32, beta64) = if g.accumulate {
            (1f32, 1f64)
        } else {
            (0f32, 0f64)
        };
        // Alpha and beta are of the compute type's scalar: f32 for every 32F compute type.
        let (alpha, beta): (*const c_void, *const c_void) = if compute == Compute::F64 {
            (&one64 as *const f64 as _, &beta64 as *const f64 as _)
        } else {
            (&one32 as *const f32 as _, &beta32 as *const f32 as _)
        };
        let at = |o: usize| (self.base + o as u64) as *mut c_void;
        // SAFETY: the workspace lies in the slab, live only while this matmul runs (the plan).
        cublas("setting cuBLAS's workspace", unsafe {
            blas::cublasSetWorkspace_v2(h, at(g.workspace.offset), g.workspace.bytes)
        })?;
        // One call, or the two of a split that leaves out an operand's zero triangle.
        for g in &g.calls() {
            self.gemm_call(part, g, (ty, out_ty, compute_type), (alpha, beta))?;
        }
        Ok(())
    }

    /// One cuBLAS call of a GEMM ([`Gemm::calls`]), with the types and scalars `gemm` chose.
    fn gemm_call(
        &self,
        part: &Part,
        g: &Gemm,
        (ty, out_ty, compute_type): (
            blas::cudaDataType,
            blas::cudaDataType,
            blas::cublasComputeType_t,
        ),
        (alpha, beta): (*const c_void, *const c_void),
    ) -> Result<(), ExecError> {
        let h = *self.blas.handle();
        let op = |t: bool| {
            if t {
                blas::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let at = |o: usize| (self.base + o as u64) as *mut c_void;
        // SAFETY: operand extents lie inside the allocation (the program's check did, for
        // every call); alpha and beta are read during the call (host pointer mode).
        let status = unsafe {
            blas::cublasGemmStridedBatchedEx(
                h,
                op(g.trans_first),
                op(g.trans_second),
                g.m as i32,
                g.n as i32,
                g.k as i32,
                alpha,
                at(g.first),
                ty,
                g.ld_first as i32,
                g.stride_first as i64,
                at(g.second),
                ty,
                g.ld_second as i32,
                g.stride_second as i64,
                beta,
                at(g.out),
                out_ty,
                g.ld_out as i32,
                g.stride_out as i64,
                g.batch as i32,
                compute_type,
                blas::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
            )
        };
        cublas("cuBLAS GEMM", status).map_err(|e| self.at(part, g.node, "recording", e.to_string()))
    }

    fn at(&self, part: &Part, node: NodeId, doing: &str, reason: String) -> ExecError {
        ExecError::AtNode {
            node: node.index(),
            op: part.exe.graph().node(node).op.name(),
            source: Box::new(ExecError::Device {
                what: doing.into(),
                reason,
            }),
        }
    }

    fn copy_to_host(&self, id: NodeId) -> Result<Tensor, ExecError> {
        if let Some(h) = self.home(id) {
            return self.read_home(id, h);
        }
        let l = self.main.location[id.index()];
        let mut host = vec![0u8; l.bytes];
        self.ctx.bind_to_thread().map_err(driver("binding"))?;
        self.stream.synchronize().map_err(driver("synchronizing"))?;
        if l.bytes > 0 {
            // SAFETY: the range lies inside the allocation; the stream is idle.
            unsafe { result::memcpy_dtoh_sync(&mut host[..], self.base + l.offset as u64) }
                .map_err(driver("copying to the host"))?;
        }
        Tensor::from_le_bytes(self.main.exe.graph().ty(id).clone(), &host)
    }

    /// Queues each `(input, bytes)` copy into `part`'s input slots on the step's stream, then
    /// replays `part`'s graph and waits for it (the device time measured between two events).
    /// The copies have finished when this returns, on success or failure, so the caller may
    /// reuse its buffers.
    fn run_with_inputs(&mut self, eval: bool, inputs: &[(NodeId, &[u8])]) -> Result<(), ExecError> {
        let part = if eval {
            self.eval.as_ref().ok_or_else(|| ExecError::Invalid {
                op: "eval",
                reason: "no evaluation step was loaded with this step".into(),
            })?
        } else {
            &self.main
        };
        for &(id, bytes) in inputs {
            let l = part.location.get(id.index()).copied();
            if l.is_none_or(|l| bytes.len() != l.bytes) {
                return Err(ExecError::Invalid {
                    op: "step_with_inputs",
                    reason: format!(
                        "input %{} holds {} bytes, not {}",
                        id.index(),
                        l.map_or(0, |l| l.bytes),
                        bytes.len()
                    ),
                });
            }
        }
        self.ctx.bind_to_thread().map_err(driver("binding"))?;
        let s = self.stream.cu_stream();
        let mut queued = Ok(());
        for &(id, bytes) in inputs {
            let l = part.location[id.index()];
            if l.bytes == 0 {
                continue;
            }
            // SAFETY: the range lies inside the allocation (checked above against the plan);
            // `bytes` is borrowed until the stream is synchronized below.
            queued = unsafe { result::memcpy_htod_async(self.base + l.offset as u64, bytes, s) }
                .map_err(driver("queueing an input's copy to the GPU"));
            if queued.is_err() {
                break;
            }
        }
        let r = queued.and_then(|()| self.replay(eval));
        if r.is_err() {
            // Whatever failed, no copy may still read the caller's buffers after we return.
            let _ = self.stream.synchronize();
        }
        r
    }

    /// Replays the training step's graph (or the evaluation step's) and waits for it; the
    /// device time is measured between two events around the replay.
    fn replay(&mut self, eval: bool) -> Result<(), ExecError> {
        self.ctx.bind_to_thread().map_err(driver("binding"))?;
        let part = if eval {
            self.eval.as_ref()
        } else {
            Some(&self.main)
        };
        let graph = part
            .and_then(|p| p.exec.as_ref())
            .ok_or_else(|| ExecError::Device {
                what: "running the step".into(),
                reason: "the step was not captured".into(),
            })?;
        self.start
            .record(&self.stream)
            .map_err(driver("recording an event"))?;
        graph
            .launch()
            .map_err(driver("launching the step's graph"))?;
        self.stop
            .record(&self.stream)
            .map_err(driver("recording an event"))?;
        self.stop
            .synchronize()
            .map_err(driver("running the step's graph"))?;
        let ms = self
            .start
            .elapsed_ms(&self.stop)
            .map_err(driver("timing the step"))?;
        self.last_seconds = Some(ms as f64 / 1e3);
        Ok(())
    }
}

/// Makes `wait` the nodes the next operation captured on `stream` depends on.
///
/// # Safety
/// `stream` is capturing, and `wait` holds nodes of its capture's graph.
unsafe fn set_capture_dependencies(
    stream: sys::CUstream,
    wait: &mut [sys::CUgraphNode],
) -> Result<(), cudarc::driver::DriverError> {
    // No edge data is passed.
    sys::cuStreamUpdateCaptureDependencies_v2(
        stream,
        wait.as_mut_ptr(),
        std::ptr::null(),
        wait.len(),
        sys::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES as u32,
    )
    .result()
}

fn cuda_program(exe: &Executable) -> Result<Program, ExecError> {
    match exe.program() {
        lower::Program::Cuda(p) => Ok(p.clone()),
        _ => Err(ExecError::Invalid {
            op: "load",
            reason: format!(
                "the executable was lowered for {}, not CUDA; compile it with --device cuda",
                exe.target()
            ),
        }),
    }
}

/// Compiles (or takes from the PTX cache) and loads `program`'s kernels in `ctx`.
fn load_kernels(
    ctx: &Arc<CudaContext>,
    program: &Program,
    options: &[String],
) -> Result<(Vec<CudaFunction>, ptx::Source), ExecError> {
    let (ptx_text, source) = ptx::compile(&program.module_source(), options)?;
    let module = ctx
        .load_module(cudarc::nvrtc::Ptx::from_src(ptx_text))
        .map_err(driver("loading the step's kernels"))?;
    let functions = program
        .kernels
        .iter()
        .map(|k| {
            module
                .load_function(&k.name)
                .map_err(driver(&format!("finding kernel {}", k.name)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((functions, source))
}

impl StepExecutor for CudaStep {
    fn graph(&self) -> &Graph {
        self.main.exe.graph()
    }

    fn plan(&self) -> &MemoryPlan {
        self.main.exe.plan()
    }

    /// An offloaded leaf's value goes to its home in the host region (the `offload` module); any other
    /// node's to its planned location.
    fn write_node_bytes(&mut self, id: NodeId, bytes: &[u8]) -> Result<(), ExecError> {
        let (at, home) = match self.home(id) {
            Some(h) => (h, true),
            None => (self.plan().location(self.graph(), id), false),
        };
        crate::executor::node_bytes_fit(id, at.bytes, bytes)?;
        match home {
            true => self.write_home(at, bytes),
            false => self.write_at(at, bytes),
        }
    }

    fn write_at(&mut self, at: Location, bytes: &[u8]) -> Result<(), ExecError> {
        if at.offset + bytes.len() > self.bytes {
            return Err(ExecError::Invalid {
                op: "write_at",
                reason: format!(
                    "{} bytes at offset {} are outside the allocation",
                    bytes.len(),
                    at.offset
                ),
            });
        }
        self.ctx.bind_to_thread().map_err(driver("binding"))?;
        self.stream.synchronize().map_err(driver("synchronizing"))?;
        if !bytes.is_empty() {
            // SAFETY: the range `at.offset..at.offset + bytes.len()` lies inside the allocation
            // (checked above) and the stream is idle (synchronized), so no kernel reads or
            // writes it while the synchronous copy runs.
            unsafe { result::memcpy_htod_sync(self.base + at.offset as u64, bytes) }
                .map_err(driver("copying to the GPU"))?;
        }
        Ok(())
    }

    fn read_node(&self, id: NodeId) -> Result<Tensor, ExecError> {
        self.copy_to_host(id)
    }

    fn read_scalar(&self, at: Location, dtype: DType) -> Result<f64, ExecError> {
        if at.bytes > 8 || at.offset + at.bytes > self.bytes {
            return Err(ExecError::Invalid {
                op: "read_scalar",
                reason: format!(
                    "{} bytes at {} are not a scalar of the allocation",
                    at.bytes, at.offset
                ),
            });
        }
        let mut host = [0u8; 8];
        self.ctx.bind_to_thread().map_err(driver("binding"))?;
        // The step's stop event was waited for: the stream is idle after a step, so a
        // synchronous copy (which orders after the default stream) reads its result.
        self.stream.synchronize().map_err(driver("synchronizing"))?;
        if at.bytes > 0 {
            // SAFETY: the range lies inside the allocation (checked); the stream is idle.
            unsafe {
                result::memcpy_dtoh_sync(&mut host[..at.bytes], self.base + at.offset as u64)
            }
            .map_err(driver("copying to the host"))?;
        }
        crate::executor::scalar_from_le(&host[..at.bytes], dtype)
    }

    fn read_at(&self, at: Location, out: &mut [u8]) -> Result<(), ExecError> {
        if out.len() > at.bytes || at.offset + at.bytes > self.bytes {
            return Err(ExecError::Invalid {
                op: "read_at",
                reason: format!(
                    "{} bytes at {} are not inside {} bytes of the allocation",
                    out.len(),
                    at.offset,
                    at.bytes
                ),
            });
        }
        self.ctx.bind_to_thread().map_err(driver("binding"))?;
        // The stream is idle after a step once synchronised: a synchronous copy reads its result.
        self.stream.synchronize().map_err(driver("synchronizing"))?;
        if !out.is_empty() {
            // SAFETY: the range lies inside the allocation (checked); the stream is idle.
            unsafe { result::memcpy_dtoh_sync(out, self.base + at.offset as u64) }
                .map_err(driver("copying to the host"))?;
        }
        Ok(())
    }

    fn eval_executable(&self) -> Option<&Executable> {
        self.eval.as_ref().map(|p| &p.exe)
    }

    /// Queues each input's copy on the step's stream (asynchronous, no staging allocation), then
    /// runs the step, which waits for the stream: the copies have finished when this returns,
    /// on success or failure, so the caller may reuse its buffers.
    fn step_with_inputs(&mut self, inputs: &[(NodeId, &[u8])]) -> Result<(), ExecError> {
        self.run_with_inputs(false, inputs)
    }

    fn eval_with_inputs(&mut self, inputs: &[(NodeId, &[u8])]) -> Result<(), ExecError> {
        self.run_with_inputs(true, inputs)
    }

    /// Replays the step's graph and waits for it; the step's device time is measured between
    /// two events around the replay.
    fn step(&mut self) -> Result<(), ExecError> {
        self.replay(false)
    }

    fn allocated_bytes(&self) -> usize {
        self.bytes
    }

    fn device(&self) -> String {
        self.name.clone()
    }

    fn last_step_device_seconds(&self) -> Option<f64> {
        self.last_seconds
    }
}

impl Drop for CudaStep {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        let _ = self.stream.synchronize();
        // The graphs refer to the allocation: they go first.
        self.main.exec = None;
        if let Some(e) = &mut self.eval {
            e.exec = None;
        }
        // The convolutions' descriptors and cuDNN's handle, while the context lives.
        self.main.convs.clear();
        if let Some(e) = &mut self.eval {
            e.convs.clear();
        }
        self.cudnn = None;
        // Then the window over it (before the memory and the communicator go), and it.
        if let (Some(w), Some(comm)) = (self.window.take(), &self.comm) {
            // SAFETY: registered in `finish`, deregistered once; the stream is idle.
            let _ = unsafe { comm.deregister(w) };
        }
        match (self.allocator, &self.comm) {
            (Allocator::Nccl, Some(comm)) => {
                // SAFETY: allocated by NCCL in `prepare`, freed once, here, after all work on
                // it finished (the stream synchronized and the graphs dropped above).
                let _ = unsafe { comm.nccl().free(self.base) };
            }
            _ => {
                // SAFETY: allocated by the driver in `prepare`, freed once, here, after all
                // work on it finished (the stream synchronized and the graphs dropped above).
                let _ = unsafe { result::free_sync(self.base) };
            }
        }
        self.comm = None;
    }
}

/// `INGOT_SKIP_ALL_REDUCES=1`, a diagnostic: every rank runs its step without its gradient
/// all-reduces, so the ranks train apart and their results are wrong. It splits what a
/// data-parallel step adds to a one-GPU step into the two-rank program's own work (its time
/// with the all-reduces skipped) and what the all-reduces cost beside it (the rest). The
/// all-gathers stay: without them the gathered token ids would be zeros, and the embedding's
/// `scatter_add` would add half the rows into one, a contention the real step never has.
/// [`super::ranks::GpuRanks`] says so on stderr when it loads.
pub fn skip_all_reduces() -> bool {
    static SKIP: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SKIP.get_or_init(|| std::env::var("INGOT_SKIP_ALL_REDUCES").is_ok_and(|v| v == "1"))
}
