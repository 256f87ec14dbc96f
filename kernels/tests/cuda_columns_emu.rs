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

// ---------------------------------------------------------------------------------------------
// Several rows a thread (kernels/src/cuda/fused/colvec.rs): a batch norm's reductions over
// channels-last data, the channels contiguous.

/// A batch norm's statistic over `dims` (`[.., c]`, every axis but the last reduced):
/// `Σ (x - mean)²` with `x` in `dtype` and `mean` one f32 a channel, or `Σ x` without it.
fn channel_statistic(dims: &[usize], dtype: DType, centred: bool) -> FusedKernel {
    let mut b = cols(dims);
    let x = load(&mut b, dtype, false);
    let s = if centred {
        let last = dims.len() - 1;
        let mi = b.input_bcast(DType::F32, &(0..last).collect::<Vec<_>>());
        let mean = b.load(mi);
        let xc = b.bin(BinaryOp::Sub, x, mean);
        let sq = b.bin(BinaryOp::Mul, xc, xc);
        b.sum(sq)
    } else {
        b.sum(x)
    };
    b.outputs(&[s]).done()
}

/// A batch norm's masked weight and bias gradients over `dims`: `dy = mask ? 0 : g`, then
/// `Σ dy` and `Σ dy · x` (a bool mask, `g` in f32, `x` in bf16).
fn masked_gradients(dims: &[usize]) -> FusedKernel {
    let mut b = cols(dims);
    let mi = b.whole(DType::Bool);
    let mask = b.load(mi);
    let g = load(&mut b, DType::F32, false);
    let x = load(&mut b, DType::BF16, false);
    let zero = b.konst(0.0);
    let dy = b.push(ingot_kernels::fused::Inst::Select {
        cond: mask,
        a: zero,
        b: g,
    });
    let t = b.bin(BinaryOp::Mul, dy, x);
    let (s, st) = (b.sum(dy), b.sum(t));
    b.outputs(&[s, st]).done()
}

/// Inputs for `k`: values from [`block_emu::values`], bools every third element.
fn inputs_of(k: &FusedKernel) -> Vec<Vec<u8>> {
    (k.inputs.iter().enumerate())
        .map(|(n, inp)| match inp.dtype {
            DType::Bool => (0..inp.len).map(|i| u8::from(i % 3 == 0)).collect(),
            d => block_emu::encode(d, &block_emu::values(inp.len, n as u64 + 1)),
        })
        .collect()
}

/// `k`'s program in the emulation against the CPU interpreter (as [`check`]); returns
/// whether every launch went several rows a thread (`None` without the emulation).
fn check_rows_a_thread(tag: &str, k: &FusedKernel) -> Option<bool> {
    let ins = inputs_of(k);
    let refs: Vec<&[u8]> = ins.iter().map(|x| &x[..]).collect();
    let want = run_buffers(k, &refs).unwrap();
    let p = cuda::fused_program(k).unwrap();
    let vectors = (p.launches.iter()).all(|l| l.kernel.source.contains("rows a thread"));
    let (got, _) = emulate(tag, k, &ins)?;
    block_emu::assert_outputs_match(tag, k, &got, &want);
    Some(vectors)
}

#[test]
fn channels_last_batch_norm_statistics_read_several_channels_a_thread_and_match_the_cpu() {
    // bf16 eight channels a thread (72, 64 and 88 channels), f32 four (68, 76); whole kernels
    // (150 terms a channel) and split ones (2,400 and 3,700); 88 channels leave the last
    // block's threads past the channels' end.
    for (tag, dims, dtype, centred) in [
        ("cv_bf16_sum", vec![3, 50, 72], DType::BF16, false),
        ("cv_bf16_var", vec![3, 50, 72], DType::BF16, true),
        ("cv_bf16_split", vec![4, 600, 64], DType::BF16, true),
        ("cv_bf16_88", vec![2, 37, 88], DType::BF16, true),
        ("cv_f32_var", vec![5, 37, 68], DType::F32, true),
        ("cv_f32_split", vec![4, 925, 76], DType::F32, false),
    ] {
        let k = channel_statistic(&dims, dtype, centred);
        if let Some(v) = check_rows_a_thread(tag, &k) {
            assert!(v, "{tag}: some launch reads one channel a thread");
        }
    }
}

#[test]
fn column_reductions_whose_channels_do_not_come_in_fours_keep_one_a_thread() {
    // 66 and 67 channels: no vector fits; still the CPU's sums.
    for (tag, dims) in [("c1_66", vec![7, 33, 66]), ("c1_67", vec![3, 40, 67])] {
        let k = channel_statistic(&dims, DType::BF16, true);
        let p = cuda::fused_program(&k).unwrap();
        assert!(
            (p.launches.iter()).all(|l| !l.kernel.source.contains("rows a thread")),
            "{tag}"
        );
        check(tag, &k);
    }
}

#[test]
fn masked_weight_and_bias_gradients_read_mask_gradient_and_input_as_vectors_and_match_the_cpu() {
    // An f32 input among them: four channels a thread (a float4, an uchar4, an ushort4).
    for (tag, dims) in [
        ("cv_wb", vec![3, 45, 96]),
        ("cv_wb_split", vec![2, 1100, 80]),
    ] {
        let k = masked_gradients(&dims);
        let p = cuda::fused_program(&k).unwrap();
        assert!(
            p.launches[0].kernel.source.contains("4 rows a thread"),
            "{tag}: {}",
            p.launches[0].kernel.source
        );
        check_rows_a_thread(tag, &k);
    }
}

#[test]
fn statistics_with_channels_enough_read_whole_128_byte_lines_and_match_the_cpu() {
    // 544 bf16 channels over 64 x 64 positions: split 32 ways, 17,408 partial rows, 2,176
    // threads' worth of 8 channels; 8 threads across read 128 bytes of a position's
    // channels side by side (4 read 64, each line split between two blocks).
    let k = channel_statistic(&[64, 64, 544], DType::BF16, true);
    let p = cuda::fused_program(&k).unwrap();
    let partial = &p.launches[0].kernel;
    assert!(
        partial.source.contains("8 rows a thread"),
        "{}",
        partial.source
    );
    assert_eq!(partial.launch.block[0], 8, "{:?}", partial.launch);
    if let Some(v) = check_rows_a_thread("cv_lines", &k) {
        assert!(v, "some launch reads one channel a thread");
    }
}

// ---------------------------------------------------------------------------------------------
// A channels-last batch norm's backward (full outputs that read its sums): split by stages
// where its channels are few ([`ingot_kernels::fused::staged`]).

/// Batch norm's backward over channels-last `dims` (`[n, h, w, c]`): `dy` (a bf16 gradient
/// plus an f32 shortcut gradient) masked where `x` is not positive, `s1 = Σ dy`, `s2 = Σ dy·x̂`, and `dx = (dy - s1/m - x̂·s2/m)·rstd` in
/// bf16, with both sums as row outputs (`x` and `dy` bf16, the mean and rstd f32 a channel).
fn channels_last_backward(dims: &[usize]) -> FusedKernel {
    use BinaryOp::{Mul, Sub};
    let mut b = cols(dims);
    let x = load(&mut b, DType::BF16, false);
    let dy = load(&mut b, DType::BF16, false);
    // The shortcut's gradient, in f32 (resnet50's bf16 step keeps that stream in f32).
    let shortcut = load(&mut b, DType::F32, false);
    let dy = b.bin(BinaryOp::Add, dy, shortcut);
    let channel = |b: &mut KernelBuilder| {
        let last = b.k.domain.len() - 1;
        let i = b.input_bcast(DType::F32, &(0..last).collect::<Vec<_>>());
        b.load(i)
    };
    let (mean, rstd) = (channel(&mut b), channel(&mut b));
    let zero = b.konst(0.0);
    let off = b.push(ingot_kernels::fused::Inst::Compare {
        op: ingot_kernels::CmpOp::Le,
        a: x,
        b: zero,
    });
    let dy = b.push(ingot_kernels::fused::Inst::Select {
        cond: off,
        a: zero,
        b: dy,
    });
    let xc = b.bin(Sub, x, mean);
    let xh = b.bin(Mul, xc, rstd);
    let s1 = b.sum(dy);
    let t = b.bin(Mul, dy, xh);
    let s2 = b.sum(t);
    let m: usize = dims[..dims.len() - 1].iter().product();
    let inv = b.konst(1.0 / m as f64);
    let (m1, m2) = (b.bin(Mul, s1, inv), b.bin(Mul, s2, inv));
    let c = b.bin(Mul, xh, m2);
    let d = b.bin(Sub, dy, m1);
    let d = b.bin(Sub, d, c);
    let dx = b.bin(Mul, d, rstd);
    let dx = b.to(dx, DType::BF16);
    b.outputs(&[dx, s1, s2]).done()
}

#[test]
fn a_channels_last_batch_norm_backward_at_resnet50s_7x7_runs_in_stages_on_more_blocks() {
    // 2,048 channels of 6,272 terms: one kernel gives 32 channels a block, 64 blocks for 132
    // SMs; split 2 ways by stages (3,136 terms a partial row), each partial kernel spreads
    // its 4,096 rows, 4 a thread, over 256 blocks.
    let k = channels_last_backward(&[128, 7, 7, 2048]);
    let whole = cuda::fused(&k).unwrap();
    assert_eq!(whole.launch.grid[0], 64, "{:?}", whole.launch);
    let p = cuda::fused_program(&k).unwrap();
    assert_eq!(cuda::staged_split(&k), Some((0, 2)));
    assert!(p.launches.len() >= 3, "{} launches", p.launches.len());
    let partial = &p.launches[0].kernel;
    assert!(partial.launch.grid[0] >= 256, "{:?}", partial.launch);
}

#[test]
fn the_emulated_channels_last_backward_split_by_stages_computes_what_the_cpu_computes() {
    // 4,096 terms a channel over 96 channels, and 5,250 over 72 at odd sizes: split 2 ways
    // by stages.
    for (tag, dims) in [
        ("cl_bwd_96", vec![32, 8, 16, 96]),
        ("cl_bwd_odd", vec![6, 35, 25, 72]),
    ] {
        let k = channels_last_backward(&dims);
        assert!(cuda::staged_split(&k).is_some(), "{tag}: not split");
        split_backward_computes_what_the_cpu_computes(tag, &k);
    }
}

/// `k` (a [`channels_last_backward`], split) runs in the emulation as at least three launches
/// (partials, finish, output pass) and gives the interpreter's outputs, on seeded inputs with
/// input 4 (the rstd) positive.
fn split_backward_computes_what_the_cpu_computes(tag: &str, k: &FusedKernel) {
    let ins: Vec<Vec<u8>> = (k.inputs.iter().enumerate())
        .map(|(n, inp)| {
            let mut v = block_emu::values(inp.len, n as u64 + 1);
            if n == 4 {
                v.iter_mut().for_each(|x| *x = 0.5 + x.abs());
            }
            block_emu::encode(inp.dtype, &v)
        })
        .collect();
    let refs: Vec<&[u8]> = ins.iter().map(|x| &x[..]).collect();
    let want = run_buffers(k, &refs).unwrap();
    let p = cuda::fused_program(k).unwrap();
    assert!(
        p.launches.len() >= 3,
        "{tag}: {} launches",
        p.launches.len()
    );
    let name = format!("ingot_columns_emu_{tag}");
    if let Some(got) = block_emu::run_program(&name, k, &p, &ins) {
        block_emu::assert_outputs_match(tag, k, &got, &want);
    }
}

/// The blocks of the first launch of `k`'s program (the first stage's partial kernel where it
/// is split by stages).
fn first_blocks(k: &FusedKernel) -> u32 {
    cuda::fused_program(k).unwrap().launches[0]
        .kernel
        .launch
        .grid[0]
}

#[test]
fn resnet50s_small_channels_last_backwards_split_until_their_partials_fill_the_sms() {
    // 7x7x512 (6,272 terms a channel) split 2 ways by the staged rule (its floor of 2,048
    // terms a partial row stops there): its partial kernel had 32 blocks for 132 SMs. The
    // ways double while twice the blocks still fit one an SM (and a partial row keeps 512
    // terms): the blocks grow as the ways, to more than half the SMs and at most all of them.
    let blocks_at = |k: &FusedKernel, w: usize| {
        let s = ingot_kernels::fused::staged::staged(k, 0, w).unwrap();
        cuda::fused(&s.passes[0].kernel).unwrap().launch.grid[0] as usize
    };
    let (dims, old) = ([128, 7, 7, 512], 2);
    let k = channels_last_backward(&dims);
    let Some((0, ways)) = cuda::staged_split(&k) else {
        panic!("{dims:?}: {:?}", cuda::staged_split(&k));
    };
    let (before, blocks) = (blocks_at(&k, old), first_blocks(&k) as usize);
    assert_eq!(blocks, blocks_at(&k, ways));
    assert!(2 * before <= 132, "{before} blocks at {old} ways");
    assert!(ways > old, "{ways} ways");
    assert_eq!(blocks, before * ways / old, "{ways} ways");
    assert!((67..=132).contains(&blocks), "{blocks} blocks");
    // Kernels whose partials already take more than half the SMs keep the staged rule's ways:
    // 14x14x256 (8 ways: this kernel's f32 shortcut makes it 4 channels a thread, 128 blocks;
    // resnet50's, all bf16, had 64 and now splits 16 ways), 28x28x128 (32) and 7x7x2048 (2).
    for (dims, ways) in [
        ([128, 14, 14, 256], 8),
        ([128, 28, 28, 128], 32),
        ([128, 7, 7, 2048], 2),
    ] {
        let k = channels_last_backward(&dims);
        assert_eq!(cuda::staged_split(&k), Some((0, ways)), "{dims:?}");
        assert!(2 * first_blocks(&k) > 132, "{dims:?}");
    }
}

#[test]
fn resnet50s_7x7x512_backward_split_4_ways_computes_what_the_cpu_computes() {
    // The shape the fill rule changes, at its real size, in the emulation: the sums' partial
    // kernel over 4 slices of the batch, their finish, then the output pass.
    let k = channels_last_backward(&[128, 7, 7, 512]);
    assert_eq!(cuda::staged_split(&k), Some((0, 4)));
    split_backward_computes_what_the_cpu_computes("cl_bwd_7x7x512", &k);
}
