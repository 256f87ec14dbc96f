//! `matmul_acc` (`c + a·b`, a GEMM with `beta = 1`) on the reference models: fusion makes it
//! from the adds that sum weight gradients (the chunked loss head, accumulated micro-batches),
//! the plan writes it over its accumulator, and the CUDA lowering calls cuBLAS with beta = 1.

use ingot_compiler::autodiff::StepOptions;
use ingot_compiler::ir::{DType, Graph, Op};
use ingot_compiler::lower::cuda::Compute;
use ingot_compiler::lower::Target;
use ingot_compiler::pipeline::{self, Compiled, Options};
use ingot_compiler::precision::Precision;
use ingot_testkit::programs::{cuda_program, gemms};

fn compile(spec: &str, precision: Precision, step: &StepOptions, acc: bool) -> Compiled {
    let m = ingot_models::by_name(spec).unwrap();
    let mut opts = Options {
        precision: Some(precision),
        ..Options::for_target(Target::Cuda)
    };
    opts.fuse.as_mut().unwrap().matmul_acc = acc;
    pipeline::compile_observed_with(&m, step, &opts, &mut |_| {}).unwrap()
}

fn chunked() -> StepOptions {
    StepOptions {
        loss_head_chunk_bytes: ingot_compiler::autodiff::chunk::HEAD_CHUNK_BYTES,
        ..Default::default()
    }
}

fn accumulated(k: usize) -> StepOptions {
    StepOptions {
        accumulate: k,
        ..Default::default()
    }
}

fn count(g: &Graph, name: &str) -> usize {
    g.op_histogram().get(name).copied().unwrap_or(0)
}

/// Whether the plan has a matmul buffer of the head weight's size (`[768, 50304]` either way
/// round) in `dtype`.
fn has_head_sized_product(c: &Compiled, dtype: DType) -> bool {
    c.graph.ids().any(|id| {
        let n = c.graph.node(id);
        let d = n.ty.shape.dims();
        matches!(n.op, Op::MatMul { .. })
            && n.ty.dtype == dtype
            && (d == [768, 50304] || d == [50304, 768])
    })
}

#[test]
fn gpt2_bf16_with_its_loss_head_in_chunks_accumulates_the_head_gradient_in_place_and_plans_less() {
    let before = compile("gpt2", Precision::Bf16, &chunked(), false);
    let after = compile("gpt2", Precision::Bf16, &chunked(), true);
    eprintln!(
        "gpt2 bf16 --chunk-loss-head (cuda): {} bytes without matmul_acc, {} with",
        before.plan.total_bytes, after.plan.total_bytes
    );
    assert!(has_head_sized_product(&before, DType::BF16));
    assert!(
        !has_head_sized_product(&after, DType::BF16),
        "a bf16 head-weight-sized product is still stored"
    );
    // Four chunks: three sums of a chunk's product into the gradient (and the first into a
    // zero fill).
    assert!(count(&after.graph, "matmul_acc") >= 3);
    assert!(after.plan.total_bytes < before.plan.total_bytes);
    // Every head-sized matmul_acc is written over its accumulator.
    for id in after.graph.ids() {
        let n = after.graph.node(id);
        if let Op::MatMulAcc { .. } = n.op {
            if n.ty.shape.numel() == 768 * 50304 {
                assert_eq!(
                    after.plan.location(&after.graph, id),
                    after.plan.location(&after.graph, n.inputs[0]),
                    "{id} is not over its accumulator"
                );
            }
        }
    }
    // The CUDA lowering: bf16 operands into f32, beta = 1.
    let exe = after.executable(Target::Cuda).unwrap();
    let head: Vec<_> = gemms(cuda_program(&exe))
        .into_iter()
        .filter(|g| matches!(after.graph.node(g.node).op, Op::MatMulAcc { .. }))
        .filter(|g| g.m * g.n == 768 * 50304)
        .collect();
    assert!(head.len() >= 4, "one per chunk: {}", head.len());
    for g in head {
        assert!(g.accumulate, "{:?}", g.node);
        assert_eq!((g.dtype, g.compute), (DType::F32, Compute::Bf16InF32Out));
        assert_eq!(g.operand_dtype(), DType::BF16);
        assert_eq!(g.m * g.n, 768 * 50304);
    }
}

#[test]
fn gpt2_accumulated_over_four_micro_batches_plans_less_with_matmul_acc() {
    for precision in [Precision::Bf16, Precision::F32] {
        let before = compile("gpt2", precision, &accumulated(4), false);
        let after = compile("gpt2", precision, &accumulated(4), true);
        eprintln!(
            "gpt2 {precision:?} --accumulate 4 (cuda): {} bytes without matmul_acc, {} with ({} matmul_acc)",
            before.plan.total_bytes,
            after.plan.total_bytes,
            count(&after.graph, "matmul_acc")
        );
        if std::env::var("SHOW").is_ok() {
            eprintln!("{}\n{}", before.report.table(), after.report.table());
        }
        assert!(count(&after.graph, "matmul_acc") > 0);
        assert!(after.plan.total_bytes <= before.plan.total_bytes);
    }
}

#[test]
fn debug_dump() {
    let m = ingot_models::by_name("gpt2").unwrap();
    let opts = Options {
        precision: Some(Precision::Bf16),
        ..Options::for_target(Target::Cuda)
    };
    let r = pipeline::rewritten(&m, &accumulated(4), &opts).unwrap();
    let g = &r.graph;
    let users = g.users();
    for id in g.ids() {
        let n = g.node(id);
        if n.ty.shape.numel() == 768 * 3072
            && !matches!(n.op, Op::Leaf { .. })
            && n.ty.dtype == DType::F32
            && !matches!(n.op, Op::Transpose { .. })
        {
            let ins: Vec<String> = n
                .inputs
                .iter()
                .map(|&x| format!("{x}={}:{}", g.node(x).op.name(), g.ty(x)))
                .collect();
            eprintln!(
                "{id} {} {} <- {:?} users {:?}",
                n.op.name(),
                n.ty,
                ins,
                &users[id.index()]
            );
        }
    }
}
