//! Step executables from the command line, run as a user would: `ingot compile` writes one,
//! `ingot run` trains it exactly as `ingot train` trains the model, `ingot inspect` shows what
//! `ingot plan` shows, and a damaged file is an error naming it, never a panic.

use ingot_testkit::text::assert_mentions;
use std::path::PathBuf;

const TINY_GPT: &str = "gpt:vocab=64,d_model=32,layers=2,heads=4,d_ff=64,seq=8,batch=2";

#[path = "support/cli.rs"]
mod cli;
use cli::{exit_stderr, run as ingot, s};

/// Runs ingot and expects success; returns stdout.
fn ok<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(args: &[S]) -> String {
    let (code, out, err) = ingot(args);
    assert_eq!(code, 0, "ingot {args:?} failed: {err}");
    out
}

/// A fresh directory for one test's files.
fn scratch(test: &str) -> PathBuf {
    cli::scratch("exe-tests", test)
}

/// The losses of `--json` step lines.
fn losses(json_lines: &str) -> Vec<f64> {
    json_lines
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter_map(|v| v.get("loss").and_then(|l| l.as_f64()))
        .collect()
}

/// The loss column of the text step lines (everything but the timings).
fn text_losses(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.starts_with("step "))
        .map(|l| l.split_whitespace().take(4).collect::<Vec<_>>().join(" "))
        .collect()
}

#[test]
fn compile_then_run_gives_the_same_losses_and_parameters_as_train() {
    let dir = scratch("same_losses");
    for (i, model) in [TINY_GPT, "mlp"].into_iter().enumerate() {
        let exe = dir.join(format!("step{i}.ingot"));
        let (trained, ran) = (dir.join(format!("t{i}.st")), dir.join(format!("r{i}.st")));
        ok(&["compile", "--model", model, "-o", s(&exe)]);
        // The same flags for both, the file saved last.
        let flags = ["--steps", "3", "--seed", "7", "--json", "--save"];
        let train = ok(&[&["train", "--model", model][..], &flags, &[s(&trained)]].concat());
        let run = ok(&[&["run", s(&exe)][..], &flags, &[s(&ran)]].concat());
        let (a, b) = (losses(&train), losses(&run));
        assert_eq!(a.len(), 3, "{model}: {train}");
        assert_eq!(
            a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "{model}: train {a:?}, run {b:?}"
        );
        assert_eq!(
            std::fs::read(&trained).unwrap(),
            std::fs::read(&ran).unwrap(),
            "{model}: the parameters after the steps differ"
        );
        // The text output is the same too, timings aside.
        let train = ok(&["train", "--model", model, "--steps", "2"]);
        let run = ok(&["run", s(&exe), "--steps", "2"]);
        assert_eq!(train.lines().next(), run.lines().next(), "{run}");
        assert_eq!(text_losses(&train), text_losses(&run));
        assert_eq!(text_losses(&run).len(), 2, "{run}");
    }
}

#[test]
fn inspect_prints_the_report_plan_prints_for_both_targets() {
    let dir = scratch("inspect");
    for device in ["cpu", "cuda"] {
        let exe = dir.join(format!("{device}.ingot"));
        compile(TINY_GPT, device, &exe);
        let plan = ok(&["plan", "--model", TINY_GPT, "--device", device]);
        // `plan` prints the table, then a line each about rewriting and fusion.
        let table: String = plan
            .lines()
            .take_while(|l| !l.starts_with("rewrite:"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(table.starts_with("memory plan for") && table.contains("in-place ops"));
        let shown = ok(&["inspect", s(&exe)]);
        assert!(
            shown.ends_with(&table),
            "{device}: inspect:\n{shown}\nplan:\n{table}"
        );
        let header = &shown[..shown.len() - table.len()];
        for part in [
            "format version 4",
            &format!("target   {device}"),
            TINY_GPT,
            "launches per step",
            "planned in one allocation",
            if device == "cpu" {
                "instructions and"
            } else {
                "cuBLAS GEMMs"
            },
        ] {
            assert!(header.contains(part), "{device}: {part:?} in\n{header}");
        }
        // --check lowers the stored graph and plan again and finds the same program.
        let checked = ok(&["inspect", s(&exe), "--check"]);
        assert!(
            checked.contains("the stored program is what this ingot lowers"),
            "{device}: {checked}"
        );

        let plan: serde_json::Value = serde_json::from_str(&ok(&[
            "plan", "--model", TINY_GPT, "--device", device, "--json",
        ]))
        .unwrap();
        let doc: serde_json::Value =
            serde_json::from_str(&ok(&["inspect", s(&exe), "--json"])).unwrap();
        assert_eq!(doc["report"], plan, "{device}");
        assert_eq!(doc["format_version"], ingot_compiler::exe::VERSION);
        assert_eq!(
            doc["constants"],
            serde_json::json!([]),
            "a built-in model has none"
        );
        assert_eq!(doc["target"], device);
        let kernels = doc["kernels"].as_array().unwrap();
        assert_eq!(kernels.is_empty(), device == "cpu", "{device}: {kernels:?}");
        for k in kernels {
            // Each kernel carries the launch shape its source's header comment states.
            let threads: u64 = (0..3).map(|d| k["block"][d].as_u64().unwrap()).product();
            assert!((1..=1024).contains(&threads), "{k}");
            assert!(k["grid"][0].as_u64().unwrap() >= 1, "{k}");
        }
        let layouts = doc["layouts"].as_array().unwrap();
        assert!(layouts
            .iter()
            .any(|l| l["name"] == "x" && l["kind"] == "input"));
    }
}

#[test]
fn the_same_model_compiles_to_byte_identical_files() {
    let dir = scratch("deterministic");
    for device in ["cpu", "cuda"] {
        let (a, b) = (
            dir.join(format!("a-{device}")),
            dir.join(format!("b-{device}")),
        );
        for f in [&a, &b] {
            compile(TINY_GPT, device, f);
        }
        let (a, b) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        assert!(a.starts_with(b"INGOTEXE"));
        assert!(a == b, "{device}: two compiles differ");
    }
}

/// Each damage, and a word its message must contain.
fn damaged(good: &[u8]) -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let mut flipped = good.to_vec();
    let mid = 28 + (good.len() - 28) / 2;
    flipped[mid] ^= 0x20;
    let mut magic = good.to_vec();
    magic[..8].copy_from_slice(b"PK\x03\x04abcd");
    let mut version = good.to_vec();
    version[8..12].copy_from_slice(&7u32.to_le_bytes());
    vec![
        ("truncated", good[..good.len() - 100].to_vec(), "truncated"),
        ("header", good[..20].to_vec(), "truncated"),
        ("flipped", flipped, "corrupted"),
        ("magic", magic, "not an Ingot step executable"),
        ("version", version, "version 7"),
        ("empty", Vec::new(), "empty"),
    ]
}

#[test]
fn a_damaged_file_is_an_error_naming_the_file_and_the_damage() {
    let dir = scratch("damaged");
    let good = dir.join("good.ingot");
    ok(&["compile", "--model", "mlp", "-o", s(&good)]);
    let bytes = std::fs::read(&good).unwrap();
    for (name, content, says) in damaged(&bytes) {
        let path = dir.join(format!("{name}.ingot"));
        std::fs::write(&path, content).unwrap();
        for args in [
            vec!["run", s(&path), "--steps", "1"],
            vec!["inspect", s(&path)],
        ] {
            let (code, out, err) = ingot(&args);
            assert_eq!(code, 1, "{name} {args:?}: {err}");
            assert!(out.is_empty(), "{name}: {out}");
            assert!(
                err.contains(s(&path)),
                "{name}: the message names the file: {err}"
            );
            assert!(err.contains(says), "{name}: {says:?} in {err}");
            assert!(!err.contains("panicked"), "{name}: {err}");
        }
    }
    let (_, _, err) = ingot(&["inspect", s(&dir.join("version.ingot"))]);
    assert_mentions(&err, &["reads version 4", "recompile"]);
    let err = exit_stderr(ingot(&["inspect", s(&dir.join("missing.ingot"))]), 1);
    assert_mentions(&err, &["missing.ingot", "cannot read"]);
}

/// `ingot compile` of `model` for `device` into `path` (for `cuda` too: planning and CUDA C
/// generation need no GPU).
fn compile(model: &str, device: &str, path: &std::path::Path) {
    ok(&[
        "compile",
        "--model",
        model,
        "--device",
        device,
        "-o",
        s(path),
    ]);
}

#[test]
fn a_file_runs_only_on_the_target_it_was_planned_for() {
    let dir = scratch("targets");
    let (cpu, cuda) = (dir.join("cpu.ingot"), dir.join("cuda.ingot"));
    ok(&["compile", "--model", "mlp", "-o", s(&cpu)]);
    compile("mlp", "cuda", &cuda);
    for (file, device, planned) in [(&cpu, "cuda", "cpu"), (&cuda, "cpu", "cuda")] {
        let err = exit_stderr(
            ingot(&["run", s(file), "--steps", "1", "--device", device]),
            1,
        );
        assert!(
            err.contains(s(file))
                && err.contains(&format!("planned for {planned}"))
                && err.contains(&format!("--device {device}"))
                && err.contains("recompile"),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn running_a_cuda_file_without_a_gpu_is_the_usual_clear_error() {
    if ingot_runtime::cuda::available().is_ok() {
        eprintln!("skipping: this machine has a GPU");
        return;
    }
    let dir = scratch("no_gpu");
    let cuda = dir.join("cuda.ingot");
    compile("mlp", "cuda", &cuda);
    for args in [
        vec!["run", s(&cuda), "--steps", "1"],
        vec!["run", s(&cuda), "--steps", "1", "--device", "cuda"],
    ] {
        let err = exit_stderr(ingot(&args), 1);
        assert_mentions(&err, &["CUDA", "--device cpu"]);
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn a_bf16_executable_runs_as_bf16_training_does_and_keeps_its_precision() {
    let dir = scratch("bf16");
    let exe = dir.join("step.ingot");
    let compiled = ok(&[
        "compile",
        "--model",
        TINY_GPT,
        "--precision",
        "bf16",
        "-o",
        s(&exe),
    ]);
    assert!(compiled.contains("in bf16"), "{compiled}");
    let args = |cmd: &str| -> Vec<String> {
        let mut v: Vec<String> = vec![cmd.into()];
        if cmd == "train" {
            v.extend([
                "--model".into(),
                TINY_GPT.into(),
                "--precision".into(),
                "bf16".into(),
            ]);
        } else {
            v.push(s(&exe).into());
        }
        v.extend(["--steps", "3", "--seed", "3", "--json"].map(String::from));
        v
    };
    let (train, run) = (ok(&args("train")), ok(&args("run")));
    let (a, b) = (losses(&train), losses(&run));
    assert_eq!(a.len(), 3, "{train}");
    assert_eq!(
        a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        b.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    // The same weights in f32 give other losses (bf16 rounds), close to them.
    let f32 = losses(&ok(&[
        "train", "--model", TINY_GPT, "--steps", "3", "--seed", "3", "--json",
    ]));
    assert!(a
        .iter()
        .zip(&f32)
        .all(|(x, y)| x != y && (x - y).abs() < 1e-2 * y.abs()));
    let shown = ok(&["inspect", s(&exe)]);
    assert_mentions(&shown, &["memory plan for", " in bf16 "]);
    // The precision is the compile's: run cannot change it.
    let err = exit_stderr(
        ingot(&["run", s(&exe), "--steps", "1", "--precision", "f32"]),
        1,
    );
    assert_mentions(&err, &["compiled in bf16, not f32", "recompile"]);
    // tf32 is a GPU mode.
    let err = exit_stderr(
        ingot(&["train", "--model", "mlp", "--steps", "1", "--tf32"]),
        2,
    );
    assert!(err.contains("tf32 applies to matmuls on the GPU"), "{err}");
}
