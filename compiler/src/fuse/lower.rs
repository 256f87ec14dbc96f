//! Lowering a group of materialized values to one [`FusedKernel`].
//!
//! Each root is evaluated over the kernel's domain; every value it needs is expanded in place
//! under an index [`Map`] (views change the map, elementwise ops keep it), down to buffers, which
//! become loads. A reduction is expanded as a stage of the kernel when it folds exactly the
//! kernel's reduce axes of a value shaped like the domain, and is read back at its own row;
//! anything that cannot be expanded is reported as a *cut*, to be materialized by the caller.

use super::index::Map;
use super::kind::{kind, Kind};
use crate::ir::{DType, Graph, NodeId, Op};
use ingot_kernels::fused::{FusedKernel, Input, Inst, Output};
use smallvec::SmallVec;

/// The lowering's maps, hashed with rustc's multiply-rotate hash (`rustc-hash`): each entered
/// value is looked up under its index map, and std's SipHash of those keys was a third of a
/// lowering's work. Nothing iterates these maps in an order that reaches the kernel (loads are
/// numbered, the interior sorted), so the hasher changes no result.
type HashMap<K, V> = rustc_hash::FxHashMap<K, V>;

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

/// The entries of `mat` a lowering read, each with its value then (repeats allowed).
pub type Reads = Vec<(NodeId, bool)>;

/// A lowered group: the kernel and the nodes its inputs load, in input order.
pub struct Lowered {
    pub kernel: FusedKernel,
    pub inputs: Vec<NodeId>,
    /// Instructions of the body that were outputs until fusion dropped their store (nothing
    /// else loads them, `fuse::unread`): their bf16 values are still read rounded, as
    /// stored ([`super::widen::bf16_arithmetic_in_f32_keeping`]). Empty but from
    /// [`lower_unstored`].
    pub unstored: Vec<usize>,
}

/// Lowers `roots` (sorted) over `domain`. `mat` says which values are buffers. On failure,
/// returns the nodes that must be materialized for the group to lower.
pub fn lower(
    g: &Graph,
    mat: &[bool],
    roots: &[NodeId],
    domain: &Domain,
) -> Result<Lowered, Vec<NodeId>> {
    lower_with_interior(g, mat, roots, domain).map(|(l, _)| l)
}

/// As [`lower`], with the group's interior: the computed values (elementwise ops and
/// reductions, not roots, not buffers) its kernel expanded, in graph order. Each is a value
/// the kernel keeps out of memory, and a place where it could be cut.
pub fn lower_with_interior(
    g: &Graph,
    mat: &[bool],
    roots: &[NodeId],
    domain: &Domain,
) -> Result<(Lowered, Vec<NodeId>), Vec<NodeId>> {
    lower_reading(g, mat, roots, domain).map(|(l, interior, _)| (l, interior))
}

/// As [`lower_with_interior`], with every entry of `mat` the lowering read and its value then:
/// the lowering is a function of the graph, the roots, the domain and those entries alone, so
/// it holds for any `mat` that agrees with them (fusion keeps lowerings between
/// fusion's rounds on that ground).
pub fn lower_reading(
    g: &Graph,
    mat: &[bool],
    roots: &[NodeId],
    domain: &Domain,
) -> Result<(Lowered, Vec<NodeId>, Reads), Vec<NodeId>> {
    lower_inner(g, mat, roots, domain, &[])
}

/// As [`lower`], for `roots` that were a group's with `unstored` too until fusion dropped
/// their stores (`fuse::unread`): each of `unstored` the body computes (in the domain's
/// own coordinates) is listed in [`Lowered::unstored`], to be rounded as it was stored.
pub fn lower_unstored(
    g: &Graph,
    mat: &[bool],
    roots: &[NodeId],
    domain: &Domain,
    unstored: &[NodeId],
) -> Result<Lowered, Vec<NodeId>> {
    lower_inner(g, mat, roots, domain, unstored).map(|(l, _, _)| l)
}

fn lower_inner(
    g: &Graph,
    mat: &[bool],
    roots: &[NodeId],
    domain: &Domain,
    unstored: &[NodeId],
) -> Result<(Lowered, Vec<NodeId>, Reads), Vec<NodeId>> {
    let mut l = Lowerer {
        g,
        mat,
        roots,
        rank: domain.dims.len(),
        domain: domain.clone(),
        body: Vec::new(),
        inputs: Vec::new(),
        loads: HashMap::default(),
        memo: HashMap::default(),
        cuts: Vec::new(),
        staged: Vec::new(),
        entered_reductions: 0,
        numbered: HashMap::default(),
        read: Vec::new(),
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
    let mut interior: Vec<NodeId> = (l.memo.keys())
        .map(|(v, _)| *v)
        .filter(|&v| {
            !mat[v.index()]
                && roots.binary_search(&v).is_err()
                && matches!(kind(g.node(v)), Kind::Elementwise | Kind::Reduce)
        })
        .collect();
    interior.sort();
    interior.dedup();
    // The interior's filter read `mat` only at memoized values, each entered (and read) above.
    let identity = Map::identity(l.rank);
    let unstored = (unstored.iter())
        .filter_map(|&v| l.memo.get(&(v, identity.clone())).copied())
        .collect();
    let lowered = Lowered {
        kernel,
        inputs,
        unstored,
    };
    Ok((lowered, interior, l.read))
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
    /// Reductions entered so far (staged, or being expanded): at most
    /// [`super::MAX_KERNEL_REDUCTIONS`]; any further one is a cut.
    entered_reductions: usize,
    /// Each instruction of the body by its [`numbering_key`].
    numbered: HashMap<InstKey, usize>,
    /// Every entry of `mat` read, with its value.
    read: Reads,
}

/// An instruction as a hashable key: a constant by its bits (so `-0.0` and `0.0` stay two).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum InstKey {
    Inst(Inst2),
    Const(u64, DType),
}

/// [`Inst`] without its one float field.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Inst2 {
    Load(usize),
    Index(usize, DType),
    Unary(ingot_kernels::UnaryOp, usize),
    Binary(ingot_kernels::BinaryOp, usize, usize),
    Compare(ingot_kernels::CmpOp, usize, usize),
    Select(usize, usize, usize),
    Convert(usize, DType),
    Reduce(ingot_kernels::ReduceOp, usize),
}

fn numbering_key(i: &Inst) -> InstKey {
    InstKey::Inst(match *i {
        Inst::Const { value, dtype } => return InstKey::Const(value.to_bits(), dtype),
        Inst::Load { input } => Inst2::Load(input),
        Inst::Index { axis, dtype } => Inst2::Index(axis, dtype),
        Inst::Unary { op, x } => Inst2::Unary(op, x),
        Inst::Binary { op, a, b } => Inst2::Binary(op, a, b),
        Inst::Compare { op, a, b } => Inst2::Compare(op, a, b),
        Inst::Select { cond, a, b } => Inst2::Select(cond, a, b),
        Inst::Convert { x, to } => Inst2::Convert(x, to),
        Inst::Reduce { op, x } => Inst2::Reduce(op, x),
    })
}

impl Lowerer<'_> {
    /// The instruction `i`, pushed unless the body already has it (the same op on the same
    /// operands): values that two graph nodes compute alike, such as a causal mask and its
    /// copy recomputed for the backward pass in a kernel that merged both passes' uses, are
    /// one value, so that the guards of the loads they select see one condition.
    fn push(&mut self, i: Inst) -> usize {
        let key = numbering_key(&i);
        if let Some(&at) = self.numbered.get(&key) {
            return at;
        }
        self.body.push(i);
        self.numbered.insert(key, self.body.len() - 1);
        self.body.len() - 1
    }

    /// Whether `v` is a buffer, recorded in [`Lowerer::read`].
    fn is_mat(&mut self, v: NodeId) -> bool {
        let m = self.mat[v.index()];
        self.read.push((v, m));
        m
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
    ///
    /// A depth-first walk with an explicit stack (a chain of 12,000 elementwise ops must not
    /// overflow the thread's stack): each value is entered before its operands, its operands
    /// are expanded one after another in operand order, and its instruction is pushed after
    /// theirs, so the body is the post-order a recursive walk gives. The first cut ends the
    /// whole walk, as it ends the group's lowering.
    fn expand(&mut self, v: NodeId, map: &Map) -> Option<usize> {
        let mut stack: Vec<Frame> = Vec::new();
        match self.enter(v, map.clone())? {
            Entered::Done(i) => return Some(i),
            Entered::Frame(f) => stack.push(f),
        }
        loop {
            let top = stack
                .last_mut()
                .expect("the walk ends when the stack empties");
            if top.next < top.children.len() {
                let (c, m) = top.children[top.next].clone();
                top.next += 1;
                match self.enter(c, m)? {
                    Entered::Done(i) => stack
                        .last_mut()
                        .expect("the parent is on the stack")
                        .results
                        .push(i),
                    Entered::Frame(f) => stack.push(f),
                }
            } else {
                let f = stack.pop().expect("the top frame is there");
                let i = self.finish(f);
                match stack.last_mut() {
                    Some(parent) => parent.results.push(i),
                    None => return Some(i),
                }
            }
        }
    }

    fn cut(&mut self, v: NodeId) -> Option<Entered> {
        self.cuts.push(v);
        None
    }

    /// A value whose instruction is known at once (memoized, a load, a constant, an index).
    fn done(&mut self, v: NodeId, map: Map, i: usize) -> Option<Entered> {
        self.memo.insert((v, map), i);
        Some(Entered::Done(i))
    }

    /// Visits `v` under `map`: its instruction if it needs no operands, else a frame listing
    /// the operands to expand and how to combine them; `None` after recording a cut.
    fn enter(&mut self, v: NodeId, map: Map) -> Option<Entered> {
        if let Some(&i) = self.memo.get(&(v, map.clone())) {
            return Some(Entered::Done(i));
        }
        let g = self.g;
        let node = g.node(v);
        // `roots` is sorted: a binary search, since a merged group can have thousands.
        let own = self.roots.binary_search(&v).is_ok();
        let k = kind(node);
        if matches!(k, Kind::Leaf | Kind::Library) || (self.is_mat(v) && !own) {
            let i = self.load(v, &map);
            return self.done(v, map, i);
        }
        let dims = node.ty.shape.dims();
        let operand = |i: usize| node.inputs[i];
        let same = |n: usize| -> SmallVec<[(NodeId, Map); 3]> {
            (0..n).map(|i| (operand(i), map.clone())).collect()
        };
        let frame = |children: SmallVec<[(NodeId, Map); 3]>, fin: Fin| {
            Some(Entered::Frame(Frame {
                v,
                map: map.clone(),
                children,
                next: 0,
                results: SmallVec::new(),
                fin,
            }))
        };
        match &node.op {
            Op::Full { value } => {
                let i = self.constant(*value, node.ty.dtype);
                self.done(v, map, i)
            }
            Op::Iota { axis } => {
                let Some(c) = map.coord(*axis).cloned() else {
                    return self.cut(v);
                };
                let i = self.iota(&c, node.ty.dtype);
                self.done(v, map, i)
            }
            Op::Unary(op) => frame(same(1), Fin::Unary(*op)),
            Op::Binary(op) => frame(same(2), Fin::Binary(*op)),
            Op::Compare(op) => frame(same(2), Fin::Compare(*op)),
            Op::Select => frame(same(3), Fin::Select),
            Op::Convert => frame(same(1), Fin::Convert(node.ty.dtype)),
            Op::Broadcast => {
                let src = g.ty(operand(0)).shape.dims();
                match map.through_broadcast(src, dims) {
                    Some(m) => frame(smallvec::smallvec![(operand(0), m)], Fin::Forward),
                    None => self.cut(v),
                }
            }
            Op::Transpose { perm } => match map.through_transpose(perm) {
                Some(m) => frame(smallvec::smallvec![(operand(0), m)], Fin::Forward),
                None => self.cut(v),
            },
            Op::Slice { axis, start, .. } => match map.through_slice(*axis, *start) {
                Some(m) => frame(smallvec::smallvec![(operand(0), m)], Fin::Forward),
                None => self.cut(v),
            },
            Op::Reshape | Op::StopGradient => {
                let src = g.ty(operand(0)).shape.dims();
                let m = map.through_reshape(src, dims);
                frame(smallvec::smallvec![(operand(0), m)], Fin::Forward)
            }
            Op::Reduce { op, axes } => {
                let x = operand(0);
                let mut axes: Vec<usize> = axes.to_vec();
                axes.sort_unstable();
                // A reduction over another domain than the kernel's is stored whatever else is
                // cut; read as a load, so that the walk goes on and finds every such cut of the
                // group at once (a sum of n such reductions, as gradient clipping's norm and the
                // update's non-finite count add them, is cut in one round, not in n rounds of
                // lowering every group again).
                if g.ty(x).shape.dims() != self.domain.dims.as_slice() {
                    self.cuts.push(v);
                    let i = self.load(v, &map);
                    return self.done(v, map, i);
                }
                match &self.domain.axes {
                    None => self.domain.axes = Some(axes.clone()),
                    Some(a) if *a != axes => return self.cut(v),
                    Some(_) => {}
                }
                // Read back at its own row: the map must be the row map.
                if Some(&map) != self.row_map().as_ref() {
                    return self.cut(v);
                }
                // A kernel holds at most so many reductions (see the constant). One more is a
                // cut, read as a load so that the walk goes on and finds every such cut of
                // the group at once: a chain of n reductions under one root is cut in one
                // round, not in n / MAX rounds of lowering every group again.
                if self.entered_reductions == super::bounds::MAX_KERNEL_REDUCTIONS {
                    self.cuts.push(v);
                    let i = self.load(v, &map);
                    return self.done(v, map, i);
                }
                self.entered_reductions += 1;
                let id = Map::identity(self.rank);
                frame(smallvec::smallvec![(x, id)], Fin::Reduce(*op))
            }
            Op::Leaf { .. }
            | Op::Concat { .. }
            | Op::MatMul { .. }
            | Op::MatMulAcc { .. }
            | Op::Gather
            | Op::ScatterAdd { .. }
            | Op::Fused(_)
            | Op::Result { .. }
            | Op::Attention { .. }
            | Op::AttentionGrad { .. }
            | Op::AllReduce { .. }
            | Op::AllGather { .. }
            | Op::ReduceScatter { .. }
            | Op::Dropout { .. }
            | Op::Window(_) => self.cut(v),
        }
    }

    /// The instruction of a frame whose operands are expanded, memoized under its map.
    fn finish(&mut self, f: Frame) -> usize {
        let r = &f.results;
        let i = match f.fin {
            Fin::Forward => r[0],
            Fin::Unary(op) => self.push(Inst::Unary { op, x: r[0] }),
            Fin::Binary(op) => self.push(Inst::Binary {
                op,
                a: r[0],
                b: r[1],
            }),
            Fin::Compare(op) => self.push(Inst::Compare {
                op,
                a: r[0],
                b: r[1],
            }),
            Fin::Select => self.push(Inst::Select {
                cond: r[0],
                a: r[1],
                b: r[2],
            }),
            Fin::Convert(to) => self.push(Inst::Convert { x: r[0], to }),
            Fin::Reduce(op) => {
                self.staged.push(f.v);
                self.push(Inst::Reduce { op, x: r[0] })
            }
        };
        self.memo.insert((f.v, f.map), i);
        i
    }

    /// `offset + Σ coef · i[axis]` as instructions of `dt`.
    fn iota(&mut self, c: &super::index::Affine, dt: DType) -> usize {
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
        match (acc, c.offset) {
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
        }
    }
}

/// The result of entering a value in [`Lowerer::expand`]. Short-lived and moved straight onto
/// the walk's stack, so the frame is not boxed (one allocation per value expanded otherwise).
#[allow(clippy::large_enum_variant)]
enum Entered {
    Done(usize),
    Frame(Frame),
}

/// A value of the walk whose operands are being expanded.
struct Frame {
    v: NodeId,
    map: Map,
    /// Operands and the maps they are read under, in operand order.
    children: SmallVec<[(NodeId, Map); 3]>,
    /// The next child to expand.
    next: usize,
    /// The instructions of the children expanded so far.
    results: SmallVec<[usize; 3]>,
    fin: Fin,
}

/// How a frame's instruction is made from its operands' instructions.
enum Fin {
    /// A view: the operand's instruction under the view's map.
    Forward,
    Unary(crate::ir::UnaryOp),
    Binary(crate::ir::BinaryOp),
    Compare(crate::ir::CmpOp),
    Select,
    Convert(DType),
    Reduce(crate::ir::ReduceOp),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::DType;

    /// `x [4]` through `n` elementwise ops (tanh and neg, alternating).
    fn chain(n: usize) -> (Graph, NodeId) {
        let mut g = Graph::new();
        let mut v = g.input("x", &[4usize][..], DType::F32).unwrap();
        for i in 0..n {
            v = if i % 2 == 0 {
                g.tanh(v).unwrap()
            } else {
                g.neg(v).unwrap()
            };
        }
        (g, v)
    }

    #[test]
    fn a_chain_of_12000_elementwise_ops_lowers_to_one_kernel_on_a_small_stack() {
        // 256 KiB of stack: a walk that recursed once per op would need far more.
        let h = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(|| {
                let (g, root) = chain(12_000);
                let mut mat = vec![false; g.len()];
                mat[0] = true;
                mat[root.index()] = true;
                let l = lower(&g, &mat, &[root], &Domain::of_root(&g, root))
                    .unwrap_or_else(|cuts| panic!("cut at {cuts:?}"));
                let x = l.inputs.len() == 1 && l.inputs[0].index() == 0;
                (l.kernel.body.len(), l.kernel.inputs.len(), x)
            })
            .unwrap();
        let (body, inputs, loaded) = h.join().unwrap();
        // one load and one instruction per op
        assert_eq!(body, 12_001);
        assert_eq!(inputs, 1);
        assert!(loaded, "the kernel loads the chain's input");
    }

    #[test]
    fn a_value_read_twice_under_one_map_is_computed_once_and_operands_come_first() {
        // y = tanh(x) * tanh(x): one load, one tanh, one mul.
        let mut g = Graph::new();
        let x = g.input("x", &[3usize][..], DType::F32).unwrap();
        let t = g.tanh(x).unwrap();
        let y = g.mul(t, t).unwrap();
        let mut mat = vec![false; g.len()];
        mat[x.index()] = true;
        mat[y.index()] = true;
        let l = lower(&g, &mat, &[y], &Domain::of_root(&g, y)).ok().unwrap();
        let b = &l.kernel.body;
        assert_eq!(b.len(), 3, "{b:?}");
        assert!(matches!(b[0], Inst::Load { input: 0 }));
        assert!(matches!(b[1], Inst::Unary { x: 0, .. }));
        assert!(matches!(b[2], Inst::Binary { a: 1, b: 1, .. }));
    }
}
