//! The rewrite pass: equality saturation with [egg](https://docs.rs/egg) over the step graph, then
//! a memory-aware extraction back into a [`Graph`].
//!
//! ```text
//! trace -> autodiff -> rewrite -> fuse -> schedule -> plan
//! ```
//!
//! [`simplify`] puts every node of the step graph into an e-graph ([`lang`]: one e-node per op;
//! identical subexpressions hash-cons into one e-class, which is common-subexpression
//! elimination), runs the [`rules`] until nothing new is learnt or a limit is hit, and extracts
//! the cheapest equivalent graph ([`extract`]), where the cost is the bytes the step
//! materializes, each shared value counted once.
//!
//! # What the output graph keeps
//! - It verifies; it has the same leaves (names, kinds, inits, types) in the same relative order,
//!   the same output names in the same order (each possibly naming a new node), and the same
//!   updates (same targets, same order). Its values are the input's, up to the float rounding of
//!   folded constants and reassociated constant factors.
//! - Its node order follows the input's: a node is emitted at the position of the smallest input
//!   node id that landed in its e-class (children first, when a rewrite made them new), and
//!   leaves keep their order. The scheduler's "traced" order is the node order, and forward
//!   before backward matters for memory.
//! - It is deterministic: egg is deterministic given the insertion order, rules search classes
//!   in id order, and the default limits never let the clock decide the result on the reference
//!   models (they stop by saturation).
//!
//! # Type safety
//! Each e-class knows its [`TensorType`] ([`analysis`]). A rule that builds
//! an ill-typed node or equates classes of different types is a bug; it is recorded, the run
//! stops, and [`simplify`] returns an error naming the rule and both types.
//!
//! # Example
//! ```
//! use ingot_compiler::ir::{DType, Graph, Init};
//! use ingot_compiler::rewrite::{simplify, RewriteOptions};
//!
//! let mut g = Graph::new();
//! let w = g.parameter("w", [4, 3], DType::F32, Init::Zeros).unwrap();
//! let x = g.input("x", [2, 3], DType::F32).unwrap();
//! let wt = g.transpose_last(w).unwrap(); // materialized before the rewrite
//! let y = g.matmul(x, wt).unwrap();
//! let y1 = g.mul_scalar(y, 1.0).unwrap(); // a no-op
//! g.set_output("y", y1).unwrap();
//!
//! let (s, report) = simplify(&g, &RewriteOptions::default()).unwrap();
//! // x, w and one matmul reading w transposed in place.
//! assert_eq!(s.len(), 3);
//! assert_eq!(report.stop_reason, "saturated");
//! ```

pub mod analysis;
pub mod extract;
pub mod index;
pub mod lang;
pub mod rules;

#[cfg(test)]
mod tests;

use crate::error::IrError;
use crate::ir::{Graph, NodeId, Op, TensorType};
use analysis::{numel, EGraph, Facts};
use egg::{Id, StopReason};
use lang::{ENode, Kind};
use rules::Rule;
use smallvec::SmallVec;
use std::fmt;
use std::time::Duration;

/// Limits of one equality-saturation run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RewriteOptions {
    /// Stop once the e-graph holds more e-nodes than this.
    pub node_limit: usize,
    /// Stop after this many iterations (search every rule, apply every match, rebuild).
    pub iter_limit: usize,
    /// Stop after this long. A run stopped by the clock is not reproducible, so the defaults
    /// leave this far out of reach of the reference models.
    pub time_limit: Duration,
    /// Rules left out, by name (as [`RewriteReport::rules_applied`] names them): to tell which
    /// rule changes a step's numbers. Empty by default; a name no rule has is an error.
    pub without: Vec<String>,
}

impl Default for RewriteOptions {
    /// Generous limits: every reference model (gpt2 included) saturates within a few
    /// iterations, far below the node limit, in seconds.
    fn default() -> RewriteOptions {
        RewriteOptions {
            node_limit: 500_000,
            iter_limit: 64,
            time_limit: Duration::from_secs(300),
            without: Vec::new(),
        }
    }
}

/// What a rewrite run did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RewriteReport {
    /// Why egg's runner stopped: `saturated`, or which limit was hit.
    pub stop_reason: String,
    /// Iterations run (the last one is the one that found nothing new, when saturated).
    pub iterations: usize,
    /// Size of the final e-graph.
    pub egraph_nodes: usize,
    pub egraph_classes: usize,
    pub nodes_before: usize,
    pub nodes_after: usize,
    /// Result bytes of every non-leaf node, summed: a rough "materialized" figure.
    pub bytes_before: usize,
    pub bytes_after: usize,
    /// For each rule, in rule order: how many of its applications changed the e-graph.
    pub rules_applied: Vec<(String, usize)>,
}

impl fmt::Display for RewriteReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "rewrite: {} after {} iterations; e-graph {} e-nodes in {} e-classes",
            self.stop_reason, self.iterations, self.egraph_nodes, self.egraph_classes
        )?;
        writeln!(
            f,
            "nodes {} -> {}, materialized bytes {} -> {}",
            self.nodes_before, self.nodes_after, self.bytes_before, self.bytes_after
        )?;
        let fired: Vec<String> = self
            .rules_applied
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(r, n)| format!("{r} {n}"))
            .collect();
        write!(f, "rules: {}", fired.join(", "))
    }
}

/// Simplifies a step graph (see the module docs for what the result keeps).
///
/// Fails on a graph that does not verify, on a graph that was already fused (`fused` and
/// `result` nodes: the rewrite runs before fusion), when `opts.without` names no rule, and
/// when a rule breaks type safety (a bug).
pub fn simplify(g: &Graph, opts: &RewriteOptions) -> Result<(Graph, RewriteReport), IrError> {
    let all = rules::all();
    if let Some(name) = (opts.without.iter()).find(|n| !all.iter().any(|r| r.name == n.as_str())) {
        let names: Vec<&str> = all.iter().map(|r| r.name).collect();
        return Err(IrError::Invalid(format!(
            "rewrite: no rule is named {name:?} (the rules: {})",
            names.join(", ")
        )));
    }
    let rules: Vec<Rule> = (all.into_iter())
        .filter(|r| !opts.without.iter().any(|n| n == r.name))
        .collect();
    simplify_with(g, opts, &rules)
}

/// [`simplify`] with a chosen rule set.
pub(crate) fn simplify_with(
    g: &Graph,
    opts: &RewriteOptions,
    rules: &[Rule],
) -> Result<(Graph, RewriteReport), IrError> {
    g.verify()?;
    let (egraph, class_of, leaf_nodes) = to_egraph(g)?;
    let runner = saturate(egraph, opts, rules);
    let mut counts: Vec<(String, usize)> = rules.iter().map(|r| (r.name.to_string(), 0)).collect();
    for it in &runner.iterations {
        for (name, n) in &it.applied {
            if let Some(slot) = counts.iter_mut().find(|(r, _)| r == name.as_str()) {
                slot.1 += n;
            }
        }
    }
    let stop_reason = describe(runner.stop_reason.as_ref(), opts);
    let iterations = runner.iterations.len();
    let mut egraph = runner.egraph;
    egraph.rebuild();
    if !egraph.analysis.errors.is_empty() {
        return Err(IrError::Invalid(format!(
            "rewrite: {}",
            egraph.analysis.errors.join("; ")
        )));
    }

    let class = |id: NodeId| egraph.find(class_of[id.index()]);
    let roots: Vec<Id> = g
        .outputs
        .values()
        .chain(g.updates.iter().map(|u| &u.value))
        .map(|&id| class(id))
        .collect();
    let ex =
        extract::extract(&egraph, &roots).map_err(|e| IrError::Invalid(format!("rewrite: {e}")))?;
    let mut out = emit(g, &egraph, &class_of, &leaf_nodes, &ex.choice)?;
    let (egraph_nodes, egraph_classes) =
        (egraph.total_number_of_nodes(), egraph.number_of_classes());
    // The e-graph and the extraction are the rewrite's largest data (a hundred thousand classes
    // at 200 layers): freed before the output is checked, so that the memory is reused warm
    // rather than new pages touched (issue 53).
    drop((ex, egraph, class_of));
    crate::ir::origin::fill_missing(&mut out);
    out.verify()?;
    let report = RewriteReport {
        stop_reason,
        iterations,
        egraph_nodes,
        egraph_classes,
        nodes_before: g.len(),
        nodes_after: out.len(),
        bytes_before: materialized_bytes(g),
        bytes_after: materialized_bytes(&out),
        rules_applied: counts,
    };
    Ok((out, report))
}

/// egg's run of `rules` over `egraph` within `opts`' limits. Before each iteration a hook stops
/// the run at the first type error and indexes the classes for the rules' search ([`index`]).
fn saturate(
    egraph: EGraph,
    opts: &RewriteOptions,
    rules: &[Rule],
) -> egg::Runner<ENode, Facts, ()> {
    let rewrites: Vec<egg::Rewrite<ENode, Facts>> = rules.iter().map(|r| r.rewrite()).collect();
    egg::Runner::<ENode, Facts, ()>::new(Facts::default())
        .with_egraph(egraph)
        .with_scheduler(egg::SimpleScheduler)
        .with_iter_limit(opts.iter_limit)
        .with_node_limit(opts.node_limit)
        .with_time_limit(opts.time_limit)
        .with_hook(|runner| match runner.egraph.analysis.errors.first() {
            None => {
                index::ClassIndex::build(&mut runner.egraph);
                Ok(())
            }
            Some(e) => Err(e.clone()),
        })
        .run(&rewrites)
}

/// Result bytes of every non-leaf node, summed (saturating).
pub fn materialized_bytes(g: &Graph) -> usize {
    g.nodes()
        .iter()
        .filter(|n| !n.op.is_leaf())
        .map(|n| bytes(&n.ty))
        .fold(0usize, usize::saturating_add)
}

fn bytes(t: &TensorType) -> usize {
    numel(t.shape.dims())
        .and_then(|n| n.checked_mul(t.dtype.size()))
        .unwrap_or(usize::MAX)
}

/// egg's stop reason, in words.
fn describe(reason: Option<&StopReason>, opts: &RewriteOptions) -> String {
    match reason {
        None => "not run".into(),
        Some(StopReason::Saturated) => "saturated".into(),
        Some(StopReason::IterationLimit(n)) => format!("iteration limit ({n} iterations)"),
        Some(StopReason::NodeLimit(n)) => format!(
            "node limit (the e-graph grew to {n} e-nodes; the limit is {})",
            opts.node_limit
        ),
        Some(StopReason::TimeLimit(s)) => format!(
            "time limit ({s:.2} s; the limit is {:.2} s)",
            opts.time_limit.as_secs_f64()
        ),
        Some(StopReason::Other(m)) => format!("stopped: {m}"),
    }
}

/// The e-graph of `g`: each node's e-class (by node index), and the leaves in order.
fn to_egraph(g: &Graph) -> Result<(EGraph, Vec<Id>, Vec<NodeId>), IrError> {
    let mut facts = Facts::default();
    let mut leaf_nodes = Vec::new();
    for id in g.ids() {
        let n = g.node(id);
        match &n.op {
            Op::Leaf { .. } => {
                leaf_nodes.push(id);
                facts.leaf_types.push(n.ty.clone());
            }
            Op::Result { .. }
                if n.inputs
                    .first()
                    .is_some_and(|&k| g.node(k).op.is_multi_output_call()) => {}
            Op::Fused(_) | Op::Result { .. } => {
                return Err(IrError::Invalid(format!(
                    "rewrite runs before fusion, but node {id} is a {} node: simplify the \
                     unfused step graph",
                    n.op.name()
                )))
            }
            _ => {}
        }
    }
    let mut egraph = EGraph::new(facts);
    let mut class_of: Vec<Id> = Vec::with_capacity(g.len());
    let mut leaf_count = 0u32;
    for id in g.ids() {
        let n = g.node(id);
        let enode = if n.op.is_leaf() {
            leaf_count += 1;
            ENode::leaf(Kind::Leaf(leaf_count - 1))
        } else {
            let kind = Kind::from_op(&n.op, &n.ty).ok_or_else(|| {
                IrError::Invalid(format!(
                    "rewrite: node {id} ({}) is not rewritable",
                    n.op.name()
                ))
            })?;
            let args: SmallVec<[Id; 3]> = n.inputs.iter().map(|x| class_of[x.index()]).collect();
            ENode { kind, args }
        };
        class_of.push(egraph.add(enode));
    }
    egraph.rebuild();
    Ok((egraph, class_of, leaf_nodes))
}

/// Writes the extracted e-nodes out as a graph, in the input's order (see the module docs).
///
/// Per-class data lives in vectors indexed by class id (egg's ids are dense: below the number
/// of e-nodes ever added), not hash maps: at 200 layers a hundred thousand classes, each
/// looked up several times, at random, in a working set far larger than the cache (issue 53).
fn emit(
    g: &Graph,
    egraph: &EGraph,
    class_of: &[Id],
    leaf_nodes: &[NodeId],
    choice: &extract::Choice,
) -> Result<Graph, IrError> {
    let bug = |what: String| IrError::Invalid(format!("rewrite: {what} (a bug in the rewriter)"));
    let ids = egraph.nodes().len();
    // Each canonical class's data by id, read here rather than through `egraph[c]` (a hash
    // lookup each time).
    let mut data: Vec<Option<&analysis::Data>> = vec![None; ids];
    for class in egraph.classes() {
        data[usize::from(class.id)] = Some(&class.data);
    }
    let data_of =
        |c: Id| data[usize::from(c)].ok_or_else(|| bug(format!("e-class {c} is not canonical")));
    let canonical: Vec<usize> = class_of
        .iter()
        .map(|&c| usize::from(egraph.find(c)))
        .collect();
    // Each class's position: the smallest input node id in it.
    let mut key = vec![usize::MAX; ids];
    for (i, &c) in canonical.iter().enumerate() {
        if key[c] == usize::MAX {
            key[c] = i;
        }
    }
    let leaf_classes: Vec<Id> = leaf_nodes
        .iter()
        .map(|l| egraph.find(class_of[l.index()]))
        .collect();
    // Sorted by (position, class), each key looked up once (not at every comparison).
    let mut keyed: Vec<(usize, Id)> = (choice.keys().chain(&leaf_classes))
        .map(|&c| (key[usize::from(c)], c))
        .collect();
    drop(key);
    keyed.sort_unstable();
    keyed.dedup();
    let order: Vec<Id> = keyed.into_iter().map(|(_, c)| c).collect();

    // Each class's provenance: the origins of the input nodes it holds, in node order (egg
    // forgets which node an extracted e-node came from; its class remembers them all).
    let sources = ClassNodes::new(&canonical, ids);
    drop(canonical);
    let mut out = Graph::new();
    // The node each class became, `NONE` until it is emitted.
    const NONE: NodeId = NodeId(u32::MAX);
    let mut new_id: Vec<NodeId> = vec![NONE; ids];
    let done = |new_id: &[NodeId], c: Id| new_id[usize::from(c)] != NONE;
    let mut next_leaf = 0usize;
    let mut emit_leaves_through =
        |k: usize, out: &mut Graph, new_id: &mut [NodeId]| -> Result<(), IrError> {
            while next_leaf <= k && next_leaf < leaf_nodes.len() {
                let orig = g.node(leaf_nodes[next_leaf]);
                let id = out.push(orig.op.clone(), &[], Some(orig.ty.clone()))?;
                let slot = &mut new_id[usize::from(leaf_classes[next_leaf])];
                if *slot == NONE {
                    *slot = id;
                }
                next_leaf += 1;
            }
            Ok(())
        };
    for &start in &order {
        let mut stack: Vec<(Id, bool)> = vec![(start, false)];
        while let Some((c, expanded)) = stack.pop() {
            if done(&new_id, c) {
                continue;
            }
            let leaf = data_of(c)?.leaf;
            if let Some(k) = leaf {
                emit_leaves_through(k as usize, &mut out, &mut new_id)?;
                continue;
            }
            let node = choice
                .get(&c)
                .ok_or_else(|| bug(format!("e-class {c} was needed but not extracted")))?;
            if !expanded {
                stack.push((c, true));
                for &a in node.args.iter().rev() {
                    if !done(&new_id, a) {
                        stack.push((a, false));
                    }
                }
                continue;
            }
            let inputs: Option<SmallVec<[NodeId; 3]>> = node
                .args
                .iter()
                .map(|&a| Some(new_id[usize::from(a)]).filter(|&n| n != NONE))
                .collect();
            let inputs = inputs.ok_or_else(|| bug(format!("e-class {c} depends on itself")))?;
            let op = {
                let types: SmallVec<[&TensorType; 3]> = inputs.iter().map(|&i| out.ty(i)).collect();
                node.kind.to_op(&types).map(|(op, _)| op)
            };
            let op = op.ok_or_else(|| bug(format!("e-class {c} chose {node}")))?;
            let id = out.push(op, &inputs, Some(data_of(c)?.ty.clone()))?;
            let src = sources.of(usize::from(c));
            if !src.is_empty() {
                out.set_origin(
                    id,
                    crate::ir::Origin::merge(src.iter().map(|&i| g.origin(NodeId(i)))),
                );
            }
            new_id[usize::from(c)] = id;
        }
    }
    emit_leaves_through(usize::MAX, &mut out, &mut new_id)?;

    let mapped = |id: NodeId| {
        let c = egraph.find(class_of[id.index()]);
        Some(new_id[usize::from(c)])
            .filter(|&n| n != NONE)
            .ok_or_else(|| bug(format!("node {id} has no extracted e-class")))
    };
    for (name, &id) in &g.outputs {
        out.set_output(name, mapped(id)?)?;
    }
    for u in &g.updates {
        out.set_update(mapped(u.target)?, mapped(u.value)?)?;
    }
    Ok(out)
}

/// The input nodes each e-class holds, in node order: one flat list cut at offsets by class
/// (compressed rows), for [`emit`]'s provenance.
struct ClassNodes {
    /// Class `c`'s nodes are `nodes[start[c]..start[c + 1]]`.
    start: Vec<u32>,
    nodes: Vec<u32>,
}

impl ClassNodes {
    /// `class[i]` is input node `i`'s canonical class, each below `classes`.
    fn new(class: &[usize], classes: usize) -> ClassNodes {
        let mut start = vec![0u32; classes + 1];
        for &c in class {
            start[c + 1] += 1;
        }
        for c in 0..classes {
            start[c + 1] += start[c];
        }
        let mut next: Vec<u32> = start[..classes].to_vec();
        let mut nodes = vec![0u32; class.len()];
        for (i, &c) in class.iter().enumerate() {
            nodes[next[c] as usize] = i as u32;
            next[c] += 1;
        }
        ClassNodes { start, nodes }
    }

    fn of(&self, c: usize) -> &[u32] {
        &self.nodes[self.start[c] as usize..self.start[c + 1] as usize]
    }
}
