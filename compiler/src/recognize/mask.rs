//! Masks computed from constants alone, evaluated on the host.
//!
//! Exporters write a causal or padding mask in many ways: PyTorch's SDPA export adds
//! `where(trilu(ones) == 0, -inf, 0)` to the scores, transformers' BERT adds a mask built from an
//! `attention_mask` input (held at 1 by the importer, so a chain of constant selects), others
//! select a fill where `j > i`. Rather than match each spelling, a mask whose value depends on no
//! leaf (only `full`, `iota` and elementwise, broadcast and layout ops over them) is evaluated
//! here, in its own shape before the broadcast to the scores, and its values decide: all zero is
//! no mask, zero exactly where the key is visible (`j <= i`) and a fill no softmax can tell from
//! `-inf` elsewhere is the causal mask. Anything else (a mask that reads data, a padding pattern,
//! a mask too large to evaluate) leaves the chain as it is.

use crate::ir::scalar as analysis;
use crate::ir::{Graph, NodeId, Op};
use std::collections::HashMap;
use std::rc::Rc;

/// Fills at most this value (or `-inf`) make a masked score's probability exactly 0.
pub(super) const MASK_FILL_MAX: f64 = -1e30;

/// The most elements one mask node may have (a BERT-base mask, `[8, 1, 512, 512]`, has 2 Mi).
const MAX_ELEMENTS: usize = 1 << 23;

/// What adding a mask does to attention scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Effect {
    /// Every element is zero: the scores are unchanged.
    Nothing,
    /// Exactly the future keys (`j > i`) take a fill at most [`MASK_FILL_MAX`].
    Causal,
}

/// What adding `m` to scores shaped `dims` does, when `m` is computed from constants alone and
/// is one of the [`Effect`]s; `None` otherwise.
pub(super) fn additive(g: &Graph, mut m: NodeId, dims: &[usize]) -> Option<Effect> {
    // The broadcast to the scores' shape is not evaluated: only what it repeats.
    while g.node(m).op == Op::Broadcast {
        m = g.node(m).inputs[0];
    }
    let own = g.ty(m).shape.dims().to_vec();
    let r = dims.len();
    if own.len() > r || r < 2 {
        return None;
    }
    let values = eval(g, m, &mut HashMap::new())?;
    if values.iter().all(|&v| v == 0.0) {
        return Some(Effect::Nothing);
    }
    // Causal: both of the last two axes present in the mask itself.
    let (tq, tk) = (dims[r - 2], dims[r - 1]);
    let n = own.len();
    if n < 2 || own[n - 2] != tq || own[n - 1] != tk {
        return None;
    }
    let causal = values.iter().enumerate().all(|(e, &v)| {
        let (i, j) = ((e / tk) % tq, e % tk);
        if j <= i {
            v == 0.0
        } else {
            v <= MASK_FILL_MAX
        }
    });
    causal.then_some(Effect::Causal)
}

/// `x`'s elements in row-major order, when it depends on no leaf and every node on the way is
/// one this evaluator knows and at most [`MAX_ELEMENTS`] large.
fn eval(g: &Graph, x: NodeId, memo: &mut HashMap<NodeId, Rc<Vec<f64>>>) -> Option<Rc<Vec<f64>>> {
    if let Some(v) = memo.get(&x) {
        return Some(v.clone());
    }
    let node = g.node(x);
    let ty = &node.ty;
    let dims = ty.shape.dims();
    let len = analysis::numel(dims).filter(|&n| n <= MAX_ELEMENTS)?;
    let mut arg = |i: usize| eval(g, node.inputs[i], memo);
    let values: Vec<f64> = match &node.op {
        Op::Full { value } => vec![*value; len],
        Op::Iota { axis } => {
            let inner: usize = dims[axis + 1..].iter().product();
            (0..len)
                .map(|e| ((e / inner) % dims[*axis]) as f64)
                .collect()
        }
        Op::Reshape | Op::StopGradient => arg(0)?.to_vec(),
        Op::Convert => {
            let from = g.ty(node.inputs[0]).dtype;
            let a = arg(0)?;
            a.iter()
                .map(|&v| analysis::convert(v, from, ty.dtype))
                .collect::<Option<_>>()?
        }
        Op::Unary(u) => {
            let a = arg(0)?;
            a.iter()
                .map(|&v| analysis::unary(*u, v, ty.dtype))
                .collect::<Option<_>>()?
        }
        Op::Binary(b) => {
            let (a, c) = (arg(0)?, arg(1)?);
            a.iter()
                .zip(c.iter())
                .map(|(&x, &y)| analysis::binary(*b, x, y, ty.dtype))
                .collect::<Option<_>>()?
        }
        Op::Compare(op) => {
            let (a, c) = (arg(0)?, arg(1)?);
            a.iter()
                .zip(c.iter())
                .map(|(&x, &y)| analysis::compare(*op, x, y))
                .collect()
        }
        Op::Select => {
            let (c, a, b) = (arg(0)?, arg(1)?, arg(2)?);
            (0..len)
                .map(|e| if c[e] != 0.0 { a[e] } else { b[e] })
                .collect()
        }
        Op::Broadcast => {
            let from = g.ty(node.inputs[0]).shape.dims().to_vec();
            let a = arg(0)?;
            let index = Strided::broadcast(dims, &from);
            (0..len).map(|e| a[index.of(e)]).collect()
        }
        Op::Transpose { perm } => {
            let from = g.ty(node.inputs[0]).shape.dims().to_vec();
            let a = arg(0)?;
            let perm = perm.to_vec();
            let index = Strided::transposed(dims, &from, &perm);
            (0..len).map(|e| a[index.of(e)]).collect()
        }
        _ => return None,
    };
    let values = Rc::new(values);
    memo.insert(x, values.clone());
    Some(values)
}

/// Maps an element of an output (row-major, `dims`) to the element of its operand it reads,
/// through one stride per output axis.
struct Strided {
    dims: Vec<usize>,
    strides: Vec<usize>,
}

impl Strided {
    /// A broadcast from `from` (aligned on the right; axes of size 1 repeat) to `dims`.
    fn broadcast(dims: &[usize], from: &[usize]) -> Strided {
        let lead = dims.len() - from.len();
        let own = row_major(from);
        let strides = (0..dims.len())
            .map(|a| match a.checked_sub(lead) {
                Some(f) if from[f] != 1 => own[f],
                _ => 0,
            })
            .collect();
        Strided {
            dims: dims.to_vec(),
            strides,
        }
    }

    /// A transpose: output axis `a` is operand axis `perm[a]`.
    fn transposed(dims: &[usize], from: &[usize], perm: &[usize]) -> Strided {
        let own = row_major(from);
        Strided {
            dims: dims.to_vec(),
            strides: perm.iter().map(|&p| own[p]).collect(),
        }
    }

    fn of(&self, mut e: usize) -> usize {
        let mut at = 0;
        for a in (0..self.dims.len()).rev() {
            at += (e % self.dims[a]) * self.strides[a];
            e /= self.dims[a];
        }
        at
    }
}

fn row_major(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for a in (0..dims.len().saturating_sub(1)).rev() {
        s[a] = s[a + 1] * dims[a + 1];
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{CmpOp, DType};

    const SQ: &[usize] = &[4, 4];

    fn scores() -> [usize; 4] {
        [2, 3, 4, 4]
    }

    /// `where(j > i, fill, 0)` over `[4, 4]`, as PyTorch's SDPA export writes a causal mask.
    fn sdpa_mask(g: &mut Graph, fill: f64) -> NodeId {
        let i = g.iota(SQ, 0, DType::I64).unwrap();
        let j = g.iota(SQ, 1, DType::I64).unwrap();
        let future = g.compare(CmpOp::Gt, j, i).unwrap();
        let f = g.full(fill, SQ, DType::F32).unwrap();
        let z = g.full(0.0, SQ, DType::F32).unwrap();
        g.select(future, f, z).unwrap()
    }

    #[test]
    fn an_exported_causal_mask_added_to_the_scores_is_causal() {
        for fill in [f64::NEG_INFINITY, -3.4028234663852886e38] {
            let mut g = Graph::new();
            let m = sdpa_mask(&mut g, fill);
            let b = g.broadcast_to(m, &scores()[..]).unwrap();
            assert_eq!(
                additive(&g, b, &scores()),
                Some(Effect::Causal),
                "fill {fill}"
            );
        }
    }

    #[test]
    fn a_fill_a_softmax_can_tell_from_minus_infinity_is_no_causal_mask() {
        let mut g = Graph::new();
        let m = sdpa_mask(&mut g, -1e4);
        assert_eq!(additive(&g, m, &scores()), None);
    }

    #[test]
    fn a_mask_hiding_the_diagonal_or_showing_a_future_key_is_not_causal() {
        let mut g = Graph::new();
        let i = g.iota(SQ, 0, DType::I64).unwrap();
        let j = g.iota(SQ, 1, DType::I64).unwrap();
        let f = g.full(f64::NEG_INFINITY, SQ, DType::F32).unwrap();
        let z = g.full(0.0, SQ, DType::F32).unwrap();
        for cmp in [CmpOp::Ge, CmpOp::Lt] {
            let c = g.compare(cmp, j, i).unwrap();
            let m = g.select(c, f, z).unwrap();
            assert_eq!(additive(&g, m, &scores()), None, "{cmp:?}");
        }
    }

    #[test]
    fn a_mask_of_zeros_through_selects_of_constants_masks_nothing() {
        // transformers' BERT with its attention_mask held at 1: constant selects of zeros.
        let mut g = Graph::new();
        let t = g.full(1.0, &[2usize, 1, 1, 4][..], DType::Bool).unwrap();
        let tb = g.broadcast_to(t, &[2usize, 1, 4, 4][..]).unwrap();
        let z = g.full(0.0, &[2usize, 1, 4, 4][..], DType::F32).unwrap();
        let f = g
            .full(f64::NEG_INFINITY, &[2usize, 1, 4, 4][..], DType::F32)
            .unwrap();
        let m = g.select(tb, z, f).unwrap();
        assert_eq!(additive(&g, m, &scores()), Some(Effect::Nothing));
    }

    #[test]
    fn a_mask_read_from_a_leaf_is_not_evaluated() {
        let mut g = Graph::new();
        let x = g.input("mask", SQ, DType::F32).unwrap();
        assert_eq!(additive(&g, x, &scores()), None);
    }

    #[test]
    fn a_transposed_mask_is_evaluated_in_its_own_order() {
        // (j > i) transposed is (i > j): future keys visible, the past hidden: not causal;
        // transposing the transposed iotas' compare back gives the causal mask.
        let mut g = Graph::new();
        let m = sdpa_mask(&mut g, f64::NEG_INFINITY);
        let t = g.transpose(m, &[1, 0]).unwrap();
        assert_eq!(additive(&g, t, &scores()), None);
        let tt = g.transpose(t, &[1, 0]).unwrap();
        assert_eq!(additive(&g, tt, &scores()), Some(Effect::Causal));
    }
}
