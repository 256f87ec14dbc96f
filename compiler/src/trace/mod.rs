//! Tracing: building graphs from Rust code. `builder` adds one method per primitive to
//! [`crate::ir::Graph`]; `nn` composes them into layers; `models` builds the reference models.

pub mod accuracy;
mod builder;
pub mod conv;
pub mod layers;
pub mod logits;
pub mod nn;

pub use builder::broadcast_shapes;
