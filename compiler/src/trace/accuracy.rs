//! Top-k accuracy counted inside the evaluation step, beside the loss.
//!
//! Why in the step: the accuracy needs each row's logits, and a classifier's logits at
//! evaluation are `[batch, classes]` values that the step otherwise never writes out. Reading
//! them back would make the logits an output of the step (kept in the plan past the loss,
//! copied to the host every batch, and for a bf16 step converted too). Counting in the step
//! costs one compare and two row sums over the logits, which fuse with the loss head's own
//! passes, and gives two scalars ([`TOP1`], [`TOP5`]) that the trainer reads as it reads the
//! loss: no buffer grows, nothing is allocated, and the planned memory stays the memory used.
//!
//! A row counts as correct at k when fewer than k classes have a logit strictly greater than
//! the label's. With distinct logits this is `label in logits.topk(k).indices`, as torchvision's
//! reference scripts count it; on exact ties the label is given the better rank (PyTorch's
//! `topk` breaks ties by position, which no model's accuracy should hang on).
//!
//! [`with_top_k_counts`] finds the logits and labels of a loss built by
//! [`super::nn::softmax_cross_entropy`] over a rank-1 label input `y` (a classifier's), so it
//! needs no help from the model: the built-in classifiers and imported ones with
//! `--loss cross-entropy` alike.

use super::nn::softmax_cross_entropy_parts;
use crate::error::Result;
use crate::ir::CmpOp;
use crate::ir::{DType, Graph, NodeId};

/// The output holding the batch's count of rows whose label is the top class.
pub const TOP1: &str = "top1";
/// The output holding the batch's count of rows whose label is among the top five classes
/// (among all of them when there are fewer than five).
pub const TOP5: &str = "top5";

/// `g` (a classifier's forward pass) with two more scalar f32 outputs, [`TOP1`] and [`TOP5`]:
/// how many rows of the batch the logits rank correctly at k = 1 and 5. `None` when `g` has no
/// softmax cross-entropy of `[N, C]` logits against the rank-1 input `y` (a language model's
/// loss, an MSE, a loss written by hand).
pub fn with_top_k_counts(g: &Graph) -> Result<Option<Graph>> {
    let Some((logits, hot)) = softmax_cross_entropy_parts(g) else {
        return Ok(None);
    };
    let mut out = g.clone();
    let classes = out.ty(logits).shape.dims()[1];
    let rank = out.scoped("accuracy", |g| rank_of_label(g, logits, hot))?;
    for (name, k) in [(TOP1, 1), (TOP5, 5.min(classes))] {
        let count = out.scoped("accuracy", |g| correct_within(g, rank, k))?;
        out.set_output(name, count)?;
    }
    Ok(Some(out))
}

/// Each row's count of classes whose logit is strictly greater than the label's (`[N, 1]`,
/// f32): `hot` marks the label's column of `logits` (`[N, C]`).
pub fn rank_of_label(g: &mut Graph, logits: NodeId, hot: NodeId) -> Result<NodeId> {
    let dtype = g.ty(logits).dtype;
    let zero = g.full(0.0, crate::ir::Shape::scalar(), dtype)?;
    let picked = g.select(hot, logits, zero)?;
    let label = g.sum(picked, &[1])?;
    let above = g.compare(CmpOp::Gt, logits, label)?;
    let above = ones_where(g, above)?;
    g.sum(above, &[1])
}

/// 1.0 where `mask` holds, else 0.0 (f32): a select, the way the loss picks its label column.
fn ones_where(g: &mut Graph, mask: NodeId) -> Result<NodeId> {
    let one = g.full(1.0, crate::ir::Shape::scalar(), DType::F32)?;
    let zero = g.full(0.0, crate::ir::Shape::scalar(), DType::F32)?;
    g.select(mask, one, zero)
}

/// How many rows of `rank` ([`rank_of_label`]) are under `k`: a scalar f32.
pub fn correct_within(g: &mut Graph, rank: NodeId, k: usize) -> Result<NodeId> {
    let limit = g.full(k as f64, crate::ir::Shape::scalar(), DType::F32)?;
    let hit = g.compare(CmpOp::Lt, rank, limit)?;
    let hit = ones_where(g, hit)?;
    g.sum_all(hit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::LeafKind;
    use crate::trace::nn;

    /// A classifier head over given logits: `loss = softmax_cross_entropy(logits, y)`.
    fn head(n: usize, c: usize) -> Graph {
        let mut g = Graph::new();
        let x = g.input("x", [n, c], DType::F32).unwrap();
        let y = g.input("y", [n], DType::I64).unwrap();
        let loss = nn::softmax_cross_entropy(&mut g, x, y).unwrap();
        g.set_output("loss", loss).unwrap();
        g
    }

    #[test]
    fn the_counts_are_found_and_added_beside_the_loss() {
        let g = with_top_k_counts(&head(4, 7)).unwrap().unwrap();
        for name in ["loss", TOP1, TOP5] {
            let id = g.outputs[name];
            assert_eq!(g.ty(id).shape.rank(), 0, "{name}");
        }
        assert_eq!(g.leaves(LeafKind::Input).len(), 2);
    }

    #[test]
    fn a_loss_without_class_labels_gets_no_counts() {
        let mut g = Graph::new();
        let x = g.input("x", [4, 3], DType::F32).unwrap();
        let s = g.sum_all(x).unwrap();
        g.set_output("loss", s).unwrap();
        assert!(with_top_k_counts(&g).unwrap().is_none());
    }
}
