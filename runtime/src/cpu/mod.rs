//! The CPU backend: [`exec::exec_node`] computes one node into a caller-provided buffer;
//! [`interp::run_graph`] is the unplanned reference interpreter built on it, and
//! [`planned::PlannedStep`] runs a planned step in its one slab.

pub mod bf16;
pub mod exec;
pub mod interp;
pub mod planned;

pub use exec::{exec_node, exec_node_with, workspace_bytes, Scratch};
pub use interp::{check_leaves, run_graph, LeafValues, Values};

/// Planner options for the CPU target: each matmul's packing space is planned in the slab.
pub fn plan_options() -> ingot_compiler::plan::PlanOptions {
    ingot_compiler::plan::PlanOptions {
        workspace: Some(workspace_bytes),
        ..Default::default()
    }
}
