//! Where an attention's operands lie in memory: shared by the CPU reference
//! ([`crate::cpu::attention`]) and the CUDA kernels ([`crate::cuda::attention`]).
//!
//! An attention is `batch_heads` independent problems; problem `bh` is batch `bh / heads`,
//! head `bh % heads`. Row `i` of an operand (a query, key or output row of `head_dim`
//! contiguous elements) of problem `bh` starts [`Strides::offset`] elements into the operand's
//! buffer. Three layouts cover what models hand an attention:
//! - [`Layout::contiguous`]: `[batch_heads, seq, head_dim]`, each problem on its own rows (the
//!   heads' layout, after a transpose from the tokens' one);
//! - [`Layout::tokens`]: `[batch, seq, heads, head_dim]`, as a linear layer writes them
//!   (FlashAttention's layout): no transpose on the way in or out;
//! - [`Layout::packed`]: q, k and v (and their gradients) as the three slots of one
//!   `[batch, seq, 3, heads, head_dim]` buffer, as one fused q/k/v projection writes them; the
//!   caller points k and v at the slot offsets [`Layout::packed_slot`]. The output stays
//!   `[batch, seq, heads, head_dim]`.
//!
//! The log-sum-exp (and the backward pass's `delta`) is always `[batch_heads, seq_q]`,
//! contiguous.

use serde::{Deserialize, Serialize};

/// Element strides of one operand: row `i` of problem (`b`, `h`) starts at
/// `b·batch + h·head + i·row`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Strides {
    pub batch: usize,
    pub head: usize,
    pub row: usize,
}

impl Strides {
    /// Where row `i` of problem `bh` starts, in elements, with `heads` heads a batch.
    #[inline]
    pub fn offset(&self, heads: usize, bh: usize, i: usize) -> usize {
        (bh / heads) * self.batch + (bh % heads) * self.head + i * self.row
    }

    /// Elements a buffer needs (from the operand's start) to hold `seq` rows of `head_dim`
    /// elements for each of `batch_heads` problems: one past the last element read or written.
    pub fn extent(&self, heads: usize, batch_heads: usize, seq: usize, head_dim: usize) -> usize {
        if batch_heads == 0 || seq == 0 || head_dim == 0 {
            return 0;
        }
        self.offset(heads, batch_heads - 1, seq - 1) + head_dim
    }
}

/// The strides of every operand of one attention (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Layout {
    /// Heads a batch: problem `bh` is batch `bh / heads`, head `bh % heads` (at least 1).
    pub heads: usize,
    /// q and dq.
    pub q: Strides,
    /// k, v, dk and dv.
    pub kv: Strides,
    /// out and dout.
    pub out: Strides,
}

impl Layout {
    /// `[batch_heads, seq, head_dim]`, each problem contiguous.
    pub fn contiguous(seq_q: usize, seq_k: usize, head_dim: usize) -> Layout {
        let rows = |seq: usize| Strides {
            batch: seq * head_dim,
            head: 0,
            row: head_dim,
        };
        Layout {
            heads: 1,
            q: rows(seq_q),
            kv: rows(seq_k),
            out: rows(seq_q),
        }
    }

    /// `[batch, seq, heads, head_dim]` for every operand.
    pub fn tokens(heads: usize, seq_q: usize, seq_k: usize, head_dim: usize) -> Layout {
        let rows = |seq: usize| Strides {
            batch: seq * heads * head_dim,
            head: head_dim,
            row: heads * head_dim,
        };
        Layout {
            heads,
            q: rows(seq_q),
            kv: rows(seq_k),
            out: rows(seq_q),
        }
    }

    /// q, k, v, dq, dk, dv in the slots of one `[batch, seq, 3, heads, head_dim]` buffer
    /// (self-attention: one sequence length); out and dout `[batch, seq, heads, head_dim]`.
    pub fn packed(heads: usize, seq: usize, head_dim: usize) -> Layout {
        let slot = Strides {
            batch: 3 * seq * heads * head_dim,
            head: head_dim,
            row: 3 * heads * head_dim,
        };
        Layout {
            heads,
            q: slot,
            kv: slot,
            out: Layout::tokens(heads, seq, seq, head_dim).out,
        }
    }

    /// Where slot `s` (0 for q, 1 for k, 2 for v) of a [`Layout::packed`] buffer starts, in
    /// elements.
    pub fn packed_slot(heads: usize, head_dim: usize, s: usize) -> usize {
        s * heads * head_dim
    }

    /// The operand groups' strides, each with the name the kernels' errors give it.
    pub fn groups(&self) -> [(&'static str, Strides); 3] {
        [("q", self.q), ("kv", self.kv), ("out", self.out)]
    }

    /// The first stride that is not a multiple of `elems` (the kernels move 16 bytes at a
    /// time): its group's name, the stride's name and its value.
    pub fn misaligned(&self, elems: usize) -> Option<(&'static str, &'static str, usize)> {
        self.groups().into_iter().find_map(|(group, st)| {
            [("batch", st.batch), ("head", st.head), ("row", st.row)]
                .into_iter()
                .find(|(_, value)| !value.is_multiple_of(elems))
                .map(|(stride, value)| (group, stride, value))
        })
    }

    /// Whether every stride is a multiple of `elems`.
    pub fn aligned(&self, elems: usize) -> bool {
        self.misaligned(elems).is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_layout_addresses_a_transposed_heads_tensor() {
        // [b, t, h, d] = [2, 3, 4, 5]: problem bh = b·4 + h, row i at ((b·3 + i)·4 + h)·5.
        let l = Layout::tokens(4, 3, 3, 5);
        for bh in 0..8 {
            for i in 0..3 {
                let (b, h) = (bh / 4, bh % 4);
                assert_eq!(l.q.offset(4, bh, i), ((b * 3 + i) * 4 + h) * 5);
            }
        }
        assert_eq!(l.q.extent(4, 8, 3, 5), 2 * 3 * 4 * 5);
    }

    #[test]
    fn the_packed_slots_interleave_q_k_and_v_per_token() {
        // [b, t, 3, h, d] = [2, 3, 3, 4, 5]: slot s of (b, h, i) at (((b·3 + i)·3 + s)·4 + h)·5.
        let l = Layout::packed(4, 3, 5);
        for s in 0..3 {
            let base = Layout::packed_slot(4, 5, s);
            for bh in 0..8 {
                for i in 0..3 {
                    let (b, h) = (bh / 4, bh % 4);
                    assert_eq!(
                        base + l.kv.offset(4, bh, i),
                        (((b * 3 + i) * 3 + s) * 4 + h) * 5
                    );
                }
            }
        }
        assert_eq!(
            Layout::packed_slot(4, 5, 2) + l.kv.extent(4, 8, 3, 5),
            2 * 3 * 3 * 4 * 5
        );
        assert_eq!(l.out, Layout::tokens(4, 3, 3, 5).out);
    }

    #[test]
    fn the_contiguous_layout_is_one_problem_after_another() {
        let l = Layout::contiguous(3, 7, 5);
        assert_eq!(l.q.offset(1, 4, 2), (4 * 3 + 2) * 5);
        assert_eq!(l.kv.offset(1, 4, 6), (4 * 7 + 6) * 5);
        assert_eq!(l.kv.extent(1, 5, 7, 5), 5 * 7 * 5);
    }
}
