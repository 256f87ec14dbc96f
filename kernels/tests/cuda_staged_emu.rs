//! Batch norm's reductions split by stages on the GPU ([`ingot_kernels::fused::staged`]): when
//! the generator splits them (few channels, long rows) and when it keeps one kernel, and the
//! generated chain of kernels, run on the host by the block emulation
//! ([`ingot_testkit::block_emu`]) with its scratch laid out as the program says, computes what
//! the CPU interpreter computes for the one kernel: the forward (mean, then the variance
//! around it, then the normalization) and the backward (two sums, then `dx`; and a ResNet
//! step's shape of it, with a ReLU mask and a second stage), f32 and bf16, at odd sizes.
//! Skips the emulation (saying so) without a C++ compiler or `ucontext.h`.

use ingot_kernels::cuda::{self, FusedArg, FusedProgram};
use ingot_kernels::fused::cpu::run_buffers;
use ingot_kernels::fused::{FusedKernel, Inst};
use ingot_kernels::{BinaryOp, CmpOp, DType, UnaryOp};
use ingot_testkit::block_emu;
use ingot_testkit::kernel_builder::KernelBuilder;

/// A kernel over NCHW `[n, c, h, w]` reducing `[0, 2, 3]`, to build an instruction at a time.
fn nchw(dims: [usize; 4]) -> KernelBuilder {
    KernelBuilder::new(&dims, &[0, 2, 3])
}

/// A load of a new input: the whole tensor, or one value a channel.
fn load(b: &mut KernelBuilder, dtype: DType, per_channel: bool) -> usize {
    let input = if per_channel {
        b.input_bcast(dtype, &[0, 2, 3])
    } else {
        b.whole(dtype)
    };
    b.load(input)
}

/// A load of a new full input of `dtype`, widened to f32.
fn load_f32(b: &mut KernelBuilder, dtype: DType) -> usize {
    let x = load(b, dtype, false);
    b.to(x, DType::F32)
}

/// `1 / (n·h·w)`, the mean's factor.
fn inv_count(b: &mut KernelBuilder) -> usize {
    let d = &b.k.domain;
    let m = (d[0] * d[2] * d[3]) as f64;
    b.konst(1.0 / m)
}

use BinaryOp::{Add, Mul, Sub};

/// Training batch norm's forward: `y = (x - mean) / sqrt(var + eps) · g + b` in `dtype`, with
/// the mean and the (biased) variance around it as row outputs.
fn forward(dims: [usize; 4], dtype: DType) -> FusedKernel {
    let mut b = nchw(dims);
    let x = load_f32(&mut b, dtype);
    let s = b.sum(x);
    let inv = inv_count(&mut b);
    let mean = b.bin(Mul, s, inv);
    let xc = b.bin(Sub, x, mean);
    let sq = b.bin(Mul, xc, xc);
    let s2 = b.sum(sq);
    let var = b.bin(Mul, s2, inv);
    let eps = b.konst(1e-5);
    let ve = b.bin(Add, var, eps);
    let sd = b.un(UnaryOp::Sqrt, ve);
    let rstd = b.un(UnaryOp::Recip, sd);
    let xh = b.bin(Mul, xc, rstd);
    let g = load(&mut b, DType::F32, true);
    let y = b.bin(Mul, xh, g);
    let bias = load(&mut b, DType::F32, true);
    let y = b.bin(Add, y, bias);
    let y = b.to(y, dtype);
    b.outputs(&[y, mean, var]).done()
}

/// The part of batch norm's backward both backward kernels share, its instructions in this
/// order: the sums `s1 = sum(dy)` and `s2 = sum(dy·x̂)` and `d = dy - s1/m - x̂·s2/m`, with
/// `1/m` as `inv`.
struct Centred {
    d: usize,
    s1: usize,
    s2: usize,
    inv: usize,
}

fn centred(b: &mut KernelBuilder, x: usize, dy: usize, mean: usize, rstd: usize) -> Centred {
    let xc = b.bin(Sub, x, mean);
    let xh = b.bin(Mul, xc, rstd);
    let s1 = b.sum(dy);
    let t = b.bin(Mul, dy, xh);
    let s2 = b.sum(t);
    let inv = inv_count(b);
    let m1 = b.bin(Mul, s1, inv);
    let m2 = b.bin(Mul, s2, inv);
    let c = b.bin(Mul, xh, m2);
    let d = b.bin(Sub, dy, m1);
    let d = b.bin(Sub, d, c);
    Centred { d, s1, s2, inv }
}

/// Batch norm's backward from `x`, `dy` (in `dtype`) and the saved mean, rstd and gain:
/// `dx = (dy - sum(dy)/m - x̂·sum(dy·x̂)/m)·rstd·g` in `dtype`, and the two sums as row
/// outputs (the bias's and the gain's gradients).
fn backward(dims: [usize; 4], dtype: DType) -> FusedKernel {
    let mut b = nchw(dims);
    let x = load_f32(&mut b, dtype);
    let dy = load_f32(&mut b, dtype);
    let mean = load(&mut b, DType::F32, true);
    let rstd = load(&mut b, DType::F32, true);
    let g = load(&mut b, DType::F32, true);
    let Centred { d, s1, s2, .. } = centred(&mut b, x, dy, mean, rstd);
    let rg = b.bin(Mul, rstd, g);
    let dx = b.bin(Mul, d, rg);
    let dx = b.to(dx, dtype);
    b.outputs(&[dx, s1, s2]).done()
}

/// A ResNet step's shape of the backward (its bf16 step fuses the ReLU's backward and the
/// next layer's sum in): `dy` masked where the forward's output was not positive, the two
/// sums, `dx`, a second-stage sum of `dx` and `dx` shifted by its mean; the mask (a full
/// output that reads no reduction) and the first stage's sums as outputs too.
fn resnet_backward(dims: [usize; 4]) -> FusedKernel {
    let bf = DType::BF16;
    let mut b = nchw(dims);
    let x = load_f32(&mut b, bf);
    let dy = load_f32(&mut b, bf);
    let mean = load(&mut b, DType::F32, true);
    let rstd = load(&mut b, DType::F32, true);
    let zero = b.konst(0.0);
    let off = b.push(Inst::Compare {
        op: CmpOp::Le,
        a: x,
        b: zero,
    });
    let dy = b.push(Inst::Select {
        cond: off,
        a: zero,
        b: dy,
    });
    let Centred { d, s1, s2, inv } = centred(&mut b, x, dy, mean, rstd);
    let dx = b.bin(Mul, d, rstd);
    let s3 = b.sum(dx);
    let m3 = b.bin(Mul, s3, inv);
    let m3 = b.to(m3, bf);
    let m3 = b.to(m3, DType::F32);
    let dx2 = b.bin(Sub, dx, m3);
    let dx2 = b.to(dx2, bf);
    b.outputs(&[off, dx2, s1, s2]).done()
}

// ---------------------------------------------------------------------------------------------
// When the generator splits by stages.

/// The blocks of a launch.
fn blocks(p: &FusedProgram, l: usize) -> u32 {
    p.launches[l].kernel.launch.grid[0]
}

#[test]
fn a_resnet50_batch_norm_backward_at_224_runs_as_partial_sums_on_many_blocks_a_fold_and_an_elementwise_dx(
) {
    use FusedArg::{Input as In, Output as Out, Scratch};
    let k = backward([128, 64, 56, 56], DType::BF16);
    assert_eq!(
        cuda::fused(&k).unwrap().launch.grid[0],
        64,
        "a block a channel"
    );
    let p = cuda::fused_program(&k).unwrap();
    assert_eq!(p.launches.len(), 3);
    assert!(
        blocks(&p, 0) >= 2 * 132,
        "partial: {} blocks",
        blocks(&p, 0)
    );
    assert_eq!(cuda::fused_scratch_bytes(&k), p.scratch_bytes);
    // The partial reads x, dy, the mean and rstd and writes two rows of f32 partials a slice; the finish
    // folds them into the two sums (scratch for dx, and the outputs); the last launch, with
    // no reduce axes, reads x, dy, the saved values and the sums, and writes dx alone.
    let (partial, finish, apply) = (&p.launches[0], &p.launches[1], &p.launches[2]);
    assert_eq!(partial.reads, 4, "x, dy, the mean and rstd: not the gain");
    assert!(partial.args[..2] == [In(0), In(1)]);
    assert!(partial.args[partial.reads..]
        .iter()
        .all(|a| matches!(a, Scratch { .. })));
    assert!(finish.args[finish.reads..].contains(&Out(1)));
    assert!(finish.args[finish.reads..].contains(&Out(2)));
    assert_eq!(apply.args[apply.reads..], [Out(0)]);
    assert!(apply.kernel.source.contains("(elementwise)"));
    for l in &p.launches {
        for a in &l.args {
            if let Scratch { offset, bytes } = *a {
                assert!(
                    offset % 256 == 0 && offset + bytes <= p.scratch_bytes,
                    "{a:?}"
                );
            }
        }
    }
}

#[test]
fn a_batch_norm_forward_with_few_channels_runs_as_two_stages_then_the_normalization() {
    for dims in [[128, 64, 112, 112], [128, 128, 28, 28], [128, 256, 56, 56]] {
        let k = forward(dims, DType::BF16);
        let p = cuda::fused_program(&k).unwrap();
        assert_eq!(p.launches.len(), 5, "{dims:?}");
        assert!(
            blocks(&p, 0) >= 2 * 132 && blocks(&p, 2) >= 2 * 132,
            "{dims:?}"
        );
        assert_eq!(
            p.launches[4].args[p.launches[4].reads..],
            [FusedArg::Output(0)]
        );
    }
    let p = cuda::fused_program(&resnet_backward([128, 64, 56, 56])).unwrap();
    assert_eq!(p.launches.len(), 5, "two stages and the full outputs");
}

#[test]
fn batch_norms_with_channels_enough_to_fill_the_gpu_or_short_rows_keep_one_kernel() {
    for (what, k) in [
        ("1024 channels", backward([128, 1024, 14, 14], DType::BF16)),
        ("512 channels", forward([128, 512, 28, 28], DType::BF16)),
        ("short rows", backward([8, 64, 32, 32], DType::F32)),
        (
            "a batch of one, short",
            forward([1, 16, 64, 64], DType::F32),
        ),
    ] {
        let p = cuda::fused_program(&k).unwrap();
        assert_eq!(p.launches.len(), 1, "{what}");
        assert_eq!(p.launches[0].kernel, cuda::fused(&k).unwrap(), "{what}");
        assert_eq!(
            (p.scratch_bytes, cuda::fused_scratch_bytes(&k)),
            (0, 0),
            "{what}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The chain, emulated.

/// Inputs of `k`: per-channel inputs positive (an rstd, a gain), full ones in [-1, 1).
fn inputs(k: &FusedKernel) -> Vec<Vec<u8>> {
    (k.inputs.iter().enumerate())
        .map(|(n, inp)| {
            let mut v = block_emu::values(inp.len, n as u64 + 1);
            if inp.len == k.domain[1] {
                v.iter_mut().for_each(|x| *x = 0.5 + x.abs());
            }
            block_emu::encode(inp.dtype, &v)
        })
        .collect()
}

/// Runs `k`'s program in the emulation: inputs, outputs and one scratch buffer (filled with
/// NaNs, so that a read before a write shows), each launch's parameters where the program
/// points them. Returns the outputs; `None` where the emulation cannot be built.
fn emulate(tag: &str, k: &FusedKernel, ins: &[Vec<u8>]) -> Option<Vec<Vec<u8>>> {
    let p = cuda::fused_program(k).unwrap();
    assert!(p.launches.len() >= 2, "{tag}: not split");
    block_emu::run_program(&format!("ingot_staged_emu_{tag}"), k, &p, ins)
}

/// The emulated chain against the CPU interpreter's one kernel: f32 outputs within 1e-4 of
/// their largest magnitude (sums folded in another order), bf16 ones within one bf16 rounding
/// of it, bools equal.
fn check(tag: &str, k: &FusedKernel) {
    let ins = inputs(k);
    let refs: Vec<&[u8]> = ins.iter().map(|x| &x[..]).collect();
    let want = run_buffers(k, &refs).unwrap();
    let Some(got) = emulate(tag, k, &ins) else {
        return;
    };
    block_emu::assert_outputs_match(tag, k, &got, &want);
}

#[test]
fn the_emulated_forward_split_by_stages_computes_what_the_cpu_computes() {
    check("fwd_f32", &forward([8, 3, 48, 48], DType::F32));
    check("fwd_bf16_odd", &forward([6, 5, 57, 61], DType::BF16));
}

#[test]
fn the_emulated_backward_split_by_stages_computes_what_the_cpu_computes() {
    check("bwd_f32", &backward([16, 2, 33, 32], DType::F32));
    check("bwd_bf16_odd", &backward([4, 1, 75, 67], DType::BF16));
}

#[test]
fn the_emulated_resnet_backward_with_two_stages_and_a_mask_computes_what_the_cpu_computes() {
    check("resnet_bwd", &resnet_backward([8, 3, 45, 47]));
}

// ---------------------------------------------------------------------------------------------
// Batch norm's backward as autodiff writes it: its second stage taken apart
// ([`ingot_kernels::fused::distribute`]), the chain one stage.

#[path = "support/bn_backward.rs"]
mod bn_backward;

/// Inputs of `k`: full ones in [-1, 1), per-channel ones in [0.5, 1.5), bools where a value is
/// negative.
fn inputs_any(k: &FusedKernel) -> Vec<Vec<u8>> {
    let full: usize = k.domain.iter().product();
    (k.inputs.iter().enumerate())
        .map(|(n, inp)| {
            let mut v = block_emu::values(inp.len, n as u64 + 3);
            if inp.len < full {
                v.iter_mut().for_each(|x| *x = 0.5 + x.abs());
            }
            match inp.dtype {
                DType::Bool => v.iter().map(|&x| u8::from(x < 0.0)).collect(),
                d => block_emu::encode(d, &v),
            }
        })
        .collect()
}

#[test]
fn the_emulated_autodiff_backward_taken_apart_into_one_stage_computes_what_the_cpu_computes() {
    use bn_backward::{autodiff_backward, Shape};
    for (tag, axes, dims, bf16) in [
        ("ad_nhwc_bf16", &[0, 1, 2][..], [32, 8, 16, 96], true),
        ("ad_nhwc_f32", &[0, 1, 2][..], [6, 35, 25, 72], false),
        ("ad_nchw_bf16", &[0, 2, 3][..], [6, 3, 61, 57], true),
    ] {
        let k = autodiff_backward(&Shape {
            dims,
            axes,
            t: DType::F32,
            bf16,
        });
        let p = cuda::fused_program(&k).unwrap();
        assert_eq!(p.launches.len(), 3, "{tag}: one stage, then dx");
        let ins = inputs_any(&k);
        let refs: Vec<&[u8]> = ins.iter().map(|x| &x[..]).collect();
        let want = run_buffers(&k, &refs).unwrap();
        let Some(got) = emulate(tag, &k, &ins) else {
            eprintln!("no C++ compiler with ucontext.h: the emulation is skipped");
            return;
        };
        block_emu::assert_outputs_match(tag, &k, &got, &want);
    }
}
