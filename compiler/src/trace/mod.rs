//! Tracing: building graphs from Rust code. `builder` adds one method per primitive to
//! [`crate::ir::Graph`]; `nn` composes them into layers; the reference models built with them are the `ingot-models` crate (the model zoo).

pub mod accuracy;
mod builder;
pub mod conv;
mod layer_error;
pub mod layers;
pub mod logits;
pub mod nn;

pub use builder::broadcast_shapes;
