//! An independent checker for memory plans, after regalloc2's checker: it shares no code with
//! the planner. It replays the schedule over a map from byte ranges to the value they hold and
//! proves that every read finds the value it expects there, so no two values that are needed at
//! the same time share a byte, whatever the planner believed about lifetimes.
//!
//! Facts it relies on are the executor's contract, not the planner's reasoning: a `reshape`
//! (or `stop_gradient`) reads its operand in place (its location must equal its operand's); an
//! elementwise op may write over an operand only when the two occupy exactly the same bytes, and
//! a fused kernel likewise, only over inputs its description says it reads at the output's own
//! index. A fused kernel writes all its outputs when it runs; its `result` nodes do nothing.

use crate::ir::{Graph, NodeId, Op};
use std::collections::BTreeMap;

/// Where one node's value lives, as an absolute byte range of the step's single allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Location {
    pub offset: usize,
    pub bytes: usize,
}

/// What the checker needs to know about a plan.
pub struct PlanView<'a> {
    pub graph: &'a Graph,
    pub order: &'a [NodeId],
    /// Location of each node's value, indexed by node.
    pub location: &'a [Location],
    /// Scratch space each node's kernel may overwrite while it runs, indexed by node.
    pub workspace: &'a [Option<Location>],
    /// For a node whose workspace is filled ahead of it (a scatter-add's ids sorted there, see
    /// `liveness::WorkspaceNeed`), the schedule position of the op after which the fill runs:
    /// from there to the node, nothing else may write the workspace's bytes, and what lived
    /// there is gone. Indexed by node; `None` for a workspace used only while its node runs.
    pub workspace_filled_after: &'a [Option<usize>],
    /// `(value, target)` copies done after the last op.
    pub copies: &'a [(NodeId, NodeId)],
    /// Size of the single allocation.
    pub total_bytes: usize,
    pub alignment: usize,
}

/// A broken promise of the plan, one variant per rule the validator checks, naming the nodes,
/// byte ranges and sizes involved. Every message starts "invalid memory plan: ".
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanViolation {
    /// The location or workspace table does not have one entry per node.
    #[error(
        "invalid memory plan: {locations} locations and {workspaces} workspaces for {nodes} nodes"
    )]
    TableLength {
        locations: usize,
        workspaces: usize,
        nodes: usize,
    },
    /// The schedule does not run as many ops as the graph has nodes.
    #[error("invalid memory plan: the schedule has {scheduled} ops, the graph {nodes}")]
    ScheduleLength { scheduled: usize, nodes: usize },
    /// A node is scheduled twice, or the schedule names a node the graph does not have.
    #[error("invalid memory plan: {node} is scheduled twice or does not exist")]
    ScheduledTwice { node: NodeId },
    /// A node is scheduled before one of its operands.
    #[error("invalid memory plan: {node} ({op}) runs before its operand {operand}")]
    OperandNotReady {
        node: NodeId,
        op: &'static str,
        operand: NodeId,
    },
    /// A value's location is not the size of its type.
    #[error("invalid memory plan: {node} needs {needs} bytes but is given {given}")]
    WrongSize {
        node: NodeId,
        needs: usize,
        given: usize,
    },
    /// A value's offset is not a multiple of the alignment.
    #[error("invalid memory plan: {node} is at offset {offset}, not a multiple of {alignment}")]
    Misaligned {
        node: NodeId,
        offset: usize,
        alignment: usize,
    },
    /// A value lies (partly) past the end of the allocation.
    #[error(
        "invalid memory plan: {node} at [{start}, {end}) lies outside the {total} byte allocation"
    )]
    OutsideAllocation {
        node: NodeId,
        start: usize,
        end: usize,
        total: usize,
    },
    /// A kernel's workspace offset is not a multiple of the alignment.
    #[error(
        "invalid memory plan: the workspace of {node} is at offset {offset}, not a multiple of \
         {alignment}"
    )]
    WorkspaceMisaligned {
        node: NodeId,
        offset: usize,
        alignment: usize,
    },
    /// A kernel's workspace lies (partly) past the end of the allocation.
    #[error(
        "invalid memory plan: the workspace of {node} at [{start}, {end}) lies outside the \
         {total} byte allocation"
    )]
    WorkspaceOutsideAllocation {
        node: NodeId,
        start: usize,
        end: usize,
        total: usize,
    },
    /// A kernel writes two of its outputs to overlapping bytes.
    #[error("invalid memory plan: {node} writes its outputs {a} and {b} over each other")]
    OutputsOverlap { node: NodeId, a: NodeId, b: NodeId },
    /// A value is read after its bytes were given to another value (outside its lifetime).
    #[error(
        "invalid memory plan: {node} ({op}) reads {operand} at [{start}, {end}), but those bytes \
         no longer hold it"
    )]
    ReadAfterOverwrite {
        node: NodeId,
        op: &'static str,
        operand: NodeId,
        start: usize,
        end: usize,
    },
    /// A kernel's output overlaps an operand it may not write over (not exactly the same bytes,
    /// or an op that does not read its operand only at the output's own index).
    #[error(
        "invalid memory plan: {node} ({op}) writes over its operand {operand} while reading it \
         (its output {output})"
    )]
    WritesOverOperand {
        node: NodeId,
        op: &'static str,
        operand: NodeId,
        output: NodeId,
    },
    /// A workspace filled ahead of its node is said to be filled at or after the node runs.
    #[error(
        "invalid memory plan: the workspace of {node} ({op}) is filled after position {after}, \
         not before the node's own position {at}"
    )]
    WorkspaceFilledLate {
        node: NodeId,
        op: &'static str,
        after: usize,
        at: usize,
    },
    /// Something is written over a workspace between its early fill and its node.
    #[error(
        "invalid memory plan: the workspace of {node} ({op}), filled after position {after}, is \
         overwritten before {node} runs"
    )]
    WorkspaceOverwritten {
        node: NodeId,
        op: &'static str,
        after: usize,
    },
    /// A kernel's workspace overlaps one of its operands.
    #[error("invalid memory plan: {node} ({op}) has its workspace on its operand {operand}")]
    WorkspaceOnOperand {
        node: NodeId,
        op: &'static str,
        operand: NodeId,
    },
    /// A kernel's workspace overlaps one of its outputs.
    #[error("invalid memory plan: {node} ({op}) has its workspace on its own output {output}")]
    WorkspaceOnOutput {
        node: NodeId,
        op: &'static str,
        output: NodeId,
    },
    /// A view (reshape, stop_gradient) is not placed on its operand's bytes.
    #[error("invalid memory plan: {op} {node} is not placed on its operand {operand}")]
    ViewNotOnOperand {
        node: NodeId,
        op: &'static str,
        operand: NodeId,
    },
    /// The outputs of an all-reduce (a gradient bucket) are not one region: each must start at
    /// the first aligned offset after the previous one ends.
    #[error(
        "invalid memory plan: all-reduce {node} has its output {output} at offset {offset}, not          at {expected} right after the previous output: a bucket must be one contiguous region"
    )]
    BucketNotContiguous {
        node: NodeId,
        output: NodeId,
        offset: usize,
        expected: usize,
    },
    /// A graph output's bytes were reused before the step ended.
    #[error("invalid memory plan: output {name:?} ({node}) was overwritten before the step ended")]
    OutputOverwritten { name: String, node: NodeId },
    /// A parameter's new value was overwritten before it was copied over the parameter.
    #[error(
        "invalid memory plan: the new value {value} of {target} was overwritten before it was \
         copied"
    )]
    UpdateOverwrittenBeforeCopy { value: NodeId, target: NodeId },
    /// A parameter does not hold its new value when the step ends.
    #[error(
        "invalid memory plan: {target} does not hold its new value {value} when the step ends"
    )]
    UpdateNotHeld { target: NodeId, value: NodeId },
}

/// The tag of bytes a kernel used as scratch: no value of the graph.
const SCRATCH: NodeId = NodeId(u32::MAX);

/// What node `id`'s workspace holds once filled ahead of it: a token no value has (graphs hold
/// far fewer than 2^31 nodes).
fn filled(id: NodeId) -> NodeId {
    NodeId(u32::MAX - 1 - id.0)
}

/// How a byte range `[offset, offset + bytes)` breaks the placement rules, if it does.
enum Misplaced {
    Misaligned,
    Outside { end: usize },
}

fn misplaced(offset: usize, bytes: usize, p: &PlanView<'_>) -> Option<Misplaced> {
    if !offset.is_multiple_of(p.alignment.max(1)) {
        return Some(Misplaced::Misaligned);
    }
    offset
        .checked_add(bytes)
        .is_none_or(|e| e > p.total_bytes)
        .then(|| Misplaced::Outside {
            end: offset.saturating_add(bytes),
        })
}

/// Replays the plan and returns the first violation found.
pub fn validate(p: &PlanView<'_>) -> Result<(), PlanViolation> {
    use PlanViolation as V;
    let g = p.graph;
    if p.location.len() != g.len()
        || p.workspace.len() != g.len()
        || p.workspace_filled_after.len() != g.len()
    {
        return Err(V::TableLength {
            locations: p.location.len(),
            workspaces: p.workspace.len(),
            nodes: g.len(),
        });
    }
    // The order runs each node once, after its operands.
    let mut done = vec![false; g.len()];
    if p.order.len() != g.len() {
        return Err(V::ScheduleLength {
            scheduled: p.order.len(),
            nodes: g.len(),
        });
    }
    for &id in p.order {
        if id.index() >= g.len() || done[id.index()] {
            return Err(V::ScheduledTwice { node: id });
        }
        if let Some(x) = g.node(id).inputs.iter().find(|x| !done[x.index()]) {
            return Err(V::OperandNotReady {
                node: id,
                op: g.node(id).op.name(),
                operand: *x,
            });
        }
        done[id.index()] = true;
    }
    // Every location is aligned, the right size, and inside the allocation.
    for id in g.ids() {
        let l = p.location[id.index()];
        if l.bytes != g.ty(id).bytes() {
            return Err(V::WrongSize {
                node: id,
                needs: g.ty(id).bytes(),
                given: l.bytes,
            });
        }
        match misplaced(l.offset, l.bytes, p) {
            Some(Misplaced::Misaligned) => {
                return Err(V::Misaligned {
                    node: id,
                    offset: l.offset,
                    alignment: p.alignment,
                })
            }
            Some(Misplaced::Outside { end }) => {
                return Err(V::OutsideAllocation {
                    node: id,
                    start: l.offset,
                    end,
                    total: p.total_bytes,
                })
            }
            None => {}
        }
    }
    for (id, w) in g.ids().zip(p.workspace) {
        let Some(w) = *w else { continue };
        match misplaced(w.offset, w.bytes, p) {
            Some(Misplaced::Misaligned) => {
                return Err(V::WorkspaceMisaligned {
                    node: id,
                    offset: w.offset,
                    alignment: p.alignment,
                })
            }
            Some(Misplaced::Outside { end }) => {
                return Err(V::WorkspaceOutsideAllocation {
                    node: id,
                    start: w.offset,
                    end,
                    total: p.total_bytes,
                })
            }
            None => {}
        }
    }
    // What each value's bytes are: a view's are its operand's.
    let mut content: Vec<NodeId> = g.ids().collect();
    for &id in p.order {
        if g.node(id).op.is_alias() {
            content[id.index()] = content[g.node(id).inputs[0].index()];
        }
    }
    // The values each node's kernel writes: a fused kernel's result nodes besides its own.
    let mut written: Vec<Vec<NodeId>> = g.ids().map(|id| vec![id]).collect();
    let mut results: Vec<(NodeId, usize, NodeId)> = Vec::new();
    for id in g.ids() {
        if let Op::Result { index } = g.node(id).op {
            written[id.index()].clear();
            results.push((g.node(id).inputs[0], index, id));
        }
    }
    results.sort();
    for (k, _, r) in results {
        written[k.index()].push(r);
    }
    let overlap = |a: Location, b: Location| {
        a.bytes > 0 && b.bytes > 0 && a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes
    };
    // The workspaces filled ahead of their nodes, by the position after which each is filled.
    let mut position = vec![0; g.len()];
    for (i, &id) in p.order.iter().enumerate() {
        position[id.index()] = i;
    }
    let mut fills: Vec<Vec<NodeId>> = vec![Vec::new(); p.order.len()];
    for id in g.ids() {
        let Some(after) = p.workspace_filled_after[id.index()] else {
            continue;
        };
        if after >= position[id.index()] || p.workspace[id.index()].is_none() {
            return Err(V::WorkspaceFilledLate {
                node: id,
                op: g.node(id).op.name(),
                after,
                at: position[id.index()],
            });
        }
        fills[after].push(id);
    }
    let mut memory = Memory::default();
    for (at, &id) in p.order.iter().enumerate() {
        // The fills that run after the op before this one.
        for &f in at.checked_sub(1).map_or(&[][..], |b| &fills[b]) {
            if let Some(w) = p.workspace[f.index()] {
                memory.write(w, filled(f));
            }
        }
        let node = g.node(id);
        let here = p.location[id.index()];
        if node.op.is_leaf() {
            memory.write(here, id);
            continue;
        }
        if matches!(node.op, Op::Result { .. }) {
            continue;
        }
        let outs = &written[id.index()];
        for (j, &o) in outs.iter().enumerate() {
            for &o2 in &outs[j + 1..] {
                if overlap(p.location[o.index()], p.location[o2.index()]) {
                    return Err(V::OutputsOverlap {
                        node: id,
                        a: o,
                        b: o2,
                    });
                }
            }
        }
        for (i, &x) in node.inputs.iter().enumerate() {
            let lx = p.location[x.index()];
            if !memory.holds(lx, content[x.index()]) {
                return Err(V::ReadAfterOverwrite {
                    node: id,
                    op: node.op.name(),
                    operand: x,
                    start: lx.offset,
                    end: lx.offset + lx.bytes,
                });
            }
            for (j, &o) in outs.iter().enumerate() {
                let lo = p.location[o.index()];
                let in_place_ok = lx == lo
                    && match &node.op {
                        Op::Fused(k) => k.can_write_over(i, j),
                        // The collective writes mean `j` over operand `j` only.
                        Op::AllReduce { .. } => i == j,
                        // The GEMM adds its product into the accumulator `c`'s bytes.
                        Op::MatMulAcc { .. } => i == 0,
                        op => op.is_alias() || op.is_elementwise(),
                    };
                if overlap(lx, lo) && !in_place_ok {
                    return Err(V::WritesOverOperand {
                        node: id,
                        op: node.op.name(),
                        operand: x,
                        output: o,
                    });
                }
            }
        }
        if let Some(w) = p.workspace[id.index()] {
            let overlap = |l: Location| {
                l.bytes > 0
                    && w.bytes > 0
                    && l.offset < w.offset + w.bytes
                    && w.offset < l.offset + l.bytes
            };
            if let Some(x) = node.inputs.iter().find(|x| overlap(p.location[x.index()])) {
                return Err(V::WorkspaceOnOperand {
                    node: id,
                    op: node.op.name(),
                    operand: *x,
                });
            }
            if let Some(&o) = outs.iter().find(|&&o| overlap(p.location[o.index()])) {
                return Err(V::WorkspaceOnOutput {
                    node: id,
                    op: node.op.name(),
                    output: o,
                });
            }
            if let Some(after) = p.workspace_filled_after[id.index()] {
                if !memory.holds(w, filled(id)) {
                    return Err(V::WorkspaceOverwritten {
                        node: id,
                        op: node.op.name(),
                        after,
                    });
                }
            }
            // Whatever lived there is gone: later reads of it must fail.
            memory.write(w, SCRATCH);
        }
        if node.op.is_alias() {
            if here != p.location[node.inputs[0].index()] {
                return Err(V::ViewNotOnOperand {
                    node: id,
                    op: node.op.name(),
                    operand: node.inputs[0],
                });
            }
            continue;
        }
        if let Op::AllReduce { .. } = node.op {
            // One collective over the outputs' whole region: each output right after the
            // previous one at the next aligned offset, and the padding between them clobbered.
            let align = p.alignment.max(1);
            for w in outs.windows(2) {
                let (a, b) = (p.location[w[0].index()], p.location[w[1].index()]);
                let expected = (a.offset + a.bytes).div_ceil(align) * align;
                if b.offset != expected {
                    return Err(V::BucketNotContiguous {
                        node: id,
                        output: w[1],
                        offset: b.offset,
                        expected,
                    });
                }
            }
            if let (Some(first), Some(last)) = (outs.first(), outs.last()) {
                let (a, b) = (p.location[first.index()], p.location[last.index()]);
                memory.write(
                    Location {
                        offset: a.offset,
                        bytes: b.offset + b.bytes - a.offset,
                    },
                    SCRATCH,
                );
            }
        }
        for &o in outs {
            memory.write(p.location[o.index()], o);
        }
    }
    for (name, &o) in &g.outputs {
        if !memory.holds(p.location[o.index()], content[o.index()]) {
            return Err(V::OutputOverwritten {
                name: name.clone(),
                node: o,
            });
        }
    }
    for &(v, t) in p.copies {
        if !memory.holds(p.location[v.index()], content[v.index()]) {
            return Err(V::UpdateOverwrittenBeforeCopy {
                value: v,
                target: t,
            });
        }
        memory.write(p.location[t.index()], content[v.index()]);
    }
    for u in &g.updates {
        if !memory.holds(p.location[u.target.index()], content[u.value.index()]) {
            return Err(V::UpdateNotHeld {
                target: u.target,
                value: u.value,
            });
        }
    }
    Ok(())
}

/// Byte ranges and the value each holds: `start -> (end, value)`, non-overlapping.
#[derive(Default)]
struct Memory {
    ranges: BTreeMap<usize, (usize, NodeId)>,
}

impl Memory {
    fn write(&mut self, l: Location, v: NodeId) {
        if l.bytes == 0 {
            return;
        }
        let (start, end) = (l.offset, l.offset + l.bytes);
        // Cut every range overlapping [start, end), keeping the parts outside it.
        let overlapping: Vec<(usize, (usize, NodeId))> = self
            .ranges
            .range(..end)
            .rev()
            .take_while(|(_, &(e, _))| e > start)
            .map(|(&s, &r)| (s, r))
            .collect();
        for (s, (e, w)) in overlapping {
            self.ranges.remove(&s);
            if s < start {
                self.ranges.insert(s, (start, w));
            }
            if e > end {
                self.ranges.insert(end, (e, w));
            }
        }
        self.ranges.insert(start, (end, v));
    }

    fn holds(&self, l: Location, v: NodeId) -> bool {
        if l.bytes == 0 {
            return true;
        }
        let (start, end) = (l.offset, l.offset + l.bytes);
        let mut at = start;
        // The range covering `start` may begin before it.
        let first = self.ranges.range(..=start).next_back();
        let mut iter: Box<dyn Iterator<Item = (&usize, &(usize, NodeId))>> = match first {
            Some((&s, _)) => Box::new(self.ranges.range(s..end)),
            None => Box::new(self.ranges.range(start..end)),
        };
        while at < end {
            match iter.next() {
                Some((&s, &(e, w))) if s <= at && e > at && w == v => at = e,
                Some((&s, &(e, _))) if e <= at && s < at => continue,
                _ => return false,
            }
        }
        true
    }
}
