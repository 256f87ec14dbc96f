//! `--shard-optimizer` on the command line: two CPU ranks that each keep and update their
//! rows of the copied weights train, save, checkpoint and resume as two unsharded ranks, the
//! plan shows the memory it saves, and what it cannot run with is a clear error.

use ingot_runtime::io;
use std::path::{Path, PathBuf};

#[path = "support/cli.rs"]
mod cli;
use cli::{ingot, ok};

/// A GPT small enough for a CPU test whose matrices' rows divide by two.
const GPT: &str = "gpt:vocab=64,d_model=32,layers=2,heads=4,d_ff=64,seq=8,batch=2";

fn scratch(test: &str) -> PathBuf {
    cli::scratch("sharded-cli-tests", test)
}

/// `ingot COMMAND` of `model` in bf16 for two CPU ranks, `--json`, sharded or not, with
/// `args` after.
fn model_args<'a>(command: &'a str, model: &'a str, shard: bool, args: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        command,
        "--model",
        model,
        "--precision",
        "bf16",
        "--ranks",
        "2",
        "--json",
    ];
    if shard {
        v.push("--shard-optimizer");
    }
    v.extend_from_slice(args);
    v
}

/// `ingot train` of [`GPT`] ([`model_args`]).
fn train_args<'a>(shard: bool, args: &[&'a str]) -> Vec<&'a str> {
    model_args("train", GPT, shard, args)
}

/// The JSON lines of a run that succeeded.
fn json_lines(args: &[&str]) -> Vec<serde_json::Value> {
    cli::json_lines(&ok(&ingot(args)))
}

/// Each step's number and its loss's bits.
fn losses(lines: &[serde_json::Value]) -> Vec<(u64, u64)> {
    let losses = cli::step_losses(lines).into_iter();
    losses.map(|(step, loss)| (step, loss.to_bits())).collect()
}

/// The summary line's `key`.
fn summary(lines: &[serde_json::Value], key: &str) -> u64 {
    let s = lines.iter().find_map(|v| v.get("summary")).unwrap();
    s[key].as_u64().unwrap()
}

#[test]
fn training_two_cpu_ranks_with_a_sharded_optimizer_gives_the_unsharded_losses_and_saved_weights_in_less_memory(
) {
    let d = scratch("losses");
    let (a, b) = (d.join("plain.safetensors"), d.join("sharded.safetensors"));
    let run = |shard: bool, save: &Path| {
        json_lines(&train_args(
            shard,
            &["--steps", "5", "--save", save.to_str().unwrap()],
        ))
    };
    let (plain, sharded) = (run(false, &a), run(true, &b));
    assert_eq!(losses(&sharded).len(), 5);
    assert_eq!(losses(&sharded), losses(&plain), "losses, bit for bit");
    let (pa, pb) = (io::load(&a).unwrap(), io::load(&b).unwrap());
    assert_eq!(pa.len(), pb.len());
    for (name, v) in &pa {
        assert_eq!(*v, pb[name], "{name} saved whole, the same bits");
    }
    for key in ["planned_bytes", "resident_bytes"] {
        assert!(
            summary(&sharded, key) < summary(&plain, key),
            "{key}: sharded {} against {}",
            summary(&sharded, key),
            summary(&plain, key)
        );
    }
}

#[test]
fn a_sharded_runs_checkpoint_resumes_sharded_and_unsharded_as_the_uninterrupted_run() {
    let d = scratch("resume");
    let ck = d.join("ck");
    let ck = ck.to_str().unwrap();
    let straight = losses(&json_lines(&train_args(true, &["--steps", "6"])));
    let first = losses(&json_lines(&train_args(
        true,
        &["--steps", "3", "--checkpoint", ck],
    )));
    for shard in [true, false] {
        let second = losses(&json_lines(&train_args(
            shard,
            &["--steps", "6", "--resume", ck],
        )));
        let resumed: Vec<(u64, u64)> = first.iter().copied().chain(second).collect();
        assert_eq!(resumed, straight, "resumed with --shard-optimizer: {shard}");
    }
}

#[test]
fn the_plan_of_a_sharded_optimizer_holds_fewer_resident_and_total_bytes() {
    let plan = |shard: bool| {
        serde_json::from_str::<serde_json::Value>(&ok(&ingot(&model_args("plan", GPT, shard, &[]))))
            .unwrap()
    };
    let (plain, sharded) = (plan(false), plan(true));
    let bytes = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap();
    assert!(bytes(&sharded, "resident_bytes") < bytes(&plain, "resident_bytes"));
    assert!(bytes(&sharded, "total_bytes") < bytes(&plain, "total_bytes"));
}

/// Runs `ingot` with `args`, which must fail with exit code `code`, without a panic, saying
/// every one of `words`.
fn refused(args: &[&str], code: i32, words: &[&str]) {
    let out = ingot(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    for w in words {
        assert!(stderr.contains(w), "{args:?} should say {w:?}: {stderr}");
    }
}

#[test]
fn sharding_with_one_rank_f32_gradient_clipping_or_torchrun_is_a_clear_error() {
    let base = ["--model", GPT, "--shard-optimizer", "--steps", "1"];
    fn with<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        [&["train"][..], base, extra].concat()
    }
    let train = |extra: &[&'static str]| with(&base, extra);
    refused(
        &train(&["--precision", "bf16"]),
        2,
        &["--shard-optimizer", "two or more", "--ranks N"],
    );
    refused(
        &train(&["--precision", "bf16", "--gpus", "1"]),
        2,
        &["--shard-optimizer", "two or more"],
    );
    refused(
        &train(&["--ranks", "2"]),
        1,
        &["bf16 weight copies", "--precision bf16"],
    );
    refused(
        &train(&["--ranks", "2", "--precision", "bf16", "--no-weight-copies"]),
        1,
        &["--no-weight-copies"],
    );
    refused(
        &train(&[
            "--ranks",
            "2",
            "--precision",
            "bf16",
            "--clip-grad-norm",
            "1",
        ]),
        1,
        &["clip", "--clip-grad-norm"],
    );
    // Refused before the launch environment is read or anything compiles.
    refused(
        &train(&["--precision", "bf16", "--torchrun"]),
        2,
        &["--shard-optimizer", "--torchrun", "--gpus N"],
    );
    // plan and compile check the ranks alike.
    refused(
        &[
            "plan",
            "--model",
            GPT,
            "--precision",
            "bf16",
            "--shard-optimizer",
        ],
        2,
        &["--shard-optimizer", "two or more"],
    );
    let d = scratch("refused");
    let out = d.join("step.ingot");
    refused(
        &[
            "compile",
            "--model",
            GPT,
            "--shard-optimizer",
            "-o",
            out.to_str().unwrap(),
        ],
        2,
        &["--shard-optimizer", "two or more"],
    );
    assert!(!out.exists(), "nothing written");
}

#[test]
fn a_sharded_run_validates_as_the_unsharded_run_does_and_plans_its_evaluation() {
    // The evaluation step reads the whole bf16 copies, which every rank holds, where the
    // training step keeps them; the sharded f32 rows stay the training step's alone.
    const BYTES_GPT: &str = "gpt:vocab=256,d_model=32,layers=2,heads=4,d_ff=64,seq=8,batch=2";
    let d = scratch("validates");
    let bin = cli::letter_tokens(&d, 3000);
    let bin = bin.to_str().unwrap();
    let run = |shard: bool| -> (Vec<(u64, u64)>, Vec<u64>) {
        let a = model_args(
            "train",
            BYTES_GPT,
            shard,
            &[
                "--dataset",
                bin,
                "--val",
                bin,
                "--eval-batches",
                "2",
                "--eval-every",
                "2",
                "--steps",
                "4",
            ],
        );
        let lines = json_lines(&a);
        let vals = lines
            .iter()
            .filter_map(|v| v.get("val_loss").and_then(|l| l.as_f64()))
            .map(f64::to_bits)
            .collect();
        (losses(&lines), vals)
    };
    let (plain, sharded) = (run(false), run(true));
    assert_eq!(plain.1.len(), 2, "two evaluations");
    assert_eq!(sharded, plain, "losses and validation losses, bit for bit");
    let plan = ok(&ingot(&model_args("plan", BYTES_GPT, true, &["--eval"])));
    assert!(plan.contains("eval"), "{plan}");
}

#[test]
fn a_sharded_optimizer_accumulating_micro_batches_trains_as_the_unsharded_one() {
    // The sharding pass sees the accumulated step: its reduce-scatters read the micro-batches'
    // summed gradients, as the plain step's all-reduces do.
    let run = |shard: bool| {
        losses(&json_lines(&train_args(
            shard,
            &["--accumulate", "2", "--steps", "4"],
        )))
    };
    let plain = run(false);
    assert_eq!(plain.len(), 4);
    assert_eq!(run(true), plain, "each step's loss, bit for bit");
}
