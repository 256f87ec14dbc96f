//! Shared by the importer's tests: the fixtures' folder, their JSON tensors, and an imported
//! model's leaves as runtime tensors.
#![allow(dead_code)]

use indexmap::IndexMap;
use ingot_compiler::ir::{DType, Shape, TensorType};
use ingot_onnx::Imported;
use ingot_runtime::tensor::Tensor;
use serde_json::Value;
use std::path::PathBuf;

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The fixture `file` (relative to the fixtures' folder) imported with a mean-squared-error loss
/// and every other option at its default.
pub fn import_mse(file: &str) -> ingot_onnx::Result<Imported> {
    ingot_onnx::import(
        &fixtures().join(file),
        &ingot_onnx::ImportOptions {
            loss: ingot_onnx::Loss::Mse { output: None },
            ..Default::default()
        },
    )
}

/// A classifier's import: cross-entropy over the model's one output, classes on its last axis.
pub fn classifier() -> ingot_onnx::ImportOptions {
    ingot_onnx::ImportOptions {
        loss: ingot_onnx::Loss::CrossEntropy { logits: None },
        class_axis: ingot_onnx::ClassAxis::Last,
        ..Default::default()
    }
}

/// The file at `path` imported as a classifier ([`classifier`]).
pub fn import_classifier(path: &std::path::Path) -> Imported {
    ingot_onnx::import(path, &classifier()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Asserts that the fixture `file`, imported as [`import_mse`] does, is refused with an error
/// that mentions each of `words`.
pub fn assert_mse_import_refused(file: &str, words: &[&str]) {
    match import_mse(file) {
        Ok(_) => panic!("{file} imported"),
        Err(e) => ingot_testkit::text::assert_mentions(&e.to_string(), words),
    }
}

/// The names of `g`'s leaves of `kind`, in the graph's order.
pub fn leaf_names(g: &ingot_compiler::ir::Graph, kind: ingot_compiler::ir::LeafKind) -> Vec<&str> {
    g.leaves(kind)
        .into_iter()
        .map(|id| g.leaf_name(id).unwrap())
        .collect()
}

/// A tensor of the fixtures' JSON form (`{"shape", "dtype": "f32"|"i64", "data"}`), with
/// floats as `float`.
pub fn tensor(v: &Value, float: DType) -> Tensor {
    let shape: Vec<usize> = v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    let data = v["data"].as_array().unwrap();
    match (v["dtype"].as_str().unwrap(), float) {
        ("i64", _) => Tensor::from_i64(
            Shape::new(&shape),
            data.iter().map(|x| x.as_i64().unwrap()).collect(),
        ),
        (_, DType::F64) => Tensor::from_f64(
            Shape::new(&shape),
            data.iter().map(|x| x.as_f64().unwrap()).collect(),
        ),
        _ => Tensor::from_f32(
            Shape::new(&shape),
            data.iter().map(|x| x.as_f64().unwrap() as f32).collect(),
        ),
    }
}

/// A JSON array of numbers.
pub fn f64s(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

pub fn json(path: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The imported weights (parameters and state) as tensors, by leaf name.
pub fn weights(imp: &Imported) -> IndexMap<String, Tensor> {
    imp.weights
        .iter()
        .map(|(k, w)| {
            (
                k.clone(),
                Tensor::from_le_bytes(w.ty.clone(), &w.bytes).unwrap(),
            )
        })
        .collect()
}

/// Zeros of a leaf's type.
pub fn zeros(ty: &TensorType) -> Tensor {
    Tensor::zeros(ty.clone())
}

/// Whether `got` is within `rel` of `want` relative to its size, with an absolute floor of
/// `rel / 10` for values near zero.
pub fn close(got: f64, want: f64, rel: f64) -> bool {
    (got - want).abs() <= rel * want.abs().max(0.1) || got == want
}
