//! Ingot runtime: host tensors, the CPU backend, the CUDA backend, and the `ingot` program.

pub mod cli;
pub mod collective;
pub mod cpu;
pub mod cuda;
pub mod data;
pub mod error;
pub mod executor;
pub mod fuzz;
pub mod init;
pub mod io;
pub mod random_step;
pub mod session;
pub mod tensor;
pub mod trainer;

pub use error::ExecError;
pub use executor::StepExecutor;
pub use tensor::{Data, Element, Tensor, View, ViewMut};
