//! The step's three phases (forward, backward, optimizer update): autodiff makes them, so they
//! live here. A step straight out of autodiff knows its phases as node ranges ([`Phases`]); a
//! graph rewritten and fused since has lost that order, so [`of_graph`] recovers each node's
//! phase from the data flow. Fusion, the memory report and the plan picture all read them from
//! here, which keeps those later stages from importing each other.

use crate::ir::{Graph, LeafKind, NodeId, Op};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::ops::Range;

/// Node ranges of the forward pass, the backward pass and the optimizer update.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Phases {
    pub forward: Range<usize>,
    pub backward: Range<usize>,
    pub optimizer: Range<usize>,
}

/// Which pass of the step a node belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Forward,
    Backward,
    Optimizer,
}

impl Phases {
    /// The phases of a step of `n` nodes that is a forward pass alone.
    pub fn forward_only(n: usize) -> Phases {
        Phases {
            forward: 0..n,
            backward: n..n,
            optimizer: n..n,
        }
    }

    /// The phase of each node of the step graph these ranges describe.
    pub fn of_nodes(&self, n: usize) -> Vec<Phase> {
        (0..n)
            .map(|i| {
                if self.forward.contains(&i) {
                    Phase::Forward
                } else if self.backward.contains(&i) {
                    Phase::Backward
                } else {
                    Phase::Optimizer
                }
            })
            .collect()
    }
}

/// Which phase each node of a (fused) step graph belongs to, by data flow: the loss and what it
/// depends on is the forward pass; kernels writing a parameter's or state's new value are the
/// optimizer; the rest is the backward pass.
pub fn of_graph(g: &Graph, loss: Option<NodeId>) -> Vec<Phase> {
    let mut p = vec![Phase::Backward; g.len()];
    if let Some(l) = loss {
        let mut stack = vec![l];
        while let Some(x) = stack.pop() {
            if p[x.index()] == Phase::Forward {
                continue;
            }
            p[x.index()] = Phase::Forward;
            stack.extend(g.node(x).inputs.iter().copied());
        }
    }
    let kouts = g.kernel_outputs();
    let update_values: BTreeSet<NodeId> = g.updates.iter().map(|u| u.value).collect();
    for id in g.ids() {
        if p[id.index()] != Phase::Forward
            && kouts[g.writer(id).index()]
                .iter()
                .any(|o| update_values.contains(o))
        {
            p[id.index()] = Phase::Optimizer;
        }
        if let Op::Leaf { kind, .. } = g.node(id).op {
            p[id.index()] = match kind {
                LeafKind::Input => Phase::Forward,
                _ => p[id.index()],
            };
        }
    }
    p
}
