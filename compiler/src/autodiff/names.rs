//! Names the training step gives its outputs and its nodes' provenance.

/// The name of the forward graph's output that the step minimises.
pub const LOSS: &str = "loss";

/// The name of the output holding the gradients' global norm
/// ([`super::StepOptions::clip_grad_norm`]).
pub const GRAD_NORM: &str = "grad_norm";

/// The provenance of the running sums of the micro-batches' gradients. Fusion stores each
/// (fusion's `select::forced`): inlined, the chain `((g0 + g1) + g2) + ...` would become
/// one kernel after the last micro-batch, keeping every micro-batch's gradients alive until
/// then, instead of one addition as each micro-batch's gradient is made.
pub const ACCUMULATION: &str = "gradient accumulation";
