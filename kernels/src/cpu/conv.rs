//! 2-d convolution over NCHW images on the CPU, forward and both backward passes, as im2col
//! (or its adjoint col2im) plus the packed GEMM of [`super::gemm()`]. Every pass works one image
//! and one group at a time through a column buffer `[C/g · kh · kw, Ho · Wo]` carved, with the
//! GEMM's packing space, from a workspace the caller gives ([`workspace_len`]): the runtime
//! plans it in the slab, so a step allocates nothing.
//!
//! - forward: `y[n, group] = W_g · col(x[n, group])` (`[O/g, K] × [K, P]`);
//! - input gradient: `dx[n, group] = col2im(W_gᵀ · dy[n, group])`;
//! - weight gradient: `dW_g = Σ_n dy[n, group] · col(x[n, group])ᵀ`, images in order.
//!
//! The summation order is fixed by the sizes, so results repeat bit for bit. [`reference()`]
//! computes the forward pass with plain loops in f64, for tests.

use super::gemm::{gemm_ws, workspace_len as gemm_len, GemmError};
use super::matmul::{GemmScalar, MatLayout};
use super::par::for_each_block;
use super::scalar::{Float, Scalar};

/// The sizes of one convolution: `x [batch, in_ch, in_hw]`, `w [out_ch, in_ch/groups, kernel]`,
/// `y [batch, out_ch, out_hw]` (PyTorch's `conv2d` semantics: cross-correlation, symmetric zero
/// padding; NCHW, contiguous). Serializable because the CUDA executable's convolution
/// operations carry it as they are (`ingot_compiler::lower::cuda::Conv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConvGeometry {
    pub batch: usize,
    pub in_ch: usize,
    pub in_hw: [usize; 2],
    pub out_ch: usize,
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
    pub out_hw: [usize; 2],
}

/// Which pass a workspace is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pass {
    Forward,
    GradInput,
    GradWeight,
}

impl ConvGeometry {
    /// The geometry of a conv of `x` dims `[N, C, H, W]` by weight dims `[O, C/g, kh, kw]`, or
    /// why they do not make one.
    pub fn new(
        x: [usize; 4],
        w: [usize; 4],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        groups: usize,
    ) -> Result<ConvGeometry, String> {
        let [batch, in_ch, h, wd] = x;
        let [out_ch, cg, kh, kw] = w;
        if groups == 0 || in_ch % groups != 0 || out_ch % groups != 0 || in_ch / groups != cg {
            return Err(format!(
                "x has {in_ch} channels and w {out_ch} outputs of {cg} channels: not {groups} groups"
            ));
        }
        let mut out_hw = [0; 2];
        for i in 0..2 {
            let k = [kh, kw][i];
            let span = (k.checked_sub(1).ok_or("an empty kernel")?)
                .checked_mul(dilation[i])
                .and_then(|s| s.checked_add(1))
                .ok_or("the kernel span overflows")?;
            let padded = padding[i]
                .checked_mul(2)
                .and_then(|p| p.checked_add([h, wd][i]))
                .ok_or("the padded size overflows")?;
            if stride[i] == 0 || dilation[i] == 0 || padded < span {
                return Err(format!("the kernel does not fit axis {}", i + 2));
            }
            out_hw[i] = (padded - span) / stride[i] + 1;
        }
        Ok(ConvGeometry {
            batch,
            in_ch,
            in_hw: [h, wd],
            out_ch,
            kernel: [kh, kw],
            stride,
            padding,
            dilation,
            groups,
            out_hw,
        })
    }

    /// Elements of `x`, `w` and `y`.
    pub fn elements(&self) -> [usize; 3] {
        [
            self.batch * self.in_ch * self.in_hw[0] * self.in_hw[1],
            self.out_ch * (self.in_ch / self.groups.max(1)) * self.kernel[0] * self.kernel[1],
            self.batch * self.out_ch * self.out_hw[0] * self.out_hw[1],
        ]
    }

    /// Rows of the column buffer: `C/g · kh · kw`.
    pub fn col_rows(&self) -> usize {
        self.in_ch / self.groups * self.kernel[0] * self.kernel[1]
    }

    /// Output positions per image: `Ho · Wo`.
    pub fn positions(&self) -> usize {
        self.out_hw[0] * self.out_hw[1]
    }

    fn x_len(&self) -> usize {
        self.batch * self.in_ch * self.in_hw[0] * self.in_hw[1]
    }

    fn y_len(&self) -> usize {
        self.batch * self.out_ch * self.positions()
    }

    fn w_len(&self) -> usize {
        self.out_ch * self.col_rows()
    }
}

/// Elements of workspace `pass` needs: the column buffer, then the GEMM's packing space.
pub fn workspace_len<T: GemmScalar>(g: &ConvGeometry, pass: Pass) -> usize {
    let (og, k, p) = (g.out_ch / g.groups, g.col_rows(), g.positions());
    let gemm = match pass {
        Pass::Forward => gemm_len::<T>(og, k, p),
        Pass::GradInput => gemm_len::<T>(k, og, p),
        Pass::GradWeight => gemm_len::<T>(og, p, k),
    };
    k * p + gemm
}

/// [`workspace_len`] in bytes.
pub fn workspace_bytes<T: GemmScalar>(g: &ConvGeometry, pass: Pass) -> usize {
    workspace_len::<T>(g, pass) * std::mem::size_of::<T>()
}

/// What can go wrong before anything is written.
#[derive(Debug, thiserror::Error)]
pub enum ConvError {
    #[error("conv2d: {what} has {len} elements, the geometry needs {need}")]
    WrongLength {
        what: &'static str,
        len: usize,
        need: usize,
    },
    #[error(transparent)]
    Gemm(#[from] GemmError),
}

fn check(what: &'static str, len: usize, need: usize) -> Result<(), ConvError> {
    if len == need {
        Ok(())
    } else {
        Err(ConvError::WrongLength { what, len, need })
    }
}

fn check_ws(len: usize, need: usize) -> Result<(), ConvError> {
    if len >= need {
        Ok(())
    } else {
        Err(ConvError::WrongLength {
            what: "the workspace",
            len,
            need,
        })
    }
}

/// Calls `f(row, position, source)` for every element of one input channel's `kh·kw` rows of
/// a column buffer (rows numbered from the channel's first), `source` the index in the
/// channel's `[H, W]` plane or `None` in the padding. Every channel's rows read its own plane
/// alike, so the column buffer is filled (and summed back) a channel at a time.
#[inline]
fn each_channel_col(g: &ConvGeometry, mut f: impl FnMut(usize, usize, Option<usize>)) {
    let ([kh, kw], [h, w], [oh, ow]) = (g.kernel, g.in_hw, g.out_hw);
    for a in 0..kh {
        for b in 0..kw {
            let row = a * kw + b;
            for i in 0..oh {
                let ih = (i * g.stride[0] + a * g.dilation[0]).wrapping_sub(g.padding[0]);
                for j in 0..ow {
                    let iw = (j * g.stride[1] + b * g.dilation[1]).wrapping_sub(g.padding[1]);
                    let src = (ih < h && iw < w).then(|| ih * w + iw);
                    f(row, i * ow + j, src);
                }
            }
        }
    }
}

/// The column buffer `[C/g·kh·kw, Ho·Wo]` of one group's block `x` `[C/g, H, W]`; the rows of
/// each input channel are filled by one thread (a copy: the same bits on any number).
fn im2col<T: Scalar>(g: &ConvGeometry, x: &[T], col: &mut [T]) {
    let (p, rows, plane) = (
        g.positions(),
        g.kernel[0] * g.kernel[1],
        g.in_hw[0] * g.in_hw[1],
    );
    let work = col.len();
    for_each_block(&mut col[..g.col_rows() * p], rows * p, work, |c, col| {
        let xc = &x[c * plane..(c + 1) * plane];
        each_channel_col(g, |row, pos, src| {
            col[row * p + pos] = match src {
                Some(s) => xc[s],
                None => T::ZERO,
            }
        });
    });
}

/// Adds the column buffer back onto one group's block `dx` (the adjoint of [`im2col`]): each
/// input channel's plane is summed by one thread, its rows in order as on one thread.
fn col2im_add<T: Scalar>(g: &ConvGeometry, col: &[T], dx: &mut [T]) {
    let (p, rows, plane) = (
        g.positions(),
        g.kernel[0] * g.kernel[1],
        g.in_hw[0] * g.in_hw[1],
    );
    let work = g.col_rows() * p;
    for_each_block(dx, plane, work, |c, dxc| {
        let colc = &col[c * rows * p..(c + 1) * rows * p];
        each_channel_col(g, |row, pos, src| {
            if let Some(s) = src {
                dxc[s] = dxc[s].add(colc[row * p + pos]);
            }
        });
    });
}

/// `y = conv(x, w)`. `ws` holds at least [`workspace_len`]`(g, Pass::Forward)` elements.
pub fn forward<T: GemmScalar + Float>(
    g: &ConvGeometry,
    x: &[T],
    w: &[T],
    y: &mut [T],
    ws: &mut [T],
) -> Result<(), ConvError> {
    check("x", x.len(), g.x_len())?;
    check("w", w.len(), g.w_len())?;
    check("y", y.len(), g.y_len())?;
    check_ws(ws.len(), workspace_len::<T>(g, Pass::Forward))?;
    let (og, k, p) = (g.out_ch / g.groups, g.col_rows(), g.positions());
    let xg = g.in_ch / g.groups * g.in_hw[0] * g.in_hw[1];
    let (col, gws) = ws.split_at_mut(k * p);
    for n in 0..g.batch {
        for gi in 0..g.groups {
            let start = (n * g.groups + gi) * xg;
            im2col(g, &x[start..start + xg], col);
            gemm_ws(
                og,
                k,
                p,
                <T as GemmScalar>::ONE,
                w,
                MatLayout::row_major(k).at(gi * og * k),
                col,
                MatLayout::row_major(p),
                <T as GemmScalar>::ZERO,
                y,
                MatLayout::row_major(p).at((n * g.out_ch + gi * og) * p),
                gws,
            )?;
        }
    }
    Ok(())
}

/// `dx`, the gradient of `conv(x, w)` in `x` given the output's gradient `dy`.
pub fn grad_input<T: GemmScalar + Float>(
    g: &ConvGeometry,
    dy: &[T],
    w: &[T],
    dx: &mut [T],
    ws: &mut [T],
) -> Result<(), ConvError> {
    check("dy", dy.len(), g.y_len())?;
    check("w", w.len(), g.w_len())?;
    check("dx", dx.len(), g.x_len())?;
    check_ws(ws.len(), workspace_len::<T>(g, Pass::GradInput))?;
    let (og, k, p) = (g.out_ch / g.groups, g.col_rows(), g.positions());
    let xg = g.in_ch / g.groups * g.in_hw[0] * g.in_hw[1];
    let (col, gws) = ws.split_at_mut(k * p);
    dx.fill(<T as Scalar>::ZERO);
    for n in 0..g.batch {
        for gi in 0..g.groups {
            gemm_ws(
                k,
                og,
                p,
                <T as GemmScalar>::ONE,
                w,
                MatLayout::col_major(k).at(gi * og * k),
                dy,
                MatLayout::row_major(p).at((n * g.out_ch + gi * og) * p),
                <T as GemmScalar>::ZERO,
                col,
                MatLayout::row_major(p),
                gws,
            )?;
            let start = (n * g.groups + gi) * xg;
            col2im_add(g, col, &mut dx[start..start + xg]);
        }
    }
    Ok(())
}

/// `dw`, the gradient of `conv(x, w)` in `w` given the output's gradient `dy` (summed over the
/// images in order).
pub fn grad_weight<T: GemmScalar + Float>(
    g: &ConvGeometry,
    x: &[T],
    dy: &[T],
    dw: &mut [T],
    ws: &mut [T],
) -> Result<(), ConvError> {
    check("x", x.len(), g.x_len())?;
    check("dy", dy.len(), g.y_len())?;
    check("dw", dw.len(), g.w_len())?;
    check_ws(ws.len(), workspace_len::<T>(g, Pass::GradWeight))?;
    let (og, k, p) = (g.out_ch / g.groups, g.col_rows(), g.positions());
    let xg = g.in_ch / g.groups * g.in_hw[0] * g.in_hw[1];
    let (col, gws) = ws.split_at_mut(k * p);
    if g.batch == 0 || p == 0 {
        dw.fill(<T as Scalar>::ZERO);
    }
    for n in 0..g.batch {
        for gi in 0..g.groups {
            let start = (n * g.groups + gi) * xg;
            im2col(g, &x[start..start + xg], col);
            let beta = if n == 0 {
                <T as GemmScalar>::ZERO
            } else {
                <T as GemmScalar>::ONE
            };
            gemm_ws(
                og,
                p,
                k,
                <T as GemmScalar>::ONE,
                dy,
                MatLayout::row_major(p).at((n * g.out_ch + gi * og) * p),
                col,
                MatLayout::col_major(p),
                beta,
                dw,
                MatLayout::row_major(k).at(gi * og * k),
                gws,
            )?;
        }
    }
    Ok(())
}

/// The forward pass with plain loops, in f64 (an independent reference for tests).
pub fn reference(g: &ConvGeometry, x: &[f64], w: &[f64]) -> Vec<f64> {
    let (cg, og) = (g.in_ch / g.groups, g.out_ch / g.groups);
    let ([h, wd], [oh, ow], [kh, kw]) = (g.in_hw, g.out_hw, g.kernel);
    let mut y = vec![0.0; g.y_len()];
    for n in 0..g.batch {
        for o in 0..g.out_ch {
            let gi = o / og;
            for i in 0..oh {
                for j in 0..ow {
                    let mut s = 0.0;
                    for c in 0..cg {
                        for a in 0..kh {
                            for b in 0..kw {
                                let ih = (i * g.stride[0] + a * g.dilation[0]) as isize
                                    - g.padding[0] as isize;
                                let iw = (j * g.stride[1] + b * g.dilation[1]) as isize
                                    - g.padding[1] as isize;
                                if ih < 0 || iw < 0 || ih as usize >= h || iw as usize >= wd {
                                    continue;
                                }
                                let xi = ((n * g.in_ch + gi * cg + c) * h + ih as usize) * wd
                                    + iw as usize;
                                let wi = ((o * cg + c) * kh + a) * kw + b;
                                s += x[xi] * w[wi];
                            }
                        }
                    }
                    y[((n * g.out_ch + o) * oh + i) * ow + j] = s;
                }
            }
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u64) -> Vec<f64> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 11) as f64) / ((1u64 << 53) as f64) * 2.0 - 1.0
            })
            .collect()
    }

    fn geometries() -> Vec<ConvGeometry> {
        let mut out = Vec::new();
        for (x, w, s, p, d, gr) in [
            ([2, 3, 7, 6], [4, 3, 3, 3], 1, 1, 1, 1),
            ([2, 4, 9, 8], [6, 2, 3, 2], 2, 1, 1, 2),
            ([1, 4, 10, 10], [4, 1, 3, 3], 1, 2, 2, 4),
            ([3, 2, 5, 5], [3, 2, 1, 1], 1, 0, 1, 1),
            ([2, 3, 8, 7], [2, 3, 4, 3], 3, 2, 1, 1),
        ] {
            out.push(ConvGeometry::new(x, w, [s, s], [p, p], [d, d], gr).unwrap());
        }
        out
    }

    #[test]
    fn the_im2col_forward_matches_plain_loops_over_strides_padding_dilation_and_groups() {
        for g in geometries() {
            let x = values(g.x_len(), 1);
            let w = values(g.w_len(), 2);
            let want = reference(&g, &x, &w);
            let mut y = vec![f64::NAN; g.y_len()];
            let mut ws = vec![f64::NAN; workspace_len::<f64>(&g, Pass::Forward)];
            forward(&g, &x, &w, &mut y, &mut ws).unwrap();
            for (a, b) in y.iter().zip(&want) {
                assert!((a - b).abs() < 1e-12, "{g:?}: {a} vs {b}");
            }
            // f32 agrees to f32 rounding.
            let (x32, w32): (Vec<f32>, Vec<f32>) = (
                x.iter().map(|&v| v as f32).collect(),
                w.iter().map(|&v| v as f32).collect(),
            );
            let mut y32 = vec![f32::NAN; g.y_len()];
            let mut ws32 = vec![f32::NAN; workspace_len::<f32>(&g, Pass::Forward)];
            forward(&g, &x32, &w32, &mut y32, &mut ws32).unwrap();
            for (a, b) in y32.iter().zip(&want) {
                assert!((*a as f64 - b).abs() < 1e-5, "{g:?}: {a} vs {b}");
            }
        }
    }

    /// `<conv(x, w), dy> = <x, grad_input(dy, w)> = <w, grad_weight(x, dy)>`: both backward
    /// passes are the adjoints of the forward one.
    #[test]
    fn both_backward_passes_are_the_adjoints_of_the_forward_pass() {
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
        for g in geometries() {
            let (x, w, dy) = (
                values(g.x_len(), 3),
                values(g.w_len(), 4),
                values(g.y_len(), 5),
            );
            let y = reference(&g, &x, &w);
            let mut dx = vec![f64::NAN; g.x_len()];
            let mut ws = vec![0.0; workspace_len::<f64>(&g, Pass::GradInput)];
            grad_input(&g, &dy, &w, &mut dx, &mut ws).unwrap();
            let mut dw = vec![f64::NAN; g.w_len()];
            let mut ws = vec![0.0; workspace_len::<f64>(&g, Pass::GradWeight)];
            grad_weight(&g, &x, &dy, &mut dw, &mut ws).unwrap();
            let lhs = dot(&y, &dy);
            assert!((lhs - dot(&x, &dx)).abs() < 1e-9, "{g:?}: input adjoint");
            assert!((lhs - dot(&w, &dw)).abs() < 1e-9, "{g:?}: weight adjoint");
        }
    }

    #[test]
    fn a_short_buffer_is_an_error_before_anything_is_written() {
        let g = geometries()[0];
        let mut y = vec![7.0f64; g.y_len()];
        let mut ws = vec![0.0; 3];
        let e = forward(
            &g,
            &vec![0.0; g.x_len()],
            &vec![0.0; g.w_len()],
            &mut y,
            &mut ws,
        )
        .unwrap_err();
        assert!(e.to_string().contains("workspace"), "{e}");
        assert!(y.iter().all(|&v| v == 7.0));
    }
}
