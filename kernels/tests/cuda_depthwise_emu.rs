//! The channels-last depthwise kernels (`ingot_kernels::cuda::depthwise`) run on the host: their
//! generated CUDA C, compiled by the host's C++ compiler and run block after block, each
//! block's threads as coroutines that meet at `__syncthreads` (`ingot_testkit::block_emu`),
//! computes each pass of the convolution as a plain f64 loop over the NHWC definition does:
//! strides, padding, dilation, channels that fill no whole tile of 32, 1x1 and 7x7 filters, in
//! f32 and bf16, the filter gradient over one pixel group and over many. Skips (saying so)
//! without a C++ compiler.

use ingot_kernels::cpu::conv::ConvGeometry;
use ingot_kernels::cuda::depthwise as dw;
use ingot_kernels::cuda::CudaKernel;
use ingot_kernels::DType;
use ingot_testkit::block_emu;

/// `(batch, channels, [h, w], [kh, kw], stride, padding, dilation)`.
type Case = (
    usize,
    usize,
    [usize; 2],
    [usize; 2],
    [usize; 2],
    [usize; 2],
    [usize; 2],
);

const CASES: [Case; 5] = [
    // ConvNeXt's block: 7x7, padding 3 (40 channels: a tile and a part).
    (2, 40, [9, 8], [7, 7], [1, 1], [3, 3], [1, 1]),
    // MobileNet's downsampling: 3x3, stride 2, padding 1.
    (3, 33, [7, 6], [3, 3], [2, 2], [1, 1], [1, 1]),
    // Dilated 3x2, uneven strides and paddings.
    (1, 5, [8, 9], [3, 2], [1, 2], [2, 0], [2, 3]),
    // 1x1, stride 2.
    (2, 64, [5, 5], [1, 1], [2, 2], [0, 0], [1, 1]),
    // 5x5 over a plane smaller than its window.
    (2, 3, [3, 4], [5, 5], [1, 1], [2, 2], [1, 1]),
];

fn geometry(c: &Case) -> ConvGeometry {
    let &(n, ch, hw, k, stride, padding, dilation) = c;
    ConvGeometry::new(
        [n, ch, hw[0], hw[1]],
        [ch, 1, k[0], k[1]],
        stride,
        padding,
        dilation,
        ch,
    )
    .unwrap()
}

/// For each output element `(n, oh, ow, c)` (channels-last order) and tap `(i, j)`, the input
/// element it reads (channels-last index), if inside the image.
fn taps(g: &ConvGeometry) -> Vec<(usize, usize, usize)> {
    let [h, w] = g.in_hw;
    let [ho, wo] = g.out_hw;
    let [kh, kw] = g.kernel;
    let ch = g.in_ch;
    let mut out = Vec::new();
    for n in 0..g.batch {
        for oh in 0..ho {
            for ow in 0..wo {
                for c in 0..ch {
                    let y = ((n * ho + oh) * wo + ow) * ch + c;
                    for i in 0..kh {
                        for j in 0..kw {
                            let ih =
                                (oh * g.stride[0] + i * g.dilation[0]) as i64 - g.padding[0] as i64;
                            let iw =
                                (ow * g.stride[1] + j * g.dilation[1]) as i64 - g.padding[1] as i64;
                            if ih < 0 || iw < 0 || ih >= h as i64 || iw >= w as i64 {
                                continue;
                            }
                            let x = ((n * h + ih as usize) * w + iw as usize) * ch + c;
                            out.push((y, x, c * kh * kw + i * kw + j));
                        }
                    }
                }
            }
        }
    }
    out
}

fn decode(d: DType, b: &[u8]) -> Vec<f64> {
    match d {
        DType::F32 => (b.chunks_exact(4))
            .map(|c| f64::from(f32::from_ne_bytes(c.try_into().unwrap())))
            .collect(),
        DType::BF16 => (b.chunks_exact(2))
            .map(|c| {
                let bits = u16::from_ne_bytes(c.try_into().unwrap());
                f64::from(f32::from_bits(u32::from(bits) << 16))
            })
            .collect(),
        d => panic!("no {d:?} here"),
    }
}

/// The three passes in f64: `y`, `dx`, `dw` and, for each, the sum of its terms' magnitudes.
struct Reference {
    y: Vec<(f64, f64)>,
    dx: Vec<(f64, f64)>,
    dw: Vec<(f64, f64)>,
}

fn reference(g: &ConvGeometry, x: &[f32], w: &[f32], dy: &[f32]) -> Reference {
    let [nx, nw, ny] = [
        g.batch * g.in_hw[0] * g.in_hw[1] * g.in_ch,
        g.in_ch * g.kernel[0] * g.kernel[1],
        g.batch * g.out_hw[0] * g.out_hw[1] * g.in_ch,
    ];
    let mut r = Reference {
        y: vec![(0.0, 0.0); ny],
        dx: vec![(0.0, 0.0); nx],
        dw: vec![(0.0, 0.0); nw],
    };
    let add = |v: &mut (f64, f64), t: f64| {
        v.0 += t;
        v.1 += t.abs();
    };
    for (yi, xi, wi) in taps(g) {
        add(&mut r.y[yi], f64::from(x[xi]) * f64::from(w[wi]));
        add(&mut r.dx[xi], f64::from(dy[yi]) * f64::from(w[wi]));
        add(&mut r.dw[wi], f64::from(dy[yi]) * f64::from(x[xi]));
    }
    r
}

/// Each emulated element within f32 summation error of the f64 sum (a bf16 result also within
/// one bf16 rounding of it).
fn assert_close(tag: &str, d: DType, got: &[f64], want: &[(f64, f64)]) {
    assert_eq!(got.len(), want.len(), "{tag}");
    for (e, (&a, &(v, mag))) in got.iter().zip(want).enumerate() {
        let mut tol = 1e-6 * mag + 1e-30;
        if d == DType::BF16 {
            tol += v.abs() / 256.0;
        }
        assert!(
            (a - v).abs() <= tol,
            "{tag} element {e}: emulated {a}, f64 {v} (tolerance {tol})"
        );
    }
}

fn run1(emu: &ingot_testkit::cxx::Emu, k: &CudaKernel, bufs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let args: Vec<(usize, usize)> = (0..bufs.len()).map(|i| (i, 0)).collect();
    block_emu::run(emu, k, bufs, &args)
}

#[test]
fn each_depthwise_pass_computes_the_f64_convolution_in_f32_and_bf16() {
    for (ci, case) in CASES.iter().enumerate() {
        let g = geometry(case);
        assert!(dw::runs(&g), "{g:?}");
        let [nx, nw, ny] = [
            g.batch * g.in_hw[0] * g.in_hw[1] * g.in_ch,
            g.in_ch * g.kernel[0] * g.kernel[1],
            g.batch * g.out_hw[0] * g.out_hw[1] * g.in_ch,
        ];
        let (x, w, dy) = (
            block_emu::values(nx, 11 + ci as u64),
            block_emu::values(nw, 23 + ci as u64),
            block_emu::values(ny, 37 + ci as u64),
        );
        let want = reference(&g, &x, &w, &dy);
        for d in [DType::F32, DType::BF16] {
            let tag = format!("case {ci} {d:?}");
            let fwd = dw::depthwise_forward(d, &g).unwrap();
            let gin = dw::depthwise_grad_input(d, &g).unwrap();
            // One pixel group (all partials in one), and as many as a roomy workspace holds.
            let many = dw::grad_weight_groups(d, &g, usize::MAX).unwrap();
            let part: Vec<CudaKernel> = [1, many]
                .iter()
                .map(|&q| dw::depthwise_grad_weight_partial(d, &g, q).unwrap())
                .collect();
            let sum: Vec<CudaKernel> = [1, many]
                .iter()
                .map(|&q| dw::depthwise_grad_weight_sum(d, &g, q).unwrap())
                .collect();
            let all = [&fwd, &gin, &part[0], &part[1], &sum[0], &sum[1]];
            let Some(emu) = block_emu::build(&format!("ingot_depthwise_{ci}_{d:?}"), all) else {
                return;
            };
            let e = d.size();
            let (bx, bw, bdy) = (
                block_emu::encode(d, &x),
                block_emu::encode(d, &w),
                block_emu::encode(d, &dy),
            );
            let out = run1(&emu, &fwd, &[bx.clone(), bw.clone(), vec![0xA5; ny * e]]);
            assert_close(&format!("{tag} forward"), d, &decode(d, &out[2]), &want.y);
            let out = run1(&emu, &gin, &[bdy.clone(), bw.clone(), vec![0xA5; nx * e]]);
            assert_close(
                &format!("{tag} grad input"),
                d,
                &decode(d, &out[2]),
                &want.dx,
            );
            for (i, &q) in [1, many].iter().enumerate() {
                // Partials start as NaN: a sum that reads one not written shows.
                let scratch: Vec<u8> = std::iter::repeat_n(f32::NAN.to_ne_bytes(), nw * q)
                    .flatten()
                    .collect();
                assert_eq!(
                    scratch.len(),
                    dw::depthwise_grad_weight_scratch_bytes(d, &g, q)
                );
                let out = run1(&emu, &part[i], &[bx.clone(), bdy.clone(), scratch]);
                let out = run1(&emu, &sum[i], &[out[2].clone(), vec![0xA5; nw * e]]);
                let tag = format!("{tag} grad weight over {q} groups");
                assert_close(&tag, d, &decode(d, &out[1]), &want.dw);
            }
            let _ = std::fs::remove_dir_all(emu.exe.parent().unwrap());
        }
    }
}

#[test]
fn the_filter_gradient_takes_as_many_pixel_groups_as_its_workspace_holds() {
    let g = geometry(&CASES[0]);
    let one = dw::depthwise_grad_weight_scratch_bytes(DType::BF16, &g, 1);
    assert_eq!(one, 40 * 49 * 4);
    assert_eq!(dw::grad_weight_groups(DType::BF16, &g, one - 1), None);
    assert_eq!(dw::grad_weight_groups(DType::BF16, &g, one), Some(1));
    assert_eq!(
        dw::grad_weight_groups(DType::BF16, &g, 3 * one + 5),
        Some(3)
    );
    // Never more groups than pixels in 8s (2 images of 9x8: 144 pixels, 18 groups).
    assert_eq!(
        dw::grad_weight_groups(DType::BF16, &g, usize::MAX),
        Some(18)
    );
    assert_eq!(
        dw::depthwise_grad_weight_scratch_bytes(DType::F64, &g, 1),
        2 * one
    );
}

#[test]
fn grouped_convolutions_that_are_not_depthwise_are_refused_with_an_error() {
    let g = ConvGeometry::new([2, 8, 5, 5], [8, 2, 3, 3], [1, 1], [1, 1], [1, 1], 4).unwrap();
    assert!(!dw::runs(&g));
    let e = dw::depthwise_forward(DType::F32, &g)
        .unwrap_err()
        .to_string();
    assert!(e.contains("depthwise_forward"), "{e}");
    let big = ConvGeometry::new([1, 4, 9, 9], [4, 1, 9, 9], [1, 1], [4, 4], [1, 1], 4).unwrap();
    assert!(!dw::runs(&big), "81 taps are more than the registers hold");
    assert!(dw::depthwise_grad_input(DType::I32, &geometry(&CASES[0])).is_err());
}
