//! Random forward graphs for differential testing of the whole pipeline.
//!
//! [`model`] builds, deterministically from a seed, a small forward pass with a scalar loss and
//! parameters that reach it, made of the ops fusion has to get right: views (broadcasts,
//! transposes, slices, merging and splitting reshapes, size-1 axes), concats of 2 to 20 parts
//! (equal parts, which fusion writes as selects, unequal ones, and parts that reshape a split
//! axis), reductions and softmax-like stages, matmuls on reshaped values, gathers, selects and
//! elementwise ops whose values stay finite, and fused attentions in each of their operand
//! layouts (heads, tokens, packed q/k/v). Autodiff and the optimizer turn it into a real
//! step, so the backward pass's broadcasts, sums and scatters are exercised too; a quarter of
//! the seeds accumulate gradients over 2 or 3 micro-batches ([`step_options`]).
//!
//! The property test in ir-tests, the fuzz target `fused_step` and the GPU test
//! `cuda_random_graphs` all draw from this one generator, so a failing seed names the same graph
//! everywhere. Values stay small (at most [`MAX_NUMEL`] elements each) so a graph compiles and
//! runs in milliseconds.

use crate::autodiff::Optimizer;
use crate::error::Result;
use crate::ir::{AttentionLayout, BinaryOp, CmpOp, DType, Graph, Init, NodeId, Shape, UnaryOp};
use crate::model::Model;
use ingot_kernels::fused::random::Rng;

/// The largest element count of any value the generator makes.
pub const MAX_NUMEL: usize = 2048;

/// Sizes an axis is drawn from: size 1 often, so broadcasts and size-1 axes are common.
const DIMS: [usize; 8] = [1, 1, 2, 3, 4, 5, 6, 8];

/// The forward graph of seed `seed`, as a model named `random:SEED`, trained with SGD or AdamW.
/// Every op is drawn only on operands it accepts, so an error here is a bug in the generator
/// (or in the IR's shape rules), never a property of the seed.
pub fn model(seed: u64) -> Result<Model> {
    let mut b = Builder::new(seed);
    let loss = b.build(None)?;
    let mut g = std::mem::take(&mut b.g);
    g.set_output("loss", loss)?;
    let optimizer = if b.rng.chance(50) {
        Optimizer::Sgd { lr: 0.1 }
    } else {
        Optimizer::adamw(0.01, 0.01)
    };
    // Mixed precision a quarter of the time, TF32 products an eighth.
    let precision = match b.rng.below(8) {
        0 | 1 => crate::precision::Precision::Bf16,
        2 => crate::precision::Precision::Tf32,
        _ => crate::precision::Precision::F32,
    };
    Ok(Model {
        precision,
        ..Model::new(format!("random:{seed}"), g, optimizer)
    })
}

/// How many micro-batches seed `seed`'s step accumulates its gradients over
/// ([`crate::autodiff::StepOptions::accumulate`]): 2 or 3 for a quarter of the seeds, else 1
/// (none). Drawn from a stream of its own, so every seed's graph is what it was before
/// accumulation was drawn; every input of rank one or more is the batch then (its rows are
/// the micro-batches'), so any generated graph accumulates.
pub fn micro_batches(seed: u64) -> usize {
    let mut r = Rng(seed ^ 0xacc0_c0de_0053_0001);
    match r.below(8) {
        0 => 2,
        1 => 3,
        _ => 1,
    }
}

/// The step options seed `seed`'s step is built with: its [`micro_batches`].
pub fn step_options(seed: u64) -> crate::autodiff::StepOptions {
    crate::autodiff::StepOptions {
        accumulate: micro_batches(seed),
        ..Default::default()
    }
}

/// One op of a [`Description`]: the kinds of op [`model`] draws from, named.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    Unary,
    Binary,
    /// A random permutation (of a value with two axes or more).
    Transpose,
    Slice,
    Concat,
    /// A sum or max over random axes.
    Reduce,
    Softmax,
    Reshape,
    MatMul,
    Broadcast,
    /// A comparison and a select.
    Select,
    /// Rows of a new table gathered by iota ids (the embedding pattern).
    Gather,
    Attention,
    /// A convolution, batch norm or pooling block over an image.
    Image,
    Dropout,
}

impl OpKind {
    /// Every kind, in the order [`model`]'s draw numbers them.
    pub const ALL: [OpKind; 15] = [
        OpKind::Unary,
        OpKind::Binary,
        OpKind::Transpose,
        OpKind::Slice,
        OpKind::Concat,
        OpKind::Reduce,
        OpKind::Softmax,
        OpKind::Reshape,
        OpKind::MatMul,
        OpKind::Broadcast,
        OpKind::Select,
        OpKind::Gather,
        OpKind::Attention,
        OpKind::Image,
        OpKind::Dropout,
    ];

    /// The number [`Builder::op`] knows the kind by (what `rng.below(16)` draws for it).
    fn code(self) -> usize {
        match self {
            OpKind::Unary => 0,
            OpKind::Binary => 1,
            OpKind::Transpose => 3,
            OpKind::Slice => 4,
            OpKind::Concat => 5,
            OpKind::Reduce => 6,
            OpKind::Softmax => 7,
            OpKind::Reshape => 8,
            OpKind::MatMul => 9,
            OpKind::Broadcast => 10,
            OpKind::Select => 11,
            OpKind::Gather => 12,
            OpKind::Attention => 13,
            OpKind::Image => 14,
            OpKind::Dropout => 15,
        }
    }
}

/// The most ops of a [`Description`] that [`described`] builds (the rest are ignored), so
/// that a graph stays small enough to compile and run in milliseconds.
pub const MAX_OPS: usize = 32;

/// A random graph described op by op rather than by one seed: the fuzz target `fused_step`
/// builds one from its input, so that the fuzzer's mutations add, remove or change ops and
/// the step's options one at a time.
#[derive(Clone, Debug, PartialEq)]
pub struct Description {
    /// Seeds the draws the description leaves to the generator: shapes, axes, and which
    /// values each op reads.
    pub seed: u64,
    /// The ops, in order, each on a value drawn from those built so far (one that does not
    /// apply to the value drawn is skipped).
    pub ops: Vec<OpKind>,
    /// AdamW, else SGD.
    pub adamw: bool,
    pub precision: crate::precision::Precision,
    /// Micro-batches the step accumulates its gradients over (1 to 3; others are clamped).
    pub micro_batches: usize,
}

/// The model that `d` describes, named `described:SEED`: built as [`model`] builds one, with
/// `d`'s ops, optimizer and precision where [`model`] draws them.
pub fn described(d: &Description) -> Result<Model> {
    let mut b = Builder::new(d.seed);
    let ops = &d.ops[..d.ops.len().min(MAX_OPS)];
    let loss = b.build(Some(ops))?;
    let mut g = std::mem::take(&mut b.g);
    g.set_output("loss", loss)?;
    let optimizer = if d.adamw {
        Optimizer::adamw(0.01, 0.01)
    } else {
        Optimizer::Sgd { lr: 0.1 }
    };
    Ok(Model {
        precision: d.precision,
        ..Model::new(format!("described:{}", d.seed), g, optimizer)
    })
}

/// The step options `d`'s step is built with: its micro-batches, clamped to 1 to 3.
pub fn described_step_options(d: &Description) -> crate::autodiff::StepOptions {
    crate::autodiff::StepOptions {
        accumulate: d.micro_batches.clamp(1, 3),
        ..Default::default()
    }
}

struct Builder {
    g: Graph,
    rng: Rng,
    /// The f32 values built so far.
    pool: Vec<NodeId>,
    params: usize,
    inputs: usize,
    /// Named layers built (convolutions, batch norms, dropouts): their names are unique.
    layers: usize,
}

fn numel(d: &[usize]) -> usize {
    d.iter().product()
}

impl Builder {
    fn new(seed: u64) -> Builder {
        Builder {
            g: Graph::new(),
            rng: Rng(seed),
            pool: Vec::new(),
            params: 0,
            inputs: 0,
            layers: 0,
        }
    }

    fn dims(&self, x: NodeId) -> Vec<usize> {
        self.g.ty(x).shape.dims().to_vec()
    }

    fn random_shape(&mut self) -> Vec<usize> {
        let rank = self.rng.pick(&[0, 1, 2, 2, 3, 3, 4]);
        (0..rank).map(|_| self.rng.pick(&DIMS)).collect()
    }

    fn parameter(&mut self, dims: &[usize]) -> Result<NodeId> {
        self.params += 1;
        let name = format!("p{}", self.params);
        self.g
            .parameter(&name, dims, DType::F32, Init::Normal { std: 0.5 })
    }

    fn leaf(&mut self, dims: &[usize]) -> Result<NodeId> {
        if self.rng.chance(30) {
            self.inputs += 1;
            let name = format!("x{}", self.inputs);
            self.g.input(&name, dims, DType::F32)
        } else {
            self.parameter(dims)
        }
    }

    fn pick(&mut self) -> NodeId {
        // Recent values more often, so chains grow deep.
        let n = self.pool.len();
        if self.rng.chance(60) {
            self.pool[n - 1 - self.rng.below(n.min(3))]
        } else {
            self.pool[self.rng.below(n)]
        }
    }

    /// The forward pass and its loss: `script`'s ops in order, else a drawn number of drawn
    /// ops.
    fn build(&mut self, script: Option<&[OpKind]>) -> Result<NodeId> {
        let first = self.random_shape();
        let p = self.parameter(&first)?;
        self.pool.push(p);
        for _ in 0..self.rng.below(2) {
            let s = self.random_shape();
            let x = self.leaf(&s)?;
            self.pool.push(x);
        }
        let ops = match script {
            Some(s) => s.len(),
            None => 3 + self.rng.below(14),
        };
        for i in 0..ops {
            let x = self.pick();
            let kind = match script {
                Some(s) => s[i].code(),
                None => self.rng.below(16),
            };
            if let Some(mut y) = self.op(x, kind)? {
                // Every value built reaches the loss (so does every parameter); one that grew
                // too large is summed down to one element first.
                let d = self.dims(y);
                if numel(&d) > MAX_NUMEL {
                    let all: Vec<usize> = (0..d.len()).collect();
                    y = self.g.sum(y, &all)?;
                }
                self.pool.push(y);
            }
        }
        self.loss()
    }

    /// The loss: the mean square of every value nothing else reads, summed, so every leaf
    /// reaches it.
    fn loss(&mut self) -> Result<NodeId> {
        let mut used = vec![false; self.g.len()];
        for id in self.g.ids() {
            for &i in &self.g.node(id).inputs {
                used[i.index()] = true;
            }
        }
        let sinks: Vec<NodeId> = self
            .pool
            .iter()
            .copied()
            .filter(|x| !used[x.index()])
            .collect();
        let mut loss: Option<NodeId> = None;
        for s in sinks {
            let sq = self.g.mul(s, s)?;
            let n = numel(&self.dims(s)).max(1);
            let t = self.g.sum_all(sq)?;
            let t = self.g.mul_scalar(t, 1.0 / n as f64)?;
            loss = Some(match loss {
                None => t,
                Some(l) => self.g.add(l, t)?,
            });
        }
        loss.ok_or_else(|| {
            crate::error::IrError::Invalid("random graph: no value to take the loss of".into())
        })
    }

    /// One random op of kind `kind` (an [`OpKind::code`]) on `x`, or `None` where it does not
    /// apply to it.
    fn op(&mut self, x: NodeId, kind: usize) -> Result<Option<NodeId>> {
        let d = self.dims(x);
        let r = d.len();
        Ok(Some(match kind {
            0 => self.unary(x)?,
            1 | 2 => self.binary(x)?,
            3 if r >= 2 => {
                let mut perm: Vec<usize> = (0..r).collect();
                for i in (1..r).rev() {
                    perm.swap(i, self.rng.below(i + 1));
                }
                self.g.transpose(x, &perm)?
            }
            4 if r >= 1 => {
                let axis = self.rng.below(r);
                if d[axis] == 0 {
                    return Ok(None);
                }
                let start = self.rng.below(d[axis]);
                let end = start + 1 + self.rng.below(d[axis] - start);
                self.g.slice(x, axis, start, end)?
            }
            5 if r >= 1 => return self.concat(x),
            6 if r >= 1 => {
                let axes = self.axes(r);
                if self.rng.chance(50) {
                    self.g.sum(x, &axes)?
                } else {
                    self.g.max(x, &axes)?
                }
            }
            7 if r >= 1 => {
                // softmax over random axes: a staged max and sum read back at their rows.
                let axes = self.axes(r);
                let m = self.g.max(x, &axes)?;
                let m = self.g.stop_gradient(m)?;
                let y = self.g.sub(x, m)?;
                let e = self.g.exp(y)?;
                let s = self.g.sum(e, &axes)?;
                self.g.div(e, s)?
            }
            8 => return self.reshape(x),
            9 if r >= 1 => self.matmul(x)?,
            10 => {
                // broadcast to a new leading axis and every size-1 axis widened.
                let mut to: Vec<usize> = Vec::new();
                if r < 4 && self.rng.chance(50) {
                    to.push(self.rng.pick(&[2, 3]));
                }
                for &n in &d {
                    to.push(if n == 1 { self.rng.pick(&DIMS) } else { n });
                }
                if numel(&to) > MAX_NUMEL {
                    return Ok(None);
                }
                self.g.broadcast_to(x, to.as_slice())?
            }
            11 => {
                let y = self.partner(x)?;
                let op = self.rng.pick(&[CmpOp::Gt, CmpOp::Le, CmpOp::Ne]);
                let c = self.g.compare(op, x, y)?;
                let z = self.g.tanh(y)?;
                self.g.select(c, x, z)?
            }
            12 => {
                // gather rows of a table by ids from iota: the embedding pattern.
                let n = self.rng.pick(&[1, 2, 3, 5]);
                let v = n + self.rng.below(3);
                let dd = self.rng.pick(&DIMS);
                let table = self.parameter(&[v, dd])?;
                let ids = self.g.iota(&[n][..], 0, DType::I64)?;
                let rows = self.g.gather(table, ids)?;
                if self.rng.chance(50) && r >= 1 && d[r - 1] == dd && numel(&d) > 0 {
                    // combine with x where the shapes broadcast
                    match self.g.broadcast_shape("add", x, rows) {
                        Ok(_) => self.g.add(x, rows)?,
                        Err(_) => rows,
                    }
                } else {
                    rows
                }
            }
            13 => self.attention(x)?,
            14 => self.image_block(x)?,
            15 => {
                // dropout: a seeded mask drawn in the forward pass and again in the backward.
                self.layers += 1;
                let p = self.rng.pick(&[0.1, 0.5]);
                crate::trace::nn::dropout(&mut self.g, &format!("drop{}", self.layers), x, p)?
            }
            _ => return Ok(None),
        }))
    }

    /// A fused attention in a random layout over new leaves, scaled by `x`'s mean so that
    /// `x` reaches it: head dim 32 (the smallest the CUDA kernels take), a few heads and
    /// positions, causal or not; the output `[.., T, D]` or `[B, T, H, D]`.
    fn attention(&mut self, x: NodeId) -> Result<NodeId> {
        const D: usize = 32;
        let (b, h) = (self.rng.pick(&[1, 2]), self.rng.pick(&[1, 2]));
        let (tq, tk) = (self.rng.pick(&[1, 2, 3, 5]), self.rng.pick(&[1, 2, 3, 5]));
        let causal = self.rng.chance(50);
        let scale = self.rng.pick(&[0.1, 0.25, 0.5]);
        let layout = self.rng.pick(&[
            AttentionLayout::Heads,
            AttentionLayout::Tokens,
            AttentionLayout::Packed,
        ]);
        let shapes: Vec<Vec<usize>> = match layout {
            AttentionLayout::Heads => vec![vec![b, h, tq, D], vec![b, h, tk, D], vec![b, h, tk, D]],
            AttentionLayout::Tokens => {
                vec![vec![b, tq, h, D], vec![b, tk, h, D], vec![b, tk, h, D]]
            }
            AttentionLayout::Packed => vec![vec![b, tq, 3, h, D]],
        };
        let mean = self.mean_of(x)?;
        let f = self.g.tanh(mean)?;
        let mut operands = Vec::new();
        for d in shapes {
            let leaf = self.leaf(&d)?;
            let fb = self.g.broadcast_to(f, d.as_slice())?;
            let y = self.g.add(leaf, fb)?;
            operands.push(y);
        }
        self.g.attention_in(layout, &operands, causal, scale)
    }

    /// A small convolutional block over a new image leaf shifted by `x`'s mean (so `x` reaches
    /// it): a convolution (kernel 1 to 3, stride 1 or 2, padding 0 or 1, with or without
    /// bias), then a batch norm (running statistics updated as state) or not, then a max or
    /// average pooling, a global average pooling, or nothing.
    fn image_block(&mut self, x: NodeId) -> Result<NodeId> {
        use crate::trace::nn;
        let n = self.rng.pick(&[1, 2]);
        let c = self.rng.pick(&[1, 2, 3]);
        let (h, w) = (3 + self.rng.below(4), 3 + self.rng.below(4));
        let image = self.leaf(&[n, c, h, w])?;
        let f = self.mean_of(x)?;
        let f = self.g.tanh(f)?;
        let fb = self.g.broadcast_to(f, &[n, c, h, w][..])?;
        let image = self.g.add(image, fb)?;
        self.layers += 1;
        let out = self.rng.pick(&[1, 2, 4]);
        let kernel = self.rng.pick(&[1, 2, 3]);
        let stride = self.rng.pick(&[1, 1, 2]);
        let padding = if kernel > 1 { self.rng.below(2) } else { 0 };
        // A batch norm after the convolution makes each output channel's result independent
        // of the scale of its weights and of any bias, so their gradients are zero in exact
        // arithmetic: rounding noise, which no tolerance can hold to the reference in bf16.
        // As in real networks, such a convolution has no bias, and keeps more than one
        // weight per output channel.
        let norm = self.rng.chance(50) && c * kernel * kernel > 1;
        let bias = !norm && self.rng.chance(50);
        let name = format!("conv{}", self.layers);
        let mut y = nn::conv2d(
            &mut self.g,
            &name,
            image,
            c,
            out,
            kernel,
            stride,
            padding,
            1,
            1,
            bias,
        )?;
        let [_, _, oh, ow] = <[usize; 4]>::try_from(self.dims(y)).expect("an image");
        if norm && n * oh * ow > 1 {
            self.layers += 1;
            y = nn::batch_norm2d(&mut self.g, &format!("bn{}", self.layers), y, 1e-5)?;
        }
        Ok(match self.rng.below(4) {
            0 if oh >= 2 && ow >= 2 => self.g.scoped("pool", |g| nn::max_pool2d(g, y, 2, 2, 0))?,
            1 if oh >= 2 && ow >= 2 => self.g.scoped("pool", |g| nn::avg_pool2d(g, y, 2, 1, 0))?,
            2 => nn::global_avg_pool(&mut self.g, y)?,
            _ => y,
        })
    }

    /// The mean of every element of `x` (a scalar; `x` itself when it is one).
    fn mean_of(&mut self, x: NodeId) -> Result<NodeId> {
        let all: Vec<usize> = (0..self.dims(x).len()).collect();
        if all.is_empty() {
            return Ok(x);
        }
        let s = self.g.sum(x, &all)?;
        let n = self.g.full(
            numel(&self.dims(x)).max(1) as f64,
            Shape::scalar(),
            DType::F32,
        )?;
        self.g.div(s, n)
    }

    /// A nonempty, sorted subset of `0..r`.
    fn axes(&mut self, r: usize) -> Vec<usize> {
        let mut axes: Vec<usize> = (0..r).filter(|_| self.rng.chance(50)).collect();
        if axes.is_empty() {
            axes.push(self.rng.below(r));
        }
        axes
    }

    fn unary(&mut self, x: NodeId) -> Result<NodeId> {
        let g = &mut self.g;
        Ok(match self.rng.below(6) {
            0 => g.tanh(x)?,
            1 => g.neg(x)?,
            2 => {
                let t = g.tanh(x)?;
                g.exp(t)?
            }
            k => {
                // log, sqrt and recip of x² + 1, which is at least 1.
                let sq = g.mul(x, x)?;
                let p = g.add_scalar(sq, 1.0)?;
                let op = [UnaryOp::Log, UnaryOp::Sqrt, UnaryOp::Recip][k - 3];
                g.unary(op, p)?
            }
        })
    }

    /// A value that broadcasts against `x`: one from the pool if one does, else a new leaf
    /// shaped like `x` with some axes taken as 1 and some leading axes dropped.
    fn partner(&mut self, x: NodeId) -> Result<NodeId> {
        let d = self.dims(x);
        if self.rng.chance(40) {
            let fits: Vec<NodeId> = self
                .pool
                .iter()
                .copied()
                .filter(|&y| {
                    let e = self.g.ty(y).shape.dims();
                    e.len() <= d.len()
                        && e.iter()
                            .zip(&d[d.len() - e.len()..])
                            .all(|(&a, &b)| a == b || a == 1)
                })
                .collect();
            if !fits.is_empty() {
                return Ok(self.rng.pick(&fits));
            }
        }
        let drop = self.rng.below(d.len() + 1).min(self.rng.below(3));
        let s: Vec<usize> = d[drop..]
            .iter()
            .map(|&n| if self.rng.chance(30) { 1 } else { n })
            .collect();
        self.leaf(&s)
    }

    fn binary(&mut self, x: NodeId) -> Result<NodeId> {
        let y = self.partner(x)?;
        let (a, b) = if self.rng.chance(50) { (x, y) } else { (y, x) };
        let op = self.rng.pick(&[
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Max,
            BinaryOp::Min,
            BinaryOp::Div,
        ]);
        if op == BinaryOp::Div {
            let sq = self.g.mul(b, b)?;
            let den = self.g.add_scalar(sq, 1.0)?;
            return self.g.div(a, den);
        }
        self.g.binary(op, a, b)
    }

    fn concat(&mut self, x: NodeId) -> Result<Option<NodeId>> {
        let d = self.dims(x);
        let r = d.len();
        let axis = self.rng.below(r);
        let n = if self.rng.chance(70) {
            2 + self.rng.below(6)
        } else {
            2 + self.rng.below(19)
        };
        let total = numel(&d).saturating_mul(n);
        if total > MAX_NUMEL || d[axis] == 0 {
            return Ok(None);
        }
        let style = self.rng.below(4);
        let mut parts = Vec::with_capacity(n);
        for i in 0..n {
            let p = match self.rng.below(4) {
                0 => x,
                1 => self.g.mul_scalar(x, (i + 1) as f64)?,
                2 => self.g.tanh(x)?,
                _ => {
                    let y = self.partner(x)?;
                    self.g.add(x, y)?
                }
            };
            let p = match style {
                // unequal parts: a prefix of each along the axis (a library concat)
                1 => {
                    let len = 1 + self.rng.below(d[axis]);
                    self.g.slice(p, axis, 0, len)?
                }
                // parts reshaping a split axis: the axis merged with the next one
                2 if axis + 1 < r => {
                    let mut m = d.clone();
                    m[axis] *= m[axis + 1];
                    m.remove(axis + 1);
                    self.g.reshape(p, m.as_slice())?
                }
                _ => p,
            };
            parts.push(p);
        }
        Ok(Some(self.g.concat(&parts, axis)?))
    }

    fn reshape(&mut self, x: NodeId) -> Result<Option<NodeId>> {
        let d = self.dims(x);
        let r = d.len();
        let to: Vec<usize> = match self.rng.below(5) {
            // merge two adjacent axes
            0 if r >= 2 => {
                let a = self.rng.below(r - 1);
                let mut m = d.clone();
                m[a] *= m[a + 1];
                m.remove(a + 1);
                m
            }
            // split an axis into two factors
            1 if (1..4).contains(&r) => {
                let a = self.rng.below(r);
                let f: Vec<usize> = (1..=d[a]).filter(|&f| d[a].is_multiple_of(f)).collect();
                let f = self.rng.pick(&f);
                let mut m = d.clone();
                m[a] = f;
                m.insert(a + 1, d[a] / f);
                m
            }
            // insert a size-1 axis
            2 if r < 4 => {
                let mut m = d.clone();
                m.insert(self.rng.below(r + 1), 1);
                m
            }
            // drop the size-1 axes
            3 => d.iter().copied().filter(|&n| n != 1).collect(),
            // flatten and refactor
            _ => {
                let mut left = numel(&d);
                let mut m = Vec::new();
                while left > 1 && m.len() < 3 {
                    let f: Vec<usize> = (1..=left).filter(|&f| left.is_multiple_of(f)).collect();
                    let f = self.rng.pick(&f);
                    m.push(f);
                    left /= f;
                }
                if left != 1 || self.rng.chance(30) {
                    m.push(left);
                }
                if numel(&d) == 0 {
                    return Ok(None);
                }
                m
            }
        };
        if to == d {
            return Ok(None);
        }
        Ok(Some(self.g.reshape(x, Shape::from(to.as_slice()))?))
    }

    /// `x` viewed as a matrix `[M, K]` (K its last axis) times a new parameter `[K, N]`, the
    /// product viewed back with N as the last axis; sometimes a batched product of two values.
    fn matmul(&mut self, x: NodeId) -> Result<NodeId> {
        let d = self.dims(x);
        let r = d.len();
        let k = d[r - 1];
        let n = self.rng.pick(&DIMS);
        if r >= 3 && self.rng.chance(40) {
            // batched: [.., M, K] x [.., K, N], the second read transposed sometimes
            let tb = self.rng.chance(50);
            let mut wd = d[..r - 2].to_vec();
            if tb {
                wd.extend([n, k]);
            } else {
                wd.extend([k, n]);
            }
            let w = self.leaf(&wd)?;
            return self.g.matmul_t(x, w, false, tb);
        }
        let m = numel(&d[..r - 1]);
        let a = self.g.reshape(x, &[m, k][..])?;
        let w = self.parameter(&[k, n])?;
        let y = self.g.matmul(a, w)?;
        let mut out = d[..r - 1].to_vec();
        out.push(n);
        self.g.reshape(y, out.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_graph_and_every_graph_is_a_valid_forward_pass() {
        for seed in 0..300 {
            let a = model(seed).unwrap();
            assert_eq!(a, model(seed).unwrap(), "seed {seed}");
            a.graph.verify().unwrap();
            let loss = a.graph.outputs["loss"];
            assert_eq!(a.graph.ty(loss).shape.rank(), 0, "seed {seed}");
            for id in a.graph.ids() {
                assert!(
                    a.graph.ty(id).shape.numel() <= MAX_NUMEL * 20,
                    "seed {seed}"
                );
            }
        }
    }

    #[test]
    fn a_description_of_every_kind_of_op_builds_a_valid_forward_pass() {
        for seed in 0..20 {
            let d = Description {
                seed,
                ops: OpKind::ALL
                    .iter()
                    .chain(OpKind::ALL.iter().rev())
                    .copied()
                    .collect(),
                adamw: seed % 2 == 0,
                precision: crate::precision::Precision::F32,
                micro_batches: 1,
            };
            let m = described(&d).unwrap();
            assert_eq!(m, described(&d).unwrap(), "seed {seed}");
            m.graph.verify().unwrap();
        }
    }

    #[test]
    fn the_generator_makes_every_kind_of_op_it_promises() {
        let mut seen = std::collections::BTreeSet::new();
        let mut layouts = std::collections::BTreeSet::new();
        for seed in 0..300 {
            let g = model(seed).unwrap().graph;
            for (op, _) in g.op_histogram() {
                seen.insert(op.to_string());
            }
            for n in g.nodes() {
                if let crate::ir::Op::Attention { layout, .. } = n.op {
                    layouts.insert(layout);
                }
            }
        }
        assert_eq!(
            layouts.len(),
            3,
            "attention layouts in 300 graphs: {layouts:?}"
        );
        for op in [
            "broadcast",
            "transpose",
            "slice",
            "concat",
            "reduce_sum",
            "reduce_max",
            "reshape",
            "matmul",
            "gather",
            "select",
            "exp",
            "attention",
            "conv2d",
            "max_pool2d",
            "dropout",
        ] {
            assert!(seen.contains(op), "no {op} in 300 graphs: {seen:?}");
        }
    }
}
