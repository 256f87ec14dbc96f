//! bf16's backward through a stored `ds` ([`DqKernel::StoredDs`]; off by default, measured
//! slower as a whole): `dkdv` computes `ds = p ∘ (dp - delta)` for every
//! (query, key) pair it visits and rounds it to bf16 for its own `dsᵀ · q` product; it also
//! copies those bf16 values into a scratch region of the backward's workspace, after `delta`.
//! `dq = scale · ds · k` then reads them back ([`dq`]) instead of recomputing the scores, the
//! probabilities and `dp = dout · vᵀ` (two products a tile fewer, and no exponentials).
//!
//! The values `dq` multiplies are the bf16 `ds` the recomputing kernel would round from the
//! same f32 products (the same arithmetic in another block), accumulated over the keys in the
//! same order (16 keys an `mma`, ascending), so `dq` moves only where the two kernels' f32
//! products of `q·kᵀ` and `dout·vᵀ` round differently.
//!
//! # The scratch's layout
//! Problem `bh`'s rows follow one another ([`problem_elems`] elements each problem). Query row
//! `i` holds keys `[0, len(i))`: every key rounded up to 64 ([`DS_BLOCK`]) without a mask;
//! causal, only the 64-key blocks up to its own (row block `b = i / 64` holds
//! `64 · min(TKB, b + 1)` keys, `TKB = ⌈seq_k / 64⌉`), so a causal scratch is about half the
//! full square. Every row starts 128 bytes aligned. Entries `dkdv` leaves unwritten (above the
//! diagonal in a row's last block, keys past `seq_k`) are masked to zero by `dq` where its
//! tiles cross them, never read as values.
//!
//! Each entry is written once by one thread and read by one block: no atomics, the same bits
//! on every run.

use super::common::{self, Operand, Text};
use super::frame;
use super::problem::{AttentionError, AttentionPrecision, AttentionShape};
use super::tiles::{self, Tiles, SHARED_LIMIT};
use crate::cuda::CudaKernel;
use crate::cuda::Src;

/// How the backward pass computes `dq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DqKernel {
    /// `dq` recomputes the scores, the probabilities and `dp = dout · vᵀ` tile by tile.
    Recompute,
    /// bf16 (other precisions recompute): dkdv also stores its bf16 `ds` in the workspace
    /// after delta, and `dq = scale · ds · k` reads them back (the module `ds`). The same bits
    /// as `Recompute` on gpt2 (session 44); dq 2.1x faster, dkdv 1.44x slower.
    StoredDs,
}

/// Keys a block of the scratch's rows (and rows a block of `dq`'s query tile): rows are stored
/// in whole blocks of this many keys.
pub const DS_BLOCK: usize = 64;

/// Whether `s`'s backward stores `ds` and computes `dq` from it: `how` asks for it and `s` is
/// bf16.
pub(crate) fn stored(s: &AttentionShape, how: DqKernel) -> bool {
    how == DqKernel::StoredDs && s.precision == AttentionPrecision::Bf16
}

/// Puts [`HELPERS`] before the kernel's signature in `c` (after the other helpers), for the
/// kernels that use the scratch only, so that every other kernel's text stays as it was.
pub(super) fn with_helpers(c: &mut Src) {
    let at = c
        .text
        .find("extern \"C\"")
        .expect("a kernel's text holds its signature");
    c.text.insert_str(at, HELPERS);
}

/// Key blocks of a full row: `⌈seq_k / 64⌉`.
fn key_blocks(s: &AttentionShape) -> u64 {
    s.seq_k.div_ceil(DS_BLOCK) as u64
}

/// Keys stored in query row `i` (a multiple of [`DS_BLOCK`]).
pub(crate) fn row_len(s: &AttentionShape, i: usize) -> u64 {
    let tkb = key_blocks(s);
    let blocks = if s.causal {
        tkb.min((i / DS_BLOCK) as u64 + 1)
    } else {
        tkb
    };
    DS_BLOCK as u64 * blocks
}

/// Elements of one problem's scratch before query row `i` (`i = seq_q`: the problem's
/// elements). The same formula as the kernels' `ig_fa_ds_off`.
pub(crate) fn row_offset(s: &AttentionShape, i: usize) -> u64 {
    let (tkb, b) = (key_blocks(s), (i / DS_BLOCK) as u64);
    let block = DS_BLOCK as u64;
    if !s.causal {
        return i as u64 * block * tkb;
    }
    // Row blocks before b: block r holds 64 rows of 64·min(TKB, r + 1) keys.
    let before = if b <= tkb {
        b * (b + 1) / 2
    } else {
        tkb * (tkb + 1) / 2 + (b - tkb) * tkb
    };
    block * block * before + (i % DS_BLOCK) as u64 * row_len(s, i)
}

/// Elements of one problem's scratch.
pub fn problem_elems(s: &AttentionShape) -> u64 {
    row_offset(s, s.seq_q)
}

/// Bytes before the scratch in the backward's workspace: `delta` (f32 `[batch_heads, seq_q]`)
/// rounded up to 256.
pub(crate) fn offset_bytes(s: &AttentionShape) -> usize {
    (s.batch_heads * s.seq_q * 4).div_ceil(256) * 256
}

/// Bytes of the scratch of `s` (bf16), saturating: a size past `usize` cannot be planned, and
/// the plan says so.
pub fn scratch_bytes(s: &AttentionShape) -> usize {
    let elems = (s.batch_heads as u64).saturating_mul(problem_elems(s));
    usize::try_from(elems.saturating_mul(2)).unwrap_or(usize::MAX)
}

/// The device helpers of the scratch: its rows' lengths and offsets (the formulas of
/// [`row_len`] and [`row_offset`]) and the loader of `dq`'s `ds` tiles.
pub(crate) const HELPERS: &str = r#"#ifndef INGOT_FA_DS
#define INGOT_FA_DS
// Keys stored in row i of a problem's ds scratch, and the elements before it (64-key blocks;
// causal rows only up to their own block).
template <int TKB, bool CAUSAL>
__device__ __forceinline__ int ig_fa_ds_len(int i) {
  return CAUSAL ? 64 * (TKB < i / 64 + 1 ? TKB : i / 64 + 1) : 64 * TKB;
}
template <int TKB, bool CAUSAL>
__device__ __forceinline__ unsigned long long ig_fa_ds_off(int i) {
  const unsigned long long tkb = (unsigned long long)TKB, b = (unsigned long long)(i / 64);
  if (!CAUSAL) return (unsigned long long)i * 64ull * tkb;
  const unsigned long long before = b <= tkb ? b * (b + 1) / 2 : tkb * (tkb + 1) / 2 + (b - tkb) * tkb;
  return 4096ull * before + (unsigned long long)(i % 64) * (unsigned long long)ig_fa_ds_len<TKB, CAUSAL>(i);
}
// Rows [0, R) of a ds tile (row r at src + r * stride), columns [col0, col0 + C), into shared
// memory at dst (row stride LDP) by cp.async, 16 bytes a copy; rows at or past `rows` are
// zeros and read nothing.
template <int R, int C, int LDP, int THREADS>
__device__ __forceinline__ void ig_fa_ds_load_async(unsigned short* dst, const unsigned short* src, int col0, int stride, int rows) {
  constexpr int PER_ROW = C / 8;
  constexpr int ITERS = (R * PER_ROW + THREADS - 1) / THREADS;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int i = it * THREADS + (int)threadIdx.x;
    if (R * PER_ROW % THREADS == 0 || i < R * PER_ROW) {
      const int r = i / PER_ROW, col = (i % PER_ROW) * 8;
      const bool in = r < rows;
      const unsigned short* from = in ? src + (unsigned long long)r * (unsigned long long)stride + col0 + col : src;
      ig_fa_cp16(dst + r * LDP + col, from, in);
    }
  }
}
#endif
"#;

/// The constants the scratch's users declare: `DS_AT` (its byte offset from `delta`),
/// `DS_TKB` (key blocks of a full row), `DS_PROBLEM` (elements a problem).
fn constants(c: &mut Src, s: &AttentionShape) {
    c.line(format!(
        "constexpr unsigned long long DS_AT = {}ull, DS_PROBLEM = {}ull;",
        offset_bytes(s),
        problem_elems(s)
    ));
    c.line(format!("constexpr int DS_TKB = {};", key_blocks(s)));
}

/// `ig_fa_ds_off` or `ig_fa_ds_len` (`what`) of row `i` for `s`.
fn call(s: &AttentionShape, what: &str, i: &str) -> String {
    format!("ig_fa_ds_{what}<DS_TKB, {}>({i})", s.causal)
}

/// dkdv's lines before its loop over query tiles: the problem's scratch `dsw`.
pub(super) fn dkdv_open(c: &mut Src, s: &AttentionShape) {
    constants(c, s);
    c.line(
        "unsigned short* const dsw = (unsigned short*)((const char*)delta + DS_AT) + bh * DS_PROBLEM;",
    );
}

/// dkdv's copy of a step's `dsᵀ` (its warp's tile `pw`, 16 keys × `BR` queries, already
/// rounded to bf16) into the scratch: a query row's 16 keys as two 16-byte stores, a lane two
/// of them (`BR` = 32) or more; rows past the queries and key blocks past the row's stored
/// length are skipped (the latter are masked zeros: past the diagonal).
pub(super) fn dkdv_store(c: &mut Src, s: &AttentionShape) {
    c.line("__syncwarp();");
    c.line("#pragma unroll");
    c.open("for (int cc = lane; cc < BR * 2; cc += 32) {");
    c.line("const int il = cc >> 1, h = cc & 1, i = q0 + il, j0 = k0 + warp * 16 + h * 8;");
    c.open(format!("if (i < TQ && j0 < {}) {{", call(s, "len", "i")));
    c.line("unsigned w[4];");
    c.line("#pragma unroll");
    c.line(
        "for (int m = 0; m < 4; ++m) w[m] = (unsigned)pw[(h * 8 + 2 * m) * LDP + il] | ((unsigned)pw[(h * 8 + 2 * m + 1) * LDP + il] << 16);",
    );
    c.line(format!(
        "*(uint4*)(dsw + {} + j0) = make_uint4(w[0], w[1], w[2], w[3]);",
        call(s, "off", "i")
    ));
    c.close();
    c.close();
}

/// Keys a step of [`dq`] for head dim `d`: 64 where two copies of its tiles fit in 48 KiB,
/// else 32 (a divisor of [`DS_BLOCK`] either way).
fn step(d: usize) -> usize {
    if shared_bytes(d, 64) <= SHARED_LIMIT {
        64
    } else {
        32
    }
}

/// Shared bytes of [`dq`] with `inner`-key steps: two copies of the k tile (`inner` rows of
/// `d + 8`) and of the ds tile (64 rows of `inner + 8`), bf16.
fn shared_bytes(d: usize, inner: usize) -> usize {
    let pad = tiles::pad(AttentionPrecision::Bf16);
    2 * (inner * (d + pad) + DS_BLOCK * (inner + pad)) * 2
}

/// [`dq`]'s tiling for head dim `d`: four warps of 16 query rows (one 64-row block of the
/// scratch), `inner` keys a step, two copies.
pub(crate) fn tiling(d: usize) -> Tiles {
    let inner = step(d);
    Tiles {
        warps: DS_BLOCK / 16,
        rows: DS_BLOCK,
        inner,
        copies: 2,
        shared_bytes: shared_bytes(d, inner),
    }
}

/// `dq = scale · ds · k` from the scratch: a block per (64-row query tile, batch·head), the
/// longest first, looping over the key tiles its rows can see; each step's k and ds tiles
/// arrive by `cp.async` while the block multiplies the previous ones (two copies, one barrier
/// a step). On a tile crossing the end of the keys or (causal) the diagonal, each warp zeroes
/// its rows' hidden entries before the product. Parameters as the recomputing kernel's (q, k,
/// v, dout, lse, delta, dq): it reads k, the scratch after delta, and writes dq.
pub(super) fn dq(s: &AttentionShape) -> Result<CudaKernel, AttentionError> {
    let x = Text::new(s);
    let st = x.st;
    let tl = tiling(s.head_dim);
    let (rows, inner) = (tl.rows, tl.inner);
    let params = frame::params(
        st,
        &["q", "k", "v", "dout"],
        &["lse", "delta"],
        &["dq"],
        &[],
    );
    let tiles = s.seq_q.div_ceil(rows);
    let grid = common::grid(s, tiles)?;
    let threads = 32 * tl.warps;
    let ldp = inner + x.pad;
    let mut c = frame::open(
        &x,
        s,
        (rows, inner, threads),
        &params,
        ldp,
        &[("sk", 2 * inner * x.ld), ("sds", 2 * rows * ldp)],
    );
    with_helpers(&mut c);
    frame::lanes(&mut c);
    frame::query_tile_longest_first(&mut c, tiles);
    c.line(common::SPLIT_PROBLEM);
    c.line(format!("const {st}* kb = k + {};", Operand::Kv.base()));
    constants(&mut c, s);
    c.line(format!(
        "const unsigned short* dsb = (const unsigned short*)((const char*)delta + DS_AT) + bh * DS_PROBLEM + {};",
        call(s, "off", "q0")
    ));
    c.line(format!("const int dsl = {};", call(s, "len", "q0")));
    c.line(if s.causal {
        "const int kend = TK < q0 + BR ? TK : q0 + BR;"
    } else {
        "const int kend = TK;"
    });
    let issue = |c: &mut Src, slot: &str, at: &str| {
        c.line(format!(
            "ig_fa_ds_load_async<BR, BC, LDP, THREADS>(sds + {slot} * BR * LDP, dsb, {at}, dsl, TQ - q0);"
        ));
        c.line(format!(
            "ig_fa_load_async<BC, D, KV_SR, LD, THREADS>(sk + {slot} * BC * LD, kb, {at}, TK);"
        ));
        c.line("ig_fa_cp_commit();");
    };
    issue(&mut c, "0", "0");
    frame::zero(&mut c, "dqa", "D / 8");
    c.open("for (int k0 = 0, slot = 0; k0 < kend; k0 += BC, slot ^= 1) {");
    // This thread's copies of the step's tiles have landed; the barrier makes every thread's
    // visible and says every warp is done with the step before, whose copies take the next.
    c.line("ig_fa_cp_wait<0>();");
    c.line("__syncthreads();");
    c.open("if (k0 + BC < kend) {");
    issue(&mut c, "(slot ^ 1)", "k0 + BC");
    c.close();
    c.line("unsigned short* pw = sds + slot * BR * LDP + warp * 16 * LDP;");
    frame::key_tile_edge(&mut c, s);
    c.open("if (edge) {");
    c.open("for (int e = lane; e < 16 * BC; e += 32) {");
    c.line("const int r = e / BC, jj = e % BC, i = q0 + warp * 16 + r, j = k0 + jj;");
    c.line(format!("if ({}) pw[r * LDP + jj] = 0;", x.hidden("i", "j")));
    c.close();
    c.close();
    c.line("__syncwarp();");
    c.line(format!(
        "ig_fa_mm_kn_{}<D / 8, BC, LDP, LD>(dqa, pw, sk + slot * BC * LD, g, t);",
        x.mm
    ));
    c.close();
    c.line("const int r0 = q0 + warp * 16 + g, r1 = r0 + 8;");
    c.line(format!("{st}* dqb = dq + {};", Operand::Q.base()));
    frame::store_rows(&mut c, &x, "dqa", "dqb", Operand::Q, Some("SCALE"), "TQ");
    Ok(frame::close(c, grid, threads))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::Layout;

    fn shape(tq: usize, tk: usize, causal: bool) -> AttentionShape {
        AttentionShape {
            batch_heads: 3,
            seq_q: tq,
            seq_k: tk,
            head_dim: 64,
            causal,
            scale: 0.125,
            precision: AttentionPrecision::Bf16,
            layout: Layout::contiguous(tq, tk, 64),
        }
    }

    #[test]
    fn each_row_starts_where_the_rows_before_it_end_and_holds_every_key_it_can_see() {
        for (tq, tk) in [
            (1, 1),
            (17, 100),
            (64, 64),
            (65, 65),
            (200, 70),
            (70, 200),
            (1024, 1024),
        ] {
            for causal in [false, true] {
                let s = shape(tq, tk, causal);
                let mut at = 0u64;
                for i in 0..tq {
                    assert_eq!(row_offset(&s, i), at, "{tq} {tk} {causal} row {i}");
                    let len = row_len(&s, i);
                    assert_eq!(len % 64, 0);
                    // Every visible key is stored; keys past the end only up to the 64-block.
                    let visible = if causal { (i + 1).min(tk) } else { tk };
                    assert!(len >= visible as u64 && len <= tk.div_ceil(64) as u64 * 64);
                    at += len;
                }
                assert_eq!(problem_elems(&s), at);
            }
        }
    }

    #[test]
    fn a_causal_scratch_is_about_half_the_square() {
        // GPT-2: 16 key blocks; rows of block b hold 64 (b + 1) keys: 136 of 256 blocks.
        let s = shape(1024, 1024, true);
        assert_eq!(problem_elems(&s), 136 * 64 * 64);
        assert_eq!(scratch_bytes(&s), 3 * 136 * 64 * 64 * 2);
        assert_eq!(problem_elems(&shape(1024, 1024, false)), 1024 * 1024);
        let f32 = AttentionShape {
            precision: AttentionPrecision::F32,
            ..s
        };
        assert!(stored(&s, DqKernel::StoredDs));
        assert!(!stored(&f32, DqKernel::StoredDs));
        assert!(!stored(&s, DqKernel::Recompute));
    }

    #[test]
    fn the_dq_tiles_fit_in_48_kib_with_64_or_32_keys_a_step() {
        for d in (32..=128).step_by(16) {
            let t = tiling(d);
            assert!(t.shared_bytes <= SHARED_LIMIT, "d={d}");
            assert_eq!(t.inner, if d <= 112 { 64 } else { 32 }, "d={d}");
        }
    }
}
