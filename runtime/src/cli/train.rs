//! `ingot train`: train a model for some steps on one batch and print the loss of each step.
//!
//! Without `--init` the parameters are initialised from `--seed`; without `--data` a synthetic
//! batch from the same seed is used for every step. `--save-data` writes the batch used, and
//! `--save` the parameters after the last step (with `--steps 0`, the initial ones), so the same
//! run can be repeated elsewhere (PyTorch: scripts/torch_reference.py).

use super::Failure;
use crate::io;
use crate::session::Session;
use ingot_compiler::models;
use std::path::PathBuf;

/// Where the step runs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda,
}

#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// mlp, gpt-mini, gpt2, or gpt:vocab=..,d_model=..,layers=..,heads=..,d_ff=..,seq=..,batch=..
    #[arg(long)]
    pub model: String,
    /// Number of training steps (0: only initialise, e.g. to --save the initial parameters).
    #[arg(long)]
    pub steps: u64,
    /// Where to run the steps.
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    pub device: Device,
    /// Initial parameters (safetensors, PyTorch names and layouts) instead of seeded ones.
    #[arg(long, value_name = "P.safetensors")]
    pub init: Option<PathBuf>,
    /// The batch (safetensors holding x and y) instead of a synthetic one.
    #[arg(long, value_name = "B.safetensors")]
    pub data: Option<PathBuf>,
    /// Write the parameters after the last step here.
    #[arg(long, value_name = "P.safetensors")]
    pub save: Option<PathBuf>,
    /// Write the batch the steps train on (x and y) here.
    #[arg(long = "save-data", value_name = "B.safetensors")]
    pub save_data: Option<PathBuf>,
    /// Print one JSON object per step: {"step": .., "loss": .., "seconds": ..}.
    #[arg(long)]
    pub json: bool,
    /// Seed of the initial parameters and of the synthetic batch.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// One line of `--json` output, fields in this order.
#[derive(serde::Serialize)]
struct StepLine {
    step: u64,
    loss: f64,
    seconds: f64,
}

pub fn run(a: &TrainArgs) -> Result<(), Failure> {
    if a.device == Device::Cuda {
        return Err(Failure::new(
            1,
            "the CUDA backend isn't built yet; run with --device cpu (the default)",
        ));
    }
    let model = models::by_name(&a.model)?;
    let mut session = Session::new(&model, a.seed)?;
    if let Some(path) = &a.init {
        let params = io::load(path)?;
        session
            .load_parameters(&params)
            .map_err(|e| Failure::new(1, format!("{}: {e}", path.display())))?;
    }
    if let Some(path) = &a.data {
        let batch = io::load(path)?;
        session
            .set_batch_map(&batch)
            .map_err(|e| Failure::new(1, format!("{}: {e}", path.display())))?;
    }
    if let Some(path) = &a.save_data {
        io::save(path, &session.batch())?;
    }
    if !a.json {
        let params: usize = session.parameters().values().map(|t| t.numel()).sum();
        crate::outln!(
            "model {}: {} parameters, {} steps on the cpu, {} parameters, {} batch",
            model.name,
            params,
            a.steps,
            if a.init.is_some() { "loaded" } else { "seeded" },
            if a.data.is_some() {
                "loaded"
            } else {
                "synthetic"
            },
        )?;
    }
    for i in 1..=a.steps {
        let r = session.step()?;
        if a.json {
            let line = StepLine {
                step: i,
                loss: r.loss,
                seconds: r.seconds,
            };
            crate::outln!(
                "{}",
                serde_json::to_string(&line).map_err(|e| Failure::new(1, e.to_string()))?
            )?;
        } else {
            crate::outln!("step {i:>5}  loss {:>12.6}  {:>9.3} s", r.loss, r.seconds)?;
        }
    }
    if let Some(path) = &a.save {
        io::save(path, &session.parameters())?;
        if !a.json {
            crate::outln!("saved the parameters to {}", path.display())?;
        }
    }
    Ok(())
}
