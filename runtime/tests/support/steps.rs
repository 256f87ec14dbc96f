//! For the test binaries that train two steps side by side (`#[path]`-included): a model's
//! step compiled for a target with step options, and the distance between two f32 tensors.

use ingot_compiler::autodiff::StepOptions;
use ingot_compiler::exe::Executable;
use ingot_compiler::lower::Target;
use ingot_compiler::models::Model;
use ingot_compiler::pipeline;
use ingot_runtime::tensor::Tensor;

/// `model`'s training step with `step`'s options, compiled and lowered for `target`.
pub fn compile(model: &Model, step: StepOptions, target: Target) -> Executable {
    pipeline::compile_observed_with(
        model,
        &step,
        &pipeline::Options::for_target(target),
        &mut |_| {},
    )
    .unwrap()
    .executable(target)
    .unwrap()
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
