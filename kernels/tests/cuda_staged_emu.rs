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
use ingot_kernels::fused::{Access, FusedKernel, Input, Inst, Output};
use ingot_kernels::{BinaryOp, CmpOp, DType, ReduceOp, UnaryOp};
use ingot_testkit::block_emu;

/// Builds a kernel over NCHW `[n, c, h, w]` reducing `[0, 2, 3]`, an instruction at a time.
struct Nchw {
    k: FusedKernel,
}

impl Nchw {
    fn new(dims: [usize; 4]) -> Nchw {
        Nchw {
            k: FusedKernel {
                domain: dims.to_vec(),
                reduce_axes: vec![0, 2, 3],
                inputs: vec![],
                body: vec![],
                outputs: vec![],
            },
        }
    }
    fn i(&mut self, inst: Inst) -> usize {
        self.k.body.push(inst);
        self.k.body.len() - 1
    }
    /// A load of a new input: the whole tensor, or one value a channel.
    fn load(&mut self, dtype: DType, per_channel: bool) -> usize {
        let d = &self.k.domain;
        let (len, strides) = if per_channel {
            (d[1], vec![0, 1, 0, 0])
        } else {
            (d.iter().product(), Access::contiguous(d).strides)
        };
        self.k.inputs.push(Input {
            dtype,
            len,
            access: Access { offset: 0, strides },
        });
        let input = self.k.inputs.len() - 1;
        self.i(Inst::Load { input })
    }
    /// A load of a new full input of `dtype`, widened to f32.
    fn load_f32(&mut self, dtype: DType) -> usize {
        let x = self.load(dtype, false);
        self.to(x, DType::F32)
    }
    fn to(&mut self, x: usize, to: DType) -> usize {
        self.i(Inst::Convert { x, to })
    }
    fn bin(&mut self, op: BinaryOp, a: usize, b: usize) -> usize {
        self.i(Inst::Binary { op, a, b })
    }
    fn un(&mut self, op: UnaryOp, x: usize) -> usize {
        self.i(Inst::Unary { op, x })
    }
    fn konst(&mut self, value: f64) -> usize {
        self.i(Inst::Const {
            value,
            dtype: DType::F32,
        })
    }
    fn sum(&mut self, x: usize) -> usize {
        self.i(Inst::Reduce {
            op: ReduceOp::Sum,
            x,
        })
    }
    /// `1 / (n·h·w)`, the mean's factor.
    fn inv_count(&mut self) -> usize {
        let d = &self.k.domain;
        let m = (d[0] * d[2] * d[3]) as f64;
        self.konst(1.0 / m)
    }
    fn out(mut self, values: &[usize]) -> FusedKernel {
        self.k.outputs = values.iter().map(|&value| Output { value }).collect();
        assert!(self.k.check().is_ok(), "{:?}", self.k.check());
        self.k
    }
}

use BinaryOp::{Add, Mul, Sub};

/// Training batch norm's forward: `y = (x - mean) / sqrt(var + eps) · g + b` in `dtype`, with
/// the mean and the (biased) variance around it as row outputs.
fn forward(dims: [usize; 4], dtype: DType) -> FusedKernel {
    let mut b = Nchw::new(dims);
    let x = b.load_f32(dtype);
    let s = b.sum(x);
    let inv = b.inv_count();
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
    let g = b.load(DType::F32, true);
    let y = b.bin(Mul, xh, g);
    let bias = b.load(DType::F32, true);
    let y = b.bin(Add, y, bias);
    let y = b.to(y, dtype);
    b.out(&[y, mean, var])
}

/// Batch norm's backward from `x`, `dy` (in `dtype`) and the saved mean, rstd and gain:
/// `dx = (dy - sum(dy)/m - x̂·sum(dy·x̂)/m)·rstd·g` in `dtype`, and the two sums as row
/// outputs (the bias's and the gain's gradients).
fn backward(dims: [usize; 4], dtype: DType) -> FusedKernel {
    let mut b = Nchw::new(dims);
    let x = b.load_f32(dtype);
    let dy = b.load_f32(dtype);
    let mean = b.load(DType::F32, true);
    let rstd = b.load(DType::F32, true);
    let g = b.load(DType::F32, true);
    let xc = b.bin(Sub, x, mean);
    let xh = b.bin(Mul, xc, rstd);
    let s1 = b.sum(dy);
    let t = b.bin(Mul, dy, xh);
    let s2 = b.sum(t);
    let inv = b.inv_count();
    let m1 = b.bin(Mul, s1, inv);
    let m2 = b.bin(Mul, s2, inv);
    let c = b.bin(Mul, xh, m2);
    let d = b.bin(Sub, dy, m1);
    let d = b.bin(Sub, d, c);
    let rg = b.bin(Mul, rstd, g);
    let dx = b.bin(Mul, d, rg);
    let dx = b.to(dx, dtype);
    b.out(&[dx, s1, s2])
}

/// A ResNet step's shape of the backward (its bf16 step fuses the ReLU's backward and the
/// next layer's sum in): `dy` masked where the forward's output was not positive, the two
/// sums, `dx`, a second-stage sum of `dx` and `dx` shifted by its mean; the mask (a full
/// output that reads no reduction) and the first stage's sums as outputs too.
fn resnet_backward(dims: [usize; 4]) -> FusedKernel {
    let bf = DType::BF16;
    let mut b = Nchw::new(dims);
    let x = b.load_f32(bf);
    let dy = b.load_f32(bf);
    let mean = b.load(DType::F32, true);
    let rstd = b.load(DType::F32, true);
    let zero = b.konst(0.0);
    let off = b.i(Inst::Compare {
        op: CmpOp::Le,
        a: x,
        b: zero,
    });
    let dy = b.i(Inst::Select {
        cond: off,
        a: zero,
        b: dy,
    });
    let xc = b.bin(Sub, x, mean);
    let xh = b.bin(Mul, xc, rstd);
    let s1 = b.sum(dy);
    let t = b.bin(Mul, dy, xh);
    let s2 = b.sum(t);
    let inv = b.inv_count();
    let m1 = b.bin(Mul, s1, inv);
    let m2 = b.bin(Mul, s2, inv);
    let c = b.bin(Mul, xh, m2);
    let d = b.bin(Sub, dy, m1);
    let d = b.bin(Sub, d, c);
    let dx = b.bin(Mul, d, rstd);
    let s3 = b.sum(dx);
    let m3 = b.bin(Mul, s3, inv);
    let m3 = b.to(m3, bf);
    let m3 = b.to(m3, DType::F32);
    let dx2 = b.bin(Sub, dx, m3);
    let dx2 = b.to(dx2, bf);
    b.out(&[off, dx2, s1, s2])
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
