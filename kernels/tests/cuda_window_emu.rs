//! The window kernels (im2col, col2im, `dy` side by side, max pooling) run on the host: their
//! generated CUDA C, compiled by the host's C++ compiler with a grid of blocks of threads run
//! one after another (the kernels are grid-stride loops with no barriers, so any order is a
//! valid schedule), computes what the CPU's convolution and pooling compute.
//!
//! The convolution checks go through the chunked layout the CUDA lowering uses: the column
//! buffer `[g, K, S·P]` of `S` images at a time, multiplied here by plain f64 loops standing
//! in for cuBLAS. So this checks the kernels' index arithmetic and the layout algebra
//! without a GPU; trainer/tests/cuda_conv.rs checks whole steps on the device. Skips (saying
//! so) without a C++ compiler.

use ingot_kernels::cpu::conv::{self, ConvGeometry, Pass};
use ingot_kernels::cpu::pool::{self, PoolGeometry};
use ingot_kernels::cuda::window as w;
use ingot_kernels::cuda::{CudaKernel, PRELUDE_BF16};
use ingot_kernels::dtype::bf16;
use ingot_kernels::DType;
use ingot_testkit::cxx::{self, Emu};

const SHIM: &str = r#"#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utility>
#include <vector>
"#;

/// The rest of the shim, after [`cxx::CUDA_ON_HOST`].
const SHIM_REST: &str = r#"struct Dim3 { unsigned x = 0, y = 0, z = 0; };
static Dim3 threadIdx, blockIdx, gridDim;
typedef void (*Runner)(void**);
template <typename... A, size_t... I> static void call_impl(void (*f)(A...), void** b, std::index_sequence<I...>) { f((A)b[I]...); }
template <typename... A> static void call(void (*f)(A...), void** b) { call_impl(f, b, std::index_sequence_for<A...>{}); }
"#;

/// argv[1]: the kernel's index; stdin: grid, block, buffer count, then each buffer (length,
/// bytes); stdout: every buffer after the run.
const MAIN: &str = r#"
static unsigned long long rd() { unsigned long long x; if (fread(&x, 8, 1, stdin) != 1) exit(4); return x; }
int main(int argc, char** argv) {
  if (argc < 2) return 1;
  const int which = atoi(argv[1]);
  const unsigned long long grid = rd(), block = rd(), n = rd();
  std::vector<std::vector<unsigned char>> bufs(n);
  std::vector<void*> ptrs(n);
  for (unsigned long long i = 0; i < n; ++i) {
    bufs[i].resize(rd());
    if (fread(bufs[i].data(), 1, bufs[i].size(), stdin) != bufs[i].size()) return 5;
    ptrs[i] = bufs[i].data();
  }
  gridDim.x = (unsigned)grid;
  for (unsigned long long b = 0; b < grid; ++b)
    for (unsigned long long t = 0; t < block; ++t) {
      blockIdx.x = (unsigned)b; threadIdx.x = (unsigned)t;
      KERNELS[which](ptrs.data());
    }
  for (unsigned long long i = 0; i < n; ++i) fwrite(bufs[i].data(), 1, bufs[i].size(), stdout);
  return 0;
}
"#;

/// The emulation of `kernels`; `None` (after saying so) without a C++ compiler.
fn build(tag: &str, kernels: &[&CudaKernel]) -> Option<Emu> {
    let cxx = cxx::host_cxx_or_skip()?;
    let head = format!("{SHIM}{}{SHIM_REST}{PRELUDE_BF16}", cxx::CUDA_ON_HOST);
    let dir = format!("ingot_window_emu_{tag}");
    let emu = Emu::build(cxx, &dir, &head, kernels.iter().copied(), MAIN);
    Some(emu.unwrap_or_else(|e| panic!("the window kernels do not compile on the host: {e}")))
}

/// Runs `k` over `bufs` (in parameter order); returns the buffers afterwards.
fn run(emu: &Emu, k: &CudaKernel, bufs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    cxx::split_like(&emu.run(k, cxx::launch_input(k, bufs)), bufs)
}

/// Deterministic values in [-1, 1) (exact in f32).
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut g = ingot_testkit::lcg::Lcg::new(seed);
    (0..n).map(|_| g.unit24() * 2.0 - 1.0).collect()
}

fn f32_bytes(xs: &[f64]) -> Vec<u8> {
    xs.iter().flat_map(|&x| (x as f32).to_ne_bytes()).collect()
}

fn f32s(b: &[u8]) -> Vec<f64> {
    b.chunks(4)
        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()) as f64)
        .collect()
}

fn geometry() -> ConvGeometry {
    // Two groups, uneven stride and dilation, padding on one axis, four images in chunks of 2.
    ConvGeometry::new([4, 4, 7, 6], [6, 2, 3, 2], [2, 1], [1, 0], [1, 2], 2).unwrap()
}

const S: usize = 2;

fn close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}");
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-12);
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= tol * scale,
            "{what}[{i}]: {a} against {b} (scale {scale})"
        );
    }
}

/// The column buffer of images `c·S ..` of `x`, by the emulated im2col.
fn columns(emu: &Emu, k: &CudaKernel, g: &ConvGeometry, x: &[f64], c: usize) -> Vec<f64> {
    let image = g.in_ch * g.in_hw[0] * g.in_hw[1];
    let chunk = &x[c * S * image..(c + 1) * S * image];
    let out = run(
        emu,
        k,
        &[f32_bytes(chunk), vec![0; w::column_len(g, S) * 4]],
    );
    f32s(&out[1])
}

#[test]
fn im2col_then_the_chunked_gemm_is_the_convolution() {
    let g = geometry();
    let k = w::im2col(DType::F32, &g, S).unwrap();
    let Some(emu) = build("forward", &[&k]) else {
        return;
    };
    let x = values(g.batch * g.in_ch * g.in_hw[0] * g.in_hw[1], 1);
    let wt = values(g.out_ch * g.col_rows(), 2);
    let (kk, p, og) = (g.col_rows(), g.positions(), g.out_ch / g.groups);
    let mut y = vec![0.0; g.batch * g.out_ch * p];
    for c in 0..g.batch / S {
        let col = columns(&emu, &k, &g, &x, c);
        for s in 0..S {
            for gi in 0..g.groups {
                for o in 0..og {
                    for q in 0..p {
                        let mut acc = 0.0;
                        for r in 0..kk {
                            acc +=
                                wt[(gi * og + o) * kk + r] * col[(gi * kk + r) * S * p + s * p + q];
                        }
                        y[((c * S + s) * g.out_ch + gi * og + o) * p + q] = acc;
                    }
                }
            }
        }
    }
    close("y", &y, &conv::reference(&g, &x, &wt), 1e-12);
}

#[test]
fn the_transposed_gemm_then_col2im_is_the_input_gradient() {
    let g = geometry();
    let k = w::col2im(DType::F32, &g, S).unwrap();
    let Some(emu) = build("grad_input", &[&k]) else {
        return;
    };
    let (kk, p, og) = (g.col_rows(), g.positions(), g.out_ch / g.groups);
    let dy = values(g.batch * g.out_ch * p, 3);
    let wt = values(g.out_ch * kk, 4);
    let image = g.in_ch * g.in_hw[0] * g.in_hw[1];
    let mut dx = Vec::new();
    for c in 0..g.batch / S {
        let mut col = vec![0.0; w::column_len(&g, S)];
        for s in 0..S {
            for gi in 0..g.groups {
                for r in 0..kk {
                    for q in 0..p {
                        let mut acc = 0.0;
                        for o in 0..og {
                            acc += wt[(gi * og + o) * kk + r]
                                * dy[((c * S + s) * g.out_ch + gi * og + o) * p + q];
                        }
                        col[(gi * kk + r) * S * p + s * p + q] = acc;
                    }
                }
            }
        }
        let out = run(&emu, &k, &[f32_bytes(&col), vec![0; S * image * 4]]);
        dx.extend(f32s(&out[1]));
    }
    let mut want = vec![0.0; g.batch * image];
    let mut ws = vec![0.0; conv::workspace_len::<f64>(&g, Pass::GradInput)];
    conv::grad_input::<f64>(&g, &dy, &wt, &mut want, &mut ws).unwrap();
    // The columns were rounded to f32 once, and col2im sums in f32.
    close("dx", &dx, &want, 1e-6);
}

#[test]
fn im2col_with_dy_side_by_side_and_accumulated_chunks_is_the_weight_gradient() {
    let g = geometry();
    let (kk, p, og) = (g.col_rows(), g.positions(), g.out_ch / g.groups);
    let ki = w::im2col(DType::F32, &g, S).unwrap();
    let ks = w::images_side_by_side(DType::F32, S, g.out_ch, p).unwrap();
    let Some(emu) = build("grad_weight", &[&ki, &ks]) else {
        return;
    };
    let x = values(g.batch * g.in_ch * g.in_hw[0] * g.in_hw[1], 5);
    let dy = values(g.batch * g.out_ch * p, 6);
    let mut dw = vec![0.0; g.out_ch * kk];
    for c in 0..g.batch / S {
        let col = columns(&emu, &ki, &g, &x, c);
        let chunk = &dy[c * S * g.out_ch * p..(c + 1) * S * g.out_ch * p];
        let side = f32s(&run(&emu, &ks, &[f32_bytes(chunk), vec![0; chunk.len() * 4]])[1]);
        for gi in 0..g.groups {
            for o in 0..og {
                for r in 0..kk {
                    let mut acc = 0.0;
                    for q in 0..S * p {
                        acc += side[(gi * og + o) * S * p + q] * col[(gi * kk + r) * S * p + q];
                    }
                    dw[(gi * og + o) * kk + r] += acc;
                }
            }
        }
    }
    let mut want = vec![0.0; g.out_ch * kk];
    let mut ws = vec![0.0; conv::workspace_len::<f64>(&g, Pass::GradWeight)];
    conv::grad_weight::<f64>(&g, &x, &dy, &mut want, &mut ws).unwrap();
    close("dw", &dw, &want, 1e-12);
}

fn pools() -> Vec<PoolGeometry> {
    type P = [usize; 2];
    let mk = |in_hw: P, kernel: P, stride: P, padding: P, dilation: P| {
        let out = |i: usize| {
            (in_hw[i] + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1) / stride[i] + 1
        };
        PoolGeometry {
            planes: 3,
            in_hw,
            kernel,
            stride,
            padding,
            dilation,
            out_hw: [out(0), out(1)],
            inner: 1,
        }
    };
    let mut pools = vec![
        mk([6, 6], [2, 2], [2, 2], [0, 0], [1, 1]),
        mk([7, 5], [3, 3], [2, 2], [1, 1], [1, 1]),
        mk([9, 8], [3, 2], [1, 2], [1, 0], [2, 1]),
        // A ResNet stem's pooling (3x3, stride 2, padding 1) over an even side, where windows
        // overlap and the last one reaches into the padding.
        mk([8, 10], [3, 3], [2, 2], [1, 1], [1, 1]),
        // Windows wholly in the padding on one axis (they pick nothing: 255).
        mk([3, 4], [2, 2], [1, 1], [2, 2], [1, 1]),
        // A stride longer than the window: elements no window reads (their gradient is 0),
        // blocks of 3x3 elements, the last ones cut by the plane's edge.
        mk([10, 11], [2, 2], [3, 3], [1, 1], [1, 1]),
        // Blocks of 5x4 elements, more than a thread of the blocked gradient owns: the
        // per-element gradient runs.
        mk([11, 12], [2, 3], [5, 4], [0, 0], [1, 1]),
    ];
    // Channels-last (two images of three channels, a pixel's channels side by side): the
    // halving pooling, the stem's, windows in the padding, and the per-element gradient.
    for i in [0, 3, 4, 6] {
        pools.push(PoolGeometry {
            planes: 6,
            inner: 3,
            ..pools[i]
        });
    }
    pools
}

/// Values with ties and NaNs, so that "the first maximum wins, a NaN wins" is exercised.
fn pool_input(n: usize, seed: u64) -> Vec<f64> {
    values(n, seed)
        .into_iter()
        .enumerate()
        .map(|(i, v)| match i % 17 {
            3 => f64::NAN,
            5 | 6 => 0.5,
            _ => (v * 4.0).round() / 4.0,
        })
        .collect()
}

#[test]
fn max_pooling_and_its_gradient_alone_or_from_picks_are_the_cpus_bit_for_bit() {
    for (i, g) in pools().iter().enumerate() {
        for d in [DType::F32, DType::BF16] {
            let (kf, kb) = (
                w::max_pool2d(d, g).unwrap(),
                w::max_pool2d_grad(d, g).unwrap(),
            );
            let (kp, kg) = (
                w::max_pool2d_pick(d, g).unwrap(),
                w::max_pool2d_grad_picked(d, g).unwrap(),
            );
            // The lowering's gradient from picks is the blocked one wherever a block is small.
            let blocked = g.stride[0] * g.stride[1] <= w::MAX_BLOCK_ELEMENTS;
            assert_eq!(
                kg.source.contains("a thread a block of"),
                blocked,
                "pool {i}"
            );
            let ke = w::max_pool2d_grad_per_element(d, g).unwrap();
            assert_eq!(kg == ke, !blocked, "pool {i}");
            let mut kernels = vec![&kf, &kb, &kp, &kg];
            if blocked {
                kernels.push(&ke);
            }
            let Some(emu) = build(&format!("pool{i}{d:?}"), &kernels) else {
                return;
            };
            let picks = w::pool_pick_bytes(g).unwrap();
            assert_eq!(picks, g.planes * g.out_hw[0] * g.out_hw[1]);
            // The gradient in two kernels: each window's pick, then the gradient from the
            // picks (what the lowering runs where the picks are planned), by the lowering's
            // kernel and by the per-element one; both must be the CPU's.
            let picked = |x: Vec<u8>, dy: Vec<u8>, e: usize| {
                let nx = g.planes * g.in_hw[0] * g.in_hw[1];
                let p = run(&emu, &kp, &[x, vec![7; picks]]).swap_remove(1);
                // dx starts as garbage: every element must be written.
                let dx = run(&emu, &kg, &[p.clone(), dy.clone(), vec![0xab; nx * e]]);
                let each = run(&emu, &ke, &[p, dy, vec![0xab; nx * e]]).swap_remove(2);
                assert_eq!(dx[2], each, "pool {i}: blocked and per-element gradients");
                dx[2].clone()
            };
            let nx = g.planes * g.in_hw[0] * g.in_hw[1];
            let ny = g.planes * g.out_hw[0] * g.out_hw[1];
            let x = pool_input(nx, 7 + i as u64);
            let dy = values(ny, 8 + i as u64);
            match d {
                DType::F32 => {
                    let (xf, dyf): (Vec<f32>, Vec<f32>) = (
                        x.iter().map(|&v| v as f32).collect(),
                        dy.iter().map(|&v| v as f32).collect(),
                    );
                    let mut y = vec![0f32; ny];
                    pool::max_forward(g, &xf, &mut y).unwrap();
                    let mut dx = vec![0f32; nx];
                    pool::max_backward(g, &xf, &dyf, &mut dx).unwrap();
                    let out = run(&emu, &kf, &[f32_bytes(&x), vec![0; ny * 4]]);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    let got = |b: &[u8]| {
                        b.chunks(4)
                            .map(|c| u32::from_ne_bytes(c.try_into().unwrap()))
                            .collect::<Vec<_>>()
                    };
                    assert_eq!(got(&out[1]), bits(&y), "pool {i} f32 forward");
                    let out = run(&emu, &kb, &[f32_bytes(&x), f32_bytes(&dy), vec![0; nx * 4]]);
                    assert_eq!(got(&out[2]), bits(&dx), "pool {i} f32 backward");
                    let two = picked(f32_bytes(&x), f32_bytes(&dy), 4);
                    assert_eq!(got(&two), bits(&dx), "pool {i} f32 backward from picks");
                }
                _ => {
                    // The CPU runs a bf16 window op as the f32 op on widened operands, its
                    // result rounded once.
                    let h = |v: &[f64]| v.iter().map(|&x| bf16::from_f64(x)).collect::<Vec<_>>();
                    let (xb, dyb) = (h(&x), h(&dy));
                    let wide = |v: &[bf16]| v.iter().map(|x| x.to_f32()).collect::<Vec<f32>>();
                    let bytes = |v: &[bf16]| {
                        v.iter()
                            .flat_map(|x| x.to_bits().to_ne_bytes())
                            .collect::<Vec<u8>>()
                    };
                    let got = |b: &[u8]| {
                        b.chunks(2)
                            .map(|c| u16::from_ne_bytes(c.try_into().unwrap()))
                            .collect::<Vec<_>>()
                    };
                    let rounded = |v: &[f32]| {
                        v.iter()
                            .map(|&x| bf16::from_f32(x).to_bits())
                            .collect::<Vec<_>>()
                    };
                    let mut y = vec![0f32; ny];
                    pool::max_forward(g, &wide(&xb), &mut y).unwrap();
                    let mut dx = vec![0f32; nx];
                    pool::max_backward(g, &wide(&xb), &wide(&dyb), &mut dx).unwrap();
                    let out = run(&emu, &kf, &[bytes(&xb), vec![0; ny * 2]]);
                    assert_eq!(got(&out[1]), rounded(&y), "pool {i} bf16 forward");
                    let out = run(&emu, &kb, &[bytes(&xb), bytes(&dyb), vec![0; nx * 2]]);
                    assert_eq!(got(&out[2]), rounded(&dx), "pool {i} bf16 backward");
                    let two = picked(bytes(&xb), bytes(&dyb), 2);
                    assert_eq!(got(&two), rounded(&dx), "pool {i} bf16 backward from picks");
                }
            }
        }
    }
}
