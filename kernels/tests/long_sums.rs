//! Sums past 2^24 and 2^27 terms, on the unfused reduction ([`cpu::reduce`], which the CPU
//! executor calls) and in fused kernels ([`fused::cpu::run`]): the sum of ones is exact, a sum
//! of random values agrees with an f64 reference to a tight relative bound, and the fused kernel
//! gives the unfused op's bits. Every shape takes each path where a plain f32 accumulation
//! fails (an accumulator stuck at 2^24): one long run, many runs per output, long runs of
//! several blocks, and a column sum (the innermost axis kept).
//!
//! One buffer of 2^27 + 2^14 f32 (512 MiB) serves every shape, so the file holds one test.

use ingot_kernels::cpu::{self, ReduceKind};
use ingot_kernels::fused::{self, Access, FusedKernel, Input, Inst, Output};
use ingot_kernels::{BinaryOp, DType, ReduceOp};
use zerocopy::IntoBytes;

#[path = "support/sum_kernels.rs"]
mod sum_kernels;
use sum_kernels::sum_and_max;

/// A shape, its reduced axes, and what the shape exercises.
struct Case {
    dims: &'static [usize],
    axes: &'static [usize],
    what: &'static str,
}

const CASES: [Case; 4] = [
    Case {
        dims: &[(1 << 27) + 16],
        axes: &[0],
        what: "one run of 2^27 + 16 (16385 blocks)",
    },
    Case {
        dims: &[16385, 2, 4096],
        axes: &[0, 2],
        what: "16385 runs of 4096 per output",
    },
    Case {
        dims: &[3, 2, (1 << 24) + 8],
        axes: &[0, 2],
        what: "3 runs of 2^24 + 8 per output",
    },
    Case {
        // 2^21 + 1 terms a column: a plain f32 sum of as many random values is off by ~1e-4.
        dims: &[2097153, 64],
        axes: &[0],
        what: "columns of 2^21 + 1 terms",
    },
];

fn numel(d: &[usize]) -> usize {
    d.iter().product()
}

/// `sum` and `mean = sum · (1/n)` of the input over `axes`, as one fused kernel.
fn kernel(dims: &[usize], axes: &[usize]) -> FusedKernel {
    let n: usize = axes.iter().map(|&a| dims[a]).product();
    FusedKernel {
        domain: dims.to_vec(),
        reduce_axes: axes.to_vec(),
        inputs: vec![Input {
            dtype: DType::F32,
            len: numel(dims),
            access: Access::contiguous(dims),
        }],
        body: vec![
            Inst::Load { input: 0 },
            Inst::Reduce {
                op: ReduceOp::Sum,
                x: 0,
            },
            Inst::Const {
                value: 1.0 / n as f64,
                dtype: DType::F32,
            },
            Inst::binary(BinaryOp::Mul, 1, 2),
        ],
        outputs: vec![Output { value: 1 }, Output { value: 3 }],
    }
}

/// The f64 sums of `x` over `axes`, outputs in row-major order: for every index of the outer
/// axes (all but the last), the last axis's elements added into their outputs.
fn reference(x: &[f32], dims: &[usize], axes: &[usize]) -> Vec<f64> {
    let r = dims.len();
    let red = |d: usize| axes.contains(&d);
    let out_dims: Vec<usize> = (0..r).map(|d| if red(d) { 1 } else { dims[d] }).collect();
    let mut out = vec![0f64; numel(&out_dims)];
    let inner = dims[r - 1];
    let mut idx = vec![0usize; r - 1];
    for row in x.chunks_exact(inner) {
        let o = (0..r - 1).fold(0, |o, d| o * out_dims[d] + if red(d) { 0 } else { idx[d] });
        if red(r - 1) {
            out[o] += row.iter().map(|&v| v as f64).sum::<f64>();
        } else {
            for (w, &v) in out[o * inner..(o + 1) * inner].iter_mut().zip(row) {
                *w += v as f64;
            }
        }
        for d in (0..r - 1).rev() {
            idx[d] += 1;
            if idx[d] < dims[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

/// The unfused sums and the fused kernel's (sum, mean) of the first `numel(dims)` elements of
/// `mem` (whose tail is the fused kernel's output and scratch space).
fn sums(mem: &mut [f32], dims: &[usize], axes: &[usize]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let n_in = numel(dims);
    let n_out = n_in / axes.iter().map(|&a| dims[a]).product::<usize>();
    let mut unfused = vec![f32::NAN; n_out];
    cpu::reduce(ReduceKind::Sum, &mem[..n_in], dims, axes, &mut unfused);

    let k = kernel(dims, axes);
    let out0 = (n_in * 4).next_multiple_of(256);
    let out1 = out0 + (n_out * 4).next_multiple_of(256);
    let scratch = out1 + (n_out * 4).next_multiple_of(256);
    let need = scratch + fused::cpu::scratch_bytes(&k);
    assert!(
        need <= mem.len() * 4,
        "the buffer is too small for {dims:?}"
    );
    let bytes = mem.as_mut_bytes();
    fused::cpu::run(&k, bytes, &[0], &[out0, out1], scratch).unwrap();
    let read = |at: usize| -> Vec<f32> {
        bytes[at..at + n_out * 4]
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    (unfused, read(out0), read(out1))
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Element `i` of the random data: uniform in [0, 1), from a hash of `i` (so any range can be
/// refilled after a kernel wrote over it).
fn random(i: usize) -> f32 {
    let mut z = (i as u64)
        .wrapping_add(1)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 40) as f32 / (1u64 << 24) as f32
}

#[test]
fn sums_past_2_pow_27_are_exact_for_ones_accurate_for_random_values_and_fused_as_unfused() {
    let len = CASES.iter().map(|c| numel(c.dims)).max().unwrap() + (1 << 16);
    let mut mem = vec![1f32; len];
    for c in &CASES {
        let n: usize = c.axes.iter().map(|&a| c.dims[a]).product();
        let (unfused, fsum, fmean) = sums(&mut mem, c.dims, c.axes);
        for (i, (&u, &f)) in unfused.iter().zip(&fsum).enumerate() {
            assert_eq!(u as f64, n as f64, "{}: unfused sum {i} of ones", c.what);
            assert_eq!(f as f64, n as f64, "{}: fused sum {i} of ones", c.what);
        }
        for &m in &fmean {
            assert!(
                (m as f64 - 1.0).abs() <= 1e-6,
                "{}: mean of ones {m}",
                c.what
            );
        }
        // The kernel wrote its outputs and scratch after the input.
        mem[numel(c.dims)..].fill(1.0);
    }

    // Random values in [0, 1): a plain f32 sum of 2^27 of them is off by more than 10%.
    for (i, v) in mem.iter_mut().enumerate() {
        *v = random(i);
    }
    for c in &CASES {
        let n_in = numel(c.dims);
        let want = reference(&mem[..n_in], c.dims, c.axes);
        let (unfused, fsum, _) = sums(&mut mem, c.dims, c.axes);
        assert_eq!(
            bits(&unfused),
            bits(&fsum),
            "{}: the fused kernel must give the unfused bits",
            c.what
        );
        for (i, (&u, &w)) in unfused.iter().zip(&want).enumerate() {
            let rel = (u as f64 - w).abs() / w;
            assert!(
                rel <= 1e-6,
                "{}: sum {i} is {u}, the f64 sum {w} (relative error {rel:e})",
                c.what
            );
        }
        for (i, v) in mem.iter_mut().enumerate().skip(n_in) {
            *v = random(i);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The generated CUDA C: a thread that adds more than 1024 terms of a float sum blocks them.

const BLOCKED: &str = "float sums in blocks of 1024 terms a thread";

#[test]
fn a_cuda_thread_with_a_long_share_of_a_row_sums_it_in_blocks() {
    // One row of 2^27 + 16: 1024 threads, 2^17 terms each.
    let k = ingot_kernels::cuda::fused(&sum_and_max(&[(1 << 27) + 16], &[0])).unwrap();
    let src = &k.source;
    assert!(src.contains(BLOCKED), "{src}");
    // The block's sum goes into a second accumulator, that one into the total every 1024
    // blocks; the max accumulates directly.
    assert!(src.contains("s1 = s1 + v0;"), "{src}");
    assert!(src.contains("m1 = m1 + s1;"), "{src}");
    assert!(
        src.contains("if (++nb1 == 1024u) { a1 = a1 + m1; m1 = 0.0f; nb1 = 0u; }"),
        "{src}"
    );
    assert!(src.contains("a1 = a1 + m1;"), "{src}");
    assert!(src.contains("a2 = ig_keep_max(a2, v0);"), "{src}");
    assert!(!src.contains("a1 = a1 + v0;"), "{src}");
    // 64-bit index arithmetic for a row this long? The row fits 32 bits: the block's end is
    // computed without overflow (n - jb > span).
    assert!(src.contains("- jb >"), "{src}");
}

#[test]
fn a_cuda_column_sum_over_many_rows_is_blocked_and_short_ones_are_not() {
    let long = ingot_kernels::cuda::fused(&sum_and_max(&[1 << 22, 64], &[0])).unwrap();
    assert!(long.source.contains(BLOCKED), "{}", long.source);
    // The reference models' sums (a bias gradient over 8 × 1024 rows, a softmax row of 50257)
    // give each thread at most 1024 terms: their kernels keep the plain loop.
    for (dims, axes) in [
        (&[8192usize, 768][..], &[0usize][..]),
        (&[8192, 50257][..], &[1][..]),
        (&[64, 1024][..], &[1][..]),
    ] {
        let k = ingot_kernels::cuda::fused(&sum_and_max(dims, axes)).unwrap();
        assert!(!k.source.contains(BLOCKED), "{dims:?}: {}", k.source);
    }
}
