//! Ingot runtime: runs an [`Executable`](ingot_compiler::exe::Executable) and nothing else.
//! Host tensors and their files ([`tensor`], [`io`]), the step executor trait ([`executor`]),
//! the CPU and CUDA executors ([`cpu`], [`cuda`]), NCCL and the rank collectives
//! ([`collective`]). A training run (data sets, the loop, checkpoints) is the `ingot-trainer`
//! crate's, and the command line the `ingot` crate's: this crate names neither (tests/layers.rs).

pub mod collective;
pub mod cpu;
pub mod cuda;
pub mod error;
pub mod executor;
pub mod io;
pub mod tensor;

pub use error::ExecError;
pub use executor::StepExecutor;
pub use tensor::{Data, Element, Tensor, View, ViewMut};
