//! `--model-file`: the `ingot` commands on a forward pass written in the IR text form.

use ingot_testkit::text::assert_mentions;
use std::path::PathBuf;
use std::process::{Command, Output};

#[path = "support/cli.rs"]
mod cli;

fn ingot(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(args)
        .current_dir(repo_root())
        .output()
        .expect("ingot runs")
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

const TINY: &str = "docs/examples/tiny-mlp.ir";

/// The stdout of `ingot args`, which must exit 0 (a failure shows stdout and stderr).
fn succeeds(args: &[&str]) -> String {
    let out = ingot(args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn plan_prints_a_report_for_a_model_file() {
    let stdout = succeeds(&["plan", "--model-file", TINY]);
    assert!(
        stdout.contains(TINY),
        "the report names the file:\n{stdout}"
    );
    assert!(stdout.contains("fusion:"), "{stdout}");
}

#[test]
fn train_on_a_model_file_lowers_the_loss() {
    let stdout = succeeds(&["train", "--model-file", TINY, "--steps", "5", "--json"]);
    let losses: Vec<f64> = stdout
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter_map(|v| v.get("loss").and_then(|l| l.as_f64()))
        .collect();
    assert_eq!(losses.len(), 5, "{stdout}");
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    assert!(losses.windows(2).all(|w| w[1] < w[0]), "{losses:?}");
    assert!(losses[4] < losses[0] * 0.5, "{losses:?}");
}

#[test]
fn compile_and_run_a_model_file() {
    let dir = cli::scratch("model-file-tests", "model-file");
    let exe = dir.join("tiny.ingot");
    let exe = exe.to_str().unwrap();
    succeeds(&["compile", "--model-file", TINY, "-o", exe]);
    let trained = ingot(&["train", "--model-file", TINY, "--steps", "2"]);
    let ran = ingot(&["run", exe, "--steps", "2"]);
    assert_eq!(
        ran.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    // Not a terminal: the plain step lines, the same for both.
    let steps = |o: &Output| -> Vec<String> {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.starts_with("step "))
            .map(|l| l.split("  ").take(3).collect::<Vec<_>>().join("  "))
            .collect()
    };
    assert_eq!(steps(&trained).len(), 2);
    assert_eq!(steps(&trained), steps(&ran));
    std::fs::remove_dir_all(&dir).ok();
}

/// `text` written as the file `name` in a fresh directory for `test`.
fn ir_file(test: &str, name: &str, text: &str) -> PathBuf {
    let f = cli::scratch("model-file-tests", test).join(name);
    std::fs::write(&f, text).unwrap();
    f
}

/// The stderr of `ingot plan --model-file` of `text` written as `name` ([`ir_file`]), which
/// must exit 1.
fn plan_refuses(test: &str, name: &str, text: &str) -> String {
    let f = ir_file(test, name, text);
    let out = ingot(&["plan", "--model-file", f.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    stderr
}

#[test]
fn a_syntax_error_names_the_file_and_line_and_exits_1() {
    let bad = ir_file(
        "model-file-bad",
        "bad.ir",
        "ingot-ir 1\n%0 = parameter \"w\" init=zeros : f32[2]\n%1 = reduce_sum(%0 axes=[0] : f32[1]\n",
    );
    let bad = bad.to_str().unwrap();
    for cmd in ["plan", "train"] {
        let mut args = vec![cmd, "--model-file", bad];
        if cmd == "train" {
            args.extend(["--steps", "1"]);
        }
        let out = ingot(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{cmd}: {stderr}");
        assert!(
            stderr.contains(&format!("{bad}: line 3:")),
            "{cmd}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let missing = ingot(&["plan", "--model-file", "no/such/file.ir"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no/such/file.ir"));
}

#[test]
fn a_file_without_a_scalar_loss_is_an_error_naming_it() {
    let text = "ingot-ir 1\n%0 = parameter \"w\" init=zeros : f32[2]\noutput \"out\" = %0\n";
    let stderr = plan_refuses("model-file-noloss", "noloss.ir", text);
    assert_mentions(&stderr, &["noloss.ir", "\"loss\""]);
}

#[test]
fn model_and_model_file_together_or_neither_are_usage_errors() {
    for extra in [
        &["plan"][..],
        &["train", "--steps", "1"],
        &["compile", "-o", "x"],
    ] {
        let mut args = extra.to_vec();
        args.extend(["--model", "mlp", "--model-file", TINY]);
        let both = ingot(&args);
        let stderr = String::from_utf8_lossy(&both.stderr);
        assert_eq!(both.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("cannot be used with"), "{args:?}: {stderr}");
    }
    let neither = ingot(&["plan"]);
    assert_eq!(neither.status.code(), Some(2));
}

const LAYERED: &str = "docs/examples/tiny-classifier.ir";
const SPELLED: &str = "cli/tests/models/tiny-classifier-primitives.ir";

/// The losses of `--json` step lines, as their bits.
fn loss_bits(stdout: &str) -> Vec<u64> {
    cli::json_lines(stdout)
        .iter()
        .filter_map(|l| l["loss"].as_f64())
        .map(f64::to_bits)
        .collect()
}

#[test]
fn a_file_of_layer_lines_plans_and_trains_to_the_losses_of_its_primitives_spelled_out() {
    let train = |file: &str| {
        loss_bits(&succeeds(&[
            "train",
            "--model-file",
            file,
            "--steps",
            "8",
            "--seed",
            "3",
            "--json",
        ]))
    };
    let (layered, spelled) = (train(LAYERED), train(SPELLED));
    assert_eq!(layered.len(), 8);
    assert_eq!(layered, spelled, "the same losses, bit for bit");
    let first = f64::from_bits(layered[0]);
    let last = f64::from_bits(layered[7]);
    assert!(last < first, "it trains: {first} -> {last}");
    // The same plan, to the byte (the reports differ only in the file's name).
    let total = |file: &str| {
        let json: serde_json::Value =
            serde_json::from_str(&succeeds(&["plan", "--model-file", file, "--json"])).unwrap();
        (json["total_bytes"].clone(), json["ops"].clone())
    };
    assert_eq!(total(LAYERED), total(SPELLED));
}

#[test]
fn a_wrong_layer_line_names_the_file_and_line_and_exits_1() {
    let text =
        "ingot-ir 1\n%0 = input \"x\" : f32[4,8]\n%1 = linear(%0) \"fc1\" out=16 : f32[4,12]\n";
    let stderr = plan_refuses("wrong_layer_line", "step.ir", text);
    assert!(stderr.contains("step.ir"), "{stderr}");
    assert!(stderr.contains("line 3"), "{stderr}");
    assert!(
        stderr.contains("`linear` gives f32[4,16], but the line states f32[4,12]"),
        "{stderr}"
    );
}
