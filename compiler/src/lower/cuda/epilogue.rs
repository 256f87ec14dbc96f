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
//! - the kernel adds each value at the GEMM's own precision: no conversion on the way from the
//!   product's load, the bias's load or the sum to the output rounds to a narrower dtype than
//!   the result's ([`BiasAdd`]'s `*_as`), so the epilogue's one rounding of `product + bias`
//!   to the result's dtype is the only change.
//!
//! The bias then rides on the GEMM as it is stored, or, for a bf16 GEMM whose bias is an f32
//! parameter the kernel rounds to bf16 (gpt2's qkv bias under bf16), rounded into the tail of
//! the GEMM's planned workspace by a small launch just before the call ([`Round`]):
//! cuBLASLt 13 refuses an f32 bias on a bf16 result (`cublasLtMatmulAlgoGetHeuristic`:
//! `CUBLAS_STATUS_INVALID_VALUE`, measured on an H200, docs/benchmarks.md session 42). That
//! needs the workspace to hold the rounded bias with room to spare ([`ROUND_ROOM`]).
//!
//! Then the GEMM carries the bias and the kernel's launch (the fallback, for a runtime whose
//! cuBLASLt refuses the epilogue or that leaves epilogues off), and the kernel's node lowers to
//! nothing. The plan is not changed. The bits: in f32 and tf32 the epilogue adds the f32 bias
//! to the f32 product as the kernel did (gpt2's losses over 5 steps were OLD's to the bit on
//! an H200); cuBLASLt may pick another GEMM algorithm than cuBLAS for the product itself.
//! Under bf16 the kernel computed `bf16(f32(bf16(acc)) + f32(bf16(bias)))`; the epilogue
//! computes `bf16(acc + f32(bf16(bias)))` on the f32 accumulator `acc`: the same bias, the
//! product rounded once instead of twice.

use super::gemm::{Compute, Epilogue, Gemm, Round};
use super::lowering::Lowering;
use super::program::DeviceOp;
use crate::ir::{DType, NodeId, Op};
use crate::lower::deps::Touch;
use crate::lower::error::LowerError;
use crate::plan::MemoryPlan;
use ingot_kernels::fused::{Access, FusedKernel, Inst};
use ingot_kernels::BinaryOp;
use smallvec::SmallVec;

/// Which inputs of a bias-add kernel are the product and the bias, and at what precision the
/// kernel adds them: each `*_as` is the narrowest dtype the value passes through between its
/// load and the add (the product, the bias) or between the add and the output (the sum); a
/// value converted to bf16 anywhere on the way holds only bf16's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BiasAdd {
    pub product: usize,
    pub bias: usize,
    pub product_as: DType,
    pub bias_as: DType,
    pub sum_as: DType,
}

/// The narrower of two of the dtypes a bias add converts between (f32 and bf16).
fn narrower(a: DType, b: DType) -> DType {
    if a == DType::BF16 || b == DType::BF16 {
        DType::BF16
    } else {
        DType::F32
    }
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
    // Through conversions to what an instruction's value comes from, and the narrowest
    // dtype converted to on the way.
    let strip = |mut v: usize| {
        let mut narrowest = DType::F32;
        loop {
            match k.body.get(v)? {
                Inst::Convert { x, to } => {
                    narrowest = narrower(narrowest, *to);
                    v = *x;
                }
                other => return Some((other, narrowest)),
            }
        }
    };
    let (Inst::Binary { a, b, .. }, sum_as) = strip(out.value)? else {
        return None;
    };
    let input = |v: usize| match strip(v)? {
        (Inst::Load { input }, through) => {
            Some((*input, narrower(through, k.inputs[*input].dtype)))
        }
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
        .find(|&(p, q)| p.0 != q.0 && is_product(p.0) && is_bias(q.0).is_some())
        .map(|(p, q)| BiasAdd {
            product: p.0,
            bias: q.0,
            product_as: p.1,
            bias_as: q.1,
            sum_as,
        })
}

/// The fewest bytes a GEMM's workspace keeps for the library beside a bias rounded into its
/// tail ([`Round`]): cuBLAS's planned 32 MiB leaves far more; below this the bias is not
/// rounded there and the kernel stays.
pub const ROUND_ROOM: usize = 1 << 20;

/// The kernel writing `n` f32 values rounded to bf16: what a bias add's body does to its
/// f32 bias before adding it.
pub fn round_to_bf16(n: usize) -> FusedKernel {
    FusedKernel {
        domain: vec![n],
        reduce_axes: vec![],
        inputs: vec![ingot_kernels::fused::Input {
            dtype: DType::F32,
            len: n,
            access: Access::contiguous(&[n]),
        }],
        body: vec![
            Inst::Load { input: 0 },
            Inst::Convert {
                x: 0,
                to: DType::BF16,
            },
        ],
        outputs: vec![ingot_kernels::fused::Output { value: 1 }],
    }
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
        // The bias as stored, or an f32 bias the kernel rounds to a bf16 GEMM's dtype.
        let rounded = bias_dtype == DType::F32 && gm.dtype == DType::BF16;
        let fits = node.inputs.len() == kernel.inputs.len()
            && node.inputs[ba.product] == id
            && kernel.domain.last() == Some(&gm.m)
            && kernel.domain.iter().product::<usize>() == gm.m * gm.n
            && kernel.inputs[ba.product].dtype == gm.dtype
            && g.ty(out).dtype == gm.dtype
            && [ba.product_as, ba.bias_as, ba.sum_as] == [gm.dtype; 3]
            && (bias_dtype == gm.dtype || rounded);
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
        // Where a rounded bias goes: the last 256-byte-aligned `m` bf16 values of the
        // workspace, which must leave the library room.
        let ws = gm.workspace;
        let tail = (ws.offset + ws.bytes).saturating_sub(gm.m * 2) & !255;
        if rounded && (tail < ws.offset + ROUND_ROOM || ws.offset + ws.bytes < gm.m * 2) {
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
        let (kernel, args) = (*kernel, args.clone());
        let from = self.location[bias.index()].offset;
        let (bias_at, bias_dtype, round) = if rounded {
            let k = ingot_kernels::cuda::fused(&round_to_bf16(gm.m)).map_err(|e| {
                LowerError::Invalid {
                    op: "matmul",
                    reason: format!("the bias epilogue's rounding kernel: {e}"),
                }
            })?;
            let round = Round {
                kernel: self.kernel_index(k),
                args: smallvec::smallvec![from, tail],
            };
            (tail, DType::BF16, Some(round))
        } else {
            (from, bias_dtype, None)
        };
        self.absorbed.insert(reader);
        let epilogue = Epilogue {
            bias: bias_at,
            bias_dtype,
            node: reader,
            kernel,
            args,
            round,
        };
        Ok(Some((epilogue, touch)))
    }
}
