//! The frame of the tiled kernels (forward, dkdv, dq): their opening (the helpers, the
//! signature, the constants, the shared tiles), the lines that place each thread in its warp's
//! fragments and each block on its tile, zeroed accumulators, and the closing launch. Written
//! once so that the three kernels cannot drift apart in the parts they share.

use super::common::{self, Operand, Text};
use super::problem::{AttentionError, AttentionShape};
use super::tiles::Tiles;
use crate::cuda::{finish, signature, CudaKernel, Launch, Src};

/// The pointer parameters, in order: `inputs` of the storage type `st` (const), `f32_inputs`
/// (const float), `outputs` of the storage type, then `f32_outputs` (float).
pub(super) fn params(
    st: &str,
    inputs: &[&str],
    f32_inputs: &[&str],
    outputs: &[&str],
    f32_outputs: &[&str],
) -> Vec<(String, String)> {
    let with = |ty: String, names: &[&str]| {
        names
            .iter()
            .map(|n| (ty.clone(), n.to_string()))
            .collect::<Vec<_>>()
    };
    let mut p = with(format!("const {st}*"), inputs);
    p.extend(with("const float*".into(), f32_inputs));
    p.extend(with(format!("{st}*"), outputs));
    p.extend(with("float*".into(), f32_outputs));
    p
}

/// A tiled kernel's text up to its own work: the helpers, the signature of `threads` threads
/// taking `params`, the constants of `rows` × `inner` tiles ([`Text::constants`]), `LDP` (the
/// row length `ldp` of the per-warp tile) and the 16-byte aligned shared tiles `(name,
/// elements)` of the storage type.
pub(super) fn open(
    x: &Text,
    s: &AttentionShape,
    (rows, inner, threads): (usize, usize, usize),
    params: &[(String, String)],
    ldp: usize,
    tiles: &[(&str, usize)],
) -> Src {
    let mut c = Src::default();
    c.text.push_str(&super::helpers::all());
    c.open(signature(threads as u32, params));
    x.constants(&mut c, s, rows, inner, threads);
    c.line(format!("constexpr int LDP = {ldp};"));
    for (name, len) in tiles {
        c.line(format!("__shared__ __align__(16) {} {name}[{len}];", x.st));
    }
    c
}

/// Which rows a tiled kernel's block owns (its warps' rows, 16 each): query rows (`BR`:
/// forward, dq) or key rows (`BC`: dkdv); it streams the other operand's rows.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Own {
    Queries,
    Keys,
}

/// A tiled kernel's rows and shared tiles: the block owns `tl.rows` rows (`own` says which)
/// held in the tiles named `owned`, and streams `tl.inner` rows a step through the tiles
/// named `streamed`.
pub(super) struct Tiling {
    pub own: Own,
    pub owned: &'static [&'static str],
    pub streamed: &'static [&'static str],
}

/// A tiled kernel's launch: `tiles` owned-row tiles a problem, `grid` blocks of `threads`.
pub(super) struct Block {
    pub tiles: usize,
    grid: u32,
    threads: usize,
}

impl Block {
    /// The kernel of text `c` (its body closed here), launched as this block's grid.
    pub(super) fn close(&self, c: Src) -> CudaKernel {
        close(c, self.grid, self.threads)
    }
}

/// [`open`] for a kernel of tiling `t`: its shared tiles in `t`'s order (`tl.copies` of each
/// streamed one, one after the other in one array), then a tile `sp`
/// whose rows are the warps' (16 each) of the owned × the streamed rows (`LDP` the streamed
/// rows and padding). The three kernels differ only in their [`Tiling`], so their shared
/// tiles are declared here for all of them.
pub(super) fn open_tiled(
    x: &Text,
    s: &AttentionShape,
    tl: Tiles,
    params: &[(String, String)],
    t: Tiling,
) -> Result<(Src, Block), AttentionError> {
    let (rows, inner) = (tl.rows, tl.inner);
    let (br, bc, seq) = match t.own {
        Own::Queries => (rows, inner, s.seq_q),
        Own::Keys => (inner, rows, s.seq_k),
    };
    let tiles = seq.div_ceil(rows);
    let b = Block {
        tiles,
        grid: common::grid(s, tiles)?,
        threads: 32 * tl.warps,
    };
    let mut shared: Vec<(&str, usize)> = t.owned.iter().map(|&n| (n, rows * x.ld)).collect();
    shared.extend(t.streamed.iter().map(|&n| (n, tl.copies * inner * x.ld)));
    shared.push(("sp", rows * (inner + x.pad)));
    let c = open(x, s, (br, bc, b.threads), params, inner + x.pad, &shared);
    Ok((c, b))
}

/// Each thread's warp and lane, and its row group `g` and column pair `t` in the warp's
/// product fragments.
pub(super) fn lanes(c: &mut Src) {
    c.line("const int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31u);");
    c.line("const int g = lane >> 2, t = lane & 3;");
}

/// The block's query tile `q0` and problem `bh` for a kernel of `tiles` query tiles a problem,
/// the longest blocks first (causal: the last query tile of every problem, then the one
/// before, ...).
pub(super) fn query_tile_longest_first(c: &mut Src, tiles: usize) {
    c.line(format!(
        "const int q0 = ({} - 1 - (int)(blockIdx.x / (unsigned)BH)) * BR;",
        tiles
    ));
    c.line("const unsigned long long bh = blockIdx.x % (unsigned)BH;");
}

/// Declares `name[n][4]`, zeroed.
pub(super) fn zero(c: &mut Src, name: &str, n: &str) {
    c.line(format!("float {name}[{n}][4];"));
    c.line("#pragma unroll");
    c.line(format!(
        "for (int n = 0; n < {n}; ++n) {{ {name}[n][0] = 0.0f; {name}[n][1] = 0.0f; {name}[n][2] = 0.0f; {name}[n][3] = 0.0f; }}"
    ));
}

/// The kernel of text `c` (its body closed here), launched as `grid` blocks of `threads`.
pub(super) fn close(mut c: Src, grid: u32, threads: usize) -> CudaKernel {
    c.close();
    finish(
        c.text,
        Launch {
            grid: [grid, 1, 1],
            block: [threads as u32, 1, 1],
            shared_bytes: 0,
        },
    )
}

/// `acc[n][4]` zeroed, then `acc += a_w · bᵀ`, where `a_w` is this warp's 16 rows of the
/// shared tile `a` (`ig_fa_mm_nk`: `n` column groups of 8 over the head dim).
pub(super) fn product_nk(c: &mut Src, x: &Text, acc: &str, n: &str, a: &str, b: &str) {
    zero(c, acc, n);
    c.line(format!(
        "ig_fa_mm_nk_{}<{n}, D, LD, LD>({acc}, {a} + warp * 16 * LD, {b}, g, t);",
        x.mm
    ));
}

/// After the warp's writes to its tile `pw`: `acc += pw · b` over `k` rows of the shared tile
/// `b` (`ig_fa_mm_kn`, into the head dim).
pub(super) fn product_kn(c: &mut Src, x: &Text, acc: &str, k: &str, b: &str) {
    c.line("__syncwarp();");
    c.line(format!(
        "ig_fa_mm_kn_{}<D / 8, {k}, LDP, LD>({acc}, pw, {b}, g, t);",
        x.mm
    ));
}

/// In the fragment loops over a key tile: on a tile that needs the mask (`edge`), `hide` (an
/// assignment) where key `j` of the element is hidden from its query row `i` (`rows`: the
/// lane's two rows, `g` and `g + 8`). The forward's scores and dq's probabilities are masked
/// so.
pub(super) fn mask_on_edge(c: &mut Src, x: &Text, (r0, r1): (&str, &str), hide: &str) {
    c.open("if (edge) {");
    c.line(format!(
        "const int j = k0 + n * 8 + 2 * t + (e & 1), i = e < 2 ? {r0} : {r1};"
    ));
    c.line(format!("if ({}) {hide};", x.hidden("i", "j")));
    c.close();
}

/// Stores a lane's four fragment values `v` (rows `g` and `g + 8`, columns `n * 8 + 2t` and
/// the next) to the warp's tile `pw`, where they become the next product's left operand.
pub(super) fn store_fragment(c: &mut Src, x: &Text, v: [&str; 4]) {
    c.line(x.store_pair("pw + g * LDP + n * 8 + 2 * t", v[0], v[1]));
    c.line(x.store_pair("pw + (g + 8) * LDP + n * 8 + 2 * t", v[2], v[3]));
}

/// Opens the loops over a lane's fragment of `n` column groups: `n`, then its 4 elements `e`.
pub(super) fn fragment_loops(c: &mut Src, n: &str) {
    c.line("#pragma unroll");
    c.open(format!("for (int n = 0; n < {n}; ++n) {{"));
    c.line("#pragma unroll");
    c.open("for (int e = 0; e < 4; ++e) {");
}

/// Opens the loop over the key tiles the block's query rows can see (causal: up to the
/// diagonal), each loaded into `sk` and `sv` (`kb` and `vb`: the problem's k and v).
pub(super) fn key_tiles(c: &mut Src, s: &AttentionShape) {
    c.line(if s.causal {
        "const int kend = TK < q0 + BR ? TK : q0 + BR;"
    } else {
        "const int kend = TK;"
    });
    c.open("for (int k0 = 0; k0 < kend; k0 += BC) {");
    c.line("__syncthreads();");
    c.line("ig_fa_load<BC, D, KV_SR, LD, THREADS, TF32>(sk, kb, k0, TK);");
    c.line("ig_fa_load<BC, D, KV_SR, LD, THREADS, TF32>(sv, vb, k0, TK);");
    c.line("__syncthreads();");
}

/// The streamed key and value tiles of a bf16 kernel (forward, dq) arrive by `cp.async`
/// (`ig_fa_load_async`), each issued while the block computes with the other, in the same
/// shared tiles as [`key_tiles`] and with two barriers a key tile as there. `order` names the
/// tile the step reads first and its operand's rows (`("sk", "kb")`: the forward's scores),
/// then the one it reads after [`pipeline_middle`]. Opens the loop (as [`key_tiles`] does):
/// - before it, the first tile of `order[0]` is issued;
/// - at the top of a step, this thread waits for its copies of that tile; the barrier after
///   makes the tile visible and says every warp is done with the step before (so the tile of
///   `order[1]` is free), which is then issued and lands while the step reads `order[0]`.
///
/// Which products read which tile changes no result: each product has its own accumulator.
pub(super) fn key_tiles_pipelined(c: &mut Src, s: &AttentionShape, order: [(&str, &str); 2]) {
    c.line(if s.causal {
        "const int kend = TK < q0 + BR ? TK : q0 + BR;"
    } else {
        "const int kend = TK;"
    });
    let [(t0, b0), (t1, b1)] = order;
    c.line(format!(
        "ig_fa_load_async<BC, D, KV_SR, LD, THREADS>({t0}, {b0}, 0, TK); ig_fa_cp_commit();"
    ));
    c.open("for (int k0 = 0; k0 < kend; k0 += BC) {");
    c.line("ig_fa_cp_wait<0>();");
    c.line("__syncthreads();");
    c.line(format!(
        "ig_fa_load_async<BC, D, KV_SR, LD, THREADS>({t1}, {b1}, k0, TK); ig_fa_cp_commit();"
    ));
}

/// The middle of a [`key_tiles_pipelined`] step, between its reads of `order[0]`'s tile and
/// of `order[1]`'s (given here as `first`): this thread waits for its copies of the second
/// tile, the barrier makes them visible and says every warp is done with the first, whose
/// next key tile is then issued (if the loop has one) to land while the step reads the second.
pub(super) fn pipeline_middle(c: &mut Src, (t0, b0): (&str, &str)) {
    c.line("ig_fa_cp_wait<0>();");
    c.line("__syncthreads();");
    c.line(format!(
        "if (k0 + BC < kend) {{ ig_fa_load_async<BC, D, KV_SR, LD, THREADS>({t0}, {b0}, k0 + BC, TK); ig_fa_cp_commit(); }}"
    ));
}

/// Declares `edge` in a key tile: whether it crosses the end of the keys or (causal) the
/// diagonal, so that its scores need the mask.
pub(super) fn key_tile_edge(c: &mut Src, s: &AttentionShape) {
    c.line(if s.causal {
        "const bool edge = k0 + BC > TK || k0 + BC - 1 > q0;"
    } else {
        "const bool edge = k0 + BC > TK;"
    });
}

/// Stores a warp's accumulator `acc[D/8][4]` (rows `r0`, `r0 + 8` of `base`, `op`'s row
/// stride apart, each below `limit`), times `factor` if any.
pub(super) fn store_rows(
    c: &mut Src,
    x: &Text,
    acc: &str,
    base: &str,
    op: Operand,
    factor: Option<&str>,
    limit: &str,
) {
    let f = |e: usize| match factor {
        Some(f) => format!("{acc}[n][{e}] * {f}"),
        None => format!("{acc}[n][{e}]"),
    };
    for (row, e0) in [("r0", 0), ("r1", 2)] {
        c.open(format!("if ({row} < {limit}) {{"));
        c.line("#pragma unroll");
        c.open("for (int n = 0; n < D / 8; ++n) {");
        c.line(x.store_output_pair(
            &format!(
                "{base} + (unsigned long long){row} * {} + n * 8 + 2 * t",
                op.row()
            ),
            &f(e0),
            &f(e0 + 1),
        ));
        c.close();
        c.close();
    }
}
