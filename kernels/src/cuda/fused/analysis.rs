//! The analysis stage: what the generator knows about a checked kernel (each instruction's
//! dtype, whether it is row-level or full, live, its reduction stage) and the strategy it picks
//! from the domain alone, plus the pieces every strategy's text starts with (parameters,
//! header). Every later stage reads this and nothing else of the kernel's meaning, so that the
//! strategies cannot disagree about it.

use crate::cuda::emit::{c_type, list, signature, Ix, Src};
use crate::cuda::kernel::{Launch, Strategy, Tuning};
use crate::fused::check::operands;
use crate::fused::{FusedKernel, Inst};
use crate::DType;

/// Fewer rows than this use the row strategy even when the innermost axis is kept.
pub(super) const FEW_ROWS: usize = 64;

/// What the generator knows about a checked kernel.
pub(super) struct Analysis<'a> {
    pub(super) k: &'a FusedKernel,
    pub(super) dt: Vec<DType>,
    /// Row-level instructions (all of them in the elementwise case, where every value is
    /// computed per element).
    pub(super) row: Vec<bool>,
    pub(super) live: Vec<bool>,
    /// 0 for loads, constants and indices; a reduction's is its operand's plus one; an op's the
    /// largest of its operands'.
    pub(super) stage: Vec<usize>,
    pub(super) numel: usize,
    pub(super) rows: usize,
    /// Elements per row (the product of the reduce axes).
    pub(super) n: usize,
    pub(super) red_axis: Vec<bool>,
    /// Axes that a live index instruction reads: never merged with their neighbours.
    pub(super) pinned: Vec<bool>,
    pub(super) strategy: Strategy,
    pub(super) ix: Ix,
    /// Choices forced from outside (none by default).
    pub(super) tuning: Tuning,
    /// f32 division and exp by the hardware's approximations, `ig_fdiv` and `ig_exp` (a kernel
    /// holding bf16: see the `cuda` module docs, "bf16").
    pub(super) fast_math: bool,
}

impl<'a> Analysis<'a> {
    /// `k` must check.
    pub(super) fn new(k: &'a FusedKernel) -> Analysis<'a> {
        let rank = k.domain.len();
        let dims = &k.domain;
        let mut red_axis = vec![false; rank];
        for &a in &k.reduce_axes {
            red_axis[a] = true;
        }
        let numel = dims.iter().fold(1usize, |n, &d| n.saturating_mul(d));
        let rows = (0..rank)
            .filter(|&d| !red_axis[d])
            .fold(1usize, |n, d| n.saturating_mul(dims[d]));
        let n = k
            .reduce_axes
            .iter()
            .fold(1usize, |n, &a| n.saturating_mul(dims[a]));
        // Every reduce axis of size 1: a reduction is a copy, the kernel elementwise.
        let elementwise = k.reduce_axes.is_empty() || n == 1;
        let dt = k.dtypes();
        let row = if elementwise {
            vec![true; k.body.len()]
        } else {
            k.row_levels()
        };
        let mut live = vec![false; k.body.len()];
        for o in &k.outputs {
            live[o.value] = true;
        }
        for i in (0..k.body.len()).rev() {
            if live[i] {
                let (ops, c) = operands(&k.body[i]);
                for &o in &ops[..c] {
                    live[o] = true;
                }
            }
        }
        let mut stage = vec![0usize; k.body.len()];
        for (i, inst) in k.body.iter().enumerate() {
            let (ops, c) = operands(inst);
            let s = ops[..c].iter().map(|&o| stage[o]).max().unwrap_or(0);
            stage[i] = match inst {
                Inst::Reduce { .. } if !elementwise => s + 1,
                _ => s,
            };
        }
        let mut pinned = vec![false; rank];
        for (i, inst) in k.body.iter().enumerate() {
            if let Inst::Index { axis, .. } = *inst {
                if live[i] {
                    pinned[axis] = true;
                }
            }
        }
        let strategy = if elementwise {
            Strategy::Elementwise
        } else {
            match (0..rank).rev().find(|&d| dims[d] > 1) {
                Some(d) if red_axis[d] => Strategy::Rows,
                _ if rows < FEW_ROWS => Strategy::Rows,
                _ => Strategy::Columns,
            }
        };
        let ix = Ix::for_extents(
            [numel, rows]
                .into_iter()
                .chain(k.inputs.iter().map(|x| x.len)),
        );
        Analysis {
            k,
            dt,
            row,
            live,
            stage,
            numel,
            rows,
            n,
            red_axis,
            pinned,
            strategy,
            ix,
            tuning: Tuning::default(),
            fast_math: k.holds_bf16(),
        }
    }

    pub(super) fn params(&self) -> Vec<(String, String)> {
        let mut p = Vec::new();
        for (n, inp) in self.k.inputs.iter().enumerate() {
            p.push((format!("const {}*", c_type(inp.dtype)), format!("in{n}")));
        }
        for j in 0..self.k.outputs.len() {
            p.push((
                format!("{}*", c_type(self.k.output_dtype(j))),
                format!("out{j}"),
            ));
        }
        p
    }

    pub(super) fn header(&self, src: &mut Src, what: &str, launch: &Launch) {
        src.line(format!(
            "// ingot fused kernel ({}): domain {}, reduce axes {}; {what}",
            self.strategy.name(),
            list(&self.k.domain),
            list(&self.k.reduce_axes),
        ));
        src.line(format!(
            "// launch: grid [{},{},{}], block [{},{},{}]",
            launch.grid[0],
            launch.grid[1],
            launch.grid[2],
            launch.block[0],
            launch.block[1],
            launch.block[2]
        ));
    }

    /// A kernel with nothing to compute (an empty domain, no rows, no outputs).
    pub(super) fn empty(&self) -> (String, Launch) {
        let launch = Launch {
            grid: [1, 1, 1],
            block: [32, 1, 1],
            shared_bytes: 0,
        };
        let mut src = Src::default();
        self.header(&mut src, "nothing to compute", &launch);
        src.open(signature(32, &self.params()));
        src.line("// every output is empty");
        src.close();
        (src.text, launch)
    }

    /// Live loads: one stride vector per input they read (in input order).
    pub(super) fn loaded_inputs(&self, pred: impl Fn(usize) -> bool) -> Vec<bool> {
        let mut used = vec![false; self.k.inputs.len()];
        for (i, inst) in self.k.body.iter().enumerate() {
            if let Inst::Load { input } = *inst {
                if self.live[i] && pred(i) {
                    used[input] = true;
                }
            }
        }
        used
    }

    pub(super) fn has_full_outputs(&self) -> bool {
        self.k.outputs.iter().any(|o| !self.row[o.value])
    }

    /// The first live load instruction of input `n` (its dtype is the input's).
    pub(super) fn input_load(&self, n: usize) -> usize {
        (0..self.k.body.len())
            .find(|&i| self.live[i] && matches!(self.k.body[i], Inst::Load { input } if input == n))
            .expect("a staged input has a live load")
    }

    /// The full instructions `roots` need (themselves included where full), in body order.
    pub(super) fn full_closure(&self, roots: &[usize]) -> Vec<usize> {
        let nb = self.k.body.len();
        let mut mark = vec![false; nb];
        for &r in roots {
            if !self.row[r] {
                mark[r] = true;
            }
        }
        for i in (0..nb).rev() {
            if mark[i] {
                let (ops, c) = operands(&self.k.body[i]);
                for &o in &ops[..c] {
                    if !self.row[o] {
                        mark[o] = true;
                    }
                }
            }
        }
        (0..nb).filter(|&i| mark[i]).collect()
    }
}
