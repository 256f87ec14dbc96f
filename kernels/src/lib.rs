//! CPU kernels.
