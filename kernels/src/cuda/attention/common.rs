//! What the attention kernels share: the shape checks, the tiling and grid of a kernel, and the
//! precision-dependent pieces of text (element type, product names, paired stores, the mask,
//! the constants every kernel declares).

use super::problem::{AttentionError, AttentionPrecision, AttentionShape};
use super::tiles::{self, TileKernel, Tiles};
use crate::attention::{Layout, Strides};
use crate::cuda::{literal, Src};
use crate::DType;

/// Head dims the kernels take: multiples of 16 from 32 to 128.
pub(crate) fn head_dim_supported(d: usize) -> bool {
    (32..=128).contains(&d) && d.is_multiple_of(16)
}

/// The largest sequence length the kernels' 32-bit row indices take (with room for a tile).
const MAX_SEQ: usize = (1 << 30) - 1;
/// The most blocks a grid's x dimension holds.
const MAX_GRID: usize = (1 << 31) - 1;

/// Whether the kernels take `s` (every generator calls this first).
pub(crate) fn check(s: &AttentionShape) -> Result<(), AttentionError> {
    for (what, v) in [
        ("batch_heads", s.batch_heads),
        ("seq_q", s.seq_q),
        ("seq_k", s.seq_k),
    ] {
        if v == 0 {
            return Err(AttentionError::Empty { what });
        }
    }
    if !head_dim_supported(s.head_dim) {
        return Err(AttentionError::UnsupportedHeadDim {
            head_dim: s.head_dim,
        });
    }
    if !s.scale.is_finite() {
        return Err(AttentionError::NonFiniteScale {
            scale_bits: s.scale.to_bits(),
        });
    }
    for (what, v) in [("seq_q", s.seq_q), ("seq_k", s.seq_k)] {
        if v > MAX_SEQ {
            return Err(AttentionError::TooLarge {
                what,
                value: v,
                limit: MAX_SEQ,
            });
        }
    }
    check_layout(s)?;
    // The preprocess kernel's grid: 8 rows a block.
    let rows = s.batch_heads.saturating_mul(s.seq_q);
    if rows.div_ceil(8) > MAX_GRID {
        return Err(AttentionError::TooLarge {
            what: "batch_heads * seq_q / 8",
            value: rows.div_ceil(8),
            limit: MAX_GRID,
        });
    }
    Ok(())
}

/// Whether the kernels can address `s.layout`: every problem has a batch and a head, rows do
/// not overlap, and every stride keeps the 16-byte vectors aligned ([`Layout::misaligned`]).
fn check_layout(s: &AttentionShape) -> Result<(), AttentionError> {
    let l = &s.layout;
    if l.heads == 0 || !s.batch_heads.is_multiple_of(l.heads) {
        return Err(AttentionError::Heads {
            heads: l.heads,
            batch_heads: s.batch_heads,
        });
    }
    for (operand, st) in l.groups() {
        if st.row < s.head_dim {
            return Err(AttentionError::OverlappingRows {
                operand,
                row: st.row,
                head_dim: s.head_dim,
            });
        }
    }
    let elems = vector_elems(s.precision);
    if let Some((operand, stride, value)) = l.misaligned(elems) {
        return Err(AttentionError::MisalignedStride {
            operand,
            stride,
            value,
            elems,
        });
    }
    Ok(())
}

/// Elements of a 16-byte vector: what every stride must be a multiple of.
fn vector_elems(p: AttentionPrecision) -> usize {
    match p {
        AttentionPrecision::Bf16 => 8,
        AttentionPrecision::F32 | AttentionPrecision::Tf32 => 4,
    }
}

/// The tiling of `kernel` for `s`.
pub(crate) fn tiles(s: &AttentionShape, kernel: TileKernel) -> Result<Tiles, AttentionError> {
    tiles::choose(kernel, s.precision, s.head_dim).ok_or(AttentionError::SharedMemory {
        kernel: match kernel {
            TileKernel::Forward => "forward",
            TileKernel::Dkdv => "dkdv",
            TileKernel::Dq => "dq",
        },
        head_dim: s.head_dim,
    })
}

/// Blocks of a kernel with `tiles` tiles per batch·head (one block each).
pub(crate) fn grid(s: &AttentionShape, tiles: usize) -> Result<u32, AttentionError> {
    let blocks = tiles.saturating_mul(s.batch_heads);
    if blocks > MAX_GRID {
        return Err(AttentionError::TooLarge {
            what: "blocks (tiles * batch_heads)",
            value: blocks,
            limit: MAX_GRID,
        });
    }
    Ok(blocks as u32)
}

/// An operand group of the layout, as the kernels' text names its strides.
#[derive(Clone, Copy)]
pub(crate) enum Operand {
    /// q and dq: `Q_SB`, `Q_SH`, `Q_SR`.
    Q,
    /// k, v, dk and dv: `KV_SB`, `KV_SH`, `KV_SR`.
    Kv,
    /// out and dout: `O_SB`, `O_SH`, `O_SR`.
    Out,
}

impl Operand {
    fn prefix(self) -> &'static str {
        match self {
            Operand::Q => "Q",
            Operand::Kv => "KV",
            Operand::Out => "O",
        }
    }

    fn strides(self, l: &Layout) -> Strides {
        match self {
            Operand::Q => l.q,
            Operand::Kv => l.kv,
            Operand::Out => l.out,
        }
    }

    /// The row stride's name: the template argument of `ig_fa_load` and the stores' step.
    pub(crate) fn row(self) -> String {
        format!("{}_SR", self.prefix())
    }

    /// Where problem (`b`, `h`)'s rows of this operand start, in elements (after
    /// [`SPLIT_PROBLEM`]).
    pub(crate) fn base(self) -> String {
        let p = self.prefix();
        format!("b * {p}_SB + h * {p}_SH")
    }
}

/// Splits problem `bh` into its batch and head, as the layout numbers them.
pub(crate) const SPLIT_PROBLEM: &str = "const unsigned long long b = bh / HEADS, h = bh % HEADS;";

/// The layout as literals: `HEADS` and the strides of `operands` (64-bit: a batch stride of a
/// long sequence passes 2^31 elements), so that the addressing folds at compile time and the
/// contiguous layout's `b = bh / 1`, `h·0` vanish.
pub(crate) fn layout_constants(c: &mut Src, s: &AttentionShape, operands: &[Operand]) {
    c.line(format!(
        "constexpr unsigned long long HEADS = {}ull;",
        s.layout.heads
    ));
    for op in operands {
        let (p, st) = (op.prefix(), op.strides(&s.layout));
        c.line(format!(
            "constexpr unsigned long long {p}_SB = {}ull, {p}_SH = {}ull, {p}_SR = {}ull;",
            st.batch, st.head, st.row
        ));
    }
}

/// The precision-dependent pieces of a kernel's text.
pub(crate) struct Text {
    /// The element type in memory and in shared tiles.
    pub st: &'static str,
    /// The suffix of the tile products (`ig_fa_mm_nk_{mm}`).
    pub mm: &'static str,
    /// Padding elements of a shared row.
    pub pad: usize,
    /// The row stride of a shared q/k/v/dout tile.
    pub ld: usize,
    causal: bool,
    bf16: bool,
    tf32: bool,
}

impl Text {
    pub(crate) fn new(s: &AttentionShape) -> Text {
        let bf16 = s.precision == AttentionPrecision::Bf16;
        let pad = tiles::pad(s.precision);
        Text {
            st: if bf16 { "unsigned short" } else { "float" },
            mm: match s.precision {
                AttentionPrecision::F32 => "f32",
                AttentionPrecision::Tf32 => "tf32",
                AttentionPrecision::Bf16 => "bf16",
            },
            pad,
            ld: s.head_dim + pad,
            causal: s.causal,
            bf16,
            tf32: s.precision == AttentionPrecision::Tf32,
        }
    }

    /// The constants every tiled kernel declares: sizes, the layout ([`layout_constants`]),
    /// tile sizes, the scale (times log2 e: the kernels exponentiate with `exp2f`), ln 2 and
    /// log2 e, and -infinity.
    pub(crate) fn constants(
        &self,
        c: &mut Src,
        s: &AttentionShape,
        rows: usize,
        inner: usize,
        threads: usize,
    ) {
        c.line(format!(
            "constexpr int BH = {}, TQ = {}, TK = {}, D = {};",
            s.batch_heads, s.seq_q, s.seq_k, s.head_dim
        ));
        layout_constants(c, s, &[Operand::Q, Operand::Kv, Operand::Out]);
        c.line(format!(
            "constexpr int BR = {rows}, BC = {inner}, THREADS = {threads}, LD = {};",
            self.ld
        ));
        let scale_log2 = f64::from(s.scale) * std::f64::consts::LOG2_E;
        c.line(format!(
            "const float SCALE = {}, SCALE_LOG2 = {};",
            literal(f64::from(s.scale), DType::F32),
            literal(scale_log2, DType::F32)
        ));
        c.line(format!(
            "const float LN2 = {}, LOG2E = {};",
            literal(std::f64::consts::LN_2, DType::F32),
            literal(std::f64::consts::LOG2_E, DType::F32)
        ));
        c.line(format!("constexpr bool TF32 = {};", self.tf32));
        c.line(format!(
            "const float NEG_INF = {};",
            literal(f64::NEG_INFINITY, DType::F32)
        ));
    }

    /// The condition under which key `j` is hidden from query `i`: past the keys, or (causal)
    /// after the query.
    pub(crate) fn hidden(&self, i: &str, j: &str) -> String {
        if self.causal {
            format!("{j} >= TK || {j} > {i}")
        } else {
            format!("{j} >= TK")
        }
    }

    /// A statement storing the floats `a`, `b` at `ptr` and `ptr + 1` (an even element, so
    /// aligned for the pair): as two bf16 rounded once to nearest even, or as a float2.
    pub(crate) fn store_pair(&self, ptr: &str, a: &str, b: &str) -> String {
        if self.bf16 {
            self.store_output_pair(ptr, a, b)
        } else if self.tf32 {
            format!(
                "*(float2*)({ptr}) = make_float2(__uint_as_float(ig_fa_tf32({a})), __uint_as_float(ig_fa_tf32({b})));"
            )
        } else {
            format!("*(float2*)({ptr}) = make_float2({a}, {b});")
        }
    }

    /// [`Text::store_pair`] for a kernel's output in global memory (f32 stays f32 in tf32).
    pub(crate) fn store_output_pair(&self, ptr: &str, a: &str, b: &str) -> String {
        if self.bf16 {
            format!(
                "*(unsigned*)({ptr}) = (unsigned)ig_bf16_bits({a}) | ((unsigned)ig_bf16_bits({b}) << 16);"
            )
        } else {
            format!("*(float2*)({ptr}) = make_float2({a}, {b});")
        }
    }

    /// Whether the streamed tiles arrive by `cp.async` a product ahead
    /// ([`super::frame::key_tiles_pipelined`]): bf16, whose tiles are copied as they lie (a
    /// tf32 tile is rounded on its way in; f32, the strict reference, stays as it was).
    pub(crate) fn pipelined(&self) -> bool {
        self.bf16
    }

    /// The float of the element at `e` (bf16 widens).
    pub(crate) fn widen(&self, e: &str) -> String {
        if self.bf16 {
            format!("ig_widen({e})")
        } else {
            e.to_string()
        }
    }
}
