//! The CUDA backend, on cudarc with the driver, NVRTC and cuBLAS loaded at run time: it builds
//! everywhere, and without a driver or GPU [`available`] (and so every constructor) returns an
//! error saying so instead of failing to load.
//!
//! The step arrives lowered ([`ingot_compiler::lower::cuda`]: device operations with byte
//! offsets, their dependency graph, the kernels' CUDA C); this backend only loads and runs it:
//! - [`ptx`]: NVRTC compilation, once, with the PTX cached by source and options;
//! - [`device`]: the loaded step: one allocation, a CUDA graph replayed every step;
//! - [`require`]: whether a GPU test runs, skips or fails (`INGOT_REQUIRE_GPU`);
//! - [`libsearch`]: finding a library PyTorch's Python packages hold, and loading it;
//! - [`nccl`]: NCCL, found and bound at run time;
//! - [`cudnn`]: cuDNN, found and bound at run time, for the convolutions;
//! - [`ranks`]: the GPUs of a data-parallel step, one rank each, averaging over NCCL;
//! - [`process`]: one rank of a job of one process per GPU (`--torchrun`);
//! - [`timeline`]: where time goes inside the step's graph, from a stamp after each operation.
//!
//! The check of every kernel against the CPU (a model's, or random ones) is test code: the
//! dev-only `ingot-testkit` crate's `kernel_check`.

pub mod cudnn;
pub mod device;
pub mod libsearch;
pub mod nccl;
pub mod pinned;
pub mod process;
pub mod ptx;
pub mod ranks;
pub mod require;
pub mod timeline;

pub use device::{available, cudnn_with_gpu, CudaOptions, CudaStep, DeviceMemory};
pub use pinned::PinnedBuffer;
pub use require::gpu_for_test;
