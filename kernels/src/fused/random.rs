//! Random fused kernels, reproducible from a seed: the one generator behind the CPU
//! executor's property tests (against a naive evaluator), the CUDA generator's syntax tests and
//! the GPU's per-kernel checks against the CPU. [`Options`] says what each needs (sizes, and
//! whether integer results must not depend on float rounding); a failing seed with the same
//! options means the same kernel everywhere. [`garbage`] and [`break_one`] give invalid kernels
//! for the never-panic tests.

use super::{Access, FusedKernel, Input, Inst, Output};
use crate::{BinaryOp, CmpOp, DType, ReduceOp, UnaryOp};

/// SplitMix64: the state advances by a fixed odd constant and is mixed on the way out.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    /// One of `xs`, uniformly (`xs` must not be empty).
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
}

/// Marsaglia's xorshift64 (shifts 13, 7, 17) from `seed` times the golden ratio's 64 bits
/// (made odd, so never zero): each call the next 64 bits. The deterministic test values of
/// several crates come from it.
pub fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

// ---------------------------------------------------------------------------------------------
// Random kernels.

/// `k` with every f32 made bf16: its inputs, constants, indices and converts (bf16 takes every
/// op f32 does, so the kernel still checks).
pub fn as_bf16(k: &FusedKernel) -> FusedKernel {
    let b = |d: DType| if d == DType::F32 { DType::BF16 } else { d };
    let mut k = k.clone();
    for i in &mut k.inputs {
        i.dtype = b(i.dtype);
    }
    for inst in &mut k.body {
        match inst {
            Inst::Const { dtype, .. } | Inst::Index { dtype, .. } => *dtype = b(*dtype),
            Inst::Convert { to, .. } => *to = b(*to),
            _ => {}
        }
    }
    k
}

/// Sizes of the generated kernels and what they may compute. The presets are what each user
/// needs: [`Options::small`] (the CPU executor against a naive evaluator, one domain index at a
/// time), [`Options::wide`] (CUDA C generation: sizes that reach every launch strategy) and
/// [`Options::exact`] (the GPU against the CPU, where integer results must agree exactly).
#[derive(Clone, Debug)]
pub struct Options {
    /// The sizes an axis takes (besides 0, four times in a hundred).
    pub sizes: &'static [usize],
    /// How often (percent) one axis instead takes one of `long_sizes`, so that chunks of lanes
    /// or threads split runs and leave remainders.
    pub long_percent: usize,
    pub long_sizes: &'static [usize],
    /// The most domain elements, counting axes of size 0 as 1 (row-level values are computed
    /// for every row even when a reduce axis is empty); random axes shrink until it holds.
    pub max_elements: usize,
    /// Instructions in the body: 1 up to this many.
    pub max_body: usize,
    /// How often (percent) an input is a plain contiguous buffer rather than a strided view
    /// (broadcast, permuted, padded, offset) of a larger one.
    pub contiguous_percent: usize,
    /// Unread elements past the end of an input's reach: 0 up to this many.
    pub slack: usize,
    /// Integer and bool results must not depend on float rounding: compares and converts to
    /// integers or bool read only exact float values (loads, constants, indices and their
    /// add/sub/neg/max/min/select, exact on multiples of 1/8 of moderate size, and converts
    /// between exact values), and ill-conditioned ops (exp, log, recip, div) read only exact
    /// values, so that rounding differences between executors are not magnified.
    pub exact: bool,
}

const DTYPES: [DType; 7] = [
    DType::F32,
    DType::F32,
    DType::F32,
    DType::F64,
    DType::I32,
    DType::I64,
    DType::Bool,
];

/// Constants: ordinary values, both zeros, NaN, infinity and values past the integer types'
/// ranges (converts saturate).
const CONSTS: [f64; 11] = [
    0.0,
    1.0,
    -2.5,
    3.0,
    0.5,
    -0.0,
    7.0,
    3e9,
    1e30,
    f64::NAN,
    f64::INFINITY,
];

impl Options {
    /// Small domains (at most 6000 elements) with one long axis a quarter of the time.
    pub fn small() -> Options {
        Options {
            sizes: &[1, 1, 2, 2, 3, 4, 5, 8, 9],
            long_percent: 25,
            long_sizes: &[17, 64, 255, 256, 257, 300, 513, 700, 1025, 2049, 3000],
            max_elements: 6000,
            max_body: 14,
            contiguous_percent: 30,
            slack: 2,
            exact: false,
        }
    }

    /// Domains up to 2^20 elements with sizes that reach every CUDA strategy (row, column,
    /// elementwise, vectorised and tiled).
    pub fn wide() -> Options {
        Options {
            sizes: &[1, 1, 2, 3, 4, 8, 9, 32, 33, 64, 100, 257, 1000],
            long_percent: 0,
            long_sizes: &[],
            max_elements: 1 << 20,
            max_body: 16,
            contiguous_percent: 20,
            slack: 1,
            exact: false,
        }
    }

    /// [`Options::wide`] with up to 2^21 elements and exact integer results.
    pub fn exact() -> Options {
        Options {
            max_elements: 1 << 21,
            exact: true,
            ..Options::wide()
        }
    }
}

/// A random kernel that passes [`FusedKernel::check`], the same for the same seed and options:
/// every dtype, op, broadcast, transpose, slice offset and empty or size-1 axis; reductions over
/// any set of axes; several outputs, full or row-level.
pub fn kernel(seed: u64, opts: &Options) -> FusedKernel {
    let mut r = Rng(seed);
    // Almost every draw checks; a few retries cover the rest. Should a thousand draws fail, a
    // plain copy keeps the promise.
    for _ in 0..1000 {
        let k = draw(&mut r, opts);
        if k.check().is_ok() {
            return k;
        }
    }
    FusedKernel {
        domain: vec![1],
        reduce_axes: vec![],
        inputs: vec![Input {
            dtype: DType::F32,
            len: 1,
            access: Access::contiguous(&[1]),
        }],
        body: vec![Inst::Load { input: 0 }],
        outputs: vec![Output { value: 0 }],
    }
}

fn domain(r: &mut Rng, opts: &Options) -> Vec<usize> {
    let rank = r.below(5);
    let mut dims: Vec<usize> = (0..rank)
        .map(|_| if r.chance(4) { 0 } else { r.pick(opts.sizes) })
        .collect();
    if rank > 0 && !opts.long_sizes.is_empty() && r.chance(opts.long_percent) {
        let a = r.below(rank);
        dims[a] = r.pick(opts.long_sizes);
    }
    let elements = |d: &[usize]| d.iter().fold(1usize, |n, &x| n.saturating_mul(x.max(1)));
    while elements(&dims) > opts.max_elements.max(1) {
        let a = r.below(rank);
        dims[a] /= 4;
    }
    dims
}

/// An input read over `dims`: contiguous, or a strided view of a larger buffer with some axes
/// broadcast (stride 0), the rest permuted and padded, at an offset.
pub fn input(r: &mut Rng, dims: &[usize], opts: &Options) -> Input {
    let rank = dims.len();
    let dtype = r.pick(&DTYPES);
    if r.chance(opts.contiguous_percent) {
        return Input {
            dtype,
            len: dims.iter().product(),
            access: Access::contiguous(dims),
        };
    }
    let mut order: Vec<usize> = (0..rank).collect();
    for i in (1..rank).rev() {
        let j = r.below(i + 1);
        order.swap(i, j);
    }
    let mut strides = vec![0; rank];
    let mut s = 1;
    for &d in order.iter().rev() {
        if r.chance(25) {
            continue; // broadcast along d
        }
        strides[d] = s;
        s *= dims[d] + r.below(2);
    }
    let offset = r.below(3);
    let reach: usize = offset
        + (0..rank)
            .map(|d| strides[d] * dims[d].saturating_sub(1))
            .sum::<usize>();
    Input {
        dtype,
        len: reach + 1 + r.below(opts.slack + 1),
        access: Access { offset, strides },
    }
}

/// One draw; it may not check (the caller retries).
fn draw(r: &mut Rng, opts: &Options) -> FusedKernel {
    let domain = domain(r, opts);
    let rank = domain.len();
    let reduce_axes: Vec<usize> = (0..rank).filter(|_| r.chance(45)).collect();
    let inputs: Vec<Input> = (0..1 + r.below(3))
        .map(|_| input(r, &domain, opts))
        .collect();
    // Per instruction: its dtype, and whether its value is exact (see `Options::exact`).
    let mut body: Vec<Inst> = Vec::new();
    let mut dt: Vec<DType> = Vec::new();
    let mut exact: Vec<bool> = Vec::new();
    let strict = opts.exact;
    let n_body = 1 + r.below(opts.max_body.max(1));
    let mut tries = 0;
    while body.len() < n_body && tries < 20 * n_body {
        tries += 1;
        // An earlier instruction that `ok` accepts, preferring recent ones so chains grow deep.
        let pick = |ok: &dyn Fn(DType, bool) -> bool, r: &mut Rng| {
            let c: Vec<usize> = (0..dt.len()).filter(|&i| ok(dt[i], exact[i])).collect();
            (!c.is_empty()).then(|| c[c.len() - 1 - r.below(c.len()).min(r.below(c.len()))])
        };
        let choice = if body.is_empty() { 0 } else { r.below(12) };
        let (inst, d, ex) = match choice {
            0 => {
                let input = r.below(inputs.len());
                (Inst::Load { input }, inputs[input].dtype, true)
            }
            1 => {
                let dtype = r.pick(&DTYPES);
                let value = r.pick(&CONSTS);
                (Inst::Const { value, dtype }, dtype, true)
            }
            2 if rank > 0 => {
                let dtype = r.pick(&DTYPES);
                let axis = r.below(rank);
                (Inst::Index { axis, dtype }, dtype, true)
            }
            2 => continue,
            3 => {
                let Some(x) = pick(&|d, _| d != DType::Bool, r) else {
                    continue;
                };
                if dt[x].is_float() {
                    // Every op but Erf, the last (a kernel of a seed stays the kernel it was).
                    let op = r.pick(&UnaryOp::ALL[..6]);
                    let op = match op {
                        UnaryOp::Exp | UnaryOp::Log | UnaryOp::Recip if strict && !exact[x] => {
                            UnaryOp::Tanh
                        }
                        op => op,
                    };
                    let ex = op == UnaryOp::Neg && exact[x];
                    (Inst::Unary { op, x }, dt[x], ex)
                } else {
                    (
                        Inst::Unary {
                            op: UnaryOp::Neg,
                            x,
                        },
                        dt[x],
                        true,
                    )
                }
            }
            4 | 5 => {
                let Some(a) = pick(&|d, _| d != DType::Bool, r) else {
                    continue;
                };
                let d = dt[a];
                let b = pick(&|e, _| e == d, r).unwrap_or(a);
                let mut ops = vec![
                    BinaryOp::Add,
                    BinaryOp::Sub,
                    BinaryOp::Mul,
                    BinaryOp::Max,
                    BinaryOp::Min,
                ];
                if d.is_float() && (!strict || exact[a] && exact[b]) {
                    ops.push(BinaryOp::Div);
                }
                let op = r.pick(&ops);
                // Max and min of exact values are exact, and so are sums of two exact leaves
                // (small multiples of 1/8); products, quotients and chains of sums may round.
                let leaf = |i: usize| matches!(body[i], Inst::Load { .. } | Inst::Const { .. });
                let ex = !d.is_float()
                    || exact[a]
                        && exact[b]
                        && (matches!(op, BinaryOp::Max | BinaryOp::Min)
                            || matches!(op, BinaryOp::Add | BinaryOp::Sub) && leaf(a) && leaf(b));
                (Inst::Binary { op, a, b }, d, ex)
            }
            6 => {
                let Some(a) = pick(&|_, e| !strict || e, r) else {
                    continue;
                };
                let d = dt[a];
                let b = pick(&|e, x| e == d && (!strict || x), r).unwrap_or(a);
                let op = r.pick(CmpOp::ALL);
                (Inst::Compare { op, a, b }, DType::Bool, true)
            }
            7 => {
                let Some(cond) = pick(&|d, _| d == DType::Bool, r) else {
                    continue;
                };
                let a = r.below(dt.len());
                let d = dt[a];
                let b = pick(&|e, _| e == d, r).unwrap_or(a);
                (Inst::Select { cond, a, b }, d, exact[a] && exact[b])
            }
            8 => {
                let x = r.below(dt.len());
                let to = r.pick(&DTYPES);
                if strict && !to.is_float() && !exact[x] {
                    continue;
                }
                // f64 to f32 may round; integers and bools are exact by construction.
                let ex = !to.is_float() || exact[x] && !(dt[x] == DType::F64 && to == DType::F32);
                (Inst::Convert { x, to }, to, ex)
            }
            _ => {
                let Some(x) = pick(&|d, _| d != DType::Bool, r) else {
                    continue;
                };
                let op = r.pick(&[ReduceOp::Sum, ReduceOp::Max]);
                let ex = !dt[x].is_float() || op == ReduceOp::Max && exact[x];
                (Inst::Reduce { op, x }, dt[x], ex)
            }
        };
        body.push(inst);
        dt.push(d);
        exact.push(ex);
    }
    let outputs = (0..1 + r.below(3))
        .map(|_| {
            let n = body.len();
            Output {
                value: n - 1 - r.below(n).min(r.below(n)),
            }
        })
        .collect();
    FusedKernel {
        domain,
        reduce_axes,
        inputs,
        body,
        outputs,
    }
}

// ---------------------------------------------------------------------------------------------
// Invalid kernels.

/// A kernel made of random numbers, huge ones included: almost never valid. Checking, querying,
/// generating code for or running it must answer without panicking.
pub fn garbage(seed: u64) -> FusedKernel {
    let mut r = Rng(seed);
    let big = [0, 1, 2, 3, 7, usize::MAX, usize::MAX / 2, 1 << 40, 1 << 33];
    let rank = r.below(5);
    let domain: Vec<usize> = (0..rank)
        .map(|_| {
            if r.chance(15) {
                r.pick(&big)
            } else {
                r.below(5)
            }
        })
        .collect();
    let num = |r: &mut Rng| {
        if r.chance(10) {
            r.pick(&big)
        } else {
            r.below(6)
        }
    };
    let reduce_axes: Vec<usize> = (0..r.below(4)).map(|_| num(&mut r)).collect();
    let inputs: Vec<Input> = (0..r.below(3))
        .map(|_| Input {
            dtype: r.pick(&DTYPES),
            len: num(&mut r),
            access: Access {
                offset: num(&mut r),
                strides: (0..r.below(6)).map(|_| num(&mut r)).collect(),
            },
        })
        .collect();
    let body: Vec<Inst> = (0..r.below(10))
        .map(|_| {
            let a = num(&mut r);
            let b = num(&mut r);
            let c = num(&mut r);
            match r.below(9) {
                0 => Inst::Load { input: a },
                1 => Inst::Const {
                    value: r.pick(&[0.0, 1.0, f64::NAN]),
                    dtype: r.pick(&DTYPES),
                },
                2 => Inst::Index {
                    axis: a,
                    dtype: r.pick(&DTYPES),
                },
                3 => Inst::Unary {
                    op: r.pick(&[UnaryOp::Neg, UnaryOp::Exp, UnaryOp::Recip]),
                    x: a,
                },
                4 => Inst::Binary {
                    op: r.pick(&[BinaryOp::Add, BinaryOp::Div, BinaryOp::Max]),
                    a,
                    b,
                },
                5 => Inst::Compare {
                    op: CmpOp::Lt,
                    a,
                    b,
                },
                6 => Inst::Select {
                    cond: a,
                    a: b,
                    b: c,
                },
                7 => Inst::Convert {
                    x: a,
                    to: r.pick(&DTYPES),
                },
                _ => Inst::Reduce {
                    op: r.pick(&[ReduceOp::Sum, ReduceOp::Max]),
                    x: a,
                },
            }
        })
        .collect();
    let outputs = (0..r.below(3))
        .map(|_| Output { value: num(&mut r) })
        .collect();
    FusedKernel {
        domain,
        reduce_axes,
        inputs,
        body,
        outputs,
    }
}

/// Makes one thing about a valid kernel (with a body and an input, as [`kernel`] gives) wrong,
/// so that it no longer checks: an operand or output past the body, a load past the inputs, an
/// input read past its end, an access of the wrong rank, a reduce axis past the domain.
pub fn break_one(k: &mut FusedKernel, r: &mut Rng) {
    let n = k.body.len();
    match r.below(6) {
        0 => {
            let i = r.below(n);
            k.body[i] = Inst::Unary {
                op: UnaryOp::Neg,
                x: i + r.below(3),
            };
        }
        1 => k.outputs.push(Output {
            value: n + r.below(3),
        }),
        2 => {
            let i = r.below(k.inputs.len());
            let reach = k.inputs[i].len;
            k.inputs[i].access.offset += reach;
            // Guarantee something is read: a nonempty domain and a row-level input.
            k.domain = vec![2; k.domain.len()];
            k.inputs[i].access.strides = vec![0; k.domain.len()];
        }
        3 => {
            let i = r.below(k.inputs.len());
            k.inputs[i].access.strides.push(1);
        }
        4 => k.body.push(Inst::Load {
            input: k.inputs.len(),
        }),
        _ => k.reduce_axes = vec![k.domain.len()],
    }
}

/// A random value for `inp`, as its bytes: elements multiples of 1/8 in [-4, 4] (integers
/// eight times that, bools where it is positive), on which kernels made with
/// [`Options::exact`] keep their integer results exact whatever order floats are summed in.
pub fn input_bytes(inp: &Input, r: &mut Rng) -> Vec<u8> {
    let vals: Vec<f64> = (0..inp.len)
        .map(|_| (r.below(65) as f64 - 32.0) / 8.0)
        .collect();
    match inp.dtype {
        DType::F32 => vals
            .iter()
            .flat_map(|&v| (v as f32).to_ne_bytes())
            .collect(),
        DType::F64 => vals.iter().flat_map(|v| v.to_ne_bytes()).collect(),
        DType::I32 => (vals.iter())
            .flat_map(|&v| ((v * 8.0) as i32).to_ne_bytes())
            .collect(),
        DType::I64 => (vals.iter())
            .flat_map(|&v| ((v * 8.0) as i64).to_ne_bytes())
            .collect(),
        DType::Bool => vals.iter().map(|&v| u8::from(v > 0.0)).collect(),
        DType::BF16 => (vals.iter())
            .flat_map(|&v| half::bf16::from_f64(v).to_bits().to_ne_bytes())
            .collect(),
    }
}

/// The elements of a buffer of `dtype`, widened to f64 (bf16 through `half`), to compare two
/// runs of a kernel.
pub fn widened(dtype: DType, b: &[u8]) -> Vec<f64> {
    b.chunks(dtype.size())
        .map(|c| match dtype {
            DType::F32 => f32::from_ne_bytes(c.try_into().unwrap()) as f64,
            DType::F64 => f64::from_ne_bytes(c.try_into().unwrap()),
            DType::I32 => i32::from_ne_bytes(c.try_into().unwrap()) as f64,
            DType::I64 => i64::from_ne_bytes(c.try_into().unwrap()) as f64,
            DType::Bool => c[0] as f64,
            DType::BF16 => {
                half::bf16::from_bits(u16::from_ne_bytes(c.try_into().unwrap())).to_f64()
            }
        })
        .collect()
}

/// The splits the split tests check: for each random kernel of seeds `0..seeds` made with
/// [`Options::exact`] (small), each reduce axis that divides into ways (the fewest above one)
/// is offered to `f` as `(seed, kernel, axis, ways, inputs)`, with the kernel's inputs drawn
/// by [`input_bytes`] from a generator seeded by the seed and the axis.
pub fn each_split_axis(seeds: u64, mut f: impl FnMut(u64, &FusedKernel, usize, usize, &[&[u8]])) {
    let opts = Options {
        exact: true,
        ..Options::small()
    };
    for seed in 0..seeds {
        let k = kernel(seed, &opts);
        for &axis in &k.reduce_axes {
            let Some(ways) = (2..=k.domain[axis]).find(|&w| k.domain[axis].is_multiple_of(w))
            else {
                continue;
            };
            let mut r = Rng(seed * 131 + axis as u64 + 1);
            let xs: Vec<Vec<u8>> = (k.inputs.iter())
                .map(|inp| input_bytes(inp, &mut r))
                .collect();
            let ins: Vec<&[u8]> = xs.iter().map(|x| &x[..]).collect();
            f(seed, &k, axis, ways, &ins);
        }
    }
}

/// Asserts that each of `got`'s outputs matches `whole`'s ([`first_difference`]); `what`
/// names the kernel and how it was split, `how` the split's outputs, in the message.
pub fn assert_outputs_match(
    k: &FusedKernel,
    whole: &[Vec<u8>],
    got: &[Vec<u8>],
    what: &str,
    how: &str,
) {
    for (j, (w, g)) in whole.iter().zip(got).enumerate() {
        let diff = first_difference(k.output_dtype(j), w, g);
        assert!(
            diff.is_none(),
            "{what} output {j}: (element, whole, {how}) {diff:?}\n{k:?}"
        );
    }
}

/// Where two runs of a kernel's output of `dtype` (`whole`, and `other`, the same kernel run
/// another way: split, staged) differ by more than summing in another order explains: the
/// first element with its two values, or `None`. Integers and bools must be equal; floats
/// within 1e-4 (f32), 1e-10 (f64) or 1/64 (bf16) of the output's largest finite magnitude (at
/// least 1); NaN matches NaN. Outputs of different lengths differ at element `usize::MAX`.
pub fn first_difference(dtype: DType, whole: &[u8], other: &[u8]) -> Option<(usize, f64, f64)> {
    let (w, o) = (widened(dtype, whole), widened(dtype, other));
    if w.len() != o.len() {
        return Some((usize::MAX, w.len() as f64, o.len() as f64));
    }
    let scale = (w.iter())
        .filter(|v| v.is_finite())
        .fold(1f64, |m, v| m.max(v.abs()));
    let tol = match dtype {
        DType::F32 => 1e-4 * scale,
        DType::F64 => 1e-10 * scale,
        DType::BF16 => scale / 64.0,
        _ => 0.0,
    };
    (w.iter().zip(&o).enumerate())
        .find(|(_, (a, b))| !((a.is_nan() && b.is_nan()) || a == b || (*a - *b).abs() <= tol))
        .map(|(e, (&a, &b))| (e, a, b))
}

/// The bytes of f32 values as a kernel's buffer holds them (native order), and back: how the
/// tests write inputs and read outputs.
pub fn f32_bytes(xs: &[f32]) -> Vec<u8> {
    xs.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

/// The f32 values of a buffer's bytes ([`f32_bytes`] undone); a trailing part of a value is
/// dropped.
pub fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn the_same_seed_gives_the_same_sequence_and_splitmix64s_reference_values() {
        let mut a = Rng(0);
        let mut b = Rng(0);
        let xs: Vec<u64> = (0..3).map(|_| a.next_u64()).collect();
        assert_eq!(xs, (0..3).map(|_| b.next_u64()).collect::<Vec<_>>());
        // SplitMix64 from state 0 (Vigna's reference implementation).
        assert_eq!(xs[0], 0xE220_A839_7B1D_CDAF);
        assert_eq!(Rng(5).below(0), 0);
    }

    #[test]
    fn every_preset_gives_kernels_that_check_within_its_bounds_and_reach_each_feature() {
        use super::*;
        for opts in [Options::small(), Options::wide(), Options::exact()] {
            let (mut reduces, mut broadcasts, mut empty, mut long_rows) = (0, 0, 0, 0);
            for seed in 0..300 {
                let k = kernel(seed, &opts);
                assert_eq!(k.check(), Ok(()), "seed {seed}\n{k}");
                // (Debug text: NaN constants are not `==` themselves.)
                let again = kernel(seed, &opts);
                assert_eq!(format!("{k:?}"), format!("{again:?}"), "seed {seed}");
                let n = k.domain.iter().map(|&d| d.max(1)).product::<usize>();
                assert!(n <= opts.max_elements, "seed {seed}: {n} elements");
                assert!(k.body.len() <= opts.max_body);
                reduces += usize::from(k.body.iter().any(|i| matches!(i, Inst::Reduce { .. })));
                broadcasts += usize::from(k.inputs.iter().any(|i| i.access.strides.contains(&0)));
                empty += usize::from(k.domain.contains(&0));
                long_rows += usize::from(k.domain.iter().any(|&d| d > 200));
            }
            assert!(
                reduces > 60 && broadcasts > 60 && empty > 3 && long_rows > 20,
                "{opts:?}: {reduces} with reductions, {broadcasts} with broadcasts, {empty} \
                 with empty axes, {long_rows} with long axes of 300"
            );
        }
    }

    #[test]
    fn a_broken_kernel_no_longer_checks() {
        use super::*;
        for seed in 0..300 {
            let mut k = kernel(seed, &Options::small());
            break_one(&mut k, &mut Rng(seed ^ 7));
            assert!(k.check().is_err(), "seed {seed} still checks:\n{k}");
        }
    }
}
