//! For the test binaries that train two steps side by side (`#[path]`-included): a model's
//! step compiled for a target with step options, a CPU run of a step from given state over
//! given batches, and the distances between two tensors and two runs. Each binary uses some.
#![allow(dead_code)]

use indexmap::IndexMap;
use ingot_compiler::autodiff::StepOptions;
use ingot_compiler::exe::Executable;
use ingot_compiler::ir::{Graph, LeafKind, Op};
use ingot_compiler::lower::Target;
use ingot_compiler::model::Model;
use ingot_compiler::pipeline;
use ingot_compiler::precision::Precision;
use ingot_runtime::cpu::planned::PlannedStep;
use ingot_runtime::tensor::Tensor;
use ingot_runtime::StepExecutor;
use ingot_trainer::init::{init_leaves, synthetic_batch};

/// `model`'s training step with `step`'s options, compiled and lowered for `target`.
pub fn compile(model: &Model, step: StepOptions, target: Target) -> Executable {
    compiled_in(model, &step, target, None)
        .executable(target)
        .unwrap()
}

/// `m` trained by SGD at a learning rate of 0.1 instead of its own optimizer: for the tests that
/// compare runs whose sums differ in order. AdamW turns a gradient that is zero in exact
/// arithmetic (a GPT's key bias: softmax ignores a constant added to a row of scores) into a
/// full step of either sign, so such runs could differ by up to 2 lr in those parameters.
pub fn with_sgd(mut m: Model) -> Model {
    m.optimizer = ingot_compiler::autodiff::optim::Optimizer::Sgd { lr: 0.1 };
    m
}

/// `model`'s training step for `ranks` ranks (0: a step without collectives), compiled and
/// lowered for `target`.
pub fn compile_for_ranks(model: &Model, ranks: usize, target: Target) -> Executable {
    let step = StepOptions {
        ranks,
        ..Default::default()
    };
    compile(model, step, target)
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

/// The bf16 training step of the model named `spec` with `step`'s options, compiled for
/// `target`: the ranked steps of the sharding tests.
pub fn bf16_step_of(spec: &str, step: &StepOptions, target: Target) -> pipeline::Compiled {
    let model = ingot_models::by_name(spec).unwrap();
    compiled_in(&model, step, target, Some(Precision::Bf16))
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

/// Rows `[r * n, (r + 1) * n)` of `t`, `n` its rows over `of`: rank `r`'s shard of a batch or
/// of a sharded leaf.
pub fn shard_rows(t: &Tensor, r: usize, of: usize) -> Tensor {
    let bytes = t.to_le_bytes();
    let per = bytes.len() / of;
    let mut ty = t.ty.clone();
    let mut dims = ty.shape.dims().to_vec();
    dims[0] /= of;
    ty.shape = ingot_compiler::ir::Shape::new(&dims);
    Tensor::from_le_bytes(ty, &bytes[r * per..(r + 1) * per]).unwrap()
}

/// The leaves of `kinds` of `g`, initialised from `seed`, in that order.
pub fn seeded_state(g: &Graph, kinds: &[LeafKind], seed: u64) -> IndexMap<String, Tensor> {
    let mut state = IndexMap::new();
    for &kind in kinds {
        state.extend(init_leaves(g, kind, seed));
    }
    state
}

/// `n` synthetic batches of `g`'s inputs, from seeds `first`, `first + 1`, ..
pub fn synthetic_batches(g: &Graph, n: u64, first: u64) -> Vec<IndexMap<String, Tensor>> {
    (0..n).map(|s| synthetic_batch(g, first + s)).collect()
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
    train_on(&mut PlannedStep::new(exe).unwrap(), state, batches)
}

/// [`train_planned`] on a step already made (a rank's, its collective set).
pub fn train_on(
    s: &mut PlannedStep,
    state: &IndexMap<String, Tensor>,
    batches: &[IndexMap<String, Tensor>],
) -> Run {
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

/// A step split into parts (`split`: micro-batches, head chunks) against the `whole` step, over
/// `steps` CPU steps from the same leaves of `kinds` (seed 3) and the same synthetic batches
/// (seeds 50, 51, ..): [`run_distance`]. The parts' products must be summed by their GEMMs
/// (`matmul_acc`), so the distance checks that op too; `what` names the split when they are not.
pub fn split_against_whole(
    what: &str,
    split: Executable,
    whole: Executable,
    kinds: &[LeafKind],
    steps: u64,
) -> (f64, f64) {
    assert!(
        split
            .graph()
            .nodes()
            .iter()
            .any(|n| matches!(n.op, Op::MatMulAcc { .. })),
        "{what}: the products are not accumulated by matmul_acc"
    );
    let g = whole.graph();
    let state = seeded_state(g, kinds, 3);
    let batches = synthetic_batches(g, steps, 50);
    run_distance(
        &train_planned(split, &state, &batches),
        &train_planned(whole, &state, &batches),
    )
}
