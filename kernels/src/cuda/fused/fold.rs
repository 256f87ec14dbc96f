//! The fold stage of a reduction: combining the partials of the threads that share a row (shared
//! memory, warp shuffles, or both, as the layout decides). Its shared memory is declared here
//! too, so that the declaration and the one reader of each array are side by side.

use super::expr::{accumulate, reduce_op};
use super::layout::Layout;
use super::Analysis;
use crate::cuda::{reg_type, Src};
use crate::ReduceOp;

impl Analysis<'_> {
    /// Declares the shared memory the fold combines the reductions `reds` through (columns:
    /// a Y × X array each; blocks: a value a warp each; groups need none), and a block's lane
    /// and warp indices.
    pub(super) fn declare_fold(&self, src: &mut Src, lay: Layout, reds: &[usize]) {
        for &r in reds {
            let ty = reg_type(self.dt[r]);
            match lay {
                Layout::Columns { x, y } => src.line(format!("__shared__ {ty} sm{r}[{y}][{x}];")),
                Layout::Block { t } => src.line(format!("__shared__ {ty} sm{r}[{}];", t / 32)),
                Layout::Group { .. } => {}
            }
        }
        if let Layout::Block { .. } = lay {
            src.line("const unsigned lane = threadIdx.x & 31u;");
            src.line("const unsigned warp = threadIdx.x >> 5;");
        }
    }

    /// The fold stage of a reduction pass: combines the partials `a{r}` of the threads that
    /// share a row into every thread's `a{r}`, through shared memory across `threadIdx.y`
    /// (columns), through shuffles within a group of lanes (groups), or through shuffles then
    /// shared memory across warps (blocks). Each thread sums its own elements first (in the
    /// loop) so that only one partial a thread crosses threads.
    pub(super) fn fold(&self, src: &mut Src, lay: Layout, these: &[usize]) {
        let k = self.k;
        match lay {
            Layout::Columns { y, .. } => {
                for &r in these {
                    src.line(format!("sm{r}[threadIdx.y][threadIdx.x] = a{r};"));
                }
                src.line("__syncthreads();");
                for &r in these {
                    let op = reduce_op(&k.body[r]);
                    src.line(format!("a{r} = sm{r}[0][threadIdx.x];"));
                    src.line(format!(
                        "for (unsigned y = 1u; y < {y}u; ++y) {{ a{r} = {}; }}",
                        accumulate(
                            op,
                            self.dt[r],
                            &format!("a{r}"),
                            &format!("sm{r}[y][threadIdx.x]")
                        )
                    ));
                }
            }
            Layout::Group { w, .. } => {
                for &r in these {
                    src.line(format!(
                        "a{r} = {}(a{r}, {w});",
                        lanes_fn(reduce_op(&k.body[r]))
                    ));
                }
            }
            Layout::Block { t } => {
                for &r in these {
                    src.line(format!(
                        "a{r} = {}(a{r}, 32);",
                        lanes_fn(reduce_op(&k.body[r]))
                    ));
                }
                let writes: Vec<String> = these
                    .iter()
                    .map(|r| format!("sm{r}[warp] = a{r};"))
                    .collect();
                src.line(format!("if (lane == 0u) {{ {} }}", writes.join(" ")));
                src.line("__syncthreads();");
                let warps = t / 32;
                for &r in these {
                    let op = reduce_op(&k.body[r]);
                    src.line(format!("a{r} = sm{r}[0];"));
                    if warps > 1 {
                        src.line(format!(
                            "for (unsigned w = 1u; w < {warps}u; ++w) {{ a{r} = {}; }}",
                            accumulate(op, self.dt[r], &format!("a{r}"), &format!("sm{r}[w]"))
                        ));
                    }
                }
            }
        }
    }
}

/// The prelude's lane reduction for `op`.
pub(super) fn lanes_fn(op: ReduceOp) -> &'static str {
    match op {
        ReduceOp::Sum => "ig_lanes_sum",
        ReduceOp::Max => "ig_lanes_max",
    }
}
