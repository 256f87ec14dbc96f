//! The precision a model trains in: a choice made with the model (its file's `precision`
//! line, or the command line), like its optimizer. What each precision does to the step is
//! the precision stage's business (the `precision` module).

use serde::{Deserialize, Serialize};

/// The arithmetic a compiled step uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// f32 everywhere: the reference.
    #[default]
    F32,
    /// f32 storage; the GPU's matrix products use TF32 tensor cores (a runtime choice: the
    /// graph is the f32 one).
    Tf32,
    /// bf16 mixed precision (the `precision` module's `autocast_bf16`).
    Bf16,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Tf32 => "tf32",
            Precision::Bf16 => "bf16",
        }
    }

    pub fn from_name(s: &str) -> Option<Precision> {
        [Precision::F32, Precision::Tf32, Precision::Bf16]
            .into_iter()
            .find(|p| p.name() == s)
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
