//! The CUDA lowering of the sliding-window ops (`Op::Window`): a convolution becomes one cuDNN
//! operation ([`Conv`]) holding, as its fallback, a chunk of images at a time, im2col (or
//! col2im) launches around cuBLAS GEMMs, through a column buffer in the node's planned
//! workspace ([`ingot_kernels::cuda::window`] says the layout); max pooling is one launch,
//! its gradient two: each window's pick into the node's workspace, then the gradient from the
//! picks ([`pool_pick_workspace`]).
//!
//! The chunk is at most the largest divisor of the batch whose column buffer (and, for the
//! weight gradient, the rearranged `dy`) fits in [`COLUMN_BUDGET`]: the whole batch at once
//! for a small net, 8 or 16 images at a time for a ResNet's first layers. The planner asks
//! for one image's workspace and grants up to that chunk's where the step's peak leaves room
//! (`WorkspaceNeed::up_to`), so a convolution at the peak runs an image at a time rather
//! than raise it; the lowering runs the largest chunk the planned workspace holds. A
//! channels-last convolution has no im2col fallback (those kernels read NCHW images): it is
//! planned cuDNN's floor ([`super::workspace::cudnn_least`]) and lowered as the cuDNN
//! operation alone. The plan knows every workspace before anything runs, and nothing is
//! allocated at run time.

use super::conv::{Conv, ConvPass};
use super::lowering::Lowering;
use super::workspace::{conv_least_bytes, conv_workspace_within};
use super::{Compute, DeviceOp, Gemm, CUBLAS_WORKSPACE};
use crate::ir::{ConvLayout, DType, NodeId, WindowOp};
use crate::lower::deps::Touch;
use crate::lower::LowerError;
use crate::plan::Location;
use crate::plan::MemoryPlan;
use ingot_kernels::cpu::conv::{ConvGeometry, Pass};
use ingot_kernels::cpu::pool::PoolGeometry;
use ingot_kernels::cuda::window as kernels;
use smallvec::{smallvec, SmallVec};

/// A row-major product `C[b] (+)= op(A[b]) · op(B[b])`, `[m, k] × [k, n]`, of matrices stored
/// with row lengths `ld*` and `stride*` elements between batch entries, as the column-major
/// call cuBLAS computes (see [`Gemm`]).
struct RowMajor {
    m: usize,
    n: usize,
    k: usize,
    /// (byte offset, stored row length, batch stride, transposed)
    a: (usize, usize, usize, bool),
    b: (usize, usize, usize, bool),
    c: (usize, usize, usize),
    batch: usize,
    accumulate: bool,
}

impl RowMajor {
    fn gemm(self, node: NodeId, dtype: DType, compute: Compute, workspace: Location) -> Gemm {
        Gemm {
            node,
            dtype,
            compute,
            trans_first: self.b.3,
            trans_second: self.a.3,
            m: self.n,
            n: self.m,
            k: self.k,
            ld_first: self.b.1,
            ld_second: self.a.1,
            ld_out: self.c.1,
            stride_first: self.b.2,
            stride_second: self.a.2,
            stride_out: self.c.2,
            batch: self.batch,
            first: self.b.0,
            second: self.a.0,
            out: self.c.0,
            workspace,
            accumulate: self.accumulate,
            split: None,
            epilogue: None,
        }
    }
}

/// One operand of a convolution chunk's GEMMs: group `gi`'s matrix for image `j` starts
/// `gi·per_group + j·per_image` elements after `at` (bytes), rows `ld` elements long.
#[derive(Clone, Copy)]
struct Operand {
    at: usize,
    ld: usize,
    per_group: usize,
    per_image: usize,
    trans: bool,
}

impl Operand {
    fn at(at: usize, ld: usize, per_group: usize, per_image: usize) -> Operand {
        Operand {
            at,
            ld,
            per_group,
            per_image,
            trans: false,
        }
    }

    fn transposed(self) -> Operand {
        Operand {
            trans: true,
            ..self
        }
    }
}

/// The `groups × images` products `C = op(A)·op(B)`, `[m, k] × [k, n]`, of a convolution
/// chunk as strided batched GEMMs: a call per group batched over the images, or a call per
/// image batched over the groups, whichever makes fewer calls. A depthwise convolution of
/// 1,152 channels is then a call per image rather than 1,152 calls of a 1-row product each.
#[allow(clippy::too_many_arguments)]
fn grouped_gemms(
    (m, n, k): (usize, usize, usize),
    [a, b, c]: [Operand; 3],
    groups: usize,
    images: usize,
    e: usize,
    accumulate: bool,
) -> Vec<RowMajor> {
    let by_group = groups <= images;
    let (calls, batch) = if by_group {
        (groups, images)
    } else {
        (images, groups)
    };
    let place = |o: Operand, i: usize| {
        let (step, stride) = if by_group {
            (o.per_group, o.per_image)
        } else {
            (o.per_image, o.per_group)
        };
        (o.at + i * step * e, o.ld, stride, o.trans)
    };
    (0..calls)
        .map(|i| {
            let (at, ld, stride, _) = place(c, i);
            RowMajor {
                m,
                n,
                k,
                a: place(a, i),
                b: place(b, i),
                c: (at, ld, stride),
                batch,
                accumulate,
            }
        })
        .collect()
}

impl Lowering<'_> {
    /// A window op: pooling is one launch (its gradient two, see `pool`); a
    /// convolution its chunks of launches and GEMMs.
    pub(super) fn window(
        &mut self,
        id: NodeId,
        w: &WindowOp,
        plan: &MemoryPlan,
        inputs: &[usize],
    ) -> Result<(), LowerError> {
        let g = self.g;
        let node = g.node(id);
        let op = w.name();
        let here = self.location[id.index()];
        self.not_in_place(id)?;
        let d = node.ty.dtype;
        let codegen = |e: ingot_kernels::cuda::CodegenError| LowerError::Invalid {
            op,
            reason: e.to_string(),
        };
        let x_dims = g.ty(node.inputs[0]).shape.dims();
        if let Some(p) = w.pool_geometry(x_dims) {
            return self.pool(id, w, &p, plan, inputs).map_err(codegen);
        }
        let least = conv_least_bytes(g, id).ok_or_else(|| LowerError::Invalid {
            op,
            reason: "the operands do not make a convolution".into(),
        })?;
        let no_workspace = || LowerError::Invalid {
            op,
            reason: format!(
                "the plan gives this convolution no {least} bytes of workspace; plan the step \
                 with the CUDA target's options (Target::Cuda.plan_options())"
            ),
        };
        let ws = plan
            .workspace(id)
            .filter(|w| w.bytes >= least)
            .ok_or_else(no_workspace)?;
        if here.bytes == 0 {
            return Ok(());
        }
        let compute = Compute::of(d, self.precision)
            .filter(|_| node.inputs.iter().all(|&x| g.ty(x).dtype == d))
            .ok_or_else(|| LowerError::Invalid {
                op,
                reason: format!("cuBLAS convolves f32, f64 or bf16 tensors of one dtype, not {d}"),
            })?;
        let loc = |i: usize| self.location[node.inputs[i].index()];
        let (a, b) = (loc(0).offset, loc(1).offset);
        // The im2col kernels read NCHW images: a channels-last convolution has no im2col
        // fallback, and the runtime refuses to load it without cuDNN ([`Conv::fallback`]); a
        // depthwise one has its direct kernels instead.
        let conv_layout = w.layout();
        let (geo_pass, fallback) = if conv_layout == ConvLayout::Nhwc {
            let dims: SmallVec<[&[usize]; 2]> =
                node.inputs.iter().map(|&x| g.ty(x).shape.dims()).collect();
            let geo_pass = w
                .conv_geometry(&dims, node.ty.shape.dims())
                .ok_or_else(no_workspace)?;
            // A depthwise one has Ingot's direct kernels as its fallback (`super::depthwise`).
            let direct = self.depthwise(id, geo_pass, d, ws).map_err(codegen)?;
            (geo_pass, direct)
        } else {
            // The chunk is the largest the planned workspace holds (the planner grants more
            // than one image's where the step's peak leaves room).
            let layout = conv_workspace_within(g, id, ws.bytes).ok_or_else(no_workspace)?;
            let geo = layout.geometry;
            let (s, e) = (layout.samples, d.size());
            let limit = i32::MAX as usize;
            let (k, p, og) = (geo.col_rows(), geo.positions(), geo.out_ch / geo.groups);
            if [k, s * p, og, geo.out_ch * p].iter().any(|&x| x > limit) {
                return Err(LowerError::Invalid {
                    op,
                    reason: "a dimension of the convolution's GEMMs exceeds cuBLAS's 32-bit limit"
                        .into(),
                });
            }
            let col = Location {
                offset: ws.offset,
                bytes: layout.column_bytes,
            };
            let blas = Location {
                offset: ws.offset + layout.blas,
                bytes: CUBLAS_WORKSPACE,
            };
            let image_x = geo.in_ch * geo.in_hw[0] * geo.in_hw[1] * e;
            let image_y = geo.out_ch * p * e;
            let chunk = |l: Location, c: usize, per_image: usize| Location {
                offset: l.offset + c * s * per_image,
                bytes: s * per_image,
            };
            // The im2col ops are lowered as before, then taken out as the fallback of one cuDNN
            // operation in their place.
            let start = self.ops.len();
            let chunks = geo.batch / s;
            let col_ld = s * p;
            match layout.pass {
                Pass::Forward => {
                    let (x, wt) = (loc(0), loc(1));
                    let im2col = kernels::im2col(d, &geo, s).map_err(codegen)?;
                    for c in 0..chunks {
                        let (xc, yc) = (chunk(x, c, image_x), chunk(here, c, image_y));
                        self.launch_from_to(id, im2col.clone(), xc, col);
                        let operands = [
                            Operand::at(wt.offset, k, og * k, 0),
                            Operand::at(col.offset, col_ld, k * col_ld, p),
                            Operand::at(yc.offset, p, og * p, geo.out_ch * p),
                        ];
                        for gemm in grouped_gemms((og, p, k), operands, geo.groups, s, e, false) {
                            self.gemm_touching(
                                gemm.gemm(id, d, compute, blas),
                                &[wt, col],
                                yc,
                                blas,
                            );
                        }
                    }
                }
                Pass::GradInput => {
                    let (dy, wt) = (loc(0), loc(1));
                    let col2im = kernels::col2im(d, &geo, s).map_err(codegen)?;
                    for c in 0..chunks {
                        let (dyc, dxc) = (chunk(dy, c, image_y), chunk(here, c, image_x));
                        let operands = [
                            Operand::at(wt.offset, k, og * k, 0).transposed(),
                            Operand::at(dyc.offset, p, og * p, geo.out_ch * p),
                            Operand::at(col.offset, col_ld, k * col_ld, p),
                        ];
                        for gemm in grouped_gemms((k, p, og), operands, geo.groups, s, e, false) {
                            self.gemm_touching(
                                gemm.gemm(id, d, compute, blas),
                                &[wt, dyc],
                                col,
                                blas,
                            );
                        }
                        self.launch_from_to(id, col2im.clone(), col, dxc);
                    }
                }
                Pass::GradWeight => {
                    let (x, dy) = (loc(0), loc(1));
                    let (side_at, side_bytes) = layout.side.expect("a weight gradient's layout");
                    let side = Location {
                        offset: ws.offset + side_at,
                        bytes: side_bytes,
                    };
                    let im2col = kernels::im2col(d, &geo, s).map_err(codegen)?;
                    let arrange =
                        kernels::images_side_by_side(d, s, geo.out_ch, p).map_err(codegen)?;
                    for c in 0..chunks {
                        let (xc, dyc) = (chunk(x, c, image_x), chunk(dy, c, image_y));
                        self.launch_from_to(id, im2col.clone(), xc, col);
                        self.launch_from_to(id, arrange.clone(), dyc, side);
                        // The chunk's images are side by side along the product's inner axis, so
                        // the groups are the only batch; the chunks add up, in image order.
                        let operands = [
                            Operand::at(side.offset, col_ld, og * col_ld, 0),
                            Operand::at(col.offset, col_ld, k * col_ld, 0).transposed(),
                            Operand::at(here.offset, k, og * k, 0),
                        ];
                        let mut reads = vec![side, col];
                        if c > 0 {
                            reads.push(here);
                        }
                        for gemm in
                            grouped_gemms((og, k, col_ld), operands, geo.groups, 1, e, c > 0)
                        {
                            self.gemm_touching(gemm.gemm(id, d, compute, blas), &reads, here, blas);
                        }
                    }
                }
            }
            let fallback: Vec<DeviceOp> = self.ops.drain(start..).collect();
            self.touches.truncate(start);
            ((geo, layout.pass), fallback)
        };
        self.push_conv(
            id,
            geo_pass,
            conv_layout,
            (d, compute),
            (a, b),
            ws,
            fallback,
        );
        Ok(())
    }

    /// Pushes convolution node `id` as one cuDNN operation over its operands at byte offsets
    /// `a` and `b` and its result, in workspace `ws`, with `fallback` (the im2col ops; none for
    /// a channels-last convolution).
    #[allow(clippy::too_many_arguments)]
    fn push_conv(
        &mut self,
        id: NodeId,
        (geo, pass): (ConvGeometry, Pass),
        layout: ConvLayout,
        (dtype, compute): (DType, Compute),
        (a, b): (usize, usize),
        ws: Location,
        fallback: Vec<DeviceOp>,
    ) {
        let here = self.location[id.index()];
        let (x, w, y) = match pass {
            Pass::Forward => (a, b, here.offset),
            Pass::GradInput => (here.offset, b, a),
            Pass::GradWeight => (a, here.offset, b),
        };
        self.ops.push(DeviceOp::Conv(Conv {
            node: id,
            pass: ConvPass::of(pass),
            dims: geo,
            layout,
            dtype,
            compute,
            x,
            w,
            y,
            workspace: ws,
            fallback,
        }));
        // It reads its operands and writes its result and the whole workspace, whichever
        // path runs.
        self.touched(id, smallvec![here, ws]);
    }

    /// A max pooling (`w`, geometry `p`): one launch; its gradient two where the node's
    /// planned workspace holds the windows' picks ([`pool_pick_workspace`]): the picks, then
    /// the gradient from them, which waits for the picks as it reads their bytes.
    fn pool(
        &mut self,
        id: NodeId,
        w: &WindowOp,
        p: &PoolGeometry,
        plan: &MemoryPlan,
        inputs: &[usize],
    ) -> Result<(), ingot_kernels::cuda::CodegenError> {
        let here = self.location[id.index()];
        if here.bytes == 0 {
            return Ok(());
        }
        let node = self.g.node(id);
        let d = node.ty.dtype;
        let picks = plan.workspace(id).filter(|ws| {
            matches!(w, WindowOp::MaxPool2dGrad(_))
                && kernels::pool_pick_bytes(p).is_some_and(|b| b <= ws.bytes)
        });
        if let Some(ws) = picks {
            let pick = kernels::max_pool2d_pick(d, p)?;
            let grad = kernels::max_pool2d_grad_picked(d, p)?;
            let (x, dy) = (
                self.location[node.inputs[0].index()],
                self.location[node.inputs[1].index()],
            );
            self.launch_from_to(id, pick, x, ws);
            let touch = Touch {
                reads: smallvec![ws, dy],
                writes: smallvec![here],
            };
            let args = smallvec![ws.offset, dy.offset, here.offset];
            self.launch_touching(id, grad, args, touch);
            return Ok(());
        }
        let k = match w {
            WindowOp::MaxPool2d(_) => kernels::max_pool2d(d, p),
            _ => kernels::max_pool2d_grad(d, p),
        }?;
        let mut args: SmallVec<[usize; 8]> = inputs.iter().copied().collect();
        args.push(here.offset);
        self.launch(id, k, args, smallvec![here]);
        Ok(())
    }

    fn gemm_touching(&mut self, gemm: Gemm, reads: &[Location], out: Location, blas: Location) {
        self.ops.push(DeviceOp::Gemm(gemm));
        self.touches.push(Touch {
            reads: reads.iter().copied().collect(),
            writes: smallvec![out, blas],
        });
    }
}
