//! Running the `ingot` program from a test: a fresh scratch directory per test, the program's
//! output, and its stdout once it succeeded. `#[path]`-included by the CLI test binaries, each
//! of which uses a part of it.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
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

/// Runs `ingot` with `args`: its exit code (-1 where a signal ended it), stdout and stderr.
pub fn run<S: AsRef<OsStr>>(args: &[S]) -> (i32, String, String) {
    code_out_err(
        &Command::new(env!("CARGO_BIN_EXE_ingot"))
            .args(args)
            .output()
            .expect("run ingot"),
    )
}

/// The exit code (-1 where a signal ended the program), stdout and stderr of `out`.
pub fn code_out_err(out: &Output) -> (i32, String, String) {
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
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

/// The stderr of a run that must have exited with `code` (the failure shows its stdout).
pub fn failed(out: &Output, code: i32) -> String {
    exit_stderr(code_out_err(out), code)
}

/// The stderr of a run's `(exit code, stdout, stderr)` ([`run`]), which must have exited with
/// `code` (the failure shows both streams).
pub fn exit_stderr((got, stdout, stderr): (i32, String, String), code: i32) -> String {
    assert_eq!(got, code, "{stdout}\n{stderr}");
    stderr
}

/// Runs `ingot train --model MODEL --dataset DATASET` with the flags `more` after them.
pub fn train_on(model: &str, dataset: impl AsRef<Path>, more: &[&str]) -> Output {
    let dataset = s(dataset.as_ref());
    ingot(&[&["train", "--model", model, "--dataset", dataset][..], more].concat())
}

/// `text` written to `dir/text.txt` and turned into byte-level tokens, `dir/text.bin`, by
/// `ingot data bytes`.
pub fn byte_tokens_of(dir: &Path, text: &str) -> PathBuf {
    let txt = dir.join("text.txt");
    std::fs::write(&txt, text).unwrap();
    let bin = dir.join("text.bin");
    ok(&ingot(&["data", "bytes", s(&txt), s(&bin)]));
    bin
}

/// `n` byte-level tokens of a deterministic text of letters ([`byte_tokens_of`]).
pub fn letter_tokens(dir: &Path, n: u32) -> PathBuf {
    let text: String = (0..n)
        .map(|i| (b'a' + ((i * 7 + i / 13) % 26) as u8) as char)
        .collect();
    byte_tokens_of(dir, &text)
}

/// Every line of `stdout` read as JSON (the panic names the line that is not).
pub fn json_lines(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

/// Each of `lines`' value of `key` that is a number, in order ([`json_lines`]); lines without
/// one are passed over.
pub fn numbers(lines: &[serde_json::Value], key: &str) -> Vec<f64> {
    lines
        .iter()
        .filter_map(|v| v.get(key).and_then(|x| x.as_f64()))
        .collect()
}

/// Each step line's step number and loss (NaN where the loss is null: not finite), in order, of
/// the `--json` lines `lines` ([`json_lines`]); lines without a loss are passed over.
pub fn step_losses(lines: &[serde_json::Value]) -> Vec<(u64, f64)> {
    lines
        .iter()
        .filter(|v| v.get("loss").is_some())
        .map(|v| {
            let loss = v["loss"].as_f64().unwrap_or(f64::NAN); // null: not finite
            (v["step"].as_u64().unwrap(), loss)
        })
        .collect()
}

/// A path as a command-line argument.
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}
