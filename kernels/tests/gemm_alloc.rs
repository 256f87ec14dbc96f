//! Invariant 3 for the matrix product: once its workspace exists, `gemm_ws` and
//! `batched_matmul_ws` make no heap allocation, for f32 and f64, every transpose combination,
//! sizes beyond the block sizes, and bad input (errors are built without allocating).
//!
//! A counting global allocator (support/counting.rs) counts the allocations of the calling
//! thread; the product spawns no threads.

use ingot_kernels::cpu::gemm::{KC, MC, NC};
use ingot_kernels::cpu::{batched_matmul_ws, gemm_ws, workspace_len, GemmScalar, MatLayout, Trans};
#[path = "support/counting.rs"]
mod counting;
use counting::allocations;

const TRANS: [(Trans, Trans); 4] = [
    (Trans::N, Trans::N),
    (Trans::N, Trans::T),
    (Trans::T, Trans::N),
    (Trans::T, Trans::T),
];

fn products_allocate_nothing<T: GemmScalar>(from: fn(f64) -> T) {
    let sizes = [
        (1, 1, 1),
        (13, 31, 7),
        (256, 784, 1024),
        (MC + 7, KC + 9, 40),
        (5, 3, NC + 9),
    ];
    for &(m, k, n) in &sizes {
        let batch = 2;
        let a: Vec<T> = (0..batch * m * k).map(|i| from((i % 7) as f64)).collect();
        let b: Vec<T> = (0..batch * k * n).map(|i| from((i % 5) as f64)).collect();
        let mut c = vec![T::ZERO; batch * m * n];
        let mut ws = vec![T::ZERO; workspace_len::<T>(m, k, n)];
        for (ta, tb) in TRANS {
            for accumulate in [false, true] {
                let n_alloc = allocations(|| {
                    batched_matmul_ws(batch, m, k, n, &a, ta, &b, tb, &mut c, accumulate, &mut ws)
                        .unwrap()
                });
                assert_eq!(n_alloc, 0, "batched_matmul_ws {m}x{k}x{n} {ta:?}{tb:?}");
            }
        }
        // A strided sub-matrix of A read transposed, C column-major (the transposed path),
        // alpha and beta.
        let la = MatLayout {
            offset: 1,
            row_stride: 1,
            col_stride: m,
        };
        let lc = MatLayout::col_major(m);
        let n_alloc = allocations(|| {
            gemm_ws(
                m,
                k - 1,
                n,
                from(0.5),
                &a,
                la,
                &b,
                MatLayout::row_major(n),
                from(2.0),
                &mut c,
                lc,
                &mut ws,
            )
            .unwrap()
        });
        assert_eq!(n_alloc, 0, "gemm_ws {m}x{}x{n}", k - 1);
        // Refusals allocate nothing either.
        let n_alloc = allocations(|| {
            let too_small = ws.len() - 1;
            let e = gemm_ws(
                m,
                k,
                n,
                from(1.0),
                &a,
                MatLayout::row_major(k),
                &b,
                MatLayout::row_major(n),
                from(0.0),
                &mut c,
                MatLayout::row_major(n),
                &mut ws[..too_small],
            );
            assert!(e.is_err());
            let e = batched_matmul_ws(
                3,
                m,
                k,
                n,
                &a,
                Trans::N,
                &b,
                Trans::N,
                &mut c,
                false,
                &mut ws,
            );
            assert!(e.is_err());
        });
        assert_eq!(n_alloc, 0, "refusals {m}x{k}x{n}");
    }
}

#[test]
fn gemm_ws_and_batched_matmul_ws_make_no_heap_allocation() {
    // The counter works: a Vec allocates.
    assert_eq!(allocations(|| drop(std::hint::black_box(vec![1u8; 10]))), 1);
    products_allocate_nothing::<f32>(|v| v as f32);
    products_allocate_nothing::<f64>(|v| v);
}
