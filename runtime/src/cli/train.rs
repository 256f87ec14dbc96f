//! `ingot train`: train a model for some steps on one batch and print the loss of each step.
//!
//! Without `--init` the parameters are initialised from `--seed`; without `--data` a synthetic
//! batch from the same seed is used for every step. `--save-data` writes the batch used, and
//! `--save` the parameters after the last step (with `--steps 0`, the initial ones), so the same
//! run can be repeated elsewhere (PyTorch: scripts/torch_reference.py).
//!
//! `ingot run` trains a step executable through the same [`train`] function, so the two print
//! the same lines. On a terminal (stdout, no `--json`) a progress bar shows the step count, the
//! last loss and step time and the planned memory; elsewhere only the plain lines are printed.

use super::Failure;
use crate::cuda::CudaOptions;
use crate::io;
use crate::session::{self, Session};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use ingot_compiler::plan::report::human;
use std::io::IsTerminal;
use std::path::PathBuf;

/// Where the step runs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda,
}

#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    #[command(flatten)]
    pub model: super::ModelArgs,
    #[command(flatten)]
    pub run: StepArgs,
}

/// How to run the steps: the options `ingot train` and `ingot run` share.
#[derive(clap::Args, Debug)]
pub struct StepArgs {
    /// Number of training steps (0: only initialise, e.g. to --save the initial parameters).
    #[arg(long)]
    pub steps: u64,
    /// Where to run the steps (train: cpu unless given; run: the executable's target).
    #[arg(long, value_enum)]
    pub device: Option<Device>,
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
    /// Print one JSON object per step ({"step", "loss", "seconds", "wall_seconds"}), then one
    /// {"summary": {..}} with the planned and measured memory and the median step time.
    #[arg(long)]
    pub json: bool,
    /// Seed of the initial parameters and of the synthetic batch.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub precision: super::PrecisionArgs,
}

impl StepArgs {
    /// Checks that `--save` and `--save-data` can be written, before anything is compiled or run.
    pub fn check_outputs(&self) -> Result<(), Failure> {
        super::check_outputs([
            ("--save", self.save.as_deref()),
            ("--save-data", self.save_data.as_deref()),
        ])
    }

    /// The session device these arguments ask for; `default` when `--device` is not given.
    pub fn session_device(&self, default: Device) -> Result<session::Device, Failure> {
        let device = self.device.unwrap_or(default);
        // Refuses tf32 on the CPU; the compile takes the precision itself (`opts.precision`).
        self.precision.for_device(device)?;
        match device {
            Device::Cpu => Ok(session::Device::Cpu),
            Device::Cuda => Ok(session::Device::Cuda(CudaOptions::default())),
        }
    }
}

/// One line of `--json` output, fields in this order.
#[derive(serde::Serialize)]
struct StepLine {
    step: u64,
    loss: f64,
    /// The step's device time on a GPU, its wall-clock time on the CPU.
    seconds: f64,
    /// The wall clock of the step and the loss's copy to the host.
    wall_seconds: f64,
    /// Present (and true) only on the step whose loss is NaN or infinite, the last one run:
    /// `loss` alone would print as `null` for both.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    non_finite: bool,
}

pub fn run(a: &TrainArgs) -> Result<(), Failure> {
    let device = a.run.session_device(Device::Cpu)?;
    a.run.check_outputs()?;
    // Compiled with the stage spinner (on a terminal, not with --json), then loaded.
    let mut opts = device.options();
    opts.precision = a
        .run
        .precision
        .for_device(a.run.device.unwrap_or(Device::Cpu))?;
    let (_, compiled, _) = super::stages::load_and_compile(&a.model, &opts, !a.run.json)?;
    let exe = compiled
        .executable(device.target())
        .map_err(|e| Failure::new(1, format!("lowering for {}: {e}", device.target())))?;
    let mut session = Session::from_executable(exe, a.run.seed, device)?;
    train(&mut session, &a.run, device)
}

/// Trains `session` as `a` says: loads `--init` and `--data`, writes `--save-data`, runs the
/// steps printing each one's loss (a line of text, or of JSON), then the summary, then writes
/// `--save`. `ingot train` and `ingot run` both end here, so their output is the same.
pub fn train(session: &mut Session, a: &StepArgs, device: session::Device) -> Result<(), Failure> {
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
            "model {}: {} parameters, {} steps on {}{}, {} parameters, {} batch",
            session.model(),
            params,
            a.steps,
            session.exe().device(),
            match (device, session.precision()) {
                (_, ingot_compiler::precision::Precision::Bf16) => " (bf16 mixed precision)",
                (session::Device::Cuda(_), ingot_compiler::precision::Precision::Tf32) => {
                    " (tf32 matmuls)"
                }
                (session::Device::Cuda(_), _) => " (strict f32)",
                (session::Device::Cpu, _) => "",
            },
            if a.init.is_some() { "loaded" } else { "seeded" },
            if a.data.is_some() {
                "loaded"
            } else {
                "synthetic"
            },
        )?;
    }
    // On a terminal (and without --json), a progress bar on stdout below the step lines;
    // otherwise the lines alone, unchanged.
    let bar = (!a.json && std::io::stdout().is_terminal()).then(|| {
        let bar = ProgressBar::with_draw_target(Some(a.steps), ProgressDrawTarget::stdout());
        bar.set_style(
            ProgressStyle::with_template(
                "{bar:30.cyan/blue} step {pos}/{len}  {msg}  [{elapsed_precise}]",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        bar
    });
    let planned = human(session.exe().plan().total_bytes);
    // Per-step times grow with the steps actually run; nothing is reserved in proportion to
    // `--steps` (which may be any u64).
    let mut seconds = Vec::new();
    let mut wall = Vec::new();
    let mut free_after_first = None;
    let mut non_finite = None;
    for i in 1..=a.steps {
        let r = session.step()?;
        if !r.loss.is_finite() {
            non_finite = Some((i, r.loss));
        }
        seconds.push(r.seconds);
        wall.push(r.wall_seconds);
        if i == 1 {
            free_after_first = session.cuda().map(|c| c.free_memory()).transpose()?;
        }
        if a.json {
            let line = StepLine {
                step: i,
                loss: r.loss,
                seconds: r.seconds,
                wall_seconds: r.wall_seconds,
                non_finite: non_finite.is_some(),
            };
            crate::outln!(
                "{}",
                serde_json::to_string(&line).map_err(|e| Failure::new(1, e.to_string()))?
            )?;
        } else if let Some(bar) = &bar {
            bar.println(format!(
                "step {i:>5}  loss {:>12.6}  {:>9.3} s",
                r.loss, r.seconds
            ));
            bar.set_message(format!(
                "loss {:.6}  {:.3} ms/step  memory {planned}",
                r.loss,
                r.seconds * 1e3
            ));
            bar.inc(1);
        } else {
            crate::outln!("step {i:>5}  loss {:>12.6}  {:>9.3} s", r.loss, r.seconds)?;
        }
        if non_finite.is_some() {
            break;
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    summary(
        a,
        session,
        &seconds,
        &wall,
        free_after_first,
        non_finite.map(|(i, _)| i),
    )?;
    if let Some((step, loss)) = non_finite {
        // The parameters were updated with a non-finite gradient: nothing is saved over a
        // good file, and the exit code says the run failed.
        return Err(Failure::new(
            1,
            format!(
                "step {step}: the loss is {loss}; training stopped at the first non-finite loss{} (lower the learning rate, or check the data and the initial parameters)",
                match &a.save {
                    Some(p) => format!(", and {} was not written", p.display()),
                    None => String::new(),
                }
            ),
        ));
    }
    if let Some(path) = &a.save {
        io::save(path, &session.parameters())?;
        if !a.json {
            crate::outln!("saved the parameters to {}", path.display())?;
        }
    }
    Ok(())
}

/// The last `--json` line: what the run measured, beside what was planned.
#[derive(serde::Serialize)]
struct Summary {
    device: String,
    /// Steps run (fewer than asked when a non-finite loss stopped the run).
    steps: u64,
    /// The step whose loss was NaN or infinite, where training stopped; absent when none was.
    #[serde(skip_serializing_if = "Option::is_none")]
    non_finite_loss_step: Option<u64>,
    median_step_seconds: Option<f64>,
    median_wall_seconds: Option<f64>,
    /// The plan's total: the one allocation's size, reported before launch.
    planned_bytes: usize,
    resident_bytes: usize,
    slab_bytes: usize,
    /// GPU only: the drop in free device memory the allocation caused.
    measured_bytes: Option<usize>,
    /// GPU only: device memory in use before the allocation (CUDA context, cuBLAS, kernels).
    context_bytes: Option<usize>,
    /// GPU only: device memory the captured step graph took.
    graph_bytes: Option<usize>,
    /// GPU only: free device memory after the last step minus after the first (0: the steps
    /// allocated nothing).
    free_change_bytes: Option<i64>,
}

fn median(xs: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn summary(
    a: &StepArgs,
    session: &Session,
    seconds: &[f64],
    wall: &[f64],
    free_after_first: Option<usize>,
    non_finite_loss_step: Option<u64>,
) -> Result<(), Failure> {
    let plan = session.exe().plan();
    let cuda = session.cuda();
    let mem = cuda.map(|c| c.memory());
    let free_change = match (cuda, free_after_first) {
        (Some(c), Some(first)) => Some(c.free_memory()? as i64 - first as i64),
        _ => None,
    };
    let s = Summary {
        device: session.exe().device(),
        steps: seconds.len() as u64,
        non_finite_loss_step,
        median_step_seconds: median(seconds),
        median_wall_seconds: median(wall),
        planned_bytes: plan.total_bytes,
        resident_bytes: plan.resident_bytes,
        slab_bytes: plan.slab_bytes,
        measured_bytes: mem.map(|m| m.allocation),
        context_bytes: mem.map(|m| m.before_allocation),
        graph_bytes: mem.map(|m| m.graph),
        free_change_bytes: free_change,
    };
    if a.json {
        #[derive(serde::Serialize)]
        struct Line<'a> {
            summary: &'a Summary,
        }
        let line = serde_json::to_string(&Line { summary: &s })
            .map_err(|e| Failure::new(1, e.to_string()))?;
        return crate::outln!("{line}");
    }
    let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
    if let (Some(m), Some(w)) = (median(seconds), median(wall)) {
        crate::outln!(
            "median step {:.3} ms over {} steps ({:.3} ms wall clock, with launch and the loss's copy)",
            m * 1e3,
            seconds.len(),
            w * 1e3
        )?;
    }
    crate::outln!(
        "memory planned: {:.1} MiB ({:.1} MiB resident + {:.1} MiB slab), one allocation",
        mib(s.planned_bytes),
        mib(s.resident_bytes),
        mib(s.slab_bytes)
    )?;
    if let Some(m) = mem {
        crate::outln!(
            "memory measured on the GPU: {:.1} MiB taken by the allocation (asked {:.1} MiB; the driver rounds up to its page)",
            mib(m.allocation),
            mib(m.requested)
        )?;
        crate::outln!(
            "CUDA context, cuBLAS and kernels (not the step's): {:.1} MiB; step graph: {:.1} MiB",
            mib(m.before_allocation),
            mib(m.graph)
        )?;
    }
    if let Some(d) = free_change {
        crate::outln!(
            "free device memory after step 1 and after step {}: {}",
            seconds.len(),
            if d == 0 {
                "identical (no allocation during the steps)".to_string()
            } else {
                format!("changed by {d} bytes")
            }
        )?;
    }
    Ok(())
}
