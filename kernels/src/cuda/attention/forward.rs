//! The forward kernel: a block per (query tile, batch·head), its warps 16 query rows each.
//!
//! The query tile sits in shared memory for the whole block; key and value tiles stream
//! through shared memory. Per key tile a warp computes its 16 × `inner` scores (one product),
//! scales them into the log2 domain, masks (only on tiles that cross the causal diagonal or the
//! end of the keys), updates each row's running max and rescales its running sum and output
//! accumulator (the online softmax, all in f32), writes its probabilities to its own rows of a
//! shared tile (rounded to bf16 for bf16) and accumulates `p · v` (a second product). At the
//! end each row's output is divided by its sum and `lse = ln 2 · (max + log2 sum)` is stored.
//! Causal blocks stop at the last key tile their rows can see; blocks are ordered so that the
//! longest (the last query tiles) start first.

use super::common::Text;
use super::common::{self, Operand};
use super::frame::{self, Own, Tiling};
use super::problem::{AttentionError, AttentionShape};
use super::tiles::Tiles;
use crate::cuda::CudaKernel;

/// The block owns query rows (its q tile) and streams key rows (k and v).
const TILING: Tiling = Tiling {
    own: Own::Queries,
    owned: &["sq"],
    streamed: &["sk", "sv"],
};

pub(super) fn generate(s: &AttentionShape, t: Tiles) -> Result<CudaKernel, AttentionError> {
    let x = Text::new(s);
    let st = x.st;
    let params = frame::params(st, &["q", "k", "v"], &[], &["out"], &["lse"]);
    let (mut c, b) = frame::open_tiled(&x, s, t, &params, TILING)?;
    frame::lanes(&mut c);
    frame::query_tile_longest_first(&mut c, b.tiles);
    c.line(common::SPLIT_PROBLEM);
    c.line(format!("const {st}* qb = q + {};", Operand::Q.base()));
    c.line(format!("const {st}* kb = k + {};", Operand::Kv.base()));
    c.line(format!("const {st}* vb = v + {};", Operand::Kv.base()));
    c.line("ig_fa_load<BR, D, Q_SR, LD, THREADS, TF32>(sq, qb, q0, TQ);");
    frame::zero(&mut c, "o", "D / 8");
    c.line("// Running max (log2 domain, scaled) and this lane's share of the running sum, rows g and g + 8.");
    c.line("float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;");
    c.line("const int i0 = q0 + warp * 16 + g, i1 = i0 + 8;");
    let pipelined = x.pipelined();
    if pipelined {
        frame::key_tiles_pipelined(&mut c, s, [("sk", "kb"), ("sv", "vb")]);
    } else {
        frame::key_tiles(&mut c, s);
    }
    frame::product_nk(&mut c, &x, "s", "BC / 8", "sq", "sk");
    frame::key_tile_edge(&mut c, s);
    c.line("float r0 = NEG_INF, r1 = NEG_INF;");
    frame::fragment_loops(&mut c, "BC / 8");
    c.line("float z = s[n][e] * SCALE_LOG2;");
    frame::mask_on_edge(&mut c, &x, ("i0", "i1"), "z = NEG_INF");
    c.line("s[n][e] = z;");
    c.line("if (e < 2) r0 = fmaxf(r0, z); else r1 = fmaxf(r1, z);");
    c.close();
    c.close();
    c.line("r0 = ig_fa_quad_max(r0); r1 = ig_fa_quad_max(r1);");
    c.line("const float n0 = fmaxf(m0, r0), n1 = fmaxf(m1, r1);");
    c.line("// A row that has seen only masked keys keeps max -inf: exponentiate against 0 there.");
    c.line("const float b0 = n0 == NEG_INF ? 0.0f : n0, b1 = n1 == NEG_INF ? 0.0f : n1;");
    c.line("const float a0 = exp2f(m0 - b0), a1 = exp2f(m1 - b1);");
    c.line("m0 = n0; m1 = n1; l0 *= a0; l1 *= a1;");
    c.line(format!("{st}* pw = sp + warp * 16 * LDP;"));
    c.line("#pragma unroll");
    c.open("for (int n = 0; n < BC / 8; ++n) {");
    c.line("const float p0 = exp2f(s[n][0] - b0), p1 = exp2f(s[n][1] - b0);");
    c.line("const float p2 = exp2f(s[n][2] - b1), p3 = exp2f(s[n][3] - b1);");
    c.line("l0 += p0 + p1; l1 += p2 + p3;");
    frame::store_fragment(&mut c, &x, ["p0", "p1", "p2", "p3"]);
    c.close();
    if pipelined {
        frame::pipeline_middle(&mut c, ("sk", "kb"));
    }
    c.line("#pragma unroll");
    c.line("for (int n = 0; n < D / 8; ++n) { o[n][0] *= a0; o[n][1] *= a0; o[n][2] *= a1; o[n][3] *= a1; }");
    frame::product_kn(&mut c, &x, "o", "BC", "sv");
    c.close();
    c.line("l0 = ig_fa_quad_sum(l0); l1 = ig_fa_quad_sum(l1);");
    c.line(format!("{st}* ob = out + {};", Operand::Out.base()));
    for (row, l, m) in [("i0", "l0", "m0"), ("i1", "l1", "m1")] {
        c.open(format!("if ({row} < TQ) {{"));
        c.line("#pragma unroll");
        c.open("for (int n = 0; n < D / 8; ++n) {");
        let (e0, e1) = if row == "i0" { (0, 1) } else { (2, 3) };
        c.line(x.store_output_pair(
            &format!("ob + (unsigned long long){row} * O_SR + n * 8 + 2 * t"),
            &format!("o[n][{e0}] / {l}"),
            &format!("o[n][{e1}] / {l}"),
        ));
        c.close();
        c.line(format!(
            "if (t == 0) lse[bh * TQ + {row}] = ({m} + log2f({l})) * LN2;"
        ));
        c.close();
    }
    Ok(b.close(c))
}
