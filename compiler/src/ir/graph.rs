//! The graph: nodes in an append-only list, so the list order is a topological order and an
//! operand always precedes its users. Outputs and in-place updates are named in insertion
//! order (`IndexMap`), which keeps printing, planning and snapshots deterministic.

use super::infer::infer;
use super::op::{LeafKind, Op};
use super::origin::sources::Origin;
use super::shape::Shape;
use super::tensor_type::TensorType;
use crate::error::IrError;
use indexmap::IndexMap;
use ingot_kernels::DType;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use std::fmt;

/// Index of a node in its graph.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeId(pub u32);

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// Operand lists: almost every op has at most three.
pub type Operands = SmallVec<[NodeId; 3]>;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub op: Op,
    pub inputs: Operands,
    pub ty: TensorType,
}

impl Node {
    pub fn shape(&self) -> &Shape {
        &self.ty.shape
    }
}

/// A step writes `value` over the resident leaf `target` when it ends (parameters and optimizer
/// state are updated in place; the planner gives the new value the leaf's own bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Update {
    pub target: NodeId,
    pub value: NodeId,
}

/// A graph of primitive ops: a model's forward pass, or a whole training step.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Graph {
    nodes: Vec<Node>,
    /// Named results the caller reads after a step (the loss, for instance).
    pub outputs: IndexMap<String, NodeId>,
    /// In-place updates of parameters and optimizer state, in the order they were declared.
    pub updates: Vec<Update>,
    /// Each node's provenance ([`Origin`]), beside the nodes so that code building [`Node`]s
    /// keeps compiling; shorter than `nodes` only for a deserialized graph (the rest unknown).
    #[serde(skip)]
    origins: Vec<Origin>,
    /// The origin [`Graph::push`] gives new nodes (see [`Graph::scoped`]).
    #[serde(skip)]
    scope: Origin,
    /// The mode layers are traced in ([`Mode`]): tracing information, like the scope, so no
    /// part of the graph's value or equality.
    #[serde(skip)]
    mode: Mode,
    /// The leaves' names, for [`Graph::push`]'s check that no two leaves share one: a scan of
    /// every node per leaf made a graph that declares its leaves late (autodiff's optimizer
    /// state after a deep forward pass) quadratic to build. It covers the first `indexed`
    /// nodes and catches up when a leaf is pushed (a deserialized graph starts with none).
    #[serde(skip)]
    leaf_names: std::collections::HashMap<String, NodeId>,
    #[serde(skip)]
    indexed: usize,
    /// Each [`Op::Result`] node by the output it names, the first one pushed for each, for
    /// [`Graph::result_of`]: a scan from the node to the graph's end for each attention's
    /// outputs made liveness and autodiff quadratic in depth (every attention asked for its
    /// unnamed outputs). It covers the first `results_indexed` nodes and catches up on
    /// [`Graph::push`] (a deserialized graph starts with none; the tail is scanned).
    #[serde(skip)]
    results: std::collections::HashMap<(NodeId, usize), NodeId>,
    #[serde(skip)]
    results_indexed: usize,
    /// The targets of the first `updates_indexed` updates, for [`Graph::set_update`]'s check
    /// that no target is updated twice: a scan of every update per update made passes that
    /// copy a graph's updates ([`Graph::keep_outputs_of`]) quadratic in the parameters.
    #[serde(skip)]
    update_targets: std::collections::HashSet<NodeId>,
    #[serde(skip)]
    updates_indexed: usize,
}

/// Each node's users (the nodes that read it as an operand, each once, in id order), as
/// [`Graph::users`] gives them: `users[i]` is node `i`'s list. One flat list cut at offsets
/// (compressed rows) rather than a vector per node: fusion, scheduling and liveness ask for the
/// users of graphs of 100,000 nodes a dozen times a compile, and a vector per node was a fifth
/// of the compile's allocations and a scattered working set (issue 53).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Users {
    /// Node `i`'s users are `list[start[i]..start[i + 1]]`; one more entry than nodes.
    start: Vec<u32>,
    list: Vec<NodeId>,
}

impl Users {
    /// The users of every node of `g`: a count of each node's users, then one pass that
    /// writes each user into its place. A node reading `x` twice (`x * x`) is one user of `x`:
    /// each pass skips `x` when the node it is at was the last one counted (written) for `x`,
    /// which costs the same for a fused kernel of a thousand operands as for an add.
    fn of(g: &Graph) -> Users {
        let n = g.len();
        let mut start = vec![0u32; n + 1];
        // The last node counted as a user of each node.
        let mut cursor = vec![u32::MAX; n];
        for (id, node) in g.ids().zip(g.nodes()) {
            for &x in &node.inputs {
                if cursor[x.index()] != id.0 {
                    cursor[x.index()] = id.0;
                    start[x.index() + 1] += 1;
                }
            }
        }
        for i in 0..n {
            start[i + 1] += start[i];
        }
        // Now where each node's next user goes.
        cursor.copy_from_slice(&start[..n]);
        let mut list = vec![NodeId(0); start[n] as usize];
        for (id, node) in g.ids().zip(g.nodes()) {
            for &x in &node.inputs {
                let at = &mut cursor[x.index()];
                if *at == start[x.index()] || list[*at as usize - 1] != id {
                    list[*at as usize] = id;
                    *at += 1;
                }
            }
        }
        Users { start, list }
    }

    /// The number of nodes (not of users).
    pub fn len(&self) -> usize {
        self.start.len().saturating_sub(1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Each node's users, in node order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[NodeId]> + '_ {
        (0..self.len()).map(move |i| &self[i])
    }
}

impl std::ops::Index<usize> for Users {
    type Output = [NodeId];

    fn index(&self, i: usize) -> &[NodeId] {
        &self.list[self.start[i] as usize..self.start[i + 1] as usize]
    }
}

/// The mode a model's forward pass is traced in, as PyTorch's `model.train()` / `model.eval()`:
/// layers that behave differently in evaluation (batch norm, dropout) read [`Graph::mode`] when
/// they are traced. A training step is built from the `Train` trace; the evaluation step from
/// the `Eval` trace of the same model, which reads the same parameters and resident state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Batch norm normalises by the batch's statistics and updates its running estimates;
    /// dropout drops.
    #[default]
    Train,
    /// Batch norm normalises by its running estimates and updates nothing; dropout is the
    /// identity.
    Eval,
}

/// Two graphs are equal when they compute the same thing: provenance is debug information and
/// takes no part.
impl PartialEq for Graph {
    fn eq(&self, other: &Graph) -> bool {
        self.nodes == other.nodes && self.outputs == other.outputs && self.updates == other.updates
    }
}

static NO_ORIGIN: Origin = Origin::NONE;

impl Graph {
    pub fn new() -> Graph {
        Graph::default()
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    pub fn ty(&self, id: NodeId) -> &TensorType {
        &self.nodes[id.index()].ty
    }

    pub fn ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        (0..self.nodes.len() as u32).map(NodeId)
    }

    /// Where `id` came from (see [`Origin`]).
    pub fn origin(&self, id: NodeId) -> &Origin {
        self.origins.get(id.index()).unwrap_or(&NO_ORIGIN)
    }

    /// Sets where `id` came from.
    pub fn set_origin(&mut self, id: NodeId, origin: Origin) {
        if self.origins.len() < self.nodes.len() {
            self.origins.resize(self.nodes.len(), Origin::none());
        }
        self.origins[id.index()] = origin;
    }

    /// `blocks.3.qkv (%12)`: a node named by provenance first and id second (`%12` alone when
    /// its origin is unknown), for reports and errors.
    pub fn describe(&self, id: NodeId) -> String {
        match self.origin(id).primary() {
            Some(p) => format!("{p} ({id})"),
            None => id.to_string(),
        }
    }

    /// The origin new nodes get.
    pub fn scope(&self) -> &Origin {
        &self.scope
    }

    /// The mode layers are traced in ([`Mode`]; `Train` for a new graph).
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Sets the mode layers traced from now on are traced in.
    pub fn set_mode(&mut self, mode: Mode) {
        self.mode = mode;
    }

    /// Sets the origin new nodes get, returning the previous one (restore it when done).
    pub fn set_scope(&mut self, origin: Origin) -> Origin {
        std::mem::replace(&mut self.scope, origin)
    }

    /// Runs `f` with new nodes attributed to `name` (an nn layer such as `blocks.3.attn.qkv`),
    /// then restores the previous scope.
    pub fn scoped<T>(&mut self, name: &str, f: impl FnOnce(&mut Graph) -> T) -> T {
        self.with_origin(Origin::new(name), f)
    }

    /// Runs `f` with new nodes attributed to `origin` (a pass making nodes on behalf of an
    /// existing one gives them its origin), then restores the previous scope.
    pub fn with_origin<T>(&mut self, origin: Origin, f: impl FnOnce(&mut Graph) -> T) -> T {
        let prev = self.set_scope(origin);
        let out = f(self);
        self.scope = prev;
        out
    }

    /// Appends a node after checking its operands exist and its types agree.
    /// `declared` is required for ops whose result type is not implied by their operands.
    pub fn push(
        &mut self,
        op: Op,
        inputs: &[NodeId],
        declared: Option<TensorType>,
    ) -> Result<NodeId, IrError> {
        let node = self.nodes.len();
        for &i in inputs {
            if i.index() >= node {
                return Err(IrError::Dangling {
                    op: op.name(),
                    node,
                    operand: i.index(),
                    len: node,
                });
            }
        }
        if let Op::Leaf { name, .. } = &op {
            self.index_leaves();
            if self.leaf_names.contains_key(name) {
                return Err(IrError::Invalid(format!("two leaves are named {name:?}")));
            }
        }
        let ty = {
            let operand_types: SmallVec<[&TensorType; 3]> =
                inputs.iter().map(|&i| self.ty(i)).collect();
            infer(&op, &operand_types, declared.as_ref(), node)?
        };
        // A leaf is its own origin: its name says more than the layer that declared it.
        let origin = match &op {
            Op::Leaf { name, .. } => Origin::new(name),
            _ => self.scope.clone(),
        };
        self.nodes.push(Node {
            op,
            inputs: SmallVec::from_slice(inputs),
            ty,
        });
        self.index_results();
        self.set_origin(NodeId(node as u32), origin);
        Ok(NodeId(node as u32))
    }

    /// Brings [`Graph::results`] up to date with the nodes.
    fn index_results(&mut self) {
        for i in self.results_indexed..self.nodes.len() {
            let n = &self.nodes[i];
            if let Op::Result { index } = n.op {
                self.results
                    .entry((n.inputs[0], index))
                    .or_insert(NodeId(i as u32));
            }
        }
        self.results_indexed = self.nodes.len();
    }

    /// Brings [`Graph::leaf_names`] up to date with the nodes.
    fn index_leaves(&mut self) {
        for i in self.indexed..self.nodes.len() {
            if let Op::Leaf { name, .. } = &self.nodes[i].op {
                self.leaf_names
                    .entry(name.clone())
                    .or_insert(NodeId(i as u32));
            }
        }
        self.indexed = self.nodes.len();
    }

    /// The node whose kernel writes `id`'s value: the multi-output node for a [`Op::Result`],
    /// else the node itself.
    pub fn writer(&self, id: NodeId) -> NodeId {
        match self.node(id).op {
            Op::Result { .. } => self.node(id).inputs[0],
            _ => id,
        }
    }

    /// The nodes `id`'s kernel reads: none for a [`Op::Result`] (its kernel did the reading),
    /// else its operands.
    pub fn reads(&self, id: NodeId) -> &[NodeId] {
        match self.node(id).op {
            Op::Result { .. } => &[],
            _ => &self.node(id).inputs,
        }
    }

    /// For each node, the values its kernel writes, in output order: a fused kernel's own node
    /// then its [`Op::Result`] nodes by index; `[id]` for any other node; empty for results.
    pub fn kernel_outputs(&self) -> Vec<SmallVec<[NodeId; 1]>> {
        let mut out: Vec<SmallVec<[NodeId; 1]>> = self
            .ids()
            .map(|id| match self.node(id).op {
                Op::Result { .. } => SmallVec::new(),
                _ => smallvec::smallvec![id],
            })
            .collect();
        let mut results: Vec<(NodeId, usize, NodeId)> = self
            .ids()
            .filter_map(|id| match self.node(id).op {
                Op::Result { index } => Some((self.node(id).inputs[0], index, id)),
                _ => None,
            })
            .collect();
        results.sort();
        for (k, _, r) in results {
            out[k.index()].push(r);
        }
        out
    }

    /// The [`Op::Result`] node naming output `index` of `node`, if the graph has one.
    pub fn result_of(&self, node: NodeId, index: usize) -> Option<NodeId> {
        if let Some(&r) = self.results.get(&(node, index)) {
            return Some(r);
        }
        // Only nodes the index does not cover yet (all of a deserialized graph's).
        (node.index().max(self.results_indexed.saturating_sub(1)) + 1..self.len())
            .map(|i| NodeId(i as u32))
            .find(|&r| self.node(r).op == (Op::Result { index }) && self.node(r).inputs[0] == node)
    }

    /// For each node, the nodes using it as an operand (each once, in id order): `users[i]`
    /// is node `i`'s list ([`Users`]).
    pub fn users(&self) -> Users {
        Users::of(self)
    }

    pub fn leaf(&self, name: &str) -> Option<NodeId> {
        self.ids()
            .find(|&id| matches!(&self.node(id).op, Op::Leaf { name: n, .. } if n == name))
    }

    /// Leaves of one kind, in graph order.
    pub fn leaves(&self, kind: LeafKind) -> Vec<NodeId> {
        self.ids()
            .filter(|&id| matches!(&self.node(id).op, Op::Leaf { kind: k, .. } if *k == kind))
            .collect()
    }

    /// The leaf's name, for leaves.
    pub fn leaf_name(&self, id: NodeId) -> Option<&str> {
        match &self.node(id).op {
            Op::Leaf { name, .. } => Some(name),
            _ => None,
        }
    }

    /// Names a result the caller wants after the step.
    pub fn set_output(&mut self, name: &str, id: NodeId) -> Result<(), IrError> {
        if id.index() >= self.len() {
            return Err(IrError::Invalid(format!(
                "output {name:?} names missing node {id}"
            )));
        }
        if self.outputs.insert(name.to_string(), id).is_some() {
            return Err(IrError::Invalid(format!("output {name:?} is named twice")));
        }
        Ok(())
    }

    /// Names the outputs and updates of `g` in this graph, a rewritten copy of it: `map`
    /// gives each node of `g` its node here (passes that rebuild a graph node by node end so).
    pub fn keep_outputs_of(
        &mut self,
        g: &Graph,
        map: impl Fn(NodeId) -> NodeId,
    ) -> Result<(), IrError> {
        for (name, &o) in &g.outputs {
            self.set_output(name, map(o))?;
        }
        for u in &g.updates {
            self.set_update(map(u.target), map(u.value))?;
        }
        Ok(())
    }

    /// Declares that the step writes `value` over the parameter or state leaf `target`.
    pub fn set_update(&mut self, target: NodeId, value: NodeId) -> Result<(), IrError> {
        check_update(self, Update { target, value })?;
        if self.is_updated(target) {
            return Err(IrError::Invalid(format!("{target} is updated twice")));
        }
        self.updates.push(Update { target, value });
        Ok(())
    }

    /// Whether some update already targets `target`. [`Graph::update_targets`] catches up with
    /// the updates first (they are public: a deserialized graph's, or updates pushed directly,
    /// are indexed then; updates cut shorter are indexed again), and a target it holds is
    /// confirmed against the updates themselves, so a stale entry never refuses an update.
    /// (An update whose target was changed in place, which nothing does, could hide a repeat
    /// here; [`Graph::verify`] checks every update anyway.)
    fn is_updated(&mut self, target: NodeId) -> bool {
        if self.updates_indexed > self.updates.len() {
            self.update_targets.clear();
            self.updates_indexed = 0;
        }
        for u in &self.updates[self.updates_indexed..] {
            self.update_targets.insert(u.target);
        }
        self.updates_indexed = self.updates.len();
        self.update_targets.contains(&target) && self.updates.iter().any(|u| u.target == target)
    }

    /// Nodes that some output or update depends on (the rest is dead code).
    pub fn live_mask(&self) -> Vec<bool> {
        let mut live = vec![false; self.len()];
        let mut stack: Vec<NodeId> = self.outputs.values().copied().collect();
        stack.extend(self.updates.iter().flat_map(|u| [u.value, u.target]));
        while let Some(id) = stack.pop() {
            if !std::mem::replace(&mut live[id.index()], true) {
                stack.extend(self.node(id).inputs.iter().copied());
            }
        }
        live
    }

    /// A copy without dead nodes (leaves are always kept: they are the step's interface).
    /// Returns the new graph and, for each old node, its new id.
    pub fn without_dead_code(&self) -> (Graph, Vec<Option<NodeId>>) {
        self.without_dead_code_and(|_| false)
    }

    /// As [`Graph::without_dead_code`], also dropping the unread leaves `drop` names: a step
    /// that no longer reads a leaf and must not name it in its interface (an evaluation that
    /// reads a weight's bf16 copy in place of the weight, `autodiff::copies`).
    pub fn without_dead_code_and(
        &self,
        drop: impl Fn(NodeId) -> bool,
    ) -> (Graph, Vec<Option<NodeId>>) {
        let live = self.live_mask();
        let mut map: Vec<Option<NodeId>> = vec![None; self.len()];
        let mut out = Graph::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if !live[i] && (!n.op.is_leaf() || drop(NodeId(i as u32))) {
                continue;
            }
            let inputs: Operands = n
                .inputs
                .iter()
                .map(|x| map[x.index()].expect("operand of a live node is live"))
                .collect();
            map[i] = Some(NodeId(out.nodes.len() as u32));
            out.nodes.push(Node {
                op: n.op.clone(),
                inputs,
                ty: n.ty.clone(),
            });
            out.origins.push(self.origin(NodeId(i as u32)).clone());
        }
        for (k, v) in &self.outputs {
            out.outputs
                .insert(k.clone(), map[v.index()].expect("outputs are live"));
        }
        for u in &self.updates {
            out.updates.push(Update {
                target: map[u.target.index()].expect("leaves are kept"),
                value: map[u.value.index()].expect("updates are live"),
            });
        }
        (out, map)
    }

    /// Counts nodes by op name, in name order (for reports and benchmarks).
    pub fn op_histogram(&self) -> std::collections::BTreeMap<&'static str, usize> {
        let mut h = std::collections::BTreeMap::new();
        for n in &self.nodes {
            *h.entry(n.op.name()).or_insert(0) += 1;
        }
        h
    }

    /// Checks every structural rule again from scratch: operands precede users, each node's type
    /// is what inference gives, leaf names are unique, outputs and updates are well formed.
    pub fn verify(&self) -> Result<(), IrError> {
        let mut names = std::collections::BTreeSet::new();
        let mut results = std::collections::BTreeSet::new();
        // Each kernel's output rows, computed once (not once per result node).
        let mut rows = std::collections::HashMap::new();
        for (i, n) in self.nodes.iter().enumerate() {
            for &x in &n.inputs {
                if x.index() >= i {
                    return Err(IrError::Dangling {
                        op: n.op.name(),
                        node: i,
                        operand: x.index(),
                        len: i,
                    });
                }
            }
            if let Op::Leaf { name, .. } = &n.op {
                if !names.insert(name.as_str()) {
                    return Err(IrError::Invalid(format!("two leaves are named {name:?}")));
                }
            }
            let operand_types: SmallVec<[&TensorType; 3]> =
                n.inputs.iter().map(|&x| self.ty(x)).collect();
            infer(&n.op, &operand_types, Some(&n.ty), i)?;
            if let Op::Result { index } = n.op {
                self.check_result(i, n.inputs[0], index, &mut results, &mut rows)?;
            }
        }
        for (name, id) in &self.outputs {
            if id.index() >= self.len() {
                return Err(IrError::Invalid(format!(
                    "output {name:?} names missing node {id}"
                )));
            }
        }
        let mut targets = std::collections::BTreeSet::new();
        for &u in &self.updates {
            check_update(self, u)?;
            if !targets.insert(u.target) {
                return Err(IrError::Invalid(format!("{} is updated twice", u.target)));
            }
        }
        Ok(())
    }
}

impl Graph {
    /// A result node `%node = result(kernel) index=..` names an existing output of a fused
    /// kernel or an attention op, once, with that output's type.
    fn check_result(
        &self,
        node: usize,
        kernel: NodeId,
        index: usize,
        seen: &mut std::collections::BTreeSet<(NodeId, usize)>,
        rows: &mut std::collections::HashMap<NodeId, (Vec<bool>, Vec<DType>)>,
    ) -> Result<(), IrError> {
        let fail = |reason: String| {
            Err(IrError::Invalid(format!(
                "result %{node} (output {index} of {kernel}): {reason}"
            )))
        };
        // The result has the type of the output it names, and no other result names that output.
        let typed_once = |want: &TensorType, seen: &mut std::collections::BTreeSet<_>| {
            if self.nodes[node].ty != *want {
                return fail(format!(
                    "typed {} but the output is {want}",
                    self.nodes[node].ty
                ));
            }
            if !seen.insert((kernel, index)) {
                return fail("another result node names the same output".into());
            }
            Ok(())
        };
        let writer = &self.node(kernel).op;
        if writer.is_attention() {
            let operands: SmallVec<[&TensorType; 6]> = self
                .node(kernel)
                .inputs
                .iter()
                .map(|&x| self.ty(x))
                .collect();
            let outs = super::attention::attention_outputs(writer, &operands).map_err(|e| {
                IrError::Invalid(format!("result %{node} (output {index} of {kernel}): {e}"))
            })?;
            let Some(want) = outs.get(index) else {
                return fail(format!("the {} has {} outputs", writer.name(), outs.len()));
            };
            return typed_once(want, seen);
        }
        if let Op::AllReduce { .. } | Op::ReduceScatter { .. } = writer {
            // Output `index` of an all-reduce is the sum of operand `index`: its type; that
            // of a reduce-scatter is one rank's rows of it.
            let Some(&x) = self.node(kernel).inputs.get(index) else {
                return fail(format!(
                    "the {} has {} outputs",
                    writer.name(),
                    self.node(kernel).inputs.len()
                ));
            };
            let want = match writer {
                Op::ReduceScatter { ranks } => super::infer::scattered(self.ty(x), *ranks)
                    .map_err(|e| {
                        IrError::Invalid(format!(
                            "result %{node} (output {index} of {kernel}): operand {x} is {}: {e}",
                            self.ty(x)
                        ))
                    })?,
                _ => self.ty(x).clone(),
            };
            return typed_once(&want, seen);
        }
        let Op::Fused(k) = writer else {
            return fail(format!(
                "{kernel} is a {}, not a fused kernel, an attention or a multi-output collective",
                writer.name()
            ));
        };
        if index >= k.outputs.len() {
            return fail(format!("the kernel has {} outputs", k.outputs.len()));
        }
        let (rows, dtypes) = rows
            .entry(kernel)
            .or_insert_with(|| (k.output_rows(), k.output_dtypes()));
        let want = TensorType::new(Shape::new(&k.output_dims_with(rows[index])), dtypes[index]);
        typed_once(&want, seen)
    }
}

fn check_update(g: &Graph, u: Update) -> Result<(), IrError> {
    if u.target.index() >= g.len() || u.value.index() >= g.len() {
        return Err(IrError::Invalid(format!(
            "update {} <- {} names a missing node",
            u.target, u.value
        )));
    }
    match &g.node(u.target).op {
        Op::Leaf {
            kind: LeafKind::Parameter | LeafKind::State,
            ..
        } => {}
        other => {
            return Err(IrError::Invalid(format!(
                "update target {} is a {}, not a parameter or state",
                u.target,
                other.name()
            )))
        }
    }
    if g.ty(u.target) != g.ty(u.value) {
        return Err(IrError::Invalid(format!(
            "update of {} ({}) by {} ({}): types differ",
            u.target,
            g.ty(u.target),
            u.value,
            g.ty(u.value)
        )));
    }
    Ok(())
}
