//! CUDA C for the sliding-window ops (the IR's `Op::Window`): the data movement around the
//! cuBLAS GEMMs a convolution becomes, and max pooling.
//!
//! A convolution runs, like the CPU's ([`crate::cpu::conv`]), as im2col (or its adjoint
//! col2im) plus a GEMM, a chunk of `S` images at a time through one column buffer in the
//! node's planned workspace. The column buffer of a chunk is `[g, K, S·P]` (`K = C/g·kh·kw`
//! rows, the `P = Ho·Wo` positions of each of the `S` images side by side), so that:
//! - the forward pass is one strided-batched GEMM per group, image `s`'s `[K, P]` block at
//!   column `s·P` with leading dimension `S·P`;
//! - the input gradient is the transposed GEMM into the same layout, then [`col2im`];
//! - the weight gradient is one plain GEMM per group over the chunk's `S·P` positions at once,
//!   with `dy` rearranged by [`images_side_by_side`] into `[O, S·P]`; the chunks accumulate
//!   (cuBLAS's `beta = 1`), in image order.
//!
//! Every kernel here is a grid-stride loop over the elements it writes, with no atomics: each
//! output element is computed by one thread in a fixed order, so results repeat bit for bit.
//! Sizes are literals (a kernel serves one geometry); index arithmetic is 32-bit when every
//! extent is below 2^31. bf16 moves as its 16 bits; sums are in f32 (f64 for f64), a bf16 sum
//! rounded once where it is stored, as the CPU runs a bf16 window op (the f32 op on widened
//! operands, its result rounded).

use super::ops::elementwise_loop;
use super::{c_type, literal, reads, widened, writes, CodegenError, CudaKernel, Ix};
use crate::cpu::conv::ConvGeometry;
use crate::cpu::pool::PoolGeometry;
use crate::DType;

fn check_dtype(op: &'static str, d: DType) -> Result<(), CodegenError> {
    match d {
        DType::F32 | DType::F64 | DType::BF16 => Ok(()),
        _ => Err(CodegenError::Unsupported {
            op,
            what: "operand",
            dtype: d,
        }),
    }
}

fn product(op: &'static str, xs: &[usize]) -> Result<usize, CodegenError> {
    xs.iter()
        .try_fold(1usize, |a, &x| a.checked_mul(x))
        .ok_or_else(|| CodegenError::TooLarge {
            op,
            sizes: xs.to_vec(),
        })
}

/// The accumulator type of sums of `d` (f64 for f64, else f32).
fn acc_type(d: DType) -> &'static str {
    match d {
        DType::F64 => "double",
        _ => "float",
    }
}

/// Elements of one chunk's column buffer: `g · K · S · P`.
pub fn column_len(g: &ConvGeometry, samples: usize) -> usize {
    g.groups * g.col_rows() * samples * g.positions()
}

/// `im2col` of `S = samples` images: `x [S, C, H, W] -> col [g, K, S·P]`, zeros where a window
/// reaches into the padding. Params: x, col.
pub fn im2col(d: DType, g: &ConvGeometry, samples: usize) -> Result<CudaKernel, CodegenError> {
    check_dtype("im2col", d)?;
    let (k, p) = (g.col_rows(), g.positions());
    let total = product("im2col", &[g.groups, k, samples, p])?;
    let x_len = product("im2col", &[samples, g.in_ch, g.in_hw[0], g.in_hw[1]])?;
    let ix = Ix::for_extents([total, x_len]);
    let params = [reads(d, "x"), writes(d, "col")];
    let what = format!(
        "// ingot im2col: {} of {samples} images -> [{}, {k}, {}]",
        describe(g),
        g.groups,
        samples * p
    );
    let zero = match d {
        DType::BF16 => "(unsigned short)0".to_string(),
        _ => literal(0.0, d),
    };
    let [kh, kw] = g.kernel;
    let cg = g.in_ch / g.groups;
    Ok(elementwise_loop(&what, &params, total, ix, |src, t| {
        src.line(format!("const {t} pos = e % {};", ix.lit(p)));
        src.line(format!("{t} r = e / {};", ix.lit(p)));
        src.line(format!(
            "const {t} s = r % {}; r /= {};",
            ix.lit(samples),
            ix.lit(samples)
        ));
        src.line(format!(
            "const {t} kk = r % {}; const {t} grp = r / {};",
            ix.lit(k),
            ix.lit(k)
        ));
        src.line(format!(
            "const {t} b = kk % {}; const {t} a = (kk / {}) % {}; const {t} c = grp * {} + kk / {};",
            ix.lit(kw),
            ix.lit(kw),
            ix.lit(kh),
            ix.lit(cg),
            ix.lit(kh * kw)
        ));
        window_source(src, g, t, ix);
        src.line(format!(
            "col[e] = inside ? x[((s * {} + c) * {} + ({t})ih) * {} + ({t})iw] : {zero};",
            ix.lit(g.in_ch),
            ix.lit(g.in_hw[0]),
            ix.lit(g.in_hw[1])
        ));
    }))
}

/// Emits `ih`, `iw` (signed) and `inside` for output position `pos` and kernel offset `(a, b)`.
fn window_source(src: &mut super::Src, g: &ConvGeometry, t: &str, ix: Ix) {
    let _ = t;
    src.line(format!(
        "const long long ih = (long long)(pos / {}) * {} - {} + (long long)a * {};",
        ix.lit(g.out_hw[1]),
        g.stride[0],
        g.padding[0],
        g.dilation[0]
    ));
    src.line(format!(
        "const long long iw = (long long)(pos % {}) * {} - {} + (long long)b * {};",
        ix.lit(g.out_hw[1]),
        g.stride[1],
        g.padding[1],
        g.dilation[1]
    ));
    src.line(format!(
        "const bool inside = ih >= 0 && ih < {} && iw >= 0 && iw < {};",
        g.in_hw[0], g.in_hw[1]
    ));
}

fn describe(g: &ConvGeometry) -> String {
    format!(
        "conv [{}, {}, {}, {}] by [{}, {}, {}, {}] stride {:?} padding {:?} dilation {:?} groups {}",
        g.batch,
        g.in_ch,
        g.in_hw[0],
        g.in_hw[1],
        g.out_ch,
        g.in_ch / g.groups,
        g.kernel[0],
        g.kernel[1],
        g.stride,
        g.padding,
        g.dilation,
        g.groups
    )
}

/// `col2im` of `S = samples` images, the adjoint of [`im2col`]: `col [g, K, S·P] ->
/// dx [S, C, H, W]`, each element the sum, kernel offsets in row-major order, of the column
/// entries that read it. Params: col, dx.
pub fn col2im(d: DType, g: &ConvGeometry, samples: usize) -> Result<CudaKernel, CodegenError> {
    check_dtype("col2im", d)?;
    let (k, p) = (g.col_rows(), g.positions());
    let [h, w] = g.in_hw;
    let total = product("col2im", &[samples, g.in_ch, h, w])?;
    let col_len = product("col2im", &[g.groups, k, samples, p])?;
    let ix = Ix::for_extents([total, col_len]);
    let params = [reads(d, "col"), writes(d, "dx")];
    let what = format!("// ingot col2im: {} of {samples} images", describe(g));
    let [kh, kw] = g.kernel;
    let cg = g.in_ch / g.groups;
    let acc = acc_type(d);
    let [ho, wo] = g.out_hw;
    let taps = [g.padding, g.dilation, g.stride];
    Ok(elementwise_loop(&what, &params, total, ix, |src, t| {
        src.line(format!(
            "const long long xw = (long long)(e % {});",
            ix.lit(w)
        ));
        src.line(format!("{t} r = e / {};", ix.lit(w)));
        src.line(format!(
            "const long long xh = (long long)(r % {}); r /= {};",
            ix.lit(h),
            ix.lit(h)
        ));
        src.line(format!(
            "const {t} c = r % {}; const {t} s = r / {};",
            ix.lit(g.in_ch),
            ix.lit(g.in_ch)
        ));
        src.line(format!(
            "const {t} base = ((c / {}) * {} + (c % {}) * {}) * {};",
            ix.lit(cg),
            ix.lit(k),
            ix.lit(cg),
            ix.lit(kh * kw),
            ix.lit(samples * p)
        ));
        src.line(format!("{acc} sum = 0;"));
        src.open(format!("for (int a = 0; a < {kh}; ++a) {{"));
        window_tap(src, taps, 0, "a", ho);
        src.open(format!("for (int b = 0; b < {kw}; ++b) {{"));
        window_tap(src, taps, 1, "b", wo);
        let v = widened(
            d,
            format!(
                "col[base + ({t})(a * {kw} + b) * {} + s * {} + ({t})(th / {}) * {} + ({t})(tw / {})]",
                ix.lit(samples * p),
                ix.lit(p),
                g.stride[0],
                ix.lit(wo),
                g.stride[1]
            ),
        );
        src.line(format!("sum += {v};"));
        src.close();
        src.close();
        src.line(format!("dx[e] = {};", store_sum(d, "sum")));
    }))
}

/// Opens the two loops over the windows that read an element, in row-major order of the
/// windows (window row `wi` grows as the kernel row `ka` falls; likewise `wj` and `kb`), with
/// `wi` and `wj` defined inside: what both max-pooling gradients sum over.
fn open_windows_of_element(
    src: &mut super::Src,
    g: &PoolGeometry,
    taps: [[usize; 2]; 3],
    ho: usize,
    wo: usize,
) {
    src.open(format!(
        "for (int ka = {}; ka >= 0; --ka) {{",
        g.kernel[0] - 1
    ));
    window_tap(src, taps, 0, "ka", ho);
    src.line(format!("const long long wi = th / {};", g.stride[0]));
    src.open(format!(
        "for (int kb = {}; kb >= 0; --kb) {{",
        g.kernel[1] - 1
    ));
    window_tap(src, taps, 1, "kb", wo);
    src.line(format!("const long long wj = tw / {};", g.stride[1]));
}

/// The lines of a backward window kernel that take the input position along `axis` (`xh`,
/// `xw`) and kernel tap `k` to the output position the tap came from: `th` (`tw`) `= xh +
/// padding - k * dilation`, and the tap skipped (`continue`) unless it is a multiple of the
/// stride whose quotient is inside the `out` output positions. `taps` is the geometry's
/// `[padding, dilation, stride]`. col2im and the max pool's gradient walk both axes so.
fn window_tap(src: &mut super::Src, taps: [[usize; 2]; 3], axis: usize, k: &str, out: usize) {
    let [padding, dilation, stride] = taps.map(|v| v[axis]);
    let (t, x) = (["th", "tw"][axis], ["xh", "xw"][axis]);
    src.line(format!(
        "const long long {t} = {x} + {padding} - (long long){k} * {dilation};"
    ));
    src.line(format!(
        "if ({t} < 0 || {t} % {stride} != 0 || {t} / {stride} >= {out}) continue;"
    ));
}

/// The memory value of dtype `d` of the (already rounded, for bf16) register `v`.
fn store(d: DType, v: &str) -> String {
    match d {
        DType::BF16 => format!("ig_narrow({v})"),
        _ => v.to_string(),
    }
}

/// The memory value of dtype `d` of the f32 (f64) sum `v`: rounded to the nearest bf16 once.
fn store_sum(d: DType, v: &str) -> String {
    match d {
        DType::BF16 => format!("ig_bf16_bits({v})"),
        _ => v.to_string(),
    }
}

/// `dy [S, O, P] -> [O, S·P]`: the `S` images' output gradients side by side, so that the
/// weight gradient of a chunk is one GEMM over its `S·P` positions. Params: dy, out.
pub fn images_side_by_side(
    d: DType,
    samples: usize,
    channels: usize,
    positions: usize,
) -> Result<CudaKernel, CodegenError> {
    check_dtype("images_side_by_side", d)?;
    let total = product("images_side_by_side", &[samples, channels, positions])?;
    let ix = Ix::for_extents([total]);
    let params = [reads(d, "dy"), writes(d, "out")];
    let what = format!(
        "// ingot images side by side: [{samples}, {channels}, {positions}] -> [{channels}, {}]",
        samples * positions
    );
    Ok(elementwise_loop(&what, &params, total, ix, |src, t| {
        src.line(format!("const {t} pos = e % {};", ix.lit(positions)));
        src.line(format!("{t} r = e / {};", ix.lit(positions)));
        src.line(format!(
            "const {t} s = r % {}; const {t} o = r / {};",
            ix.lit(samples),
            ix.lit(samples)
        ));
        src.line(format!(
            "out[e] = dy[(s * {} + o) * {} + pos];",
            ix.lit(channels),
            ix.lit(positions)
        ));
    }))
}

fn pool_describe(g: &PoolGeometry) -> String {
    let last = match g.inner {
        1 => String::new(),
        c => format!(", channels-last ({c} channels innermost)"),
    };
    format!(
        "{} planes of [{}, {}], window {:?} stride {:?} padding {:?} dilation {:?}{last}",
        g.planes, g.in_hw[0], g.in_hw[1], g.kernel, g.stride, g.padding, g.dilation
    )
}

/// Plane element `i` (an expression) as an offset from the plane's pointer: `i` itself where
/// planes are contiguous (NCHW), `(i) * C` channels-last, where a plane's elements are the
/// `C` channels apart ([`PoolGeometry::inner`]).
fn el(g: &PoolGeometry, i: &str) -> String {
    match g.inner {
        1 => i.to_string(),
        c => format!("({i}) * {c}"),
    }
}

/// The offset of image `plane`'s plane in a buffer of planes of `size` elements: `plane *
/// size` (NCHW); channels-last `plane` is the image, each `size · C` elements, and `ch` the
/// channel, the plane's first element.
fn plane_offset(ix: Ix, g: &PoolGeometry, size: usize) -> String {
    match g.inner {
        1 => format!("plane * {}", ix.lit(size)),
        c => format!("plane * {} + ch", ix.lit(size * c)),
    }
}

/// Emits `ch`, the channel of loop element `e`, and returns the expression of `e` with the
/// channel taken off (`e` itself where planes are contiguous: no line emitted).
fn channel_of(src: &mut super::Src, ix: Ix, g: &PoolGeometry) -> String {
    match g.inner {
        1 => "e".to_string(),
        c => {
            src.line(format!(
                "const long long ch = (long long)(e % {});",
                ix.lit(c)
            ));
            format!("(e / {})", ix.lit(c))
        }
    }
}

/// Emits the coordinates of output element `e`'s window, `wi` and `wj`, and `xp`, its plane of
/// `x`: what [`pick_source`] scans, in the forward pooling and in the pick kernel alike.
fn window_of_output(src: &mut super::Src, ix: Ix, d: DType, g: &PoolGeometry) {
    let [ho, wo] = g.out_hw;
    let e = channel_of(src, ix, g);
    src.line(format!(
        "const long long wj = (long long)({e} % {});",
        ix.lit(wo)
    ));
    src.line(format!(
        "const long long wi = (long long)(({e} / {}) % {});",
        ix.lit(wo),
        ix.lit(ho)
    ));
    let ch = if g.inner == 1 { "" } else { " + ch" };
    src.line(format!(
        "const {} * xp = x + ({e} / {}) * {}{ch};",
        c_type(d),
        ix.lit(ho * wo),
        ix.lit(g.in_hw[0] * g.in_hw[1] * g.inner)
    ));
}

/// Emits the scan of window `(i, j)` of plane `pl` (row-major, `v > best || isnan(v)`, as
/// [`crate::cpu::pool`]): `found` and, when found, `best` and its index `at` in the plane;
/// with `tap`, also the picked tap `tap = a·kw + b` of the window.
fn pick_source(src: &mut super::Src, d: DType, g: &PoolGeometry, tap: bool) {
    let [h, w] = g.in_hw;
    let reg = super::reg_type(d);
    src.line(format!(
        "bool found = false; {reg} best = 0; long long at = -1;"
    ));
    if tap {
        src.line("int tap = -1;");
    }
    src.open(format!("for (int a = 0; a < {}; ++a) {{", g.kernel[0]));
    src.line(format!(
        "const long long ih = wi * {} - {} + (long long)a * {};",
        g.stride[0], g.padding[0], g.dilation[0]
    ));
    src.line(format!("if (ih < 0 || ih >= {h}) continue;"));
    src.open(format!("for (int b = 0; b < {}; ++b) {{", g.kernel[1]));
    src.line(format!(
        "const long long iw = wj * {} - {} + (long long)b * {};",
        g.stride[1], g.padding[1], g.dilation[1]
    ));
    src.line(format!("if (iw < 0 || iw >= {w}) continue;"));
    src.line(format!(
        "const {reg} v = {};",
        widened(d, format!("xp[{}]", el(g, &format!("ih * {w} + iw"))))
    ));
    let and_tap = if tap {
        format!(" tap = a * {} + b;", g.kernel[1])
    } else {
        String::new()
    };
    src.line(format!(
        "if (!found || v > best || v != v) {{ found = true; best = v; at = ih * {w} + iw;{and_tap} }}"
    ));
    src.close();
    src.close();
}

/// `max_pool2d(x) -> y`: each window's maximum (−∞ for a window wholly in the padding).
/// Params: x, y.
pub fn max_pool2d(d: DType, g: &PoolGeometry) -> Result<CudaKernel, CodegenError> {
    check_dtype("max_pool2d", d)?;
    let [ho, wo] = g.out_hw;
    let total = product("max_pool2d", &[g.planes, ho, wo])?;
    let x_len = product("max_pool2d", &[g.planes, g.in_hw[0], g.in_hw[1]])?;
    let ix = Ix::for_extents([total, x_len]);
    let params = [reads(d, "x"), writes(d, "y")];
    let what = format!("// ingot max_pool2d: {}", pool_describe(g));
    let lowest = literal(
        f64::NEG_INFINITY,
        if d == DType::BF16 { DType::F32 } else { d },
    );
    Ok(elementwise_loop(&what, &params, total, ix, |src, _| {
        window_of_output(src, ix, d, g);
        pick_source(src, d, g, false);
        src.line(format!(
            "(void)at; y[e] = {};",
            store(d, &format!("(found ? best : {lowest})"))
        ));
    }))
}

/// Opens a gradient kernel's loop body over the input's elements `e`: the element's column
/// `xw`, row `xh` and plane (`t` the index type) in planes of `[h, w]`.
fn element_of_plane(src: &mut super::Src, ix: Ix, t: &str, g: &PoolGeometry) {
    let [h, w] = g.in_hw;
    let e = channel_of(src, ix, g);
    src.line(format!(
        "const long long xw = (long long)({e} % {});",
        ix.lit(w)
    ));
    src.line(format!(
        "const long long xh = (long long)(({e} / {}) % {});",
        ix.lit(w),
        ix.lit(h)
    ));
    src.line(format!("const {t} plane = {e} / {};", ix.lit(h * w)));
}

/// `max_pool2d_grad(x, dy) -> dx`: each input element gathers `dy` from the windows that
/// picked it (recomputed from `x`), windows in row-major order, as the CPU adds them.
/// Params: x, dy, dx.
pub fn max_pool2d_grad(d: DType, g: &PoolGeometry) -> Result<CudaKernel, CodegenError> {
    check_dtype("max_pool2d_grad", d)?;
    let [h, w] = g.in_hw;
    let [ho, wo] = g.out_hw;
    let total = product("max_pool2d_grad", &[g.planes, h, w])?;
    let y_len = product("max_pool2d_grad", &[g.planes, ho, wo])?;
    let ix = Ix::for_extents([total, y_len]);
    let params = [reads(d, "x"), reads(d, "dy"), writes(d, "dx")];
    let what = format!("// ingot max_pool2d_grad: {}", pool_describe(g));
    Ok(elementwise_loop(&what, &params, total, ix, |src, t| {
        let xp = format!(
            "const {} * xp = x + {};",
            c_type(d),
            plane_offset(ix, g, h * w)
        );
        open_gradient_windows(src, ix, t, d, g, &xp);
        pick_source(src, d, g, false);
        src.line(format!(
            "if (found && at == xh * {w} + xw) sum += {};",
            widened(d, format!("dyp[{}]", el(g, &format!("wi * {wo} + wj"))))
        ));
        src.close();
        src.close();
        src.line(format!("dx[e] = {};", store_sum(d, "sum")));
    }))
}

/// Bytes of the picks [`max_pool2d_pick`] writes for [`max_pool2d_grad_picked`]: a byte a
/// window. `None` where a window has more than 255 taps (255 means "no pick") or a dilation
/// of 0 (taps that meet one element): such poolings keep the one-kernel
/// [`max_pool2d_grad`].
pub fn pool_pick_bytes(g: &PoolGeometry) -> Option<usize> {
    let taps = g.kernel[0].checked_mul(g.kernel[1])?;
    if taps > 255 || g.dilation.contains(&0) {
        return None;
    }
    g.planes.checked_mul(g.out_hw[0])?.checked_mul(g.out_hw[1])
}

/// Opens a pooling gradient's loop body over the input's elements `e` ([`element_of_plane`]):
/// `operand`, the line that points into this plane of the kernel's first parameter, then
/// `dyp` into `dy`'s plane, the accumulator `sum`, and the windows that read the element, in
/// row-major order (window row `wi` grows as the kernel row `ka` falls). Both gradients (the
/// scanning one and the one from picks) add the same windows in this order.
fn open_gradient_windows(
    src: &mut super::Src,
    ix: Ix,
    t: &str,
    d: DType,
    g: &PoolGeometry,
    operand: &str,
) {
    let [ho, wo] = g.out_hw;
    element_of_plane(src, ix, t, g);
    src.line(operand);
    src.line(format!(
        "const {} * dyp = dy + {};",
        c_type(d),
        plane_offset(ix, g, ho * wo)
    ));
    src.line(format!("{} sum = 0;", acc_type(d)));
    let taps = [g.padding, g.dilation, g.stride];
    open_windows_of_element(src, g, taps, ho, wo);
}

/// [`pool_pick_bytes`], or the error that names `op` where a window's tap does not fit a byte.
fn pick_bytes(op: &'static str, d: DType, g: &PoolGeometry) -> Result<usize, CodegenError> {
    pool_pick_bytes(g).ok_or(CodegenError::Unsupported {
        op,
        what: "windows of more than 255 taps, or of dilation 0, in poolings",
        dtype: d,
    })
}

/// `max_pool2d_pick(x) -> pick`: the tap `a·kw + b` each window picks (the scan of
/// [`max_pool2d`]), 255 for a window wholly in the padding; a byte a window, `[planes, Ho,
/// Wo]`. The first of the gradient's two kernels. Params: x, pick.
pub fn max_pool2d_pick(d: DType, g: &PoolGeometry) -> Result<CudaKernel, CodegenError> {
    check_dtype("max_pool2d_pick", d)?;
    let total = pick_bytes("max_pool2d_pick", d, g)?;
    let x_len = product("max_pool2d_pick", &[g.planes, g.in_hw[0], g.in_hw[1]])?;
    let ix = Ix::for_extents([total, x_len]);
    let params = [
        reads(d, "x"),
        ("unsigned char*".to_string(), "pick".to_string()),
    ];
    let what = format!("// ingot max_pool2d_pick: {}", pool_describe(g));
    Ok(elementwise_loop(&what, &params, total, ix, |src, _| {
        window_of_output(src, ix, d, g);
        pick_source(src, d, g, true);
        src.line("(void)at; (void)best;");
        src.line("pick[e] = found ? (unsigned char)tap : (unsigned char)255;");
    }))
}

/// `max_pool2d_grad` from the picks of [`max_pool2d_pick`] (`pick, dy -> dx`): each input
/// element gathers `dy` from the windows whose pick is the tap that reads it, windows in
/// row-major order, so it adds what [`max_pool2d_grad`] adds, in the same order, bit for bit,
/// without scanning each window again for each of its elements. Params: pick, dy, dx.
///
/// A thread owns a block of `stride[0] x stride[1]` input elements ([`max_pool2d_grad_blocked`])
/// where such a block has at most [`MAX_BLOCK_ELEMENTS`] elements and a plane's indices fit 31
/// bits; otherwise an element ([`max_pool2d_grad_per_element`]).
pub fn max_pool2d_grad_picked(d: DType, g: &PoolGeometry) -> Result<CudaKernel, CodegenError> {
    check_dtype("max_pool2d_grad_picked", d)?;
    let small = |v: usize| v < 1 << 31;
    let block = g.stride[0].checked_mul(g.stride[1]);
    if block.is_some_and(|b| (1..=MAX_BLOCK_ELEMENTS).contains(&b))
        && small(g.in_hw[0] * g.in_hw[1] * g.inner)
        && small(g.out_hw[0] * g.out_hw[1] * g.inner)
    {
        max_pool2d_grad_blocked(d, g)
    } else {
        max_pool2d_grad_per_element(d, g)
    }
}

/// The most input elements a thread of [`max_pool2d_grad_blocked`] owns (one accumulator
/// each).
pub const MAX_BLOCK_ELEMENTS: usize = 16;

/// The per-element form of [`max_pool2d_grad_picked`]: a thread an input element, each tap
/// `(ka, kb)` of the kernel tested for a window that reads the element (for a 3x3 window of
/// stride 2, nine tests an element, the threads of a warp on different ones by their column's
/// parity). Params: pick, dy, dx.
pub fn max_pool2d_grad_per_element(d: DType, g: &PoolGeometry) -> Result<CudaKernel, CodegenError> {
    check_dtype("max_pool2d_grad_picked", d)?;
    let [h, w] = g.in_hw;
    let [ho, wo] = g.out_hw;
    let total = product("max_pool2d_grad_picked", &[g.planes, h, w])?;
    let y_len = pick_bytes("max_pool2d_grad_picked", d, g)?;
    let ix = Ix::for_extents([total, y_len]);
    let params = [
        ("const unsigned char*".to_string(), "pick".to_string()),
        reads(d, "dy"),
        writes(d, "dx"),
    ];
    let what = format!("// ingot max_pool2d_grad_picked: {}", pool_describe(g));
    let kw = g.kernel[1];
    Ok(elementwise_loop(&what, &params, total, ix, |src, t| {
        let pp = format!(
            "const unsigned char * pp = pick + {};",
            plane_offset(ix, g, ho * wo)
        );
        open_gradient_windows(src, ix, t, d, g, &pp);
        let at = el(g, &format!("wi * {wo} + wj"));
        src.line(format!(
            "if ((int)pp[{at}] == ka * {kw} + kb) sum += {};",
            widened(d, format!("dyp[{at}]"))
        ));
        src.close();
        src.close();
        src.line(format!("dx[e] = {};", store_sum(d, "sum")));
    }))
}

/// The window offsets, along one axis, of the windows that may pick an element of the block
/// starting at `i·stride`: window `i + o` for `o` in the range, the first one whose last tap
/// reaches the block's first element, the last one whose first tap is at or before the
/// block's last element (the same for every block, as blocks start at multiples of the
/// stride).
fn block_window_offsets(kernel: usize, stride: usize, padding: usize, dilation: usize) -> [i64; 2] {
    let (k, s, p, dl) = (
        kernel as i64,
        stride as i64,
        padding as i64,
        dilation as i64,
    );
    let first = (p - (k - 1) * dl).div_euclid(s) + i64::from((p - (k - 1) * dl).rem_euclid(s) != 0);
    let last = (s - 1 + p).div_euclid(s);
    [first, last]
}

/// [`max_pool2d_grad_picked`] a block of `stride[0] x stride[1]` input elements a thread: the
/// thread reads the pick and `dy` of each window that may pick one of its elements once
/// (two by two windows for a 3x3 window of stride 2), adds `dy` to the accumulator of the
/// element the pick names, windows in row-major order (each element's sum is the
/// per-element kernel's, term by term), and stores its elements; no thread tests a tap that
/// cannot read its element. Params: pick, dy, dx.
pub fn max_pool2d_grad_blocked(d: DType, g: &PoolGeometry) -> Result<CudaKernel, CodegenError> {
    check_dtype("max_pool2d_grad_picked", d)?;
    let [h, w] = g.in_hw;
    let [ho, wo] = g.out_hw;
    let [sh, sw] = g.stride;
    let [kh, kw] = g.kernel;
    let (bh, bw) = (h.div_ceil(sh), w.div_ceil(sw));
    let total = product("max_pool2d_grad_picked", &[g.planes, bh, bw])?;
    let x_len = product("max_pool2d_grad_picked", &[g.planes, h, w])?;
    let y_len = pick_bytes("max_pool2d_grad_picked", d, g)?;
    let ix = Ix::for_extents([total, x_len, y_len]);
    let params = [
        ("const unsigned char*".to_string(), "pick".to_string()),
        reads(d, "dy"),
        writes(d, "dx"),
    ];
    let what = format!(
        "// ingot max_pool2d_grad_picked: {}, a thread a block of [{sh}, {sw}]",
        pool_describe(g)
    );
    let acc = acc_type(d);
    let rows = block_window_offsets(kh, sh, g.padding[0], g.dilation[0]);
    let cols = block_window_offsets(kw, sw, g.padding[1], g.dilation[1]);
    let pair_store = d == DType::BF16 && sw == 2 && w.is_multiple_of(2) && g.inner == 1;
    Ok(elementwise_loop(&what, &params, total, ix, |src, t| {
        let e = channel_of(src, ix, g);
        src.line(format!("const int bj = (int)({e} % {});", ix.lit(bw)));
        src.line(format!(
            "const int bi = (int)(({e} / {}) % {});",
            ix.lit(bw),
            ix.lit(bh)
        ));
        src.line(format!("const {t} plane = {e} / {};", ix.lit(bh * bw)));
        src.line(format!(
            "const unsigned char * pp = pick + {};",
            plane_offset(ix, g, ho * wo)
        ));
        src.line(format!(
            "const {} * dyp = dy + {};",
            c_type(d),
            plane_offset(ix, g, ho * wo)
        ));
        src.line(format!(
            "{} * dxp = dx + {};",
            c_type(d),
            plane_offset(ix, g, h * w)
        ));
        for r in 0..sh {
            for c in 0..sw {
                src.line(format!("{acc} s{r}_{c} = 0;"));
            }
        }
        for oi in rows[0]..=rows[1] {
            src.open("{");
            src.line(format!("const int wi = bi + ({oi});"));
            src.open(format!("if (wi >= 0 && wi < {ho}) {{"));
            for oj in cols[0]..=cols[1] {
                src.open("{");
                src.line(format!("const int wj = bj + ({oj});"));
                src.open(format!("if (wj >= 0 && wj < {wo}) {{"));
                let at = el(g, &format!("wi * {wo} + wj"));
                src.line(format!("const int p = (int)pp[{at}];"));
                src.open(format!("if (p < {}) {{", kh * kw));
                src.line(format!(
                    "const int r = (wi - bi) * {sh} - {} + (p / {kw}) * {};",
                    g.padding[0], g.dilation[0]
                ));
                src.line(format!(
                    "const int c = (wj - bj) * {sw} - {} + (p % {kw}) * {};",
                    g.padding[1], g.dilation[1]
                ));
                src.line(format!(
                    "const {acc} v = {};",
                    widened(d, format!("dyp[{at}]"))
                ));
                for r in 0..sh {
                    for c in 0..sw {
                        src.line(format!("if (r == {r} && c == {c}) s{r}_{c} += v;"));
                    }
                }
                src.close();
                src.close();
                src.close();
            }
            src.close();
            src.close();
        }
        for r in 0..sh {
            src.open("{");
            src.line(format!("const int xh = bi * {sh} + {r};"));
            src.open(format!("if (xh < {h}) {{"));
            if pair_store {
                // Two bf16 neighbours in one aligned 32-bit store (w even: each pair starts at
                // an even element of an even-sized plane).
                src.line(format!(
                    "*(unsigned *)(dxp + xh * {w} + bj * 2) = (unsigned){} | ((unsigned){} << 16);",
                    store_sum(d, &format!("s{r}_0")),
                    store_sum(d, &format!("s{r}_1"))
                ));
            } else {
                for c in 0..sw {
                    src.line(format!(
                        "if (bj * {sw} + {c} < {w}) dxp[{}] = {};",
                        el(g, &format!("xh * {w} + bj * {sw} + {c}")),
                        store_sum(d, &format!("s{r}_{c}"))
                    ));
                }
            }
            src.close();
            src.close();
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry(groups: usize) -> ConvGeometry {
        ConvGeometry::new(
            [4, 4, 7, 6],
            [6, 4 / groups, 3, 2],
            [2, 1],
            [1, 0],
            [1, 2],
            groups,
        )
        .unwrap()
    }

    fn pool() -> PoolGeometry {
        PoolGeometry {
            planes: 6,
            in_hw: [5, 7],
            kernel: [3, 2],
            stride: [2, 2],
            padding: [1, 0],
            dilation: [1, 1],
            out_hw: [3, 3],
            inner: 1,
        }
    }

    fn every_kernel(d: DType) -> Vec<CudaKernel> {
        let (g, p) = (geometry(2), pool());
        vec![
            im2col(d, &g, 2).unwrap(),
            col2im(d, &g, 2).unwrap(),
            images_side_by_side(d, 2, 6, g.positions()).unwrap(),
            max_pool2d(d, &p).unwrap(),
            max_pool2d_grad(d, &p).unwrap(),
            max_pool2d_pick(d, &p).unwrap(),
            max_pool2d_grad_picked(d, &p).unwrap(),
            max_pool2d_grad_per_element(d, &p).unwrap(),
        ]
    }

    #[test]
    fn a_blocks_windows_are_those_whose_taps_reach_it() {
        // resnet's 3x3 stride-2 pooling with padding 1: block i (rows 2i, 2i+1) is read by
        // windows i (taps 1, 2) and i + 1 (tap 0).
        assert_eq!(block_window_offsets(3, 2, 1, 1), [0, 1]);
        // 2x2 stride 2, no padding: window i alone.
        assert_eq!(block_window_offsets(2, 2, 0, 1), [0, 0]);
        // 3 taps at stride 1 with padding 1: windows i - 1 to i + 1.
        assert_eq!(block_window_offsets(3, 1, 1, 1), [-1, 1]);
        // Dilation 2, 3 taps, stride 1, no padding: windows i - 4 to i.
        assert_eq!(block_window_offsets(3, 1, 0, 2), [-4, 0]);
        // Against the definition: every window with a tap in the block is in the range, and
        // both ends of the range have one (for blocks far from the edges).
        for (k, s, p, dl) in [
            (3, 2, 1, 1),
            (2, 3, 1, 1),
            (4, 2, 3, 2),
            (1, 3, 0, 1),
            (5, 4, 2, 1),
        ] {
            let [lo, hi] = block_window_offsets(k, s, p, dl);
            let i = 20i64;
            let reads = |wi: i64| {
                (0..k as i64).any(|a| {
                    let x = wi * s as i64 - p as i64 + a * dl as i64;
                    (i * s as i64..(i + 1) * s as i64).contains(&x)
                })
            };
            let want: Vec<i64> = (0..60).filter(|&wi| reads(wi)).map(|wi| wi - i).collect();
            if let (Some(&a), Some(&b)) = (want.first(), want.last()) {
                assert_eq!([a, b], [lo, hi], "k {k} s {s} p {p} d {dl}");
            } else {
                assert!(lo > hi, "k {k} s {s} p {p} d {dl}: {lo}..={hi}");
            }
        }
    }

    #[test]
    fn window_kernels_are_balanced_named_by_their_text_and_use_no_bf16_helper_outside_bf16() {
        for d in [DType::F32, DType::F64, DType::BF16] {
            for k in every_kernel(d) {
                assert_eq!(
                    k.source.matches('{').count(),
                    k.source.matches('}').count(),
                    "{}",
                    k.source
                );
                assert!(k.source.contains(&k.name), "{}", k.source);
                if d != DType::BF16 {
                    assert!(!super::super::uses_bf16(&k.source), "{}", k.source);
                }
            }
        }
        // Distinct geometries give distinct kernels; the same one the same kernel.
        assert_ne!(
            im2col(DType::F32, &geometry(1), 2).unwrap().name,
            im2col(DType::F32, &geometry(2), 2).unwrap().name
        );
        assert_eq!(
            im2col(DType::F32, &geometry(2), 2).unwrap(),
            im2col(DType::F32, &geometry(2), 2).unwrap()
        );
    }

    #[test]
    fn window_kernels_refuse_integer_operands() {
        let e = im2col(DType::I32, &geometry(1), 1).unwrap_err();
        assert!(e.to_string().contains("im2col"), "{e}");
        assert!(max_pool2d(DType::Bool, &pool()).is_err());
    }

    #[test]
    fn the_column_buffer_holds_every_group_row_and_image_position() {
        let g = geometry(2);
        // K = C/g · kh · kw = 2 · 3 · 2; P = Ho · Wo.
        assert_eq!(g.col_rows(), 12);
        assert_eq!(column_len(&g, 3), 2 * 12 * 3 * g.positions());
    }
}
