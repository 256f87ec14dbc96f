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
//! none of it, the others get up to the whole of it.

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
