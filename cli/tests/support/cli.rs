//! Running the `ingot` program from a test: a fresh scratch directory per test, the program's
//! output, and its stdout once it succeeded. `#[path]`-included by the CLI test binaries.

use std::path::PathBuf;
use std::process::{Command, Output};

/// An empty directory for `test` under `group`, in cargo's scratch space for tests.
pub fn scratch(group: &str, test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(group)
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `ingot` with `args`.
pub fn ingot(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(args)
        .output()
        .expect("ingot runs")
}

/// The stdout of a run that must have succeeded (the failure shows its exit code and stderr).
pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}
