use super::data::inputs_for;
use super::reference::{compare, reference};
use super::*;
use ingot_compiler::ir::Op;

fn f32s(xs: &[f32]) -> Vec<u8> {
    xs.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

#[test]
fn floats_pass_within_the_tolerance_and_nan_must_match_nan() {
    let cpu = f32s(&[1.0, f32::NAN, -2.0, f32::INFINITY]);
    let passes = |got: &[f32]| compare(DType::F32, &f32s(got), &cpu, Tolerance::Drift).0;
    assert!(passes(&[1.0, f32::NAN, -2.0, f32::INFINITY]));
    assert!(passes(&[1.000001, f32::NAN, -2.0, f32::INFINITY]));
    assert!(!passes(&[1.001, f32::NAN, -2.0, f32::INFINITY]));
    assert!(!passes(&[1.0, 0.0, -2.0, f32::INFINITY]));
    assert!(!passes(&[1.0, f32::NAN, -2.0, f32::MAX]));
    // An unwritten output (0xFF bytes) is a NaN where the CPU has a number.
    assert!(!compare(DType::F32, &[0xFF; 16], &cpu, Tolerance::Drift).0);
    assert!(!compare(DType::I32, &[0, 0, 0, 1], &[0, 0, 0, 0], Tolerance::Exact).0);
    assert!(!compare(DType::F32, &cpu[..8], &cpu, Tolerance::Drift).0);
}

fn bf16s(xs: &[f32]) -> Vec<u8> {
    xs.iter()
        .flat_map(|&x| half::bf16::from_f32(x).to_bits().to_ne_bytes())
        .collect()
}

#[test]
fn bf16_values_are_exact_where_the_arithmetic_is_and_within_an_ulp_where_it_drifts() {
    let cpu = bf16s(&[1.0, 0.5, -3.0, f32::NAN]);
    // 1 + 2^-7 is one bf16 ulp above 1; a NaN of another payload is a NaN.
    let one_ulp = bf16s(&[1.0078125, 0.5, -3.0, -f32::NAN]);
    let far = bf16s(&[1.0625, 0.5, -3.0, f32::NAN]);
    let other_nan = bf16s(&[1.0, 0.5, -3.0, -f32::NAN]);
    assert!(compare(DType::BF16, &cpu, &cpu, Tolerance::Exact).0);
    assert!(compare(DType::BF16, &other_nan, &cpu, Tolerance::Exact).0);
    assert!(!compare(DType::BF16, &one_ulp, &cpu, Tolerance::Exact).0);
    assert!(compare(DType::BF16, &one_ulp, &cpu, Tolerance::Drift).0);
    assert!(!compare(DType::BF16, &far, &cpu, Tolerance::Drift).0);
    assert!(compare(DType::BF16, &far, &cpu, Tolerance::Coarse).0);
    // An unwritten bf16 output (0xFF bytes) is a NaN where the CPU has a number.
    assert!(!compare(DType::BF16, &[0xFF; 8], &cpu, Tolerance::Coarse).0);
}

#[test]
fn the_bf16_gpt_mini_step_yields_bf16_kernels_with_every_tolerance() {
    let items = kernels_of(&Source::bf16_models(&["gpt-mini"]), false).unwrap();
    let bf16_io = |w: &Work| {
        let (i, o) = w.buffers();
        i.iter().chain(&o).any(|&(d, _)| d == DType::BF16)
    };
    let with_bf16 = items.iter().filter(|it| bf16_io(&it.work)).count();
    assert!(
        with_bf16 >= 10,
        "{with_bf16} of {} kernels move bf16",
        items.len()
    );
    let mut seen = std::collections::HashSet::new();
    for it in &items {
        if let Work::Fused(k) = &it.work {
            let t = tolerances(k);
            for (j, &t) in t.iter().enumerate() {
                if k.output_dtype(j) == DType::BF16 {
                    seen.insert(format!("{t:?}"));
                }
            }
        }
    }
    // Casts and products are exact; a softmax's rounded output drifts (expf). Arithmetic
    // inside a kernel is f32 (fuse::widen), so a drift is rounded once, at the store.
    for t in ["Exact", "Drift"] {
        assert!(seen.contains(t), "no bf16 output is {t}: {seen:?}");
    }
}

#[test]
fn the_mlp_step_yields_distinct_fused_kernels_with_their_origins() {
    let items = kernels_of(&Source::models(&["mlp"]), false).unwrap();
    assert!(items.len() >= 5, "{} kernels", items.len());
    let mut names: Vec<String> = items.iter().map(|i| i.name()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), items.len(), "kernels are not distinct");
    assert!(items.iter().all(|i| i.origin.starts_with("mlp x")));
    // Every one has a CPU reference that runs on its random inputs.
    for it in &items {
        let ins = inputs_for(&it.work, 1, false);
        let outs = reference(&it.work, &ins).unwrap();
        assert_eq!(outs.len(), it.work.buffers().1.len());
    }
}

/// The dropout kernels generate, and their CPU reference is the CPU executor's dropout
/// (the same draws, the same products) on random inputs.
#[test]
fn dropout_kernels_generate_and_their_reference_is_the_cpu_executors() {
    use ingot_compiler::ir::{Node, TensorType};
    use ingot_runtime::tensor::{Tensor, ViewMut};
    let items = kernels_of(&Source::Dropout, false).unwrap();
    assert_eq!(items.len(), 3 * 3 * 4 * 2, "every kernel distinct");
    for it in items.iter().filter(|it| it.work.buffers().0[0].1 == 4099) {
        let Work::Dropout { dtype, n, p, salt } = it.work else {
            panic!("not dropout")
        };
        let ins = inputs_for(&it.work, 3, false);
        let want = reference(&it.work, &ins).unwrap();
        let x = Tensor::from_le_bytes(TensorType::new([n], dtype), &ins[0]).unwrap();
        let seed = Tensor::from_le_bytes(
            TensorType::new(ingot_compiler::ir::Shape::scalar(), DType::I64),
            &ins[1],
        )
        .unwrap();
        let node = Node {
            op: Op::Dropout { p, salt },
            inputs: smallvec::smallvec![
                ingot_compiler::ir::NodeId(0),
                ingot_compiler::ir::NodeId(1)
            ],
            ty: TensorType::new([n], dtype),
        };
        let mut out = Tensor::zeros(TensorType::new([n], dtype));
        let out_view: ViewMut<'_> = out.view_mut();
        ingot_runtime::cpu::exec::exec_node(
            &node,
            &[x.view(), seed.view()],
            &[&x.ty, &seed.ty],
            out_view,
        )
        .unwrap();
        assert_eq!(out.to_le_bytes(), want[0], "{dtype} p {p}");
    }
}

#[test]
fn random_sources_are_exact_kernels_that_check() {
    let items = kernels_of(&Source::Random(0..20), false).unwrap();
    assert!(items.len() >= 18, "{} distinct of 20", items.len());
    for it in &items {
        let Work::Fused(k) = &it.work else {
            panic!("not fused")
        };
        assert_eq!(k.check(), Ok(()));
    }
}
