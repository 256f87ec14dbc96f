//! CPU kernels.

pub mod cpu;
