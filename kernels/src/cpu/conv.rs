//! 2-d convolution over NCHW images on the CPU, forward and both backward passes, as im2col
//! (or its adjoint col2im) plus the packed GEMM of [`super::gemm()`]. Each pass is cut into
//! units of work (an image and a group; for the weight gradient, a group and a range of its
//! input channels) spread over up to [`MAX_LANES`] lanes, each lane with its own column buffer
//! `[channels · kh · kw, Ho · Wo]` and GEMM packing space carved from a workspace the caller
//! gives ([`workspace_len`]): the runtime plans it in the slab, so a step allocates nothing.
//! The pool's threads take the lanes, so small images (whose GEMMs are too small to spread
//! over threads) still use every core.
//!
//! - forward: `y[n, group] = W_g · col(x[n, group])` (`[O/g, K] × [K, P]`);
//! - input gradient: `dx[n, group] = col2im(W_gᵀ · dy[n, group])`;
//! - weight gradient: `dW_g[:, range] = Σ_n dy[n, group] · col(x[n, range])ᵀ`, images in order.
//!
//! A pointwise convolution (1x1, stride 1, no padding: [`is_pointwise`]) has the image itself
//! as its column buffer, so its passes read `x` and write `dx` in place, with no im2col or
//! col2im.
//!
//! Images with few output positions (a ResNet's later layers on 32x32 images: 4x4 down to
//! 1x1) make per-image GEMMs that are nearly matrix-vector products, each reading and packing
//! the whole weight (or, in the weight gradient, reading and writing the whole `dw`) for a
//! handful of columns. With one group, such a pass runs in blocks of images whose column
//! buffers lie side by side, one GEMM a block ([`BLOCK_COLUMNS`], [`WEIGHT_BLOCK_COLUMNS`]).
//!
//! Every element is summed by one GEMM whose order depends only on the reduction's length
//! (see [`mod@super::gemm`]), whichever lane or thread runs its unit, so results repeat bit for
//! bit on any number of threads, and equal those of one image and one whole group at a time;
//! except the weight gradient in parts of the images or in blocks of them, whose reductions
//! run over a part's sums added in order or a block's images at once: their order is fixed by
//! the geometry (the same bits on any threads and in any workspace), but it is not the
//! per-image order.
//! [`reference()`] computes the forward pass with plain loops in f64, for tests.
//!
//! One-pixel images under a kernel larger than them (a ResNet's last stage on small inputs)
//! run through the one tap that reaches the pixel instead ([`super::conv_one_tap`]).

pub use super::conv_geometry::{ConvError, ConvGeometry, Pass};
use super::conv_one_tap as one_tap;
use super::gemm::{gemm_ws, gemm_ws_alone, workspace_len as gemm_len, GemmError};
use super::matmul::{GemmScalar, MatLayout};
use super::par::{for_each_block, pool_threads, PARALLEL_ELEMENTS};
use super::scalar::{Float, Scalar};

/// Most lanes a pass is cut into: each lane owns a slice of the workspace (its column buffer
/// and GEMM packing space) and runs its share of the pass's units (images and groups, or for
/// the weight gradient groups and channel ranges) one after the other; the pool's threads take
/// lanes. Sixteen keeps the cores of a 16-core host busy on small images, where one image's
/// GEMM is too small to spread over threads.
pub const MAX_LANES: usize = 16;

/// Fewest columns of the weight gradient (channels times kernel taps) a channel range takes:
/// every range packs each image's output gradient again for its GEMM, which narrower ranges
/// would not repay (measured on cnn in session 32: with 18-column ranges the packing took 14%
/// of a step).
pub const MIN_RANGE_COLUMNS: usize = 128;

/// Columns (images times output positions) a block of images gives the forward and
/// input-gradient GEMMs: images with fewer output positions than half this (a ResNet's
/// later layers on small images: 8x8 down to 2x2) run several to one GEMM, so that the
/// weights are packed once a block rather than once an image. One GEMM panel's width
/// ([`super::gemm::NC`]): a block's GEMM then has as many columns as the GEMM's threads
/// split one panel's tiles over (session 39: with 256 columns, resnet18's small-image
/// convolutions ran in GEMMs of 8 to 64 columns on 16 threads, each packing the whole weight
/// for them). Their sums are the same sums in the same order ([`mod@super::gemm`]: a
/// function of the reduction's length only), so a block gives the bits of one image at a
/// time.
pub const BLOCK_COLUMNS: usize = super::gemm::NC;

/// Columns a block of images gives the weight gradient's GEMM, whose reduction runs over
/// them: below half this many output positions an image, the images of a block are summed
/// as one reduction (rather than one rank-`positions` update of the whole weight gradient
/// an image). That changes the order of the sums, so it is a function of the geometry (and
/// the element's size) alone and the least workspace holds one block. Session 39 tried a GEMM
/// panel's width, as [`BLOCK_COLUMNS`]: resnet18's weight gradients ran faster on 16 threads,
/// but the least workspace grew with it (an imported CNN's CPU plan 87.0 -> 127.5 KiB, its
/// peak that workspace) and recomputing a ResNet's blocks under a budget no longer lowered
/// its peak; so 64, for batches of fewer than [`WIDE_WEIGHT_COLUMNS`] columns.
pub const WEIGHT_BLOCK_COLUMNS: usize = 64;

/// Reduction columns (images times output positions) from which a weight gradient's blocks of
/// images are a GEMM's reduction block wide ([`super::gemm::KC`], 256 columns) rather than
/// [`WEIGHT_BLOCK_COLUMNS`]: two of its reduction blocks. Blocks of `KC` columns chained
/// (`β = 1`) sum every element as one GEMM over all their columns would (the GEMM folds each
/// `KC` block's sum into `C` the same way), so with positions dividing `KC` a part's blocks are
/// the bits of one product over the part, whatever the block. Session 41's profile of resnet18
/// on 16 threads had its weight gradients in 64-column blocks at 4x4 and 2x2 (32 and 8 GEMMs a
/// pass, each reading and writing all of `dw` for 64 terms of its sums, one after the other)
/// at 13.7 and 8.3 ms a step. Smaller batches (an imported CNN's 4 images, whose plan's peak
/// is near such a workspace) keep 64.
pub const WIDE_WEIGHT_COLUMNS: usize = 2 * super::gemm::KC;

/// Columns a block of images gives the weight gradient of `g`: [`super::gemm::KC`] where the
/// batch has at least [`WIDE_WEIGHT_COLUMNS`] columns, else [`WEIGHT_BLOCK_COLUMNS`].
fn weight_block_columns(g: &ConvGeometry) -> usize {
    if g.batch.saturating_mul(g.positions()) >= WIDE_WEIGHT_COLUMNS {
        super::gemm::KC
    } else {
        WEIGHT_BLOCK_COLUMNS
    }
}

/// Fewest reduction columns (images times output positions) a part of the weight gradient's
/// images sums (`image_parts`): a pass whose images hold at least two such parts sums them
/// apart, up to [`MAX_LANES`] parts, and adds the parts' sums in order. Session 39's profile of
/// cnn on 16 threads had conv2's weight gradient (64x288 outputs summed over 25,088 positions,
/// two channel ranges) at 9.1 of 25.6 ms: its sums over the images ran on one lane each.
pub const MIN_PART_POSITIONS: usize = 1024;

/// Bytes of workspace a pass's lanes (and the weight gradient's partial sums) ask for at most
/// ([`workspace_len_up_to`]): large images (a ResNet-50 at 224x224) have column buffers of
/// several MiB each, and their GEMMs are large enough to use the threads alone; small ones fit
/// sixteen lanes.
pub const LANE_BUDGET_BYTES: usize = 8 << 20;

/// How one pass is cut into units of work and lanes: a function of the geometry, the pass,
/// the element type and the workspace's length only (never of the threads). The planner
/// gives every convolution at least one lane's workspace ([`workspace_len`]) and, where the
/// step's slab has free bytes around it, up to [`workspace_len_up_to`]; the kernel runs as
/// many lanes as it was given, and every unit computes the same bits whichever lane runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Split {
    /// Units of work: `(image, group)` pairs for the forward and input-gradient passes,
    /// `(group, channel range)` pairs for the weight gradient.
    units: usize,
    /// Input channels per unit (all of a group's, except in the weight gradient's ranges).
    chunk: usize,
    /// Lanes the units are spread over, each with `lane_len` elements of workspace.
    lanes: usize,
    lane_len: usize,
    /// Images per unit: one, or a block of several ([`BLOCK_COLUMNS`]) whose columns make one
    /// GEMM (then the unit covers every channel: such blocks are cut only with one group).
    images: usize,
    /// Elements of a lane's column buffer (zero for a pointwise convolution, which reads its
    /// operands in place).
    col_len: usize,
    /// Elements of a block's output (or output gradient) with its images side by side
    /// (`[out_ch, images · positions]`), after the column buffer; zero for one image.
    tmp_len: usize,
    /// Elements of the weight gradient's partial sums, one block per unit, before the lanes
    /// (none when each unit covers a whole group and writes its block of `dw` in place).
    partial: usize,
    /// The most lanes this cut can use: one per unit, at most [`MAX_LANES`], within
    /// [`LANE_BUDGET_BYTES`].
    most: usize,
    /// Parts of the images the weight gradient sums apart, each into its lane's own
    /// `[O/g, K]` block after the column buffer and the side-by-side output gradient
    /// ([`image_parts`]); one otherwise.
    parts: usize,
}

impl Split {
    /// Elements of workspace the cut takes with `lanes` lanes.
    fn len(&self, lanes: usize) -> usize {
        self.partial + lanes * self.lane_len
    }

    /// The cut with as many lanes as `avail` elements hold (`None`: not even one).
    fn within(mut self, avail: usize) -> Option<Split> {
        let lanes = avail.checked_sub(self.partial)? / self.lane_len;
        self.lanes = lanes.min(self.most);
        (self.lanes >= 1).then_some(self)
    }
}

/// A 1x1 convolution with unit stride and no padding: its column buffer would be a copy of
/// the input, so every pass reads and writes the images in place.
pub fn is_pointwise(g: &ConvGeometry) -> bool {
    g.kernel == [1, 1] && g.stride == [1, 1] && g.padding == [0, 0]
}

/// The cut of `pass` with each group's input channels cut into `ranges` ranges (the weight
/// gradient's; one for the other passes), with one lane, and with as many at most as
/// [`LANE_BUDGET_BYTES`] holds (at least one).
fn cut<T: GemmScalar>(g: &ConvGeometry, pass: Pass, ranges: usize) -> Split {
    let (og, cg, p) = (g.out_ch / g.groups, g.in_ch / g.groups, g.positions());
    let taps = g.kernel[0] * g.kernel[1];
    let chunk = cg.div_ceil(ranges.max(1)).max(1);
    let (units, gemm) = match pass {
        Pass::Forward => (g.batch * g.groups, gemm_len::<T>(og, cg * taps, p)),
        Pass::GradInput => (g.batch * g.groups, gemm_len::<T>(cg * taps, og, p)),
        Pass::GradWeight => (
            g.groups * cg.div_ceil(chunk),
            gemm_len::<T>(og, p, chunk * taps),
        ),
    };
    let col_len = if is_pointwise(g) { 0 } else { chunk * taps * p };
    // At least one element, so that the lanes' slices can always be cut.
    let lane_len = (col_len + gemm).max(1);
    // Units that cover a whole group write its rows of the weight gradient in place.
    let partial = match pass {
        Pass::GradWeight if chunk < cg => units * og * chunk * taps,
        _ => 0,
    };
    let budget = LANE_BUDGET_BYTES / std::mem::size_of::<T>().max(1);
    let cap = (budget.saturating_sub(partial) / lane_len).max(1);
    Split {
        units,
        chunk,
        lanes: 1,
        lane_len,
        images: 1,
        col_len,
        tmp_len: 0,
        partial,
        most: units.clamp(1, MAX_LANES).min(cap),
        parts: 1,
    }
}

/// Parts of the images a weight gradient sums apart (a function of the geometry alone, so
/// its bits are the same on any threads and in any workspace): one per [`MIN_PART_POSITIONS`]
/// reduction columns, at most [`MAX_LANES`] and one per image; one (no parts) for the other
/// passes. A part of small images sums them in blocks ([`part_cut`]).
fn image_parts(g: &ConvGeometry, pass: Pass) -> usize {
    if pass != Pass::GradWeight {
        return 1;
    }
    let columns = g.batch.saturating_mul(g.positions());
    (columns / MIN_PART_POSITIONS)
        .clamp(1, MAX_LANES)
        .min(g.batch.max(1))
}

/// The weight gradient's cut into `(group, part of the images)` units ([`image_parts`]), where
/// it has parts and one lane (a whole group's column buffer, GEMM space and `[O/g, K]` block of
/// sums) fits [`LANE_BUDGET_BYTES`]. The least workspace grows by that block (one image's
/// `[O/g, K]` of partial sums: cnn's conv2 72 KiB), and each lane the planner grants holds one.
/// Where the weight gradient has blocks of images ([`block_images`]), each part sums its images
/// in blocks of that many (the first from the part's first image), so a lane holds a block's
/// column buffer and side-by-side output gradient (`tmp_len`) before its block of sums.
fn part_cut<T: GemmScalar>(g: &ConvGeometry) -> Option<Split> {
    let parts = image_parts(g, Pass::GradWeight);
    if parts < 2 {
        return None;
    }
    let (og, cg, p) = (g.out_ch / g.groups, g.in_ch / g.groups, g.positions());
    let k = cg * g.kernel[0] * g.kernel[1];
    let images = block_images::<T>(g, Pass::GradWeight).unwrap_or(1);
    let cols = images * p;
    let (col_len, tmp_len) = match images {
        1 if is_pointwise(g) => (0, 0),
        1 => (k * p, 0),
        _ => (k * cols, og * cols),
    };
    let lane_len = col_len + tmp_len + og * k + gemm_len::<T>(og, cols, k);
    let budget = LANE_BUDGET_BYTES / std::mem::size_of::<T>().max(1);
    if lane_len > budget {
        return None;
    }
    let units = g.groups * parts;
    Some(Split {
        units,
        chunk: cg,
        lanes: 1,
        lane_len,
        images,
        col_len,
        tmp_len,
        partial: 0,
        most: units.clamp(1, MAX_LANES).min(budget / lane_len),
        parts,
    })
}

/// [`block_images`] for any element type's budget test: whether `pass` has blocks of images
/// at all, by the columns alone (the budget only lowers their images).
fn block_images_of(g: &ConvGeometry, pass: Pass) -> Option<usize> {
    let columns = match pass {
        Pass::GradWeight => weight_block_columns(g),
        _ => BLOCK_COLUMNS,
    };
    let most = (columns / g.positions().max(1)).min(g.batch);
    (g.groups == 1 && most >= 2).then_some(most)
}

/// Images per block of `pass` (see [`BLOCK_COLUMNS`] and [`WEIGHT_BLOCK_COLUMNS`]), fewer
/// where one lane of them would pass [`LANE_BUDGET_BYTES`] (many channels); `None` where
/// blocks would hold one image, or the convolution has several groups.
fn block_images<T: GemmScalar>(g: &ConvGeometry, pass: Pass) -> Option<usize> {
    let most = block_images_of(g, pass)?;
    let budget = LANE_BUDGET_BYTES / std::mem::size_of::<T>().max(1);
    (2..=most)
        .rev()
        .find(|&images| block_cut_of::<T>(g, pass, images).len(1) <= budget)
}

/// The cut of `pass` into blocks of images, each unit one block through one GEMM (one lane
/// for the weight gradient, whose blocks add into `dw` one after the other), where
/// [`block_images`] gives blocks.
fn block_cut<T: GemmScalar>(g: &ConvGeometry, pass: Pass) -> Option<Split> {
    Some(block_cut_of::<T>(g, pass, block_images::<T>(g, pass)?))
}

/// The cut of `pass` into blocks of `images` images (one lane at least; see [`block_cut`]).
fn block_cut_of<T: GemmScalar>(g: &ConvGeometry, pass: Pass, images: usize) -> Split {
    let (o, k, cols) = (g.out_ch, g.col_rows(), images * g.positions());
    let gemm = match pass {
        Pass::Forward => gemm_len::<T>(o, k, cols),
        Pass::GradInput => gemm_len::<T>(k, o, cols),
        Pass::GradWeight => gemm_len::<T>(o, cols, k),
    };
    let (col_len, tmp_len) = (k * cols, o * cols);
    let lane_len = (col_len + tmp_len + gemm).max(1);
    let units = g.batch.div_ceil(images);
    let budget = LANE_BUDGET_BYTES / std::mem::size_of::<T>().max(1);
    let most = match pass {
        Pass::GradWeight => 1,
        _ => units.clamp(1, MAX_LANES).min((budget / lane_len).max(1)),
    };
    Split {
        units,
        chunk: g.in_ch,
        lanes: 1,
        lane_len,
        images,
        col_len,
        tmp_len,
        partial: 0,
        most,
        parts: 1,
    }
}

/// The forward or input-gradient pass's blocks of images in `avail` elements: full blocks
/// with as many lanes as fit, else one lane of the largest block (two images at least) that
/// fits. Their bits do not depend on the images a block, so the workspace may choose them.
fn block_within<T: GemmScalar>(g: &ConvGeometry, pass: Pass, avail: usize) -> Option<Split> {
    let full = block_cut::<T>(g, pass)?;
    if let Some(s) = full.within(avail) {
        return Some(s);
    }
    largest_block::<T>(g, pass, full.images, |b| b.len(1) <= avail)
}

/// One lane of the largest block of two to `most` images for which `fits` holds (what
/// [`block_within`] and [`least_block`] look for under their two bounds).
fn largest_block<T: GemmScalar>(
    g: &ConvGeometry,
    pass: Pass,
    most: usize,
    fits: impl Fn(&Split) -> bool,
) -> Option<Split> {
    (2..=most)
        .rev()
        .map(|images| block_cut_of::<T>(g, pass, images))
        .find(|b| fits(b))
}

/// The cuts `pass` may run: whole groups (the least workspace: one image and group's column
/// buffer and GEMM space, as before lanes), and for the weight gradient, which sums over the
/// images and so has only the groups to spread, channel ranges too: up to [`MAX_LANES`]
/// units in all of [`MIN_RANGE_COLUMNS`] columns at least, each summing its channels'
/// products over every image in order into partial sums copied into `dw` at the end; fewer
/// ranges where their partial sums and lanes would pass [`LANE_BUDGET_BYTES`]. A weight
/// gradient in parts of the images ([`part_cut`]), or else in blocks of images
/// ([`WEIGHT_BLOCK_COLUMNS`]), runs that cut alone.
fn cuts<T: GemmScalar>(g: &ConvGeometry, pass: Pass) -> [Split; 2] {
    let whole = cut::<T>(g, pass, 1);
    if pass != Pass::GradWeight {
        return [whole, whole];
    }
    if let Some(b) = part_cut::<T>(g).or_else(|| block_cut::<T>(g, pass)) {
        return [b, b];
    }
    let cg = g.in_ch / g.groups.max(1);
    let widest = (cg * g.kernel[0] * g.kernel[1] / MIN_RANGE_COLUMNS).max(1);
    let budget = LANE_BUDGET_BYTES / std::mem::size_of::<T>().max(1);
    let mut ranges = (MAX_LANES / g.groups.max(1))
        .clamp(1, cg.max(1))
        .min(widest);
    loop {
        let s = cut::<T>(g, pass, ranges);
        if ranges == 1 || s.len(s.most) <= budget {
            return [whole, s];
        }
        ranges /= 2;
    }
}

/// The cut `pass` runs in `avail` elements of workspace: blocks of images where the forward
/// and input-gradient passes have them and `avail` holds one lane of two images at least
/// ([`block_within`]: the same bits as one image at a time, in fewer and larger GEMMs); else the cut with the most lanes (whole
/// groups on a tie); `None` when `avail` is short of [`workspace_len`].
fn split<T: GemmScalar>(g: &ConvGeometry, pass: Pass, avail: usize) -> Option<Split> {
    let [whole, ranged] = cuts::<T>(g, pass);
    let whole = whole.within(avail)?;
    if pass != Pass::GradWeight {
        if let Some(b) = block_within::<T>(g, pass, avail) {
            return Some(b);
        }
    }
    Some(match ranged.within(avail) {
        Some(r) if r.lanes > whole.lanes => r,
        _ => whole,
    })
}

/// Elements of workspace `pass` needs at least: for a one-pixel convolution, its one GEMM
/// over the batch ([`one_tap::workspace_len`]); else one lane's column buffer (none for a
/// pointwise convolution) and GEMM packing space, one image and group at a time, or, for the
/// weight gradient in blocks of images (`block_images`), one lane of a whole block, and for the
/// other passes one lane of the largest block within [`LEAST_BLOCK_GROWTH`] of one image's.
/// Session 39 tried the least holding a whole block for every pass: plans grew where a
/// convolution's workspace was the peak (see [`WEIGHT_BLOCK_COLUMNS`]).
pub fn workspace_len<T: GemmScalar>(g: &ConvGeometry, pass: Pass) -> usize {
    if one_tap::live_tap(g).is_some() {
        return one_tap::workspace_len::<T>(g, pass);
    }
    let one = cuts::<T>(g, pass)[0].len(1);
    match pass {
        // Its blocks fix the order of its sums: the least workspace holds one.
        Pass::GradWeight => block_cut::<T>(g, pass).map_or(one, |b| b.len(1).max(one)),
        // Blocks of any size give the same bits ([`block_within`]): the least holds the
        // largest block within a quarter more than one image's ([`LEAST_BLOCK_GROWTH`]),
        // and the planner grants up to a whole block where the peak leaves room
        // ([`workspace_len_up_to`]).
        Pass::Forward | Pass::GradInput => {
            least_block::<T>(g, pass).map_or(one, |b| b.len(1).max(one))
        }
    }
}

/// How much more than one image's lane the least workspace of a forward or input-gradient
/// pass in blocks of images may be, in quarters: 5 (a quarter more). The planner grants
/// these passes more only from the slab's free bytes, and at the peak of a ResNet's step
/// (its last layer's input gradient, 1x1 images) there are none: one image a GEMM there
/// packs the whole weight for one column, the costliest op of the step (a third of
/// resnet18's on 2 threads); a block of 13 images costs 0.26 MB more.
pub const LEAST_BLOCK_GROWTH: usize = 5;

/// The block of images the least workspace of a forward or input-gradient pass holds (see
/// [`workspace_len`]): `None` for the weight gradient, where blocks are cut otherwise, and
/// where no block of two images fits.
fn least_block<T: GemmScalar>(g: &ConvGeometry, pass: Pass) -> Option<Split> {
    if pass == Pass::GradWeight {
        return None;
    }
    let full = block_cut::<T>(g, pass)?;
    let one = cut::<T>(g, pass, 1).len(1);
    largest_block::<T>(g, pass, full.images, |b| {
        4 * b.len(1) <= LEAST_BLOCK_GROWTH * one
    })
}

/// Elements of workspace `pass` runs fastest in: blocks of images where it has them (as many
/// lanes of them as it can use within [`LANE_BUDGET_BYTES`]), else every lane it can use (one
/// per unit, at most [`MAX_LANES`], within the budget), with the weight gradient's partial
/// sums where its channel ranges give more lanes than its groups.
pub fn workspace_len_up_to<T: GemmScalar>(g: &ConvGeometry, pass: Pass) -> usize {
    if one_tap::live_tap(g).is_some() {
        return workspace_len::<T>(g, pass);
    }
    if let Some(c) = part_cut::<T>(g).filter(|_| pass == Pass::GradWeight) {
        return c.len(c.most);
    }
    if let Some(b) = block_cut::<T>(g, pass) {
        return b.len(b.most).max(workspace_len::<T>(g, pass));
    }
    let [whole, ranged] = cuts::<T>(g, pass);
    if ranged.most > whole.most {
        ranged.len(ranged.most)
    } else {
        whole.len(whole.most)
    }
}

/// [`workspace_len`] in bytes.
pub fn workspace_bytes<T: GemmScalar>(g: &ConvGeometry, pass: Pass) -> usize {
    workspace_len::<T>(g, pass) * std::mem::size_of::<T>()
}

/// [`workspace_len_up_to`] in bytes.
pub fn workspace_bytes_up_to<T: GemmScalar>(g: &ConvGeometry, pass: Pass) -> usize {
    workspace_len_up_to::<T>(g, pass) * std::mem::size_of::<T>()
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

/// The cut of `pass` that `len` elements of workspace hold, or the error naming how many it
/// needs at least.
fn split_ws<T: GemmScalar>(g: &ConvGeometry, pass: Pass, len: usize) -> Result<Split, ConvError> {
    check_ws(len, workspace_len::<T>(g, pass))?;
    split::<T>(g, pass, len).ok_or(ConvError::WrongLength {
        what: "the workspace",
        len,
        need: workspace_len::<T>(g, pass),
    })
}

/// Runs `f(unit, out, lane)` for every unit of `s`, where `out` is the unit's own `unit`-long
/// block of `out` (units in order) and `lane` the workspace of the lane that runs it. Lane `l`
/// runs units `l·per .. (l+1)·per` in order; the lanes run on the pool's threads when there
/// are several and `work` is worth waking them. On one thread one lane runs every unit; on
/// several, the lanes in use are a multiple of the threads where the workspace holds that
/// many (three lanes on two threads would leave one thread running two lanes while the other
/// runs one). Each unit computes the same bits whichever lane or thread runs it, so the
/// result depends neither on the number of threads nor on the lanes in use.
fn for_each_unit<T: Send>(
    out: &mut [T],
    unit: usize,
    ws: &mut [T],
    s: &Split,
    work: usize,
    f: impl Fn(usize, &mut [T], &mut [T]) -> Result<(), GemmError> + Sync,
) -> Result<(), GemmError> {
    if unit == 0 || s.units == 0 {
        return Ok(());
    }
    let threads = pool_threads();
    let parallel = threads > 1 && s.lanes > 1 && work >= PARALLEL_ELEMENTS;
    let lanes = match parallel {
        false => 1,
        true if s.lanes >= threads => s.lanes / threads * threads,
        true => s.lanes,
    };
    let per = s.units.div_ceil(lanes);
    let run = |(l, (outs, lane)): (usize, (&mut [T], &mut [T]))| {
        outs.chunks_mut(unit)
            .enumerate()
            .try_for_each(|(i, o)| f(l * per + i, o, lane))
    };
    // A last block of fewer images is a shorter last unit.
    let used = (s.units * unit).min(out.len());
    let (outs, ws) = (&mut out[..used], &mut ws[..lanes * s.lane_len]);
    if parallel {
        use rayon::prelude::*;
        outs.par_chunks_mut(per * unit)
            .zip(ws.par_chunks_mut(s.lane_len))
            .enumerate()
            .try_for_each(run)
    } else {
        outs.chunks_mut(per * unit)
            .zip(ws.chunks_mut(s.lane_len))
            .enumerate()
            .try_for_each(run)
    }
}

/// Multiply-adds of a pass's GEMMs, to decide whether its lanes are worth threads.
fn gemm_work(g: &ConvGeometry) -> usize {
    g.batch
        .saturating_mul(g.out_ch)
        .saturating_mul(g.col_rows())
        .saturating_mul(g.positions())
}

/// One row segment of a channel's column buffer: output positions `pos .. pos + len` of
/// kernel tap `row` read input elements `src, src + step, ..` of the channel's plane; the
/// positions of the row (`out_w` of them from `row_start`) outside the segment read padding.
#[derive(Clone, Copy)]
struct Segment {
    row_start: usize,
    pos: usize,
    len: usize,
    src: usize,
    step: usize,
}

/// Calls `f` with every output row (`i`) of every kernel tap (`a`, `b`) of one input
/// channel's column rows, in that order (rows numbered from the channel's first, `ld`
/// elements apart, the image's positions from column `at` of each: `ld` is the positions
/// and `at` zero for one image, a block of images lying side by side): the same order,
/// element by element, as a walk over taps, then output rows, then output columns. Every
/// channel's rows read its own plane alike, so the column buffer is filled (and summed back)
/// a channel at a time.
#[inline]
fn each_channel_segment(g: &ConvGeometry, ld: usize, at: usize, mut f: impl FnMut(Segment)) {
    let ([kh, kw], [h, w], [oh, ow]) = (g.kernel, g.in_hw, g.out_hw);
    let ([sh, sw], [dh, dw], [ph, pw]) = (g.stride, g.dilation, g.padding);
    for a in 0..kh {
        for b in 0..kw {
            let row = a * kw + b;
            // Output columns j whose input column j·sw + b·dw − pw lies in 0..w.
            let off = b * dw;
            let lo = pw.saturating_sub(off).div_ceil(sw).min(ow);
            let hi = if w + pw > off {
                ((w + pw - off - 1) / sw + 1).clamp(lo, ow)
            } else {
                lo
            };
            for i in 0..oh {
                let row_start = row * ld + at + i * ow;
                let ih = (i * sh + a * dh).wrapping_sub(ph);
                let (len, src) = if ih < h && hi > lo {
                    (hi - lo, ih * w + lo * sw + off - pw)
                } else {
                    (0, 0)
                };
                f(Segment {
                    row_start,
                    pos: row_start + lo,
                    len,
                    src,
                    step: sw,
                });
            }
        }
    }
}

/// The column buffer `[c·kh·kw, Ho·Wo]` of the `c` channels `x` `[c, H, W]` holds (a group's,
/// or a range of them), in the front of `col`; the rows of each input channel are filled by
/// one thread (a copy: the same bits on any number), a row segment at a time.
fn im2col<T: Scalar>(g: &ConvGeometry, x: &[T], col: &mut [T]) {
    im2col_images(g, x, 1, col)
}

/// The column buffer `[c·kh·kw, images·Ho·Wo]` of `images` images `x` `[images, c, H, W]`
/// side by side (image `i`'s positions in columns `i·Ho·Wo ..`), in the front of `col`, its
/// channels spread over the pool's threads.
fn im2col_images<T: Scalar>(g: &ConvGeometry, x: &[T], images: usize, col: &mut [T]) {
    fill_columns(g, x, images, col, true)
}

/// [`im2col_images`] on the calling thread alone (a lane's, inside a pool).
fn im2col_images_alone<T: Scalar>(g: &ConvGeometry, x: &[T], images: usize, col: &mut [T]) {
    fill_columns(g, x, images, col, false)
}

/// [`im2col_images`], its channels spread over the pool's threads where `spread` holds and
/// they are worth waking, else on the calling thread.
fn fill_columns<T: Scalar>(g: &ConvGeometry, x: &[T], images: usize, col: &mut [T], spread: bool) {
    let (p, rows, plane, ow) = (
        g.positions(),
        g.kernel[0] * g.kernel[1],
        g.in_hw[0] * g.in_hw[1],
        g.out_hw[1],
    );
    let channels = x.len() / (plane * images).max(1);
    let ld = images * p;
    let used = channels * rows * ld;
    let work = if spread { used } else { 0 };
    for_each_block(&mut col[..used], rows * ld, work, |c, col| {
        for i in 0..images {
            let xc = &x[(i * channels + c) * plane..(i * channels + c + 1) * plane];
            each_channel_segment(g, ld, i * p, |s| {
                let out = &mut col[s.row_start..s.row_start + ow];
                let (before, rest) = out.split_at_mut(s.pos - s.row_start);
                let (seg, after) = rest.split_at_mut(s.len);
                before.fill(T::ZERO);
                after.fill(T::ZERO);
                if s.step == 1 {
                    seg.copy_from_slice(&xc[s.src..s.src + s.len]);
                } else {
                    for (t, v) in seg.iter_mut().enumerate() {
                        *v = xc[s.src + t * s.step];
                    }
                }
            });
        }
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
    for_each_block(dx, plane, g.col_rows() * p, |c, dxc| {
        col2im_channel(g, &col[c * rows * p..(c + 1) * rows * p], p, 0, dxc);
    });
}

/// Adds one input channel's rows `colc` of a column buffer (rows `ld` long, the image's
/// positions from column `at`) onto its plane `dxc`, tap by tap and row by row.
#[inline]
fn col2im_channel<T: Scalar>(g: &ConvGeometry, colc: &[T], ld: usize, at: usize, dxc: &mut [T]) {
    each_channel_segment(g, ld, at, |s| {
        let seg = &colc[s.pos..s.pos + s.len];
        if s.step == 1 {
            for (d, &v) in dxc[s.src..s.src + s.len].iter_mut().zip(seg) {
                *d = d.add(v);
            }
        } else {
            for (t, &v) in seg.iter().enumerate() {
                let d = &mut dxc[s.src + t * s.step];
                *d = d.add(v);
            }
        }
    });
}

/// Lays `images` images' `[rows, p]` planes (`from`: `[images, rows, p]`, a block of `dy`)
/// side by side in `to` (`[rows, images · p]`), as a block's GEMM reads them.
fn to_side_by_side<T: Copy>(images: usize, rows: usize, p: usize, from: &[T], to: &mut [T]) {
    let ld = images * p;
    for i in 0..images {
        for r in 0..rows {
            let (a, b) = ((i * rows + r) * p, r * ld + i * p);
            to[b..b + p].copy_from_slice(&from[a..a + p]);
        }
    }
}

/// The inverse of [`to_side_by_side`]: a block's GEMM output `from` (`[rows, images · p]`)
/// back into its images' planes `to` (`[images, rows, p]`, a block of `y`).
fn from_side_by_side<T: Copy>(images: usize, rows: usize, p: usize, from: &[T], to: &mut [T]) {
    let ld = images * p;
    for i in 0..images {
        for r in 0..rows {
            let (a, b) = ((i * rows + r) * p, r * ld + i * p);
            to[a..a + p].copy_from_slice(&from[b..b + p]);
        }
    }
}

/// Most output positions (images times positions) a tile of small images gives its GEMM
/// ([`Tiles`]): four AVX-512 micro-panels of `B` a row, so that a lane's column buffer, its
/// output gradient side by side and the packed panel stay in its core's L2 between the GEMM
/// that writes them and the col2im (or copy) that reads them.
const TILE_COLUMNS: usize = 256;

/// Fewest output positions a tile's GEMM has (two AVX-512 micro-panels of `B`), unless a
/// block of images holds fewer: narrower tiles give more lanes but pad the micro-kernel's
/// tiles.
const MIN_TILE_COLUMNS: usize = 64;

/// Rows of the input gradient's column buffer (input channels times the kernel's taps) a
/// tile covers, about: 72 is 8 channels of a 3x3 kernel, six AVX-512 micro-tiles high.
const TILE_ROWS: usize = 72;

/// How a forward or input-gradient pass of small images runs in a workspace cut for blocks
/// of images: in tiles of a few images (and, for the input gradient, a few input channels),
/// each tile one unit run by one lane on one thread alone, its GEMM ([`gemm_ws_alone`]) and
/// its col2im (or the forward's copy back) one after the other while they are in its cache.
/// Session 42 measured the input gradients at 8x8 to 2x2 on 16 threads at half their bare
/// GEMM's rate: each block's GEMM spread over the threads (two waits a panel), then the
/// col2im read the block's whole column buffer (2.4-4.7 MB) back from other cores' caches.
/// Every element is still the one GEMM sum (the order fixed by the reduction's length) and
/// every input-gradient element its taps added in the same order from zero, so a tile gives
/// the bits of a block, or of one image at a time, whatever its size: the tiles are cut from
/// the workspace the block's cut was given (each needs no more than a block's lane), so the
/// plan is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tiles {
    /// Images a tile (the last tile may hold fewer).
    images: usize,
    /// Input channels a tile (all of them for the forward; the last chunk may hold fewer).
    channels: usize,
    /// Tiles across the input channels: units are `(images, channels)` pairs, numbered
    /// images-major, `u = tile · chunks + chunk`.
    chunks: usize,
    units: usize,
    /// Lanes the workspace holds (at most one per unit and [`MAX_LANES`]).
    lanes: usize,
    /// Elements of a lane: its column buffer, its output (gradient) side by side, its GEMM's.
    col_len: usize,
    tmp_len: usize,
    len: usize,
}

/// The tiles of `images` images of `pass`, with one lane.
fn tile_of<T: GemmScalar>(g: &ConvGeometry, pass: Pass, images: usize) -> Tiles {
    let (o, cin, p) = (g.out_ch, g.in_ch, g.positions());
    let taps = g.kernel[0] * g.kernel[1];
    let channels = match pass {
        Pass::GradInput => (TILE_ROWS / taps.max(1)).clamp(1, cin.max(1)),
        _ => cin,
    };
    let (rows, cols) = (channels * taps, images * p);
    let gemm = match pass {
        Pass::GradInput => gemm_len::<T>(rows, o, cols),
        _ => gemm_len::<T>(o, rows, cols),
    };
    let (col_len, tmp_len) = (rows * cols, o * cols);
    let chunks = cin.div_ceil(channels.max(1)).max(1);
    Tiles {
        images,
        channels,
        chunks,
        units: g.batch.div_ceil(images.max(1)) * chunks,
        lanes: 1,
        col_len,
        tmp_len,
        len: (col_len + tmp_len + gemm).max(1),
    }
}

/// The tiles a forward or input-gradient pass cut into blocks of `most` images runs in
/// `avail` elements: the widest tile from [`TILE_COLUMNS`] down to [`MIN_TILE_COLUMNS`]
/// (within the block) whose lanes, one per unit up to [`MAX_LANES`], all fit; else the
/// narrowest, with the lanes that fit. `None` where not even one lane fits (never, for the
/// workspace of a block's lane: a tile's lane is no larger), or an image has no positions.
fn tiles<T: GemmScalar>(g: &ConvGeometry, pass: Pass, most: usize, avail: usize) -> Option<Tiles> {
    let p = g.positions();
    if p == 0 || g.in_hw[0] * g.in_hw[1] == 0 || g.groups != 1 {
        return None;
    }
    let hi = (TILE_COLUMNS / p).clamp(1, most.max(1));
    let lo = MIN_TILE_COLUMNS.div_ceil(p).clamp(1, hi);
    let with_lanes = |t: Tiles| Tiles {
        lanes: (avail / t.len).min(t.units).min(MAX_LANES),
        ..t
    };
    let t = (lo..=hi)
        .rev()
        .map(|i| with_lanes(tile_of::<T>(g, pass, i)))
        .find(|t| t.lanes == t.units.min(MAX_LANES))
        .unwrap_or_else(|| with_lanes(tile_of::<T>(g, pass, lo)));
    (t.lanes >= 1).then_some(t)
}

/// Runs `f(units, lane)` for each lane of `t`: lane `l` runs units `l·per .. (l+1)·per` in
/// order on one thread, in its own `t.len` elements of `ws`; the lanes run on the pool's
/// threads when there are several and `work` is worth waking them (a multiple of the
/// threads where the workspace holds that many, as [`for_each_unit`]). Each unit computes
/// the same bits whichever lane runs it.
fn for_each_tile<T: Send>(
    ws: &mut [T],
    t: &Tiles,
    work: usize,
    f: impl Fn(std::ops::Range<usize>, &mut [T]) -> Result<(), GemmError> + Sync,
) -> Result<(), GemmError> {
    let threads = pool_threads();
    let parallel = threads > 1 && t.lanes > 1 && work >= PARALLEL_ELEMENTS;
    let lanes = match parallel {
        false => 1,
        true if t.lanes >= threads => t.lanes / threads * threads,
        true => t.lanes,
    };
    let per = t.units.div_ceil(lanes);
    let run = |(l, lane): (usize, &mut [T])| {
        f((l * per).min(t.units)..((l + 1) * per).min(t.units), lane)
    };
    let ws = &mut ws[..lanes * t.len];
    if parallel {
        use rayon::prelude::*;
        ws.par_chunks_mut(t.len).enumerate().try_for_each(run)
    } else {
        ws.chunks_mut(t.len).enumerate().try_for_each(run)
    }
}

/// An output slice the lanes of [`for_each_tile`] write at disjoint ranges through
/// [`Disjoint::range`] (each use vouches that no other lane's range meets its own).
struct Disjoint<T>(*mut T, usize);
// SAFETY: a Disjoint is shared only by lanes that write disjoint ranges of the slice it was
// made from (vouched at each `range` call), for one blocking parallel loop that returns before
// the slice's borrow ends; so sharing it is sharing disjoint `&mut` parts of a `Send` slice.
unsafe impl<T: Send> Sync for Disjoint<T> {}
// SAFETY: as for Sync.
unsafe impl<T: Send> Send for Disjoint<T> {}

impl<T> Disjoint<T> {
    fn new(out: &mut [T]) -> Disjoint<T> {
        Disjoint(out.as_mut_ptr(), out.len())
    }

    /// Elements `start .. start + len` of the slice.
    ///
    /// # Safety
    /// No other reference to any of these elements is live while the returned one is.
    #[allow(clippy::mut_from_ref)]
    unsafe fn range(&self, start: usize, len: usize) -> &mut [T] {
        assert!(start.checked_add(len).is_some_and(|end| end <= self.1));
        // SAFETY: in bounds (asserted), and unaliased by the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), len) }
    }
}

/// The forward pass of small images in tiles of whole images ([`Tiles`]): each unit fills
/// its images' column buffer, multiplies it by `W` into its lane and copies the product back
/// into its images' planes of `y`, on one thread.
fn forward_tiles<T: GemmScalar + Float>(
    g: &ConvGeometry,
    x: &[T],
    w: &[T],
    y: &mut [T],
    ws: &mut [T],
    t: &Tiles,
) -> Result<(), GemmError> {
    let (o, k, p) = (g.out_ch, g.col_rows(), g.positions());
    let xi = g.in_ch * g.in_hw[0] * g.in_hw[1];
    let out = Disjoint::new(y);
    for_each_tile(ws, t, gemm_work(g), |units, lane| {
        let (col, rest) = lane.split_at_mut(t.col_len);
        let (tmp, gws) = rest.split_at_mut(t.tmp_len);
        for u in units {
            let n0 = u * t.images;
            let images = t.images.min(g.batch - n0);
            let cols = images * p;
            let col = &mut col[..k * cols];
            im2col_images_alone(g, &x[n0 * xi..(n0 + images) * xi], images, col);
            let tmp = &mut tmp[..o * cols];
            gemm_ws_alone(
                o,
                k,
                cols,
                <T as GemmScalar>::ONE,
                w,
                MatLayout::row_major(k),
                col,
                MatLayout::row_major(cols),
                <T as GemmScalar>::ZERO,
                tmp,
                MatLayout::row_major(cols),
                gws,
            )?;
            // SAFETY: unit `u` alone writes images `n0 .. n0 + images` of `y` (the units
            // cover the batch's images once each, and each runs on one lane).
            let yu = unsafe { out.range(n0 * o * p, images * o * p) };
            from_side_by_side(images, o, p, tmp, yu);
        }
        Ok(())
    })
}

/// The input gradient of small images in tiles of a few images and input channels
/// ([`Tiles`]): each unit multiplies its channels' rows of `Wᵀ` by its images' output
/// gradient side by side (copied once a run of units on the same images) into its lane's
/// column buffer, then sums that buffer back into its images' planes of those channels,
/// each plane from zero, taps and rows in order as [`col2im_add`] sums them, on one thread.
fn grad_input_tiles<T: GemmScalar + Float>(
    g: &ConvGeometry,
    dy: &[T],
    w: &[T],
    dx: &mut [T],
    ws: &mut [T],
    t: &Tiles,
) -> Result<(), GemmError> {
    let (o, cin, k, p) = (g.out_ch, g.in_ch, g.col_rows(), g.positions());
    let (taps, plane) = (g.kernel[0] * g.kernel[1], g.in_hw[0] * g.in_hw[1]);
    let out = Disjoint::new(dx);
    for_each_tile(ws, t, gemm_work(g), |units, lane| {
        let (col, rest) = lane.split_at_mut(t.col_len);
        let (tmp, gws) = rest.split_at_mut(t.tmp_len);
        let mut held = None;
        for u in units {
            let (tile, chunk) = (u / t.chunks, u % t.chunks);
            let n0 = tile * t.images;
            let images = t.images.min(g.batch - n0);
            let cols = images * p;
            let tmp = &mut tmp[..o * cols];
            if held != Some(tile) {
                to_side_by_side(images, o, p, &dy[n0 * o * p..(n0 + images) * o * p], tmp);
                held = Some(tile);
            }
            let c0 = chunk * t.channels;
            let cw = t.channels.min(cin - c0);
            let col = &mut col[..cw * taps * cols];
            gemm_ws_alone(
                cw * taps,
                o,
                cols,
                <T as GemmScalar>::ONE,
                w,
                MatLayout::col_major(k).at(c0 * taps),
                tmp,
                MatLayout::row_major(cols),
                <T as GemmScalar>::ZERO,
                col,
                MatLayout::row_major(cols),
                gws,
            )?;
            for i in 0..images {
                // SAFETY: unit `u` alone writes channels `c0 .. c0 + cw` of images
                // `n0 .. n0 + images` of `dx` (the units cover each image's channels once,
                // and each runs on one lane).
                let dxi = unsafe { out.range(((n0 + i) * cin + c0) * plane, cw * plane) };
                for (c, dxc) in dxi.chunks_mut(plane).enumerate() {
                    dxc.fill(<T as Scalar>::ZERO);
                    let rows = &col[c * taps * cols..(c + 1) * taps * cols];
                    col2im_channel(g, rows, cols, i * p, dxc);
                }
            }
        }
        Ok(())
    })
}

/// `y = conv(x, w)`. `ws` holds at least [`workspace_len`]`(g, Pass::Forward)` elements.
/// Each `(image, group)` unit is `y[n, group] = W_g · col(x[n, group])`, the column buffer
/// being the image itself for a pointwise convolution.
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
    if let Some(tap) = one_tap::live_tap(g) {
        check_ws(ws.len(), workspace_len::<T>(g, Pass::Forward))?;
        return one_tap::run(g, Pass::Forward, tap, x, w, y, ws);
    }
    let s = split_ws::<T>(g, Pass::Forward, ws.len())?;
    let (og, k, p) = (g.out_ch / g.groups, g.col_rows(), g.positions());
    let xg = g.in_ch / g.groups * g.in_hw[0] * g.in_hw[1];
    let direct = is_pointwise(g);
    let every_thread = |t: &Tiles| t.lanes >= pool_threads().min(MAX_LANES);
    if let Some(t) = (s.images > 1)
        .then(|| tiles::<T>(g, Pass::Forward, s.images, s.lanes * s.lane_len))
        .flatten()
        .filter(every_thread)
    {
        return forward_tiles(g, x, w, y, ws, &t).map_err(ConvError::from);
    }
    if s.images > 1 {
        // Blocks of images (one group): `y[block] = W · col(x[block])`, side by side.
        return for_each_unit(y, s.images * og * p, ws, &s, gemm_work(g), |u, yu, lane| {
            let (images, n0) = (yu.len() / (og * p), u * s.images);
            let cols = images * p;
            let (col, rest) = lane.split_at_mut(s.col_len);
            let (tmp, gws) = rest.split_at_mut(s.tmp_len);
            im2col_images(g, &x[n0 * xg..(n0 + images) * xg], images, col);
            let tmp = &mut tmp[..og * cols];
            gemm_ws(
                og,
                k,
                cols,
                <T as GemmScalar>::ONE,
                w,
                MatLayout::row_major(k),
                col,
                MatLayout::row_major(cols),
                <T as GemmScalar>::ZERO,
                tmp,
                MatLayout::row_major(cols),
                gws,
            )?;
            from_side_by_side(images, og, p, tmp, yu);
            Ok(())
        })
        .map_err(ConvError::from);
    }
    for_each_unit(y, og * p, ws, &s, gemm_work(g), |u, yu, lane| {
        let (gi, start) = (u % g.groups, u * xg);
        let (col, gws) = lane.split_at_mut(s.col_len);
        let (b, lb) = if direct {
            (x, MatLayout::row_major(p).at(start))
        } else {
            im2col(g, &x[start..start + xg], col);
            (&*col, MatLayout::row_major(p))
        };
        gemm_ws(
            og,
            k,
            p,
            <T as GemmScalar>::ONE,
            w,
            MatLayout::row_major(k).at(gi * og * k),
            b,
            lb,
            <T as GemmScalar>::ZERO,
            yu,
            MatLayout::row_major(p),
            gws,
        )
    })?;
    Ok(())
}

/// `dx`, the gradient of `conv(x, w)` in `x` given the output's gradient `dy`: each
/// `(image, group)` unit is `col2im(W_gᵀ · dy[n, group])`, written straight into `dx` for a
/// pointwise convolution.
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
    if let Some(tap) = one_tap::live_tap(g) {
        check_ws(ws.len(), workspace_len::<T>(g, Pass::GradInput))?;
        return one_tap::run(g, Pass::GradInput, tap, dy, w, dx, ws);
    }
    let s = split_ws::<T>(g, Pass::GradInput, ws.len())?;
    let (og, k, p) = (g.out_ch / g.groups, g.col_rows(), g.positions());
    let xg = g.in_ch / g.groups * g.in_hw[0] * g.in_hw[1];
    let direct = is_pointwise(g);
    let product = |c: &mut [T], u: usize, gws: &mut [T]| {
        gemm_ws(
            k,
            og,
            p,
            <T as GemmScalar>::ONE,
            w,
            MatLayout::col_major(k).at(u % g.groups * og * k),
            dy,
            MatLayout::row_major(p).at(u * og * p),
            <T as GemmScalar>::ZERO,
            c,
            MatLayout::row_major(p),
            gws,
        )
    };
    if s.images > 1 {
        // Blocks of images (one group), run in tiles of their images and channels.
        let avail = s.lanes * s.lane_len;
        let t = tiles::<T>(g, Pass::GradInput, s.images, avail).ok_or(ConvError::WrongLength {
            what: "the workspace",
            len: avail,
            need: tile_of::<T>(g, Pass::GradInput, 1).len,
        })?;
        return grad_input_tiles(g, dy, w, dx, ws, &t).map_err(ConvError::from);
    }
    for_each_unit(dx, xg, ws, &s, gemm_work(g), |u, dxu, lane| {
        let (col, gws) = lane.split_at_mut(s.col_len);
        if direct {
            product(dxu, u, gws)
        } else {
            product(col, u, gws)?;
            dxu.fill(<T as Scalar>::ZERO);
            col2im_add(g, col, dxu);
            Ok(())
        }
    })?;
    Ok(())
}

/// `dw`, the gradient of `conv(x, w)` in `w` given the output's gradient `dy`. Each
/// `(group, channel range)` unit sums `dy[n, group] · col(x[n, range])ᵀ` over the images in
/// order into its own block of partial sums in the workspace (the column buffer being the
/// images themselves for a pointwise convolution), which is then copied into `dw`: every
/// element is summed as one unit over the whole group would sum it.
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
    if g.batch == 0 || dw.is_empty() {
        dw.fill(<T as Scalar>::ZERO);
        return Ok(());
    }
    if let Some(tap) = one_tap::live_tap(g) {
        check_ws(ws.len(), workspace_len::<T>(g, Pass::GradWeight))?;
        return one_tap::run(g, Pass::GradWeight, tap, x, dy, dw, ws);
    }
    let s = split_ws::<T>(g, Pass::GradWeight, ws.len())?;
    let (og, cg) = (g.out_ch / g.groups, g.in_ch / g.groups);
    let taps = g.kernel[0] * g.kernel[1];
    let (k, ranges) = (cg * taps, s.units / g.groups);
    if s.parts > 1 {
        return grad_weight_parts(g, x, dy, dw, ws, &s).map_err(ConvError::from);
    }
    if s.images > 1 {
        let (col, rest) = ws[..s.lane_len].split_at_mut(s.col_len);
        let (tmp, gws) = rest.split_at_mut(s.tmp_len);
        return sum_in_blocks(g, x, dy, 0..g.batch, s.images, col, tmp, dw, gws)
            .map_err(ConvError::from);
    }
    // Unit `u` covers group `u / ranges`, channels `c0 .. c0 + cw` of it.
    let range = |u: usize| {
        let c0 = (u % ranges) * s.chunk;
        (u / ranges, c0, s.chunk.min(cg - c0))
    };
    let (partial, lanes) = ws.split_at_mut(s.partial);
    let unit = og * s.chunk * taps;
    let into = if s.partial == 0 {
        &mut *dw
    } else {
        &mut *partial
    };
    for_each_unit(into, unit, lanes, &s, gemm_work(g), |u, part, lane| {
        let (gi, c0, cw) = range(u);
        let part = &mut part[..og * cw * taps];
        let (col, gws) = lane.split_at_mut(s.col_len);
        sum_over_images(g, x, dy, (gi, c0, cw), 0..g.batch, col, part, gws)
    })?;
    for u in (0..s.units).filter(|_| s.partial > 0) {
        let (gi, c0, cw) = range(u);
        let n_cols = cw * taps;
        for o in 0..og {
            let from = u * unit + o * n_cols;
            let to = (gi * og + o) * k + c0 * taps;
            dw[to..to + n_cols].copy_from_slice(&partial[from..from + n_cols]);
        }
    }
    Ok(())
}

/// `out = Σ dy[n, group] · col(x[n, group, c0 .. c0 + cw])ᵀ` over `images` in order, the
/// first image writing `out` and each later one adding to it: the sums of one channel range
/// over the whole batch, or of one part of the images over the whole group. `col` is the
/// column buffer (unused for a pointwise convolution, whose columns are the images
/// themselves), `gws` the GEMM's workspace.
#[allow(clippy::too_many_arguments)]
fn sum_over_images<T: GemmScalar + Float>(
    g: &ConvGeometry,
    x: &[T],
    dy: &[T],
    (gi, c0, cw): (usize, usize, usize),
    images: std::ops::Range<usize>,
    col: &mut [T],
    out: &mut [T],
    gws: &mut [T],
) -> Result<(), GemmError> {
    let (og, p) = (g.out_ch / g.groups, g.positions());
    let plane = g.in_hw[0] * g.in_hw[1];
    let (xg, n_cols) = (g.in_ch / g.groups * plane, cw * g.kernel[0] * g.kernel[1]);
    let direct = is_pointwise(g);
    let first = images.start;
    for n in images {
        let start = (n * g.groups + gi) * xg + c0 * plane;
        let b: &[T] = if direct {
            x
        } else {
            im2col(g, &x[start..start + cw * plane], col);
            col
        };
        let lb = MatLayout::col_major(p).at(if direct { start } else { 0 });
        let beta = if n == first {
            <T as GemmScalar>::ZERO
        } else {
            <T as GemmScalar>::ONE
        };
        gemm_ws(
            og,
            p,
            n_cols,
            <T as GemmScalar>::ONE,
            dy,
            MatLayout::row_major(p).at((n * g.out_ch + gi * og) * p),
            b,
            lb,
            beta,
            out,
            MatLayout::row_major(n_cols),
            gws,
        )?;
    }
    Ok(())
}

/// The weight gradient in parts of the images ([`image_parts`]): for each group, part `j`
/// sums `dy[n, group] · col(x[n, group])ᵀ` over its images in order (one image a GEMM, or
/// blocks of `s.images` images side by side, [`sum_in_blocks`]) into a lane's own block,
/// and `dw[group]` is part 0's block plus part 1's, plus part 2's, ..., element by element in
/// that order. The lanes (as many as the workspace holds, a multiple of the threads where it
/// holds that many) compute a wave of consecutive parts at once, then their blocks are added
/// in part order: every element is the same sums in the same order with one lane or sixteen.
fn grad_weight_parts<T: GemmScalar + Float>(
    g: &ConvGeometry,
    x: &[T],
    dy: &[T],
    dw: &mut [T],
    ws: &mut [T],
    s: &Split,
) -> Result<(), GemmError> {
    let (og, cg) = (g.out_ch / g.groups, g.in_ch / g.groups);
    let (k, parts) = (cg * g.kernel[0] * g.kernel[1], s.parts);
    let block = og * k;
    let threads = pool_threads();
    let parallel = threads > 1 && s.lanes > 1 && gemm_work(g) >= PARALLEL_ELEMENTS;
    let lanes = match parallel {
        false => 1,
        true if s.lanes >= threads => s.lanes / threads * threads,
        true => s.lanes,
    };
    // Part `j` of group `gi` into the block after `lane`'s column buffer (and side-by-side
    // output gradient, where the part sums blocks of images).
    let part = |gi: usize, j: usize, lane: &mut [T]| -> Result<(), GemmError> {
        let (n0, n1) = (j * g.batch / parts, (j + 1) * g.batch / parts);
        let (col, rest) = lane.split_at_mut(s.col_len);
        let (tmp, rest) = rest.split_at_mut(s.tmp_len);
        let (acc, gws) = rest.split_at_mut(block);
        if s.images > 1 {
            sum_in_blocks(g, x, dy, n0..n1, s.images, col, tmp, acc, gws)
        } else {
            sum_over_images(g, x, dy, (gi, 0, cg), n0..n1, col, acc, gws)
        }
    };
    let (lane_len, col_len) = (s.lane_len, s.col_len + s.tmp_len);
    for (gi, target) in dw.chunks_mut(block).enumerate() {
        for w0 in (0..parts).step_by(lanes) {
            let wave = lanes.min(parts - w0);
            let lanes_ws = &mut ws[..wave * lane_len];
            if parallel && wave > 1 {
                use rayon::prelude::*;
                lanes_ws
                    .par_chunks_mut(lane_len)
                    .enumerate()
                    .try_for_each(|(l, lane)| part(gi, w0 + l, lane))?;
            } else {
                for (l, lane) in lanes_ws.chunks_mut(lane_len).enumerate() {
                    part(gi, w0 + l, lane)?;
                }
            }
            let lanes_ws = &*lanes_ws;
            // Adds the wave's blocks onto `t`, elements `i0 ..` of the group's block.
            let add = |i0: usize, t: &mut [T]| {
                for l in 0..wave {
                    let at = l * lane_len + col_len + i0;
                    let acc = &lanes_ws[at..at + t.len()];
                    if w0 + l == 0 {
                        t.copy_from_slice(acc);
                    } else {
                        for (d, &v) in t.iter_mut().zip(acc) {
                            *d = d.add(v);
                        }
                    }
                }
            };
            const ADD_CHUNK: usize = 4096;
            if parallel && block > ADD_CHUNK {
                use rayon::prelude::*;
                target
                    .par_chunks_mut(ADD_CHUNK)
                    .enumerate()
                    .for_each(|(c, t)| add(c * ADD_CHUNK, t));
            } else {
                add(0, target);
            }
        }
    }
    Ok(())
}

/// `out = Σ dy[block] · col(x[block])ᵀ` over the blocks of `per` images of `images` (one
/// group), each block one GEMM whose reduction runs over its images' positions side by side
/// (`col` its column buffer, `tmp` its output gradient), the first block writing `out` and
/// each later one adding to it: the whole weight gradient in blocks, or one part's. The GEMM
/// spreads its tiles over the pool's threads, with the same sums on any number.
#[allow(clippy::too_many_arguments)]
fn sum_in_blocks<T: GemmScalar + Float>(
    g: &ConvGeometry,
    x: &[T],
    dy: &[T],
    images: std::ops::Range<usize>,
    per: usize,
    col: &mut [T],
    tmp: &mut [T],
    out: &mut [T],
    gws: &mut [T],
) -> Result<(), GemmError> {
    let (o, k, p) = (g.out_ch, g.col_rows(), g.positions());
    let xi = g.in_ch * g.in_hw[0] * g.in_hw[1];
    for n0 in images.clone().step_by(per.max(1)) {
        let nb = per.min(images.end - n0);
        let cols = nb * p;
        im2col_images(g, &x[n0 * xi..(n0 + nb) * xi], nb, col);
        let tmp = &mut tmp[..o * cols];
        to_side_by_side(nb, o, p, &dy[n0 * o * p..(n0 + nb) * o * p], tmp);
        let beta = if n0 == images.start {
            <T as GemmScalar>::ZERO
        } else {
            <T as GemmScalar>::ONE
        };
        gemm_ws(
            o,
            cols,
            k,
            <T as GemmScalar>::ONE,
            tmp,
            MatLayout::row_major(cols),
            col,
            MatLayout::col_major(cols),
            beta,
            out,
            MatLayout::row_major(k),
            gws,
        )?;
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
#[path = "conv_tests.rs"]
mod tests;
