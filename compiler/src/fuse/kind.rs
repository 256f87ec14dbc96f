//! How fusion sees an op ([`Kind`]): what each pass of fusion asks of a node first.

use crate::ir::{Node, Op};

/// How fusion sees an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Leaf,
    /// A library call (its operands and result are buffers), or an extra output of one.
    Library,
    /// Same bytes, new shape: reshape, stop-gradient.
    Alias,
    /// A view that moves elements: broadcast, transpose, slice.
    View,
    /// Full and iota: computed from the index alone.
    Source,
    Elementwise,
    Reduce,
    /// Already fused.
    Fused,
}

pub fn kind(n: &Node) -> Kind {
    match &n.op {
        Op::Leaf { .. } => Kind::Leaf,
        Op::MatMul { .. }
        | Op::MatMulAcc { .. }
        | Op::Gather
        | Op::ScatterAdd { .. }
        | Op::Concat { .. }
        | Op::Attention { .. }
        | Op::AttentionGrad { .. }
        | Op::AllReduce { .. }
        | Op::AllGather { .. }
        | Op::ReduceScatter { .. } => Kind::Library,
        // Dropout is its own kernel (the counter-based draw, see `ingot_kernels::rng`): its
        // operands and result are buffers, and the mask is drawn again wherever it is needed.
        Op::Dropout { .. } => Kind::Library,
        // Before fusion, a result node is an attention's extra output: a buffer that library
        // call writes (fusion makes the fused kernels' own result nodes).
        Op::Result { .. } => Kind::Library,
        Op::Reshape | Op::StopGradient => Kind::Alias,
        Op::Broadcast | Op::Transpose { .. } | Op::Slice { .. } => Kind::View,
        Op::Full { .. } | Op::Iota { .. } => Kind::Source,
        Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Convert => {
            Kind::Elementwise
        }
        Op::Reduce { .. } => Kind::Reduce,
        Op::Fused(_) => Kind::Fused,
        // Convolution and pooling are library calls: operands and result are buffers.
        Op::Window(_) => Kind::Library,
    }
}
