//! For the test binaries that train two steps side by side (`#[path]`-included): a model's
//! step compiled for a target with step options, a CPU run of a step from given state over
//! given batches, and the distances between two tensors and two runs. Each binary uses some.
#![allow(dead_code)]

use indexmap::IndexMap;
use ingot_compiler::autodiff::StepOptions;
use ingot_compiler::exe::Executable;
use ingot_compiler::lower::Target;
use ingot_compiler::model::Model;
use ingot_compiler::pipeline;
use ingot_compiler::precision::Precision;
use ingot_runtime::cpu::planned::PlannedStep;
use ingot_runtime::tensor::Tensor;
use ingot_runtime::StepExecutor;

/// `model`'s training step with `step`'s options, compiled and lowered for `target`.
pub fn compile(model: &Model, step: StepOptions, target: Target) -> Executable {
    compiled_in(model, &step, target, None)
        .executable(target)
        .unwrap()
}

/// `model`'s training step with `step`'s options, compiled for `target` in `precision` (the
/// target's own where `None`).
pub fn compiled_in(
    model: &Model,
    step: &StepOptions,
    target: Target,
    precision: Option<Precision>,
) -> pipeline::Compiled {
    let mut o = pipeline::Options::for_target(target);
    if precision.is_some() {
        o.precision = precision;
    }
    pipeline::compile_observed_with(model, step, &o, &mut |_| {}).unwrap()
}

/// max |a - b| / max |b| over two f32 tensors of one shape (0 for other dtypes).
pub fn max_relative(a: &Tensor, b: &Tensor) -> f64 {
    let (Some(a), Some(b)) = (a.as_f32(), b.as_f32()) else {
        return 0.0;
    };
    let diff = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() as f64)
        .fold(0.0, f64::max);
    let scale = b.iter().map(|y| y.abs() as f64).fold(0.0, f64::max);
    diff / scale.max(f64::MIN_POSITIVE)
}

/// A run's per-step losses and its leaves after the last step.
pub type Run = (Vec<f64>, IndexMap<String, Tensor>);

/// Runs `exe` on the CPU from `state` (leaves by name), one step per batch of `batches`
/// (inputs by name): each step's loss, and the leaves of `state` after the last.
pub fn train_planned(
    exe: Executable,
    state: &IndexMap<String, Tensor>,
    batches: &[IndexMap<String, Tensor>],
) -> Run {
    let mut s = PlannedStep::new(exe).unwrap();
    for (n, v) in state {
        s.write_leaf(n, v).unwrap();
    }
    let mut losses = Vec::new();
    for batch in batches {
        for (n, v) in batch {
            s.write_leaf(n, v).unwrap();
        }
        s.step().unwrap();
        losses.push(s.read_output("loss").unwrap().to_f64_vec()[0]);
    }
    let leaves = state
        .keys()
        .map(|n| (n.clone(), s.read_leaf(n).unwrap()))
        .collect();
    (losses, leaves)
}

/// The largest relative difference of a loss, and of a leaf ([`max_relative`]), of run `a`
/// from run `b`.
pub fn run_distance(a: &Run, b: &Run) -> (f64, f64) {
    let loss =
        a.0.iter()
            .zip(&b.0)
            .map(|(x, y)| ((x - y) / y).abs())
            .fold(0.0, f64::max);
    let leaf =
        a.1.iter()
            .map(|(n, v)| max_relative(v, &b.1[n]))
            .fold(0.0, f64::max);
    (loss, leaf)
}
