//! Lowering a group of materialized values to one [`FusedKernel`].
//!
//! Each root is evaluated over the kernel's domain; every value it needs is expanded in place
//! under an index [`Map`] (views change the map, elementwise ops keep it), down to buffers, which
//! become loads. A reduction is expanded as a stage of the kernel when it folds exactly the
//! kernel's reduce axes of a value shaped like the domain, and is read back at its own row;
//! anything that cannot be expanded is reported as a *cut*, to be materialized by the caller.

use super::index::Map;
use super::{kind, Kind};
use crate::ir::{DType, Graph, NodeId, Op};
use ingot_kernels::fused::{FusedKernel, Input, Inst, Output};
use std::collections::HashMap;

/// The domain and reduce axes of a group, from its first root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Domain {
    pub dims: Vec<usize>,
    /// Set by a reduction root or the first staged reduction.
    pub axes: Option<Vec<usize>>,
}

impl Domain {
    /// The domain a root value defines: a reduction iterates over its operand.
    pub fn of_root(g: &Graph, r: NodeId) -> Domain {
        match &g.node(r).op {
            Op::Reduce { axes, .. } => {
                let mut a: Vec<usize> = axes.to_vec();
                a.sort_unstable();
                Domain {
                    dims: g.ty(g.node(r).inputs[0]).shape.dims().to_vec(),
                    axes: Some(a),
                }
            }
            _ => Domain {
                dims: g.ty(r).shape.dims().to_vec(),
                axes: None,
            },
        }
    }
}

/// A lowered group: the kernel and the nodes its inputs load, in input order.
pub struct Lowered {
    pub kernel: FusedKernel,
    pub inputs: Vec<NodeId>,
}

/// Lowers `roots` (sorted) over `domain`. `mat` says which values are buffers. On failure,
/// returns the nodes that must be materialized for the group to lower.
pub fn lower(
    g: &Graph,
    mat: &[bool],
    roots: &[NodeId],
    domain: &Domain,
) -> Result<Lowered, Vec<NodeId>> {
    let mut l = Lowerer {
        g,
        mat,
        roots,
        rank: domain.dims.len(),
        domain: domain.clone(),
        body: Vec::new(),
        inputs: Vec::new(),
        loads: HashMap::new(),
        memo: HashMap::new(),
        cuts: Vec::new(),
        staged: Vec::new(),
    };
    let mut outputs = Vec::new();
    let mut row_roots = Vec::new();
    for &r in roots {
        let dims = g.ty(r).shape.dims();
        let map = if matches!(g.node(r).op, Op::Reduce { .. }) || dims != domain.dims {
            row_roots.push(r);
            l.row_map()
        } else {
            Some(Map::identity(l.rank))
        };
        let Some(map) = map else {
            l.cuts.push(r);
            continue;
        };
        if let Some(v) = l.expand(r, &map) {
            outputs.push(Output { value: v });
        }
    }
    if !l.cuts.is_empty() {
        return Err(dedup(l.cuts));
    }
    let inputs = l.loads_order();
    let kernel = FusedKernel {
        domain: l.domain.dims.clone(),
        reduce_axes: l.domain.axes.clone().unwrap_or_default(),
        inputs: l.inputs,
        body: l.body,
        outputs,
    };
    // Each root must come out at its own shape: row-level exactly when it is a row value.
    let rows = kernel.output_rows();
    for (j, &r) in roots.iter().enumerate() {
        let want_row = row_roots.contains(&r);
        let is_row = rows[j];
        if want_row != is_row {
            // A full-shaped root that only depends on rows (a broadcast of a reduction): store
            // the reductions instead and let the root be a plain elementwise kernel.
            let mut cuts = l.staged.clone();
            if cuts.is_empty() {
                cuts.push(r);
            }
            return Err(cuts);
        }
    }
    Ok(Lowered { kernel, inputs })
}

fn dedup(mut v: Vec<NodeId>) -> Vec<NodeId> {
    v.sort();
    v.dedup();
    v
}

struct Lowerer<'a> {
    g: &'a Graph,
    mat: &'a [bool],
    roots: &'a [NodeId],
    rank: usize,
    domain: Domain,
    body: Vec<Inst>,
    inputs: Vec<Input>,
    /// Input index of each (buffer, access) loaded, and the buffer nodes in input order.
    loads: HashMap<(NodeId, ingot_kernels::fused::Access), usize>,
    memo: HashMap<(NodeId, Map), usize>,
    cuts: Vec<NodeId>,
    /// Reductions expanded as stages.
    staged: Vec<NodeId>,
}

impl Lowerer<'_> {
    fn push(&mut self, i: Inst) -> usize {
        self.body.push(i);
        self.body.len() - 1
    }

    fn loads_order(&self) -> Vec<NodeId> {
        let mut v: Vec<(usize, NodeId)> = self.loads.iter().map(|(k, &i)| (i, k.0)).collect();
        v.sort();
        v.into_iter().map(|(_, n)| n).collect()
    }

    /// The map of a row value read at its own row: identity off the reduce axes, 0 on them.
    fn row_map(&self) -> Option<Map> {
        let axes = self.domain.axes.as_ref()?;
        let Map::Coords(mut c) = Map::identity(self.rank) else {
            unreachable!()
        };
        for &a in axes {
            c[a] = super::index::Affine {
                offset: 0,
                terms: Default::default(),
            };
        }
        Some(Map::Coords(c))
    }

    fn load(&mut self, v: NodeId, map: &Map) -> usize {
        let ty = self.g.ty(v);
        let access = map.access(ty.shape.dims(), self.rank);
        let n = self.loads.len();
        let input = *self.loads.entry((v, access.clone())).or_insert(n);
        if input == self.inputs.len() {
            self.inputs.push(Input {
                dtype: ty.dtype,
                len: ty.shape.numel(),
                access,
            });
        }
        self.push(Inst::Load { input })
    }

    fn constant(&mut self, value: f64, dtype: DType) -> usize {
        self.push(Inst::Const { value, dtype })
    }

    /// The instruction computing `v` at the element `map` names; `None` after recording a cut.
    fn expand(&mut self, v: NodeId, map: &Map) -> Option<usize> {
        if let Some(&i) = self.memo.get(&(v, map.clone())) {
            return Some(i);
        }
        let i = self.expand_uncached(v, map)?;
        self.memo.insert((v, map.clone()), i);
        Some(i)
    }

    fn cut(&mut self, v: NodeId) -> Option<usize> {
        self.cuts.push(v);
        None
    }

    fn expand_uncached(&mut self, v: NodeId, map: &Map) -> Option<usize> {
        let g = self.g;
        let node = g.node(v);
        // `roots` is sorted: a binary search, since a merged group can have thousands.
        let own = self.roots.binary_search(&v).is_ok();
        let k = kind(node);
        if matches!(k, Kind::Leaf | Kind::Library) || (self.mat[v.index()] && !own) {
            return Some(self.load(v, map));
        }
        let dims = node.ty.shape.dims();
        let operand = |i: usize| node.inputs[i];
        match &node.op {
            Op::Full { value } => Some(self.constant(*value, node.ty.dtype)),
            Op::Iota { axis } => {
                let Some(c) = map.coord(*axis).cloned() else {
                    return self.cut(v);
                };
                let dt = node.ty.dtype;
                let mut acc: Option<usize> = None;
                for &(a, coef) in &c.terms {
                    let mut t = self.push(Inst::Index { axis: a, dtype: dt });
                    if coef != 1 {
                        let k = self.constant(coef as f64, dt);
                        t = self.push(Inst::Binary {
                            op: crate::ir::BinaryOp::Mul,
                            a: t,
                            b: k,
                        });
                    }
                    acc = Some(match acc {
                        None => t,
                        Some(s) => self.push(Inst::Binary {
                            op: crate::ir::BinaryOp::Add,
                            a: s,
                            b: t,
                        }),
                    });
                }
                Some(match (acc, c.offset) {
                    (None, o) => self.constant(o as f64, dt),
                    (Some(s), 0) => s,
                    (Some(s), o) => {
                        let k = self.constant(o as f64, dt);
                        self.push(Inst::Binary {
                            op: crate::ir::BinaryOp::Add,
                            a: s,
                            b: k,
                        })
                    }
                })
            }
            Op::Unary(op) => {
                let x = self.expand(operand(0), map)?;
                Some(self.push(Inst::Unary { op: *op, x }))
            }
            Op::Binary(op) => {
                let a = self.expand(operand(0), map)?;
                let b = self.expand(operand(1), map)?;
                Some(self.push(Inst::Binary { op: *op, a, b }))
            }
            Op::Compare(op) => {
                let a = self.expand(operand(0), map)?;
                let b = self.expand(operand(1), map)?;
                Some(self.push(Inst::Compare { op: *op, a, b }))
            }
            Op::Select => {
                let cond = self.expand(operand(0), map)?;
                let a = self.expand(operand(1), map)?;
                let b = self.expand(operand(2), map)?;
                Some(self.push(Inst::Select { cond, a, b }))
            }
            Op::Convert => {
                let x = self.expand(operand(0), map)?;
                Some(self.push(Inst::Convert {
                    x,
                    to: node.ty.dtype,
                }))
            }
            Op::Broadcast => {
                let src = g.ty(operand(0)).shape.dims();
                match map.through_broadcast(src, dims) {
                    Some(m) => self.expand(operand(0), &m),
                    None => self.cut(v),
                }
            }
            Op::Transpose { perm } => match map.through_transpose(perm) {
                Some(m) => self.expand(operand(0), &m),
                None => self.cut(v),
            },
            Op::Slice { axis, start, .. } => match map.through_slice(*axis, *start) {
                Some(m) => self.expand(operand(0), &m),
                None => self.cut(v),
            },
            Op::Reshape | Op::StopGradient => {
                let src = g.ty(operand(0)).shape.dims();
                let m = map.through_reshape(src, dims);
                self.expand(operand(0), &m)
            }
            Op::Reduce { op, axes } => {
                let x = operand(0);
                let mut axes: Vec<usize> = axes.to_vec();
                axes.sort_unstable();
                if g.ty(x).shape.dims() != self.domain.dims.as_slice() {
                    return self.cut(v);
                }
                match &self.domain.axes {
                    None => self.domain.axes = Some(axes.clone()),
                    Some(a) if *a != axes => return self.cut(v),
                    Some(_) => {}
                }
                // Read back at its own row: the map must be the row map.
                if Some(map) != self.row_map().as_ref() {
                    return self.cut(v);
                }
                let xi = self.expand(x, &Map::identity(self.rank))?;
                self.staged.push(v);
                Some(self.push(Inst::Reduce { op: *op, x: xi }))
            }
            Op::Leaf { .. }
            | Op::Concat { .. }
            | Op::MatMul { .. }
            | Op::Gather
            | Op::ScatterAdd { .. }
            | Op::Fused(_)
            | Op::Result { .. } => self.cut(v),
        }
    }
}
