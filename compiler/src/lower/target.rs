//! The backends a step is lowered for.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The backend a step is planned and lowered for. Backends plan different library workspaces
/// (the CPU matmul's packing space, cuBLAS's workspace), so a plan runs only on its own target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    Cpu,
    Cuda,
}

impl Target {
    /// The name used on the command line and in the file (`cpu`, `cuda`).
    pub fn name(self) -> &'static str {
        match self {
            Target::Cpu => "cpu",
            Target::Cuda => "cuda",
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
