//! The CUDA program's format: the device operations of one step, the kernels they launch, the
//! bytes each touches and what each waits for; stored in the step executable as is.

use super::gemm::{Compute, Gemm};
use crate::ir::{ConvLayout, DType, NodeId};
use crate::lower::deps::Touch;
use crate::lower::offload::{CopyIn, CopyOut};
use crate::plan::Location;
use ingot_kernels::cpu::conv::{ConvGeometry, Pass};
use ingot_kernels::cuda::CudaKernel;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

/// One device operation of a step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum DeviceOp {
    /// Launch kernel `kernel` of [`Program::kernels`] with these byte offsets as its pointer
    /// arguments, in the kernel's parameter order.
    Launch {
        node: NodeId,
        kernel: usize,
        args: SmallVec<[usize; 8]>,
    },
    Gemm(Gemm),
    /// A convolution pass through cuDNN, with its im2col ops as the fallback ([`Conv`]).
    Conv(Conv),
    /// Set `bytes` bytes at `offset` to zero.
    Zero {
        offset: usize,
        bytes: usize,
    },
    /// Copy `bytes` bytes from `from` to `to` (an update the plan could not place in place).
    Copy {
        from: usize,
        to: usize,
        bytes: usize,
    },
    /// Offload's copy in ([`crate::plan::offload`]) of a leaf's home (page-locked memory the
    /// runtime allocates once) into its staging buffer, on the runtime's copy stream.
    CopyIn(CopyIn),
    /// Offload's copy out of a leaf's staging buffer back to its home, on the copy stream.
    CopyOut(CopyOut),
    /// Replace the `bytes` bytes of `dtype` elements at `offset` (one gradient bucket, a
    /// contiguous planned region) by their sum over the step's `ranks` data-parallel ranks
    /// (each rank's of its share of the loss: the mean): NCCL's in-place all-reduce with
    /// `ncclSum`, on the runtime's communicator. Every rank's
    /// program holds the same all-reduces in the same order, and each waits for the one before
    /// it (NCCL requires one order of collectives on every rank; two left unordered on parallel
    /// branches of the step's graph could run in different orders on two ranks and hang).
    AllReduce {
        node: NodeId,
        offset: usize,
        bytes: usize,
        dtype: DType,
        ranks: usize,
    },
    /// Every rank's `bytes` bytes at `from`, rank 0's first, into the `ranks * bytes` bytes at
    /// `to` (apart from `from`): NCCL's all-gather of bytes, on the runtime's communicator, in
    /// the one order of the program's collectives as [`DeviceOp::AllReduce`].
    AllGather {
        node: NodeId,
        from: usize,
        to: usize,
        bytes: usize,
        ranks: usize,
    },
    /// For each part, this rank's `bytes` bytes of the sum over the `ranks` ranks of the
    /// `ranks * bytes` bytes of `dtype` elements at `from`, into `to` (apart from every
    /// part's `from`): NCCL's reduce-scatter with `ncclSum`, one call per part launched
    /// together (one NCCL group), in the one order of the program's collectives as
    /// [`DeviceOp::AllReduce`].
    ReduceScatter {
        node: NodeId,
        parts: Vec<crate::lower::scatter::ScatterPart>,
        dtype: DType,
        ranks: usize,
    },
}

impl DeviceOp {
    /// The graph node the operation computes; `None` for a memset or a copy, which the lowering
    /// adds for a node's output or the step's end rather than computing one.
    pub fn node(&self) -> Option<NodeId> {
        match self {
            DeviceOp::Launch { node, .. }
            | DeviceOp::AllReduce { node, .. }
            | DeviceOp::AllGather { node, .. }
            | DeviceOp::ReduceScatter { node, .. } => Some(*node),
            DeviceOp::Gemm(gm) => Some(gm.node),
            DeviceOp::Conv(c) => Some(c.node),
            DeviceOp::Zero { .. }
            | DeviceOp::Copy { .. }
            | DeviceOp::CopyIn { .. }
            | DeviceOp::CopyOut { .. } => None,
        }
    }

    /// True for offload's copies between the host region and the allocation, which the
    /// runtime captures on its copy stream.
    pub fn is_offload_copy(&self) -> bool {
        matches!(self, DeviceOp::CopyIn { .. } | DeviceOp::CopyOut { .. })
    }

    /// The operation and, for a convolution, its fallback's operations after it: every
    /// operation the runtime may run for this one.
    pub fn with_fallback(&self) -> impl Iterator<Item = &DeviceOp> + '_ {
        let fallback: &[DeviceOp] = match self {
            DeviceOp::Conv(c) => &c.fallback,
            _ => &[],
        };
        std::iter::once(self).chain(fallback)
    }

    /// True for the data-parallel collectives, which every rank runs in the same order.
    pub fn is_collective(&self) -> bool {
        matches!(
            self,
            DeviceOp::AllReduce { .. }
                | DeviceOp::AllGather { .. }
                | DeviceOp::ReduceScatter { .. }
        )
    }
}

/// The device operations of one step and the kernels they launch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Program {
    /// Source placed before the kernels in the module: the generator's prelude.
    pub prelude: String,
    /// Distinct kernels, each generated once (the same fused kernel in every layer is one).
    pub kernels: Vec<CudaKernel>,
    pub ops: Vec<DeviceOp>,
    /// The bytes each operation reads and writes (one per op).
    pub touches: Vec<Touch>,
    /// The earlier operations each one waits for ([`deps::dependencies`](crate::lower::deps::dependencies), one list per op).
    pub deps: Vec<SmallVec<[usize; 4]>>,
    /// Bytes of the one allocation every offset lies in.
    pub total_bytes: usize,
    /// Bytes of the host region offloaded leaves live in ([`DeviceOp::CopyIn`]); 0, and absent
    /// from the file, without offload (so a program without it is stored as it always was).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub host_bytes: usize,
}

impl Program {
    /// The CUDA C of the module holding every kernel: the shared prelude, then each kernel once.
    pub fn module_source(&self) -> String {
        let mut s = self.prelude.clone();
        for k in &self.kernels {
            s.push('\n');
            s.push_str(&k.source);
        }
        s
    }

    /// Every operation the runtime may run: the program's, each convolution followed by its
    /// fallback's ([`DeviceOp::with_fallback`]).
    pub fn all_ops(&self) -> impl Iterator<Item = &DeviceOp> + '_ {
        self.ops.iter().flat_map(DeviceOp::with_fallback)
    }

    /// Kernel launches, GEMMs, cuDNN convolutions, memsets and copies per step (a
    /// convolution's fallback not counted: it runs only in place of the convolution).
    pub fn counts(&self) -> OpCounts {
        let mut c = OpCounts::default();
        for op in &self.ops {
            match op {
                DeviceOp::Launch { .. } => c.launches += 1,
                DeviceOp::Gemm(_) => c.gemms += 1,
                DeviceOp::Conv(conv) => {
                    c.convs += 1;
                    if conv.default_route().few_channels_in_room() {
                        c.convs_few_channel_cudnn += 1;
                    }
                }
                DeviceOp::Zero { .. } => c.memsets += 1,
                DeviceOp::Copy { .. } => c.copies += 1,
                DeviceOp::CopyIn { .. } | DeviceOp::CopyOut { .. } => c.offload_copies += 1,
                DeviceOp::AllReduce { .. } => c.all_reduces += 1,
                DeviceOp::AllGather { .. } => c.all_gathers += 1,
                DeviceOp::ReduceScatter { .. } => c.reduce_scatters += 1,
            }
        }
        c
    }
}

impl Program {
    /// A short text account of the program, stable across machines, for snapshots and
    /// `ingot inspect`: operation counts, the dependency graph's size and depth, the kernels'
    /// launch shapes, the GEMM shapes with their counts, and an FNV-1a-64 fingerprint of the
    /// whole program (every offset, argument and source byte), so that any change to the
    /// lowering shows as a changed line.
    pub fn summary(&self) -> String {
        use std::collections::BTreeMap;
        use std::fmt::Write as _;
        let c = self.counts();
        let edges: usize = self.deps.iter().map(|d| d.len()).sum();
        // The longest chain of operations each waiting for the one before (the critical path
        // in operations), and the most operations at one depth (how many may overlap).
        let mut depth = vec![0usize; self.ops.len()];
        for j in 0..self.ops.len() {
            depth[j] = self.deps[j]
                .iter()
                .map(|&i| depth[i] + 1)
                .max()
                .unwrap_or(0);
        }
        let mut per_depth: BTreeMap<usize, usize> = BTreeMap::new();
        for &d in &depth {
            *per_depth.entry(d).or_default() += 1;
        }
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} operations: {} kernel launches, {} GEMMs, {} memsets, {} copies",
            self.ops.len(),
            c.launches,
            c.gemms,
            c.memsets,
            c.copies
        );
        if c.convs > 0 {
            let fallback = self.all_ops().count() - self.ops.len();
            let _ = writeln!(
                out,
                "{} cuDNN convolutions, with {fallback} im2col launches and GEMMs as their fallback",
                c.convs
            );
            let _ = writeln!(out, "default routes: {}", self.default_routes());
        }
        let _ = writeln!(
            out,
            "dependency graph: {edges} edges, {} operations deep, at most {} at one depth",
            per_depth.len(),
            per_depth.values().max().copied().unwrap_or(0)
        );
        let _ = writeln!(out, "allocation: {} bytes", self.total_bytes);
        if c.offload_copies > 0 {
            let _ = writeln!(
                out,
                "offload: {} copies on the copy stream, host region {} bytes",
                c.offload_copies, self.host_bytes
            );
        }
        let mut shapes: BTreeMap<String, usize> = BTreeMap::new();
        for k in &self.kernels {
            let l = k.launch;
            *shapes
                .entry(format!(
                    "grid {:?} block {:?} shared {}",
                    l.grid, l.block, l.shared_bytes
                ))
                .or_default() += 1;
        }
        let _ = writeln!(
            out,
            "{} distinct kernels, {} bytes of CUDA C with the prelude; launch shapes:",
            self.kernels.len(),
            self.prelude.len() + self.kernels.iter().map(|k| k.source.len()).sum::<usize>()
        );
        for (shape, n) in &shapes {
            let _ = writeln!(out, "  {n:4} x {shape}");
        }
        let mut gemms: BTreeMap<String, usize> = BTreeMap::new();
        for op in &self.ops {
            if let DeviceOp::Gemm(g) = op {
                let t = |x: bool| if x { 'T' } else { 'N' };
                *gemms
                    .entry(format!(
                        "{}{} {} m={} n={} k={} batch={}",
                        t(g.trans_first),
                        t(g.trans_second),
                        g.dtype,
                        g.m,
                        g.n,
                        g.k,
                        g.batch
                    ))
                    .or_default() += 1;
            }
        }
        let _ = writeln!(out, "GEMMs (cuBLAS column-major):");
        for (shape, n) in &gemms {
            let _ = writeln!(out, "  {n:4} x {shape}");
        }
        let json = serde_json::to_vec(self).unwrap_or_default();
        let _ = writeln!(out, "fingerprint: {:016x}", crate::files::fnv1a64(&json));
        out
    }
}

/// How many operations of each kind one step runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OpCounts {
    pub launches: usize,
    pub gemms: usize,
    /// Convolution passes through cuDNN ([`DeviceOp::Conv`]).
    #[serde(skip_serializing_if = "is_zero")]
    pub convs: usize,
    /// Of those, the NCHW passes over few channels the default runs through cuDNN, in the
    /// room its fast algorithm asks (`conv::DefaultRoute::FewChannelsInRoom`).
    #[serde(skip_serializing_if = "is_zero")]
    pub convs_few_channel_cudnn: usize,
    pub memsets: usize,
    pub copies: usize,
    /// Gradient buckets averaged over the data-parallel ranks (0 for one rank).
    pub all_reduces: usize,
    /// Gradient operands gathered from the data-parallel ranks (0 for one rank).
    pub all_gathers: usize,
    /// Gradient buckets of which each rank keeps its rows of the sum (a sharded optimizer's).
    pub reduce_scatters: usize,
    /// Offload's copies between the host region and the allocation, in and out.
    #[serde(skip_serializing_if = "is_zero")]
    pub offload_copies: usize,
}

fn is_zero(x: &usize) -> bool {
    *x == 0
}

/// Which of a convolution's three computations an operation is (cuDNN's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConvPass {
    /// `y = conv(x, w)` (`cudnnConvolutionForward`).
    Forward,
    /// `dx` from `dy` and `w` (`cudnnConvolutionBackwardData`): `x` is the result.
    Data,
    /// `dw` from `x` and `dy` (`cudnnConvolutionBackwardFilter`): `w` is the result.
    Filter,
}

impl ConvPass {
    pub fn of(pass: Pass) -> ConvPass {
        match pass {
            Pass::Forward => ConvPass::Forward,
            Pass::GradInput => ConvPass::Data,
            Pass::GradWeight => ConvPass::Filter,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ConvPass::Forward => "forward",
            ConvPass::Data => "data gradient",
            ConvPass::Filter => "filter gradient",
        }
    }
}

/// One convolution pass through cuDNN, or, where the loading runtime has no cuDNN (or cuDNN
/// has no deterministic algorithm within the workspace), through `fallback`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Conv {
    pub node: NodeId,
    pub pass: ConvPass,
    pub dims: ConvGeometry,
    /// How `x`, `w` and `y` are stored (`dims` is in NCHW's terms either way). A channels-last
    /// convolution runs only through cuDNN: its `fallback` is empty, and a runtime without
    /// cuDNN refuses to load it. Serialized only when not NCHW (an NCHW step's executable is
    /// as before; an older reader refuses a channels-last one, whose field it does not know).
    #[serde(default, skip_serializing_if = "ConvLayout::is_nchw")]
    pub layout: ConvLayout,
    /// The dtype of all three tensors.
    pub dtype: DType,
    /// The arithmetic: f32 FMA, TF32 tensor cores (a tf32 step), f64, or bf16 tensors with
    /// f32 accumulation ([`Compute::of`], as the GEMMs').
    pub compute: Compute,
    /// Byte offsets of `x`, `w` and `y`; the pass's result is one of them ([`ConvPass`]).
    pub x: usize,
    pub w: usize,
    pub y: usize,
    /// The planned workspace: cuDNN's algorithm may use all of it.
    pub workspace: Location,
    /// The operations that compute the same pass without cuDNN, in order (launches and
    /// GEMMs only, each reading and writing inside the operation's own bytes); none for a
    /// channels-last convolution.
    pub fallback: Vec<DeviceOp>,
}

impl Conv {
    /// The byte ranges of `x`, `w` and `y`.
    pub fn tensors(&self) -> [Location; 3] {
        let e = self.dtype.size();
        let [x, w, y] = self.dims.elements();
        [
            Location {
                offset: self.x,
                bytes: x * e,
            },
            Location {
                offset: self.w,
                bytes: w * e,
            },
            Location {
                offset: self.y,
                bytes: y * e,
            },
        ]
    }

    /// The range the pass writes (besides the workspace) and the two it reads.
    pub fn result_and_operands(&self) -> (Location, [Location; 2]) {
        let [x, w, y] = self.tensors();
        match self.pass {
            ConvPass::Forward => (y, [x, w]),
            ConvPass::Data => (x, [y, w]),
            ConvPass::Filter => (w, [x, y]),
        }
    }
}
