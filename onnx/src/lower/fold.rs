//! Evaluation on the host of ops whose inputs are all constants (shape arithmetic, masks).

use super::*;

impl Lower<'_> {
    /// Evaluates `n` on the host when every input is a constant (or the op only reads its
    /// input's shape); `None` when the op has no host evaluation and must be traced.
    pub(super) fn fold(&mut self, n: &NodeProto, at: &Attrs) -> R<Option<Vec<Val>>> {
        let op = n.op_type();
        let c = |i: usize| self.const_in(n, i);
        let out = folded;
        match op {
            "Add" | "Sub" | "Mul" | "Div" | "Max" | "Min" | "Pow" => self.fold_arithmetic(n, op),
            "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" => {
                self.fold_comparison(n, op)
            }
            "Mod" => self.fold_mod(n, at),
            "IsNaN" => {
                let a = c(0)?;
                let v: Vec<i64> = a.to_f64s().iter().map(|x| x.is_nan() as i64).collect();
                out(Const::new(DType::Bool, a.dims.clone(), Data::I(v)))
            }
            "GatherElements" => self.fold_gather_elements(n, at),
            "GatherND" => self.fold_gather_nd(n, at),
            "Not" => {
                let a = c(0)?;
                let v: Vec<i64> = a.to_f64s().iter().map(|&x| (x == 0.0) as i64).collect();
                out(Const::new(DType::Bool, a.dims.clone(), Data::I(v)))
            }
            "Neg" | "Sqrt" | "Exp" | "Log" | "Reciprocal" | "Floor" | "Ceil" | "Abs" | "Tanh" => {
                self.fold_unary(n, op)
            }
            "Where" => self.fold_where(n),
            "Cast" => out(c(0)?.cast(dtype_of(at.int("to", 0) as i32, self.float)?)),
            // PyTorch's dynamo exporter casts its constants (a Range's bounds) like others.
            "CastLike" => out(c(0)?.cast(c(1)?.dtype)),
            "Range" => self.fold_range(n),
            "ConstantOfShape" => self.fold_constant_of_shape(n, at),
            "Identity" => out(c(0)?),
            "Trilu" => self.fold_trilu(n, at),
            "Reshape" | "Squeeze" | "Unsqueeze" | "Flatten" | "Split" | "Transpose" | "Expand"
            | "Concat" | "Slice" | "Gather" => self.fold_shape_op(n, at).map(Some),
            _ => Ok(None),
        }
    }

    /// Input `i` of `n`, which must be a constant.
    fn const_in(&self, n: &NodeProto, i: usize) -> R<Const> {
        match self.opt(n, i)? {
            Some(Val::Const(c)) => Ok(c),
            _ => Err(format!("needs input {i}")),
        }
    }

    /// Add, Sub, Mul, Div, Max, Min and Pow of two constants (`None` for more operands).
    fn fold_arithmetic(&self, n: &NodeProto, op: &str) -> R<Option<Vec<Val>>> {
        let (a, b) = (self.const_in(n, 0)?, self.const_in(n, 1)?);
        if n.input.len() != 2 {
            return Ok(None);
        }
        let dt = a.dtype;
        let r = match op {
            "Add" => zip(&a, &b, dt, |x, y| x + y, |x, y| x.checked_add(y)),
            "Sub" => zip(&a, &b, dt, |x, y| x - y, |x, y| x.checked_sub(y)),
            "Mul" => zip(&a, &b, dt, |x, y| x * y, |x, y| x.checked_mul(y)),
            "Div" => zip(&a, &b, dt, |x, y| x / y, |x, y| x.checked_div(y)),
            "Max" => zip(&a, &b, dt, f64::max, |x, y| Some(x.max(y))),
            "Min" => zip(&a, &b, dt, f64::min, |x, y| Some(x.min(y))),
            _ => zip(&a, &b, dt, f64::powf, |x, y| {
                u32::try_from(y).ok().and_then(|y| x.checked_pow(y))
            }),
        };
        folded(fit(r.ok_or_else(|| format!("constant operands {:?} and {:?} do not broadcast (or an integer overflow or division by zero)", a.dims, b.dims))?))
    }

    /// Equal, Less, Greater, LessOrEqual and GreaterOrEqual of two constants.
    fn fold_comparison(&self, n: &NodeProto, op: &str) -> R<Option<Vec<Val>>> {
        let (a, b) = (self.const_in(n, 0)?, self.const_in(n, 1)?);
        let (f, g) = (comparison::<f64>(op), comparison::<i64>(op));
        let r = zip(
            &a,
            &b,
            DType::Bool,
            |x, y| f(x, y) as i64 as f64,
            |x, y| Some(g(x, y) as i64),
        )
        .ok_or("constant operands do not broadcast")?;
        folded(r.cast(DType::Bool))
    }

    /// Mod: C's fmod with `fmod=1`, else the sign of the divisor (integers only).
    fn fold_mod(&self, n: &NodeProto, at: &Attrs) -> R<Option<Vec<Val>>> {
        let (a, b) = (self.const_in(n, 0)?, self.const_in(n, 1)?);
        let fmod = at.int("fmod", 0) != 0;
        if a.dtype.is_float() && !fmod {
            return Err("Mod of floats needs fmod=1 (ONNX's rule)".into());
        }
        // fmod=1: C's fmod (the sign of the dividend, Rust's `%`); fmod=0: the sign of
        // the divisor (Python's `%`, integers only).
        let r = zip(
            &a,
            &b,
            a.dtype,
            |x, y| x % y,
            |x, y| {
                let m = x.checked_rem(y)?;
                Some(if !fmod && m != 0 && (m < 0) != (y < 0) {
                    m + y
                } else {
                    m
                })
            },
        )
        .ok_or("constant operands do not broadcast, or a division by zero")?;
        folded(fit(r))
    }

    /// GatherElements of constant data at constant indices.
    /// GatherND of constants (batch_dims 0): each index tuple (the indices' last axis) picks
    /// a slice of the data (PyTorch's dynamo export of BERT indexes its token-type buffer so).
    fn fold_gather_nd(&self, n: &NodeProto, at: &Attrs) -> R<Option<Vec<Val>>> {
        if at.int("batch_dims", 0) != 0 {
            return Err("batch_dims other than 0 is not supported".into());
        }
        let (data, idx) = (self.const_in(n, 0)?, self.const_in(n, 1)?);
        let k = *idx
            .dims
            .last()
            .ok_or("indices must have at least one axis")?;
        if k == 0 || k > data.dims.len() {
            return Err(format!(
                "index tuples of {k} entries into data {:?} (1 to its rank)",
                data.dims
            ));
        }
        let ids = idx.to_i64s().ok_or("indices must be integers")?;
        let inner: usize = data.dims[k..].iter().product();
        if (ids.len() / k).saturating_mul(inner) > MAX_FOLDED {
            return Err(format!("gathers more than {MAX_FOLDED} elements"));
        }
        let ds = crate::value::strides(&data.dims);
        let mut picks = Vec::with_capacity(ids.len() / k * inner);
        for tuple in ids.chunks(k) {
            let mut base = 0;
            for (a, &i) in tuple.iter().enumerate() {
                let size = data.dims[a] as i64;
                let j = if i < 0 { i + size } else { i };
                if j < 0 || j >= size {
                    return Err(format!(
                        "index {i} is out of range for axis {a} of size {size}"
                    ));
                }
                base += j as usize * ds[a];
            }
            picks.extend(base..base + inner);
        }
        let mut dims = idx.dims[..idx.dims.len() - 1].to_vec();
        dims.extend(&data.dims[k..]);
        let flat = data.reshaped(vec![data.numel()]).sliced(0, &picks);
        folded(flat.reshaped(dims))
    }

    fn fold_gather_elements(&self, n: &NodeProto, at: &Attrs) -> R<Option<Vec<Val>>> {
        let (data, idx) = (self.const_in(n, 0)?, self.const_in(n, 1)?);
        let r = data.dims.len();
        let axis = norm_axis(at.int("axis", 0), r)?;
        if idx.dims.len() != r {
            return Err(format!(
                "indices {:?} must have the rank of the data {:?}",
                idx.dims, data.dims
            ));
        }
        let ids = idx.to_i64s().ok_or("indices must be integers")?;
        let (ds, is) = (
            crate::value::strides(&data.dims),
            crate::value::strides(&idx.dims),
        );
        let mut picks = Vec::with_capacity(ids.len());
        for (flat, &i) in ids.iter().enumerate() {
            let size = data.dims[axis] as i64;
            let j = if i < 0 { i + size } else { i };
            if j < 0 || j >= size {
                return Err(format!(
                    "index {i} is out of range for axis {axis} of size {size}"
                ));
            }
            let mut src = 0;
            for k in 0..r {
                let pos = (flat / is[k]) % idx.dims[k];
                if k != axis && pos >= data.dims[k] {
                    return Err(format!(
                        "indices {:?} are larger than the data {:?} on axis {k}",
                        idx.dims, data.dims
                    ));
                }
                src += if k == axis { j as usize } else { pos } * ds[k];
            }
            picks.push(src);
        }
        let flat = data.reshaped(vec![data.numel()]).sliced(0, &picks);
        folded(flat.reshaped(idx.dims.clone()))
    }

    /// Neg, Sqrt, Exp, Log, Reciprocal, Floor, Ceil, Abs and Tanh (integers kept integers where the op allows).
    fn fold_unary(&self, n: &NodeProto, op: &str) -> R<Option<Vec<Val>>> {
        let a = self.const_in(n, 0)?;
        if let (Data::I(v), "Neg" | "Abs" | "Floor" | "Ceil") = (&a.data, op) {
            let v = v.iter().map(|&x| match op {
                "Neg" => -x,
                "Abs" => x.abs(),
                _ => x,
            });
            return folded(Const::new(a.dtype, a.dims.clone(), Data::I(v.collect())));
        }
        let f: fn(f64) -> f64 = match op {
            "Neg" => |x| -x,
            "Sqrt" => f64::sqrt,
            "Exp" => f64::exp,
            "Log" => f64::ln,
            "Reciprocal" => |x| 1.0 / x,
            "Floor" => f64::floor,
            "Ceil" => f64::ceil,
            "Abs" => f64::abs,
            _ => f64::tanh,
        };
        let v = a.to_f64s().into_iter().map(f).collect();
        folded(fit(Const::new(a.dtype, a.dims.clone(), Data::F(v))))
    }

    /// Where over three constants, broadcast together.
    fn fold_where(&self, n: &NodeProto) -> R<Option<Vec<Val>>> {
        let (k, a, b) = (
            self.const_in(n, 0)?,
            self.const_in(n, 1)?,
            self.const_in(n, 2)?,
        );
        let dims = broadcast_dims(&k.dims, &a.dims)
            .and_then(|d| broadcast_dims(&d, &b.dims))
            .ok_or("constant operands do not broadcast")?;
        let (k, a, b) = (k.broadcast(&dims), a.broadcast(&dims), b.broadcast(&dims));
        let data = match (&a.data, &b.data) {
            (Data::I(x), Data::I(y)) => Data::I(
                (0..x.len())
                    .map(|i| if k.data.f64_at(i) != 0.0 { x[i] } else { y[i] })
                    .collect(),
            ),
            _ => Data::F(
                (0..a.numel())
                    .map(|i| {
                        if k.data.f64_at(i) != 0.0 {
                            a.data.f64_at(i)
                        } else {
                            b.data.f64_at(i)
                        }
                    })
                    .collect(),
            ),
        };
        folded(Const::new(a.dtype, dims, data))
    }

    /// Range from constant start, limit and delta.
    fn fold_range(&self, n: &NodeProto) -> R<Option<Vec<Val>>> {
        let (s, l, d) = (
            self.const_in(n, 0)?,
            self.const_in(n, 1)?,
            self.const_in(n, 2)?,
        );
        let (s, l, d) = (
            s.scalar().ok_or("start must be a scalar")?,
            l.scalar().ok_or("limit must be a scalar")?,
            d.scalar().ok_or("delta must be a scalar")?,
        );
        if d == 0.0 {
            return Err("delta is 0".into());
        }
        let count = ((l - s) / d).ceil().max(0.0) as usize;
        if count > MAX_FOLDED {
            return Err(format!("Range of {count} elements is too large"));
        }
        let dt = self.const_in(n, 0)?.dtype;
        let data = if dt.is_int() {
            Data::I((0..count).map(|i| (s + i as f64 * d) as i64).collect())
        } else {
            Data::F((0..count).map(|i| s + i as f64 * d).collect())
        };
        folded(fit(Const::new(dt, vec![count], data)))
    }

    /// ConstantOfShape: `value` (0 of the float type by default) repeated to the shape.
    fn fold_constant_of_shape(&self, n: &NodeProto, at: &Attrs) -> R<Option<Vec<Val>>> {
        let shape = self
            .const_in(n, 0)?
            .to_i64s()
            .ok_or("the shape must be integers")?;
        if shape.iter().any(|&s| s < 0) {
            return Err(format!("shape {shape:?} has a negative size"));
        }
        let dims: Vec<usize> = shape.iter().map(|&s| s as usize).collect();
        let count = dims
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .filter(|&c| c <= MAX_FOLDED)
            .ok_or("too large")?;
        let v = match at.tensor("value") {
            Some(t) => tensor(t, self.float, &self.dir).map_err(|e| e.to_string())?,
            None => Const::new(self.float, vec![1], Data::F(vec![0.0])),
        };
        let data = match &v.data {
            Data::I(x) => Data::I(vec![*x.first().ok_or("value is empty")?; count]),
            Data::F(x) => Data::F(vec![*x.first().ok_or("value is empty")?; count]),
        };
        folded(Const::new(v.dtype, dims, data))
    }

    /// Trilu of a constant.
    fn fold_trilu(&self, n: &NodeProto, at: &Attrs) -> R<Option<Vec<Val>>> {
        let a = self.const_in(n, 0)?;
        let k = self.trilu_k(n)?;
        let r = a.dims.len();
        if r < 2 {
            return Err(format!("needs at least two axes, got {:?}", a.dims));
        }
        let (rows, cols) = (a.dims[r - 2], a.dims[r - 1]);
        let upper = at.int("upper", 1) != 0;
        let keep = |flat: usize| {
            let (i, j) = (((flat / cols) % rows) as i64, (flat % cols) as i64);
            if upper {
                j - i >= k
            } else {
                j - i <= k
            }
        };
        let data = match &a.data {
            Data::I(v) => Data::I(
                v.iter()
                    .enumerate()
                    .map(|(f, &x)| if keep(f) { x } else { 0 })
                    .collect(),
            ),
            Data::F(v) => Data::F(
                v.iter()
                    .enumerate()
                    .map(|(f, &x)| if keep(f) { x } else { 0.0 })
                    .collect(),
            ),
        };
        folded(Const::new(a.dtype, a.dims.clone(), data))
    }

    pub(super) fn fold_shape_op(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let op = n.op_type();
        let x = match self.arg(n, 0)? {
            Val::Const(c) => c,
            Val::Node(_) => return Err("folding a computed value".into()),
        };
        let d = x.dims.clone();
        let one = |k: Const| Ok(vec![Val::Const(k)]);
        match op {
            "Transpose" => one(x.transposed(&transpose_perm(at.ints("perm"), d.len())?)),
            "Expand" => {
                let shape = self.konst_i64s(n, 1)?.ok_or("needs a shape")?;
                let target = expand_dims(&d, &shape)?;
                if target
                    .iter()
                    .try_fold(1usize, |a, &x| a.checked_mul(x))
                    .is_none_or(|c| c > MAX_FOLDED)
                {
                    return Err(format!("expanding a constant to {target:?} is too large"));
                }
                one(x.broadcast(&target))
            }
            "Concat" => {
                let parts: Vec<Const> = (0..n.input.len())
                    .map(|i| match self.arg(n, i)? {
                        Val::Const(c) => Ok(c),
                        Val::Node(_) => Err("mixed".to_string()),
                    })
                    .collect::<R<_>>()?;
                let axis = norm_axis(at.int("axis", 0), d.len())?;
                for p in &parts {
                    let ok = p.dims.len() == d.len()
                        && (0..d.len()).all(|k| k == axis || p.dims[k] == d[k]);
                    if !ok {
                        return Err(format!(
                            "parts {:?} and {:?} do not join on axis {axis}",
                            d, p.dims
                        ));
                    }
                }
                one(Const::concat(&parts, axis))
            }
            "Slice" => {
                let mut k = x;
                for (axis, p) in self.slice_picks(n, &d)? {
                    k = k.sliced(axis, &p);
                }
                one(k)
            }
            "Split" => {
                let axis = norm_axis(at.int("axis", 0), d.len())?;
                let sizes = split_sizes(self.konst_i64s(n, 1)?, at, n.output.len(), d[axis])?;
                let mut start = 0;
                let mut outs = Vec::new();
                for s in sizes {
                    let p: Vec<usize> = (start..start + s).collect();
                    outs.push(Val::Const(x.sliced(axis, &p)));
                    start += s;
                }
                Ok(outs)
            }
            "Gather" => {
                let idx = match self.arg(n, 1)? {
                    Val::Const(c) => c,
                    Val::Node(_) => return Err("mixed".into()),
                };
                let axis = norm_axis(at.int("axis", 0), d.len())?;
                let ids = idx.to_i64s().ok_or("indices must be integers")?;
                let mut picks = Vec::new();
                for &i in &ids {
                    let j = if i < 0 { i + d[axis] as i64 } else { i };
                    if j < 0 || j as usize >= d[axis] {
                        return Err(format!(
                            "index {i} is out of range for axis {axis} of size {}",
                            d[axis]
                        ));
                    }
                    picks.push(j as usize);
                }
                let g = x.sliced(axis, &picks);
                let mut dims = d[..axis].to_vec();
                dims.extend(&idx.dims);
                dims.extend(&d[axis + 1..]);
                one(g.reshaped(dims))
            }
            _ => {
                let lowered = self.lower_shape_only(n, at, x)?;
                Ok(lowered)
            }
        }
    }

    pub(super) fn lower_shape_only(&mut self, n: &NodeProto, at: &Attrs, x: Const) -> R<Vec<Val>> {
        let d = x.dims.clone();
        let shape = match n.op_type() {
            "Reshape" => reshape_dims(&d, &self.reshape_spec(n)?)?,
            "Flatten" => {
                let axis = at.int("axis", 1);
                let a = if axis < 0 {
                    axis + d.len() as i64
                } else {
                    axis
                } as usize;
                if a > d.len() {
                    return Err(format!("axis {axis} is out of range"));
                }
                vec![d[..a].iter().product(), d[a..].iter().product()]
            }
            op => {
                let axes = match self.konst_i64s(n, 1)? {
                    Some(a) => Some(a),
                    None => at.ints("axes"),
                };
                squeeze_dims(op, &d, axes.as_deref())?
            }
        };
        Ok(vec![Val::Const(x.reshaped(shape))])
    }
}

/// A folded op's one output.
fn folded(k: Const) -> R<Option<Vec<Val>>> {
    Ok(Some(vec![Val::Const(k)]))
}

/// `k` kept as f32 when it is of f32 (its values rounded to f32).
fn fit(k: Const) -> Const {
    if k.dtype == DType::F32 {
        k.cast(DType::F32)
    } else {
        k
    }
}

/// The comparison `op` names (Equal, Less, Greater, LessOrEqual; anything else is
/// GreaterOrEqual), on floats or integers alike.
fn comparison<T: PartialOrd>(op: &str) -> fn(T, T) -> bool {
    match op {
        "Equal" => |x, y| x == y,
        "Less" => |x, y| x < y,
        "Greater" => |x, y| x > y,
        "LessOrEqual" => |x, y| x <= y,
        _ => |x, y| x >= y,
    }
}
