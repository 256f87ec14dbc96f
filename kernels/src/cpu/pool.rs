//! 2-d max pooling over NCHW (or channels-last, [`PoolGeometry::inner`]) images on the CPU,
//! forward and backward, by direct loops.
//!
//! Each window is scanned in row-major order and its element replaces the running maximum when
//! it is greater or NaN (PyTorch's `val > max || isnan(val)`): the first maximum wins, a NaN
//! wins over every number. Padding is −∞ and never picked; a window that lies entirely in the
//! padding gives −∞ and passes no gradient. The backward pass recomputes each window's pick
//! from `x` and adds the window's gradient there, windows in row-major order, so the result
//! repeats bit for bit and no index tensor is stored between the passes.

use super::par::for_each_block;
use super::scalar::{Float, Scalar};
use super::wide::{self, Wide};

/// The sizes of one pooling: `x [planes, in_hw]` (`planes` = N·C), `y [planes, out_hw]`,
/// each plane contiguous where `inner` is 1 (NCHW); channels-last where `inner` is the channel
/// count C: `x [N, in_hw, C]`, `y [N, out_hw, C]`, a plane's neighbouring elements `C` apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PoolGeometry {
    pub planes: usize,
    pub in_hw: [usize; 2],
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub out_hw: [usize; 2],
    /// 1 for NCHW; the channels, stored innermost, for channels-last (it divides `planes`).
    pub inner: usize,
}

impl PoolGeometry {
    fn x_len(&self) -> usize {
        self.planes * self.in_hw[0] * self.in_hw[1]
    }

    fn y_len(&self) -> usize {
        self.planes * self.out_hw[0] * self.out_hw[1]
    }

    /// The index in the plane of the element window `(i, j)` of plane block `x` picks, if any:
    /// its taps inside the plane in row-major order, each replacing the running pick when
    /// greater or NaN. The taps inside the plane are found per axis once per window
    /// ([`taps`]), not tested element by element; the first tap is compared with itself, which
    /// keeps it (a NaN replaces itself).
    #[inline]
    fn pick<T: Scalar>(&self, x: &[T], i: usize, j: usize) -> Option<usize> {
        let w = self.in_hw[1];
        let (rows, ih) = taps(i, self, 0);
        let (cols, iw) = taps(j, self, 1);
        if rows == 0 || cols == 0 {
            return None;
        }
        let mut best = ih * w + iw;
        let mut m = x[best];
        if self.dilation == [1, 1] && rows == 2 && cols == 2 {
            // A full 2x2 window (the common pooling): four reads in row-major order.
            for s in [best, best + 1, best + w, best + w + 1] {
                let v = x[s];
                if v > m || v.is_nan() {
                    (best, m) = (s, v);
                }
            }
            return Some(best);
        }
        let (dh, dw) = (self.dilation[0] * w, self.dilation[1]);
        let first = best;
        for a in 0..rows {
            let row = first + a * dh;
            for b in 0..cols {
                let s = row + b * dw;
                let v = x[s];
                if v > m || v.is_nan() {
                    (best, m) = (s, v);
                }
            }
        }
        Some(best)
    }

    /// [`PoolGeometry::pick`] in a channels-last image: element `s` of the plane is
    /// `x[s * inner]` (`x` starts at the plane's channel); the same taps in the same order, so
    /// the same pick.
    #[inline]
    fn pick_strided<T: Scalar>(&self, x: &[T], i: usize, j: usize) -> Option<usize> {
        let (w, c) = (self.in_hw[1], self.inner);
        let (rows, ih) = taps(i, self, 0);
        let (cols, iw) = taps(j, self, 1);
        if rows == 0 || cols == 0 {
            return None;
        }
        let first = ih * w + iw;
        let (mut best, mut m) = (first, x[first * c]);
        for a in 0..rows {
            for b in 0..cols {
                let s = first + a * self.dilation[0] * w + b * self.dilation[1];
                let v = x[s * c];
                if v > m || v.is_nan() {
                    (best, m) = (s, v);
                }
            }
        }
        Some(best)
    }

    /// Whether the layout is sound: `inner` at least 1 and dividing `planes`.
    fn check_inner(&self) -> Result<(), PoolError> {
        if self.inner >= 1 && self.planes.is_multiple_of(self.inner) {
            Ok(())
        } else {
            Err(PoolError {
                what: "the channels stored innermost",
                len: self.inner,
                need: self.planes,
            })
        }
    }
}

/// The taps of axis `axis` of output index `o` whose input index `o·stride + t·dilation −
/// padding` lies inside the plane: they are a run `lo .. lo + count`; returns `count` and the
/// input index of tap `lo` (0 when `count` is 0). A window inside the plane takes no division.
#[inline]
fn taps(o: usize, g: &PoolGeometry, axis: usize) -> (usize, usize) {
    let (k, s, d, p, n) = (
        g.kernel[axis],
        g.stride[axis],
        g.dilation[axis],
        g.padding[axis],
        g.in_hw[axis],
    );
    let at = o * s;
    if k == 0 || d == 0 {
        return (0, 0);
    }
    if at >= p && at + (k - 1) * d < n + p {
        return (k, at - p);
    }
    // Taps t with at + t·d >= p and at + t·d < n + p.
    let lo = if at >= p { 0 } else { (p - at).div_ceil(d) };
    let hi = if n + p > at {
        (n + p - at).div_ceil(d).min(k)
    } else {
        0
    };
    if lo >= hi {
        (0, 0)
    } else {
        (hi - lo, at + lo * d - p)
    }
}

/// Why a pooling call cannot run (before anything is written).
#[derive(Debug, thiserror::Error)]
#[error("max_pool2d: {what} has {len} elements, the geometry needs {need}")]
pub struct PoolError {
    pub what: &'static str,
    pub len: usize,
    pub need: usize,
}

fn check(what: &'static str, len: usize, need: usize) -> Result<(), PoolError> {
    if len == need {
        Ok(())
    } else {
        Err(PoolError { what, len, need })
    }
}

/// `y`: the max of each window of `x`.
pub fn max_forward<T: Float>(g: &PoolGeometry, x: &[T], y: &mut [T]) -> Result<(), PoolError> {
    check("x", x.len(), g.x_len())?;
    check("y", y.len(), g.y_len())?;
    g.check_inner()?;
    let (plane, [oh, ow]) = (g.in_hw[0] * g.in_hw[1], g.out_hw);
    let work = g.y_len() * g.kernel[0] * g.kernel[1];
    if g.inner > 1 {
        // Channels-last: a thread an image, each output pixel's channels in turn.
        let c = g.inner;
        for_each_block(y, oh * ow * c, work, |n, yn| {
            let xn = &x[n * plane * c..(n + 1) * plane * c];
            for o in 0..oh * ow {
                for ch in 0..c {
                    yn[o * c + ch] = match g.pick_strided(&xn[ch..], o / ow, o % ow) {
                        Some(s) => xn[s * c + ch],
                        None => T::LOWEST,
                    };
                }
            }
        });
        return Ok(());
    }
    if halves(g) {
        for_each_block(y, oh * ow, work, |p, yp| {
            let xp = &x[p * plane..(p + 1) * plane];
            wide::widest(Halve { g, xp, yp });
        });
        return Ok(());
    }
    // Planes are independent: each thread writes the output planes of its own.
    for_each_block(y, oh * ow, work, |p, yp| {
        let xp = &x[p * plane..(p + 1) * plane];
        for i in 0..oh {
            for j in 0..ow {
                yp[i * ow + j] = match g.pick(xp, i, j) {
                    Some(s) => xp[s],
                    None => T::LOWEST,
                };
            }
        }
    });
    Ok(())
}

/// Whether `g` is the common pooling that halves each side (2x2 windows, stride 2, no padding
/// or dilation, every window inside the plane), which [`Halve`] computes without the general
/// path's per-window bookkeeping.
fn halves(g: &PoolGeometry) -> bool {
    g.kernel == [2, 2]
        && g.stride == [2, 2]
        && g.padding == [0, 0]
        && g.dilation == [1, 1]
        && 2 * g.out_hw[0] <= g.in_hw[0]
        && 2 * g.out_hw[1] <= g.in_hw[1]
}

/// A 2x2 window's maximum and its index (0 to 3, row-major) from its top row `a` and bottom
/// row `b`: the four read in row-major order, each replacing the running maximum when greater
/// or NaN, as [`PoolGeometry::pick`] does. What [`Halve`] stores and [`HalveBack`] routes to.
#[inline(always)]
fn halve_pick<T: Float>(a: &[T], b: &[T]) -> (T, usize) {
    let (mut m, mut k) = (a[0], 0);
    for (q, v) in [a[1], b[0], b[1]].into_iter().enumerate() {
        if v > m || v.is_nan() {
            (m, k) = (v, q + 1);
        }
    }
    (m, k)
}

/// One plane of a pooling that [`halves`]: each output the maximum of its 2x2 window, the
/// four read in row-major order and each replacing the running maximum when greater or NaN,
/// as [`PoolGeometry::pick`] does (so the same bits, NaNs and signed zeros included), as a
/// loop over a row's windows that is compiled for the widest vectors ([`super::wide`]).
struct Halve<'a, T> {
    g: &'a PoolGeometry,
    xp: &'a [T],
    yp: &'a mut [T],
}

impl<T: Float> Wide for Halve<'_, T> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let (w, [oh, ow]) = (self.g.in_hw[1], self.g.out_hw);
        for (i, yr) in self.yp.chunks_exact_mut(ow).take(oh).enumerate() {
            let r0 = &self.xp[2 * i * w..][..2 * ow];
            let r1 = &self.xp[(2 * i + 1) * w..][..2 * ow];
            for ((y, a), b) in yr
                .iter_mut()
                .zip(r0.chunks_exact(2))
                .zip(r1.chunks_exact(2))
            {
                *y = halve_pick(a, b).0;
            }
        }
    }
}

/// One plane of the gradient of a pooling that [`halves`], whose windows do not overlap:
/// each window's `0 + dy` (what the general path's add onto a zeroed plane gives, `-0.0`
/// made `+0.0` as there) at the element [`Halve`]'s order picks, zero at its other three
/// and in the rows and columns no window covers; one pass over the plane, as a loop over a
/// row's windows compiled for the widest vectors, where the general path zeroes the plane,
/// then finds each window's pick again through its per-window bookkeeping (2.5 GB/s on
/// cnn's first pooling, session 37).
struct HalveBack<'a, T> {
    g: &'a PoolGeometry,
    xp: &'a [T],
    dyp: &'a [T],
    dxp: &'a mut [T],
}

impl<T: Float> Wide for HalveBack<'_, T> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let (w, [oh, ow]) = (self.g.in_hw[1], self.g.out_hw);
        let (rows, rest) = self.dxp.split_at_mut(2 * oh * w);
        rest.fill(T::ZERO);
        for (i, pair) in rows.chunks_exact_mut(2 * w).enumerate() {
            let (top, bottom) = pair.split_at_mut(w);
            top[2 * ow..].fill(T::ZERO);
            bottom[2 * ow..].fill(T::ZERO);
            let r0 = &self.xp[2 * i * w..][..2 * ow];
            let r1 = &self.xp[(2 * i + 1) * w..][..2 * ow];
            let dyr = &self.dyp[i * ow..][..ow];
            let windows = r0.chunks_exact(2).zip(r1.chunks_exact(2));
            let outs = top.chunks_exact_mut(2).zip(bottom.chunks_exact_mut(2));
            for ((d, (a, b)), (t, u)) in dyr.iter().zip(windows).zip(outs) {
                let k = halve_pick(a, b).1;
                let d = T::ZERO.add(*d);
                let at = |q: usize| if k == q { d } else { T::ZERO };
                (t[0], t[1], u[0], u[1]) = (at(0), at(1), at(2), at(3));
            }
        }
    }
}

/// `dx`: each window's `dy` added at the element [`max_forward`] picked.
pub fn max_backward<T: Float>(
    g: &PoolGeometry,
    x: &[T],
    dy: &[T],
    dx: &mut [T],
) -> Result<(), PoolError> {
    check("x", x.len(), g.x_len())?;
    check("dy", dy.len(), g.y_len())?;
    check("dx", dx.len(), g.x_len())?;
    g.check_inner()?;
    let (plane, [oh, ow]) = (g.in_hw[0] * g.in_hw[1], g.out_hw);
    let work = g.y_len() * g.kernel[0] * g.kernel[1];
    if g.inner > 1 {
        // Channels-last: each element's windows add in row-major order, as NCHW's.
        let c = g.inner;
        for_each_block(dx, plane * c, work, |n, dxn| {
            dxn.fill(T::ZERO);
            let xn = &x[n * plane * c..(n + 1) * plane * c];
            let dyn_ = &dy[n * oh * ow * c..(n + 1) * oh * ow * c];
            for o in 0..oh * ow {
                for ch in 0..c {
                    if let Some(s) = g.pick_strided(&xn[ch..], o / ow, o % ow) {
                        dxn[s * c + ch] = dxn[s * c + ch].add(dyn_[o * c + ch]);
                    }
                }
            }
        });
        return Ok(());
    }
    if halves(g) {
        for_each_block(dx, plane, work, |p, dxp| {
            let xp = &x[p * plane..(p + 1) * plane];
            let dyp = &dy[p * oh * ow..(p + 1) * oh * ow];
            wide::widest(HalveBack { g, xp, dyp, dxp });
        });
        return Ok(());
    }
    // A plane's windows add into that plane only, in row-major order as on one thread.
    for_each_block(dx, plane, work, |p, dxp| {
        dxp.fill(T::ZERO);
        let xp = &x[p * plane..(p + 1) * plane];
        for i in 0..oh {
            for j in 0..ow {
                if let Some(s) = g.pick(xp, i, j) {
                    dxp[s] = dxp[s].add(dy[(p * oh + i) * ow + j]);
                }
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::wide::Level;

    fn geometry() -> PoolGeometry {
        PoolGeometry {
            planes: 2,
            in_hw: [4, 5],
            kernel: [3, 3],
            stride: [2, 2],
            padding: [1, 1],
            dilation: [1, 1],
            out_hw: [2, 3],
            inner: 1,
        }
    }

    #[test]
    fn halving_pools_give_the_general_paths_bits_with_nans_and_signed_zeros() {
        for (h, w) in [(28, 28), (14, 14), (7, 9), (2, 2)] {
            let g = PoolGeometry {
                planes: 3,
                in_hw: [h, w],
                kernel: [2, 2],
                stride: [2, 2],
                padding: [0, 0],
                dilation: [1, 1],
                out_hw: [h / 2, w / 2],
                inner: 1,
            };
            assert!(halves(&g));
            let special = [0.0, -0.0, f32::NAN, 1.5, -1.5, f32::INFINITY, 1.5];
            let x: Vec<f32> = (0..3 * h * w)
                .map(|i| match (i * 7919) % 23 {
                    k if k < special.len() => special[k],
                    k => k as f32 * 0.25 - 3.0,
                })
                .collect();
            let plane = h * w;
            let want: Vec<f32> = (0..3)
                .flat_map(|p| {
                    let xp = &x[p * plane..(p + 1) * plane];
                    (0..g.out_hw[0] * g.out_hw[1])
                        .map(move |o| xp[g.pick(xp, o / g.out_hw[1], o % g.out_hw[1]).unwrap()])
                })
                .collect();
            for level in [Level::Base, Level::Avx2, Level::Avx512] {
                let mut y = vec![7.0f32; want.len()];
                for (p, yp) in y.chunks_exact_mut(g.out_hw[0] * g.out_hw[1]).enumerate() {
                    let xp = &x[p * plane..(p + 1) * plane];
                    wide::at(level, Halve { g: &g, xp, yp });
                }
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&y), bits(&want), "{h}x{w} at {level:?}");
            }
            let mut y = vec![7.0f32; want.len()];
            max_forward(&g, &x, &mut y).unwrap();
            assert!(y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }

    #[test]
    fn halving_pools_gradients_give_the_general_paths_bits_with_nans_and_signed_zeros() {
        for (h, w) in [(28, 28), (14, 14), (7, 9), (2, 2), (3, 2)] {
            let g = PoolGeometry {
                planes: 3,
                in_hw: [h, w],
                kernel: [2, 2],
                stride: [2, 2],
                padding: [0, 0],
                dilation: [1, 1],
                out_hw: [h / 2, w / 2],
                inner: 1,
            };
            let special = [0.0, -0.0, f32::NAN, 1.5, -1.5, f32::INFINITY, 1.5];
            let x: Vec<f32> = (0..3 * h * w)
                .map(|i| match (i * 7919) % 23 {
                    k if k < special.len() => special[k],
                    k => k as f32 * 0.25 - 3.0,
                })
                .collect();
            let (plane, outs) = (h * w, g.out_hw[0] * g.out_hw[1]);
            let dy: Vec<f32> = (0..3 * outs)
                .map(|i| {
                    if i % 5 == 0 {
                        -0.0
                    } else {
                        i as f32 * 0.375 - 2.0
                    }
                })
                .collect();
            // The general path: each window's pick, found again, takes `0 + dy`.
            let mut want = vec![0f32; x.len()];
            for p in 0..3 {
                let xp = &x[p * plane..(p + 1) * plane];
                for o in 0..outs {
                    let s = g.pick(xp, o / g.out_hw[1], o % g.out_hw[1]).unwrap();
                    want[p * plane + s] += dy[p * outs + o];
                }
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for level in [Level::Base, Level::Avx2, Level::Avx512] {
                let mut dx = vec![7.0f32; x.len()];
                for (p, dxp) in dx.chunks_exact_mut(plane).enumerate() {
                    let (xp, dyp) = (&x[p * plane..][..plane], &dy[p * outs..][..outs]);
                    wide::at(
                        level,
                        HalveBack {
                            g: &g,
                            xp,
                            dyp,
                            dxp,
                        },
                    );
                }
                assert_eq!(bits(&dx), bits(&want), "{h}x{w} at {level:?}");
            }
            let mut dx = vec![7.0f32; x.len()];
            max_backward(&g, &x, &dy, &mut dx).unwrap();
            assert_eq!(bits(&dx), bits(&want), "{h}x{w}");
        }
    }

    #[test]
    fn max_pooling_picks_the_first_maximum_and_lets_nan_win() {
        let g = geometry();
        let mut x = vec![0.0f32; 40];
        x[0] = 5.0;
        x[1] = 5.0; // a tie with x[0] in window (0, 0): the first (x[0]) is picked
        x[2] = 6.0; // beats x[1] in window (0, 1)
        x[20 + 6] = f32::NAN;
        let mut y = vec![0.0f32; 12];
        max_forward(&g, &x, &mut y).unwrap();
        assert_eq!(y[0], 5.0);
        assert!(y[6].is_nan(), "the NaN's window gives NaN");
        let dy = vec![1.0f32; 12];
        let mut dx = vec![9.0f32; 40];
        max_backward(&g, &x, &dy, &mut dx).unwrap();
        assert_eq!(dx[0], 1.0, "the first of the tie takes the gradient");
        assert_eq!(dx[1], 0.0);
        assert!(dx[20 + 6] >= 1.0, "the NaN takes its windows' gradients");
    }

    /// The pick as it was first written: every tap of the window tested against the plane,
    /// an `Option` per element (the reference the per-axis runs of taps are checked against).
    fn pick_by_scan(g: &PoolGeometry, x: &[f32], i: usize, j: usize) -> Option<usize> {
        let [h, w] = g.in_hw;
        let mut best: Option<(usize, f32)> = None;
        for a in 0..g.kernel[0] {
            let ih = (i * g.stride[0] + a * g.dilation[0]).wrapping_sub(g.padding[0]);
            for b in 0..g.kernel[1] {
                let iw = (j * g.stride[1] + b * g.dilation[1]).wrapping_sub(g.padding[1]);
                if ih >= h || iw >= w {
                    continue;
                }
                let v = x[ih * w + iw];
                if best.is_none_or(|(_, m)| v > m || v.is_nan()) {
                    best = Some((ih * w + iw, v));
                }
            }
        }
        best.map(|(s, _)| s)
    }

    /// Every window of kernels 1 to 4, strides 1 to 3, padding up to 2 and dilation 1 to 2
    /// over planes of 1 to 9 rows and columns (values with ties and NaNs) picks the element the
    /// element-by-element scan picks, and both passes give its bits.
    #[test]
    fn runs_of_taps_pick_what_a_scan_of_every_tap_picks() {
        let mut seed = 7u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            (seed >> 33) as usize
        };
        for k in 1..5 {
            for stride in 1..4 {
                for pad in 0..3 {
                    for dil in 1..3 {
                        for (h, w) in [(1, 1), (2, 3), (5, 4), (9, 7), (8, 8)] {
                            let span = |n: usize| (n + 2 * pad).checked_sub(dil * (k - 1) + 1);
                            let (Some(sh), Some(sw)) = (span(h), span(w)) else {
                                continue;
                            };
                            let g = PoolGeometry {
                                planes: 2,
                                in_hw: [h, w],
                                kernel: [k, k],
                                stride: [stride, stride],
                                padding: [pad, pad],
                                dilation: [dil, dil],
                                out_hw: [sh / stride + 1, sw / stride + 1],
                                inner: 1,
                            };
                            let x: Vec<f32> = (0..g.x_len())
                                .map(|_| match next() % 9 {
                                    0 => f32::NAN,
                                    r => (r % 4) as f32 - 1.5,
                                })
                                .collect();
                            let dy: Vec<f32> =
                                (0..g.y_len()).map(|_| next() as f32 / 7e8).collect();
                            let plane = h * w;
                            let (mut want_y, mut want_dx) =
                                (vec![0f32; g.y_len()], vec![0f32; g.x_len()]);
                            for p in 0..g.planes {
                                let xp = &x[p * plane..(p + 1) * plane];
                                for i in 0..g.out_hw[0] {
                                    for j in 0..g.out_hw[1] {
                                        let o = (p * g.out_hw[0] + i) * g.out_hw[1] + j;
                                        let picked = pick_by_scan(&g, xp, i, j);
                                        assert_eq!(g.pick(xp, i, j), picked, "{g:?} ({i}, {j})");
                                        want_y[o] = picked.map_or(f32::NEG_INFINITY, |s| xp[s]);
                                        if let Some(s) = picked {
                                            want_dx[p * plane + s] += dy[o];
                                        }
                                    }
                                }
                            }
                            let (mut y, mut dx) = (vec![0f32; g.y_len()], vec![9f32; g.x_len()]);
                            max_forward(&g, &x, &mut y).unwrap();
                            max_backward(&g, &x, &dy, &mut dx).unwrap();
                            let bits =
                                |v: &[f32]| v.iter().map(|a| a.to_bits()).collect::<Vec<_>>();
                            assert_eq!(bits(&y), bits(&want_y), "{g:?}");
                            assert_eq!(bits(&dx), bits(&want_dx), "{g:?}");
                        }
                    }
                }
            }
        }
    }

    /// `[n, c, hw]` stored as `[n, hw, c]`.
    fn to_nhwc(v: &[f32], n: usize, c: usize, hw: usize) -> Vec<f32> {
        let mut out = vec![0f32; v.len()];
        for i in 0..n {
            for ch in 0..c {
                for s in 0..hw {
                    out[(i * hw + s) * c + ch] = v[(i * c + ch) * hw + s];
                }
            }
        }
        out
    }

    /// A channels-last pooling (`inner` = C) computes, element for element and bit for bit,
    /// the NCHW pooling of the same image (ties, NaNs, padding, dilation, the halving window).
    #[test]
    fn channels_last_pooling_gives_the_nchw_poolings_bits() {
        let (n, c) = (2, 5);
        for (hw, k, s, p, d) in [
            ([7, 6], [3, 3], [2, 2], [1, 1], [1, 1]),
            ([8, 8], [2, 2], [2, 2], [0, 0], [1, 1]),
            ([9, 7], [2, 3], [1, 2], [1, 0], [2, 1]),
        ] {
            let out = |a: usize| (hw[a] + 2 * p[a] - d[a] * (k[a] - 1) - 1) / s[a] + 1;
            let g = PoolGeometry {
                planes: n * c,
                in_hw: hw,
                kernel: k,
                stride: s,
                padding: p,
                dilation: d,
                out_hw: [out(0), out(1)],
                inner: 1,
            };
            let x: Vec<f32> = (0..g.x_len())
                .map(|i| match (i * 7919) % 13 {
                    0 => f32::NAN,
                    r => (r % 5) as f32 - 2.0,
                })
                .collect();
            let dy: Vec<f32> = (0..g.y_len()).map(|i| i as f32 * 0.125 - 3.0).collect();
            let (mut y, mut dx) = (vec![0f32; g.y_len()], vec![0f32; g.x_len()]);
            max_forward(&g, &x, &mut y).unwrap();
            max_backward(&g, &x, &dy, &mut dx).unwrap();
            let last = PoolGeometry { inner: c, ..g };
            let (hwi, hwo) = (hw[0] * hw[1], g.out_hw[0] * g.out_hw[1]);
            let (xl, dyl) = (to_nhwc(&x, n, c, hwi), to_nhwc(&dy, n, c, hwo));
            let (mut yl, mut dxl) = (vec![7f32; g.y_len()], vec![7f32; g.x_len()]);
            max_forward(&last, &xl, &mut yl).unwrap();
            max_backward(&last, &xl, &dyl, &mut dxl).unwrap();
            let bits = |v: &[f32]| v.iter().map(|a| a.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&yl), bits(&to_nhwc(&y, n, c, hwo)), "{last:?}");
            assert_eq!(bits(&dxl), bits(&to_nhwc(&dx, n, c, hwi)), "{last:?}");
        }
        let bad = PoolGeometry {
            inner: 3,
            ..geometry()
        };
        let err = max_forward(&bad, &[0f32; 40], &mut [0f32; 12]).unwrap_err();
        assert!(err.to_string().contains("innermost"), "{err}");
    }

    #[test]
    fn the_gradient_of_each_window_lands_once() {
        // With distinct values, the gradients sum to the sum of dy.
        let g = geometry();
        let x: Vec<f64> = (0..40).map(|i| ((i * 37) % 41) as f64).collect();
        let dy: Vec<f64> = (0..12).map(|i| i as f64 + 1.0).collect();
        let mut dx = vec![0.0; 40];
        max_backward(&g, &x, &dy, &mut dx).unwrap();
        assert_eq!(dx.iter().sum::<f64>(), dy.iter().sum::<f64>());
    }
}
