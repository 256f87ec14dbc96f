//! Snapshot and property tests live under tests/.

pub mod gradcheck;
