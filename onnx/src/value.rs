//! Constant tensors held on the host while importing: initializers that are not parameters,
//! `Constant` nodes, and everything computed from them and from static shapes (`Shape`,
//! `Gather`, `Concat`, arithmetic, ...). Shape arithmetic is folded here so that the graph
//! Ingot plans has static shapes; a constant a graph op needs is materialized by the lowering.

use ingot_compiler::ir::DType;

/// Elements: floats as f64 (exact for f32 and f64), integers and booleans as i64 (exact for
/// i64 sizes such as Slice's `INT64_MAX` ends).
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    F(Vec<f64>),
    I(Vec<i64>),
}

/// A constant tensor: its Ingot dtype, dims and row-major elements.
#[derive(Clone, Debug, PartialEq)]
pub struct Const {
    pub dtype: DType,
    pub dims: Vec<usize>,
    pub data: Data,
}

/// Row-major strides of `dims`.
pub fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// The NumPy broadcast of `a` and `b`, or `None` when they do not broadcast.
pub fn broadcast_dims(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let r = a.len().max(b.len());
    (0..r)
        .map(|i| {
            let da = if i + a.len() >= r {
                a[i + a.len() - r]
            } else {
                1
            };
            let db = if i + b.len() >= r {
                b[i + b.len() - r]
            } else {
                1
            };
            match (da, db) {
                (x, y) if x == y => Some(x),
                (1, y) => Some(y),
                (x, 1) => Some(x),
                _ => None,
            }
        })
        .collect()
}

/// For each element of `out` (row-major), the flat index of the element of a tensor shaped
/// `src` that broadcasting reads there.
pub fn broadcast_index(out: &[usize], src: &[usize]) -> Vec<usize> {
    let n: usize = out.iter().product();
    let off = out.len() - src.len();
    let ss = strides(src);
    let os = strides(out);
    (0..n)
        .map(|flat| {
            let mut at = 0;
            for (k, (&d, &st)) in src.iter().zip(&ss).enumerate() {
                let i = (flat / os[k + off]) % out[k + off];
                if d != 1 {
                    at += i * st;
                }
            }
            at
        })
        .collect()
}

impl Data {
    pub fn len(&self) -> usize {
        match self {
            Data::F(v) => v.len(),
            Data::I(v) => v.len(),
        }
    }

    /// The element at `i` as f64.
    pub fn f64_at(&self, i: usize) -> f64 {
        match self {
            Data::F(v) => v[i],
            Data::I(v) => v[i] as f64,
        }
    }

    /// The elements picked by `index`, in its order.
    pub fn pick(&self, index: &[usize]) -> Data {
        match self {
            Data::F(v) => Data::F(index.iter().map(|&i| v[i]).collect()),
            Data::I(v) => Data::I(index.iter().map(|&i| v[i]).collect()),
        }
    }
}

impl Const {
    pub fn new(dtype: DType, dims: Vec<usize>, data: Data) -> Const {
        Const { dtype, dims, data }
    }

    /// A 1-d i64 tensor (a shape, a list of axes).
    pub fn i64s(values: Vec<i64>) -> Const {
        Const::new(DType::I64, vec![values.len()], Data::I(values))
    }

    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// The elements as integers (floats must be whole numbers), or `None`.
    pub fn to_i64s(&self) -> Option<Vec<i64>> {
        match &self.data {
            Data::I(v) => Some(v.clone()),
            Data::F(v) => v
                .iter()
                .map(|&x| (x.fract() == 0.0 && x.abs() < 9e15).then_some(x as i64))
                .collect(),
        }
    }

    /// The elements as f64.
    pub fn to_f64s(&self) -> Vec<f64> {
        (0..self.numel()).map(|i| self.data.f64_at(i)).collect()
    }

    /// The one value of a one-element tensor.
    pub fn scalar(&self) -> Option<f64> {
        (self.numel() == 1).then(|| self.data.f64_at(0))
    }

    /// The value every element has, when they are all equal (and there is at least one).
    pub fn uniform(&self) -> Option<f64> {
        if self.numel() == 0 {
            return None;
        }
        let first = self.data.f64_at(0);
        let same = match &self.data {
            Data::F(v) => v.iter().all(|x| x.to_bits() == v[0].to_bits()),
            Data::I(v) => v.iter().all(|x| *x == v[0]),
        };
        same.then_some(first)
    }

    /// The constant with every axis its elements repeat along cut to size 1, when there is
    /// such an axis: the constant is that smaller one broadcast back (an exported attention
    /// mask `[batch, 1, T, T]` is one `[1, 1, T, T]` triangle for every sample).
    pub fn repeated(&self) -> Option<Const> {
        let mut cur = self.clone();
        let mut cut = false;
        for a in 0..cur.dims.len() {
            let n = cur.dims[a];
            if n <= 1 {
                continue;
            }
            let outer: usize = cur.dims[..a].iter().product();
            let inner: usize = cur.dims[a + 1..].iter().product();
            let bits = |i: usize| cur.data.f64_at(i).to_bits();
            let same = (0..outer).all(|o| {
                let base = o * n * inner;
                (1..n).all(|k| (0..inner).all(|i| bits(base + k * inner + i) == bits(base + i)))
            });
            if !same {
                continue;
            }
            let keep: Vec<usize> = (0..outer)
                .flat_map(|o| (0..inner).map(move |i| o * n * inner + i))
                .collect();
            let data = match &cur.data {
                Data::F(v) => Data::F(keep.iter().map(|&i| v[i]).collect()),
                Data::I(v) => Data::I(keep.iter().map(|&i| v[i]).collect()),
            };
            cur.dims[a] = 1;
            cur.data = data;
            cut = true;
        }
        cut.then_some(cur)
    }

    /// When the elements over the last two axes depend only on the diagonal `d = j − i`, as
    /// one value up to some `d = k` and another after (a causal mask, a triangle of ones), and
    /// every leading axis has size 1: `(k, value for d <= k, value for d > k)`.
    pub fn triangle(&self) -> Option<(i64, f64, f64)> {
        let r = self.dims.len();
        if r < 2 || self.dims[..r - 2].iter().any(|&d| d != 1) {
            return None;
        }
        let (rows, cols) = (self.dims[r - 2], self.dims[r - 1]);
        if rows == 0 || cols == 0 {
            return None;
        }
        // The value of each diagonal, from its first cell; every other cell must agree.
        let diag = |d: i64| -> f64 {
            let (i, j) = if d >= 0 {
                (0, d as usize)
            } else {
                ((-d) as usize, 0)
            };
            self.data.f64_at(i * cols + j)
        };
        for i in 0..rows {
            for j in 0..cols {
                let d = j as i64 - i as i64;
                if self.data.f64_at(i * cols + j).to_bits() != diag(d).to_bits() {
                    return None;
                }
            }
        }
        let first = diag(-(rows as i64 - 1));
        let mut k = None;
        for d in -(rows as i64 - 1)..cols as i64 {
            let v = diag(d);
            match k {
                None if v.to_bits() != first.to_bits() => k = Some((d - 1, v)),
                Some((_, high)) if v.to_bits() != high.to_bits() => return None,
                _ => {}
            }
        }
        k.map(|(k, high)| (k, first, high))
    }

    /// The same elements with a new dtype (integer casts truncate toward zero, as ONNX's
    /// `Cast` does; a cast to bool is `x != 0`). Float values are rounded to the target's
    /// precision (f32 values kept as f64 are rounded through f32).
    pub fn cast(&self, to: DType) -> Const {
        let data = match (to, &self.data) {
            (DType::Bool, d) => {
                Data::I((0..d.len()).map(|i| (d.f64_at(i) != 0.0) as i64).collect())
            }
            (t, Data::F(v)) if t.is_int() => Data::I(v.iter().map(|&x| x.trunc() as i64).collect()),
            (t, Data::I(v)) if t.is_int() => Data::I(v.clone()),
            (DType::F32 | DType::BF16, d) => {
                Data::F((0..d.len()).map(|i| d.f64_at(i) as f32 as f64).collect())
            }
            (_, d) => Data::F((0..d.len()).map(|i| d.f64_at(i)).collect()),
        };
        Const::new(to, self.dims.clone(), data)
    }

    /// Same elements, new dims (the caller checked the element count).
    pub fn reshaped(&self, dims: Vec<usize>) -> Const {
        Const::new(self.dtype, dims, self.data.clone())
    }

    /// Output axis `i` is axis `perm[i]`.
    pub fn transposed(&self, perm: &[usize]) -> Const {
        let dims: Vec<usize> = perm.iter().map(|&p| self.dims[p]).collect();
        let src = strides(&self.dims);
        let out = strides(&dims);
        let n = self.numel();
        let index: Vec<usize> = (0..n)
            .map(|flat| {
                perm.iter()
                    .enumerate()
                    .map(|(k, &p)| ((flat / out[k]) % dims[k]) * src[p])
                    .sum()
            })
            .collect();
        Const::new(self.dtype, dims, self.data.pick(&index))
    }

    /// The elements of `self` broadcast to `dims` (the caller checked that they broadcast).
    pub fn broadcast(&self, dims: &[usize]) -> Const {
        let index = broadcast_index(dims, &self.dims);
        Const::new(self.dtype, dims.to_vec(), self.data.pick(&index))
    }

    /// Elements `start, start + step, ...` (before `end`) along `axis`; `step` may be negative.
    pub fn sliced(&self, axis: usize, picks: &[usize]) -> Const {
        let mut dims = self.dims.clone();
        dims[axis] = picks.len();
        let src = strides(&self.dims);
        let out = strides(&dims);
        let n: usize = dims.iter().product();
        let index: Vec<usize> = (0..n)
            .map(|flat| {
                (0..dims.len())
                    .map(|k| {
                        let i = (flat / out[k]) % dims[k];
                        let i = if k == axis { picks[i] } else { i };
                        i * src[k]
                    })
                    .sum()
            })
            .collect();
        Const::new(self.dtype, dims, self.data.pick(&index))
    }

    /// `parts` joined along `axis` (the caller checked their dims agree elsewhere).
    pub fn concat(parts: &[Const], axis: usize) -> Const {
        let mut dims = parts[0].dims.clone();
        dims[axis] = parts.iter().map(|p| p.dims[axis]).sum();
        let outer: usize = dims[..axis].iter().product();
        let float = parts.iter().any(|p| matches!(p.data, Data::F(_)));
        let mut f = Vec::new();
        let mut iv = Vec::new();
        for o in 0..outer {
            for p in parts {
                let inner: usize = p.dims[axis..].iter().product();
                for k in o * inner..(o + 1) * inner {
                    if float {
                        f.push(p.data.f64_at(k));
                    } else if let Data::I(v) = &p.data {
                        iv.push(v[k]);
                    }
                }
            }
        }
        let data = if float { Data::F(f) } else { Data::I(iv) };
        Const::new(parts[0].dtype, dims, data)
    }

    /// Little-endian bytes of the elements as `dtype` (what a leaf of that dtype holds).
    pub fn to_le_bytes(&self, dtype: DType) -> Vec<u8> {
        let n = self.numel();
        let mut out = Vec::with_capacity(n * dtype.size());
        for i in 0..n {
            let x = self.data.f64_at(i);
            match (dtype, &self.data) {
                (DType::F32, _) => out.extend((x as f32).to_le_bytes()),
                (DType::F64, _) => out.extend(x.to_le_bytes()),
                (DType::BF16, _) => out.extend(bf16_bits(x as f32).to_le_bytes()),
                (DType::I32, Data::I(v)) => out.extend((v[i] as i32).to_le_bytes()),
                (DType::I64, Data::I(v)) => out.extend(v[i].to_le_bytes()),
                (DType::I32, _) => out.extend((x as i32).to_le_bytes()),
                (DType::I64, _) => out.extend((x as i64).to_le_bytes()),
                (DType::Bool, _) => out.push((x != 0.0) as u8),
            }
        }
        out
    }
}

/// The bf16 nearest to `x` (ties to even; NaN stays NaN), as bits.
fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// Elementwise `f` over `a` and `b` broadcast together; floats when either is float.
pub fn zip(
    a: &Const,
    b: &Const,
    dtype: DType,
    ff: impl Fn(f64, f64) -> f64,
    fi: impl Fn(i64, i64) -> Option<i64>,
) -> Option<Const> {
    let dims = broadcast_dims(&a.dims, &b.dims)?;
    let ia = broadcast_index(&dims, &a.dims);
    let ib = broadcast_index(&dims, &b.dims);
    let data = match (&a.data, &b.data) {
        (Data::I(x), Data::I(y)) => Data::I(
            ia.iter()
                .zip(&ib)
                .map(|(&i, &j)| fi(x[i], y[j]))
                .collect::<Option<Vec<_>>>()?,
        ),
        _ => Data::F(
            ia.iter()
                .zip(&ib)
                .map(|(&i, &j)| ff(a.data.f64_at(i), b.data.f64_at(j)))
                .collect(),
        ),
    };
    Some(Const::new(dtype, dims, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_a_row_repeats_it_for_every_column_position() {
        let a = Const::new(DType::I64, vec![1, 3], Data::I(vec![1, 2, 3]));
        let b = Const::new(DType::I64, vec![2, 1], Data::I(vec![10, 20]));
        let s = zip(&a, &b, DType::I64, |x, y| x + y, |x, y| Some(x + y)).unwrap();
        assert_eq!(s.dims, vec![2, 3]);
        assert_eq!(s.data, Data::I(vec![11, 12, 13, 21, 22, 23]));
    }

    #[test]
    fn a_transpose_of_a_2x3_matrix_reads_its_columns() {
        let a = Const::new(DType::I64, vec![2, 3], Data::I(vec![0, 1, 2, 3, 4, 5]));
        assert_eq!(a.transposed(&[1, 0]).data, Data::I(vec![0, 3, 1, 4, 2, 5]));
    }

    #[test]
    fn concat_along_the_last_axis_interleaves_rows() {
        let a = Const::new(DType::I64, vec![2, 1], Data::I(vec![1, 2]));
        let b = Const::new(DType::I64, vec![2, 2], Data::I(vec![3, 4, 5, 6]));
        let c = Const::concat(&[a, b], 1);
        assert_eq!(c.data, Data::I(vec![1, 3, 4, 2, 5, 6]));
    }

    #[test]
    fn a_mask_repeated_over_the_batch_is_one_triangle_and_a_varying_one_is_kept() {
        // [2, 1, 3, 3]: the same causal mask for both samples.
        let tri = [0.0, -1.0, -1.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0];
        let both: Vec<f64> = tri.iter().chain(tri.iter()).copied().collect();
        let c = Const::new(DType::F32, vec![2, 1, 3, 3], Data::F(both.clone()));
        let small = c.repeated().unwrap();
        assert_eq!(small.dims, [1, 1, 3, 3]);
        assert_eq!(small.triangle(), Some((0, 0.0, -1.0)));
        // A padded sample differs from the other: nothing repeats.
        let mut padded = both;
        padded[9 + 2] = -1.0;
        padded[9 + 5] = -1.0;
        padded[9 + 8] = -1.0;
        let c = Const::new(DType::F32, vec![2, 1, 3, 3], Data::F(padded));
        assert_eq!(c.repeated(), None);
    }

    #[test]
    fn a_causal_mask_is_a_triangle_and_a_scattered_matrix_is_not() {
        let lower = Const::new(
            DType::Bool,
            vec![1, 3, 3],
            Data::I(vec![1, 0, 0, 1, 1, 0, 1, 1, 1]),
        );
        assert_eq!(lower.triangle(), Some((0, 1.0, 0.0)));
        let upper = Const::new(
            DType::F32,
            vec![2, 3],
            Data::F(vec![0.0, 5.0, 5.0, 0.0, 0.0, 5.0]),
        );
        assert_eq!(upper.triangle(), Some((0, 0.0, 5.0)));
        let scattered = Const::new(DType::I64, vec![2, 2], Data::I(vec![0, 1, 1, 0]));
        assert_eq!(scattered.triangle(), None);
        let two_steps = Const::new(DType::I64, vec![1, 3], Data::I(vec![0, 1, 2]));
        assert_eq!(two_steps.triangle(), None);
    }

    #[test]
    fn slicing_with_picks_reverses_an_axis() {
        let a = Const::new(DType::I64, vec![2, 2], Data::I(vec![1, 2, 3, 4]));
        assert_eq!(a.sliced(1, &[1, 0]).data, Data::I(vec![2, 1, 4, 3]));
    }
}
