//! Whole CPU training steps as the tests compare them: the leaves a seed gives, a planned step
//! checked bit for bit against the reference interpreter step after step, and the bytes of the
//! loss and every leaf after each step (what two runs of one step on other settings, threads or
//! interpreted kernels, must agree on). One copy for trainer/ and ir-tests/, which wrote these
//! loops each for itself.

use indexmap::IndexMap;
use ingot_compiler::exe::Executable;
use ingot_compiler::ir::{Graph, LeafKind};
use ingot_compiler::lower::Target;
use ingot_compiler::pipeline::Compiled;
use ingot_compiler::plan::MemoryPlan;
use ingot_compiler::precision::Precision;
use ingot_runtime::cpu::interp::run_graph;
use ingot_runtime::cpu::planned::PlannedStep;
use ingot_runtime::tensor::Tensor;
use ingot_runtime::StepExecutor;
use ingot_trainer::init::{init_leaves, synthetic_batch};
use ingot_trainer::session::Session;

/// Every leaf of `g` from `seed`: the parameters and state as initialised, a synthetic batch.
pub fn seeded_leaves(g: &Graph, seed: u64) -> IndexMap<String, Tensor> {
    let mut leaves = init_leaves(g, LeafKind::Parameter, seed);
    leaves.extend(init_leaves(g, LeafKind::State, seed));
    leaves.extend(synthetic_batch(g, seed));
    leaves
}

/// Whether `a` and `b` have one type and the same bytes (NaN payloads included).
pub fn same_bits(a: &Tensor, b: &Tensor) -> bool {
    a.ty == b.ty && a.to_le_bytes() == b.to_le_bytes()
}

/// The CPU executable of a compiled step.
pub fn cpu_executable(c: Compiled) -> Executable {
    Executable::from_plan("step", c.graph, c.plan, Target::Cpu).unwrap()
}

/// Runs `steps` steps of `g` both ways, planned by `plan` and by the reference interpreter,
/// from the leaves of `seed`, and asserts that the allocation is the plan's total and that the
/// loss and every leaf agree bit for bit after each step; `what` names the step in a failure.
pub fn assert_planned_matches_reference(
    what: &str,
    g: &Graph,
    plan: MemoryPlan,
    seed: u64,
    steps: usize,
) {
    let total = plan.total_bytes;
    let mut planned = PlannedStep::from_plan(g.clone(), plan).unwrap();
    assert_eq!(
        planned.allocated_bytes(),
        total,
        "{what}: the allocation must be the planned total"
    );
    let mut reference = seeded_leaves(g, seed);
    for (name, value) in &reference {
        planned.write_leaf(name, value).unwrap();
    }
    for s in 0..steps {
        let mut values = run_graph(g, &reference).unwrap();
        planned.step().unwrap();
        let loss = planned.read_output("loss").unwrap();
        assert!(
            same_bits(&loss, &values.outputs["loss"]),
            "{what} step {s}: planned loss {loss:?} != reference {:?}",
            values.outputs["loss"]
        );
        values.apply_updates(&mut reference);
        for (name, value) in &reference {
            let got = planned.read_leaf(name).unwrap();
            assert!(
                same_bits(&got, value),
                "{what} step {s}: leaf {name} differs from the reference"
            );
        }
    }
}

/// Writes `leaves` into `p`, runs `steps` steps and returns the bytes of the loss and of every
/// leaf of `leaves` (in its order) after each step.
pub fn step_bytes(
    p: &mut PlannedStep,
    leaves: &IndexMap<String, Tensor>,
    steps: usize,
) -> Vec<Vec<u8>> {
    for (name, v) in leaves {
        p.write_leaf(name, v).unwrap();
    }
    let mut out = Vec::new();
    for _ in 0..steps {
        p.step().unwrap();
        out.push(p.read_output("loss").unwrap().to_le_bytes());
        for name in leaves.keys() {
            out.push(p.read_leaf(name).unwrap().to_le_bytes());
        }
    }
    out
}

/// The losses (as bits) of `steps` steps of `s`, then its optimizer state as bytes by name:
/// what two sessions that must train alike (offloaded or not, resumed or not) compare.
pub fn losses_and_state(s: &mut Session, steps: usize) -> (Vec<u64>, Vec<(String, Vec<u8>)>) {
    let losses = (0..steps)
        .map(|_| s.step().unwrap().loss.to_bits())
        .collect();
    let state = s
        .optimizer_state()
        .into_iter()
        .map(|(n, t)| (n, t.to_le_bytes()))
        .collect();
    (losses, state)
}

/// Steps `a` and `b` together `steps` times and asserts that each loss of `a` is finite and
/// within `tolerance` of `b`'s, relative to `b`'s: a GPU run against the CPU's, a bf16 run
/// against f32's. `what` names the run in the line printed for each step and in a failure.
pub fn assert_losses_track(
    what: &str,
    a: &mut Session,
    b: &mut Session,
    steps: u64,
    tolerance: f64,
) {
    for step in 1..=steps {
        let (x, y) = (a.step().unwrap().loss, b.step().unwrap().loss);
        let rel = (x - y).abs() / y.abs().max(1e-12);
        eprintln!("{what} step {step}: {x:.8} against {y:.8}, rel {rel:.2e}");
        assert!(
            x.is_finite() && rel <= tolerance,
            "{what} step {step}: loss {x} against {y} (rel {rel:e}, more than {tolerance:e})"
        );
    }
}

/// A GPU session against the CPU's: [`assert_losses_track`] over `steps` steps and, in f32
/// (where the two may differ only by the order of sums), [`assert_parameters_close`] after
/// them, both within `tolerance`.
pub fn assert_gpu_tracks_cpu(
    what: &str,
    (gpu, cpu): (&mut Session, &mut Session),
    precision: Precision,
    steps: u64,
    tolerance: f64,
) {
    assert_losses_track(what, gpu, cpu, steps, tolerance);
    if precision == Precision::F32 {
        assert_parameters_close(what, gpu, cpu, tolerance);
    }
}

/// Asserts that `a`'s parameters are within `tolerance` of `b`'s, relative to `b`'s: ‖a − b‖ /
/// ‖b‖ over every parameter of `b` (by name), in f64. `what` names the run.
pub fn assert_parameters_close(what: &str, a: &Session, b: &Session, tolerance: f64) {
    let (pa, pb) = (a.parameters(), b.parameters());
    let (mut diff, mut norm) = (0.0, 0.0);
    for (name, tb) in &pb {
        for (u, v) in pa[name].to_f64_vec().iter().zip(tb.to_f64_vec()) {
            diff += (u - v) * (u - v);
            norm += v * v;
        }
    }
    let rel = (diff / norm).sqrt();
    eprintln!("{what}: parameters rel {rel:.2e}");
    assert!(rel <= tolerance, "{what}: parameters differ by {rel:e}");
}
