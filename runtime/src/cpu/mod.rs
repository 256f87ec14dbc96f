//! The CPU backend: [`exec::exec_node`] computes one node into a caller-provided buffer;
//! [`interp::run_graph`] is the unplanned reference interpreter built on it, and
//! [`planned::PlannedStep`] runs a CPU step executable (lowered by
//! [`ingot_compiler::lower::cpu`]) in its one slab.

pub mod bf16;
pub mod exec;
pub mod interp;
pub mod planned;
mod profile;
pub mod ranks;
mod scratch;
pub mod threads;

pub use exec::{exec_node, exec_node_with, Scratch};
pub use interp::{check_leaves, run_graph, LeafValues, Values};
