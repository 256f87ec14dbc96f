//! What a lowered attention writes besides its named results.

use crate::ir::{Graph, NodeId, TensorType};

/// The outputs of attention node `id` that no result node names (nothing reads them: an lse
/// without backward pass, a dk whose operand needs no gradient), with their types. The kernels
/// write every output, so these go to the tail of the node's planned workspace.
pub fn unnamed_outputs(g: &Graph, id: NodeId) -> Vec<(usize, TensorType)> {
    let node = g.node(id);
    let types: Vec<&TensorType> = node.inputs.iter().map(|&x| g.ty(x)).collect();
    crate::ir::attention_outputs(&node.op, &types)
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .skip(1)
        .filter(|(i, _)| g.result_of(id, *i).is_none())
        .collect()
}
