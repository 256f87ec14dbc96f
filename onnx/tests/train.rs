//! Imported models train: Ingot's planned CPU step on an imported model gives the losses an
//! independent reference computes (the mlp fixture's SGD steps backpropagated by hand in
//! numpy, scripts/onnx_op_fixtures.py), batch norm's running statistics are state the
//! training step updates and the evaluation step reads, and a training-mode Dropout trains
//! with a seeded mask and is the identity in evaluation.

mod support;

use indexmap::IndexMap;
use ingot_compiler::ir::{DType, LeafKind, Op, Shape};
use ingot_onnx::{import, ImportOptions, Imported, Loss};
use ingot_runtime::cpu::interp::run_graph;
use ingot_runtime::tensor::Tensor;
use ingot_testkit::text::assert_mentions;
use ingot_trainer::session::Session;
use support::*;

/// A CPU session on `imp` with the file's weights: parameters, and state (batch norm's
/// running statistics, constants) from `state` where given, else from the file.
pub fn session(
    imp: &Imported,
    params: &IndexMap<String, Tensor>,
    state: &IndexMap<String, Tensor>,
) -> Session {
    let mut s = Session::new(&imp.model, 0).unwrap();
    s.load_parameters(params).unwrap();
    let w = weights(imp);
    let st: IndexMap<String, Tensor> = imp
        .weights
        .iter()
        .filter(|(_, v)| v.kind == LeafKind::State)
        .map(|(k, _)| (k.clone(), state.get(k).unwrap_or(&w[k]).clone()))
        .collect();
    s.load_optimizer_state(&st).unwrap();
    s
}

fn params_of(imp: &Imported) -> IndexMap<String, Tensor> {
    let w = weights(imp);
    imp.weights
        .iter()
        .filter(|(_, v)| v.kind == LeafKind::Parameter)
        .map(|(k, _)| (k.clone(), w[k].clone()))
        .collect()
}

#[test]
fn an_imported_mlp_trains_with_the_losses_of_hand_written_sgd() {
    let dir = fixtures().join("ops");
    let doc = json(&dir.join("mlp.json"));
    let imp = import_classifier(&dir.join("mlp.onnx"));
    let names: Vec<&String> = imp.weights.keys().collect();
    assert_eq!(names, ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]);
    let mut s = session(&imp, &params_of(&imp), &IndexMap::new());
    s.set_batch(
        &tensor(&doc["x"], DType::F32),
        &tensor(&doc["y"], DType::F32),
    )
    .unwrap();
    let want = f64s(&doc["sgd_losses"]);
    for (i, w) in want.iter().enumerate() {
        let got = s.step().unwrap().loss;
        assert!(close(got, *w, 1e-4), "step {i}: loss {got}, numpy {w}");
    }
}

#[test]
fn batch_norm_running_statistics_are_state_updated_in_training_and_read_in_evaluation() {
    let dir = fixtures().join("ops");
    let imp = import_classifier(&dir.join("cnn.onnx"));
    let g = &imp.model.graph;
    let state: Vec<&str> = leaf_names(g, LeafKind::State);
    assert_eq!(state, ["bn.running_mean", "bn.running_var"]);
    assert_eq!(g.updates.len(), 2);
    let eval = imp
        .model
        .eval_graph
        .as_ref()
        .expect("batch norm traces differently in evaluation");
    assert!(eval.updates.is_empty());
    // The batch norm's updated statistics after one step are the ones onnxruntime computes.
    let bn = json(&dir.join("batchnorm_train.json"));
    let imp = import(
        &dir.join("batchnorm_train.onnx"),
        &ImportOptions {
            loss: Loss::Mse {
                output: Some("out".into()),
            },
            ..Default::default()
        },
    )
    .unwrap();
    let mut leaves = weights(&imp);
    leaves.insert("x".into(), tensor(&bn["x"], DType::F32));
    let y = imp.model.graph.leaf("y").unwrap();
    leaves.insert("y".into(), zeros(imp.model.graph.ty(y)));
    let vals = run_graph(&imp.model.graph, &leaves).unwrap();
    for (leaf, out) in [("bn.running_mean", "rm"), ("bn.running_var", "rv")] {
        let got = vals.updates[leaf].to_f64_vec();
        let want = tensor(&bn["outputs"][out], DType::F64).to_f64_vec();
        for (a, b) in got.iter().zip(&want) {
            assert!(close(*a, *b, 1e-5), "{leaf}: {a} vs onnxruntime {b}");
        }
    }
}

#[test]
fn a_training_mode_dropout_draws_a_seeded_mask_and_is_the_identity_in_evaluation() {
    let imp = import_mse("errors/dropout_train.onnx").unwrap();
    let g = &imp.model.graph;
    let drops: Vec<f64> = g
        .nodes()
        .iter()
        .filter_map(|n| match n.op {
            Op::Dropout { p, .. } => Some(p),
            _ => None,
        })
        .collect();
    assert_eq!(drops, [0.25]);
    assert!(g.leaf("dropout_seed").is_some());
    let eval = imp
        .model
        .eval_graph
        .as_ref()
        .expect("dropout traces differently in evaluation");
    assert!(!eval
        .nodes()
        .iter()
        .any(|n| matches!(n.op, Op::Dropout { .. })));
    // Ones through the training graph: each element dropped (0) or kept and scaled by
    // 1/(1 − p).
    let mut g2 = g.clone();
    g2.set_output("onnx.out", imp.outputs["out"]).unwrap();
    let mut leaves = IndexMap::new();
    leaves.insert(
        "x".to_string(),
        Tensor::from_f32(Shape::new(&[2, 3]), vec![1.0; 6]),
    );
    leaves.insert(
        "y".to_string(),
        Tensor::from_f32(Shape::new(&[2, 3]), vec![0.0; 6]),
    );
    leaves.insert("dropout_seed".to_string(), Tensor::scalar(7i64));
    let out = run_graph(&g2, &leaves).unwrap().outputs["onnx.out"].to_f64_vec();
    for v in out {
        assert!(v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6, "{v}");
    }
}

#[test]
fn an_imported_gpt_like_model_trains_from_onnxruntimes_first_loss_downwards() {
    let dir = fixtures().join("ops");
    let doc = json(&dir.join("gpt.json"));
    let imp = import_classifier(&dir.join("gpt.onnx"));
    // The causal mask buffer is computed, not stored: the model's only leaves are parameters.
    assert!(imp.weights.values().all(|w| w.kind == LeafKind::Parameter));
    let mut s = session(&imp, &params_of(&imp), &IndexMap::new());
    s.set_batch(
        &tensor(&doc["x"], DType::F32),
        &tensor(&doc["y"], DType::F32),
    )
    .unwrap();
    let first = s.step().unwrap().loss;
    let want = doc["ce"].as_f64().unwrap();
    assert!(
        close(first, want, 1e-5),
        "first loss {first}, onnxruntime's logits give {want}"
    );
    let mut last = first;
    for _ in 0..4 {
        last = s.step().unwrap().loss;
    }
    assert!(last < first, "5 SGD steps on one batch: {first} -> {last}");
}

#[test]
fn an_imported_causal_attention_is_recognized_as_one_fused_attention() {
    let imp = import_classifier(&fixtures().join("ops/gpt.onnx"));
    let (_, fused) = ingot_compiler::recognize::attention(&imp.model.graph).unwrap();
    assert_eq!(fused, 1);
}

#[test]
fn a_model_computing_its_own_loss_takes_data_as_x_and_target_as_y() {
    let imp = import(
        &fixtures().join("errors/own_loss.onnx"),
        &ImportOptions::default(),
    )
    .unwrap();
    assert_eq!(
        imp.inputs,
        [
            ("input".to_string(), "x".to_string()),
            ("target".to_string(), "y".to_string())
        ]
    );
    let mut leaves = weights(&imp);
    let x = [0.5f32, -1.0, 2.0, 0.0, 1.5, -0.5];
    let y = [1.0f32, 0.0, 3.0, -1.0, 2.0, 1.0];
    leaves.insert(
        "x".into(),
        Tensor::from_f32(Shape::new(&[2, 3]), x.to_vec()),
    );
    leaves.insert(
        "y".into(),
        Tensor::from_f32(Shape::new(&[2, 3]), y.to_vec()),
    );
    let got = run_graph(&imp.model.graph, &leaves).unwrap().outputs["loss"].to_f64_vec()[0];
    let want: f64 = x
        .iter()
        .zip(&y)
        .map(|(a, b)| ((2.0 * a - b) as f64).powi(2))
        .sum::<f64>()
        / 6.0;
    assert!(close(got, want, 1e-6), "{got} vs {want}");
}

#[test]
fn a_model_with_three_data_inputs_is_refused_naming_them() {
    assert_mse_import_refused(
        "errors/three_inputs.onnx",
        &["\"input\", \"target\", \"third\"", "--input-value"],
    );
}

#[test]
fn data_inputs_held_at_a_value_are_folded_constants_and_the_rest_are_fed() {
    let path = fixtures().join("errors/three_inputs.onnx");
    let opts = |fixed: &[(&str, f64)]| ImportOptions {
        loss: Loss::Mse { output: None },
        fixed_inputs: fixed
            .iter()
            .map(|(k, v)| (k.to_string(), (*v).into()))
            .collect(),
        ..Default::default()
    };
    let imp = import(&path, &opts(&[("target", 1.5), ("third", -4.0)])).unwrap();
    assert_eq!(imp.inputs[0], ("input".to_string(), "x".to_string()));
    let g = &imp.model.graph;
    let inputs: Vec<&str> = leaf_names(g, LeafKind::Input);
    assert_eq!(inputs, ["x", "y"], "the held inputs are not step inputs");
    let mut g2 = g.clone();
    g2.set_output("onnx.out", imp.outputs["out"]).unwrap();
    let x = Tensor::from_f32(Shape::new(&[2, 3]), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    let mut leaves = IndexMap::new();
    leaves.insert("x".to_string(), x);
    leaves.insert(
        "y".to_string(),
        Tensor::from_f32(Shape::new(&[2, 3]), vec![0.0; 6]),
    );
    let out = run_graph(&g2, &leaves).unwrap().outputs["onnx.out"].to_f64_vec();
    assert_eq!(out, [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5]);
    // Holding a name that is not a data input is an error naming it.
    let e = import(
        &path,
        &opts(&[("nope", 1.0), ("target", 0.0), ("third", 0.0)]),
    )
    .unwrap_err()
    .to_string();
    assert_mentions(&e, &["\"nope\"", "third"]);
}

/// Runs `g` (training or evaluation graph of `imp`) on `x` with the dropout seed `seed`,
/// returning the named ONNX outputs.
fn run_outputs(imp: &Imported, eval: bool, x: &Tensor, seed: i64, outs: &[&str]) -> Vec<Vec<f64>> {
    let mut g = if eval {
        imp.model
            .eval_graph
            .clone()
            .unwrap_or(imp.model.graph.clone())
    } else {
        imp.model.graph.clone()
    };
    for o in outs {
        let id = if eval && imp.model.eval_graph.is_some() {
            imp.eval_outputs[*o]
        } else {
            imp.outputs[*o]
        };
        g.set_output(&format!("onnx.{o}"), id).unwrap();
    }
    let mut leaves = IndexMap::new();
    leaves.insert("x".to_string(), x.clone());
    if let Some(y) = g.leaf("y") {
        leaves.insert("y".to_string(), Tensor::zeros(g.ty(y).clone()));
    }
    if g.leaf("dropout_seed").is_some() {
        leaves.insert("dropout_seed".to_string(), Tensor::scalar(seed));
    }
    let vals = run_graph(&g, &leaves).unwrap();
    outs.iter()
        .map(|o| vals.outputs[&format!("onnx.{o}")].to_f64_vec())
        .collect()
}

fn ramp(rows: usize, cols: usize) -> Tensor {
    Tensor::from_f32(
        Shape::new(&[rows, cols]),
        (0..rows * cols)
            .map(|i| 1.0 + (i % 97) as f32 / 10.0)
            .collect(),
    )
}

#[test]
fn a_dropouts_mask_output_is_the_draw_its_output_applied() {
    let imp = import(
        &fixtures().join("random/dropout_mask_train.onnx"),
        &ImportOptions {
            loss: Loss::Mse {
                output: Some("out".into()),
            },
            ..Default::default()
        },
    )
    .unwrap();
    let x = ramp(40, 50);
    let xs = x.to_f64_vec();
    let r = run_outputs(&imp, false, &x, 11, &["out", "kept"]);
    let (out, kept) = (&r[0], &r[1]);
    let mut n_kept = 0;
    for i in 0..xs.len() {
        if kept[i] == 1.0 {
            n_kept += 1;
            assert!(
                (out[i] - xs[i] / 0.75).abs() < 1e-5,
                "{i}: {} vs {}",
                out[i],
                xs[i]
            );
        } else {
            assert_eq!((kept[i], out[i]), (0.0, 0.0), "element {i}");
        }
    }
    // 2000 draws at p = 0.25: 1500 kept expected, σ ≈ 19.
    assert!((1400..=1600).contains(&n_kept), "{n_kept} of 2000 kept");
    // Another seed draws another mask.
    let other = run_outputs(&imp, false, &x, 12, &["kept"]);
    assert_ne!(&other[0], kept);
    // Evaluation: the identity, every element kept.
    let e = run_outputs(&imp, true, &x, 11, &["out", "kept"]);
    assert_eq!(e[0], xs);
    assert!(e[1].iter().all(|&k| k == 1.0));
}

#[test]
fn stochastic_depth_drops_whole_samples_at_its_rate_and_is_the_identity_in_evaluation() {
    let imp = import_mse("random/stochastic_depth.onnx").unwrap();
    assert!(imp
        .model
        .graph
        .nodes()
        .iter()
        .any(|n| matches!(n.op, Op::Dropout { p, .. } if (p - 0.2).abs() < 1e-6)));
    let x = ramp(2000, 3);
    let xs = x.to_f64_vec();
    let out = &run_outputs(&imp, false, &x, 5, &["out"])[0];
    let mut kept_rows = 0;
    for row in 0..2000 {
        let r = &out[row * 3..row * 3 + 3];
        if r.iter().all(|&v| v == 0.0) {
            continue;
        }
        kept_rows += 1;
        for c in 0..3 {
            let want = xs[row * 3 + c] / 0.8;
            assert!((r[c] - want).abs() < 1e-5 * want, "row {row}: {r:?}");
        }
    }
    // 2000 samples kept with probability 0.8: 1600 expected, σ ≈ 18.
    assert!(
        (1500..=1700).contains(&kept_rows),
        "{kept_rows} of 2000 kept"
    );
    let again = &run_outputs(&imp, false, &x, 6, &["out"])[0];
    assert_ne!(again, out, "another seed, another draw");
    let eval = &run_outputs(&imp, true, &x, 5, &["out"])[0];
    for (a, b) in eval.iter().zip(&xs) {
        assert!((a - b).abs() <= 1e-6 * b.abs(), "evaluation: {a} vs {b}");
    }
}

#[test]
fn a_random_draw_read_other_than_by_a_comparison_is_refused_naming_the_node() {
    assert_mse_import_refused(
        "random/random_read_directly.onnx",
        &["RandomUniformLike", "\"noise\"", "Add"],
    );
}

#[test]
fn a_dropout_whose_declared_mask_nothing_reads_imports_without_computing_it() {
    // PyTorch's exporter writes nn.Dropout in training mode with its mask output declared.
    let imp = import_mse("random/dropout_mask_unread.onnx").unwrap();
    let drops = imp
        .model
        .graph
        .nodes()
        .iter()
        .filter(|n| matches!(n.op, Op::Dropout { .. }))
        .count();
    assert_eq!(drops, 1, "the unread mask is not drawn a second time");
    let x = ramp(40, 50);
    let xs = x.to_f64_vec();
    let out = &run_outputs(&imp, false, &x, 3, &["out"])[0];
    let kept = out.iter().filter(|&&v| v != 0.0).count();
    for (o, x) in out.iter().zip(&xs) {
        assert!(*o == 0.0 || (o - x / 0.75).abs() < 1e-5, "{o} from {x}");
    }
    assert!((1400..=1600).contains(&kept), "{kept} of 2000 kept");
}

/// A batch norm written in its inference form (`training_mode` 0, as an `eval()` export or
/// PyTorch's dynamo exporter writes it) is imported as the file says, and the import carries
/// a note naming the node and how to export batch statistics; a training-mode one has none.
#[test]
fn an_inference_form_batch_norm_is_imported_with_a_note_naming_it_and_a_training_one_without() {
    let dir = fixtures().join("ops");
    let opts = ImportOptions {
        loss: Loss::Mse {
            output: Some("out".into()),
        },
        ..Default::default()
    };
    let eval = import(&dir.join("batchnorm_eval.onnx"), &opts).unwrap();
    assert_eq!(eval.notes.len(), 1, "{:?}", eval.notes);
    assert_mentions(
        &eval.notes[0],
        &[
            "1 BatchNormalization node",
            "training_mode 0",
            "running statistics",
            "dynamo=False",
        ],
    );
    let train = import(&dir.join("batchnorm_train.onnx"), &opts).unwrap();
    assert!(train.notes.is_empty(), "{:?}", train.notes);
}
