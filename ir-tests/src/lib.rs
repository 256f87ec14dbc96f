//! Snapshot and property tests live under tests/.
