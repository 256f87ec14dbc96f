//! The whole training step as one graph: forward, backward, optimizer update.

use super::{grad, Optimizer, Phases};
use crate::error::{IrError, Result};
use crate::ir::{Graph, LeafKind, NodeId, Op};

/// The name of the forward graph's output that the step minimises.
pub const LOSS: &str = "loss";

/// A training step graph, with the node ranges of its three phases (for reports and benchmarks).
#[derive(Clone, Debug)]
pub struct Step {
    pub graph: Graph,
    pub phases: Phases,
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
    // As in PyTorch, a parameter the loss does not depend on gets no gradient and so no update:
    // no weight decay, no optimizer state (its value stays as loaded, and is still saved).
    let reaches = ancestors(&g, loss);
    let params: Vec<NodeId> = params.into_iter().filter(|p| reaches[p.index()]).collect();
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

/// `out[i]` is true when `x` depends on node `i` (or is it). One backward sweep over the
/// topological node list.
fn ancestors(g: &Graph, x: NodeId) -> Vec<bool> {
    let mut reaches = vec![false; x.index() + 1];
    reaches[x.index()] = true;
    for id in g
        .ids()
        .take(x.index() + 1)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
    {
        if reaches[id.index()] {
            for i in &g.node(id).inputs {
                reaches[i.index()] = true;
            }
        }
    }
    reaches.resize(g.len(), false);
    reaches
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::text::parse;

    /// `v` feeds an output but not the loss.
    const UNREACHED: &str = r#"ingot-ir 1
%0 = parameter "w" init=normal(0.5) : f32[2,2]
%1 = parameter "v" init=normal(0.5) : f32[2,2]
%2 = input "x" : f32[4,2]
%3 = matmul(%2, %0) : f32[4,2]
%4 = mul(%3, %3) : f32[4,2]
%5 = reduce_sum(%4) axes=[0,1] : f32[1,1]
%6 = reshape(%5) : f32[]
%7 = matmul(%2, %1) : f32[4,2]
output "loss" = %6
output "other" = %7
"#;

    #[test]
    fn a_parameter_the_loss_does_not_reach_gets_no_update_and_no_optimizer_state() {
        let forward = parse(UNREACHED).unwrap();
        let step = training_step(&forward, &Optimizer::adamw(1e-3, 0.1)).unwrap();
        let g = &step.graph;
        let name = |id: NodeId| match &g.node(id).op {
            Op::Leaf { name, .. } => name.clone(),
            op => panic!("an update of a non-leaf {op:?}"),
        };
        let mut targets: Vec<String> = g.updates.iter().map(|u| name(u.target)).collect();
        targets.sort();
        assert_eq!(
            targets,
            [
                super::super::optim::STEP_COUNTER,
                "w",
                "w.exp_avg",
                "w.exp_avg_sq"
            ],
            "only w, its moments and the step counter are updated"
        );
        let mut state: Vec<String> = g.leaves(LeafKind::State).into_iter().map(name).collect();
        state.sort();
        assert_eq!(
            state,
            [
                super::super::optim::STEP_COUNTER,
                "w.exp_avg",
                "w.exp_avg_sq"
            ],
            "v has no optimizer state"
        );
    }
}
