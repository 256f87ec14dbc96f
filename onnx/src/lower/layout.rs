//! Ops that move elements without arithmetic: reshapes, transposes, broadcasts, joins, splits
//! and slices (and Trilu's mask), with the shape arithmetic they share with folding.

use super::*;

impl Lower<'_> {
    /// Flatten: the axes before `axis` and those from it, each joined into one.
    pub(super) fn flatten(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let x = self.arg(n, 0)?;
        let d = self.dims(&x);
        let axis = at.int("axis", 1);
        let axis = if axis < 0 {
            axis + d.len() as i64
        } else {
            axis
        };
        if axis < 0 || axis as usize > d.len() {
            return Err(format!(
                "axis {} is out of range for rank {}",
                at.int("axis", 1),
                d.len()
            ));
        }
        let a = axis as usize;
        let shape = [d[..a].iter().product::<usize>(), d[a..].iter().product()];
        self.reshape_val(n, x, &shape)
    }

    /// Reshape to a constant shape.
    pub(super) fn reshape(&mut self, n: &NodeProto) -> R<Vec<Val>> {
        let x = self.arg(n, 0)?;
        let spec = self.reshape_spec(n)?;
        let shape = reshape_dims(&self.dims(&x), &spec)?;
        self.reshape_val(n, x, &shape)
    }

    /// Reshape's target (input 1). `allowzero=1` (which PyTorch's dynamo exporter writes on
    /// every Reshape) changes nothing unless the target holds a 0, which it then makes a
    /// zero-sized axis: refused, since Ingot's tensors cannot be zero-sized.
    pub(super) fn reshape_spec(&self, n: &NodeProto) -> R<Vec<i64>> {
        let spec = self.konst_i64s(n, 1)?.ok_or("needs a shape")?;
        if Attrs(&n.attribute).int("allowzero", 0) != 0 && spec.contains(&0) {
            return Err(format!(
                "allowzero=1 with a 0 in the shape {spec:?} makes a zero-sized axis, which Ingot's tensors cannot have"
            ));
        }
        Ok(spec)
    }

    /// SplitToSequence: the parts Split would give (the sizes of a 1-d `split`; chunks of a
    /// scalar `split`, the last smaller; or parts of size 1, that axis dropped unless
    /// `keepdims`), kept under the sequence's name for `SequenceAt` (Ingot has no sequence
    /// values, and nothing else may read one).
    pub(super) fn split_to_sequence(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let x = self.arg(n, 0)?;
        let d = self.dims(&x);
        let axis = norm_axis(at.int("axis", 0), d.len())?;
        let size = d[axis];
        let (sizes, drop_axis) = match self.konst(n, 1)? {
            None => (vec![1; size], at.int("keepdims", 1) == 0),
            Some(c) if c.dims.is_empty() => {
                let k = c
                    .scalar()
                    .filter(|&k| k >= 1.0 && k.fract() == 0.0)
                    .ok_or_else(|| {
                        format!(
                            "split {:?} must be a positive whole chunk size",
                            c.to_f64s()
                        )
                    })? as usize;
                let sizes = (0..size.div_ceil(k)).map(|i| k.min(size - i * k)).collect();
                (sizes, false)
            }
            Some(c) => {
                let v = c.to_i64s().ok_or("split must hold integers")?;
                if v.iter().any(|&s| s < 1) || v.iter().sum::<i64>() != size as i64 {
                    return Err(format!(
                        "split {v:?} must be positive sizes adding up to axis {axis}'s {size}"
                    ));
                }
                (v.iter().map(|&s| s as usize).collect(), false)
            }
        };
        let x = self.node(&x, &n.input[0])?;
        let mut parts = Vec::with_capacity(sizes.len());
        let mut start = 0;
        for s in sizes {
            let mut p = ir(self.g.slice(x, axis, start, start + s))?;
            if drop_axis {
                let mut nd = d.clone();
                nd.remove(axis);
                p = ir(self.g.reshape(p, Shape::new(&nd)))?;
            }
            parts.push(Val::Node(p));
            start += s;
        }
        let out = n.output.first().ok_or("has no output")?;
        self.sequences.insert(out.clone(), parts);
        Ok(vec![])
    }

    /// SequenceAt: one part of a sequence `SplitToSequence` made, at a constant position
    /// (negative counts from the end).
    pub(super) fn sequence_at(&mut self, n: &NodeProto) -> R<Vec<Val>> {
        let name = n.input.first().map(String::as_str).unwrap_or("");
        let len = self
            .sequences
            .get(name)
            .map(Vec::len)
            .ok_or_else(|| format!("input {name:?} is not a sequence SplitToSequence made (the only sequences Ingot imports)"))?;
        let pos = self.konst_i64s(n, 1)?.ok_or("needs a position")?;
        let [p] = pos[..] else {
            return Err(format!("position {pos:?} must be one integer"));
        };
        let i = if p < 0 { p + len as i64 } else { p };
        if i < 0 || i >= len as i64 {
            return Err(format!(
                "position {p} is outside the sequence's {len} parts"
            ));
        }
        Ok(vec![self.sequences[name][i as usize].clone()])
    }

    /// Squeeze and Unsqueeze, with axes as an input or an attribute.
    pub(super) fn squeeze(&mut self, n: &NodeProto, at: &Attrs, op: &str) -> R<Vec<Val>> {
        let x = self.arg(n, 0)?;
        let axes = match self.konst_i64s(n, 1)? {
            Some(a) => Some(a),
            None => at.ints("axes"),
        };
        let shape = squeeze_dims(op, &self.dims(&x), axes.as_deref())?;
        self.reshape_val(n, x, &shape)
    }

    /// Transpose (reversed axes without `perm`).
    pub(super) fn transpose(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let x = self.arg(n, 0)?;
        let r = self.dims(&x).len();
        let perm = transpose_perm(at.ints("perm"), r)?;
        let x = self.node(&x, &n.input[0])?;
        one(ir(self.g.transpose(x, &perm))?)
    }

    /// Expand: broadcast to a constant shape.
    pub(super) fn expand(&mut self, n: &NodeProto) -> R<Vec<Val>> {
        let x = self.arg(n, 0)?;
        let shape = self.konst_i64s(n, 1)?.ok_or("needs a shape")?;
        let target = expand_dims(&self.dims(&x), &shape)?;
        let x = self.node(&x, &n.input[0])?;
        let rank = target.len();
        let x = self.lift(x, rank)?;
        one(ir(self.g.broadcast_to(x, Shape::new(&target)))?)
    }

    /// Concat (an empty constant part adds nothing).
    pub(super) fn concat(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let parts: Vec<Val> = (0..n.input.len())
            .map(|i| self.arg(n, i))
            .collect::<R<_>>()?;
        let r = self.dims(&parts[0]).len();
        let axis = norm_axis(at.int("axis", 0), r)?;
        let mut ids = Vec::new();
        for (i, p) in parts.iter().enumerate() {
            // An empty constant part (a shape sliced to nothing) adds nothing.
            if matches!(p, Val::Const(c) if c.dims.get(axis) == Some(&0)) {
                continue;
            }
            ids.push(self.node(p, &n.input[i])?);
        }
        // A join of one part is that part (PyTorch's SDPA export concatenates a lone key and
        // value onto an empty cache): no copy, and attention recognition sees the projection.
        if let [only] = ids[..] {
            return one(only);
        }
        one(ir(self.g.concat(&ids, axis))?)
    }

    /// Split into the sizes given, or equal parts.
    pub(super) fn split(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let x = self.arg(n, 0)?;
        let d = self.dims(&x);
        let axis = norm_axis(at.int("axis", 0), d.len())?;
        let sizes = split_sizes(self.konst_i64s(n, 1)?, at, n.output.len(), d[axis])?;
        let x = self.node(&x, &n.input[0])?;
        let mut out = Vec::new();
        let mut start = 0;
        for s in sizes {
            out.push(Val::Node(ir(self.g.slice(x, axis, start, start + s))?));
            start += s;
        }
        Ok(out)
    }

    /// Slice with constant starts, ends and unit steps.
    pub(super) fn slice(&mut self, n: &NodeProto) -> R<Vec<Val>> {
        let x = self.arg(n, 0)?;
        let d = self.dims(&x);
        let picks = self.slice_picks(n, &d)?;
        if let Some((axis, _)) = picks.iter().find(|(_, p)| p.is_empty()) {
            return Err(format!(
                    "slices axis {axis} (size {}) of a computed tensor to nothing: Ingot's tensors cannot be zero-sized",
                    d[*axis]
                ));
        }
        let mut x = self.node(&x, &n.input[0])?;
        for (axis, p) in picks {
            let (s, e) = (p[0], p[p.len() - 1] + 1);
            if p.len() > 1 && p.windows(2).any(|w| w[1] != w[0] + 1) {
                return Err(format!(
                        "a step other than 1 on axis {axis} of a computed tensor needs a strided slice primitive"
                    ));
            }
            x = ir(self.g.slice(x, axis, s, e))?;
        }
        one(x)
    }

    /// Trilu: the upper (lower) triangle from diagonal `k`, the rest zero.
    pub(super) fn trilu(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let x = self.arg(n, 0)?;
        let x = self.node(&x, &n.input[0])?;
        let k = self.trilu_k(n)?;
        let d = self.g.ty(x).shape.dims().to_vec();
        if d.len() < 2 {
            return Err(format!("needs at least two axes, got {:?}", d));
        }
        let rc = [d[d.len() - 2], d[d.len() - 1]];
        let i = ir(self.g.iota(rc, 0, DType::I64))?;
        let j = ir(self.g.iota(rc, 1, DType::I64))?;
        let diff = ir(self.g.sub(j, i))?;
        let kk = ir(self.g.full(k as f64, Shape::scalar(), DType::I64))?;
        let c = if at.int("upper", 1) != 0 {
            CmpOp::Ge
        } else {
            CmpOp::Le
        };
        let keep = ir(self.g.compare(c, diff, kk))?;
        let zero = self.scalar(0.0, x)?;
        one(ir(self.g.select(keep, x, zero))?)
    }

    /// `x` with `rank − its rank` leading axes of size 1.
    pub(super) fn lift(&mut self, x: NodeId, rank: usize) -> R<NodeId> {
        let d = self.g.ty(x).shape.dims().to_vec();
        if d.len() >= rank {
            return Ok(x);
        }
        let mut nd = vec![1; rank - d.len()];
        nd.extend(d);
        ir(self.g.reshape(x, Shape::new(&nd)))
    }

    pub(super) fn reshape_val(&mut self, n: &NodeProto, x: Val, shape: &[usize]) -> R<Vec<Val>> {
        let have: usize = self.dims(&x).iter().product();
        if have != shape.iter().product::<usize>() {
            return Err(format!(
                "cannot reshape {:?} ({have} elements) to {shape:?}",
                self.dims(&x)
            ));
        }
        match x {
            Val::Const(c) => Ok(vec![Val::Const(c.reshaped(shape.to_vec()))]),
            v => {
                let id = self.node(&v, &n.input[0])?;
                Ok(vec![Val::Node(ir(self.g.reshape(id, Shape::new(shape)))?)])
            }
        }
    }

    /// Slice's picked indices per sliced axis (ONNX's clamping rules, any step).
    /// The indices a `Slice` keeps on each axis it slices, by ONNX's rules: a negative start or
    /// end counts from the end (adds the dim), then both are clamped (to `0..=dim` for a positive
    /// step, to `-1..=dim-1` for a negative one), so `INT64_MAX` and `INT64_MIN` mean "to the
    /// end" and "to the start". A list may be empty: shape arithmetic slices a shape to nothing
    /// (PyTorch's `unflatten` of the last axis takes `shape[rank:]`, `Slice(shape, [rank],
    /// [INT64_MAX])`, and concatenates it); only the caller knows whether an empty result is a
    /// constant (fine) or a computed tensor (which Ingot cannot hold at size zero).
    pub(super) fn slice_picks(&self, n: &NodeProto, d: &[usize]) -> R<Vec<(usize, Vec<usize>)>> {
        let starts = self.konst_i64s(n, 1)?.ok_or("needs starts")?;
        let ends = self.konst_i64s(n, 2)?.ok_or("needs ends")?;
        let axes = match self.konst_i64s(n, 3)? {
            Some(a) => a,
            None => (0..starts.len() as i64).collect(),
        };
        let steps = self.konst_i64s(n, 4)?.unwrap_or(vec![1; starts.len()]);
        if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
            return Err("starts, ends, axes and steps must have one entry per sliced axis".into());
        }
        let mut out = Vec::new();
        for i in 0..starts.len() {
            let axis = norm_axis(axes[i], d.len())?;
            let dim = d[axis] as i64;
            let step = steps[i];
            if step == 0 {
                return Err("a step of 0".into());
            }
            let fix = |v: i64| if v < 0 { v.saturating_add(dim) } else { v };
            let picks: Vec<usize> = if step > 0 {
                let s = fix(starts[i]).clamp(0, dim);
                let e = fix(ends[i]).clamp(0, dim);
                (s..e).step_by(step as usize).map(|x| x as usize).collect()
            } else {
                let s = fix(starts[i]).clamp(0, dim - 1);
                let e = fix(ends[i]).clamp(-1, dim - 1);
                let mut v = Vec::new();
                let mut k = s;
                while k > e {
                    v.push(k as usize);
                    k += step;
                }
                v
            };
            out.push((axis, picks));
        }
        Ok(out)
    }
}
