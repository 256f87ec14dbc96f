//! Column reductions on the GPU (the innermost axis kept: bias and LayerNorm-gain gradients):
//! the generated kernels, split in two ([`ingot_kernels::fused::split`]: partial sums over
//! slices of the rows, then their fold) or whole, run on the host by the block emulation
//! ([`ingot_testkit::block_emu`], blocks of `(X, Y)` threads: a column a thread `x`, threads
//! `y` along it, folding through shared memory) against the CPU interpreter, f32 and bf16, at
//! odd sizes. Skips the emulation (saying so) without a C++ compiler or `ucontext.h`.

use ingot_kernels::cuda;
use ingot_kernels::fused::cpu::run_buffers;
use ingot_kernels::fused::FusedKernel;
use ingot_kernels::{BinaryOp, DType};
use ingot_testkit::block_emu;
use ingot_testkit::kernel_builder::KernelBuilder;

/// A kernel over `[b, t, c]` reducing `[0, 1]` (or `[r, c]` reducing `[0]`), to build an
/// instruction at a time.
fn cols(dims: &[usize]) -> KernelBuilder {
    KernelBuilder::new(dims, &(0..dims.len() - 1).collect::<Vec<_>>())
}

/// A load of a new input, widened to f32: the whole tensor, or one value a token (every axis
/// but the last).
fn load(b: &mut KernelBuilder, dtype: DType, per_token: bool) -> usize {
    let input = if per_token {
        let last = b.k.domain.len() - 1;
        b.input_bcast(dtype, &[last])
    } else {
        b.whole(dtype)
    };
    let x = b.load(input);
    if dtype == DType::F32 {
        x
    } else {
        b.to(x, DType::F32)
    }
}

/// A LayerNorm's gain and bias gradients over `dims` (`[b, t, c]`): `sum(dy · (x - mean) ·
/// rstd)` and `sum(dy)` over the tokens, `dy` and `x` in `dtype`, the sums rounded to `dtype`.
fn gain_gradient(dims: &[usize], dtype: DType) -> FusedKernel {
    let mut b = cols(dims);
    let dy = load(&mut b, dtype, false);
    let x = load(&mut b, dtype, false);
    let mean = load(&mut b, DType::F32, true);
    let rstd = load(&mut b, DType::F32, true);
    let xc = b.bin(BinaryOp::Sub, x, mean);
    let xh = b.bin(BinaryOp::Mul, xc, rstd);
    let t = b.bin(BinaryOp::Mul, dy, xh);
    let g = b.sum(t);
    let s = b.sum(dy);
    let (g, s) = if dtype == DType::F32 {
        (g, s)
    } else {
        (b.to(g, dtype), b.to(s, dtype))
    };
    b.outputs(&[g, s]).done()
}

/// A bias gradient: `sum(dy)` over every axis but the last, `dy` and the sum in `dtype`, and
/// `2 · dy` beside it as a full output where `full`.
fn bias_gradient(dims: &[usize], dtype: DType, full: bool) -> FusedKernel {
    let mut b = cols(dims);
    let dy = load(&mut b, dtype, false);
    let s = b.sum(dy);
    let s = if dtype == DType::F32 {
        s
    } else {
        b.to(s, dtype)
    };
    if full {
        let twice = b.bin(BinaryOp::Add, dy, dy);
        let twice = b.to(twice, dtype);
        b.outputs(&[s, twice]).done()
    } else {
        b.outputs(&[s]).done()
    }
}

// ---------------------------------------------------------------------------------------------
// The kernels, emulated.

/// Runs `k`'s program in the emulation: inputs, outputs and one scratch buffer (NaNs, so that
/// a read before a write shows), each launch's parameters where the program points them.
/// Returns the outputs and the launches; `None` where the emulation cannot be built.
fn emulate(tag: &str, k: &FusedKernel, ins: &[Vec<u8>]) -> Option<(Vec<Vec<u8>>, usize)> {
    let p = cuda::fused_program(k).unwrap();
    for l in &p.launches {
        assert!(
            l.kernel.source.contains("(columns)"),
            "{tag}: {}",
            l.kernel.source
        );
    }
    let outs = block_emu::run_program(&format!("ingot_columns_emu_{tag}"), k, &p, ins)?;
    Some((outs, p.launches.len()))
}

/// The emulated program against the CPU interpreter: f32 outputs within 1e-4 of their largest
/// magnitude (sums folded in another order), bf16 ones within one bf16 rounding of it.
/// Returns the program's launches (0 where the emulation cannot be built).
fn check(tag: &str, k: &FusedKernel) -> usize {
    let ins: Vec<Vec<u8>> = (k.inputs.iter().enumerate())
        .map(|(n, inp)| {
            let mut v = block_emu::values(inp.len, n as u64 + 1);
            if n == 3 {
                // An rstd: positive.
                v.iter_mut().for_each(|x| *x = 0.5 + x.abs());
            }
            block_emu::encode(inp.dtype, &v)
        })
        .collect();
    let refs: Vec<&[u8]> = ins.iter().map(|x| &x[..]).collect();
    let want = run_buffers(k, &refs).unwrap();
    let Some((got, launches)) = emulate(tag, k, &ins) else {
        return 0;
    };
    block_emu::assert_outputs_match(tag, k, &got, &want);
    launches
}

#[test]
fn the_emulated_split_layernorm_gain_gradient_computes_what_the_cpu_computes() {
    // 3 x 700 tokens (2,100 terms: split 4 ways along the tokens), 67 columns; bf16, and f32
    // over 5 x 416 tokens (16 ways).
    let k = gain_gradient(&[3, 700, 67], DType::BF16);
    let launches = check("gain_bf16", &k);
    assert!(launches == 0 || launches == 2, "{launches} launches");
    check("gain_f32", &gain_gradient(&[5, 416, 70], DType::F32));
}

#[test]
fn the_emulated_split_bias_gradient_computes_what_the_cpu_computes() {
    let launches = check("bias_bf16", &bias_gradient(&[2176, 65], DType::BF16, false));
    assert!(launches == 0 || launches == 2, "{launches} launches");
    check(
        "bias_f32_3d",
        &bias_gradient(&[4, 544, 72], DType::F32, false),
    );
}

#[test]
fn the_emulated_whole_column_reductions_with_a_full_output_compute_what_the_cpu_computes() {
    // Kept whole (rows short of the split's 2,048 terms): threads of 3 and of 8 terms (the
    // last of them past the rows' end for some), a full output beside the sum.
    for (tag, dims) in [("c300", [300, 70]), ("c1000", [1000, 67])] {
        let k = bias_gradient(&dims, DType::BF16, true);
        let launches = check(tag, &k);
        assert!(launches <= 1, "{tag}: {launches} launches");
    }
}
