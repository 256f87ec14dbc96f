//! A reduction kernel whose full outputs read its reductions, split into a chain of kernels:
//! for each stage of reductions a partial kernel and a finish kernel ([`super::split`]), then
//! an elementwise **apply** kernel that makes the full outputs from the finished row values.
//!
//! Batch norm is the case: over NCHW activations its statistics reduce axes `[0, 2, 3]` (a
//! row a channel, 64 channels of 401,408 terms in a ResNet-50 at 224x224 and batch 128), and
//! its forward normalizes every element with the batch's mean and variance, its backward makes
//! `dx` from the sums of `dy` and `dy·x̂`. One kernel gives each channel one block, and 64
//! blocks leave most of a GPU idle while each walks its channel two or three times. The
//! ordinary split ([`super::split::splittable`]) refuses such a kernel: a full value that
//! reads a reduction would need the finished reduction inside the partial kernel.
//!
//! Here the reductions are cut by **stage** (a reduction's stage is one more than the largest
//! of the reductions it reads: a variance around the mean is stage 2). Stage `s` is a kernel
//! that computes only the stage-`s` reductions, reading each earlier reduction from the
//! scratch row buffer its stage's finish kernel wrote; having only first-stage reductions and
//! no full outputs, it splits as [`super::split::split`] splits (partials over `ways` slices
//! of one reduce axis, then a finish that folds them in a fixed order: deterministic, no
//! atomics). The last stage's finish also writes the original's row-level outputs. The apply
//! kernel has the original's domain and no reduce axes, loads every reduction it needs from
//! scratch, and writes every full output: every full output is written after the last read
//! of any input, so an output the planner lays over an input
//! ([`FusedKernel::can_write_over`]) is as safe as in the one kernel.
//!
//! Before it is cut, a sum that reads a reduction is computed from sums of the stage before
//! where its operand is a linear combination of them ([`super::distribute`]): batch norm's
//! backward, as autodiff writes it, then has one stage, not two.
//!
//! Row-level arithmetic after a reduction (a mean from a sum, `rsqrt(var + eps)`) is
//! recomputed by each kernel that needs it, from the stored reductions, by the same
//! instructions: the values are the original's, up to the order the partials are folded in.

use super::distribute::{distributed, stages};
use super::split::{needed, renamed, split, FinishInput, SplitOutput};
use super::{Access, FusedKernel, Input, Inst, Output};
use crate::DType;

/// A buffer a pass of a [`Staged`] kernel reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buffer {
    /// The original kernel's input `n`.
    Input(usize),
    /// The original kernel's output `j`.
    Output(usize),
    /// Scratch buffer `s` of [`Staged::scratch`].
    Scratch(usize),
}

/// One kernel of the chain: its inputs and outputs in order, where each lies.
#[derive(Clone, Debug, PartialEq)]
pub struct Pass {
    pub kernel: FusedKernel,
    pub inputs: Vec<Buffer>,
    pub outputs: Vec<Buffer>,
}

/// A scratch buffer only the chain uses: a finished reduction (a row buffer) or partials.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScratchBuffer {
    pub dtype: DType,
    /// Elements.
    pub len: usize,
}

/// A kernel split by stages (see the module docs): its passes, run in order, mean what the
/// original means.
#[derive(Clone, Debug, PartialEq)]
pub struct Staged {
    pub passes: Vec<Pass>,
    pub scratch: Vec<ScratchBuffer>,
}

/// What a kernel of the chain is cut from: the original, its dtypes, where each reduction's
/// finished value lies, and the access that reads a row buffer over the domain.
struct Cutter<'a> {
    k: &'a FusedKernel,
    dt: Vec<DType>,
    slot: Vec<usize>,
    row_input: Input,
}

impl Cutter<'_> {
    /// The kernel over the original's domain with `reduce_axes` that computes `roots`, every
    /// reduction `stored` says is a load of its scratch row buffer; with where its inputs lie.
    fn cut(
        &self,
        roots: &[usize],
        stored: impl Fn(usize) -> bool,
        reduce_axes: Vec<usize>,
    ) -> (FusedKernel, Vec<Buffer>) {
        let k = self.k;
        let stop: Vec<bool> = (0..k.body.len())
            .map(|i| matches!(k.body[i], Inst::Reduce { .. }) && stored(i))
            .collect();
        let need = needed(k, roots.iter().copied(), &stop);
        let (mut inputs, mut buffers) = (Vec::new(), Vec::<Buffer>::new());
        let mut input_of = |b: Buffer, input: Input| match buffers.iter().position(|&x| x == b) {
            Some(n) => n,
            None => {
                buffers.push(b);
                inputs.push(input);
                inputs.len() - 1
            }
        };
        let mut map = vec![usize::MAX; k.body.len()];
        let mut body = Vec::new();
        for (i, inst) in k.body.iter().enumerate() {
            if !need[i] {
                continue;
            }
            let inst = if stop[i] {
                let input = Input {
                    dtype: self.dt[i],
                    ..self.row_input.clone()
                };
                Inst::Load {
                    input: input_of(Buffer::Scratch(self.slot[i]), input),
                }
            } else if let Inst::Load { input } = *inst {
                Inst::Load {
                    input: input_of(Buffer::Input(input), k.inputs[input].clone()),
                }
            } else {
                renamed(inst, &map)
            };
            body.push(inst);
            map[i] = body.len() - 1;
        }
        let kernel = FusedKernel {
            domain: k.domain.clone(),
            reduce_axes,
            inputs,
            body,
            outputs: roots.iter().map(|&r| Output { value: map[r] }).collect(),
        };
        (kernel, buffers)
    }
}

/// Splits `k` by stages along reduce axis `axis` in `ways` slices (see the module docs);
/// `None` where it does not check, has no live reduction, `ways < 2`, the axis is not a
/// reduce axis of a size that is a multiple of `ways`, or a stage does not split along it
/// ([`super::split::splittable`]: an index instruction reads the axis).
pub fn staged(k: &FusedKernel, axis: usize, ways: usize) -> Option<Staged> {
    // Sums of linear combinations of values that read sums, taken apart where that saves a
    // stage: a partial kernel, a finish and a pass over the inputs fewer.
    let taken_apart = distributed(k);
    let k = taken_apart.as_ref().unwrap_or(k);
    if k.check().is_err()
        || !k.reduce_axes.contains(&axis)
        || ways < 2
        || !k.domain[axis].is_multiple_of(ways)
    {
        return None;
    }
    let all = vec![false; k.body.len()];
    let live = needed(k, k.outputs.iter().map(|o| o.value), &all);
    let stage = stages(k);
    let reductions: Vec<usize> = (0..k.body.len())
        .filter(|&i| live[i] && matches!(k.body[i], Inst::Reduce { .. }))
        .collect();
    let last = reductions.iter().map(|&r| stage[r]).max()?;
    let row_dims = k.output_dims_with(true);
    let mut row_access = Access::contiguous(&row_dims);
    for &a in &k.reduce_axes {
        row_access.strides[a] = 0;
    }
    let row_len: usize = row_dims.iter().product();
    let dt = k.dtypes();
    let mut scratch = Vec::new();
    let mut slot = vec![usize::MAX; k.body.len()];
    for &r in &reductions {
        slot[r] = scratch.len();
        scratch.push(ScratchBuffer {
            dtype: dt[r],
            len: row_len,
        });
    }
    let cutter = Cutter {
        k,
        dt,
        slot,
        row_input: Input {
            dtype: DType::F32,
            len: row_len,
            access: row_access,
        },
    };
    let out_rows = k.output_rows();
    let mut passes = Vec::new();
    for s in 1..=last {
        // This stage's reductions into their row buffers; at the last, the row outputs too.
        let mut roots: Vec<(usize, Buffer)> = (reductions.iter())
            .filter(|&&r| stage[r] == s)
            .map(|&r| (r, Buffer::Scratch(cutter.slot[r])))
            .collect();
        if s == last {
            roots.extend(
                (0..k.outputs.len())
                    .filter(|&j| out_rows[j])
                    .map(|j| (k.outputs[j].value, Buffer::Output(j))),
            );
        }
        let values: Vec<usize> = roots.iter().map(|&(v, _)| v).collect();
        let (ks, ins) = cutter.cut(&values, |r| stage[r] < s, k.reduce_axes.clone());
        let sp = split(&ks, axis, ways)?;
        let mut partials = Vec::new();
        for (j, o) in sp.partial_outputs.iter().enumerate() {
            // A stage kernel has row-level outputs only: every partial output is scratch.
            if *o != SplitOutput::Scratch {
                return None;
            }
            partials.push(Buffer::Scratch(scratch.len()));
            scratch.push(ScratchBuffer {
                dtype: sp.partial.output_dtype(j),
                len: sp.partial.output_len(j),
            });
        }
        passes.push(Pass {
            kernel: sp.partial,
            inputs: ins.clone(),
            outputs: partials.clone(),
        });
        passes.push(Pass {
            kernel: sp.finish,
            inputs: (sp.finish_inputs.iter())
                .map(|f| match *f {
                    FinishInput::Partial(j) => partials[j],
                    FinishInput::Original(n) => ins[n],
                })
                .collect(),
            outputs: sp.finish_outputs.iter().map(|&t| roots[t].1).collect(),
        });
    }
    let full: Vec<usize> = (0..k.outputs.len()).filter(|&j| !out_rows[j]).collect();
    if !full.is_empty() {
        let values: Vec<usize> = full.iter().map(|&j| k.outputs[j].value).collect();
        let (kernel, inputs) = cutter.cut(&values, |_| true, Vec::new());
        passes.push(Pass {
            kernel,
            inputs,
            outputs: full.iter().map(|&j| Buffer::Output(j)).collect(),
        });
    }
    passes
        .iter()
        .all(|p| p.kernel.check().is_ok())
        .then_some(Staged { passes, scratch })
}

#[cfg(test)]
#[path = "staged_tests.rs"]
mod tests;
