//! The scratch memory a node's kernel is given.

/// Scratch memory for kernels that need it (matmul packs its panels there).
pub enum Scratch<'a> {
    /// Bytes planned for this node (256-byte aligned, at least
    /// [`ingot_compiler::lower::cpu::workspace_bytes`] long).
    Given(&'a mut [u8]),
    /// Allocate what the kernel needs for this call (the reference interpreter's way).
    Allocate,
}
