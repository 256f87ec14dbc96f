//! The reference interpreter: evaluates a graph node by node, in graph order, with a fresh
//! output tensor per node. It is the unplanned baseline that planned execution must match bit for
//! bit (both compute every node with [`exec_node`]).
//!
//! Dead nodes (on which no output or update depends) are skipped, and each value is dropped as
//! soon as its last live user has run, so memory stays near the graph's live set.

use super::exec::{exec_node, Scratch};
use crate::error::ExecError;
use crate::tensor::{Tensor, View, ViewMut};
use indexmap::IndexMap;
use ingot_compiler::ir::{Graph, LeafKind, NodeId, Op, TensorType};
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;

/// Where the interpreter finds the values of leaves (parameters, optimizer state, inputs).
pub trait LeafValues {
    /// The value of the leaf named `name`, if one is supplied.
    fn leaf_value(&self, name: &str) -> Option<&Tensor>;
}

impl<S: BuildHasher> LeafValues for IndexMap<String, Tensor, S> {
    fn leaf_value(&self, name: &str) -> Option<&Tensor> {
        self.get(name)
    }
}

impl<S: BuildHasher> LeafValues for HashMap<String, Tensor, S> {
    fn leaf_value(&self, name: &str) -> Option<&Tensor> {
        self.get(name)
    }
}

impl LeafValues for BTreeMap<String, Tensor> {
    fn leaf_value(&self, name: &str) -> Option<&Tensor> {
        self.get(name)
    }
}

/// What one run of a graph produces.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Values {
    /// The graph's outputs by name, in the graph's order.
    pub outputs: IndexMap<String, Tensor>,
    /// The new value of each updated leaf (parameters, optimizer state), by leaf name, in the
    /// graph's update order.
    pub updates: IndexMap<String, Tensor>,
}

impl Values {
    /// Writes the updated leaf values over `leaves` (what one training step does to the
    /// resident state), leaving the outputs here.
    pub fn apply_updates(&mut self, leaves: &mut IndexMap<String, Tensor>) {
        for (name, value) in self.updates.drain(..) {
            leaves.insert(name, value);
        }
    }
}

/// A node's value during the run.
enum Slot<'a> {
    Empty,
    Leaf(&'a Tensor),
    Owned(Tensor),
}

impl Slot<'_> {
    fn tensor(&self) -> Option<&Tensor> {
        match self {
            Slot::Empty => None,
            Slot::Leaf(t) => Some(t),
            Slot::Owned(t) => Some(t),
        }
    }
}

/// The value of operand `x`: the walk runs every operand before its readers and keeps it until
/// its last use, so its slot is full.
fn operand<'s>(slots: &'s [Slot], x: NodeId) -> &'s Tensor {
    slots[x.index()]
        .tensor()
        .expect("operands run first and live until their last use")
}

/// Error `e` of node `i` (op `op`), wrapped to name the node.
fn at_node(i: usize, op: &'static str, e: ExecError) -> ExecError {
    ExecError::AtNode {
        node: i,
        op,
        source: Box::new(e),
    }
}

/// Checks the supplied value of every leaf of `g` that has one (and, for leaves some output or
/// update depends on, that it has one): the value must have the leaf's exact shape and dtype.
pub fn check_leaves<L: LeafValues + ?Sized>(g: &Graph, leaves: &L) -> Result<(), ExecError> {
    let live = g.live_mask();
    for id in g.ids() {
        let node = g.node(id);
        if let Op::Leaf { name, kind, .. } = &node.op {
            leaf_value(*kind, name, &node.ty, leaves, live[id.index()])?;
        }
    }
    Ok(())
}

fn leaf_value<'a, L: LeafValues + ?Sized>(
    kind: LeafKind,
    name: &str,
    ty: &TensorType,
    leaves: &'a L,
    required: bool,
) -> Result<Option<&'a Tensor>, ExecError> {
    match leaves.leaf_value(name) {
        None if required => Err(ExecError::MissingLeaf {
            kind,
            name: name.to_string(),
            expected: ty.clone(),
        }),
        None => Ok(None),
        Some(t)
            if t.ty != *ty || t.data.dtype() != ty.dtype || t.data.len() != ty.shape.numel() =>
        {
            Err(ExecError::LeafType {
                kind,
                name: name.to_string(),
                expected: ty.clone(),
                got: t.ty.clone(),
            })
        }
        Some(t) => Ok(Some(t)),
    }
}

/// Evaluates every live node of `g` in order and returns the outputs by name and the new values
/// of updated leaves by leaf name.
///
/// Every leaf that an output or update depends on needs a value in `leaves` of exactly the
/// leaf's type; a missing or mistyped value is an error naming the leaf and both types (values
/// for other names are ignored). An error while executing a node is wrapped in
/// [`ExecError::AtNode`] naming the node and its op.
pub fn run_graph<L: LeafValues + ?Sized>(g: &Graph, leaves: &L) -> Result<Values, ExecError> {
    check_leaves(g, leaves)?;
    let live = g.live_mask();
    // Remaining operand uses of each node by live nodes; outputs and updates pin their node.
    let mut uses = vec![0u32; g.len()];
    let mut pinned = vec![0u32; g.len()];
    for id in g.ids() {
        if live[id.index()] {
            for &x in &g.node(id).inputs {
                uses[x.index()] += 1;
            }
        }
    }
    for &o in g.outputs.values() {
        pinned[o.index()] += 1;
    }
    for u in &g.updates {
        pinned[u.value.index()] += 1;
    }

    let mut slots: Vec<Slot> = (0..g.len()).map(|_| Slot::Empty).collect();
    // A fused kernel's extra outputs, held until their result nodes are reached.
    let kernel_outputs = g.kernel_outputs();
    let mut pending: HashMap<NodeId, Tensor> = HashMap::new();
    for id in g.ids() {
        let i = id.index();
        if !live[i] {
            continue;
        }
        let node = g.node(id);
        if let Op::Leaf { name, kind, .. } = &node.op {
            let t = leaf_value(*kind, name, &node.ty, leaves, true)?
                .expect("required leaves have values");
            slots[i] = Slot::Leaf(t);
            continue;
        }
        if let Op::Result { .. } = node.op {
            let t = pending.remove(&id).ok_or_else(|| ExecError::Invalid {
                op: "result",
                reason: format!("{id} is not an output of a kernel that has run"),
            })?;
            slots[i] = Slot::Owned(t);
        } else if let Op::Fused(kernel) = &node.op {
            let bytes: Vec<Vec<u8>> = node
                .inputs
                .iter()
                .map(|&x| operand(&slots, x).to_le_bytes())
                .collect();
            let refs: Vec<&[u8]> = bytes.iter().map(|b| b.as_slice()).collect();
            let outs = ingot_kernels::fused::cpu::run_buffers(kernel, &refs).map_err(|e| {
                let reason = e.to_string();
                at_node(
                    i,
                    "fused",
                    ExecError::Invalid {
                        op: "fused",
                        reason,
                    },
                )
            })?;
            for (j, (o, b)) in kernel_outputs[i].iter().zip(outs).enumerate() {
                let t = Tensor::from_le_bytes(g.ty(*o).clone(), &b)?;
                if j == 0 {
                    slots[i] = Slot::Owned(t);
                } else {
                    pending.insert(*o, t);
                }
            }
        } else {
            let views: Vec<View> = node
                .inputs
                .iter()
                .map(|&x| operand(&slots, x).view())
                .collect();
            let types: Vec<&TensorType> = node.inputs.iter().map(|&x| g.ty(x)).collect();
            let op = node.op.name();
            if node.op.is_attention() {
                // Every output gets a buffer, the lse too when no result node names it.
                let all = ingot_compiler::ir::attention_outputs(&node.op, &types)
                    .map_err(|reason| at_node(i, op, ExecError::Invalid { op, reason }))?;
                let mut outs: Vec<Tensor> = all.into_iter().map(Tensor::zeros).collect();
                {
                    let mut out_views: Vec<Option<ViewMut>> =
                        outs.iter_mut().map(|t| Some(t.view_mut())).collect();
                    super::exec::exec_attention(
                        node,
                        &views,
                        &types,
                        &mut out_views,
                        Scratch::Allocate,
                    )
                    .map_err(|e| at_node(i, op, e))?;
                }
                for (j, t) in outs.into_iter().enumerate() {
                    if j == 0 {
                        slots[i] = Slot::Owned(t);
                    } else if let Some(r) = g.result_of(id, j) {
                        pending.insert(r, t);
                    }
                }
            } else {
                let mut out = Tensor::zeros(node.ty.clone());
                exec_node(node, &views, &types, out.view_mut()).map_err(|e| at_node(i, op, e))?;
                slots[i] = Slot::Owned(out);
            }
        }
        // Operands (a result node's kernel included) are dropped after their last use.
        for &x in &node.inputs {
            let x = x.index();
            uses[x] -= 1;
            if uses[x] == 0 && pinned[x] == 0 {
                slots[x] = Slot::Empty;
            }
        }
    }

    let mut take = |id: NodeId, slots: &mut Vec<Slot>| -> Tensor {
        let i = id.index();
        pinned[i] -= 1;
        if pinned[i] == 0 {
            match std::mem::replace(&mut slots[i], Slot::Empty) {
                Slot::Owned(t) => return t,
                other => slots[i] = other,
            }
        }
        slots[i]
            .tensor()
            .expect("outputs and updates are live")
            .clone()
    };
    let mut values = Values::default();
    for (name, &id) in &g.outputs {
        values.outputs.insert(name.clone(), take(id, &mut slots));
    }
    for u in &g.updates {
        let name = g
            .leaf_name(u.target)
            .expect("update targets are leaves")
            .to_string();
        values.updates.insert(name, take(u.value, &mut slots));
    }
    Ok(values)
}
