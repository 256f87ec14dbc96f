//! A channels-last depthwise convolution's direct kernels ([`ingot_kernels::cuda::depthwise`]),
//! lowered as the fallback of its cuDNN operation: by default the step runs them in its place
//! ([`super::conv::DefaultRoute::Depthwise`]); `INGOT_CONV=cudnn` runs cuDNN instead.
//!
//! Why: ConvNeXt's 7x7 depthwise convolutions through cuDNN's first deterministic algorithm
//! (the heuristics' order, channels-last bf16) are where the imported convnext_tiny's step
//! spent its time beside torch.compile's (issue 48, docs/benchmarks.md, session 42). The
//! forward and data-gradient passes need no workspace; the filter gradient puts its partial
//! sums in the node's planned workspace, as many pixel groups as it holds
//! ([`kernels::grad_weight_groups`]): the plan is the one cuDNN's path has, byte for byte.

use super::lowering::Lowering;
use super::DeviceOp;
use crate::ir::{DType, NodeId};
use crate::lower::deps::Touch;
use crate::plan::Location;
use ingot_kernels::cpu::conv::{ConvGeometry, Pass};
use ingot_kernels::cuda::depthwise as kernels;
use ingot_kernels::cuda::CodegenError;
use smallvec::smallvec;

impl Lowering<'_> {
    /// The direct kernels of channels-last convolution node `id` (geometry `geo`, pass `pass`,
    /// dtype `d`, planned workspace `ws`), taken out of the program to stand as its cuDNN
    /// operation's fallback; none where the convolution is not depthwise
    /// ([`kernels::runs`]), the dtype is not f32, f64 or bf16, or (the filter gradient) the
    /// workspace holds not one pixel group's partial sums.
    pub(super) fn depthwise(
        &mut self,
        id: NodeId,
        (geo, pass): (ConvGeometry, Pass),
        d: DType,
        ws: Location,
    ) -> Result<Vec<DeviceOp>, CodegenError> {
        if !kernels::runs(&geo) || !matches!(d, DType::F32 | DType::F64 | DType::BF16) {
            return Ok(Vec::new());
        }
        let node = self.g.node(id);
        let here = self.location[id.index()];
        let (a, b) = (
            self.location[node.inputs[0].index()],
            self.location[node.inputs[1].index()],
        );
        let start = self.ops.len();
        match pass {
            Pass::Forward | Pass::GradInput => {
                // Forward: x, w -> y; data gradient: dy, w -> dx.
                let k = match pass {
                    Pass::Forward => kernels::depthwise_forward(d, &geo)?,
                    _ => kernels::depthwise_grad_input(d, &geo)?,
                };
                let touch = Touch {
                    reads: smallvec![a, b],
                    writes: smallvec![here],
                };
                self.launch_touching(id, k, smallvec![a.offset, b.offset, here.offset], touch);
            }
            Pass::GradWeight => {
                // x, dy -> dw, through the partial sums at the workspace's start.
                let Some(groups) = kernels::grad_weight_groups(d, &geo, ws.bytes) else {
                    return Ok(Vec::new());
                };
                let part = Location {
                    offset: ws.offset,
                    bytes: kernels::depthwise_grad_weight_scratch_bytes(d, &geo, groups),
                };
                let partial = kernels::depthwise_grad_weight_partial(d, &geo, groups)?;
                let sum = kernels::depthwise_grad_weight_sum(d, &geo, groups)?;
                let touch = Touch {
                    reads: smallvec![a, b],
                    writes: smallvec![part],
                };
                let args = smallvec![a.offset, b.offset, part.offset];
                self.launch_touching(id, partial, args, touch);
                let touch = Touch {
                    reads: smallvec![part],
                    writes: smallvec![here],
                };
                self.launch_touching(id, sum, smallvec![part.offset, here.offset], touch);
            }
        }
        let ops: Vec<DeviceOp> = self.ops.drain(start..).collect();
        self.touches.truncate(start);
        Ok(ops)
    }
}
