//! What the checker reports: the first way a plan breaks the executor's contract, naming the
//! node and the bytes.

use crate::ir::NodeId;

/// A broken promise of the plan, one variant per rule the validator checks, naming the nodes,
/// byte ranges and sizes involved. Every message starts "invalid memory plan: ".
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanViolation {
    /// The location or workspace table does not have one entry per node.
    #[error(
        "invalid memory plan: {locations} locations and {workspaces} workspaces for {nodes} nodes"
    )]
    TableLength {
        locations: usize,
        workspaces: usize,
        nodes: usize,
    },
    /// The schedule does not run as many ops as the graph has nodes.
    #[error("invalid memory plan: the schedule has {scheduled} ops, the graph {nodes}")]
    ScheduleLength { scheduled: usize, nodes: usize },
    /// A node is scheduled twice, or the schedule names a node the graph does not have.
    #[error("invalid memory plan: {node} is scheduled twice or does not exist")]
    ScheduledTwice { node: NodeId },
    /// A node is scheduled before one of its operands.
    #[error("invalid memory plan: {node} ({op}) runs before its operand {operand}")]
    OperandNotReady {
        node: NodeId,
        op: &'static str,
        operand: NodeId,
    },
    /// A value's location is not the size of its type.
    #[error("invalid memory plan: {node} needs {needs} bytes but is given {given}")]
    WrongSize {
        node: NodeId,
        needs: usize,
        given: usize,
    },
    /// A value's offset is not a multiple of the alignment.
    #[error("invalid memory plan: {node} is at offset {offset}, not a multiple of {alignment}")]
    Misaligned {
        node: NodeId,
        offset: usize,
        alignment: usize,
    },
    /// A value lies (partly) past the end of the allocation.
    #[error(
        "invalid memory plan: {node} at [{start}, {end}) lies outside the {total} byte allocation"
    )]
    OutsideAllocation {
        node: NodeId,
        start: usize,
        end: usize,
        total: usize,
    },
    /// A kernel's workspace offset is not a multiple of the alignment.
    #[error(
        "invalid memory plan: the workspace of {node} is at offset {offset}, not a multiple of \
         {alignment}"
    )]
    WorkspaceMisaligned {
        node: NodeId,
        offset: usize,
        alignment: usize,
    },
    /// A kernel's workspace lies (partly) past the end of the allocation.
    #[error(
        "invalid memory plan: the workspace of {node} at [{start}, {end}) lies outside the \
         {total} byte allocation"
    )]
    WorkspaceOutsideAllocation {
        node: NodeId,
        start: usize,
        end: usize,
        total: usize,
    },
    /// A kernel writes two of its outputs to overlapping bytes.
    #[error("invalid memory plan: {node} writes its outputs {a} and {b} over each other")]
    OutputsOverlap { node: NodeId, a: NodeId, b: NodeId },
    /// A value is read after its bytes were given to another value (outside its lifetime).
    #[error(
        "invalid memory plan: {node} ({op}) reads {operand} at [{start}, {end}), but those bytes \
         no longer hold it"
    )]
    ReadAfterOverwrite {
        node: NodeId,
        op: &'static str,
        operand: NodeId,
        start: usize,
        end: usize,
    },
    /// A kernel's output overlaps an operand it may not write over (not exactly the same bytes,
    /// or an op that does not read its operand only at the output's own index).
    #[error(
        "invalid memory plan: {node} ({op}) writes over its operand {operand} while reading it \
         (its output {output})"
    )]
    WritesOverOperand {
        node: NodeId,
        op: &'static str,
        operand: NodeId,
        output: NodeId,
    },
    /// A workspace filled ahead of its node is said to be filled at or after the node runs.
    #[error(
        "invalid memory plan: the workspace of {node} ({op}) is filled after position {after}, \
         not before the node's own position {at}"
    )]
    WorkspaceFilledLate {
        node: NodeId,
        op: &'static str,
        after: usize,
        at: usize,
    },
    /// Something is written over a workspace between its early fill and its node.
    #[error(
        "invalid memory plan: the workspace of {node} ({op}), filled after position {after}, is \
         overwritten before {node} runs"
    )]
    WorkspaceOverwritten {
        node: NodeId,
        op: &'static str,
        after: usize,
    },
    /// A kernel's workspace overlaps one of its operands.
    #[error("invalid memory plan: {node} ({op}) has its workspace on its operand {operand}")]
    WorkspaceOnOperand {
        node: NodeId,
        op: &'static str,
        operand: NodeId,
    },
    /// A kernel's workspace overlaps one of its outputs.
    #[error("invalid memory plan: {node} ({op}) has its workspace on its own output {output}")]
    WorkspaceOnOutput {
        node: NodeId,
        op: &'static str,
        output: NodeId,
    },
    /// A view (reshape, stop_gradient) is not placed on its operand's bytes.
    #[error("invalid memory plan: {op} {node} is not placed on its operand {operand}")]
    ViewNotOnOperand {
        node: NodeId,
        op: &'static str,
        operand: NodeId,
    },
    /// The outputs of an all-reduce (a gradient bucket) are not one region: each must start at
    /// the first aligned offset after the previous one ends.
    #[error(
        "invalid memory plan: all-reduce {node} has its output {output} at offset {offset}, not          at {expected} right after the previous output: a bucket must be one contiguous region"
    )]
    BucketNotContiguous {
        node: NodeId,
        output: NodeId,
        offset: usize,
        expected: usize,
    },
    /// A graph output's bytes were reused before the step ended.
    #[error("invalid memory plan: output {name:?} ({node}) was overwritten before the step ended")]
    OutputOverwritten { name: String, node: NodeId },
    /// A parameter's new value was overwritten before it was copied over the parameter.
    #[error(
        "invalid memory plan: the new value {value} of {target} was overwritten before it was \
         copied"
    )]
    UpdateOverwrittenBeforeCopy { value: NodeId, target: NodeId },
    /// A parameter does not hold its new value when the step ends.
    #[error(
        "invalid memory plan: {target} does not hold its new value {value} when the step ends"
    )]
    UpdateNotHeld { target: NodeId, value: NodeId },
    /// An offload record is malformed: not updated optimizer state, named twice, copies out of
    /// order or outside the schedule, or a host home of the wrong size or outside its region.
    #[error("invalid memory plan: offloaded {leaf}: {reason}")]
    OffloadInvalid { leaf: NodeId, reason: String },
    /// Two offloaded leaves share bytes of the host region (each holds its leaf all step).
    #[error("invalid memory plan: the host homes of offloaded {a} and {b} overlap")]
    OffloadHomesOverlap { a: NodeId, b: NodeId },
    /// When an offloaded leaf is copied out, its staging buffer does not hold its new value.
    #[error(
        "invalid memory plan: offloaded {leaf} is copied out after position {at}, but its \
         staging buffer does not hold its new value {value} then"
    )]
    OffloadNotHeld {
        leaf: NodeId,
        value: NodeId,
        at: usize,
    },
}
