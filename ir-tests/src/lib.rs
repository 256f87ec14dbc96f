//! Snapshot and property tests live under tests/.

pub mod chains;
pub mod exe_file;
pub mod fits;
pub mod gradcheck;
pub mod losses;
pub mod planned;

use ingot_compiler::lower::Target;
use ingot_compiler::pipeline::Options;
use ingot_compiler::precision::Precision;

/// The CUDA pipeline's options at `precision`, everything else at the CUDA target's defaults:
/// what the tests of a CUDA plan at each precision compile with.
pub fn cuda_options(precision: Precision) -> Options {
    Options {
        precision: Some(precision),
        ..Options::for_target(Target::Cuda)
    }
}

/// One insta snapshot test a line: `snapshot_tests! { test_name => text, ... }` is a `#[test]
/// fn test_name` asserting the snapshot of `text` (the snapshot file is named for the test, as
/// a written-out test's is). For the tests that snapshot the same thing of each reference
/// model; the crate using it depends on `insta`.
#[macro_export]
macro_rules! snapshot_tests {
    ($($name:ident => $text:expr),+ $(,)?) => {$(
        #[test]
        fn $name() {
            insta::assert_snapshot!($text);
        }
    )+};
}
