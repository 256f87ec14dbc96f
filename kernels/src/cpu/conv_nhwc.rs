//! Channels-last (NHWC) 2-d convolutions on the CPU: `x [N, H, W, C]`, `w [O, kh, kw, C/g]`
//! (cuDNN's NHWC filter format), `y [N, Ho, Wo, O]`, with the semantics of [`super::conv`]'s
//! NCHW passes, which compute them: each pass copies its operands into NCHW order in the
//! workspace, runs the NCHW pass there and copies its result back into channels-last order.
//!
//! The CPU does not choose channels-last for itself (its im2col reads NCHW images directly);
//! these passes exist so that a step the compiler rewrote for a GPU's tensor cores still runs
//! on the CPU, the reference every GPU step is checked against. The copies are exact, so each
//! pass gives, element for element, the bits of the NCHW pass on the same values.
//!
//! The workspace (from the plan, so a step allocates nothing) holds the three NCHW copies
//! (`x`, `w`, `y` of [`ConvGeometry::elements`]), then the NCHW pass's own workspace: at least
//! [`super::conv::workspace_len`], and as many lanes as what is left gives it.

use super::conv::{self, ConvError, ConvGeometry, Pass};
use super::matmul::GemmScalar;
use super::scalar::Float;

/// Stored axis `i` of a channels-last tensor is NCHW axis `NHWC[i]`.
const NHWC: [usize; 4] = [0, 2, 3, 1];
/// Stored axis `i` of an NCHW tensor is channels-last axis `NCHW[i]`.
const NCHW: [usize; 4] = [0, 3, 1, 2];

/// Elements of the three NCHW copies a channels-last pass keeps in its workspace.
fn copies_len(g: &ConvGeometry) -> usize {
    g.elements().iter().sum()
}

/// Elements of workspace a channels-last `pass` needs at least: the NCHW copies and the NCHW
/// pass's least workspace.
pub fn workspace_len<T: GemmScalar>(g: &ConvGeometry, pass: Pass) -> usize {
    copies_len(g) + conv::workspace_len::<T>(g, pass)
}

/// Elements of workspace a channels-last `pass` runs fastest in: the NCHW copies and every
/// lane of the NCHW pass ([`conv::workspace_len_up_to`]).
pub fn workspace_len_up_to<T: GemmScalar>(g: &ConvGeometry, pass: Pass) -> usize {
    copies_len(g) + conv::workspace_len_up_to::<T>(g, pass)
}

/// [`workspace_len`] in bytes.
pub fn workspace_bytes<T: GemmScalar>(g: &ConvGeometry, pass: Pass) -> usize {
    workspace_len::<T>(g, pass) * std::mem::size_of::<T>()
}

/// [`workspace_len_up_to`] in bytes.
pub fn workspace_bytes_up_to<T: GemmScalar>(g: &ConvGeometry, pass: Pass) -> usize {
    workspace_len_up_to::<T>(g, pass) * std::mem::size_of::<T>()
}

/// Copies `src`, a row-major tensor of dims `d`, into `out` with its axes permuted: axis `i`
/// of `out` is axis `perm[i]` of `src`.
pub fn permute<T: Copy>(d: [usize; 4], perm: [usize; 4], src: &[T], out: &mut [T]) {
    let strides = [d[1] * d[2] * d[3], d[2] * d[3], d[3], 1];
    let od = perm.map(|a| d[a]);
    let os = perm.map(|a| strides[a]);
    let mut at = 0;
    for i in 0..od[0] {
        for j in 0..od[1] {
            for k in 0..od[2] {
                let base = i * os[0] + j * os[1] + k * os[2];
                for l in 0..od[3] {
                    out[at] = src[base + l * os[3]];
                    at += 1;
                }
            }
        }
    }
}

/// The NCHW dims of `x`, `w` and `y`.
fn nchw_dims(g: &ConvGeometry) -> [[usize; 4]; 3] {
    [
        [g.batch, g.in_ch, g.in_hw[0], g.in_hw[1]],
        [
            g.out_ch,
            g.in_ch / g.groups.max(1),
            g.kernel[0],
            g.kernel[1],
        ],
        [g.batch, g.out_ch, g.out_hw[0], g.out_hw[1]],
    ]
}

fn check(what: &'static str, len: usize, need: usize) -> Result<(), ConvError> {
    if len == need {
        Ok(())
    } else {
        Err(ConvError::WrongLength { what, len, need })
    }
}

/// Runs `pass` channels-last: `a` and `b` are its operands (as [`conv::forward`],
/// [`conv::grad_input`] and [`conv::grad_weight`] take them), `out` its result, each stored
/// channels-last.
pub fn run<T: GemmScalar + Float>(
    g: &ConvGeometry,
    pass: Pass,
    a: &[T],
    b: &[T],
    out: &mut [T],
    ws: &mut [T],
) -> Result<(), ConvError> {
    let [x, w, y] = nchw_dims(g);
    let [xl, wl, yl] = g.elements();
    // Which tensor (0 x, 1 w, 2 y) each operand and the result is.
    let ([ia, ib], io, names) = match pass {
        Pass::Forward => ([0, 1], 2, ["x", "w", "y"]),
        Pass::GradInput => ([2, 1], 0, ["dy", "w", "dx"]),
        Pass::GradWeight => ([0, 2], 1, ["x", "dy", "dw"]),
    };
    let lens = [xl, wl, yl];
    check(names[0], a.len(), lens[ia])?;
    check(names[1], b.len(), lens[ib])?;
    check(names[2], out.len(), lens[io])?;
    if ws.len() < copies_len(g) {
        return Err(ConvError::WrongLength {
            what: "the workspace",
            len: ws.len(),
            need: workspace_len::<T>(g, pass),
        });
    }
    let (xs, rest) = ws.split_at_mut(xl);
    let (wsn, rest) = rest.split_at_mut(wl);
    let (ys, inner) = rest.split_at_mut(yl);
    let dims = [x, w, y];
    // The channels-last dims of tensor `i`, which the NCHW copy is permuted from.
    let stored = |i: usize| NHWC.map(|ax| dims[i][ax]);
    let mut copies = [Some(xs), Some(wsn), Some(ys)];
    for (i, src) in [(ia, a), (ib, b)] {
        let dst = copies[i].as_deref_mut().expect("each tensor once");
        permute(stored(i), NCHW, src, dst);
    }
    let [xs, wsn, ys] = copies.map(|c| c.expect("each tensor"));
    match pass {
        Pass::Forward => conv::forward(g, xs, wsn, ys, inner)?,
        Pass::GradInput => conv::grad_input(g, ys, wsn, xs, inner)?,
        Pass::GradWeight => conv::grad_weight(g, xs, ys, wsn, inner)?,
    }
    let result = [&*xs, &*wsn, &*ys][io];
    permute(dims[io], NHWC, result, out);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values in [-1, 1) from the kernel tests' fixed linear congruential sequence.
    fn values(n: usize, seed: u64) -> Vec<f64> {
        let mut g = ingot_testkit::lcg::Lcg::mixed(seed);
        (0..n).map(|_| g.unit53() * 2.0 - 1.0).collect()
    }

    fn geometry(
        [n, c, h, w]: [usize; 4],
        [o, k]: [usize; 2],
        stride: usize,
        padding: usize,
        dilation: usize,
        groups: usize,
    ) -> ConvGeometry {
        ConvGeometry::new(
            [n, c, h, w],
            [o, c / groups, k, k],
            [stride; 2],
            [padding; 2],
            [dilation; 2],
            groups,
        )
        .unwrap()
    }

    /// Strides, padding, dilation, groups (depthwise among them), 1x1 and 7x7.
    fn geometries() -> Vec<ConvGeometry> {
        vec![
            geometry([2, 3, 9, 8], [4, 3], 1, 1, 1, 1),
            geometry([2, 4, 11, 10], [6, 3], 2, 1, 1, 2),
            geometry([1, 4, 9, 9], [4, 3], 1, 2, 2, 1),
            geometry([2, 6, 7, 7], [6, 3], 1, 1, 1, 6),
            geometry([2, 8, 5, 6], [5, 1], 1, 0, 1, 1),
            geometry([1, 3, 16, 15], [4, 7], 2, 3, 1, 1),
        ]
    }

    fn stored(d: [usize; 4]) -> [usize; 4] {
        NHWC.map(|a| d[a])
    }

    fn to_nhwc(d: [usize; 4], v: &[f64]) -> Vec<f64> {
        let mut out = vec![0.0; v.len()];
        permute(d, NHWC, v, &mut out);
        out
    }

    #[test]
    fn permuting_to_channels_last_and_back_is_the_identity_and_moves_channels_innermost() {
        let d = [2, 3, 4, 5];
        let v: Vec<f64> = (0..120).map(f64::from).collect();
        let nhwc = to_nhwc(d, &v);
        // Element [n=1, c=2, h=3, w=4] sits at [1, 3, 4, 2] of [2, 4, 5, 3].
        assert_eq!(
            nhwc[((4 + 3) * 5 + 4) * 3 + 2],
            v[((3 + 2) * 4 + 3) * 5 + 4]
        );
        let mut back = vec![0.0; v.len()];
        permute(stored(d), NCHW, &nhwc, &mut back);
        assert_eq!(back, v);
    }

    #[test]
    fn the_channels_last_forward_pass_matches_the_plain_loop_reference_on_permuted_data() {
        for (i, g) in geometries().into_iter().enumerate() {
            let [x, w, y] = nchw_dims(&g);
            let [xl, wl, _] = g.elements();
            let (xv, wv) = (values(xl, 2 * i as u64), values(wl, 2 * i as u64 + 1));
            let want = to_nhwc(y, &conv::reference(&g, &xv, &wv));
            let mut got = vec![0.0; want.len()];
            let mut ws = vec![0.0; workspace_len::<f64>(&g, Pass::Forward)];
            run(
                &g,
                Pass::Forward,
                &to_nhwc(x, &xv),
                &to_nhwc(w, &wv),
                &mut got,
                &mut ws,
            )
            .unwrap();
            for (k, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-12,
                    "{g:?}: element {k}: {a} against {b}"
                );
            }
        }
    }

    #[test]
    fn each_channels_last_gradient_is_the_nchw_gradient_permuted_bit_for_bit() {
        for (i, g) in geometries().into_iter().enumerate() {
            let [x, w, y] = nchw_dims(&g);
            let [xl, wl, yl] = g.elements();
            let (xv, wv, dy) = (
                values(xl, 3 * i as u64),
                values(wl, 3 * i as u64 + 1),
                values(yl, 3 * i as u64 + 2),
            );
            let mut ws = vec![
                0.0;
                workspace_len_up_to::<f64>(&g, Pass::GradWeight)
                    .max(workspace_len_up_to::<f64>(&g, Pass::GradInput),)
            ];
            let (mut dx, mut dw) = (vec![0.0; xl], vec![0.0; wl]);
            conv::grad_input(&g, &dy, &wv, &mut dx, &mut ws).unwrap();
            conv::grad_weight(&g, &xv, &dy, &mut dw, &mut ws).unwrap();
            let (mut dx_l, mut dw_l) = (vec![0.0; xl], vec![0.0; wl]);
            let (xn, wn, dyn_) = (to_nhwc(x, &xv), to_nhwc(w, &wv), to_nhwc(y, &dy));
            run(&g, Pass::GradInput, &dyn_, &wn, &mut dx_l, &mut ws).unwrap();
            run(&g, Pass::GradWeight, &xn, &dyn_, &mut dw_l, &mut ws).unwrap();
            assert_eq!(dx_l, to_nhwc(x, &dx), "{g:?}: dx");
            assert_eq!(dw_l, to_nhwc(w, &dw), "{g:?}: dw");
        }
    }

    #[test]
    fn a_workspace_short_of_the_copies_is_an_error_naming_it() {
        let g = geometry([1, 2, 4, 4], [2, 3], 1, 1, 1, 1);
        let [xl, wl, yl] = g.elements();
        let (x, w, mut y) = (vec![0.0f32; xl], vec![0.0f32; wl], vec![0.0f32; yl]);
        let e = run(&g, Pass::Forward, &x, &w, &mut y, &mut [0.0; 3]).unwrap_err();
        assert!(e.to_string().contains("the workspace"), "{e}");
        let e = run(&g, Pass::Forward, &x[1..], &w, &mut y, &mut [0.0; 3]).unwrap_err();
        assert!(e.to_string().contains("x has"), "{e}");
    }
}
