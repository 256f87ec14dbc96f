//! Property tests of the fused-kernel CPU implementation against a naive evaluator that follows
//! the "Meaning" section of `ingot_kernels::fused` literally, one domain index at a time, and
//! shares no code with `fused::cpu`.
//!
//! The naive evaluator folds reductions in the order the docs fix (that of
//! `ingot_kernels::cpu::reduce` for a tensor shaped like the domain), so every comparison is
//! exact: integers and bools byte for byte, floats bit for bit (any NaN matches any NaN).

use ingot_kernels::fused::random::{self, Rng};
use ingot_kernels::fused::{cpu, FusedKernel, Input, Inst, KernelError};
use ingot_kernels::{BinaryOp, CmpOp, DType, ReduceOp, UnaryOp};
use proptest::prelude::*;
use std::collections::HashMap;

// ---------------------------------------------------------------------------------------------
// Values.

#[derive(Clone, Copy, Debug)]
enum V {
    F32(f32),
    F64(f64),
    I32(i32),
    I64(i64),
    B(u8),
}

/// `a op b` of two floats of one type (f32 or f64), the naive way: written once for both.
macro_rules! float_binary {
    ($op:expr, $a:expr, $b:expr) => {{
        let (a, b) = ($a, $b);
        match $op {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            // NaN propagates (either operand NaN gives NaN).
            BinaryOp::Max if a.is_nan() || b.is_nan() => a + b,
            BinaryOp::Min if a.is_nan() || b.is_nan() => a + b,
            BinaryOp::Max => a.max(b),
            BinaryOp::Min => a.min(b),
        }
    }};
}

/// `a op b` of two integers of one type (i32 or i64), wrapping: written once for both.
macro_rules! int_binary {
    ($op:expr, $a:expr, $b:expr) => {{
        let (a, b) = ($a, $b);
        match $op {
            BinaryOp::Add => a.wrapping_add(b),
            BinaryOp::Sub => a.wrapping_sub(b),
            BinaryOp::Mul => a.wrapping_mul(b),
            BinaryOp::Max => a.max(b),
            BinaryOp::Min => a.min(b),
            BinaryOp::Div => panic!("naive: integer div"),
        }
    }};
}

impl V {
    fn read(dtype: DType, bytes: &[u8], e: usize) -> V {
        let s = dtype.size();
        let b = &bytes[e * s..(e + 1) * s];
        match dtype {
            DType::F32 => V::F32(f32::from_ne_bytes(b.try_into().unwrap())),
            DType::F64 => V::F64(f64::from_ne_bytes(b.try_into().unwrap())),
            DType::I32 => V::I32(i32::from_ne_bytes(b.try_into().unwrap())),
            DType::I64 => V::I64(i64::from_ne_bytes(b.try_into().unwrap())),
            DType::Bool => V::B(b[0]),
            // The random kernels have no bf16 (tests/bf16.rs covers it).
            DType::BF16 => panic!("naive: no bf16"),
        }
    }

    fn write(self, out: &mut Vec<u8>) {
        match self {
            V::F32(x) => out.extend_from_slice(&x.to_ne_bytes()),
            V::F64(x) => out.extend_from_slice(&x.to_ne_bytes()),
            V::I32(x) => out.extend_from_slice(&x.to_ne_bytes()),
            V::I64(x) => out.extend_from_slice(&x.to_ne_bytes()),
            V::B(x) => out.push(x),
        }
    }

    /// `value` as `dtype`, the way `full` and `convert` from f64 do.
    fn from_f64(value: f64, dtype: DType) -> V {
        match dtype {
            DType::F32 => V::F32(value as f32),
            DType::F64 => V::F64(value),
            DType::I32 => V::I32(value as i32),
            DType::I64 => V::I64(value as i64),
            DType::Bool => V::B((value != 0.0) as u8),
            DType::BF16 => panic!("naive: no bf16"),
        }
    }

    fn convert(self, to: DType) -> V {
        match self {
            V::F32(x) => match to {
                DType::F32 => V::F32(x),
                DType::F64 => V::F64(x as f64),
                DType::I32 => V::I32(x as i32),
                DType::I64 => V::I64(x as i64),
                DType::Bool => V::B((x != 0.0) as u8),
                DType::BF16 => panic!("naive: no bf16"),
            },
            V::F64(x) => V::from_f64(x, to),
            V::I32(x) => match to {
                DType::F32 => V::F32(x as f32),
                DType::F64 => V::F64(x as f64),
                DType::I32 => V::I32(x),
                DType::I64 => V::I64(x as i64),
                DType::Bool => V::B((x != 0) as u8),
                DType::BF16 => panic!("naive: no bf16"),
            },
            V::I64(x) => match to {
                DType::F32 => V::F32(x as f32),
                DType::F64 => V::F64(x as f64),
                DType::I32 => V::I32(x as i32),
                DType::I64 => V::I64(x),
                DType::Bool => V::B((x != 0) as u8),
                DType::BF16 => panic!("naive: no bf16"),
            },
            V::B(x) => {
                let one = (x != 0) as u8;
                match to {
                    DType::F32 => V::F32(one as f32),
                    DType::F64 => V::F64(one as f64),
                    DType::I32 => V::I32(one as i32),
                    DType::I64 => V::I64(one as i64),
                    DType::Bool => V::B(one),
                    DType::BF16 => panic!("naive: no bf16"),
                }
            }
        }
    }

    fn unary(self, op: UnaryOp) -> V {
        match (self, op) {
            (V::F32(x), UnaryOp::Neg) => V::F32(-x),
            (V::F32(x), UnaryOp::Exp) => V::F32(ingot_kernels::cpu::Float::exp(x)),
            (V::F32(x), UnaryOp::Log) => V::F32(x.ln()),
            (V::F32(x), UnaryOp::Sqrt) => V::F32(x.sqrt()),
            (V::F32(x), UnaryOp::Tanh) => V::F32(ingot_kernels::cpu::Float::tanh(x)),
            (V::F32(x), UnaryOp::Recip) => V::F32(1.0 / x),
            (V::F64(x), UnaryOp::Neg) => V::F64(-x),
            (V::F64(x), UnaryOp::Exp) => V::F64(x.exp()),
            (V::F64(x), UnaryOp::Log) => V::F64(x.ln()),
            (V::F64(x), UnaryOp::Sqrt) => V::F64(x.sqrt()),
            (V::F64(x), UnaryOp::Tanh) => V::F64(x.tanh()),
            (V::F64(x), UnaryOp::Recip) => V::F64(1.0 / x),
            (V::I32(x), UnaryOp::Neg) => V::I32(x.wrapping_neg()),
            (V::I64(x), UnaryOp::Neg) => V::I64(x.wrapping_neg()),
            (v, op) => panic!("naive: {op:?} of {v:?}"),
        }
    }

    fn binary(self, op: BinaryOp, o: V) -> V {
        match (self, o) {
            (V::F32(a), V::F32(b)) => V::F32(float_binary!(op, a, b)),
            (V::F64(a), V::F64(b)) => V::F64(float_binary!(op, a, b)),
            (V::I32(a), V::I32(b)) => V::I32(int_binary!(op, a, b)),
            (V::I64(a), V::I64(b)) => V::I64(int_binary!(op, a, b)),
            (a, b) => panic!("naive: {op:?} of {a:?} and {b:?}"),
        }
    }

    fn compare(self, op: CmpOp, o: V) -> V {
        fn c<T: PartialOrd>(op: CmpOp, a: T, b: T) -> bool {
            match op {
                CmpOp::Lt => a < b,
                CmpOp::Le => a <= b,
                CmpOp::Gt => a > b,
                CmpOp::Ge => a >= b,
                CmpOp::Eq => a == b,
                CmpOp::Ne => a != b,
            }
        }
        let r = match (self, o) {
            (V::F32(a), V::F32(b)) => c(op, a, b),
            (V::F64(a), V::F64(b)) => c(op, a, b),
            (V::I32(a), V::I32(b)) => c(op, a, b),
            (V::I64(a), V::I64(b)) => c(op, a, b),
            (V::B(a), V::B(b)) => c(op, a, b),
            (a, b) => panic!("naive: compare {a:?} with {b:?}"),
        };
        V::B(r as u8)
    }

    fn truthy(self) -> bool {
        match self {
            V::B(x) => x != 0,
            v => panic!("naive: condition {v:?}"),
        }
    }

    /// `acc ⊕ x` for a reduction: sum (wrapping for integers), or max keeping `acc` unless `x`
    /// is strictly greater or NaN (so NaN propagates).
    fn fold(self, op: ReduceOp, x: V) -> V {
        match op {
            ReduceOp::Sum => self.binary(BinaryOp::Add, x),
            ReduceOp::Max => {
                let greater = match (self, x) {
                    (V::F32(a), V::F32(b)) => b > a || b.is_nan(),
                    (V::F64(a), V::F64(b)) => b > a || b.is_nan(),
                    (V::I32(a), V::I32(b)) => b > a,
                    (V::I64(a), V::I64(b)) => b > a,
                    (a, b) => panic!("naive: max of {a:?} and {b:?}"),
                };
                if greater {
                    x
                } else {
                    self
                }
            }
        }
    }

    fn identity(op: ReduceOp, dtype: DType) -> V {
        match (op, dtype) {
            (ReduceOp::Sum, d) => V::from_f64(0.0, d),
            (ReduceOp::Max, DType::F32) => V::F32(f32::NEG_INFINITY),
            (ReduceOp::Max, DType::F64) => V::F64(f64::NEG_INFINITY),
            (ReduceOp::Max, DType::I32) => V::I32(i32::MIN),
            (ReduceOp::Max, DType::I64) => V::I64(i64::MIN),
            (op, d) => panic!("naive: {op:?} over {d}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The documented summation order (ingot_kernels::cpu::reduce), written out independently.

/// Terms of a run summed as one block.
const RUN_BLOCK: usize = 1024;
/// Values a cascade level adds one after another.
const FAN: usize = 64;
/// Cascade levels.
const LEVELS: usize = 8;

/// Eight interleaved partials from `id`, combined `((p0+p4)+(p2+p6))+((p1+p5)+(p3+p7))`.
fn eight_partials(ts: &[V], id: V, f: impl Fn(V, V) -> V) -> V {
    let mut p = [id; 8];
    for (n, &t) in ts.iter().enumerate() {
        p[n % 8] = f(p[n % 8], t);
    }
    f(
        f(f(p[0], p[4]), f(p[2], p[6])),
        f(f(p[1], p[5]), f(p[3], p[7])),
    )
}

/// The cascade of `values`: at each level, groups of FAN consecutive values summed one after
/// another from zero; every group but the last moves up to the next level as one value (the
/// top level sums all it gets); the result is `acc[top] + (… + (acc[1] + acc[0]))`, over the
/// levels that got anything.
fn cascade(values: &[V], zero: V, f: impl Fn(V, V) -> V + Copy) -> V {
    let serial = |vs: &[V]| vs.iter().fold(zero, |a, &v| f(a, v));
    let mut accs = Vec::new();
    let mut level: Vec<V> = values.to_vec();
    for l in 0..LEVELS {
        if level.is_empty() {
            break;
        }
        if l + 1 == LEVELS || level.len() <= FAN {
            accs.push(serial(&level));
            break;
        }
        let last = (level.len() - 1) / FAN * FAN;
        accs.push(serial(&level[last..]));
        level = level[..last].chunks(FAN).map(serial).collect();
    }
    let mut r = accs.first().copied().unwrap_or(zero);
    for &a in accs.iter().skip(1) {
        r = f(a, r);
    }
    r
}

// ---------------------------------------------------------------------------------------------
// The naive evaluator.

struct Naive<'a> {
    k: &'a FusedKernel,
    inputs: &'a [Vec<u8>],
    dtypes: Vec<DType>,
    memo: HashMap<(usize, Vec<usize>), V>,
}

impl<'a> Naive<'a> {
    fn new(k: &'a FusedKernel, inputs: &'a [Vec<u8>]) -> Naive<'a> {
        Naive {
            k,
            inputs,
            dtypes: (0..k.body.len()).map(|i| k.dtype_of(i)).collect(),
            memo: HashMap::new(),
        }
    }

    fn is_reduce_axis(&self, d: usize) -> bool {
        self.k.reduce_axes.contains(&d)
    }

    /// The value of instruction `i` at domain index `idx`.
    fn value(&mut self, i: usize, idx: &[usize]) -> V {
        let key_idx: Vec<usize> = if matches!(self.k.body[i], Inst::Reduce { .. }) {
            // A reduction does not depend on the index along the reduce axes.
            (0..idx.len())
                .map(|d| if self.is_reduce_axis(d) { 0 } else { idx[d] })
                .collect()
        } else {
            idx.to_vec()
        };
        if let Some(&v) = self.memo.get(&(i, key_idx.clone())) {
            return v;
        }
        let v = match self.k.body[i].clone() {
            Inst::Load { input } => {
                let inp = &self.k.inputs[input];
                let e = inp.access.offset
                    + (0..idx.len())
                        .map(|d| inp.access.strides[d] * idx[d])
                        .sum::<usize>();
                V::read(inp.dtype, &self.inputs[input], e)
            }
            Inst::Const { value, dtype } => V::from_f64(value, dtype),
            Inst::Index { axis, dtype } => V::I64(idx[axis] as i64).convert(dtype),
            Inst::Unary { op, x } => self.value(x, idx).unary(op),
            Inst::Binary { op, a, b } => {
                let a = self.value(a, idx);
                let b = self.value(b, idx);
                a.binary(op, b)
            }
            Inst::Compare { op, a, b } => {
                let a = self.value(a, idx);
                let b = self.value(b, idx);
                a.compare(op, b)
            }
            Inst::Select { cond, a, b } => {
                let c = self.value(cond, idx).truthy();
                let a = self.value(a, idx);
                let b = self.value(b, idx);
                if c {
                    a
                } else {
                    b
                }
            }
            Inst::Convert { x, to } => self.value(x, idx).convert(to),
            Inst::Reduce { op, x } => self.reduce(op, x, i, &key_idx),
        };
        self.memo.insert((i, key_idx), v);
        v
    }

    /// The fold of `x` over every domain index that agrees with `idx` outside the reduce axes,
    /// in the documented order.
    fn reduce(&mut self, op: ReduceOp, x: usize, i: usize, idx: &[usize]) -> V {
        let dims = self.k.domain.clone();
        let axes = self.k.reduce_axes.clone();
        if axes.iter().all(|&a| dims[a] == 1) {
            // Nothing is reduced: the reduction is its operand.
            return self.value(x, idx);
        }
        // Every agreeing index, in row-major order.
        let mut terms = Vec::new();
        let count: usize = axes.iter().map(|&a| dims[a]).product();
        for flat in 0..count {
            let mut j = idx.to_vec();
            let mut f = flat;
            for &a in axes.iter().rev() {
                j[a] = f % dims[a];
                f /= dims[a];
            }
            terms.push(self.value(x, &j));
        }
        let id = V::identity(op, self.dtypes[i]);
        if terms.is_empty() {
            return id;
        }
        // The domain simplified: size-1 axes dropped, neighbours of one kind merged.
        let mut groups: Vec<(usize, bool)> = Vec::new();
        for (d, &n) in dims.iter().enumerate() {
            if n == 1 {
                continue;
            }
            let r = axes.contains(&d);
            match groups.last_mut() {
                Some((size, kind)) if *kind == r => *size *= n,
                _ => groups.push((n, r)),
            }
        }
        let &(run_len, innermost_reduced) = groups.last().unwrap();
        let f = |a: V, b: V| a.fold(op, b);
        if op == ReduceOp::Sum {
            // Runs cut into blocks of RUN_BLOCK terms (eight interleaved partials each), the
            // blocks' sums cascaded; kept innermost axis: the terms cascaded.
            let values: Vec<V> = if innermost_reduced {
                terms
                    .chunks(run_len)
                    .flat_map(|run| run.chunks(RUN_BLOCK).map(|b| eight_partials(b, id, f)))
                    .collect()
            } else {
                terms
            };
            return cascade(&values, id, f);
        }
        if !innermost_reduced {
            return terms.iter().fold(id, |acc, &t| acc.fold(op, t));
        }
        if terms.len() == run_len {
            eight_partials(&terms, id, f)
        } else {
            terms
                .chunks(run_len)
                .fold(id, |acc, ts| acc.fold(op, eight_partials(ts, id, f)))
        }
    }

    /// Every output's bytes.
    fn outputs(&mut self) -> Vec<Vec<u8>> {
        let k = self.k;
        let mut outs = Vec::new();
        for (j, out) in k.outputs.iter().enumerate() {
            let dims = k.output_dims(j);
            let n: usize = dims.iter().product();
            let mut bytes = Vec::new();
            let mut idx = vec![0; dims.len()];
            for flat in 0..n {
                let mut f = flat;
                for d in (0..dims.len()).rev() {
                    idx[d] = f % dims[d];
                    f /= dims[d];
                }
                self.value(out.value, &idx).write(&mut bytes);
            }
            outs.push(bytes);
        }
        outs
    }
}

// ---------------------------------------------------------------------------------------------
// Random kernels: `fused::random` with small domains (the naive evaluator goes one domain index
// at a time).

fn random_kernel(seed: u64) -> FusedKernel {
    random::kernel(seed, &random::Options::small())
}

fn random_data(r: &mut Rng, inp: &Input) -> Vec<u8> {
    let mut out = Vec::new();
    // Some inputs hold only -1 and zeros of both signs, so that max reductions meet ties of
    // 0.0 and -0.0 (where the order decides which one wins).
    let zeros = r.chance(20);
    for _ in 0..inp.len {
        let special = r.chance(8);
        let v = match inp.dtype {
            DType::F32 | DType::F64 if zeros => V::from_f64(r.pick(&[-1.0, -0.0, 0.0]), inp.dtype),
            DType::F32 | DType::F64 => {
                let x = if special {
                    r.pick(&[
                        -0.0,
                        0.0,
                        -0.0,
                        0.0,
                        f64::NAN,
                        f64::INFINITY,
                        f64::NEG_INFINITY,
                        1e20,
                        -3e-20,
                    ])
                } else {
                    (r.below(97) as f64 - 48.0) / 8.0 + r.below(1000) as f64 * 1e-4
                };
                V::from_f64(x, inp.dtype)
            }
            DType::I32 => V::I32(if special {
                r.pick(&[i32::MAX, i32::MIN, -1])
            } else {
                r.below(41) as i32 - 20
            }),
            DType::I64 => V::I64(if special {
                r.pick(&[i64::MAX, i64::MIN, -1])
            } else {
                r.below(41) as i64 - 20
            }),
            DType::Bool => V::B(r.below(2) as u8),
            DType::BF16 => panic!("naive: no bf16"),
        };
        v.write(&mut out);
    }
    out
}

fn same_bits(dtype: DType, a: &[u8], b: &[u8]) -> Result<(), String> {
    if a.len() != b.len() {
        return Err(format!("{} bytes, expected {}", a.len(), b.len()));
    }
    let s = dtype.size();
    for e in 0..a.len() / s {
        let (x, y) = (V::read(dtype, a, e), V::read(dtype, b, e));
        let nan =
            |v: V| matches!(v, V::F32(f) if f.is_nan()) || matches!(v, V::F64(f) if f.is_nan());
        if nan(x) && nan(y) {
            continue;
        }
        if a[e * s..(e + 1) * s] != b[e * s..(e + 1) * s] {
            return Err(format!("element {e}: got {x:?}, expected {y:?}"));
        }
    }
    Ok(())
}

fn compare_with_naive(seed: u64) -> Result<(), String> {
    let k = random_kernel(seed);
    k.check()
        .map_err(|e| format!("generated kernel does not check: {e}\n{k}"))?;
    let mut r = Rng(seed ^ 0xABCD);
    let data: Vec<Vec<u8>> = k.inputs.iter().map(|i| random_data(&mut r, i)).collect();
    let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    let got = cpu::run_buffers(&k, &refs).map_err(|e| format!("run failed: {e}\n{k}"))?;
    let want = Naive::new(&k, &data).outputs();
    for j in 0..k.outputs.len() {
        same_bits(k.output_dtype(j), &got[j], &want[j])
            .map_err(|e| format!("output {j}: {e}\nseed {seed}\n{k}"))?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn random_kernels_match_the_naive_meaning_bit_for_bit(seed in any::<u64>()) {
        if let Err(e) = compare_with_naive(seed) {
            prop_assert!(false, "{}", e);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Garbage (`fused::random::garbage`) and broken kernels (`fused::random::break_one`).

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn checking_and_querying_garbage_never_panics(seed in any::<u64>()) {
        let k = random::garbage(seed);
        let checked = k.check();
        let _ = k.to_string();
        for i in 0..k.body.len() + 2 {
            let _ = (k.dtype_of(i), k.is_row_level(i));
        }
        for j in 0..k.outputs.len() + 1 {
            let _ = (k.output_dtype(j), k.output_len(j), k.output_dims(j));
            for n in 0..k.inputs.len() + 1 {
                let _ = k.can_write_over(n, j);
            }
        }
        let _ = cpu::scratch_bytes(&k);
        // A small arena: whatever the kernel, `run` answers without panicking, and refuses
        // every kernel that does not check.
        let mut mem = vec![0u8; 1 << 16];
        let ins: Vec<usize> = (0..k.inputs.len()).map(|n| n * 4096).collect();
        let outs: Vec<usize> = (0..k.outputs.len()).map(|j| 16384 + j * 4096).collect();
        // (A valid kernel over a huge domain may legitimately take long: those are skipped.)
        let numel = k.domain.iter().fold(1usize, |n, &d| n.saturating_mul(d));
        if checked.is_err() || numel <= 1 << 20 {
            let res = cpu::run(&k, &mut mem, &ins, &outs, 32768);
            if checked.is_err() {
                prop_assert!(res.is_err());
            }
        }
    }

    #[test]
    fn running_a_broken_kernel_is_an_error_not_a_panic(seed in any::<u64>()) {
        let mut k = random_kernel(seed);
        let mut r = Rng(seed.rotate_left(17));
        random::break_one(&mut k, &mut r);
        prop_assert!(k.check().is_err(), "still checks:\n{}", k);
        let data: Vec<Vec<u8>> = k
            .inputs
            .iter()
            .map(|i| vec![0u8; i.len.saturating_mul(i.dtype.size()).min(1 << 20)])
            .collect();
        let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        let res = cpu::run_buffers(&k, &refs);
        prop_assert!(res.is_err());
        // And through `run` directly, on an arena that is large enough for everything.
        let mut mem = vec![0u8; 1 << 20];
        let ins: Vec<usize> = vec![0; k.inputs.len()];
        let outs: Vec<usize> = vec![0; k.outputs.len()];
        let res: Result<(), KernelError> = cpu::run(&k, &mut mem, &ins, &outs, 1 << 19);
        prop_assert!(res.is_err());
    }
}
