//! Batch norm's data gradient as Ingot's autodiff writes it (the shape of resnet50's bf16
//! channels-last backward kernels, `kernels_of resnet:depth=50,side=224,batch=128 --precision
//! bf16 --channels-last`): the ReLU's mask on the sum of two incoming gradients, the bias and
//! gain sums, and `dx` through the variance's gradient, whose sum of `dxc` reads a first-stage
//! sum (a second stage).

use ingot_kernels::fused::{FusedKernel, Inst};
use ingot_kernels::{BinaryOp, DType, UnaryOp};
use ingot_testkit::kernel_builder::KernelBuilder;

/// What the kernel is built for: its domain and reduce axes (NCHW `[0, 2, 3]` or channels-last
/// `[0, 1, 2]`), the dtype it computes in (f32, or f64 for a reference), and whether it rounds
/// to bf16 where the bf16 step does (the incoming gradient, `dxc` and the mean's gradient
/// stored as bf16, full inputs bf16); without rounding, full inputs are of the compute dtype.
pub struct Shape<'a> {
    pub dims: [usize; 4],
    pub axes: &'a [usize],
    pub t: DType,
    pub bf16: bool,
}

/// The kernel. Inputs in order: the mask (bool, true where the forward's output was not
/// positive), two incoming gradients, `x`, then per channel the mean, rstd, the gain and
/// `Σ(x − mean)²`. Outputs: the masked gradient, `Σdy`, `Σdy·x̂`, `dx`, and the mean's
/// gradient `−Σdxc / n` (a row).
pub fn autodiff_backward(s: &Shape) -> FusedKernel {
    use BinaryOp::{Add, Div, Mul, Sub};
    let t = s.t;
    let store = if s.bf16 { DType::BF16 } else { t };
    let mut b = KernelBuilder::new(&s.dims, s.axes);
    let d = &s.dims;
    let inv = 1.0 / (s.axes.iter().map(|&a| d[a]).product::<usize>() as f64);
    let full = |b: &mut KernelBuilder| {
        let i = b.whole(store);
        let v = b.load(i);
        b.to(v, t)
    };
    let row = |b: &mut KernelBuilder| {
        let i = b.input_bcast(t, s.axes);
        b.load(i)
    };
    let rounded = |b: &mut KernelBuilder, v: usize| {
        let r = b.to(v, store);
        b.to(r, t)
    };
    let m = b.whole(DType::Bool);
    let mask = b.load(m);
    let zero = b.konst_of(0.0, t);
    let g1 = full(&mut b);
    let g2 = full(&mut b);
    let g = b.bin(Add, g1, g2);
    let dy = b.push(Inst::Select {
        cond: mask,
        a: zero,
        b: g,
    });
    let dy_out = b.to(dy, store);
    let dy = rounded(&mut b, dy);
    let s_dy = b.sum(dy);
    let x = full(&mut b);
    let mean = row(&mut b);
    let xc = b.bin(Sub, x, mean);
    let rstd = row(&mut b);
    let xh = b.bin(Mul, xc, rstd);
    let dyxh = b.bin(Mul, dy, xh);
    let s_dyxh = b.sum(dyxh);
    let gain = row(&mut b);
    let dxh = b.bin(Mul, dy, gain);
    let direct = b.bin(Mul, dxh, rstd);
    let dxh_xc = b.bin(Mul, dxh, xc);
    let s_dxh_xc = b.sum(dxh_xc);
    let sq = row(&mut b);
    let n_inv = b.konst_of(inv, t);
    let var = b.bin(Mul, sq, n_inv);
    let eps = b.konst_of(1e-5, t);
    let ve = b.bin(Add, var, eps);
    let sd = b.un(UnaryOp::Sqrt, ve);
    let r = b.un(UnaryOp::Recip, sd);
    let r2 = b.bin(Mul, r, r);
    let p = b.bin(Mul, s_dxh_xc, r2);
    let p = b.un(UnaryOp::Neg, p);
    let two = b.konst_of(2.0, t);
    let q = b.bin(Mul, sd, two);
    let dvar = b.bin(Div, p, q);
    let k = b.bin(Mul, dvar, n_inv);
    let kxc = b.bin(Mul, k, xc);
    let dxc = b.bin(Add, direct, kxc);
    let dxc = b.bin(Add, dxc, kxc);
    let dxc_r = rounded(&mut b, dxc);
    let s_dxc = b.sum(dxc);
    let dmean = b.un(UnaryOp::Neg, s_dxc);
    let dmean = b.bin(Mul, dmean, n_inv);
    let dmean_r = rounded(&mut b, dmean);
    let dx = b.bin(Add, dxc_r, dmean_r);
    let dx = b.to(dx, store);
    b.outputs(&[dy_out, s_dy, s_dyxh, dx, dmean]).done()
}
