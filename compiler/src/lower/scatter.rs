//! The operands of a reduce-scatter, as a lowered program names them.

use serde::{Deserialize, Serialize};

/// One operand of a reduce-scatter in a lowered program: the `ranks * bytes` bytes at `from`
/// (the whole operand) and this rank's `bytes` bytes of their sum at `to` (its output).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScatterPart {
    pub from: usize,
    pub to: usize,
    pub bytes: usize,
}
