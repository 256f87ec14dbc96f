//! Normalizations, reductions, softmax and gather.

use super::*;

impl Lower<'_> {
    /// Softmax and LogSoftmax along any axis.
    pub(super) fn softmax(&mut self, n: &NodeProto, at: &Attrs, op: &str) -> R<Vec<Val>> {
        let x = self.float_in(n, 0)?;
        let r = self.g.ty(x).shape.rank();
        let axis = norm_axis(at.int("axis", -1), r)?;
        let y = self.along_last(x, axis, |g, x| {
            if op == "Softmax" {
                nn::softmax(g, x)
            } else {
                nn::log_softmax(g, x)
            }
        })?;
        one(y)
    }

    /// `f` applied with `axis` moved last (softmax over any axis).
    pub(super) fn along_last(
        &mut self,
        x: NodeId,
        axis: usize,
        f: impl FnOnce(&mut Graph, NodeId) -> ingot_compiler::Result<NodeId>,
    ) -> R<NodeId> {
        let r = self.g.ty(x).shape.rank();
        if r == 0 || axis + 1 == r {
            return ir(f(self.g, x));
        }
        let mut perm: Vec<usize> = (0..r).collect();
        perm.remove(axis);
        perm.push(axis);
        let xt = ir(self.g.transpose(x, &perm))?;
        let y = ir(f(self.g, xt))?;
        let mut back = vec![0; r];
        for (i, &p) in perm.iter().enumerate() {
            back[p] = i;
        }
        ir(self.g.transpose(y, &back))
    }

    /// BatchNormalization over axis 1 of `[N, C, ...]`. Traced in training mode with
    /// `training_mode=1`: normalised by the batch's mean and biased variance, and the running
    /// statistics (inputs 3 and 4, state leaves) updated in place as ONNX specifies
    /// (`r·momentum + s·(1 − momentum)`, with the biased variance as onnxruntime computes);
    /// otherwise, and always in evaluation mode, normalised by the running statistics.
    pub(super) fn batch_norm(&mut self, n: &NodeProto, at: &Attrs, _name: &str) -> R<Vec<Val>> {
        let x = self.float_in(n, 0)?;
        let ids: Vec<NodeId> = (1..5).map(|i| self.float_in(n, i)).collect::<R<_>>()?;
        let (scale, bias, rm, rv) = (ids[0], ids[1], ids[2], ids[3]);
        let d = self.g.ty(x).shape.dims().to_vec();
        if d.len() < 2 {
            return Err(format!("needs an input [N, C, ...], got {:?}", d));
        }
        let c = d[1];
        let mut bshape = vec![c];
        bshape.extend(std::iter::repeat_n(1, d.len() - 2));
        for id in &ids {
            if self.g.ty(*id).shape.dims() != [c] {
                return Err(format!(
                    "scale, bias, mean and var must be [{c}], got {}",
                    self.g.ty(*id)
                ));
            }
        }
        let eps = at.float("epsilon", 1e-5);
        let momentum = at.float("momentum", 0.9);
        let train = at.int("training_mode", 0) != 0 && self.g.mode() == Mode::Train;
        let axes: Vec<usize> = std::iter::once(0).chain(2..d.len()).collect();
        let (mean, var, xc) = if train {
            let mean = ir(self.g.mean(x, &axes))?;
            let xc = ir(self.g.sub(x, mean))?;
            let sq = ir(self.g.mul(xc, xc))?;
            let var = ir(self.g.mean(sq, &axes))?;
            (mean, var, xc)
        } else {
            let m = ir(self.g.reshape(rm, Shape::new(&bshape)))?;
            let v = ir(self.g.reshape(rv, Shape::new(&bshape)))?;
            let xc = ir(self.g.sub(x, m))?;
            (m, v, xc)
        };
        let ve = ir(self.g.add_scalar(var, eps))?;
        let sd = ir(self.g.sqrt(ve))?;
        let r = ir(self.g.recip(sd))?;
        let xh = ir(self.g.mul(xc, r))?;
        let s = ir(self.g.reshape(scale, Shape::new(&bshape)))?;
        let b = ir(self.g.reshape(bias, Shape::new(&bshape)))?;
        let y = ir(self.g.mul(xh, s))?;
        let y = ir(self.g.add(y, b))?;
        let mut out = vec![Val::Node(y)];
        if train {
            let upd =
                |g: &mut Graph, state: NodeId, stat: NodeId| -> ingot_compiler::Result<NodeId> {
                    let s = g.reshape(stat, [c])?;
                    let s = g.stop_gradient(s)?;
                    let old = g.mul_scalar(state, momentum)?;
                    let new = g.mul_scalar(s, 1.0 - momentum)?;
                    let v = g.add(old, new)?;
                    if g.leaves(ingot_compiler::ir::LeafKind::State)
                        .contains(&state)
                    {
                        g.set_update(state, v)?;
                    }
                    Ok(v)
                };
            let nm = ir(upd(self.g, rm, mean))?;
            let nv = ir(upd(self.g, rv, var))?;
            out.push(Val::Node(nm));
            out.push(Val::Node(nv));
        } else {
            out.push(Val::Node(rm));
            out.push(Val::Node(rv));
        }
        Ok(out)
    }

    pub(super) fn layer_norm(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let x = self.float_in(n, 0)?;
        let scale = self.float_in(n, 1)?;
        let d = self.g.ty(x).shape.dims().to_vec();
        let axis = norm_axis(at.int("axis", -1), d.len())?;
        let axes: Vec<usize> = (axis..d.len()).collect();
        let eps = at.float("epsilon", 1e-5);
        let mean = ir(self.g.mean(x, &axes))?;
        let xc = ir(self.g.sub(x, mean))?;
        let sq = ir(self.g.mul(xc, xc))?;
        let var = ir(self.g.mean(sq, &axes))?;
        let ve = ir(self.g.add_scalar(var, eps))?;
        let sd = ir(self.g.sqrt(ve))?;
        let r = ir(self.g.recip(sd))?;
        let xh = ir(self.g.mul(xc, r))?;
        let mut y = ir(self.g.mul(xh, scale))?;
        if let Some(b) = self.opt(n, 2)? {
            let b = match b {
                Val::Const(k) => Val::Const(k.cast(self.g.ty(y).dtype)),
                v => v,
            };
            let b = self.node(&b, &n.input[2])?;
            y = ir(self.g.add(y, b))?;
        }
        Ok(vec![Val::Node(y), Val::Node(mean), Val::Node(r)])
    }

    pub(super) fn reduce(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let x = self.float_in(n, 0)?;
        let d = self.g.ty(x).shape.dims().to_vec();
        let axes = match self.konst_i64s(n, 1)? {
            Some(a) => Some(a),
            None => at.ints("axes"),
        };
        let axes = match axes {
            Some(a) if !a.is_empty() => norm_axes(&a, d.len())?,
            _ if at.int("noop_with_empty_axes", 0) != 0 => return Ok(vec![Val::Node(x)]),
            _ => (0..d.len()).collect(),
        };
        let y = match n.op_type() {
            "ReduceMean" => ir(self.g.mean(x, &axes))?,
            "ReduceSum" => ir(self.g.sum(x, &axes))?,
            "ReduceMin" => {
                // min x = −max(−x), exactly.
                let nx = ir(self.g.neg(x))?;
                let m = ir(self.g.reduce(ReduceOp::Max, nx, &axes))?;
                ir(self.g.neg(m))?
            }
            _ => ir(self.g.reduce(ReduceOp::Max, x, &axes))?,
        };
        if at.int("keepdims", 1) != 0 {
            return Ok(vec![Val::Node(y)]);
        }
        let kept: Vec<usize> = d
            .iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, &s)| s)
            .collect();
        Ok(vec![Val::Node(ir(self.g.reshape(y, Shape::new(&kept)))?)])
    }

    /// `Gather(data, indices, axis)`: the table's `axis` moved first, rows gathered, the
    /// index axes put back where `axis` was. A constant scalar index is a slice.
    /// `y = gather(table, ids)` with the rows read at index `row` cut from the backward pass:
    /// `select(ids == row, stop_gradient(y), y)`, the same values, no gradient into the table's
    /// padding row from this lookup (PyTorch's `nn.Embedding(padding_idx=row)`).
    fn padding_passes_no_gradient(&mut self, y: NodeId, ids: NodeId, row: i64) -> R<NodeId> {
        let id_dims = self.g.ty(ids).shape.dims().to_vec();
        let y_dims = self.g.ty(y).shape.dims().to_vec();
        let pad = ir(self
            .g
            .full(row as f64, Shape::new(&id_dims), self.g.ty(ids).dtype))?;
        let at_pad = ir(self.g.compare(CmpOp::Eq, ids, pad))?;
        // [i...] -> [i..., 1...] -> y's [i..., d...].
        let mut ones = id_dims;
        ones.resize(y_dims.len(), 1);
        let at_pad = ir(self.g.reshape(at_pad, Shape::new(&ones)))?;
        let at_pad = ir(self.g.broadcast_to(at_pad, Shape::new(&y_dims)))?;
        let kept = ir(self.g.stop_gradient(y))?;
        ir(self.g.select(at_pad, kept, y))
    }

    pub(super) fn gather(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let data = self.arg(n, 0)?;
        let idx = self.arg(n, 1)?;
        let d = self.dims(&data);
        let axis = norm_axis(at.int("axis", 0), d.len())?;
        let data = self.node(&data, &n.input[0])?;
        if let Val::Const(c) = &idx {
            let vals = c.to_i64s().ok_or("indices must be integers")?;
            let fixed: Vec<i64> = vals
                .iter()
                .map(|&i| if i < 0 { i + d[axis] as i64 } else { i })
                .collect();
            if let Some(bad) = fixed.iter().find(|&&i| i < 0 || i as usize >= d[axis]) {
                return Err(format!(
                    "index {bad} is out of range for axis {axis} of size {}",
                    d[axis]
                ));
            }
            if c.dims.is_empty() {
                let i = fixed[0] as usize;
                let s = ir(self.g.slice(data, axis, i, i + 1))?;
                let mut out = d.clone();
                out.remove(axis);
                return Ok(vec![Val::Node(ir(self.g.reshape(s, Shape::new(&out)))?)]);
            }
        }
        let idx = match idx {
            Val::Const(c) => {
                let fixed: Vec<i64> = c
                    .to_i64s()
                    .unwrap_or_default()
                    .iter()
                    .map(|&i| if i < 0 { i + d[axis] as i64 } else { i })
                    .collect();
                Val::Const(Const::new(DType::I64, c.dims.clone(), Data::I(fixed)))
            }
            v => v,
        };
        let ids = self.node(&idx, &n.input[1])?;
        let ir_ = self.g.ty(ids).shape.rank();
        let r = d.len();
        let table = if axis == 0 {
            data
        } else {
            let mut perm = vec![axis];
            perm.extend((0..r).filter(|&i| i != axis));
            ir(self.g.transpose(data, &perm))?
        };
        let y = ir(self.g.gather(table, ids))?;
        if axis == 0 {
            let y = match self.padding.get(&n.input[0]) {
                Some(&row) => self.padding_passes_no_gradient(y, ids, row)?,
                None => y,
            };
            return Ok(vec![Val::Node(y)]);
        }
        // y is [idx..., d[0..axis], d[axis+1..]]; the output is [d[0..axis], idx..., d[axis+1..]].
        let mut perm: Vec<usize> = (ir_..ir_ + axis).collect();
        perm.extend(0..ir_);
        perm.extend(ir_ + axis..ir_ + r - 1);
        Ok(vec![Val::Node(ir(self.g.transpose(y, &perm))?)])
    }
}
