//! Using what was trained (issue 50): `ingot eval` and `ingot predict` over a data set by a
//! forward-only planned step, checked against the CPU interpreter on the same weights;
//! `train --steps 0 --val` evaluating; `ingot generate` repeating under a seed; and the errors
//! (weights of another model, a data set of another shape, an --out that exists or is an input).

use indexmap::IndexMap;
use ingot_runtime::tensor::Tensor;
use ingot_testkit::text::assert_mentions;
use std::path::{Path, PathBuf};

#[path = "support/cli.rs"]
mod cli;
use cli::{exit_stderr, ingot, json_lines, ok, run, s, train_on};

const N: usize = 256;

/// `N` samples for the mlp (`[N, 784]` f32, deterministic) and labels in `0..10`, as x.npy and
/// y.npy in `dir`.
fn mlp_samples(dir: &Path) -> (Vec<f32>, Vec<i64>) {
    use ingot_trainer::data::npy::encode;
    let mut state = 7u64;
    let x: Vec<f32> = (0..N * 784)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect();
    let y: Vec<i64> = (0..N as i64).map(|i| (i * 3) % 10).collect();
    let xb: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let yb: Vec<u8> = y.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(dir.join("x.npy"), encode("<f4", &[N, 784], &xb)).unwrap();
    std::fs::write(dir.join("y.npy"), encode("<i8", &[N], &yb)).unwrap();
    (x, y)
}

/// Trains the mlp for a few steps on the samples and saves its weights: `dir/w.safetensors`.
fn trained_mlp(dir: &Path, data: &Path) -> PathBuf {
    let w = dir.join("w.safetensors");
    ok(&train_on(
        "mlp",
        s(data),
        &["--steps", "3", "--save", s(&w), "--threads", "1"],
    ));
    w
}

/// The GPT the generate tests train: small enough for a few CPU steps, a window of 16 tokens.
const SMALL_GPT: &str = "gpt:vocab=256,d_model=16,layers=1,heads=2,d_ff=32,seq=16,batch=4";

/// Trains [`SMALL_GPT`] for `steps` steps on 600 letter tokens written in `dir`, its weights
/// kept at `at` by `keep` (`--checkpoint` for a checkpoint folder, `--save` for a weights file).
fn train_small_gpt(dir: &Path, steps: &str, keep: &str, at: &Path) {
    let text = cli::letter_tokens(dir, 600);
    ok(&train_on(
        SMALL_GPT,
        &text,
        &["--steps", steps, keep, s(at), "--threads", "1"],
    ));
}

/// The reference: the interpreter runs the mlp's forward graph at batch `N` on the weights;
/// the logits are read off through `trace::logits`.
fn reference_logits(w: &Path, x: &[f32], y: &[i64]) -> (Vec<f32>, f64) {
    let m = ingot_models::at_batch("mlp", N, ingot_compiler::ir::DType::F32).unwrap();
    let g = ingot_compiler::trace::logits::with_logits(&m.graph).unwrap();
    let mut leaves: IndexMap<String, Tensor> = ingot_runtime::io::load(w).unwrap();
    leaves.insert("x".into(), Tensor::from_f32([N, 784], x.to_vec()));
    leaves.insert("y".into(), Tensor::from_i64([N], y.to_vec()));
    let out = ingot_runtime::cpu::interp::run_graph(&g, &leaves).unwrap();
    let loss = out.outputs["loss"].scalar_f64().unwrap();
    (out.outputs["logits"].as_f32().unwrap().to_vec(), loss)
}

fn argmax(row: &[f32]) -> usize {
    (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b })
}

#[test]
fn eval_and_predict_give_the_references_loss_accuracy_and_classes() {
    let d = cli::scratch("infer", "eval_predict");
    let data = d.join("set");
    std::fs::create_dir_all(&data).unwrap();
    let (x, y) = mlp_samples(&data);
    let w = trained_mlp(&d, &data);
    let (logits, loss) = reference_logits(&w, &x, &y);
    let rows: Vec<&[f32]> = logits.chunks(10).collect();
    let top1 = (0..N).filter(|&i| argmax(rows[i]) == y[i] as usize).count() as f64 / N as f64;

    // Batches of 64 cover the 256 samples: the mean of their losses is the whole set's.
    let common = [
        "--model",
        "mlp",
        "--init",
        s(&w),
        "--dataset",
        s(&data),
        "--batch-size",
        "64",
    ];
    let out = ok(&ingot(
        &[&["eval"][..], &common, &["--json", "--threads", "1"]].concat(),
    ));
    let v = &json_lines(&out)[0];
    assert_eq!(v["samples"], N);
    assert!(
        (v["loss"].as_f64().unwrap() - loss).abs() < 1e-4,
        "{v} vs {loss}"
    );
    assert!(
        (v["top1"].as_f64().unwrap() - top1).abs() < 1e-9,
        "{v} vs {top1}"
    );
    assert!(v["top5"].as_f64().unwrap() >= top1);

    let csv = d.join("predictions.csv");
    ok(&ingot(
        &[&["predict"][..], &common, &["--out", s(&csv)]].concat(),
    ));
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("index,predicted,probability,label"));
    let body: Vec<Vec<String>> = lines
        .map(|l| l.split(',').map(String::from).collect())
        .collect();
    assert_eq!(body.len(), N);
    for (i, r) in body.iter().enumerate() {
        let row = rows[i];
        let best = argmax(row);
        let total: f64 = row.iter().map(|&l| ((l - row[best]) as f64).exp()).sum();
        assert_eq!(r[0], i.to_string());
        assert_eq!(r[1], best.to_string(), "sample {i}");
        assert!(
            (r[2].parse::<f64>().unwrap() - 1.0 / total).abs() < 1e-5,
            "sample {i}: {r:?}"
        );
        assert_eq!(r[3], y[i].to_string());
    }

    // An --out that exists is refused without --force; an input file even with it.
    let e = exit_stderr(
        run(&[&["predict"][..], &common, &["--out", s(&csv)]].concat()),
        2,
    );
    assert_mentions(&e, &["exists", "--force"]);
    let e = exit_stderr(
        run(&[&["predict"][..], &common, &["--out", s(&w), "--force"]].concat()),
        2,
    );
    assert!(e.contains("same file as --init"), "{e}");
}

/// `eval` and `predict` given only `--checkpoint DIR` run the model the checkpoint's record
/// names, as `--model` would; a record that names none, or names what cannot be loaded, is an
/// error saying what to give.
#[test]
fn eval_and_predict_without_a_model_run_the_one_the_checkpoint_records() {
    let d = cli::scratch("infer", "recorded_model");
    let data = d.join("set");
    std::fs::create_dir_all(&data).unwrap();
    mlp_samples(&data);
    let ck = d.join("ck");
    ok(&train_on(
        "mlp",
        &data,
        &["--steps", "2", "--checkpoint", s(&ck), "--threads", "1"],
    ));
    let common = ["--dataset", s(&data), "--json", "--threads", "1"];
    let recorded = ok(&ingot(
        &[&["eval", "--checkpoint", s(&ck)][..], &common].concat(),
    ));
    let named = ok(&ingot(
        &[
            &["eval", "--model", "mlp", "--checkpoint", s(&ck)][..],
            &common,
        ]
        .concat(),
    ));
    assert_eq!(recorded, named);
    assert_eq!(json_lines(&recorded)[0]["samples"], N);
    let csv = d.join("p.csv");
    ok(&ingot(&[
        "predict",
        "--checkpoint",
        s(&ck),
        "--dataset",
        s(&data),
        "--out",
        s(&csv),
    ]));
    assert_eq!(
        std::fs::read_to_string(&csv).unwrap().lines().count(),
        N + 1
    );

    // Without --checkpoint, a model is still needed.
    let e = exit_stderr(run(&["eval", "--init", s(&csv), "--dataset", s(&data)]), 2);
    assert!(e.contains("--model"), "{e}");

    let record = ck.join("checkpoint.json");
    let text = std::fs::read_to_string(&record).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    for (model, says) in [
        ("", "does not record the model it trained: give --model NAME, --model-file PATH or --onnx MODEL.onnx"),
        ("no-such-model", "records the model \"no-such-model\", which is neither a model name nor a model file found from here"),
    ] {
        v["model"] = model.into();
        std::fs::write(&record, v.to_string()).unwrap();
        let e = exit_stderr(run(&[&["eval", "--checkpoint", s(&ck)][..], &common].concat()), 2);
        assert!(e.contains(says), "{e}");
    }
}

#[test]
fn train_with_no_steps_evaluates_the_given_weights() {
    let d = cli::scratch("infer", "steps0");
    let data = d.join("set");
    std::fs::create_dir_all(&data).unwrap();
    mlp_samples(&data);
    let out = ok(&train_on(
        "mlp",
        &data,
        &[
            "--val",
            s(&data),
            "--steps",
            "0",
            "--json",
            "--threads",
            "1",
            "--eval-batches",
            "1",
        ],
    ));
    let lines = json_lines(&out);
    assert!(
        lines.iter().any(|v| v
            .get("val_loss")
            .and_then(|l| l.as_f64())
            .is_some_and(f64::is_finite)),
        "{lines:?}"
    );
}

#[test]
fn weights_of_another_model_and_data_of_another_shape_are_refused_naming_them() {
    let d = cli::scratch("infer", "errors");
    let data = d.join("set");
    std::fs::create_dir_all(&data).unwrap();
    mlp_samples(&data);
    let text = cli::letter_tokens(&d, 600);
    let gpt = "gpt:vocab=256,d_model=16,layers=1,heads=2,d_ff=32,seq=8,batch=2";
    let ckpt = d.join("ckpt");
    ok(&train_on(
        gpt,
        &text,
        &["--steps", "1", "--checkpoint", s(&ckpt), "--threads", "1"],
    ));
    // The checkpoint over the mlp's samples, evaluated as `model`.
    let eval = |model: &str| {
        let from = [
            "--checkpoint",
            s(&ckpt),
            "--dataset",
            s(&data),
            "--threads",
            "1",
        ];
        exit_stderr(run(&[&["eval", "--model", model][..], &from].concat()), 1)
    };
    let e = eval("mlp");
    assert_mentions(&e, &["written by a run of gpt:", "mlp"]);
    // The gpt's own weights over the mlp's samples: the data set's shape is named.
    let e = eval(gpt);
    assert!(e.contains("--dataset"), "{e}");
}

#[test]
fn generate_continues_a_prompt_and_repeats_under_a_seed() {
    let d = cli::scratch("infer", "generate");
    let ckpt = d.join("ckpt");
    train_small_gpt(&d, "5", "--checkpoint", &ckpt);
    let args = [
        "generate",
        "--checkpoint",
        s(&ckpt),
        "--prompt",
        "abc",
        "--tokens",
        "24",
        "--seed",
        "5",
        "--top-k",
        "8",
        "--json",
        "--threads",
        "1",
    ];
    let a = json_lines(&ok(&ingot(&args)));
    let b = json_lines(&ok(&ingot(&args)));
    assert_eq!(a, b);
    assert_eq!(a[0]["tokens"].as_array().unwrap().len(), 24);
    let e = exit_stderr(
        run(&[
            "generate",
            "--init",
            s(&ckpt.join("weights.safetensors")),
            "--prompt",
            "a",
            "--tokens",
            "1",
        ]),
        2,
    );
    assert!(e.contains("--model"), "{e}");
}

#[test]
fn generate_by_the_kv_cache_prints_its_plan_first_and_the_whole_windows_greedy_text() {
    let d = cli::scratch("infer", "generate_cached");
    let weights = d.join("w.safetensors");
    train_small_gpt(&d, "20", "--save", &weights);
    // 40 greedy tokens after a 3-token prompt: the 16-token window slides 4 times.
    let generate = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            SMALL_GPT,
            "--init",
            s(&weights),
            "--prompt",
            "abc",
            "--tokens",
            "40",
            "--temperature",
            "0",
            "--threads",
            "1",
            "--json",
        ];
        args.extend_from_slice(extra);
        let (code, out, err) = run(&args);
        assert_eq!(code, 0, "{err}");
        (json_lines(&out).remove(0), err)
    };
    let (cached, err) = generate(&[]);
    let (whole, whole_err) = generate(&["--whole-window"]);
    assert_eq!(cached["tokens"], whole["tokens"]);
    assert_eq!(cached["tokens"].as_array().unwrap().len(), 40);
    assert_eq!(
        (cached["cached"].as_bool(), whole["cached"].as_bool()),
        (Some(true), Some(false))
    );
    let planned = err.find("the decode step of").expect(&err);
    let rate = err.find("40 tokens in").expect(&err);
    assert!(
        planned < rate,
        "the plan is printed after the tokens: {err}"
    );
    assert_mentions(&err, &["(KV cache ", "in f32"]);
    assert!(
        whole_err.contains("the whole-window step of"),
        "{whole_err}"
    );
    let (bf16, err) = generate(&["--precision", "bf16"]);
    assert!(err.contains("in bf16"), "{err}");
    assert_eq!(bf16["tokens"].as_array().unwrap().len(), 40);
}
