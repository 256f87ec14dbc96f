//! Hand-written fused kernels of a training step (softmax, layer norm, cross-entropy, column
//! sums, an AdamW-like update), each ONE kernel, checked against straightforward Rust loops that
//! compute the textbook formulas; running in place; the text listing.

use ingot_kernels::fused::{cpu, FusedKernel, Inst, Output};
use ingot_kernels::{CmpOp, DType, ReduceOp, UnaryOp};
// Kernels are built with the kernel tests' one builder.
use ingot_testkit::kernel_builder::KernelBuilder as B;

// ---------------------------------------------------------------------------------------------
// Data and comparisons.

/// Deterministic values in about [-scale, scale] (`2u - 1` is exact in f32 for the 24-bit
/// draws, so each value is the f32 product of the draw and `scale`).
fn data(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut g = ingot_testkit::lcg::Lcg::mixed(seed);
    (0..n)
        .map(|_| (g.unit24() * 2.0 - 1.0) as f32 * scale)
        .collect()
}

fn bytes_f32(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

fn bytes_i32(x: &[i32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

fn run(k: &FusedKernel, inputs: &[Vec<u8>]) -> Vec<Vec<f32>> {
    let refs: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    cpu::run_buffers(k, &refs)
        .unwrap_or_else(|e| panic!("run failed: {e}\n{k}"))
        .iter()
        .map(|b| f32s(b))
        .collect()
}

/// `got` agrees with the f64 textbook values to `tol`, relative to the larger of 1 and |want|.
fn assert_close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs() / w.abs().max(1.0);
        assert!(
            err <= tol,
            "{what}[{i}]: got {g}, textbook {w} (error {err:e})"
        );
    }
}

fn softmax_kernel(r: usize, n: usize) -> FusedKernel {
    let mut b = B::new(&[r, n], &[1]);
    let xi = b.whole(DType::F32);
    let x = b.load(xi);
    let m = b.max(x);
    let d = b.sub(x, m);
    let e = b.un(UnaryOp::Exp, d);
    let s = b.sum(e);
    let y = b.div(e, s);
    b.out(y);
    b.done()
}

fn softmax_textbook(x: &[f32], r: usize, n: usize) -> Vec<f64> {
    let mut y = vec![0.0; r * n];
    for i in 0..r {
        let row = &x[i * n..(i + 1) * n];
        let m = row.iter().fold(f64::NEG_INFINITY, |a, &v| a.max(v as f64));
        let s: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
        for j in 0..n {
            y[i * n + j] = (row[j] as f64 - m).exp() / s;
        }
    }
    y
}

// ---------------------------------------------------------------------------------------------
// Softmax.

#[test]
fn softmax_kernel_matches_the_textbook_formula() {
    // 300 columns: a row spans two chunks of lanes and ends in a partial chunk.
    for &(r, n) in &[(5, 300), (3, 7), (1, 1), (4, 256)] {
        let k = softmax_kernel(r, n);
        let x = data(r * n, 1, 8.0);
        let y = run(&k, &[bytes_f32(&x)]);
        assert_close("softmax", &y[0], &softmax_textbook(&x, r, n), 1e-6);
    }
}

#[test]
fn softmax_backward_kernel_matches_the_textbook_formula() {
    // dx = dy·y − y·Σ(dy·y), one kernel over [r, n] reducing axis 1.
    let (r, n) = (6, 129);
    let mut b = B::new(&[r, n], &[1]);
    let (yi, dyi) = (b.whole(DType::F32), b.whole(DType::F32));
    let y = b.load(yi);
    let dy = b.load(dyi);
    let p = b.mul(dy, y);
    let s = b.sum(p);
    let t = b.mul(y, s);
    let dx = b.sub(p, t);
    b.out(dx);
    let k = b.done();

    let x = data(r * n, 2, 4.0);
    let yv: Vec<f32> = softmax_textbook(&x, r, n)
        .iter()
        .map(|&v| v as f32)
        .collect();
    let dyv = data(r * n, 3, 1.0);
    let got = run(&k, &[bytes_f32(&yv), bytes_f32(&dyv)]);
    let mut want = vec![0.0; r * n];
    for i in 0..r {
        let dot: f64 = (0..n)
            .map(|j| dyv[i * n + j] as f64 * yv[i * n + j] as f64)
            .sum();
        for j in 0..n {
            let (yy, dd) = (yv[i * n + j] as f64, dyv[i * n + j] as f64);
            want[i * n + j] = yy * (dd - dot);
        }
    }
    assert_close("softmax backward", &got[0], &want, 1e-6);
}

// ---------------------------------------------------------------------------------------------
// Layer norm.

const EPS: f64 = 1e-5;

#[test]
fn layer_norm_forward_kernel_matches_the_textbook_formula_with_mean_and_rstd_outputs() {
    let (r, n) = (7, 300);
    let mut b = B::new(&[r, n], &[1]);
    let xi = b.whole(DType::F32);
    let gi = b.input(DType::F32, &[0, 1]); // gain [n], broadcast over rows
    let bi = b.input(DType::F32, &[0, 1]); // bias [n]
    let x = b.load(xi);
    let nn = b.konst(n as f64);
    let sx = b.sum(x);
    let mean = b.div(sx, nn);
    let d = b.sub(x, mean);
    let d2 = b.mul(d, d);
    let sd2 = b.sum(d2);
    let var = b.div(sd2, nn);
    let eps = b.konst(EPS);
    let ve = b.add(var, eps);
    let sq = b.un(UnaryOp::Sqrt, ve);
    let rstd = b.un(UnaryOp::Recip, sq);
    let xhat = b.mul(d, rstd);
    let g = b.load(gi);
    let bb = b.load(bi);
    let yg = b.mul(xhat, g);
    let y = b.add(yg, bb);
    b.out(y);
    b.out(mean);
    b.out(rstd);
    let k = b.done();
    assert_eq!(k.output_dims(0), vec![r, n]);
    assert_eq!(k.output_dims(1), vec![r, 1]);
    assert_eq!(k.output_len(2), r);

    let x = data(r * n, 4, 3.0);
    let x: Vec<f32> = x
        .iter()
        .enumerate()
        .map(|(i, v)| v + (i / n) as f32)
        .collect();
    let g = data(n, 5, 1.0);
    let bias = data(n, 6, 1.0);
    let got = run(&k, &[bytes_f32(&x), bytes_f32(&g), bytes_f32(&bias)]);
    let (mut wy, mut wm, mut wr) = (vec![0.0; r * n], vec![0.0; r], vec![0.0; r]);
    for i in 0..r {
        let row = &x[i * n..(i + 1) * n];
        let m = row.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
        let var = row.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / n as f64;
        let rs = 1.0 / (var + EPS).sqrt();
        wm[i] = m;
        wr[i] = rs;
        for j in 0..n {
            wy[i * n + j] = (row[j] as f64 - m) * rs * g[j] as f64 + bias[j] as f64;
        }
    }
    assert_close("y", &got[0], &wy, 1e-5);
    assert_close("mean", &got[1], &wm, 1e-6);
    assert_close("rstd", &got[2], &wr, 1e-5);
}

#[test]
fn layer_norm_backward_kernel_matches_the_textbook_formula() {
    // dx = rstd · (dy·g − mean(dy·g) − x̂ · mean(dy·g · x̂)), x̂ = (x − mean)·rstd, with mean and
    // rstd saved by the forward pass (row-level loads: stride 0 along the reduced axis).
    let (r, n) = (5, 200);
    let mut b = B::new(&[r, n], &[1]);
    let xi = b.whole(DType::F32);
    let dyi = b.whole(DType::F32);
    let gi = b.input(DType::F32, &[0, 1]);
    let mi = b.input(DType::F32, &[1, 0]);
    let ri = b.input(DType::F32, &[1, 0]);
    let x = b.load(xi);
    let mean = b.load(mi);
    let rstd = b.load(ri);
    let d = b.sub(x, mean);
    let xhat = b.mul(d, rstd);
    let dy = b.load(dyi);
    let g = b.load(gi);
    let dyg = b.mul(dy, g);
    let nn = b.konst(n as f64);
    let s1 = b.sum(dyg);
    let a = b.div(s1, nn);
    let p = b.mul(dyg, xhat);
    let s2 = b.sum(p);
    let c = b.div(s2, nn);
    let t1 = b.sub(dyg, a);
    let t2 = b.mul(xhat, c);
    let t3 = b.sub(t1, t2);
    let dx = b.mul(t3, rstd);
    b.out(dx);
    let k = b.done();
    assert!(k.is_row_level(mean) && k.is_row_level(a) && !k.is_row_level(xhat));

    let x = data(r * n, 7, 2.0);
    let dy = data(r * n, 8, 1.0);
    let g = data(n, 9, 1.5);
    let (mut mv, mut rv) = (vec![0f32; r], vec![0f32; r]);
    for i in 0..r {
        let row = &x[i * n..(i + 1) * n];
        let m = row.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
        let var = row.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / n as f64;
        mv[i] = m as f32;
        rv[i] = (1.0 / (var + EPS).sqrt()) as f32;
    }
    let got = run(
        &k,
        &[
            bytes_f32(&x),
            bytes_f32(&dy),
            bytes_f32(&g),
            bytes_f32(&mv),
            bytes_f32(&rv),
        ],
    );
    let mut want = vec![0.0; r * n];
    for i in 0..r {
        let (m, rs) = (mv[i] as f64, rv[i] as f64);
        let xh: Vec<f64> = (0..n).map(|j| (x[i * n + j] as f64 - m) * rs).collect();
        let dg: Vec<f64> = (0..n).map(|j| dy[i * n + j] as f64 * g[j] as f64).collect();
        let a = dg.iter().sum::<f64>() / n as f64;
        let c = dg.iter().zip(&xh).map(|(p, q)| p * q).sum::<f64>() / n as f64;
        for j in 0..n {
            want[i * n + j] = rs * (dg[j] - a - xh[j] * c);
        }
    }
    assert_close("layer norm dx", &got[0], &want, 1e-5);
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy.

/// Loss per row: log Σ exp(x) − x[target], the target picked by `index == target` with the
/// target loaded at stride 0 along the class axis. Returns the kernel and the instructions for
/// the backward variant.
fn cross_entropy(r: usize, c: usize, backward: bool) -> FusedKernel {
    let mut b = B::new(&[r, c], &[1]);
    let xi = b.whole(DType::F32);
    let ti = b.input(DType::I32, &[1, 0]);
    let x = b.load(xi);
    let m = b.max(x);
    let d = b.sub(x, m);
    let e = b.un(UnaryOp::Exp, d);
    let s = b.sum(e);
    let cls = b.push(Inst::Index {
        axis: 1,
        dtype: DType::I32,
    });
    let t = b.load(ti);
    let hit = b.push(Inst::Compare {
        op: CmpOp::Eq,
        a: cls,
        b: t,
    });
    if backward {
        // softmax − one-hot, scaled by 1/r (the mean over rows).
        let p = b.div(e, s);
        let oh = b.push(Inst::Convert {
            x: hit,
            to: DType::F32,
        });
        let g = b.sub(p, oh);
        let scale = b.konst(1.0 / r as f64);
        let gs = b.mul(g, scale);
        b.out(gs);
    } else {
        let ls = b.un(UnaryOp::Log, s);
        let lse = b.add(ls, m);
        let zero = b.konst(0.0);
        let picked = b.push(Inst::Select {
            cond: hit,
            a: x,
            b: zero,
        });
        let xt = b.sum(picked);
        let loss = b.sub(lse, xt);
        b.out(loss);
    }
    b.done()
}

#[test]
fn cross_entropy_forward_kernel_is_log_sum_exp_minus_the_target_logit() {
    let (r, c) = (9, 333);
    let k = cross_entropy(r, c, false);
    assert_eq!(k.output_dims(0), vec![r, 1]);
    let x = data(r * c, 10, 6.0);
    let t: Vec<i32> = (0..r).map(|i| ((i * 37 + 5) % c) as i32).collect();
    let got = run(&k, &[bytes_f32(&x), bytes_i32(&t)]);
    let want: Vec<f64> = (0..r)
        .map(|i| {
            let row = &x[i * c..(i + 1) * c];
            let m = row.iter().fold(f64::NEG_INFINITY, |a, &v| a.max(v as f64));
            let lse = m + row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
            lse - row[t[i] as usize] as f64
        })
        .collect();
    assert_close("loss", &got[0], &want, 1e-5);
}

#[test]
fn cross_entropy_backward_kernel_is_softmax_minus_one_hot() {
    let (r, c) = (4, 50);
    let k = cross_entropy(r, c, true);
    let x = data(r * c, 11, 5.0);
    let t: Vec<i32> = vec![0, 49, 17, 3];
    let got = run(&k, &[bytes_f32(&x), bytes_i32(&t)]);
    let sm = softmax_textbook(&x, r, c);
    let want: Vec<f64> = (0..r * c)
        .map(|e| {
            let one = (e % c == t[e / c] as usize) as u8 as f64;
            (sm[e] - one) / r as f64
        })
        .collect();
    assert_close("dlogits", &got[0], &want, 1e-6);
}

// ---------------------------------------------------------------------------------------------
// Reductions over leading axes, and agreement with the unfused reduce.

#[test]
fn a_column_sum_and_max_over_axis_0_equal_row_major_loops_bit_for_bit() {
    let (r, c) = (300, 37);
    let mut b = B::new(&[r, c], &[0]);
    let xi = b.whole(DType::F32);
    let x = b.load(xi);
    let s = b.sum(x);
    let m = b.max(x);
    let x2 = b.mul(x, x);
    let s2 = b.sum(x2);
    b.out(s);
    b.out(m);
    b.out(s2);
    let k = b.done();
    assert_eq!(k.output_dims(0), vec![1, c]);
    let x = data(r * c, 12, 10.0);
    let got = run(&k, &[bytes_f32(&x)]);
    let (mut ws, mut wm, mut ws2) = (vec![0f64; c], vec![f32::NEG_INFINITY; c], vec![0f64; c]);
    for i in 0..r {
        for j in 0..c {
            let v = x[i * c + j];
            ws[j] += v as f64;
            wm[j] = if v > wm[j] { v } else { wm[j] };
            ws2[j] += (v * v) as f64;
        }
    }
    // The sums cascade (300 terms: groups of 64), as the unfused reduce does, bit for bit.
    let unfused = |x: &[f32]| {
        let mut o = vec![0f32; c];
        ingot_kernels::cpu::reduce(
            ingot_kernels::cpu::ReduceKind::Sum,
            x,
            &[r, c],
            &[0],
            &mut o,
        );
        o
    };
    let sq: Vec<f32> = x.iter().map(|v| v * v).collect();
    assert_eq!(got[0], unfused(&x));
    assert_eq!(got[2], unfused(&sq));
    // 300 terms of up to 10 in magnitude: f32 rounding of the partial sums is ~1e-5.
    assert_close("column sum", &got[0], &ws, 1e-4);
    assert_close("column sum of squares", &got[2], &ws2, 1e-6);
    assert_eq!(got[1], wm);
}

#[test]
fn a_sum_over_batch_and_time_of_b_t_c_equals_row_major_loops_bit_for_bit() {
    let (bt, t, c) = (3, 5, 300);
    let mut b = B::new(&[bt, t, c], &[0, 1]);
    let xi = b.whole(DType::F32);
    let x = b.load(xi);
    let s = b.sum(x);
    // A full output too: x minus its column mean.
    let n = b.konst((bt * t) as f64);
    let mean = b.div(s, n);
    let centered = b.sub(x, mean);
    b.out(s);
    b.out(centered);
    let k = b.done();
    assert_eq!(k.output_dims(0), vec![1, 1, c]);
    let x = data(bt * t * c, 13, 3.0);
    let got = run(&k, &[bytes_f32(&x)]);
    let mut ws = vec![0f32; c];
    for i in 0..bt * t {
        for j in 0..c {
            ws[j] += x[i * c + j];
        }
    }
    assert_eq!(got[0], ws);
    let wc: Vec<f32> = (0..bt * t * c)
        .map(|e| x[e] - ws[e % c] / (bt * t) as f32)
        .collect();
    assert_eq!(got[1], wc);
}

#[test]
fn fused_reductions_give_the_bits_of_the_unfused_reduce() {
    use ingot_kernels::cpu::{reduce, ReduceKind};
    let shapes: &[(&[usize], &[usize])] = &[
        (&[7, 300], &[1]),
        (&[300, 7], &[0]),
        (&[3, 4, 100], &[0, 2]),
        (&[3, 4, 100], &[1, 2]),
        (&[3, 4, 100], &[0, 1]),
        (&[2, 3, 4, 5], &[0, 2]),
        (&[2, 1, 260], &[1, 2]),
        (&[1, 9], &[0]),
        (&[5, 0], &[1]),
        (&[1000], &[0]),
    ];
    for &(dims, axes) in shapes {
        let n: usize = dims.iter().product();
        // Zeros of both signs and ties, so the order of max matters too.
        let x: Vec<f32> = data(n, 14, 4.0)
            .iter()
            .enumerate()
            .map(|(i, &v)| match i % 5 {
                0 => 0.0,
                1 => -0.0,
                _ => v,
            })
            .collect();
        for (op, kind) in [
            (ReduceOp::Sum, ReduceKind::Sum),
            (ReduceOp::Max, ReduceKind::Max),
        ] {
            let mut b = B::new(dims, axes);
            let xi = b.whole(DType::F32);
            let l = b.load(xi);
            let neg = b.un(UnaryOp::Neg, l); // −x, so max meets −0.0 and 0.0 ties
            let red = b.push(Inst::Reduce { op, x: neg });
            b.out(red);
            let k = b.done();
            let got = run(&k, &[bytes_f32(&x)]);
            let negx: Vec<f32> = x.iter().map(|v| -v).collect();
            let mut want = vec![0f32; k.output_len(0)];
            reduce(kind, &negx, dims, axes, &mut want);
            let gb: Vec<u32> = got[0].iter().map(|v| v.to_bits()).collect();
            let wb: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
            assert_eq!(gb, wb, "{op:?} of {dims:?} over {axes:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// In place.

/// Runs `k` in one arena; `over[j] = Some(n)` puts output `j` on input `n`'s memory. With
/// `odd`, every offset is odd (so not even 4-aligned: values are copied in and out), otherwise
/// 64-aligned in memory (contiguous loads are read in place).
fn run_arena(
    k: &FusedKernel,
    inputs: &[Vec<u8>],
    over: &[Option<usize>],
    odd: bool,
) -> Vec<Vec<u8>> {
    let round = |x: usize| if odd { x + 7 } else { x.div_ceil(64) * 64 };
    let mut at = if odd { 3 } else { 0 };
    let mut ins = vec![];
    for b in inputs {
        ins.push(at);
        at = round(at + b.len());
    }
    let mut outs = vec![];
    for (j, o) in over.iter().enumerate() {
        match o {
            Some(n) => {
                assert!(
                    k.can_write_over(*n, j),
                    "output {j} may not go over input {n}"
                );
                outs.push(ins[*n]);
            }
            None => {
                outs.push(at);
                at = round(at + k.output_len(j) * k.output_dtype(j).size());
            }
        }
    }
    let scratch = at + 1;
    let mut mem = vec![0xAAu8; 64 + scratch + cpu::scratch_bytes(k)];
    let base = (64 - mem.as_ptr() as usize % 64) % 64;
    let mem = &mut mem[base..];
    for (&o, b) in ins.iter().zip(inputs) {
        mem[o..o + b.len()].copy_from_slice(b);
    }
    cpu::run(k, mem, &ins, &outs, scratch).unwrap();
    (0..k.outputs.len())
        .map(|j| {
            let n = k.output_len(j) * k.output_dtype(j).size();
            mem[outs[j]..outs[j] + n].to_vec()
        })
        .collect()
}

/// The outputs in place (`over`) equal the outputs apart, at aligned and at odd offsets.
fn in_place_equals_apart(
    k: &FusedKernel,
    inputs: &[Vec<u8>],
    over: &[Option<usize>],
) -> Vec<Vec<u8>> {
    let apart = run_arena(k, inputs, &vec![None; over.len()], false);
    for odd in [false, true] {
        assert_eq!(
            run_arena(k, inputs, over, odd),
            apart,
            "in place, odd offsets: {odd}"
        );
        assert_eq!(run_arena(k, inputs, &vec![None; over.len()], odd), apart);
    }
    apart
}

#[test]
fn softmax_written_over_its_input_equals_the_out_of_place_result() {
    for &(r, n) in &[(6, 300), (4, 8)] {
        let k = softmax_kernel(r, n);
        assert!(k.can_write_over(0, 0));
        let x = vec![bytes_f32(&data(r * n, 15, 5.0))];
        let apart = in_place_equals_apart(&k, &x, &[Some(0)]);
        assert_eq!(apart[0], bytes_f32(&run(&k, &x)[0]));
    }
}

#[test]
fn an_adamw_update_with_each_output_over_its_own_input_equals_the_out_of_place_result() {
    let n = 1000;
    let (lr, b1, b2, eps, wd) = (1e-3, 0.9, 0.999, 1e-8, 0.01);
    let mut b = B::new(&[n], &[]);
    let (pi, mi, vi, gi) = (
        b.whole(DType::F32),
        b.whole(DType::F32),
        b.whole(DType::F32),
        b.whole(DType::F32),
    );
    let p = b.load(pi);
    let m = b.load(mi);
    let v = b.load(vi);
    let g = b.load(gi);
    let cb1 = b.konst(b1);
    let c1b1 = b.konst(1.0 - b1);
    let cb2 = b.konst(b2);
    let c1b2 = b.konst(1.0 - b2);
    let t1 = b.mul(cb1, m);
    let t2 = b.mul(c1b1, g);
    let m2 = b.add(t1, t2);
    let gg = b.mul(g, g);
    let t3 = b.mul(cb2, v);
    let t4 = b.mul(c1b2, gg);
    let v2 = b.add(t3, t4);
    let sq = b.un(UnaryOp::Sqrt, v2);
    let ce = b.konst(eps);
    let den = b.add(sq, ce);
    let upd = b.div(m2, den);
    let cwd = b.konst(wd);
    let decay = b.mul(cwd, p);
    let step = b.add(upd, decay);
    let clr = b.konst(lr);
    let delta = b.mul(clr, step);
    let p2 = b.sub(p, delta);
    b.out(p2);
    b.out(m2);
    b.out(v2);
    let k = b.done();
    let ins = vec![
        bytes_f32(&data(n, 16, 1.0)),
        bytes_f32(&data(n, 17, 0.1)),
        bytes_f32(
            &data(n, 18, 0.01)
                .iter()
                .map(|x| x.abs())
                .collect::<Vec<_>>(),
        ),
        bytes_f32(&data(n, 19, 1.0)),
    ];
    let apart = in_place_equals_apart(&k, &ins, &[Some(0), Some(1), Some(2)]);
    // And the update is the textbook one.
    let (p0, m0, v0, g0) = (f32s(&ins[0]), f32s(&ins[1]), f32s(&ins[2]), f32s(&ins[3]));
    let want: Vec<f64> = (0..n)
        .map(|i| {
            let m = b1 * m0[i] as f64 + (1.0 - b1) * g0[i] as f64;
            let v = b2 * v0[i] as f64 + (1.0 - b2) * (g0[i] as f64).powi(2);
            p0[i] as f64 - lr * (m / (v.sqrt() + eps) + wd * p0[i] as f64)
        })
        .collect();
    assert_close("p", &f32s(&apart[0]), &want, 1e-6);
}

#[test]
fn centering_columns_over_its_input_equals_the_out_of_place_result() {
    // Reduce axis 0 of [r, c]: the lanes run along the kept axis, passes walk the rows.
    let (r, c) = (50, 300);
    let mut b = B::new(&[r, c], &[0]);
    let xi = b.whole(DType::F32);
    let x = b.load(xi);
    let s = b.sum(x);
    let n = b.konst(r as f64);
    let mean = b.div(s, n);
    let y = b.sub(x, mean);
    b.out(y);
    b.out(mean);
    let k = b.done();
    assert!(k.can_write_over(0, 0) && !k.can_write_over(0, 1));
    let ins = vec![bytes_f32(&data(r * c, 20, 2.0))];
    in_place_equals_apart(&k, &ins, &[Some(0), None]);
}

#[test]
fn can_write_over_allows_only_an_input_read_at_the_outputs_own_index() {
    let mut b = B::new(&[4, 6], &[1]);
    let x = b.whole(DType::F32); // 0: contiguous
    let t = b.input(DType::F32, &[1, 4]); // 1: transposed
    let bc = b.input(DType::F32, &[0, 1]); // 2: broadcast
    let i = b.whole(DType::I32); // 3: same size, other dtype
    let d = b.whole(DType::F64); // 4: other size
    let lx = b.load(x);
    let lt = b.load(t);
    let lb = b.load(bc);
    let li = b.load(i);
    let ld = b.load(d);
    let s1 = b.add(lx, lt);
    let s2 = b.add(s1, lb);
    let conv = b.push(Inst::Convert {
        x: li,
        to: DType::F32,
    });
    let s3 = b.add(s2, conv);
    let cd = b.push(Inst::Convert {
        x: ld,
        to: DType::F32,
    });
    let full = b.add(s3, cd);
    let row = b.sum(full);
    b.out(full);
    b.out(row);
    let mut k = b.done();
    assert!(k.can_write_over(0, 0));
    assert!(!k.can_write_over(1, 0), "transposed");
    assert!(!k.can_write_over(2, 0), "broadcast");
    assert!(k.can_write_over(3, 0), "i32 has f32's size");
    assert!(!k.can_write_over(4, 0), "f64 is wider");
    assert!(!k.can_write_over(0, 1), "a row-level output");
    assert!(!k.can_write_over(9, 0) && !k.can_write_over(0, 9));
    k.inputs[0].access.offset = 1;
    k.inputs[0].len += 1;
    assert!(!k.can_write_over(0, 0), "sliced");
}

// ---------------------------------------------------------------------------------------------
// Odds and ends.

#[test]
fn the_listing_of_softmax_names_every_instruction_with_dtype_and_level() {
    let k = softmax_kernel(4, 8);
    let want = "\
fused domain=[4,8] reduce=[1]
  in0 = f32[32] offset=0 strides=[8,1]
  %0 = load(in0) : f32 full
  %1 = reduce_max(%0) : f32 row
  %2 = sub(%0, %1) : f32 full
  %3 = exp(%2) : f32 full
  %4 = reduce_sum(%3) : f32 row
  %5 = div(%3, %4) : f32 full
  out0 = %5 : f32[4,8]
";
    assert_eq!(k.to_string(), want);
    let mut k2 = k.clone();
    k2.body.push(Inst::Const {
        value: -0.0,
        dtype: DType::I64,
    });
    k2.body.push(Inst::Index {
        axis: 0,
        dtype: DType::I32,
    });
    k2.body.push(Inst::Compare {
        op: CmpOp::Ge,
        a: 6,
        b: 7,
    });
    k2.body.push(Inst::Select {
        cond: 8,
        a: 0,
        b: 5,
    });
    k2.body.push(Inst::Convert {
        x: 9,
        to: DType::F64,
    });
    k2.outputs.push(Output { value: 8 });
    let text = k2.to_string();
    assert!(text.contains("  %6 = const(-0.0) : i64 row\n"), "{text}");
    assert!(text.contains("  %7 = index(axis=0) : i32 row\n"), "{text}");
    assert!(text.contains("  %8 = ge(%6, %7) : bool row\n"), "{text}");
    assert!(
        text.contains("  %9 = select(%8, %0, %5) : f32 full\n"),
        "{text}"
    );
    assert!(text.contains("  %10 = convert(%9) : f64 full\n"), "{text}");
    assert!(text.contains("  out1 = %8 : bool[4,1]\n"), "{text}");
}

#[test]
fn integer_arithmetic_wraps_and_converts_saturate_as_rust_casts() {
    let mut b = B::new(&[4], &[]);
    let xi = b.whole(DType::I32);
    let fi = b.whole(DType::F32);
    let x = b.load(xi);
    let one = b.push(Inst::Const {
        value: 1.0,
        dtype: DType::I32,
    });
    let y = b.add(x, one);
    let neg = b.un(UnaryOp::Neg, x);
    let f = b.load(fi);
    let fi32 = b.push(Inst::Convert {
        x: f,
        to: DType::I32,
    });
    let fb = b.push(Inst::Convert {
        x: f,
        to: DType::Bool,
    });
    b.out(y);
    b.out(neg);
    b.out(fi32);
    b.out(fb);
    let k = b.done();
    let xs = [i32::MAX, i32::MIN, -1, 5];
    let fs = [f32::NAN, 1e20, -2.7, 0.0];
    let refs = [bytes_i32(&xs), bytes_f32(&fs)];
    let refs: Vec<&[u8]> = refs.iter().map(|v| v.as_slice()).collect();
    let got = cpu::run_buffers(&k, &refs).unwrap();
    let i32s = |b: &[u8]| -> Vec<i32> {
        b.chunks_exact(4)
            .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    };
    assert_eq!(i32s(&got[0]), vec![i32::MIN, i32::MIN + 1, 0, 6]);
    assert_eq!(i32s(&got[1]), vec![i32::MIN + 1, i32::MIN, 1, -5]);
    assert_eq!(i32s(&got[2]), vec![0, i32::MAX, -2, 0]);
    assert_eq!(got[3], vec![1, 1, 1, 0]);
}
