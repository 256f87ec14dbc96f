//! The replay: the schedule run over a map from byte ranges to the value they hold, proving
//! that every read finds the value it expects, that no kernel writes over what it still reads
//! or over its own workspace, and that the step ends with its outputs and updates in place.

use super::view::PlanView;
use super::violation::PlanViolation;
use crate::ir::{NodeId, Op};
use crate::plan::location::Location;
use std::collections::BTreeMap;

/// The tag of bytes a kernel used as scratch: no value of the graph.
const SCRATCH: NodeId = NodeId(u32::MAX);

/// What node `id`'s workspace holds once filled ahead of it: a token no value has (graphs hold
/// far fewer than 2^31 nodes).
fn filled(id: NodeId) -> NodeId {
    NodeId(u32::MAX - 1 - id.0)
}

/// Replays `p` and returns the first read, write or end-of-step state that breaks a rule.
pub(super) fn check(p: &PlanView<'_>) -> Result<(), PlanViolation> {
    use PlanViolation as V;
    let g = p.graph;
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
    // Offloaded leaves: written by their copy in, not where the leaf is scheduled; their new
    // value must be in the staging buffer when it is copied out, and the buffer is gone after.
    let mut offloaded = vec![false; g.len()];
    let (mut ins, mut outs) = (
        vec![Vec::new(); p.order.len()],
        vec![Vec::new(); p.order.len()],
    );
    for o in p.offload {
        offloaded[o.leaf.index()] = true;
        ins[o.copy_in_before].push(o.leaf);
        outs[o.copy_out_after].push(o.leaf);
    }
    let new_value = |leaf: NodeId| g.updates.iter().find(|u| u.target == leaf).map(|u| u.value);
    let mut copied_out = vec![false; g.len()];
    let mut memory = Memory::default();
    for (at, &id) in p.order.iter().enumerate() {
        // The fills that run after the op before this one.
        for &f in at.checked_sub(1).map_or(&[][..], |b| &fills[b]) {
            if let Some(w) = p.workspace[f.index()] {
                memory.write(w, filled(f));
            }
        }
        for &leaf in &ins[at] {
            memory.write(p.location[leaf.index()], leaf);
        }
        if !offloaded[id.index()] {
            step(p, &mut memory, &content, &written, id)?;
        }
        for &leaf in &outs[at] {
            let value = new_value(leaf).unwrap_or(leaf);
            let here = p.location[leaf.index()];
            if !memory.holds(here, content[value.index()]) {
                return Err(V::OffloadNotHeld { leaf, value, at });
            }
            memory.write(here, SCRATCH);
            copied_out[leaf.index()] = true;
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
        if offloaded[u.target.index()] {
            // Its home holds the new value once copied out (checked above).
            if !copied_out[u.target.index()] {
                return Err(V::UpdateNotHeld {
                    target: u.target,
                    value: u.value,
                });
            }
            continue;
        }
        if !memory.holds(p.location[u.target.index()], content[u.value.index()]) {
            return Err(V::UpdateNotHeld {
                target: u.target,
                value: u.value,
            });
        }
    }
    Ok(())
}

/// Runs node `id` over `memory`: checks its reads, writes and workspace, then writes its
/// outputs. `content` is what each value's bytes are; `written`, the values each node writes.
fn step(
    p: &PlanView<'_>,
    memory: &mut Memory,
    content: &[NodeId],
    written: &[Vec<NodeId>],
    id: NodeId,
) -> Result<(), PlanViolation> {
    use PlanViolation as V;
    let g = p.graph;
    let overlap = |a: Location, b: Location| {
        a.bytes > 0 && b.bytes > 0 && a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes
    };
    let node = g.node(id);
    let here = p.location[id.index()];
    if node.op.is_leaf() {
        memory.write(here, id);
        return Ok(());
    }
    if matches!(node.op, Op::Result { .. }) {
        return Ok(());
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
        return Ok(());
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
