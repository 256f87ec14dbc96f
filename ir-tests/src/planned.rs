//! A planned CPU step against the reference run of its graph.

use indexmap::IndexMap;
use ingot_compiler::ir::{Graph, LeafKind};
use ingot_compiler::pipeline::Compiled;
use ingot_runtime::cpu::interp::{run_graph, Values};
use ingot_runtime::cpu::planned::PlannedStep;
use ingot_runtime::tensor::Tensor;
use ingot_runtime::StepExecutor;
use ingot_trainer::init::{init_leaves, synthetic_batch};

/// Every leaf of `g` from `seed`: the parameters and state as initialised, a synthetic batch.
pub fn seeded_leaves(g: &Graph, seed: u64) -> IndexMap<String, Tensor> {
    let mut leaves = init_leaves(g, LeafKind::Parameter, seed);
    leaves.extend(init_leaves(g, LeafKind::State, seed));
    leaves.extend(synthetic_batch(g, seed));
    leaves
}

/// One planned step of `c` on `leaves` gives the outputs and updated leaves of the reference
/// run of its graph on them, bit for bit; returns the reference run.
pub fn assert_planned_step_is_reference(c: &Compiled, leaves: &IndexMap<String, Tensor>) -> Values {
    let reference = run_graph(&c.graph, leaves).unwrap();
    let mut planned = PlannedStep::from_plan(c.graph.clone(), c.plan.clone()).unwrap();
    for (name, v) in leaves {
        planned.write_leaf(name, v).unwrap();
    }
    planned.step().unwrap();
    for (name, v) in &reference.outputs {
        assert_eq!(&planned.read_output(name).unwrap(), v, "output {name}");
    }
    for (name, v) in &reference.updates {
        assert_eq!(&planned.read_leaf(name).unwrap(), v, "updated {name}");
    }
    reference
}
