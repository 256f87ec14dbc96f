//! `ingot onnx check` and `--onnx`, run as a user would, on the importer's fixtures
//! (onnx/tests/fixtures, written by scripts/onnx_op_fixtures.py).

use indexmap::IndexMap;
use ingot_runtime::tensor::Tensor;
use ingot_testkit::text::assert_mentions;
use std::path::{Path, PathBuf};

#[path = "support/cli.rs"]
mod cli;
use cli::{exit_stderr, run as ingot};
#[path = "../../onnx/tests/support/mod.rs"]
mod onnx_support;

fn fixture(rel: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../onnx/tests/fixtures")
        .join(rel)
        .display()
        .to_string()
}

/// `ingot train --onnx MODEL --loss cross-entropy MORE..`: a classifier from a file.
fn train_ce(model: &str, more: &[&str]) -> (i32, String, String) {
    ingot(
        &[
            &["train", "--onnx", model, "--loss", "cross-entropy"][..],
            more,
        ]
        .concat(),
    )
}

/// Asserts that two tensors hold the same bytes (a trained weight and its alias, or the same
/// weight saved by two runs); `what` says which.
#[track_caller]
fn assert_same_bits(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.to_le_bytes(), b.to_le_bytes(), "{what}");
}

/// Asserts that the JSON lines of `out` (a run of 5 steps) hold 5 losses, each within 1e-4
/// relative of the reference's (`want`, computed by `by`).
#[track_caller]
fn assert_losses_near(out: &str, want: &[f64], by: &str) {
    let losses: Vec<f64> = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()?["loss"].as_f64())
        .collect();
    assert_eq!(losses.len(), 5, "{out}");
    for (i, (g, w)) in losses.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-4 * w.abs(), "step {i}: {g} vs {by} {w}");
    }
}

/// A state dict's names in sorted order, to compare the names two files hold.
fn sorted_names(m: &IndexMap<String, Tensor>) -> Vec<&str> {
    let mut v: Vec<&str> = m.keys().map(String::as_str).collect();
    v.sort();
    v
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
    let dir = cli::scratch("cli-onnx-tests", "cli-onnx");
    let batch = dir.join("batch.safetensors");
    let mut b = IndexMap::new();
    b.insert("x".to_string(), Tensor::from_f32([4, 6], floats(&doc["x"])));
    b.insert("y".to_string(), Tensor::from_i64([4], ids));
    ingot_runtime::io::save(&batch, &b).unwrap();
    let (code, out, err) = train_ce(
        &fixture("ops/mlp.onnx"),
        &["--data", batch.to_str().unwrap(), "--steps", "5", "--json"],
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, 0, "{err}");
    assert_losses_near(&out, &onnx_support::f64s(&doc["sgd_losses"]), "numpy");
}

#[test]
fn onnx_flags_without_onnx_and_a_symbolic_batch_without_batch_are_refused_by_name() {
    let err = exit_stderr(ingot(&["plan", "--model", "mlp", "--loss", "mse"]), 2);
    assert_mentions(&err, &["--loss", "--onnx"]);
    let path = fixture("errors/symbolic_batch.onnx");
    let err = exit_stderr(ingot(&["plan", "--onnx", &path, "--loss", "mse"]), 1);
    assert_mentions(&err, &["axis 0", "--batch"]);
    let (code, out, err) = ingot(&[
        "plan", "--onnx", &path, "--loss", "mse", "--batch", "16", "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("total_bytes"), "{out}");
}

#[test]
fn max_batch_of_an_onnx_model_with_a_symbolic_batch_fits_and_the_next_batch_does_not() {
    let path = fixture("errors/symbolic_batch.onnx");
    let plan = |extra: &[&str]| {
        let mut args = vec!["plan", "--onnx", &path, "--loss", "mse"];
        args.extend_from_slice(extra);
        ingot(&args)
    };
    // The budget: what batch 16 needs, so that the largest batch is at least 16.
    let (code, out, err) = plan(&["--batch", "16", "--json"]);
    assert_eq!(code, 0, "{err}");
    let doc: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let budget = doc["total_bytes"].as_u64().unwrap().to_string();
    let (code, out, err) = plan(&["--budget", &budget, "--max-batch", "--json"]);
    assert_eq!(code, 0, "{err}");
    let doc: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(doc["model"].as_str(), Some(path.as_str()));
    let cheap = doc["max_batch"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["recompute"] == "cheap")
        .unwrap();
    let n = cheap["max_batch"].as_u64().unwrap();
    assert!(n >= 16, "{doc}");
    let gate = |b: u64| {
        let b = b.to_string();
        plan(&["--batch", &b, "--budget", &budget, "--accumulate", "1"]).0
    };
    assert_eq!(gate(n), 0, "batch {n} fits");
    assert_eq!(gate(n + 1), 3, "batch {} does not", n + 1);
    // A file whose batch is fixed cannot be searched: the error names the axis.
    let fixed = fixture("ops/cnn.onnx");
    let err = exit_stderr(
        ingot(&[
            "plan",
            "--onnx",
            &fixed,
            "--loss",
            "cross-entropy",
            "--budget",
            "1GiB",
            "--max-batch",
        ]),
        1,
    );
    assert_mentions(&err, &["axis 0", "fixed size"]);
}

/// Transformers' GPT-2 exports a constant Ingot does not compute (state the step reads and
/// never writes): `ingot compile` puts its value in the executable, so `ingot run` of the file
/// trains exactly as `ingot train --onnx` of the model does.
#[test]
fn a_compiled_onnx_model_carries_its_constants_so_run_trains_as_train_does() {
    let dir = cli::scratch("cli-onnx-tests", "cli-onnx-exe");
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../onnx/tests/torch/hf_gpt2");
    let path = |p: &PathBuf| p.to_str().unwrap().to_string();
    let (model, batch) = (
        path(&fixture.join("model.onnx")),
        path(&fixture.join("batch.safetensors")),
    );
    let (w0, step, bare) = (
        path(&dir.join("w0.safetensors")),
        path(&dir.join("step.ingot")),
        path(&dir.join("bare.ingot")),
    );
    let import = ["--loss", "cross-entropy", "--class-axis", "last"];
    let losses = |args: &[&str]| -> Vec<f64> {
        let (code, out, err) = ingot(args);
        assert_eq!(code, 0, "{args:?}: {err}");
        let l: Vec<f64> = out
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()?["loss"].as_f64())
            .collect();
        assert_eq!(l.len(), 3, "{out}");
        l
    };
    let with = |head: &[&str], tail: &[&str]| -> Vec<String> {
        head.iter().chain(tail).map(|s| s.to_string()).collect()
    };
    fn strs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    let save = with(&["train", "--onnx", &model], &import);
    let save = with(&strs(&save), &["--steps", "0", "--save", &w0]);
    exit_stderr(ingot(&strs(&save)), 0);
    let steps = ["--data", &batch, "--steps", "3", "--json"];
    let train = with(&["train", "--onnx", &model], &import);
    let want = losses(&strs(&with(&strs(&train), &steps)));

    let compile = with(&["compile", "--onnx", &model], &import);
    exit_stderr(ingot(&strs(&with(&strs(&compile), &["-o", &step]))), 0);
    let (_, shown, _) = ingot(&["inspect", &step]);
    assert!(
        shown.contains("constant 1 of the state leaves, their values carried in the file"),
        "{shown}"
    );
    let run = |file: &str| losses(&strs(&with(&["run", file, "--init", &w0], &steps)));
    assert_eq!(run(&step), want, "the step run from the file");

    // The same file without the constant's value (state starts at zero) computes another step.
    let exe = ingot_compiler::exe::Executable::read(&step).unwrap();
    assert_eq!(exe.constants().len(), 1);
    exe.with_constants(Vec::new())
        .unwrap()
        .write(&bare)
        .unwrap();
    assert_ne!(
        run(&bare),
        want,
        "the constant changes nothing: the test proves nothing"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_trained_onnx_model_is_named_by_its_path_and_starts_from_the_files_weights() {
    let model = fixture("ops/mlp.onnx");
    let (code, out, err) = train_ce(&model, &["--steps", "1"]);
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
    let dir = cli::scratch("cli-onnx-tests", "cli-onnx-sd");
    let init = fixture("state_dict/cnn.safetensors");
    let sd = ingot_runtime::io::load(&init).unwrap();
    let model = fixture("ops/cnn.onnx");
    let on_cnn = |flags: &[&str]| train_ce(&model, flags);
    let train = |steps: &str, init: &str, save: &std::path::Path| {
        on_cnn(&[
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
    assert_eq!(sorted_names(&back), sorted_names(&sd));
    for (k, t) in &sd {
        assert_eq!(back[k].ty, t.ty, "{k}");
        assert_eq!(back[k].as_f32(), t.as_f32(), "{k}");
    }
    assert_eq!(back["bn.num_batches_tracked"].as_i64(), Some(&[7i64][..]));
    // Three training steps: the running statistics move from the loaded ones (batch norm in
    // training mode) and the batch count advances by three.
    let trained = dir.join("trained.safetensors");
    exit_stderr(train("3", &init, &trained), 0);
    let t = ingot_runtime::io::load(&trained).unwrap();
    assert_eq!(sorted_names(&t), sorted_names(&sd));
    assert_eq!(t["bn.num_batches_tracked"].as_i64(), Some(&[10i64][..]));
    assert_ne!(
        t["bn.running_mean"].as_f32(),
        sd["bn.running_mean"].as_f32()
    );
    // The file written is read back as an --init.
    let again = dir.join("again.safetensors");
    exit_stderr(train("0", trained.to_str().unwrap(), &again), 0);
    // A checkpoint keeps the count --init read: resumed after step 1, the run saved after
    // step 3 writes the uninterrupted run's count and statistics.
    let ck = dir.join("ck");
    let ck = ck.to_str().unwrap();
    exit_stderr(
        on_cnn(&["--init", &init, "--steps", "1", "--checkpoint", ck]),
        0,
    );
    let resumed = dir.join("resumed.safetensors");
    exit_stderr(
        on_cnn(&[
            "--resume",
            ck,
            "--steps",
            "3",
            "--save",
            resumed.to_str().unwrap(),
        ]),
        0,
    );
    let r = ingot_runtime::io::load(&resumed).unwrap();
    assert_eq!(r["bn.num_batches_tracked"].as_i64(), Some(&[10i64][..]));
    assert_same_bits(
        &r["bn.running_mean"],
        &t["bn.running_mean"],
        "the resumed run's running mean is the uninterrupted run's",
    );
    // A name the model lacks, and a running statistic of the wrong shape, are errors naming them.
    let mut bad = sd.clone();
    bad.insert("layer9.weight".into(), Tensor::from_f32([2], vec![0.0; 2]));
    let bad_path = dir.join("bad.safetensors");
    ingot_runtime::io::save(&bad_path, &bad).unwrap();
    let err = exit_stderr(train("0", bad_path.to_str().unwrap(), &again), 1);
    assert!(err.contains("layer9.weight"), "{err}");
    let mut bad = sd.clone();
    bad.insert("bn.running_var".into(), Tensor::from_f32([4], vec![1.0; 4]));
    ingot_runtime::io::save(&bad_path, &bad).unwrap();
    let err = exit_stderr(train("0", bad_path.to_str().unwrap(), &again), 1);
    assert_mentions(&err, &["bn.running_var", "[4]"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_state_dict_pytorch_saved_loads_trains_to_pytorchs_losses_and_saves_back_under_its_names() {
    // onnx/tests/torch/cnn: exported by scripts/export_onnx.py, its init.safetensors PyTorch's
    // own state_dict (running statistics and num_batches_tracked included), and PyTorch's
    // losses of 5 SGD steps on batch.safetensors.
    let dir = cli::scratch("cli-onnx-tests", "cli-onnx-torchsd");
    let base = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../onnx/tests/torch/cnn");
    let p = |f: &str| base.join(f).display().to_string();
    let saved = dir.join("trained.safetensors");
    let (code, out, err) = train_ce(
        &p("model.onnx"),
        &[
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
        ],
    );
    assert_eq!(code, 0, "{err}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p("losses.json")).unwrap()).unwrap();
    assert_losses_near(&out, &onnx_support::f64s(&doc["losses"]), "PyTorch");
    let init = ingot_runtime::io::load(p("init.safetensors")).unwrap();
    let back = ingot_runtime::io::load(&saved).unwrap();
    assert_eq!(
        sorted_names(&init),
        sorted_names(&back),
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
    let err = exit_stderr(ingot(&["plan", "--onnx", &path, "--loss", "mse"]), 1);
    assert_mentions(&err, &["\"target\"", "\"third\"", "--input-value"]);
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
    let err = exit_stderr(
        ingot(&["plan", "--onnx", &path, "--input-value", "third"]),
        2,
    );
    assert!(err.contains("NAME=VALUE"), "{err}");
}

/// The mlp fixture's own weights as a PyTorch state_dict (its initializers, by name).
fn mlp_state_dict() -> IndexMap<String, Tensor> {
    let imp = ingot_onnx::import(
        std::path::Path::new(&fixture("ops/mlp.onnx")),
        &ingot_onnx::ImportOptions {
            loss: ingot_onnx::Loss::CrossEntropy { logits: None },
            ..Default::default()
        },
    )
    .unwrap();
    onnx_support::weights(&imp)
}

/// A safetensors file of `tensors` whose header carries `metadata` (as PyTorch's
/// `safetensors.torch.save_model` writes one: `{"dropped name": "kept name"}` for tied ones).
fn save_with_metadata(
    path: &std::path::Path,
    tensors: &IndexMap<String, Tensor>,
    metadata: &[(&str, &str)],
) {
    let bytes = ingot_runtime::io::to_bytes(tensors, path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let meta: serde_json::Map<String, serde_json::Value> = metadata
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
        .collect();
    header.insert("__metadata__".into(), meta.into());
    let mut h = serde_json::to_vec(&header).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(&bytes[8 + n..]);
    std::fs::write(path, out).unwrap();
}

#[test]
fn an_imported_tied_weight_is_trained_once_and_saved_under_both_of_pytorchs_names() {
    // GPT-2's lm_head.weight is transformer.wte.weight: PyTorch's state_dict has both names,
    // the ONNX file one initializer. Here head.weight is the mlp's fc2.weight, bit for bit.
    let dir = cli::scratch("cli-onnx-tests", "cli-onnx-tied");
    let mut sd = mlp_state_dict();
    let fc2 = sd["fc2.weight"].clone();
    sd.insert("head.weight".into(), fc2.clone());
    let init = dir.join("tied.safetensors");
    ingot_runtime::io::save(&init, &sd).unwrap();
    let model = fixture("ops/mlp.onnx");
    let train = |extra: &[&str]| train_ce(&model, extra);
    // `train FROM first --steps n TO to`: a run from a file or checkpoint into one.
    let from_to = |from: &str, first: &Path, steps: &str, to: &str, last: &Path| {
        let path = |p: &Path| p.to_str().unwrap().to_string();
        let (first, last) = (path(first), path(last));
        train(&[from, &first, "--steps", steps, to, &last])
    };
    // Two steps from a file or checkpoint, saved to `file`: what the run saved.
    let saved_by = |from: &str, first: &Path, file: &str| {
        let saved = dir.join(file);
        exit_stderr(from_to(from, first, "2", "--save", &saved), 0);
        ingot_runtime::io::load(&saved).unwrap()
    };
    let saved = dir.join("saved.safetensors");
    let (code, out, err) = from_to("--init", &init, "2", "--save", &saved);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("tied") && out.contains("head.weight = fc2.weight"),
        "the run says which names are tied: {out}"
    );
    let back = ingot_runtime::io::load(&saved).unwrap();
    assert_eq!(
        sorted_names(&sd),
        sorted_names(&back),
        "--save writes both names, as load_state_dict wants them"
    );
    assert_same_bits(
        &back["head.weight"],
        &back["fc2.weight"],
        "the alias holds the trained value",
    );
    assert_ne!(
        back["fc2.weight"].as_f32(),
        fc2.as_f32(),
        "2 steps trained it"
    );

    // safetensors' save_model keeps one name of a tied pair (the first sorted) and records
    // the other in its metadata: fc2.weight absent, head.weight present.
    let mut one = sd.clone();
    one.shift_remove("fc2.weight");
    let meta_init = dir.join("save_model.safetensors");
    save_with_metadata(
        &meta_init,
        &one,
        &[("fc2.weight", "head.weight"), ("format", "pt")],
    );
    let back2 = saved_by("--init", &meta_init, "saved2.safetensors");
    assert_same_bits(
        &back2["fc2.weight"],
        &back["fc2.weight"],
        "the same run as from the file with both names",
    );
    assert_same_bits(
        &back2["head.weight"],
        &back2["fc2.weight"],
        "the alias holds the trained value",
    );

    // A checkpoint keeps the alias list: a resumed run's --save writes both names too.
    let ck = dir.join("ck");
    exit_stderr(from_to("--init", &init, "1", "--checkpoint", &ck), 0);
    let back3 = saved_by("--resume", &ck, "saved3.safetensors");
    assert_same_bits(
        &back3["head.weight"],
        &back["fc2.weight"],
        "resumed after step 1, saved after step 2: the uninterrupted run's weights",
    );

    // An alias whose values differ from its twin is refused, naming both.
    let mut bad = sd.clone();
    let mut v = fc2.as_f32().unwrap().to_vec();
    v[0] += 1.0;
    bad.insert(
        "head.weight".into(),
        Tensor::from_f32(fc2.ty.shape.clone(), v),
    );
    let bad_path = dir.join("bad.safetensors");
    ingot_runtime::io::save(&bad_path, &bad).unwrap();
    let err = exit_stderr(
        train(&["--init", bad_path.to_str().unwrap(), "--steps", "0"]),
        1,
    );
    assert_mentions(&err, &["head.weight", "fc2.weight", "bit for bit"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_tied_head_model_trains_on_labels_up_to_its_vocabulary_with_the_class_axis_read_off_the_labels()
{
    // ops/tied_head: BERT's masked-LM head in small (the decoder tied to the embeddings, so
    // the last matrix parameter has 4 rows, the vocabulary 7): logits [2, 3, 7], token labels
    // [2, 3] holding ids up to 6. The H200 run refused BERT's "id 913 ... outside 0..128".
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("ops/tied_head.json")).unwrap())
            .unwrap();
    let ints = |v: &serde_json::Value| -> Vec<i64> {
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_i64().unwrap())
            .collect()
    };
    let dir = cli::scratch("cli-onnx-tests", "cli-onnx-head");
    let batch = dir.join("batch.safetensors");
    let mut b = IndexMap::new();
    b.insert("x".to_string(), Tensor::from_i64([2, 3], ints(&doc["x"])));
    b.insert("y".to_string(), Tensor::from_i64([2, 3], ints(&doc["y"])));
    ingot_runtime::io::save(&batch, &b).unwrap();
    let model = fixture("ops/tied_head.onnx");
    let (code, out, err) = train_ce(
        &model,
        &["--data", batch.to_str().unwrap(), "--steps", "1", "--json"],
    );
    assert_eq!(code, 0, "{err}");
    let loss = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()?["loss"].as_f64())
        .next()
        .unwrap();
    let want = doc["ce"].as_f64().unwrap();
    assert!((loss - want).abs() <= 1e-5 * want, "{loss} vs numpy {want}");
    // Without labels to read the axis off, three-axis logits ask for --class-axis.
    let loss = ["--onnx", &model, "--loss", "cross-entropy"];
    let err = exit_stderr(ingot(&[&["plan"][..], &loss].concat()), 1);
    assert!(err.contains("--class-axis"), "{err}");
    let axis = ["--class-axis", "last"];
    exit_stderr(ingot(&[&["plan"][..], &loss, &axis].concat()), 0);
    // A synthetic batch draws labels over the whole vocabulary, the declared bound.
    let saved = dir.join("synthetic.safetensors");
    let save_data = ["--steps", "0", "--save-data", saved.to_str().unwrap()];
    exit_stderr(
        ingot(&[&["train"][..], &loss, &axis, &save_data].concat()),
        0,
    );
    let y = ingot_runtime::io::load(&saved).unwrap()["y"].clone();
    let ids: Vec<i64> = match y.as_i64() {
        Some(v) => v.to_vec(),
        None => y.as_i32().unwrap().iter().map(|&i| i as i64).collect(),
    };
    assert!(ids.iter().all(|&i| (0..7).contains(&i)), "{ids:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn onnx_check_runs_the_whole_import_so_it_fails_where_train_would() {
    // Every op of this file is supported; its Slice empties a computed tensor, which only
    // tracing finds. Before, check said "every node can be imported" and train then failed.
    let path = fixture("errors/slice_to_nothing.onnx");
    let (code, out, err) = ingot(&["onnx", "check", &path]);
    assert_eq!(code, 1, "{out}");
    assert_mentions(&err, &["import fails", "/attn/Slice_9"]);
    let train_err = exit_stderr(
        ingot(&["train", "--onnx", &path, "--loss", "mse", "--steps", "1"]),
        1,
    );
    assert!(train_err.contains("/attn/Slice_9"), "{train_err}");
    // The same flags as train: the loss is checked when given.
    let head = fixture("ops/tied_head.onnx");
    let err = exit_stderr(
        ingot(&["onnx", "check", &head, "--loss", "cross-entropy"]),
        1,
    );
    assert!(err.contains("--class-axis"), "{err}");
    let (code, out, err) = ingot(&[
        "onnx",
        "check",
        &head,
        "--loss",
        "cross-entropy",
        "--class-axis",
        "last",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_mentions(&out, &["every node can be imported", "the loss"]);
}
