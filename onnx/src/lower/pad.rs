//! `Pad` on Ingot's primitives, axis by axis: a negative pad is a crop (`slice`); a constant
//! pad joins blocks of the value (`full`) before and after (`concat`); an edge pad joins the
//! first (last) element broadcast to the pad's width; a reflect pad joins single-element
//! slices in mirrored order (`x[p], .., x[1]` before, `x[n-2], .., x[n-1-p]` after). Every
//! piece is a slice, a broadcast, a constant or a join, so autodiff already has the gradient:
//! a reflected element's gradient is the sum of its copies'. Padding the axes one after
//! another is what ONNX's n-dimensional pad computes in each mode (a corner of a constant pad
//! is the value; of an edge or reflect pad, the padded row's pad).

use super::*;

/// What a `Pad` node puts outside the input.
#[derive(Clone, Copy, Debug, PartialEq)]
enum PadMode {
    Constant(f64),
    Reflect,
    Edge,
}

/// Each axis's `(begin, end)` pad from ONNX's `pads` (`[x1_begin, x2_begin, .., x1_end,
/// x2_end]`, one pair per axis of `axes`, or of every axis without it); axes not listed are
/// not padded. Negative pads crop.
pub(super) fn pad_pairs(rank: usize, pads: &[i64], axes: Option<&[i64]>) -> R<Vec<(i64, i64)>> {
    let axes: Vec<usize> = match axes {
        Some(a) => {
            let mut seen = vec![false; rank];
            let mut out = Vec::with_capacity(a.len());
            for &ax in a {
                let ax = norm_axis(ax, rank)?;
                if std::mem::replace(&mut seen[ax], true) {
                    return Err(format!("axes {a:?} repeat axis {ax}"));
                }
                out.push(ax);
            }
            out
        }
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(format!(
            "pads {pads:?} must hold {} values (a begin and an end for each of {} axes)",
            2 * axes.len(),
            axes.len()
        ));
    }
    let mut out = vec![(0, 0); rank];
    for (i, &ax) in axes.iter().enumerate() {
        out[ax] = (pads[i], pads[i + axes.len()]);
    }
    Ok(out)
}

impl Lower<'_> {
    /// Pad (opset 11 on: `pads`, `constant_value` and, from opset 18, `axes` as inputs; before
    /// 11, `pads` and `value` as attributes) in constant, reflect and edge modes.
    pub(super) fn pad(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let x = self.arg(n, 0)?;
        let d = self.dims(&x);
        let pads = match self.konst_i64s(n, 1)? {
            Some(p) => p,
            None => at.ints("pads").ok_or("needs pads (input 1)")?,
        };
        let axes = self.konst_i64s(n, 3)?;
        let pairs = pad_pairs(d.len(), &pads, axes.as_deref())?;
        let mode = match at.string("mode", "constant").as_str() {
            "constant" => PadMode::Constant(match self.konst(n, 2)? {
                Some(c) => c.scalar().ok_or_else(|| {
                    format!("constant_value must be one value, got shape {:?}", c.dims)
                })?,
                None => at.float("value", 0.0),
            }),
            "reflect" => PadMode::Reflect,
            "edge" => PadMode::Edge,
            other => {
                return Err(format!(
                    "mode {other:?} is not imported (constant, reflect, edge)"
                ))
            }
        };
        let mut x = self.node(&x, &n.input[0])?;
        for (axis, &(begin, end)) in pairs.iter().enumerate() {
            if (begin, end) != (0, 0) {
                x = self.pad_one_axis(x, axis, begin, end, mode)?;
            }
        }
        one(x)
    }

    /// `x` cropped by the negative and padded by the positive of `begin` and `end` on `axis`.
    fn pad_one_axis(
        &mut self,
        x: NodeId,
        axis: usize,
        begin: i64,
        end: i64,
        mode: PadMode,
    ) -> R<NodeId> {
        let d = self.g.ty(x).shape.dims().to_vec();
        let size = d[axis] as i64;
        let (from, to) = (begin.min(0).abs(), size + end.min(0));
        if from >= to {
            return Err(format!(
                "pads ({begin}, {end}) crop axis {axis} (size {size}) to nothing: Ingot's tensors cannot be zero-sized"
            ));
        }
        let x = if (from, to) == (0, size) {
            x
        } else {
            ir(self.g.slice(x, axis, from as usize, to as usize))?
        };
        let kept = (to - from) as usize;
        let (before, after) = (begin.max(0) as usize, end.max(0) as usize);
        if before == 0 && after == 0 {
            return Ok(x);
        }
        if mode == PadMode::Reflect && before.max(after) >= kept {
            return Err(format!(
                "reflect pads ({begin}, {end}) on axis {axis}: each must be smaller than the axis's {kept} kept elements"
            ));
        }
        let mut parts = Vec::new();
        let block = |this: &mut Self, width: usize, at: usize| -> R<NodeId> {
            let mut shape = d.clone();
            shape[axis] = width;
            match mode {
                PadMode::Constant(v) => {
                    let dt = this.g.ty(x).dtype;
                    ir(this.g.full(v, Shape::new(&shape), dt))
                }
                _ => {
                    let one = ir(this.g.slice(x, axis, at, at + 1))?;
                    ir(this.g.broadcast_to(one, Shape::new(&shape)))
                }
            }
        };
        // The elements before the input, then after it, in output order.
        let (lead, trail): (Vec<usize>, Vec<usize>) = match mode {
            PadMode::Reflect => (
                (1..=before).rev().collect(),
                (1..=after).map(|k| kept - 1 - k).collect(),
            ),
            _ => (vec![0], vec![kept - 1]),
        };
        if before > 0 {
            match mode {
                PadMode::Reflect => {
                    for &i in &lead {
                        parts.push(ir(self.g.slice(x, axis, i, i + 1))?);
                    }
                }
                _ => parts.push(block(self, before, lead[0])?),
            }
        }
        parts.push(x);
        if after > 0 {
            match mode {
                PadMode::Reflect => {
                    for &i in &trail {
                        parts.push(ir(self.g.slice(x, axis, i, i + 1))?);
                    }
                }
                _ => parts.push(block(self, after, trail[0])?),
            }
        }
        ir(self.g.concat(&parts, axis))
    }
}
