//! Elementwise ops: arithmetic, comparisons, logic, activations, casts, clipping, dropout and
//! the seeded uniform draws that become Bernoulli masks.

use super::*;

impl Lower<'_> {
    /// Add, Sub, Mul, Div, Max and Min: folded left over their operands, broadcast pairwise.
    pub(super) fn arithmetic(&mut self, n: &NodeProto, op: &str) -> R<Vec<Val>> {
        let bop = match op {
            "Add" => BinaryOp::Add,
            "Sub" => BinaryOp::Sub,
            "Mul" => BinaryOp::Mul,
            "Div" => BinaryOp::Div,
            "Max" => BinaryOp::Max,
            _ => BinaryOp::Min,
        };
        let mut acc = self.arg(n, 0)?;
        for i in 1..n.input.len() {
            let b = self.arg(n, i)?;
            let (x, y) = self.pair(n, &acc, &b)?;
            acc = Val::Node(ir(self.g.binary(bop, x, y))?);
        }
        Ok(vec![acc])
    }

    /// Equal, Less, Greater, LessOrEqual and GreaterOrEqual (a uniform draw compared with a constant is a Bernoulli draw).
    pub(super) fn comparison(&mut self, n: &NodeProto, op: &str) -> R<Vec<Val>> {
        let c = match op {
            "Equal" => CmpOp::Eq,
            "Less" => CmpOp::Lt,
            "Greater" => CmpOp::Gt,
            "LessOrEqual" => CmpOp::Le,
            _ => CmpOp::Ge,
        };
        if let Some(v) = self.bernoulli_draw(n, c)? {
            return one(v);
        }
        let (a, b) = (self.arg(n, 0)?, self.arg(n, 1)?);
        let (x, y) = self.pair(n, &a, &b)?;
        one(ir(self.g.compare(c, x, y))?)
    }

    /// Not, And and Or, as selects between constant booleans.
    pub(super) fn logic(&mut self, n: &NodeProto, op: &str) -> R<Vec<Val>> {
        let x = self.arg(n, 0)?;
        let x = self.node(&x, &n.input[0])?;
        let t = ir(self.g.full(1.0, Shape::scalar(), DType::Bool))?;
        let f = ir(self.g.full(0.0, Shape::scalar(), DType::Bool))?;
        match op {
            "Not" => one(ir(self.g.select(x, f, t))?),
            _ => {
                let y = self.arg(n, 1)?;
                let y = self.node(&y, &n.input[1])?;
                if op == "And" {
                    one(ir(self.g.select(x, y, f))?)
                } else {
                    one(ir(self.g.select(x, t, y))?)
                }
            }
        }
    }

    /// Where.
    pub(super) fn select(&mut self, n: &NodeProto) -> R<Vec<Val>> {
        let c = self.arg(n, 0)?;
        let c = self.node(&c, &n.input[0])?;
        let (a, b) = (self.arg(n, 1)?, self.arg(n, 2)?);
        let (x, y) = self.pair(n, &a, &b)?;
        one(ir(self.g.select(c, x, y))?)
    }

    /// Neg, Exp, Log, Sqrt, Tanh and Reciprocal: one primitive each.
    pub(super) fn unary(&mut self, n: &NodeProto, op: &str) -> R<Vec<Val>> {
        let u = match op {
            "Neg" => UnaryOp::Neg,
            "Exp" => UnaryOp::Exp,
            "Log" => UnaryOp::Log,
            "Sqrt" => UnaryOp::Sqrt,
            "Tanh" => UnaryOp::Tanh,
            _ => UnaryOp::Recip,
        };
        let x = self.float_in(n, 0)?;
        one(ir(self.g.unary(u, x))?)
    }

    /// Relu, LeakyRelu, Abs, Sigmoid, Softplus, HardSigmoid, HardSwish, Gelu (exact or tanh), Erf and IsNaN.
    pub(super) fn activation(&mut self, n: &NodeProto, at: &Attrs, op: &str) -> R<Vec<Val>> {
        match op {
            "Relu" => {
                let x = self.float_in(n, 0)?;
                one(ir(nn::relu(self.g, x))?)
            }
            "LeakyRelu" => {
                let x = self.float_in(n, 0)?;
                let alpha = at.float("alpha", 0.01);
                let zero = self.scalar(0.0, x)?;
                let neg = ir(self.g.compare(CmpOp::Lt, x, zero))?;
                let ax = ir(self.g.mul_scalar(x, alpha))?;
                one(ir(self.g.select(neg, ax, x))?)
            }
            "Abs" => {
                let x = self.float_in(n, 0)?;
                one(self.abs(x)?)
            }
            "Sigmoid" => {
                let x = self.float_in(n, 0)?;
                one(self.sigmoid(x)?)
            }
            "Softplus" => {
                // max(x, 0) + log(1 + exp(−|x|)): finite everywhere, gradients included.
                let x = self.float_in(n, 0)?;
                let a = self.abs(x)?;
                let na = ir(self.g.neg(a))?;
                let e = ir(self.g.exp(na))?;
                let e1 = ir(self.g.add_scalar(e, 1.0))?;
                let l = ir(self.g.log(e1))?;
                let zero = self.scalar(0.0, x)?;
                let m = ir(self.g.maximum(x, zero))?;
                one(ir(self.g.add(m, l))?)
            }
            "HardSigmoid" | "HardSwish" => {
                let x = self.float_in(n, 0)?;
                let (alpha, beta) = if op == "HardSwish" {
                    (1.0 / 6.0, 0.5)
                } else {
                    (at.float("alpha", 0.2), at.float("beta", 0.5))
                };
                let ax = ir(self.g.mul_scalar(x, alpha))?;
                let y = ir(self.g.add_scalar(ax, beta))?;
                let one_ = self.scalar(1.0, x)?;
                let zero = self.scalar(0.0, x)?;
                let y = ir(self.g.minimum(y, one_))?;
                let y = ir(self.g.maximum(y, zero))?;
                if op == "HardSwish" {
                    one(ir(self.g.mul(x, y))?)
                } else {
                    one(y)
                }
            }
            "Gelu" if at.string("approximate", "none") == "tanh" => {
                let x = self.float_in(n, 0)?;
                one(ir(nn::gelu_tanh(self.g, x))?)
            }
            "Gelu" => {
                // Exact GELU, `x·½·(1 + erf(x/√2))` (PyTorch's default `F.gelu`).
                let x = self.float_in(n, 0)?;
                let s = ir(self.g.mul_scalar(x, std::f64::consts::FRAC_1_SQRT_2))?;
                let e = ir(self.g.unary(UnaryOp::Erf, s))?;
                let e1 = ir(self.g.add_scalar(e, 1.0))?;
                let h = ir(self.g.mul_scalar(x, 0.5))?;
                one(ir(self.g.mul(h, e1))?)
            }
            "Erf" => {
                let x = self.float_in(n, 0)?;
                one(ir(self.g.unary(UnaryOp::Erf, x))?)
            }
            "IsNaN" => {
                // NaN is the one value unequal to itself.
                let x = self.float_in(n, 0)?;
                one(ir(self.g.compare(CmpOp::Ne, x, x))?)
            }
            _ => Err(format!("{op} is not an activation")),
        }
    }

    /// Clip: a maximum with the constant min and a minimum with the constant max, where given.
    pub(super) fn clip(&mut self, n: &NodeProto) -> R<Vec<Val>> {
        let x = self.float_in(n, 0)?;
        let mut y = x;
        if let Some(lo) = self.konst(n, 1)? {
            let lo = lo.scalar().ok_or("min must be a scalar")?;
            let k = self.scalar(lo, x)?;
            y = ir(self.g.maximum(y, k))?;
        }
        if let Some(hi) = self.konst(n, 2)? {
            let hi = hi.scalar().ok_or("max must be a scalar")?;
            let k = self.scalar(hi, x)?;
            y = ir(self.g.minimum(y, k))?;
        }
        one(y)
    }

    /// Cast and CastLike.
    pub(super) fn cast(&mut self, n: &NodeProto, at: &Attrs, op: &str) -> R<Vec<Val>> {
        let to = if op == "Cast" {
            dtype_of(at.int("to", 0) as i32, self.float)?
        } else {
            let like = self.arg(n, 1)?;
            self.dtype(&like)
        };
        // A constant cast like a computed tensor stays a constant (PyTorch's dynamo export
        // writes `ones_like(input)` as Expand(CastLike(1, input), Shape(input))).
        if let Val::Const(c) = self.arg(n, 0)? {
            return Ok(vec![Val::Const(c.cast(to))]);
        }
        // A Bernoulli(q) mask cast to a float is, in evaluation mode, its expectation
        // q: `mask / q` (stochastic depth, `bernoulli_` then `div_`) is then 1, the
        // identity PyTorch's evaluation mode computes.
        if let Some(&q) = self.bernoulli.get(&n.input[0]) {
            if self.g.mode() == Mode::Eval && to.is_float() {
                let x = self.arg(n, 0)?;
                let d = self.dims(&x);
                return one(ir(self.g.full(q, Shape::new(&d), to))?);
            }
        }
        let x = self.arg(n, 0)?;
        let x = self.node(&x, &n.input[0])?;
        one(ir(self.g.convert(x, to))?)
    }

    /// Dropout: the identity unless training (and in evaluation mode); the mask is computed only when read.
    pub(super) fn dropout(&mut self, n: &NodeProto, name: &str) -> R<Vec<Val>> {
        let x = self.float_in(n, 0)?;
        let p = match self.konst(n, 1)? {
            Some(c) => c.scalar().ok_or("ratio must be a scalar")?,
            None => 0.5,
        };
        let train = match self.konst(n, 2)? {
            Some(c) => c.scalar().ok_or("training_mode must be a scalar")? != 0.0,
            None => false,
        };
        let mask_used = n.output.get(1).is_some_and(|m| self.used.contains(m));
        if !train || self.g.mode() == Mode::Eval {
            if mask_used {
                let d = self.g.ty(x).shape.clone();
                let t = ir(self.g.full(1.0, d, DType::Bool))?;
                return Ok(vec![Val::Node(x), Val::Node(t)]);
            }
            return one(x);
        }
        let y = ir(nn::dropout(self.g, name, x, p))?;
        if !mask_used {
            return one(y);
        }
        // The mask is the same draw (seed, the node's salt, each element's index) of
        // a tensor of ones: kept where it is not zero.
        let ones = ir(self.g.full_like(1.0, x))?;
        let kept = ir(nn::dropout(self.g, name, ones, p))?;
        let zero = self.scalar(0.0, x)?;
        let mask = ir(self.g.compare(CmpOp::Ne, kept, zero))?;
        Ok(vec![Val::Node(y), Val::Node(mask)])
    }

    /// constant ([`Self::bernoulli_draw`]); the value returned here stands for the draw's
    /// shape and is never read.
    pub(super) fn random_uniform(&mut self, n: &NodeProto, at: &Attrs, name: &str) -> R<Vec<Val>> {
        let x = self.arg(n, 0)?;
        let d = self.dims(&x);
        let (low, high) = (at.float("low", 0.0), at.float("high", 1.0));
        if high <= low {
            return Err(format!("high {high} is not above low {low}"));
        }
        let dt = if at.has("dtype") {
            dtype_of(at.int("dtype", 1) as i32, self.float)?
        } else {
            self.dtype(&x)
        };
        if !dt.is_float() {
            return Err(format!("dtype {dt} is not a float"));
        }
        let out = n.output.first().ok_or("has no output")?;
        self.uniforms
            .insert(out.clone(), (name.to_string(), low, high));
        Ok(vec![Val::Node(ir(self.g.full(
            (low + high) / 2.0,
            Shape::new(&d),
            dt,
        ))?)])
    }

    /// A comparison of a `RandomUniformLike` draw `u` with a constant scalar `q` (PyTorch's
    /// `bernoulli_(p)`: `u < p`): a Bernoulli mask, true with the probability the comparison
    /// has, drawn as Ingot's seeded dropout mask of a tensor of ones (salted by the uniform's
    /// node, so every step draws anew and the backward pass sees the same draw). In
    /// evaluation mode the mask is all true (and cast to a float, its expectation: see
    /// `Cast`). `None` when neither operand is a uniform draw.
    pub(super) fn bernoulli_draw(&mut self, n: &NodeProto, c: CmpOp) -> R<Option<NodeId>> {
        let side = (0..2).find(|&i| {
            n.input
                .get(i)
                .is_some_and(|s| self.uniforms.contains_key(s))
        });
        let Some(side) = side else {
            return Ok(None);
        };
        let (salt, low, high) = self.uniforms[&n.input[side]].clone();
        let q = self
            .konst(n, 1 - side)
            .map_err(|_| "compares a random draw with a computed value: Ingot imports a comparison of RandomUniformLike with a constant (a Bernoulli draw) only".to_string())?
            .and_then(|k| k.scalar())
            .ok_or("compares a random draw with something other than one constant")?;
        // The comparison as `u OP q` (swapped when the draw is on the right).
        let c = if side == 0 {
            c
        } else {
            match c {
                CmpOp::Lt => CmpOp::Gt,
                CmpOp::Gt => CmpOp::Lt,
                CmpOp::Le => CmpOp::Ge,
                CmpOp::Ge => CmpOp::Le,
                other => other,
            }
        };
        let below = ((q - low) / (high - low)).clamp(0.0, 1.0);
        let keep = match c {
            CmpOp::Lt | CmpOp::Le => below,
            CmpOp::Gt | CmpOp::Ge => 1.0 - below,
            _ => return Err("compares a random draw for equality (probability 0): not a Bernoulli draw Ingot imports".into()),
        };
        let u = self.node(&self.arg(n, side)?, &n.input[side])?;
        let shape = self.g.ty(u).shape.clone();
        let out = n.output.first().ok_or("has no output")?.clone();
        self.bernoulli.insert(out, keep);
        if self.g.mode() == Mode::Eval || keep >= 1.0 {
            return Ok(Some(ir(self.g.full(1.0, shape, DType::Bool))?));
        }
        if keep <= 0.0 {
            return Ok(Some(ir(self.g.full(0.0, shape, DType::Bool))?));
        }
        let ones = ir(self.g.full(1.0, shape, self.float))?;
        let kept = ir(nn::dropout(self.g, &salt, ones, 1.0 - keep))?;
        let zero = ir(self.g.full(0.0, Shape::scalar(), self.float))?;
        Ok(Some(ir(self.g.compare(CmpOp::Ne, kept, zero))?))
    }

    /// Trilu's diagonal offset `k` (input 1, default 0).
    pub(super) fn trilu_k(&self, n: &NodeProto) -> R<i64> {
        match self.konst_i64s(n, 1)? {
            None => Ok(0),
            Some(v) if v.len() == 1 => Ok(v[0]),
            Some(v) => Err(format!("k must be one integer, got {v:?}")),
        }
    }

    pub(super) fn constant(&self, at: &Attrs) -> R<Const> {
        if let Some(t) = at.tensor("value") {
            return tensor(t, self.float, &self.dir).map_err(|e| e.to_string());
        }
        if at.has("value_float") {
            return Ok(Const::new(
                self.float,
                vec![],
                Data::F(vec![at.float("value_float", 0.0) as f32 as f64]),
            ));
        }
        if let Some(v) = at.floats("value_floats") {
            return Ok(Const::new(
                self.float,
                vec![v.len()],
                Data::F(v.iter().map(|&x| x as f64).collect()),
            ));
        }
        if at.has("value_int") {
            return Ok(Const::new(
                DType::I64,
                vec![],
                Data::I(vec![at.int("value_int", 0)]),
            ));
        }
        if let Some(v) = at.ints("value_ints") {
            return Ok(Const::i64s(v));
        }
        Err("has no value attribute Ingot reads (value, value_float(s), value_int(s))".into())
    }

    /// Input `i` as a float node.
    pub(super) fn float_in(&mut self, n: &NodeProto, i: usize) -> R<NodeId> {
        let v = self.arg(n, i)?;
        let v = match v {
            Val::Const(c) if !c.dtype.is_float() => Val::Const(c.cast(self.float)),
            v => v,
        };
        let id = self.node(&v, &n.input[i])?;
        let t = self.g.ty(id);
        if !t.dtype.is_float() {
            return Err(format!("input {i} must be a float tensor, got {t}"));
        }
        Ok(id)
    }

    pub(super) fn abs(&mut self, x: NodeId) -> R<NodeId> {
        let zero = self.scalar(0.0, x)?;
        let neg = ir(self.g.compare(CmpOp::Lt, x, zero))?;
        let nx = ir(self.g.neg(x))?;
        ir(self.g.select(neg, nx, x))
    }

    /// `1/(1 + e^−x)`, written with `e = exp(−|x|)` (never overflows) as `1/(1 + e)` for
    /// `x >= 0` and `e/(1 + e)` below, so that neither the value nor its gradient is ever
    /// `inf · 0`.
    pub(super) fn sigmoid(&mut self, x: NodeId) -> R<NodeId> {
        let a = self.abs(x)?;
        let na = ir(self.g.neg(a))?;
        let e = ir(self.g.exp(na))?;
        let e1 = ir(self.g.add_scalar(e, 1.0))?;
        let r = ir(self.g.recip(e1))?;
        let er = ir(self.g.mul(e, r))?;
        let zero = self.scalar(0.0, x)?;
        let pos = ir(self.g.compare(CmpOp::Ge, x, zero))?;
        ir(self.g.select(pos, r, er))
    }

    pub(super) fn pow(&mut self, n: &NodeProto) -> R<Vec<Val>> {
        let x = self.float_in(n, 0)?;
        let e = self
            .konst(n, 1)?
            .and_then(|c| c.scalar())
            .ok_or("the exponent must be one constant value")?;
        let y = match e {
            1.0 => x,
            2.0 => ir(self.g.mul(x, x))?,
            3.0 => {
                let x2 = ir(self.g.mul(x, x))?;
                ir(self.g.mul(x2, x))?
            }
            0.5 => ir(self.g.sqrt(x))?,
            -1.0 => ir(self.g.recip(x))?,
            -0.5 => {
                let s = ir(self.g.sqrt(x))?;
                ir(self.g.recip(s))?
            }
            0.0 => ir(self.g.full_like(1.0, x))?,
            _ => {
                return Err(format!(
                    "exponent {e} needs a pow primitive (Ingot writes exponents 0, ±1, 2, 3, 0.5 and −0.5 exactly)"
                ))
            }
        };
        Ok(vec![Val::Node(y)])
    }
}
