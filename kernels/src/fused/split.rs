//! A reduction split in two kernels: the first folds `ways` slices of the rows each reducing
//! row covers into partials, the second folds the partials and finishes.
//!
//! A column reduction (bias and LayerNorm-gain gradients: 768 sums over 8,192 tokens) has
//! few rows and long ones; a kernel that gives each row to one group of threads runs on a
//! few dozen blocks and leaves most of a GPU idle. Splitting one reduce axis `a` of size
//! `ways × q` into `(ways, q)` and keeping the `ways` axis makes `ways` times as many rows,
//! each `ways` times shorter: the **partial** kernel. Its row-level outputs (one partial a
//! reduction, a row) are the **finish** kernel's inputs, which folds them along the `ways`
//! axis and computes what the original computed from its reductions.
//!
//! Both are ordinary [`FusedKernel`]s, so every executor runs them as it runs any kernel, and
//! the pair means what the original means up to the order its sums are combined in (which the
//! kernel contract leaves to executors other than the CPU's). Bf16 reductions carry f32
//! partials, converted once at the end, as a single bf16 reduction accumulates in f32 and
//! rounds once.
//!
//! Only kernels whose reductions all read stage-0 values and whose full values do not read a
//! reduction split (one pass over the rows, then row-level arithmetic): a full value that
//! needs a reduction would need the finished reduction inside the partial kernel.

use super::check::operands;
use super::{Access, FusedKernel, Input, Inst, Output};
use crate::DType;

/// Where a finish kernel's input comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishInput {
    /// The partial kernel's output `j` (a partial, row-level over its domain).
    Partial(usize),
    /// The original kernel's input `n`.
    Original(usize),
}

/// Where a kernel of the pair writes its output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitOutput {
    /// Scratch only the pair uses: a partial.
    Scratch,
    /// The original kernel's output `j`.
    Original(usize),
}

/// The two kernels of a split reduction and how their buffers map to the original's.
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    /// Inputs: the original's, in order. Outputs: `partial_outputs`.
    pub partial: FusedKernel,
    pub partial_outputs: Vec<SplitOutput>,
    /// Inputs: `finish_inputs`. Outputs: the original's outputs `finish_outputs[j]`.
    pub finish: FusedKernel,
    pub finish_inputs: Vec<FinishInput>,
    pub finish_outputs: Vec<usize>,
}

/// Whether each instruction depends on a reduction (is one, or reads one).
fn after_reduction(k: &FusedKernel) -> Vec<bool> {
    let mut after = vec![false; k.body.len()];
    for (i, inst) in k.body.iter().enumerate() {
        let (ops, n) = operands(inst);
        after[i] = matches!(inst, Inst::Reduce { .. }) || ops[..n].iter().any(|&o| after[o]);
    }
    after
}

/// Marks every instruction `roots` need, stopping at instructions `stop` says to (marked, not
/// followed).
pub(super) fn needed(
    k: &FusedKernel,
    roots: impl IntoIterator<Item = usize>,
    stop: &[bool],
) -> Vec<bool> {
    let mut need = vec![false; k.body.len()];
    for r in roots {
        need[r] = true;
    }
    for i in (0..k.body.len()).rev() {
        if need[i] && !stop[i] {
            let (ops, n) = operands(&k.body[i]);
            for &o in &ops[..n] {
                need[o] = true;
            }
        }
    }
    need
}

/// Whether `k` can be split along reduce axis `axis` (see the module docs): it checks, `axis`
/// is a reduce axis that no live index instruction reads, no reduction reads another and no
/// full value reads a reduction.
pub fn splittable(k: &FusedKernel, axis: usize) -> bool {
    if k.check().is_err() || !k.reduce_axes.contains(&axis) {
        return false;
    }
    let rows = k.row_levels();
    let after = after_reduction(k);
    let live = needed(
        k,
        k.outputs.iter().map(|o| o.value),
        &vec![false; k.body.len()],
    );
    k.body.iter().enumerate().all(|(i, inst)| {
        if !live[i] {
            return true;
        }
        let (ops, n) = operands(inst);
        match *inst {
            Inst::Index { axis: a, .. } => a != axis,
            Inst::Reduce { x, .. } => !after[x],
            _ => rows[i] || !ops[..n].iter().any(|&o| after[o]),
        }
    })
}

/// Copies instruction `inst` with its operands renamed by `map`.
pub(super) fn renamed(inst: &Inst, map: &[usize]) -> Inst {
    let mut inst = inst.clone();
    match &mut inst {
        Inst::Load { .. } | Inst::Const { .. } | Inst::Index { .. } => {}
        Inst::Unary { x, .. } | Inst::Convert { x, .. } | Inst::Reduce { x, .. } => *x = map[*x],
        Inst::Binary { a, b, .. } | Inst::Compare { a, b, .. } => {
            *a = map[*a];
            *b = map[*b];
        }
        Inst::Select { cond, a, b } => {
            *cond = map[*cond];
            *a = map[*a];
            *b = map[*b];
        }
    }
    inst
}

/// The dtype a reduction's partials carry: f32 for bf16 (accumulated as one bf16 reduction
/// accumulates), its own otherwise.
fn partial_dtype(d: DType) -> DType {
    match d {
        DType::BF16 => DType::F32,
        d => d,
    }
}

/// Splits `k` along reduce axis `axis` in `ways` slices (see the module docs); `None` where
/// it is not [`splittable`] there, `ways < 2` or the axis's size is not a multiple of `ways`.
pub fn split(k: &FusedKernel, axis: usize, ways: usize) -> Option<Split> {
    if !splittable(k, axis) || ways < 2 || !k.domain[axis].is_multiple_of(ways) {
        return None;
    }
    let q = k.domain[axis] / ways;
    let dt = k.dtypes();
    let rows = k.row_levels();
    let out_rows = k.output_rows();

    // The partial kernel: axis `axis` becomes (ways, q), q reduced.
    let moved = |d: usize| if d < axis { d } else { d + 1 };
    let mut domain = k.domain.clone();
    domain[axis] = q;
    domain.insert(axis, ways);
    let reduce_axes: Vec<usize> = k.reduce_axes.iter().map(|&d| moved(d)).collect();
    let inputs: Vec<Input> = (k.inputs.iter())
        .map(|inp| {
            let mut strides = inp.access.strides.clone();
            let s = strides[axis];
            strides[axis] = s * q;
            strides.insert(axis + 1, s);
            Input {
                access: Access {
                    offset: inp.access.offset,
                    strides,
                },
                ..inp.clone()
            }
        })
        .collect();
    let full_outputs: Vec<usize> = (0..k.outputs.len()).filter(|&j| !out_rows[j]).collect();
    let reductions: Vec<usize> = {
        let live = needed(
            k,
            k.outputs.iter().map(|o| o.value),
            &vec![false; k.body.len()],
        );
        (0..k.body.len())
            .filter(|&i| live[i] && matches!(k.body[i], Inst::Reduce { .. }))
            .collect()
    };
    let roots = reductions
        .iter()
        .copied()
        .chain(full_outputs.iter().map(|&j| k.outputs[j].value));
    let need = needed(k, roots, &vec![false; k.body.len()]);
    let mut map = vec![usize::MAX; k.body.len()];
    let mut body = Vec::new();
    for (i, inst) in k.body.iter().enumerate() {
        if !need[i] {
            continue;
        }
        let inst = match *inst {
            Inst::Index { axis: a, dtype } => Inst::Index {
                axis: moved(a),
                dtype,
            },
            Inst::Reduce { op, x } if partial_dtype(dt[i]) != dt[i] => {
                body.push(Inst::Convert {
                    x: map[x],
                    to: partial_dtype(dt[i]),
                });
                Inst::Reduce {
                    op,
                    x: body.len() - 1,
                }
            }
            ref inst => renamed(inst, &map),
        };
        body.push(inst);
        map[i] = body.len() - 1;
    }
    let mut outputs: Vec<Output> = (reductions.iter())
        .map(|&r| Output { value: map[r] })
        .collect();
    let mut partial_outputs = vec![SplitOutput::Scratch; reductions.len()];
    for &j in &full_outputs {
        outputs.push(Output {
            value: map[k.outputs[j].value],
        });
        partial_outputs.push(SplitOutput::Original(j));
    }
    let partial = FusedKernel {
        domain,
        reduce_axes,
        inputs,
        body,
        outputs,
    };

    // The finish kernel: the original's domain with `axis` of size `ways`, every other reduce
    // axis of size 1; the partials are contiguous over it.
    let mut domain = k.domain.clone();
    for &a in &k.reduce_axes {
        domain[a] = 1;
    }
    domain[axis] = ways;
    let row_outputs: Vec<usize> = (0..k.outputs.len()).filter(|&j| out_rows[j]).collect();
    let is_reduce: Vec<bool> = (k.body.iter())
        .map(|i| matches!(i, Inst::Reduce { .. }))
        .collect();
    let need = needed(
        k,
        row_outputs.iter().map(|&j| k.outputs[j].value),
        &is_reduce,
    );
    let mut inputs = Vec::new();
    let mut finish_inputs = Vec::new();
    let mut input_of = vec![usize::MAX; k.inputs.len()];
    let mut map = vec![usize::MAX; k.body.len()];
    let mut body = Vec::new();
    for (i, inst) in k.body.iter().enumerate() {
        if !need[i] {
            continue;
        }
        debug_assert!(rows[i], "the finish kernel computes row-level values only");
        match *inst {
            Inst::Reduce { op, .. } => {
                let j = reductions.iter().position(|&r| r == i)?;
                inputs.push(Input {
                    dtype: partial_dtype(dt[i]),
                    len: domain.iter().product(),
                    access: Access::contiguous(&domain),
                });
                finish_inputs.push(FinishInput::Partial(j));
                body.push(Inst::Load {
                    input: inputs.len() - 1,
                });
                body.push(Inst::Reduce {
                    op,
                    x: body.len() - 1,
                });
                if partial_dtype(dt[i]) != dt[i] {
                    body.push(Inst::Convert {
                        x: body.len() - 1,
                        to: dt[i],
                    });
                }
            }
            Inst::Load { input } => {
                if input_of[input] == usize::MAX {
                    inputs.push(k.inputs[input].clone());
                    finish_inputs.push(FinishInput::Original(input));
                    input_of[input] = inputs.len() - 1;
                }
                body.push(Inst::Load {
                    input: input_of[input],
                });
            }
            ref inst => body.push(renamed(inst, &map)),
        }
        map[i] = body.len() - 1;
    }
    let finish = FusedKernel {
        domain,
        reduce_axes: k.reduce_axes.clone(),
        inputs,
        body,
        outputs: (row_outputs.iter())
            .map(|&j| Output {
                value: map[k.outputs[j].value],
            })
            .collect(),
    };
    let s = Split {
        partial,
        partial_outputs,
        finish,
        finish_inputs,
        finish_outputs: row_outputs,
    };
    (s.partial.check().is_ok() && s.finish.check().is_ok()).then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fused::cpu::run_buffers;
    use crate::fused::random::{self, f32_bytes, f32s};
    use crate::{BinaryOp, ReduceOp};

    /// Runs the pair on the CPU: the partial kernel, then the finish kernel on its partials,
    /// each output gathered where the original would have written it.
    fn run_split(s: &Split, inputs: &[&[u8]], outputs: usize) -> Vec<Vec<u8>> {
        let part = run_buffers(&s.partial, inputs).unwrap();
        let fin_in: Vec<&[u8]> = (s.finish_inputs.iter())
            .map(|f| match *f {
                FinishInput::Partial(j) => &part[j][..],
                FinishInput::Original(n) => inputs[n],
            })
            .collect();
        let fin = run_buffers(&s.finish, &fin_in).unwrap();
        let mut out = vec![Vec::new(); outputs];
        for (j, o) in s.partial_outputs.iter().enumerate() {
            if let SplitOutput::Original(t) = *o {
                out[t] = part[j].clone();
            }
        }
        for (j, &t) in s.finish_outputs.iter().enumerate() {
            out[t] = fin[j].clone();
        }
        out
    }

    /// `sum_rows(dy * (x - mean) * rstd)` over `[b, t, c]` (a LayerNorm gain's gradient),
    /// and `dy * 2` beside it (a full output).
    fn gain_gradient(b: usize, t: usize, c: usize) -> FusedKernel {
        let dims = [b, t, c];
        let per_token = Access {
            offset: 0,
            strides: vec![t, 1, 0],
        };
        FusedKernel {
            domain: dims.to_vec(),
            reduce_axes: vec![0, 1],
            inputs: vec![
                Input {
                    dtype: DType::F32,
                    len: b * t * c,
                    access: Access::contiguous(&dims),
                },
                Input {
                    dtype: DType::F32,
                    len: b * t * c,
                    access: Access::contiguous(&dims),
                },
                Input {
                    dtype: DType::F32,
                    len: b * t,
                    access: per_token,
                },
            ],
            body: vec![
                Inst::Load { input: 0 },
                Inst::Load { input: 1 },
                Inst::Load { input: 2 },
                Inst::binary(BinaryOp::Mul, 1, 2),
                Inst::binary(BinaryOp::Mul, 0, 3),
                Inst::Reduce {
                    op: ReduceOp::Sum,
                    x: 4,
                },
                Inst::binary(BinaryOp::Add, 0, 0),
            ],
            outputs: vec![Output { value: 5 }, Output { value: 6 }],
        }
    }

    #[test]
    fn a_split_column_reduction_sums_what_the_whole_one_sums() {
        let (b, t, c) = (2, 12, 5);
        let k = gain_gradient(b, t, c);
        let s = split(&k, 1, 4).expect("splits along the token axis");
        assert_eq!(s.partial.domain, vec![2, 4, 3, 5]);
        assert_eq!(s.partial.reduce_axes, vec![0, 2]);
        assert_eq!(s.finish.domain, vec![1, 4, 5]);
        let xs: Vec<Vec<u8>> = [b * t * c, b * t * c, b * t]
            .iter()
            .enumerate()
            .map(|(n, &len)| {
                f32_bytes(
                    &(0..len)
                        .map(|i| ((i * 7 + n * 3) % 11) as f32 * 0.25 - 1.0)
                        .collect::<Vec<_>>(),
                )
            })
            .collect();
        let ins: Vec<&[u8]> = xs.iter().map(|x| &x[..]).collect();
        let whole = run_buffers(&k, &ins).unwrap();
        let pair = run_split(&s, &ins, 2);
        // The full output is the same computation; the sums are of quarters: exact in any order.
        assert_eq!(pair, whole);
        assert_eq!(f32s(&pair[0]).len(), c);
    }

    #[test]
    fn a_kernel_whose_full_values_read_a_reduction_does_not_split() {
        let mut k = gain_gradient(2, 8, 3);
        // dy * sum: a full value after the reduction (a softmax-like second pass).
        k.body.push(Inst::binary(BinaryOp::Mul, 0, 5));
        k.outputs.push(Output { value: 7 });
        assert!(k.check().is_ok());
        assert!(!splittable(&k, 1));
        assert_eq!(split(&k, 1, 2), None);
    }

    #[test]
    fn a_split_needs_a_reduce_axis_a_multiple_of_its_ways_and_no_index_along_it() {
        let k = gain_gradient(2, 12, 5);
        assert!(split(&k, 2, 5).is_none(), "axis 2 is not reduced");
        assert!(split(&k, 1, 5).is_none(), "12 is not a multiple of 5");
        assert!(split(&k, 1, 1).is_none(), "one way is no split");
        // The gain gradient's sum with each term scaled by its token's index.
        let mut k = gain_gradient(2, 12, 5);
        k.body.truncate(5);
        k.body.extend([
            Inst::Index {
                axis: 1,
                dtype: DType::F32,
            },
            Inst::binary(BinaryOp::Mul, 4, 5),
            Inst::Reduce {
                op: ReduceOp::Sum,
                x: 6,
            },
        ]);
        k.outputs = vec![Output { value: 7 }];
        assert!(k.check().is_ok());
        assert!(split(&k, 1, 4).is_none(), "the index along the split axis");
        assert!(split(&k, 0, 2).is_some(), "another reduce axis splits");
    }

    /// Random kernels whose integer results do not depend on float rounding
    /// (`Options::exact`), on values that are multiples of 1/8 in [-4, 4], split along every
    /// reduce axis they split along: integers and bools equal the whole kernel's, floats
    /// within the rounding of sums combined in another order.
    #[test]
    fn every_random_kernel_that_splits_computes_what_the_whole_kernel_computes() {
        let mut tried = 0;
        random::each_split_axis(4000, |seed, k, axis, ways, ins| {
            let Some(s) = split(k, axis, ways) else {
                return;
            };
            tried += 1;
            let whole = run_buffers(k, ins).unwrap();
            let pair = run_split(&s, ins, k.outputs.len());
            let what = format!("seed {seed} axis {axis} ways {ways}");
            random::assert_outputs_match(k, &whole, &pair, &what, "split");
        });
        assert!(tried >= 100, "only {tried} random kernels split");
    }
}
