//! Convolutions of one-pixel images (a ResNet's last stage on 32x32 inputs, where 512
//! channels reach the 3x3 convolutions at 1x1): every window there holds the pixel at one tap
//! and padding at all the others, so one tap of the kernel is all that ever multiplies a value.
//! The im2col path ([`super::conv`]) builds a column buffer that is `kh·kw − 1` parts zeros
//! and runs GEMMs `kh·kw` times larger than the product (9x for a 3x3 kernel), one block of
//! images at a time; on 2 threads resnet18's three such convolutions took a fifth of its CPU
//! step (session 38, `docs/benchmarks.md`). Here each pass is one GEMM over the whole batch
//! that reads the live tap's weights in place, as a strided matrix of `w`:
//!
//! - forward: `y [N, O] = x [N, C] · W_tᵀ`, where `W_t [O, C] = w[:, :, th, tw]`;
//! - input gradient: `dx [N, C] = dy [N, O] · W_t`;
//! - weight gradient: `dw[:, :, th, tw] = dyᵀ [O, N] · x [N, C]`, every other tap zero.
//!
//! The input gradient sums the same products in the same order as the im2col path (its
//! reduction runs over the output channels either way), the other two drop the zero products
//! and so reassociate their sums: their bits differ from the im2col path's in the last
//! places. A weight at a dead tap is never read, so an infinite or NaN one there no longer
//! turns the products with the padding's zeros into NaN (as in PyTorch's direct
//! convolutions). Whether a convolution runs here is a function of its geometry alone
//! ([`live_tap`] and a product that fits in `super::conv::workspace_len`), so the planner's
//! workspace is unchanged and the planned step, the interpreter and any thread count agree to
//! the bit (the GEMM's sums depend on its reduction's length only).

use super::conv_geometry::{ConvError, ConvGeometry, Pass};
use super::gemm::{gemm_ws, workspace_len as gemm_len};
use super::matmul::{GemmScalar, MatLayout};

/// The index `th·kw + tw` of the one tap of `g`'s kernel that lands on the pixel, where every
/// image and output is one pixel, there is one group and the kernel has more than one tap
/// (a 1x1 kernel is already one GEMM an image); `None` otherwise. On a one-pixel axis tap `t`
/// reads input `t·dilation − padding`, so the live tap is `padding / dilation`, when that
/// divides and lies inside the kernel.
pub fn live_tap(g: &ConvGeometry) -> Option<usize> {
    if g.groups != 1 || g.in_hw != [1, 1] || g.out_hw != [1, 1] || g.kernel[0] * g.kernel[1] < 2 {
        return None;
    }
    let mut tap = [0; 2];
    for (a, t) in tap.iter_mut().enumerate() {
        let (p, d) = (g.padding[a], g.dilation[a]);
        if d == 0 || p % d != 0 || p / d >= g.kernel[a] {
            return None;
        }
        *t = p / d;
    }
    Some(tap[0] * g.kernel[1] + tap[1])
}

/// The GEMM `(m, k, n)` of `pass` over the whole batch.
fn product(g: &ConvGeometry, pass: Pass) -> (usize, usize, usize) {
    let (n, c, o) = (g.batch, g.in_ch, g.out_ch);
    match pass {
        Pass::Forward => (n, c, o),
        Pass::GradInput => (n, o, c),
        Pass::GradWeight => (o, n, c),
    }
}

/// The product of `pass` with its cut dimension (the images, rows of the forward and
/// input-gradient products; the input channels, columns of the weight gradient's) set to
/// `cut`: a GEMM's sums depend on its reduction's length only, so any cut gives the bits of
/// the whole product.
fn cut_product(g: &ConvGeometry, pass: Pass, cut: usize) -> (usize, usize, usize) {
    let (m, k, n) = product(g, pass);
    match pass {
        Pass::GradWeight => (m, k, cut.min(n)),
        _ => (cut.min(m), k, n),
    }
}

/// The largest cut ([`cut_product`]) whose GEMM packs within `len` elements (at least 1).
fn widest_cut<T: GemmScalar>(g: &ConvGeometry, pass: Pass, len: usize) -> usize {
    let full = match pass {
        Pass::GradWeight => g.in_ch,
        _ => g.batch,
    };
    let fits = |c: usize| {
        let (m, k, n) = cut_product(g, pass, c);
        gemm_len::<T>(m, k, n) <= len
    };
    let (mut lo, mut hi) = (1, full.max(1));
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// Elements of workspace `pass` of a one-pixel convolution ([`live_tap`]) needs: its one
/// GEMM's over the whole batch, which the planner gives it (`super::conv::workspace_len`
/// is this where there is a live tap; before session 39 it was the im2col path's least
/// workspace, and the pass ran here where one image's GEMM packed within that).
pub fn workspace_len<T: GemmScalar>(g: &ConvGeometry, pass: Pass) -> usize {
    let (m, k, n) = product(g, pass);
    gemm_len::<T>(m, k, n)
}

/// `W_t` (`[O, C]`) or its transpose, read in place from `w [O, C, kh, kw]`, from input
/// channel `c0` on.
fn tap_weights(g: &ConvGeometry, tap: usize, c0: usize, transposed: bool) -> MatLayout {
    let taps = g.kernel[0] * g.kernel[1];
    let (rows, cols) = (g.in_ch * taps, taps);
    MatLayout {
        offset: tap + c0 * taps,
        row_stride: if transposed { cols } else { rows },
        col_stride: if transposed { rows } else { cols },
    }
}

/// `pass` of `g` through its live tap `tap` ([`live_tap`]): `a` and `b` are the pass's
/// operands as [`super::conv::forward`], [`super::conv::grad_input`] and
/// [`super::conv::grad_weight`] take them, `out` its result; the caller has checked every
/// length, the workspace's included. The product runs in as few GEMMs as the workspace
/// holds (one in [`workspace_len`]), each over a run of images (or input channels), with
/// the same bits as one.
pub fn run<T: GemmScalar>(
    g: &ConvGeometry,
    pass: Pass,
    tap: usize,
    a: &[T],
    b: &[T],
    out: &mut [T],
    ws: &mut [T],
) -> Result<(), ConvError> {
    let (m, k, n) = product(g, pass);
    let cut = widest_cut::<T>(g, pass, ws.len());
    let (one, zero) = (<T as GemmScalar>::ONE, <T as GemmScalar>::ZERO);
    let rm = MatLayout::row_major;
    if pass == Pass::GradWeight {
        out.fill(zero);
    }
    let total = if pass == Pass::GradWeight { n } else { m };
    for s in (0..total).step_by(cut.max(1)) {
        let r = cut.min(total - s);
        match pass {
            // y = x · W_tᵀ (a = x, b = w) or dx = dy · W_t (a = dy, b = w), images s .. s + r.
            Pass::Forward | Pass::GradInput => gemm_ws(
                r,
                k,
                n,
                one,
                a,
                rm(k).at(s * k),
                b,
                tap_weights(g, tap, 0, pass == Pass::Forward),
                zero,
                out,
                rm(n).at(s * n),
                ws,
            ),
            // dw[:, s .. s + r, tap] = dyᵀ · x[:, s .. s + r] (a = x, b = dy), the dead taps
            // zero.
            Pass::GradWeight => gemm_ws(
                m,
                k,
                r,
                one,
                b,
                MatLayout::col_major(m),
                a,
                rm(n).at(s),
                zero,
                out,
                tap_weights(g, tap, s, false),
                ws,
            ),
        }?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::conv;

    fn values(n: usize, seed: u64) -> Vec<f64> {
        let mut g = ingot_testkit::lcg::Lcg::new(seed);
        (0..n).map(|_| g.unit53() * 2.0 - 1.0).collect()
    }

    /// One-pixel convolutions: 3x3 "same" (resnet18's last stage, smaller), 5x5 and 3x1
    /// kernels, strided ones whose live tap is off the centre (row 2, column 1) or at it, a
    /// dilated one, and enough channels and images to wake the GEMM's threads.
    fn geometries() -> Vec<ConvGeometry> {
        [
            ([6, 5, 1, 1], [4, 5, 3, 3], [1, 1], [1, 1], [1, 1]),
            ([3, 7, 1, 1], [9, 7, 5, 5], [1, 1], [2, 2], [1, 1]),
            ([4, 3, 1, 1], [2, 3, 3, 1], [1, 1], [1, 0], [1, 1]),
            ([5, 4, 1, 1], [3, 4, 3, 3], [3, 1], [2, 1], [1, 1]),
            ([5, 4, 1, 1], [3, 4, 3, 3], [2, 2], [1, 1], [1, 1]),
            ([3, 4, 1, 1], [3, 4, 3, 3], [1, 1], [2, 2], [2, 2]),
            ([70, 6, 1, 1], [5, 6, 3, 3], [1, 1], [1, 1], [1, 1]),
            ([128, 256, 1, 1], [256, 256, 3, 3], [1, 1], [1, 1], [1, 1]),
        ]
        .into_iter()
        .map(|(x, w, s, p, d)| ConvGeometry::new(x, w, s, p, d, 1).unwrap())
        .collect()
    }

    /// `dx` and `dw` by the definition, in f64: `dx[n, c, ih, iw] = Σ dy[n, o, i, j] ·
    /// w[o, c, a, b]` and `dw[o, c, a, b] = Σ dy[n, o, i, j] · x[n, c, ih, iw]` over the taps
    /// inside the image (`ih = i·s + a·d − p`), one pixel or not.
    fn reference_grads(g: &ConvGeometry, x: &[f64], w: &[f64], dy: &[f64]) -> [Vec<f64>; 2] {
        let [mut dx, mut dw] = [vec![0.0; x.len()], vec![0.0; w.len()]];
        let ([h, wd], [oh, ow], [kh, kw]) = (g.in_hw, g.out_hw, g.kernel);
        let c = g.in_ch;
        for (n, o, i, j, ci, a, b) in terms(g) {
            let ih = (i * g.stride[0] + a * g.dilation[0]) as isize - g.padding[0] as isize;
            let iw = (j * g.stride[1] + b * g.dilation[1]) as isize - g.padding[1] as isize;
            if ih < 0 || iw < 0 || ih as usize >= h || iw as usize >= wd {
                continue;
            }
            let xi = ((n * c + ci) * h + ih as usize) * wd + iw as usize;
            let wi = ((o * c + ci) * kh + a) * kw + b;
            let d = dy[((n * g.out_ch + o) * oh + i) * ow + j];
            dx[xi] += d * w[wi];
            dw[wi] += d * x[xi];
        }
        [dx, dw]
    }

    /// Every `(image, output channel, i, j, input channel, a, b)` of `g`.
    fn terms(
        g: &ConvGeometry,
    ) -> impl Iterator<Item = (usize, usize, usize, usize, usize, usize, usize)> + '_ {
        let ([oh, ow], [kh, kw]) = (g.out_hw, g.kernel);
        (0..g.batch).flat_map(move |n| {
            (0..g.out_ch).flat_map(move |o| {
                (0..oh * ow).flat_map(move |ij| {
                    (0..g.in_ch * kh * kw)
                        .map(move |r| (n, o, ij / ow, ij % ow, r / (kh * kw), r / kw % kh, r % kw))
                })
            })
        })
    }

    /// The three passes, each in its least workspace, inside a pool of `threads` (or none).
    fn passes<T: GemmScalar + crate::cpu::scalar::Float>(
        g: &ConvGeometry,
        x: &[T],
        w: &[T],
        dy: &[T],
        threads: usize,
    ) -> [Vec<T>; 3] {
        let ws = |pass| vec![<T as GemmScalar>::ZERO; conv::workspace_len::<T>(g, pass)];
        let junk = |len| vec![<T as GemmScalar>::ONE; len];
        let body = || {
            let [xl, wl, yl] = g.elements();
            let (mut y, mut dx, mut dw) = (junk(yl), junk(xl), junk(wl));
            conv::forward(g, x, w, &mut y, &mut ws(Pass::Forward)).unwrap();
            conv::grad_input(g, dy, w, &mut dx, &mut ws(Pass::GradInput)).unwrap();
            conv::grad_weight(g, x, dy, &mut dw, &mut ws(Pass::GradWeight)).unwrap();
            [y, dx, dw]
        };
        if threads == 0 {
            return body();
        }
        let pool = crate::cpu::par::pool_of(threads);
        pool.install(body)
    }

    #[test]
    fn one_pixel_passes_run_through_their_live_tap_and_match_the_definition_in_f64() {
        for g in geometries() {
            for pass in [Pass::Forward, Pass::GradInput, Pass::GradWeight] {
                assert!(live_tap(&g).is_some(), "{g:?} {pass:?}");
                let least = conv::workspace_len::<f32>(&g, pass);
                assert_eq!(least, workspace_len::<f32>(&g, pass), "{g:?} {pass:?}");
            }
            let [x, w, dy] = [0, 1, 2].map(|i| values(g.elements()[i], 20 + i as u64));
            let f32s = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<f32>>();
            let (x32, w32, dy32) = (f32s(&x), f32s(&w), f32s(&dy));
            let got64 = passes(&g, &x, &w, &dy, 0);
            let got32 = passes(&g, &x32, &w32, &dy32, 0);
            let [rdx, rdw] = reference_grads(&g, &x, &w, &dy);
            let want = [conv::reference(&g, &x, &w), rdx, rdw];
            for (i, name) in ["y", "dx", "dw"].into_iter().enumerate() {
                for ((a, b), c) in got64[i].iter().zip(&want[i]).zip(&got32[i]) {
                    assert!((a - b).abs() < 1e-12, "{g:?} {name}: {a} vs {b}");
                    assert!(
                        (*c as f64 - b).abs() < 1e-4,
                        "{g:?} {name} in f32: {c} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_weight_gradient_is_zero_at_every_dead_tap_and_dead_weights_are_never_read() {
        let g = geometries()[0];
        let tap = live_tap(&g).unwrap();
        assert_eq!(tap, 4, "a 3x3 same convolution's centre");
        let [x, mut w, dy] = [0, 1, 2].map(|i| values(g.elements()[i], 30 + i as u64));
        let want = passes(&g, &x, &w, &dy, 0);
        for (i, v) in w.iter_mut().enumerate() {
            if i % 9 != tap {
                *v = f64::NAN;
            }
        }
        let got = passes(&g, &x, &w, &dy, 0);
        assert_eq!(got[0], want[0], "y reads the live tap only");
        assert_eq!(got[1], want[1], "dx reads the live tap only");
        assert!(got[2]
            .iter()
            .enumerate()
            .all(|(i, &v)| i % 9 == tap || v.to_bits() == 0));
    }

    #[test]
    fn one_pixel_passes_give_the_same_bits_on_1_2_3_and_16_threads() {
        let f32s = |v: Vec<f64>| v.into_iter().map(|a| a as f32).collect::<Vec<f32>>();
        for g in geometries() {
            let [x, w, dy] = [0, 1, 2].map(|i| f32s(values(g.elements()[i], 40 + i as u64)));
            let bits = |t| {
                passes(&g, &x, &w, &dy, t)
                    .map(|v| v.iter().map(|a| a.to_bits()).collect::<Vec<_>>())
            };
            let want = bits(0);
            for threads in [1, 2, 3, 16] {
                assert!(bits(threads) == want, "{g:?}: {threads} threads");
            }
        }
    }

    /// One image's or one input channel's packing space (the least `run` takes) cuts every
    /// pass of the largest geometry into runs; more workspace, fewer and longer runs, up to
    /// the one GEMM of the planned workspace: the same bits in any.
    #[test]
    fn one_pixel_passes_give_the_same_bits_in_any_workspace() {
        let f32s = |v: Vec<f64>| v.into_iter().map(|a| a as f32).collect::<Vec<f32>>();
        let g = *geometries().last().unwrap();
        let [x, w, dy] = [0, 1, 2].map(|i| f32s(values(g.elements()[i], 60 + i as u64)));
        for pass in [Pass::Forward, Pass::GradInput, Pass::GradWeight] {
            let least = conv::workspace_len::<f32>(&g, pass);
            let (m, k, n) = product(&g, pass);
            let whole = gemm_len::<f32>(m, k, n);
            let (m1, k1, n1) = cut_product(&g, pass, 1);
            let one = gemm_len::<f32>(m1, k1, n1);
            assert!(widest_cut::<f32>(&g, pass, one) < g.batch.max(g.in_ch));
            let run_in = |len: usize| {
                let [xl, wl, yl] = g.elements();
                let (mut o, a, b) = match pass {
                    Pass::Forward => (vec![1f32; yl], &x, &w),
                    Pass::GradInput => (vec![1f32; xl], &dy, &w),
                    Pass::GradWeight => (vec![1f32; wl], &x, &dy),
                };
                let mut ws = vec![f32::NAN; len];
                run(&g, pass, 4, a, b, &mut o, &mut ws).unwrap();
                o.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            };
            let want = run_in(whole);
            for len in [
                one,
                one + 7,
                least,
                least + 1,
                (least + whole) / 2,
                whole + 3,
            ] {
                assert!(run_in(len) == want, "{pass:?} in {len} elements");
            }
        }
    }

    /// The input gradient's reduction runs over the output channels on both paths, one tap's
    /// products in the same order: the same bits as the im2col path's column buffer gives.
    #[test]
    fn the_input_gradient_gives_the_bits_of_the_im2col_path() {
        for g in geometries() {
            let tap = live_tap(&g).unwrap();
            let (o, c, taps) = (g.out_ch, g.in_ch, g.kernel[0] * g.kernel[1]);
            let w: Vec<f32> = values(g.elements()[1], 51)
                .iter()
                .map(|&v| v as f32)
                .collect();
            let dy: Vec<f32> = values(g.elements()[2], 52)
                .iter()
                .map(|&v| v as f32)
                .collect();
            let mut dx = vec![f32::NAN; g.elements()[0]];
            let mut ws = vec![0f32; conv::workspace_len::<f32>(&g, Pass::GradInput)];
            conv::grad_input(&g, &dy, &w, &mut dx, &mut ws).unwrap();
            // The im2col path: col [C·taps, N] = Wᵀ · dyᵀ, then the live tap's rows onto zeros.
            let mut col = vec![0f32; c * taps * g.batch];
            let mut gws = vec![0f32; gemm_len::<f32>(c * taps, o, g.batch)];
            gemm_ws(
                c * taps,
                o,
                g.batch,
                1.0,
                &w,
                MatLayout::col_major(c * taps),
                &dy,
                MatLayout::col_major(o),
                0.0,
                &mut col,
                MatLayout::row_major(g.batch),
                &mut gws,
            )
            .unwrap();
            for n in 0..g.batch {
                for ci in 0..c {
                    let want = 0f32 + col[(ci * taps + tap) * g.batch + n];
                    let got = 0f32 + dx[n * c + ci];
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{g:?} image {n} channel {ci}"
                    );
                }
            }
        }
    }

    #[test]
    fn only_one_pixel_single_group_kernels_with_a_tap_on_the_pixel_run_here() {
        let g = |x: [usize; 4], w: [usize; 4], s: usize, p: usize, d: usize, gr: usize| {
            ConvGeometry::new(x, w, [s, s], [p, p], [d, d], gr).unwrap()
        };
        assert_eq!(
            live_tap(&g([2, 4, 1, 1], [4, 4, 3, 3], 1, 1, 1, 1)),
            Some(4)
        );
        // Two pixels: every tap reads one of them somewhere.
        assert_eq!(live_tap(&g([2, 4, 2, 2], [4, 4, 3, 3], 1, 1, 1, 1)), None);
        // A 1x1 kernel is the pointwise path's already.
        assert_eq!(live_tap(&g([2, 4, 1, 1], [4, 4, 1, 1], 1, 0, 1, 1)), None);
        // Groups.
        assert_eq!(live_tap(&g([2, 4, 1, 1], [4, 2, 3, 3], 1, 1, 1, 2)), None);
        // Padding 3 with dilation 2: the pixel lies between two taps (every output is zero).
        assert_eq!(live_tap(&g([2, 4, 1, 1], [4, 4, 3, 3], 3, 3, 2, 1)), None);
        // resnet18's last stage at batch 128 runs here, planned one GEMM's workspace.
        let r = g([128, 512, 1, 1], [512, 512, 3, 3], 1, 1, 1, 1);
        assert_eq!(live_tap(&r), Some(4));
        for pass in [Pass::Forward, Pass::GradInput, Pass::GradWeight] {
            let (m, k, n) = product(&r, pass);
            assert_eq!(
                conv::workspace_len::<f32>(&r, pass),
                gemm_len::<f32>(m, k, n)
            );
        }
    }
}
