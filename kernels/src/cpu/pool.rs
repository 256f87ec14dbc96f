//! 2-d max pooling over NCHW images on the CPU, forward and backward, by direct loops.
//!
//! Each window is scanned in row-major order and its element replaces the running maximum when
//! it is greater or NaN (PyTorch's `val > max || isnan(val)`): the first maximum wins, a NaN
//! wins over every number. Padding is −∞ and never picked; a window that lies entirely in the
//! padding gives −∞ and passes no gradient. The backward pass recomputes each window's pick
//! from `x` and adds the window's gradient there, windows in row-major order, so the result
//! repeats bit for bit and no index tensor is stored between the passes.

use super::par::for_each_block;
use super::scalar::{Float, Scalar};

/// The sizes of one pooling: `x [planes, in_hw]` (`planes` = N·C), `y [planes, out_hw]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PoolGeometry {
    pub planes: usize,
    pub in_hw: [usize; 2],
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub out_hw: [usize; 2],
}

impl PoolGeometry {
    fn x_len(&self) -> usize {
        self.planes * self.in_hw[0] * self.in_hw[1]
    }

    fn y_len(&self) -> usize {
        self.planes * self.out_hw[0] * self.out_hw[1]
    }

    /// The index in the plane of the element window `(i, j)` of plane block `x` picks, if any.
    #[inline]
    fn pick<T: Scalar>(&self, x: &[T], i: usize, j: usize) -> Option<usize> {
        let [h, w] = self.in_hw;
        let mut best: Option<(usize, T)> = None;
        for a in 0..self.kernel[0] {
            let ih = (i * self.stride[0] + a * self.dilation[0]).wrapping_sub(self.padding[0]);
            if ih >= h {
                continue;
            }
            for b in 0..self.kernel[1] {
                let iw = (j * self.stride[1] + b * self.dilation[1]).wrapping_sub(self.padding[1]);
                if iw >= w {
                    continue;
                }
                let s = ih * w + iw;
                let v = x[s];
                let better = match best {
                    None => true,
                    Some((_, m)) => v > m || v.is_nan(),
                };
                if better {
                    best = Some((s, v));
                }
            }
        }
        best.map(|(s, _)| s)
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
    let (plane, [oh, ow]) = (g.in_hw[0] * g.in_hw[1], g.out_hw);
    let work = g.y_len() * g.kernel[0] * g.kernel[1];
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
    let (plane, [oh, ow]) = (g.in_hw[0] * g.in_hw[1], g.out_hw);
    let work = g.y_len() * g.kernel[0] * g.kernel[1];
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

    fn geometry() -> PoolGeometry {
        PoolGeometry {
            planes: 2,
            in_hw: [4, 5],
            kernel: [3, 3],
            stride: [2, 2],
            padding: [1, 1],
            dilation: [1, 1],
            out_hw: [2, 3],
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
