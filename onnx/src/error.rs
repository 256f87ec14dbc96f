//! What an import can fail with. Every error names what is wrong and where: the file, the
//! node (its op type and name), the input and axis, or the tensor. None of them is a panic.

use ingot_compiler::IrError;
use std::fmt;
use thiserror::Error;

/// One node Ingot cannot import, and what would be needed to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsupported {
    /// The node's op type (`Erf`, `Conv`, ...), with its domain when it is not ONNX's own.
    pub op_type: String,
    /// The node's name (or `#index` when the file leaves it empty).
    pub node: String,
    /// Why, and what Ingot would need (an IR primitive, an attribute value it accepts, ...).
    pub reason: String,
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} node {:?}: {}", self.op_type, self.node, self.reason)
    }
}

#[derive(Debug, Error)]
pub enum OnnxError {
    /// The file could not be read.
    #[error("{path}: {reason}")]
    Io { path: String, reason: String },
    /// The bytes are not an ONNX model (truncated, garbage, or a field out of range).
    #[error("{what}: not a readable ONNX model: {reason}")]
    Decode { what: String, reason: String },
    /// The graph breaks a structural rule: a cycle, a name used before (or without) being
    /// produced, two producers of one name, a tensor whose data does not match its type.
    #[error("invalid ONNX graph: {0}")]
    Graph(String),
    /// Nodes Ingot cannot import, every one of them listed (see [`Unsupported`]).
    #[error("{} node(s) cannot be imported:\n{}", .0.len(), list(.0))]
    Unsupported(Vec<Unsupported>),
    /// A node could not be imported with the shapes and values it was given.
    #[error("{op_type} node {node:?}: {reason}")]
    Node {
        op_type: String,
        node: String,
        reason: String,
    },
    /// A batch size was asked for ([`crate::ImportOptions::batch`]) where the file fixes the
    /// input's batch axis to another: a caller that can take the file's batch imports again
    /// without one.
    #[error("input {input:?}: axis 0 has the fixed size {fixed} in the file, so the batch cannot be set to {asked} (export with a dynamic batch axis)")]
    FixedBatch {
        input: String,
        fixed: i64,
        asked: usize,
    },
    /// More data inputs than the trainer feeds (`fed`: `x`, and `y` unless the loss adds the
    /// labels), none held at a value: `names` lists them all in the file's order, so a caller
    /// that feeds fewer (generation feeds the first alone) can say which need a value.
    #[error("the model has {} data inputs ({names:?}); Ingot's trainer feeds {fed} with this loss (x{}): hold the others at a value (`--input-value NAME=VALUE`, e.g. attention_mask=1 token_type_ids=0; ImportOptions::fixed_inputs)", .names.len(), and_y(*.labels))]
    DataInputs {
        names: Vec<String>,
        fed: usize,
        labels: bool,
    },
    /// A graph input Ingot cannot make static, or the loss cannot be attached as asked.
    #[error("{0}")]
    Options(String),
    /// The finished graph was refused by Ingot's IR (a bug of the importer if it happens).
    #[error(transparent)]
    Ir(#[from] IrError),
}

/// What the trainer feeds besides `x`: the labels a loss adds, or the model's `y`.
fn and_y(labels: bool) -> &'static str {
    if labels {
        ", and the labels y"
    } else {
        " and y"
    }
}

fn list(items: &[Unsupported]) -> String {
    items
        .iter()
        .map(|u| format!("  {u}"))
        .collect::<Vec<_>>()
        .join("\n")
}

pub type Result<T, E = OnnxError> = std::result::Result<T, E>;
