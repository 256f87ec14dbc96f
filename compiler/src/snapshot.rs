//! A memory plan as a snapshot for a user's own tests: a small, deterministic summary of the
//! [`Report`] (totals, LOAD, the peak and what is live there) that reads well in a diff, so a
//! CI job that snapshots it (with `insta`) fails when a change makes the step need more memory,
//! plus [`PlanSnapshot::assert_within`] for a hard budget.
//!
//! Everything in it is derived from byte counts and the schedule, never from timings, so the
//! same model and options give the same snapshot on every machine (invariant 5).
//!
//! Buffers are named by provenance (the layer that made them, `fc2 (backward)`,
//! `update of fc1.weight`, `workspace of ...`), never by node id: node ids renumber whenever
//! a compiler pass changes, so a snapshot keyed by them would churn on every compiler upgrade
//! even when the plan did not move. Schedule positions (the peak's, buffers' lifetimes) are
//! not in it either, for the same reason; `ingot plan --json` has them.
//!
//! ```no_run
//! use ingot_compiler::{pipeline, snapshot::plan_snapshot};
//! let model = ingot_models::by_name("mlp").unwrap();
//! let snap = plan_snapshot(&model, &pipeline::Options::default()).unwrap();
//! snap.assert_within(64 << 20).unwrap();
//! ```

use crate::model::Model;
use crate::pipeline::{self, CompileError, Compiled};
use crate::report::{human, KindBytes, PeakBuffer, Report, ResidentBytes};
use serde::{Deserialize, Serialize};

/// What a plan costs and what holds its peak, in a form meant to be committed and diffed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanSnapshot {
    pub model: String,
    /// The schedule the planner chose.
    pub schedule: String,
    /// Nodes of the planned step graph.
    pub ops: usize,
    /// Kernel launches per step.
    pub kernels: usize,
    /// The one allocation the step needs, in bytes: what the runtime allocates.
    pub total_bytes: usize,
    /// `total_bytes` in binary units, for the reader.
    pub total: String,
    /// Parameters, optimizer state and inputs.
    pub resident_bytes: usize,
    pub resident: ResidentBytes,
    /// Everything else: activations, gradients, temporaries, workspace.
    pub slab_bytes: usize,
    /// LOAD: the most slab bytes live at one moment, a lower bound on `slab_bytes`.
    pub lower_bound_bytes: usize,
    /// slab / LOAD to four decimals (1.0000 is a perfect packing).
    pub slab_over_lower_bound: String,
    pub peak: PeakSnapshot,
    /// Values that write over a dying operand instead of taking new bytes.
    pub in_place_ops: usize,
    /// Slab storages (after in-place sharing).
    pub slab_buffers: usize,
}

/// The moment of the schedule at which LOAD is reached.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeakSnapshot {
    /// The op running there: `provenance (op)`, e.g. `fc3 (backward) (matmul)`.
    pub op: String,
    /// Live slab bytes there, by kind.
    pub by_kind: KindBytes,
    /// The largest buffers live there, largest first, one line each:
    /// `provenance: op dtype[shape] bytes B (human) kind`.
    pub largest_buffers: Vec<String>,
}

/// The plan needs more than the budget: what [`PlanSnapshot::assert_within`] returns. Its
/// `Display` is the readable message (total, budget, excess, what is live at the peak).
#[derive(Clone, Debug, PartialEq)]
pub struct OverBudget {
    pub model: String,
    pub total_bytes: usize,
    pub budget_bytes: usize,
    pub resident_bytes: usize,
    pub slab_bytes: usize,
    /// The op running at the peak.
    pub peak_op: String,
    /// The largest buffers live at the peak, one line each.
    pub largest_buffers: Vec<String>,
}

impl std::fmt::Display for OverBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: the plan needs {} ({} bytes), over the budget of {} ({} bytes) by {} ({} bytes).\n\
             resident (parameters, optimizer state, inputs): {}; slab: {}.\n\
             at the peak ({}) the largest live buffers are:",
            self.model,
            human(self.total_bytes),
            self.total_bytes,
            human(self.budget_bytes),
            self.budget_bytes,
            human(self.total_bytes - self.budget_bytes),
            self.total_bytes - self.budget_bytes,
            human(self.resident_bytes),
            human(self.slab_bytes),
            self.peak_op,
        )?;
        for b in &self.largest_buffers {
            write!(f, "\n  {b}")?;
        }
        write!(
            f,
            "\nlower the batch size or sequence length, or raise the budget if the growth is expected"
        )
    }
}

impl std::error::Error for OverBudget {}

/// Compiles `model`'s training step with `opts` and summarises its memory plan.
///
/// Use the options of the target the step will run on (the runtime's
/// `session::Device::Cpu.options()` plans the CPU matmul's workspace, as `ingot plan` does), so
/// the snapshot's total is what that target allocates.
pub fn plan_snapshot(
    model: &Model,
    opts: &pipeline::Options,
) -> Result<PlanSnapshot, CompileError> {
    Ok(PlanSnapshot::of(&pipeline::compile(model, opts)?))
}

impl PlanSnapshot {
    /// The snapshot of an already compiled step.
    pub fn of(compiled: &Compiled) -> PlanSnapshot {
        PlanSnapshot::from_report(&compiled.report)
    }

    /// The snapshot of a plan report.
    pub fn from_report(r: &Report) -> PlanSnapshot {
        PlanSnapshot {
            model: r.model.clone(),
            schedule: r.schedule.clone(),
            ops: r.ops,
            kernels: r.kernels,
            total_bytes: r.total_bytes,
            total: human(r.total_bytes),
            resident_bytes: r.resident_bytes,
            resident: r.resident.clone(),
            slab_bytes: r.slab_bytes,
            lower_bound_bytes: r.lower_bound_bytes,
            slab_over_lower_bound: format!("{:.4}", r.slab_over_lower_bound),
            peak: PeakSnapshot {
                op: peak_op(r),
                by_kind: r.peak_by_kind.clone(),
                largest_buffers: r.peak_buffers.iter().map(buffer_line).collect(),
            },
            in_place_ops: r.in_place_ops,
            slab_buffers: r.slab_buffers,
        }
    }

    /// `Ok` when the step fits in `budget_bytes`; otherwise an [`OverBudget`] naming the total,
    /// the budget, and what is live at the peak (print it: its `Display` is the message).
    pub fn assert_within(&self, budget_bytes: usize) -> Result<(), OverBudget> {
        if self.total_bytes <= budget_bytes {
            return Ok(());
        }
        Err(OverBudget {
            model: self.model.clone(),
            total_bytes: self.total_bytes,
            budget_bytes,
            resident_bytes: self.resident_bytes,
            slab_bytes: self.slab_bytes,
            peak_op: self.peak.op.clone(),
            largest_buffers: self.peak.largest_buffers.clone(),
        })
    }
}

/// `fc3 (backward) (matmul)`: the peak op by provenance and op name, no node id.
fn peak_op(r: &Report) -> String {
    let op = r
        .peak_op
        .split_once(' ')
        .map_or(r.peak_op.as_str(), |x| x.1);
    if r.peak_provenance.is_empty() {
        op.to_string()
    } else {
        format!("{} ({op})", r.peak_provenance)
    }
}

/// `fc3 (backward): matmul f32[1024,1024] 4194304 B (4.00 MiB) gradient`.
fn buffer_line(b: &PeakBuffer) -> String {
    format!(
        "{}: {} {} {} B ({}) {}",
        b.provenance,
        b.op,
        b.type_label(),
        b.bytes,
        human(b.bytes),
        b.kind
    )
}
