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
//!    expanded inside each kernel that uses it;
//! 3. [`lower`](mod@lower): each materialized value becomes the root of a kernel; where a root
//!    cannot be expanded (a reduction over other axes, a view a linear index cannot express) the
//!    value in the way is materialized too, and lowering starts again;
//! 4. merging: a kernel is folded into a consumer that reads its outputs at their own index
//!    (same domain, compatible reduce axes) when that creates no cycle, so e.g. a LayerNorm's
//!    statistics, its output and the AdamW moments and parameter each come out of one kernel
//!    with several outputs; then siblings merge: two kernels of one pass over the same domain
//!    that read a full-size value at the same index, neither reaching the other, become one
//!    kernel that reads it once (a plain attention's probabilities and its scores' gradient,
//!    both computed from the scores in the backward pass; a bias's and a gain's gradient sums);
//! 5. in each kernel, every bf16 value stays rounded to bf16 where the IR types it bf16, as the
//!    unfused ops round it: a value a kernel keeps in registers then equals the one another
//!    kernel reads from memory (a max's gradient compares the two; issue 53), and fusion
//!    changes no bit of a bf16 step on the CPU.
//!
//! The result is again a [`Graph`]: leaves, library ops, reshapes of buffers, and `fused`
//! nodes with `result` nodes for their extra outputs, which the planner and runtimes take as is.

pub mod concat;
pub mod index;
pub mod lower;
pub mod matmul_acc;
pub mod remat;
pub mod select;
pub mod triangle;

use crate::error::IrError;
use crate::ir::{Graph, Node, NodeId, Op, Shape, TensorType};
use index::Map;
use ingot_kernels::fused::Access;
use lower::{lower, Domain, Lowered};
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
}

impl Default for FuseOptions {
    fn default() -> Self {
        FuseOptions {
            recompute_ops: 12,
            remat: true,
            merge: true,
            matmul_acc: true,
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

/// How fusion sees an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Leaf,
    /// A library call (its operands and result are buffers), or an extra output of one.
    Library,
    /// Same bytes, new shape: reshape, stop-gradient.
    Alias,
    /// A view that moves elements: broadcast, transpose, slice.
    View,
    /// Full and iota: computed from the index alone.
    Source,
    Elementwise,
    Reduce,
    /// Already fused.
    Fused,
}

pub fn kind(n: &Node) -> Kind {
    match &n.op {
        Op::Leaf { .. } => Kind::Leaf,
        Op::MatMul { .. }
        | Op::MatMulAcc { .. }
        | Op::Gather
        | Op::ScatterAdd { .. }
        | Op::Concat { .. }
        | Op::Attention { .. }
        | Op::AttentionGrad { .. }
        | Op::AllReduce { .. }
        | Op::AllGather { .. }
        | Op::ReduceScatter { .. } => Kind::Library,
        // Dropout is its own kernel (the counter-based draw, see `ingot_kernels::rng`): its
        // operands and result are buffers, and the mask is drawn again wherever it is needed.
        Op::Dropout { .. } => Kind::Library,
        // Before fusion, a result node is an attention's extra output: a buffer that library
        // call writes (fusion makes the fused kernels' own result nodes).
        Op::Result { .. } => Kind::Library,
        Op::Reshape | Op::StopGradient => Kind::Alias,
        Op::Broadcast | Op::Transpose { .. } | Op::Slice { .. } => Kind::View,
        Op::Full { .. } | Op::Iota { .. } => Kind::Source,
        Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Convert => {
            Kind::Elementwise
        }
        Op::Reduce { .. } => Kind::Reduce,
        Op::Fused(_) => Kind::Fused,
        // Convolution and pooling are library calls: operands and result are buffers.
        Op::Window(_) => Kind::Library,
    }
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
        remat::recompute_with(&g, opts.recompute_ops, heavy)?
    } else {
        (g, 0, Vec::new())
    };
    let recomputed_flops = crate::flops::of_graph(&g).saturating_sub(flops_before);
    let mut mat = select::forced(&g);
    let mut rounds = 0;
    let groups = loop {
        rounds += 1;
        select::shared(&g, &mut mat, opts.recompute_ops);
        match lower_all(&g, &mat) {
            Ok(groups) => break groups,
            Err(cuts) => {
                for c in cuts {
                    mat[c.index()] = true;
                }
            }
        }
        if rounds > g.len() + 1 {
            return Err(IrError::Invalid(
                "fusion did not converge (a cut that materializes nothing)".into(),
            ));
        }
    };
    let groups = if opts.merge {
        merged_groups(&g, &mat, groups)?
    } else {
        groups
    };
    let mut graph = emit(&g, &groups)?;
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

/// One future kernel: its roots (materialized values it writes), domain and lowering.
struct Group {
    roots: Vec<NodeId>,
    domain: Domain,
    lowered: Lowered,
}

/// Lowers every materialized computed value as a one-root group; on failure, every cut.
fn lower_all(g: &Graph, mat: &[bool]) -> Result<Vec<Group>, Vec<NodeId>> {
    let mut groups = Vec::new();
    let mut cuts = Vec::new();
    for id in g.ids() {
        if !mat[id.index()] || matches!(kind(g.node(id)), Kind::Leaf | Kind::Library) {
            continue;
        }
        let domain = Domain::of_root(g, id);
        match lower(g, mat, &[id], &domain) {
            Ok(lowered) => groups.push(Group {
                roots: vec![id],
                domain,
                lowered,
            }),
            Err(c) => cuts.extend(c.into_iter().filter(|c| !mat[c.index()])),
        }
    }
    if cuts.is_empty() {
        Ok(groups)
    } else {
        Err(cuts)
    }
}

/// The domain of a group made of `a`'s and `b`'s roots, if they iterate the same space.
fn merged_domain(a: &Domain, b: &Domain) -> Option<Domain> {
    if a.dims != b.dims {
        return None;
    }
    let axes = match (&a.axes, &b.axes) {
        (Some(x), Some(y)) if x != y => return None,
        (Some(x), _) | (_, Some(x)) => Some(x.clone()),
        (None, None) => None,
    };
    Some(Domain {
        dims: a.dims.clone(),
        axes,
    })
}

/// The most reductions one fused kernel holds. An executor evaluates a kernel's body once per
/// reduction level (a softmax is two passes over its row) and keeps per-pass bookkeeping for
/// every instruction, so a kernel's work and scratch grow with its reductions times its body:
/// merging a chain of n row reductions into one kernel cost O(n²) to compile (the growing group
/// lowered again at each merge), to run and to store (2,000 centred layers of f32[8, 8]
/// planned 252 MiB of scratch against 0.5 MiB unfused). A merge that would pass this is not
/// made, and is refused before the merged group is lowered, so each kernel of such a chain
/// costs a bounded amount. The reference models' largest kernel holds 7 reductions (resnet18's
/// batch-norm backward), so none of their kernels change.
pub const MAX_KERNEL_REDUCTIONS: usize = 16;

/// A group while merging: its lowering may be left for the end (see [`merge`]).
struct Part {
    /// Sorted whenever `lowered` is present.
    roots: Vec<NodeId>,
    domain: Domain,
    /// `None` after a merge decided without lowering: lowered once, at the end.
    lowered: Option<Lowered>,
    /// What the kernel loads, with the access of each load (repeats allowed), by the value
    /// each reads through its views. After a merge decided without lowering it may also hold
    /// reads of the group's own roots (see [`merge`]): they name the group itself, so no edge
    /// and no merge comes of them.
    loads: Loads,
    /// No reduction anywhere: no reduce axes, none staged.
    elementwise: bool,
    /// The reductions of its kernel (0 for an elementwise group).
    reductions: usize,
}

/// A group's loads keyed by the value each reads through its views ([`select::base`]): what
/// merging asks of them, "does this group read what that one produces, and how", is answered
/// by looking up the other group's roots, not by scanning every load. A group that absorbs
/// thousands of small producers (a long backward chain) would otherwise be rescanned at each.
#[derive(Default)]
struct Loads(BTreeMap<NodeId, Vec<(NodeId, Access)>>);

impl Loads {
    fn of(g: &Graph, loads: impl IntoIterator<Item = (NodeId, Access)>) -> Loads {
        let mut by_base: BTreeMap<NodeId, Vec<(NodeId, Access)>> = BTreeMap::new();
        for (x, access) in loads {
            by_base
                .entry(select::base(g, x))
                .or_default()
                .push((x, access));
        }
        Loads(by_base)
    }

    /// Every load.
    fn iter(&self) -> impl Iterator<Item = &(NodeId, Access)> {
        self.0.values().flatten()
    }

    /// The loads of `base` (through any view).
    fn of_base(&self, base: NodeId) -> &[(NodeId, Access)] {
        self.0.get(&base).map_or(&[], Vec::as_slice)
    }

    /// The values read, each once.
    fn bases(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.0.keys().copied()
    }

    /// Takes in `other`'s loads (the smaller map is moved into the larger).
    fn absorb(&mut self, mut other: Loads) {
        if other.0.len() > self.0.len() {
            std::mem::swap(self, &mut other);
        }
        for (base, mut v) in other.0 {
            self.0.entry(base).or_default().append(&mut v);
        }
    }
}

impl Part {
    fn of(g: &Graph, gr: Group) -> Part {
        let loads = Loads::of(
            g,
            gr.lowered
                .inputs
                .iter()
                .zip(&gr.lowered.kernel.inputs)
                .map(|(&x, i)| (x, i.access.clone())),
        );
        Part {
            elementwise: gr.domain.axes.is_none() && gr.lowered.kernel.reduce_axes.is_empty(),
            reductions: gr.lowered.kernel.reductions(),
            roots: gr.roots,
            domain: gr.domain,
            lowered: Some(gr.lowered),
            loads,
        }
    }
}

/// [`merge`] with merges decided without lowering where that is known to be safe; should a
/// group merged that way not lower at the end (which the reasoning in [`merge`] rules out), the
/// merge is redone lowering every candidate, so the result never depends on the shortcut.
fn merged_groups(g: &Graph, mat: &[bool], groups: Vec<Group>) -> Result<Vec<Group>, IrError> {
    match merge(g, mat, groups, true) {
        Ok((groups, _)) => Ok(groups),
        Err(_) => {
            let groups = lower_all(g, mat).map_err(|_| {
                IrError::Invalid("fusion: groups that lowered once do not lower again".into())
            })?;
            Ok(merge(g, mat, groups, false)?.0)
        }
    }
}

/// Whether `domain` reduces over some axes but not its last one (a column reduction).
fn is_column_reduction(domain: &Domain) -> bool {
    match &domain.axes {
        Some(axes) => {
            let last = domain.dims.len().saturating_sub(1);
            !axes.is_empty() && !axes.contains(&last) && domain.dims[last] > 1
        }
        None => false,
    }
}

/// Whether merging a producer with roots `p` into a consumer with roots `c` would move backward
/// work (after `loss`) to the forward pass across a library call (`library`, in node order).
fn crosses_into_backward(
    loss: Option<NodeId>,
    library: &[NodeId],
    p: &[NodeId],
    c: &[NodeId],
) -> bool {
    let (Some(loss), Some(&p_last), Some(&c_first)) = (loss, p.iter().max(), c.iter().min()) else {
        return false;
    };
    p_last <= loss && c_first > loss && library.iter().any(|&l| l > p_last && l < c_first)
}

/// Folds producer groups into consumer groups that read their roots (see the module docs).
///
/// Whether a merge is allowed is decided by lowering the merged group, except when the answer is
/// known without it: two purely elementwise groups (no reduce axes, no staged reduction) where
/// the consumer reads each of the producer's roots at the root's own index. Lowering the union
/// then expands exactly the (value, index) pairs the two lowerings expanded, with the
/// consumer's loads of the producer's roots replaced by the producer's own expansions, so it
/// succeeds and computes every producer root; the merged group's loads are the two groups'
/// loads less those. Such merges leave the lowering for the end, so that a chain of n
/// elementwise groups folded one by one costs O(n), not the O(n²) of lowering a growing group
/// after every merge. The merges made are the same either way.
fn merge(
    g: &Graph,
    mat: &[bool],
    groups: Vec<Group>,
    shortcut: bool,
) -> Result<(Vec<Group>, usize), IrError> {
    let mut shortcuts = 0;
    // Units of the dependence graph: groups and library nodes, keyed by a representative node.
    let mut group_of: HashMap<NodeId, usize> = HashMap::new();
    for (i, gr) in groups.iter().enumerate() {
        for &r in &gr.roots {
            group_of.insert(r, i);
        }
    }
    let mut slots: Vec<Option<Part>> = groups.into_iter().map(|gr| Some(Part::of(g, gr))).collect();
    // Union-find over group indices.
    let mut parent: Vec<usize> = (0..slots.len()).collect();
    fn find(parent: &mut [usize], mut x: usize) -> usize {
        while parent[x] != x {
            parent[x] = parent[parent[x]];
            x = parent[x];
        }
        x
    }
    // Library nodes are units too (a path through a matmul is a path).
    let library: Vec<NodeId> = g
        .ids()
        .filter(|&id| kind(g.node(id)) == Kind::Library)
        .collect();
    let lib_unit: HashMap<NodeId, usize> = library
        .iter()
        .enumerate()
        .map(|(i, &id)| (id, slots.len() + i))
        .collect();
    let n_units = slots.len() + library.len();
    let loss = g.outputs.get(crate::autodiff::LOSS).copied();
    // The unit producing a materialized value, if any (leaves produce none).
    let producer = |x: NodeId, parent: &mut Vec<usize>| -> Option<usize> {
        let b = select::base(g, x);
        if let Some(&u) = lib_unit.get(&b) {
            return Some(u);
        }
        group_of.get(&b).map(|&i| find(parent, i))
    };
    // The new values written over each updated leaf, and (filled below) the units reading it.
    let mut new_values: HashMap<NodeId, Vec<NodeId>> = HashMap::new();
    let mut leaf_of_value: HashMap<NodeId, NodeId> = HashMap::new();
    for up in &g.updates {
        new_values.entry(up.target).or_default().push(up.value);
        leaf_of_value.insert(select::base(g, up.value), up.target);
    }
    let mut leaf_readers: HashMap<NodeId, Vec<usize>> = HashMap::new();
    // The unit graph's edges, both ways: `succ[p]` holds the units reading what `p` produces,
    // and the writer of a leaf's new value after every reader of the leaf (anti-dependences).
    // Kept up to date as units merge (rebuilding them after every merge made the pass quadratic).
    let mut succ: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n_units];
    let mut pred: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n_units];
    for u in 0..n_units {
        let inputs: Vec<NodeId> = if u < slots.len() {
            slots[u]
                .as_ref()
                .map_or_else(Vec::new, |s| s.loads.bases().collect())
        } else {
            g.node(library[u - slots.len()]).inputs.to_vec()
        };
        for x in inputs {
            if let Some(p) = producer(x, &mut parent) {
                if p != u {
                    succ[p].insert(u);
                    pred[u].insert(p);
                }
            }
            // Anti-dependences of in-place updates: a unit reading a parameter or state runs
            // before the unit writing its new value, so no merge may put a value that reader
            // needs into that writer (the schedule would have a cycle).
            let leaf = select::base(g, x);
            if new_values.contains_key(&leaf) {
                leaf_readers.entry(leaf).or_default().push(u);
            }
            for &v in new_values.get(&leaf).into_iter().flatten() {
                if let Some(w) = producer(v, &mut parent) {
                    if w != u {
                        succ[u].insert(w);
                        pred[w].insert(u);
                    }
                }
            }
        }
    }
    let mut levels = Levels::of(&succ, &pred);
    // Producers in order of their first root.
    for p0 in 0..slots.len() {
        let p = find(&mut parent, p0);
        if p != p0 || slots[p].is_none() {
            continue;
        }
        // Candidates read what p produces; an anti-dependence alone makes none. A consumer
        // the merge could never join (its reductions and p's over the limit) is passed over
        // before its loads are scanned: one kernel that loads thousands of cut reductions is
        // a successor of each of their producers.
        let Some(pg) = slots[p].as_ref() else {
            continue;
        };
        let consumers: Vec<usize> = succ[p]
            .iter()
            .copied()
            .filter(|&c| {
                c < slots.len()
                    && slots[c].as_ref().is_some_and(|cg| {
                        pg.reductions + cg.reductions <= MAX_KERNEL_REDUCTIONS
                            && reads_roots_of(cg, pg, p, &mut |x| producer(x, &mut parent))
                    })
            })
            .collect();
        for c in consumers {
            let (Some(pg), Some(cg)) = (&slots[p], &slots[c]) else {
                continue;
            };
            let Some(domain) = merged_domain(&pg.domain, &cg.domain) else {
                continue;
            };
            if pg.reductions + cg.reductions > MAX_KERNEL_REDUCTIONS {
                continue;
            }
            // A column reduction (over leading axes) runs on few blocks, one per group of
            // columns: full-size outputs written from it would be written by a small fraction
            // of the GPU. Such outputs stay in a kernel of their own.
            if is_column_reduction(&domain)
                && pg
                    .roots
                    .iter()
                    .chain(&cg.roots)
                    .any(|&r| g.ty(r).shape.numel() == domain.dims.iter().product::<usize>())
            {
                continue;
            }
            // No other path p -> ... -> c.
            if reaches_avoiding(&succ, levels.as_ref(), p, c) {
                continue;
            }
            // A backward kernel that follows library work is not pulled into the forward
            // pass: the merged kernel runs at the forward kernel's place, so its backward
            // outputs would be held through everything in between (a softmax recomputed for
            // the backward pass, merged into the forward softmax, would be stored twice). The
            // loss kernel and its gradient, with nothing between them, still merge.
            if crosses_into_backward(loss, &library, &pg.roots, &cg.roots) {
                continue;
            }
            // A running sum of accumulated gradients is added when its micro-batch is done,
            // not folded into its reader (the next sum, or the update after the last
            // micro-batch), which would hold every micro-batch's gradient until then.
            if pg.roots.iter().any(|&r| select::is_accumulation(g, r)) {
                continue;
            }
            let own_index =
                Map::identity(domain.dims.len()).access(&domain.dims, domain.dims.len());
            let known = shortcut
                && pg.elementwise
                && cg.elementwise
                && loads_of_roots(cg, pg, p, &mut |x| producer(x, &mut parent))
                    .iter()
                    .all(|(x, access)| select::base(g, *x) == *x && *access == own_index);
            let (mut pg, mut cg) = (
                slots[p].take().expect("checked above"),
                slots[c].take().expect("checked above"),
            );
            let merged = if known {
                // Append the smaller root list to the larger, sorting only at the end.
                let (mut roots, more) = if pg.roots.len() >= cg.roots.len() {
                    (std::mem::take(&mut pg.roots), std::mem::take(&mut cg.roots))
                } else {
                    (std::mem::take(&mut cg.roots), std::mem::take(&mut pg.roots))
                };
                roots.extend(more);
                // The loads too, without taking out the consumer's reads of p's roots: after
                // the merge those map to the merged group itself and make no edge, and a
                // group that absorbs thousands of small producers is not rescanned at each.
                let mut loads = std::mem::take(&mut pg.loads);
                loads.absorb(std::mem::take(&mut cg.loads));
                Part {
                    roots,
                    domain,
                    lowered: None,
                    loads,
                    elementwise: true,
                    reductions: 0,
                }
            } else {
                let mut roots: Vec<NodeId> = pg.roots.iter().chain(&cg.roots).copied().collect();
                roots.sort();
                // The merged kernel must compute the producer's roots, not load them.
                let lowered = lower(g, mat, &roots, &domain).ok().filter(|l| {
                    l.kernel.reductions() <= MAX_KERNEL_REDUCTIONS
                        && !l
                            .inputs
                            .iter()
                            .any(|&x| producer(x, &mut parent) == Some(p))
                });
                let Some(lowered) = lowered else {
                    slots[p] = Some(pg);
                    slots[c] = Some(cg);
                    continue;
                };
                Part::of(
                    g,
                    Group {
                        roots,
                        domain,
                        lowered,
                    },
                )
            };
            shortcuts += usize::from(known);
            parent[p] = c;
            // p's readers now read c; p's and c's operands are the merged kernel's.
            for w in std::mem::take(&mut succ[p]) {
                pred[w].remove(&p);
                if w != c {
                    succ[c].insert(w);
                    pred[w].insert(c);
                }
            }
            let old_preds: Vec<usize> = std::mem::take(&mut pred[p])
                .into_iter()
                .chain(std::mem::take(&mut pred[c]))
                .collect();
            for &q in &old_preds {
                succ[q].remove(&p);
                succ[q].remove(&c);
            }
            if known {
                // The merged loads are both groups' loads less p's roots: the same producers.
                for q in old_preds {
                    if q != p && q != c {
                        succ[q].insert(c);
                        pred[c].insert(q);
                    }
                }
            } else {
                for x in merged.loads.bases() {
                    if let Some(q) = producer(x, &mut parent) {
                        if q != c {
                            succ[q].insert(c);
                            pred[c].insert(q);
                        }
                    }
                }
                // The readers of every leaf whose new value the merged kernel writes.
                for r in &merged.roots {
                    let Some(leaf) = leaf_of_value.get(r) else {
                        continue;
                    };
                    for &q0 in leaf_readers.get(leaf).into_iter().flatten() {
                        let q = if q0 < slots.len() {
                            find(&mut parent, q0)
                        } else {
                            q0
                        };
                        if q != c {
                            succ[q].insert(c);
                            pred[c].insert(q);
                        }
                    }
                }
            }
            slots[c] = Some(merged);
            if let Some(l) = &mut levels {
                let p_level = l.0[p];
                l.merged(&succ, c, p_level);
            }
            break;
        }
    }
    // Siblings: two kernels of one pass over the same domain that read a full-size value at
    // the same index, neither reaching the other, become one kernel that reads it once.
    // GPT-2's plain attention backward recomputes the probabilities twice from the scores:
    // once for the product with the output's gradient, once inside the scores' gradient.
    let lib_flops: Vec<u64> = library
        .iter()
        .map(|&id| crate::flops::of_node(g, id))
        .collect();
    // Which groups read each computed value: a sibling shares a load with `b`, so only these
    // are looked at (trying every earlier group for every group was quadratic in depth). Kept
    // a superset as groups merge: entries name a group or one merged into another since.
    // Only full-size reads count (what a sibling merge saves), so a small value every group
    // reads (a scalar of the optimizer's) does not make every group a candidate.
    let mut readers: HashMap<NodeId, Vec<usize>> = HashMap::new();
    let full_reads = |part: &Part| -> Vec<NodeId> {
        let full: usize = part.domain.dims.iter().product();
        (part.loads.0.iter())
            .filter(|(base, loads)| {
                !matches!(kind(g.node(**base)), Kind::Leaf)
                    && loads.iter().any(|(x, _)| g.ty(*x).shape.numel() == full)
            })
            .map(|(base, _)| *base)
            .collect()
    };
    for (i, slot) in slots.iter().enumerate() {
        for x in slot.iter().flat_map(full_reads) {
            readers.entry(x).or_default().push(i);
        }
    }
    let mut candidates: BTreeSet<usize> = BTreeSet::new();
    for b0 in 0..slots.len() {
        let b = find(&mut parent, b0);
        if b != b0 || slots[b].is_none() {
            continue;
        }
        // The earlier groups sharing a computed load with `b`, tried from the nearest down as
        // before; a merge adds those sharing one with what `b` took in, below the one taken.
        candidates.clear();
        let sharing = |readers: &HashMap<NodeId, Vec<usize>>,
                       part: &Part,
                       below: usize,
                       parent: &mut Vec<usize>,
                       out: &mut BTreeSet<usize>| {
            for x in full_reads(part) {
                for &r0 in readers.get(&x).into_iter().flatten() {
                    let r = find(parent, r0);
                    if r < below {
                        out.insert(r);
                    }
                }
            }
        };
        if let Some(pb) = &slots[b] {
            sharing(&readers, pb, b0, &mut parent, &mut candidates);
        }
        while let Some(a0) = candidates.pop_last() {
            let a = find(&mut parent, a0);
            if a != a0 || a == b {
                continue;
            }
            let (Some(pa), Some(pb)) = (&slots[a], &slots[b]) else {
                continue;
            };
            let Some(domain) = merged_domain(&pa.domain, &pb.domain) else {
                continue;
            };
            let full: usize = domain.dims.iter().product();
            let mut shared: Vec<NodeId> = (pa.loads.iter())
                .filter(|(x, access)| {
                    g.ty(*x).shape.numel() == full
                        && !matches!(kind(g.node(select::base(g, *x))), Kind::Leaf)
                        && (pb.loads.of_base(select::base(g, *x)))
                            .iter()
                            .any(|(y, other)| y == x && other == access)
                })
                .map(|(x, _)| *x)
                .collect();
            shared.sort();
            shared.dedup();
            let shared_bytes: u64 = shared.iter().map(|&x| g.ty(x).bytes() as u64).sum();
            if shared.is_empty()
                || pa.reductions + pb.reductions > MAX_KERNEL_REDUCTIONS
                || (is_column_reduction(&domain)
                    && (pa.roots.iter().chain(&pb.roots)).any(|&r| g.ty(r).shape.numel() == full))
            {
                continue;
            }
            // One pass: both in the forward pass or both after it.
            let after = |roots: &[NodeId]| loss.is_some_and(|l| roots.iter().all(|&r| r > l));
            let before = |roots: &[NodeId]| loss.is_none_or(|l| roots.iter().all(|&r| r <= l));
            let same_pass =
                (after(&pa.roots) && after(&pb.roots)) || (before(&pa.roots) && before(&pb.roots));
            if !same_pass
                || (pa.roots.iter().chain(&pb.roots)).any(|&r| select::is_accumulation(g, r))
                || succ[a].contains(&b)
                || succ[b].contains(&a)
                || reaches_avoiding(&succ, levels.as_ref(), a, b)
                || reaches_avoiding(&succ, levels.as_ref(), b, a)
                || delays_more_than_it_saves(&succ, &pred, &lib_flops, a, b, shared_bytes)
            {
                continue;
            }
            let mut roots: Vec<NodeId> = pa.roots.iter().chain(&pb.roots).copied().collect();
            roots.sort();
            let Some(lowered) = lower(g, mat, &roots, &domain)
                .ok()
                .filter(|l| l.kernel.reductions() <= MAX_KERNEL_REDUCTIONS)
            else {
                continue;
            };
            let merged = Part::of(
                g,
                Group {
                    roots,
                    domain,
                    lowered,
                },
            );
            slots[a] = None;
            parent[a] = b;
            for w in std::mem::take(&mut succ[a]) {
                pred[w].remove(&a);
                succ[b].insert(w);
                pred[w].insert(b);
            }
            for q in std::mem::take(&mut pred[a]) {
                succ[q].remove(&a);
                succ[q].insert(b);
                pred[b].insert(q);
            }
            for x in full_reads(&merged) {
                readers.entry(x).or_default().push(b);
            }
            sharing(&readers, &merged, a0, &mut parent, &mut candidates);
            slots[b] = Some(merged);
            if let Some(l) = &mut levels {
                let a_level = l.0[a];
                l.merged(&succ, b, a_level);
            }
        }
    }
    let groups = slots
        .into_iter()
        .flatten()
        .map(|mut part| {
            let lowered = match part.lowered {
                Some(l) => l,
                None => {
                    part.roots.sort();
                    lower(g, mat, &part.roots, &part.domain).map_err(|cuts| {
                        IrError::Invalid(format!(
                            "fusion: a merged elementwise kernel does not lower (cuts {cuts:?}; a bug: please report it)"
                        ))
                    })?
                }
            };
            Ok(Group {
                roots: part.roots,
                domain: part.domain,
                lowered,
            })
        })
        .collect::<Result<_, IrError>>()?;
    Ok((groups, shortcuts))
}

/// Whether merging sibling units `a` and `b` (neither reaching the other), which read
/// `shared_bytes` once instead of twice, may cost more than that read: where one of them gains
/// a library call among its ancestors (the other's data-gradient product, say), everything
/// reading it now waits for that call, and the library calls reading it (a weight gradient's
/// product) can no longer run beside the other's chain.
///
/// The read saved takes about `shared_bytes / bandwidth`; the overlap lost is at most those
/// library calls' time, about `flops / peak`. An H100's peak over its bandwidth is about 300
/// flops a byte in bf16 and 150 in TF32, so a merge that delays library calls is made only
/// where they do at most [`FLOPS_PER_BYTE_SAVED`] flops a byte read less. Measured on an H200
/// (session 12): merging GPT-2's recomputed GELU and LayerNorm outputs (read by the weight
/// gradients) into the kernels of the data gradients beside them made the TF32 step's
/// dependency-graph replay 1.6 ms slower (its parallel speedup over the serial chain fell from
/// 1.057 to 1.001), while the plain attention's probabilities merged into the scores' gradient
/// (12.9 GFLOP of product against 201 MB of scores) made the bf16 step 0.9 ms faster.
fn delays_more_than_it_saves(
    succ: &[BTreeSet<usize>],
    pred: &[BTreeSet<usize>],
    lib_flops: &[u64],
    a: usize,
    b: usize,
    shared_bytes: u64,
) -> bool {
    let groups = succ.len() - lib_flops.len();
    let most = shared_bytes.saturating_mul(FLOPS_PER_BYTE_SAVED);
    // The flops of the library calls reading `x`: what would wait, if anything does. Asked
    // first, since it needs no walk: most pairs have no heavy library reader at all.
    let readers_flops = |x: usize| -> u64 {
        (succ[x].iter())
            .filter(|&&u| u >= groups)
            .map(|&u| lib_flops[u - groups])
            .sum()
    };
    let (flops_a, flops_b) = (readers_flops(a), readers_flops(b));
    if flops_a <= most && flops_b <= most {
        return false;
    }
    let ancestors = |x: usize| {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<usize> = pred[x].iter().copied().collect();
        while let Some(u) = stack.pop() {
            if seen.insert(u) {
                stack.extend(pred[u].iter().copied());
            }
        }
        seen
    };
    // Whether `x`'s library readers would newly wait: a library call among the other's
    // ancestors that is not among `x`'s (a small kernel alone, a mask's, delays little).
    let (of_a, of_b) = (ancestors(a), ancestors(b));
    let waits = |before: &BTreeSet<usize>, other: &BTreeSet<usize>| {
        other.iter().any(|&q| q >= groups && !before.contains(&q))
    };
    (flops_a > most && waits(&of_a, &of_b)) || (flops_b > most && waits(&of_b, &of_a))
}

/// See [`delays_more_than_it_saves`].
const FLOPS_PER_BYTE_SAVED: u64 = 100;

/// Whether `c` loads a value `p` (unit `p_unit`) produces: `p`'s roots looked up among `c`'s
/// loads, or `c`'s loaded values asked for their producer, whichever list is shorter.
fn reads_roots_of(
    c: &Part,
    p: &Part,
    p_unit: usize,
    producer: &mut dyn FnMut(NodeId) -> Option<usize>,
) -> bool {
    if p.roots.len() <= c.loads.0.len() {
        p.roots.iter().any(|r| c.loads.0.contains_key(r))
    } else {
        c.loads.bases().any(|b| producer(b) == Some(p_unit))
    }
}

/// The loads of `c` that read values `p` (unit `p_unit`) produces.
fn loads_of_roots(
    c: &Part,
    p: &Part,
    p_unit: usize,
    producer: &mut dyn FnMut(NodeId) -> Option<usize>,
) -> Vec<(NodeId, Access)> {
    let bases: Vec<NodeId> = if p.roots.len() <= c.loads.0.len() {
        p.roots.clone()
    } else {
        c.loads
            .bases()
            .filter(|&b| producer(b) == Some(p_unit))
            .collect()
    };
    bases
        .into_iter()
        .flat_map(|b| c.loads.of_base(b).iter().cloned())
        .collect()
}

/// Levels of the unit graph: every edge `u -> w` has `level[u] < level[w]`, so a search for a
/// path to `to` never needs to enter a unit at `to`'s level or above. Kept valid as units
/// merge ([`Levels::merged`]), which makes [`reaches_avoiding`] visit only the units between
/// the two ends instead of everything downstream of the first: on a chain of n units, O(n)
/// merges of O(1) searches rather than O(n) searches of O(n) units each.
struct Levels(Vec<usize>);

impl Levels {
    /// Longest-path levels by Kahn's algorithm; `None` if the graph has a cycle (then no search
    /// is pruned).
    fn of(succ: &[BTreeSet<usize>], pred: &[BTreeSet<usize>]) -> Option<Levels> {
        let n = succ.len();
        let mut level = vec![0usize; n];
        let mut waiting: Vec<usize> = pred.iter().map(BTreeSet::len).collect();
        let mut ready: Vec<usize> = (0..n).filter(|&u| waiting[u] == 0).collect();
        let mut done = 0;
        while let Some(u) = ready.pop() {
            done += 1;
            for &w in &succ[u] {
                level[w] = level[w].max(level[u] + 1);
                waiting[w] -= 1;
                if waiting[w] == 0 {
                    ready.push(w);
                }
            }
        }
        (done == n).then_some(Levels(level))
    }

    /// After `into` took over another unit's edges (whose level was `other`): `into` is at
    /// least as deep as either, and every unit downstream is pushed below it where needed.
    fn merged(&mut self, succ: &[BTreeSet<usize>], into: usize, other: usize) {
        self.0[into] = self.0[into].max(other);
        let mut work = vec![into];
        while let Some(u) = work.pop() {
            for &w in &succ[u] {
                if self.0[w] <= self.0[u] {
                    self.0[w] = self.0[u] + 1;
                    work.push(w);
                }
            }
        }
    }
}

/// True if `to` is reachable from `from` by a path of at least two edges. With `levels`, units
/// at `to`'s level or deeper are not entered (no path from them can reach it).
fn reaches_avoiding(
    succ: &[BTreeSet<usize>],
    levels: Option<&Levels>,
    from: usize,
    to: usize,
) -> bool {
    let shallow = |u: usize| levels.is_none_or(|l| l.0[u] < l.0[to]);
    let mut stack: Vec<usize> = succ[from]
        .iter()
        .copied()
        .filter(|&u| u != to && shallow(u))
        .collect();
    let mut seen = BTreeSet::new();
    while let Some(u) = stack.pop() {
        if seen.insert(u) {
            for &w in &succ[u] {
                if w == to {
                    return true;
                }
                if shallow(w) {
                    stack.push(w);
                }
            }
        }
    }
    false
}

/// Builds the fused graph: leaves, then units in dependence order (ties: earliest root).
fn emit(g: &Graph, groups: &[Group]) -> Result<Graph, IrError> {
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
                let k = triangle::structural_zero_products(&gr.lowered.kernel);
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
    use super::*;

    /// Random DAGs as edge sets over `n` units, each edge from a lower to a higher unit.
    fn random_dag(seed: u64, n: usize) -> (Vec<BTreeSet<usize>>, Vec<BTreeSet<usize>>) {
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as usize
        };
        let (mut succ, mut pred) = (vec![BTreeSet::new(); n], vec![BTreeSet::new(); n]);
        for (w, into_w) in pred.iter_mut().enumerate().skip(1) {
            for _ in 0..next() % 3 {
                let u = next() % w;
                succ[u].insert(w);
                into_w.insert(u);
            }
        }
        (succ, pred)
    }

    fn levels_hold(l: &Levels, succ: &[BTreeSet<usize>], live: &[bool]) -> bool {
        (0..succ.len())
            .filter(|&u| live[u])
            .all(|u| succ[u].iter().all(|&w| l.0[u] < l.0[w]))
    }

    #[test]
    fn a_search_pruned_by_levels_finds_every_path_the_full_search_finds_through_merges() {
        for seed in 0..60 {
            let n = 40;
            let (mut succ, mut pred) = random_dag(seed, n);
            let mut levels = Levels::of(&succ, &pred).expect("a DAG");
            let mut live = vec![true; n];
            // Merge along edges that have no other path (as fusion does), checking each time
            // that the levels still increase along every edge and that the pruned search
            // answers as the full one does.
            for _ in 0..25 {
                let edges: Vec<(usize, usize)> = (0..n)
                    .filter(|&u| live[u])
                    .flat_map(|u| succ[u].iter().map(move |&w| (u, w)))
                    .collect();
                for &(a, b) in &edges {
                    for (from, to) in [(a, b), (b, a)] {
                        assert_eq!(
                            reaches_avoiding(&succ, Some(&levels), from, to),
                            reaches_avoiding(&succ, None, from, to),
                            "seed {seed}: {from} -> {to}"
                        );
                    }
                }
                let Some(&(p, c)) = edges
                    .iter()
                    .find(|&&(p, c)| !reaches_avoiding(&succ, None, p, c))
                else {
                    break;
                };
                // p into c: p's edges become c's.
                for w in std::mem::take(&mut succ[p]) {
                    pred[w].remove(&p);
                    if w != c {
                        succ[c].insert(w);
                        pred[w].insert(c);
                    }
                }
                for q in std::mem::take(&mut pred[p]) {
                    succ[q].remove(&p);
                    if q != c {
                        succ[q].insert(c);
                        pred[c].insert(q);
                    }
                }
                live[p] = false;
                let p_level = levels.0[p];
                levels.merged(&succ, c, p_level);
                assert!(levels_hold(&levels, &succ, &live), "seed {seed}");
            }
        }
    }

    #[test]
    fn a_cycle_gives_no_levels_and_the_search_then_prunes_nothing() {
        let succ = vec![
            BTreeSet::from([1]),
            BTreeSet::from([2]),
            BTreeSet::from([0]),
        ];
        let pred = vec![
            BTreeSet::from([2]),
            BTreeSet::from([0]),
            BTreeSet::from([1]),
        ];
        assert!(Levels::of(&succ, &pred).is_none());
        assert!(reaches_avoiding(&succ, None, 0, 2));
    }

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
            match lower_all(&g, &mat) {
                Ok(groups) => break groups,
                Err(cuts) => cuts.into_iter().for_each(|c| mat[c.index()] = true),
            }
        };
        let (groups, shortcuts) = merge(&g, &mat, groups, shortcut).unwrap();
        (
            crate::ir::text::print(&emit(&g, &groups).unwrap()),
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
        crate::pipeline::compile_model(
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
            crate::models::Model::from_ir_text("chain", &t).unwrap()
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
