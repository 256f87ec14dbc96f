//! Lowering a planned graph into a [`Program`]: each node, in schedule order, becomes its
//! device operations on the plan's byte offsets.

use super::gemm::{split_of, SPLIT_MIN};
use super::gemm::{Compute, Gemm};
use super::program::{DeviceOp, Program};
use super::workspace::kernel_shape;
use super::workspace::{attention_workspace, workspace_need};
use crate::fuse::triangle::{self, Triangle};
use crate::ir::{DType, Graph, Node, NodeId, Op};
use crate::lower::deps::{self, Touch};
use crate::lower::error::LowerError;
use crate::lower::offload::{CopyIn, CopyOut};
use crate::plan::{Location, MemoryPlan};
use crate::precision::Precision;
use ingot_kernels::cuda::attention;
use ingot_kernels::cuda::{self as codegen, CudaKernel};
use smallvec::SmallVec;
use std::collections::HashMap;

/// Lowers `g` under `plan` (validated by the caller, [`crate::lower::lower`]); `precision` picks the
/// GEMMs' compute types ([`Compute::of`]).
pub(crate) fn lower(
    g: &Graph,
    plan: &MemoryPlan,
    precision: Precision,
) -> Result<Program, LowerError> {
    let mut p = Lowering {
        g,
        precision,
        location: g.ids().map(|id| plan.location(g, id)).collect(),
        kernels: Vec::new(),
        by_name: HashMap::new(),
        ops: Vec::new(),
        touches: Vec::new(),
        triangles: triangle::zero_triangles(g),
        unread: triangle::unread_triangles(g),
        filled: Default::default(),
        users: g.users(),
        absorbed: Default::default(),
    };
    let outputs = g.kernel_outputs();
    let after = early_fills(g, plan);
    for (pos, &id) in plan.liveness.order.iter().enumerate() {
        for o in plan.offload.iter().filter(|o| o.copy_in_before == pos) {
            p.offload_copy(o, true);
        }
        p.node(id, &outputs, plan)
            .map_err(|e| LowerError::at(g, id, e))?;
        for &s in after.get(&pos).into_iter().flatten() {
            p.fill(s, plan).map_err(|e| LowerError::at(g, s, e))?;
        }
        for o in plan.offload.iter().filter(|o| o.copy_out_after == pos) {
            p.offload_copy(o, false);
        }
    }
    for &(value, target) in &plan.liveness.copies {
        let (from, to) = (p.location[value.index()], p.location[target.index()]);
        if from.bytes > 0 {
            p.copy(
                from,
                Location {
                    offset: to.offset,
                    bytes: from.bytes,
                },
            );
        }
    }
    let mut deps = deps::dependencies(&p.touches);
    chain_collectives(&p.ops, &mut deps);
    let program = Program {
        prelude: codegen::prelude_for(&p.kernels),
        kernels: p.kernels,
        ops: p.ops,
        touches: p.touches,
        deps,
        total_bytes: plan.total_bytes,
        host_bytes: plan.host_bytes,
    };
    program.check(plan.total_bytes)?;
    Ok(program)
}

/// How many of `program`'s launches, first, read only its first input and write only its
/// scratch: those that fill the workspace (a scatter-add's sort of its ids).
fn fill_launches(program: &codegen::FusedProgram) -> usize {
    (program.launches.iter())
        .take_while(|l| {
            l.args.iter().all(|a| match a {
                codegen::FusedArg::Input(i) => *i == 0,
                codegen::FusedArg::Output(_) => false,
                codegen::FusedArg::Scratch { .. } => true,
            })
        })
        .count()
}

/// The nodes whose workspace an operand fills ahead of them ([`workspace_need`]: a
/// scatter-add's sorted ids), by the schedule position after which the launches that fill it
/// are lowered: where the plan starts holding the workspace
/// ([`MemoryPlan::workspace_filled_after`], which the validator checks nothing else writes
/// from there to the node), when the operand is made by then. So those launches come early in
/// the program as well as in its dependencies, and the graph runs them beside the forward pass
/// rather than with the node's own launches. A plan that holds the workspace at the node alone
/// keeps them there.
fn early_fills(g: &Graph, plan: &MemoryPlan) -> HashMap<usize, Vec<NodeId>> {
    let mut after = HashMap::<usize, Vec<NodeId>>::new();
    for &id in &plan.liveness.order {
        let (Some(i), Some(at)) = (
            workspace_need(g, id).filled_from,
            plan.workspace_filled_after(id),
        ) else {
            continue;
        };
        let (lv, operand) = (&plan.liveness, g.node(id).inputs[i]);
        let region = lv.storages[lv.storage_of[operand.index()]].region;
        if crate::plan::liveness::made_at(g, &lv.position, region, operand) <= at {
            after.entry(at).or_default().push(id);
        }
    }
    after
}

/// Makes each collective wait for the one before it in program order, so every rank runs its
/// collectives in the program's one order ([`DeviceOp::AllReduce`]).
fn chain_collectives(ops: &[DeviceOp], deps: &mut [SmallVec<[usize; 4]>]) {
    let mut last = None;
    for (i, op) in ops.iter().enumerate() {
        if op.is_collective() {
            if let Some(prev) = last {
                if !deps[i].contains(&prev) {
                    deps[i].push(prev);
                }
            }
            last = Some(i);
        }
    }
}

pub(super) struct Lowering<'g> {
    pub(super) g: &'g Graph,
    pub(super) precision: Precision,
    pub(super) location: Vec<Location>,
    pub(super) kernels: Vec<CudaKernel>,
    pub(super) by_name: HashMap<String, usize>,
    pub(super) ops: Vec<DeviceOp>,
    pub(super) touches: Vec<Touch>,
    /// The zero triangle of each node's value ([`triangle::zero_triangles`]).
    pub(super) triangles: Vec<Option<Triangle>>,
    /// The triangle of each matmul's result nothing reads ([`triangle::unread_triangles`]).
    pub(super) unread: Vec<Option<Triangle>>,
    /// Nodes whose workspace was filled ahead of them ([`early_fills`]), with the launches of
    /// their program left for their turn.
    pub(super) filled: HashMap<NodeId, codegen::FusedProgram>,
    /// Each node's readers.
    pub(super) users: crate::ir::Users,
    /// Fused nodes whose work a GEMM's epilogue does ([`super::epilogue`]): they lower to
    /// nothing at their turn.
    pub(super) absorbed: std::collections::HashSet<NodeId>,
}

impl Lowering<'_> {
    fn node(
        &mut self,
        id: NodeId,
        outputs: &[SmallVec<[NodeId; 1]>],
        plan: &MemoryPlan,
    ) -> Result<(), LowerError> {
        let g = self.g;
        let node = g.node(id);
        let here = self.location[id.index()];
        let inputs: SmallVec<[usize; 8]> = node
            .inputs
            .iter()
            .map(|x| self.location[x.index()].offset)
            .collect();
        if self.absorbed.contains(&id) {
            return Ok(());
        }
        match &node.op {
            op if op.is_leaf() || op.is_alias() => Ok(()),
            Op::Result { .. } => Ok(()),
            Op::Fused(kernel) => {
                let outs = &outputs[id.index()];
                if outs.iter().all(|o| self.location[o.index()].bytes == 0) {
                    return Ok(());
                }
                self.fused(id, kernel, outs, plan)
            }
            Op::MatMul { ta, tb } => {
                self.not_in_place(id)?;
                let w = plan.workspace(id).ok_or_else(|| LowerError::Invalid {
                    op: "matmul",
                    reason: "the plan gives this matmul no cuBLAS workspace; plan the step with \
                             the CUDA target's options (Target::Cuda.plan_options())"
                        .into(),
                })?;
                let operands = [node.inputs[0], node.inputs[1]];
                let mut gemm = gemm(g, id, operands, (*ta, *tb), here.offset, w, self)?;
                if here.bytes > 0 {
                    let absorbed = self.bias_epilogue(id, &gemm, outputs, plan)?;
                    let extra = absorbed.map(|(e, t)| {
                        gemm.epilogue = Some(e);
                        t
                    });
                    self.ops.push(DeviceOp::Gemm(gemm));
                    // The workspace is scratch the call writes.
                    self.touched(id, smallvec::smallvec![here, w]);
                    // The bias read, and the absorbed kernel's bytes (its fallback's).
                    if let (Some(t), Some(last)) = (extra, self.touches.last_mut()) {
                        last.reads.extend(t.reads);
                        last.writes
                            .extend(t.writes.into_iter().filter(|l| *l != here));
                    }
                }
                Ok(())
            }
            Op::MatMulAcc { ta, tb } => {
                // `c + a·b`: cuBLAS adds the product into the result's bytes (beta = 1), which
                // hold `c`: the plan places the result over `c` where `c` dies here; elsewhere
                // `c` is copied there first. `a` and `b` never share its bytes.
                let (c, a, b) = (node.inputs[0], node.inputs[1], node.inputs[2]);
                let overlaps = |l: Location| {
                    l.bytes > 0
                        && here.bytes > 0
                        && l.offset < here.offset + here.bytes
                        && here.offset < l.offset + l.bytes
                };
                if let Some(x) = [a, b]
                    .into_iter()
                    .find(|x| overlaps(self.location[x.index()]))
                {
                    return Err(LowerError::Invalid {
                        op: "matmul_acc",
                        reason: format!(
                            "operand {x} shares bytes with the result; only the accumulator c \
                             may be under it"
                        ),
                    });
                }
                let w = plan.workspace(id).ok_or_else(|| LowerError::Invalid {
                    op: "matmul_acc",
                    reason: "the plan gives this matmul_acc no cuBLAS workspace; plan the step \
                             with the CUDA target's options (Target::Cuda.plan_options())"
                        .into(),
                })?;
                let mut gemm = gemm(g, id, [a, b], (*ta, *tb), here.offset, w, self)?;
                gemm.accumulate = true;
                if here.bytes > 0 {
                    let from = self.location[c.index()];
                    if from != here {
                        self.copy(from, here);
                    }
                    self.ops.push(DeviceOp::Gemm(gemm));
                    self.touched(id, smallvec::smallvec![here, w]);
                }
                Ok(())
            }
            Op::Gather => {
                self.not_in_place(id)?;
                let (table, ids) = (g.ty(node.inputs[0]), g.ty(node.inputs[1]));
                let rows = table.shape.dims().first().copied().unwrap_or(1);
                let row_len = table.shape.dims()[1..].iter().product();
                let k = codegen::gather(table.dtype, ids.dtype, rows, row_len, ids.shape.numel())
                    .map_err(codegen_error)?;
                if here.bytes > 0 {
                    let mut args = inputs;
                    args.push(here.offset);
                    self.launch(id, k, args, smallvec::smallvec![here]);
                }
                Ok(())
            }
            Op::ScatterAdd { .. } => {
                self.not_in_place(id)?;
                // What is left where the sort was lowered where the ids are made
                // ([`early_fills`]), else the whole program.
                let program = match self.filled.remove(&id) {
                    Some(rest) => rest,
                    None => self.scatter_program(id)?,
                };
                if here.bytes > 0 {
                    self.ops.push(DeviceOp::Zero {
                        offset: here.offset,
                        bytes: here.bytes,
                    });
                    self.touches.push(Touch {
                        reads: SmallVec::new(),
                        writes: smallvec::smallvec![here],
                    });
                    self.program(id, program, &[id], plan, "scatter_add", "its sorted ids")?;
                }
                Ok(())
            }
            Op::Dropout { p, salt } => {
                // Each thread reads x[e] before writing out[e]: in place is fine.
                let x = g.ty(node.inputs[0]);
                let k =
                    codegen::dropout(x.dtype, x.shape.numel(), *p, *salt).map_err(codegen_error)?;
                if here.bytes > 0 {
                    let mut args = inputs;
                    args.push(here.offset);
                    self.launch(id, k, args, smallvec::smallvec![here]);
                }
                Ok(())
            }
            Op::Concat { axis } => {
                self.not_in_place(id)?;
                let dims = node.ty.shape.dims();
                let outer: usize = dims[..*axis].iter().product();
                let widths: Vec<usize> = node
                    .inputs
                    .iter()
                    .map(|&x| g.ty(x).shape.dims()[*axis..].iter().product())
                    .collect();
                let k = codegen::concat(node.ty.dtype, outer, &widths).map_err(codegen_error)?;
                if here.bytes > 0 {
                    let mut args = inputs;
                    args.push(here.offset);
                    self.launch(id, k, args, smallvec::smallvec![here]);
                }
                Ok(())
            }
            Op::Attention { .. } | Op::AttentionGrad { .. } => {
                self.attention(id, node, outputs, plan)
            }
            Op::AllReduce { ranks } => self.all_reduce(id, *ranks, &outputs[id.index()]),
            Op::ReduceScatter { ranks } => self.reduce_scatter(id, *ranks, &outputs[id.index()]),
            Op::AllGather { ranks } => {
                self.not_in_place(id)?;
                let (from, to) = (
                    self.location[self.g.node(id).inputs[0].index()],
                    self.location[id.index()],
                );
                self.ops.push(DeviceOp::AllGather {
                    node: id,
                    from: from.offset,
                    to: to.offset,
                    bytes: from.bytes,
                    ranks: *ranks,
                });
                self.touches.push(Touch {
                    reads: smallvec::smallvec![from],
                    writes: smallvec::smallvec![to],
                });
                Ok(())
            }
            Op::Window(w) => self.window(id, w, plan, &inputs),
            op => Err(LowerError::Invalid {
                op: op.name(),
                reason: format!(
                    "the CUDA backend has no kernel for a lone `{}`; it runs fused steps, where \
                     every elementwise op, view and reduction is inside a fused kernel (compile \
                     with fusion on, the default)",
                    op.name()
                ),
            }),
        }
    }

    /// A fused kernel's launches ([`codegen::fused_program`]): one, a split column
    /// reduction's two, or a reduction split by stages (a partial and a finish kernel a stage,
    /// then the full outputs), whose partials and finished sums lie in the node's planned
    /// workspace.
    pub(super) fn fused(
        &mut self,
        id: NodeId,
        kernel: &ingot_kernels::FusedKernel,
        outs: &[NodeId],
        plan: &MemoryPlan,
    ) -> Result<(), LowerError> {
        let program = codegen::fused_program(kernel).map_err(codegen_error)?;
        self.program(id, program, outs, plan, "fused", "its partial sums")
    }

    /// Scatter-add `id`'s program ([`codegen::scatter_add_program`]).
    fn scatter_program(&self, id: NodeId) -> Result<codegen::FusedProgram, LowerError> {
        let (g, node) = (self.g, self.g.node(id));
        let Op::ScatterAdd { rows } = node.op else {
            unreachable!("scatter_program of a {}", node.op.name());
        };
        let (ids, values) = (g.ty(node.inputs[0]), g.ty(node.inputs[1]));
        let n = ids.shape.numel();
        let row_len = values.shape.numel().checked_div(n).unwrap_or(0);
        codegen::scatter_add_program(ids.dtype, values.dtype, node.ty.dtype, rows, row_len, n)
            .map_err(codegen_error)
    }

    /// The launches that fill node `id`'s workspace from its operand (a scatter-add's sort of
    /// its ids), lowered ahead of the node ([`early_fills`]).
    fn fill(&mut self, id: NodeId, plan: &MemoryPlan) -> Result<(), LowerError> {
        if self.location[id.index()].bytes == 0 {
            return Ok(());
        }
        let mut program = self.scatter_program(id)?;
        let rest = codegen::FusedProgram {
            launches: program.launches.split_off(fill_launches(&program)),
            scratch_bytes: program.scratch_bytes,
        };
        self.filled.insert(id, rest);
        self.program(id, program, &[id], plan, "scatter_add", "its sorted ids")
    }

    /// The launches of `program` for node `id` (a fused kernel's, or scatter-add's): each
    /// argument at the node's input, at output `outs[j]`, or in the node's planned workspace,
    /// which must hold the program's scratch (`scratch` says what it holds, for the error).
    fn program(
        &mut self,
        id: NodeId,
        program: codegen::FusedProgram,
        outs: &[NodeId],
        plan: &MemoryPlan,
        op: &'static str,
        scratch: &str,
    ) -> Result<(), LowerError> {
        let ws = plan.workspace(id);
        if program.scratch_bytes > ws.map_or(0, |w| w.bytes) {
            return Err(LowerError::Invalid {
                op,
                reason: format!(
                    "the plan gives this {op} kernel no {} bytes of workspace for {scratch}; \
                     plan the step with the CUDA target's options \
                     (Target::Cuda.plan_options())",
                    program.scratch_bytes
                ),
            });
        }
        let node = self.g.node(id);
        for l in program.launches {
            let at: Vec<Location> = (l.args.iter())
                .map(|a| match *a {
                    codegen::FusedArg::Input(n) => self.location[node.inputs[n].index()],
                    codegen::FusedArg::Output(j) => self.location[outs[j].index()],
                    codegen::FusedArg::Scratch { offset, bytes } => Location {
                        offset: ws.map_or(0, |w| w.offset) + offset,
                        bytes,
                    },
                })
                .collect();
            let touch = Touch {
                reads: at[..l.reads].iter().copied().collect(),
                writes: at[l.reads..].iter().copied().collect(),
            };
            let args = at.iter().map(|l| l.offset).collect();
            self.launch_touching(id, l.kernel, args, touch);
        }
        Ok(())
    }

    /// An attention op: one launch of the forward kernel (q, k, v, out, lse), or the backward
    /// pass's three launches (delta from out and dout into the workspace; then dk and dv; then
    /// dq). An output no result node names lands in the workspace. A shape the kernels do not
    /// support is refused here, at compile time, naming the reason.
    fn attention(
        &mut self,
        id: NodeId,
        node: &Node,
        outputs: &[SmallVec<[NodeId; 1]>],
        plan: &MemoryPlan,
    ) -> Result<(), LowerError> {
        let g = self.g;
        let op = node.op.name();
        let types: Vec<&crate::ir::TensorType> = node.inputs.iter().map(|&x| g.ty(x)).collect();
        let problem = crate::ir::attention_problem(&node.op, &types)
            .map_err(|reason| LowerError::Invalid { op, reason })?;
        let shape = kernel_shape(&problem, self.precision);
        let refused = |e: attention::AttentionError| LowerError::Invalid {
            op,
            reason: format!("no fused attention kernel for {shape:?}: {e}"),
        };
        self.not_in_place(id)?;
        let layout = attention_workspace(g, id);
        let ws = plan.workspace(id);
        if layout.total > 0 && ws.is_none_or(|w| w.bytes < layout.total) {
            return Err(LowerError::Invalid {
                op,
                reason: format!(
                    "the plan gives this attention no {} bytes of workspace; plan the step with \
                     the CUDA target's options (Target::Cuda.plan_options())",
                    layout.total
                ),
            });
        }
        let in_ws = |offset: usize, bytes: usize| Location {
            offset: ws.map_or(0, |w| w.offset) + offset,
            bytes,
        };
        // Every output's bytes, by output index.
        let out_types = crate::ir::attention_outputs(&node.op, &types)
            .map_err(|reason| LowerError::Invalid { op, reason })?;
        let mut out: Vec<Location> = out_types.iter().map(|t| in_ws(0, t.bytes())).collect();
        for &o in &outputs[id.index()] {
            let index = match g.node(o).op {
                Op::Result { index } => index,
                _ => 0,
            };
            out[index] = self.location[o.index()];
        }
        for &(index, offset) in &layout.outputs {
            out[index] = in_ws(offset, out_types[index].bytes());
        }
        // Where q, k, v (and dq, dk, dv) start: their own buffers, or the slots of a packed one.
        let starts = problem.operand_starts();
        let elem = problem.dtype.size();
        let at = |l: Location, elems: usize| l.offset + elems * elem;
        let loc = |i: usize| self.location[node.inputs[i].index()];
        let n = problem.layout.inputs(); // the forward's operands; then out, lse, dout
        let [q, k, v] = starts.map(|(i, e)| at(loc(i), e));
        let args =
            |ls: &[Location]| -> SmallVec<[usize; 8]> { ls.iter().map(|l| l.offset).collect() };
        // What a launch reads of the forward's operands: each buffer once.
        let operands: SmallVec<[Location; 6]> = (0..n).map(loc).collect();
        match node.op {
            Op::Attention { .. } => {
                let kernel = attention::forward(&shape).map_err(refused)?;
                let mut a: SmallVec<[usize; 8]> = smallvec::smallvec![q, k, v];
                a.extend(out.iter().map(|l| l.offset));
                self.launch_touching(
                    id,
                    kernel,
                    a,
                    Touch {
                        reads: operands,
                        writes: out.iter().copied().collect(),
                    },
                );
            }
            _ => {
                let b = attention::backward(&shape).map_err(refused)?;
                // delta (f32, a row each); then, where the kernels store it (bf16 with
                // `DqKernel::StoredDs` the default: not today), the ds dkdv writes and dq reads.
                let ws_at = layout.delta.unwrap_or(0);
                let delta = in_ws(ws_at, shape.batch_heads * shape.seq_q * 4);
                let ds_bytes = attention::backward_ds_bytes(&shape);
                let ds = (ds_bytes > 0)
                    .then(|| in_ws(ws_at + attention::backward_ds_offset(&shape), ds_bytes));
                let [o, lse, dout] = [n, n + 1, n + 2].map(loc);
                let [dq, dk, dv] = starts.map(|(i, e)| at(out[i], e));
                self.launch_touching(
                    id,
                    b.preprocess,
                    args(&[o, dout, delta]),
                    Touch {
                        reads: smallvec::smallvec![o, dout],
                        writes: smallvec::smallvec![delta],
                    },
                );
                let mut reads = operands.clone();
                reads.extend([dout, lse, delta]);
                // dk, dv (their buffers: dq's too when packed, which the dq launch then follows).
                let grads = |slots: &[usize]| -> SmallVec<[Location; 2]> {
                    let mut w: SmallVec<[Location; 2]> = SmallVec::new();
                    for &s in slots {
                        let l = out[starts[s].0];
                        if !w.contains(&l) {
                            w.push(l);
                        }
                    }
                    w
                };
                let mut dkdv_writes: SmallVec<[Location; 2]> = grads(&[1, 2]).into_iter().collect();
                dkdv_writes.extend(ds);
                self.launch_touching(
                    id,
                    b.dkdv,
                    smallvec::smallvec![q, k, v, dout.offset, lse.offset, delta.offset, dk, dv],
                    Touch {
                        reads: reads.clone(),
                        writes: dkdv_writes,
                    },
                );
                let mut dq_reads = reads;
                dq_reads.extend(ds);
                self.launch_touching(
                    id,
                    b.dq,
                    smallvec::smallvec![q, k, v, dout.offset, lse.offset, delta.offset, dq],
                    Touch {
                        reads: dq_reads,
                        writes: grads(&[0]).into_iter().collect(),
                    },
                );
            }
        }
        Ok(())
    }

    /// As [`Self::launch`], with what the launch touches given explicitly.
    /// Launches `k` with two pointer arguments: it reads `from` and writes `to`.
    pub(super) fn launch_from_to(
        &mut self,
        node: NodeId,
        k: CudaKernel,
        from: Location,
        to: Location,
    ) {
        let touch = Touch {
            reads: smallvec::smallvec![from],
            writes: smallvec::smallvec![to],
        };
        self.launch_touching(node, k, smallvec::smallvec![from.offset, to.offset], touch);
    }

    pub(super) fn launch_touching(
        &mut self,
        node: NodeId,
        k: CudaKernel,
        args: SmallVec<[usize; 8]>,
        touch: Touch,
    ) {
        self.touches.push(touch);
        let kernel = self.kernel_index(k);
        self.ops.push(DeviceOp::Launch { node, kernel, args });
    }

    /// The index of `k` in the program's kernels, adding it the first time.
    pub(super) fn kernel_index(&mut self, k: CudaKernel) -> usize {
        match self.by_name.get(&k.name) {
            Some(&i) => i,
            None => {
                self.by_name.insert(k.name.clone(), self.kernels.len());
                self.kernels.push(k);
                self.kernels.len() - 1
            }
        }
    }

    /// Records what the op just pushed for `node` touches: it reads the node's operands and
    /// writes `writes`.
    pub(super) fn touched(&mut self, node: NodeId, writes: SmallVec<[Location; 2]>) {
        let reads = self
            .g
            .node(node)
            .inputs
            .iter()
            .map(|x| self.location[x.index()])
            .collect();
        self.touches.push(Touch { reads, writes });
    }

    /// Adds a launch of `k` (generating each distinct kernel once) that reads `node`'s
    /// operands and writes `writes`.
    pub(super) fn launch(
        &mut self,
        node: NodeId,
        k: CudaKernel,
        args: SmallVec<[usize; 8]>,
        writes: SmallVec<[Location; 2]>,
    ) {
        self.touched(node, writes);
        let kernel = self.kernel_index(k);
        self.ops.push(DeviceOp::Launch { node, kernel, args });
    }

    /// A device copy of `to.bytes` bytes from `from` to `to`, reading and writing those bytes.
    /// Offload's copy of leaf `o` into its staging buffer (`into`) or back to its home: it
    /// writes or reads the staging bytes, so the dependency graph puts a copy in after the
    /// last use of those bytes before it and before every reader of the leaf, and a copy out
    /// after the leaf's last writer and before anything that takes the bytes next.
    fn offload_copy(&mut self, o: &crate::plan::Offload, into: bool) {
        let staging = Location {
            offset: self.location[o.leaf.index()].offset,
            bytes: o.host.bytes,
        };
        let (op, touch) = if into {
            let op = DeviceOp::CopyIn(CopyIn::of(o, staging.offset));
            (
                op,
                Touch {
                    reads: SmallVec::new(),
                    writes: smallvec::smallvec![staging],
                },
            )
        } else {
            let op = DeviceOp::CopyOut(CopyOut::of(o, staging.offset));
            (
                op,
                Touch {
                    reads: smallvec::smallvec![staging],
                    writes: SmallVec::new(),
                },
            )
        };
        self.ops.push(op);
        self.touches.push(touch);
    }

    fn copy(&mut self, from: Location, to: Location) {
        self.ops.push(DeviceOp::Copy {
            from: from.offset,
            to: to.offset,
            bytes: to.bytes,
        });
        self.touches.push(Touch {
            reads: smallvec::smallvec![from],
            writes: smallvec::smallvec![to],
        });
    }

    /// A gradient bucket's all-reduce: each gradient the planner could not place in its slot of
    /// the bucket is copied there first, then the bucket's one contiguous region is averaged
    /// over the ranks in place ([`DeviceOp::AllReduce`]).
    fn all_reduce(&mut self, id: NodeId, ranks: usize, outs: &[NodeId]) -> Result<(), LowerError> {
        let node = self.g.node(id);
        let invalid = |reason: String| LowerError::Invalid {
            op: "all_reduce",
            reason,
        };
        if outs.len() != node.inputs.len() || outs.is_empty() {
            return Err(invalid(format!(
                "{} gradients in and {} out",
                node.inputs.len(),
                outs.len()
            )));
        }
        let mut end = None;
        for (&x, &o) in node.inputs.iter().zip(outs) {
            let (from, to) = (self.location[x.index()], self.location[o.index()]);
            // The validator placed them one after another, at aligned offsets with the
            // padding between them the collective's to clobber.
            if end.is_some_and(|e| to.offset < e) {
                return Err(invalid(format!(
                    "the bucket's gradients are not in order in one region: %{} starts at {} \
                     before the one before it ends, at {}",
                    o.index(),
                    to.offset,
                    end.unwrap_or(0)
                )));
            }
            end = Some(to.offset + to.bytes);
            if from != to && to.bytes > 0 {
                self.copy(from, to);
            }
        }
        let offset = self.location[outs[0].index()].offset;
        let region = Location {
            offset,
            bytes: end.unwrap_or(offset) - offset,
        };
        if region.bytes == 0 {
            return Ok(());
        }
        self.ops.push(DeviceOp::AllReduce {
            node: id,
            offset,
            bytes: region.bytes,
            dtype: node.ty.dtype,
            ranks,
        });
        self.touches.push(Touch {
            reads: smallvec::smallvec![region],
            writes: smallvec::smallvec![region],
        });
        Ok(())
    }

    /// A bucket's reduce-scatter: each output, a buffer of its own, gets this rank's rows of
    /// its operand's sum over the ranks ([`DeviceOp::ReduceScatter`]); it reads the operands
    /// and writes the outputs, so a later writer of an operand's bytes waits for it.
    fn reduce_scatter(
        &mut self,
        id: NodeId,
        ranks: usize,
        outs: &[NodeId],
    ) -> Result<(), LowerError> {
        let node = self.g.node(id);
        if outs.len() != node.inputs.len() || outs.is_empty() {
            return Err(LowerError::Invalid {
                op: "reduce_scatter",
                reason: format!("{} gradients in and {} out", node.inputs.len(), outs.len()),
            });
        }
        let (mut parts, mut touch) = (Vec::new(), Touch::default());
        for (&x, &o) in node.inputs.iter().zip(outs) {
            let (from, to) = (self.location[x.index()], self.location[o.index()]);
            if to.bytes == 0 {
                continue;
            }
            parts.push(crate::lower::scatter::ScatterPart {
                from: from.offset,
                to: to.offset,
                bytes: to.bytes,
            });
            touch.reads.push(from);
            touch.writes.push(to);
        }
        if parts.is_empty() {
            return Ok(());
        }
        self.ops.push(DeviceOp::ReduceScatter {
            node: id,
            parts,
            dtype: node.ty.dtype,
            ranks,
        });
        self.touches.push(touch);
        Ok(())
    }

    /// Library calls and the gather, scatter and concat kernels read operands that must not
    /// share bytes with their output (the planner places only elementwise values in place).
    pub(super) fn not_in_place(&self, id: NodeId) -> Result<(), LowerError> {
        let here = self.location[id.index()];
        let overlaps = |l: Location| {
            l.bytes > 0
                && here.bytes > 0
                && l.offset < here.offset + here.bytes
                && here.offset < l.offset + l.bytes
        };
        match self
            .g
            .node(id)
            .inputs
            .iter()
            .position(|x| overlaps(self.location[x.index()]))
        {
            Some(i) => Err(LowerError::Invalid {
                op: self.g.node(id).op.name(),
                reason: format!(
                    "operand {i} shares bytes with the output; this op cannot run in place"
                ),
            }),
            None => Ok(()),
        }
    }
}

/// The cuBLAS call of node `id` (a matmul, or a matmul_acc's product) with operands
/// `[a, b]`: `[..., m, k] x [..., k, n] -> [..., m, n]`, with `ta` (`tb`) meaning `a` (`b`) is
/// stored with its last two axes swapped; the compute type from the operands' and result's
/// dtypes and the step's precision ([`Compute::of`], or [`Compute::Bf16InF32Out`] for bf16
/// operands with an f32 result).
fn gemm(
    g: &Graph,
    id: NodeId,
    [a_id, b_id]: [NodeId; 2],
    (ta, tb): (bool, bool),
    out: usize,
    workspace: Location,
    at: &Lowering<'_>,
) -> Result<Gemm, LowerError> {
    let node = g.node(id);
    let precision = at.precision;
    let inputs = [
        at.location[a_id.index()].offset,
        at.location[b_id.index()].offset,
    ];
    let (a, b) = (g.ty(a_id), g.ty(b_id));
    let (ad, bd, cd) = (a.shape.dims(), b.shape.dims(), node.ty.shape.dims());
    let bad = |reason: String| LowerError::Invalid {
        op: node.op.name(),
        reason,
    };
    if ad.len() < 2 || bd.len() != ad.len() || cd.len() != ad.len() {
        return Err(bad(format!(
            "operands {} and {} and result {} must have one rank of at least 2",
            a, b, node.ty
        )));
    }
    let r = ad.len();
    let (m, k) = if ta {
        (ad[r - 1], ad[r - 2])
    } else {
        (ad[r - 2], ad[r - 1])
    };
    let (kb, n) = if tb {
        (bd[r - 1], bd[r - 2])
    } else {
        (bd[r - 2], bd[r - 1])
    };
    if k != kb
        || cd[r - 2] != m
        || cd[r - 1] != n
        || ad[..r - 2] != bd[..r - 2]
        || ad[..r - 2] != cd[..r - 2]
    {
        return Err(bad(format!(
            "operands {a} (ta={ta}) and {b} (tb={tb}) do not give the result {}",
            node.ty
        )));
    }
    let compute = match (a.dtype, b.dtype, node.ty.dtype) {
        (DType::BF16, DType::BF16, DType::F32) => Some(Compute::Bf16InF32Out),
        (x, y, z) if x == z && y == z => Compute::of(z, precision),
        _ => None,
    };
    let Some(compute) = compute else {
        return Err(bad(format!(
            "cuBLAS multiplies f32, f64 or bf16 matrices of one dtype (or bf16 into f32), not \
             {} x {} -> {}",
            a.dtype, b.dtype, node.ty.dtype
        )));
    };
    let batch = ad[..r - 2].iter().product();
    let limit = i32::MAX as usize;
    if [m, n, k, batch].iter().any(|&x| x > limit) {
        return Err(bad(format!(
            "a dimension of {a} x {b} exceeds cuBLAS's 32-bit limit"
        )));
    }
    let mut gm = Gemm {
        node: id,
        dtype: node.ty.dtype,
        compute,
        trans_first: tb,
        trans_second: ta,
        m: n,
        n: m,
        k,
        ld_first: if tb { k } else { n },
        ld_second: if ta { m } else { k },
        ld_out: n,
        stride_first: k * n,
        stride_second: m * k,
        stride_out: m * n,
        batch,
        first: inputs[1],
        second: inputs[0],
        out,
        workspace,
        accumulate: false,
        split: None,
        epilogue: None,
    };
    let zero = [at.triangles[a_id.index()], at.triangles[b_id.index()]];
    gm.split = split_of(&gm, (ta, tb), zero, at.unread[id.index()], SPLIT_MIN);
    Ok(gm)
}

fn codegen_error(e: codegen::CodegenError) -> LowerError {
    LowerError::Invalid {
        op: "cuda codegen",
        reason: e.to_string(),
    }
}
