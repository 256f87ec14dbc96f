//! Long sums and NaN in the generated CUDA kernels, on a GPU: a fused kernel's sum of 2^27 + 16
//! ones (one row, and columns) is exact, a sum of 2^27 random values agrees with an f64
//! reference to 1e-6, and max, min and reduce-max of a NaN give NaN. Without a GPU the tests
//! print why they skip and pass (with `INGOT_REQUIRE_GPU=1`, a missing GPU fails them).
//!
//! On a GPU machine without cargo, build here with `cargo test --release -p ingot-runtime
//! --test cuda_sums --no-run` and run the binary there.

use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use ingot_kernels::cuda::{self, CudaKernel};
use ingot_kernels::fused::{Access, FusedKernel, Input, Inst, Output};
use ingot_kernels::DType;
use ingot_runtime::cuda as rt;
use std::sync::Arc;

#[path = "../../kernels/tests/support/sum_kernels.rs"]
mod sum_kernels;
use sum_kernels::{max_min_and_reduce_max, sum_and_max};

/// Compiles `k` (with the prelude) for device 0 and runs it on `input`, returning every output.
fn run_on_gpu(k: &FusedKernel, input: &[f32]) -> Vec<Vec<f32>> {
    let code: CudaKernel = cuda::fused(k).unwrap();
    let ctx: Arc<CudaContext> = CudaContext::new(0).unwrap();
    let (major, minor) = ctx.compute_capability().unwrap();
    let arch: &'static str = Box::leak(format!("compute_{major}{minor}").into_boxed_str());
    // The prelude the step's module would get (the bf16 helpers where the kernel uses them).
    let src = format!("{}{}", cuda::prelude_for([&code]), code.source);
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(&src, opts)
        .unwrap_or_else(|e| panic!("NVRTC: {e:?}\n{}", code.source));
    let module = ctx.load_module(ptx).unwrap();
    let f = module.load_function(&code.name).unwrap();
    let stream = ctx.default_stream();
    let d_in = stream.clone_htod(input).unwrap();
    let mut outs: Vec<_> = (0..k.outputs.len())
        .map(|j| stream.alloc_zeros::<f32>(k.output_len(j).max(1)).unwrap())
        .collect();
    let l = code.launch;
    let cfg = LaunchConfig {
        grid_dim: (l.grid[0], l.grid[1], l.grid[2]),
        block_dim: (l.block[0], l.block[1], l.block[2]),
        shared_mem_bytes: l.shared_bytes,
    };
    let mut b = stream.launch_builder(&f);
    b.arg(&d_in);
    for o in outs.iter_mut() {
        b.arg(o);
    }
    // SAFETY: the kernel takes one input pointer and one pointer per output, each buffer as
    // long as the kernel's description says.
    unsafe { b.launch(cfg) }.unwrap();
    stream.synchronize().unwrap();
    outs.iter()
        .enumerate()
        .map(|(j, o)| {
            let mut v = stream.clone_dtoh(o).unwrap();
            v.truncate(k.output_len(j));
            v
        })
        .collect()
}

/// Every f32 exponent and sign with low halves at and around the bf16 tie, and random ones:
/// zeros, subnormals, the largest finite values (which round to infinity above the tie) and
/// the infinities.
fn rounding_cases() -> Vec<f32> {
    let mut v = Vec::new();
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    for high in 0u32..=0xffff {
        if (high & 0x7f80) == 0x7f80 && (high & 0x7f) != 0 {
            continue; // NaN
        }
        for low in [0u32, 1, 0x7fff, 0x8000, 0x8001, 0xffff] {
            v.push(f32::from_bits(high << 16 | low));
        }
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        if (high & 0x7f80) != 0x7f80 {
            v.push(f32::from_bits(high << 16 | (s as u32 & 0xffff)));
        }
    }
    v
}

#[test]
fn the_gpu_rounds_every_kind_of_float_to_bf16_as_the_host_does() {
    if !rt::gpu_for_test("the_gpu_rounds_every_kind_of_float_to_bf16_as_the_host_does") {
        return;
    }
    let x = rounding_cases();
    let k = FusedKernel {
        domain: vec![x.len()],
        reduce_axes: vec![],
        inputs: vec![Input {
            dtype: DType::F32,
            len: x.len(),
            access: Access::contiguous(&[x.len()]),
        }],
        body: vec![
            Inst::Load { input: 0 },
            Inst::Convert {
                x: 0,
                to: DType::BF16,
            },
            Inst::Convert {
                x: 1,
                to: DType::F32,
            },
        ],
        outputs: vec![Output { value: 2 }],
    };
    let got = &run_on_gpu(&k, &x)[0];
    let wrong: Vec<String> = x
        .iter()
        .zip(got)
        .filter(|(a, g)| ingot_kernels::dtype::round_bf16(**a).to_f32().to_bits() != g.to_bits())
        .take(5)
        .map(|(a, g)| format!("{:#010x} -> {:#010x}", a.to_bits(), g.to_bits()))
        .collect();
    assert!(wrong.is_empty(), "of {} floats: {wrong:?}", x.len());
}

fn random(n: usize) -> Vec<f32> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32
        })
        .collect()
}

#[test]
fn gpu_sums_of_2_pow_27_plus_terms_are_exact_for_ones_and_accurate_for_random_values() {
    if !rt::gpu_for_test(
        "gpu_sums_of_2_pow_27_plus_terms_are_exact_for_ones_and_accurate_for_random_values",
    ) {
        return;
    }
    let n = (1usize << 27) + 16;
    // One row (a block of threads, 2^17 terms each) and 16 columns of n / 16 (threads striding
    // over 2^23 + 1 rows).
    for (dims, axes) in [(vec![n], vec![0usize]), (vec![n / 16, 16], vec![0])] {
        let terms: usize = axes.iter().map(|&a| dims[a]).product();
        let k = sum_and_max(&dims, &axes);
        let out = run_on_gpu(&k, &vec![1.0f32; n]);
        for (i, &s) in out[0].iter().enumerate() {
            assert_eq!(s as f64, terms as f64, "{dims:?}: sum {i} of ones");
        }
        let x = random(n);
        let out = run_on_gpu(&k, &x);
        let cols = n / terms;
        for (i, &s) in out[0].iter().enumerate() {
            let want: f64 = x.iter().skip(i).step_by(cols).map(|&v| v as f64).sum();
            let rel = (s as f64 - want).abs() / want;
            assert!(
                rel <= 1e-6,
                "{dims:?}: sum {i} is {s}, f64 {want} ({rel:e})"
            );
            let max = x
                .iter()
                .skip(i)
                .step_by(cols)
                .fold(f32::MIN, |a, &v| a.max(v));
            assert_eq!(out[1][i], max, "{dims:?}: max {i}");
        }
    }
}

#[test]
fn gpu_max_min_and_reduce_max_of_nan_are_nan() {
    if !rt::gpu_for_test("gpu_max_min_and_reduce_max_of_nan_are_nan") {
        return;
    }
    let (r, c) = (64usize, 300usize);
    let mut x: Vec<f32> = (0..r * c).map(|i| (i % 97) as f32 - 48.0).collect();
    x[5 * c + 7] = f32::NAN;
    for axes in [vec![1usize], vec![0]] {
        let k = max_min_and_reduce_max(&[r, c], &axes, 0);
        let out = run_on_gpu(&k, &x);
        for (e, &v) in x.iter().enumerate() {
            assert_eq!(out[0][e].is_nan(), v.is_nan(), "max(x, 0) at {e}");
            assert_eq!(out[1][e].is_nan(), v.is_nan(), "min(x, 0) at {e}");
        }
        let nan_at = if axes == [1] { 5 } else { 7 };
        for (i, v) in out[2].iter().enumerate() {
            assert_eq!(
                v.is_nan(),
                i == nan_at,
                "reduce max over {axes:?} at {i}: {v}"
            );
        }
    }
}
