//! Channels-last convolutions: a step's convolutions rewritten to store their tensors NHWC
//! (`x [N, H, W, C]`, `w [O, kh, kw, C/g]`), where a GPU's tensor cores want the channels
//! innermost, with the transposes this needs placed as ordinary ops that the planner sees,
//! schedules and counts. The model, its parameters and every output keep PyTorch's NCHW.
//!
//! Rather than wrap each convolution in transposes and then sink and cancel them one rewrite
//! at a time, the pass decides each 4-d value's layout at once, which is where such sinking
//! ends:
//! - a convolution's operands and result are channels-last, unless it has fewer than
//!   [`MIN_CHANNELS_LAST_CHANNELS`] input channels (a small stem over an image's three) and is
//!   not large enough in bf16 for cuDNN's channels-last kernels to pay ([`few_channels_last`]):
//!   such a convolution keeps NCHW, like the ops below;
//! - ops that only move elements or reduce axes (elementwise ops, converts, broadcasts,
//!   reductions) compute in whichever layout their operands arrive in: they are joined into
//!   components (union-find over operand edges) that take one layout each, the one whose
//!   transposes move fewer bytes. A batch norm and ReLU between two convolutions, its
//!   residual add and all their gradients form one component with convolutions on both
//!   sides, and stay channels-last;
//! - a max pooling and its gradient compute in the layout the pooled image comes in, so a
//!   channels-last stem's batch norm, ReLU and max pooling are channels-last up to the first
//!   block, and an NCHW stem's pooled output is what is transposed;
//! - every other op (reshapes, products, leaves, outputs, updates) keeps NCHW.
//!
//! Where a value's layout differs from what a reader needs, one transpose is made (once per
//! value and layout, and composed with a transpose it would follow, so no two transposes are
//! adjacent). A value whose channels-last bytes equal its NCHW bytes (its size-1 axes aside,
//! its axes stay in order: `[N, C, 1, 1]`, a 1x1 kernel's `[O, C, 1, 1]`, a per-channel
//! `[1, C, 1, 1]`) changes layout by a reshape, which copies nothing; a constant is made
//! again in the other layout.
//!
//! The rewritten step computes the same values: each op gets the same operands, permuted;
//! only the reductions' summation order may change (f32 rounding).

use crate::error::IrError;
use crate::ir::{ConvLayout, Graph, NodeId, Op, Pool2d, Shape, TensorType, WindowOp};
use std::collections::HashMap;

#[cfg(test)]
mod tests;

/// What [`channels_last`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LayoutReport {
    /// Convolution ops made channels-last.
    pub convolutions: usize,
    /// Ops that compute channels-last besides the convolutions.
    pub channels_last_ops: usize,
    /// Transposes added (copies), and the bytes they write.
    pub transposes: usize,
    pub transposed_bytes: usize,
    /// Layout changes that copy nothing (reshapes) or remake a constant.
    pub free_changes: usize,
}

/// How an op treats the layout of its 4-d operands and result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A convolution: channels-last in and out.
    Conv,
    /// Computes in its operands' layout (elementwise, convert, broadcast, reduce).
    Flexible,
    /// Reads and writes NCHW.
    Fixed,
    /// A max pooling or its gradient: in the layout its image (operand 0) comes in
    /// ([`decide`]), so that a transpose, where one is needed, moves the pooled side.
    Pool,
}

/// Input channels a convolution needs to go channels-last by default: cuDNN's NHWC kernels
/// read the channels of a pixel in vectors of 8 (16 bytes of bf16), so fewer are padded to 8
/// and the kernels do more work than the NCHW ones. Measured on an H200 (session 34),
/// resnet50's stem at 224 (3 channels, 7x7, batch 128, bf16): its filter gradient took 4.79 ms
/// channels-last against 2.74 NCHW, its forward 1.66 against 1.50, in the workspace planned
/// then; every other convolution of resnet50 (64 channels and more) was faster channels-last.
/// A large bf16 convolution over fewer channels goes channels-last all the same
/// ([`few_channels_last`]): in the room cuDNN asks it is faster so.
pub const MIN_CHANNELS_LAST_CHANNELS: usize = 8;

/// Whether a step's convolutions are stored channels-last ([`channels_last`]):
/// [`crate::pipeline::Options::channels_last`]. The CUDA runtime runs channels-last
/// convolutions only through cuDNN, so a caller asks for it only where cuDNN will run them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ChannelsLast {
    /// Every convolution NCHW (the CPU; CUDA without cuDNN or under `INGOT_CONV=im2col`).
    #[default]
    No,
    /// Every convolution with enough input channels channels-last, whatever its precision.
    Yes,
    /// Channels-last where the graph's convolutions compute in bf16 ([`pays`]): the CUDA
    /// default where cuDNN loads.
    WherePays,
}

impl From<bool> for ChannelsLast {
    fn from(yes: bool) -> ChannelsLast {
        match yes {
            true => ChannelsLast::Yes,
            false => ChannelsLast::No,
        }
    }
}

impl ChannelsLast {
    /// Whether graph `g` (rewritten, its precision applied) is made channels-last.
    pub fn applies_to(self, g: &Graph) -> bool {
        match self {
            ChannelsLast::No => false,
            ChannelsLast::Yes => true,
            ChannelsLast::WherePays => pays(g),
        }
    }
}

/// Each convolution pass's layout, in node order: what the layout pass chose, as
/// reports and tests read it.
pub fn conv_layouts(g: &Graph) -> Vec<ConvLayout> {
    g.nodes()
        .iter()
        .filter_map(|n| match &n.op {
            Op::Window(w) => w.conv().map(|c| c.layout),
            _ => None,
        })
        .collect()
}

/// The rule for the CUDA default, from the graph alone (the compiler does not see the GPU):
/// channels-last through cuDNN where a convolution that would go channels-last (enough input
/// channels) computes in bf16; NCHW through im2col + cuBLAS in f32 and tf32. Measured on an
/// H200 (session 36, docs/benchmarks.md, 10 steps, median): bf16 resnet50 at 224, batch 128,
/// 35.3 ms channels-last against 66.4 ms im2col, bf16 resnet18 (CIFAR) 1.77 against 3.17 ms;
/// f32 resnet18 5.50 against 4.63 ms and the f32 cnn 0.94 against 0.57 ms (a strict f32 step
/// keeps cuDNN off tensor cores, where cuBLAS's f32 GEMMs are faster). tf32 was not measured
/// and keeps the NCHW path it had.
pub fn pays(g: &Graph) -> bool {
    g.ids().any(|id| {
        let n = g.node(id);
        matches!(&n.op, Op::Window(w) if w.conv().is_some())
            && !stays_nchw(g, id, false)
            && n.inputs
                .iter()
                .any(|&x| g.ty(x).dtype == crate::ir::DType::BF16)
    })
}

/// The most elements a tensor of a channels-last convolution may have: cuDNN describes its
/// tensors with 32-bit dimensions and strides, and refuses a larger one when the step loads
/// (`CUDNN_STATUS_NOT_SUPPORTED` describing y; resnet50 at batch 5,411, whose
/// `[5411, 256, 56, 56]` activations hold 4.3e9 elements, H200, session 40). Such a
/// convolution stays NCHW, where im2col + cuBLAS runs it a chunk of images at a time.
pub const MAX_CHANNELS_LAST_ELEMENTS: usize = i32::MAX as usize;

/// Whether convolution node `id` (of any pass) stays NCHW: too few input channels
/// ([`MIN_CHANNELS_LAST_CHANNELS`]) where it is not [`few_channels_last`], or a tensor too
/// large for cuDNN's descriptors ([`MAX_CHANNELS_LAST_ELEMENTS`]); `false` for any other node.
/// With `every`, a convolution over few channels goes channels-last whatever its size and dtype
/// ([`channels_last_every`]).
fn stays_nchw(g: &Graph, id: NodeId, every: bool) -> bool {
    let n = g.node(id);
    let too_large =
        |x: NodeId| g.ty(x).shape.dims().iter().product::<usize>() > MAX_CHANNELS_LAST_ELEMENTS;
    (few_channels(g, id) && !every && !few_channels_last(g, id))
        || (matches!(&n.op, Op::Window(w) if w.conv().is_some())
            && (too_large(id) || n.inputs.iter().any(|&x| too_large(x))))
}

/// The geometry (NCHW's terms) of convolution node `id`, of any pass; `None` for any other.
fn geometry(g: &Graph, id: NodeId) -> Option<ingot_kernels::cpu::conv::ConvGeometry> {
    let n = g.node(id);
    let Op::Window(w) = &n.op else {
        return None;
    };
    let dims: Vec<&[usize]> = n.inputs.iter().map(|&x| g.ty(x).shape.dims()).collect();
    w.conv_geometry(&dims, n.ty.shape.dims())
        .map(|(geo, _)| geo)
}

/// Whether convolution node `id` (of any pass) has too few input channels to go
/// channels-last by default ([`MIN_CHANNELS_LAST_CHANNELS`]); `false` for any other node.
fn few_channels(g: &Graph, id: NodeId) -> bool {
    geometry(g, id).is_some_and(|geo| geo.in_ch < MIN_CHANNELS_LAST_CHANNELS)
}

/// Whether a convolution over few input channels (node `id`, any pass) goes channels-last all
/// the same: it computes in bf16 and the room cuDNN's fast channels-last algorithms ask for it
/// (the input padded to 8 channels and the filter's split sums,
/// [`crate::lower::cuda::conv::cudnn_few_channel_room`]) is larger than any im2col chunk's
/// workspace ([`crate::lower::cuda::conv::LARGE_ROOM`]): the convolutions that the NCHW default
/// already routes to cuDNN in their room, where cuDNN's channels-last kernels are faster.
/// Measured on an H200 with cuDNN 9.19 (session 39, docs/benchmarks.md), resnet50's stem at
/// 224 (`[128, 3, 224, 224]` bf16, 7x7 stride 2, each in the room it asks): filter gradient
/// 631 us channels-last against 1,003 NCHW, forward 978 against 1,378 (PyTorch's
/// channels_last 605 and 917), and 205 MB less workspace. Small stems (resnet18's at 32x32,
/// the cnn's 1-channel layer) keep NCHW and im2col, which were faster there (session 40).
pub fn few_channels_last(g: &Graph, id: NodeId) -> bool {
    use crate::lower::cuda::conv::{cudnn_few_channel_room, LARGE_ROOM};
    let n = g.node(id);
    let bf16 = n
        .inputs
        .iter()
        .all(|&x| g.ty(x).dtype == crate::ir::DType::BF16);
    bf16 && geometry(g, id).is_some_and(|geo| {
        geo.in_ch < MIN_CHANNELS_LAST_CHANNELS
            && cudnn_few_channel_room(&geo, ConvLayout::Nhwc, 2) > LARGE_ROOM
    })
}

fn kind(g: &Graph, id: NodeId, every: bool) -> Kind {
    let n = g.node(id);
    let rank4 = |x: NodeId| g.ty(x).shape.rank() == 4;
    match &n.op {
        Op::Window(w) if w.conv().is_some() && stays_nchw(g, id, every) => Kind::Fixed,
        Op::Window(w) if w.conv().is_some() => Kind::Conv,
        _ if !rank4(id) => Kind::Fixed,
        op if op.is_elementwise() || matches!(op, Op::StopGradient) => {
            if n.inputs.iter().all(|&x| rank4(x)) {
                Kind::Flexible
            } else {
                Kind::Fixed
            }
        }
        Op::Reduce { .. } if rank4(n.inputs[0]) => Kind::Flexible,
        Op::Window(WindowOp::MaxPool2d(_) | WindowOp::MaxPool2dGrad(_))
            if n.inputs.iter().all(|&x| rank4(x)) =>
        {
            Kind::Pool
        }
        Op::Broadcast if g.ty(n.inputs[0]).shape.rank() <= 4 => Kind::Flexible,
        _ => Kind::Fixed,
    }
}

/// True when a tensor of these NCHW dims has the same bytes channels-last: its axes other
/// than those of size 1 keep their order under the permutation.
fn same_bytes(d: &[usize]) -> bool {
    let kept: Vec<usize> = ConvLayout::NHWC_PERM
        .iter()
        .copied()
        .filter(|&a| d[a] != 1)
        .collect();
    kept.windows(2).all(|w| w[0] < w[1])
}

fn dims4(t: &TensorType) -> Option<[usize; 4]> {
    t.shape.dims().try_into().ok()
}

/// Union-find over node indices.
struct Sets(Vec<usize>);

impl Sets {
    fn find(&mut self, mut a: usize) -> usize {
        while self.0[a] != a {
            self.0[a] = self.0[self.0[a]];
            a = self.0[a];
        }
        a
    }

    fn join(&mut self, a: usize, b: usize) {
        let (a, b) = (self.find(a), self.find(b));
        if a != b {
            self.0[a.max(b)] = a.min(b);
        }
    }
}

/// The layout each node's value is computed in.
/// The layout each node's value is computed in: the components' layouts decided with the max
/// poolings charging nothing, then again with each pooling (and its gradient) in the layout
/// its image took, so that a pooling fed channels-last computes channels-last (a transpose
/// after it moves a quarter of the bytes one before it would) and one fed NCHW keeps NCHW.
fn decide(g: &Graph, every: bool) -> Vec<ConvLayout> {
    let kinds: Vec<Kind> = g.ids().map(|id| kind(g, id, every)).collect();
    let first = components(g, &kinds, None);
    let pools: Vec<ConvLayout> = g
        .ids()
        .map(|id| match kinds[id.index()] {
            Kind::Pool => first[g.node(id).inputs[0].index()],
            _ => ConvLayout::Nchw,
        })
        .collect();
    components(g, &kinds, Some(&pools))
}

/// Each node's layout, the poolings' given (`pools`, by node index; `None`: they charge
/// nothing and are NCHW): each component of flexible ops takes the layout whose transposes
/// move fewer bytes.
fn components(g: &Graph, kinds: &[Kind], pools: Option<&[ConvLayout]>) -> Vec<ConvLayout> {
    let mut sets = Sets((0..g.len()).collect());
    for id in g.ids() {
        if kinds[id.index()] != Kind::Flexible {
            continue;
        }
        for &x in &g.node(id).inputs {
            if kinds[x.index()] == Kind::Flexible && g.ty(x).shape.rank() == 4 {
                sets.join(id.index(), x.index());
            }
        }
    }
    // Bytes a component's transposes would move if it took NCHW (index 0) or channels-last
    // (1): a neighbour that wants one layout charges the other.
    let mut cost: HashMap<usize, [usize; 2]> = HashMap::new();
    let mut charge = |sets: &mut Sets, flexible: NodeId, wants: ConvLayout, bytes: usize| {
        let c = cost.entry(sets.find(flexible.index())).or_default();
        c[usize::from(wants == ConvLayout::Nchw)] += bytes;
    };
    let costly = |x: NodeId| {
        dims4(g.ty(x)).is_some_and(|d| !same_bytes(&d)) && !matches!(g.node(x).op, Op::Full { .. })
    };
    let pool = |id: NodeId| pools.map_or(ConvLayout::Nchw, |p| p[id.index()]);
    let fixed_layout = |id: NodeId| match kinds[id.index()] {
        Kind::Conv => ConvLayout::Nhwc,
        Kind::Pool => pool(id),
        _ => ConvLayout::Nchw,
    };
    let neutral = |id: NodeId| kinds[id.index()] == Kind::Pool && pools.is_none();
    for id in g.ids() {
        let k = kinds[id.index()];
        for &x in &g.node(id).inputs {
            if !costly(x) {
                continue;
            }
            let kx = kinds[x.index()];
            if neutral(id) || neutral(x) {
                continue;
            }
            let bytes = g.ty(x).bytes();
            match (kx, k) {
                (Kind::Flexible, Kind::Flexible) => {}
                (Kind::Flexible, _) => charge(&mut sets, x, fixed_layout(id), bytes),
                (_, Kind::Flexible) => charge(&mut sets, id, fixed_layout(x), bytes),
                _ => {}
            }
        }
    }
    for &x in g.outputs.values().chain(g.updates.iter().map(|u| &u.value)) {
        if kinds[x.index()] == Kind::Flexible && costly(x) {
            charge(&mut sets, x, ConvLayout::Nchw, g.ty(x).bytes());
        }
    }
    g.ids()
        .map(|id| match kinds[id.index()] {
            Kind::Conv => ConvLayout::Nhwc,
            Kind::Fixed => ConvLayout::Nchw,
            Kind::Pool => pool(id),
            Kind::Flexible => {
                // What the component's transposes would move if it took each layout: its
                // readers and writers that want the other one pay.
                let [nchw, nhwc] = cost
                    .get(&sets.find(id.index()))
                    .copied()
                    .unwrap_or_default();
                if nhwc < nchw {
                    ConvLayout::Nhwc
                } else {
                    ConvLayout::Nchw
                }
            }
        })
        .collect()
}

/// The graph under construction with each value's layout and its conversions made so far.
struct Builder<'a> {
    g: &'a Graph,
    out: Graph,
    map: Vec<NodeId>,
    layout: Vec<ConvLayout>,
    converted: HashMap<(NodeId, ConvLayout), NodeId>,
    report: LayoutReport,
}

impl Builder<'_> {
    /// Node `x` of the old graph in the new one, stored in `want` where it is 4-d.
    fn get(&mut self, x: NodeId, want: ConvLayout) -> Result<NodeId, IrError> {
        let have = self.layout[x.index()];
        if have == want || self.g.ty(x).shape.rank() != 4 {
            return Ok(self.map[x.index()]);
        }
        if let Some(&n) = self.converted.get(&(x, want)) {
            return Ok(n);
        }
        let n = self.convert(self.map[x.index()], have, want)?;
        self.converted.insert((x, want), n);
        Ok(n)
    }

    /// New node `n`, stored in `from`, stored in `to`: a reshape where the bytes agree, a
    /// constant made again, a transpose composed with the one `n` is, or a new transpose.
    fn convert(&mut self, n: NodeId, from: ConvLayout, to: ConvLayout) -> Result<NodeId, IrError> {
        let t = self.out.ty(n).clone();
        let d = dims4(&t).expect("a 4-d value");
        let logical = from.logical(d);
        let target = TensorType::new(Shape::new(&to.store(logical)), t.dtype);
        let node = self.out.node(n).clone();
        if let Op::Full { value } = node.op {
            self.report.free_changes += 1;
            return self.out.push(Op::Full { value }, &[], Some(target));
        }
        if same_bytes(&logical) {
            self.report.free_changes += 1;
            return self.out.push(Op::Reshape, &[n], Some(target));
        }
        let perm = match to {
            ConvLayout::Nhwc => ConvLayout::NHWC_PERM,
            ConvLayout::Nchw => ConvLayout::NCHW_PERM,
        };
        if let Op::Transpose { perm: first } = &node.op {
            // transpose(transpose(m, first), perm) = transpose(m, first ∘ perm).
            let composed: Vec<usize> = perm.iter().map(|&i| first[i]).collect();
            let m = node.inputs[0];
            if composed.iter().enumerate().all(|(i, &a)| i == a) {
                return Ok(m);
            }
            self.report.transposes += 1;
            self.report.transposed_bytes += target.bytes();
            return self.out.push(
                Op::Transpose {
                    perm: composed.into_iter().collect(),
                },
                &[m],
                Some(target),
            );
        }
        self.report.transposes += 1;
        self.report.transposed_bytes += target.bytes();
        self.out.push(
            Op::Transpose {
                perm: perm.into_iter().collect(),
            },
            &[n],
            Some(target),
        )
    }

    /// Node `id` built in layout `l` on its operands, converted as it needs them.
    fn build(&mut self, id: NodeId, l: ConvLayout) -> Result<NodeId, IrError> {
        let g = self.g;
        let n = g.node(id);
        if let (Op::Window(w), ConvLayout::Nhwc) = (&n.op, l) {
            if let Some(c) = w.conv() {
                let op = Op::Window(nhwc_conv(w, c));
                let ins = self.operands(id, ConvLayout::Nhwc)?;
                self.report.convolutions += 1;
                return self.out.push(op, &ins, None);
            }
        }
        if l == ConvLayout::Nchw {
            let ins = self.operands(id, ConvLayout::Nchw)?;
            return self.out.push(n.op.clone(), &ins, Some(n.ty.clone()));
        }
        self.report.channels_last_ops += 1;
        let stored = |t: &TensorType| {
            let d = dims4(t).expect("a 4-d value");
            TensorType::new(Shape::new(&l.store(d)), t.dtype)
        };
        match &n.op {
            Op::Reduce { op, axes } => {
                let x = self.get(n.inputs[0], l)?;
                let mut axes: crate::ir::Axes =
                    axes.iter().map(|&a| ConvLayout::NCHW_PERM[a]).collect();
                axes.sort_unstable();
                self.out
                    .push(Op::Reduce { op: *op, axes }, &[x], Some(stored(&n.ty)))
            }
            Op::Broadcast => {
                let x = n.inputs[0];
                let xt = g.ty(x);
                let x = if xt.shape.rank() == 4 {
                    self.get(x, l)?
                } else {
                    // NumPy's right alignment made explicit, then the 4-d operand converted.
                    let mut d = vec![1; 4 - xt.shape.rank()];
                    d.extend_from_slice(xt.shape.dims());
                    let four = TensorType::new(Shape::new(&d), xt.dtype);
                    let r = self
                        .out
                        .push(Op::Reshape, &[self.map[x.index()]], Some(four))?;
                    self.convert(r, ConvLayout::Nchw, l)?
                };
                self.out.push(Op::Broadcast, &[x], Some(stored(&n.ty)))
            }
            Op::Window(WindowOp::MaxPool2d(p)) => {
                let ins = self.operands(id, l)?;
                let p = Pool2d { layout: l, ..*p };
                let op = Op::Window(WindowOp::MaxPool2d(p));
                self.out.push(op, &ins, Some(stored(&n.ty)))
            }
            Op::Window(WindowOp::MaxPool2dGrad(p)) => {
                let ins = self.operands(id, l)?;
                let p = Pool2d { layout: l, ..*p };
                let op = Op::Window(WindowOp::MaxPool2dGrad(p));
                self.out.push(op, &ins, Some(stored(&n.ty)))
            }
            op => {
                let ins = self.operands(id, l)?;
                self.out.push(op.clone(), &ins, Some(stored(&n.ty)))
            }
        }
    }

    /// Node `id`'s operands in the new graph, each 4-d one stored in `l`.
    fn operands(&mut self, id: NodeId, l: ConvLayout) -> Result<Vec<NodeId>, IrError> {
        let inputs = self.g.node(id).inputs.clone();
        inputs.iter().map(|&x| self.get(x, l)).collect()
    }
}

/// The channels-last form of convolution op `w` (geometry `c`).
fn nhwc_conv(w: &WindowOp, c: &crate::ir::Conv2d) -> WindowOp {
    let conv = crate::ir::Conv2d {
        layout: ConvLayout::Nhwc,
        ..*c
    };
    match *w {
        WindowOp::Conv2dGradInput { input, .. } => WindowOp::Conv2dGradInput { conv, input },
        WindowOp::Conv2dGradWeight { kernel, .. } => WindowOp::Conv2dGradWeight { conv, kernel },
        _ => WindowOp::Conv2d(conv),
    }
}

/// `g` with every convolution channels-last and the transposes that needs (see the module
/// docs); a graph without convolutions comes back as it is.
pub fn channels_last(g: &Graph) -> Result<(Graph, LayoutReport), IrError> {
    rewrite(g, false)
}

/// [`channels_last`] with the convolutions over few input channels channels-last too, whatever
/// their size and dtype: what [`few_channels_last`] does to a large bf16 stem, on a stem small
/// enough for the CPU's reference interpreter to check.
pub fn channels_last_every(g: &Graph) -> Result<(Graph, LayoutReport), IrError> {
    rewrite(g, true)
}

fn rewrite(g: &Graph, every: bool) -> Result<(Graph, LayoutReport), IrError> {
    let convs = g
        .nodes()
        .iter()
        .any(|n| matches!(&n.op, Op::Window(w) if w.conv().is_some()));
    if !convs {
        return Ok((g.clone(), LayoutReport::default()));
    }
    let layout = decide(g, every);
    let mut b = Builder {
        g,
        out: Graph::new(),
        map: Vec::with_capacity(g.len()),
        layout,
        converted: HashMap::new(),
        report: LayoutReport::default(),
    };
    for id in g.ids() {
        b.out.set_scope(g.origin(id).clone());
        let l = b.layout[id.index()];
        let new = b.build(id, l)?;
        b.map.push(new);
    }
    // Every output and update is read in NCHW.
    let ends: Vec<NodeId> = g
        .outputs
        .values()
        .copied()
        .chain(g.updates.iter().flat_map(|u| [u.target, u.value]))
        .collect();
    let mut end = HashMap::new();
    for x in ends {
        let n = b.get(x, ConvLayout::Nchw)?;
        end.insert(x, n);
    }
    b.out.keep_outputs_of(g, |x| end[&x])?;
    Ok((b.out, b.report))
}
