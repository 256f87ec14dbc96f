//! What to run: the kernels of a graph, or given ones, as work items.

use ingot_compiler::ir::{Graph, Op};
use ingot_kernels::cuda::{self, CudaKernel, FusedProgram};
use ingot_kernels::fused::FusedKernel;
use ingot_kernels::DType;

/// What the check's steps return: an error is a message naming the kernel and what failed.
pub(super) type Res<T> = Result<T, String>;
/// (dtype, elements) of each buffer.
pub(super) type Shapes = Vec<(DType, usize)>;

/// One kernel to check.
#[derive(Clone, Debug)]
pub enum Work {
    Fused(Box<FusedKernel>),
    Gather {
        table: DType,
        ids: DType,
        rows: usize,
        row_len: usize,
        n: usize,
    },
    Scatter {
        op: cuda::ScatterAdd,
        /// Ids drawn log-uniformly (as words in text: id 0 at about 6% of the positions),
        /// not uniformly.
        skewed: bool,
    },
    Concat {
        dtype: DType,
        outer: usize,
        widths: Vec<usize>,
    },
    /// `dropout(x [n], seed)` (its CPU reference: `ingot_kernels::rng`, bf16 widened).
    Dropout {
        dtype: DType,
        n: usize,
        p: f64,
        salt: u64,
    },
}

/// A distinct kernel to check, generated: the launches that compute it (one, or a split
/// column reduction's two, [`cuda::fused_program`]).
pub struct Item {
    pub program: FusedProgram,
    /// The same work generated otherwise, and how (`variants`).
    pub variants: Vec<(String, CudaKernel)>,
    pub work: Work,
    /// Where it came from ("gpt2 x12").
    pub origin: String,
}

impl Item {
    /// The first launch's kernel (the only one, unless the work is split).
    pub fn kernel(&self) -> &CudaKernel {
        &self.program.launches[0].kernel
    }

    /// The names of its launches' kernels, joined: what makes two items the same.
    pub(super) fn name(&self) -> String {
        name_of(&self.program)
    }
}

pub(super) fn name_of(p: &FusedProgram) -> String {
    let names: Vec<&str> = p.launches.iter().map(|l| l.kernel.name.as_str()).collect();
    names.join("+")
}

impl Work {
    /// The launches that run this work: a fused kernel's program, scatter-add's three, or one
    /// kernel.
    pub(super) fn generate(&self) -> Res<FusedProgram> {
        let one = |k: Result<CudaKernel, cuda::CodegenError>| {
            let (ins, outs) = self.buffers();
            k.map(|k| FusedProgram::one(k, ins.len(), outs.len()))
        };
        let r = match self {
            Work::Fused(k) => cuda::fused_program(k),
            Work::Scatter { op, .. } => op.program(),
            Work::Gather {
                table,
                ids,
                rows,
                row_len,
                n,
            } => one(cuda::gather(*table, *ids, *rows, *row_len, *n)),
            Work::Concat {
                dtype,
                outer,
                widths,
            } => one(cuda::concat(*dtype, *outer, widths)),
            Work::Dropout { dtype, n, p, salt } => one(cuda::dropout(*dtype, *n, *p, *salt)),
        };
        r.map_err(|e| e.to_string())
    }

    pub(super) fn kind(&self) -> &'static str {
        match self {
            Work::Fused(_) => "fused",
            Work::Gather { .. } => "gather",
            Work::Scatter { .. } => "scatter_add",
            Work::Concat { .. } => "concat",
            Work::Dropout { .. } => "dropout",
        }
    }

    /// Domain, reduce axes and strategy, in words.
    pub(super) fn shape(&self) -> String {
        match self {
            Work::Fused(k) => format!(
                "domain {:?} reduce {:?} {}",
                k.domain,
                k.reduce_axes,
                cuda::strategy(k).map_or("?", |s| s.name())
            ),
            Work::Gather {
                rows, row_len, n, ..
            } => format!("{n} ids into [{rows},{row_len}]"),
            Work::Scatter { op, skewed } => format!(
                "{} rows of {} into {}{}",
                op.n,
                op.row_len,
                op.rows,
                if *skewed { ", skewed ids" } else { "" }
            ),
            Work::Concat { outer, widths, .. } => format!("[{outer}, {widths:?}]"),
            Work::Dropout { n, p, .. } => format!("{n} elements, p {p}"),
        }
    }

    /// (dtype, elements) of each input and each output, in parameter order.
    pub(super) fn buffers(&self) -> (Shapes, Shapes) {
        match self {
            Work::Fused(k) => (
                k.inputs.iter().map(|i| (i.dtype, i.len)).collect(),
                (0..k.outputs.len())
                    .map(|j| (k.output_dtype(j), k.output_len(j)))
                    .collect(),
            ),
            Work::Gather {
                table,
                ids,
                rows,
                row_len,
                n,
            } => (
                vec![(*table, rows * row_len), (*ids, *n)],
                vec![(*table, n * row_len)],
            ),
            Work::Scatter { op, .. } => (
                vec![(op.ids, op.n), (op.values, op.n * op.row_len)],
                vec![(op.out, op.rows * op.row_len)],
            ),
            Work::Concat {
                dtype,
                outer,
                widths,
            } => (
                widths.iter().map(|w| (*dtype, outer * w)).collect(),
                vec![(*dtype, outer * widths.iter().sum::<usize>())],
            ),
            Work::Dropout { dtype, n, .. } => {
                (vec![(*dtype, *n), (DType::I64, 1)], vec![(*dtype, *n)])
            }
        }
    }
}

/// Every fused kernel, gather, scatter-add and concat of a compiled graph.
pub fn collect(graph: &Graph) -> Vec<Work> {
    let mut out = Vec::new();
    for node in graph.nodes() {
        match &node.op {
            Op::Fused(k) => out.push(Work::Fused(k.clone())),
            Op::Gather => {
                let (table, ids) = (graph.ty(node.inputs[0]), graph.ty(node.inputs[1]));
                let dims = table.shape.dims();
                out.push(Work::Gather {
                    table: table.dtype,
                    ids: ids.dtype,
                    rows: dims.first().copied().unwrap_or(1),
                    row_len: dims.iter().skip(1).product(),
                    n: ids.shape.numel(),
                });
            }
            Op::ScatterAdd { rows } => {
                let (ids, values) = (graph.ty(node.inputs[0]), graph.ty(node.inputs[1]));
                let n = ids.shape.numel();
                let op = cuda::ScatterAdd {
                    ids: ids.dtype,
                    values: values.dtype,
                    out: node.ty.dtype,
                    rows: *rows,
                    row_len: values.shape.numel().checked_div(n).unwrap_or(0),
                    n,
                };
                out.push(Work::Scatter { op, skewed: false });
            }
            Op::Dropout { p, salt } => out.push(Work::Dropout {
                dtype: node.ty.dtype,
                n: node.ty.shape.numel(),
                p: *p,
                salt: *salt,
            }),
            Op::Concat { axis } => {
                let dims = node.ty.shape.dims();
                out.push(Work::Concat {
                    dtype: node.ty.dtype,
                    outer: dims[..*axis].iter().product(),
                    widths: node
                        .inputs
                        .iter()
                        .map(|&x| graph.ty(x).shape.dims()[*axis..].iter().product())
                        .collect(),
                });
            }
            _ => {}
        }
    }
    out
}
