//! Errors of the runtime. Each names the op, node, leaf or shapes at fault and says what to do;
//! bad input gives one of these, never a panic.

use ingot_compiler::ir::{DType, LeafKind, TensorType};
use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum ExecError {
    /// A live leaf of the graph has no value.
    #[error("no value was supplied for {} {name:?} of type {expected}; supply a tensor of that type under that name", kind_name(*kind))]
    MissingLeaf {
        kind: LeafKind,
        name: String,
        expected: TensorType,
    },
    /// A supplied leaf value does not have the type the graph declares.
    #[error("the value supplied for {} {name:?} is {got}, but the graph declares {expected}", kind_name(*kind))]
    LeafType {
        kind: LeafKind,
        name: String,
        expected: TensorType,
        got: TensorType,
    },
    /// A gather or scatter-add id does not name a row of the table.
    #[error("{op}: id {id} at position {position} of the ids is outside the table's {rows} rows (ids must lie in 0..{rows})")]
    IdOutOfRange {
        op: &'static str,
        id: i64,
        position: usize,
        rows: usize,
    },
    /// An operand buffer does not match the operand type it was given with.
    #[error("{op}: operand {index} should be {expected} ({} elements), but its buffer holds {got_len} {got_dtype} elements", expected.shape.numel())]
    Operand {
        op: &'static str,
        index: usize,
        expected: TensorType,
        got_dtype: DType,
        got_len: usize,
    },
    /// The output buffer does not match the node's type.
    #[error("{op}: the output should be {expected} ({} elements), but its buffer holds {got_len} {got_dtype} elements", expected.shape.numel())]
    Output {
        op: &'static str,
        expected: TensorType,
        got_dtype: DType,
        got_len: usize,
    },
    /// The node cannot be executed as given (operand count, types or attributes disagree).
    #[error("{op}: {reason}")]
    Invalid { op: &'static str, reason: String },
    /// The memory plan breaks a rule of the independent validator (which one, in the variant).
    #[error("plan: {0}")]
    Plan(#[from] ingot_compiler::plan::check::PlanViolation),
    /// A graph and plan could not be lowered into a step executable (its plan did not validate,
    /// or an op has no kernel on the target).
    #[error("lowering: {0}")]
    Lower(#[from] ingot_compiler::lower::LowerError),
    /// The GPU, its driver or a CUDA library failed, or is missing.
    #[error("CUDA: {what}: {reason}")]
    Device { what: String, reason: String },
    /// An error while executing one node of a graph.
    #[error("node %{node} ({op}): {source}")]
    AtNode {
        node: usize,
        op: &'static str,
        source: Box<ExecError>,
    },
    /// Tensor data that does not fit its declared type.
    #[error("tensor {ty}: {reason}")]
    Data { ty: TensorType, reason: String },
}

impl ExecError {
    /// The error without its node context.
    pub fn root(&self) -> &ExecError {
        match self {
            ExecError::AtNode { source, .. } => source.root(),
            e => e,
        }
    }
}

/// How errors name a leaf kind.
fn kind_name(kind: LeafKind) -> &'static str {
    match kind {
        LeafKind::Parameter => "parameter",
        LeafKind::State => "optimizer state",
        LeafKind::Input => "input",
    }
}
