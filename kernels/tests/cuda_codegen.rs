//! Host tests of the CUDA C generator: what can be checked without a GPU. Names, determinism,
//! strategies and launch shapes, errors instead of panics, and that every generated kernel (a
//! set of representative descriptions, plus random ones) is valid C++ as far as a host compiler
//! can tell, through a small shim header that stands in for CUDA's built-ins.
//!
//! Numerical checks against the CPU executor run on a GPU: `cargo run --release -p
//! ingot-testkit --example cuda_kernels`.

use ingot_kernels::cuda::{self, CudaKernel, Strategy, PRELUDE, PRELUDE_BF16};
use ingot_kernels::fused::random::{self, Rng};
use ingot_kernels::fused::{FusedKernel, Inst, Output};
use ingot_kernels::{BinaryOp, CmpOp, DType, ReduceOp, UnaryOp};
use ingot_testkit::kernel_builder::KernelBuilder as B;
use std::collections::BTreeMap;

// ---------------------------------------------------------------------------------------------
// Building descriptions: [`B`], the kernel tests' one builder.

use BinaryOp::*;
use ReduceOp::{Max as RMax, Sum as RSum};
use UnaryOp::*;

fn softmax(r: usize, n: usize) -> FusedKernel {
    let mut b = B::new(&[r, n], &[1]);
    let x = b.whole(DType::F32);
    let x = b.load(x);
    let m = b.red(RMax, x);
    let d = b.bin(Sub, x, m);
    let e = b.un(Exp, d);
    let s = b.red(RSum, e);
    let y = b.bin(Div, e, s);
    b.out(y).done()
}

/// LayerNorm forward over the last axis of `[b, s, d]`: outputs y, mean, rstd.
fn layer_norm(bs: usize, s: usize, d: usize) -> FusedKernel {
    let mut b = B::new(&[bs, s, d], &[2]);
    let x = b.whole(DType::F32);
    let g = b.input_bcast(DType::F32, &[0, 1]);
    let be = b.input_bcast(DType::F32, &[0, 1]);
    let x = b.load(x);
    let sum = b.red(RSum, x);
    let inv_n = b.konst_of(1.0 / d as f64, DType::F32);
    let mean = b.bin(Mul, sum, inv_n);
    let xc = b.bin(Sub, x, mean);
    let sq = b.bin(Mul, xc, xc);
    let ss = b.red(RSum, sq);
    let var = b.bin(Mul, ss, inv_n);
    let eps = b.konst_of(1e-5, DType::F32);
    let ve = b.bin(Add, var, eps);
    let sd = b.un(Sqrt, ve);
    let rstd = b.un(Recip, sd);
    let xh = b.bin(Mul, xc, rstd);
    let g = b.load(g);
    let be = b.load(be);
    let y = b.bin(Mul, xh, g);
    let y = b.bin(Add, y, be);
    b.out(y).out(mean).out(rstd).done()
}

/// LayerNorm backward over the last axis of `[r, d]`, from dy, x, gamma and the saved mean and
/// rstd (row-level inputs): outputs dx.
fn layer_norm_backward(r: usize, d: usize) -> FusedKernel {
    layer_norm_backward_with(r, d, false)
}

/// [`layer_norm_backward`] whose gradient is added to the residual stream's (an input only
/// the final loop reads), as a transformer's LayerNorm backward is.
fn layer_norm_backward_into_residual(r: usize, d: usize) -> FusedKernel {
    layer_norm_backward_with(r, d, true)
}

fn layer_norm_backward_with(r: usize, d: usize, into_residual: bool) -> FusedKernel {
    let mut b = B::new(&[r, d], &[1]);
    let dy = b.whole(DType::F32);
    let x = b.whole(DType::F32);
    let g = b.input_bcast(DType::F32, &[0]);
    let mean = b.input_bcast(DType::F32, &[1]);
    let rstd = b.input_bcast(DType::F32, &[1]);
    let residual = into_residual.then(|| b.whole(DType::F32));
    let dy = b.load(dy);
    let x = b.load(x);
    let g = b.load(g);
    let mean = b.load(mean);
    let rstd = b.load(rstd);
    let residual = residual.map(|r| b.load(r));
    let xc = b.bin(Sub, x, mean);
    let xh = b.bin(Mul, xc, rstd);
    let dyg = b.bin(Mul, dy, g);
    let s1 = b.red(RSum, dyg);
    let t = b.bin(Mul, dyg, xh);
    let s2 = b.red(RSum, t);
    let inv_n = b.konst_of(1.0 / d as f64, DType::F32);
    let m1 = b.bin(Mul, s1, inv_n);
    let m2 = b.bin(Mul, s2, inv_n);
    let a = b.bin(Sub, dyg, m1);
    let c = b.bin(Mul, xh, m2);
    let a = b.bin(Sub, a, c);
    let dx = b.bin(Mul, a, rstd);
    let dx = match residual {
        Some(r) => b.bin(Add, dx, r),
        None => dx,
    };
    b.out(dx).done()
}

/// Cross-entropy over the last axis of logits `[r, v]` with i64 targets `[r]`: outputs the
/// per-row loss and the gradient (four reductions over three stages).
fn cross_entropy(r: usize, v: usize) -> FusedKernel {
    cross_entropy_of(r, v, DType::F32)
}

/// [`cross_entropy`] over logits of `dtype`: bf16 logits are widened to f32 after their load
/// and the gradient rounded to bf16 before its store, as gpt2's bf16 step does; the
/// arithmetic between is f32.
fn cross_entropy_of(r: usize, v: usize, dtype: DType) -> FusedKernel {
    let mut b = B::new(&[r, v], &[1]);
    let logits = b.whole(dtype);
    let target = b.input_bcast(DType::I64, &[1]);
    let mut x = b.load(logits);
    if dtype != DType::F32 {
        x = b.push(Inst::Convert { x, to: DType::F32 });
    }
    let m = b.red(RMax, x);
    let d = b.bin(Sub, x, m);
    let e = b.un(Exp, d);
    let s = b.red(RSum, e);
    let idx = b.push(Inst::Index {
        axis: 1,
        dtype: DType::I64,
    });
    let t = b.load(target);
    let hit = b.push(Inst::Compare {
        op: CmpOp::Eq,
        a: idx,
        b: t,
    });
    let ls = b.un(Log, s);
    let lp = b.bin(Sub, d, ls);
    let zero = b.konst_of(0.0, DType::F32);
    let picked = b.push(Inst::Select {
        cond: hit,
        a: lp,
        b: zero,
    });
    let loss = b.red(RSum, picked);
    let nloss = b.un(Neg, loss);
    let scale = b.konst_of(-1.0 / r as f64, DType::F32);
    let g0 = b.push(Inst::Select {
        cond: hit,
        a: scale,
        b: zero,
    });
    let gs = b.red(RSum, g0);
    let ng = b.un(Neg, gs);
    let k = b.bin(Div, ng, s);
    let ke = b.bin(Mul, k, e);
    let mut grad = b.bin(Add, g0, ke);
    if dtype != DType::F32 {
        grad = b.push(Inst::Convert { x: grad, to: dtype });
    }
    b.out(nloss).out(grad).done()
}

/// `[m, d]` summed over axis 0 (a bias gradient).
fn column_sum(m: usize, d: usize) -> FusedKernel {
    let mut b = B::new(&[m, d], &[0]);
    let x = b.whole(DType::F32);
    let x = b.load(x);
    let s = b.red(RSum, x);
    b.out(s).done()
}

/// `[b, s, d]` summed over axes 0 and 1, of a product (a LayerNorm weight gradient).
fn column_sum_3d(bs: usize, s: usize, d: usize) -> FusedKernel {
    let mut b = B::new(&[bs, s, d], &[0, 1]);
    let x = b.whole(DType::F32);
    let y = b.whole(DType::F32);
    let x = b.load(x);
    let y = b.load(y);
    let p = b.bin(Mul, x, y);
    let s = b.red(RSum, p);
    b.out(s).done()
}

/// AdamW-like update: param, grad, m, v (contiguous), lr and step (one element each,
/// broadcast): outputs param, m, v.
fn adamw(dims: &[usize]) -> FusedKernel {
    let mut b = B::new(dims, &[]);
    let all: Vec<usize> = (0..dims.len()).collect();
    let p = b.whole(DType::F32);
    let g = b.whole(DType::F32);
    let m = b.whole(DType::F32);
    let v = b.whole(DType::F32);
    let lr = b.input_bcast(DType::F32, &all);
    let step = b.input_bcast(DType::F32, &all);
    let p = b.load(p);
    let g = b.load(g);
    let m = b.load(m);
    let v = b.load(v);
    let lr = b.load(lr);
    let step = b.load(step);
    let b1 = b.konst_of(0.9, DType::F32);
    let nb1 = b.konst_of(0.1, DType::F32);
    let b2 = b.konst_of(0.999, DType::F32);
    let nb2 = b.konst_of(0.001, DType::F32);
    let m1 = b.bin(Mul, m, b1);
    let m2 = b.bin(Mul, g, nb1);
    let m_new = b.bin(Add, m1, m2);
    let v1 = b.bin(Mul, v, b2);
    let gg = b.bin(Mul, g, g);
    let v2 = b.bin(Mul, gg, nb2);
    let v_new = b.bin(Add, v1, v2);
    let sq = b.un(Sqrt, v_new);
    let eps = b.konst_of(1e-8, DType::F32);
    let den = b.bin(Add, sq, eps);
    let upd = b.bin(Div, m_new, den);
    let lrs = b.bin(Mul, lr, step);
    let wd = b.konst_of(0.01, DType::F32);
    let decay = b.bin(Mul, p, wd);
    let upd = b.bin(Add, upd, decay);
    let delta = b.bin(Mul, upd, lrs);
    let p_new = b.bin(Sub, p, delta);
    b.out(p_new).out(m_new).out(v_new).done()
}

/// Integer, bool and f64 arithmetic with converts, index values and wrapping.
fn mixed_types(r: usize, n: usize) -> FusedKernel {
    let mut b = B::new(&[r, n], &[]);
    let a = b.whole(DType::I64);
    let f = b.input_bcast(DType::F64, &[0]);
    let m = b.whole(DType::Bool);
    let a = b.load(a);
    let f = b.load(f);
    let m = b.load(m);
    let big = b.konst_of(9.0e18, DType::I64);
    let w = b.bin(Mul, a, big); // wraps
    let ix = b.push(Inst::Index {
        axis: 1,
        dtype: DType::I64,
    });
    let w = b.bin(Add, w, ix);
    let w = b.bin(Max, w, a);
    let nw = b.un(Neg, w);
    let wf = b.push(Inst::Convert {
        x: nw,
        to: DType::F64,
    });
    let s = b.bin(Min, wf, f);
    let si = b.push(Inst::Convert {
        x: s,
        to: DType::I32,
    });
    let sb = b.push(Inst::Convert {
        x: si,
        to: DType::Bool,
    });
    let both = b.push(Inst::Select {
        cond: m,
        a: sb,
        b: m,
    });
    let nan = b.konst_of(f64::NAN, DType::F32);
    let inf = b.konst_of(f64::NEG_INFINITY, DType::F64);
    let mn = b.konst_of(-2147483648.0, DType::I32);
    let lmin = b.konst_of(-9.3e18, DType::I64);
    let fx = b.push(Inst::Convert {
        x: s,
        to: DType::F32,
    });
    let fm = b.bin(Max, fx, nan);
    let dm = b.bin(Max, s, inf);
    let im = b.bin(Sub, si, mn);
    let lm = b.bin(Sub, w, lmin);
    b.out(both).out(fm).out(dm).out(im).out(lm).done()
}

/// Integer and f64 reductions: sum and max of i32, i64 and f64 values over the last axis.
fn int_reductions(r: usize, n: usize) -> FusedKernel {
    let mut b = B::new(&[r, n], &[1]);
    let a = b.whole(DType::I32);
    let c = b.whole(DType::I64);
    let d = b.whole(DType::F64);
    let a = b.load(a);
    let c = b.load(c);
    let d = b.load(d);
    let s1 = b.red(RSum, a);
    let m1 = b.red(RMax, a);
    let s2 = b.red(RSum, c);
    let m2 = b.red(RMax, c);
    let s3 = b.red(RSum, d);
    let m3 = b.red(RMax, d);
    b.out(s1).out(m1).out(s2).out(m2).out(s3).out(m3).done()
}

/// A transposed load (`[a, b]` read from a `[b, a]` buffer), a sliced one and a broadcast one.
fn transposed(a: usize, n: usize) -> FusedKernel {
    let mut b = B::new(&[a, n], &[]);
    let t = b.input_at(DType::F32, 0, &[1, a]);
    let s = b.input_at(DType::F32, 7, &[n * 3, 1]);
    let c = b.input_bcast(DType::F32, &[1]);
    let t = b.load(t);
    let s = b.load(s);
    let c = b.load(c);
    let x = b.bin(Add, t, s);
    let x = b.bin(Mul, x, c);
    b.out(x).done()
}

/// Attention-style permuted read: `[b, h, s, dh]` from a `[b, s, h*dh]` buffer.
fn heads(bs: usize, h: usize, s: usize, dh: usize) -> FusedKernel {
    let mut b = B::new(&[bs, h, s, dh], &[]);
    let x = b.input_at(DType::F32, 0, &[s * h * dh, dh, h * dh, 1]);
    let x = b.load(x);
    b.out(x).done()
}

/// Attention's key transpose: `[b, h, dh, s]` from a `[b, s, h*dh]` buffer, scaled, with
/// the index along the sequence and a bias broadcast along it.
fn heads_transposed(bs: usize, h: usize, s: usize, dh: usize) -> FusedKernel {
    let mut b = B::new(&[bs, h, dh, s], &[]);
    let x = b.input_at(DType::F32, 5, &[s * h * dh, dh, 1, h * dh]);
    let bias = b.input_bcast(DType::F32, &[0, 3]);
    let x = b.load(x);
    let bias = b.load(bias);
    let i = b.push(Inst::Index {
        axis: 3,
        dtype: DType::F32,
    });
    let y = b.bin(Add, x, bias);
    let y = b.bin(Mul, y, i);
    b.out(y).out(x).done()
}

/// Masked softmax with index instructions on a row axis and on the reduce axis.
fn causal_softmax(bh: usize, s: usize) -> FusedKernel {
    masked_softmax(bh, s, CmpOp::Gt, false).0
}

/// A softmax over rows of `[bh, s, s]` scores (in0, scaled by 0.125) whose scores are replaced
/// by the lowest float where `col OP row` is `!keep` (`keep`: the condition says where a score
/// is kept); outputs the max, the sum and the probabilities. Returns the condition's index too.
fn masked_softmax(bh: usize, s: usize, op: CmpOp, keep: bool) -> (FusedKernel, usize) {
    let mut b = B::new(&[bh, s, s], &[2]);
    let x = b.whole(DType::F32);
    let col = b.push(Inst::Index {
        axis: 2,
        dtype: DType::I32,
    });
    let row = b.push(Inst::Index {
        axis: 1,
        dtype: DType::I32,
    });
    let cond = b.push(Inst::Compare { op, a: col, b: row });
    let lowest = b.konst_of(-3.4028234663852886e38, DType::F32);
    let x = b.load(x);
    let sc = b.konst_of(0.125, DType::F32);
    let xs = b.bin(Mul, x, sc);
    let (a, c) = if keep { (xs, lowest) } else { (lowest, xs) };
    let v = b.push(Inst::Select { cond, a, b: c });
    let (m, s, y) = softmax_of(&mut b, v);
    (b.out(m).out(s).out(y).done(), cond)
}

/// The max, the sum of exponentials and the probabilities of row values `v`.
fn softmax_of(b: &mut B, v: usize) -> (usize, usize, usize) {
    let m = b.red(RMax, v);
    let d = b.bin(Sub, v, m);
    let e = b.un(Exp, d);
    let s = b.red(RSum, e);
    let y = b.bin(Div, e, s);
    (m, s, y)
}

/// GPT-2's attention backward through the causal softmax, as fusion makes it (domain
/// `[b, h, s, s]`, reduce axis 3): the scores (in0) and the probabilities' gradient (in1),
/// both full, and two row-level inputs (in2, in3); it recomputes the softmax (max, then sum),
/// reduces the gradient's dot product, and writes the probabilities and the scores' gradient.
fn attention_backward(bs: usize, h: usize, s: usize) -> FusedKernel {
    let mut b = B::new(&[bs, h, s, s], &[3]);
    let scores = b.whole(DType::F32);
    let dp = b.whole(DType::F32);
    let r1 = b.input_bcast(DType::F32, &[3]);
    let r2 = b.input_bcast(DType::F32, &[3]);
    let col = b.push(Inst::Index {
        axis: 3,
        dtype: DType::I32,
    });
    let row = b.push(Inst::Index {
        axis: 2,
        dtype: DType::I32,
    });
    let masked = b.push(Inst::Compare {
        op: CmpOp::Gt,
        a: col,
        b: row,
    });
    let lowest = b.konst_of(-3.4028234663852886e38, DType::F32);
    let x = b.load(scores);
    let sc = b.konst_of(0.125, DType::F32);
    let xs = b.bin(Mul, x, sc);
    let v = b.push(Inst::Select {
        cond: masked,
        a: lowest,
        b: xs,
    });
    let m = b.red(RMax, v);
    let d = b.bin(Sub, v, m);
    let e = b.un(Exp, d);
    let sum = b.red(RSum, e);
    let p = b.bin(Div, e, sum);
    let zero = b.konst_of(0.0, DType::F32);
    let g = b.load(dp);
    let r1 = b.load(r1);
    let gr = b.bin(Div, g, r1);
    let pr = b.bin(Div, p, r1);
    let gp = b.bin(Mul, g, pr);
    let dot = b.red(RSum, gp);
    let ndot = b.un(Neg, dot);
    let t = b.bin(Add, gr, ndot);
    let r2 = b.load(r2);
    let z = b.bin(Sub, v, r2);
    let z = b.un(Exp, z);
    let t = b.bin(Mul, t, z);
    let t = b.push(Inst::Select {
        cond: masked,
        a: zero,
        b: t,
    });
    let t = b.bin(Mul, t, sc);
    b.out(p).out(t).done()
}

/// A reduction over a middle axis (`[a, n, c]` summed over axis 1): the innermost axis is kept.
fn middle_sum(a: usize, n: usize, c: usize) -> FusedKernel {
    let mut b = B::new(&[a, n, c], &[1]);
    let x = b.whole(DType::F32);
    let x = b.load(x);
    let m = b.red(RMax, x);
    let d = b.bin(Sub, x, m);
    let s = b.red(RSum, d);
    b.out(d).out(s).done()
}

/// Reduce axes of size 0: the reductions are their identities, the row-level outputs exist.
fn empty_rows(r: usize) -> FusedKernel {
    let mut b = B::new(&[r, 0], &[1]);
    let x = b.whole(DType::F32);
    let y = b.input_bcast(DType::I32, &[1]);
    let x = b.load(x);
    let y = b.load(y);
    let s = b.red(RSum, x);
    let m = b.red(RMax, x);
    let yi = b.red(RMax, y);
    b.out(s).out(m).out(yi).out(x).done()
}

/// Reduce axes of size 1: reductions are copies, the kernel elementwise.
fn size_one_reduce(r: usize) -> FusedKernel {
    let mut b = B::new(&[r, 1], &[1]);
    let x = b.whole(DType::F32);
    let x = b.load(x);
    let m = b.red(RMax, x);
    let s = b.red(RSum, x);
    let y = b.bin(Add, m, s);
    b.out(y).out(m).done()
}

/// A full reduction to one value (fewer than 64 rows: the row strategy).
fn total_sum(n: usize) -> FusedKernel {
    let mut b = B::new(&[n, 1], &[0, 1]);
    let x = b.input_at(DType::F32, 0, &[1, 1]);
    let x = b.load(x);
    let s = b.red(RSum, x);
    b.out(s).done()
}

/// A scalar kernel (rank 0).
fn scalar() -> FusedKernel {
    let mut b = B::new(&[], &[]);
    let x = b.whole(DType::F32);
    let x = b.load(x);
    let c = b.konst_of(-0.00390625, DType::F32);
    let y = b.bin(Mul, x, c);
    b.out(y).done()
}

/// A domain with more than 2^31 elements (only generated, never run here).
fn huge() -> FusedKernel {
    let mut b = B::new(&[1 << 16, 1 << 16], &[]);
    let x = b.whole(DType::F32);
    let x = b.load(x);
    let y = b.un(Exp, x);
    b.out(y).done()
}

/// Many rows with a huge row count of the row strategy (more than 2^20 blocks of work).
fn many_rows() -> FusedKernel {
    softmax(3 << 20, 4)
}

/// Exact GELU, `x·½·(1 + erf(x/√2))`, elementwise in `dtype`.
fn exact_gelu(n: usize, dtype: DType) -> FusedKernel {
    let mut b = B::new(&[n], &[]);
    let x = b.whole(dtype);
    let x = b.load(x);
    let c = b.konst_of(std::f64::consts::FRAC_1_SQRT_2, dtype);
    let s = b.bin(Mul, x, c);
    let e = b.un(Erf, s);
    let one = b.konst_of(1.0, dtype);
    let e1 = b.bin(Add, e, one);
    let half = b.konst_of(0.5, dtype);
    let h = b.bin(Mul, x, half);
    let y = b.bin(Mul, h, e1);
    b.out(y).done()
}

#[test]
fn erf_is_cudas_erff_in_f32_and_bf16_and_erf_in_f64() {
    let src = |dt| cuda::fused(&exact_gelu(64, dt)).unwrap().source;
    assert!(src(DType::F32).contains("erff("), "{}", src(DType::F32));
    assert!(src(DType::BF16).contains("erff("), "{}", src(DType::BF16));
    let f64_src = src(DType::F64);
    assert!(
        f64_src.contains("erf(") && !f64_src.contains("erff("),
        "{f64_src}"
    );
}

fn representative() -> Vec<(&'static str, FusedKernel)> {
    vec![
        ("softmax", softmax(64, 1000)),
        ("softmax_small", softmax(300, 10)),
        ("softmax_long", softmax(8, 50304)),
        ("layer_norm", layer_norm(2, 16, 768)),
        ("layer_norm_backward", layer_norm_backward(512, 768)),
        ("cross_entropy", cross_entropy(256, 1000)),
        ("column_sum", column_sum(8192, 768)),
        ("column_sum_wide", column_sum(256, 65536)),
        ("column_sum_3d", column_sum_3d(8, 1024, 768)),
        ("adamw", adamw(&[1024, 768])),
        ("adamw_1d", adamw(&[768])),
        ("adamw_vec4", adamw(&[4096, 1024])),
        ("heads_vec4", heads(8, 12, 1024, 64)),
        ("mixed_types", mixed_types(33, 65)),
        ("int_reductions", int_reductions(100, 300)),
        ("transposed", transposed(100, 300)),
        ("heads", heads(2, 12, 128, 64)),
        ("transposed_big", transposed(256, 700)),
        ("heads_transposed", heads_transposed(2, 12, 100, 64)),
        ("causal_softmax", causal_softmax(24, 128)),
        ("attention_backward", attention_backward(2, 3, 128)),
        ("attention_backward_ragged", attention_backward(1, 2, 1000)),
        ("layer_norm_backward_long", layer_norm_backward(16, 3000)),
        // Rows long enough that both of its passes (the mean, then the variance) sum in blocks:
        // two blocked loops in one kernel, each with its own block counter.
        ("layer_norm_long_rows", layer_norm(1, 2, (1 << 21) + 3)),
        ("middle_sum", middle_sum(4, 100, 300)),
        ("empty_rows", empty_rows(10)),
        ("empty_rows_none", empty_rows(0)),
        ("size_one_reduce", size_one_reduce(1000)),
        ("total_sum", total_sum(8192)),
        // Threads with more than 1024 terms of a float sum block them (see cuda::fused).
        ("softmax_rows_2e22", softmax(2, 1 << 22)),
        ("column_sum_tall", column_sum(1 << 22, 64)),
        ("total_sum_2e27", total_sum((1 << 27) + 16)),
        ("scalar", scalar()),
        ("huge", huge()),
        ("many_rows", many_rows()),
        ("exact_gelu_f32", exact_gelu(1000, DType::F32)),
        ("exact_gelu_f64", exact_gelu(1000, DType::F64)),
        ("exact_gelu_bf16", exact_gelu(1000, DType::BF16)),
        ("empty_elementwise", {
            let mut b = B::new(&[0, 5], &[]);
            let x = b.whole(DType::F32);
            let x = b.load(x);
            b.out(x).done()
        }),
    ]
}

// ---------------------------------------------------------------------------------------------
// The syntax check.

const SHIM: &str = r#"// Host stand-ins for CUDA's built-ins, enough for -fsyntax-only.
#include <cmath>
struct ig_uint3 { unsigned x, y, z; };
struct float4 { float x, y, z, w; };
struct int4 { int x, y, z, w; };
struct uchar4 { unsigned char x, y, z, w; };
struct ushort4 { unsigned short x, y, z, w; };
struct uint4 { unsigned x, y, z, w; };
uint4 make_uint4(unsigned, unsigned, unsigned, unsigned);
extern ig_uint3 threadIdx, blockIdx, blockDim, gridDim;
void __syncthreads();
int __syncthreads_or(int);
unsigned __ballot_sync(unsigned mask, int predicate);
int __ffs(unsigned);
void __syncwarp(unsigned mask = 0xffffffffu);
template <typename T> T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32);
template <typename T> T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32);
int __float2int_rz(float);
int __double2int_rz(double);
long long __float2ll_rz(float);
long long __double2ll_rz(double);
float __int_as_float(int);
float __uint_as_float(unsigned);
unsigned __float_as_uint(float);
double __longlong_as_double(long long);
float atomicAdd(float*, float);
double atomicAdd(double*, double);
int atomicAdd(int*, int);
unsigned long long atomicAdd(unsigned long long*, unsigned long long);
unsigned atomicMax(unsigned*, unsigned);
unsigned atomicOr(unsigned*, unsigned);
unsigned atomicAdd(unsigned*, unsigned);
unsigned __match_any_sync(unsigned mask, unsigned v);
int __popc(unsigned);
template <typename T> T __shfl_sync(unsigned mask, T v, int lane, int width = 32);
"#;

/// Writes the shim, the prelude and each distinct kernel once to a file and runs the host
/// compiler over it with warnings as errors. Returns false (after saying so) when there is no
/// C++ compiler.
fn syntax_check(tag: &str, kernels: &[CudaKernel]) -> bool {
    let Some(cxx) = ingot_testkit::cxx::host_cxx_or_skip() else {
        return false;
    };
    let mut distinct: BTreeMap<&str, &CudaKernel> = BTreeMap::new();
    for k in kernels {
        if let Some(prev) = distinct.insert(&k.name, k) {
            assert_eq!(prev.source, k.source, "two kernels named {}", k.name);
        }
    }
    let mut text = format!("{}{SHIM}", ingot_testkit::cxx::CUDA_ON_HOST);
    text.push_str(PRELUDE);
    text.push_str(PRELUDE_BF16);
    for k in distinct.values() {
        text.push_str(&k.source);
    }
    let flags = [
        "-std=c++17",
        "-fsyntax-only",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-Wno-unused-parameter",
        "-Wno-unknown-pragmas",
        "-Wno-type-limits",
        "-Wno-tautological-compare",
    ];
    let dir = format!("ingot_cuda_codegen_{tag}");
    let file = ingot_testkit::cxx::compile(cxx, &dir, "kernels.cpp", &text, &flags)
        .unwrap_or_else(|e| panic!("{cxx} rejects the generated kernels: {e}"));
    let _ = std::fs::remove_dir_all(file.parent().unwrap());
    true
}

// ---------------------------------------------------------------------------------------------
// Tests.

#[test]
fn every_representative_kernel_passes_a_host_syntax_check() {
    let mut kernels: Vec<CudaKernel> = Vec::new();
    for (name, k) in representative() {
        kernels.push(cuda::fused(&k).unwrap_or_else(|e| panic!("{name}: {e}")));
        // A split column reduction's two kernels as well.
        let p = cuda::fused_program(&k).unwrap_or_else(|e| panic!("{name}: {e}"));
        if p.launches.len() > 1 {
            kernels.extend(p.launches.into_iter().map(|l| l.kernel));
        }
    }
    syntax_check("representative", &kernels);
}

/// `[b, s, d]` bf16 `dy` and `x` with per-token mean and rstd: the gain gradient
/// `sum(dy * (x - mean) * rstd)` over axes 0 and 1, bf16 as a bf16 step stores it.
fn gain_gradient_bf16(bs: usize, s: usize, d: usize) -> FusedKernel {
    let mut b = B::new(&[bs, s, d], &[0, 1]);
    let dy = b.whole(DType::BF16);
    let x = b.whole(DType::BF16);
    let mean = b.input_bcast(DType::F32, &[2]);
    let rstd = b.input_bcast(DType::F32, &[2]);
    let (dy, x, mean, rstd) = (b.load(dy), b.load(x), b.load(mean), b.load(rstd));
    let dy = b.push(Inst::Convert {
        x: dy,
        to: DType::F32,
    });
    let x = b.push(Inst::Convert { x, to: DType::F32 });
    let xc = b.bin(Sub, x, mean);
    let xh = b.bin(Mul, xc, rstd);
    let t = b.bin(Mul, dy, xh);
    let t = b.push(Inst::Convert {
        x: t,
        to: DType::BF16,
    });
    let s = b.red(RSum, t);
    b.out(s).done()
}

#[test]
fn a_column_reduction_too_narrow_to_fill_the_gpu_runs_as_partial_sums_then_their_fold() {
    use cuda::FusedArg::{Input as In, Output as Out, Scratch};
    // GPT-2's bias gradient: 768 columns of 8,192 tokens, 48 blocks as one kernel.
    let k = column_sum(8192, 768);
    let p = cuda::fused_program(&k).unwrap();
    assert_eq!(p.launches.len(), 2);
    let (partial, finish) = (&p.launches[0], &p.launches[1]);
    let grid = |l: &cuda::FusedLaunch| l.kernel.launch.grid[0] as usize;
    assert!(
        grid(partial) >= 2 * 132,
        "partial kernel: {} blocks",
        grid(partial)
    );
    assert!(grid(partial) > 4 * cuda::fused(&k).unwrap().launch.grid[0] as usize);
    // 32 f32 partials a column, in the scratch the planner gives the node.
    assert_eq!(p.scratch_bytes, 32 * 768 * 4);
    assert_eq!(cuda::fused_scratch_bytes(&k), p.scratch_bytes);
    let part = Scratch {
        offset: 0,
        bytes: 32 * 768 * 4,
    };
    assert_eq!(
        (partial.args.clone(), partial.reads),
        (vec![In(0), part], 1)
    );
    assert_eq!((finish.args.clone(), finish.reads), (vec![part, Out(0)], 1));

    // The bf16 gain gradient splits along its outer (batch) axis, eight ways, so that its
    // slices keep the tokens of a sequence whole, and carries f32 partials.
    let k = gain_gradient_bf16(8, 1024, 768);
    let p = cuda::fused_program(&k).unwrap();
    assert_eq!(p.launches.len(), 2);
    assert_eq!(p.scratch_bytes, 8 * 768 * 4, "f32 partials");
    let whole = cuda::fused(&k).unwrap().launch;
    let partial = p.launches[0].kernel.launch;
    let threads = |l: cuda::Launch| l.grid[0] * l.block[0] * l.block[1];
    assert!(
        partial.grid[0] >= 4 * whole.grid[0],
        "{partial:?} {whole:?}"
    );
    assert!(
        threads(partial) >= 4 * threads(whole),
        "{partial:?} {whole:?}"
    );
    assert!(
        p.launches[1].kernel.source.contains("ig_to_bf16"),
        "rounds once, at the end"
    );
}

#[test]
fn reductions_that_fill_the_gpu_or_read_their_sums_again_keep_one_kernel() {
    for (what, k) in [
        ("rows", softmax(8192, 768)),
        (
            "a row-strategy LayerNorm backward",
            layer_norm_backward(8192, 768),
        ),
        ("columns enough for the GPU", column_sum(8192, 65536)),
        ("short columns", column_sum(512, 768)),
        ("an elementwise kernel", adamw(&[768, 3072])),
    ] {
        let p = cuda::fused_program(&k).unwrap();
        assert_eq!(p.launches.len(), 1, "{what}");
        assert_eq!(p.scratch_bytes, 0, "{what}");
        assert_eq!(p.launches[0].kernel, cuda::fused(&k).unwrap(), "{what}");
        assert_eq!(cuda::fused_scratch_bytes(&k), 0, "{what}");
    }
}

#[test]
fn a_scatter_add_programs_sort_reads_only_the_ids_and_its_scratch_and_only_its_sums_read_the_values(
) {
    let (rows, n) = (50304, 16384);
    let p = cuda::scatter_add_program(DType::I64, DType::BF16, DType::F32, rows, 768, n).unwrap();
    // Two radix passes of 8 bits for ids up to 50,304 (histogram, scan, place each), the
    // counts zeroed, the runs found, then the short runs' and the long runs' sums.
    assert_eq!(p.launches.len(), 2 * 3 + 4);
    assert_eq!(p.scratch_bytes, cuda::scatter_add_scratch_bytes(rows, n));
    assert_eq!(p.scratch_bytes % 256, 0);
    // Sorted keys and positions twice (the passes alternate), two lists of runs, and a
    // histogram a tile.
    assert!(p.scratch_bytes >= 6 * 4 * n + 4 * 256 * n.div_ceil(1024));
    let reads_values = |l: &cuda::FusedLaunch| l.args.contains(&cuda::FusedArg::Input(1));
    for (i, l) in p.launches.iter().enumerate() {
        for (j, a) in l.args.iter().enumerate() {
            match *a {
                cuda::FusedArg::Scratch { offset, bytes } => {
                    assert!(offset + bytes <= p.scratch_bytes, "launch {i} arg {j}");
                    assert_eq!(offset % 256, 0, "launch {i} arg {j}");
                    // Only the sort and the runs write the scratch.
                    if reads_values(l) {
                        assert!(j < l.reads, "launch {i} writes its scratch arg {j}");
                    }
                }
                cuda::FusedArg::Input(_) => assert!(j < l.reads, "launch {i} writes an input"),
                cuda::FusedArg::Output(_) => assert!(j >= l.reads, "launch {i} reads the output"),
            }
        }
    }
    // Everything before the sums can run as soon as the ids exist; the last two launches sum.
    let (sort, sums) = p.launches.split_at(p.launches.len() - 2);
    for l in sort {
        assert!(
            !reads_values(l)
                && !l
                    .args
                    .iter()
                    .any(|a| matches!(a, cuda::FusedArg::Output(_)))
        );
    }
    for l in sums {
        assert!(reads_values(l));
        assert_eq!(l.args.last(), Some(&cuda::FusedArg::Output(0)));
    }
    // Enough digits for the ids 0..=rows (rows stands for an id out of range); rows longer
    // than 1024 columns are summed by panels only.
    let launches = |rows, row_len| {
        cuda::scatter_add_program(DType::I32, DType::F32, DType::F32, rows, row_len, 9)
            .unwrap()
            .launches
            .len()
    };
    assert_eq!(launches(255, 4), 3 + 4);
    assert_eq!(launches(256, 4), 6 + 4);
    assert_eq!(launches((1 << 24) - 1, 4), 9 + 4);
    assert_eq!(launches(1 << 24, 4), 12 + 4);
    assert_eq!(launches(256, 1025), 6 + 3);
    let e = cuda::scatter_add_program(DType::I64, DType::F32, DType::F32, 4, 1, u32::MAX as usize)
        .unwrap_err();
    assert!(e.to_string().contains("scatter_add"), "{e}");
    assert_eq!(
        cuda::scatter_add_scratch_bytes(4, u32::MAX as usize),
        usize::MAX
    );
}

/// Every launch's kernel of the scatter-add program of ids, values and sums of the given types
/// and of `[rows, row_len, n]`.
fn scatter_kernels(types: (DType, DType, DType), sizes: [usize; 3]) -> Vec<CudaKernel> {
    let p = cuda::ScatterAdd::of(types, sizes).program().unwrap();
    p.launches.into_iter().map(|l| l.kernel).collect()
}

#[test]
fn gather_scatter_and_concat_pass_a_host_syntax_check() {
    let mut ks = Vec::new();
    for ids in [DType::I32, DType::I64] {
        // bf16 is refused (see tests/bf16.rs).
        for t in DType::ALL.into_iter().filter(|&t| t != DType::BF16) {
            ks.push(cuda::gather(t, ids, 50304, 768, 8192).unwrap());
            if t != DType::Bool {
                ks.extend(scatter_kernels((ids, t, t), [50304, 768, 8192]));
            }
        }
    }
    ks.push(cuda::gather(DType::F32, DType::I64, 10, 1, 5).unwrap());
    ks.push(cuda::gather(DType::F32, DType::I64, 10, 0, 5).unwrap());
    ks.extend(scatter_kernels(
        (DType::I64, DType::F32, DType::F32),
        [3, 1, 0],
    ));
    ks.push(cuda::gather(DType::F32, DType::I64, 1 << 22, 1024, 16).unwrap());
    // 64-bit indices (an output of 2^32 elements), and rows longer than one column panel.
    ks.extend(scatter_kernels(
        (DType::I64, DType::F32, DType::F32),
        [1 << 22, 1024, 16],
    ));
    ks.extend(scatter_kernels(
        (DType::I32, DType::F64, DType::F64),
        [100, 5000, 300],
    ));
    for t in DType::ALL.into_iter().filter(|&t| t != DType::BF16) {
        ks.push(cuda::concat(t, 8192, &[768, 768, 768]).unwrap());
    }
    ks.push(cuda::concat(DType::F32, 4, &[0, 3, 0, 5]).unwrap());
    ks.push(cuda::concat(DType::F32, 4, &[7]).unwrap());
    ks.push(cuda::concat(DType::F32, 0, &[7, 2]).unwrap());
    ks.push(cuda::concat(DType::F32, 4, &[]).unwrap());
    syntax_check("ops", &ks);
}

#[test]
fn random_descriptions_generate_kernels_that_pass_a_host_syntax_check() {
    // `fused::random` with sizes that reach every strategy; every kernel it gives checks.
    let opts = random::Options::wide();
    let mut ks = Vec::new();
    let mut strategies = BTreeMap::new();
    for seed in 0..400u64 {
        let k = random::kernel(seed, &opts);
        match cuda::fused(&k) {
            Ok(c) => ks.push(c),
            Err(e) => panic!("seed {seed}: {e}\n{k}"),
        }
        *strategies
            .entry(cuda::strategy(&k).unwrap().name())
            .or_insert(0) += 1;
    }
    assert!(strategies.len() >= 3, "strategies reached: {strategies:?}");
    syntax_check("random", &ks);
}

#[test]
fn bf16_versions_of_the_representative_and_random_kernels_pass_a_host_syntax_check() {
    let mut ks = Vec::new();
    let mut strategies = BTreeMap::new();
    let random = (0..400u64).map(|s| {
        (
            format!("seed {s}"),
            random::kernel(s, &random::Options::wide()),
        )
    });
    let named = representative()
        .into_iter()
        .map(|(n, k)| (n.to_string(), k));
    for (name, k) in named.chain(random) {
        let k = random::as_bf16(&k);
        k.check()
            .unwrap_or_else(|e| panic!("{name} in bf16 does not check: {e}"));
        let c = cuda::fused(&k).unwrap_or_else(|e| panic!("{name} in bf16: {e}\n{k}"));
        if k.dtypes().contains(&DType::BF16) {
            *strategies
                .entry(cuda::strategy(&k).unwrap().name())
                .or_insert(0) += 1;
        }
        ks.push(c);
    }
    assert_eq!(
        strategies.len(),
        3,
        "strategies reached in bf16: {strategies:?}"
    );
    for ids in [DType::I32, DType::I64] {
        ks.push(cuda::gather(DType::BF16, ids, 50304, 768, 8192).unwrap());
        ks.extend(scatter_kernels(
            (ids, DType::BF16, DType::BF16),
            [50304, 768, 8192],
        ));
        ks.extend(scatter_kernels(
            (ids, DType::BF16, DType::F32),
            [50304, 768, 8192],
        ));
    }
    ks.extend(scatter_kernels(
        (DType::I32, DType::BF16, DType::BF16),
        [100, 5000, 300],
    ));
    ks.push(cuda::concat(DType::BF16, 8192, &[768, 768, 768]).unwrap());
    syntax_check("bf16", &ks);
}

#[test]
fn identical_descriptions_give_identical_kernels_and_different_ones_different_names() {
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for (name, k) in representative() {
        let a = cuda::fused(&k).unwrap();
        let b = cuda::fused(&k.clone()).unwrap();
        assert_eq!(a, b, "{name}: generation is not deterministic");
        assert!(
            a.name.starts_with("ingot_") && a.name.len() == 6 + 16,
            "{}",
            a.name
        );
        assert!(
            a.source.contains(&a.name),
            "{name}: the source defines another name"
        );
        assert_eq!(
            a.source.matches("__global__").count(),
            1,
            "{name}: one function per kernel"
        );
        if let Some(other) = seen.insert(a.name.clone(), name.to_string()) {
            panic!("{name} and {other} got the same name {}", a.name);
        }
    }
    // A change of one size, one stride or one constant changes the name.
    let base = cuda::fused(&softmax(64, 1000)).unwrap();
    assert_ne!(base.name, cuda::fused(&softmax(64, 1001)).unwrap().name);
    assert_ne!(base.name, cuda::fused(&softmax(65, 1000)).unwrap().name);
    let mut k = adamw(&[1024, 768]);
    let a = cuda::fused(&k).unwrap();
    if let Inst::Const { value, .. } = &mut k.body[6] {
        *value = 0.95;
    }
    assert_ne!(a.name, cuda::fused(&k).unwrap().name);
}

#[test]
fn the_same_kernel_in_every_layer_gets_one_name() {
    let names: Vec<String> = (0..12)
        .map(|_| cuda::fused(&layer_norm(8, 1024, 768)).unwrap().name)
        .collect();
    assert!(names.iter().all(|n| *n == names[0]));
}

#[test]
fn a_last_axis_softmax_uses_the_row_strategy_and_a_column_sum_the_column_strategy() {
    assert_eq!(cuda::strategy(&softmax(64, 1000)).unwrap(), Strategy::Rows);
    assert_eq!(
        cuda::strategy(&layer_norm(2, 16, 768)).unwrap(),
        Strategy::Rows
    );
    assert_eq!(
        cuda::strategy(&cross_entropy(256, 1000)).unwrap(),
        Strategy::Rows
    );
    assert_eq!(
        cuda::strategy(&column_sum(8192, 768)).unwrap(),
        Strategy::Columns
    );
    assert_eq!(
        cuda::strategy(&column_sum_3d(8, 1024, 768)).unwrap(),
        Strategy::Columns
    );
    assert_eq!(
        cuda::strategy(&middle_sum(4, 100, 300)).unwrap(),
        Strategy::Columns
    );
    assert_eq!(
        cuda::strategy(&adamw(&[1024, 768])).unwrap(),
        Strategy::Elementwise
    );
    // Reduce axes of size 1 make copies: elementwise.
    assert_eq!(
        cuda::strategy(&size_one_reduce(100)).unwrap(),
        Strategy::Elementwise
    );
    // Few rows: one block per row even though the innermost axis is kept.
    assert_eq!(
        cuda::strategy(&column_sum(8192, 8)).unwrap(),
        Strategy::Rows
    );
    assert_eq!(cuda::strategy(&total_sum(8192)).unwrap(), Strategy::Rows);
    // The launch shapes say so too.
    let s = cuda::fused(&softmax(64, 5000)).unwrap();
    assert_eq!(s.launch.grid, [64, 1, 1]);
    assert_eq!(s.launch.block[1], 1);
    // Short rows: 32 lanes of a warp per row, 8 rows a block.
    let s = cuda::fused(&softmax(64, 200)).unwrap();
    assert_eq!(s.launch.grid, [8, 1, 1]);
    assert_eq!(s.launch.block, [256, 1, 1]);
    // Rows of 1000 would leave 32 elements a lane: a block of 256 threads per row instead.
    let s = cuda::fused(&softmax(64, 1000)).unwrap();
    assert_eq!(s.launch.grid, [64, 1, 1]);
    assert_eq!(s.launch.block, [256, 1, 1]);
    // Eight rows across a block or more (a thread may take several: `rows_a_thread`).
    let c = cuda::fused(&column_sum(8192, 768)).unwrap();
    assert!(
        c.launch.block[0] as usize * rows_a_thread(&c.source) >= 8 && c.launch.block[1] > 1,
        "{:?}",
        c.launch
    );
}

fn numel(dims: &[usize]) -> usize {
    dims.iter().product()
}

#[test]
fn launch_shapes_cover_the_work_within_the_limits() {
    for (name, k) in representative() {
        let c = cuda::fused(&k).unwrap();
        let l = c.launch;
        let threads = l.block[0] * l.block[1] * l.block[2];
        assert!((1..=1024).contains(&threads), "{name}: {threads} threads");
        assert!(
            l.block[2] == 1 && l.grid[1] == 1 && l.grid[2] == 1,
            "{name}: {l:?}"
        );
        assert!(l.grid[0] >= 1 && l.grid[0] < (1 << 31), "{name}: {l:?}");
        assert_eq!(l.shared_bytes, 0, "{name}: shared memory is static");
        let (grid, bx) = (l.grid[0] as usize, l.block[0] as usize);
        let rows: usize = (0..k.domain.len())
            .filter(|d| !k.reduce_axes.contains(d))
            .map(|d| k.domain[d])
            .product();
        let looped = c.source.contains("gridDim.x");
        match cuda::strategy(&k).unwrap() {
            Strategy::Elementwise => {
                let n = numel(&k.domain);
                // Capped grids stride over the rest.
                // A thread per element (or per four), or a block per 32 × 32 tile.
                let per_block = if l.block[1] > 1 {
                    1024
                } else if c.source.contains("4 a thread") {
                    4 * bx
                } else {
                    bx
                };
                assert!(
                    grid * per_block >= n || (grid == 132 * 32 && looped),
                    "{name}: {l:?}"
                );
                assert!(threads == 256 || n == 0, "{name}");
            }
            Strategy::Rows => {
                // A block per row, or (short rows) 256 / w rows a block of w lanes each.
                let n = numel(&k.domain) / rows.max(1);
                let per_block = if n <= 1024 && !c.source.contains("__shared__") {
                    256 / n.next_power_of_two().clamp(1, 32)
                } else {
                    1
                };
                let units = rows.div_ceil(per_block);
                assert!(grid >= units.min(1 << 20), "{name}: {l:?} for {rows} rows");
                assert!(grid >= units || looped, "{name}");
                // A power of two, or a multiple of 32 that gives whole vectors (192 for 768).
                assert!(bx.is_multiple_of(32) && bx <= 1024, "{name}: {l:?}");
            }
            Strategy::Columns => {
                let across = bx * rows_a_thread(&c.source);
                assert!(grid * across >= rows, "{name}: {l:?} for {rows} rows");
                assert!(across >= 8 && l.block[1] >= 2, "{name}: {l:?}");
            }
        }
    }
    // Rows: small rows get small blocks, long rows with few of them big ones.
    assert_eq!(
        cuda::fused(&softmax(300, 10)).unwrap().launch.grid,
        [19, 1, 1]
    );
    assert_eq!(
        cuda::fused(&softmax(4096, 1025)).unwrap().launch.block,
        [256, 1, 1]
    );
    assert_eq!(
        cuda::fused(&softmax(8, 50304)).unwrap().launch.block,
        [1024, 1, 1]
    );
    // Elementwise: the grid is capped at 132 × 32 blocks.
    assert_eq!(
        cuda::fused(&adamw(&[8192, 768])).unwrap().launch.grid,
        [132 * 32, 1, 1]
    );
    assert_eq!(cuda::fused(&adamw(&[768])).unwrap().launch.grid, [3, 1, 1]);
}

#[test]
fn index_arithmetic_is_32_bit_below_2_pow_31_elements_and_64_bit_above() {
    let small = cuda::fused(&softmax(8192, 50304)).unwrap();
    assert!(
        !small.source.contains("unsigned long long"),
        "{}",
        small.source
    );
    let big = cuda::fused(&huge()).unwrap();
    assert!(
        big.source.contains("unsigned long long e"),
        "{}",
        big.source
    );
    // An input longer than 2^31 elements makes it 64-bit too, even for a small domain.
    let mut b = B::new(&[4, 4], &[]);
    let x = b.input_at(DType::F32, 1 << 31, &[4, 1]);
    let x = b.load(x);
    b.out(x);
    let k = b.done();
    assert!(cuda::fused(&k)
        .unwrap()
        .source
        .contains("unsigned long long"));
}

#[test]
fn contiguous_loads_read_at_the_linear_index_and_sizes_are_literals() {
    // Four elements a thread (16-byte vectors at the linear index in fours).
    let c = cuda::fused(&adamw(&[4096, 1024])).unwrap();
    // No division at all: every load is the identity map (or a broadcast scalar).
    assert!(
        !c.source.contains(" / ") || !c.source.contains('%'),
        "{}",
        c.source
    );
    assert!(
        c.source
            .contains("const float4 l0 = reinterpret_cast<const float4*>(in0)[e];"),
        "{}",
        c.source
    );
    assert!(c.source.contains("in4[0u]"), "{}", c.source);
    assert!(c.source.contains("1048576u"), "{}", c.source);
    // One a thread where the innermost size is not a multiple of 4, or the kernel is smaller.
    let c = cuda::fused(&adamw(&[1 << 20, 5])).unwrap();
    assert!(c.source.contains("in0[e]"), "{}", c.source);
    assert!(c.source.contains("5242880u"), "{}", c.source);
    assert!(!c.source.contains("float4"), "{}", c.source);
    let c = cuda::fused(&adamw(&[1024, 768])).unwrap();
    assert!(c.source.contains("in0[e]"), "{}", c.source);
    assert!(c.source.contains("786432u"), "{}", c.source);
    // A bias broadcast needs the column index only.
    for (cols, index, read) in [
        (1024, "e % 256u", "reinterpret_cast<const float4*>(in1)[i1]"),
        (1022, "e % 1022u", "in1[i1]"),
    ] {
        let mut b = B::new(&[4096, cols], &[]);
        let x = b.whole(DType::F32);
        let y = b.input_bcast(DType::F32, &[0]);
        let x = b.load(x);
        let y = b.load(y);
        let s = b.bin(Add, x, y);
        b.out(s);
        let c = cuda::fused(&b.done()).unwrap();
        assert!(
            c.source.contains(&format!("const unsigned i1 = {index};")),
            "{}",
            c.source
        );
        assert!(c.source.contains(read), "{}", c.source);
        assert!(!c.source.contains("i0"), "{}", c.source);
    }
    // Softmax reads each row at its base plus the thread's position.
    let s = cuda::fused(&softmax(64, 1000)).unwrap();
    assert!(s.source.contains("in0[b0 + j]"), "{}", s.source);
}

#[test]
fn elementwise_kernels_use_vectors_only_where_aligned() {
    // `[r, 8]` read through strides `[row, 1]` at `offset`, plus one, into f32 (or `dtype`).
    let k = |row: usize, offset: usize, dtype: DType| {
        let mut b = B::new(&[1 << 19, 8], &[]);
        let x = b.input_at(dtype, offset, &[row, 1]);
        let x = b.load(x);
        let one = b.konst_of(1.0, dtype);
        let y = b.bin(Add, x, one);
        b.out(y).done()
    };
    let vec4 = |k: &FusedKernel| cuda::fused(k).unwrap().source.contains("4 a thread");
    assert!(vec4(&k(8, 0, DType::F32)));
    let scalar = cuda::Tuning {
        scalar_elementwise: true,
        ..Default::default()
    };
    let c = cuda::fused_tuned(&k(8, 0, DType::F32), scalar).unwrap();
    assert!(c.source.contains("in0[e]"), "{}", c.source);
    assert!(vec4(&k(12, 4, DType::F32)));
    assert!(vec4(&k(8, 0, DType::I32)));
    // Misaligned: an offset or a row stride that is not a multiple of 4 elements.
    assert!(!vec4(&k(8, 2, DType::F32)));
    assert!(!vec4(&k(10, 0, DType::F32)));
    // No 16-byte vector of 8-byte values here.
    assert!(!vec4(&k(8, 0, DType::F64)));
    // A slice at a vector offset is read in vectors: offset 4 elements is vector 1.
    let c = cuda::fused(&k(12, 4, DType::F32)).unwrap();
    assert!(
        c.source
            .contains("reinterpret_cast<const float4*>(in0)[1u + 3u * i0 + i1]"),
        "{}",
        c.source
    );
    // Index values along the vector axis count the four elements.
    let mut b = B::new(&[1 << 17, 32], &[]);
    let x = b.whole(DType::F32);
    let x = b.load(x);
    let i = b.push(Inst::Index {
        axis: 1,
        dtype: DType::F32,
    });
    let y = b.bin(Mul, x, i);
    b.out(y);
    let c = cuda::fused(&b.done()).unwrap();
    assert!(c.source.contains("(float)(4u * i1)"), "{}", c.source);
    assert!(c.source.contains("(float)(4u * i1 + 3u)"), "{}", c.source);
    // Bool vectors are 4 bytes; the stores come after every read.
    let mut b = B::new(&[1 << 17, 32], &[]);
    let x = b.whole(DType::F32);
    let x = b.load(x);
    let z = b.konst_of(0.0, DType::F32);
    let m = b.push(Inst::Compare {
        op: CmpOp::Gt,
        a: x,
        b: z,
    });
    b.out(m).out(x);
    let c = cuda::fused(&b.done()).unwrap();
    let src = &c.source;
    assert!(src.contains("uchar4 r0;"), "{src}");
    assert!(
        src.find("(out0)[").unwrap() > src.rfind("l0.").unwrap(),
        "{src}"
    );
}

#[test]
fn a_transposing_copy_goes_through_shared_memory_tiles() {
    // Reads coalesce along the input's contiguous axis, writes along the output's.
    let c = cuda::fused(&heads_transposed(2, 12, 100, 64)).unwrap();
    assert_eq!(c.launch.block, [32, 8, 1], "{}", c.source);
    assert_eq!(c.launch.grid, [2 * 12 * 2 * 4, 1, 1], "{}", c.source);
    assert!(
        c.source.contains("__shared__ float t0[32][33];"),
        "{}",
        c.source
    );
    assert!(
        c.source.contains("t0[q][threadIdx.x] = in0["),
        "{}",
        c.source
    );
    assert!(c.source.contains("= t0[threadIdx.x][q];"), "{}", c.source);
    // The bias is broadcast along the tile's inner axis: read directly, not tiled.
    assert!(!c.source.contains("float t1[32]"), "{}", c.source);
    // Small kernels, and copies whose reads are already contiguous along the innermost axis,
    // stay plain loops.
    assert!(!cuda::fused(&transposed(100, 300))
        .unwrap()
        .source
        .contains("__shared__"));
    assert!(!cuda::fused(&heads(2, 12, 128, 64))
        .unwrap()
        .source
        .contains("__shared__"));
}

/// How many of `src`'s loops over the row (its passes and its output loop) read input `m`,
/// one element (`in0[`) or a vector (`in0 + (`) at a time.
fn loops_reading(src: &str, m: &str) -> usize {
    let starts: Vec<usize> = (src.match_indices("// pass ").map(|(at, _)| at))
        .chain(src.find("// the full outputs"))
        .chain([src.len()])
        .collect();
    starts
        .windows(2)
        .filter(|w| {
            let part = &src[w[0]..w[1]];
            part.contains(&format!("{m}[")) || part.contains(&format!("{m} + ("))
        })
        .count()
}

/// Every use of a cached array `c{i}` in `src` is its declaration or an element `[u]` of the
/// unrolled loop over the thread's elements (a constant index once unrolled, so the array
/// lives in registers); returns how many arrays there are.
fn cached_arrays_in_registers(src: &str) -> usize {
    let mut arrays = 0;
    for (at, _) in src.match_indices(" c") {
        let rest = &src[at + 2..];
        let digits = rest.chars().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 || !rest[digits..].starts_with('[') {
            continue;
        }
        let index = &rest[digits + 1..];
        let index = &index[..index.find(']').unwrap()];
        if src[..at].ends_with("float") || src[..at].ends_with("double") {
            arrays += 1;
            assert!(index.parse::<usize>().is_ok(), "{src}");
        } else {
            assert_eq!(index, "u", "{src}");
        }
    }
    if arrays > 0 {
        assert!(src.contains("#pragma unroll"), "{src}");
        assert!(!src.contains("for (unsigned j"), "{src}");
    }
    arrays
}

#[test]
fn a_short_softmax_row_is_read_from_memory_once() {
    // Each lane of a warp keeps its 7 elements of a row of 200 in registers for the later
    // passes; in a row of 1000, each of 256 threads keeps 4.
    let c = cuda::fused(&softmax(64, 200)).unwrap();
    assert_eq!(c.source.matches("in0[").count(), 1, "{}", c.source);
    assert!(c.source.contains("float c0[7];"), "{}", c.source);
    assert!(c.source.contains("const float v0 = c0[u];"), "{}", c.source);
    assert_eq!(cached_arrays_in_registers(&c.source), 1);
    let c = cuda::fused(&softmax(64, 1000)).unwrap();
    assert_eq!(c.source.matches("in0[").count(), 1, "{}", c.source);
    assert!(c.source.contains("float c0[4];"), "{}", c.source);
    assert!(c.source.contains("const float v0 = c0[u];"), "{}", c.source);
    assert_eq!(cached_arrays_in_registers(&c.source), 1);
    // Three loads of 24 elements a lane would not fit: the row gets a block of 192 threads
    // instead, 4 elements each, one vector (256 would leave 3 each, no whole vector). Gamma is
    // read once per row (by the first pass) and kept too.
    let c = cuda::fused(&layer_norm_backward(512, 768)).unwrap();
    assert_eq!(c.launch.block, [192, 1, 1], "{}", c.source);
    assert_eq!(c.launch.grid, [512, 1, 1], "{}", c.source);
    for n in 0..3 {
        let m = format!("in{n}");
        assert_eq!(loops_reading(&c.source, &m), 1, "{m}: {}", c.source);
    }
    assert_eq!(cached_arrays_in_registers(&c.source), 3);
    assert!(c.source.contains("float c0[4];"), "{}", c.source);
    // One element a thread when asked: 256 threads, 3 each.
    let scalar = cuda::fused_tuned(
        &layer_norm_backward(512, 768),
        cuda::Tuning {
            scalar_rows: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(scalar.launch.block, [256, 1, 1], "{}", scalar.source);
    assert!(scalar.source.contains("float c0[3];"), "{}", scalar.source);
    // Longer rows get bigger blocks: 3000 elements, 1024 threads, 3 elements each.
    let c = cuda::fused(&layer_norm_backward(16, 3000)).unwrap();
    assert_eq!(c.launch.block, [1024, 1, 1], "{}", c.source);
    assert!(c.source.contains("if (j < 3000u) {"), "{}", c.source);
    assert_eq!(cached_arrays_in_registers(&c.source), 3);
    // Up to 8 elements a thread with 1024 threads.
    let c = cuda::fused(&layer_norm_backward(16, 8192)).unwrap();
    assert_eq!(c.launch.block, [1024, 1, 1], "{}", c.source);
    assert!(c.source.contains("float c0[8];"), "{}", c.source);
    // Not when even a block of 1024 threads leaves too many elements a thread.
    let c = cuda::fused(&layer_norm_backward(16, 16384)).unwrap();
    assert!(!c.source.contains("[u]"), "{}", c.source);
    let c = cuda::fused(&cross_entropy(256, 50304)).unwrap();
    assert!(!c.source.contains("[u]"), "{}", c.source);
}

/// `k` generated one element a load (`Tuning::scalar_rows`), as before row vectors.
fn one_element_a_load(k: &FusedKernel) -> CudaKernel {
    cuda::fused_tuned(
        k,
        cuda::Tuning {
            scalar_rows: true,
            ..Default::default()
        },
    )
    .unwrap()
}

fn threads(t: u32) -> cuda::Tuning {
    cuda::Tuning {
        row_threads: Some(t),
        ..Default::default()
    }
}

#[test]
fn the_attention_backward_kernel_reads_each_full_input_once() {
    // GPT-2's: [8, 12, 1024, 1024] reduced over the last axis, two full loads read by four
    // loops (three passes and the outputs). A 32-lane group would keep 2 × 32 values a lane,
    // more than fit; with 98304 rows the GPU is full anyway, so a block of 128 threads per row
    // keeps 2 × 8, half the registers the cache may take.
    let k = attention_backward(8, 12, 1024);
    let c = cuda::fused(&k).unwrap();
    let src = &c.source;
    assert_eq!(c.launch.block, [128, 1, 1], "{src}");
    assert_eq!(c.launch.grid, [8 * 12 * 1024, 1, 1], "{src}");
    assert_eq!(cached_arrays_in_registers(src), 2);
    assert_eq!(src.matches("[8]; // %").count(), 2, "{src}");
    // Each full input is read in one loop only, a vector of four at a time, and kept for the
    // later loops.
    for m in ["in0", "in1"] {
        assert_eq!(loops_reading(src, m), 1, "{m}: {src}");
        assert_eq!(
            (src.matches(&format!("reinterpret_cast<const float4*>({m} + ("))
                .count()),
            1,
            "{m}: {src}"
        );
    }
    // One element a thread when asked: the same, a load an element.
    let scalar = one_element_a_load(&k).source;
    assert_eq!(scalar.matches("in0[").count(), 1, "{scalar}");
    assert_eq!(scalar.matches("in1[").count(), 1, "{scalar}");
    assert_eq!(scalar.matches("u < 8u; ++u").count(), 4, "{scalar}");
    assert_eq!(cached_arrays_in_registers(&scalar), 2);
    // Fewer rows (12 × 1024, 1.5 million threads at 128 a row): 256 threads keep 2 × 4.
    let few = cuda::fused(&attention_backward(1, 12, 1024)).unwrap();
    assert_eq!(few.launch.block, [256, 1, 1], "{}", few.source);
    assert_eq!(few.source.matches("[4]; // %").count(), 2, "{}", few.source);
    // The 4 warps of a row combine through shared memory; the row's last pass ends with a
    // barrier before any output is written (an output may be written over in0 or in1).
    assert!(src.contains("__shared__ float"), "{src}");
    let last_pass = src.rfind("// pass ").unwrap();
    let outputs = src.find("// the full outputs").unwrap();
    assert!(
        src[last_pass..outputs].contains("__syncthreads();"),
        "{src}"
    );
    assert!(!src[..outputs].contains("out0["), "{src}");
    assert!(!src[..outputs].contains("out1["), "{src}");
    // A row that is not a multiple of the block: the unrolled loops are guarded.
    let c = cuda::fused(&attention_backward(1, 2, 1000)).unwrap();
    assert_eq!(c.launch.block, [256, 1, 1], "{}", c.source);
    assert_eq!(c.source.matches("in0[").count(), 1, "{}", c.source);
    assert!(c.source.contains("if (j < 1000u) {"), "{}", c.source);
    assert_eq!(cached_arrays_in_registers(&c.source), 2);
    // The forward softmax (one load): 64 threads a row, 16 values each.
    let c = cuda::fused(&causal_softmax(96, 1024)).unwrap();
    assert_eq!(c.launch.grid[0], 96 * 1024, "{}", c.source);
    assert_eq!(c.launch.block, [64, 1, 1], "{}", c.source);
    assert!(c.source.contains("float c4[16];"), "{}", c.source);
    // Forced thread counts (for measuring) keep what fits in registers only.
    let k = attention_backward(8, 12, 1024);
    // Uncached, its loops read memory: three of them (the sum of exponentials is taken
    // online in the maximum's pass).
    let c = cuda::fused_tuned(&k, threads(32)).unwrap();
    assert_eq!(c.launch.block, [256, 1, 1], "{}", c.source);
    assert!(!c.source.contains("[u]"), "{}", c.source);
    assert_eq!(c.source.matches("in0[").count(), 3, "{}", c.source);
    let c = cuda::fused_tuned(&k, threads(128)).unwrap();
    assert_eq!(c.launch.block, [128, 1, 1], "{}", c.source);
    assert!(c.source.contains("[8]; // %"), "{}", c.source);
    assert_eq!(c, cuda::fused_tuned(&k, threads(128)).unwrap());
    // Not when the values would not fit: 16 elements a thread of two loads, 32 registers, is
    // kept; 32 a lane is not.
    let c = cuda::fused_tuned(&k, threads(64)).unwrap();
    assert!(c.source.contains("[16]; // %"), "{}", c.source);
    assert_eq!(
        cuda::fused(&k).unwrap(),
        cuda::fused_tuned(&k, threads(128)).unwrap()
    );
}

#[test]
fn outputs_are_written_in_the_final_pass_after_a_barrier() {
    // Full outputs are stored in the last loop over the row, after the barrier that ends the
    // earlier passes: that keeps outputs written over their inputs correct.
    for k in [
        softmax(64, 1000),
        softmax(64, 5000),
        layer_norm(2, 16, 768),
        cross_entropy(256, 1000),
        cross_entropy(256, 8192),
        layer_norm_backward(512, 768),
        attention_backward(2, 3, 1000),
    ] {
        let c = cuda::fused(&k).unwrap();
        let src = &c.source;
        let body = src.find(") {\n").unwrap();
        let first_store = body + src[body..].find("out").unwrap();
        let final_pass = src.find("// the full outputs").unwrap();
        assert!(first_store > final_pass, "{src}");
        // Between the last pass's loop and the outputs: a block barrier when several warps
        // share a row, a warp one when one warp's lanes do.
        let last_pass = src.rfind("// pass ").unwrap();
        let barrier = &src[last_pass..final_pass];
        if src.contains("const unsigned warp") {
            assert!(barrier.contains("__syncthreads();"), "{src}");
        } else {
            assert!(
                barrier.contains("__syncthreads();") || barrier.contains("__syncwarp();"),
                "{src}"
            );
        }
    }
}

#[test]
fn invalid_descriptions_give_errors_not_panics() {
    let good = softmax(4, 8);
    let mut bad = Vec::new();
    let mut k = good.clone();
    k.reduce_axes = vec![1, 0];
    bad.push(k);
    let mut k = good.clone();
    k.reduce_axes = vec![5];
    bad.push(k);
    let mut k = good.clone();
    k.body[1] = Inst::Reduce { op: RMax, x: 7 };
    bad.push(k);
    let mut k = good.clone();
    k.inputs[0].len = 31;
    bad.push(k);
    let mut k = good.clone();
    k.inputs[0].access.strides = vec![8];
    bad.push(k);
    let mut k = good.clone();
    k.outputs.push(Output { value: 99 });
    bad.push(k);
    let mut k = good.clone();
    k.body.push(Inst::Load { input: 3 });
    bad.push(k);
    let mut k = good.clone();
    k.domain = vec![usize::MAX, 3];
    bad.push(k);
    let mut b = B::new(&[4], &[]);
    let m = b.whole(DType::Bool);
    let m = b.load(m);
    b.bin(Add, m, m);
    bad.push(b.k.clone());
    for k in bad {
        assert!(cuda::fused(&k).is_err(), "accepted:\n{k}");
        assert!(cuda::strategy(&k).is_err());
    }
    for seed in 0..2000u64 {
        // Garbage never panics, and what does not check is refused.
        let g = random::garbage(seed);
        let made = cuda::fused(&g);
        if g.check().is_err() {
            assert!(made.is_err(), "seed {seed}: accepted\n{g}");
        }
        // Nor does a valid kernel with one thing broken.
        let mut k = random::kernel(seed, &random::Options::wide());
        random::break_one(&mut k, &mut Rng(seed));
        assert!(cuda::fused(&k).is_err(), "seed {seed}: accepted\n{k}");
    }
    assert!(cuda::scatter_add_program(DType::I64, DType::Bool, DType::Bool, 4, 4, 4).is_err());
    assert!(cuda::gather(DType::F32, DType::F32, 4, 4, 4).is_err());
    assert!(cuda::scatter_add_program(DType::Bool, DType::F32, DType::F32, 4, 4, 4).is_err());
    assert!(cuda::gather(DType::F32, DType::I64, usize::MAX, 2, 4).is_err());
    assert!(cuda::concat(DType::F32, usize::MAX, &[2, 2]).is_err());
    assert!(cuda::concat(DType::F32, 2, &[usize::MAX, 2]).is_err());
}

#[test]
fn the_prelude_and_kernels_use_no_fast_math_or_restrict() {
    assert!(!PRELUDE.contains("__restrict__"));
    assert!(!PRELUDE.contains("__expf"));
    for (name, k) in representative() {
        let c = cuda::fused(&k).unwrap();
        assert!(!c.source.contains("__restrict__"), "{name}");
        assert!(
            !c.source.contains("__expf") && !c.source.contains("__logf"),
            "{name}"
        );
    }
}

#[test]
fn reductions_over_empty_axes_are_their_identities() {
    let c = cuda::fused(&empty_rows(10)).unwrap();
    assert!(c.source.contains("const float v2 = 0.0f;"), "{}", c.source);
    assert!(
        c.source
            .contains("const float v3 = __int_as_float((int)0xff800000u);"),
        "{}",
        c.source
    );
    assert!(
        c.source.contains("const int v4 = (-2147483647 - 1);"),
        "{}",
        c.source
    );
    assert!(!c.source.contains("for (unsigned j"), "{}", c.source);
    assert!(!c.source.contains("__syncthreads"), "{}", c.source);
}

#[test]
#[ignore]
fn print_sources() {
    for (name, k) in representative() {
        let c = cuda::fused(&k).unwrap();
        if std::env::var("ONLY").map_or(true, |o| o.split(',').any(|x| x == name)) {
            println!("==== {name}\n{}", c.source);
        }
    }
}

#[test]
fn a_causal_softmax_reads_no_masked_score() {
    // GPT-2's forward attention softmax: the scores above the diagonal are replaced by the
    // lowest float before anything reads them, so the load is predicated on the mask (read
    // where `col > row` is false, 0 where true) and the mask is computed before the load.
    let k = causal_softmax(96, 1024);
    // A vector of four scores at a time: the mask is computed from indices, so a thread
    // first asks whether any lane of its vector is unmasked (`k0`) and reads the vector only
    // then; the vectors wholly above the diagonal are never read. Each lane still takes its
    // score only where the mask lets it through.
    let src = cuda::fused(&k).unwrap().source;
    assert!(src.contains("bool k0 = false;"), "{src}");
    assert!(src.contains("k0 = k0 || (!v"), "{src}");
    assert!(
        src.contains("if (k0) { l0 = *reinterpret_cast<const float4*>(in0 + ("),
        "{src}"
    );
    assert!(src.find("bool k0").unwrap() < src.find("if (k0)").unwrap());
    assert!(src.contains(" ? 0.0f : l0.x;"), "{src}");
    assert!(!src.contains("in0["), "{src}");
    // A vector whose lanes are all masked is computed apart, in every loop over the row: its
    // lanes know the mask (a constant) and read no score (its guarded 0), so what they
    // compute no longer depends on the lane and the compiler computes it once.
    let loops = src.matches("bool km = false;").count();
    assert_eq!(loops, 3, "two passes and the outputs: {src}");
    assert_eq!(src.matches("if (km) {").count(), loops, "{src}");
    for masked in src.split("else {").skip(1) {
        let lanes = &masked[..masked.find("\n      }\n").unwrap_or(masked.len())];
        assert!(lanes.contains(" = 1u;"), "{lanes}");
        assert!(!lanes.contains("l0."), "{lanes}");
        assert!(
            !lanes.contains(" > "),
            "the mask is not computed again: {lanes}"
        );
    }
    // One element a thread: each score's load predicated on its own mask.
    let src = one_element_a_load(&k).source;
    let load = src.find("in0[").unwrap();
    let line_start = src[..load].rfind('\n').unwrap();
    let line = &src[line_start..load + src[load..].find('\n').unwrap()];
    assert!(line.contains(" ? 0.0f : in0["), "{line}\n{src}");
    let cond = line
        .split('=')
        .nth(1)
        .unwrap()
        .trim()
        .split(' ')
        .next()
        .unwrap();
    let defined = src.find(&format!("unsigned char {cond} = ")).unwrap();
    assert!(defined < load, "{src}");
    // Measurable as a choice: unguarded, the same kernel reads every score.
    let plain = cuda::fused_tuned(
        &k,
        cuda::Tuning {
            unguarded_loads: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!plain.source.contains("? 0.0f : in0["), "{}", plain.source);
    assert_ne!(plain.name, cuda::fused(&k).unwrap().name);
}

#[test]
fn a_kernel_holding_bf16_divides_by_the_hardware_approximation_and_an_f32_one_exactly() {
    // The causal softmax's quotient `e / sum`: IEEE division in f32, `div.full.f32` (through
    // `ig_fdiv`) once the scores are bf16.
    let f32_src = cuda::fused(&causal_softmax(96, 1024)).unwrap().source;
    assert!(!f32_src.contains("ig_fdiv("), "{f32_src}");
    assert!(f32_src.contains(" / v"), "{f32_src}");
    let k = random::as_bf16(&causal_softmax(96, 1024));
    assert!(k.holds_bf16());
    let src = cuda::fused(&k).unwrap().source;
    assert!(src.contains("ig_fdiv(v"), "{src}");
    assert!(!src.contains(" / v"), "{src}");
    assert!(PRELUDE_BF16.contains("div.full.f32"));
    assert!(cuda::prelude_for([&cuda::fused(&k).unwrap()]).contains("ig_fdiv"));
}

#[test]
fn a_kernel_holding_bf16_takes_exp_by_the_hardware_approximation_and_an_f32_one_by_expf() {
    // gpt2's cross-entropy shape: in f32 every exponential (the online sum's terms and
    // rescales, the output loop's probabilities) is CUDA's `expf`; once the logits are bf16,
    // every one is the prelude's `ig_exp` (`ex2.approx`), and the module carries it.
    let f32_src = cuda::fused(&cross_entropy(256, 50304)).unwrap().source;
    assert!(f32_src.contains("expf(ox"), "{f32_src}");
    assert!(!f32_src.contains("ig_exp("), "{f32_src}");
    let k = cross_entropy_of(256, 50304, DType::BF16);
    assert!(k.holds_bf16());
    let c = cuda::fused(&k).unwrap();
    assert!(c.source.contains("ig_exp(ox"), "{}", c.source);
    assert!(c.source.contains("* ig_exp(o"), "{}", c.source);
    assert!(!c.source.contains("expf("), "{}", c.source);
    // Every value bf16: each exponential rounded, still through `ig_exp`.
    let all = cuda::fused(&random::as_bf16(&cross_entropy(256, 50304))).unwrap();
    assert!(all.source.contains("ig_round(ig_exp("), "{}", all.source);
    assert!(!all.source.contains("expf("), "{}", all.source);
    assert!(PRELUDE_BF16.contains("ex2.approx.f32"));
    assert!(cuda::prelude_for([&c]).contains("float ig_exp("));
}

#[test]
fn a_mask_that_keeps_where_its_condition_holds_is_known_false_in_a_masked_vector() {
    // `select(col <= row, x, lowest)`: the score is needed where the condition is true, so a
    // vector none of whose lanes passes knows the condition is 0 there.
    let (k, keep) = masked_softmax(96, 1024, CmpOp::Le, true);
    let src = cuda::fused(&k).unwrap().source;
    assert!(src.contains("k0 = k0 || (v"), "{src}");
    assert!(src.contains("if (km) {"), "{src}");
    let masked = src.split("else {").nth(1).unwrap();
    assert!(
        masked.contains(&format!("const unsigned char v{keep} = 0u;")),
        "{masked}"
    );
    if !syntax_check("mask_kept_where_true", &[cuda::fused(&k).unwrap()]) {
        eprintln!("skipped the syntax check: no host C++ compiler");
    }
}

#[test]
fn a_vector_masked_by_a_loaded_mask_is_read_whole_beside_the_mask() {
    // The same softmax with its mask read from memory (a bool input): waiting for the mask
    // before the scores' load measured slower (see `loop_vectors`), so the scores' vector is
    // read unconditionally and each lane drops its masked score.
    let mut b = B::new(&[96, 1024, 1024], &[2]);
    let mask = b.whole(DType::Bool);
    let x = b.whole(DType::F32);
    let masked = b.load(mask);
    let lowest = b.konst_of(-3.4028234663852886e38, DType::F32);
    let x = b.load(x);
    let v = b.push(Inst::Select {
        cond: masked,
        a: lowest,
        b: x,
    });
    let (_, _, y) = softmax_of(&mut b, v);
    let src = cuda::fused(&b.out(y).done()).unwrap().source;
    assert!(!src.contains("if (k1)"), "{src}");
    assert!(
        src.contains("const float4 l1 = *reinterpret_cast<const float4*>(in1 + ("),
        "{src}"
    );
    assert!(src.contains(" ? 0.0f : l1.x;"), "{src}");
}

#[test]
fn the_cross_entropy_pick_reads_only_the_target_logit() {
    // Pass 3 sums `select(j == target, x - max - log(sum), 0)`: in that pass the logits are
    // read only at the target. The max and the sum (pass 1, the sum taken online) and the
    // gradient (the outputs) need every logit, so those read every element (four at a time).
    let src = cuda::fused(&cross_entropy(8192, 50304)).unwrap().source;
    let scalar: Vec<&str> = src.lines().filter(|l| l.contains("in0[")).collect();
    assert_eq!(scalar.len(), 1, "{src}");
    assert!(scalar[0].contains(" ? in0["), "{src}");
    assert_eq!(
        src.matches("reinterpret_cast<const float4*>(in0").count(),
        2,
        "{src}"
    );
    let pass3 = src.find("// pass 3").unwrap();
    let outputs = src.find("// the full outputs").unwrap();
    assert!(src[pass3..outputs].contains(" ? in0["), "{src}");
}

#[test]
fn guarded_kernels_pass_the_host_syntax_check() {
    let kernels: Vec<CudaKernel> = [causal_softmax(4, 100), cross_entropy(8, 1000)]
        .iter()
        .map(|k| cuda::fused(k).unwrap())
        .collect();
    if !syntax_check("guarded", &kernels) {
        eprintln!("skipped: no host C++ compiler for the syntax check");
    }
}

#[test]
fn a_row_too_long_for_the_register_cache_is_read_and_written_four_elements_a_thread() {
    // GPT-2's cross-entropy: rows of 50,304 logits, read from memory by every loop; 16 bytes
    // a vector: four f32, or eight bf16 (two to each 32-bit component).
    for dtype in [DType::F32, DType::BF16] {
        let k = match dtype {
            DType::BF16 => random::as_bf16(&cross_entropy(64, 50304)),
            _ => cross_entropy(64, 50304),
        };
        let src = cuda::fused(&k).unwrap().source;
        let (v, width) = if dtype == DType::BF16 {
            ("uint4", 8)
        } else {
            ("float4", 4)
        };
        // The passes over every logit and the output loop read them as vectors (two loops
        // where the sum is taken online, in f32; three in the bf16 copy, where it is not)...
        let loads = format!("*reinterpret_cast<const {v}*>(in0 + (b0 + jb))");
        let want = if dtype == DType::BF16 { 3 } else { 2 };
        assert_eq!(src.matches(&loads).count(), want, "{src}");
        let vectors = 50304 / width;
        assert!(
            src.contains(&format!("jv < {vectors}u; jv += 1024u")),
            "{src}"
        );
        // ...each lane in its own scope, and the gradient goes out as vectors.
        let (last, stored) = if dtype == DType::BF16 {
            ("r1[7] = ", "make_uint4(")
        } else {
            ("r1.w = ", "r1;")
        };
        assert!(src.contains(last), "{src}");
        assert!(
            src.contains(&format!(
                "*reinterpret_cast<{v}*>(out1 + (bo + jb)) = {stored}"
            )),
            "{src}"
        );
        // The pass that reads only the target's logit keeps its guarded scalar load.
        assert!(
            src.contains("? ig_widen(in0[b0 + j])") || src.contains("? in0[b0 + j]"),
            "{src}"
        );
        // One element a thread when asked, or when the row is not a multiple of four.
        let scalar = one_element_a_load(&k).source;
        assert!(!scalar.contains("jv"), "{scalar}");
    }
    assert!(!cuda::fused(&cross_entropy(64, 50257))
        .unwrap()
        .source
        .contains("jv"));
    // Rows the register cache holds keep their unrolled loops.
    assert!(!cuda::fused(&softmax(8192, 1024))
        .unwrap()
        .source
        .contains("jv"));
}

#[test]
fn a_row_kernels_final_loop_reads_its_loads_before_its_first_store() {
    // An output may be written over an input; a load issued after a store to the same row
    // waits for that store (gpt2's tf32 LayerNorm backward: 197 µs, 63 µs with its loads
    // first). With the register cache, every load of the final loop comes before its stores.
    // (An element `in0[..]` or a vector `in0 + (..)`.)
    let load = |s: &str| {
        s.match_indices("in").any(|(at, _)| {
            let rest = &s[at + 2..];
            let d = rest.chars().take_while(|c| c.is_ascii_digit()).count();
            d > 0 && (rest[d..].starts_with('[') || rest[d..].starts_with(" + ("))
        })
    };
    let c = cuda::fused(&layer_norm_backward_into_residual(512, 768)).unwrap();
    let src = &c.source;
    let last_pass = src.rfind("// pass ").unwrap();
    let first_store = last_pass
        + (src[last_pass..].find("out0["))
            .or_else(|| src[last_pass..].find("(out0 + ("))
            .unwrap();
    assert!(
        src[last_pass..first_store].contains("// the final loop's loads"),
        "{src}"
    );
    assert!(load(&src[last_pass..first_store]), "{src}");
    assert!(!load(&src[first_store..]), "{src}");
    // Rows too long for the cache keep the plain loop (reading ahead measured slower there).
    let c = cuda::fused(&cross_entropy(256, 50304)).unwrap();
    assert!(
        !c.source.contains("// the final loop's loads"),
        "{}",
        c.source
    );
}

#[test]
fn a_long_rows_sum_of_exponentials_is_taken_online_in_the_maximums_pass() {
    // A cross-entropy over rows of 50304 (too long for the register cache): the second pass
    // has no loop over the row; each thread's sum is brought from its own running maximum to
    // the row's before the threads combine. Rows kept in registers keep their second pass.
    let src = cuda::fused(&cross_entropy(256, 50304)).unwrap().source;
    let (p2, p3) = (
        src.find("// pass 2").unwrap(),
        src.find("// pass 3").unwrap(),
    );
    assert!(!src[p2..p3].contains("for (unsigned j"), "{src}");
    assert!(src[p2..p3].contains("expf(o"), "{src}");
    // Four elements at a time: one rescale a vector, from the maximum before its lanes.
    let p1 = src.find("// pass 1").unwrap();
    assert!(src[p1..p2].contains("const float om"), "{src}");
    assert!(src[p1..p2].contains("expf(ox"), "{src}");
    // One element a thread: the rescale at every element.
    let scalar = cuda::fused_tuned(
        &cross_entropy(256, 50304),
        cuda::Tuning {
            scalar_rows: true,
            ..Default::default()
        },
    )
    .unwrap()
    .source;
    let (p1, p2) = (
        scalar.find("// pass 1").unwrap(),
        scalar.find("// pass 2").unwrap(),
    );
    assert!(
        scalar[p1..p2].contains("const float mn = ig_keep_max("),
        "{scalar}"
    );
    let short = cuda::fused(&softmax(64, 1000)).unwrap().source;
    assert!(
        !short.contains("const float mn") && !short.contains("const float om"),
        "{short}"
    );
}

/// A warp a row (for measuring, `Tuning { row_threads: 32, cache_words: 96 }`): a causal
/// softmax over rows of 1024 keeps each lane's 32 elements in registers, read as vectors
/// (8 bf16 or bool, 4 f32), eight rows a block of 256; the lanes combine by shuffles alone,
/// and a group whose row is past the last (`ok` false) writes nothing.
#[test]
fn a_warp_a_row_caches_its_lanes_elements_in_vectors() {
    let tuning = cuda::Tuning {
        row_threads: Some(32),
        cache_words: Some(96),
        ..Default::default()
    };
    for (k, vector) in [
        (causal_softmax(100, 1024), "float4"),
        (attention_backward(1, 3, 1024), "float4"),
        (random::as_bf16(&causal_softmax(100, 1024)), "uint4"),
    ] {
        let c = cuda::fused_tuned(&k, tuning).unwrap();
        let src = &c.source;
        assert_eq!(c.launch.block, [256, 1, 1], "{src}");
        assert!(src.contains("[32]; // %"), "{src}");
        assert!(
            src.contains(&format!("= *reinterpret_cast<const {vector}*>(in0 + (")),
            "{src}"
        );
        assert_eq!(loops_reading(src, "in0"), 1, "{src}");
        assert!(!src.contains("__syncthreads"), "{src}");
        assert!(src.contains("if (ok) {"), "{src}");
        cached_arrays_in_registers(src);
        // The default keeps a block a row.
        let default = cuda::fused(&k).unwrap().source;
        assert!(!default.contains("const unsigned rr = "), "{default}");
        syntax_check("warp_a_row", &[c]);
    }
}

/// Rows each thread of a column kernel takes, as its header says ("W rows a thread",
/// kernels/src/cuda/fused/colvec.rs), else 1.
fn rows_a_thread(source: &str) -> usize {
    source
        .split(" rows a thread")
        .next()
        .filter(|head| head.len() < source.len())
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|w| w.parse().ok())
        .unwrap_or(1)
}
