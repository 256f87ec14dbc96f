//! Scheduling: the order kernels run in decides which values are live together, and so the
//! peak. Two orders are offered: the traced order, and a memory-aware list schedule that at each
//! step runs the ready op that frees the most bytes. The planner plans both and keeps the smaller.
//!
//! Both orders respect data dependences and the anti-dependences of in-place updates: every
//! reader of a parameter (or optimizer state) runs before the op that produces its new value, so
//! the new value can be written over the old one.

use crate::ir::{Graph, NodeId, Op};
use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::Direction;
use std::collections::BTreeSet;

/// Which order a schedule was made by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Strategy {
    Traced,
    MemoryAware,
}

/// The dependence graph of a step: an edge `a -> b` means `a` must run before `b`.
pub fn dependences(g: &Graph) -> DiGraph<NodeId, ()> {
    let mut d = DiGraph::with_capacity(g.len(), g.len() * 2);
    for id in g.ids() {
        d.add_node(id);
    }
    // One edge per distinct input: a node reads few inputs, so they are deduplicated locally
    // (`update_edge` would walk the input's whole list of readers, and a value read by every
    // layer, a shared constant, made that quadratic in depth).
    let mut seen: Vec<NodeId> = Vec::new();
    for id in g.ids() {
        seen.clear();
        for &x in &g.node(id).inputs {
            if !seen.contains(&x) {
                seen.push(x);
                d.add_edge(NodeIndex::new(x.index()), NodeIndex::new(id.index()), ());
            }
        }
    }
    let users = g.users();
    let anti = |u: &crate::ir::Update| -> (NodeIndex, Vec<NodeIndex>) {
        // An update to the value the target already holds (`update p = p`, what a gradient
        // that simplifies to zero leaves) writes nothing, so it orders nothing.
        if g.writer(u.value) == u.target {
            return (NodeIndex::new(u.target.index()), Vec::new());
        }
        // The kernel that writes the new value (a fused kernel for a result node).
        let producer = NodeIndex::new(g.writer(u.value).index());
        let readers = readers_through_views(g, &users, u.target)
            .into_iter()
            .filter(|&r| r != g.writer(u.value) && r.index() < g.len())
            .map(|r| NodeIndex::new(r.index()))
            .collect();
        (producer, readers)
    };
    let data = d.clone();
    for u in &g.updates {
        let (producer, readers) = anti(u);
        for r in readers {
            d.update_edge(r, producer, ());
        }
    }
    if petgraph::algo::toposort(&d, None).is_ok() {
        return d;
    }
    // Some reader of a leaf needs (through a kernel that fusion made read several leaves) a
    // value computed after that leaf's new value: that update cannot be written in place. Its
    // anti-dependences are dropped (the planner then writes the new value aside and copies it
    // at the step's end, as for any update whose old value is read late); the others are kept
    // where they create no cycle.
    let mut d = data;
    for u in &g.updates {
        let (producer, readers) = anti(u);
        let late = readers
            .iter()
            .any(|&r| petgraph::algo::has_path_connecting(&d, producer, r, None));
        if !late {
            for r in readers {
                d.update_edge(r, producer, ());
            }
        }
    }
    d
}

/// Every node reading `x`'s bytes: its users, and the users of reshapes of it (reshape is a view).
/// `users` is [`Graph::users`]`()`.
pub fn readers_through_views(g: &Graph, users: &crate::ir::Users, x: NodeId) -> Vec<NodeId> {
    let mut out = Vec::new();
    let mut stack = vec![x];
    while let Some(v) = stack.pop() {
        for &u in &users[v.index()] {
            if g.node(u).op.is_alias() {
                stack.push(u);
            }
            out.push(u);
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The order the graph was traced in (already topological), if it respects the update
/// anti-dependences; otherwise the first topological order close to it.
pub fn traced(g: &Graph) -> Vec<NodeId> {
    let d = dependences(g);
    if g.ids().all(|id| {
        d.neighbors_directed(NodeIndex::new(id.index()), Direction::Incoming)
            .all(|p| p.index() < id.index())
    }) {
        return g.ids().collect();
    }
    list_schedule(g, &d, false)
}

/// [`traced`] with each convolution's filter gradient run before its data gradient where
/// that frees the convolution's input first (see `move_filter_gradients`); `None` where the
/// traced order is not the nodes' own or nothing moves. The planner plans it beside the
/// traced order and keeps the smaller.
pub fn filter_gradients_first(g: &Graph) -> Option<Vec<NodeId>> {
    let d = dependences(g);
    let as_traced = g.ids().all(|id| {
        d.neighbors_directed(NodeIndex::new(id.index()), Direction::Incoming)
            .all(|p| p.index() < id.index())
    });
    if !as_traced {
        return None;
    }
    let order = move_filter_gradients(g)?;
    let mut pos = vec![0; g.len()];
    for (p, &id) in order.iter().enumerate() {
        pos[id.index()] = p;
    }
    let respects = d.edge_indices().all(|e| {
        let (a, b) = d.edge_endpoints(e).expect("edge exists");
        pos[a.index()] < pos[b.index()]
    });
    respects.then_some(order)
}

/// The traced order (node ids) with each convolution's filter gradient `dw = f(x, dy)` moved
/// to just before its data gradient `dx = f(dy, w)` where the filter gradient is the last
/// reader of `x` (through views; `x` no leaf and no output of the step), all its operands are
/// made before the data gradient, and `dw` takes no more bytes than `dx`. Autodiff emits the
/// data gradient first (operand order), so `x` lived until `dx` was made and the two were
/// live together; moved, `x` dies before `dx` is made and neither position holds more bytes
/// than before (`dw`'s bytes replace `dx`'s at the first, `x`'s are gone from the second).
/// The room matters to the filter gradient's own workspace, which cuDNN's split-K algorithms
/// fill with partial sums (at a U-Net's decoder convolution over 48 channels at 64x64, a
/// 12 MiB `x` and a 12 MiB `dx`: 2.9 MB asked, 2.0 MiB of room under the peak beside both;
/// docs/benchmarks.md, session 42). A pure function of the graph, so every machine plans the
/// same order. `None` where nothing moves.
fn move_filter_gradients(g: &Graph) -> Option<Vec<NodeId>> {
    use crate::ir::WindowOp;
    let n = g.len();
    let grad_weights: Vec<NodeId> = (g.ids())
        .filter(|&b| matches!(g.node(b).op, Op::Window(WindowOp::Conv2dGradWeight { .. })))
        .collect();
    if grad_weights.is_empty() {
        return None;
    }
    let users = g.users();
    let is_output = |x: NodeId| g.outputs.values().any(|&o| o == x);
    // `before[a]`: the filter gradient to run just before data gradient `a`.
    let mut before: Vec<Option<NodeId>> = vec![None; n];
    let mut moved = vec![false; n];
    for b in grad_weights {
        let node = g.node(b);
        let Op::Window(WindowOp::Conv2dGradWeight { conv, .. }) = node.op else {
            continue;
        };
        let (x, dy) = (node.inputs[0], node.inputs[1]);
        let data_gradient = |a: NodeId| {
            a < b
                && g.node(a).inputs.first() == Some(&dy)
                && matches!(g.node(a).op,
                    Op::Window(WindowOp::Conv2dGradInput { conv: c, .. }) if c == conv)
        };
        let Some(a) = users[dy.index()]
            .iter()
            .copied()
            .filter(|&a| data_gradient(a))
            .max()
        else {
            continue;
        };
        let frees_x = !g.node(x).op.is_leaf()
            && !is_output(x)
            && readers_through_views(g, &users, x).last() == Some(&b);
        let operands_ready = node.inputs.iter().all(|&i| g.writer(i) < a);
        let smaller = g.ty(b).bytes() <= g.ty(a).bytes();
        if frees_x && operands_ready && smaller && before[a.index()].is_none() {
            before[a.index()] = Some(b);
            moved[b.index()] = true;
        }
    }
    if !moved.contains(&true) {
        return None;
    }
    let mut order = Vec::with_capacity(n);
    for id in g.ids() {
        if let Some(b) = before[id.index()] {
            order.push(b);
        }
        if !moved[id.index()] {
            order.push(id);
        }
    }
    Some(order)
}

/// `order` with each collective (an all-reduce or a reduce-scatter and its result nodes, an
/// all-gather) moved to right after the last of its operands: a gradient bucket is reduced as
/// soon as the backward pass has produced it, so on a device that runs collectives on a stream
/// of their own it overlaps the rest of the backward pass. Moving a node earlier, after all its operands, keeps
/// every dependence (its readers were after it and still are). An order without collectives is
/// returned unchanged.
pub fn hoist_collectives(g: &Graph, order: Vec<NodeId>) -> Vec<NodeId> {
    let is_collective = |id: NodeId| g.node(g.writer(id)).op.is_collective();
    if !order.iter().any(|&id| is_collective(id)) {
        return order;
    }
    let outputs = g.kernel_outputs();
    // One dependence graph serves both passes: moving nodes changes the order, not the graph.
    let d = dependences(g);
    let operands = operand_writers(g, &outputs);
    let order = hasten_gradients(g, &d, order, &outputs, &operands);
    let mut position = vec![usize::MAX; g.len()];
    for (p, &id) in order.iter().enumerate() {
        position[id.index()] = p;
    }
    // For each position, the collectives that become ready right after it.
    let mut after: Vec<Vec<NodeId>> = vec![Vec::new(); order.len()];
    for &id in &order {
        if g.node(id).op.is_collective() {
            let last = g.node(id).inputs.iter().map(|x| position[x.index()]).max();
            if let Some(last) = last.filter(|&l| l < order.len()) {
                after[last].push(id);
            }
        }
    }
    // An all-gather overtakes the all-reduce that becomes ready just before it: that bucket's
    // update is released only after the next collective anyway (`lag_collective_readers`),
    // while the gathered operands feed a sum and then an update (an embedding's rows, at the
    // end of the backward pass, the step's longest tail).
    let ready: Vec<(usize, NodeId)> = after
        .iter()
        .enumerate()
        .flat_map(|(p, cs)| cs.iter().map(move |&c| (p, c)))
        .collect();
    for w in ready.windows(2) {
        let ((p, a), (q, gather)) = (w[0], w[1]);
        if matches!(g.node(a).op, Op::AllReduce { .. })
            && matches!(g.node(gather).op, Op::AllGather { .. })
        {
            after[p].retain(|&c| c != a);
            let at = after[q]
                .iter()
                .position(|&c| c == gather)
                .map_or(0, |i| i + 1);
            after[q].insert(at, a);
        }
    }
    let mut out = Vec::with_capacity(order.len());
    for (p, &id) in order.iter().enumerate() {
        if !is_collective(id) {
            out.push(id);
        }
        for &c in &after[p] {
            out.extend(outputs[c.index()].iter().copied());
        }
    }
    lag_collective_readers(g, &d, out, &outputs, &operands.made)
}

/// The kernels that make a collective's operands, with their other outputs and the reshapes a
/// collective reads them through (`made`), and among them those an all-gather sends
/// (`gathered`), indexed by node.
struct Operands {
    made: Vec<bool>,
    gathered: Vec<bool>,
}

fn operand_writers(g: &Graph, outputs: &[smallvec::SmallVec<[NodeId; 1]>]) -> Operands {
    let n = g.len();
    let mut made = vec![false; n];
    let mut gathered = vec![false; n];
    for id in g.ids() {
        if g.node(id).op.is_collective() {
            let gather = matches!(g.node(id).op, Op::AllGather { .. });
            for &x in &g.node(id).inputs {
                // The kernel that writes the operand, under the reshapes a collective may read
                // it through (a LayerNorm gain's `[1, 1, d]` sum sent as `[d]`).
                let mut v = x;
                while let Op::Reshape = g.node(v).op {
                    made[v.index()] = true;
                    v = g.node(v).inputs[0];
                }
                let w = g.writer(v);
                made[w.index()] = true;
                gathered[w.index()] |= gather;
                for &o in &outputs[w.index()] {
                    made[o.index()] = true;
                }
            }
        }
    }
    Operands { made, gathered }
}

/// `order` with each kernel that makes an operand of a collective (a gradient an all-reduce
/// averages, a value an all-gather sends) and its results
/// moved to right after the last of its dependences, so every bucket is complete, and its
/// collective can start, as early as the backward pass allows. Left where the schedule put
/// them, the small gradients (a bias's or a LayerNorm gain's column sum, which frees little
/// and which autodiff finishes after the whole backward pass) would come at its end, and every
/// collective with them. Moving a node earlier, after all its dependences, keeps the order
/// valid (its dependents were after it and still are).
fn hasten_gradients(
    g: &Graph,
    d: &DiGraph<NodeId, ()>,
    order: Vec<NodeId>,
    outputs: &[smallvec::SmallVec<[NodeId; 1]>],
    operands: &Operands,
) -> Vec<NodeId> {
    let n = g.len();
    let Operands {
        made: picked,
        gathered,
    } = operands;
    let pulled = values_only_they_read(g, d, outputs, picked, |_| false);
    let mut left: Vec<usize> = (0..n)
        .map(|i| {
            d.neighbors_directed(NodeIndex::new(i), Direction::Incoming)
                .count()
        })
        .collect();
    let mut placed = vec![false; n];
    let mut out = Vec::with_capacity(order.len());
    let mut due: Vec<usize> = (0..n).filter(|&i| picked[i] && left[i] == 0).collect();
    due.reverse();
    // Operands an all-gather sends: their readers sum them and update on the step's tail, so
    // where several picked nodes are due, these go first (an embedding's rows before the first
    // layer's small f32 gradients, whose all-reduce would otherwise hold the gather). The last
    // due one whose dependences are all placed is taken out of `due`.
    let first_gathered = |due: &mut Vec<usize>, placed: &[bool], left: &[usize]| {
        let k = due
            .iter()
            .rposition(|&i| gathered[i] && !placed[i] && left[i] == 0)?;
        Some(due.remove(k))
    };
    for id in order {
        let mut next = Some(id.index());
        while let Some(i) = next
            .take()
            .or_else(|| first_gathered(&mut due, &placed, &left))
            .or_else(|| due.pop())
        {
            if std::mem::replace(&mut placed[i], true) {
                continue;
            }
            out.push(NodeId(i as u32));
            for s in d.neighbors_directed(NodeIndex::new(i), Direction::Outgoing) {
                let s = s.index();
                left[s] -= 1;
                if !picked[s] || placed[s] {
                    continue;
                }
                if left[s] == 0 {
                    due.push(s);
                } else if let Some(first) = pullable_deps(d, s, &pulled, &placed) {
                    // Only values computed for `s` are missing: they run now, then `s`.
                    due.push(s);
                    due.extend(first.into_iter().rev());
                }
            }
        }
    }
    out
}

/// The unplaced dependences of `s`, in an order they can run in, when every one of them is a
/// pulled node whose own unplaced dependences are too (recursively); `None` otherwise.
fn pullable_deps(
    d: &DiGraph<NodeId, ()>,
    s: usize,
    pulled: &[bool],
    placed: &[bool],
) -> Option<Vec<usize>> {
    fn visit(
        d: &DiGraph<NodeId, ()>,
        v: usize,
        pulled: &[bool],
        placed: &[bool],
        seen: &mut std::collections::HashSet<usize>,
        out: &mut Vec<usize>,
    ) -> bool {
        for p in d.neighbors_directed(NodeIndex::new(v), Direction::Incoming) {
            let p = p.index();
            if placed[p] || seen.contains(&p) {
                continue;
            }
            if !pulled[p] || !visit(d, p, pulled, placed, seen, out) {
                return false;
            }
            seen.insert(p);
            out.push(p);
        }
        true
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    visit(d, s, pulled, placed, &mut seen, &mut out).then_some(out)
}

/// Every node `v` depends on, directly or not, that is not `placed` yet.
fn unplaced_ancestors(d: &DiGraph<NodeId, ()>, v: usize, placed: &[bool]) -> Vec<usize> {
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![v];
    while let Some(u) = stack.pop() {
        for p in d.neighbors_directed(NodeIndex::new(u), Direction::Incoming) {
            let p = p.index();
            if !placed[p] && seen.insert(p) {
                stack.push(p);
            }
        }
    }
    seen.into_iter().collect()
}

/// Marks every node computed only for picked nodes (or for marked ones), which is pulled in
/// ahead of them: a node with operands, not pinned ([`pinned`]: a leaf or named output), all
/// of whose readers are picked or marked (with its
/// kernel's other outputs). These are the recomputations a gradient reads (remat's GELU output
/// for an MLP's weight gradient), which the traced order places after the whole backward pass:
/// left there, they hold their gradient, the bucket it is in, and that bucket's all-reduce
/// until the step's end. A pulled node runs right before the first reader that waits only for
/// pulled nodes, not as soon as its operands exist (a recomputation run in the forward pass
/// would live through it). No node that `stays` is marked.
fn values_only_they_read(
    g: &Graph,
    d: &DiGraph<NodeId, ()>,
    outputs: &[smallvec::SmallVec<[NodeId; 1]>],
    picked: &[bool],
    stays: impl Fn(NodeId) -> bool,
) -> Vec<bool> {
    let mut pulled = vec![false; g.len()];
    let Ok(topo) = petgraph::algo::toposort(d, None) else {
        return pulled;
    };
    let pinned = pinned(g);
    let users = g.users();
    for v in topo.into_iter().rev() {
        let id = NodeId(v.index() as u32);
        let readers = &users[id.index()];
        if picked[id.index()]
            || stays(id)
            || g.node(id).inputs.is_empty()
            || readers.is_empty()
            || pinned[id.index()]
            || !readers
                .iter()
                .all(|r| picked[r.index()] || pulled[r.index()])
        {
            continue;
        }
        pulled[id.index()] = true;
        for &o in &outputs[id.index()] {
            pulled[o.index()] = true;
        }
    }
    pulled
}

/// `order` with every node that reads a collective's result, directly or not (the optimizer's
/// update of a reduced bucket, the embedding's sum over the gathered rows), placed one
/// collective late: right after the collective that follows the latest one it reads is
/// launched (a reader of the last collective at the end). Values computed only for such
/// readers (the optimizer's step-size scalars) are pulled in right before the first one. A
/// collective that sends what such readers make (a sharded update's new rows, all-gathered
/// after a reduce-scatter) has them placed right before it instead.
///
/// Run where the memory-aware schedule put it (as early as it frees memory: right after the
/// bucket's all-reduce), an update would free the bucket's bytes for the next kernels of the
/// backward pass to reuse, and those would then wait for the all-reduce (and the update) to
/// finish: the collective would sit on the critical path instead of overlapping the backward
/// pass. Run after the whole backward pass instead (as PyTorch DDP's optimizer does), every
/// update would be on the step's tail, where nothing overlaps it: for gpt2 on two ranks, 1.2
/// ms of Adam over 124M parameters after the last bucket's all-reduce. One collective late,
/// the bucket's all-reduce has had the backward pass of the next bucket's layers to finish
/// in, so the update overlaps the backward pass as on one device, and what reuses its bytes
/// rarely waits.
///
/// A valid order: a node is placed only after all its dependences, and the readers keep their
/// order among themselves.
fn lag_collective_readers(
    g: &Graph,
    d: &DiGraph<NodeId, ()>,
    order: Vec<NodeId>,
    outputs: &[smallvec::SmallVec<[NodeId; 1]>],
    made: &[bool],
) -> Vec<NodeId> {
    let n = g.len();
    let reduced = |id: NodeId| g.node(g.writer(id)).op.is_collective();
    // Each collective's number in launch order, and for each reader the number of the latest
    // collective it reads (through other readers).
    let mut number = vec![usize::MAX; n];
    let mut launched = 0usize;
    for &id in &order {
        if g.node(id).op.is_collective() {
            number[id.index()] = launched;
            launched += 1;
        }
    }
    let mut gate: Vec<Option<usize>> = vec![None; n];
    for &id in &order {
        if reduced(id) {
            continue;
        }
        gate[id.index()] = g
            .node(id)
            .inputs
            .iter()
            .filter_map(|&x| {
                if reduced(x) {
                    Some(number[g.writer(x).index()])
                } else {
                    gate[x.index()]
                }
            })
            .max();
    }
    let deferred: Vec<bool> = gate.iter().map(Option::is_some).collect();
    // A collective stays where the backward pass launches it, though only readers read it.
    let pulled = values_only_they_read(g, d, outputs, &deferred, reduced);
    let mut placed = vec![false; n];
    let mut out = Vec::with_capacity(order.len());
    let mut waiting: Vec<usize> = order
        .iter()
        .map(|id| id.index())
        .filter(|&i| deferred[i])
        .collect();
    let mut launched = 0usize;
    let place = |i: usize, placed: &mut Vec<bool>, out: &mut Vec<NodeId>| {
        placed[i] = true;
        out.push(NodeId(i as u32));
    };
    // The nodes this loop places itself, in order (the others are placed only by a release):
    // a release waits while the next of them makes a collective's operand.
    let own: Vec<usize> = order
        .iter()
        .map(|id| id.index())
        .filter(|&i| !deferred[i] && !pulled[i])
        .collect();
    // Where each node is in `order`, to place a collective's missing dependences in an order
    // they can run in.
    let mut rank_in_order = vec![usize::MAX; n];
    for (k, id) in order.iter().enumerate() {
        rank_in_order[id.index()] = k;
    }
    for (at, &i) in own.iter().enumerate() {
        if g.node(NodeId(i as u32)).op.is_collective() {
            // A collective may send what readers of an earlier one make (a sharded update's
            // new rows, all-gathered): they wait for no later collective than this one.
            let mut missing = unplaced_ancestors(d, i, &placed);
            if !missing.is_empty() {
                missing.sort_by_key(|&m| rank_in_order[m]);
                for &m in &missing {
                    place(m, &mut placed, &mut out);
                }
                waiting.retain(|&w| !placed[w]);
            }
        }
        place(i, &mut placed, &mut out);
        if g.node(NodeId(i as u32)).op.is_collective() {
            launched += 1;
        }
        // A gradient that is ready goes before the released updates: they only wait, its
        // all-reduce would wait behind them (the first layer's LayerNorm gains behind the
        // embedding's sum and update, on the step's tail).
        if own.get(at + 1).is_some_and(|&j| made[j]) {
            continue;
        }
        // Release, in order, the waiting readers whose collective's successor is launched and
        // whose dependences are placed or are pulled values (placed first).
        let mut k = 0;
        while k < waiting.len() {
            let w = waiting[k];
            let due = gate[w].is_some_and(|c| c + 2 <= launched);
            let first = due.then(|| pullable_deps(d, w, &pulled, &placed)).flatten();
            match first {
                Some(first) => {
                    for p in first {
                        place(p, &mut placed, &mut out);
                    }
                    place(w, &mut placed, &mut out);
                    waiting.remove(k);
                    // A reader released may let an earlier-waiting one go: start again.
                    k = 0;
                }
                None => k += 1,
            }
        }
    }
    // The rest (readers of the last collectives, and what only they read) in their order,
    // which is valid: everything else is placed.
    for id in order {
        if !placed[id.index()] {
            place(id.index(), &mut placed, &mut out);
        }
    }
    out
}

/// A list schedule that always runs, among the ready ops, the one with the best
/// `freed - allocated` byte balance (ties: the earliest traced).
pub fn memory_aware(g: &Graph) -> Vec<NodeId> {
    list_schedule(g, &dependences(g), true)
}

/// Values whose bytes are not the slab's to free: leaves and named outputs.
fn pinned(g: &Graph) -> Vec<bool> {
    let mut p: Vec<bool> = g.nodes().iter().map(|n| n.op.is_leaf()).collect();
    for &o in g.outputs.values() {
        p[o.index()] = true;
    }
    p
}

/// Bytes a node adds to the slab when it runs (views and leaves add none).
fn own_bytes(g: &Graph, kernel_outputs: &[smallvec::SmallVec<[NodeId; 1]>], id: NodeId) -> i64 {
    match &g.node(id).op {
        // An all-reduce writes over its operands: it adds nothing.
        Op::Leaf { .. } | Op::Result { .. } | Op::AllReduce { .. } => 0,
        op if op.is_alias() => 0,
        // A reduce-scatter's outputs are buffers of their own, as a kernel's are.
        Op::Fused(_)
        | Op::Attention { .. }
        | Op::AttentionGrad { .. }
        | Op::ReduceScatter { .. } => kernel_outputs[id.index()]
            .iter()
            .map(|&o| g.ty(o).bytes() as i64)
            .sum(),
        _ => g.ty(id).bytes() as i64,
    }
}

/// List scheduling over the dependence graph. Leaves are taken first (they cost nothing); then,
/// with `by_memory`, the ready op with the best byte balance ([`peek`]), else the earliest traced.
///
/// The ready ops are kept ordered by (balance, index), and a balance is recomputed only when it
/// can change: when an operand's count of readers yet to run drops to one, the last of them
/// now frees it. Each value drops to one once, so the bookkeeping costs the graph's edges, where
/// rescanning every ready op at every step cost the ready set's size per step (quadratic in
/// depth for a step whose backward pass keeps many ops ready).
fn list_schedule(g: &Graph, d: &DiGraph<NodeId, ()>, by_memory: bool) -> Vec<NodeId> {
    let n = g.len();
    let Start {
        mut indeg,
        users,
        mut remaining,
        pinned,
        bytes,
    } = Start::of(g, d);
    let mut ready = Ready::new(n);
    let balance = |i: u32, remaining: &[usize]| {
        if by_memory {
            peek(g, NodeId(i), remaining, &pinned, &bytes)
        } else {
            0
        }
    };
    for i in (0..n as u32).filter(|&i| indeg[i as usize] == 0) {
        ready.insert(i, g.node(NodeId(i)).op.is_leaf(), balance(i, &remaining));
    }
    let mut done = vec![false; n];
    let mut order = Vec::with_capacity(n);
    let mut seen: Vec<NodeId> = Vec::new();
    while let Some(pick) = ready.pop() {
        let id = NodeId(pick);
        done[pick as usize] = true;
        seen.clear();
        for &x in &g.node(id).inputs {
            if seen.contains(&x) {
                continue;
            }
            seen.push(x);
            remaining[x.index()] -= 1;
            // The one reader left of `x` now frees it: its balance changes.
            if by_memory && remaining[x.index()] == 1 {
                if let Some(&last) = users[x.index()].iter().find(|u| !done[u.index()]) {
                    ready.rescore(last.0, balance(last.0, &remaining));
                }
            }
        }
        order.push(id);
        for s in d.neighbors_directed(NodeIndex::new(pick as usize), Direction::Outgoing) {
            indeg[s.index()] -= 1;
            if indeg[s.index()] == 0 {
                let i = s.index() as u32;
                ready.insert(i, g.node(NodeId(i)).op.is_leaf(), balance(i, &remaining));
            }
        }
    }
    order
}

/// What a list schedule of `g` over its dependence graph starts from, by node index: the
/// count of predecessors not yet scheduled, the readers ([`Graph::users`]) and the count of
/// them yet to run, whether the node's bytes are pinned ([`pinned`]), and its own bytes
/// ([`own_bytes`]).
struct Start {
    indeg: Vec<usize>,
    users: crate::ir::Users,
    remaining: Vec<usize>,
    pinned: Vec<bool>,
    bytes: Vec<i64>,
}

impl Start {
    fn of(g: &Graph, d: &DiGraph<NodeId, ()>) -> Start {
        let indeg = (0..g.len())
            .map(|i| {
                d.neighbors_directed(NodeIndex::new(i), Direction::Incoming)
                    .count()
            })
            .collect();
        let users = g.users();
        let remaining = users.iter().map(|u| u.len()).collect();
        let kernel_outputs = g.kernel_outputs();
        let bytes = g
            .ids()
            .map(|id| own_bytes(g, &kernel_outputs, id))
            .collect();
        Start {
            indeg,
            users,
            remaining,
            pinned: pinned(g),
            bytes,
        }
    }
}

/// The ready set of [`list_schedule`]: leaves by index; other ops by best balance, then index.
struct Ready {
    leaves: BTreeSet<u32>,
    ops: BTreeSet<(std::cmp::Reverse<i64>, u32)>,
    /// The balance an op in `ops` is filed under (`None`: not in `ops`).
    filed: Vec<Option<i64>>,
}

impl Ready {
    fn new(n: usize) -> Self {
        Ready {
            leaves: BTreeSet::new(),
            ops: BTreeSet::new(),
            filed: vec![None; n],
        }
    }

    fn insert(&mut self, i: u32, leaf: bool, balance: i64) {
        if leaf {
            self.leaves.insert(i);
        } else {
            self.ops.insert((std::cmp::Reverse(balance), i));
            self.filed[i as usize] = Some(balance);
        }
    }

    /// Files a ready op under a new balance; an op not ready yet is scored when it becomes so.
    fn rescore(&mut self, i: u32, balance: i64) {
        if let Some(old) = self.filed[i as usize] {
            self.ops.remove(&(std::cmp::Reverse(old), i));
            self.ops.insert((std::cmp::Reverse(balance), i));
            self.filed[i as usize] = Some(balance);
        }
    }

    /// The first ready leaf, else the op with the best balance (ties: the earliest traced).
    fn pop(&mut self) -> Option<u32> {
        if let Some(leaf) = self.leaves.pop_first() {
            return Some(leaf);
        }
        let (_, i) = self.ops.pop_first()?;
        self.filed[i as usize] = None;
        Some(i)
    }
}

/// The byte balance of running `id` now: bytes of operands it is the last reader of, minus its
/// own output's bytes.
fn peek(g: &Graph, id: NodeId, remaining: &[usize], pinned: &[bool], bytes: &[i64]) -> i64 {
    let node = g.node(id);
    let mut gain = -bytes[id.index()];
    for (k, &x) in node.inputs.iter().enumerate() {
        if !node.inputs[..k].contains(&x) && remaining[x.index()] == 1 && !pinned[x.index()] {
            gain += bytes[x.index()];
        }
    }
    gain
}

/// True when `order` runs every node of `g` exactly once and after all its dependences.
pub fn is_valid_order(g: &Graph, order: &[NodeId]) -> bool {
    if order.len() != g.len() {
        return false;
    }
    let mut pos = vec![usize::MAX; g.len()];
    for (p, &id) in order.iter().enumerate() {
        if id.index() >= g.len() || pos[id.index()] != usize::MAX {
            return false;
        }
        pos[id.index()] = p;
    }
    let d = dependences(g);
    d.edge_indices().all(|e| {
        let (a, b) = d.edge_endpoints(e).expect("edge exists");
        pos[a.index()] < pos[b.index()]
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::{self, Options};

    /// The memory-aware list schedule as it was before its ready set was kept ordered: every
    /// step rescans every ready op's balance. The reference the incremental one must equal.
    fn rescanning(g: &Graph) -> Vec<NodeId> {
        let d = dependences(g);
        let n = g.len();
        let Start {
            mut indeg,
            mut remaining,
            pinned,
            bytes,
            ..
        } = Start::of(g, &d);
        let mut ready: BTreeSet<u32> = (0..n as u32).filter(|&i| indeg[i as usize] == 0).collect();
        let mut order = Vec::with_capacity(n);
        while !ready.is_empty() {
            let leaf = ready
                .iter()
                .copied()
                .find(|&i| g.node(NodeId(i)).op.is_leaf());
            let pick = leaf.unwrap_or_else(|| {
                let mut best: Option<(i64, u32)> = None;
                for &i in &ready {
                    let s = peek(g, NodeId(i), &remaining, &pinned, &bytes);
                    if best.is_none_or(|(bs, _)| s > bs) {
                        best = Some((s, i));
                    }
                }
                best.expect("ready is not empty").1
            });
            ready.remove(&pick);
            let mut seen: Vec<NodeId> = Vec::new();
            for &x in &g.node(NodeId(pick)).inputs {
                if !seen.contains(&x) {
                    seen.push(x);
                    remaining[x.index()] -= 1;
                }
            }
            order.push(NodeId(pick));
            for s in d.neighbors_directed(NodeIndex::new(pick as usize), Direction::Outgoing) {
                indeg[s.index()] -= 1;
                if indeg[s.index()] == 0 {
                    ready.insert(s.index() as u32);
                }
            }
        }
        order
    }

    /// Bytes of values live at each position of `order`, counted independently of the
    /// planner: a value (no leaf, no alias) from the position of its kernel to that of its last
    /// reader through views, or the end for an output.
    fn live_by_position(g: &Graph, order: &[NodeId]) -> Vec<usize> {
        let mut pos = vec![0; g.len()];
        for (p, &id) in order.iter().enumerate() {
            pos[id.index()] = p;
        }
        let users = g.users();
        let mut live = vec![0; order.len() + 1];
        for x in g.ids() {
            let op = &g.node(x).op;
            if op.is_leaf() || op.is_alias() {
                continue;
            }
            let start = pos[g.writer(x).index()];
            let end = match g.outputs.values().any(|&o| o == x) {
                true => order.len(),
                false => (readers_through_views(g, &users, x).iter())
                    .map(|r| pos[r.index()])
                    .max()
                    .unwrap_or(start),
            };
            for l in &mut live[start..=end] {
                *l += g.ty(x).bytes();
            }
        }
        live
    }

    #[test]
    fn a_filter_gradient_that_frees_its_input_runs_before_its_data_gradient_and_no_position_holds_more(
    ) {
        use crate::ir::WindowOp;
        let m = crate::models::by_name("cnn").expect("a reference model");
        let c = pipeline::compile(&m, &Options::default()).expect("it compiles");
        let g = &c.graph;
        let as_traced = traced(g);
        assert_eq!(as_traced, g.ids().collect::<Vec<_>>());
        let order = filter_gradients_first(g).expect("cnn's second convolution moves");
        assert!(is_valid_order(g, &order));
        let at = |id: NodeId| order.iter().position(|&o| o == id).expect("scheduled");
        let mut moved = 0;
        for b in g.ids() {
            if let Op::Window(WindowOp::Conv2dGradWeight { .. }) = g.node(b).op {
                let dy = g.node(b).inputs[1];
                for a in g.users()[dy.index()].iter().copied() {
                    if let Op::Window(WindowOp::Conv2dGradInput { .. }) = g.node(a).op {
                        assert!(a < b, "autodiff emits the data gradient first");
                        if at(b) < at(a) {
                            assert_eq!(at(b) + 1, at(a), "moved to just before it");
                            moved += 1;
                        }
                    }
                }
            }
        }
        assert!(
            moved > 0,
            "cnn's second convolution frees its input at its filter gradient"
        );
        let (before, after) = (live_by_position(g, &as_traced), live_by_position(g, &order));
        assert!(before.iter().zip(&after).all(|(b, a)| a <= b));
        assert!(before.iter().zip(&after).any(|(b, a)| a < b));
        // Nothing to move: a graph without convolutions has no such order.
        let mlp = pipeline::compile(&crate::models::by_name("mlp").unwrap(), &Options::default());
        assert_eq!(
            filter_gradients_first(&mlp.expect("it compiles").graph),
            None
        );
    }

    #[test]
    fn the_incremental_memory_aware_schedule_is_the_one_that_rescans_every_ready_op() {
        let mut graphs: Vec<(String, Graph)> = Vec::new();
        for name in ["mlp", "gpt-mini", "cnn"] {
            let m = crate::models::by_name(name).expect("a reference model");
            let c = pipeline::compile(&m, &Options::default()).expect("it compiles");
            graphs.push((name.to_string(), c.step.graph.clone()));
            graphs.push((format!("{name} fused"), c.graph));
        }
        for seed in 0..40 {
            let m = crate::random_graph::model(seed).expect("the generator's graphs are valid");
            let c = pipeline::compile(&m, &Options::default()).expect("it compiles");
            graphs.push((format!("random:{seed}"), c.graph));
        }
        for (name, g) in &graphs {
            let order = memory_aware(g);
            assert!(is_valid_order(g, &order), "{name}");
            assert!(order == rescanning(g), "{name}: the orders differ");
        }
    }
}
