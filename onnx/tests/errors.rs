//! Bad files and graphs Ingot cannot import are errors that say what is wrong and where, never
//! panics: truncated and garbage bytes, a cycle, a dangling name, unsupported ops (every one
//! listed, with its op type and node name), symbolic axes without sizes, external data outside
//! the model's folder or of the wrong size, and a file over the size cap.

mod support;

use ingot_onnx::{check, check_bytes, import, import_bytes, ImportOptions, Loss, OnnxError};
use ingot_testkit::text::assert_mentions;
use std::collections::BTreeMap;
use support::*;

fn err_of(r: Result<ingot_onnx::Imported, OnnxError>) -> OnnxError {
    match r {
        Ok(_) => panic!("imported, but it should not"),
        Err(e) => e,
    }
}

fn mse() -> ImportOptions {
    ImportOptions {
        loss: Loss::Mse { output: None },
        ..Default::default()
    }
}

#[test]
fn a_truncated_file_is_a_decode_error_at_every_length_never_a_panic() {
    let bytes = std::fs::read(fixtures().join("ops/cnn.onnx")).unwrap();
    let mut errors = 0;
    for len in (0..bytes.len()).step_by(3) {
        if import_bytes(&bytes[..len], "cnn.onnx", &mse()).is_err() {
            errors += 1;
        }
    }
    assert!(
        errors > bytes.len() / 3 - 2,
        "only {errors} truncations refused"
    );
    let e = err_of(import_bytes(&bytes[..bytes.len() / 2], "cnn.onnx", &mse())).to_string();
    assert_mentions(&e, &["cnn.onnx", "not a readable ONNX model"]);
}

#[test]
fn garbage_and_empty_files_are_refused_naming_the_file() {
    let mut state = 0x1234_5678_9abc_def0u64;
    let garbage: Vec<u8> = (0..4096)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    let e = err_of(import_bytes(&garbage, "noise.onnx", &mse()));
    assert!(matches!(e, OnnxError::Decode { .. }), "{e}");
    assert!(e.to_string().contains("noise.onnx"), "{e}");
    let e = err_of(import_bytes(&[], "empty.onnx", &mse())).to_string();
    assert!(e.contains("empty"), "{e}");
    let dir = std::env::temp_dir().join(format!("ingot-onnx-garbage-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("noise.onnx");
    std::fs::write(&p, &garbage).unwrap();
    assert!(check(&p).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cycle_is_an_error_naming_the_nodes_on_it() {
    let e = err_of(import(&fixtures().join("errors/cycle.onnx"), &mse())).to_string();
    assert_mentions(&e, &["cycle", "first", "second"]);
}

#[test]
fn a_dangling_input_name_is_an_error_naming_the_node_and_the_name() {
    let e = err_of(import(&fixtures().join("errors/dangling.onnx"), &mse())).to_string();
    assert_mentions(&e, &["add_missing", "nowhere"]);
}

#[test]
fn every_unsupported_node_is_listed_with_its_op_type_and_name_and_what_is_needed() {
    let path = fixtures().join("errors/unsupported.onnx");
    let listed = check(&path).unwrap();
    let names: Vec<(&str, &str)> = listed
        .iter()
        .map(|u| (u.op_type.as_str(), u.node.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("Hardmax", "the_hardmax"),
            ("Resize", "upsample"),
            ("Softmax", "softmax_with_junk"),
            ("MaxPool", "pool_ceil")
        ]
    );
    assert!(listed[0].reason.contains("no mapping"), "{}", listed[0]);
    assert!(listed[1].reason.contains("cubic"), "{}", listed[1]);
    assert!(listed[2].reason.contains("\"junk\""), "{}", listed[2]);
    assert!(listed[3].reason.contains("ceil_mode"), "{}", listed[3]);
    let e = err_of(import(&path, &mse()));
    let OnnxError::Unsupported(items) = &e else {
        panic!("{e}")
    };
    assert_eq!(items, &listed);
    let text = e.to_string();
    assert!(
        text.contains("4 node(s)") && text.contains("the_hardmax") && !text.contains("fine_relu"),
        "{text}"
    );
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(check_bytes(&bytes, "u").unwrap(), listed);
}

#[test]
fn a_pad_in_wrap_mode_is_refused_naming_the_node_and_the_modes_imported() {
    let path = fixtures().join("errors/pad_wrap.onnx");
    let listed = check(&path).unwrap();
    let names: Vec<(&str, &str)> = listed
        .iter()
        .map(|u| (u.op_type.as_str(), u.node.as_str()))
        .collect();
    assert_eq!(names, [("Pad", "the_wrap_pad")]);
    assert_mentions(
        &listed[0].reason,
        &["\"wrap\"", "constant, reflect and edge"],
    );
    let e = err_of(import(&path, &mse())).to_string();
    assert_mentions(&e, &["Pad", "the_wrap_pad", "wrap"]);
}

#[test]
fn pads_that_crop_an_axis_to_nothing_or_reflect_past_it_are_errors_naming_the_node() {
    let e = err_of(import(&fixtures().join("errors/pad_crop_all.onnx"), &mse())).to_string();
    assert_mentions(&e, &["the_pad_crop_all", "axis 1 (size 3) to nothing"]);
    let e = err_of(import(
        &fixtures().join("errors/pad_reflect_wide.onnx"),
        &mse(),
    ))
    .to_string();
    assert_mentions(
        &e,
        &[
            "the_pad_reflect_wide",
            "reflect pads (3, 0) on axis 1",
            "3 kept",
        ],
    );
}

#[test]
fn a_supported_model_checks_clean() {
    assert_eq!(check(&fixtures().join("ops/cnn.onnx")).unwrap(), vec![]);
}

#[test]
fn a_symbolic_batch_needs_a_batch_size_and_takes_the_one_given() {
    let path = fixtures().join("errors/symbolic_batch.onnx");
    let e = err_of(import(&path, &mse())).to_string();
    assert_mentions(&e, &["\"input\"", "axis 0", "--batch"]);
    let opts = ImportOptions {
        batch: Some(5),
        ..mse()
    };
    let imp = import(&path, &opts).unwrap();
    let x = imp.model.graph.leaf("x").unwrap();
    assert_eq!(imp.model.graph.ty(x).shape.dims(), [5, 3]);
    assert_eq!(
        imp.inputs,
        [
            ("input".to_string(), "x".to_string()),
            (String::new(), "y".to_string())
        ]
    );
}

#[test]
fn a_fixed_batch_in_the_file_cannot_be_changed() {
    let opts = ImportOptions {
        batch: Some(7),
        ..mse()
    };
    let e = err_of(import(&fixtures().join("ops/relu.onnx"), &opts)).to_string();
    assert!(e.contains("fixed size 3") && e.contains('7'), "{e}");
}

#[test]
fn another_symbolic_axis_is_named_and_sized_by_its_name() {
    let path = fixtures().join("errors/symbolic_seq.onnx");
    let e = err_of(import(&path, &mse())).to_string();
    assert_mentions(&e, &["axis 1", "\"seq\""]);
    let opts = ImportOptions {
        dims: BTreeMap::from([("seq".to_string(), 4)]),
        ..mse()
    };
    let imp = import(&path, &opts).unwrap();
    let x = imp.model.graph.leaf("x").unwrap();
    assert_eq!(imp.model.graph.ty(x).shape.dims(), [2, 4]);
}

#[test]
fn external_data_loads_from_the_models_folder() {
    let imp = import(&fixtures().join("errors/external/model.onnx"), &mse()).unwrap();
    let w = &weights(&imp)["W"];
    let want: Vec<f64> = (0..6).map(|i| (i as f32 / 10.0) as f64).collect();
    assert_eq!(w.to_f64_vec(), want);
}

#[test]
fn external_data_outside_the_models_folder_or_of_the_wrong_size_is_refused() {
    let dir = fixtures().join("errors/external");
    let e = err_of(import(&dir.join("escape.onnx"), &mse())).to_string();
    assert_mentions(&e, &["\"W\"", "inside the model's folder"]);
    let e = err_of(import(&dir.join("short.onnx"), &mse())).to_string();
    assert_mentions(&e, &["length 20", "24 bytes"]);
    let bytes = std::fs::read(dir.join("model.onnx")).unwrap();
    let e = err_of(import_bytes(&bytes, "model.onnx", &mse())).to_string();
    assert!(e.contains("external file"), "{e}");
}

#[test]
fn a_file_over_the_size_cap_is_refused_before_it_is_read() {
    let opts = ImportOptions {
        max_file_bytes: 100,
        ..mse()
    };
    let e = err_of(import(&fixtures().join("ops/conv.onnx"), &opts)).to_string();
    assert!(e.contains("over the limit of 100 bytes"), "{e}");
    let e = err_of(import(&fixtures().join("ops/no_such_file.onnx"), &mse())).to_string();
    assert!(e.contains("no_such_file.onnx"), "{e}");
}

#[test]
fn a_loss_that_is_not_a_scalar_asks_for_cross_entropy_or_mse() {
    let e = err_of(import(
        &fixtures().join("ops/relu.onnx"),
        &ImportOptions::default(),
    ))
    .to_string();
    assert!(
        e.contains("scalar float outputs") || e.contains("not a float scalar"),
        "{e}"
    );
}

#[test]
fn importing_twice_gives_equal_models_and_weights() {
    let path = fixtures().join("ops/cnn.onnx");
    let opts = classifier();
    let (a, b) = (import(&path, &opts).unwrap(), import(&path, &opts).unwrap());
    assert_eq!(a.model, b.model);
    assert_eq!(a.weights, b.weights);
}

#[test]
fn flipping_any_byte_of_a_model_gives_an_import_or_an_error_never_a_panic() {
    let mut imported = 0;
    let mut refused = 0;
    for name in [
        "gpt",
        "cnn",
        "shape_folding",
        "conv_groups_dilation_stride",
        "slice",
    ] {
        let bytes = std::fs::read(fixtures().join(format!("ops/{name}.onnx"))).unwrap();
        let step = (bytes.len() / 400).max(1);
        for at in (0..bytes.len()).step_by(step) {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[at] ^= flip;
                let opts = classifier();
                match import_bytes(&b, name, &opts) {
                    Ok(_) => imported += 1,
                    Err(_) => refused += 1,
                }
            }
        }
    }
    assert!(
        imported > 0 && refused > 0,
        "{imported} imported, {refused} refused"
    );
}
