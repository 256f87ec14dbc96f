//! The text of one instruction (its right-hand side) and of one step of a reduction: shared by
//! every strategy, so that an op means the same in all of them.

use super::Analysis;
use crate::cuda::{literal, rounded, widened, CodegenError};
use crate::fused::Inst;
use crate::{BinaryOp, CmpOp, DType, ReduceOp, UnaryOp};

impl Analysis<'_> {
    /// The f32 quotient `a / b`: IEEE division, or in a kernel holding bf16 the hardware's
    /// full-range approximation (`ig_fdiv`, at most 2 ulp), whose error is far below the bf16
    /// rounding the kernel's values go through. Measured on an H100 (session 13), the precise
    /// division was the largest cost of gpt2's plain-attention softmax kernels, which are
    /// bound by instructions, not memory: 210 → 175 µs forward, 336 → 261 µs backward.
    fn f32_div(&self, a: &str, b: &str) -> String {
        if self.fast_math {
            format!("ig_fdiv({a}, {b})")
        } else {
            format!("{a} / {b}")
        }
    }

    /// The right-hand side of instruction `i`: `addr[n]` is the element index input `n` is read
    /// at, `axis(d)` the domain index along axis `d`. A bf16 value is a float register: a load
    /// widens, and an index, unary or binary instruction of dtype bf16 is the f32 op rounded
    /// to the nearest bf16 (a constant is the rounded value; a select and a copy keep rounded
    /// values; a conversion to bf16 rounds), as the CPU's fused executor computes it.
    pub(super) fn expr(
        &self,
        i: usize,
        addr: &[String],
        axis: &dyn Fn(usize) -> String,
    ) -> Result<String, CodegenError> {
        let v = |j: usize| format!("v{j}");
        let dt = self.dt[i];
        let unsupported = |op: &'static str, dtype: DType| CodegenError::Unsupported {
            op,
            what: "an operand",
            dtype,
        };
        Ok(match self.k.body[i] {
            Inst::Load { input } => self.load_expr(input, &addr[input]),
            Inst::Const { value, dtype } => literal(value, dtype),
            Inst::Index { axis: d, dtype } => {
                let x = axis(d);
                match dtype {
                    DType::F32 => format!("(float){x}"),
                    DType::F64 => format!("(double){x}"),
                    DType::I32 => format!("(int){x}"),
                    DType::I64 => format!("(long long){x}"),
                    DType::Bool => format!("(unsigned char)({x} != 0)"),
                    DType::BF16 => format!("ig_round((float){x})"),
                }
            }
            Inst::Unary { op, x } => {
                let (x, d) = (v(x), dt);
                if d == DType::BF16 {
                    return Ok(rounded(d, self.float_unary(op, &x)));
                }
                match (op, d) {
                    (UnaryOp::Neg, DType::F32 | DType::F64) => format!("-{x}"),
                    (UnaryOp::Neg, DType::I32 | DType::I64) => format!("ig_neg({x})"),
                    (UnaryOp::Exp, DType::F32) => self.f32_exp(&x),
                    (UnaryOp::Exp, DType::F64) => format!("exp({x})"),
                    (UnaryOp::Log, DType::F32) => format!("logf({x})"),
                    (UnaryOp::Log, DType::F64) => format!("log({x})"),
                    (UnaryOp::Sqrt, DType::F32) => format!("sqrtf({x})"),
                    (UnaryOp::Sqrt, DType::F64) => format!("sqrt({x})"),
                    (UnaryOp::Tanh, DType::F32) => format!("tanhf({x})"),
                    (UnaryOp::Tanh, DType::F64) => format!("tanh({x})"),
                    (UnaryOp::Recip, DType::F32) => self.f32_div("1.0f", &x),
                    (UnaryOp::Recip, DType::F64) => format!("1.0 / {x}"),
                    (UnaryOp::Erf, DType::F32) => format!("erff({x})"),
                    (UnaryOp::Erf, DType::F64) => format!("erf({x})"),
                    _ => return Err(unsupported(op.name(), d)),
                }
            }
            Inst::Binary { op, a, b } => {
                let (a, b, d) = (v(a), v(b), dt);
                if d == DType::BF16 {
                    // The f32 op's text (its own operator precedence), rounded.
                    let f = match op {
                        BinaryOp::Add => format!("{a} + {b}"),
                        BinaryOp::Sub => format!("{a} - {b}"),
                        BinaryOp::Mul => format!("{a} * {b}"),
                        BinaryOp::Div => self.f32_div(&a, &b),
                        BinaryOp::Max => format!("ig_max({a}, {b})"),
                        BinaryOp::Min => format!("ig_min({a}, {b})"),
                    };
                    return Ok(rounded(d, f));
                }
                let float = d.is_float();
                match (op, d) {
                    (BinaryOp::Add, _) if float => format!("{a} + {b}"),
                    (BinaryOp::Sub, _) if float => format!("{a} - {b}"),
                    (BinaryOp::Mul, _) if float => format!("{a} * {b}"),
                    (BinaryOp::Div, DType::F32) => self.f32_div(&a, &b),
                    (BinaryOp::Div, _) if float => format!("{a} / {b}"),
                    (BinaryOp::Add, DType::I32 | DType::I64) => format!("ig_add({a}, {b})"),
                    (BinaryOp::Sub, DType::I32 | DType::I64) => format!("ig_sub({a}, {b})"),
                    (BinaryOp::Mul, DType::I32 | DType::I64) => format!("ig_mul({a}, {b})"),
                    // The prelude's float overloads propagate NaN (fmaxf/fminf drop it).
                    (BinaryOp::Max, DType::F32 | DType::F64 | DType::I32 | DType::I64) => {
                        format!("ig_max({a}, {b})")
                    }
                    (BinaryOp::Min, DType::F32 | DType::F64 | DType::I32 | DType::I64) => {
                        format!("ig_min({a}, {b})")
                    }
                    _ => return Err(unsupported(op.name(), d)),
                }
            }
            Inst::Compare { op, a, b } => {
                let c = match op {
                    CmpOp::Lt => "<",
                    CmpOp::Le => "<=",
                    CmpOp::Gt => ">",
                    CmpOp::Ge => ">=",
                    CmpOp::Eq => "==",
                    CmpOp::Ne => "!=",
                };
                format!("(unsigned char)({} {c} {})", v(a), v(b))
            }
            Inst::Select { cond, a, b } => format!("{} ? {} : {}", v(cond), v(a), v(b)),
            Inst::Convert { x, to } => {
                let f = match to {
                    DType::F32 => "ig_to_f32",
                    DType::F64 => "ig_to_f64",
                    DType::I32 => "ig_to_i32",
                    DType::I64 => "ig_to_i64",
                    DType::Bool => "ig_to_bool",
                    DType::BF16 => "ig_to_bf16",
                };
                format!("{f}({})", v(x))
            }
            // Only in the elementwise case (every reduce axis of size 1): a copy.
            Inst::Reduce { x, .. } => v(x),
        })
    }

    /// The f32 `e^x`: CUDA's `expf`, or in a kernel holding bf16 the prelude's `ig_exp`
    /// (`ex2.approx`, see the `cuda` module docs, "bf16"), also in the online sums'
    /// rescaling. gpt2's cross-entropy kernel takes two an element: with `expf` 958.7 µs, with
    /// `ig_exp` 852.1 µs on an H200 (session 41).
    pub(super) fn f32_exp(&self, x: &str) -> String {
        if self.fast_math {
            format!("ig_exp({x})")
        } else {
            format!("expf({x})")
        }
    }

    /// The f32 text of a unary op on a float operand (that of an f32 instruction).
    fn float_unary(&self, op: UnaryOp, x: &str) -> String {
        match op {
            UnaryOp::Neg => format!("-{x}"),
            UnaryOp::Exp => self.f32_exp(x),
            UnaryOp::Log => format!("logf({x})"),
            UnaryOp::Sqrt => format!("sqrtf({x})"),
            UnaryOp::Tanh => format!("tanhf({x})"),
            UnaryOp::Recip => format!("1.0f / {x}"),
            UnaryOp::Erf => format!("erff({x})"),
        }
    }

    /// Input `n` read at the element index `at`, as a register value (bf16 widens).
    pub(super) fn load_expr(&self, n: usize, at: &str) -> String {
        widened(self.k.inputs[n].dtype, format!("in{n}[{at}]"))
    }
}

pub(super) fn reduce_op(inst: &Inst) -> ReduceOp {
    match *inst {
        Inst::Reduce { op, .. } => op,
        _ => ReduceOp::Sum,
    }
}

/// The starting value of a reduction: 0, or the lowest value for max.
pub(super) fn identity(op: ReduceOp, d: DType) -> String {
    match op {
        ReduceOp::Sum => literal(0.0, d),
        ReduceOp::Max => literal(f64::NEG_INFINITY, d),
    }
}

/// `acc` with the term `t` folded in.
pub(super) fn accumulate(op: ReduceOp, d: DType, acc: &str, t: &str) -> String {
    match op {
        ReduceOp::Sum if d.is_float() => format!("{acc} + {t}"),
        ReduceOp::Sum => format!("ig_add({acc}, {t})"),
        ReduceOp::Max => format!("ig_keep_max({acc}, {t})"),
    }
}
