//! A GPT and weights large enough that its logits differ clearly, for the generation tests
//! (trainer/tests/generate.rs on the CPU, cuda_generate.rs on a GPU).

use indexmap::IndexMap;
use ingot_compiler::ir::LeafKind;
use ingot_compiler::models::{self, Model};
use ingot_runtime::tensor::{Data, Tensor};

/// The model `spec` and its parameters drawn from `seed`, the matrices scaled up from GPT-2's
/// 0.02 (the layer norms left as they are).
pub fn model_and_weights(spec: &str, seed: u64) -> (Model, IndexMap<String, Tensor>) {
    let m = models::by_name(spec).unwrap();
    let mut w = ingot_trainer::init::init_leaves(&m.graph, LeafKind::Parameter, seed);
    for (name, t) in w.iter_mut() {
        if let (Data::F32(v), false) = (&mut t.data, name.contains("ln")) {
            v.iter_mut().for_each(|x| *x *= 25.0);
        }
    }
    (m, w)
}
