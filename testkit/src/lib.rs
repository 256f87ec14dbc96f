//! What Ingot's tests, benchmarks and fuzz targets share, kept out of production crates
//! (`publish = false`; no production crate depends on it):
//! - [`kernel_check`]: every kernel of a model, or random ones, run on the GPU against the CPU;
//! - [`random_step`]: random training steps checked against the unfused reference interpreter;
//! - [`fuzz`]: the bodies and properties of the fuzz targets (fuzz/), and their bounded twins;
//! - [`cxx`]: the host's C++ compiler, for the kernel tests that compile CUDA C for the host.

pub mod cxx;
pub mod fuzz;
pub mod kernel_check;
pub mod random_step;
