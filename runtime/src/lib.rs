//! Ingot runtime: host tensors, the CPU executor, and (later) loading executables and the CUDA
//! backend.

pub mod cli;
pub mod cpu;
pub mod error;
pub mod init;
pub mod io;
pub mod session;
pub mod tensor;

pub use error::ExecError;
pub use tensor::{Data, Element, Tensor, View, ViewMut};
