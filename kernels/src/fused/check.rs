//! Validation of a fused kernel (placeholder until the checker lands).

/// What is wrong with a fused kernel, naming the instruction, input or output.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("fused kernel: {0}")]
    Invalid(String),
}
