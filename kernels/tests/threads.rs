//! The CPU kernels on several threads give the bits they give on one: GEMM (tiles spread over
//! a pool), convolutions (units spread over lanes), attention (problems spread over a pool)
//! and fused kernels cut into pieces
//! (`fused::parts`), for pools of 1, 2, 3 and 16 threads. The one-thread reference is the
//! kernel called outside any pool, which is the single-threaded path the other tests check
//! against independent references.

use half::bf16;
use ingot_kernels::attention::Layout;
use ingot_kernels::cpu::attention::{self as att, Grads, Shape};
use ingot_kernels::cpu::conv::ConvGeometry;
use ingot_kernels::cpu::gemm::{gemm_ws, workspace_len};
use ingot_kernels::cpu::{MatLayout, Trans};
use ingot_kernels::fused::{cpu, parts, random};
use proptest::prelude::*;

const THREADS: [usize; 4] = [1, 2, 3, 16];

fn pool(n: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .expect("a pool")
}

/// Values with a spread of magnitudes, so that a changed summation order changes bits.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1);
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            u * if s & 1 == 0 { 1.0 } else { 1e-3 }
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn product(m: usize, k: usize, n: usize, ta: bool, tb: bool, beta: f32, seed: u64) -> Vec<f32> {
    let a = values(m * k, seed);
    let b = values(k * n, seed + 1);
    let mut c = values(m * n, seed + 2);
    let tr = |t: bool| if t { Trans::T } else { Trans::N };
    let (la, lb) = (
        MatLayout::stored(tr(ta), m, k),
        MatLayout::stored(tr(tb), k, n),
    );
    let mut ws = vec![0.0f32; workspace_len::<f32>(m, k, n)];
    gemm_ws(
        m,
        k,
        n,
        0.75,
        &a,
        la,
        &b,
        lb,
        beta,
        &mut c,
        MatLayout::row_major(n),
        &mut ws,
    )
    .expect("gemm");
    c
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Shapes large enough that a block's tiles are spread over the pool (m·n·k well above
    /// the threshold), in every transpose combination, with and without accumulation.
    #[test]
    fn gemm_gives_the_same_bits_on_any_number_of_threads(
        m in 1usize..400, k in 1usize..700, n in 1usize..400,
        ta: bool, tb: bool, acc: bool, seed in 0u64..1000,
    ) {
        let beta = if acc { 1.0 } else { 0.0 };
        let one = product(m, k, n, ta, tb, beta, seed);
        for t in THREADS {
            let got = pool(t).install(|| product(m, k, n, ta, tb, beta, seed));
            prop_assert!(
                got.iter().zip(&one).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{m}x{k}x{n} (ta {ta}, tb {tb}, beta {beta}) differs on {t} threads"
            );
        }
    }
}

fn attention<T: att::Elem + PartialEq + std::fmt::Debug>(
    s: &Shape,
    from: impl Fn(f32) -> T,
) -> (Vec<T>, Vec<f32>, [Vec<T>; 3]) {
    let (bh, tq, tk, d) = (s.batch_heads, s.seq_q, s.seq_k, s.head_dim);
    let q: Vec<T> = values(bh * tq * d, 1).into_iter().map(&from).collect();
    let k: Vec<T> = values(bh * tk * d, 2).into_iter().map(&from).collect();
    let v: Vec<T> = values(bh * tk * d, 3).into_iter().map(&from).collect();
    let dout: Vec<T> = values(bh * tq * d, 4).into_iter().map(&from).collect();
    let mut out = vec![from(0.0); bh * tq * d];
    let mut lse = vec![0.0f32; bh * tq];
    let mut ws = vec![0.0f32; att::forward_scratch_len(s).max(att::backward_scratch_len(s))];
    att::forward(s, &q, &k, &v, &mut out, &mut lse, &mut ws);
    let (mut dq, mut dk, mut dv) = (
        vec![from(0.0); q.len()],
        vec![from(0.0); k.len()],
        vec![from(0.0); v.len()],
    );
    att::backward(
        s,
        [&q, &k, &v, &out, &dout],
        &lse,
        Grads::Separate {
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dv,
        },
        &mut ws,
    );
    (out, lse, [dq, dk, dv])
}

#[test]
fn attention_gives_the_same_bits_on_any_number_of_threads() {
    for (bh, tq, tk, d, causal) in [
        (16, 64, 64, 32, true),
        (6, 33, 70, 16, false),
        (3, 128, 128, 8, true),
    ] {
        let s = Shape::new(
            (bh, tq, tk, d, causal),
            1.0 / (d as f32).sqrt(),
            Layout::contiguous(tq, tk, d),
        );
        let one = attention::<f32>(&s, |x| x);
        let one16 = attention::<bf16>(&s, bf16::from_f32);
        for t in THREADS {
            let p = pool(t);
            assert_eq!(
                p.install(|| attention::<f32>(&s, |x| x)),
                one,
                "f32 {s:?} on {t} threads"
            );
            assert_eq!(
                p.install(|| attention::<bf16>(&s, bf16::from_f32)),
                one16,
                "bf16 {s:?} on {t} threads"
            );
        }
    }
}

/// Bytes of random data for an input of a random kernel (any bit pattern of its dtype but
/// bool, which must be 0 or 1).
fn input_bytes(inp: &ingot_kernels::fused::Input, seed: u64) -> Vec<u8> {
    let size = inp.dtype.size();
    let raw = values(inp.len * size, seed);
    match inp.dtype {
        ingot_kernels::DType::Bool => raw.iter().map(|x| (*x > 0.0) as u8).collect(),
        _ => raw
            .iter()
            .map(|x| (x.to_bits() >> 7) as u8)
            .collect::<Vec<u8>>()
            .chunks(size)
            .flat_map(|c| {
                // Moderate values: the float's exponent byte set from a fixed table.
                let mut c = c.to_vec();
                if size >= 4 {
                    c[size - 1] = 0x3f ^ (c[size - 1] & 0x80);
                }
                c
            })
            .collect(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Every piece of a cut kernel computes exactly the slice of the whole kernel's outputs
    /// that its `output_start` names, and the pieces tile the outputs: every dtype, reduction,
    /// broadcast and layout the random kernels have.
    #[test]
    fn the_pieces_of_a_fused_kernel_compute_its_outputs_bit_for_bit(
        seed in 0u64..1_000_000, pieces in 2usize..17,
    ) {
        let k = random::kernel(seed, &random::Options::small());
        let Some(cut) = parts::cut(&k, pieces, 1) else { return Ok(()) };
        let inputs: Vec<Vec<u8>> = k
            .inputs
            .iter()
            .enumerate()
            .map(|(n, inp)| input_bytes(inp, seed * 31 + n as u64))
            .collect();
        let refs: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
        let whole = cpu::run_buffers(&k, &refs).expect("the whole kernel runs");
        let mut covered = vec![0usize; k.outputs.len()];
        for p in &cut {
            prop_assert!(p.kernel.check().is_ok(), "a piece does not check: {}", p.kernel);
            let got = cpu::run_buffers(&p.kernel, &refs).expect("a piece runs");
            for (j, bytes) in got.iter().enumerate() {
                let size = k.output_dtype(j).size();
                let at = p.output_start[j] * size;
                prop_assert_eq!(at, covered[j], "output {} of piece starts at {}", j, at);
                prop_assert!(
                    whole[j][at..at + bytes.len()] == bytes[..],
                    "output {} of a piece differs from the whole kernel's (seed {})", j, seed
                );
                covered[j] += bytes.len();
            }
        }
        for (j, w) in whole.iter().enumerate() {
            prop_assert_eq!(covered[j], w.len(), "the pieces do not cover output {}", j);
        }
    }
}

/// A convolution's three passes: their units (images and groups, or groups and channel
/// ranges) spread over lanes on the pool, im2col and col2im over a group's input channels,
/// beside the GEMM's tiles. `lanes`: in `lanes` times the least workspace (one lane's), or
/// with `None` in the workspace of every lane the pass can use (`workspace_len_up_to`).
fn conv_passes(
    geo: &ingot_kernels::cpu::conv::ConvGeometry,
    seed: u64,
    lanes: Option<usize>,
) -> [Vec<f32>; 3] {
    use ingot_kernels::cpu::conv::{self, Pass};
    let g = *geo;
    let x_len = g.batch * g.in_ch * g.in_hw[0] * g.in_hw[1];
    let y_len = g.batch * g.out_ch * g.positions();
    let w_len = g.out_ch * g.col_rows();
    let (x, w, dy) = (
        values(x_len, seed),
        values(w_len, seed + 1),
        values(y_len, seed + 2),
    );
    let ws = |p: Pass| {
        let len = match lanes {
            None => conv::workspace_len_up_to::<f32>(&g, p),
            Some(k) => k * conv::workspace_len::<f32>(&g, p),
        };
        vec![0.0f32; len]
    };
    let mut y = vec![0.0f32; y_len];
    conv::forward(&g, &x, &w, &mut y, &mut ws(Pass::Forward)).expect("forward");
    let mut dx = vec![0.0f32; x_len];
    conv::grad_input(&g, &dy, &w, &mut dx, &mut ws(Pass::GradInput)).expect("grad_input");
    let mut dw = vec![0.0f32; w_len];
    conv::grad_weight(&g, &x, &dy, &mut dw, &mut ws(Pass::GradWeight)).expect("grad_weight");
    [y, dx, dw]
}

/// Max pooling's two passes: planes spread over the pool.
fn pool_passes(g: &ingot_kernels::cpu::pool::PoolGeometry, seed: u64) -> [Vec<f32>; 2] {
    use ingot_kernels::cpu::pool;
    let x_len = g.planes * g.in_hw[0] * g.in_hw[1];
    let y_len = g.planes * g.out_hw[0] * g.out_hw[1];
    let (x, dy) = (values(x_len, seed), values(y_len, seed + 1));
    let mut y = vec![0.0f32; y_len];
    pool::max_forward(g, &x, &mut y).expect("forward");
    let mut dx = vec![7.0f32; x_len];
    pool::max_backward(g, &x, &dy, &mut dx).expect("backward");
    [y, dx]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Geometries whose column buffers pass the parallel threshold, with strides, padding,
    /// dilation and groups; several images, so that the lanes take several units each.
    #[test]
    fn convolutions_give_the_same_bits_on_any_number_of_threads(
        batch in 1usize..6, cg in 1usize..12, groups in 1usize..3, og in 1usize..6,
        hw in 12usize..24, k in 1usize..4, stride in 1usize..3, pad in 0usize..2,
        dil in 1usize..3, seed in 0u64..1000,
    ) {
        let geo = ingot_kernels::cpu::conv::ConvGeometry::new(
            [batch, cg * groups, hw, hw + 3],
            [og * groups, cg, k, k],
            [stride, stride],
            [pad, pad],
            [dil, dil],
            groups,
        );
        prop_assume!(geo.is_ok());
        let geo = geo.unwrap();
        conv_same_bits_on_every_pool(&geo, seed)?;
    }

    #[test]
    fn max_pooling_gives_the_same_bits_on_any_number_of_threads(
        planes in 1usize..40, hw in 8usize..40, k in 1usize..4, stride in 1usize..3,
        pad in 0usize..2, seed in 0u64..1000,
    ) {
        prop_assume!(pad < k);
        let out = |n: usize| (n + 2 * pad - k) / stride + 1;
        let g = ingot_kernels::cpu::pool::PoolGeometry {
            planes,
            in_hw: [hw, hw + 5],
            kernel: [k, k],
            stride: [stride, stride],
            padding: [pad, pad],
            dilation: [1, 1],
            out_hw: [out(hw), out(hw + 5)],
            inner: 1,
        };
        let one = pool_passes(&g, seed);
        for t in THREADS {
            let got = pool(t).install(|| pool_passes(&g, seed));
            for (pass, (a, b)) in ["forward", "backward"].iter().zip(got.iter().zip(&one)) {
                prop_assert!(
                    a.iter().zip(b).all(|(u, v)| u.to_bits() == v.to_bits()),
                    "{} differs on {} threads ({:?})", pass, t, g
                );
            }
        }
    }
}

/// The passes on every pool, in the least workspace (one lane), in three lanes' (fewer lanes
/// than threads, or a number the threads do not divide) and in the most (every lane), give
/// the bits of the least on one thread outside any pool.
fn conv_same_bits_on_every_pool(g: &ConvGeometry, seed: u64) -> Result<(), TestCaseError> {
    let one = conv_passes(g, seed, Some(1));
    for t in THREADS {
        for lanes in [Some(1), Some(3), None] {
            let got = pool(t).install(|| conv_passes(g, seed, lanes));
            for (name, (a, b)) in ["y", "dx", "dw"].iter().zip(got.iter().zip(&one)) {
                prop_assert!(
                    a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{g:?}: {name} differs on {t} threads (lanes: {lanes:?})"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn convolutions_of_resnet_and_cnn_shapes_give_the_same_bits_on_any_number_of_threads() {
    for (x, w, s, p, groups) in [
        // cnn's conv2 and a resnet 3x3 at 8x8 (channel ranges in the weight gradient).
        ([16, 32, 14, 14], [64, 32, 3, 3], 1, 1, 1),
        ([8, 64, 8, 8], [64, 64, 3, 3], 1, 1, 1),
        // A bottleneck's pointwise convolution, read in place.
        ([8, 64, 7, 7], [128, 64, 1, 1], 1, 0, 1),
        ([4, 512, 4, 4], [64, 512, 1, 1], 1, 0, 1),
        // A strided 1x1 shortcut and a depthwise convolution.
        ([8, 32, 8, 8], [64, 32, 1, 1], 2, 0, 1),
        ([8, 24, 10, 10], [24, 1, 3, 3], 1, 1, 24),
    ] {
        let g = ConvGeometry::new(x, w, [s, s], [p, p], [1, 1], groups).expect("a geometry");
        conv_same_bits_on_every_pool(&g, 11).expect("the same bits");
    }
}
