//! What a compiled program computes, whatever the chunks it runs over ([`Body`]: the row-level
//! steps, the passes with their folds and stages, where each output is, the buffers and slots
//! they take), built from a fused kernel; and which kernels compiled programs cover
//! ([`covered`], [`chunk_axes`]). The rows and flat programs ([`super::rows`]) and the column
//! programs ([`super::columns`]) both run a `Body`.

use crate::cpu::{Float, Num, Scalar};
use crate::dtype::DType;
use crate::fused::check::operands;
use crate::fused::{FusedKernel, Inst};
use crate::ops::{BinaryOp, CmpOp, ReduceOp, UnaryOp};

/// Where an operand's value is, for the chunk being computed.
#[derive(Clone, Copy, Debug)]
pub(super) enum Src {
    /// Lane buffer `n`: one value per lane.
    Lanes(usize),
    /// Row buffer `n`: one value per row of the chunk.
    Row(usize),
    /// The same value everywhere (a constant, or computed from constants only).
    Const(f32),
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Code {
    Load { input: usize },
    Unary(UnaryOp),
    Binary(BinaryOp),
    Compare(CmpOp),
    Select,
}

/// One instruction: what it computes, from where, into which buffer (a lane buffer in a pass,
/// a row buffer in a stage).
#[derive(Clone, Copy, Debug)]
pub(super) struct Step {
    pub(super) code: Code,
    pub(super) args: [Src; 3],
    pub(super) out: usize,
}

/// A reduction fed in a pass: its operand's lane buffer, its slot, its row buffer.
#[derive(Clone, Copy, Debug)]
pub(super) struct Fold {
    pub(super) op: ReduceOp,
    pub(super) from: usize,
    pub(super) slot: usize,
    pub(super) to: usize,
}

#[derive(Clone, Debug, Default)]
pub(super) struct Pass {
    pub(super) steps: Vec<Step>,
    pub(super) folds: Vec<Fold>,
    /// Row-level instructions evaluated after the pass (its reductions finished).
    pub(super) stage: Vec<Step>,
}

/// Applies a constant-only instruction to constant operands, with the interpreter's functions.
fn fold_const(code: Code, a: f32, b: f32, c: f32) -> f32 {
    match code {
        Code::Load { .. } => f32::NAN,
        Code::Unary(op) => unary_fn(op)(a),
        Code::Binary(op) => binary_fn(op)(a, b),
        Code::Compare(op) => bool_f32(compare_fn(op)(a, b)),
        Code::Select => {
            if a != 0.0 {
                b
            } else {
                c
            }
        }
    }
}

#[inline(always)]
pub(super) fn bool_f32(b: bool) -> f32 {
    if b {
        1.0
    } else {
        0.0
    }
}

fn unary_fn(op: UnaryOp) -> fn(f32) -> f32 {
    match op {
        UnaryOp::Neg => <f32 as Num>::neg,
        UnaryOp::Exp => <f32 as Float>::exp,
        UnaryOp::Log => <f32 as Float>::ln,
        UnaryOp::Sqrt => <f32 as Float>::sqrt,
        UnaryOp::Tanh => <f32 as Float>::tanh,
        UnaryOp::Recip => <f32 as Float>::recip,
        UnaryOp::Erf => <f32 as Float>::erf,
    }
}

fn binary_fn(op: BinaryOp) -> fn(f32, f32) -> f32 {
    match op {
        BinaryOp::Add => <f32 as Scalar>::add,
        BinaryOp::Sub => <f32 as Num>::sub,
        BinaryOp::Mul => <f32 as Num>::mul,
        BinaryOp::Div => <f32 as Float>::div,
        BinaryOp::Max => <f32 as Scalar>::max,
        BinaryOp::Min => <f32 as Num>::min,
    }
}

fn compare_fn(op: CmpOp) -> fn(f32, f32) -> bool {
    match op {
        CmpOp::Lt => |x, y| x < y,
        CmpOp::Le => |x, y| x <= y,
        CmpOp::Gt => |x, y| x > y,
        CmpOp::Ge => |x, y| x >= y,
        CmpOp::Eq => |x, y| x == y,
        CmpOp::Ne => |x, y| x != y,
    }
}

/// What a compiled kernel computes, whatever the chunks it runs over: the row-level steps
/// before the first pass, the passes (full steps, folds, stages), where each output is, and
/// the lane buffers, row buffers and reduction slots they use. The rows and flat programs
/// ([`Program`](super::rows::Program)) and the columns programs ([`super::columns`]) run it.
#[derive(Clone, Debug)]
pub(super) struct Body {
    pub(super) stage0: Vec<Step>,
    pub(super) passes: Vec<Pass>,
    /// Per output: its value, and whether it is stored once per row.
    pub(super) outputs: Vec<(Src, bool)>,
    /// Per input and per output: whether it holds bools (else f32).
    pub(super) in_bool: Vec<bool>,
    pub(super) out_bool: Vec<bool>,
    pub(super) lane_bufs: usize,
    pub(super) row_bufs: usize,
    pub(super) slots: usize,
}

impl Body {
    /// The body of `k` (flat: it reduces nothing), or `None` when some value has no place a
    /// compiled kernel can keep it in.
    pub(super) fn of(k: &FusedKernel, flat: bool) -> Option<Body> {
        let n_body = k.body.len();
        let lv = levels(k, flat)?;
        let (row, konst, live, depth) = (&lv.row, &lv.konst, &lv.live, &lv.depth);
        let full = |i: usize| !row[i] && konst[i].is_none();
        let passes = {
            let mut p = usize::from(flat);
            for i in 0..n_body {
                if !live[i] || flat {
                    continue;
                }
                if matches!(k.body[i], Inst::Reduce { .. }) {
                    p = p.max(depth[i]);
                }
                if full(i) && k.outputs.iter().any(|o| o.value == i) {
                    p = p.max(depth[i] + 1);
                }
            }
            p
        };

        // Row buffers: one per live row-level value that is not a constant.
        let mut row_buf = vec![usize::MAX; n_body];
        let mut row_bufs = 0;
        for i in 0..n_body {
            if live[i] && row[i] && konst[i].is_none() {
                row_buf[i] = row_bufs;
                row_bufs += 1;
            }
        }
        let src_row = |j: usize, row_buf: &[usize]| match konst[j] {
            Some(v) => Src::Const(v),
            None => Src::Row(row_buf[j]),
        };

        let (mut out_passes, lane_bufs, last_buf, slots) = build_passes(k, &lv, passes, &row_buf)?;
        // Stages: row-level values of depth s are evaluated before pass s (after the last
        // pass for s = passes), in body order; reductions are finished by their pass.
        let mut stages: Vec<Vec<Step>> = vec![Vec::new(); passes + 1];
        for i in 0..n_body {
            if !(live[i] && row[i] && konst[i].is_none())
                || matches!(k.body[i], Inst::Reduce { .. })
            {
                continue;
            }
            let (ops, c) = operands(&k.body[i]);
            let mut args = [Src::Const(0.0); 3];
            for (q, &o) in ops[..c].iter().enumerate() {
                args[q] = src_row(o, &row_buf);
            }
            let s = depth[i].min(passes);
            stages[s].push(Step {
                code: code_of(&k.body[i])?,
                args,
                out: row_buf[i],
            });
        }
        let mut stages = stages.into_iter();
        let stage0 = stages.next().unwrap_or_default();
        for (pass, st) in out_passes.iter_mut().zip(stages) {
            pass.stage = st;
        }
        let mut outputs = Vec::with_capacity(k.outputs.len());
        for o in &k.outputs {
            let v = o.value;
            outputs.push(match konst[v] {
                Some(c) => (Src::Const(c), row[v]),
                None if row[v] => (Src::Row(row_buf[v]), true),
                // Full outputs are in their lane buffer after the last pass's steps.
                None if last_buf[v] != usize::MAX => (Src::Lanes(last_buf[v]), false),
                None => return None,
            });
        }
        if out_passes.iter().any(|p| {
            p.folds
                .iter()
                .any(|f| f.from == usize::MAX || f.to == usize::MAX)
        }) {
            return None;
        }
        let dts = k.dtypes();
        Some(Body {
            stage0,
            passes: out_passes,
            outputs,
            in_bool: k.inputs.iter().map(|i| i.dtype == DType::Bool).collect(),
            out_bool: k
                .outputs
                .iter()
                .map(|o| dts[o.value] == DType::Bool)
                .collect(),
            lane_bufs,
            row_bufs,
            slots,
        })
    }
}

/// The kernel's passes over each row ([`Pass`]: the full values the reductions of each depth
/// need, and in the last pass the full outputs), with the lane buffers they take (reused once a
/// value's last reader in the pass has run), where the last pass leaves each value, and the
/// reductions' slots.
fn build_passes(
    k: &FusedKernel,
    lv: &Levels,
    passes: usize,
    row_buf: &[usize],
) -> Option<(Vec<Pass>, usize, Vec<usize>, usize)> {
    let (row, konst, live, depth) = (&lv.row, &lv.konst, &lv.live, &lv.depth);
    let n_body = k.body.len();
    let full = |i: usize| !row[i] && konst[i].is_none();
    let src_row = |j: usize, row_buf: &[usize]| match konst[j] {
        Some(v) => Src::Const(v),
        None => Src::Row(row_buf[j]),
    };
    // Passes: pass p evaluates, in body order, the full values that the reductions of
    // depth p + 1 (and in the last pass, the full outputs) need; lane buffers are reused
    // once a value's last reader in the pass has run.
    let mut out_passes = Vec::with_capacity(passes);
    let mut lane_bufs = 0usize;
    let mut last_buf = vec![usize::MAX; n_body];
    let mut slots = 0usize;
    for p in 0..passes {
        let last = p + 1 == passes;
        let mut need = vec![false; n_body];
        let mut folds_src = Vec::new();
        for i in (0..n_body).rev() {
            if !live[i] {
                continue;
            }
            if let Inst::Reduce { x, .. } = k.body[i] {
                if depth[i] == p + 1 {
                    need[x] = true;
                    folds_src.push(i);
                }
            }
            if last && full(i) && k.outputs.iter().any(|o| o.value == i) {
                need[i] = true;
            }
            if need[i] && full(i) {
                let (ops, c) = operands(&k.body[i]);
                for &o in &ops[..c] {
                    if full(o) {
                        need[o] = true;
                    }
                }
            }
        }
        folds_src.reverse();
        let list: Vec<usize> = (0..n_body).filter(|&i| need[i] && full(i)).collect();
        // Last reader of each value within the pass (usize::MAX: read after the steps).
        let mut last_use = vec![0usize; n_body];
        for (pos, &i) in list.iter().enumerate() {
            let (ops, c) = operands(&k.body[i]);
            for &o in &ops[..c] {
                last_use[o] = pos;
            }
        }
        for &r in &folds_src {
            if let Inst::Reduce { x, .. } = k.body[r] {
                last_use[x] = usize::MAX;
            }
        }
        if last {
            for o in &k.outputs {
                last_use[o.value] = usize::MAX;
            }
        }
        let mut buf = vec![usize::MAX; n_body];
        let mut free: Vec<usize> = Vec::new();
        let mut count = 0usize;
        let mut steps = Vec::with_capacity(list.len());
        for (pos, &i) in list.iter().enumerate() {
            let out = free.pop().unwrap_or_else(|| {
                count += 1;
                count - 1
            });
            buf[i] = out;
            let (ops, c) = operands(&k.body[i]);
            let mut args = [Src::Const(0.0); 3];
            for (q, &o) in ops[..c].iter().enumerate() {
                args[q] = if full(o) {
                    Src::Lanes(buf[o])
                } else {
                    src_row(o, row_buf)
                };
            }
            steps.push(Step {
                code: code_of(&k.body[i])?,
                args,
                out,
            });
            for &o in &ops[..c] {
                if full(o) && last_use[o] == pos && !free.contains(&buf[o]) {
                    free.push(buf[o]);
                }
            }
        }
        lane_bufs = lane_bufs.max(count);
        if last {
            last_buf = buf.clone();
        }
        let mut folds = Vec::with_capacity(folds_src.len());
        for (q, &r) in folds_src.iter().enumerate() {
            let Inst::Reduce { op, x } = k.body[r] else {
                return None;
            };
            slots = slots.max(q + 1);
            folds.push(Fold {
                op,
                from: buf[x],
                slot: q,
                to: row_buf[r],
            });
        }
        out_passes.push(Pass {
            steps,
            folds,
            stage: Vec::new(),
        });
    }
    Some((out_passes, lane_bufs, last_buf, slots))
}

/// The axes of a flat or rows-case program ([`super::rows`]), axes of size 1 dropped: the
/// inner axes (the innermost ones every input walks with one stride; in a reduction, exactly
/// the trailing run of reduced axes), the row axes (the kept ones), the run axes (the reduced
/// ones outside the inner ones, wherever they lie among the kept ones), and whether the kernel
/// is flat (reduces nothing); `None` where no such split exists (the innermost axis kept in a
/// reduction: a column reduction; an input that walks the inner axes with several strides).
pub(super) type Axes = (Vec<usize>, Vec<usize>, Vec<usize>, bool);

pub(super) fn chunk_axes(k: &FusedKernel) -> Option<Axes> {
    let dims = &k.domain;
    // Axes of size 1 change no index: drop them. The chunk axes are the innermost ones.
    let eff: Vec<usize> = (0..dims.len()).filter(|&d| dims[d] != 1).collect();
    let red = |d: usize| k.reduce_axes.contains(&d);
    let reduced: Vec<usize> = eff.iter().copied().filter(|&d| red(d)).collect();
    let flat = reduced.is_empty();
    if flat && k.body.iter().any(|i| matches!(i, Inst::Reduce { .. })) {
        return None;
    }
    let composes = |q: usize, axes: &[usize]| {
        let s = &k.inputs[q].access.strides;
        axes.windows(2)
            .all(|w| s[w[1]].checked_mul(dims[w[1]]) == Some(s[w[0]]))
    };
    let inner: Vec<usize> = if flat {
        // The longest innermost run of axes every input walks with one stride.
        let mut t = eff.len().min(1);
        while t < eff.len() {
            let axes = &eff[eff.len() - t - 1..];
            if !(0..k.inputs.len()).all(|q| composes(q, axes)) {
                break;
            }
            t += 1;
        }
        eff[eff.len() - t..].to_vec()
    } else {
        // Rows: the trailing run of reduced axes, as the interpreter's chunk axes (its runs
        // fold along all of them at once, so every input must walk them with one stride).
        let t = eff.iter().rev().take_while(|&&d| red(d)).count();
        if t == 0 {
            return None;
        }
        let inner = eff[eff.len() - t..].to_vec();
        if !(0..k.inputs.len()).all(|q| composes(q, &inner)) {
            return None;
        }
        inner
    };
    let rest = &eff[..eff.len() - inner.len()];
    let outer: Vec<usize> = rest.iter().copied().filter(|&d| !red(d)).collect();
    let runs: Vec<usize> = rest.iter().copied().filter(|&d| red(d)).collect();
    Some((inner, outer, runs, flat))
}

/// Whether `k` checks, has elements and outputs, and every value f32 ([`f32_only`]): what both
/// kinds of program ask before they look at the kernel's case.
pub(super) fn covered(k: &FusedKernel) -> bool {
    k.check().is_ok() && !k.domain.contains(&0) && !k.outputs.is_empty() && f32_only(k)
}

/// Whether every value of `k` is f32 but its bools (compares, loads of bool inputs), which
/// only selects read, as their condition, and outputs store: what compiled kernels cover.
pub(super) fn f32_only(k: &FusedKernel) -> bool {
    let dts = k.dtypes();
    // Values are f32; bools (compares, loads) are read only by selects, as their condition.
    for (i, inst) in k.body.iter().enumerate() {
        let ok = match *inst {
            Inst::Load { input } => matches!(k.inputs[input].dtype, DType::F32 | DType::Bool),
            Inst::Const { dtype, .. } => dtype == DType::F32,
            Inst::Unary { .. } | Inst::Binary { .. } | Inst::Select { .. } => dts[i] == DType::F32,
            Inst::Compare { a, .. } => dts[a] == DType::F32,
            Inst::Reduce { .. } => dts[i] == DType::F32,
            Inst::Index { .. } | Inst::Convert { .. } => false,
        };
        if !ok {
            return false;
        }
        let (ops, c) = operands(inst);
        for (q, &o) in ops[..c].iter().enumerate() {
            let cond = matches!(inst, Inst::Select { .. }) && q == 0;
            if (dts[o] == DType::Bool) != cond {
                return false;
            }
        }
    }
    k.outputs
        .iter()
        .all(|o| matches!(dts[o.value], DType::F32 | DType::Bool))
}

/// What the analysis of a kernel's body knows of each value: row-level (one value per row;
/// flat kernels have none: every value is per element), a constant, live (an output reads it),
/// and depth (reductions one deeper than their operand).
struct Levels {
    row: Vec<bool>,
    konst: Vec<Option<f32>>,
    live: Vec<bool>,
    depth: Vec<usize>,
}

/// Each value's levels ([`Levels`]), or `None` where a reduction reads a row-level value or a
/// constant (its value would need broadcasting over the row's lanes: left to the interpreter).
fn levels(k: &FusedKernel, flat: bool) -> Option<Levels> {
    let n_body = k.body.len();
    let row: Vec<bool> = if flat {
        vec![false; n_body]
    } else {
        k.row_levels()
    };
    let mut konst: Vec<Option<f32>> = vec![None; n_body];
    let mut live = vec![false; n_body];
    let mut depth = vec![0usize; n_body];
    for o in &k.outputs {
        live[o.value] = true;
    }
    for i in (0..n_body).rev() {
        if live[i] {
            let (ops, c) = operands(&k.body[i]);
            for &o in &ops[..c] {
                live[o] = true;
            }
        }
    }
    for (i, inst) in k.body.iter().enumerate() {
        let (ops, c) = operands(inst);
        let d = ops[..c].iter().map(|&o| depth[o]).max().unwrap_or(0);
        depth[i] = if matches!(inst, Inst::Reduce { .. }) {
            d + 1
        } else {
            d
        };
        konst[i] = match *inst {
            Inst::Const { value, .. } => Some(value as f32),
            Inst::Load { .. } | Inst::Reduce { .. } | Inst::Index { .. } => None,
            _ => {
                let vals: Vec<Option<f32>> = ops[..c].iter().map(|&o| konst[o]).collect();
                if vals.iter().all(|v| v.is_some()) {
                    let v = |q: usize| vals.get(q).copied().flatten().unwrap_or(0.0);
                    Some(fold_const(code_of(inst)?, v(0), v(1), v(2)))
                } else {
                    None
                }
            }
        };
        // A reduction of a row-level value or a constant would need its value broadcast
        // over the row's lanes: left to the interpreter.
        if let Inst::Reduce { x, .. } = *inst {
            if row[x] || konst[x].is_some() {
                return None;
            }
        }
    }
    Some(Levels {
        row,
        konst,
        live,
        depth,
    })
}

fn code_of(inst: &Inst) -> Option<Code> {
    Some(match *inst {
        Inst::Load { input } => Code::Load { input },
        Inst::Unary { op, .. } => Code::Unary(op),
        Inst::Binary { op, .. } => Code::Binary(op),
        Inst::Compare { op, .. } => Code::Compare(op),
        Inst::Select { .. } => Code::Select,
        Inst::Const { .. } | Inst::Index { .. } | Inst::Convert { .. } | Inst::Reduce { .. } => {
            return None
        }
    })
}
