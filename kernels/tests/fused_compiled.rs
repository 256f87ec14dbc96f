//! Compiled fused kernels (`fused::cpu::Compiled`) against the interpreter (`fused::cpu::run`),
//! which stays the reference: the same bits on random kernels, on their pieces or ranges of
//! rows for 1, 2, 3 and 16 threads, on a layer norm's short rows run several to a chunk, on
//! batch norms (kept axes between reduced ones) and on column sums run several terms to a
//! chunk; and no allocation.

use ingot_kernels::fused::cpu::{self, Compiled};
use ingot_kernels::fused::random::{self, Rng};
use ingot_kernels::fused::{parts, Access, FusedKernel, Input, Inst, KernelError, Output};
use ingot_kernels::{BinaryOp, DType, ReduceOp, UnaryOp};
use ingot_testkit::fused_kernels::layer_norm;
use ingot_testkit::kernel_builder::KernelBuilder;
use zerocopy::IntoBytes;
#[path = "support/counting.rs"]
mod counting;
use counting::allocations;

/// A random kernel made f32 throughout where it can be: inputs and constants f32, indices
/// replaced by a constant and converts by a negation. `None` if the result does not check
/// (a bool read where a number is needed, for instance).
fn f32_kernel(seed: u64, opts: &random::Options) -> Option<FusedKernel> {
    let mut k = random::kernel(seed, opts);
    for i in &mut k.inputs {
        i.dtype = DType::F32;
    }
    for inst in &mut k.body {
        *inst = match *inst {
            Inst::Const { value, .. } => Inst::Const {
                value,
                dtype: DType::F32,
            },
            Inst::Index { .. } => Inst::Const {
                value: 1.5,
                dtype: DType::F32,
            },
            Inst::Convert { x, .. } => Inst::Unary {
                op: UnaryOp::Neg,
                x,
            },
            ref other => other.clone(),
        };
    }
    k.check().ok().map(|_| k)
}

/// Inputs of ordinary values, both zeros, infinities and NaN (a fifth of the inputs hold only
/// -1 and zeros of both signs, so that max reductions meet ties).
fn data(r: &mut Rng, inp: &Input) -> Vec<u8> {
    let zeros = r.chance(20);
    let mut out = Vec::with_capacity(inp.len * 4);
    for _ in 0..inp.len {
        let x: f32 = if zeros {
            r.pick(&[-1.0, -0.0, 0.0])
        } else if r.chance(8) {
            r.pick(&[
                -0.0,
                0.0,
                f32::NAN,
                f32::INFINITY,
                f32::NEG_INFINITY,
                1e20,
                -3e-20,
            ])
        } else {
            (r.below(97) as f32 - 48.0) / 8.0 + r.below(1000) as f32 * 1e-4
        };
        out.extend_from_slice(&x.to_ne_bytes());
    }
    out
}

/// `bytes` (f32 values) with every NaN made an infinity.
fn without_nan(mut bytes: Vec<u8>) -> Vec<u8> {
    for c in bytes.chunks_exact_mut(4) {
        if f32::from_ne_bytes([c[0], c[1], c[2], c[3]]).is_nan() {
            c.copy_from_slice(&f32::INFINITY.to_ne_bytes());
        }
    }
    bytes
}

/// An arena (8-aligned) with the inputs and outputs at 256-aligned offsets and `scratch`
/// bytes after them: `(arena, inputs, outputs, scratch offset)`.
fn arena(
    k: &FusedKernel,
    inputs: &[Vec<u8>],
    scratch: usize,
) -> (Vec<u64>, Vec<usize>, Vec<usize>, usize) {
    let mut at = 0usize;
    let mut ins = Vec::new();
    for d in inputs {
        ins.push(at);
        at = (at + d.len()).next_multiple_of(256);
    }
    let mut outs = Vec::new();
    for j in 0..k.outputs.len() {
        outs.push(at);
        at = (at + k.output_len(j) * k.output_dtype(j).size()).next_multiple_of(256);
    }
    let s = at;
    let mut mem = vec![0u64; (at + scratch).div_ceil(8) + 1];
    let bytes = mem.as_mut_bytes();
    for (&o, d) in ins.iter().zip(inputs) {
        bytes[o..o + d.len()].copy_from_slice(d);
    }
    (mem, ins, outs, s)
}

fn outputs_of(k: &FusedKernel, mem: &[u64], outs: &[usize]) -> Vec<Vec<u8>> {
    let bytes = mem.as_bytes();
    (0..k.outputs.len())
        .map(|j| bytes[outs[j]..outs[j] + k.output_len(j) * k.output_dtype(j).size()].to_vec())
        .collect()
}

/// Runs `k` through its program (or `k`'s pieces for `threads`, each through its own program
/// where it has one, one after another) in an arena.
fn run_compiled(
    k: &FusedKernel,
    inputs: &[Vec<u8>],
    threads: usize,
) -> Result<Vec<Vec<u8>>, KernelError> {
    let pieces = if threads > 1 {
        parts::cut(k, threads, 1)
    } else {
        None
    };
    match pieces {
        None => {
            let c = Compiled::new(k).expect("compiled");
            let (mut mem, ins, outs, s) = arena(k, inputs, c.scratch_bytes());
            match c.row_ranges(k, threads, 1) {
                // Ranges of rows, as threads run them, last range first: each writes its
                // own rows whatever the others did.
                Some(ranges) if threads > 1 => {
                    for r in ranges.into_iter().rev() {
                        c.run_rows(k, mem.as_mut_bytes(), &ins, &outs, s, r)?;
                    }
                }
                _ => c.run(k, mem.as_mut_bytes(), &ins, &outs, s)?,
            }
            Ok(outputs_of(k, &mem, &outs))
        }
        Some(ps) => {
            let need = ps
                .iter()
                .map(|p| cpu::scratch_bytes(&p.kernel))
                .max()
                .unwrap_or(0);
            let (mut mem, ins, outs, s) = arena(k, inputs, need);
            for p in &ps {
                let po: Vec<usize> = outs
                    .iter()
                    .zip(&p.output_start)
                    .enumerate()
                    .map(|(j, (&o, &st))| o + st * k.output_dtype(j).size())
                    .collect();
                match Compiled::new(&p.kernel) {
                    Some(c) => c.run(&p.kernel, mem.as_mut_bytes(), &ins, &po, s)?,
                    None => cpu::run(&p.kernel, mem.as_mut_bytes(), &ins, &po, s)?,
                }
            }
            Ok(outputs_of(k, &mem, &outs))
        }
    }
}

/// Whether the outputs are the same bits, a NaN matching any NaN: a sum meeting two NaNs keeps
/// either payload (LLVM may swap an addition's operands, and does so differently in loops of
/// 2 and of 64 lanes), so NaN payloads are not the claim.
fn same(k: &FusedKernel, got: &[Vec<u8>], want: &[Vec<u8>]) -> Result<(), String> {
    let f = |b: &[u8]| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
    let differ = |a: &[u8], b: &[u8]| a != b && !(f(a).is_nan() && f(b).is_nan());
    for (j, (g, w)) in got.iter().zip(want).enumerate() {
        if k.output_dtype(j) == DType::Bool {
            if let Some(e) = (0..g.len().max(w.len())).find(|&e| g.get(e) != w.get(e)) {
                return Err(format!(
                    "output {j} (bool) element {e}: compiled {:?}, interpreted {:?}\n{k}",
                    g.get(e),
                    w.get(e)
                ));
            }
            continue;
        }
        if g.len() != w.len()
            || g.chunks_exact(4)
                .zip(w.chunks_exact(4))
                .any(|(a, b)| differ(a, b))
        {
            let e = g
                .chunks_exact(4)
                .zip(w.chunks_exact(4))
                .position(|(a, b)| differ(a, b))
                .unwrap_or(0);
            let f = |b: &[u8]| f32::from_ne_bytes(b[e * 4..e * 4 + 4].try_into().unwrap());
            return Err(format!(
                "output {j} element {e}: compiled {:?}, interpreted {:?}\n{k}",
                f(g),
                f(w)
            ));
        }
    }
    Ok(())
}

/// Whether some kept axis of `k` (of size > 1) lies between reduced ones, or a reduced one
/// between kept ones: the kept and reduced axes interleave.
/// Inputs of `k` drawn from `seed` with no NaN (a sum meeting two NaNs keeps either payload:
/// LLVM may swap an addition's operands, so NaN bits are not the claim), and the interpreter's
/// outputs on them.
fn inputs_and_want(k: &FusedKernel, seed: u64) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let mut r = Rng(seed);
    let inputs: Vec<Vec<u8>> = k
        .inputs
        .iter()
        .map(|i| without_nan(data(&mut r, i)))
        .collect();
    let refs: Vec<&[u8]> = inputs.iter().map(|d| d.as_slice()).collect();
    let want = cpu::run_buffers(k, &refs).unwrap();
    (inputs, want)
}

/// `k` compiled, run on `inputs` on each of `threads` threads, gives the bits `want`; `what`
/// names the case in a failure.
fn compiled_gives(
    k: &FusedKernel,
    inputs: &[Vec<u8>],
    want: &[Vec<u8>],
    threads: &[usize],
    what: &str,
) {
    for &threads in threads {
        let got = run_compiled(k, inputs, threads).unwrap();
        same(k, &got, want).unwrap_or_else(|e| panic!("{what}, {threads} threads: {e}"));
    }
}

fn interleaved(k: &FusedKernel) -> bool {
    let red: Vec<bool> = (0..k.domain.len())
        .filter(|&d| k.domain[d] > 1)
        .map(|d| k.reduce_axes.contains(&d))
        .collect();
    red.windows(2).filter(|w| w[0] != w[1]).count() >= 2
}

#[test]
fn compiled_random_kernels_give_the_interpreters_bits_on_1_2_3_and_16_threads() {
    let (mut compiled, mut rows, mut multi_row, mut columns) = (0, 0, 0, 0);
    let mut mixed = 0;
    for seed in 0..6000u64 {
        let Some(k) = f32_kernel(seed, &random::Options::small()) else {
            continue;
        };
        let Some(c) = Compiled::new(&k) else {
            continue;
        };
        compiled += 1;
        columns += usize::from(c.is_columns());
        mixed += usize::from(interleaved(&k));
        if k.reduce_axes.iter().any(|&a| k.domain[a] > 1) {
            rows += 1;
            if c.shape().1 > 1 {
                multi_row += 1;
            }
        }
        let mut r = Rng(seed ^ 0x5EED);
        let inputs: Vec<Vec<u8>> = k.inputs.iter().map(|i| data(&mut r, i)).collect();
        let refs: Vec<&[u8]> = inputs.iter().map(|d| d.as_slice()).collect();
        let want = cpu::run_buffers(&k, &refs).unwrap();
        for threads in [1, 2, 3, 16] {
            let got = run_compiled(&k, &inputs, threads)
                .unwrap_or_else(|e| panic!("seed {seed}, {threads} threads: {e}\n{k}"));
            if let Err(e) = same(&k, &got, &want) {
                panic!("seed {seed}, {threads} threads: {e}");
            }
        }
    }
    // The generator must reach the compiled path often, rows several to a chunk included.
    assert!(compiled >= 500, "{compiled} kernels compiled");
    assert!(columns >= 100, "{columns} column reductions compiled");
    assert!(rows >= 100, "{rows} row kernels compiled");
    assert!(
        multi_row >= 50,
        "{multi_row} row kernels with several rows a chunk"
    );
    assert!(
        mixed >= 50,
        "{mixed} kernels with interleaved kept and reduced axes compiled"
    );
}

/// A batch norm over `domain` reduced over `reduce` (the normalised axes; the kept ones are the
/// channels): `x` read through `x_strides` (at `x_offset`, `x_len` elements), a scale and a
/// shift per channel. Outputs: the normalised, scaled and shifted `y` (full), the mean and
/// `1/sqrt(var + eps)` (per channel), and `Σ y·x`, as a backward pass's statistics.
fn batch_norm(
    domain: &[usize],
    reduce: &[usize],
    x_strides: Vec<usize>,
    x_offset: usize,
    x_len: usize,
) -> FusedKernel {
    let count: usize = reduce.iter().map(|&a| domain[a]).product();
    let per_channel = || {
        let (strides, len) = kept_strides(domain, reduce);
        Input {
            dtype: DType::F32,
            len,
            access: Access { offset: 0, strides },
        }
    };
    let bin = |op, a, b| Inst::Binary { op, a, b };
    let konst = |value| Inst::Const {
        value,
        dtype: DType::F32,
    };
    let sum = |x| Inst::Reduce {
        op: ReduceOp::Sum,
        x,
    };
    FusedKernel {
        domain: domain.to_vec(),
        reduce_axes: reduce.to_vec(),
        inputs: vec![
            Input {
                dtype: DType::F32,
                len: x_len,
                access: Access {
                    offset: x_offset,
                    strides: x_strides,
                },
            },
            per_channel(),
            per_channel(),
        ],
        body: vec![
            Inst::Load { input: 0 },         // 0 x
            Inst::Load { input: 1 },         // 1 scale
            Inst::Load { input: 2 },         // 2 shift
            konst(1.0 / count as f64),       // 3
            sum(0),                          // 4 Σx
            bin(BinaryOp::Mul, 4, 3),        // 5 mean
            bin(BinaryOp::Sub, 0, 5),        // 6 d
            bin(BinaryOp::Mul, 6, 6),        // 7 d²
            sum(7),                          // 8
            bin(BinaryOp::Mul, 8, 3),        // 9 var
            konst(1e-5),                     // 10
            bin(BinaryOp::Add, 9, 10),       // 11
            Inst::unary(UnaryOp::Sqrt, 11),  // 12
            Inst::unary(UnaryOp::Recip, 12), // 13 rstd
            bin(BinaryOp::Mul, 6, 13),       // 14 xhat
            bin(BinaryOp::Mul, 14, 1),       // 15
            bin(BinaryOp::Add, 15, 2),       // 16 y
            bin(BinaryOp::Mul, 16, 0),       // 17 y·x
            sum(17),                         // 18
        ],
        outputs: vec![
            Output { value: 16 },
            Output { value: 5 },
            Output { value: 13 },
            Output { value: 18 },
        ],
    }
}

/// Row-major strides over `domain`'s kept axes (those not in `reduce`), 0 over the reduced
/// ones: a value per kept index; and how many kept indices there are.
fn kept_strides(domain: &[usize], reduce: &[usize]) -> (Vec<usize>, usize) {
    let mut strides = vec![0; domain.len()];
    let mut acc = 1;
    for d in (0..domain.len()).rev().filter(|d| !reduce.contains(d)) {
        strides[d] = acc;
        acc *= domain[d];
    }
    (strides, acc)
}

/// Row-major strides of `dims`.
fn row_major(dims: &[usize]) -> Vec<usize> {
    Access::contiguous(dims).strides
}

#[test]
fn reductions_with_kept_axes_between_reduced_ones_compile_with_the_interpreters_bits_on_1_2_3_and_16_threads(
) {
    // Batch norm over NCHW (channels kept between the batch and the image), its transposes,
    // kept axes on both sides of a reduced one, long runs split over chunks, runs of 2.
    let cases: [(&[usize], &[usize]); 9] = [
        (&[8, 16, 2, 2], &[0, 2, 3]),
        (&[16, 4, 4, 4], &[0, 2, 3]),
        (&[3, 5, 7, 9], &[0, 2, 3]),
        (&[4, 3, 1500], &[0, 2]),
        (&[5, 6, 7, 2], &[1, 3]),
        (&[2, 3, 4, 5, 6], &[0, 2, 4]),
        (&[6, 1, 5, 4], &[0, 3]),
        (&[70, 9, 2], &[0, 2]),
        (&[2, 33, 3, 2, 4], &[0, 1, 3, 4]),
    ];
    for (domain, reduce) in cases {
        let numel: usize = domain.iter().product();
        // x contiguous; x stored with its two outermost axes swapped; x a slice of a padded
        // buffer (the strides of the axes outside the trailing reduced ones doubled, an
        // offset).
        let mut swapped: Vec<usize> = domain.to_vec();
        swapped.swap(0, 1);
        let mut sw = row_major(&swapped);
        sw.swap(0, 1);
        let mut padded = row_major(domain);
        let rank = domain.len();
        let inner = (0..rank).rev().take_while(|d| reduce.contains(d)).count();
        for s in &mut padded[..rank - inner] {
            *s *= 2;
        }
        let padded_len = 7
            + (0..rank)
                .map(|d| (domain[d] - 1) * padded[d])
                .sum::<usize>()
            + 1;
        let layouts = [
            (row_major(domain), 0, numel),
            (sw, 0, numel),
            (padded, 7, padded_len),
        ];
        for (strides, offset, len) in layouts {
            let k = batch_norm(domain, reduce, strides, offset, len);
            k.check().unwrap();
            let c = Compiled::new(&k)
                .unwrap_or_else(|| panic!("{domain:?} reduced over {reduce:?} compiles"));
            assert!(!c.is_columns());
            assert!(c.scratch_bytes() <= cpu::scratch_bytes(&k));
            let (inputs, want) = inputs_and_want(&k, numel as u64 + offset as u64);
            let what = format!("{domain:?} over {reduce:?}");
            compiled_gives(&k, &inputs, &want, &[1, 2, 3, 16], &what);
        }
    }
}

#[test]
fn resnet18s_batch_norms_at_2x2_and_4x4_go_across_the_channels_with_the_interpreters_bits_on_1_2_3_and_16_threads(
) {
    // resnet18 (CIFAR) at batch 128: a channel's runs are 2×2 or 4×4 pixels, 1,024 or 2,048
    // floats apart. The program takes each run of a group of channels in one chunk: a group
    // is as many channels as a chunk's lanes hold runs (where a row's runs together made
    // groups of one channel), so that their per-channel values, spread over the lanes once a
    // stage, line up with every chunk of the group.
    for domain in [[128, 256, 2, 2], [128, 128, 4, 4]] {
        let reduce = [0, 2, 3];
        let numel: usize = domain.iter().product();
        let k = batch_norm(&domain, &reduce, row_major(&domain), 0, numel);
        let c = Compiled::new(&k).expect("a batch norm compiles");
        let (lanes, group) = c.shape();
        let hw = domain[2] * domain[3];
        assert_eq!(group, (lanes / hw).min(128), "{domain:?}: channels a group");
        assert!(group >= 16, "{domain:?}: {group} channels a group");
        assert!(c.scratch_bytes() <= cpu::scratch_bytes(&k));
        // Finite values (the random kernels' data holds infinities), so that the means can
        // be held to f64 sums.
        let mut r = Rng(18);
        let inputs: Vec<Vec<u8>> = k
            .inputs
            .iter()
            .map(|i| {
                (0..i.len)
                    .flat_map(|_| ((r.below(2001) as f32 - 1000.0) / 256.0).to_ne_bytes())
                    .collect()
            })
            .collect();
        let refs: Vec<&[u8]> = inputs.iter().map(|d| d.as_slice()).collect();
        let want = cpu::run_buffers(&k, &refs).unwrap();
        compiled_gives(&k, &inputs, &want, &[1, 2, 3, 16], &format!("{domain:?}"));
        // The means against f64 sums of the same inputs (an independent reference).
        let x: Vec<f32> = inputs[0]
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
            .collect();
        let (ch, hw) = (domain[1], domain[2] * domain[3]);
        for (cc, m) in want[1].chunks_exact(4).enumerate() {
            let m = f32::from_ne_bytes(m.try_into().unwrap()) as f64;
            let terms = (0..domain[0]).flat_map(|n| {
                let at = (n * ch + cc) * hw;
                x[at..at + hw].iter().map(|&v| v as f64)
            });
            let (sum, abs) = terms.fold((0.0, 0.0), |(s, a), v: f64| (s + v, a + v.abs()));
            let count = (domain[0] * hw) as f64;
            let tol = 4e-6 * abs / count;
            assert!(
                (m - sum / count).abs() <= tol,
                "{domain:?} channel {cc}: mean {m}, f64 {}",
                sum / count
            );
        }
    }
}

/// A batch norm's backward pass over `[N, C, H, W]` as resnet18's step fuses it: a ReLU's
/// mask (bools) applied to `dy`, and the per-channel values `mean`, `rstd`, `scale` read by
/// every full instruction; outputs the two per-channel sums and the full `dx`.
fn batch_norm_backward(domain: &[usize]) -> FusedKernel {
    let reduce = [0, 2, 3];
    let count: usize = reduce.iter().map(|&a| domain[a]).product();
    let mut b = KernelBuilder::new(domain, &reduce);
    let (mask, dy, x) = (
        b.whole(DType::Bool),
        b.whole(DType::F32),
        b.whole(DType::F32),
    );
    let channel = |b: &mut KernelBuilder| {
        let i = b.input_bcast(DType::F32, &reduce);
        b.load(i)
    };
    let (mean, rstd, scale) = (channel(&mut b), channel(&mut b), channel(&mut b));
    let mask = b.load(mask);
    let zero = b.konst(0.0);
    let dy = b.load(dy);
    let g = b.push(Inst::Select {
        cond: mask,
        a: zero,
        b: dy,
    });
    let x = b.load(x);
    let d = b.bin(BinaryOp::Sub, x, mean);
    let xhat = b.bin(BinaryOp::Mul, d, rstd);
    let sum_g = b.sum(g);
    let gx = b.bin(BinaryOp::Mul, g, xhat);
    let sum_gx = b.sum(gx);
    let inv = b.konst(1.0 / count as f64);
    let m_g = b.bin(BinaryOp::Mul, sum_g, inv);
    let m_gx = b.bin(BinaryOp::Mul, sum_gx, inv);
    let t = b.bin(BinaryOp::Mul, xhat, m_gx);
    let u = b.bin(BinaryOp::Sub, g, m_g);
    let v = b.bin(BinaryOp::Sub, u, t);
    let sr = b.bin(BinaryOp::Mul, scale, rstd);
    let dx = b.bin(BinaryOp::Mul, v, sr);
    b.outputs(&[sum_g, sum_gx, dx]).done()
}

#[test]
fn batch_norm_backwards_across_the_channels_give_the_interpreters_bits_on_1_2_3_and_16_threads() {
    // Runs of 2×2, 3×3 and 4×4 pixels go across the channels, their per-channel operands read
    // from spread buffers filled once a group; channel counts that leave a last, shorter
    // group (300, 131), or one group smaller than a chunk's lanes (5), and batches of 1 to 9.
    let cases: [&[usize]; 6] = [
        &[3, 300, 2, 2],
        &[9, 131, 4, 4],
        &[4, 300, 3, 3],
        &[2, 5, 2, 2],
        &[1, 64, 4, 4],
        &[7, 40, 1, 3],
    ];
    for domain in cases {
        let k = batch_norm_backward(domain);
        k.check().unwrap();
        let c = Compiled::new(&k).unwrap_or_else(|| panic!("{domain:?} compiles"));
        assert!(!c.is_columns());
        assert!(c.scratch_bytes() <= cpu::scratch_bytes(&k));
        // A group is as many channels as a chunk holds runs (all of them where fewer).
        let (lanes, group) = c.shape();
        let hw = domain[2] * domain[3];
        assert_eq!(group, (lanes / hw).min(128).min(domain[1]), "{domain:?}");
        let numel: usize = domain.iter().product();
        // The mask one byte an element (0 or 1), the rest f32 without NaN.
        let mut r = Rng(numel as u64);
        let inputs: Vec<Vec<u8>> = k
            .inputs
            .iter()
            .map(|i| match i.dtype {
                DType::Bool => (0..i.len).map(|_| u8::from(r.chance(3))).collect(),
                _ => without_nan(data(&mut r, i)),
            })
            .collect();
        let refs: Vec<&[u8]> = inputs.iter().map(|d| d.as_slice()).collect();
        let want = cpu::run_buffers(&k, &refs).unwrap();
        compiled_gives(&k, &inputs, &want, &[1, 2, 3, 16], &format!("{domain:?}"));
    }
}

/// A ReLU's backward pass into a batch norm's: `dy` where the stored mask is false, its sum
/// per channel; and the mask of the result's non-positive elements, stored (bools).
fn masked_sum(domain: &[usize], reduce: &[usize]) -> FusedKernel {
    let mut b = KernelBuilder::new(domain, reduce);
    let (mask, dy) = (b.whole(DType::Bool), b.whole(DType::F32));
    let mask = b.load(mask);
    let zero = b.konst(0.0);
    let dy = b.load(dy);
    let kept = b.push(Inst::Select {
        cond: mask,
        a: zero,
        b: dy,
    });
    let sum = b.sum(kept);
    let off = b.push(Inst::Compare {
        op: ingot_kernels::CmpOp::Le,
        a: kept,
        b: zero,
    });
    b.outputs(&[kept, sum, off]);
    b.k
}

#[test]
fn masks_loaded_and_stored_as_bools_compile_with_the_interpreters_bits() {
    let cases: [(&[usize], &[usize]); 4] = [
        (&[16, 8, 4, 4], &[0, 2, 3]),
        (&[128, 32], &[0]),
        (&[6, 5, 70], &[0, 2]),
        (&[9, 300], &[0]),
    ];
    for (domain, reduce) in cases {
        let k = masked_sum(domain, reduce);
        k.check().unwrap();
        let c = Compiled::new(&k).unwrap_or_else(|| panic!("{domain:?} over {reduce:?}"));
        let mut r = Rng(domain.iter().product::<usize>() as u64);
        let mask: Vec<u8> = (0..k.inputs[0].len)
            .map(|_| u8::from(r.chance(50)))
            .collect();
        let inputs = vec![mask, without_nan(data(&mut r, &k.inputs[1]))];
        let refs: Vec<&[u8]> = inputs.iter().map(|d| d.as_slice()).collect();
        let want = cpu::run_buffers(&k, &refs).unwrap();
        for threads in [1, 2, 3, 16] {
            let (mut mem, ins, outs, s) = arena(&k, &inputs, c.scratch_bytes());
            match c.row_ranges(&k, threads, 1) {
                Some(ranges) if threads > 1 => {
                    for r in ranges {
                        c.run_rows(&k, mem.as_mut_bytes(), &ins, &outs, s, r)
                            .unwrap();
                    }
                }
                _ => c.run(&k, mem.as_mut_bytes(), &ins, &outs, s).unwrap(),
            }
            let bytes = mem.as_bytes();
            for (j, w) in want.iter().enumerate() {
                let got = &bytes[outs[j]..outs[j] + w.len()];
                assert!(
                    got == &w[..],
                    "{domain:?} over {reduce:?}, {threads} threads: output {j} differs"
                );
            }
        }
    }
}

#[test]
fn a_batch_norm_with_a_full_output_is_cut_into_ranges_of_its_channels() {
    // `fused::parts` cannot cut it (its outermost axis is reduced and it stores a full
    // output); its program's rows (the channels) can be.
    let k = batch_norm(
        &[8, 16, 2, 2],
        &[0, 2, 3],
        row_major(&[8, 16, 2, 2]),
        0,
        512,
    );
    assert!(parts::cut(&k, 4, 1).is_none());
    let c = Compiled::new(&k).unwrap();
    assert_eq!(c.rows(), 16);
    let ranges = c.row_ranges(&k, 3, 1).unwrap();
    assert_eq!(ranges, [0..5, 5..10, 10..16]);
    // No more ranges than channels, and none under the smallest piece.
    assert_eq!(c.row_ranges(&k, 64, 1).unwrap().len(), 16);
    assert_eq!(c.row_ranges(&k, 64, 200).unwrap().len(), 2);
    assert!(c.row_ranges(&k, 64, 512).is_none());
    // A range past the rows is an error, not a panic.
    let mut r = Rng(3);
    let inputs: Vec<Vec<u8>> = k.inputs.iter().map(|i| data(&mut r, i)).collect();
    let (mut mem, ins, outs, s) = arena(&k, &inputs, c.scratch_bytes());
    assert!(c
        .run_rows(&k, mem.as_mut_bytes(), &ins, &outs, s, 10..17)
        .is_err());
}

#[test]
fn a_layer_norms_short_rows_run_several_to_a_chunk_with_the_interpreters_bits() {
    for (rows, n) in [(512, 64), (37, 256), (5, 3000), (300, 2)] {
        let k = layer_norm(rows, n, false, true);
        k.check().unwrap();
        let c = Compiled::new(&k).expect("a layer norm compiles");
        let (lanes, group) = c.shape();
        if n <= 128 {
            assert!(group > 1, "rows of {n}: {group} a chunk of {lanes} lanes");
        }
        assert!(c.scratch_bytes() <= cpu::scratch_bytes(&k));
        let mut r = Rng(n as u64);
        let inputs: Vec<Vec<u8>> = k.inputs.iter().map(|i| data(&mut r, i)).collect();
        let refs: Vec<&[u8]> = inputs.iter().map(|d| d.as_slice()).collect();
        let want = cpu::run_buffers(&k, &refs).unwrap();
        for threads in [1, 2, 3] {
            let got = run_compiled(&k, &inputs, threads).unwrap();
            same(&k, &got, &want).unwrap();
        }
    }
}

#[test]
fn kernels_outside_the_compiled_subset_are_left_to_the_interpreter() {
    // An index, a bf16 input: `None`, so that the interpreter runs them.
    let mut k = layer_norm(8, 16, false, true);
    k.body.push(Inst::Index {
        axis: 1,
        dtype: DType::F32,
    });
    k.outputs.push(Output { value: 15 });
    assert!(Compiled::new(&k).is_none());
    let mut k = layer_norm(8, 16, false, true);
    k.inputs[1].dtype = DType::BF16;
    assert!(Compiled::new(&k).is_none());
}

/// [`column_sums`]'s body over `domain` reduced over `reduce` (the innermost axis kept):
/// `dy` and `xhat` contiguous, `w` one value per kept index.
fn interleaved_columns(domain: &[usize], reduce: &[usize], full: bool) -> FusedKernel {
    let mut k = column_sums(&[2], 2, full);
    let numel: usize = domain.iter().product();
    k.domain = domain.to_vec();
    k.reduce_axes = reduce.to_vec();
    let (w, kept) = kept_strides(domain, reduce);
    for i in &mut k.inputs[..2] {
        i.len = numel;
        i.access = Access::contiguous(domain);
    }
    k.inputs[2].len = kept;
    k.inputs[2].access.strides = w;
    k
}

#[test]
fn column_reductions_with_kept_axes_outside_their_columns_give_the_interpreters_bits_on_1_2_3_and_16_threads(
) {
    // Kept axes before the reduced ones (planes), reduced axes on both sides of a kept one,
    // more terms than a cascade level takes, more columns than a chunk holds.
    let cases: [(&[usize], &[usize]); 7] = [
        (&[2, 3, 4], &[1]),
        (&[5, 70, 3], &[1]),
        (&[3, 4, 5, 6], &[0, 2]),
        (&[4, 3, 2, 9, 5], &[1, 3]),
        (&[2, 600, 3], &[1]),
        (&[3, 2, 1500], &[1]),
        (&[16, 8, 2], &[0, 1]),
    ];
    for (domain, reduce) in cases {
        for (full, transposed) in [(false, false), (true, false), (false, true)] {
            let mut k = interleaved_columns(domain, reduce, full);
            if transposed {
                // `dy` stored with its last two axes swapped: the columns end where its
                // strides stop composing.
                let rank = domain.len();
                let mut dims = domain.to_vec();
                dims.swap(rank - 2, rank - 1);
                let mut s = Access::contiguous(&dims).strides;
                s.swap(rank - 2, rank - 1);
                k.inputs[0].access.strides = s;
            }
            k.check().unwrap();
            let c = Compiled::new(&k)
                .unwrap_or_else(|| panic!("{domain:?} reduced over {reduce:?} compiles"));
            assert!(c.is_columns(), "{domain:?} over {reduce:?}");
            assert!(c.scratch_bytes() <= cpu::scratch_bytes(&k));
            let kept: usize = (0..domain.len())
                .filter(|d| !reduce.contains(d))
                .map(|d| domain[d])
                .product();
            assert_eq!(c.rows(), kept, "every kept index is a column run apart");
            let (inputs, want) = inputs_and_want(
                &k,
                kept as u64 * 7 + u64::from(full) + 2 * u64::from(transposed),
            );
            let what = format!("{domain:?} over {reduce:?}");
            compiled_gives(&k, &inputs, &want, &[1, 2, 3, 16], &what);
        }
    }
}

/// Gradients of a bias and of a layer norm's weight: `dy` and `xhat` of shape
/// `[terms.., cols]` summed over the terms: `Σ dy`, `Σ dy·w·xhat` (`w` one value per
/// column), `max xhat`, and per-column values computed from them (`0.5 Σ dy·w·xhat`, plus `w`);
/// with `full`, also the full `dy·w·xhat`.
fn column_sums(terms: &[usize], cols: usize, full: bool) -> FusedKernel {
    let domain = [terms, &[cols]].concat();
    let mut b = KernelBuilder::new(&domain, &(0..terms.len()).collect::<Vec<_>>());
    let (dy, xhat) = (b.whole(DType::F32), b.whole(DType::F32));
    let w = b.input_at(DType::F32, 0, &[&vec![0; terms.len()][..], &[1]].concat());
    let (dy, xhat, w) = (b.load(dy), b.load(xhat), b.load(w));
    let dyw = b.mul(dy, w);
    let dywx = b.mul(dyw, xhat);
    let sum_dy = b.sum(dy);
    let sum_dywx = b.sum(dywx);
    let max_xhat = b.max(xhat);
    let half = b.konst(0.5);
    let halved = b.mul(sum_dywx, half);
    let plus_w = b.add(halved, w);
    b.outputs(&[sum_dy, halved, max_xhat, plus_w]);
    if full {
        b.out(dywx);
    }
    b.k
}

#[test]
fn column_sums_run_several_terms_a_chunk_with_the_interpreters_bits_on_1_2_and_3_threads() {
    // Rows of a bias gradient, batch × seq of a layer norm's, more terms than a cascade level
    // takes, more columns than a chunk holds, and a few of each.
    let shapes: [(&[usize], usize); 7] = [
        (&[512], 64),
        (&[8, 64], 64),
        (&[3], 5),
        (&[70], 3),
        (&[5000], 2),
        (&[100], 1500),
        (&[2, 3], 700),
    ];
    for (terms, cols) in shapes {
        for full in [false, true] {
            let k = column_sums(terms, cols, full);
            k.check().unwrap();
            let c = Compiled::new(&k).expect("a column reduction compiles");
            assert!(c.is_columns(), "{terms:?} x {cols}");
            assert!(c.scratch_bytes() <= cpu::scratch_bytes(&k));
            let (lanes, per_chunk) = c.shape();
            if cols <= 128 {
                assert!(
                    per_chunk > 1,
                    "{cols} columns: {per_chunk} terms a chunk of {lanes}"
                );
            }
            let (inputs, want) = inputs_and_want(&k, (cols * 31 + terms[0]) as u64);
            for threads in [1, 2, 3] {
                // A full output keeps the kernel whole (it is not cut along its columns).
                let cut = parts::cut(&k, threads, 1).map_or(1, |p| p.len());
                // Nor is a kernel of fewer than 4 columns (2 at least a piece).
                let cuts = threads > 1 && !full && cols >= 4;
                assert_eq!(cut > 1, cuts, "{terms:?} x {cols}");
                let got = run_compiled(&k, &inputs, threads).unwrap();
                same(&k, &got, &want).unwrap_or_else(|e| panic!("{threads} threads: {e}"));
            }
        }
    }
}

#[test]
fn running_a_compiled_kernel_allocates_nothing() {
    let k = layer_norm(512, 64, false, true);
    let c = Compiled::new(&k).unwrap();
    let mut r = Rng(7);
    let inputs: Vec<Vec<u8>> = k.inputs.iter().map(|i| data(&mut r, i)).collect();
    let (mut mem, ins, outs, s) = arena(&k, &inputs, c.scratch_bytes());
    c.run(&k, mem.as_mut_bytes(), &ins, &outs, s).unwrap();
    let n = allocations(|| {
        for _ in 0..3 {
            c.run(&k, mem.as_mut_bytes(), &ins, &outs, s).unwrap();
        }
    });
    assert_eq!(n, 0, "{n} allocations");
}
