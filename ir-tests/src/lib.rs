//! Snapshot and property tests live under tests/.

pub mod chains;
pub mod exe_file;
pub mod fits;
pub mod gradcheck;
pub mod losses;
pub mod planned;
