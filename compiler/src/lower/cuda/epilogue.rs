//! A matmul's bias add taken into its GEMM as cuBLASLt's bias epilogue ([`Epilogue`]).
//!
//! The rule, on the graph and the plan, not on any one model: a matmul whose only reader is a
//! fused kernel that adds a bias vector to it and nothing else ([`bias_add`]), where
//! - the GEMM is one plain call (no batch, no split, no accumulation; f32, tf32 or bf16 with
//!   f32 accumulation), its result dense (`ld_out == m`) and the kernel's output of its dtype;
//! - the plan writes the kernel's output over the product's own bytes (in place), so the sum
//!   can be written where and when the product is, and nothing else reads the product;
//! - the bias is made before the matmul in the schedule (a parameter always is).
//!
//! - the bias is stored in the result's dtype: cuBLASLt 13 refuses an f32 bias on a bf16
//!   result (`cublasLtMatmulAlgoGetHeuristic`: `CUBLAS_STATUS_INVALID_VALUE`, measured on an
//!   H200, docs/benchmarks.md session 42), and under bf16 the bias is an f32 parameter rounded
//!   inside the kernel, so bf16 steps keep their kernel: the rule holds in f32 and tf32 only.
//!
//! Then the GEMM carries the bias and the kernel's launch (the fallback, for a runtime whose
//! cuBLASLt refuses the epilogue or that leaves epilogues off), and the kernel's node lowers to
//! nothing. The plan is not changed. The bits: in f32 and tf32 the epilogue adds the f32 bias
//! to the f32 product as the kernel did (gpt2's losses over 5 steps were OLD's to the bit on
//! an H200); cuBLASLt may pick another GEMM algorithm than cuBLAS for the product itself.

use super::gemm::{Compute, Epilogue, Gemm};
use super::lowering::Lowering;
use super::program::DeviceOp;
use crate::ir::{DType, NodeId, Op};
use crate::lower::deps::Touch;
use crate::lower::error::LowerError;
use crate::plan::MemoryPlan;
use ingot_kernels::fused::{Access, FusedKernel, Inst};
use ingot_kernels::BinaryOp;
use smallvec::SmallVec;

/// Which inputs of a bias-add kernel are the product and the bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BiasAdd {
    pub product: usize,
    pub bias: usize,
}

/// The inputs of `k` if it is `out = product + bias[last index]` and nothing else: an
/// elementwise kernel of two inputs and one output whose body loads both, converts between
/// f32 and bf16 only, and adds them once; the product read whole in the domain's row-major
/// order, the bias a vector along the domain's last axis, the same for every row.
pub fn bias_add(k: &FusedKernel) -> Option<BiasAdd> {
    let (Some(&cols), [out]) = (k.domain.last(), &k.outputs[..]) else {
        return None;
    };
    if !k.reduce_axes.is_empty() || k.inputs.len() != 2 {
        return None;
    }
    // Every instruction a load, a conversion between f32 and bf16, or the one add.
    let plain = |t: DType| matches!(t, DType::F32 | DType::BF16);
    let mut adds = 0;
    for inst in &k.body {
        match inst {
            Inst::Load { .. } => {}
            Inst::Convert { to, .. } if plain(*to) => {}
            Inst::Binary {
                op: BinaryOp::Add, ..
            } => adds += 1,
            _ => return None,
        }
    }
    if adds != 1 || !k.inputs.iter().all(|i| plain(i.dtype)) {
        return None;
    }
    // Through conversions to what an instruction's value comes from.
    let strip = |mut v: usize| loop {
        match k.body.get(v)? {
            Inst::Convert { x, .. } => v = *x,
            other => return Some((v, other)),
        }
    };
    let (_, Inst::Binary { a, b, .. }) = strip(out.value)? else {
        return None;
    };
    let input = |v: usize| match strip(v)? {
        (_, Inst::Load { input }) => Some(*input),
        _ => None,
    };
    let (a, b) = (input(*a)?, input(*b)?);
    let whole = Access::contiguous(&k.domain);
    let numel: usize = k.domain.iter().product();
    let is_product = |i: usize| k.inputs[i].access == whole && k.inputs[i].len == numel;
    let is_bias = |i: usize| {
        let acc = &k.inputs[i].access;
        let (last, rest) = acc.strides.split_last()?;
        (acc.offset == 0 && *last == 1 && rest.iter().all(|&s| s == 0) && k.inputs[i].len == cols)
            .then_some(())
    };
    [(a, b), (b, a)]
        .into_iter()
        .find(|&(p, q)| p != q && is_product(p) && is_bias(q).is_some())
        .map(|(product, bias)| BiasAdd { product, bias })
}

/// Whether a GEMM is one plain call a bias epilogue can ride on.
fn plain_call(gm: &Gemm) -> bool {
    gm.batch == 1
        && gm.split.is_none()
        && !gm.accumulate
        && gm.ld_out == gm.m
        && matches!(gm.compute, Compute::F32 | Compute::Tf32 | Compute::Bf16F32)
}

impl Lowering<'_> {
    /// The bias epilogue of matmul `id`'s GEMM `gm`, where the rule in the module's
    /// documentation holds: the reader's launch is lowered here, taken out of the program
    /// into the epilogue, and its touch returned to join the GEMM's; the reader then lowers to
    /// nothing.
    pub(super) fn bias_epilogue(
        &mut self,
        id: NodeId,
        gm: &Gemm,
        outputs: &[SmallVec<[NodeId; 1]>],
        plan: &MemoryPlan,
    ) -> Result<Option<(Epilogue, Touch)>, LowerError> {
        let g = self.g;
        if !plain_call(gm) {
            return Ok(None);
        }
        let [reader] = self.users[id.index()][..] else {
            return Ok(None);
        };
        let node = g.node(reader);
        let Op::Fused(kernel) = &node.op else {
            return Ok(None);
        };
        let Some(ba) = bias_add(kernel) else {
            return Ok(None);
        };
        let outs = &outputs[reader.index()];
        let [out] = outs[..] else {
            return Ok(None);
        };
        let bias = node.inputs.get(ba.bias).copied();
        let bias_dtype = kernel.inputs[ba.bias].dtype;
        let fits = node.inputs.len() == kernel.inputs.len()
            && node.inputs[ba.product] == id
            && kernel.domain.last() == Some(&gm.m)
            && kernel.domain.iter().product::<usize>() == gm.m * gm.n
            && kernel.inputs[ba.product].dtype == gm.dtype
            && g.ty(out).dtype == gm.dtype
            && bias_dtype == gm.dtype;
        let (here, there) = (self.location[id.index()], self.location[out.index()]);
        let Some(bias) = bias.filter(|_| fits && here == there && here.bytes > 0) else {
            return Ok(None);
        };
        let lv = &plan.liveness;
        let region = lv.storages[lv.storage_of[bias.index()]].region;
        if crate::plan::liveness::made_at(g, &lv.position, region, bias) >= lv.position[id.index()]
        {
            return Ok(None);
        }
        let (ops, touches, kernels) = (self.ops.len(), self.touches.len(), self.kernels.len());
        self.fused(reader, kernel, outs, plan)?;
        let launched = self.ops.split_off(ops);
        let mut touched = self.touches.split_off(touches);
        let ([DeviceOp::Launch { kernel, args, .. }], Some(touch)) = (&launched[..], touched.pop())
        else {
            // More than one launch (a reduction's parts) has no one epilogue: lowered again
            // at its turn.
            self.kernels.truncate(kernels);
            self.by_name.retain(|_, k| *k < kernels);
            return Ok(None);
        };
        self.absorbed.insert(reader);
        let epilogue = Epilogue {
            bias: self.location[bias.index()].offset,
            bias_dtype,
            node: reader,
            kernel: *kernel,
            args: args.clone(),
        };
        Ok(Some((epilogue, touch)))
    }
}
