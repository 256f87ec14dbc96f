//! Running a fused kernel on the host (placeholder until the implementation lands).
