//! What the generator hands out: a kernel's text and launch shape ([`CudaKernel`], [`Launch`]),
//! a fused kernel's launches ([`FusedProgram`]), the strategy and tuning choices it was made
//! with, and why it could not be made ([`CodegenError`]).

use crate::dtype::DType;
use crate::fused::KernelError;

/// One generated kernel: an `extern "C" __global__` function, its launch shape.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CudaKernel {
    /// Entry point; derived from a stable 64-bit FNV-1a hash of the function's text,
    /// `ingot_{hash:016x}`, so identical kernels (the same fused kernel in twelve layers) get one
    /// name and the runtime compiles each once.
    pub name: String,
    /// The function's CUDA C text (uses the helpers in [`PRELUDE`](crate::cuda::PRELUDE); everything else it needs is
    /// inside the function).
    pub source: String,
    pub launch: Launch,
}

/// A launch shape. `shared_bytes` is dynamic shared memory (the generated kernels declare their
/// shared memory statically, so it is 0 for them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Launch {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
}

/// How a fused kernel maps onto threads (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// A grid-stride loop over the domain's elements (or over 32 × 32 tiles, transposing).
    Elementwise,
    /// A block, or a group of lanes of one warp, per row; threads striding along the row.
    Rows,
    /// A block per 32 (or 16, or 8) rows, thread `x` a row, threads `y` striding along it.
    Columns,
}

impl Strategy {
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Elementwise => "elementwise",
            Strategy::Rows => "rows",
            Strategy::Columns => "columns",
        }
    }
}

/// A description the generator cannot turn into a kernel. Never a panic.
#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    /// The fused kernel does not check.
    #[error("cuda codegen: {0}")]
    Invalid(#[from] KernelError),
    /// An op is not defined (or not supported on the GPU) for a dtype.
    #[error("cuda codegen: {op} is not supported for {what} of dtype {dtype}")]
    Unsupported {
        op: &'static str,
        what: &'static str,
        dtype: DType,
    },
    /// Sizes whose element counts overflow.
    #[error("cuda codegen: {op}: the sizes {sizes:?} give more elements than 64 bits can index")]
    TooLarge { op: &'static str, sizes: Vec<usize> },
    /// More static shared memory than a block may declare.
    #[error(
        "cuda codegen: fused kernel needs {bytes} bytes of shared memory for its {reductions} \
         reductions, more than the 48 KiB a block may declare statically; split the kernel"
    )]
    SharedMemory { bytes: usize, reductions: usize },
    /// A geometry the generator has no kernel for (a direct depthwise convolution's, say).
    #[error("cuda codegen: {op} does not run {what}")]
    Geometry { op: &'static str, what: String },
}

/// Where a launch of a fused kernel's program points one of its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FusedArg {
    /// The fused kernel's input `n`.
    Input(usize),
    /// Its output `j`.
    Output(usize),
    /// `bytes` bytes at `offset` of the kernel's scratch space
    /// ([`FusedProgram::scratch_bytes`]).
    Scratch { offset: usize, bytes: usize },
}

/// One launch of a fused kernel's program: its parameters in order, of which the first
/// `reads` are read and the rest written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FusedLaunch {
    pub kernel: CudaKernel,
    pub args: Vec<FusedArg>,
    pub reads: usize,
}

/// How a fused kernel runs on the GPU: its launches in order, and the scratch bytes they share
/// (planned as the node's workspace). One launch of [`fused`](crate::cuda::fused())'s kernel, or a column reduction
/// that leaves the GPU idle split in two ([`crate::fused::split`]): partials into the scratch,
/// then the finish; or a reduction whose full outputs read its reductions, split by stages
/// ([`crate::fused::staged`]): a partial and a finish kernel a stage, then the full outputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FusedProgram {
    pub launches: Vec<FusedLaunch>,
    pub scratch_bytes: usize,
}

impl FusedProgram {
    /// One launch of `kernel` on `inputs` inputs then `outputs` outputs, no scratch.
    pub fn one(kernel: CudaKernel, inputs: usize, outputs: usize) -> FusedProgram {
        FusedProgram {
            launches: vec![FusedLaunch {
                kernel,
                args: (0..inputs)
                    .map(FusedArg::Input)
                    .chain((0..outputs).map(FusedArg::Output))
                    .collect(),
                reads: inputs,
            }],
            scratch_bytes: 0,
        }
    }
}

/// Choices of [`fused_tuned`](crate::cuda::fused_tuned) that override the generator's own, for measuring them
/// (`cuda_kernels --variants`); the default overrides nothing.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tuning {
    /// Threads per row of the row strategy (a power of two up to 1024: up to 32, a group of
    /// lanes of one warp; above, a block, whose size may also be any multiple of 32, say 192
    /// for rows of 768 in vectors of 4; anything else is ignored). Loads are still kept in
    /// registers across passes only where they fit.
    pub row_threads: Option<u32>,
    /// Elementwise kernels one element a thread, never four.
    pub scalar_elementwise: bool,
    /// Long rows (read from memory in every loop) one element a thread, never four.
    pub scalar_rows: bool,
    /// Every load read at every element, even where a `select` drops its value (see the
    /// guarded loads of the row strategy).
    pub unguarded_loads: bool,
    /// Rows side by side in a block of the column strategy (a power of two from 1 to 32;
    /// anything else is ignored).
    pub column_rows: Option<u32>,
    /// 32-bit registers a thread the register cache of a row may take, instead of the
    /// generator's 32 (with `row_threads`: a warp a row of 1024 caching 32 elements of two
    /// loads a lane needs 64).
    pub cache_words: Option<usize>,
}
