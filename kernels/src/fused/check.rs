//! Validation of a fused kernel, the questions the compiler and the executors ask of it, and its
//! text listing.
//!
//! [`FusedKernel::check`] says whether a kernel means something (see the rules on it). The query
//! methods ([`FusedKernel::dtype_of`], [`FusedKernel::is_row_level`], the `output_*` methods and
//! [`FusedKernel::can_write_over`]) answer for checked kernels; on a kernel that does not check
//! they still return without panicking, with fallbacks documented on each (an instruction that
//! does not exist, or names one that does not, has dtype `f32` and is full).

use super::kernel::{FusedKernel, Inst};
use crate::dtype::DType;
use crate::ops::{BinaryOp, ReduceOp, UnaryOp};
use std::fmt;

/// What is wrong with a fused kernel, or with the buffers a run was given: names the instruction
/// (`%i`), input, output or buffer and the dtypes, shapes or sizes involved.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    #[error("fused kernel: the domain {domain:?} has more elements than a usize can count")]
    DomainTooLarge { domain: Vec<usize> },
    #[error(
        "fused kernel: reduce axes {axes:?} must be sorted, distinct and below the domain's rank \
         {rank}"
    )]
    ReduceAxes { axes: Vec<usize>, rank: usize },
    #[error("fused kernel: input {input} has {strides} strides, but the domain has {rank} axes")]
    StrideCount {
        input: usize,
        strides: usize,
        rank: usize,
    },
    #[error(
        "fused kernel: input {input} ({dtype}, {len} elements) is read up to element {reach} \
         (offset {offset}, strides {strides:?} over the domain {domain:?}), past its end"
    )]
    AccessOutOfBounds {
        input: usize,
        dtype: DType,
        len: usize,
        /// The largest element index read (saturated at `u128::MAX`).
        reach: u128,
        offset: usize,
        strides: Vec<usize>,
        domain: Vec<usize>,
    },
    #[error("fused kernel: %{inst} uses %{operand}, which is not an earlier instruction")]
    Operand { inst: usize, operand: usize },
    #[error("fused kernel: %{inst} loads input {input}, but the kernel has {inputs} inputs")]
    NoSuchInput {
        inst: usize,
        input: usize,
        inputs: usize,
    },
    #[error("fused kernel: %{inst} is the index along axis {axis} of a rank-{rank} domain")]
    IndexAxis {
        inst: usize,
        axis: usize,
        rank: usize,
    },
    #[error("fused kernel: %{inst} ({op}) has operands of different dtypes, {a} and {b}")]
    OperandDtypes {
        inst: usize,
        op: &'static str,
        a: DType,
        b: DType,
    },
    #[error("fused kernel: %{inst}: {op} is not defined for {dtype}")]
    NotDefined {
        inst: usize,
        op: &'static str,
        dtype: DType,
    },
    #[error("fused kernel: %{inst}: the condition of select is {dtype}, it must be bool")]
    SelectCondition { inst: usize, dtype: DType },
    #[error("fused kernel: output {output} stores %{value}, but the body has {body} instructions")]
    OutputValue {
        output: usize,
        value: usize,
        body: usize,
    },
    #[error(
        "fused kernel run: the kernel has {expected} {what}, but {given} buffer offsets were given"
    )]
    BufferCount {
        what: &'static str,
        expected: usize,
        given: usize,
    },
    #[error(
        "fused kernel run: {what} {index} needs {bytes} bytes at offset {offset}, but the memory \
         has {mem} bytes"
    )]
    BufferOutOfRange {
        what: &'static str,
        index: usize,
        offset: usize,
        bytes: usize,
        mem: usize,
    },
    #[error(
        "fused kernel run: {what} {index} (bytes {offset}..{end}) overlaps the scratch region \
         ({scratch_start}..{scratch_end})"
    )]
    ScratchOverlap {
        what: &'static str,
        index: usize,
        offset: usize,
        end: usize,
        scratch_start: usize,
        scratch_end: usize,
    },
    /// An internal consistency check of the CPU implementation failed: a bug, not bad input.
    #[error("fused kernel run: internal error ({0}); please report it with the kernel's listing")]
    Internal(&'static str),
}

/// The operands of an instruction, in order (at most three).
pub(crate) fn operands(inst: &Inst) -> ([usize; 3], usize) {
    match *inst {
        Inst::Load { .. } | Inst::Const { .. } | Inst::Index { .. } => ([0; 3], 0),
        Inst::Unary { x, .. } | Inst::Convert { x, .. } | Inst::Reduce { x, .. } => ([x, 0, 0], 1),
        Inst::Binary { a, b, .. } | Inst::Compare { a, b, .. } => ([a, b, 0], 2),
        Inst::Select { cond, a, b } => ([cond, a, b], 3),
    }
}

pub(crate) fn dtype_code(d: DType) -> usize {
    match d {
        DType::F32 => 0,
        DType::F64 => 1,
        DType::I32 => 2,
        DType::I64 => 3,
        DType::Bool => 4,
        DType::BF16 => 5,
    }
}

pub(crate) fn code_dtype(c: usize) -> DType {
    match c {
        1 => DType::F64,
        2 => DType::I32,
        3 => DType::I64,
        4 => DType::Bool,
        5 => DType::BF16,
        _ => DType::F32,
    }
}

pub(crate) fn reduce_name(op: ReduceOp) -> &'static str {
    match op {
        ReduceOp::Sum => "reduce_sum",
        ReduceOp::Max => "reduce_max",
    }
}

/// The element count of `dims`, or `None` if it overflows.
pub(crate) fn checked_numel(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

impl FusedKernel {
    /// Checks that the kernel means something:
    /// - the domain's element count, and its row count (the element count with every reduce
    ///   axis taken as size 1), fit a `usize`; the reduce axes are sorted, distinct and below
    ///   the rank;
    /// - every input's access has one stride per domain axis and stays inside the input: its
    ///   largest element index, `offset + Σ strides[d]·(domain[d] − 1)`, is below `len` when the
    ///   domain is not empty; an input whose strides on every reduce axis are 0 is checked over
    ///   the rows too (the domain with each reduce axis taken as size 1), because a row-level
    ///   value is computed for every row even where a reduce axis has size 0;
    /// - every operand names an earlier instruction, every load an input, every index an axis;
    /// - dtypes: unary and binary operands and compared values share a dtype; binary ops are not
    ///   defined for bool; `div` and `exp`/`log`/`sqrt`/`tanh`/`recip` only for floats; `neg` for
    ///   floats and integers; `select`'s condition is bool and its two values share a dtype;
    ///   reductions are not defined for bool; any dtype converts to any dtype;
    /// - every output names an instruction.
    ///
    /// Never panics, whatever the kernel. Allocates one word per instruction.
    pub fn check(&self) -> Result<(), KernelError> {
        let mut dtypes = vec![0usize; self.body.len()];
        self.check_into(&mut dtypes)
    }

    /// [`FusedKernel::check`], writing each instruction's dtype code into `dtypes` (one entry
    /// per instruction) instead of allocating.
    pub(crate) fn check_into(&self, dtypes: &mut [usize]) -> Result<(), KernelError> {
        if dtypes.len() != self.body.len() {
            return Err(KernelError::Internal(
                "check: dtype table of the wrong length",
            ));
        }
        let rank = self.domain.len();
        let numel = checked_numel(&self.domain).ok_or_else(|| KernelError::DomainTooLarge {
            domain: self.domain.clone(),
        })?;
        let axes_ok = self.reduce_axes.windows(2).all(|w| w[0] < w[1])
            && self.reduce_axes.last().is_none_or(|&a| a < rank);
        if !axes_ok {
            return Err(KernelError::ReduceAxes {
                axes: self.reduce_axes.clone(),
                rank,
            });
        }
        // Rows: the domain with every reduce axis taken as size 1.
        let mut rows = 1usize;
        for (d, &n) in self.domain.iter().enumerate() {
            if !self.reduce_axes.contains(&d) {
                rows = rows
                    .checked_mul(n)
                    .ok_or_else(|| KernelError::DomainTooLarge {
                        domain: self.domain.clone(),
                    })?;
            }
        }
        for (n, inp) in self.inputs.iter().enumerate() {
            let s = &inp.access.strides;
            if s.len() != rank {
                return Err(KernelError::StrideCount {
                    input: n,
                    strides: s.len(),
                    rank,
                });
            }
            let row_level = self.reduce_axes.iter().all(|&a| s[a] == 0);
            let read = numel > 0 || (row_level && rows > 0);
            if read {
                let mut reach = inp.access.offset as u128;
                for (d, &dim) in self.domain.iter().enumerate() {
                    // Along a reduce axis a row-level input has stride 0: nothing to add.
                    let top = dim.saturating_sub(1) as u128;
                    reach = reach.saturating_add((s[d] as u128).saturating_mul(top));
                }
                if reach >= inp.len as u128 {
                    return Err(KernelError::AccessOutOfBounds {
                        input: n,
                        dtype: inp.dtype,
                        len: inp.len,
                        reach,
                        offset: inp.access.offset,
                        strides: s.clone(),
                        domain: self.domain.clone(),
                    });
                }
            }
        }
        for (i, inst) in self.body.iter().enumerate() {
            let (ops, n_ops) = operands(inst);
            for &o in &ops[..n_ops] {
                if o >= i {
                    return Err(KernelError::Operand {
                        inst: i,
                        operand: o,
                    });
                }
            }
            let dt = |j: usize| code_dtype(dtypes[j]);
            let not_defined =
                |op: &'static str, dtype: DType| KernelError::NotDefined { inst: i, op, dtype };
            let same = |op: &'static str, a: usize, b: usize| {
                if dt(a) == dt(b) {
                    Ok(dt(a))
                } else {
                    Err(KernelError::OperandDtypes {
                        inst: i,
                        op,
                        a: dt(a),
                        b: dt(b),
                    })
                }
            };
            let d = match *inst {
                Inst::Load { input } => {
                    self.inputs
                        .get(input)
                        .ok_or(KernelError::NoSuchInput {
                            inst: i,
                            input,
                            inputs: self.inputs.len(),
                        })?
                        .dtype
                }
                Inst::Const { dtype, .. } => dtype,
                Inst::Index { axis, dtype } => {
                    if axis >= rank {
                        return Err(KernelError::IndexAxis {
                            inst: i,
                            axis,
                            rank,
                        });
                    }
                    dtype
                }
                Inst::Unary { op, x } => {
                    let d = dt(x);
                    let ok = match op {
                        UnaryOp::Neg => d.is_float() || d.is_int(),
                        _ => d.is_float(),
                    };
                    if !ok {
                        return Err(not_defined(op.name(), d));
                    }
                    d
                }
                Inst::Binary { op, a, b } => {
                    let d = same(op.name(), a, b)?;
                    let ok = match op {
                        BinaryOp::Div => d.is_float(),
                        _ => d != DType::Bool,
                    };
                    if !ok {
                        return Err(not_defined(op.name(), d));
                    }
                    d
                }
                Inst::Compare { op, a, b } => {
                    same(op.name(), a, b)?;
                    DType::Bool
                }
                Inst::Select { cond, a, b } => {
                    if dt(cond) != DType::Bool {
                        return Err(KernelError::SelectCondition {
                            inst: i,
                            dtype: dt(cond),
                        });
                    }
                    same("select", a, b)?
                }
                Inst::Convert { to, .. } => to,
                Inst::Reduce { op, x } => {
                    let d = dt(x);
                    if d == DType::Bool {
                        return Err(not_defined(reduce_name(op), d));
                    }
                    d
                }
            };
            dtypes[i] = dtype_code(d);
        }
        for (j, out) in self.outputs.iter().enumerate() {
            if out.value >= self.body.len() {
                return Err(KernelError::OutputValue {
                    output: j,
                    value: out.value,
                    body: self.body.len(),
                });
            }
        }
        Ok(())
    }

    /// Whether the kernel holds bf16 values: an input, or an instruction of dtype bf16. Such a
    /// kernel is part of a bf16 mixed-precision step, where the CUDA generator computes f32
    /// division with the hardware's full-range approximation (see `cuda`'s module docs,
    /// "bf16").
    pub fn holds_bf16(&self) -> bool {
        self.inputs.iter().any(|x| x.dtype == DType::BF16) || self.dtypes().contains(&DType::BF16)
    }

    /// Every instruction's dtype (see [`FusedKernel::dtype_of`]).
    pub fn dtypes(&self) -> Vec<DType> {
        let mut out: Vec<DType> = Vec::with_capacity(self.body.len());
        for (i, inst) in self.body.iter().enumerate() {
            let earlier = |j: usize| if j < i { out[j] } else { DType::F32 };
            let d = match *inst {
                Inst::Load { input } => self.inputs.get(input).map_or(DType::F32, |x| x.dtype),
                Inst::Const { dtype, .. } | Inst::Index { dtype, .. } => dtype,
                Inst::Compare { .. } => DType::Bool,
                Inst::Convert { to, .. } => to,
                Inst::Unary { x, .. } | Inst::Reduce { x, .. } => earlier(x),
                Inst::Binary { a, .. } | Inst::Select { a, .. } => earlier(a),
            };
            out.push(d);
        }
        out
    }

    /// The dtype of instruction `inst`'s value: the input's for a load, the named one for a
    /// constant, index or convert, bool for a compare, the (first) value operand's otherwise.
    /// Fallback on a kernel that does not check: `f32` where the instruction or the operand it
    /// takes its dtype from does not exist.
    pub fn dtype_of(&self, inst: usize) -> DType {
        // Follows the chain of operands the dtype comes from: no allocation.
        let mut i = inst;
        loop {
            let Some(x) = self.body.get(i) else {
                return DType::F32;
            };
            let next = match *x {
                Inst::Load { input } => {
                    return self.inputs.get(input).map_or(DType::F32, |x| x.dtype)
                }
                Inst::Const { dtype, .. } | Inst::Index { dtype, .. } => return dtype,
                Inst::Compare { .. } => return DType::Bool,
                Inst::Convert { to, .. } => return to,
                Inst::Unary { x, .. } | Inst::Reduce { x, .. } => x,
                Inst::Binary { a, .. } | Inst::Select { a, .. } => a,
            };
            if next >= i {
                return DType::F32;
            }
            i = next;
        }
    }

    /// For each instruction, whether it is row-level (see [`FusedKernel::is_row_level`]).
    pub fn row_levels(&self) -> Vec<bool> {
        let mut out: Vec<bool> = Vec::with_capacity(self.body.len());
        for (i, inst) in self.body.iter().enumerate() {
            let r = self.row_level_with(inst, |j| j < i && out[j]);
            out.push(r);
        }
        out
    }

    /// Whether instruction `inst` is row-level: uniform along the reduce axes (see the module
    /// docs of [`crate::fused`]): a load whose strides on every reduce axis are 0, a constant, an
    /// index along a non-reduce axis, a reduction, or an op whose operands are all row-level.
    /// With no reduce axes every instruction is row-level. Fallback on a kernel that does not
    /// check: an instruction that does not exist, or uses one that does not, is full.
    pub fn is_row_level(&self, inst: usize) -> bool {
        if inst >= self.body.len() {
            return false;
        }
        self.row_levels()[inst]
    }

    /// Row-levelness of `inst`, given that of earlier instructions.
    pub(crate) fn row_level_with(&self, inst: &Inst, earlier: impl Fn(usize) -> bool) -> bool {
        match *inst {
            Inst::Load { input } => self.inputs.get(input).is_some_and(|x| {
                self.reduce_axes
                    .iter()
                    .all(|&a| x.access.strides.get(a) == Some(&0))
            }),
            Inst::Const { .. } | Inst::Reduce { .. } => true,
            Inst::Index { axis, .. } => !self.reduce_axes.contains(&axis),
            _ => {
                let (ops, n) = operands(inst);
                ops[..n].iter().all(|&o| earlier(o))
            }
        }
    }

    /// The dtype output `j` stores (`f32` if there is no such output).
    pub fn output_dtype(&self, j: usize) -> DType {
        self.outputs
            .get(j)
            .map_or(DType::F32, |o| self.dtype_of(o.value))
    }

    /// The shape output `j` is stored as, row-major: the domain, with every reduce axis taken as
    /// size 1 if the stored instruction is row-level. (The domain if there is no such output.)
    pub fn output_dims(&self, j: usize) -> Vec<usize> {
        self.output_dims_with(self.output_is_row(j))
    }

    /// Whether output `j` is stored at row level: the kernel has reduce axes and the stored
    /// instruction is row-level (false for an output that does not exist).
    fn output_is_row(&self, j: usize) -> bool {
        // Without reduce axes there is nothing to shrink: skip the walk over the body.
        !self.reduce_axes.is_empty()
            && self
                .outputs
                .get(j)
                .is_some_and(|o| self.is_row_level(o.value))
    }

    /// For every output, whether it is stored at row level (as [`FusedKernel::output_dims`]
    /// decides), in one walk over the body. Asking output by output walks the body each time,
    /// which is quadratic for a kernel with thousands of outputs; pass these to the `_with`
    /// methods instead.
    pub fn output_rows(&self) -> Vec<bool> {
        if self.reduce_axes.is_empty() {
            return vec![false; self.outputs.len()];
        }
        let rows = self.row_levels();
        self.outputs
            .iter()
            .map(|o| rows.get(o.value).copied().unwrap_or(false))
            .collect()
    }

    /// For every output, the dtype it stores (as [`FusedKernel::output_dtype`]), in one walk
    /// over the body; for the same reason as [`FusedKernel::output_rows`].
    pub fn output_dtypes(&self) -> Vec<DType> {
        let dtypes = self.dtypes();
        self.outputs
            .iter()
            .map(|o| dtypes.get(o.value).copied().unwrap_or(DType::F32))
            .collect()
    }

    /// [`FusedKernel::output_dims`], given [`FusedKernel::output_rows`]`()[j]`.
    pub fn output_dims_with(&self, row: bool) -> Vec<usize> {
        let mut dims = self.domain.clone();
        if row {
            for &a in &self.reduce_axes {
                if let Some(d) = dims.get_mut(a) {
                    *d = 1;
                }
            }
        }
        dims
    }

    /// Elements output `j` stores: the product of [`FusedKernel::output_dims`] (saturating at
    /// `usize::MAX` on a kernel whose domain is too large to check).
    pub fn output_len(&self, j: usize) -> usize {
        self.output_dims(j)
            .iter()
            .fold(1usize, |n, &d| n.saturating_mul(d))
    }

    /// Whether output `output` may be written over input `input` (take its memory): the output
    /// is full (or the kernel has no reduce axes), its dtype has the input's byte size, the input
    /// is read exactly at the output's own index (its access is
    /// [`Access::contiguous`](crate::fused::Access::contiguous) over the
    /// domain, offset 0) and holds exactly as many elements as the output. Executors write a full
    /// output in the last pass over each row, after every read of that row, so this is safe as
    /// long as no *other* input of the kernel is the same buffer. False for indices that do not
    /// exist.
    pub fn can_write_over(&self, input: usize, output: usize) -> bool {
        self.can_write_over_with(
            input,
            output,
            self.output_is_row(output),
            self.output_dtype(output),
        )
    }

    /// [`FusedKernel::can_write_over`], given [`FusedKernel::output_rows`]`()[output]` and
    /// [`FusedKernel::output_dtypes`]`()[output]`.
    pub fn can_write_over_with(
        &self,
        input: usize,
        output: usize,
        row: bool,
        dtype: DType,
    ) -> bool {
        let (Some(inp), Some(out)) = (self.inputs.get(input), self.outputs.get(output)) else {
            return false;
        };
        if out.value >= self.body.len() {
            return false;
        }
        // `inp.access == Access::contiguous(&self.domain)`, without overflowing on huge domains.
        let mut contiguous =
            inp.access.offset == 0 && inp.access.strides.len() == self.domain.len();
        let mut stride = 1usize;
        for (s, &d) in inp.access.strides.iter().zip(&self.domain).rev() {
            contiguous &= *s == stride;
            stride = stride.wrapping_mul(d);
        }
        let len = self
            .output_dims_with(row)
            .iter()
            .fold(1usize, |n, &d| n.saturating_mul(d));
        !row && inp.dtype.size() == dtype.size() && contiguous && inp.len == len
    }
}

fn write_list(f: &mut fmt::Formatter<'_>, xs: &[usize]) -> fmt::Result {
    f.write_str("[")?;
    for (i, x) in xs.iter().enumerate() {
        if i > 0 {
            f.write_str(",")?;
        }
        write!(f, "{x}")?;
    }
    f.write_str("]")
}

/// A compact listing, one line per input, instruction and output, e.g. for softmax:
/// ```text
/// fused domain=[4,8] reduce=[1]
///   in0 = f32[32] offset=0 strides=[8,1]
///   %0 = load(in0) : f32 full
///   %1 = reduce_max(%0) : f32 row
///   %2 = sub(%0, %1) : f32 full
///   %3 = exp(%2) : f32 full
///   %4 = reduce_sum(%3) : f32 row
///   %5 = div(%3, %4) : f32 full
///   out0 = %5 : f32[4,8]
/// ```
/// Constants print with `{:?}` (`1.0`, `-0.0`, `NaN`, `inf`). The text is a deterministic
/// function of the kernel, and printing never panics, even for a kernel that does not check.
impl fmt::Display for FusedKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dtypes = self.dtypes();
        let rows = self.row_levels();
        f.write_str("fused domain=")?;
        write_list(f, &self.domain)?;
        f.write_str(" reduce=")?;
        write_list(f, &self.reduce_axes)?;
        writeln!(f)?;
        for (n, inp) in self.inputs.iter().enumerate() {
            write!(
                f,
                "  in{n} = {}[{}] offset={} strides=",
                inp.dtype, inp.len, inp.access.offset
            )?;
            write_list(f, &inp.access.strides)?;
            writeln!(f)?;
        }
        for (i, inst) in self.body.iter().enumerate() {
            write!(f, "  %{i} = ")?;
            match *inst {
                Inst::Load { input } => write!(f, "load(in{input})")?,
                Inst::Const { value, .. } => write!(f, "const({value:?})")?,
                Inst::Index { axis, .. } => write!(f, "index(axis={axis})")?,
                Inst::Unary { op, x } => write!(f, "{}(%{x})", op.name())?,
                Inst::Binary { op, a, b } => write!(f, "{}(%{a}, %{b})", op.name())?,
                Inst::Compare { op, a, b } => write!(f, "{}(%{a}, %{b})", op.name())?,
                Inst::Select { cond, a, b } => write!(f, "select(%{cond}, %{a}, %{b})")?,
                Inst::Convert { x, .. } => write!(f, "convert(%{x})")?,
                Inst::Reduce { op, x } => write!(f, "{}(%{x})", reduce_name(op))?,
            }
            let level = if rows[i] { "row" } else { "full" };
            writeln!(f, " : {} {level}", dtypes[i])?;
        }
        for (j, out) in self.outputs.iter().enumerate() {
            write!(f, "  out{j} = %{} : {}", out.value, self.output_dtype(j))?;
            write_list(f, &self.output_dims(j))?;
            writeln!(f)?;
        }
        Ok(())
    }
}
