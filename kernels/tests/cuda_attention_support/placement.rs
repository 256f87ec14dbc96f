//! Attention operands placed where a layout ([`Layout`]) puts them, for the tests that run the
//! kernels (kernels/tests/cuda_attention_emu.rs on the host, runtime/tests/cuda_attention.rs on
//! the GPU): the reference's problem-major values scattered into strided buffers (several
//! operands may share a buffer, as packed q, k and v do), each kernel's arguments as (buffer,
//! offset) pairs, the outputs gathered back, and a check that no kernel wrote where no output
//! lies.

#![allow(dead_code)]

use ingot_kernels::attention::{Layout, Strides};

/// The strided operands of the forward and backward kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operand {
    Q,
    K,
    V,
    Dout,
    Out,
    Dq,
    Dk,
    Dv,
}

impl Operand {
    /// Written by a kernel (out by the forward, the gradients by the backward).
    pub fn is_output(self) -> bool {
        matches!(self, Operand::Out | Operand::Dq | Operand::Dk | Operand::Dv)
    }
}

/// A kernel's argument: a strided operand, or the contiguous f32 lse or delta.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    Op(Operand),
    Lse,
    Delta,
}

use Arg::{Delta, Lse, Op};
use Operand::{Dk, Dout, Dq, Dv, Out, K, Q, V};

/// The parameter lists of the kernels (`cuda::attention::forward` and `backward`).
pub const FORWARD: [Arg; 5] = [Op(Q), Op(K), Op(V), Op(Out), Lse];
pub const PREPROCESS: [Arg; 3] = [Op(Out), Op(Dout), Delta];
pub const DKDV: [Arg; 8] = [Op(Q), Op(K), Op(V), Op(Dout), Lse, Delta, Op(Dk), Op(Dv)];
pub const DQ: [Arg; 7] = [Op(Q), Op(K), Op(V), Op(Dout), Lse, Delta, Op(Dq)];

/// Where one operand lies: in buffer `buffer`, from element `offset`, its rows by `strides`.
#[derive(Clone, Copy, Debug)]
pub struct Site {
    pub buffer: usize,
    pub offset: usize,
    pub strides: Strides,
    /// Rows a problem: seq_q or seq_k.
    pub seq: usize,
}

/// A test's strided buffers (lengths in elements) and where each operand lies in them; lse and
/// delta follow as the last two buffers (f32, `[batch_heads, seq_q]`).
#[derive(Clone, Debug)]
pub struct Placement {
    pub layout: Layout,
    pub batch_heads: usize,
    pub seq_q: usize,
    pub head_dim: usize,
    pub lens: Vec<usize>,
    sites: Vec<(Operand, Site)>,
}

impl Placement {
    /// Every operand in its own buffer, as long as the layout's extent (so a layout with gaps
    /// leaves bytes no operand addresses).
    pub fn separate(layout: Layout, batch_heads: usize, tq: usize, tk: usize, d: usize) -> Self {
        let mut p = Placement {
            layout,
            batch_heads,
            seq_q: tq,
            head_dim: d,
            lens: Vec::new(),
            sites: Vec::new(),
        };
        for op in [Q, K, V, Dout, Out, Dq, Dk, Dv] {
            let (strides, seq) = p.strides(op, tq, tk);
            p.sites.push((
                op,
                Site {
                    buffer: p.lens.len(),
                    offset: 0,
                    strides,
                    seq,
                },
            ));
            p.lens
                .push(strides.extent(layout.heads, batch_heads, seq, d));
        }
        p
    }

    /// [`Layout::packed`]: q, k, v in the slots of one `[batch, seq, 3, heads, head_dim]`
    /// buffer, dq, dk, dv in the slots of another; dout and out each in its own.
    pub fn packed(heads: usize, batch_heads: usize, seq: usize, d: usize) -> Self {
        let layout = Layout::packed(heads, seq, d);
        let mut p = Placement {
            layout,
            batch_heads,
            seq_q: seq,
            head_dim: d,
            lens: vec![3 * batch_heads * seq * d, 0, 0, 3 * batch_heads * seq * d],
            sites: Vec::new(),
        };
        for (buffer, ops) in [(0, [Q, K, V]), (3, [Dq, Dk, Dv])] {
            for (slot, op) in ops.into_iter().enumerate() {
                let offset = Layout::packed_slot(heads, d, slot);
                p.add(op, buffer, offset, seq);
            }
        }
        for (buffer, op) in [(1, Dout), (2, Out)] {
            p.add(op, buffer, 0, seq);
            p.lens[buffer] = layout.out.extent(heads, batch_heads, seq, d);
        }
        p
    }

    fn add(&mut self, op: Operand, buffer: usize, offset: usize, seq: usize) {
        let (strides, seq) = self.strides(op, seq, seq);
        self.sites.push((
            op,
            Site {
                buffer,
                offset,
                strides,
                seq,
            },
        ));
    }

    /// The layout's strides of `op` and its rows a problem.
    fn strides(&self, op: Operand, tq: usize, tk: usize) -> (Strides, usize) {
        match op {
            Q | Dq => (self.layout.q, tq),
            K | V | Dk | Dv => (self.layout.kv, tk),
            Dout | Out => (self.layout.out, tq),
        }
    }

    pub fn site(&self, op: Operand) -> Site {
        self.sites.iter().find(|(o, _)| *o == op).unwrap().1
    }

    /// Buffers in all: the strided ones, then lse, then delta.
    pub fn buffers(&self) -> usize {
        self.lens.len() + 2
    }

    /// The buffer and element offset a kernel's argument points at.
    pub fn arg(&self, a: Arg) -> (usize, usize) {
        match a {
            Op(op) => {
                let s = self.site(op);
                (s.buffer, s.offset)
            }
            Lse => (self.lens.len(), 0),
            Delta => (self.lens.len() + 1, 0),
        }
    }

    /// The elements (in its buffer) of row `i` of problem `bh` of `op`, from its first.
    fn row(&self, s: &Site, bh: usize, i: usize) -> usize {
        s.offset + s.strides.offset(self.layout.heads, bh, i)
    }

    /// Calls `f(index in the buffer, index in the problem-major values)` for every element of
    /// `op`.
    fn each(&self, op: Operand, mut f: impl FnMut(usize, usize)) {
        let s = self.site(op);
        let d = self.head_dim;
        for bh in 0..self.batch_heads {
            for i in 0..s.seq {
                let at = self.row(&s, bh, i);
                for c in 0..d {
                    f(at + c, (bh * s.seq + i) * d + c);
                }
            }
        }
    }

    /// `values` (problem-major `[batch_heads, seq, head_dim]`) of `op` put into `buf`.
    pub fn scatter(&self, op: Operand, values: &[f64], buf: &mut [f64]) {
        self.each(op, |at, v| buf[at] = values[v]);
    }

    /// `op`'s values out of `buf`, problem-major.
    pub fn gather(&self, op: Operand, buf: &[f64]) -> Vec<f64> {
        let s = self.site(op);
        let mut v = vec![0.0; self.batch_heads * s.seq * self.head_dim];
        self.each(op, |at, i| v[i] = buf[at]);
        v
    }

    /// The strided buffers before a run: the inputs (q, k, v, dout, problem-major) scattered
    /// over NaN, so that a kernel reading where no input lies poisons its outputs; `None` for
    /// the buffers of outputs (the tests fill them with 0xff bytes, NaN in every precision).
    pub fn inputs(&self, [q, k, v, dout]: [&[f64]; 4]) -> Vec<Option<Vec<f64>>> {
        let mut bufs: Vec<Option<Vec<f64>>> = vec![None; self.lens.len()];
        for (op, values) in [(Q, q), (K, k), (V, v), (Dout, dout)] {
            let b = self.site(op).buffer;
            let buf = bufs[b].get_or_insert_with(|| vec![f64::NAN; self.lens[b]]);
            self.scatter(op, values, buf);
        }
        bufs
    }

    /// Whether every element of an output buffer that none of `written` addresses still
    /// holds the fill (bytes 0xff, `es` bytes an element): no kernel stored outside its rows.
    /// `bufs` are the strided buffers' bytes. Returns the first stray element.
    pub fn untouched(
        &self,
        bufs: &[Vec<u8>],
        es: usize,
        written: &[Operand],
    ) -> Result<(), String> {
        for (b, len) in self.lens.iter().enumerate() {
            let outputs = self
                .sites
                .iter()
                .any(|(o, s)| s.buffer == b && o.is_output());
            if !outputs {
                continue;
            }
            let mut mask = vec![false; *len];
            for &op in written.iter().filter(|op| self.site(**op).buffer == b) {
                self.each(op, |at, _| mask[at] = true);
            }
            let stray = (0..*len)
                .find(|&e| !mask[e] && bufs[b][e * es..(e + 1) * es].iter().any(|&x| x != 0xff));
            if let Some(e) = stray {
                return Err(format!(
                    "buffer {b}: element {e}, which no output of {written:?} addresses, was written"
                ));
            }
        }
        Ok(())
    }
}

/// [`Layout::tokens`] with `pad` elements after every token's heads and after every batch:
/// gaps between the rows that no operand addresses.
pub fn padded_tokens(heads: usize, tq: usize, tk: usize, d: usize, pad: usize) -> Layout {
    let rows = |seq: usize| {
        let row = heads * d + pad;
        Strides {
            batch: seq * row + pad,
            head: d,
            row,
        }
    };
    Layout {
        heads,
        q: rows(tq),
        kv: rows(tk),
        out: rows(tq),
    }
}

/// The problem `(batch·heads, Tq, Tk, head dim, causal)` in precision `p`, laid out as `layout`,
/// with the usual scale `1/√d`.
pub fn shape(
    p: ingot_kernels::cuda::attention::AttentionPrecision,
    (bh, tq, tk, d, causal): (usize, usize, usize, usize, bool),
    layout: Layout,
) -> ingot_kernels::cuda::attention::AttentionShape {
    ingot_kernels::cuda::attention::AttentionShape {
        batch_heads: bh,
        seq_q: tq,
        seq_k: tk,
        head_dim: d,
        causal,
        scale: 1.0 / (d as f32).sqrt(),
        precision: p,
        layout,
    }
}
