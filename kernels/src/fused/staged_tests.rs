use super::*;
use crate::fused::cpu::run_buffers;
use crate::fused::random::{self, f32_bytes, f32s};
use crate::{BinaryOp, ReduceOp, UnaryOp};

/// Runs the chain on the CPU, pass by pass, each buffer where the chain says it lies; returns
/// the original's outputs. Panics where a pass reads a buffer no earlier pass wrote.
pub(crate) fn run_staged(st: &Staged, k: &FusedKernel, inputs: &[&[u8]]) -> Vec<Vec<u8>> {
    let mut scratch: Vec<Option<Vec<u8>>> = vec![None; st.scratch.len()];
    let mut outs: Vec<Option<Vec<u8>>> = vec![None; k.outputs.len()];
    for p in &st.passes {
        let ins: Vec<&[u8]> = (p.inputs.iter())
            .map(|b| match *b {
                Buffer::Input(n) => inputs[n],
                Buffer::Scratch(s) => scratch[s].as_deref().expect("scratch read before written"),
                Buffer::Output(j) => outs[j].as_deref().expect("output read before written"),
            })
            .collect();
        let got = run_buffers(&p.kernel, &ins).unwrap();
        for (b, v) in p.outputs.iter().zip(got) {
            match *b {
                Buffer::Scratch(s) => {
                    assert_eq!(v.len(), st.scratch[s].len * st.scratch[s].dtype.size());
                    scratch[s] = Some(v);
                }
                Buffer::Output(j) => outs[j] = Some(v),
                Buffer::Input(n) => panic!("a pass writes input {n}"),
            }
        }
    }
    outs.into_iter()
        .map(|o| o.expect("every output written"))
        .collect()
}

fn input(dtype: DType, len: usize, strides: Vec<usize>) -> Input {
    Input {
        dtype,
        len,
        access: Access { offset: 0, strides },
    }
}

fn bin(op: BinaryOp, a: usize, b: usize) -> Inst {
    Inst::Binary { op, a, b }
}

fn sum(x: usize) -> Inst {
    Inst::Reduce {
        op: ReduceOp::Sum,
        x,
    }
}

fn konst(value: f64) -> Inst {
    Inst::Const {
        value,
        dtype: DType::F32,
    }
}

fn un(op: UnaryOp, x: usize) -> Inst {
    Inst::Unary { op, x }
}

/// A kernel over NCHW `dims` that reduces N, H and W (batch norm's), from its inputs, body and
/// the values it outputs.
fn over_channels(
    dims: [usize; 4],
    inputs: Vec<Input>,
    body: Vec<Inst>,
    outputs: &[usize],
) -> FusedKernel {
    FusedKernel {
        domain: dims.to_vec(),
        reduce_axes: vec![0, 2, 3],
        inputs,
        body,
        outputs: outputs.iter().map(|&value| Output { value }).collect(),
    }
}

/// An f32 input of the whole NCHW `dims`, contiguous.
fn image(dims: [usize; 4]) -> Input {
    let len = dims.iter().product();
    input(DType::F32, len, Access::contiguous(&dims).strides)
}

/// An f32 input of one value a channel (of `dims[1]`), read the same at every N, H and W.
fn per_channel(dims: [usize; 4]) -> Input {
    input(DType::F32, dims[1], vec![0, 1, 0, 0])
}

/// Batch norm's training forward over NCHW `[n, c, h, w]` in one kernel: the mean, the
/// variance around it (a second-stage reduction), `y = (x - mean) / sqrt(var + eps) * g + b`,
/// and the mean and variance as row outputs.
pub(crate) fn batch_norm_forward(n: usize, c: usize, h: usize, w: usize) -> FusedKernel {
    let dims = [n, c, h, w];
    let inv = 1.0 / (n * h * w) as f64;
    let inputs = vec![image(dims), per_channel(dims), per_channel(dims)];
    let body = vec![
        Inst::Load { input: 0 },    // 0 x
        sum(0),                     // 1
        konst(inv),                 // 2
        bin(BinaryOp::Mul, 1, 2),   // 3 mean
        bin(BinaryOp::Sub, 0, 3),   // 4 x - mean
        bin(BinaryOp::Mul, 4, 4),   // 5
        sum(5),                     // 6
        bin(BinaryOp::Mul, 6, 2),   // 7 var
        konst(1e-5),                // 8
        bin(BinaryOp::Add, 7, 8),   // 9
        un(UnaryOp::Sqrt, 9),       // 10
        un(UnaryOp::Recip, 10),     // 11 rstd
        bin(BinaryOp::Mul, 4, 11),  // 12 xhat
        Inst::Load { input: 1 },    // 13 g
        bin(BinaryOp::Mul, 12, 13), // 14
        Inst::Load { input: 2 },    // 15 b
        bin(BinaryOp::Add, 14, 15), // 16 y
    ];
    over_channels(dims, inputs, body, &[16, 3, 7])
}

/// Batch norm's backward over NCHW in one kernel, given `x`, `dy` and the saved mean and
/// rstd: the sums of `dy` and `dy·x̂` (row outputs: the bias's and gain's gradients), and
/// `dx = (dy - sum(dy)/m - x̂·sum(dy·x̂)/m) · rstd · g`.
pub(crate) fn batch_norm_backward(n: usize, c: usize, h: usize, w: usize) -> FusedKernel {
    let dims = [n, c, h, w];
    let inv = 1.0 / (n * h * w) as f64;
    let (x, dy, mean, rstd, g) = (
        image(dims),
        image(dims),
        per_channel(dims),
        per_channel(dims),
        per_channel(dims),
    );
    let body = vec![
        Inst::Load { input: 0 },    // 0 x
        Inst::Load { input: 1 },    // 1 dy
        Inst::Load { input: 2 },    // 2 mean
        Inst::Load { input: 3 },    // 3 rstd
        Inst::Load { input: 4 },    // 4 g
        bin(BinaryOp::Sub, 0, 2),   // 5
        bin(BinaryOp::Mul, 5, 3),   // 6 xhat
        sum(1),                     // 7 sum dy
        bin(BinaryOp::Mul, 1, 6),   // 8
        sum(8),                     // 9 sum dy xhat
        konst(inv),                 // 10
        bin(BinaryOp::Mul, 7, 10),  // 11
        bin(BinaryOp::Mul, 9, 10),  // 12
        bin(BinaryOp::Mul, 6, 12),  // 13
        bin(BinaryOp::Sub, 1, 11),  // 14
        bin(BinaryOp::Sub, 14, 13), // 15
        bin(BinaryOp::Mul, 3, 4),   // 16
        bin(BinaryOp::Mul, 15, 16), // 17 dx
    ];
    over_channels(dims, vec![x, dy, mean, rstd, g], body, &[17, 7, 9])
}

/// Deterministic f32 values in [-2, 2) with a per-channel offset pattern.
fn values(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 37 + seed * 11 + (i / 7) * 5) % 64) as f32 / 16.0 - 2.0)
        .collect()
}

fn close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}");
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!((a - b).abs() <= tol * scale, "{what}[{i}]: {a} against {b}");
    }
}

fn check_against_whole(k: &FusedKernel, axis: usize, ways: usize) -> Staged {
    let st = staged(k, axis, ways).expect("splits by stages");
    let xs: Vec<Vec<u8>> = (k.inputs.iter().enumerate())
        .map(|(n, inp)| f32_bytes(&values(inp.len, n)))
        .collect();
    let ins: Vec<&[u8]> = xs.iter().map(|x| &x[..]).collect();
    let whole = run_buffers(k, &ins).unwrap();
    let chain = run_staged(&st, k, &ins);
    for (j, (w, c)) in whole.iter().zip(&chain).enumerate() {
        close(&format!("output {j}"), &f32s(c), &f32s(w), 1e-5);
    }
    st
}

#[test]
fn batch_norm_forward_splits_into_two_stages_and_an_apply_pass_that_compute_what_the_one_kernel_computes(
) {
    for (dims, ways) in [([8, 3, 5, 7], 4), ([6, 1, 9, 3], 2), ([16, 5, 3, 3], 16)] {
        let [n, c, h, w] = dims;
        let k = batch_norm_forward(n, c, h, w);
        let st = check_against_whole(&k, 0, ways);
        // Stage 1 (the mean) and stage 2 (the variance around it), each partial then finish,
        // then the normalization with no reduce axes.
        assert_eq!(st.passes.len(), 5, "{dims:?}");
        assert_eq!(st.passes[0].kernel.domain, vec![ways, n / ways, c, h, w]);
        assert_eq!(st.passes[4].kernel.reduce_axes, Vec::<usize>::new());
        assert_eq!(st.passes[4].outputs, vec![Buffer::Output(0)]);
        // The variance's partial kernel reads the finished mean from scratch.
        assert!(st.passes[2].inputs.contains(&Buffer::Scratch(0)));
    }
}

#[test]
fn batch_norm_backward_splits_into_one_stage_of_two_sums_and_an_apply_pass_that_computes_dx() {
    for (dims, ways) in [([8, 2, 4, 5], 8), ([4, 3, 7, 1], 2), ([12, 1, 3, 11], 4)] {
        let [n, c, h, w] = dims;
        let k = batch_norm_backward(n, c, h, w);
        let st = check_against_whole(&k, 0, ways);
        assert_eq!(st.passes.len(), 3, "{dims:?}");
        assert_eq!(
            st.passes[1].outputs.len(),
            4,
            "two row buffers and two row outputs"
        );
        assert_eq!(st.passes[2].outputs, vec![Buffer::Output(0)]);
    }
}

#[test]
fn a_stage_split_needs_a_reduce_axis_a_multiple_of_its_ways_and_a_live_reduction() {
    let k = batch_norm_forward(8, 3, 5, 7);
    assert!(staged(&k, 1, 3).is_none(), "axis 1 is not reduced");
    assert!(staged(&k, 0, 3).is_none(), "8 is not a multiple of 3");
    assert!(staged(&k, 0, 1).is_none(), "one way is no split");
    assert!(staged(&k, 2, 5).is_some(), "another reduce axis splits");
    let mut bad = k.clone();
    bad.outputs.push(Output { value: 99 });
    assert!(staged(&bad, 0, 2).is_none(), "a kernel that does not check");
    // Only the normalization's input: no live reduction, nothing to stage.
    let mut plain = k;
    plain.outputs = vec![Output { value: 15 }];
    assert!(staged(&plain, 0, 2).is_none());
}

/// Random kernels (`Options::exact`, values multiples of 1/8 in [-4, 4]) split by stages
/// along every reduce axis they split along: integers and bools equal the whole kernel's,
/// floats within the rounding of sums combined in another order; and every full output is
/// written by the last pass alone, after every read of an input.
#[test]
fn every_random_kernel_split_by_stages_computes_what_the_whole_kernel_computes() {
    let (mut tried, mut multi_stage) = (0, 0);
    random::each_split_axis(4000, |seed, k, axis, ways, ins| {
        let Some(st) = staged(k, axis, ways) else {
            return;
        };
        tried += 1;
        multi_stage += usize::from(st.passes.len() > 3);
        let out_rows = k.output_rows();
        let last = st.passes.len() - 1;
        for (p, pass) in st.passes.iter().enumerate() {
            for b in &pass.outputs {
                if let Buffer::Output(j) = *b {
                    assert!(
                        out_rows[j] || p == last,
                        "seed {seed}: full output {j} in pass {p}"
                    );
                }
            }
        }
        let whole = run_buffers(k, ins).unwrap();
        let chain = run_staged(&st, k, ins);
        let what = format!("seed {seed} axis {axis} ways {ways}");
        random::assert_outputs_match(k, &whole, &chain, &what, "staged");
    });
    assert!(tried >= 100, "only {tried} random kernels split by stages");
    assert!(
        multi_stage >= 10,
        "only {multi_stage} had more than one stage"
    );
}
