//! The intermediate representation: a graph of primitive ops with shapes and dtypes checked as
//! each node is added.

mod attention;
mod graph;
mod infer;
mod op;
pub mod origin;
mod rebuild;
pub mod scalar;
mod shape;
mod tensor_type;
pub mod text;
pub mod window;

pub use attention::{
    attention_check, attention_outputs, attention_problem, Problem as AttentionProblem,
};
pub use graph::{Graph, Mode, Node, NodeId, Operands, Update, Users};
pub use infer::infer;
pub use ingot_kernels::{BinaryOp, CmpOp, DType, ReduceOp, UnaryOp};
pub use op::{AttentionLayout, Axes, Init, LeafKind, Op};
pub use origin::Origin;
pub use shape::Shape;
pub use tensor_type::TensorType;
pub use window::{Conv2d, ConvLayout, Pool2d, WindowOp};
