//! Training on the CPU end to end: safetensors files, seeded initialisation, the `Session`, and
//! the `ingot train` command.

use indexmap::IndexMap;
use ingot_compiler::ir::DType;
use ingot_models::{by_name, mlp_with};
use ingot_runtime::io::{self, IoError};
use ingot_runtime::Tensor;
use ingot_testkit::text::assert_mentions;
use ingot_trainer::session::{Session, SessionError};
use std::path::PathBuf;

#[path = "support/cli.rs"]
mod cli;
use cli::{ingot, ok};

const TINY_GPT: &str = "gpt:vocab=32,d_model=16,layers=1,heads=2,d_ff=32,seq=8,batch=2";

/// A fresh directory for one test's files.
fn scratch(test: &str) -> PathBuf {
    cli::scratch("train-tests", test)
}

fn bits(t: &Tensor) -> (Vec<usize>, DType, Vec<u8>) {
    (t.dims().to_vec(), t.dtype(), t.to_le_bytes())
}

#[test]
fn a_safetensors_file_round_trips_every_dtype_bit_exactly() {
    let dir = scratch("round_trip");
    let mut m = IndexMap::new();
    m.insert(
        "w".to_string(),
        Tensor::from_f32([2, 2], vec![1.5, -0.0, f32::NAN, f32::from_bits(1)]),
    );
    m.insert(
        "d".to_string(),
        Tensor::from_f64([2], vec![f64::MAX, -f64::from_bits(3)]),
    );
    m.insert(
        "i".to_string(),
        Tensor::from_i32([3], vec![i32::MIN, 0, i32::MAX]),
    );
    m.insert(
        "l".to_string(),
        Tensor::from_i64([1, 2], vec![i64::MIN, i64::MAX]),
    );
    m.insert(
        "b".to_string(),
        Tensor::from_bool([3], vec![true, false, true]),
    );
    m.insert("step".to_string(), Tensor::scalar(3.0f64));
    let path = dir.join("all.safetensors");
    io::save(&path, &m).unwrap();
    let back = io::load(&path).unwrap();
    assert_eq!(back.len(), m.len());
    for (name, t) in &m {
        assert_eq!(bits(&back[name]), bits(t), "{name}");
    }
}

#[test]
fn a_truncated_or_corrupt_file_is_an_error_naming_the_file() {
    let dir = scratch("corrupt");
    let mut m = IndexMap::new();
    m.insert("w".to_string(), Tensor::from_f32([4], vec![1.0; 4]));
    let good = dir.join("good.safetensors");
    io::save(&good, &m).unwrap();
    let bytes = std::fs::read(&good).unwrap();

    let truncated = dir.join("truncated.safetensors");
    std::fs::write(&truncated, &bytes[..bytes.len() - 3]).unwrap();
    let e = io::load(&truncated).unwrap_err();
    assert!(matches!(e, IoError::Corrupt { .. }), "{e}");
    assert!(e.to_string().contains("truncated.safetensors"), "{e}");

    let corrupt = dir.join("corrupt.safetensors");
    let mut junk = bytes.clone();
    junk[8] = b'#'; // the header's opening brace
    std::fs::write(&corrupt, &junk).unwrap();
    let e = io::load(&corrupt).unwrap_err().to_string();
    assert!(e.contains("corrupt.safetensors"), "{e}");

    let e = io::load(dir.join("absent.safetensors"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("absent.safetensors"), "{e}");
}

fn tiny_mlp_session(seed: u64) -> Session {
    Session::new(&mlp_with(8, DType::F32).unwrap(), seed).unwrap()
}

#[test]
fn loading_parameters_without_one_is_an_error_naming_it() {
    let mut s = tiny_mlp_session(0);
    let mut p = s.parameters();
    p.shift_remove("fc2.bias");
    let e = s.load_parameters(&p).unwrap_err();
    assert!(matches!(e, SessionError::MissingParameter { .. }), "{e}");
    assert!(e.to_string().contains("fc2.bias"), "{e}");
}

#[test]
fn loading_a_parameter_of_the_wrong_shape_is_an_error_naming_it_and_both_shapes() {
    let mut s = tiny_mlp_session(0);
    let mut p = s.parameters();
    p.insert(
        "fc3.weight".into(),
        Tensor::zeros(ingot_compiler::ir::TensorType::new([1024, 10], DType::F32)),
    );
    let e = s.load_parameters(&p).unwrap_err().to_string();
    for want in ["fc3.weight", "f32[1024,10]", "f32[10,1024]"] {
        assert!(e.contains(want), "{want} missing from: {e}");
    }
    // A wrong dtype too.
    let mut p = s.parameters();
    p.insert("fc1.bias".into(), Tensor::from_f64([1024], vec![0.0; 1024]));
    let e = s.load_parameters(&p).unwrap_err().to_string();
    assert_mentions(&e, &["fc1.bias", "f64"]);
}

#[test]
fn loading_unknown_names_is_an_error_listing_them_and_changes_nothing() {
    let mut s = tiny_mlp_session(0);
    let before = s.parameters();
    let mut p = tiny_mlp_session(1).parameters();
    p.insert("fc4.weight".into(), Tensor::scalar(1.0f32));
    p.insert("transformer.h.0.attn.bias".into(), Tensor::scalar(1.0f32));
    let e = s.load_parameters(&p).unwrap_err().to_string();
    assert_mentions(&e, &["fc4.weight", "transformer.h.0.attn.bias"]);
    assert_eq!(s.parameters(), before);
}

#[test]
fn loaded_parameters_replace_the_seeded_ones() {
    let mut s = tiny_mlp_session(0);
    let other = tiny_mlp_session(1).parameters();
    assert_ne!(s.parameters(), other);
    s.load_parameters(&other).unwrap();
    assert_eq!(s.parameters(), other);
}

#[test]
fn the_same_seed_gives_the_same_session_and_another_seed_a_different_one() {
    let (a, b, c) = (
        tiny_mlp_session(5),
        tiny_mlp_session(5),
        tiny_mlp_session(6),
    );
    assert_eq!(a.parameters(), b.parameters());
    assert_eq!(a.batch(), b.batch());
    assert_ne!(a.parameters()["fc1.weight"], c.parameters()["fc1.weight"]);
    assert_ne!(a.batch()["x"], c.batch()["x"]);
}

#[test]
fn the_loss_of_a_tiny_mlp_falls_over_ten_steps_on_a_fixed_batch() {
    let mut s = tiny_mlp_session(0);
    let losses: Vec<f64> = (0..10).map(|_| s.step().unwrap().loss).collect();
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    // ln 10 ≈ 2.30 at the start: the outputs are near zero.
    assert!((losses[0] - 10f64.ln()).abs() < 0.1, "{losses:?}");
    assert!(losses[9] < 0.5 * losses[0], "{losses:?}");
    assert_eq!(s.steps(), 10);
}

#[test]
fn two_sessions_from_one_seed_train_identically() {
    let (mut a, mut b) = (tiny_mlp_session(3), tiny_mlp_session(3));
    for _ in 0..3 {
        assert_eq!(
            a.step().unwrap().loss.to_bits(),
            b.step().unwrap().loss.to_bits()
        );
    }
    assert_eq!(a.parameters(), b.parameters());
}

#[test]
fn a_batch_of_i32_ids_is_converted_and_a_wrong_shape_names_the_input_and_both_shapes() {
    let model = by_name(TINY_GPT).unwrap();
    let mut s = Session::new(&model, 0).unwrap();
    let batch = s.batch();
    let to_i32 = |t: &Tensor| {
        Tensor::from_i32(
            t.dims().to_vec().as_slice(),
            t.as_i64().unwrap().iter().map(|&v| v as i32).collect(),
        )
    };
    s.set_batch(&to_i32(&batch["x"]), &to_i32(&batch["y"]))
        .unwrap();
    assert_eq!(s.batch(), batch, "i32 ids become the model's i64 ids");

    let wrong = Tensor::from_i64([2, 7], vec![0; 14]);
    let e = s.set_batch(&batch["x"], &wrong).unwrap_err().to_string();
    for want in ["\"y\"", "i64[2,7]", "i64[2,8]"] {
        assert!(e.contains(want), "{want} missing from: {e}");
    }
    let e = s.set_batch(&wrong, &batch["y"]).unwrap_err().to_string();
    assert!(e.contains("\"x\""), "{e}");
}

#[test]
fn an_id_outside_the_vocabulary_is_an_error_naming_the_input_and_position() {
    let mut s = Session::new(&by_name(TINY_GPT).unwrap(), 0).unwrap();
    let batch = s.batch();
    let mut y = batch["y"].as_i64().unwrap().to_vec();
    y[5] = 32;
    let e = s
        .set_batch(&batch["x"], &Tensor::from_i64([2, 8], y))
        .unwrap_err()
        .to_string();
    assert_mentions(&e, &["\"y\"", "32", "position 5"]);
}

// --- the `ingot train` command ---------------------------------------------------------------

fn losses(out: &std::process::Output) -> Vec<f64> {
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    // The last line is the run's summary: the plan's figures beside the measured ones.
    let (last, steps) = lines.split_last().expect("a summary line");
    let summary: serde_json::Value = serde_json::from_str(last).unwrap();
    assert_eq!(
        summary["summary"]["steps"].as_u64(),
        Some(steps.len() as u64),
        "{last}"
    );
    assert!(
        summary["summary"]["planned_bytes"].as_u64().unwrap() > 0,
        "{last}"
    );
    steps
        .iter()
        .enumerate()
        .map(|(i, line)| {
            let v: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("line {line:?}: {e}"));
            assert_eq!(v["step"].as_u64(), Some(i as u64 + 1), "{line}");
            assert!(v["seconds"].as_f64().is_some(), "{line}");
            v["loss"].as_f64().unwrap()
        })
        .collect()
}

#[test]
fn ingot_train_json_prints_one_line_per_step_with_a_falling_loss() {
    let out = ingot(&["train", "--model", TINY_GPT, "--steps", "8", "--json"]);
    ok(&out);
    let l = losses(&out);
    assert_eq!(l.len(), 8, "{l:?}");
    assert!((l[0] - 32f64.ln()).abs() < 0.2, "{l:?}");
    assert!(l[7] < l[0], "{l:?}");
}

/// The y coordinates of the polyline drawn just before the label `name` in a report page.
fn curve_ys(page: &str, name: &str) -> Vec<String> {
    let at = page
        .find(&format!(">{name}</text>"))
        .unwrap_or_else(|| panic!("no curve {name:?} in the report"));
    let line = &page[page[..at].rfind("<polyline").unwrap()..at];
    let points = line
        .split("points=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap();
    points
        .split(' ')
        .map(|p| p.split(',').nth(1).unwrap().to_string())
        .collect()
}

/// The `ingot` program counts its heap (issue 50): on the CPU `measured_bytes` is the host
/// memory loading the step took (its one allocation, so at least the plan's total, and its
/// program), the heap after the last of 1,000 steps is the heap after the first, and the
/// report draws the measured memory over the run as a flat line beside the planned one.
#[test]
fn a_cpu_run_measures_its_heap_beside_the_plan_and_1000_steps_hold_no_more_of_it() {
    let dir = scratch("host_memory");
    let report = dir.join("run.html");
    let out = ingot(&[
        "train",
        "--model",
        TINY_GPT,
        "--steps",
        "1000",
        "--json",
        "--report",
        report.to_str().unwrap(),
    ]);
    let lines = cli::json_lines(&ok(&out));
    let summary = &lines.last().unwrap()["summary"];
    let planned = summary["planned_bytes"].as_u64().unwrap();
    let measured = summary["measured_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no measured bytes on the CPU: {summary}"));
    assert!(measured >= planned, "{summary}");
    assert_eq!(summary["heap_change_bytes"].as_i64(), Some(0), "{summary}");
    let page = std::fs::read_to_string(&report).unwrap();
    assert!(page.contains("host memory held by the run"), "{page}");
    let ys = curve_ys(&page, "measured on the host (heap)");
    assert!(ys.len() > 100, "a point per step, thinned: {}", ys.len());
    assert!(ys.iter().all(|y| *y == ys[0]), "not flat: {ys:?}");
    assert_ne!(
        ys[0],
        curve_ys(&page, "planned (one allocation)")[0],
        "drawn apart from the planned line"
    );

    // The lines a person reads say the same.
    let out = ingot(&["train", "--model", TINY_GPT, "--steps", "20"]);
    let text = ok(&out);
    assert!(
        text.contains("memory measured on the host: ")
            && text.contains("taken by loading the step (its one allocation and its program)")
            && text.contains(
                "host heap after step 1 and after step 20: identical (the steps held no new memory)"
            ),
        "{text}"
    );
}

#[test]
fn ingot_train_save_writes_parameters_that_init_reads_back() {
    let dir = scratch("save_init");
    let (p0, b0, p1) = (
        dir.join("p0.safetensors"),
        dir.join("b0.safetensors"),
        dir.join("p1.safetensors"),
    );
    let s = |p: &PathBuf| p.to_str().unwrap().to_string();
    // --steps 0 --save writes the initial parameters; --save-data the synthetic batch.
    ok(&ingot(&[
        "train",
        "--model",
        TINY_GPT,
        "--steps",
        "0",
        "--seed",
        "4",
        "--save",
        &s(&p0),
        "--save-data",
        &s(&b0),
    ]));
    let params = io::load(&p0).unwrap();
    let session = Session::new(&by_name(TINY_GPT).unwrap(), 4).unwrap();
    assert_eq!(params, session.parameters());
    assert_eq!(io::load(&b0).unwrap(), session.batch());

    // Loading them (with another seed) trains exactly as the seeded run does.
    let three_steps = [
        "train", "--model", TINY_GPT, "--steps", "3", "--json", "--seed",
    ];
    let seeded = ingot(&[&three_steps[..], &["4", "--save", s(&p1).as_str()]].concat());
    ok(&seeded);
    let loaded = ingot(
        &[
            &three_steps[..],
            &["99", "--init", s(&p0).as_str(), "--data", s(&b0).as_str()],
        ]
        .concat(),
    );
    ok(&loaded);
    let (a, b) = (losses(&seeded), losses(&loaded));
    assert_eq!(a.len(), 3);
    assert_eq!(a, b);
    // The trained parameters differ from the initial ones and load back too.
    let trained = io::load(&p1).unwrap();
    assert_ne!(trained, params);
    ok(&ingot(&[
        "train",
        "--model",
        TINY_GPT,
        "--steps",
        "1",
        "--init",
        &s(&p1),
    ]));
}

#[test]
fn ingot_train_on_cuda_says_the_backend_is_not_built_yet() {
    let out = ingot(&[
        "train", "--model", TINY_GPT, "--steps", "1", "--device", "cuda",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let e = String::from_utf8_lossy(&out.stderr);
    assert_mentions(&e, &["CUDA", "--device cpu"]);
}

#[test]
fn ingot_train_names_an_unknown_model_or_a_bad_file() {
    let out = ingot(&["train", "--model", "resnet50", "--steps", "1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("resnet50"));

    let dir = scratch("bad_file");
    let bad = dir.join("bad.safetensors");
    std::fs::write(&bad, b"not a safetensors file").unwrap();
    for flag in ["--init", "--data"] {
        let out = ingot(&[
            "train",
            "--model",
            TINY_GPT,
            "--steps",
            "1",
            flag,
            bad.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(1), "{flag}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("bad.safetensors"),
            "{flag}"
        );
    }

    // Parameters of another shape: the error names the file and the parameter.
    let other = dir.join("other.safetensors");
    let s = other.to_str().unwrap();
    ok(&ingot(&[
        "train",
        "--model",
        "gpt:vocab=33,d_model=16,layers=1,heads=2,d_ff=32,seq=8,batch=2",
        "--steps",
        "0",
        "--save",
        s,
    ]));
    let out = ingot(&["train", "--model", TINY_GPT, "--steps", "1", "--init", s]);
    assert_eq!(out.status.code(), Some(1));
    let e = String::from_utf8_lossy(&out.stderr);
    assert_mentions(&e, &["other.safetensors", "wte.weight"]);
}

/// The trainer's GPT-2 names fixture (made by scripts/gpt2_names_fixture.py).
fn gpt2_fixture(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../trainer/tests/fixtures/gpt2_names")
        .join(name);
    p.to_str().unwrap().to_string()
}

#[test]
fn a_transformers_gpt2_read_with_init_saves_under_nanogpts_names_and_trains_from_transformers_loss()
{
    let dir = scratch("gpt2_names");
    let torch: serde_json::Value =
        serde_json::from_slice(&std::fs::read(gpt2_fixture("torch.json")).unwrap()).unwrap();
    let model = torch["model"].as_str().unwrap();
    let nano = dir.join("nano.safetensors");
    let nano = nano.to_str().unwrap();
    // Hugging Face's names in, nanoGPT's out: the script's nanoGPT file, mask buffers aside.
    let said = ok(&ingot(&[
        "train",
        "--model",
        model,
        "--init",
        &gpt2_fixture("hf.safetensors"),
        "--steps",
        "0",
        "--save",
        nano,
        "--names",
        "nanogpt",
    ]));
    assert_mentions(
        &said,
        &[
            "under Hugging Face's (transformers' GPT2LMHeadModel) names",
            "saved the parameters under nanoGPT's names",
        ],
    );
    let written = io::load(nano).unwrap();
    let want = io::load(gpt2_fixture("nanogpt.safetensors")).unwrap();
    assert_eq!(written.len() + 2, want.len());
    for (name, t) in &written {
        assert_eq!(bits(t), bits(&want[name]), "{name}");
    }
    // Read back under nanoGPT's names: the first step's loss is transformers'.
    let out = ok(&ingot(&[
        "train",
        "--model",
        model,
        "--init",
        nano,
        "--data",
        &gpt2_fixture("batch.safetensors"),
        "--steps",
        "1",
        "--json",
    ]));
    let step: serde_json::Value = out
        .lines()
        .find(|l| l.contains("\"loss\""))
        .map(|l| serde_json::from_str(l).unwrap())
        .expect("a step line");
    let (got, want) = (
        step["loss"].as_f64().unwrap(),
        torch["loss_f32"].as_f64().unwrap(),
    );
    assert!(
        (got - want).abs() <= 1e-5,
        "Ingot {got}, transformers {want}"
    );
    // --names refuses a model that is not Ingot's GPT, before anything trains.
    let refused = ingot(&[
        "train", "--model", "mlp", "--steps", "1", "--save", nano, "--names", "hf",
    ]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("not Ingot's GPT"));
}
