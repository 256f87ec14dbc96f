//! A sum that reads a sum, taken apart into first-stage sums ([`ingot_kernels::fused::distribute`]):
//! batch norm's backward as autodiff writes it goes from two stages to one, the GPU's chain
//! from five launches to three, and the taken-apart kernel, run by the CPU interpreter, is as
//! close to an f64 run of the original as the original is. Sums the rule must keep are kept.

#[path = "support/bn_backward.rs"]
mod bn_backward;

use bn_backward::{autodiff_backward, Shape};
use ingot_kernels::cuda;
use ingot_kernels::fused::cpu::run_buffers;
use ingot_kernels::fused::distribute::{depth, distributed};
use ingot_kernels::fused::{FusedKernel, Inst};
use ingot_kernels::{BinaryOp, DType, UnaryOp};
use ingot_testkit::kernel_builder::KernelBuilder;

const NHWC: &[usize] = &[0, 1, 2];
const NCHW: &[usize] = &[0, 2, 3];

/// Deterministic values for [`autodiff_backward`]: full inputs `u` in [-1, 1), per-channel
/// ones in [0.5, 1.5) (an rstd, a gain, a sum of squares), the mask true on about a third;
/// `x` (input 3) and the mean (input 4) moved by `offset` (the mean by `offset + u/2`).
fn inputs(k: &FusedKernel, offset: f64) -> Vec<Vec<u8>> {
    let full: usize = k.domain.iter().product();
    let mut s = 0x2545f4914f6cdd1du64;
    let mut next = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 40) as f64 / (1u64 << 24) as f64) * 2.0 - 1.0
    };
    (k.inputs.iter().enumerate())
        .map(|(n, inp)| {
            let shift = if n == 3 || n == 4 { offset } else { 0.0 };
            let v: Vec<f64> = (0..inp.len)
                .map(|_| match inp.len < full {
                    true if n == 4 => shift + 0.5 * next(),
                    true => 1.0 + 0.5 * next(),
                    false => shift + next(),
                })
                .collect();
            match inp.dtype {
                DType::Bool => v.iter().map(|&x| u8::from(x < -0.33)).collect(),
                DType::F32 => v.iter().flat_map(|&x| (x as f32).to_ne_bytes()).collect(),
                DType::F64 => v.iter().flat_map(|&x| x.to_ne_bytes()).collect(),
                d => panic!("no {d:?} inputs here"),
            }
        })
        .collect()
}

fn decode(dtype: DType, b: &[u8]) -> Vec<f64> {
    match dtype {
        DType::F32 => (b.chunks_exact(4))
            .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]) as f64)
            .collect(),
        DType::F64 => (b.chunks_exact(8))
            .map(|c| f64::from_ne_bytes(c.try_into().unwrap()))
            .collect(),
        d => panic!("no {d:?} outputs here"),
    }
}

fn run(k: &FusedKernel, ins: &[Vec<u8>]) -> Vec<Vec<f64>> {
    let refs: Vec<&[u8]> = ins.iter().map(|x| &x[..]).collect();
    let out = run_buffers(k, &refs).unwrap();
    (out.iter().enumerate())
        .map(|(j, o)| decode(k.output_dtype(j), o))
        .collect()
}

/// The largest difference of `got` from `want`.
fn error(got: &[f64], want: &[f64]) -> f64 {
    got.iter()
        .zip(want)
        .fold(0f64, |m, (a, b)| m.max((a - b).abs()))
}

#[test]
fn batch_norms_autodiff_backward_takes_its_second_stage_sum_apart_into_first_stage_sums() {
    for axes in [NHWC, NCHW] {
        let dims = if axes == NHWC {
            [4, 6, 5, 8]
        } else {
            [4, 8, 6, 5]
        };
        let k = autodiff_backward(&Shape {
            dims,
            axes,
            t: DType::F32,
            bf16: true,
        });
        assert_eq!(depth(&k), 2, "Σdxc reads Σ(dy·γ·xc)");
        let d = distributed(&k).expect("taken apart");
        assert_eq!(depth(&d), 1);
        // One sum more than the first stage had (Σxc; Σdy is reused), none of the second's.
        let sums = |k: &FusedKernel| {
            (k.body.iter())
                .filter(|i| matches!(i, Inst::Reduce { .. }))
                .count()
        };
        assert_eq!(sums(&d), sums(&k), "Σdxc replaced by Σxc");
        assert_eq!((d.inputs.clone(), d.outputs.len()), (k.inputs.clone(), 5));
    }
}

/// The original kernel run in f32 and taken apart in f32, each against the original run in
/// f64 (the same inputs, exact in f32): the largest error of `dx`, the mean's gradient and the
/// sums, over inputs centred at 0 and far from it (a mean of 100, where `Σ(x − mean)` must not
/// be computed as `Σx − n·mean`).
#[test]
fn the_taken_apart_backward_is_as_close_to_f64_as_the_original() {
    for (axes, dims) in [(NHWC, [8, 7, 9, 16]), (NCHW, [8, 4, 15, 13])] {
        for offset in [0.0, 100.0] {
            let shape = |t| Shape {
                dims,
                axes,
                t,
                bf16: false,
            };
            let k32 = autodiff_backward(&shape(DType::F32));
            let k64 = autodiff_backward(&shape(DType::F64));
            let d32 = distributed(&k32).expect("taken apart");
            let ins32 = inputs(&k32, offset);
            let ins64 = inputs(&k64, offset);
            let (want, orig, new) = (run(&k64, &ins64), run(&k32, &ins32), run(&d32, &ins32));
            for j in 1..5 {
                let scale = want[j].iter().fold(1e-30f64, |m, v| m.max(v.abs()));
                let (e_orig, e_new) = (error(&orig[j], &want[j]), error(&new[j], &want[j]));
                eprintln!(
                    "{axes:?} offset {offset} output {j}: scale {scale:.3e} error original \
                     {e_orig:.3e} taken apart {e_new:.3e}"
                );
                // As close as the original, within a factor 2 and a few f32 roundings of the
                // output's largest magnitude (both errors are rounding noise).
                assert!(
                    e_new <= 2.0 * e_orig + 4.0 * f32::EPSILON as f64 * scale,
                    "{axes:?} offset {offset} output {j}: {e_new:e} against {e_orig:e}"
                );
            }
            // The mean's gradient is γ·rstd·Σdy/n up to rounding: Σ(x − mean)'s share is noise.
            assert!(
                error(&new[4], &want[4])
                    <= 1e-4 * want[4].iter().fold(1e-30, |m: f64, v| m.max(v.abs()))
            );
        }
    }
}

/// The CUDA chain of resnet50's 28x28x512 backward (channels-last) and of an NCHW one with
/// few channels: a partial kernel, its finish and `dx`, where the two stages took five.
#[test]
fn resnet50s_backward_runs_on_the_gpu_as_one_partial_one_finish_and_dx() {
    for (axes, dims) in [(NHWC, [128, 28, 28, 512]), (NCHW, [128, 64, 56, 56])] {
        let k = autodiff_backward(&Shape {
            dims,
            axes,
            t: DType::F32,
            bf16: true,
        });
        let p = cuda::fused_program(&k).unwrap();
        assert_eq!(p.launches.len(), 3, "{dims:?}");
        assert_eq!(cuda::fused_scratch_bytes(&k), p.scratch_bytes, "{dims:?}");
        let apply = &p.launches[2];
        assert!(apply.kernel.source.contains("(elementwise)"), "{dims:?}");
    }
}

/// A kernel over channels-last `[8, 6, 6, 4]` with `x`, `dy` (full) and a per-channel `mean`,
/// its first sums `Σdy` and `Σdy·x`, and `body` making the value whose sum is output 2 from
/// them (instructions: x, dy, mean, Σdy, Σdy·x).
fn second_stage(t: DType, body: impl Fn(&mut KernelBuilder, [usize; 5]) -> usize) -> FusedKernel {
    let mut b = KernelBuilder::new(&[8, 6, 6, 4], NHWC);
    let xi = b.whole(t);
    let x = b.load(xi);
    let di = b.whole(t);
    let dy = b.load(di);
    let mi = b.input_bcast(t, NHWC);
    let mean = b.load(mi);
    let s1 = b.sum(dy);
    let p = b.mul(dy, x);
    let s2 = b.sum(p);
    let v = body(&mut b, [x, dy, mean, s1, s2]);
    let s3 = b.sum(v);
    b.outputs(&[s1, s2, s3, v]).done()
}

#[test]
fn sums_that_are_not_linear_combinations_of_earlier_values_are_kept() {
    use BinaryOp::{Mul, Sub};
    let f32 = DType::F32;
    // Linear: Σ(dy·s2 − x·s1) = s2·Σdy − s1·Σx, taken apart.
    let linear = second_stage(f32, |b, [x, dy, _, s1, s2]| {
        let a = b.bin(Mul, dy, s2);
        let c = b.bin(Mul, x, s1);
        b.bin(Sub, a, c)
    });
    assert_eq!(depth(&linear), 2);
    assert_eq!(distributed(&linear).map(|d| depth(&d)), Some(1));
    // A row-level value subtracted from a full one: Σ(dy − s1/n) would be Σdy − s1, two nearly
    // equal numbers; kept.
    let centred = second_stage(f32, |b, [_, dy, _, s1, _]| {
        let n = b.konst(1.0 / 288.0);
        let m = b.bin(Mul, s1, n);
        b.bin(Sub, dy, m)
    });
    assert!(distributed(&centred).is_none(), "a row subtracted");
    // Not linear: exp of a value that reads a sum, a product of two full values.
    let exp = second_stage(f32, |b, [x, _, _, s1, _]| {
        let a = b.bin(Mul, x, s1);
        b.un(UnaryOp::Exp, a)
    });
    assert!(distributed(&exp).is_none(), "exp");
    let square = second_stage(f32, |b, [x, _, _, s1, _]| {
        let a = b.bin(Mul, x, s1);
        b.bin(Mul, a, a)
    });
    assert!(distributed(&square).is_none(), "a square");
    // A bf16 sum rounds: a combination of rounded sums is not it.
    let bf16 = second_stage(DType::BF16, |b, [x, _, _, _, s2]| b.bin(Mul, x, s2));
    assert!(distributed(&bf16).is_none(), "bf16");
    // One stage only: nothing to take apart.
    let first = second_stage(f32, |b, [x, _, mean, _, _]| b.bin(Sub, x, mean));
    assert_eq!(depth(&first), 1);
    assert!(distributed(&first).is_none(), "one stage");
}
