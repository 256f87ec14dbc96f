//! NaN propagates through max, min and reduce-max on every path, as PyTorch's `maximum`,
//! `minimum`, `amax` and XLA's `max`/`min`/`reduce_max` do: the scalar arithmetic, the unfused
//! reduction, the fused CPU kernels (rows and columns cases) and the generated CUDA C.

use ingot_kernels::cpu::{self, Num, ReduceKind, Scalar};
use ingot_kernels::cuda::{self, PRELUDE};
use ingot_kernels::fused::{self, FusedKernel};
use ingot_testkit::text::assert_mentions;

#[path = "support/sum_kernels.rs"]
mod sum_kernels;

#[test]
fn scalar_max_and_min_of_nan_are_nan_in_either_position() {
    for (a, b) in [(f32::NAN, 1.0), (1.0, f32::NAN), (f32::NAN, f32::NAN)] {
        assert!(Scalar::max(a, b).is_nan(), "max({a}, {b})");
        assert!(Num::min(a, b).is_nan(), "min({a}, {b})");
    }
    assert!(Scalar::max(f64::NAN, 0.0).is_nan());
    assert!(Num::min(0.0, f64::NAN).is_nan());
    assert_eq!(Scalar::max(2.0f32, -1.0), 2.0);
    assert_eq!(Num::min(2.0f32, -1.0), -1.0);
    assert_eq!(Scalar::max(3i32, 4), 4);
}

#[test]
fn unfused_reduce_max_is_nan_where_a_term_is_nan_on_every_path() {
    // [2, 3, 4]: one NaN at [1, 2, 1].
    let dims = [2usize, 3, 4];
    let mut x: Vec<f32> = (0..24).map(|i| i as f32).collect();
    x[12 + 2 * 4 + 1] = f32::NAN;
    let nan_out = |axes: &[usize], want_nan: &[usize]| {
        let n: usize = (0..3)
            .filter(|d| !axes.contains(d))
            .map(|d| dims[d])
            .product();
        let mut out = vec![0f32; n];
        cpu::reduce(ReduceKind::Max, &x, &dims, axes, &mut out);
        for (i, v) in out.iter().enumerate() {
            assert_eq!(
                v.is_nan(),
                want_nan.contains(&i),
                "max over {axes:?}: {out:?}"
            );
        }
    };
    nan_out(&[2], &[5]); // rows: [2, 3] outputs, row (1, 2)
    nan_out(&[0, 2], &[2]); // several runs per output: [3] outputs, j = 2
    nan_out(&[0], &[9]); // columns: [3, 4] outputs, (2, 1)
    nan_out(&[0, 1, 2], &[0]);
    // The NaN first or last in its run.
    for at in [0usize, 23] {
        let mut y = vec![1f32; 24];
        y[at] = f32::NAN;
        let mut out = [0f32];
        cpu::reduce(ReduceKind::Max, &y, &[24], &[0], &mut out);
        assert!(out[0].is_nan(), "NaN at {at}");
    }
}

fn bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// `relu = max(x, 0)`, `lo = min(x, 0)`, and `m = reduce max(relu)` over `axes`.
fn relu_max(dims: &[usize], axes: &[usize]) -> FusedKernel {
    sum_kernels::max_min_and_reduce_max(dims, axes, 2)
}

#[test]
fn fused_max_min_and_reduce_max_propagate_nan_in_rows_and_columns() {
    let (r, c) = (5usize, 40usize);
    let mut x: Vec<f32> = (0..r * c).map(|i| (i as f32) * 0.25 - 20.0).collect();
    let (nr, nc) = (3, 17);
    x[nr * c + nc] = f32::NAN;
    for (axes, nan_row) in [(vec![1usize], nr), (vec![0], nc)] {
        let k = relu_max(&[r, c], &axes);
        let out = fused::cpu::run_buffers(&k, &[&bytes(&x)]).unwrap();
        let (relu, lo, m) = (f32s(&out[0]), f32s(&out[1]), f32s(&out[2]));
        for (e, &v) in x.iter().enumerate() {
            assert_eq!(relu[e].is_nan(), v.is_nan(), "relu at {e}");
            assert_eq!(lo[e].is_nan(), v.is_nan(), "min at {e}");
            if !v.is_nan() {
                assert_eq!(relu[e], v.max(0.0));
                assert_eq!(lo[e], v.min(0.0));
            }
        }
        for (i, v) in m.iter().enumerate() {
            assert_eq!(v.is_nan(), i == nan_row, "max over {axes:?}: {m:?}");
        }
        // The unfused reduction agrees.
        let mut want = vec![0f32; m.len()];
        cpu::reduce(ReduceKind::Max, &relu, &[r, c], &axes, &mut want);
        assert_eq!(
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            m.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }
}

#[test]
fn generated_cuda_max_and_min_propagate_nan() {
    for axes in [vec![1usize], vec![0]] {
        let k = cuda::fused(&relu_max(&[512, 512], &axes)).unwrap();
        let src = &k.source;
        assert!(!src.contains("fmaxf") && !src.contains("fminf"), "{src}");
        assert_mentions(src, &["ig_max(", "ig_min("]);
        assert!(src.contains("ig_keep_max("), "{src}");
    }
    // The prelude's float max/min and the running max keep NaN.
    for line in [
        "float ig_max(float a, float b) { return (a != a || b != b) ? a + b : fmaxf(a, b); }",
        "double ig_max(double a, double b) { return (a != a || b != b) ? a + b : fmax(a, b); }",
        "float ig_min(float a, float b) { return (a != a || b != b) ? a + b : fminf(a, b); }",
        "double ig_min(double a, double b) { return (a != a || b != b) ? a + b : fmin(a, b); }",
        "T ig_keep_max(T m, T t) { return (t > m || t != t) ? t : m; }",
    ] {
        assert!(PRELUDE.contains(line), "the prelude lacks {line}");
    }
}
