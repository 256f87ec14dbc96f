//! Snapshot and property tests live under tests/.

pub mod chains;
pub mod gradcheck;
