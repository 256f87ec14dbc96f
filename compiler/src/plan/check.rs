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
use std::fmt;

/// Where one node's value lives, as an absolute byte range of the step's single allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    /// `(value, target)` copies done after the last op.
    pub copies: &'a [(NodeId, NodeId)],
    /// Size of the single allocation.
    pub total_bytes: usize,
    pub alignment: usize,
}

/// A broken promise of the plan, naming the nodes involved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanViolation(pub String);

impl fmt::Display for PlanViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid memory plan: {}", self.0)
    }
}

impl std::error::Error for PlanViolation {}

/// The tag of bytes a kernel used as scratch: no value of the graph.
const SCRATCH: NodeId = NodeId(u32::MAX);

/// Replays the plan and returns the first violation found.
pub fn validate(p: &PlanView<'_>) -> Result<(), PlanViolation> {
    let g = p.graph;
    let err = |s: String| Err(PlanViolation(s));
    if p.location.len() != g.len() || p.workspace.len() != g.len() {
        return err(format!(
            "{} locations and {} workspaces for {} nodes",
            p.location.len(),
            p.workspace.len(),
            g.len()
        ));
    }
    // The order runs each node once, after its operands.
    let mut done = vec![false; g.len()];
    if p.order.len() != g.len() {
        return err(format!(
            "the schedule has {} ops, the graph {}",
            p.order.len(),
            g.len()
        ));
    }
    for &id in p.order {
        if id.index() >= g.len() || done[id.index()] {
            return err(format!("{id} is scheduled twice or does not exist"));
        }
        if let Some(x) = g.node(id).inputs.iter().find(|x| !done[x.index()]) {
            return err(format!(
                "{id} ({}) runs before its operand {x}",
                g.node(id).op.name()
            ));
        }
        done[id.index()] = true;
    }
    // Every location is aligned, the right size, and inside the allocation.
    for id in g.ids() {
        let l = p.location[id.index()];
        if l.bytes != g.ty(id).bytes() {
            return err(format!(
                "{id} needs {} bytes but is given {}",
                g.ty(id).bytes(),
                l.bytes
            ));
        }
        if !l.offset.is_multiple_of(p.alignment) {
            return err(format!(
                "{id} is at offset {}, not a multiple of {}",
                l.offset, p.alignment
            ));
        }
        if l.offset + l.bytes > p.total_bytes {
            return err(format!(
                "{id} at [{}, {}) lies outside the {} byte allocation",
                l.offset,
                l.offset + l.bytes,
                p.total_bytes
            ));
        }
    }
    for (i, w) in p.workspace.iter().enumerate() {
        if let Some(w) = w {
            if w.offset % p.alignment != 0 || w.offset + w.bytes > p.total_bytes {
                return err(format!(
                    "the workspace of %{i} at [{}, {}) is misaligned or outside the allocation",
                    w.offset,
                    w.offset + w.bytes
                ));
            }
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
    let mut memory = Memory::default();
    for &id in p.order {
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
                    return err(format!(
                        "{id} writes its outputs {o} and {o2} over each other"
                    ));
                }
            }
        }
        for (i, &x) in node.inputs.iter().enumerate() {
            let lx = p.location[x.index()];
            if !memory.holds(lx, content[x.index()]) {
                return err(format!(
                    "{id} ({}) reads {x} at [{}, {}), but those bytes no longer hold it",
                    node.op.name(),
                    lx.offset,
                    lx.offset + lx.bytes
                ));
            }
            for (j, &o) in outs.iter().enumerate() {
                let lo = p.location[o.index()];
                let in_place_ok = lx == lo
                    && match &node.op {
                        Op::Fused(k) => k.can_write_over(i, j),
                        op => op.is_alias() || op.is_elementwise(),
                    };
                if overlap(lx, lo) && !in_place_ok {
                    return err(format!(
                        "{id} ({}) writes over its operand {x} while reading it (its output {o})",
                        node.op.name()
                    ));
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
                return err(format!(
                    "{id} ({}) has its workspace on its operand {x}",
                    node.op.name()
                ));
            }
            if outs.iter().any(|&o| overlap(p.location[o.index()])) {
                return err(format!(
                    "{id} ({}) has its workspace on its own output",
                    node.op.name()
                ));
            }
            // Whatever lived there is gone: later reads of it must fail.
            memory.write(w, SCRATCH);
        }
        if node.op.is_alias() {
            if here != p.location[node.inputs[0].index()] {
                return err(format!(
                    "{} {id} is not placed on its operand",
                    node.op.name()
                ));
            }
            continue;
        }
        for &o in outs {
            memory.write(p.location[o.index()], o);
        }
    }
    for (name, &o) in &g.outputs {
        if !memory.holds(p.location[o.index()], content[o.index()]) {
            return err(format!(
                "output {name:?} ({o}) was overwritten before the step ended"
            ));
        }
    }
    for &(v, t) in p.copies {
        if !memory.holds(p.location[v.index()], content[v.index()]) {
            return err(format!(
                "the new value {v} of {t} was overwritten before it was copied"
            ));
        }
        memory.write(p.location[t.index()], content[v.index()]);
    }
    for u in &g.updates {
        if !memory.holds(p.location[u.target.index()], content[u.value.index()]) {
            return err(format!(
                "{} does not hold its new value {} when the step ends",
                u.target, u.value
            ));
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
