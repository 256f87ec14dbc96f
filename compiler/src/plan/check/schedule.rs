//! The schedule check: the order runs each node of the graph once, after its operands.

use super::view::PlanView;
use super::violation::PlanViolation;

/// The first way `p.order` fails to run each node once, after its operands.
pub(super) fn check(p: &PlanView<'_>) -> Result<(), PlanViolation> {
    use PlanViolation as V;
    let g = p.graph;
    // The order runs each node once, after its operands.
    let mut done = vec![false; g.len()];
    if p.order.len() != g.len() {
        return Err(V::ScheduleLength {
            scheduled: p.order.len(),
            nodes: g.len(),
        });
    }
    for &id in p.order {
        if id.index() >= g.len() || done[id.index()] {
            return Err(V::ScheduledTwice { node: id });
        }
        if let Some(x) = g.node(id).inputs.iter().find(|x| !done[x.index()]) {
            return Err(V::OperandNotReady {
                node: id,
                op: g.node(id).op.name(),
                operand: *x,
            });
        }
        done[id.index()] = true;
    }
    Ok(())
}
