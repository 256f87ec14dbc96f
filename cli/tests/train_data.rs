//! Training runs over a data set (issue 18): `ingot train --dataset` over epochs, checkpoints
//! and resume, non-finite losses, and the data set kind told from the file.

use indexmap::IndexMap;
use ingot_runtime::io;
use ingot_runtime::Tensor;
use ingot_testkit::text::assert_mentions;
use ingot_trainer::checkpoint;
use ingot_trainer::datasets::{dataset_kind, DatasetKind};
use std::path::{Path, PathBuf};

/// A byte-level GPT (vocabulary 256) small enough for a CPU test.
const BYTE_GPT: &str = "gpt:vocab=256,d_model=32,layers=1,heads=2,d_ff=64,seq=32,batch=8";

#[path = "support/cli.rs"]
mod cli;
use cli::{failed, ingot, numbers, ok, train_on};

fn scratch(test: &str) -> PathBuf {
    cli::scratch("train-data-tests", test)
}

/// A text of a few thousand bytes from a small vocabulary of words (deterministic), written as
/// byte-level tokens with `ingot data bytes`.
fn byte_tokens(dir: &Path) -> PathBuf {
    let words = [
        "the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "park",
    ];
    let mut state = 12345u64;
    let mut text = String::new();
    for _ in 0..1500 {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        text.push_str(words[(state >> 33) as usize % words.len()]);
        text.push(' ');
    }
    // 5000 tokens: 156 rows of 32 + 1, 19 whole batches of 8, and tokens left over.
    text.truncate(5000);
    cli::byte_tokens_of(dir, &text)
}

use cli::{json_lines, step_losses};

/// Runs `ingot train --model BYTE_GPT --dataset bin` with `more` flags.
fn train_gpt(bin: impl AsRef<Path>, more: &[&str]) -> std::process::Output {
    train_on(BYTE_GPT, bin, more)
}

#[test]
fn a_byte_level_gpt_trains_two_epochs_over_a_generated_text_and_its_loss_falls() {
    let d = scratch("two-epochs");
    let bin = byte_tokens(&d);
    let out = train_gpt(&bin, &["--epochs", "2", "--order", "sequential", "--json"]);
    let lines = json_lines(&ok(&out));
    let steps: Vec<&serde_json::Value> = lines.iter().filter(|v| v.get("loss").is_some()).collect();
    // Rows of 32 + 1 tokens overlapping by one, 8 rows a batch.
    let tokens = std::fs::metadata(&bin).unwrap().len() as usize / 2;
    let per_epoch = (tokens - 1) / 32 / 8;
    assert!(per_epoch >= 10, "{tokens} tokens");
    assert_eq!(steps.len(), 2 * per_epoch, "two epochs of whole batches");
    for (i, v) in steps.iter().enumerate() {
        assert_eq!(v["step"].as_u64(), Some(i as u64 + 1));
        assert_eq!(v["epoch"].as_u64(), Some((i / per_epoch) as u64), "{v}");
        assert!(v["tokens_per_s"].as_f64().unwrap() > 0.0, "{v}");
    }
    let ends: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|v| v.get("epoch_end").is_some())
        .collect();
    assert_eq!(ends.len(), 2, "one line per finished epoch");
    let (m0, m1) = (
        ends[0]["mean_loss"].as_f64().unwrap(),
        ends[1]["mean_loss"].as_f64().unwrap(),
    );
    assert!(
        m1 < m0 - 0.3,
        "the second epoch's mean loss {m1} is well below the first's {m0}"
    );
    let first = steps[0]["loss"].as_f64().unwrap();
    assert!(
        (first - 256f64.ln()).abs() < 0.3,
        "starts near ln 256: {first}"
    );
    assert!(lines.last().unwrap().get("summary").is_some());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("a partial batch is dropped").count(),
        1,
        "the dropped partial batch is said once: {stderr}"
    );
}

fn run_losses(args: &[&str]) -> Vec<(u64, f64)> {
    step_losses(&json_lines(&ok(&ingot(args))))
}

/// The losses of a run cut in two (`first`, then `second` resumed from its checkpoint) are the
/// uninterrupted run's, step by step and bit for bit, `steps` of them.
fn assert_resumed_as_straight(
    straight: &[(u64, f64)],
    first: Vec<(u64, f64)>,
    second: Vec<(u64, f64)>,
    steps: usize,
) {
    let resumed: Vec<(u64, f64)> = first.into_iter().chain(second).collect();
    assert_eq!(resumed.len(), steps);
    for ((s, a), (r, b)) in straight.iter().zip(&resumed) {
        assert_eq!(s, r);
        assert_eq!(
            a.to_bits(),
            b.to_bits(),
            "step {s}: {a} straight, {b} resumed"
        );
    }
}

#[test]
fn a_resumed_run_reproduces_the_uninterrupted_runs_losses_bit_for_bit() {
    let d = scratch("resume");
    let bin = byte_tokens(&d);
    let ck = d.join("ck");
    let (bin, ck) = (bin.to_str().unwrap(), ck.to_str().unwrap());
    // 40 steps cross an epoch boundary in the resumed half; shuffled offsets.
    let base = ["train", "--model", BYTE_GPT, "--dataset", bin, "--json"];
    let straight = run_losses(&[&base[..], &["--steps", "40"]].concat());
    assert_eq!(straight.len(), 40);
    let first = run_losses(
        &[
            &base[..],
            &[
                "--steps",
                "20",
                "--checkpoint",
                ck,
                "--checkpoint-every",
                "7",
            ],
        ]
        .concat(),
    );
    let record: checkpoint::CheckpointInfo =
        serde_json::from_slice(&std::fs::read(Path::new(ck).join("checkpoint.json")).unwrap())
            .unwrap();
    assert_eq!(record.step, 20, "the run's end wrote the last checkpoint");
    let p = record.position.unwrap();
    assert_eq!(
        p.epoch * 19 + p.batch,
        20,
        "the next batch is the 21st: {p:?}"
    );
    let mut files: Vec<String> = std::fs::read_dir(ck)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "checkpoint.json",
            "checkpoint.lock",
            "optimizer-00000020.safetensors",
            "weights-00000020.safetensors"
        ],
        "older checkpoints' files are removed"
    );
    let second = run_losses(&[&base[..], &["--steps", "40", "--resume", ck]].concat());
    assert_resumed_as_straight(&straight, first, second, 40);
}

/// A run of 12 steps with a cosine schedule, warmup and clipping dies at step 8 (its
/// checkpoint cannot be written there: a directory stands where the file goes), leaving the
/// checkpoint of step 4. Resumed without `--schedule`, `--warmup` or `--clip-grad-norm`, it
/// goes on with the checkpoint's (it used to go on at the full rate, unclipped), and its
/// losses are the uninterrupted run's bit for bit. Resumed with another schedule, it applies
/// it and says what changed.
#[test]
fn a_resumed_run_without_its_schedule_flags_continues_on_the_checkpoints_schedule() {
    let d = scratch("resume-schedule");
    let bin = byte_tokens(&d);
    let ck = d.join("ck");
    let (bin, cks) = (bin.to_str().unwrap(), ck.to_str().unwrap());
    let base = [
        "train",
        "--model",
        BYTE_GPT,
        "--dataset",
        bin,
        "--json",
        "--steps",
        "12",
    ];
    let scheduled = [
        "--schedule",
        "cosine",
        "--warmup",
        "2",
        "--min-lr-ratio",
        "0.1",
        "--clip-grad-norm",
        "0.5",
    ];
    let straight = run_losses(&[&base[..], &scheduled].concat());
    assert_eq!(straight.len(), 12);
    std::fs::create_dir_all(ck.join("weights-00000008.safetensors")).unwrap();
    let out = ingot(
        &[
            &base[..],
            &scheduled,
            &["--checkpoint", cks, "--checkpoint-every", "4"],
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(1), "the save at step 8 fails");
    let first: Vec<(u64, f64)> = step_losses(&json_lines(&String::from_utf8_lossy(&out.stdout)))
        .into_iter()
        .take(4)
        .collect();
    let record = checkpoint::read_info(&ck).unwrap();
    assert_eq!(record.step, 4, "the checkpoint of step 4 is what is left");
    assert_eq!(record.clip_grad_norm, Some(Some(0.5)), "{record:?}");
    let out = ingot(&[&base[..], &["--resume", cks]].concat());
    let second = step_losses(&json_lines(&ok(&out)));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!e.contains("resuming with"), "nothing changed: {e}");
    assert_resumed_as_straight(&straight, first, second, 12);
    // Another schedule is applied, and said with the checkpoint's.
    let out = ingot(&[&base[..], &["--resume", cks, "--schedule", "linear"]].concat());
    let relinear = step_losses(&json_lines(&ok(&out)));
    assert_ne!(
        relinear[1].1.to_bits(),
        straight[5].1.to_bits(),
        "{relinear:?}"
    );
    let e = String::from_utf8_lossy(&out.stderr);
    assert_mentions(
        &e,
        &[
            "resuming with schedule linear (warmup 2, down to 0.1 of the rate at step 12)",
            "where the checkpoint's run used schedule cosine",
        ],
    );
    // `--no-clip-grad-norm` turns the checkpoint's clipping off, and says so.
    let out = ingot(&[&base[..], &["--resume", cks, "--no-clip-grad-norm"]].concat());
    let unclipped = step_losses(&json_lines(&ok(&out)));
    assert_ne!(
        unclipped[1].1.to_bits(),
        straight[5].1.to_bits(),
        "step 5's update unclipped: {unclipped:?}"
    );
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains(
            "resuming with no gradient clipping where the checkpoint's run used --clip-grad-norm 0.5"
        ),
        "{e}"
    );
    let out = ingot(
        &[
            &base[..],
            &[
                "--resume",
                cks,
                "--no-clip-grad-norm",
                "--clip-grad-norm",
                "1",
            ],
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(2), "both: a usage error");
}

/// A record's clipping tells "none" (`null`) from "not known" (absent, as in checkpoints
/// written before it was recorded), and what a resumed run trains with is each flag given,
/// else the checkpoint's, else the default.
#[test]
fn a_resumed_runs_settings_are_the_flags_given_else_the_checkpoints() {
    use ingot_trainer::checkpoint::{GivenTraining, Training};
    use ingot_trainer::schedule::{Decay, Schedule};
    let d = scratch("record-clip");
    let bin = byte_tokens(&d);
    let ck = d.join("ck");
    ok(&train_gpt(
        &bin,
        &["--steps", "1", "--checkpoint", ck.to_str().unwrap()],
    ));
    let text = std::fs::read_to_string(ck.join("checkpoint.json")).unwrap();
    let mut info: checkpoint::CheckpointInfo = serde_json::from_str(&text).unwrap();
    assert_eq!(info.clip_grad_norm, Some(None), "recorded as none: {text}");
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v.as_object_mut().unwrap().remove("clip_grad_norm");
    let old: checkpoint::CheckpointInfo = serde_json::from_value(v).unwrap();
    assert_eq!(old.clip_grad_norm, None, "not known");
    info.schedule = Some(Schedule {
        decay: Decay::Cosine,
        warmup: 3,
        total: 10,
        min_ratio: 0.25,
    });
    info.clip_grad_norm = Some(Some(2.0));
    let none = GivenTraining::default();
    let want = Training {
        decay: Decay::Cosine,
        warmup: 3,
        min_lr_ratio: 0.25,
        clip_grad_norm: Some(2.0),
    };
    assert_eq!(none.or_resumed(Some(&info)), want);
    assert_eq!(none.or_resumed(None), Training::default());
    let given = GivenTraining {
        decay: Some(Decay::Linear),
        clip_grad_norm: Some(Some(1.0)),
        ..GivenTraining::default()
    };
    assert_eq!(
        given.or_resumed(Some(&info)),
        Training {
            decay: Decay::Linear,
            clip_grad_norm: Some(1.0),
            ..want
        }
    );
    // `--no-clip-grad-norm`: off, whatever the checkpoint clipped at.
    let off = GivenTraining {
        clip_grad_norm: Some(None),
        ..GivenTraining::default()
    };
    assert_eq!(
        off.or_resumed(Some(&info)),
        Training {
            clip_grad_norm: None,
            ..want
        }
    );
}

#[test]
fn a_resumed_bf16_run_rebuilds_its_weight_copies_and_reproduces_the_uninterrupted_run() {
    // A bf16 step keeps bf16 copies of its weights, which checkpoints leave out: the resumed
    // run makes them again from the parameters it loads, or its losses would differ.
    let d = scratch("resume-bf16");
    let bin = byte_tokens(&d);
    let ck = d.join("ck");
    let (bin, ck) = (bin.to_str().unwrap(), ck.to_str().unwrap());
    let base = [
        "train",
        "--model",
        BYTE_GPT,
        "--precision",
        "bf16",
        "--dataset",
        bin,
        "--json",
    ];
    let straight = run_losses(&[&base[..], &["--steps", "12"]].concat());
    let first = run_losses(&[&base[..], &["--steps", "6", "--checkpoint", ck]].concat());
    let second = run_losses(&[&base[..], &["--steps", "12", "--resume", ck]].concat());
    assert_resumed_as_straight(&straight, first, second, 12);
}

#[test]
fn resuming_with_another_model_or_data_set_is_an_error_naming_both() {
    let d = scratch("resume-mismatch");
    let bin = byte_tokens(&d);
    // Another data set: the same text without its first token.
    let other = d.join("other.bin");
    std::fs::write(&other, &std::fs::read(&bin).unwrap()[2..]).unwrap();
    let ck = d.join("ck");
    let (bin, other, ck) = (
        bin.to_str().unwrap(),
        other.to_str().unwrap(),
        ck.to_str().unwrap(),
    );
    ok(&train_gpt(bin, &["--steps", "2", "--checkpoint", ck]));
    let smaller = "gpt:vocab=256,d_model=32,layers=1,heads=2,d_ff=64,seq=16,batch=8";
    let out = train_on(smaller, bin, &["--steps", "4", "--resume", ck]);
    let e = failed(&out, 1);
    assert!(e.contains(BYTE_GPT) && e.contains(smaller), "{e}");
    let out = train_on(BYTE_GPT, other, &["--steps", "4", "--resume", ck]);
    let e = failed(&out, 1);
    assert_mentions(&e, &["text.bin", "other.bin"]);
    let nowhere = d.join("nowhere");
    let out = train_gpt(bin, &["--steps", "4", "--resume", cli::s(&nowhere)]);
    assert!(failed(&out, 1).contains("checkpoint.json"));
}

#[test]
fn a_save_cut_short_leaves_the_previous_checkpoint_readable() {
    let d = scratch("crash");
    let bin = byte_tokens(&d);
    let ck = d.join("ck");
    ok(&train_gpt(
        &bin,
        &["--steps", "3", "--checkpoint", ck.to_str().unwrap()],
    ));
    let before = checkpoint::load(&ck).unwrap();
    // What a crash midway through the next save leaves: a tensor file, or half of one, and a
    // temporary file, but the record still names the step-3 files.
    std::fs::write(ck.join("weights-00000006.safetensors"), b"\x10\x00\x00").unwrap();
    std::fs::write(ck.join(".checkpoint.json.tmp"), b"{\"format\":").unwrap();
    let after = checkpoint::load(&ck).unwrap();
    assert_eq!(after.info, before.info);
    assert_eq!(after.info.step, 3);
    assert_eq!(after.parameters.len(), before.parameters.len());
    assert!(
        after.optimizer_state.contains_key("step"),
        "AdamW's step counter is saved"
    );
    assert!(after
        .optimizer_state
        .keys()
        .any(|k| k.ends_with(".exp_avg_sq")));
}

#[test]
fn a_non_finite_loss_stops_the_run_naming_the_step_unless_skipped() {
    let d = scratch("non-finite");
    let bin = byte_tokens(&d);
    let init = d.join("init.safetensors");
    let ck = d.join("ck");
    let bin = bin.to_str().unwrap();
    ok(&ingot(&[
        "train",
        "--model",
        BYTE_GPT,
        "--steps",
        "0",
        "--save",
        init.to_str().unwrap(),
    ]));
    let mut params = io::load(&init).unwrap();
    let (name, t) = params
        .iter()
        .next()
        .map(|(n, t)| (n.clone(), t.clone()))
        .unwrap();
    let mut data = t.data.clone();
    if let ingot_runtime::Data::F32(v) = &mut data {
        v.iter_mut().for_each(|x| *x = f32::INFINITY);
    }
    params.insert(name, Tensor { ty: t.ty, data });
    let bad = d.join("bad.safetensors");
    io::save(&bad, &params).unwrap();
    let bad = bad.to_str().unwrap();
    let out = train_gpt(
        bin,
        &[
            "--steps",
            "3",
            "--init",
            bad,
            "--checkpoint",
            ck.to_str().unwrap(),
        ],
    );
    let e = failed(&out, 1);
    assert!(e.contains("step 1: the loss is"), "{e}");
    assert!(
        !ck.join("checkpoint.json").exists(),
        "no checkpoint of a broken run"
    );
    let out = train_gpt(
        bin,
        &["--steps", "3", "--init", bad, "--skip-nonfinite", "--json"],
    );
    let lines = json_lines(&ok(&out));
    assert_eq!(
        step_losses(&lines).len(),
        3,
        "the run goes on past the step"
    );
    assert!(lines[0]["non_finite"].as_bool() == Some(true));
    let e = String::from_utf8_lossy(&out.stderr);
    assert_mentions(&e, &["step 1: the loss is", "--skip-nonfinite"]);
}

#[test]
fn a_run_over_a_data_set_needs_epochs_or_steps() {
    let d = scratch("bounds");
    let bin = byte_tokens(&d);
    let out = train_gpt(&bin, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--epochs N or --steps N"));
    let out = ingot(&["train", "--model", BYTE_GPT]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_sample_set_is_told_from_a_token_stream_by_its_contents() {
    let d = scratch("kind");
    let mut t = IndexMap::new();
    t.insert("x".to_string(), Tensor::from_f32([2, 3], vec![0.0; 6]));
    t.insert("y".to_string(), Tensor::from_f32([2], vec![0.0; 2]));
    let st = d.join("samples.safetensors");
    io::save(&st, &t).unwrap();
    assert_eq!(dataset_kind(&st).unwrap(), DatasetKind::Samples);
    assert_eq!(
        dataset_kind(&d).unwrap(),
        DatasetKind::Samples,
        "a directory of .npy"
    );
    // Byte tokens whose 9th byte is '{' stay tokens: their length field is far too large.
    let tokens: Vec<u8> = b"abcd{xyz"
        .iter()
        .flat_map(|&b| (b as u16).to_le_bytes())
        .collect();
    let tb = d.join("t.bin");
    std::fs::write(&tb, &tokens).unwrap();
    assert_eq!(tokens[8], b'{');
    assert_eq!(dataset_kind(&tb).unwrap(), DatasetKind::Tokens);
    assert!(dataset_kind(&d.join("missing")).is_err());
    // Tokens 4, 0, 0, 0 then '{': a length that fits the file and a brace, but no JSON header
    // behind them: still tokens.
    let lookalike: Vec<u8> = [4u16, 0, 0, 0, b'{' as u16, b'a' as u16, 7, 9, 11, 13]
        .iter()
        .flat_map(|t| t.to_le_bytes())
        .collect();
    let la = d.join("lookalike.bin");
    std::fs::write(&la, &lookalike).unwrap();
    assert_eq!(lookalike[8], b'{');
    assert_eq!(dataset_kind(&la).unwrap(), DatasetKind::Tokens);
    // A FIFO is refused at once, not opened (with no writer, opening it waits forever).
    #[cfg(unix)]
    {
        let fifo = d.join("fifo");
        if std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .is_ok_and(|s| s.success())
        {
            let e = dataset_kind(&fifo).unwrap_err().to_string();
            assert!(e.contains("not a regular file"), "{e}");
        }
    }
}

/// Issue 53: raw uint16 tokens whose first bytes are a valid safetensors header (tokens 2, 0,
/// 0, 0 are the length 2, token 32123 the bytes `{}`) are taken for a sample set; the error
/// says so and names the flag, and `--dataset-format raw` reads the same file as tokens.
#[test]
fn a_token_file_that_reads_as_safetensors_says_so_and_trains_when_read_as_raw() {
    let d = scratch("format-lookalike");
    let gpt = "gpt:vocab=32768,d_model=8,layers=1,heads=1,d_ff=16,seq=8,batch=2";
    let mut tokens: Vec<u16> = vec![2, 0, 0, 0, u16::from_le_bytes(*b"{}")];
    tokens.extend((0..200u16).map(|i| i * 7 % 1000));
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    let bin = d.join("train.bin");
    std::fs::write(&bin, &bytes).unwrap();
    assert_eq!(dataset_kind(&bin).unwrap(), DatasetKind::Samples);
    let run = |extra: &[&str]| {
        let mut args = vec![
            "train",
            "--model",
            gpt,
            "--dataset",
            bin.to_str().unwrap(),
            "--steps",
            "1",
        ];
        args.extend_from_slice(extra);
        ingot(&args)
    };
    let out = run(&[]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{e}");
    assert_mentions(
        &e,
        &[
            "was taken for a safetensors file of samples x and y by its first bytes",
            "--dataset-format raw",
        ],
    );
    ok(&run(&["--dataset-format", "raw"]));
    // Forced to a format it is not, the file is refused saying what is missing.
    let e = String::from_utf8_lossy(&run(&["--dataset-format", "llmc"]).stderr).into_owned();
    assert!(e.contains("does not begin with magic"), "{e}");
}

/// A quadratic loss `sum((p - x)^2)` over one parameter vector, as an IR file with an
/// `optimizer` line.
fn quadratic(optimizer_line: &str) -> ingot_compiler::model::Model {
    let text = format!(
        "ingot-ir 1\n{optimizer_line}\n\
         %0 = parameter \"p\" init=normal(1.0) : f32[3]\n\
         %1 = input \"x\" : f32[3]\n\
         %2 = input \"y\" : f32[3]\n\
         %3 = sub(%0, %1) : f32[3]\n\
         %4 = mul(%3, %3) : f32[3]\n\
         %5 = reduce_sum(%4) axes=[0] : f32[1]\n\
         %6 = reshape(%5) : f32[]\n\
         output \"loss\" = %6\n"
    );
    ingot_compiler::model::Model::from_ir_text("quadratic.ir", &text).unwrap()
}

#[test]
fn sgd_with_momentum_and_weight_decay_follows_torchs_update_rule() {
    let (lr, mu, wd) = (0.05, 0.9, 0.01);
    let model = quadratic(&format!(
        "optimizer momentum lr={lr} momentum={mu} weight_decay={wd}"
    ));
    let mut s = ingot_trainer::session::Session::new(&model, 3).unwrap();
    assert!(s.optimizer_state().contains_key("p.momentum_buffer"));
    let as_f64 = |t: &Tensor| match &t.data {
        ingot_runtime::Data::F32(v) => v.iter().map(|&x| x as f64).collect::<Vec<f64>>(),
        _ => panic!("f32"),
    };
    let mut p = as_f64(&s.parameters()["p"]);
    let x = as_f64(&s.batch()["x"]);
    let mut buf = [0.0; 3];
    for step in 0..8 {
        // torch.optim.SGD: d = g + wd p; buf = mu buf + d; p -= lr buf.
        let want: f64 = p.iter().zip(&x).map(|(p, x)| (p - x) * (p - x)).sum();
        let got = s.step().unwrap().loss;
        assert!(
            (got - want).abs() <= 1e-5 * want.max(1.0),
            "step {step}: {got} vs {want}"
        );
        for i in 0..3 {
            let d = 2.0 * (p[i] - x[i]) + wd * p[i];
            buf[i] = mu * buf[i] + d;
            p[i] -= lr * buf[i];
        }
    }
}

#[test]
fn the_command_line_chooses_the_optimizer_of_any_model() {
    let d = scratch("optimizer-flags");
    let ir = d.join("q.ir");
    let text = "ingot-ir 1\n\
         %0 = parameter \"p\" init=normal(1.0) : f32[3]\n\
         %1 = input \"x\" : f32[3]\n\
         %2 = input \"y\" : f32[3]\n\
         %3 = sub(%0, %1) : f32[3]\n\
         %4 = mul(%3, %3) : f32[3]\n\
         %5 = reduce_sum(%4) axes=[0] : f32[1]\n\
         %6 = reshape(%5) : f32[]\n\
         output \"loss\" = %6\n";
    std::fs::write(&ir, text).unwrap();
    let ir = ir.to_str().unwrap();
    let ck = d.join("ck");
    let ck = ck.to_str().unwrap();
    ok(&ingot(&[
        "train",
        "--model-file",
        ir,
        "--steps",
        "3",
        "--optimizer",
        "adamw",
        "--lr",
        "0.01",
        "--betas",
        "0.8,0.9",
        "--checkpoint",
        ck,
    ]));
    let c = checkpoint::load(Path::new(ck)).unwrap();
    assert!(
        c.optimizer_state.contains_key("p.exp_avg"),
        "a file model trains with AdamW"
    );
    assert_eq!(c.optimizer_state.len(), 3, "exp_avg, exp_avg_sq, step");
    let out = ingot(&[
        "train", "--model", "mlp", "--steps", "1", "--betas", "0.9,0.99",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("adamw"));
    let out = ingot(&["train", "--model-file", ir, "--steps", "1", "--lr=-1"]);
    let err = failed(&out, 2);
    assert_mentions(&err, &["--lr", "not a finite number above 0"]);
    // Different learning rates give different losses after the first step.
    let l = |lr: &str| {
        run_losses(&[
            "train", "--model", "mlp", "--steps", "2", "--lr", lr, "--json",
        ])
    };
    let (a, b) = (l("0.1"), l("0.01"));
    assert_eq!(a[0].1.to_bits(), b[0].1.to_bits());
    assert_ne!(a[1].1.to_bits(), b[1].1.to_bits());
}

fn f64s(t: &Tensor) -> Vec<f64> {
    match &t.data {
        ingot_runtime::Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
        _ => panic!("f32"),
    }
}

/// A session of `model` compiled with `step` options.
fn session_with(
    model: &ingot_compiler::model::Model,
    step: ingot_compiler::autodiff::StepOptions,
) -> ingot_trainer::session::Session {
    let c = ingot_compiler::pipeline::compile_observed_with(
        model,
        &step,
        &ingot_trainer::session::Session::cpu_options(),
        &mut |_| {},
    )
    .unwrap();
    let exe = c.executable(ingot_compiler::lower::Target::Cpu).unwrap();
    ingot_trainer::session::Session::from_executable(exe, 3, Default::default()).unwrap()
}

#[test]
fn clipping_by_the_global_norm_follows_torchs_clip_grad_norm() {
    let (lr, max) = (0.1, 0.5);
    let model = quadratic(&format!("optimizer sgd lr={lr}"));
    let mut s = session_with(
        &model,
        ingot_compiler::autodiff::StepOptions {
            lr_scale: false,
            clip_grad_norm: Some(max),
            ..Default::default()
        },
    );
    let mut p = f64s(&s.parameters()["p"]);
    let x = f64s(&s.batch()["x"]);
    for step in 0..6 {
        let g: Vec<f64> = p.iter().zip(&x).map(|(p, x)| 2.0 * (p - x)).collect();
        let norm = g.iter().map(|v| v * v).sum::<f64>().sqrt();
        s.step().unwrap();
        let got = s.last_grad_norm().expect("the norm is an output");
        assert!(
            (got - norm).abs() <= 1e-5 * norm,
            "step {step}: norm {got} vs {norm}"
        );
        let coef = (max / (norm + 1e-6)).min(1.0);
        for i in 0..3 {
            p[i] -= lr * coef * g[i];
        }
        let now = f64s(&s.parameters()["p"]);
        for i in 0..3 {
            assert!(
                (now[i] - p[i]).abs() < 1e-5,
                "step {step}: p {now:?} vs {p:?}"
            );
        }
    }
}

#[test]
fn the_learning_rate_input_scales_the_update_and_one_step_serves_a_schedule() {
    let model = quadratic("optimizer sgd lr=0.1");
    let opts = ingot_compiler::autodiff::StepOptions {
        lr_scale: true,
        clip_grad_norm: None,
        ..Default::default()
    };
    let mut s = session_with(&model, opts);
    assert!(s.has_lr_scale());
    assert!(!s.batch().contains_key("lr_scale"), "not part of the batch");
    let x = f64s(&s.batch()["x"]);
    for factor in [1.0, 0.5, 0.0, 0.25] {
        let p = f64s(&s.parameters()["p"]);
        s.set_lr_scale(factor).unwrap();
        s.step().unwrap();
        let now = f64s(&s.parameters()["p"]);
        for i in 0..3 {
            let want = p[i] - 0.1 * factor * 2.0 * (p[i] - x[i]);
            assert!((now[i] - want).abs() < 1e-6, "factor {factor}: {now:?}");
        }
    }
}

#[test]
fn a_schedule_held_at_one_trains_bit_identically_to_the_plain_step() {
    let base = [
        "train",
        "--model",
        "gpt:vocab=32,d_model=16,layers=1,heads=2,d_ff=32,seq=8,batch=2",
        "--steps",
        "4",
        "--json",
    ];
    let plain = run_losses(&base);
    let held = run_losses(&[&base[..], &["--schedule", "linear", "--min-lr-ratio", "1"]].concat());
    assert_eq!(plain.len(), 4);
    for (a, b) in plain.iter().zip(&held) {
        assert_eq!(a.1.to_bits(), b.1.to_bits(), "step {}", a.0);
    }
    let warm = run_losses(&[&base[..], &["--warmup", "2"]].concat());
    assert_eq!(warm[0].1.to_bits(), plain[0].1.to_bits());
    assert_ne!(
        warm[1].1.to_bits(),
        plain[1].1.to_bits(),
        "a smaller first update"
    );
}

#[test]
fn ingot_run_drives_a_schedule_only_through_a_step_compiled_with_the_input() {
    let d = scratch("run-schedule");
    let (with, without) = (d.join("with.ingot"), d.join("without.ingot"));
    let m = "gpt:vocab=32,d_model=16,layers=1,heads=2,d_ff=32,seq=8,batch=2";
    ok(&ingot(&[
        "compile",
        "--model",
        m,
        "-o",
        without.to_str().unwrap(),
    ]));
    ok(&ingot(&[
        "compile",
        "--model",
        m,
        "--lr-scale-input",
        "-o",
        with.to_str().unwrap(),
    ]));
    let sched = ["--steps", "3", "--schedule", "cosine", "--json"];
    let out = ingot(&[&["run", without.to_str().unwrap()][..], &sched].concat());
    assert!(failed(&out, 1).contains("--lr-scale-input"));
    let lines = json_lines(&ok(&ingot(
        &[&["run", with.to_str().unwrap()][..], &sched].concat(),
    )));
    let scales: Vec<f64> = numbers(&lines, "lr_scale");
    assert_eq!(scales, vec![1.0, 0.5, 0.0]);
}

#[test]
fn the_validation_loss_is_evaluated_each_epoch_and_falls() {
    let d = scratch("val");
    let bin = byte_tokens(&d);
    let out = train_gpt(
        &bin,
        &[
            "--epochs",
            "2",
            "--val",
            bin.to_str().unwrap(),
            "--eval-batches",
            "3",
            "--json",
        ],
    );
    let lines = json_lines(&ok(&out));
    let evals: Vec<(u64, f64)> = lines
        .iter()
        .filter(|v| v.get("val_loss").is_some())
        .map(|v| {
            (
                v["eval_step"].as_u64().unwrap(),
                v["val_loss"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(evals.len(), 2, "one per epoch end: {evals:?}");
    assert!(evals[1].1 < evals[0].1 - 0.2, "{evals:?}");
    let exe = d.join("step.ingot");
    ok(&ingot(&[
        "compile",
        "--model",
        BYTE_GPT,
        "-o",
        exe.to_str().unwrap(),
    ]));
    let (exe, bin) = (exe.to_str().unwrap(), bin.to_str().unwrap());
    let out = ingot(&["run", exe, "--steps", "1", "--dataset", bin, "--val", bin]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "a step executable has no forward-only step"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("ingot train"));
}

#[test]
fn an_evaluation_is_the_training_steps_loss_on_the_same_batch_and_changes_nothing() {
    use ingot_trainer::data::{BatchSource, Order};
    let d = scratch("eval-equal");
    let bin = byte_tokens(&d);
    let model = ingot_models::by_name(BYTE_GPT).unwrap();
    let opts = ingot_trainer::session::Session::cpu_options();
    let exe = ingot_compiler::pipeline::compile(&model, &opts)
        .unwrap()
        .executable(ingot_compiler::lower::Target::Cpu)
        .unwrap();
    let mut train =
        ingot_trainer::eval::session_with_eval(&model, exe, &opts, 5, Default::default()).unwrap();
    let mut eval = ingot_trainer::eval::Evaluator::new(&train, &bin, 1, 5).unwrap();
    let before = train.parameters();
    let v = eval.evaluate(&mut train).unwrap();
    assert_eq!(
        train.parameters(),
        before,
        "evaluation leaves the parameters as they are"
    );
    // The same first in-order batch through the training step: its loss (before its update).
    let mut src =
        ingot_trainer::datasets::open_dataset(&bin, train.graph(), Order::Sequential, 5).unwrap();
    let (mut x, mut y) = (vec![0u8; src.x().bytes()], vec![0u8; src.y().bytes()]);
    src.fill(0, 0, &mut x, &mut y).unwrap();
    let slots = train.input_slots().unwrap();
    let l = train.step_on(&slots, &x, &y).unwrap().loss;
    assert!((v - l).abs() <= 1e-5 * l, "eval {v} vs training step {l}");
}

#[test]
fn a_run_writes_its_report_page_with_the_loss_and_validation_curves() {
    let d = scratch("report");
    let bin = byte_tokens(&d);
    let page = d.join("run.html");
    let bin = bin.to_str().unwrap();
    ok(&train_gpt(
        bin,
        &[
            "--steps",
            "6",
            "--val",
            bin,
            "--eval-every",
            "3",
            "--eval-batches",
            "2",
            "--report",
            page.to_str().unwrap(),
        ],
    ));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("validation loss") && html.contains("training loss"));
    assert_eq!(
        html.matches("<polyline").count(),
        4,
        "train, val, planned memory, the host memory measured at each step"
    );
    assert!(html.contains("measured on the host"));
    assert!(html.contains(BYTE_GPT));
    let out = ingot(&[
        "train",
        "--model",
        BYTE_GPT,
        "--steps",
        "1",
        "--report",
        d.join("no/such/dir/run.html").to_str().unwrap(),
    ]);
    assert!(failed(&out, 1).contains("--report"));
}

#[test]
fn a_data_set_is_recognised_on_resume_by_its_contents_not_the_path_typed() {
    let d = scratch("resume-same-data");
    let bin = byte_tokens(&d);
    let copy = d.join("copy.bin");
    std::fs::copy(&bin, &copy).unwrap();
    let ck = d.join("ck");
    let ckp = ck.to_str().unwrap();
    ok(&train_gpt(&bin, &["--steps", "4", "--checkpoint", ckp]));
    // Resuming from the checkpoint at step 4 to 6 steps (no new checkpoint written).
    let again = |data: &str, more: &[&str]| {
        let mut args = vec![
            "train",
            "--model",
            BYTE_GPT,
            "--dataset",
            data,
            "--steps",
            "6",
            "--resume",
            ckp,
        ];
        args.extend_from_slice(more);
        ingot(&args)
    };
    let dotted = format!("{}/./text.bin", d.display());
    ok(&again(&dotted, &[]));
    ok(&again(copy.to_str().unwrap(), &[]));
    // Another learning rate is a logged override; another optimizer an error naming both.
    let out = again(bin.to_str().unwrap(), &["--lr", "0.0001"]);
    ok(&out);
    let e = String::from_utf8_lossy(&out.stderr);
    assert_mentions(&e, &["lr=0.0001", "resuming with"]);
    let out = again(bin.to_str().unwrap(), &["--optimizer", "sgd"]);
    let e = failed(&out, 1);
    assert_mentions(&e, &["sgd", "adamw"]);
}

/// `n` images `[n, c, side, side]` (f32 in [0, 1), deterministic) and their class ids `[n]`
/// (i64 in `0..10`), written as `x.npy` and `y.npy` in `dir`.
fn image_samples(dir: &Path, n: usize, c: usize, side: usize) {
    use ingot_trainer::data::npy::encode;
    let mut state = 99u64;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    let x: Vec<u8> = (0..n * c * side * side)
        .flat_map(|_| next().to_le_bytes())
        .collect();
    let y: Vec<u8> = (0..n as i64).flat_map(|i| (i % 10).to_le_bytes()).collect();
    std::fs::write(dir.join("x.npy"), encode("<f4", &[n, c, side, side], &x)).unwrap();
    std::fs::write(dir.join("y.npy"), encode("<i8", &[n], &y)).unwrap();
}

/// `ingot train --model cnn|resnet18 --val` on the CPU: the validation runs the forward pass
/// traced in evaluation mode (resnet18's batch norms by their running statistics) in the
/// training step's allocation, and reports a finite loss.
#[test]
fn a_cnn_and_a_resnet18_train_with_validation_on_the_cpu() {
    for (model, c, side) in [("cnn", 1, 28), ("resnet18", 3, 32)] {
        let d = scratch(&format!("{model}-val"));
        image_samples(&d, 128, c, side);
        let dir = d.to_str().unwrap();
        let out = train_on(
            model,
            dir,
            &[
                "--val",
                dir,
                "--steps",
                "2",
                "--eval-every",
                "2",
                "--eval-batches",
                "1",
                "--lr",
                "0.01",
                "--json",
            ],
        );
        let lines = json_lines(&ok(&out));
        let vals: Vec<f64> = numbers(&lines, "val_loss");
        assert!(!vals.is_empty(), "{model}: no validation line: {lines:?}");
        assert!(
            vals.iter().all(|l| l.is_finite() && *l > 0.0),
            "{model}: {vals:?}"
        );
    }
}

/// `ingot train --precision bf16 --val` on a classifier: the validation step reads the
/// weights through their bf16 copies (its f32 weights are not in its graph), and the class
/// count of the labels is read off those copies; it used to fail at start with "the model has
/// no output layer to read the class count off".
#[test]
fn a_bf16_classifier_validates_reading_its_class_count_off_the_weight_copies() {
    for (model, c, side) in [
        ("cnn:batch=8", 1, 28),
        ("resnet:depth=18,side=32,batch=2,classes=10,width=8", 3, 32),
    ] {
        let d = scratch(&format!("bf16-val-{}", &model[..3]));
        image_samples(&d, 8, c, side);
        let dir = d.to_str().unwrap();
        let out = ingot(&[
            "train",
            "--model",
            model,
            "--precision",
            "bf16",
            "--dataset",
            dir,
            "--val",
            dir,
            "--steps",
            "1",
            "--eval-batches",
            "1",
            "--json",
        ]);
        let lines = json_lines(&ok(&out));
        let vals: Vec<f64> = numbers(&lines, "val_loss");
        assert!(
            !vals.is_empty() && vals.iter().all(|l| l.is_finite() && *l > 0.0),
            "{model}: {lines:?}"
        );
    }
}

/// `ingot train --model resnet18` over uint8 NHWC images (`[n, 32, 32, 3]`, the layout of
/// CIFAR-10's arrays as NumPy holds them): read as NCHW floats in [0, 1], and the loss is that
/// of a near-uniform classifier at the start.
#[test]
fn resnet18_trains_on_uint8_nhwc_images() {
    use ingot_trainer::data::npy::encode;
    let d = scratch("resnet-nhwc");
    let n = 128;
    let x: Vec<u8> = (0..n * 32 * 32 * 3).map(|i| (i * 7 % 256) as u8).collect();
    let y: Vec<u8> = (0..n as i64).flat_map(|i| (i % 10).to_le_bytes()).collect();
    std::fs::write(d.join("x.npy"), encode("|u1", &[n, 32, 32, 3], &x)).unwrap();
    std::fs::write(d.join("y.npy"), encode("<i8", &[n], &y)).unwrap();
    let out = train_on("resnet18", &d, &["--steps", "1", "--json"]);
    let losses = step_losses(&json_lines(&ok(&out)));
    assert_eq!(losses.len(), 1);
    assert!(
        losses[0].1.is_finite() && (losses[0].1 - 10f64.ln()).abs() < 1.5,
        "{losses:?}"
    );
    // A 4-D array in neither layout is refused before any step, naming the file.
    std::fs::write(d.join("x.npy"), encode("|u1", &[n, 32, 3, 32], &x)).unwrap();
    let out = train_on("resnet18", &d, &["--steps", "1"]);
    assert_ne!(out.status.code(), Some(0));
    let e = String::from_utf8_lossy(&out.stderr);
    assert_mentions(&e, &["x.npy", "NHWC"]);
}

/// A model file with dropout: `ingot train` writes the step's seed from `--seed` and the step
/// number, so a run resumed from a checkpoint draws the uninterrupted run's masks (the same
/// losses, bit for bit), and another seed draws others.
#[test]
fn a_run_with_dropout_resumes_bit_for_bit_and_another_seed_draws_other_masks() {
    let d = scratch("dropout-resume");
    let ir = d.join("q.ir");
    std::fs::write(&ir, ingot_testkit::ir_text::dropout_model(64, "0.5", 1)).unwrap();
    let ir = ir.to_str().unwrap();
    let ck = d.join("ck");
    let ck = ck.to_str().unwrap();
    let base = ["train", "--model-file", ir, "--json"];
    let whole = run_losses(&[&base[..], &["--steps", "4"]].concat());
    assert_eq!(whole.len(), 4);
    run_losses(&[&base[..], &["--steps", "2", "--checkpoint", ck]].concat());
    let resumed = run_losses(&[&base[..], &["--steps", "4", "--resume", ck]].concat());
    assert_eq!(resumed, whole[2..], "resumed steps 3 and 4");
    // Another run seed: another initialisation and other masks, other losses.
    let other = run_losses(&[&base[..], &["--steps", "4", "--seed", "1"]].concat());
    assert_ne!(other, whole);
}
