//! `ingot onnx check` and `--onnx`, run as a user would, on the importer's fixtures
//! (onnx/tests/fixtures, written by scripts/onnx_op_fixtures.py).

use indexmap::IndexMap;
use ingot_runtime::tensor::Tensor;
use std::path::PathBuf;
use std::process::Command;

fn ingot(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(args)
        .output()
        .expect("run ingot");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn fixture(rel: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../onnx/tests/fixtures")
        .join(rel)
        .display()
        .to_string()
}

#[test]
fn onnx_check_lists_every_node_that_cannot_be_imported_and_exits_1() {
    let (code, out, err) = ingot(&["onnx", "check", &fixture("errors/unsupported.onnx")]);
    assert_eq!(code, 1, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert!(
        lines[0].starts_with("Hardmax node \"the_hardmax\""),
        "{out}"
    );
    assert!(err.contains("4 node(s) cannot be imported"), "{err}");
    let (code, out, _) = ingot(&["onnx", "check", &fixture("ops/cnn.onnx")]);
    assert_eq!(code, 0);
    assert!(out.contains("every node can be imported"), "{out}");
}

#[test]
fn train_onnx_starts_from_the_files_weights_and_gives_the_reference_losses() {
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("ops/mlp.json")).unwrap()).unwrap();
    let floats = |v: &serde_json::Value| -> Vec<f32> {
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect()
    };
    let ids: Vec<i64> = doc["y"]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect();
    let dir = std::env::temp_dir().join(format!("ingot-cli-onnx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let batch = dir.join("batch.safetensors");
    let mut b = IndexMap::new();
    b.insert("x".to_string(), Tensor::from_f32([4, 6], floats(&doc["x"])));
    b.insert("y".to_string(), Tensor::from_i64([4], ids));
    ingot_runtime::io::save(&batch, &b).unwrap();
    let (code, out, err) = ingot(&[
        "train",
        "--onnx",
        &fixture("ops/mlp.onnx"),
        "--loss",
        "cross-entropy",
        "--data",
        batch.to_str().unwrap(),
        "--steps",
        "5",
        "--json",
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, 0, "{err}");
    let losses: Vec<f64> = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()?["loss"].as_f64())
        .collect();
    let want: Vec<f64> = doc["sgd_losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(losses.len(), 5, "{out}");
    for (i, (g, w)) in losses.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * w.abs(),
            "step {i}: {g} vs numpy {w}"
        );
    }
}

#[test]
fn onnx_flags_without_onnx_and_a_symbolic_batch_without_batch_are_refused_by_name() {
    let (code, _, err) = ingot(&["plan", "--model", "mlp", "--loss", "mse"]);
    assert_eq!(code, 2);
    assert!(err.contains("--loss") && err.contains("--onnx"), "{err}");
    let path = fixture("errors/symbolic_batch.onnx");
    let (code, _, err) = ingot(&["plan", "--onnx", &path, "--loss", "mse"]);
    assert_eq!(code, 1);
    assert!(err.contains("axis 0") && err.contains("--batch"), "{err}");
    let (code, out, err) = ingot(&[
        "plan", "--onnx", &path, "--loss", "mse", "--batch", "16", "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("total_bytes"), "{out}");
}

#[test]
fn compile_refuses_an_onnx_model_whose_constants_an_executable_cannot_hold() {
    let dir = std::env::temp_dir().join(format!("ingot-cli-onnx-exe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("step.ingot");
    let (code, _, err) = ingot(&[
        "compile",
        "--onnx",
        &fixture("ops/constant_expand.onnx"),
        "--loss",
        "mse",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("constants") && err.contains("ingot train --onnx"),
        "{err}"
    );
    let (code, _, err) = ingot(&[
        "compile",
        "--onnx",
        &fixture("ops/mlp.onnx"),
        "--loss",
        "cross-entropy",
        "-o",
        out.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn a_trained_onnx_model_is_named_by_its_path_and_starts_from_the_files_weights() {
    let model = fixture("ops/mlp.onnx");
    let (code, out, err) = ingot(&[
        "train",
        "--onnx",
        &model,
        "--loss",
        "cross-entropy",
        "--steps",
        "1",
    ]);
    assert_eq!(code, 0, "{err}");
    let header = out.lines().next().unwrap_or_default();
    assert!(
        header.starts_with(&format!("model {model}:"))
            && header.contains("the model file's parameters"),
        "{header}"
    );
}

#[test]
fn init_reads_a_whole_pytorch_state_dict_and_save_writes_one_back() {
    let dir = std::env::temp_dir().join(format!("ingot-cli-onnx-sd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let init = fixture("state_dict/cnn.safetensors");
    let sd = ingot_runtime::io::load(&init).unwrap();
    let train = |steps: &str, init: &str, save: &std::path::Path| {
        ingot(&[
            "train",
            "--onnx",
            &fixture("ops/cnn.onnx"),
            "--loss",
            "cross-entropy",
            "--init",
            init,
            "--steps",
            steps,
            "--save",
            save.to_str().unwrap(),
        ])
    };
    // No steps: the file written is the state_dict read, running statistics and count included.
    let same = dir.join("same.safetensors");
    let (code, out, err) = train("0", &init, &same);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("running statistics"), "{out}");
    let back = ingot_runtime::io::load(&same).unwrap();
    let names = |m: &IndexMap<String, Tensor>| {
        let mut v: Vec<String> = m.keys().cloned().collect();
        v.sort();
        v
    };
    assert_eq!(names(&back), names(&sd));
    for (k, t) in &sd {
        assert_eq!(back[k].ty, t.ty, "{k}");
        assert_eq!(back[k].as_f32(), t.as_f32(), "{k}");
    }
    assert_eq!(back["bn.num_batches_tracked"].as_i64(), Some(&[7i64][..]));
    // Three training steps: the running statistics move from the loaded ones (batch norm in
    // training mode) and the batch count advances by three.
    let trained = dir.join("trained.safetensors");
    let (code, _, err) = train("3", &init, &trained);
    assert_eq!(code, 0, "{err}");
    let t = ingot_runtime::io::load(&trained).unwrap();
    assert_eq!(names(&t), names(&sd));
    assert_eq!(t["bn.num_batches_tracked"].as_i64(), Some(&[10i64][..]));
    assert_ne!(
        t["bn.running_mean"].as_f32(),
        sd["bn.running_mean"].as_f32()
    );
    // The file written is read back as an --init.
    let again = dir.join("again.safetensors");
    let (code, _, err) = train("0", trained.to_str().unwrap(), &again);
    assert_eq!(code, 0, "{err}");
    // A name the model lacks, and a running statistic of the wrong shape, are errors naming them.
    let mut bad = sd.clone();
    bad.insert("layer9.weight".into(), Tensor::from_f32([2], vec![0.0; 2]));
    let bad_path = dir.join("bad.safetensors");
    ingot_runtime::io::save(&bad_path, &bad).unwrap();
    let (code, _, err) = train("0", bad_path.to_str().unwrap(), &again);
    assert_eq!(code, 1);
    assert!(err.contains("layer9.weight"), "{err}");
    let mut bad = sd.clone();
    bad.insert("bn.running_var".into(), Tensor::from_f32([4], vec![1.0; 4]));
    ingot_runtime::io::save(&bad_path, &bad).unwrap();
    let (code, _, err) = train("0", bad_path.to_str().unwrap(), &again);
    assert_eq!(code, 1);
    assert!(
        err.contains("bn.running_var") && err.contains("[4]"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_state_dict_pytorch_saved_loads_trains_to_pytorchs_losses_and_saves_back_under_its_names() {
    // onnx/tests/torch/cnn: exported by scripts/export_onnx.py, its init.safetensors PyTorch's
    // own state_dict (running statistics and num_batches_tracked included), and PyTorch's
    // losses of 5 SGD steps on batch.safetensors.
    let dir = std::env::temp_dir().join(format!("ingot-cli-onnx-torchsd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let base = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../onnx/tests/torch/cnn");
    let p = |f: &str| base.join(f).display().to_string();
    let saved = dir.join("trained.safetensors");
    let (code, out, err) = ingot(&[
        "train",
        "--onnx",
        &p("model.onnx"),
        "--loss",
        "cross-entropy",
        "--init",
        &p("init.safetensors"),
        "--data",
        &p("batch.safetensors"),
        "--optimizer",
        "sgd",
        "--lr",
        "0.1",
        "--steps",
        "5",
        "--save",
        saved.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let losses: Vec<f64> = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()?["loss"].as_f64())
        .collect();
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p("losses.json")).unwrap()).unwrap();
    let want: Vec<f64> = doc["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(losses.len(), 5, "{out}");
    for (i, (g, w)) in losses.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * w.abs(),
            "step {i}: {g} vs PyTorch {w}"
        );
    }
    let init = ingot_runtime::io::load(p("init.safetensors")).unwrap();
    let back = ingot_runtime::io::load(&saved).unwrap();
    let mut a: Vec<&String> = init.keys().collect();
    let mut b: Vec<&String> = back.keys().collect();
    a.sort();
    b.sort();
    assert_eq!(
        a, b,
        "--save writes the state_dict's names, no more, no fewer"
    );
    for (k, t) in &init {
        assert_eq!(back[k].ty, t.ty, "{k}");
        if k.ends_with("num_batches_tracked") {
            assert_eq!(
                back[k].as_i64().unwrap()[0],
                t.as_i64().unwrap()[0] + 5,
                "{k}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn input_value_holds_extra_data_inputs_and_without_it_the_error_names_them_and_the_flag() {
    let path = fixture("errors/three_inputs.onnx");
    let (code, _, err) = ingot(&["plan", "--onnx", &path, "--loss", "mse"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("\"target\"") && err.contains("\"third\"") && err.contains("--input-value"),
        "{err}"
    );
    let (code, out, err) = ingot(&[
        "plan",
        "--onnx",
        &path,
        "--loss",
        "mse",
        "--input-value",
        "target=1",
        "--input-value",
        "third=0.5",
    ]);
    // The inputs are accepted; this fixture (input + target + third) has nothing to train,
    // which is the next thing planning says.
    assert_eq!(code, 1, "{out}");
    assert!(
        err.contains("no parameters to train") && !err.contains("--input-value"),
        "{err}"
    );
    let (code, _, err) = ingot(&["plan", "--onnx", &path, "--input-value", "third"]);
    assert_eq!(code, 2);
    assert!(err.contains("NAME=VALUE"), "{err}");
}
