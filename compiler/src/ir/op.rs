//! The primitive operations. Everything a training step does (layers, losses, their gradients
//! and the optimizer update) is spelled in these few ops, so that every later pass (autodiff,
//! rewriting, fusion, planning) handles a small closed set.

use super::window::WindowOp;
use ingot_kernels::FusedKernel;
use ingot_kernels::{BinaryOp, CmpOp, ReduceOp, UnaryOp};
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

/// Axis lists (for reductions and permutations).
pub type Axes = SmallVec<[usize; 4]>;

/// How a parameter is initialised when no weights file is given.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Init {
    Zeros,
    Ones,
    /// Normal(0, std), from the run's seeded generator.
    Normal {
        std: f64,
    },
    /// Uniform on `[-bound, bound)`, from the run's seeded generator (PyTorch's default
    /// kaiming-uniform init of conv and linear layers).
    Uniform {
        bound: f64,
    },
    /// An integer input's ids lie in `0..bound`: a synthetic batch draws them there and a
    /// loaded one is checked against it. Declared where the graph cannot show it: an imported
    /// model's labels, whose class count is its logits' class axis (no parameter's rows say
    /// it when the output head is tied to the embedding, as BERT's is).
    Ids {
        bound: u64,
    },
}

/// How an attention's operands are shaped, and so where its kernels read and write them
/// (`ingot_kernels::attention::Layout`). Recognition picks the layout in which the model's
/// own tensors are the operands, so that no transpose or slice is copied on the way in or out.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum AttentionLayout {
    /// q `[.., Tq, D]`, k and v `[.., Tk, D]`, out `[.., Tq, D]`: each problem (the leading
    /// axes) on its own rows.
    #[default]
    Heads,
    /// q `[B, Tq, H, D]`, k and v `[B, Tk, H, D]`, out `[B, Tq, H, D]`: token-major, as a linear
    /// layer writes them; problem `b·H + h`.
    Tokens,
    /// One operand `qkv [B, T, 3, H, D]` (q, k and v the slots of axis 2, as one fused
    /// projection writes them); out `[B, T, H, D]`; the gradient is one `dqkv` shaped as `qkv`.
    Packed,
}

impl AttentionLayout {
    /// The name in the IR text form (`layout=...`).
    pub fn name(self) -> &'static str {
        match self {
            AttentionLayout::Heads => "heads",
            AttentionLayout::Tokens => "tokens",
            AttentionLayout::Packed => "packed",
        }
    }

    /// Operands of the forward op: 1 for a packed q/k/v, else 3.
    pub fn inputs(self) -> usize {
        if self == AttentionLayout::Packed {
            1
        } else {
            3
        }
    }
}

/// What a leaf tensor is to the step: it decides where the planner puts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LeafKind {
    /// A trainable parameter: resident, updated in place by the step.
    Parameter,
    /// Optimizer state (moments, step counter): resident, updated in place by the step.
    State,
    /// A step input (batch): resident, written by the host before each step.
    Input,
}

/// One primitive operation. Operands are the node's `inputs`; attributes live here.
///
/// Binary, compare and select ops take operands of identical shape: broadcasting is its own op,
/// so that its cost and its gradient (a sum) are visible to every pass.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Op {
    /// A named leaf: parameter, optimizer state or step input. Shape and dtype are the node's.
    Leaf {
        kind: LeafKind,
        name: String,
        init: Init,
    },
    /// A constant tensor with every element equal to `value`.
    Full {
        value: f64,
    },
    /// Each element is its index along `axis` (used for masks and one-hot encodings).
    Iota {
        axis: usize,
    },
    Unary(UnaryOp),
    Binary(BinaryOp),
    /// Elementwise comparison; the result is `bool`.
    Compare(CmpOp),
    /// `select(cond, a, b)`: `a` where `cond` is true, else `b`.
    Select,
    /// NumPy broadcasting: operand axes align to the right; each is equal or 1.
    Broadcast,
    /// Same elements, new shape (row-major order kept).
    Reshape,
    /// Output axis `i` is operand axis `perm[i]`.
    Transpose {
        perm: Axes,
    },
    /// `[start, end)` along `axis`.
    Slice {
        axis: usize,
        start: usize,
        end: usize,
    },
    /// Operands joined along `axis`.
    Concat {
        axis: usize,
    },
    /// Reduces `axes`, keeping each as size 1.
    Reduce {
        op: ReduceOp,
        axes: Axes,
    },
    /// Batched matrix product: `[..., m, k] x [..., k, n] -> [..., m, n]`, equal batch axes.
    /// `ta` (`tb`) reads the first (second) operand with its last two axes swapped, so a
    /// transposed weight never has to be materialized.
    MatMul {
        ta: bool,
        tb: bool,
    },
    /// A matrix product accumulated into a value (GEMM with `beta = 1`): operands `c, a, b`,
    /// value `c + a·b`, where `a·b` is [`Op::MatMul`] with the same `ta`, `tb`. `a` and `b`
    /// share one float dtype; `c` and the result share another, as wide or wider (f32 `a`, `b`
    /// and `c`; bf16 `a`, `b` and `c`; or bf16 `a`, `b` with f32 `c`). The product is
    /// accumulated in f32 (f64 for f64) and the sum is rounded once to the result's dtype.
    /// The result may be written over `c` (operand 0), never over `a` or `b`. Made by
    /// fusion (its `matmul_acc` step) from `add(c, matmul(a, b))` and
    /// `add(c, convert(matmul(a, b)))`.
    MatMulAcc {
        ta: bool,
        tb: bool,
    },
    /// `gather(table [r, d...], ids [i...]) -> [i..., d...]`: rows of `table` picked by `ids`.
    Gather,
    /// `scatter_add(ids [i...], values [i..., d...]) -> [rows, d...]`: the transpose of gather.
    ScatterAdd {
        rows: usize,
    },
    /// Elementwise conversion to the node's dtype.
    Convert,
    /// The operand's value, through which autodiff passes no gradient (softmax's max shift).
    /// The rewriter removes it once the backward pass exists.
    StopGradient,
    /// Dropout (`nn.Dropout(p)` in training mode): operands `x` (float) and `seed` (an `i64`
    /// scalar, the step's seed input); the value is `x[i] · 1/(1 − p)` where the
    /// counter-based draw of `(seed, salt, i)` ([`ingot_kernels::rng`], `i` the row-major
    /// index) is at least `p`, else `x[i] · 0`. Nothing random is stored: the same operands
    /// draw the same mask, so its gradient is `dropout(dy, seed)` with the same `p` and `salt`.
    /// `salt` tells layers apart (a hash of the layer's name).
    Dropout {
        p: f64,
        salt: u64,
    },
    /// A fused kernel (see [`ingot_kernels::fused`]): its operands are the kernel's inputs in
    /// order, and the node's value is the kernel's output 0. Made by the fusion pass.
    Fused(Box<FusedKernel>),
    /// Output `index` (at least 1) of the node with several outputs that is this node's one
    /// operand (a fused kernel, `attention`, `attention_grad`). It is written when that node's
    /// kernel runs, and reads nothing itself.
    Result {
        index: usize,
    },
    /// Fused scaled dot-product attention, `softmax(scale · q·kᵀ [causal mask]) · v`, as one
    /// kernel that never stores the `[.., Tq, Tk]` scores (FlashAttention-2 on CUDA).
    /// Operands q, k, v (one float dtype, f32 or bf16), shaped and ordered as `layout` says
    /// ([`AttentionLayout`]). The node's value is `out` (q's dtype, shaped as `layout` says);
    /// output 1 (a [`Op::Result`]) is `lse`, f32 `[.., Tq]` over the problems (batch and heads,
    /// in that order): each row's `ln Σ_j exp(scale · q·k_j)` over the visible keys, which the
    /// backward pass recomputes the probabilities from. With `causal`, key `j` is visible to
    /// query `i` iff `j <= i`.
    Attention {
        causal: bool,
        scale: f64,
        #[serde(default)]
        layout: AttentionLayout,
    },
    /// The backward pass of [`Op::Attention`]: operands the forward's operands, then
    /// `out, lse, dout`; the values are the gradients of the forward's operands in their order
    /// and types (`dq`, output 1 `dk`, output 2 `dv`; or one `dqkv` for [`AttentionLayout::Packed`]).
    AttentionGrad {
        causal: bool,
        scale: f64,
        #[serde(default)]
        layout: AttentionLayout,
    },
    /// A sliding-window op over NCHW images: convolution, max pooling and their backward ops
    /// (see [`super::window`]).
    Window(WindowOp),
    /// Data parallelism: the sum over `ranks` ranks of each operand (a bucket of gradients,
    /// one dtype, each rank's of its share of the loss, so the sum is their mean), as one
    /// collective all-reduce over the bucket's bytes. The node's value is the sum of operand
    /// 0, output `i` (an [`Op::Result`]) that of operand `i`; each output
    /// is written in place over its operand, and the plan lays the operands out adjacently in
    /// operand order, so the collective runs on one contiguous region with no copy
    /// (`plan::check` verifies both). Made by autodiff's `buckets` module for `ranks >= 2`.
    AllReduce {
        ranks: usize,
    },
    /// Data parallelism: the concatenation along axis 0 of every rank's operand, rank 0's
    /// first (`[n, ..]` on each rank gives `[ranks * n, ..]` on every rank), as one collective
    /// all-gather. Made by autodiff's `buckets` module where a gradient is cheaper to compute
    /// again from every rank's operands than to all-reduce (an embedding's `scatter_add`: its
    /// ids and rows are a fraction of the table's bytes).
    AllGather {
        ranks: usize,
    },
    /// Data parallelism: rank `r`'s rows of the sum over `ranks` ranks of each operand (a
    /// bucket of gradients, one dtype): operand `[n, ..]` gives `[n / ranks, ..]`, rows
    /// `r·n/ranks .. (r+1)·n/ranks`, on rank `r`. The node's value is that of operand 0, output
    /// `i` (an [`Op::Result`]) that of operand `i`; each output is a buffer of its own. One
    /// collective reduce-scatter per operand, launched together. Made by autodiff's `shard`
    /// module, where each rank updates only its rows of a weight (ZeRO stage 1).
    ReduceScatter {
        ranks: usize,
    },
}

impl Op {
    /// The op's name in the text form and in error messages.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Leaf {
                kind: LeafKind::Parameter,
                ..
            } => "parameter",
            Op::Leaf {
                kind: LeafKind::State,
                ..
            } => "state",
            Op::Leaf {
                kind: LeafKind::Input,
                ..
            } => "input",
            Op::Full { .. } => "full",
            Op::Iota { .. } => "iota",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Compare(c) => c.name(),
            Op::Select => "select",
            Op::Broadcast => "broadcast",
            Op::Reshape => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::Slice { .. } => "slice",
            Op::Concat { .. } => "concat",
            Op::Reduce {
                op: ReduceOp::Sum, ..
            } => "reduce_sum",
            Op::Reduce {
                op: ReduceOp::Max, ..
            } => "reduce_max",
            Op::MatMul { .. } => "matmul",
            Op::MatMulAcc { .. } => "matmul_acc",
            Op::Gather => "gather",
            Op::ScatterAdd { .. } => "scatter_add",
            Op::Convert => "convert",
            Op::StopGradient => "stop_gradient",
            Op::Dropout { .. } => "dropout",
            Op::Fused(_) => "fused",
            Op::Result { .. } => "result",
            Op::Attention { .. } => "attention",
            Op::AttentionGrad { .. } => "attention_grad",
            Op::Window(w) => w.name(),
            Op::AllReduce { .. } => "all_reduce",
            Op::AllGather { .. } => "all_gather",
            Op::ReduceScatter { .. } => "reduce_scatter",
        }
    }

    /// True for ops that map each output element from the same-index elements of their operands:
    /// the ops an output may share memory with a dying operand in, and the ops fusion chains.
    pub fn is_elementwise(&self) -> bool {
        matches!(
            self,
            Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Convert
        )
    }

    /// True for ops whose value is their operand's bytes, unchanged: they share its storage.
    pub fn is_alias(&self) -> bool {
        matches!(self, Op::Reshape | Op::StopGradient)
    }

    /// A plain (untransposed) matrix product.
    pub const MATMUL: Op = Op::MatMul {
        ta: false,
        tb: false,
    };

    /// True for the fused attention ops: library calls with several outputs.
    pub fn is_attention(&self) -> bool {
        matches!(self, Op::Attention { .. } | Op::AttentionGrad { .. })
    }

    /// True for ops with several outputs read through [`Op::Result`] nodes that are library
    /// calls, not fused kernels: attention and the data-parallel all-reduce.
    pub fn is_multi_output_call(&self) -> bool {
        self.is_attention() || matches!(self, Op::AllReduce { .. } | Op::ReduceScatter { .. })
    }

    /// True for the data-parallel collectives (all-reduce, all-gather, reduce-scatter): every
    /// rank runs the same ones in the same order, and each waits for the one before it.
    pub fn is_collective(&self) -> bool {
        matches!(
            self,
            Op::AllReduce { .. } | Op::AllGather { .. } | Op::ReduceScatter { .. }
        )
    }

    /// The data-parallel ranks of a collective, `None` for every other op.
    pub fn collective_ranks(&self) -> Option<usize> {
        match self {
            Op::AllReduce { ranks } | Op::AllGather { ranks } | Op::ReduceScatter { ranks } => {
                Some(*ranks)
            }
            _ => None,
        }
    }

    /// True for leaves (no operands, values supplied from outside the step).
    pub fn is_leaf(&self) -> bool {
        matches!(self, Op::Leaf { .. })
    }
}
