//! Fusion: groups of elementwise ops, views and reductions become fused kernels
//! ([`FusedKernel`](ingot_kernels::FusedKernel)) whose intermediates never reach memory;
//! matmuls, gathers, scatter-adds and concats stay library calls.
//!
//! The pass runs in seven steps, each a small function of the previous one's result:
//! 0. [`concat`](mod@concat): a concat of equal parts becomes selects on the output with the
//!    axis split, so that its parts' views (transposes back from the heads' layout) fuse into it;
//!    and [`matmul_acc`](mod@matmul_acc): a matrix product added to a value that dies there
//!    becomes one `matmul_acc`, a library call that adds the product into that value's bytes;
//! 1. [`remat`]: a stored forward value that the backward pass reads again, and that is cheap to
//!    compute from values the backward pass keeps anyway (a LayerNorm or GELU output), gets a
//!    copy computed just before its backward users, so the original dies in the forward pass;
//! 2. [`select`]: which values are materialized (written to a buffer); everything else is
//!    expanded inside each kernel that uses it; and [`early`](mod@early): a slice read long
//!    after the rest of its value is copied out (a kernel of its own, emitted after that rest's
//!    last read), so the whole value dies there;
//! 3. [`lower`](mod@lower): each materialized value becomes the root of a kernel; where a root
//!    cannot be expanded (a reduction over other axes, a view a linear index cannot express) the
//!    value in the way is materialized too, and lowering starts again (taking the lowerings
//!    the new buffers leave alone: `rounds.rs`);
//! 4. merging: a kernel is folded into a consumer that reads its outputs at their own index
//!    (same domain, compatible reduce axes) when that creates no cycle, so e.g. a LayerNorm's
//!    statistics, its output and the AdamW moments and parameter each come out of one kernel
//!    with several outputs; then siblings merge: two kernels of one pass over the same domain
//!    that read a full-size value at the same index, neither reaching the other, become one
//!    kernel that reads it once (a plain attention's probabilities and its scores' gradient,
//!    both computed from the scores in the backward pass; a bias's and a gain's gradient sums);
//!    a root that only its own merged kernel read is no longer stored (`unread.rs`);
//! 5. [`widen`]: in each kernel, bf16 arithmetic is computed in f32 and rounded once where it
//!    is stored, as PyTorch's generated kernels do (f32 kernels are unchanged).
//!
//! The result is again a [`Graph`]: leaves, library ops, reshapes of buffers, and `fused`
//! nodes with `result` nodes for their extra outputs, which the planner and runtimes take as is.

mod bounds;
pub mod concat;
pub mod early;
mod group;
pub mod index;
mod kind;
pub mod lower;
pub mod matmul_acc;
mod merge;
pub mod relu_mask;
pub mod remat;
mod rounds;
pub mod segment;
pub mod select;
pub mod triangle;
mod unread;
pub mod widen;

use crate::error::IrError;
use crate::ir::{Graph, NodeId, Op, Shape, TensorType};
pub use bounds::{scratch_bound, MAX_KERNEL_REDUCTIONS, SCRATCH_FREE};
use group::Group;
pub use kind::{kind, Kind};
use merge::merged_groups;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Knobs of the fusion pass.
#[derive(Clone, Debug)]
pub struct FuseOptions {
    /// Most elementwise ops a shared value may have and still be recomputed in each kernel
    /// that uses it rather than stored.
    pub recompute_ops: usize,
    /// Recompute cheap forward values for the backward pass ([`remat`]).
    pub remat: bool,
    /// Merge kernels into consumers that read their outputs at their own index.
    pub merge: bool,
    /// Make a matrix product added into a dying value one `matmul_acc`
    /// ([`matmul_acc`](mod@matmul_acc)).
    pub matmul_acc: bool,
    /// Copy a slice read long after the rest of its value out early
    /// ([`early`](mod@early)).
    pub early_slices: bool,
}

impl Default for FuseOptions {
    fn default() -> Self {
        FuseOptions {
            recompute_ops: 12,
            remat: true,
            merge: true,
            matmul_acc: true,
            early_slices: true,
        }
    }
}

/// What fusion did, for reports and benchmarks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FuseReport {
    /// Nodes of the input graph that compute something (not leaves).
    pub ops_before: usize,
    /// Kernel launches per step after fusion: fused kernels plus library calls.
    pub kernels: usize,
    pub fused_kernels: usize,
    pub library_calls: usize,
    /// Fused kernels with more than one output.
    pub multi_output_kernels: usize,
    /// Forward values recomputed for the backward pass.
    pub recomputed: usize,
    /// The library calls among them ([`remat::recompute_with`]), as node ids of the graph
    /// fusion received ([`prepared`]).
    #[serde(skip)]
    pub recomputed_heavy: Vec<NodeId>,
    /// The arithmetic the recomputation adds to the step ([`crate::flops`]).
    #[serde(skip_serializing_if = "is_zero64")]
    pub recomputed_flops: u64,
    /// The arithmetic of the step before recomputation ([`crate::flops`]).
    #[serde(skip_serializing_if = "is_zero64")]
    pub flops: u64,
    /// Concats of equal parts fused as selects.
    pub concats_fused: usize,
    /// Products added into a dying value made one `matmul_acc` ([`matmul_acc`](mod@matmul_acc)).
    #[serde(skip_serializing_if = "is_zero")]
    pub matmuls_accumulated: usize,
    /// Rounds of lowering (each round materializes what the last could not expand).
    pub rounds: usize,
    /// Fused attention ops (forward; each has one backward `attention_grad`).
    #[serde(skip_serializing_if = "is_zero")]
    pub attentions: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn is_zero64(n: &u64) -> bool {
    *n == 0
}

/// A fused step graph and what fusion did.
#[derive(Clone, Debug)]
pub struct Fused {
    pub graph: Graph,
    pub report: FuseReport,
}

/// Fuses a step graph. The result computes the same outputs and updates.
pub fn fuse(g: &Graph, opts: &FuseOptions) -> Result<Fused, IrError> {
    fuse_recomputing(g, opts, &[])
}

/// The graph fusion groups into kernels, before any recomputation: `g` with its concats of
/// equal parts turned into selects and its products added into dying values made `matmul_acc`
/// (`prepare`). [`remat::candidates`] lists the heavy values of this graph, and
/// [`fuse_recomputing`] takes their ids in it.
pub fn prepared(g: &Graph) -> Result<Graph, IrError> {
    prepared_with(g, &FuseOptions::default())
}

/// [`prepared`] for fusion with `opts`.
pub fn prepared_with(g: &Graph, opts: &FuseOptions) -> Result<Graph, IrError> {
    Ok(prepare(g, opts)?.0)
}

/// Step 0 of fusion: [`concat::as_selects`], then [`matmul_acc::form`] (when `opts` asks);
/// with how many concats and how many accumulations each made.
fn prepare(g: &Graph, opts: &FuseOptions) -> Result<(Graph, usize, usize), IrError> {
    let (g, concats) = concat::as_selects(g)?;
    if !opts.matmul_acc {
        return Ok((g, concats, 0));
    }
    let (g, accumulated) = matmul_acc::form(&g)?;
    Ok((g, concats, accumulated))
}

/// As [`fuse`], recomputing for the backward pass, besides the cheap values, the library calls
/// `heavy` (node ids of [`prepared`]`(g)`, as [`remat::candidates`] gives them; see
/// [`remat::recompute_with`]).
pub fn fuse_recomputing(g: &Graph, opts: &FuseOptions, heavy: &[NodeId]) -> Result<Fused, IrError> {
    g.verify()?;
    if let Some(id) = g.ids().find(|&id| {
        kind(g.node(id)) == Kind::Fused
            || matches!(g.node(id).op, Op::Result { .. })
                && !g.node(g.writer(id)).op.is_multi_output_call()
    }) {
        return Err(IrError::Invalid(format!(
            "{id} is already a {}: fusion runs once, on an unfused step",
            g.node(id).op.name()
        )));
    }
    let (g, concats, accumulated) = prepare(g, opts)?;
    if !opts.remat && !heavy.is_empty() {
        return Err(IrError::Invalid(
            "recomputing library calls for the backward pass needs fusion's recomputation on (FuseOptions::remat)".into(),
        ));
    }
    let flops_before = crate::flops::of_graph(&g);
    let (g, recomputed, recomputed_heavy) = if opts.remat {
        // The prepared graph is freed once its copy with recomputation exists, not kept to
        // the end of fusion beside it (issue 53: memory freed early is reused warm).
        let prepared = g;
        remat::recompute_with(&prepared, opts.recompute_ops, heavy)?
    } else {
        (g, 0, Vec::new())
    };
    let recomputed_flops = crate::flops::of_graph(&g).saturating_sub(flops_before);
    let mut mat = select::forced(&g);
    let early = if opts.early_slices {
        early::early_slices(&g, &mat)
    } else {
        BTreeSet::new()
    };
    for &s in &early {
        mat[s.index()] = true;
    }
    let mut rounds = 0;
    let largest = g.ids().map(|id| g.ty(id).bytes()).max().unwrap_or(0);
    let mut kept = rounds::Lowerings::default();
    let groups = loop {
        rounds += 1;
        select::shared(&g, &mut mat, opts.recompute_ops);
        let cuts = match rounds::lower_all_keeping(&g, &mat, &mut kept) {
            Ok((groups, reads)) => {
                let cuts = scratch_cuts(&g, &mat, &groups, largest);
                if cuts.is_empty() {
                    break groups;
                }
                kept.keep_groups(groups, reads);
                cuts
            }
            Err(cuts) => cuts,
        };
        for c in cuts {
            mat[c.index()] = true;
        }
        if rounds > g.len() + 1 {
            return Err(IrError::Invalid(
                "fusion did not converge (a cut that materializes nothing)".into(),
            ));
        }
    };
    // The earlier rounds' lowerings are done with: freed before merging (issue 53).
    drop(kept);
    let groups = if opts.merge {
        unread::drop_unread_roots(&g, &mat, merged_groups(&g, &mat, groups, &early)?)
    } else {
        groups
    };
    let mut graph = emit(&g, &groups, &early)?;
    crate::ir::origin::fill_missing(&mut graph);
    index::check_loads(&graph)?;
    graph.verify()?;
    let mut report = FuseReport {
        ops_before: g.ids().filter(|&id| !g.node(id).op.is_leaf()).count(),
        recomputed,
        recomputed_heavy,
        recomputed_flops,
        flops: flops_before,
        concats_fused: concats,
        matmuls_accumulated: accumulated,
        rounds,
        ..FuseReport::default()
    };
    for id in graph.ids() {
        match &graph.node(id).op {
            Op::Fused(k) => {
                report.fused_kernels += 1;
                report.multi_output_kernels += usize::from(k.outputs.len() > 1);
            }
            Op::Result { .. } => {}
            op => {
                if kind(graph.node(id)) == Kind::Library {
                    report.library_calls += 1;
                }
                report.attentions += usize::from(matches!(op, Op::Attention { .. }));
            }
        }
    }
    report.kernels = report.fused_kernels + report.library_calls;
    Ok(Fused { graph, report })
}

/// Values to store so that no kernel's scratch exceeds the step's largest value (or
/// [`scratch_bound`]), where that is possible: a kernel whose scratch (the CPU executor's
/// tables and lane buffers, which grow with its body) is over it is cut into pieces of about
/// that scratch each, at values evenly spaced through what it expanded. The plan holds the
/// largest value anyway, so a kernel's scratch under it is bounded by the plan it is part
/// of; over it, a kernel that expanded a long chain of tiny single-use values (one of 2,000
/// layers of f32[8, 8] had 1.26 MiB of scratch, for 256-byte values) costs more than storing
/// them. Every kernel of the reference models is far under their
/// largest value, so none is cut.
fn scratch_cuts(g: &Graph, mat: &[bool], groups: &[Group], largest: usize) -> Vec<NodeId> {
    let bound = scratch_bound(largest);
    let mut cuts = Vec::new();
    for gr in groups {
        let scratch = ingot_kernels::fused::cpu::scratch_bytes(&gr.lowered.kernel);
        if scratch <= bound {
            continue;
        }
        let Ok((_, interior)) = lower::lower_with_interior(g, mat, &gr.roots, &gr.domain) else {
            continue;
        };
        if interior.is_empty() {
            continue;
        }
        let pieces = scratch.div_ceil(bound).min(interior.len());
        let step = (interior.len() / pieces).max(1);
        cuts.extend(interior.iter().skip(step - 1).step_by(step).copied());
    }
    cuts
}

/// Builds the fused graph: leaves, then units in dependence order (ties: earliest root; a
/// slice copied early, [`early`](mod@early), keyed just after the last other unit reading its
/// value instead: [`early::copy_keys`]).
fn emit(g: &Graph, groups: &[Group], early: &BTreeSet<NodeId>) -> Result<Graph, IrError> {
    let mut out = Graph::new();
    let mut new_id: HashMap<NodeId, NodeId> = HashMap::new();
    for id in g.ids() {
        if g.node(id).op.is_leaf() {
            let n = g.node(id);
            let nid = out.push(n.op.clone(), &[], Some(n.ty.clone()))?;
            new_id.insert(id, nid);
        }
    }
    // Units: groups (index) and library nodes, each with the old nodes it needs first.
    enum Unit<'a> {
        Group(&'a Group),
        Library(NodeId),
    }
    let mut units: Vec<(NodeId, Unit)> = groups
        .iter()
        .map(|gr| (gr.roots[0], Unit::Group(gr)))
        .chain(
            g.ids()
                .filter(|&id| kind(g.node(id)) == Kind::Library)
                .map(|id| (id, Unit::Library(id))),
        )
        .collect();
    if !early.is_empty() {
        let reads: Vec<Vec<NodeId>> = (units.iter())
            .map(|(_, u)| match u {
                Unit::Group(gr) => gr.lowered.inputs.clone(),
                Unit::Library(id) => g.node(*id).inputs.to_vec(),
            })
            .map(|xs| xs.into_iter().map(|x| select::base(g, x)).collect())
            .collect();
        let copies: Vec<bool> = (units.iter())
            .map(|(_, u)| matches!(u, Unit::Group(gr) if early.contains(&gr.roots[0])))
            .collect();
        let keys: Vec<NodeId> = units.iter().map(|u| u.0).collect();
        for (u, k) in units
            .iter_mut()
            .zip(early::copy_keys(&keys, &reads, &copies))
        {
            u.0 = k;
        }
    }
    units.sort_by_key(|u| u.0);
    let produced_by: HashMap<NodeId, usize> = units
        .iter()
        .enumerate()
        .flat_map(|(i, (_, u))| match u {
            Unit::Group(gr) => gr.roots.iter().map(|&r| (r, i)).collect::<Vec<_>>(),
            Unit::Library(id) => vec![(*id, i)],
        })
        .collect();
    let needs = |u: &Unit| -> Vec<NodeId> {
        match u {
            Unit::Group(gr) => gr.lowered.inputs.clone(),
            Unit::Library(id) => g.node(*id).inputs.to_vec(),
        }
    };
    // Kahn's algorithm, always taking the ready unit with the earliest key.
    let mut indeg = vec![0usize; units.len()];
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); units.len()];
    for (i, (_, u)) in units.iter().enumerate() {
        let mut preds: BTreeSet<usize> = BTreeSet::new();
        for x in needs(u) {
            if let Some(&p) = produced_by.get(&select::base(g, x)) {
                if p != i {
                    preds.insert(p);
                }
            }
        }
        indeg[i] = preds.len();
        for p in preds {
            succ[p].push(i);
        }
    }
    let mut ready: BTreeSet<(NodeId, usize)> = units
        .iter()
        .enumerate()
        .filter(|(i, _)| indeg[*i] == 0)
        .map(|(i, u)| (u.0, i))
        .collect();
    let mut views: HashMap<NodeId, NodeId> = HashMap::new();
    let mut emitted = 0;
    while let Some(first) = ready.pop_first() {
        let i = first.1;
        emitted += 1;
        match &units[i].1 {
            Unit::Library(id) => {
                let n = g.node(*id);
                let ins: Vec<NodeId> = n
                    .inputs
                    .iter()
                    .map(|&x| buffer(g, &mut out, &new_id, &mut views, x))
                    .collect::<Result<_, _>>()?;
                let nid = out.push(n.op.clone(), &ins, Some(n.ty.clone()))?;
                out.set_origin(nid, g.origin(*id).clone());
                new_id.insert(*id, nid);
            }
            Unit::Group(gr) => {
                let ins: Vec<NodeId> = gr
                    .lowered
                    .inputs
                    .iter()
                    .map(|x| new_id.get(x).copied().ok_or_else(|| missing(*x)))
                    .collect::<Result<_, _>>()?;
                let k =
                    widen::bf16_arithmetic_in_f32_keeping(&gr.lowered.kernel, &gr.lowered.unstored);
                let k = triangle::structural_zero_products(&k);
                let outs: Vec<TensorType> = k
                    .output_rows()
                    .into_iter()
                    .zip(k.output_dtypes())
                    .map(|(row, dtype)| {
                        TensorType::new(Shape::new(&k.output_dims_with(row)), dtype)
                    })
                    .collect();
                let fid = out.push(Op::Fused(Box::new(k)), &ins, Some(outs[0].clone()))?;
                // The kernel lists every source it fused, its first output's first; each
                // further output keeps its own value's origin.
                out.set_origin(fid, fused_origin(g, gr));
                new_id.insert(gr.roots[0], fid);
                for (j, &r) in gr.roots.iter().enumerate().skip(1) {
                    let rid = out.push(Op::Result { index: j }, &[fid], Some(outs[j].clone()))?;
                    out.set_origin(rid, g.origin(r).clone());
                    new_id.insert(r, rid);
                }
            }
        }
        for &s in &succ[i] {
            indeg[s] -= 1;
            if indeg[s] == 0 {
                ready.insert((units[s].0, s));
            }
        }
    }
    if emitted != units.len() {
        return Err(IrError::Invalid(
            "fusion made a cycle between kernels (a bug: please report it)".into(),
        ));
    }
    for (name, &o) in &g.outputs {
        let b = buffer(g, &mut out, &new_id, &mut views, o)?;
        out.set_output(name, b)?;
    }
    for u in &g.updates {
        let v = buffer(g, &mut out, &new_id, &mut views, u.value)?;
        let t = new_id[&u.target];
        out.set_update(t, v)?;
    }
    Ok(out)
}

/// The provenance of a group's kernel: its first root's origin, then those of every node it
/// fused (the nodes between its inputs and its roots), in graph order, deduplicated.
fn fused_origin(g: &Graph, gr: &Group) -> crate::ir::Origin {
    let inputs: BTreeSet<NodeId> = gr.lowered.inputs.iter().copied().collect();
    let mut body: BTreeSet<NodeId> = BTreeSet::new();
    let mut stack: Vec<NodeId> = gr.roots.clone();
    while let Some(x) = stack.pop() {
        if inputs.contains(&x) || g.node(x).op.is_leaf() || !body.insert(x) {
            continue;
        }
        stack.extend(g.node(x).inputs.iter().copied());
    }
    let first = std::iter::once(gr.roots[0]);
    crate::ir::Origin::merge(first.chain(body).map(|x| g.origin(x)))
}

fn missing(x: NodeId) -> IrError {
    IrError::Invalid(format!(
        "fusion: {x} is read before any kernel writes it (a bug: please report it)"
    ))
}

/// The new node holding `x`'s bytes: its own buffer, or a reshape of its base's. Walks the
/// alias chain with a loop, since a chain of reshapes can be as long as the graph.
fn buffer(
    g: &Graph,
    out: &mut Graph,
    new_id: &HashMap<NodeId, NodeId>,
    views: &mut HashMap<NodeId, NodeId>,
    x: NodeId,
) -> Result<NodeId, IrError> {
    // The aliases from x down to the first value that already has a node.
    let mut chain = Vec::new();
    let mut y = x;
    let mut inner = loop {
        if let Some(&n) = new_id.get(&y).or_else(|| views.get(&y)) {
            break n;
        }
        let n = g.node(y);
        if !n.op.is_alias() {
            return Err(missing(y));
        }
        chain.push(y);
        y = n.inputs[0];
    };
    for &v in chain.iter().rev() {
        let n = g.node(v);
        if out.ty(inner).shape != n.ty.shape {
            inner = out.push(Op::Reshape, &[inner], Some(n.ty.clone()))?;
            out.set_origin(inner, g.origin(v).clone());
        }
        views.insert(v, inner);
    }
    Ok(inner)
}

/// A histogram of the fused graph's kernels: library op names and fused kernels by their
/// shape of work, for snapshots and reports.
pub fn kernel_list(g: &Graph) -> BTreeMap<String, usize> {
    let mut h = BTreeMap::new();
    for id in g.ids() {
        let n = g.node(id);
        let key = match &n.op {
            Op::Fused(k) => format!(
                "fused {} in {} out {}",
                if k.reduce_axes.is_empty() {
                    "elementwise".to_string()
                } else {
                    format!("reduce{:?}", k.reduce_axes)
                },
                k.inputs.len(),
                k.outputs.len()
            ),
            Op::Result { .. } => continue,
            op if kind(n) == Kind::Library => op.name().to_string(),
            _ => continue,
        };
        *h.entry(key).or_insert(0) += 1;
    }
    h
}

#[cfg(test)]
mod tests {
    use super::merge::merge;
    use super::*;

    /// The fused graph's text, with merges decided with or without the shortcut, and how many
    /// merges took it.
    fn fused_text(g: &Graph, shortcut: bool, remat: bool) -> (String, usize) {
        let opts = FuseOptions::default();
        let (g, _) = concat::as_selects(g).unwrap();
        let (g, _) = if remat {
            remat::recompute_for_backward(&g, opts.recompute_ops).unwrap()
        } else {
            (g, 0)
        };
        let mut mat = select::forced(&g);
        let groups = loop {
            select::shared(&g, &mut mat, opts.recompute_ops);
            match rounds::lower_all(&g, &mat) {
                Ok(groups) => break groups,
                Err(cuts) => cuts.into_iter().for_each(|c| mat[c.index()] = true),
            }
        };
        let (groups, shortcuts) = merge(&g, &mat, groups, shortcut, &BTreeSet::new()).unwrap();
        (
            crate::ir::text::print(&emit(&g, &groups, &BTreeSet::new()).unwrap()),
            shortcuts,
        )
    }

    /// A one-layer GPT's CUDA step (2 heads, 64 positions, batch 2) with attention as the plain
    /// math, in `precision`.
    fn plain_attention_step(precision: crate::precision::Precision) -> crate::pipeline::Compiled {
        let opts = crate::pipeline::Options {
            precision: Some(precision),
            fuse_attention: false,
            ..crate::pipeline::Options::for_target(crate::lower::Target::Cuda)
        };
        crate::models::compile_model(
            "gpt:vocab=32,d_model=32,layers=1,heads=2,d_ff=64,seq=64,batch=2",
            &opts,
        )
        .unwrap()
    }

    /// A plain causal attention's backward pass in bf16 recomputes the probabilities from the
    /// scores twice: for the product with the output's gradient, and inside the scores'
    /// gradient.
    /// The two kernels read the scores at the same index and neither reads the other, so they
    /// are one kernel with both outputs; the forward softmax, in the other pass, stays apart.
    #[test]
    fn sibling_kernels_reading_one_value_at_one_index_are_one_kernel() {
        for precision in [
            crate::precision::Precision::F32,
            crate::precision::Precision::Bf16,
        ] {
            let c = plain_attention_step(precision);
            let g = &c.graph;
            let square: Vec<(NodeId, usize)> = g
                .ids()
                .filter_map(|id| match &g.node(id).op {
                    Op::Fused(k) if k.domain == [2, 2, 64, 64] => Some((id, k.outputs.len())),
                    _ => None,
                })
                .collect();
            assert_eq!(square.len(), 2, "{precision:?}: {square:?}");
            let loss = g.outputs["loss"];
            let (forward, backward) = (square[0], square[1]);
            assert!(
                forward.0 < loss && backward.0 > loss,
                "{precision:?}: {square:?}"
            );
            // In bf16 the backward pass recomputes the probabilities (f32 keeps them).
            if precision == crate::precision::Precision::Bf16 {
                assert_eq!(backward.1, 2, "probabilities and the scores' gradient");
            }
        }
    }

    /// The causal mask `j > i` reads nothing: however widely it is broadcast, no kernel
    /// stores it, and each kernel that selects with it computes it from its own indices. The
    /// backward kernel, which merged the forward's mask with its recomputed copy, computes it
    /// once (one compare, not two), so its scores' load sees one condition.
    #[test]
    fn a_mask_computed_from_indices_is_computed_where_it_is_used_and_once_a_kernel() {
        let c = plain_attention_step(crate::precision::Precision::Bf16);
        let g = &c.graph;
        let kernels: Vec<&ingot_kernels::FusedKernel> = g
            .ids()
            .filter_map(|id| match &g.node(id).op {
                Op::Fused(k) => Some(&**k),
                _ => None,
            })
            .collect();
        assert!(
            !kernels.iter().any(|k| k.inputs.is_empty()
                && k.outputs
                    .iter()
                    .all(|o| k.dtypes()[o.value] == crate::ir::DType::Bool)),
            "a kernel that only computes a mask"
        );
        let square: Vec<_> = kernels
            .iter()
            .filter(|k| k.domain == [2, 2, 64, 64])
            .collect();
        assert_eq!(square.len(), 2);
        for k in square {
            assert!(
                k.inputs.iter().all(|i| i.dtype != crate::ir::DType::Bool),
                "{k}"
            );
            let compares = k
                .body
                .iter()
                .filter(|i| matches!(i, ingot_kernels::fused::Inst::Compare { .. }))
                .count();
            assert_eq!(compares, 1, "{k}");
        }
    }

    #[test]
    fn merging_without_lowering_where_it_is_known_to_succeed_makes_the_same_kernels() {
        let chain = {
            let mut t = String::from(
                "ingot-ir 1\n%0 = parameter \"w\" init=normal(0.5) : f32[8]\n%1 = input \"x\" : f32[8]\n",
            );
            for i in 0..40 {
                let op = if i % 2 == 0 {
                    "mul(%PREV, %0)"
                } else {
                    "tanh(%PREV)"
                };
                t += &format!(
                    "%{} = {} : f32[8]\n",
                    i + 2,
                    op.replace("PREV", &(i + 1).to_string())
                );
            }
            t += "%42 = reduce_sum(%41) axes=[0] : f32[1]\n%43 = reshape(%42) : f32[]\noutput \"loss\" = %43\n";
            crate::model::Model::from_ir_text("chain", &t).unwrap()
        };
        // The chain without remat, which would recompute half of it for the backward pass:
        // its point is a long run of elementwise kernels merged one by one.
        for (model, remat) in [
            (
                crate::models::by_name(
                    "gpt:vocab=16,d_model=8,layers=2,heads=2,d_ff=16,seq=4,batch=2",
                )
                .unwrap(),
                true,
            ),
            (crate::models::by_name("mlp").unwrap(), true),
            (chain, false),
        ] {
            let step = crate::autodiff::training_step(&model.graph, &model.optimizer).unwrap();
            let (g, _) = crate::rewrite::simplify(&step.graph, &Default::default()).unwrap();
            let (fast, shortcuts) = fused_text(&g, true, remat);
            let (exact, none) = fused_text(&g, false, remat);
            assert_eq!(fast, exact, "{}", model.name);
            assert_eq!(none, 0);
            assert!(shortcuts > 0, "{}: no merge took the shortcut", model.name);
        }
    }
}
