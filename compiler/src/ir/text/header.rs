//! The text form's first line, `ingot-ir 1`: its keyword and the version this build writes
//! and reads.

/// The version this build writes and reads, on the first line: `ingot-ir 1`.
pub const VERSION: u32 = 1;

/// The header's keyword.
pub(super) const MAGIC: &str = "ingot-ir";
