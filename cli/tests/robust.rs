//! Inputs that used to panic, abort, read forever or lose work, run through the `ingot` program
//! as a user would: each is now a plan that runs or an error naming what is wrong, with the
//! program's exit codes (1 an error, 2 bad arguments, 3 a capacity or budget not met).

use ingot_testkit::text::assert_mentions;
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "support/cli.rs"]
mod cli;
use cli::{exit_stderr, s};

fn ingot<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> (i32, String, String) {
    let (code, out, err) = cli::code_out_err(
        &Command::new(env!("CARGO_BIN_EXE_ingot"))
            .args(args)
            .current_dir(repo_root())
            .output()
            .expect("run ingot"),
    );
    assert!(
        !err.contains("panicked") && !err.contains("memory allocation"),
        "ingot {:?} crashed: {err}",
        args.iter().map(|a| a.as_ref()).collect::<Vec<_>>()
    );
    (code, out, err)
}

/// `ingot train --model-file FILE --steps STEPS EXTRA..`: how most tests here start.
fn train_file(file: &str, steps: &str, extra: &[&str]) -> (i32, String, String) {
    let mut args = vec!["train", "--model-file", file, "--steps", steps];
    args.extend_from_slice(extra);
    ingot(&args)
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// An IR model file of cli/tests/models, by name, relative to the repository root.
fn model(name: &str) -> String {
    format!("cli/tests/models/{name}.ir")
}

/// A fresh directory for one test's files.
fn scratch(test: &str) -> PathBuf {
    cli::scratch("robust-tests", test)
}

use cli::{json_lines, numbers};

/// The names of the files in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn a_parameter_that_does_not_reach_the_loss_plans_trains_and_keeps_its_value() {
    let dir = scratch("unreachable");
    let (before, after) = (dir.join("p0.safetensors"), dir.join("p3.safetensors"));
    let file = model("unreachable-parameter");
    for device in ["cpu", "cuda"] {
        let (code, out, err) = ingot(&["plan", "--model-file", &file, "--device", device]);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("memory plan"), "{out}");
    }
    exit_stderr(train_file(&file, "0", &["--save", s(&before)]), 0);
    let (code, out, err) = train_file(&file, "3", &["--json", "--save", s(&after)]);
    assert_eq!(code, 0, "{err}");
    let losses: Vec<f64> = numbers(&json_lines(&out), "loss");
    assert_eq!(losses.len(), 3);
    assert!(losses[2] < losses[0], "w trains: {losses:?}");
    let (p0, p3) = (
        ingot_runtime::io::load(&before).unwrap(),
        ingot_runtime::io::load(&after).unwrap(),
    );
    assert_eq!(
        p0["v"], p3["v"],
        "a parameter with no gradient is left as it was"
    );
    assert_ne!(p0["w"], p3["w"]);
}

#[test]
fn a_loss_that_simplifies_to_a_constant_plans_and_trains() {
    let file = model("constant-loss");
    exit_stderr(ingot(&["plan", "--model-file", &file]), 0);
    let (code, out, err) = train_file(&file, "2", &["--json"]);
    assert_eq!(code, 0, "{err}");
    let losses: Vec<f64> = numbers(&json_lines(&out), "loss");
    assert_eq!(losses, [0.0, 0.0]);
}

#[test]
fn a_loss_that_depends_on_no_parameter_is_refused_as_not_requiring_grad() {
    let file = model("loss-without-parameters");
    for cmd in ["plan", "train", "compile"] {
        let mut args = vec![cmd, "--model-file", &file];
        match cmd {
            "train" => args.extend(["--steps", "1"]),
            "compile" => args.extend(["-o", "/dev/null"]),
            _ => {}
        }
        let (code, out, err) = ingot(&args);
        assert_eq!(code, 1, "{cmd}: {out}{err}");
        assert!(
            err.contains(&file)
                && err.contains("depends on no parameter")
                && err.contains("does not require grad"),
            "{cmd}: {err}"
        );
    }
}

#[test]
fn a_step_count_near_u64_max_reserves_nothing_in_proportion_to_it() {
    // The run stops at its first non-finite loss (step 15), long before the count. (A count
    // past 2^53 is refused as it is parsed: cli/src/numbers.rs.)
    for steps in ["9007199254740992", "1000000000000"] {
        let (code, out, err) = train_file(&model("diverges"), steps, &[]);
        assert_eq!(code, 1, "{out}{err}");
        assert!(out.contains("step    14"), "{out}");
        assert!(err.contains("step 15"), "{err}");
    }
    let err = exit_stderr(
        train_file(&model("diverges"), "18446744073709551615", &[]),
        2,
    );
    assert_mentions(&err, &["--steps", "2^53"]);
}

#[test]
fn a_non_finite_loss_stops_training_names_the_step_and_writes_nothing_over_the_weights() {
    let dir = scratch("non_finite");
    let weights = dir.join("w.safetensors");
    let file = model("diverges");
    exit_stderr(train_file(&file, "2", &["--save", s(&weights)]), 0);
    let good = std::fs::read(&weights).unwrap();
    let exe = dir.join("diverges.ingot");
    exit_stderr(ingot(&["compile", "--model-file", &file, "-o", s(&exe)]), 0);
    let train = ["train", "--model-file", &file];
    let run = ["run", s(&exe)];
    for cmd in [&train[..], &run[..]] {
        let mut args = cmd.to_vec();
        args.extend(["--steps", "100", "--json", "--save", s(&weights)]);
        let (code, out, err) = ingot(&args);
        assert_eq!(code, 1, "{cmd:?}: {err}");
        assert!(
            err.contains("step 15")
                && err.contains("non-finite")
                && err.contains("was not written"),
            "{cmd:?}: {err}"
        );
        let lines = json_lines(&out);
        let last_step = &lines[lines.len() - 2];
        assert_eq!(last_step["step"], 15);
        assert_eq!(last_step["non_finite"], true, "{last_step}");
        assert!(lines[..lines.len() - 2]
            .iter()
            .all(|l| l.get("non_finite").is_none()));
        let summary = &lines[lines.len() - 1]["summary"];
        assert_eq!(summary["steps"], 15);
        assert_eq!(summary["non_finite_loss_step"], 15);
        assert_eq!(
            std::fs::read(&weights).unwrap(),
            good,
            "{cmd:?}: the weights are untouched"
        );
        // Without --json: the step's line, then the error.
        args.retain(|a| *a != "--json");
        let (code, out, err) = ingot(&args);
        assert_eq!(code, 1);
        assert!(
            out.contains("step    15") && err.contains("step 15"),
            "{out}{err}"
        );
    }
}

#[test]
fn a_normal_init_with_a_nan_or_negative_std_is_an_error_naming_the_line() {
    let dir = scratch("bad_init");
    for std in ["nan", "-0.35", "inf"] {
        let path = dir.join("m.ir");
        std::fs::write(
            &path,
            format!("ingot-ir 1\n%0 = input \"x\" : f32[2]\n%1 = parameter \"w\" init=normal({std}) : f32[2]\n%2 = mul(%0, %1) : f32[2]\n%3 = reduce_sum(%2) axes=[0] : f32[1]\n%4 = reshape(%3) : f32[]\noutput \"loss\" = %4\n"),
        )
        .unwrap();
        let (code, _, err) = ingot(&["train", "--model-file", s(&path), "--steps", "1"]);
        assert_eq!(code, 1, "{std}: {err}");
        assert!(
            err.contains("line 3") && err.contains("standard deviation"),
            "{std}: {err}"
        );
    }
}

#[test]
fn a_model_too_large_for_the_host_is_refused_before_allocating_naming_its_sizes() {
    let err = exit_stderr(
        ingot(&["train", "--model-file", &model("too-large"), "--steps", "1"]),
        1,
    );
    assert_mentions(&err, &["4000000039168 bytes", "4000000000000 resident"]);
    let gpt = "gpt:vocab=1099511627776,d_model=32,layers=1,heads=2,d_ff=64,seq=8,batch=2";
    let err = exit_stderr(ingot(&["train", "--model", gpt, "--steps", "1"]), 1);
    assert_mentions(&err, &["the plan needs", "resident"]);
}

#[test]
fn a_shape_whose_bytes_overflow_is_an_error_naming_the_line() {
    let dir = scratch("overflow");
    let path = dir.join("m.ir");
    std::fs::write(
        &path,
        "ingot-ir 1\n%0 = parameter \"w\" init=zeros : f32[4294967296,4294967296]\n",
    )
    .unwrap();
    let err = exit_stderr(ingot(&["plan", "--model-file", s(&path)]), 1);
    assert_mentions(&err, &["line 2", "f32[4294967296,4294967296]", "too large"]);
}

#[test]
fn a_model_file_that_never_ends_is_refused_at_the_cap() {
    if !Path::new("/dev/zero").exists() {
        return;
    }
    let err = exit_stderr(ingot(&["plan", "--model-file", "/dev/zero"]), 1);
    assert_mentions(&err, &["/dev/zero", "longer than"]);
}

/// A small offset problem in MiniMalloc's CSV format.
fn dsa_problem(dir: &Path) -> PathBuf {
    let p = dir.join("p.csv");
    std::fs::write(&p, "id,lower,upper,size\n0,0,2,10\n1,1,3,10\n2,2,4,10\n").unwrap();
    p
}

#[test]
fn a_dsa_time_limit_too_large_for_a_duration_saturates_and_a_bad_one_is_refused() {
    let dir = scratch("dsa_time");
    let (input, output) = (dsa_problem(&dir), dir.join("out.csv"));
    // A limit a duration cannot hold runs unbounded (exit 0); one that is no limit is refused (2).
    for (t, want) in [
        ("1e300", 0),
        ("inf", 0),
        ("0", 0),
        ("nan", 2),
        ("-1", 2),
        ("-inf", 2),
    ] {
        let limit = format!("--time-limit={t}");
        let (code, _, err) = ingot(&["dsa", "--input", s(&input), "--output", s(&output), &limit]);
        assert_eq!(code, want, "{t}: {err}");
        if want == 2 {
            assert!(err.contains("--time-limit"), "{err}");
        }
    }
}

#[test]
fn a_dsa_capacity_not_met_says_what_stopped_the_search() {
    let dir = scratch("dsa_stop");
    let (input, output) = (dir.join("hard.csv"), dir.join("out.csv"));
    // LOAD 11, but no packing has a peak below 12 (the solver's own tests prove it).
    std::fs::write(
        &input,
        "id,lower,upper,size\n0,5,6,3\n1,7,8,5\n2,5,7,2\n3,2,6,2\n4,0,4,5\n5,0,2,5\n6,6,8,5\n7,6,8,1\n8,2,7,3\n",
    )
    .unwrap();
    let dsa = [
        "dsa",
        "--input",
        s(&input),
        "--output",
        s(&output),
        "--capacity",
        "11",
    ];
    let err = exit_stderr(ingot(&dsa), 3);
    assert!(err.contains("proved"), "{err}");
    // With no time to search, the message says the time limit stopped it.
    let err = exit_stderr(ingot(&[&dsa[..], &["--time-limit", "0"]].concat()), 3);
    assert_mentions(
        &err,
        &[
            "the time limit of 0.000 s ran out",
            "raise the capacity or the time limit",
        ],
    );
    assert!(
        !output.exists(),
        "nothing is written when the capacity is not met"
    );
}

#[test]
fn every_output_path_is_checked_before_any_work() {
    let dir = scratch("outputs");
    let bad = "/nonexistent-ingot-dir/out";
    let tiny = "docs/examples/tiny-mlp.ir";
    let exe = dir.join("tiny.ingot");
    exit_stderr(ingot(&["compile", "--model-file", tiny, "-o", s(&exe)]), 0);
    let input = dsa_problem(&dir);
    // Three steps of the tiny model, writing `path` with `option`.
    let train = |option, path| vec!["train", "--model-file", tiny, "--steps", "3", option, path];
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("--save", train("--save", bad)),
        ("--save-data", train("--save-data", bad)),
        (
            "--save",
            vec!["run", s(&exe), "--steps", "3", "--save", bad],
        ),
        ("--output", vec!["compile", "--model-file", tiny, "-o", bad]),
        ("--html", vec!["plan", "--model-file", tiny, "--html", bad]),
        ("--svg", vec!["plan", "--model-file", tiny, "--svg", bad]),
        (
            "--output",
            vec!["dsa", "--input", s(&input), "--output", bad],
        ),
        // A directory is not a file to write.
        ("--save", train("--save", s(&dir))),
    ];
    for (option, args) in cases {
        let (code, out, err) = ingot(&args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(
            err.contains(option) && err.contains("cannot write there"),
            "{args:?}: {err}"
        );
        assert!(!out.contains("step "), "no step ran: {out}");
    }
}

#[test]
fn every_file_ingot_writes_is_complete_and_leaves_no_temporary_beside_it() {
    let dir = scratch("atomic");
    let tiny = "docs/examples/tiny-mlp.ir";
    let p = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let input = dsa_problem(&dir);
    // Each target exists already (a good older file): it is replaced whole.
    for name in [
        "w.safetensors",
        "b.safetensors",
        "t.ingot",
        "p.html",
        "p.svg",
        "out.csv",
    ] {
        std::fs::write(dir.join(name), b"old").unwrap();
    }
    let runs: Vec<Vec<String>> = vec![
        vec![
            "train".into(),
            "--model-file".into(),
            tiny.into(),
            "--steps".into(),
            "1".into(),
            "--save".into(),
            p("w.safetensors"),
            "--save-data".into(),
            p("b.safetensors"),
        ],
        vec![
            "compile".into(),
            "--model-file".into(),
            tiny.into(),
            "-o".into(),
            p("t.ingot"),
        ],
        vec![
            "plan".into(),
            "--model-file".into(),
            tiny.into(),
            "--html".into(),
            p("p.html"),
            "--svg".into(),
            p("p.svg"),
        ],
        vec![
            "dsa".into(),
            "--input".into(),
            s(&input).into(),
            "--output".into(),
            p("out.csv"),
        ],
    ];
    for args in runs {
        let (code, _, err) = ingot(&args);
        assert_eq!(code, 0, "{args:?}: {err}");
    }
    assert_eq!(
        listing(&dir),
        [
            "b.safetensors",
            "out.csv",
            "p.csv",
            "p.html",
            "p.svg",
            "t.ingot",
            "w.safetensors"
        ]
    );
    for name in ["w.safetensors", "b.safetensors"] {
        ingot_runtime::io::load(dir.join(name)).unwrap();
    }
    ingot_compiler::exe::Executable::read(dir.join("t.ingot")).unwrap();
    assert!(std::fs::read_to_string(dir.join("p.html"))
        .unwrap()
        .contains("plan-data"));
    assert!(std::fs::read_to_string(dir.join("out.csv"))
        .unwrap()
        .contains("offset"));
}

/// Issue 53: names with terminal escape codes are printed escaped, never raw: in the plan, a
/// run's lines, and an error that names a parameter (here `--init` without it).
#[test]
fn names_holding_escape_sequences_print_escaped_everywhere() {
    let dir = scratch("escape-names");
    let file = model("escape-names");
    let init = dir.join("init.safetensors");
    let mut t = indexmap::IndexMap::new();
    t.insert(
        "other".to_string(),
        ingot_runtime::Tensor::from_f32([4], vec![0.0; 4]),
    );
    ingot_runtime::io::save(&init, &t).unwrap();
    let runs: [&[&str]; 4] = [
        &["plan", "--model-file", &file],
        &["plan", "--model-file", &file, "--json"],
        &["train", "--model-file", &file, "--steps", "2"],
        &[
            "train",
            "--model-file",
            &file,
            "--steps",
            "1",
            "--init",
            init.to_str().unwrap(),
        ],
    ];
    let mut escaped = 0;
    for args in runs {
        let (_, out, err) = ingot(args);
        for text in [&out, &err] {
            for bad in ['\u{1b}', '\u{7}', '\u{9b}'] {
                assert!(
                    !text.contains(bad),
                    "ingot {args:?} printed {bad:?} raw:\n{text}"
                );
            }
            escaped += text.matches("\\u{1b}").count() + text.matches("\\u001b").count();
        }
    }
    assert!(escaped > 0, "no name was printed at all");
}

/// Every file of a directory and its bytes, sorted by name, but the lock file (which holds
/// the pid of the last run that opened the directory).
fn contents(dir: &Path) -> Vec<(String, Vec<u8>)> {
    listing(dir)
        .into_iter()
        .filter(|n| n != "checkpoint.lock")
        .map(|n| {
            let bytes = std::fs::read(dir.join(&n)).unwrap();
            (n, bytes)
        })
        .collect()
}

#[test]
fn an_update_that_makes_a_parameter_non_finite_stops_the_run_at_that_step_naming_it() {
    let dir = scratch("non_finite_update");
    let (weights, ck) = (dir.join("w.safetensors"), dir.join("ck"));
    // Two good steps: a checkpoint at step 2 and the weights saved.
    exit_stderr(
        ingot(&[
            "train",
            "--model",
            "mlp",
            "--steps",
            "2",
            "--checkpoint",
            s(&ck),
            "--save",
            s(&weights),
        ]),
        0,
    );
    let (good, good_ck) = (std::fs::read(&weights).unwrap(), contents(&ck));
    // Resumed with a learning rate of 1e39: step 3's loss is finite, its update is not.
    let exe = dir.join("mlp.ingot");
    exit_stderr(
        ingot(&["compile", "--model", "mlp", "--lr", "1e39", "-o", s(&exe)]),
        0,
    );
    let train = ["train", "--model", "mlp", "--lr", "1e39"];
    let run = ["run", s(&exe)];
    for cmd in [&train[..], &run[..]] {
        let mut args = cmd.to_vec();
        args.extend([
            "--steps",
            "5",
            "--json",
            "--resume",
            s(&ck),
            "--checkpoint",
            s(&ck),
            "--checkpoint-every",
            "1",
            "--save",
            s(&weights),
        ]);
        let (code, out, err) = ingot(&args);
        assert_eq!(code, 1, "{cmd:?}: {err}");
        assert!(
            err.contains("step 3: after its update, parameter \"")
                && err.contains("is not finite")
                && err.contains("was not written")
                && err.contains("the last checkpoint"),
            "{cmd:?}: {err}"
        );
        let lines = json_lines(&out);
        let last_step = &lines[lines.len() - 2];
        assert_eq!(last_step["step"], 3, "{cmd:?}: {out}");
        assert_eq!(last_step["non_finite"], true, "{last_step}");
        assert!(last_step["loss"].as_f64().is_some_and(f64::is_finite));
        assert_eq!(lines[lines.len() - 1]["summary"]["steps"], 1);
        assert!(
            std::fs::read(&weights).unwrap() == good,
            "{cmd:?}: --save untouched"
        );
        let now = contents(&ck);
        assert!(
            now == good_ck,
            "{cmd:?}: the checkpoint is untouched: {:?}",
            now.iter().map(|f| &f.0).collect::<Vec<_>>()
        );
    }
    // From the start, as the command: stopped at step 1, nothing written.
    let fresh = dir.join("fresh.safetensors");
    let err = exit_stderr(
        ingot(&[
            "train",
            "--model",
            "mlp",
            "--steps",
            "3",
            "--lr",
            "1e39",
            "--save",
            s(&fresh),
        ]),
        1,
    );
    assert!(err.contains("step 1: after its update, parameter"), "{err}");
    assert!(!fresh.exists());
}

#[test]
fn a_parameter_made_infinite_by_the_gradient_of_sqrt_at_zero_stops_the_run_at_step_one() {
    let dir = scratch("sqrt_at_zero");
    let weights = dir.join("w.safetensors");
    let file = model("sqrt-at-zero");
    let (code, out, err) = train_file(&file, "3", &["--json", "--save", s(&weights)]);
    assert_eq!(code, 1, "{err}");
    assert_mentions(
        &err,
        &[
            "step 1: after its update, parameter \"w\" is not finite",
            "4 of its 4 elements",
        ],
    );
    let lines = json_lines(&out);
    assert_eq!(lines[0]["step"], 1);
    assert_eq!(lines[0]["loss"], 0.0, "the loss at w = 0 is finite");
    assert_eq!(lines[0]["non_finite"], true);
    assert!(!weights.exists());
    // --skip-nonfinite goes on past it, says so, and still writes no non-finite weights.
    let err = exit_stderr(
        train_file(&file, "2", &["--skip-nonfinite", "--save", s(&weights)]),
        1,
    );
    assert_mentions(
        &err,
        &["step 1: after its update", "--skip-nonfinite: going on"],
    );
    assert!(!weights.exists());
}
