//! The backward kernels (FlashAttention-2's backward, without atomics):
//! - `preprocess`: `delta[i] = Σ_d dout[i,d] · out[i,d]`, a warp per row;
//! - `dkdv`: a block per (key tile, batch·head), its warps 16 key rows each, looping over the
//!   query tiles that can see them: per query tile it recomputes `pᵀ = exp(scale · k·qᵀ - lse)`
//!   (masked), accumulates `dv += pᵀ · dout`, computes `dpᵀ = v · doutᵀ`,
//!   `dsᵀ = pᵀ ∘ (dpᵀ - delta)` and accumulates `dk += dsᵀ · q`; `dk` is scaled once at the end;
//! - `dq`: a block per (query tile, batch·head), looping over the key tiles its rows can see:
//!   `p`, `dp = dout · vᵀ`, `ds = p ∘ (dp - delta)`, `dq += ds · k`, scaled once at the end.
//!   With `DqKernel::StoredDs` (bf16; off by default: measured slower), dkdv also
//!   stores its bf16 `ds` in the workspace and `dq` multiplies those instead of recomputing
//!   them (`super::ds`).
//!
//! Each output element is written once by the one thread that accumulated it, so results are
//! the same bits on every run. For bf16 the probabilities and `ds` are rounded to bf16 when
//! they become a product's operand (in the per-warp shared tile); `ds` is computed from the
//! unrounded probabilities.

use super::common::Text;
use super::common::{self, Operand};
use super::frame::{self, Own, Tiling};
use super::problem::{AttentionError, AttentionShape};
use super::tiles::Tiles;
use crate::cuda::{signature, CudaKernel, Src};

/// dkdv's block owns key rows (its k and v tiles) and streams query rows (q and dout).
const DKDV: Tiling = Tiling {
    own: Own::Keys,
    owned: &["sk", "sv"],
    streamed: &["sq", "sdo"],
};

/// dq's block owns query rows (its q and dout tiles) and streams key rows (k and v).
const DQ: Tiling = Tiling {
    own: Own::Queries,
    owned: &["sq", "sdo"],
    streamed: &["sk", "sv"],
};

/// Rows (warps) a block of the preprocess kernel.
const PRE_ROWS: usize = 8;

/// The f32 inputs of the dkdv and dq kernels, after q, k, v and dout: each row's log-sum-exp
/// and `delta`.
const BACKWARD_F32: &[&str] = &["lse", "delta"];

pub(super) fn preprocess(s: &AttentionShape) -> Result<CudaKernel, AttentionError> {
    let x = Text::new(s);
    let st = x.st;
    let rows = s.batch_heads * s.seq_q;
    let mut c = Src::default();
    let params = frame::params(st, &["out", "dout"], &[], &[], &["delta"]);
    c.open(signature((32 * PRE_ROWS) as u32, &params));
    c.line(format!("constexpr int D = {};", s.head_dim));
    c.line(format!("constexpr unsigned long long TQ = {}ull;", s.seq_q));
    common::layout_constants(&mut c, s, &[Operand::Out]);
    // `row` runs over every problem's rows (delta's index); the layout places row `i` of
    // problem `bh`.
    c.line(format!(
        "const unsigned long long row = (unsigned long long)blockIdx.x * {PRE_ROWS}ull + (threadIdx.x >> 5);"
    ));
    c.line("const int lane = (int)(threadIdx.x & 31u);");
    c.line(format!("if (row >= {rows}ull) return;"));
    c.line("const unsigned long long bh = row / TQ, i = row % TQ;");
    c.line(common::SPLIT_PROBLEM);
    c.line(format!(
        "const unsigned long long at = {} + i * O_SR;",
        Operand::Out.base()
    ));
    c.line("float acc = 0.0f;");
    c.line("#pragma unroll");
    c.line(format!(
        "for (int d = lane; d < D; d += 32) acc = fmaf({}, {}, acc);",
        x.widen("out[at + d]"),
        x.widen("dout[at + d]")
    ));
    c.line("#pragma unroll");
    c.line("for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);");
    c.line("if (lane == 0) delta[row] = acc;");
    Ok(frame::close(
        c,
        rows.div_ceil(PRE_ROWS) as u32,
        32 * PRE_ROWS,
    ))
}

/// Problem `bh`'s batch and head, and where its rows of the inputs start: `qb`, `dob`, `kb`,
/// `vb` (by the layout of q, out and kv).
fn problem_bases(c: &mut Src, st: &str) {
    c.line(common::SPLIT_PROBLEM);
    for (p, n, op) in [
        ("qb", "q", Operand::Q),
        ("dob", "dout", Operand::Out),
        ("kb", "k", Operand::Kv),
        ("vb", "v", Operand::Kv),
    ] {
        c.line(format!("const {st}* {p} = {n} + {};", op.base()));
    }
}

/// `store_ds`: also store the bf16 `ds` after delta (`super::ds`; bf16 only).
pub(super) fn dkdv(
    s: &AttentionShape,
    tl: Tiles,
    store_ds: bool,
) -> Result<CudaKernel, AttentionError> {
    let x = Text::new(s);
    let st = x.st;
    // Here the block owns key rows (BC, the warps' rows) and streams query tiles (BR).
    let params = frame::params(
        st,
        &["q", "k", "v", "dout"],
        BACKWARD_F32,
        &["dk", "dv"],
        &[],
    );
    let (mut c, b) = frame::open_tiled(&x, s, tl, &params, DKDV)?;
    let br = tl.inner;
    c.line(format!("__shared__ float sl[{}];", br * tl.copies));
    c.line(format!("__shared__ float sd[{}];", br * tl.copies));
    frame::lanes(&mut c);
    // Causal: the first key tiles see the most queries; they start first.
    c.line("const int k0 = (int)(blockIdx.x / (unsigned)BH) * BC;");
    c.line("const unsigned long long bh = blockIdx.x % (unsigned)BH;");
    problem_bases(&mut c, st);
    c.line("const float* lb = lse + bh * TQ;");
    c.line("const float* db = delta + bh * TQ;");
    if store_ds {
        super::ds::with_helpers(&mut c);
        super::ds::dkdv_open(&mut c, s);
    }
    c.line("ig_fa_load<BC, D, KV_SR, LD, THREADS, TF32>(sk, kb, k0, TK);");
    c.line("ig_fa_load<BC, D, KV_SR, LD, THREADS, TF32>(sv, vb, k0, TK);");
    frame::zero(&mut c, "dka", "D / 8");
    frame::zero(&mut c, "dva", "D / 8");
    c.line("const int r0 = k0 + warp * 16 + g, r1 = r0 + 8;");
    c.line(format!("{st}* pw = sp + warp * 16 * LDP;"));
    c.line(if s.causal {
        "const int qstart = k0 / BR * BR;"
    } else {
        "const int qstart = 0;"
    });
    // The streamed tiles this step reads: with two copies, the step's halves of the arrays.
    let two = tl.copies == 2;
    let [sq, sdo, sl, sd] = if two {
        ["sqc", "sdoc", "slc", "sdc"]
    } else {
        ["sq", "sdo", "sl", "sd"]
    };
    if two {
        query_tiles_double_buffered(&mut c, st);
    } else {
        c.open("for (int q0 = qstart; q0 < TQ; q0 += BR) {");
        c.line("__syncthreads();");
        c.line("ig_fa_load<BR, D, Q_SR, LD, THREADS, TF32>(sq, qb, q0, TQ);");
        c.line("ig_fa_load<BR, D, O_SR, LD, THREADS, TF32>(sdo, dob, q0, TQ);");
    }
    c.open("for (int i = (int)threadIdx.x; i < BR; i += THREADS) {");
    c.line("const bool in = q0 + i < TQ;");
    c.line(format!("{sl}[i] = in ? lb[q0 + i] * LOG2E : 0.0f;"));
    c.line(format!("{sd}[i] = in ? db[q0 + i] : 0.0f;"));
    c.close();
    if two {
        query_tiles_next(&mut c);
    } else {
        c.line("__syncthreads();");
    }
    frame::product_nk(&mut c, &x, "pt", "BR / 8", "sk", sq);
    c.line(if s.causal {
        "const bool edge = q0 + BR > TQ || q0 < k0 + BC - 1;"
    } else {
        "const bool edge = q0 + BR > TQ;"
    });
    frame::fragment_loops(&mut c, "BR / 8");
    c.line("const int il = n * 8 + 2 * t + (e & 1);");
    c.line(format!(
        "float p = exp2f(pt[n][e] * SCALE_LOG2 - {sl}[il]);"
    ));
    c.open("if (edge) {");
    c.line("const int i = q0 + il, j = e < 2 ? r0 : r1;");
    let hide = if s.causal {
        "i >= TQ || j > i"
    } else {
        "i >= TQ"
    };
    c.line(format!("if ({hide}) p = 0.0f;"));
    c.close();
    c.line("pt[n][e] = p;");
    c.close();
    frame::store_fragment(&mut c, &x, ["pt[n][0]", "pt[n][1]", "pt[n][2]", "pt[n][3]"]);
    c.close();
    frame::product_kn(&mut c, &x, "dva", "BR", sdo);
    frame::product_nk(&mut c, &x, "dpt", "BR / 8", "sv", sdo);
    c.line("__syncwarp();");
    c.line("#pragma unroll");
    c.open("for (int n = 0; n < BR / 8; ++n) {");
    c.line("const int il = n * 8 + 2 * t;");
    c.line(format!("const float d0 = {sd}[il], d1 = {sd}[il + 1];"));
    c.line("const float s0 = pt[n][0] * (dpt[n][0] - d0), s1 = pt[n][1] * (dpt[n][1] - d1);");
    c.line("const float s2 = pt[n][2] * (dpt[n][2] - d0), s3 = pt[n][3] * (dpt[n][3] - d1);");
    frame::store_fragment(&mut c, &x, ["s0", "s1", "s2", "s3"]);
    c.close();
    frame::product_kn(&mut c, &x, "dka", "BR", sq);
    if store_ds {
        super::ds::dkdv_store(&mut c, s);
    }
    c.close();
    c.line(format!("{st}* dkb = dk + {};", Operand::Kv.base()));
    c.line(format!("{st}* dvb = dv + {};", Operand::Kv.base()));
    frame::store_rows(&mut c, &x, "dka", "dkb", Operand::Kv, Some("SCALE"), "TK");
    frame::store_rows(&mut c, &x, "dva", "dvb", Operand::Kv, None, "TK");
    Ok(b.close(c))
}

/// Opens dkdv's loop over query tiles with two copies of the streamed tiles (bf16, where they
/// fit: [`super::tiles::Tiles::copies`]): step `slot` reads the copy `sqc`, `sdoc` (q and
/// dout, arrived by `cp.async`) and `slc`, `sdc` (lse and delta, which it writes itself before
/// the step's barrier). The first query tile is issued before the loop.
fn query_tiles_double_buffered(c: &mut Src, st: &str) {
    c.line("ig_fa_load_async<BR, D, Q_SR, LD, THREADS>(sq, qb, qstart, TQ);");
    c.line("ig_fa_load_async<BR, D, O_SR, LD, THREADS>(sdo, dob, qstart, TQ);");
    c.line("ig_fa_cp_commit();");
    c.open("for (int q0 = qstart, slot = 0; q0 < TQ; q0 += BR, slot ^= 1) {");
    c.line(format!(
        "const {st}* sqc = sq + slot * BR * LD; const {st}* sdoc = sdo + slot * BR * LD;"
    ));
    c.line("float* slc = sl + slot * BR; float* sdc = sd + slot * BR;");
}

/// The one barrier of a double-buffered dkdv step, after this thread's copies of the step's q
/// and dout tiles have landed: it makes them and lse/delta visible, and says every warp is done
/// with the step before, whose copies then take the next query tile (if there is one), to land
/// while this step computes.
fn query_tiles_next(c: &mut Src) {
    c.line("ig_fa_cp_wait<0>();");
    c.line("__syncthreads();");
    c.open("if (q0 + BR < TQ) {");
    c.line(
        "ig_fa_load_async<BR, D, Q_SR, LD, THREADS>(sq + (slot ^ 1) * BR * LD, qb, q0 + BR, TQ);",
    );
    c.line(
        "ig_fa_load_async<BR, D, O_SR, LD, THREADS>(sdo + (slot ^ 1) * BR * LD, dob, q0 + BR, TQ);",
    );
    c.line("ig_fa_cp_commit();");
    c.close();
}

pub(super) fn dq(s: &AttentionShape, tl: Tiles) -> Result<CudaKernel, AttentionError> {
    let x = Text::new(s);
    let st = x.st;
    let params = frame::params(st, &["q", "k", "v", "dout"], BACKWARD_F32, &["dq"], &[]);
    let (mut c, b) = frame::open_tiled(&x, s, tl, &params, DQ)?;
    frame::lanes(&mut c);
    frame::query_tile_longest_first(&mut c, b.tiles);
    problem_bases(&mut c, st);
    c.line("ig_fa_load<BR, D, Q_SR, LD, THREADS, TF32>(sq, qb, q0, TQ);");
    c.line("ig_fa_load<BR, D, O_SR, LD, THREADS, TF32>(sdo, dob, q0, TQ);");
    c.line("const int r0 = q0 + warp * 16 + g, r1 = r0 + 8;");
    c.line("const float L0 = r0 < TQ ? lse[bh * TQ + r0] * LOG2E : 0.0f;");
    c.line("const float L1 = r1 < TQ ? lse[bh * TQ + r1] * LOG2E : 0.0f;");
    c.line("const float E0 = r0 < TQ ? delta[bh * TQ + r0] : 0.0f;");
    c.line("const float E1 = r1 < TQ ? delta[bh * TQ + r1] : 0.0f;");
    frame::zero(&mut c, "dqa", "D / 8");
    c.line(format!("{st}* pw = sp + warp * 16 * LDP;"));
    if x.pipelined() {
        // dp (v's tile) first, then the scores and dq (k's), each while the other tile lands.
        frame::key_tiles_pipelined(&mut c, s, [("sv", "vb"), ("sk", "kb")]);
        frame::product_nk(&mut c, &x, "dp", "BC / 8", "sdo", "sv");
        frame::pipeline_middle(&mut c, ("sv", "vb"));
        frame::product_nk(&mut c, &x, "sc", "BC / 8", "sq", "sk");
    } else {
        frame::key_tiles(&mut c, s);
        frame::product_nk(&mut c, &x, "sc", "BC / 8", "sq", "sk");
        frame::product_nk(&mut c, &x, "dp", "BC / 8", "sdo", "sv");
    }
    frame::key_tile_edge(&mut c, s);
    frame::fragment_loops(&mut c, "BC / 8");
    c.line("float p = exp2f(sc[n][e] * SCALE_LOG2 - (e < 2 ? L0 : L1));");
    frame::mask_on_edge(&mut c, &x, ("r0", "r1"), "p = 0.0f");
    c.line("sc[n][e] = p * (dp[n][e] - (e < 2 ? E0 : E1));");
    c.close();
    frame::store_fragment(&mut c, &x, ["sc[n][0]", "sc[n][1]", "sc[n][2]", "sc[n][3]"]);
    c.close();
    frame::product_kn(&mut c, &x, "dqa", "BC", "sk");
    c.close();
    c.line(format!("{st}* dqb = dq + {};", Operand::Q.base()));
    frame::store_rows(&mut c, &x, "dqa", "dqb", Operand::Q, Some("SCALE"), "TQ");
    Ok(b.close(c))
}
