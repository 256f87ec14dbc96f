//! The attention ops' operand rules: what [`Op::Attention`] and [`Op::AttentionGrad`] take in
//! each [`AttentionLayout`], what they give, and the problem their kernels solve.
//!
//! Every consumer (type inference, the CPU executor, both lowerings, the flop count) reads an
//! attention node through [`attention_problem`], so a layout is defined in one place.

use super::op::{AttentionLayout, Op};
use super::shape::Shape;
use super::tensor_type::TensorType;
use ingot_kernels::attention::Layout;
use ingot_kernels::DType;
use smallvec::SmallVec;

/// One attention node as its kernels see it: `batch_heads` independent problems of `seq_q`
/// queries over `seq_k` keys of `head_dim`, laid out as [`Problem::layout`] says.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Problem {
    pub batch_heads: usize,
    /// Heads a batch in the operands' layout (1 for [`AttentionLayout::Heads`], whose leading
    /// axes are flattened into problems).
    pub heads: usize,
    pub seq_q: usize,
    pub seq_k: usize,
    pub head_dim: usize,
    pub dtype: DType,
    pub causal: bool,
    pub scale: f64,
    pub layout: AttentionLayout,
}

impl Problem {
    /// Where the kernels find each operand's rows.
    pub fn strides(&self) -> Layout {
        match self.layout {
            AttentionLayout::Heads => Layout::contiguous(self.seq_q, self.seq_k, self.head_dim),
            AttentionLayout::Tokens => {
                Layout::tokens(self.heads, self.seq_q, self.seq_k, self.head_dim)
            }
            AttentionLayout::Packed => Layout::packed(self.heads, self.seq_q, self.head_dim),
        }
    }

    /// The CPU kernel's description of this problem ([`ingot_kernels::cpu::attention`]).
    pub fn cpu(&self) -> ingot_kernels::cpu::attention::Shape {
        ingot_kernels::cpu::attention::Shape {
            batch_heads: self.batch_heads,
            seq_q: self.seq_q,
            seq_k: self.seq_k,
            head_dim: self.head_dim,
            causal: self.causal,
            scale: self.scale as f32,
            layout: self.strides(),
        }
    }

    /// For each of q, k and v (dq, dk and dv): which operand (output) holds it, and how many
    /// elements into that buffer it starts. Three operands each hold their own from element 0;
    /// a packed one holds all three in its slots.
    pub fn operand_starts(&self) -> [(usize, usize); 3] {
        match self.layout {
            AttentionLayout::Packed => {
                [0, 1, 2].map(|s| (0, Layout::packed_slot(self.heads, self.head_dim, s)))
            }
            _ => [(0, 0), (1, 0), (2, 0)],
        }
    }
}

fn layout_of(op: &Op) -> Result<(bool, f64, AttentionLayout, bool), String> {
    match *op {
        Op::Attention {
            causal,
            scale,
            layout,
        } => Ok((causal, scale, layout, false)),
        Op::AttentionGrad {
            causal,
            scale,
            layout,
        } => Ok((causal, scale, layout, true)),
        _ => Err(format!("{} is not an attention op", op.name())),
    }
}

/// The problem of an attention op over `operands` (the forward's operands first; an
/// `attention_grad`'s further operands are not looked at here), or what breaks the rules.
pub fn attention_problem(op: &Op, operands: &[&TensorType]) -> Result<Problem, String> {
    let (causal, scale, layout, _) = layout_of(op)?;
    if !scale.is_finite() {
        return Err(format!("scale={scale} must be a finite number"));
    }
    let n = layout.inputs();
    if operands.len() < n {
        return Err(format!(
            "the {} layout takes {n} forward operand(s), got {}",
            layout.name(),
            operands.len()
        ));
    }
    let fwd = &operands[..n];
    let dtype = fwd[0].dtype;
    if !matches!(dtype, DType::F32 | DType::BF16) || fwd.iter().any(|t| t.dtype != dtype) {
        return Err(match layout {
            AttentionLayout::Packed => "qkv must be f32 or bf16".into(),
            _ => "q, k and v must share one dtype, f32 or bf16".into(),
        });
    }
    let p = match layout {
        AttentionLayout::Heads => heads(fwd)?,
        AttentionLayout::Tokens => tokens(fwd)?,
        AttentionLayout::Packed => packed(fwd[0])?,
    };
    if [p.batch_heads, p.seq_q, p.seq_k, p.head_dim].contains(&0) {
        return Err("attention over an empty axis".into());
    }
    Ok(Problem {
        dtype,
        causal,
        scale,
        layout,
        ..p
    })
}

/// The parts of a [`Problem`] the shapes give.
fn problem(batch_heads: usize, heads: usize, seq_q: usize, seq_k: usize, d: usize) -> Problem {
    Problem {
        batch_heads,
        heads,
        seq_q,
        seq_k,
        head_dim: d,
        dtype: DType::F32,
        causal: false,
        scale: 1.0,
        layout: AttentionLayout::Heads,
    }
}

/// q `[.., Tq, D]`, k and v `[.., Tk, D]`.
fn heads(fwd: &[&TensorType]) -> Result<Problem, String> {
    let (q, k, v) = (fwd[0], fwd[1], fwd[2]);
    let r = q.shape.rank();
    if r < 2 || k.shape.rank() != r || v.shape.rank() != r {
        return Err("q, k and v must have the same rank, at least 2 ([.., seq, head_dim])".into());
    }
    let (qd, kd, vd) = (q.shape.dims(), k.shape.dims(), v.shape.dims());
    if qd[..r - 2] != kd[..r - 2] || qd[..r - 2] != vd[..r - 2] {
        return Err("q, k and v must have equal leading (batch, head) axes".into());
    }
    one_key_count_and_head_dim((kd[r - 2], vd[r - 2]), (qd[r - 1], kd[r - 1], vd[r - 1]))?;
    Ok(problem(
        qd[..r - 2].iter().product(),
        1,
        qd[r - 2],
        kd[r - 2],
        qd[r - 1],
    ))
}

/// q `[B, Tq, H, D]`, k and v `[B, Tk, H, D]`.
fn tokens(fwd: &[&TensorType]) -> Result<Problem, String> {
    let (q, k, v) = (fwd[0], fwd[1], fwd[2]);
    if [q, k, v].iter().any(|t| t.shape.rank() != 4) {
        return Err(
            "the tokens layout takes q, k and v of rank 4 ([batch, seq, heads, head_dim])".into(),
        );
    }
    let (qd, kd, vd) = (q.shape.dims(), k.shape.dims(), v.shape.dims());
    if qd[0] != kd[0] || qd[0] != vd[0] || qd[2] != kd[2] || qd[2] != vd[2] {
        return Err("q, k and v must have one batch and one head count".into());
    }
    one_key_count_and_head_dim((kd[1], vd[1]), (qd[3], kd[3], vd[3]))?;
    Ok(problem(qd[0] * qd[2], qd[2], qd[1], kd[1], qd[3]))
}

/// qkv `[B, T, 3, H, D]`.
fn packed(qkv: &TensorType) -> Result<Problem, String> {
    let d = qkv.shape.dims();
    if d.len() != 5 || d[2] != 3 {
        return Err(format!(
            "the packed layout takes one qkv [batch, seq, 3, heads, head_dim], got {qkv}"
        ));
    }
    Ok(problem(d[0] * d[3], d[3], d[1], d[1], d[4]))
}

fn one_key_count_and_head_dim(
    (k, v): (usize, usize),
    (qd, kd, vd): (usize, usize, usize),
) -> Result<(), String> {
    if k != v {
        return Err(format!("k and v must have one key count, got {k} and {v}"));
    }
    if kd != qd || vd != qd {
        return Err(format!(
            "q, k and v must have one head_dim, got {qd}, {kd} and {vd}"
        ));
    }
    Ok(())
}

/// An attention op over `operands` checked against every rule (the forward's operands, and an
/// `attention_grad`'s `out`, `lse` and `dout`), its problem, and whether it is the backward
/// op. The error says which operand breaks which rule (see [`Op::Attention`]). Allocates
/// nothing for types of rank up to 4 (the CPU executor calls it on every step).
pub fn attention_check(op: &Op, operands: &[&TensorType]) -> Result<(Problem, bool), String> {
    let (_, _, layout, grad) = layout_of(op)?;
    let n = layout.inputs();
    let want = if grad { n + 3 } else { n };
    if operands.len() != want {
        let names = match (layout, grad) {
            (AttentionLayout::Packed, false) => "qkv",
            (AttentionLayout::Packed, true) => "qkv, out, lse, dout",
            (_, false) => "q, k, v",
            (_, true) => "q, k, v, out, lse, dout",
        };
        return Err(format!(
            "takes {want} operand(s) ({names}), got {}",
            operands.len()
        ));
    }
    let p = attention_problem(op, operands)?;
    if grad {
        let (o, l, dout) = (operands[n], operands[n + 1], operands[n + 2]);
        let [out, lse] = forward_outputs(&p, operands[0]);
        if *o != out {
            return Err(format!("out must be {out}, got {o}"));
        }
        if *l != lse {
            return Err(format!("lse must be {lse}, got {l}"));
        }
        if *dout != out {
            return Err(format!("dout must have out's type {out}, got {dout}"));
        }
    }
    Ok((p, grad))
}

/// `[out, lse]` of problem `p` whose first operand is `first`.
fn forward_outputs(p: &Problem, first: &TensorType) -> [TensorType; 2] {
    let (b, h) = (p.batch_heads / p.heads, p.heads);
    let out = match p.layout {
        AttentionLayout::Heads => first.clone(),
        _ => TensorType::new(Shape::new(&[b, p.seq_q, h, p.head_dim]), p.dtype),
    };
    let lse_dims: SmallVec<[usize; 4]> = match p.layout {
        AttentionLayout::Heads => {
            let q = first.shape.dims();
            q[..q.len() - 1].iter().copied().collect()
        }
        _ => smallvec::smallvec![b, h, p.seq_q],
    };
    [out, TensorType::new(Shape(lse_dims), DType::F32)]
}

impl Problem {
    /// The dtype and element count of every output, output 0 first (see
    /// [`attention_outputs`]), without building their types.
    pub fn output_elems(&self, grad: bool) -> SmallVec<[(DType, usize); 3]> {
        let (bh, d) = (self.batch_heads, self.head_dim);
        if !grad {
            return smallvec::smallvec![
                (self.dtype, bh * self.seq_q * d),
                (DType::F32, bh * self.seq_q)
            ];
        }
        match self.layout {
            AttentionLayout::Packed => smallvec::smallvec![(self.dtype, 3 * bh * self.seq_q * d)],
            _ => smallvec::smallvec![
                (self.dtype, bh * self.seq_q * d),
                (self.dtype, bh * self.seq_k * d),
                (self.dtype, bh * self.seq_k * d)
            ],
        }
    }
}

/// The types of every output of an attention op, output 0 (the node's own value) first:
/// `[out, lse]` for `attention`; for `attention_grad` the forward operands' gradients (`[dq,
/// dk, dv]`, or `[dqkv]` when packed). The error says which operand breaks which rule (see
/// [`Op::Attention`]).
pub fn attention_outputs(
    op: &Op,
    operands: &[&TensorType],
) -> Result<SmallVec<[TensorType; 3]>, String> {
    let (p, grad) = attention_check(op, operands)?;
    if grad {
        let n = p.layout.inputs();
        return Ok(operands[..n].iter().map(|t| (*t).clone()).collect());
    }
    let [out, lse] = forward_outputs(&p, operands[0]);
    Ok(smallvec::smallvec![out, lse])
}
