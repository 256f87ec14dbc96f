//! The intermediate representation: a graph of primitive ops with shapes and dtypes checked as
//! each node is added.

mod dtype;
mod graph;
mod infer;
mod op;
mod shape;
pub mod text;

pub use dtype::DType;
pub use graph::{Graph, Node, NodeId, Operands, Update};
pub use infer::infer;
pub use op::{Axes, BinaryOp, CmpOp, Init, LeafKind, Op, ReduceOp, TensorType, UnaryOp};
pub use shape::Shape;
