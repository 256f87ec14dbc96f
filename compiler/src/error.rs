//! Errors the compiler returns. Every one names the op, the shapes or the line at fault and
//! says what to do; none of them is a panic.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum IrError {
    /// An op was given operands it cannot take (shapes, dtypes, attributes).
    #[error("{op} (node %{node}): {reason}; operands: {operands}")]
    Type {
        op: &'static str,
        node: usize,
        operands: String,
        reason: String,
    },
    /// An operand refers to a node that does not exist yet.
    #[error("{op} (node %{node}): operand %{operand} does not exist (the graph has {len} nodes; operands must come before their users)")]
    Dangling {
        op: &'static str,
        node: usize,
        operand: usize,
        len: usize,
    },
    /// The graph breaks a structural rule (duplicate names, bad updates, bad outputs).
    #[error("invalid graph: {0}")]
    Invalid(String),
    /// The text form could not be read.
    #[error("line {line}: {reason}")]
    Parse { line: usize, reason: String },
    /// A model specification could not be understood.
    #[error("model {spec:?}: {reason}")]
    Model { spec: String, reason: String },
}

pub type Result<T, E = IrError> = std::result::Result<T, E>;
