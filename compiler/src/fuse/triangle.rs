//! Which values of a step are zero on one side of the diagonal of their last two axes: the
//! probabilities of a causal softmax and their gradient, written by fused kernels whose bodies
//! select by comparing two domain indices. A GEMM with such an operand leaves out the products
//! with its zero triangle, and one whose result is read only on one side computes only that
//! side (the CUDA lowering's `Split`); inside a kernel, a product with a zero factor does not
//! read its other factor there ([`structural_zero_products`]).
//!
//! The facts come from abstract interpretation of each fused kernel's body over the lanes where
//! one index exceeds the other (`j > i` or `i > j` on the domain's last two axes), in
//! topological order, so a load of a value a kernel before it wrote carries that value's fact.
//! What is zero is *structurally* zero: `0 · x`, `0 / x` and `x / +inf` are taken as 0 and
//! `-inf ± x` as `-inf` whatever `x` holds, and a mask's fill value at most `-1e30` (the
//! dtype's lowest finite value, which PyTorch code often masks with, as gpt2's f32 graph does)
//! counts as `-inf`: `exp(fill - max)` is 0 exactly for any row maximum above `fill + 104`.
//! That is exact wherever `x` is finite; a NaN or an infinity inside the triangle of the other
//! operand does not reach the product, as in FlashAttention's causal kernels and Ingot's own
//! fused attention, which never read the masked half.

use super::widen::remap;
use crate::ir::{Graph, NodeId, Op};
use ingot_kernels::fused::{Access, FusedKernel, Input, Inst};
use ingot_kernels::{BinaryOp, CmpOp, DType, UnaryOp};

/// The side of the diagonal of a value's last two axes (row `i`, column `j`) that holds zeros.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Triangle {
    /// Zero where `j > i`: lower triangular (a causal softmax's probabilities).
    ZeroAbove,
    /// Zero where `i > j`: upper triangular (the same, transposed).
    ZeroBelow,
}

/// For every node of `g`, the triangle its value is zero in, if the analysis can tell.
pub fn zero_triangles(g: &Graph) -> Vec<Option<Triangle>> {
    let mut facts: Vec<Option<Triangle>> = vec![None; g.len()];
    for id in g.ids() {
        let node = g.node(id);
        facts[id.index()] = match &node.op {
            Op::Fused(k) => output_triangle(g, k, &node.inputs, 0, &facts, id),
            Op::Result { index } => {
                let writer = node.inputs[0];
                match &g.node(writer).op {
                    Op::Fused(k) => {
                        output_triangle(g, k, &g.node(writer).inputs, *index, &facts, id)
                    }
                    _ => None,
                }
            }
            _ => None,
        };
    }
    facts
}

/// `k` with every product whose one factor is zero on a triangle its body selects by (see the
/// module docs) taking its other factor through `select(triangle, 0, factor)`: the factor is
/// then read only off the triangle ([`ingot_kernels::cuda`]'s guarded loads). A causal
/// softmax's gradient, `P · (dP - sum(P · dP))`, no longer reads `dP` above the diagonal, where
/// `P` is zero, so the GEMM that makes `dP` need not compute it there. Exact wherever the factor
/// is finite; a NaN or infinity there no longer reaches the product, as for a GEMM's zero
/// triangle.
pub fn structural_zero_products(k: &FusedKernel) -> FusedKernel {
    let r = k.domain.len();
    if r < 2 {
        return k.clone();
    }
    let mut k = k.clone();
    for t in [Triangle::ZeroAbove, Triangle::ZeroBelow] {
        let region = Region::of(t, r);
        // A comparison that holds exactly on the region (true), or exactly off it (false).
        let Some((cond, on)) = k.body.iter().enumerate().find_map(|(i, inst)| match *inst {
            Inst::Compare { op, a, b } => match (op, axis_of(&k.body, a), axis_of(&k.body, b)) {
                (CmpOp::Gt, Some(x), Some(y)) | (CmpOp::Lt, Some(y), Some(x))
                    if (x, y) == (region.above, region.below) =>
                {
                    Some((i, true))
                }
                (CmpOp::Le, Some(x), Some(y)) | (CmpOp::Ge, Some(y), Some(x))
                    if (x, y) == (region.above, region.below) =>
                {
                    Some((i, false))
                }
                _ => None,
            },
            _ => None,
        }) else {
            continue;
        };
        let facts = interpret(&k.body, region, &vec![false; k.inputs.len()]);
        let read = |i: usize| !matches!(k.body[i], Inst::Const { .. } | Inst::Index { .. });
        // The factor of each product to take through the select.
        let guarded: Vec<Option<usize>> = (k.body.iter().enumerate())
            .map(|(i, inst)| match *inst {
                // After the comparison, which the select reads.
                Inst::Binary {
                    op: BinaryOp::Mul,
                    a,
                    b,
                } if i > cond => {
                    if facts[b] == Value::Zero && facts[a] != Value::Zero && read(a) {
                        Some(a)
                    } else if facts[a] == Value::Zero && facts[b] != Value::Zero && read(b) {
                        Some(b)
                    } else {
                        None
                    }
                }
                _ => None,
            })
            .collect();
        if guarded.iter().all(Option::is_none) {
            continue;
        }
        let dtypes = k.dtypes();
        let mut body: Vec<Inst> = Vec::with_capacity(k.body.len() + 4);
        let mut new: Vec<usize> = Vec::with_capacity(k.body.len());
        // The select of each guarded factor (old index), made once; a zero of each dtype.
        let mut selected: std::collections::HashMap<usize, usize> = Default::default();
        let mut zeros: std::collections::HashMap<DType, usize> = Default::default();
        for (i, inst) in k.body.iter().enumerate() {
            if let Some(f) = guarded[i] {
                if let std::collections::hash_map::Entry::Vacant(e) = selected.entry(f) {
                    let zero = *zeros.entry(dtypes[f]).or_insert_with(|| {
                        body.push(Inst::Const {
                            value: 0.0,
                            dtype: dtypes[f],
                        });
                        body.len() - 1
                    });
                    let (a, b) = if on { (zero, new[f]) } else { (new[f], zero) };
                    body.push(Inst::Select {
                        cond: new[cond],
                        a,
                        b,
                    });
                    e.insert(body.len() - 1);
                }
            }
            let at = |j: usize| match guarded[i] {
                Some(f) if j == f => selected[&f],
                _ => new[j],
            };
            body.push(remap(inst.clone(), at));
            new.push(body.len() - 1);
            if let Inst::Const { value, dtype } = *inst {
                if value.to_bits() == 0 {
                    zeros.entry(dtype).or_insert(body.len() - 1);
                }
            }
        }
        for o in &mut k.outputs {
            o.value = new[o.value];
        }
        k.body = body;
    }
    k
}

/// The axis of an integer index instruction (a float index of a long axis could round two
/// indices together).
fn axis_of(body: &[Inst], i: usize) -> Option<usize> {
    match body[i] {
        Inst::Index {
            axis,
            dtype: DType::I32 | DType::I64,
        } => Some(axis),
        _ => None,
    }
}

/// For every matmul of `g`, the triangle of its result that nothing reads: every user is a
/// fused kernel that loads it in domain order and only selects it away there (a causal
/// softmax's scores, `select(j > i, -inf, s)`), and it is not an output of the step. Such a
/// GEMM need not compute that triangle (the CUDA lowering's `Split`); its bytes keep whatever
/// they held, which is why a use that multiplies them, even by zero, keeps the triangle read.
pub fn unread_triangles(g: &Graph) -> Vec<Option<Triangle>> {
    let users = g.users();
    let kept: std::collections::HashSet<NodeId> = g
        .outputs
        .values()
        .copied()
        .chain(g.updates.iter().flat_map(|u| [u.target, u.value]))
        .collect();
    g.ids()
        .map(|id| {
            let dims = g.ty(id).shape.dims();
            if !matches!(g.node(id).op, Op::MatMul { .. }) || dims.len() < 2 || kept.contains(&id) {
                return None;
            }
            [Triangle::ZeroAbove, Triangle::ZeroBelow]
                .into_iter()
                .find(|&t| {
                    !users[id.index()].is_empty()
                        && users[id.index()].iter().all(|&u| {
                            let Op::Fused(k) = &g.node(u).op else {
                                return false;
                            };
                            let unneeded = unneeded_loads(k, Region::of(t, dims.len()));
                            (g.node(u).inputs.iter().zip(&k.inputs).zip(unneeded)).all(
                                |((&x, input), unneeded)| {
                                    x != id || in_domain_order(g, k, input, x) && unneeded
                                },
                            )
                        })
                })
        })
        .collect()
}

/// For each input of `k`: whether no output depends on its loads' values on the region.
fn unneeded_loads(k: &FusedKernel, region: Region) -> Vec<bool> {
    let facts = interpret(&k.body, region, &vec![false; k.inputs.len()]);
    // `on[v]`: some output depends on v's values on the region's lanes; `off[v]`: on other
    // lanes. A reduction needs its operand on every lane of the rows it is needed in, the
    // region's included, whichever lanes its own value is needed on.
    let (mut on, mut off) = (vec![false; k.body.len()], vec![false; k.body.len()]);
    for o in &k.outputs {
        (on[o.value], off[o.value]) = (true, true);
    }
    let mut unneeded = vec![true; k.inputs.len()];
    for v in (0..k.body.len()).rev() {
        let (r, elsewhere) = (on[v], off[v]);
        if !r && !elsewhere {
            continue;
        }
        let mut mark = |x: usize, r: bool, elsewhere: bool| {
            on[x] |= r;
            off[x] |= elsewhere;
        };
        match k.body[v] {
            Inst::Load { input } => {
                if r {
                    unneeded[input] = false;
                }
            }
            Inst::Const { .. } | Inst::Index { .. } => {}
            Inst::Reduce { x, .. } => mark(x, true, true),
            Inst::Unary { x, .. } | Inst::Convert { x, .. } => mark(x, r, elsewhere),
            Inst::Binary { a, b, .. } | Inst::Compare { a, b, .. } => {
                mark(a, r, elsewhere);
                mark(b, r, elsewhere);
            }
            Inst::Select { cond, a, b } => {
                mark(cond, r, elsewhere);
                let (ra, rb) = match facts[cond] {
                    Value::True => (r, false),
                    Value::False => (false, r),
                    _ => (r, r),
                };
                mark(a, ra, elsewhere);
                mark(b, rb, elsewhere);
            }
        }
    }
    unneeded
}

/// The triangle output `index` of kernel `k` (read from `inputs`, node `id`) is zero in.
fn output_triangle(
    g: &Graph,
    k: &FusedKernel,
    inputs: &[NodeId],
    index: usize,
    facts: &[Option<Triangle>],
    id: NodeId,
) -> Option<Triangle> {
    let r = k.domain.len();
    let out = k.outputs.get(index)?;
    // A whole-domain output (not a reduction's row values) is stored in domain order: its
    // axes are the domain's.
    if r < 2 || g.ty(id).shape.dims() != k.domain.as_slice() {
        return None;
    }
    [Triangle::ZeroAbove, Triangle::ZeroBelow]
        .into_iter()
        .find(|&t| {
            let region = Region::of(t, r);
            let loads: Vec<bool> = k
                .inputs
                .iter()
                .zip(inputs)
                .map(|(input, &x)| facts[x.index()] == Some(t) && in_domain_order(g, k, input, x))
                .collect();
            let values = interpret(&k.body, region, &loads);
            values[out.value] == Value::Zero
        })
}

/// Whether `k` reads node `x` through `input` element for element in domain order: lane
/// `[.., i, j]` of the kernel is element `[.., i, j]` of `x`, so a triangle of one is the same
/// triangle of the other.
fn in_domain_order(g: &Graph, k: &FusedKernel, input: &Input, x: NodeId) -> bool {
    g.ty(x).shape.dims() == k.domain.as_slice() && input.access == Access::contiguous(&k.domain)
}

/// The lanes `index[above] > index[below]` of a kernel's domain.
#[derive(Clone, Copy, Debug)]
struct Region {
    above: usize,
    below: usize,
}

impl Region {
    /// Triangle `t`'s zero lanes on the last two axes of a rank-`r` domain.
    fn of(t: Triangle, r: usize) -> Region {
        let (i, j) = (r - 2, r - 1);
        match t {
            Triangle::ZeroAbove => Region { above: j, below: i },
            Triangle::ZeroBelow => Region { above: i, below: j },
        }
    }
}

/// The fill values at most this count as minus infinity.
const LOWEST: f64 = -1e30;

/// What an instruction holds on every lane of the region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Value {
    Unknown,
    Zero,
    /// `-inf`, or a finite value at most [`LOWEST`].
    NegInf,
    PosInf,
    True,
    False,
}

/// Each instruction's value over `region`; `zero_loads[i]`: input `i` is zero there.
fn interpret(body: &[Inst], region: Region, zero_loads: &[bool]) -> Vec<Value> {
    use Value::*;
    let mut v: Vec<Value> = Vec::with_capacity(body.len());
    for inst in body {
        let x = match *inst {
            Inst::Load { input } => {
                if zero_loads.get(input).copied().unwrap_or(false) {
                    Zero
                } else {
                    Unknown
                }
            }
            Inst::Const { value, dtype } if is_float(dtype) => {
                if value == 0.0 {
                    Zero
                } else if value <= LOWEST {
                    NegInf
                } else if value == f64::INFINITY {
                    PosInf
                } else {
                    Unknown
                }
            }
            Inst::Const { .. } | Inst::Index { .. } | Inst::Reduce { .. } => Unknown,
            Inst::Unary { op, x } => match (op, v[x]) {
                (UnaryOp::Neg, Zero) => Zero,
                (UnaryOp::Neg, PosInf) => NegInf,
                (UnaryOp::Exp, NegInf) => Zero,
                (UnaryOp::Sqrt | UnaryOp::Tanh, Zero) => Zero,
                (UnaryOp::Log, Zero) => NegInf,
                (UnaryOp::Recip, PosInf) => Zero,
                _ => Unknown,
            },
            Inst::Binary { op, a, b } => binary(op, v[a], v[b]),
            Inst::Compare { op, a, b } => compare(body, region, op, a, b),
            Inst::Select { cond, a, b } => match v[cond] {
                True => v[a],
                False => v[b],
                _ if v[a] == v[b] => v[a],
                _ => Unknown,
            },
            Inst::Convert { x, to } => match v[x] {
                Zero => Zero,
                NegInf | PosInf if is_float(to) => v[x],
                _ => Unknown,
            },
        };
        v.push(x);
    }
    v
}

fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F64 | DType::BF16)
}

/// Structural arithmetic on the region: a zero factor or dividend gives zero, an infinite
/// summand keeps its infinity unless the other is the opposite one.
fn binary(op: BinaryOp, a: Value, b: Value) -> Value {
    use Value::*;
    match op {
        BinaryOp::Mul if a == Zero || b == Zero => Zero,
        BinaryOp::Div if a == Zero || b == PosInf => Zero,
        BinaryOp::Add | BinaryOp::Sub if a == Zero && b == Zero => Zero,
        BinaryOp::Add => match (a, b) {
            (NegInf, x) | (x, NegInf) if x != PosInf => NegInf,
            (PosInf, x) | (x, PosInf) if x != NegInf => PosInf,
            _ => Unknown,
        },
        BinaryOp::Sub => match (a, b) {
            (NegInf, x) if x != NegInf => NegInf,
            (PosInf, x) if x != PosInf => PosInf,
            (x, PosInf) if x != PosInf => NegInf,
            _ => Unknown,
        },
        BinaryOp::Min if a == NegInf || b == NegInf => NegInf,
        BinaryOp::Max if a == PosInf || b == PosInf => PosInf,
        BinaryOp::Max | BinaryOp::Min if a == b && a == Zero => Zero,
        _ => Unknown,
    }
}

/// A comparison of two domain indices, decided on the region where one exceeds the other.
fn compare(body: &[Inst], region: Region, op: CmpOp, a: usize, b: usize) -> Value {
    let (Some(x), Some(y)) = (axis_of(body, a), axis_of(body, b)) else {
        return Value::Unknown;
    };
    // `greater`: on the region, index x > index y.
    let greater = if (x, y) == (region.above, region.below) {
        true
    } else if (x, y) == (region.below, region.above) {
        false
    } else {
        return Value::Unknown;
    };
    let holds = match op {
        CmpOp::Gt | CmpOp::Ge => greater,
        CmpOp::Lt | CmpOp::Le => !greater,
        CmpOp::Ne => true,
        CmpOp::Eq => false,
    };
    if holds {
        Value::True
    } else {
        Value::False
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lower::Target;
    use crate::pipeline;

    fn plain_causal(spec: &str, precision: crate::precision::Precision) -> pipeline::Compiled {
        let opts = pipeline::Options {
            fuse_attention: false,
            precision: Some(precision),
            ..pipeline::Options::for_target(Target::Cuda)
        };
        crate::models::compile_model(spec, &opts).unwrap()
    }

    /// A two-layer GPT's step with plain causal attention, in bf16 and in f32.
    fn small_causal_steps(
    ) -> impl Iterator<Item = (crate::precision::Precision, pipeline::Compiled)> {
        use crate::precision::Precision;
        [Precision::Bf16, Precision::F32].into_iter().map(|p| {
            let spec = "gpt:vocab=64,d_model=32,layers=2,heads=2,d_ff=64,seq=16,batch=2";
            (p, plain_causal(spec, p))
        })
    }

    /// The operands of each batched matmul of `c` (the attention products: rank 4) with a
    /// zero triangle: `(matmul, operand index, triangle)`.
    fn attention_triangles(c: &pipeline::Compiled) -> Vec<(NodeId, usize, Triangle)> {
        let t = zero_triangles(&c.graph);
        c.graph
            .ids()
            .filter(|&id| matches!(c.graph.node(id).op, Op::MatMul { .. }))
            .filter(|&id| c.graph.ty(id).shape.dims().len() == 4)
            .flat_map(|id| {
                let ins = c.graph.node(id).inputs.clone();
                let t = &t;
                ins.into_iter()
                    .enumerate()
                    .filter_map(move |(i, x)| t[x.index()].map(|tri| (id, i, tri)))
            })
            .collect()
    }

    #[test]
    fn a_causal_softmax_and_its_gradient_are_zero_above_the_diagonal_in_bf16_and_f32() {
        for (precision, c) in small_causal_steps() {
            let found = attention_triangles(&c);
            // Per layer: P·V and Pᵀ·dO read the probabilities, dS·K and dSᵀ·Q their gradient;
            // the scores Q·Kᵀ and dO·Vᵀ have no zero operand.
            assert_eq!(found.len(), 2 * 4, "{precision:?}: {found:?}");
            assert!(
                found.iter().all(|&(_, _, t)| t == Triangle::ZeroAbove),
                "{precision:?}: {found:?}"
            );
        }
    }

    #[test]
    fn the_scores_and_their_gradient_before_the_softmax_are_read_below_the_diagonal_alone() {
        for (precision, c) in small_causal_steps() {
            let unread: Vec<(NodeId, Triangle)> = unread_triangles(&c.graph)
                .into_iter()
                .enumerate()
                .filter_map(|(i, t)| t.map(|t| (NodeId(i as u32), t)))
                .collect();
            // Per layer the scores Q·Kᵀ, which the softmax and its gradient select away above
            // the diagonal, and dP = dO·Vᵀ, which the gradient multiplies by the zero
            // probabilities there: `structural_zero_products` selects it away first (a kernel's
            // 0 · NaN would be NaN).
            assert_eq!(unread.len(), 4, "{precision:?}: {unread:?}");
            for (id, t) in unread {
                assert_eq!(t, Triangle::ZeroAbove);
                let users = c.graph.users();
                assert!(users[id.index()]
                    .iter()
                    .all(|&u| matches!(&c.graph.node(u).op, Op::Fused(k) if k.reduce_axes == [3])));
            }
        }
    }

    #[test]
    fn a_load_that_only_a_select_discards_on_the_region_is_unneeded_and_others_are_needed() {
        let above = Region::of(Triangle::ZeroAbove, 2);
        let k = |body: Vec<Inst>, out: usize| FusedKernel {
            domain: vec![4, 4],
            reduce_axes: vec![],
            inputs: vec![
                ingot_kernels::fused::Input {
                    dtype: DType::F32,
                    len: 16,
                    access: Access::contiguous(&[4, 4]),
                };
                2
            ],
            body,
            outputs: vec![ingot_kernels::fused::Output { value: out }],
        };
        // select(j > i, -inf, load 0): load 0 unneeded above the diagonal.
        let masked = masked_exp(CmpOp::Gt, 1, 0);
        assert_eq!(unneeded_loads(&k(masked.clone(), 7), above), [false, true]);
        // ... but not below it, where the select keeps it.
        let below = Region::of(Triangle::ZeroBelow, 2);
        assert!(!unneeded_loads(&k(masked, 7), below)[0]);
        // 0 · load 1 still reads load 1: a NaN there would make the product NaN.
        assert_eq!(
            unneeded_loads(&k(masked_exp_times_load(), 9), above),
            [false, false]
        );
        // A row's sum of load 1 (even one selected away above the diagonal afterwards) needs
        // it there: a softmax gradient's sum of dP · P.
        let mut body = masked_exp(CmpOp::Gt, 1, 0);
        body.push(Inst::Load { input: 1 });
        body.push(Inst::Reduce {
            op: ingot_kernels::ReduceOp::Sum,
            x: 8,
        });
        body.push(konst(0.0));
        body.push(Inst::Select {
            cond: 2,
            a: 10,
            b: 9,
        });
        let mut reducing = k(body, 11);
        reducing.reduce_axes = vec![1];
        assert!(!unneeded_loads(&reducing, above)[1]);
    }

    #[test]
    fn a_product_with_a_factor_zero_above_the_diagonal_reads_its_other_factor_below_it_alone() {
        // exp(select(j > i, -inf, load 0)) · load 1: load 1 goes through select(j > i, 0, ·).
        let body = masked_exp_times_load();
        let input = ingot_kernels::fused::Input {
            dtype: DType::F32,
            len: 16,
            access: Access::contiguous(&[4, 4]),
        };
        let k = FusedKernel {
            domain: vec![4, 4],
            reduce_axes: vec![],
            inputs: vec![input.clone(), input],
            body,
            outputs: vec![ingot_kernels::fused::Output { value: 9 }],
        };
        let above = Region::of(Triangle::ZeroAbove, 2);
        assert_eq!(unneeded_loads(&k, above), [false, false]);
        let g = structural_zero_products(&k);
        assert_eq!(unneeded_loads(&g, above), [false, true]);
        let out = g.outputs[0].value;
        let Inst::Binary { a, .. } = g.body[out] else {
            panic!("{g}")
        };
        assert!(matches!(g.body[a], Inst::Select { cond: 2, .. }), "{g}");
        // It computes what the kernel did wherever load 1 is finite, and 0 above the diagonal
        // where load 1 is NaN (0 · NaN).
        let x: Vec<f32> = (0..16).map(|i| i as f32 * 0.25 - 1.0).collect();
        let mut y: Vec<f32> = (0..16).map(|i| 3.0 - i as f32).collect();
        let bytes = |v: &[f32]| v.iter().flat_map(|f| f.to_ne_bytes()).collect::<Vec<u8>>();
        let run = |k: &FusedKernel, y: &[f32]| -> Vec<f32> {
            let out = ingot_kernels::fused::cpu::run_buffers(k, &[&bytes(&x), &bytes(y)]).unwrap();
            (out[0].chunks(4))
                .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
                .collect()
        };
        assert_eq!(run(&g, &y), run(&k, &y));
        y[1] = f32::NAN; // row 0, column 1: above the diagonal
        assert!(run(&k, &y)[1].is_nan());
        assert_eq!(run(&g, &y)[1], 0.0);
    }

    /// [`masked_exp`]`(j > i) · load 1`, the product value 9.
    fn masked_exp_times_load() -> Vec<Inst> {
        let mut body = masked_exp(CmpOp::Gt, 1, 0);
        body.push(Inst::Load { input: 1 });
        body.push(Inst::binary(BinaryOp::Mul, 8, 7));
        body
    }

    fn index(axis: usize) -> Inst {
        Inst::Index {
            axis,
            dtype: DType::I32,
        }
    }

    fn konst(value: f64) -> Inst {
        Inst::Const {
            value,
            dtype: DType::F32,
        }
    }

    /// `exp(select(index[a] <op> index[b], -inf, load) - load)`: a masked softmax's numerator.
    fn masked_exp(op: CmpOp, a: usize, b: usize) -> Vec<Inst> {
        vec![
            index(a),
            index(b),
            Inst::Compare { op, a: 0, b: 1 },
            konst(f64::NEG_INFINITY),
            Inst::Load { input: 0 },
            Inst::Select {
                cond: 2,
                a: 3,
                b: 4,
            },
            Inst::binary(BinaryOp::Sub, 5, 4),
            Inst::unary(UnaryOp::Exp, 6),
        ]
    }

    #[test]
    fn the_mask_decides_which_triangle_is_zero() {
        let above = Region::of(Triangle::ZeroAbove, 2);
        let below = Region::of(Triangle::ZeroBelow, 2);
        // Masked where j > i (j = axis 1), written four ways; i > j, two ways.
        for (op, a, b, zero_above) in [
            (CmpOp::Gt, 1, 0, true),
            (CmpOp::Lt, 0, 1, true),
            (CmpOp::Ge, 1, 0, true),
            (CmpOp::Ne, 1, 0, true),
            (CmpOp::Gt, 0, 1, false),
            (CmpOp::Lt, 1, 0, false),
        ] {
            let body = masked_exp(op, a, b);
            let last = body.len() - 1;
            let (za, zb) = (
                interpret(&body, above, &[false])[last] == Value::Zero,
                interpret(&body, below, &[false])[last] == Value::Zero,
            );
            assert_eq!(
                (za, zb),
                (zero_above, !zero_above || op == CmpOp::Ne),
                "{op:?}({a}, {b})"
            );
        }
    }

    #[test]
    fn a_mask_that_is_not_a_strict_triangle_or_not_of_indices_gives_nothing() {
        let above = Region::of(Triangle::ZeroAbove, 2);
        // Masked where j <= i or j == i: the region j > i is kept, not masked.
        for op in [CmpOp::Le, CmpOp::Eq] {
            let body = masked_exp(op, 1, 0);
            assert_eq!(
                interpret(&body, above, &[false])[7],
                Value::Unknown,
                "{op:?}"
            );
        }
        // Masked by a loaded bool: nothing is known of its lanes.
        let mut body = masked_exp(CmpOp::Gt, 1, 0);
        body[2] = Inst::Load { input: 1 };
        assert_eq!(interpret(&body, above, &[false, false])[7], Value::Unknown);
        // A float index could round two indices together: not read.
        let mut body = masked_exp(CmpOp::Gt, 1, 0);
        body[0] = Inst::Index {
            axis: 1,
            dtype: DType::F32,
        };
        assert_eq!(interpret(&body, above, &[false])[7], Value::Unknown);
    }

    #[test]
    fn a_zero_input_is_zero_through_products_and_quotients_but_not_sums() {
        let above = Region::of(Triangle::ZeroAbove, 2);
        let body = vec![
            Inst::Load { input: 0 },
            Inst::Load { input: 1 },
            Inst::binary(BinaryOp::Mul, 1, 0),
            Inst::binary(BinaryOp::Div, 0, 1),
            Inst::binary(BinaryOp::Add, 0, 1),
            Inst::Convert {
                x: 3,
                to: DType::BF16,
            },
        ];
        let v = interpret(&body, above, &[true, false]);
        assert_eq!(
            v,
            [
                Value::Zero,
                Value::Unknown,
                Value::Zero,
                Value::Zero,
                Value::Unknown,
                Value::Zero
            ]
        );
    }
}
