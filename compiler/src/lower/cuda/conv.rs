//! A convolution pass as one device operation for cuDNN ([`Conv`]): its geometry, dtype,
//! compute type and pass, the byte offsets of its three tensors and of its planned workspace,
//! and the im2col / col2im launches and cuBLAS GEMMs that compute the same pass, kept inside
//! the operation as its fallback.
//!
//! The lowering cannot know whether the machine that loads the step has cuDNN, nor which of
//! cuDNN's algorithms suit its GPU; both are settled when the step is loaded (the runtime's
//! `cuda::cudnn`): cuDNN's heuristics, keeping the first deterministic algorithm whose
//! workspace fits the planned one, else the fallback. The workspace is planned exactly as the
//! fallback needs it (`super::window`: at least one image's column buffer and cuBLAS's
//! workspace, up to a chunk's where the step's peak leaves room), so both paths run in what
//! the plan holds and nothing is allocated at run time; cuDNN's implicit-GEMM algorithms need
//! none of it, the others get up to the whole of it. A convolution over fewer than 8 input
//! channels (a stem) may grow further, into room for the padded copies cuDNN's fast
//! algorithms make of it ([`cudnn_few_channel_room`]).

use super::gemm::Compute;
use super::program::DeviceOp;
use crate::ir::{ConvLayout, DType, NodeId};
use crate::plan::Location;
use ingot_kernels::cpu::conv::{ConvGeometry, Pass};
use serde::{Deserialize, Serialize};

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

/// The input channels (of one group) cuDNN's tensor-core kernels read a pixel at a time: a
/// convolution over fewer is run by cuDNN on a copy of its input padded to this many.
pub const CUDNN_CHANNEL_PAD: usize = 8;

/// The workspace in which cuDNN runs a convolution over few input channels (fewer than
/// [`CUDNN_CHANNEL_PAD`], one group: an image model's stem) by its fast algorithm; 0 for any
/// other convolution, which needs nothing of the kind.
///
/// Measured on an H200 with cuDNN 9.19 (session 39, `runtime/examples/conv_probe.rs`) for
/// resnet50's stem (x `[128, 3, 224, 224]` bf16, w `[64, 3, 7, 7]`, stride 2, padding 3): the
/// heuristics' first deterministic filter-gradient algorithm (`ALGO_1`) asks 314,453,136 bytes
/// in NCHW and runs in 1.00 ms; within the 54.7 MB the im2col fallback was planned it gets a
/// variant of 37,728 bytes that runs in 4.88 ms. Its bytes are, to the byte, the input copied
/// channels-last and padded to 8 channels (102,760,448 + 50,192), `dy` copied channels-last
/// (205,520,896: none in a channels-last convolution, which asks 108,932,240) and 61 f32 copies
/// of the padded filter (6,121,600) for its split sums; the forward asks the same less the
/// split sums (308,331,536 NCHW: 1.39 ms against 1.51 ms in 588 bytes; 102,810,640
/// channels-last: 0.97 ms against 1.56). So this asks the input padded, the output copied
/// where the convolution is NCHW, 64 f32 copies of the padded filter and 1 MiB, for every
/// pass; the planner grants it only where the step's peak leaves room
/// ([`crate::plan::WorkspaceNeed::up_to`]), and the runtime's choice stays cuDNN's first
/// deterministic algorithm that fits what was granted.
pub fn cudnn_few_channel_room(geo: &ConvGeometry, layout: ConvLayout, e: usize) -> usize {
    if geo.groups != 1 || geo.in_ch >= CUDNN_CHANNEL_PAD {
        return 0;
    }
    let [h, w] = geo.in_hw;
    let padded_input = geo.batch * h * w * CUDNN_CHANNEL_PAD * e;
    let output_copy = match layout {
        ConvLayout::Nchw => geo.batch * geo.out_ch * geo.positions() * e,
        ConvLayout::Nhwc => 0,
    };
    let padded_filter = geo.out_ch * CUDNN_CHANNEL_PAD * geo.kernel[0] * geo.kernel[1];
    padded_input + output_copy + 64 * padded_filter * 4 + (1 << 20)
}
