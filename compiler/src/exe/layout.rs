//! Where each leaf of a step lives in its one allocation: the executable's table of leaves, a
//! module of its own so that the parts of the format that read it (the constants' check) need
//! not reach back into the executable.

use crate::ir::{Graph, LeafKind, Op};
use crate::plan::MemoryPlan;
use serde::{Deserialize, Serialize};

/// Where one leaf (parameter, optimizer state or input) lives in the step's one allocation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    pub name: String,
    /// `parameter`, `state` or `input`.
    pub kind: String,
    /// `f32`, `f64`, `i32`, `i64` or `bool`.
    pub dtype: String,
    pub shape: Vec<usize>,
    /// Byte offset in the allocation (inside the resident region).
    pub offset: usize,
    /// Bytes of the value (elements times the element size, before alignment).
    pub bytes: usize,
}

/// The layout of every leaf of `g` under `plan`, in graph order. `plan` must fit `g` (as a
/// plan the planner made, or one [`Executable::from_bytes`](super::Executable::from_bytes)
/// accepted, does).
pub fn layouts(g: &Graph, plan: &MemoryPlan) -> Vec<Layout> {
    g.ids()
        .filter_map(|id| match &g.node(id).op {
            Op::Leaf { name, kind, .. } => {
                let ty = g.ty(id);
                let loc = plan.location(g, id);
                Some(Layout {
                    name: name.clone(),
                    kind: match kind {
                        LeafKind::Parameter => "parameter",
                        LeafKind::State => "state",
                        LeafKind::Input => "input",
                    }
                    .to_string(),
                    dtype: ty.dtype.to_string(),
                    shape: ty.shape.dims().to_vec(),
                    offset: loc.offset,
                    bytes: loc.bytes,
                })
            }
            _ => None,
        })
        .collect()
}
