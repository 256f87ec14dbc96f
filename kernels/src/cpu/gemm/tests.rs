use super::super::matmul::batched_matmul;
use super::*;

/// A xorshift stream of values in [-1, 1), or of small integers in -4..=4 (`ints`), whose
/// products and sums are exact in f32 and f64.
fn data(len: usize, seed: u64, ints: bool) -> Vec<f64> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if ints {
                ((x >> 40) % 9) as f64 - 4.0
            } else {
                (x >> 11) as f64 / (1u64 << 52) as f64 - 1.0
            }
        })
        .collect()
}

fn layout_len(l: MatLayout, rows: usize, cols: usize) -> usize {
    l.max_index(rows, cols).map_or(l.offset, |x| x + 1)
}

/// One product on operands at arbitrary layouts, checked element by element against the
/// triple loop in f64 with the error bound of a reordered sum of `k` terms, and checked to
/// leave every element of C's slice outside the matrix, and the workspace's surroundings,
/// untouched.
struct Case {
    m: usize,
    k: usize,
    n: usize,
    alpha: f64,
    beta: f64,
    la: MatLayout,
    lb: MatLayout,
    lc: MatLayout,
}

impl Case {
    /// Row-major or transposed operands, C row-major, each with `pad` extra columns and
    /// an offset (so every operand is a strided sub-matrix of a larger one).
    fn plain(m: usize, k: usize, n: usize, ta: Trans, tb: Trans, pad: usize) -> Case {
        let sub = |t: Trans, rows: usize, cols: usize| match t {
            Trans::N => MatLayout {
                offset: pad,
                row_stride: cols + pad,
                col_stride: 1,
            },
            Trans::T => MatLayout {
                offset: pad,
                row_stride: 1,
                col_stride: rows + pad,
            },
        };
        Case {
            m,
            k,
            n,
            alpha: 1.0,
            beta: 0.0,
            la: sub(ta, m, k),
            lb: sub(tb, k, n),
            lc: sub(Trans::N, m, n),
        }
    }

    /// Runs the case for `E` with kernel family `isa`; returns C's whole slice.
    fn run<E: Elem>(&self, isa: Isa, seed: u64, from: fn(f64) -> E, to: fn(E) -> f64) -> Vec<f64> {
        let &Case {
            m,
            k,
            n,
            alpha,
            beta,
            la,
            lb,
            lc,
        } = self;
        let a64 = data(layout_len(la, m, k), seed, false);
        let b64 = data(layout_len(lb, k, n), seed + 1, false);
        // C's elements depend on (i, j) only, not on its layout.
        let mut c64 = data(layout_len(lc, m, n), seed + 2, false);
        let cij = data(m * n, seed + 3, false);
        for i in 0..m {
            for j in 0..n {
                c64[lc.offset + i * lc.row_stride + j * lc.col_stride] = cij[i * n + j];
            }
        }
        let a: Vec<E> = a64.iter().map(|&v| from(v)).collect();
        let b: Vec<E> = b64.iter().map(|&v| from(v)).collect();
        let mut c: Vec<E> = c64.iter().map(|&v| from(v)).collect();
        // The workspace is an exact-length window, at a varying misalignment, of a longer
        // buffer whose guard elements must survive.
        let need = workspace_len::<E>(m, k, n);
        let skew = (seed % 17) as usize;
        let guard = from(12345.0);
        let mut wbuf = vec![guard; skew + need + 32];
        gemm_typed(
            m,
            k,
            n,
            from(alpha),
            &a,
            la,
            &b,
            lb,
            from(beta),
            &mut c,
            lc,
            &mut wbuf[skew..skew + need],
            isa,
        )
        .unwrap();
        assert!(wbuf[..skew]
            .iter()
            .chain(&wbuf[skew + need..])
            .all(|&g| g == guard));
        // The reference, from the values as E holds them.
        let (a64, b64, c64): (Vec<f64>, Vec<f64>, Vec<f64>) = (
            a.iter().map(|&v| to(v)).collect(),
            b.iter().map(|&v| to(v)).collect(),
            c64.iter().map(|&v| to(from(v))).collect(),
        );
        let eps = to(from(1.0 + f64::EPSILON)) - 1.0;
        let eps = if eps == 0.0 { f32::EPSILON as f64 } else { eps };
        let got: Vec<f64> = c.iter().map(|&v| to(v)).collect();
        let mut inside = vec![false; c.len()];
        for i in 0..m {
            for j in 0..n {
                let (mut s, mut mag) = (0.0, 0.0);
                for p in 0..k {
                    let x = a64[la.offset + i * la.row_stride + p * la.col_stride]
                        * b64[lb.offset + p * lb.row_stride + j * lb.col_stride];
                    s += x;
                    mag += x.abs();
                }
                let ci = lc.offset + i * lc.row_stride + j * lc.col_stride;
                inside[ci] = true;
                let old = if beta == 0.0 { 0.0 } else { c64[ci] };
                let want = alpha * s + beta * old;
                let bound =
                    2.0 * (k + 2) as f64 * eps * (alpha.abs() * mag + beta.abs() * old.abs());
                assert!(
                    (got[ci] - want).abs() <= bound,
                    "{m}x{k}x{n} {la:?} {lb:?} {lc:?} α={alpha} β={beta} {isa:?}: C[{i},{j}] = {}, want {want} (bound {bound})",
                    got[ci]
                );
            }
        }
        for (ci, &is_in) in inside.iter().enumerate() {
            if !is_in {
                assert_eq!(
                    got[ci].to_bits(),
                    to(from(c64[ci])).to_bits(),
                    "{m}x{k}x{n}: C[{ci}] outside the matrix was written"
                );
            }
        }
        got
    }

    fn check_all_kernels(&self, seed: u64) {
        for isa in [Isa::Avx512, Isa::Avx2, Isa::Portable] {
            if isa.available() {
                self.run::<f32>(isa, seed, |v| v as f32, |v| v as f64);
                self.run::<f64>(isa, seed, |v| v, |v| v);
            }
        }
    }
}

const TRANS: [(Trans, Trans); 4] = [
    (Trans::N, Trans::N),
    (Trans::N, Trans::T),
    (Trans::T, Trans::N),
    (Trans::T, Trans::T),
];

#[test]
fn matches_the_triple_loop_on_edge_prime_and_beyond_block_sizes() {
    let sizes = [
        (0, 0, 0),
        (0, 5, 3),
        (4, 0, 3),
        (3, 5, 0),
        (1, 1, 1),
        (1, 7, 1),
        (1, 13, 37),
        (37, 13, 1),
        (2, 3, 5),
        (7, 11, 13),
        (12, 5, 32),
        (13, 31, 33),
        (31, 97, 17),
        (53, 257, 41),
        (MC + 5, 19, 29),
        (23, KC * 2 + 3, 19),
        (3, 7, NC + 37),
        (NC + 11, 9, 3),
    ];
    for (s, &(m, k, n)) in sizes.iter().enumerate() {
        for (t, &(ta, tb)) in TRANS.iter().enumerate() {
            for pad in [0, 3] {
                let case = Case::plain(m, k, n, ta, tb, pad);
                case.check_all_kernels((s * 10 + t * 2 + pad) as u64);
            }
        }
    }
}

#[test]
fn random_sizes_alphas_and_betas_match_the_triple_loop() {
    let r = data(400, 99, false);
    let mut r = r.iter().map(|v| (v + 1.0) / 2.0);
    let mut pick = |hi: usize| (r.next().unwrap() * hi as f64) as usize;
    for s in 0..40 {
        let (m, k, n) = (pick(90), pick(300), pick(90));
        let (ta, tb) = TRANS[pick(4)];
        let mut case = Case::plain(m, k, n, ta, tb, pick(3));
        case.alpha = [1.0, -0.5, 2.25, 0.0][pick(4)];
        case.beta = [0.0, 1.0, -1.5, 0.75][pick(4)];
        case.check_all_kernels(1000 + s);
    }
}

#[test]
fn strided_and_column_major_outputs_match_the_triple_loop() {
    // C column-major (computed as Cᵀ = Bᵀ·Aᵀ), C with both strides > 1, and operands with
    // both strides > 1.
    let (m, k, n) = (45, 70, 38);
    let col_major = MatLayout {
        offset: 2,
        row_stride: 1,
        col_stride: m + 3,
    };
    let both = MatLayout {
        offset: 1,
        row_stride: 2 * n + 5,
        col_stride: 2,
    };
    let a_both = MatLayout {
        offset: 0,
        row_stride: 3,
        col_stride: 3 * m + 1,
    };
    for (t, lc) in [col_major, both].into_iter().enumerate() {
        for (u, &(ta, tb)) in TRANS.iter().enumerate() {
            let mut case = Case::plain(m, k, n, ta, tb, 1);
            case.lc = lc;
            case.beta = 0.5;
            if u == 3 {
                case.la = a_both;
            }
            case.check_all_kernels(500 + (t * 4 + u) as u64);
        }
    }
}

#[test]
fn every_kernel_and_orientation_gives_the_same_bits() {
    // Same sums in the same order: the AVX-512 and AVX2 kernels agree bit for bit, and a
    // column-major C (computed transposed) equals a row-major one. The portable kernel
    // joins in where it fuses.
    let (m, k, n) = (77, 600, 83);
    let mut rm = Case::plain(m, k, n, Trans::N, Trans::T, 0);
    rm.alpha = 0.75;
    rm.beta = -1.25;
    let mut cm = Case::plain(m, k, n, Trans::N, Trans::T, 0);
    cm.alpha = 0.75;
    cm.beta = -1.25;
    cm.lc = MatLayout::col_major(m);
    let mut isas = vec![Isa::Avx512, Isa::Avx2];
    if HW_FMA {
        isas.push(Isa::Portable);
    }
    let isas: Vec<Isa> = isas.into_iter().filter(|i| i.available()).collect();
    let first = rm.run::<f32>(isas[0], 7, |v| v as f32, |v| v as f64);
    let first64 = rm.run::<f64>(isas[0], 7, |v| v, |v| v);
    for &isa in &isas {
        for case in [&rm, &cm] {
            let got = case.run::<f32>(isa, 7, |v| v as f32, |v| v as f64);
            let got64 = case.run::<f64>(isa, 7, |v| v, |v| v);
            // Compare element (i, j) of each, wherever the layout put it.
            for i in 0..m {
                for j in 0..n {
                    let x = rm.lc.offset + i * rm.lc.row_stride + j * rm.lc.col_stride;
                    let y = case.lc.offset + i * case.lc.row_stride + j * case.lc.col_stride;
                    assert_eq!(
                        first[x].to_bits(),
                        got[y].to_bits(),
                        "f32 {isa:?} ({i},{j})"
                    );
                    assert_eq!(
                        first64[x].to_bits(),
                        got64[y].to_bits(),
                        "f64 {isa:?} ({i},{j})"
                    );
                }
            }
        }
    }
}

#[test]
fn batched_products_equal_matrixmultiply_exactly_on_small_integers() {
    for &(batch, m, k, n) in &[
        (3, 5, 7, 2),
        (2, 17, 33, 9),
        (1, 70, 300, 65),
        (2, 4, 0, 3),
        (1, 0, 3, 4),
        (0, 3, 3, 3),
    ] {
        for (ta, tb) in TRANS {
            for accumulate in [false, true] {
                let a = data(batch * m * k, 1, true);
                let b = data(batch * k * n, 2, true);
                let c0 = data(batch * m * n, 3, true);
                let mut want = c0.clone();
                batched_matmul(batch, m, k, n, &a, ta, &b, tb, &mut want, accumulate);
                let mut got = c0.clone();
                let mut ws = vec![0.0; workspace_len::<f64>(m, k, n)];
                batched_matmul_ws(
                    batch, m, k, n, &a, ta, &b, tb, &mut got, accumulate, &mut ws,
                )
                .unwrap();
                assert_eq!(
                    got, want,
                    "f64 {batch}x{m}x{k}x{n} {ta:?}{tb:?} {accumulate}"
                );
                let f = |v: &Vec<f64>| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
                let mut got32 = f(&c0);
                let mut ws32 = vec![0f32; workspace_len::<f32>(m, k, n)];
                batched_matmul_ws(
                    batch,
                    m,
                    k,
                    n,
                    &f(&a),
                    ta,
                    &f(&b),
                    tb,
                    &mut got32,
                    accumulate,
                    &mut ws32,
                )
                .unwrap();
                assert_eq!(
                    got32,
                    f(&want),
                    "f32 {batch}x{m}x{k}x{n} {ta:?}{tb:?} {accumulate}"
                );
            }
        }
    }
}

#[test]
fn beta_zero_ignores_nan_in_c_and_alpha_zero_ignores_nan_in_a_and_b() {
    let (m, k, n) = (9, 4, 35);
    let mut ws = vec![0f32; workspace_len::<f32>(m, k, n)];
    let ones = vec![1f32; m * k.max(n)];
    let mut c = vec![f32::NAN; m * n];
    let (la, lb, lc) = (
        MatLayout::row_major(k),
        MatLayout::row_major(n),
        MatLayout::row_major(n),
    );
    gemm_ws(m, k, n, 1.0, &ones, la, &ones, lb, 0.0, &mut c, lc, &mut ws).unwrap();
    assert!(c.iter().all(|&x| x == 4.0));
    let nans = vec![f32::NAN; m * k.max(n)];
    gemm_ws(m, k, n, 0.0, &nans, la, &nans, lb, 0.5, &mut c, lc, &mut ws).unwrap();
    assert!(c.iter().all(|&x| x == 2.0));
    gemm_ws(m, k, n, 0.0, &nans, la, &nans, lb, 0.0, &mut c, lc, &mut ws).unwrap();
    assert!(c.iter().all(|&x| x == 0.0));
    gemm_ws(
        m,
        0,
        n,
        1.0,
        &[],
        la,
        &[],
        lb,
        3.0,
        &mut vec![1f32; m * n],
        lc,
        &mut [],
    )
    .unwrap();
}

#[test]
fn bad_input_is_an_error_and_writes_nothing() {
    let (m, k, n) = (4, 5, 6);
    let a = vec![1f32; m * k];
    let b = vec![1f32; k * n];
    let mut c = vec![7f32; m * n];
    let need = workspace_len::<f32>(m, k, n);
    let mut ws = vec![0f32; need];
    let (la, lb, lc) = (
        MatLayout::row_major(k),
        MatLayout::row_major(n),
        MatLayout::row_major(n),
    );
    let mut call = |la: MatLayout, a: &[f32], lc: MatLayout, ws_len: usize| {
        gemm_ws(
            m,
            k,
            n,
            1.0,
            a,
            la,
            &b,
            lb,
            0.0,
            &mut c,
            lc,
            &mut ws[..ws_len],
        )
    };
    assert!(matches!(
        call(la, &a[1..], lc, need),
        Err(GemmError::OutOfBounds {
            operand: "A",
            reach: Some(19),
            len: 19,
            ..
        })
    ));
    assert!(matches!(
        call(la.at(usize::MAX), &a, lc, need),
        Err(GemmError::OutOfBounds {
            operand: "A",
            reach: None,
            ..
        })
    ));
    assert!(matches!(
        call(la, &a, lc.at(1), need),
        Err(GemmError::OutOfBounds { operand: "C", .. })
    ));
    let aliased = MatLayout {
        offset: 0,
        row_stride: 1,
        col_stride: 1,
    };
    assert!(matches!(
        call(la, &a, aliased, need),
        Err(GemmError::AliasedOutput { .. })
    ));
    assert_eq!(
        call(la, &a, lc, need - 1),
        Err(GemmError::WorkspaceTooSmall {
            m,
            k,
            n,
            need,
            len: need - 1
        })
    );
    let msg = call(la, &a[1..], lc, need).unwrap_err().to_string();
    assert!(
        msg.contains("reaches index 19") && msg.contains("19 elements"),
        "{msg}"
    );
    assert!(c.iter().all(|&x| x == 7.0));
    // The batched product of `batch` items over these operands, with workspace `ws`.
    let t = Trans::N;
    let mut batched =
        |batch, ws: &mut [f32]| batched_matmul_ws(batch, m, k, n, &a, t, &b, t, &mut c, false, ws);
    assert!(matches!(
        batched(2, &mut ws),
        Err(GemmError::WrongLength {
            operand: "A",
            batch: 2,
            need: Some(40),
            len: 20,
            ..
        })
    ));
    assert!(matches!(
        batched(1, &mut []),
        Err(GemmError::WorkspaceTooSmall { .. })
    ));
    assert!(c.iter().all(|&x| x == 7.0));
}

#[test]
fn the_workspace_is_symmetric_machine_independent_and_bounded() {
    assert_eq!(workspace_len::<f32>(0, 10, 10), 0);
    assert_eq!(
        workspace_len::<f32>(7, 300, 5),
        workspace_len::<f32>(5, 300, 7)
    );
    let cap32 = (NC + MC) * KC + 16;
    let cap64 = (NC + MC) * KC + 8;
    for &(m, k, n) in &[
        (1, 1, 1),
        (100_000, 100_000, 100_000),
        (256, 784, 1024),
        (1024, 1024, 1024),
    ] {
        assert!(workspace_len::<f32>(m, k, n) <= cap32);
        assert!(workspace_len::<f64>(m, k, n) <= cap64);
    }
    assert_eq!(
        workspace_bytes::<f64>(3, 4, 5),
        8 * workspace_len::<f64>(3, 4, 5)
    );
}

/// `gemm_ws_alone`, which keeps a product on the calling thread inside a pool of 16 threads,
/// gives `gemm_ws`'s bits, on one thread and spread over the pool's.
#[test]
fn a_product_alone_on_its_thread_gives_the_bits_of_one_spread_over_the_pool() {
    let (m, k, n) = (150, 300, 1100);
    let a: Vec<f32> = data(m * k, 31, false).iter().map(|&v| v as f32).collect();
    let b: Vec<f32> = data(k * n, 32, false).iter().map(|&v| v as f32).collect();
    let c0: Vec<f32> = data(m * n, 33, false).iter().map(|&v| v as f32).collect();
    let rm = MatLayout::row_major;
    let run = |alone: bool| {
        let (mut c, mut ws) = (c0.clone(), vec![0f32; workspace_len::<f32>(m, k, n)]);
        let f = if alone {
            gemm_ws_alone::<f32>
        } else {
            gemm_ws::<f32>
        };
        f(
            m,
            k,
            n,
            1.5,
            &a,
            rm(k),
            &b,
            rm(n),
            0.5,
            &mut c,
            rm(n),
            &mut ws,
        )
        .unwrap();
        c.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
    };
    let want = run(false);
    let pool = crate::cpu::par::pool_of(16);
    assert!(
        pool.install(|| run(false)) == want,
        "spread over 16 threads"
    );
    assert!(
        pool.install(|| run(true)) == want,
        "alone inside a pool of 16"
    );
    assert!(run(true) == want, "alone outside any pool");
}
