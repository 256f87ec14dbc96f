//! Two steps in one allocation: a training step and a forward-only (evaluation) step of the same
//! model, which never run at the same time.
//!
//! The training step's plan is taken as it is. The evaluation step, planned on its own, is
//! re-based against it ([`rebase`]):
//! - each parameter it reads is placed on the training step's bytes of the same parameter (same
//!   name, same type), so evaluation reads the weights training just wrote, with no copy; so is
//!   each resident state leaf it reads (batch norm's running statistics in evaluation mode);
//! - its slab (everything it makes and drops) starts where the training step's slab starts: the
//!   two transient regions overlap, because each step's slab values are dead when it ends;
//! - what only it keeps across its step (its inputs `x` and `y`) is placed after both slabs, so
//!   neither step's transient values ever touch it.
//!
//! The allocation is then `resident + max(train slab, eval slab) + eval-only values`, not the
//! sum of two allocations ([`SharedLayout`]). The re-based plan is a plan like any other: the
//! validator replays it ([`MemoryPlan::validate`]) and the lowering checks its program against
//! it. What neither can see, because each knows one graph, is checked here
//! ([`check_disjoint`]): no value of the evaluation step other than a shared parameter touches a
//! byte the training step keeps between steps.

use super::liveness::Region;
use super::Location;
use super::{align_up, MemoryPlan};
use crate::ir::{Graph, LeafKind, Op};
use serde::{Deserialize, Serialize};

/// How the one allocation of a training and an evaluation step divides, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedLayout {
    /// The training step's resident region (parameters, optimizer state, its inputs); the
    /// evaluation step's parameters are these same bytes.
    pub resident_bytes: usize,
    /// Of those, the parameters (and resident state, batch norm's running statistics) the
    /// evaluation step reads in place.
    pub shared_parameter_bytes: usize,
    /// Where both slabs start.
    pub slab_base: usize,
    /// The training step's slab.
    pub train_slab_bytes: usize,
    /// The evaluation step's slab, over the same bytes.
    pub eval_slab_bytes: usize,
    /// What only the evaluation step keeps (its inputs), after both slabs.
    pub eval_only_bytes: usize,
    /// The training step's own plan total (what it would allocate alone).
    pub train_total_bytes: usize,
    /// The evaluation step's own plan total, before re-basing (what it would allocate alone).
    pub eval_alone_bytes: usize,
    /// The one allocation: `slab_base + max(train slab, eval slab)`, rounded to the alignment,
    /// plus the evaluation step's own values.
    pub total_bytes: usize,
}

impl SharedLayout {
    /// What two separate allocations would take.
    pub fn separate_bytes(&self) -> usize {
        self.train_total_bytes + self.eval_alone_bytes
    }
}

/// Why an evaluation step cannot share a training step's allocation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SharedError {
    /// The evaluation step reads a parameter (or resident state) the training step does not
    /// hold.
    #[error("the evaluation step reads parameter or state {name:?}, which the training step does not hold; both steps must be compiled from the same model")]
    MissingParameter { name: String },
    /// The two steps disagree on a parameter's type.
    #[error("parameter {name:?} is {train} in the training step but {eval} in the evaluation step; both steps must be compiled from the same model in the same precision")]
    ParameterType {
        name: String,
        train: String,
        eval: String,
    },
    /// The evaluation step updates leaves: it is not forward-only.
    #[error("the evaluation step updates {count} leaves; only a forward-only step can share the training step's parameters")]
    NotForwardOnly { count: usize },
    /// The re-based plan puts an evaluation value on bytes the training step keeps.
    #[error("invalid shared plan: the evaluation step's {node} ({op}) at bytes {start}..{end} overlaps the training step's resident {owner} at {owner_start}..{owner_end}")]
    Overlap {
        node: String,
        op: &'static str,
        start: usize,
        end: usize,
        owner: String,
        owner_start: usize,
        owner_end: usize,
    },
    /// The re-based plan does not validate on its own.
    #[error(transparent)]
    Invalid(#[from] super::check::PlanViolation),
}

/// Re-bases `eval`'s plan (of the forward-only graph `eval_g`) into the allocation of `train`'s
/// plan (of `train_g`), as the module says, and validates the result. The training plan is not
/// changed: its total is at most the shared one, so it runs in the larger allocation as it is.
pub fn rebase(
    train_g: &Graph,
    train: &MemoryPlan,
    eval_g: &Graph,
    eval: &MemoryPlan,
) -> Result<(MemoryPlan, SharedLayout), SharedError> {
    if !eval_g.updates.is_empty() {
        return Err(SharedError::NotForwardOnly {
            count: eval_g.updates.len(),
        });
    }
    let mut offset = vec![usize::MAX; eval.liveness.storages.len()];
    let mut shared_parameter_bytes = 0;
    let mut eval_only = Vec::new();
    for (i, s) in eval.liveness.storages.iter().enumerate() {
        match s.region {
            Region::Slab => offset[i] = eval.storage_offset[i] - eval.slab_base + train.slab_base,
            Region::Resident => match parameter_name(eval_g, s.owner) {
                Some(name) => {
                    let t = train_g
                        .leaf(name)
                        .filter(|&t| parameter_name(train_g, t).is_some())
                        .ok_or_else(|| SharedError::MissingParameter {
                            name: name.to_string(),
                        })?;
                    if train_g.ty(t) != eval_g.ty(s.owner) {
                        return Err(SharedError::ParameterType {
                            name: name.to_string(),
                            train: train_g.ty(t).to_string(),
                            eval: eval_g.ty(s.owner).to_string(),
                        });
                    }
                    offset[i] = train.location(train_g, t).offset;
                    shared_parameter_bytes += align_up(s.bytes);
                }
                None => eval_only.push(i),
            },
        }
    }
    let slab_end = align_up(train.total_bytes.max(train.slab_base + eval.slab_bytes));
    let mut end = slab_end;
    for &i in &eval_only {
        offset[i] = end;
        end += align_up(eval.liveness.storages[i].bytes);
    }
    let layout = SharedLayout {
        resident_bytes: train.resident_bytes,
        shared_parameter_bytes,
        slab_base: train.slab_base,
        train_slab_bytes: train.slab_bytes,
        eval_slab_bytes: eval.slab_bytes,
        eval_only_bytes: end - slab_end,
        train_total_bytes: train.total_bytes,
        eval_alone_bytes: eval.total_bytes,
        total_bytes: end,
    };
    let plan = MemoryPlan {
        storage_offset: offset,
        resident_bytes: eval.resident_bytes,
        slab_base: train.slab_base,
        total_bytes: end,
        ..eval.clone()
    };
    plan.validate(eval_g)?;
    check_disjoint(train_g, train, eval_g, &plan)?;
    Ok((plan, layout))
}

/// A node as messages name it: `%7` or `%7 (wte.weight)` for a leaf.
fn describe(g: &Graph, id: crate::ir::NodeId) -> String {
    match g.leaf_name(id) {
        Some(name) => format!("{id} ({name})"),
        None => id.to_string(),
    }
}

/// The name of `id` if it is a leaf both steps share: a parameter, or resident state the
/// forward pass reads (batch norm's running statistics, read in evaluation mode).
fn parameter_name(g: &Graph, id: crate::ir::NodeId) -> Option<&str> {
    match &g.node(id).op {
        Op::Leaf {
            kind: LeafKind::Parameter | LeafKind::State,
            name,
            ..
        } => Some(name),
        _ => None,
    }
}

/// Checks, from the two plans' locations alone, that every value and workspace of the
/// evaluation step either is a parameter on exactly the training step's bytes of that
/// parameter, or shares no byte with anything the training step keeps between steps (its
/// resident leaves); and that the evaluation step's own resident values share no byte with the
/// training step's slab. Shares no code with [`rebase`].
pub fn check_disjoint(
    train_g: &Graph,
    train: &MemoryPlan,
    eval_g: &Graph,
    eval: &MemoryPlan,
) -> Result<(), SharedError> {
    let kept: Vec<(Location, String)> = train_g
        .ids()
        .filter(|&id| train_g.node(id).op.is_leaf())
        .map(|id| (train.location(train_g, id), describe(train_g, id)))
        .collect();
    let train_slab = Location {
        offset: train.slab_base,
        bytes: train.total_bytes - train.slab_base,
    };
    let overlap = |a: Location, b: Location| {
        a.bytes > 0 && b.bytes > 0 && a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes
    };
    let mut places: Vec<(crate::ir::NodeId, Location, bool)> = Vec::new();
    for id in eval_g.ids() {
        places.push((id, eval.location(eval_g, id), false));
        if let Some(w) = eval.workspace(id) {
            places.push((id, w, true));
        }
    }
    for (id, l, workspace) in places {
        // A parameter (or a view of one) sits exactly on the training step's parameter.
        let storage = eval.liveness.storage_of[id.index()];
        let owner = eval.liveness.storages[storage].owner;
        if !workspace {
            if let Some(name) = parameter_name(eval_g, owner) {
                let same = train_g
                    .leaf(name)
                    .is_some_and(|t| train.location(train_g, t).offset == l.offset);
                if same {
                    continue;
                }
            }
        }
        let node = if workspace {
            format!("workspace of {}", describe(eval_g, id))
        } else {
            describe(eval_g, id)
        };
        for (k, name) in &kept {
            if overlap(l, *k) {
                return Err(SharedError::Overlap {
                    node,
                    op: eval_g.node(id).op.name(),
                    start: l.offset,
                    end: l.offset + l.bytes,
                    owner: name.clone(),
                    owner_start: k.offset,
                    owner_end: k.offset + k.bytes,
                });
            }
        }
        let resident = eval.liveness.storages[storage].region == Region::Resident;
        if resident && !workspace && overlap(l, train_slab) {
            return Err(SharedError::Overlap {
                node,
                op: eval_g.node(id).op.name(),
                start: l.offset,
                end: l.offset + l.bytes,
                owner: "slab".into(),
                owner_start: train_slab.offset,
                owner_end: train_slab.offset + train_slab.bytes,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autodiff::Step;
    use crate::exe::Target;
    use crate::pipeline::{self, Options};

    /// `model`'s forward pass alone as a step (no backward pass, no update).
    fn forward_only(model: &crate::model::Model) -> Step {
        Step::forward_only(model.graph.without_dead_code().0)
    }

    /// mlp's training step and its forward pass alone, each planned on its own for the CPU.
    fn steps() -> (pipeline::Compiled, pipeline::Compiled) {
        let model = crate::models::by_name("mlp").unwrap();
        let opts = Options::for_target(Target::Cpu);
        let train = pipeline::compile(&model, &opts).unwrap();
        let eval = pipeline::compile_step("mlp (eval)", forward_only(&model), &opts).unwrap();
        (train, eval)
    }

    #[test]
    fn a_rebased_eval_plan_reads_the_parameters_in_place_and_overlaps_the_slabs() {
        let (t, e) = steps();
        let (plan, l) = rebase(&t.graph, &t.plan, &e.graph, &e.plan).unwrap();
        assert_eq!(plan.slab_base, t.plan.slab_base, "the slabs start together");
        assert_eq!(
            l.total_bytes,
            align_up(t.plan.total_bytes.max(t.plan.slab_base + e.plan.slab_bytes))
                + l.eval_only_bytes
        );
        assert!(l.total_bytes < t.plan.total_bytes + e.plan.total_bytes);
        for id in e.graph.leaves(LeafKind::Parameter) {
            let t_id = t.graph.leaf(e.graph.leaf_name(id).unwrap()).unwrap();
            assert_eq!(plan.location(&e.graph, id), t.plan.location(&t.graph, t_id));
        }
        // x and y: after both slabs.
        for id in e.graph.leaves(LeafKind::Input) {
            assert!(plan.location(&e.graph, id).offset >= t.plan.total_bytes);
        }
    }

    #[test]
    fn an_eval_value_moved_onto_a_training_parameter_is_refused_naming_both() {
        let (t, e) = steps();
        let (mut plan, _) = rebase(&t.graph, &t.plan, &e.graph, &e.plan).unwrap();
        // A slab storage of the evaluation step moved onto the training step's optimizer
        // state (which the evaluation step does not hold, so its own validator cannot see it).
        let state = t.graph.leaves(LeafKind::State);
        let victim = match state.first() {
            Some(&s) => s,
            None => t.graph.leaves(LeafKind::Input)[0],
        };
        let at = t.plan.location(&t.graph, victim).offset;
        let s = (0..plan.liveness.storages.len())
            .find(|&i| plan.liveness.storages[i].region == Region::Slab)
            .unwrap();
        plan.storage_offset[s] = at;
        let err = check_disjoint(&t.graph, &t.plan, &e.graph, &plan)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("overlaps the training step's resident"),
            "{err}"
        );
    }

    #[test]
    fn an_eval_step_of_another_model_is_refused_naming_the_parameter() {
        let (t, _) = steps();
        let other =
            crate::models::by_name("gpt:vocab=16,d_model=8,layers=1,heads=2,d_ff=16,seq=4,batch=2")
                .unwrap();
        let e = pipeline::compile_step(
            "gpt (eval)",
            forward_only(&other),
            &Options::for_target(Target::Cpu),
        )
        .unwrap();
        let err = rebase(&t.graph, &t.plan, &e.graph, &e.plan).unwrap_err();
        assert!(matches!(err, SharedError::MissingParameter { .. }), "{err}");
    }
}
