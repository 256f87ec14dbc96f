//! ONNX's `Attention` (opset 23; PyTorch's dynamo exporter writes `scaled_dot_product_attention`
//! so, transformers' GPT-2 and BERT included) as the plain math Ingot's recognition fuses:
//! `softmax(q·kᵀ·scale + mask)·v`, a causal mask as `select(j > i, fill, scores)` of two iotas
//! and a boolean mask as the additive `select(mask, 0, fill)` (`fill` the dtype's lowest value,
//! which no softmax tells from `-inf`). Only the 4-d form (`[batch, heads, seq, head_dim]`)
//! with as many key-value heads as query heads, and without a key-value cache or a softcap.

use super::*;

impl Lower<'_> {
    /// Attention's first output, `Y`; the others (the cache, the scores) are not computed.
    pub(super) fn attention(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        for (i, what) in [(4, "past_key"), (5, "past_value"), (6, "nonpad_kv_seqlen")] {
            if self.opt(n, i)?.is_some() {
                return Err(format!(
                    "input {i} ({what}): Ingot imports attention without a key-value cache"
                ));
            }
        }
        let q = self.float_in(n, 0)?;
        let k = self.float_in(n, 1)?;
        let v = self.float_in(n, 2)?;
        let (qd, kd, vd) = (
            self.g.ty(q).shape.dims().to_vec(),
            self.g.ty(k).shape.dims().to_vec(),
            self.g.ty(v).shape.dims().to_vec(),
        );
        if qd.len() != 4 || kd.len() != 4 || vd.len() != 4 {
            return Err(format!(
                "q {qd:?}, k {kd:?}, v {vd:?}: Ingot imports the 4-d form [batch, heads, seq, head_dim] (the 3-d form with q_num_heads and kv_num_heads is not mapped yet)"
            ));
        }
        if kd[..2] != qd[..2] || vd[..2] != qd[..2] || kd[3] != qd[3] || vd[2] != kd[2] {
            return Err(format!(
                "q {qd:?}, k {kd:?}, v {vd:?} must share batch and heads (grouped-query attention is not mapped yet), q and k the head size, k and v the keys"
            ));
        }
        if at.float("softcap", 0.0) != 0.0 {
            return Err("softcap other than 0 is not supported".into());
        }
        let dtype = self.g.ty(q).dtype;
        let scale = if at.has("scale") {
            at.float("scale", 1.0)
        } else {
            1.0 / (qd[3] as f64).sqrt()
        };
        let (s, l) = (qd[2], kd[2]);
        let kt = ir(self.g.transpose(k, &[0, 1, 3, 2]))?;
        let scores = ir(self.g.matmul(q, kt))?;
        let mut scores = ir(self.g.mul_scalar(scores, scale))?;
        let fill = ir(self.g.full(nn::mask_value(dtype), Shape::scalar(), dtype))?;
        if let Some(m) = self.opt(n, 3)? {
            let m = self.node(&m, &n.input[3])?;
            let add = if self.g.ty(m).dtype == DType::Bool {
                let zero = ir(self.g.full(0.0, Shape::scalar(), dtype))?;
                ir(self.g.select(m, zero, fill))?
            } else if self.g.ty(m).dtype == dtype {
                m
            } else {
                ir(self.g.convert(m, dtype))?
            };
            scores = ir(self.g.add(scores, add))?;
        }
        if at.int("is_causal", 0) != 0 {
            // Top-left aligned, as ONNX defines it: query i sees keys j <= i.
            let i = ir(self.g.iota([s, l], 0, DType::I64))?;
            let j = ir(self.g.iota([s, l], 1, DType::I64))?;
            let future = ir(self.g.compare(CmpOp::Gt, j, i))?;
            scores = ir(self.g.select(future, fill, scores))?;
        }
        let p = ir(nn::softmax(self.g, scores))?;
        one(ir(self.g.matmul(p, v))?)
    }
}
