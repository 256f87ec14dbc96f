//! An independent checker for memory plans, after regalloc2's checker: it shares no code with
//! the planner. It replays the schedule over a map from byte ranges to the value they hold and
//! proves that every read finds the value it expects there, so no two values that are needed at
//! the same time share a byte, whatever the planner believed about lifetimes.
//!
//! Facts it relies on are the executor's contract, not the planner's reasoning: a `reshape`
//! (or `stop_gradient`) reads its operand in place (its location must equal its operand's); an
//! elementwise op may write over an operand only when the two occupy exactly the same bytes, and
//! a fused kernel likewise, only over inputs its description says it reads at the output's own
//! index. A fused kernel writes all its outputs when it runs; its `result` nodes do nothing.
//!
//! It checks in four parts, each reporting the first [`PlanViolation`] it finds: the
//! `schedule` (every node once, after its operands), the `placement` (every location and
//! workspace the right size, aligned and inside the allocation), the `host` region of
//! offloaded leaves (homes apart, copies in order), and the `replay` (the schedule run over
//! the map of bytes, offload copies included: a read of an offloaded leaf before its copy in
//! or after its copy out finds other bytes there).

mod host;
mod placement;
mod replay;
mod schedule;
mod view;
mod violation;

pub use view::PlanView;
pub use violation::PlanViolation;

/// Checks the plan's tables, schedule and placement, then replays it; returns the first
/// violation found.
pub fn validate(p: &PlanView<'_>) -> Result<(), PlanViolation> {
    use PlanViolation as V;
    let g = p.graph;
    if p.location.len() != g.len()
        || p.workspace.len() != g.len()
        || p.workspace_filled_after.len() != g.len()
    {
        return Err(V::TableLength {
            locations: p.location.len(),
            workspaces: p.workspace.len(),
            nodes: g.len(),
        });
    }
    schedule::check(p)?;
    placement::check(p)?;
    host::check(p)?;
    replay::check(p)
}
