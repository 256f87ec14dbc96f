//! The whole training step as one graph: forward, backward, optimizer update.

use super::{grad, Optimizer};
use crate::error::{IrError, Result};
use crate::ir::{Graph, LeafKind, NodeId, Op};
use serde::Serialize;
use std::ops::Range;

/// The name of the forward graph's output that the step minimises.
pub const LOSS: &str = "loss";

/// A training step graph, with the node ranges of its three phases (for reports and benchmarks).
#[derive(Clone, Debug)]
pub struct Step {
    pub graph: Graph,
    pub phases: Phases,
}

/// Node ranges of the forward pass, the backward pass and the optimizer update.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Phases {
    pub forward: Range<usize>,
    pub backward: Range<usize>,
    pub optimizer: Range<usize>,
}

/// Builds the training step of `forward` (which must name its scalar loss `"loss"`):
/// gradients of the loss with respect to every parameter, then `optimizer`'s in-place updates.
pub fn training_step(forward: &Graph, optimizer: &Optimizer) -> Result<Step> {
    let loss = *forward.outputs.get(LOSS).ok_or_else(|| {
        IrError::Invalid(format!("the forward graph has no output named {LOSS:?}"))
    })?;
    if !forward.updates.is_empty() {
        return Err(IrError::Invalid(
            "the forward graph already updates leaves; is it a step already?".into(),
        ));
    }
    let (mut g, map) = forward.without_dead_code();
    let loss = map[loss.index()].expect("outputs survive dead-code removal");
    let params = g.leaves(LeafKind::Parameter);
    if params.is_empty() {
        return Err(IrError::Invalid(
            "the forward graph has no parameters to train".into(),
        ));
    }
    if !depends_on_a_parameter(&g, loss) {
        return Err(IrError::Invalid(format!(
            "the loss {loss} depends on no parameter, so no step can change it (as PyTorch says, it \"does not require grad\"); compute the loss from the model's parameters"
        )));
    }
    let f = g.len();
    let grads = grad::grad(&mut g, loss, &params)?;
    let b = g.len();
    optimizer.apply(&mut g, &params, &grads)?;
    let n = g.len();
    Ok(Step {
        graph: g,
        phases: Phases {
            forward: 0..f,
            backward: f..b,
            optimizer: b..n,
        },
    })
}

/// True when some parameter reaches `x` through the graph's operands. The node list is a
/// topological order, so one forward sweep decides it for every node.
fn depends_on_a_parameter(g: &Graph, x: NodeId) -> bool {
    let mut depends = vec![false; x.index() + 1];
    for id in g.ids().take(x.index() + 1) {
        let node = g.node(id);
        depends[id.index()] = matches!(
            node.op,
            Op::Leaf {
                kind: LeafKind::Parameter,
                ..
            }
        ) || node.inputs.iter().any(|i| depends[i.index()]);
    }
    depends[x.index()]
}
