//! What Ingot's tests, benchmarks and fuzz targets share, kept out of production crates
//! (`publish = false`; no production crate depends on it):
//! - [`kernel_check`]: every kernel of a model, or random ones, run on the GPU against the CPU;
//! - [`random_step`]: random training steps checked against the unfused reference interpreter;
//! - [`fuzz`]: the bodies and properties of the fuzz targets (fuzz/), and their bounded twins;
//! - [`device`]: the raw CUDA driver calls the GPU harnesses share (GPU 0, load, launch, copy,
//!   time), the kernel check's and the attention tests' (runtime/tests/support/attention_device.rs);
//! - [`fused_kernels`]: the hand-built fused kernels (softmax, layer norm) of the kernel tests;
//!   [`kernel_builder`]: the builder the kernel tests write their kernels with;
//! - [`cxx`]: the host's C++ compiler, for the kernel tests that compile CUDA C for the host;
//!   [`block_emu`]: the emulation of CUDA blocks that runs generated fused kernels there;
//! - [`programs`]: the CUDA program of a lowered executable, as the tests read it;
//! - [`counting`]: the per-thread counting allocator of the tests that allocate nothing;
//! - [`lcg`]: the deterministic values the kernel tests draw their data from;
//! - [`text`]: the check that an error or a report names what it must;
//! - [`steps`]: whole CPU training steps against the reference interpreter, and their bytes;
//! - [`bytes`]: a buffer's bytes read back as f32 or i64 values;
//! - [`ir_text`]: models in the IR text form that several suites read.

pub mod block_emu;
pub mod bytes;
pub mod counting;
pub mod cxx;
pub mod device;
pub mod fused_kernels;
pub mod fuzz;
pub mod ir_text;
pub mod kernel_builder;
pub mod kernel_check;
pub mod lcg;
pub mod programs;
pub mod random_step;
pub mod steps;
pub mod text;
