//! Where a value lives in the step's one allocation: what the planner assigns, the validator
//! checks, the lowering turns into byte offsets and the runtimes read. A plain byte range, kept
//! apart from both the planner and its checker so that each can use it without the other.

/// Where one node's value lives, as an absolute byte range of the step's single allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Location {
    pub offset: usize,
    pub bytes: usize,
}
