//! Every per-op fixture (onnx/tests/fixtures/ops, written by scripts/onnx_op_fixtures.py)
//! imports and its forward pass, run by the CPU reference interpreter, gives the outputs
//! onnxruntime computed for the same input within 1e-5 relative.

mod support;

use ingot_compiler::ir::DType;
use ingot_compiler::ir::{Init, Op};
use ingot_onnx::{import, ClassAxis, ImportOptions, Loss};
use ingot_runtime::cpu::interp::run_graph;
use ingot_testkit::text::assert_mentions;
use support::*;

/// Runs one fixture; the errors say which output and element differ.
fn run_case(name: &str) -> Result<usize, String> {
    let dir = fixtures().join("ops");
    let doc = json(&dir.join(format!("{name}.json")));
    let loss = match doc["loss"].as_str().unwrap() {
        "ce" => Loss::CrossEntropy {
            logits: Some("out".into()),
        },
        out => Loss::Mse {
            output: Some(out.into()),
        },
    };
    let opts = ImportOptions {
        loss,
        // The fixtures' labels are the logits' shape less the last axis.
        class_axis: ClassAxis::Last,
        ..Default::default()
    };
    let imp = import(&dir.join(format!("{name}.onnx")), &opts).map_err(|e| e.to_string())?;
    let mut g = imp.model.graph.clone();
    let outs = doc["outputs"].as_object().unwrap();
    for o in outs.keys() {
        let id = *imp
            .outputs
            .get(o)
            .ok_or_else(|| format!("output {o} is not a node"))?;
        g.set_output(&format!("onnx.{o}"), id).unwrap();
    }
    let mut leaves = weights(&imp);
    leaves.insert("x".into(), tensor(&doc["x"], DType::F32));
    let y = g.leaf("y").unwrap();
    let yv = match doc.get("y") {
        Some(v) => tensor(v, DType::F32),
        None => zeros(g.ty(y)),
    };
    leaves.insert("y".into(), yv);
    let vals = run_graph(&g, &leaves).map_err(|e| e.to_string())?;
    let mut compared = 0;
    for (o, want) in outs {
        let want = tensor(want, DType::F64);
        let got = &vals.outputs[&format!("onnx.{o}")];
        if got.dims() != want.dims() {
            return Err(format!(
                "output {o}: shape {:?}, want {:?}",
                got.dims(),
                want.dims()
            ));
        }
        for (i, (a, b)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
            if !close(*a, b, 1e-5) {
                return Err(format!("output {o}[{i}]: {a} vs onnxruntime {b}"));
            }
            compared += 1;
        }
    }
    if let Some(ce) = doc.get("ce").and_then(|v| v.as_f64()) {
        let got = vals.outputs["loss"].to_f64_vec()[0];
        if !close(got, ce, 1e-5) {
            return Err(format!(
                "cross-entropy {got} vs {ce} (numpy, from onnxruntime's logits)"
            ));
        }
    }
    Ok(compared)
}

#[test]
fn every_op_fixture_matches_onnxruntime_within_1e_5_relative() {
    let mut names: Vec<String> = std::fs::read_dir(fixtures().join("ops"))
        .unwrap()
        .filter_map(|e| {
            let p = e.unwrap().path();
            (p.extension()? == "json")
                .then(|| p.file_stem().unwrap().to_string_lossy().into_owned())
        })
        .collect();
    names.sort();
    assert!(
        names.len() >= 60,
        "only {} fixtures: run scripts/onnx_op_fixtures.py",
        names.len()
    );
    let mut failures = Vec::new();
    let mut total = 0;
    for n in &names {
        match run_case(n) {
            Ok(k) => total += k,
            Err(e) => failures.push(format!("{n}: {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} fixtures fail:\n{}",
        failures.len(),
        names.len(),
        failures.join("\n")
    );
    assert!(total > 1000, "only {total} elements compared");
}

#[test]
fn vit_b_16s_packed_attention_slices_import_a_shape_sliced_to_nothing_included() {
    // nn.MultiheadAttention's in_proj as torch.onnx writes it: `unflatten(-1, (3, E))` takes
    // `shape[3:]` (Slice to INT64_MAX from 3, empty), then q, k, v are sliced with negative,
    // INT64_MAX and Constant-node bounds; and a shape reversed by a step of -1.
    let compared = run_case("packed_attention_slices").unwrap();
    assert_eq!(compared, 2 * 5 * 12);
}

#[test]
fn a_computed_tensor_sliced_to_nothing_is_refused_naming_the_node() {
    assert_mse_import_refused(
        "errors/slice_to_nothing.onnx",
        &["/attn/Slice_9", "to nothing", "size 3"],
    );
}

/// The labels leaf `y` of `opts`'s import of `file`: its dims and its declared id bound.
fn labels_of(file: &str, opts: ImportOptions) -> Result<(Vec<usize>, Option<u64>), String> {
    let opts = ImportOptions {
        loss: Loss::CrossEntropy { logits: None },
        ..opts
    };
    let imp = import(&fixtures().join(file), &opts).map_err(|e| e.to_string())?;
    let g = &imp.model.graph;
    let y = g.leaf("y").unwrap();
    let bound = match &g.node(y).op {
        Op::Leaf {
            init: Init::Ids { bound },
            ..
        } => Some(*bound),
        _ => None,
    };
    Ok((g.ty(y).shape.dims().to_vec(), bound))
}

#[test]
fn the_class_axis_of_three_axis_logits_is_the_one_whose_removal_gives_the_labels_shape() {
    // tied_head: logits [2, 3, 7] (BERT's head in small, the decoder tied to the embeddings).
    let err = labels_of("ops/tied_head.onnx", ImportOptions::default()).unwrap_err();
    assert!(
        err.contains("--class-axis") && err.contains("[2, 7]") && err.contains("[2, 3]"),
        "without the labels' shape both readings are named: {err}"
    );
    let with = |labels: Vec<usize>| ImportOptions {
        labels_shape: Some(labels),
        ..Default::default()
    };
    // Token labels [2, 3]: the last axis, 7 classes, declared on y (no parameter has 7 rows
    // last: the last matrix parameter is the transform's 4x4).
    assert_eq!(
        labels_of("ops/tied_head.onnx", with(vec![2, 3])).unwrap(),
        (vec![2, 3], Some(7))
    );
    // Labels [2, 7]: PyTorch's [N, C, d1] layout, 3 classes on axis 1.
    assert_eq!(
        labels_of("ops/tied_head.onnx", with(vec![2, 7])).unwrap(),
        (vec![2, 7], Some(3))
    );
    let err = labels_of("ops/tied_head.onnx", with(vec![3, 7])).unwrap_err();
    assert!(err.contains("fit neither"), "{err}");
    // The flag decides without labels.
    let second = ImportOptions {
        class_axis: ClassAxis::Second,
        ..Default::default()
    };
    assert_eq!(
        labels_of("ops/tied_head.onnx", second).unwrap(),
        (vec![2, 7], Some(3))
    );
    // [2, 3, 3] with labels [2, 3]: both fit, an error that says so and names the flag.
    let err = labels_of("errors/class_axis_square.onnx", with(vec![2, 3])).unwrap_err();
    assert_mentions(&err, &["both readings fit", "--class-axis"]);
}

#[test]
fn cross_entropy_on_axis_1_matches_numpys_over_the_moved_axis() {
    // The [N, C, d1] reading of tied_head's logits against numpy's loss (fixture's ce_axis1).
    let dir = fixtures().join("ops");
    let doc = json(&dir.join("tied_head.json"));
    let opts = ImportOptions {
        loss: Loss::CrossEntropy { logits: None },
        class_axis: ClassAxis::Second,
        ..Default::default()
    };
    let imp = import(&dir.join("tied_head.onnx"), &opts).unwrap();
    let mut leaves = weights(&imp);
    leaves.insert("x".into(), tensor(&doc["x"], DType::F32));
    leaves.insert("y".into(), tensor(&doc["y_axis1"], DType::F32));
    let vals = run_graph(&imp.model.graph, &leaves).unwrap();
    let got = vals.outputs["loss"].to_f64_vec()[0];
    let want = doc["ce_axis1"].as_f64().unwrap();
    assert!(close(got, want, 1e-5), "{got} vs numpy {want}");
}

#[test]
fn a_causal_mask_buffer_is_computed_from_iotas_not_stored() {
    let imp = import_mse("ops/causal_mask_buffer.onnx").unwrap();
    let g = &imp.model.graph;
    assert!(g.leaves(ingot_compiler::ir::LeafKind::State).is_empty());
    assert!(imp.weights.is_empty(), "{:?}", imp.weights.keys());
    assert!(g
        .nodes()
        .iter()
        .any(|n| matches!(n.op, ingot_compiler::ir::Op::Iota { .. })));
}

#[test]
fn a_constant_with_no_pattern_is_a_state_leaf_holding_its_elements_once() {
    // A [3, 1] constant expanded to [3, 4]: the state holds its 3 elements, broadcast.
    let imp = import_mse("ops/constant_expand.onnx").unwrap();
    let w: Vec<(&String, &ingot_onnx::Weight)> = imp.weights.iter().collect();
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].1.kind, ingot_compiler::ir::LeafKind::State);
    assert_eq!(w[0].1.ty.shape.dims(), [3, 1]);
    assert_eq!(w[0].1.bytes.len(), 3 * 4);
}

#[test]
fn initializers_the_options_freeze_are_constants_not_parameters() {
    let path = fixtures().join("ops/add_broadcast.onnx");
    let mse = || ImportOptions {
        loss: Loss::Mse { output: None },
        ..Default::default()
    };
    let trained = import(&path, &mse()).unwrap();
    assert_eq!(
        trained.weights["b"].kind,
        ingot_compiler::ir::LeafKind::Parameter
    );
    let frozen = import(
        &path,
        &ImportOptions {
            frozen: vec!["b".into()],
            ..mse()
        },
    )
    .unwrap();
    assert!(frozen
        .model
        .graph
        .leaves(ingot_compiler::ir::LeafKind::Parameter)
        .is_empty());
    assert_eq!(
        frozen.weights["b"].kind,
        ingot_compiler::ir::LeafKind::State
    );
}

#[test]
fn with_the_exporters_list_of_parameters_every_other_initializer_is_a_constant() {
    let imp = import_mse("ops/gemm_listed_parameters.onnx").unwrap();
    let g = &imp.model.graph;
    let params: Vec<&str> = leaf_names(g, ingot_compiler::ir::LeafKind::Parameter);
    assert_eq!(params, ["fc.weight"]);
    assert_eq!(
        imp.weights["fc.bias"].kind,
        ingot_compiler::ir::LeafKind::State
    );
}

#[test]
fn every_supported_op_type_appears_in_a_fixture() {
    use ingot_onnx::proto::ModelProto;
    use prost::Message;
    let mut seen = std::collections::BTreeSet::new();
    for dir in ["ops", "errors", "random"] {
        for e in std::fs::read_dir(fixtures().join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "onnx") {
                let m = ModelProto::decode(std::fs::read(&p).unwrap().as_slice()).unwrap();
                for n in &m.graph.unwrap().node {
                    seen.insert(n.op_type().to_string());
                }
            }
        }
    }
    let missing: Vec<&&str> = ingot_onnx::SUPPORTED
        .iter()
        .filter(|op| !seen.contains(**op))
        .collect();
    assert!(missing.is_empty(), "no fixture has {missing:?}");
}
