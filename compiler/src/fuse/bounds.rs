//! What one fused kernel may hold: its reductions ([`MAX_KERNEL_REDUCTIONS`]) and the scratch
//! it may take without being weighed against what it saves ([`scratch_bound`]). Lowering cuts
//! at the first, merging refuses past both, and fusion's rounds cut kernels over the second.

/// The most reductions one fused kernel holds. An executor evaluates a kernel's body once per
/// reduction level (a softmax is two passes over its row) and keeps per-pass bookkeeping for
/// every instruction, so a kernel's work and scratch grow with its reductions times its body:
/// merging a chain of n row reductions into one kernel cost O(n²) to compile (the growing group
/// lowered again at each merge), to run and to store (2,000 centred layers of f32[8, 8]
/// planned 252 MiB of scratch against 0.5 MiB unfused). A merge that would pass this is not
/// made, and is refused before the merged group is lowered, so each kernel of such a chain
/// costs a bounded amount. The reference models' largest kernel holds 7 reductions (resnet18's
/// batch-norm backward), so none of their kernels change.
pub const MAX_KERNEL_REDUCTIONS: usize = 16;

/// Scratch bytes a kernel may take without being weighed against what it saves: the CPU
/// executor's lane buffers alone take tens of KiB for a kernel over a thousand elements or
/// more, whatever its values.
pub const SCRATCH_FREE: usize = 64 << 10;

/// The scratch a kernel of a step whose largest value is `largest` bytes may take unweighed:
/// that value (the plan holds it anyway) or 64 times it up to [`SCRATCH_FREE`], whichever is
/// more. A lane buffer holds at most twice its kernel's domain in f32 bytes (the executor's
/// lanes stop at the domain), and no domain is larger than the largest value's elements, so
/// 64 times it covers 32 lane buffers; a step of tiny values (a deep chain of f32[8, 8]
/// layers, 256 bytes each) gets 16 KiB, not the 64 KiB that let one of its kernels plan more
/// scratch than 150 layers hold unfused. (16 times, 4 KiB there, cut that chain into ten
/// times as many kernels and made its compile grow 5.2x for 4x the layers.)
pub fn scratch_bound(largest: usize) -> usize {
    largest.max(SCRATCH_FREE.min(largest.saturating_mul(64)))
}
