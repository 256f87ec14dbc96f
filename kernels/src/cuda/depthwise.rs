//! CUDA C for channels-last depthwise convolutions (`groups = C_in = C_out`, one filter a
//! channel): `x [N, H, W, C]`, `w [C, kh, kw, 1]` (cuDNN's NHWC filter format), `y [N, Ho,
//! Wo, C]`, in the three passes, as direct loops over the window instead of a library call.
//!
//! A depthwise convolution does `kh·kw` multiply-adds an output element (49 for ConvNeXt's
//! 7x7): it is bound by memory, not arithmetic, and a GEMM (cuDNN's, or im2col's) spends its
//! time on the unfolding. Here every launch maps a warp onto 32 consecutive channels of one
//! pixel, so that each of its loads is a coalesced run of the channels-last row, and a thread
//! keeps one channel for the whole launch: the forward and data-gradient passes hold that
//! channel's `kh·kw` filter taps in registers, the filter gradient its `kh·kw` sums.
//!
//! Launch shape (every kernel here but [`depthwise_grad_weight_sum`]): blocks of 256 threads,
//! 8 warps; block `b` takes channel tile `b % T` (`T = ⌈C/32⌉` tiles of 32 channels) and
//! pixel group `b / T`; warp `i` of pixel group `q` takes pixels `8q + i`, `8q + i + 8G`, ...
//! (`G` pixel groups in the grid). Lanes past the last channel idle.
//!
//! Determinism: no atomics. Each output element of the forward and data-gradient passes is one
//! thread's sum over the taps in row-major order. The filter gradient is summed in two
//! launches: [`depthwise_grad_weight_partial`] sums each thread's pixels in order, then the 8
//! warps of a block in warp order through shared memory, into one partial sum per pixel group
//! in the workspace; [`depthwise_grad_weight_sum`] adds the `G` partials in group order. So a
//! step repeats bit for bit. Sums are in f32 (f64 for f64); a bf16 result is rounded once,
//! where it is stored.

use super::emit::{finish, grid_for, reads, signature, widened, writes, Ix, Src};
use super::kernel::{CodegenError, CudaKernel, Launch};
use crate::cpu::conv::ConvGeometry;
use crate::DType;

/// Threads per block: 8 warps.
const BLOCK: u32 = 256;
/// Warps (pixels at a time) per block.
const WARPS: usize = 8;
/// Channels of a tile: a warp's lanes.
const TILE: usize = 32;
/// The most filter taps (`kh·kw`) the kernels hold in registers; a larger depthwise filter
/// keeps cuDNN.
pub const MAX_TAPS: usize = 64;
/// Blocks the forward and data-gradient passes aim at: 8 per SM of a 132-SM GPU, which holds
/// them all resident at once; the pixel loop covers the rest.
const TARGET_BLOCKS: usize = 132 * 8;

/// Whether the kernels here run convolution `g`: depthwise (`groups = in_ch = out_ch`, one
/// filter a channel) with at most [`MAX_TAPS`] taps, and every extent nonzero.
pub fn runs(g: &ConvGeometry) -> bool {
    let taps = g.kernel[0] * g.kernel[1];
    g.groups == g.in_ch
        && g.out_ch == g.in_ch
        && g.in_ch > 0
        && g.batch > 0
        && (1..=MAX_TAPS).contains(&taps)
        && g.out_hw.iter().all(|&x| x > 0)
        && g.in_hw.iter().all(|&x| x > 0)
        && g.stride.iter().all(|&s| s > 0)
}

fn check(op: &'static str, d: DType, g: &ConvGeometry) -> Result<(), CodegenError> {
    if !matches!(d, DType::F32 | DType::F64 | DType::BF16) {
        return Err(CodegenError::Unsupported {
            op,
            what: "operand",
            dtype: d,
        });
    }
    if !runs(g) {
        return Err(CodegenError::Geometry {
            op,
            what: format!(
                "{} groups of {} input and {} output channels with {}x{} filters: only a \
                 depthwise convolution (one filter a channel) of at most {MAX_TAPS} taps",
                g.groups, g.in_ch, g.out_ch, g.kernel[0], g.kernel[1]
            ),
        });
    }
    let [h, w] = g.in_hw;
    let [ho, wo] = g.out_hw;
    for n in [[g.batch, h, w, g.in_ch], [g.batch, ho, wo, g.in_ch]] {
        n.iter()
            .try_fold(1usize, |a, &b| a.checked_mul(b))
            .ok_or_else(|| CodegenError::TooLarge {
                op,
                sizes: n.to_vec(),
            })?;
    }
    Ok(())
}

/// Channel tiles of 32.
fn tiles(g: &ConvGeometry) -> usize {
    g.in_ch.div_ceil(TILE)
}

/// Pixel groups of a launch over `pixels` pixels, at most `cap`.
fn groups_for(g: &ConvGeometry, pixels: usize, cap: usize) -> usize {
    let most = (TARGET_BLOCKS / tiles(g)).max(1);
    pixels.div_ceil(WARPS).min(most).min(cap).max(1)
}

/// Pixel groups (partial sums) of the filter gradient of dtype `d` within `workspace` bytes:
/// [`depthwise_grad_weight_scratch_bytes`]`(d, g, groups) <= workspace`. `None` where not
/// even one group's partials fit.
pub fn grad_weight_groups(d: DType, g: &ConvGeometry, workspace: usize) -> Option<usize> {
    let one = depthwise_grad_weight_scratch_bytes(d, g, 1);
    if one == 0 || workspace < one {
        return None;
    }
    let pixels = g.batch * g.out_hw[0] * g.out_hw[1];
    Some(groups_for(g, pixels, workspace / one))
}

/// Bytes of the filter gradient's partial sums over `groups` pixel groups: `groups · kh·kw ·
/// C` sums, f32 (f64 for f64 operands).
pub fn depthwise_grad_weight_scratch_bytes(d: DType, g: &ConvGeometry, groups: usize) -> usize {
    let e = if d == DType::F64 { 8 } else { 4 };
    groups * g.kernel[0] * g.kernel[1] * g.in_ch * e
}

fn acc(d: DType) -> &'static str {
    match d {
        DType::F64 => "double",
        _ => "float",
    }
}

fn store_sum(d: DType, v: &str) -> String {
    match d {
        DType::BF16 => format!("ig_bf16_bits({v})"),
        _ => v.to_string(),
    }
}

fn describe(g: &ConvGeometry) -> String {
    format!(
        "depthwise [{}, {}, {}, {}] (channels-last) by [{}, {}, {}] stride {:?} padding {:?} \
         dilation {:?} -> [{}, {}]",
        g.batch,
        g.in_hw[0],
        g.in_hw[1],
        g.in_ch,
        g.in_ch,
        g.kernel[0],
        g.kernel[1],
        g.stride,
        g.padding,
        g.dilation,
        g.out_hw[0],
        g.out_hw[1]
    )
}

/// A kernel being written: its text so far, its launch and its index type.
struct Frame {
    src: Src,
    launch: Launch,
    ix: Ix,
}

/// A kernel's first lines over `groups` pixel groups: what it computes, its launch, its
/// signature, and the thread's lane, warp, channel tile, pixel group and channel `c`.
fn frame(
    what: String,
    g: &ConvGeometry,
    params: &[(String, String)],
    groups: usize,
    extents: &[usize],
) -> Frame {
    let t = tiles(g);
    let launch = Launch {
        grid: [(t * groups) as u32, 1, 1],
        block: [BLOCK, 1, 1],
        shared_bytes: 0,
    };
    let ix = Ix::for_extents(extents.iter().copied());
    let mut src = Src::default();
    src.line(what);
    src.line(format!(
        "// launch: grid [{},1,1] ({t} channel tiles x {groups} pixel groups), block [{BLOCK},1,1]",
        t * groups
    ));
    src.open(signature(BLOCK, params));
    let ty = ix.ty();
    src.line(format!(
        "const {ty} lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;"
    ));
    src.line(format!(
        "const {ty} tile = blockIdx.x % {}, group = blockIdx.x / {};",
        ix.lit(t),
        ix.lit(t)
    ));
    src.line(format!("const {ty} c = tile * {} + lane;", ix.lit(TILE)));
    src.line(format!("const bool active = c < {};", ix.lit(g.in_ch)));
    Frame { src, launch, ix }
}

/// Opens the loop over the thread's pixels `pix < pixels`.
fn open_pixels(f: &mut Frame, pixels: usize, groups: usize) {
    let (ix, ty) = (f.ix, f.ix.ty());
    f.src.open(format!(
        "for ({ty} pix = group * {} + warp; pix < {}; pix += {}) {{",
        ix.lit(WARPS),
        ix.lit(pixels),
        ix.lit(groups * WARPS)
    ));
}

/// Loads the thread's `taps` filter values `w[c, ·]` into registers `wr` (zeros for an idle
/// lane).
fn filter_in_registers(f: &mut Frame, d: DType, taps: usize) {
    let a = acc(d);
    f.src.line(format!("{a} wr[{taps}];"));
    f.src.line("#pragma unroll");
    f.src.open(format!("for (int k = 0; k < {taps}; ++k) {{"));
    f.src.line(format!(
        "wr[k] = active ? ({a}){} : ({a})0;",
        widened(d, format!("w[c * {} + k]", f.ix.lit(taps)))
    ));
    f.src.close();
}

/// Declares output pixel `pix`'s coordinates `n`, `oh` and `ow` (NHWC order, `pix` counting
/// output pixels).
fn output_pixel(f: &mut Frame, g: &ConvGeometry) {
    let (ix, ty) = (f.ix, f.ix.ty());
    let [ho, wo] = g.out_hw;
    f.src.line(format!(
        "const long long ow = (long long)(pix % {});",
        ix.lit(wo)
    ));
    f.src.line(format!(
        "const long long oh = (long long)((pix / {}) % {});",
        ix.lit(wo),
        ix.lit(ho)
    ));
    f.src
        .line(format!("const {ty} n = pix / {};", ix.lit(ho * wo)));
}

/// Opens the loops over the filter's taps `i`, `j` (row-major) of output pixel `(n, oh, ow)`,
/// skipping taps that fall in the padding, and returns the input element `x[n, ih, iw, c]`
/// they read, widened to the accumulator's type; the caller closes both loops.
fn open_taps(f: &mut Frame, d: DType, g: &ConvGeometry) -> String {
    let (ix, ty) = (f.ix, f.ix.ty());
    let ([h, w], [kh, kw]) = (g.in_hw, g.kernel);
    let src = &mut f.src;
    src.line("#pragma unroll");
    src.open(format!("for (int i = 0; i < {kh}; ++i) {{"));
    src.line(format!(
        "const long long ih = oh * {} - {} + (long long)i * {};",
        g.stride[0], g.padding[0], g.dilation[0]
    ));
    src.line(format!("if (ih < 0 || ih >= {h}) continue;"));
    src.line("#pragma unroll");
    src.open(format!("for (int j = 0; j < {kw}; ++j) {{"));
    src.line(format!(
        "const long long iw = ow * {} - {} + (long long)j * {};",
        g.stride[1], g.padding[1], g.dilation[1]
    ));
    src.line(format!("if (iw < 0 || iw >= {w}) continue;"));
    widened(
        d,
        format!(
            "x[((n * {} + ({ty})ih) * {} + ({ty})iw) * {} + c]",
            ix.lit(h),
            ix.lit(w),
            ix.lit(g.in_ch)
        ),
    )
}

/// `y = conv(x, w)`. Params: x, w, y.
pub fn depthwise_forward(d: DType, g: &ConvGeometry) -> Result<CudaKernel, CodegenError> {
    check("depthwise_forward", d, g)?;
    let [h, w] = g.in_hw;
    let [ho, wo] = g.out_hw;
    let [kh, kw] = g.kernel;
    let pixels = g.batch * ho * wo;
    let groups = groups_for(g, pixels, usize::MAX);
    let params = [reads(d, "x"), reads(d, "w"), writes(d, "y")];
    let extents = [g.batch * h * w * g.in_ch, pixels * g.in_ch];
    let mut f = frame(
        format!("// ingot depthwise_forward: {}", describe(g)),
        g,
        &params,
        groups,
        &extents,
    );
    filter_in_registers(&mut f, d, kh * kw);
    f.src.open("if (active) {");
    open_pixels(&mut f, pixels, groups);
    let (ix, a) = (f.ix, acc(d));
    output_pixel(&mut f, g);
    f.src.line(format!("{a} sum = ({a})0;"));
    let x = open_taps(&mut f, d, g);
    let src = &mut f.src;
    src.line(format!("sum += wr[i * {kw} + j] * ({a}){x};"));
    src.close();
    src.close();
    src.line(format!(
        "y[pix * {} + c] = {};",
        ix.lit(g.in_ch),
        store_sum(d, "sum")
    ));
    src.close();
    src.close();
    src.close();
    Ok(finish(f.src.text, f.launch))
}

/// `dx` from `dy` and `w`: each input element gathers `dy` from the windows that read it,
/// taps in row-major order. Params: dy, w, dx.
pub fn depthwise_grad_input(d: DType, g: &ConvGeometry) -> Result<CudaKernel, CodegenError> {
    check("depthwise_grad_input", d, g)?;
    let [h, w] = g.in_hw;
    let [ho, wo] = g.out_hw;
    let [kh, kw] = g.kernel;
    let pixels = g.batch * h * w;
    let groups = groups_for(g, pixels, usize::MAX);
    let params = [reads(d, "dy"), reads(d, "w"), writes(d, "dx")];
    let extents = [pixels * g.in_ch, g.batch * ho * wo * g.in_ch];
    let mut f = frame(
        format!("// ingot depthwise_grad_input: {}", describe(g)),
        g,
        &params,
        groups,
        &extents,
    );
    filter_in_registers(&mut f, d, kh * kw);
    f.src.open("if (active) {");
    open_pixels(&mut f, pixels, groups);
    let (ix, ty, a) = (f.ix, f.ix.ty(), acc(d));
    let src = &mut f.src;
    src.line(format!(
        "const long long iw = (long long)(pix % {});",
        ix.lit(w)
    ));
    src.line(format!(
        "const long long ih = (long long)((pix / {}) % {});",
        ix.lit(w),
        ix.lit(h)
    ));
    src.line(format!("const {ty} n = pix / {};", ix.lit(h * w)));
    src.line(format!("{a} sum = ({a})0;"));
    src.line("#pragma unroll");
    src.open(format!("for (int i = 0; i < {kh}; ++i) {{"));
    src.line(format!(
        "const long long th = ih + {} - (long long)i * {};",
        g.padding[0], g.dilation[0]
    ));
    src.line(format!(
        "if (th < 0 || th % {} != 0 || th / {} >= {ho}) continue;",
        g.stride[0], g.stride[0]
    ));
    src.line("#pragma unroll");
    src.open(format!("for (int j = 0; j < {kw}; ++j) {{"));
    src.line(format!(
        "const long long tw = iw + {} - (long long)j * {};",
        g.padding[1], g.dilation[1]
    ));
    src.line(format!(
        "if (tw < 0 || tw % {} != 0 || tw / {} >= {wo}) continue;",
        g.stride[1], g.stride[1]
    ));
    src.line(format!(
        "sum += wr[i * {kw} + j] * ({a}){};",
        widened(
            d,
            format!(
                "dy[((n * {} + ({ty})(th / {})) * {} + ({ty})(tw / {})) * {} + c]",
                ix.lit(ho),
                g.stride[0],
                ix.lit(wo),
                g.stride[1],
                ix.lit(g.in_ch)
            )
        )
    ));
    src.close();
    src.close();
    src.line(format!(
        "dx[pix * {} + c] = {};",
        ix.lit(g.in_ch),
        store_sum(d, "sum")
    ));
    src.close();
    src.close();
    src.close();
    Ok(finish(f.src.text, f.launch))
}

/// The filter gradient's first launch, over `groups` pixel groups
/// ([`grad_weight_groups`]): each block's sums of `dy · x` over its pixels, for its 32
/// channels and every tap, into `part [groups, kh·kw, C]` (f32; f64 for f64). Params: x, dy,
/// part.
pub fn depthwise_grad_weight_partial(
    d: DType,
    g: &ConvGeometry,
    groups: usize,
) -> Result<CudaKernel, CodegenError> {
    check("depthwise_grad_weight_partial", d, g)?;
    let [h, w] = g.in_hw;
    let [ho, wo] = g.out_hw;
    let [kh, kw] = g.kernel;
    let taps = kh * kw;
    let pixels = g.batch * ho * wo;
    let groups = groups.clamp(1, pixels.div_ceil(WARPS));
    let a = acc(d);
    let params = [
        reads(d, "x"),
        reads(d, "dy"),
        (format!("{a}*"), "part".to_string()),
    ];
    let extents = [
        g.batch * h * w * g.in_ch,
        pixels * g.in_ch,
        groups * taps * g.in_ch,
    ];
    let mut f = frame(
        format!(
            "// ingot depthwise_grad_weight_partial: {}, {groups} partial sums",
            describe(g)
        ),
        g,
        &params,
        groups,
        &extents,
    );
    let (ix, ty) = (f.ix, f.ix.ty());
    f.src.line(format!("{a} s[{taps}];"));
    f.src.line("#pragma unroll");
    f.src
        .line(format!("for (int k = 0; k < {taps}; ++k) s[k] = ({a})0;"));
    f.src.open("if (active) {");
    open_pixels(&mut f, pixels, groups);
    output_pixel(&mut f, g);
    f.src.line(format!(
        "const {a} gy = ({a}){};",
        widened(d, format!("dy[pix * {} + c]", ix.lit(g.in_ch)))
    ));
    let x = open_taps(&mut f, d, g);
    let src = &mut f.src;
    src.line(format!("s[i * {kw} + j] += gy * ({a}){x};"));
    src.close();
    src.close();
    src.close();
    src.close();
    // The block's 8 warps added in warp order, a tap at a time, through shared memory.
    src.line(format!("__shared__ {a} red[{WARPS}][{TILE}];"));
    src.line("#pragma unroll");
    src.open(format!("for (int k = 0; k < {taps}; ++k) {{"));
    src.line("red[warp][lane] = s[k];");
    src.line("__syncthreads();");
    src.open("if (warp == 0 && active) {");
    src.line(format!("{a} t = red[0][lane];"));
    src.line(format!(
        "for (int v = 1; v < {WARPS}; ++v) t += red[v][lane];"
    ));
    src.line(format!(
        "part[(group * {} + ({ty})k) * {} + c] = t;",
        ix.lit(taps),
        ix.lit(g.in_ch)
    ));
    src.close();
    src.line("__syncthreads();");
    src.close();
    src.close();
    Ok(finish(f.src.text, f.launch))
}

/// The filter gradient's second launch: `dw[c, tap]` the sum of the `groups` partials of
/// [`depthwise_grad_weight_partial`], in group order. Params: part, dw.
pub fn depthwise_grad_weight_sum(
    d: DType,
    g: &ConvGeometry,
    groups: usize,
) -> Result<CudaKernel, CodegenError> {
    check("depthwise_grad_weight_sum", d, g)?;
    let taps = g.kernel[0] * g.kernel[1];
    let pixels = g.batch * g.out_hw[0] * g.out_hw[1];
    let groups = groups.clamp(1, pixels.div_ceil(WARPS));
    let total = taps * g.in_ch;
    let a = acc(d);
    let ix = Ix::for_extents([groups * total]);
    let ty = ix.ty();
    let launch = Launch {
        grid: [grid_for(total, BLOCK as usize, usize::MAX), 1, 1],
        block: [BLOCK, 1, 1],
        shared_bytes: 0,
    };
    let params = [(format!("const {a}*"), "part".to_string()), writes(d, "dw")];
    let mut src = Src::default();
    src.line(format!(
        "// ingot depthwise_grad_weight_sum: {}, {groups} partial sums",
        describe(g)
    ));
    src.line(format!(
        "// launch: grid [{},1,1], block [{BLOCK},1,1]",
        launch.grid[0]
    ));
    src.open(signature(BLOCK, &params));
    src.line(format!("const {ty} e = {};", ix.global_thread(BLOCK)));
    src.line(format!("if (e >= {}) return;", ix.lit(total)));
    // dw is [C, kh·kw]; the partials are [groups, kh·kw, C].
    src.line(format!(
        "const {ty} c = e / {}, k = e % {};",
        ix.lit(taps),
        ix.lit(taps)
    ));
    src.line(format!("{a} t = ({a})0;"));
    src.line(format!(
        "for ({ty} q = 0; q < {}; ++q) t += part[(q * {} + k) * {} + c];",
        ix.lit(groups),
        ix.lit(taps),
        ix.lit(g.in_ch)
    ));
    src.line(format!("dw[e] = {};", store_sum(d, "t")));
    src.close();
    Ok(finish(src.text, launch))
}
