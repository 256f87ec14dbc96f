//! Reverse-mode automatic differentiation over the IR, and optimizers spelled as IR, so that a
//! whole training step (forward, backward, update) is one graph. Those three phases are
//! defined here too ([`phase`]), where they are made; later stages only read them.

pub mod accumulate;
pub mod buckets;
pub mod chunk;
pub mod copies;
pub mod grad;
mod names;
pub mod nonfinite;
pub mod optim;
pub mod phase;
pub mod shard;
mod slices;
pub mod step;

pub use grad::grad;
pub use nonfinite::NONFINITE;
pub use optim::Optimizer;
pub use phase::{Phase, Phases};
pub use step::{training_step, training_step_with, Step, StepOptions, GRAD_NORM, LOSS, LR_SCALE};
