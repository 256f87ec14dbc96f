//! What the generation tests share (trainer/tests/generate.rs on the CPU, cuda_generate.rs on a
//! GPU): a GPT with weights large enough that its logits differ clearly, a generation with the
//! logits of each token, and how far two rows of logits are apart.

use indexmap::IndexMap;
use ingot_compiler::ir::LeafKind;
use ingot_compiler::model::Model;
use ingot_runtime::tensor::{Data, Tensor};
use ingot_trainer::generate::{Generator, Sampling};

/// The model `spec` and its parameters drawn from `seed`, the matrices scaled up from GPT-2's
/// 0.02 (the layer norms left as they are).
pub fn model_and_weights(spec: &str, seed: u64) -> (Model, IndexMap<String, Tensor>) {
    let m = ingot_models::by_name(spec).unwrap();
    let mut w = ingot_trainer::init::init_leaves(&m.graph, LeafKind::Parameter, seed);
    for (name, t) in w.iter_mut() {
        if let (Data::F32(v), false) = (&mut t.data, name.contains("ln")) {
            v.iter_mut().for_each(|x| *x *= 25.0);
        }
    }
    (m, w)
}

/// The tokens of a generation and, for each, the logits it was drawn from.
pub fn run_observed(
    g: &mut Generator,
    prompt: &[u32],
    n: usize,
    s: &Sampling,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let (mut tokens, mut logits) = (Vec::new(), Vec::new());
    g.generate_observed(prompt, n, s, |t, l| {
        tokens.push(t);
        logits.push(l.to_vec());
        Ok(())
    })
    .unwrap();
    (tokens, logits)
}

/// The largest difference between two rows of logits over the largest magnitude in `want`.
pub fn relative_difference(got: &[f32], want: &[f32]) -> f64 {
    let scale = want.iter().fold(0f64, |m, &v| m.max(v.abs() as f64));
    let diff = got
        .iter()
        .zip(want)
        .fold(0f64, |m, (&a, &b)| m.max((a as f64 - b as f64).abs()));
    diff / scale.max(f64::MIN_POSITIVE)
}

/// Asserts that each row of `got` is within `tolerance` ([`relative_difference`]) of the row of
/// `want` at its position; `what` names the rows' logits in the message ("token 3: {what}").
#[track_caller]
pub fn assert_logits_within(got: &[Vec<f32>], want: &[Vec<f32>], tolerance: f64, what: &str) {
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        let r = relative_difference(a, b);
        assert!(r <= tolerance, "token {i}: {what} differ by {r:e} relative");
    }
}
