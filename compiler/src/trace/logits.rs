//! The logits of a trained model as an output of its forward pass: what prediction and text
//! generation read, where training and evaluation read only the loss.
//!
//! Why found rather than declared: every model Ingot trains with a softmax cross-entropy
//! (the built-in classifiers and GPTs, IR files, imported ONNX models with
//! `--loss cross-entropy`) builds it with [`super::nn::softmax_cross_entropy`], whose shape
//! [`super::nn::cross_entropy_parts`] recognises; so one mechanism serves them all and no model
//! has to name its logits.

use super::nn::cross_entropy_parts;
use crate::error::{IrError, Result};
use crate::ir::{Graph, NodeId};

/// The output holding the logits, `[rows, classes]`: one row per label element of `y`.
pub const LOGITS: &str = "logits";

/// The logits node of `g`'s softmax cross-entropy, or an error saying the model has none.
fn logits_of(g: &Graph) -> Result<NodeId> {
    cross_entropy_parts(g)
        .map(|(logits, _)| logits)
        .ok_or_else(|| {
            IrError::Invalid(
                "the model's loss is not a softmax cross-entropy of logits against the labels y, \
             so it has no logits to predict from"
                    .into(),
            )
        })
}

/// `g` (a forward pass) with its logits as one more output, [`LOGITS`], beside the loss (and
/// any other outputs): for predictions over a labelled data set, whose loss is reported too.
pub fn with_logits(g: &Graph) -> Result<Graph> {
    let logits = logits_of(g)?;
    let mut out = g.clone();
    out.set_output(LOGITS, logits)?;
    Ok(out)
}

/// `g` (a forward pass) reduced to its logits: the only output is [`LOGITS`], and the labels
/// input `y` and everything that read it (the loss) are gone, so the step takes only `x`.
/// This is what a language model's generation step runs.
pub fn logits_only(g: &Graph) -> Result<Graph> {
    let logits = logits_of(g)?;
    let y = g.leaf("y");
    let mut out = g.clone();
    out.outputs.clear();
    out.set_output(LOGITS, logits)?;
    Ok(out.without_dead_code_and(|id| Some(id) == y).0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{DType, LeafKind};
    use crate::trace::nn;

    #[test]
    fn a_language_models_logits_are_found_and_its_labels_dropped() {
        let m =
            crate::models::by_name("gpt:vocab=16,d_model=8,layers=1,heads=2,d_ff=16,seq=4,batch=1")
                .unwrap();
        let g = logits_only(&m.graph).unwrap();
        assert_eq!(g.outputs.len(), 1);
        assert_eq!(g.ty(g.outputs[LOGITS]).shape.dims(), &[4, 16]);
        let inputs: Vec<_> = g
            .leaves(LeafKind::Input)
            .into_iter()
            .map(|id| g.leaf_name(id).unwrap().to_string())
            .collect();
        assert_eq!(inputs, ["x"]);
        assert_eq!(
            g.leaves(LeafKind::Parameter).len(),
            m.graph.leaves(LeafKind::Parameter).len()
        );
    }

    #[test]
    fn a_classifiers_logits_join_its_loss() {
        let mut g = Graph::new();
        let x = g.input("x", [3, 5], DType::F32).unwrap();
        let y = g.input("y", [3], DType::I64).unwrap();
        let loss = nn::softmax_cross_entropy(&mut g, x, y).unwrap();
        g.set_output("loss", loss).unwrap();
        let with = with_logits(&g).unwrap();
        assert_eq!(with.outputs[LOGITS], x);
        assert!(with.outputs.contains_key("loss"));
    }

    #[test]
    fn a_loss_without_logits_is_an_error_saying_so() {
        let mut g = Graph::new();
        let x = g.input("x", [4, 3], DType::F32).unwrap();
        let s = g.sum_all(x).unwrap();
        g.set_output("loss", s).unwrap();
        let e = logits_only(&g).unwrap_err().to_string();
        assert!(e.contains("softmax cross-entropy"), "{e}");
    }
}
