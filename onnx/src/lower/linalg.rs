//! Matrix products: MatMul, Gemm and Einsum.

use super::*;

impl Lower<'_> {
    pub(super) fn matmul(&mut self, n: &NodeProto) -> R<Vec<Val>> {
        let a = self.float_in(n, 0)?;
        let b = self.float_in(n, 1)?;
        Ok(vec![Val::Node(self.matmul_nodes(a, b)?)])
    }

    /// NumPy's `matmul`: 1-d operands promoted and the added axis removed, batch axes
    /// broadcast; a 2-d right operand under a batched left one is one `[rows, k]` product.
    pub(super) fn matmul_nodes(&mut self, a: NodeId, b: NodeId) -> R<NodeId> {
        let (da, db) = (
            self.g.ty(a).shape.dims().to_vec(),
            self.g.ty(b).shape.dims().to_vec(),
        );
        if da.is_empty() || db.is_empty() {
            return Err("MatMul does not take scalars".into());
        }
        let a2 = if da.len() == 1 {
            ir(self.g.reshape(a, [1, da[0]]))?
        } else {
            a
        };
        let b2 = if db.len() == 1 {
            ir(self.g.reshape(b, [db[0], 1]))?
        } else {
            b
        };
        let (pa, pb) = (
            self.g.ty(a2).shape.dims().to_vec(),
            self.g.ty(b2).shape.dims().to_vec(),
        );
        let (m, k) = (pa[pa.len() - 2], pa[pa.len() - 1]);
        let (k2, nn_) = (pb[pb.len() - 2], pb[pb.len() - 1]);
        if k != k2 {
            return Err(format!(
                "operands {da:?} and {db:?} do not multiply ({k} ≠ {k2})"
            ));
        }
        let (ba, bb) = (&pa[..pa.len() - 2], &pb[..pb.len() - 2]);
        let batch = broadcast_dims(ba, bb)
            .ok_or_else(|| format!("batch axes of {da:?} and {db:?} do not broadcast"))?;
        let y = if bb.is_empty() && !ba.is_empty() {
            let rows: usize = ba.iter().product::<usize>() * m;
            let a3 = ir(self.g.reshape(a2, [rows, k]))?;
            let y = ir(self.g.matmul(a3, b2))?;
            let mut out = batch.clone();
            out.extend([m, nn_]);
            ir(self.g.reshape(y, Shape::new(&out)))?
        } else {
            let mut sa = batch.clone();
            sa.extend([m, k]);
            let mut sb = batch.clone();
            sb.extend([k, nn_]);
            let a3 = self.lift(a2, sa.len())?;
            let a3 = ir(self.g.broadcast_to(a3, Shape::new(&sa)))?;
            let b3 = self.lift(b2, sb.len())?;
            let b3 = ir(self.g.broadcast_to(b3, Shape::new(&sb)))?;
            ir(self.g.matmul(a3, b3))?
        };
        // Remove the promoted axes.
        let mut out = batch;
        if da.len() > 1 {
            out.push(m);
        }
        if db.len() > 1 {
            out.push(nn_);
        }
        ir(self.g.reshape(y, Shape::new(&out)))
    }

    pub(super) fn gemm(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let a = self.float_in(n, 0)?;
        let b = self.float_in(n, 1)?;
        for (i, x) in [a, b].into_iter().enumerate() {
            if self.g.ty(x).shape.rank() != 2 {
                return Err(format!("input {i} must be a matrix, got {}", self.g.ty(x)));
            }
        }
        let a = if at.int("transA", 0) != 0 {
            ir(self.g.transpose_last(a))?
        } else {
            a
        };
        let b = if at.int("transB", 0) != 0 {
            ir(self.g.transpose_last(b))?
        } else {
            b
        };
        let mut y = ir(self.g.matmul(a, b))?;
        let alpha = at.float("alpha", 1.0);
        if alpha != 1.0 {
            y = ir(self.g.mul_scalar(y, alpha))?;
        }
        if let Some(c) = self.opt(n, 2)? {
            let beta = at.float("beta", 1.0);
            let c = match c {
                Val::Const(k) => Val::Const(k.cast(self.g.ty(y).dtype)),
                v => v,
            };
            let mut c = self.node(&c, &n.input[2])?;
            if beta != 1.0 {
                c = ir(self.g.mul_scalar(c, beta))?;
            }
            y = ir(self.g.add(y, c))?;
        }
        Ok(vec![Val::Node(y)])
    }

    /// Einsum of one or two operands without repeated or ellipsis indices: batch indices (in
    /// both operands and the output), contracted ones (in both, not the output) and free ones,
    /// as one batched matmul between transposes and reshapes.
    pub(super) fn einsum(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let eq: String = at
            .string("equation", "")
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        let (lhs, out) = eq
            .split_once("->")
            .ok_or("needs an explicit output (`...->...`)")?;
        let ins: Vec<&str> = lhs.split(',').collect();
        let ok = |s: &str| {
            s.chars().all(|c| c.is_ascii_alphabetic())
                && s.chars().collect::<std::collections::BTreeSet<_>>().len() == s.len()
        };
        if ins.len() != n.input.len() || !ins.iter().chain([&out]).all(|s| ok(s)) {
            return Err(format!(
                "equation {eq:?}: Ingot imports one or two operands with distinct letters per operand and no ellipsis"
            ));
        }
        let a = self.float_in(n, 0)?;
        let pos = |s: &str, c: char| s.find(c);
        if ins.len() == 1 {
            let s = ins[0];
            if !out.chars().all(|c| s.contains(c)) {
                return Err(format!(
                    "equation {eq:?}: output letters must come from the operand"
                ));
            }
            let summed: Vec<usize> = s
                .chars()
                .enumerate()
                .filter(|(_, c)| !out.contains(*c))
                .map(|(i, _)| i)
                .collect();
            let mut x = a;
            let mut rest: String = s.to_string();
            if !summed.is_empty() {
                x = ir(self.g.sum(x, &summed))?;
                rest = s.chars().filter(|c| out.contains(*c)).collect();
                let dims: Vec<usize> = self
                    .g
                    .ty(x)
                    .shape
                    .dims()
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !summed.contains(i))
                    .map(|(_, &d)| d)
                    .collect();
                x = ir(self.g.reshape(x, Shape::new(&dims)))?;
            }
            let perm: Vec<usize> = out
                .chars()
                .map(|c| pos(&rest, c).expect("checked"))
                .collect();
            return Ok(vec![Val::Node(ir(self.g.transpose(x, &perm))?)]);
        }
        let b = self.float_in(n, 1)?;
        let (sa, sb) = (ins[0], ins[1]);
        let (da, db) = (
            self.g.ty(a).shape.dims().to_vec(),
            self.g.ty(b).shape.dims().to_vec(),
        );
        if da.len() != sa.len() || db.len() != sb.len() {
            return Err(format!(
                "equation {eq:?} does not match the operands' ranks ({da:?}, {db:?})"
            ));
        }
        let size = |c: char| {
            pos(sa, c)
                .map(|i| da[i])
                .or_else(|| pos(sb, c).map(|i| db[i]))
                .unwrap_or(1)
        };
        let mut batch = String::new();
        let mut contract = String::new();
        let mut fa = String::new();
        let mut fb = String::new();
        for c in sa.chars() {
            match (sb.contains(c), out.contains(c)) {
                (true, true) => batch.push(c),
                (true, false) => contract.push(c),
                (false, true) => fa.push(c),
                (false, false) => {
                    return Err(format!(
                        "equation {eq:?}: index {c} is summed inside one operand (not supported)"
                    ))
                }
            }
        }
        for c in sb.chars() {
            match (sa.contains(c), out.contains(c)) {
                (false, true) => fb.push(c),
                (false, false) => {
                    return Err(format!(
                        "equation {eq:?}: index {c} is summed inside one operand (not supported)"
                    ))
                }
                _ => {}
            }
        }
        if !out.chars().all(|c| sa.contains(c) || sb.contains(c)) {
            return Err(format!(
                "equation {eq:?}: an output index is in neither operand"
            ));
        }
        for c in batch.chars().chain(contract.chars()) {
            if da[pos(sa, c).expect("in a")] != db[pos(sb, c).expect("in b")] {
                return Err(format!("equation {eq:?}: index {c} has different sizes"));
            }
        }
        let prod = |s: &str| s.chars().map(size).product::<usize>();
        let order_a: String = format!("{batch}{fa}{contract}");
        let order_b: String = format!("{batch}{contract}{fb}");
        let pa: Vec<usize> = order_a.chars().map(|c| pos(sa, c).expect("in a")).collect();
        let pb: Vec<usize> = order_b.chars().map(|c| pos(sb, c).expect("in b")).collect();
        let at_ = ir(self.g.transpose(a, &pa))?;
        let bt = ir(self.g.transpose(b, &pb))?;
        let (nb, m, k, nn_) = (prod(&batch), prod(&fa), prod(&contract), prod(&fb));
        let a3 = ir(self.g.reshape(at_, [nb, m, k]))?;
        let b3 = ir(self.g.reshape(bt, [nb, k, nn_]))?;
        let y = ir(self.g.matmul(a3, b3))?;
        let got: String = format!("{batch}{fa}{fb}");
        let dims: Vec<usize> = got.chars().map(size).collect();
        let y = ir(self.g.reshape(y, Shape::new(&dims)))?;
        let perm: Vec<usize> = out
            .chars()
            .map(|c| pos(&got, c).expect("an output index"))
            .collect();
        Ok(vec![Val::Node(ir(self.g.transpose(y, &perm))?)])
    }
}
