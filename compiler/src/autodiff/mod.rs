//! Reverse-mode automatic differentiation over the IR, and optimizers spelled as IR, so that a
//! whole training step (forward, backward, update) is one graph.

pub mod optim;

pub use optim::Optimizer;
