//! The `--precision` flag several subcommands share, and the device check that goes with it.

use crate::device::Device;
use crate::failure::Failure;

/// The precision a command compiles in: `--precision f32|tf32|bf16`, `--tf32` its alias for tf32.
#[derive(clap::Args, Debug, Clone, Copy, Default)]
pub struct PrecisionArgs {
    /// f32 (the reference); tf32 (f32 storage, the GPU's matrix products on TF32 tensor
    /// cores); bf16 (mixed precision as PyTorch's bf16 autocast: bf16 matmul operands and
    /// activations, f32 parameters, gradients, optimizer state, reductions and loss).
    /// Default: f32, or what the executable was compiled in (`ingot run`).
    #[arg(long, value_enum)]
    pub precision: Option<PrecisionName>,
    /// The same as --precision tf32.
    #[arg(long, conflicts_with = "precision")]
    pub tf32: bool,
}

/// The spellings of [`ingot_compiler::precision::Precision`] on the command line.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrecisionName {
    F32,
    Tf32,
    Bf16,
}

impl PrecisionArgs {
    /// The precision asked for, if any.
    pub fn given(&self) -> Option<ingot_compiler::precision::Precision> {
        use ingot_compiler::precision::Precision;
        if self.tf32 {
            return Some(Precision::Tf32);
        }
        self.precision.map(|p| match p {
            PrecisionName::F32 => Precision::F32,
            PrecisionName::Tf32 => Precision::Tf32,
            PrecisionName::Bf16 => Precision::Bf16,
        })
    }

    /// The precision to compile in: what was given, else `None` (the model's own: f32, or a
    /// model file's `precision` line). Refused where it means nothing: TF32 is a mode of the
    /// GPU's tensor cores, so `tf32` on the CPU is an error (a file's `tf32` on the CPU is
    /// refused when the step is lowered).
    pub fn for_device(
        &self,
        device: Device,
    ) -> Result<Option<ingot_compiler::precision::Precision>, Failure> {
        let p = self.given();
        if p == Some(ingot_compiler::precision::Precision::Tf32) && device == Device::Cpu {
            return Err(Failure::new(
                2,
                "tf32 applies to matmuls on the GPU; add --device cuda, or use --precision f32 or bf16",
            ));
        }
        Ok(p)
    }
}
