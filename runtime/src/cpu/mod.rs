//! The CPU backend: [`exec::exec_node`] computes one node into a caller-provided buffer, and
//! [`interp::run_graph`] is the unplanned reference interpreter built on it.

pub mod exec;
pub mod interp;
pub mod planned;

pub use exec::exec_node;
pub use interp::{check_leaves, run_graph, LeafValues, Values};
