//! Whether a GPU test runs, skips or fails: one rule for every GPU test of the workspace.
//!
//! On a machine without a GPU (CI, most development machines) a GPU test has nothing to check;
//! it says why it skips and passes. On the GPU machine a missing driver or device must not pass
//! the same way, or a broken setup would look like a green run: there the check script sets
//! `INGOT_REQUIRE_GPU=1`, and a missing GPU fails the test with the reason.

use super::device::available;

/// The environment variable that makes a missing GPU a test failure (any value but empty or
/// `0`).
pub const REQUIRE_GPU: &str = "INGOT_REQUIRE_GPU";

/// Whether `INGOT_REQUIRE_GPU` asks for a GPU.
pub fn gpu_required() -> bool {
    std::env::var_os(REQUIRE_GPU).is_some_and(|v| !v.is_empty() && v != "0")
}

/// What a GPU test does on this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuTest {
    /// A GPU is there: run.
    Run,
    /// No GPU, none required: skip, for this reason.
    Skip(String),
    /// No GPU, but `INGOT_REQUIRE_GPU` asks for one: fail, for this reason.
    Fail(String),
}

/// Decides from whether a GPU is `available` (the driver's answer, or why not) and whether one
/// is `required`; separate from the environment so that both branches are testable anywhere.
pub fn decide(available: Result<(), String>, required: bool) -> GpuTest {
    match available {
        Ok(()) => GpuTest::Run,
        Err(why) if required => GpuTest::Fail(format!(
            "{REQUIRE_GPU} is set but there is no usable GPU: {why}"
        )),
        Err(why) => GpuTest::Skip(why),
    }
}

/// For a GPU test named `test`: true when a GPU is there; false after printing
/// `skipping <test>: <reason>` when there is none and none is required; and a panic (the test's
/// failure) naming the reason when `INGOT_REQUIRE_GPU` is set and there is no GPU.
pub fn gpu_for_test(test: &str) -> bool {
    let here = available().map(|_| ()).map_err(|e| e.to_string());
    match decide(here, gpu_required()) {
        GpuTest::Run => true,
        GpuTest::Skip(why) => {
            eprintln!("skipping {test}: {why}");
            false
        }
        GpuTest::Fail(why) => panic!("{test}: {why}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_gpu_skips_unless_required_and_fails_when_required() {
        assert_eq!(decide(Ok(()), true), GpuTest::Run);
        assert_eq!(decide(Ok(()), false), GpuTest::Run);
        assert_eq!(
            decide(Err("no driver".into()), false),
            GpuTest::Skip("no driver".into())
        );
        match decide(Err("no driver".into()), true) {
            GpuTest::Fail(why) => assert!(
                why.contains("INGOT_REQUIRE_GPU") && why.contains("no driver"),
                "{why}"
            ),
            other => panic!("required but {other:?}"),
        }
    }
}
