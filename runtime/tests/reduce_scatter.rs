//! The data-parallel reduce-scatter (`Op::ReduceScatter`) on the CPU: two in-process thread
//! ranks run a graph built by hand through the whole pipeline (rewrite, fusion, plan,
//! lowering), and each rank's output is its rows of the mean over the ranks, bit for bit the
//! same rows of an all-reduce of the same operands.

use indexmap::IndexMap;
use ingot_compiler::autodiff::{Phases, Step};
use ingot_compiler::ir::{DType, Graph, NodeId, Op, TensorType};
use ingot_compiler::lower::Target;
use ingot_compiler::pipeline::{self, Options};
use ingot_runtime::collective::{threads, Collective};
use ingot_runtime::cpu::planned::PlannedStep;
use ingot_runtime::tensor::Tensor;
use ingot_runtime::StepExecutor;

const RANKS: usize = 2;

/// `op` over `operands`, its outputs (the node, then a result node per further operand).
fn collective(g: &mut Graph, op: Op, operands: &[NodeId]) -> Vec<NodeId> {
    let first = g.push(op.clone(), operands, None).unwrap();
    let mut outs = vec![first];
    for (i, &x) in operands.iter().enumerate().skip(1) {
        let mut ty: TensorType = g.ty(x).clone();
        if let Op::ReduceScatter { ranks } = op {
            let mut d = ty.shape.dims().to_vec();
            d[0] /= ranks;
            ty.shape = d.as_slice().into();
        }
        outs.push(g.push(Op::Result { index: i }, &[first], Some(ty)).unwrap());
    }
    outs
}

/// A step with inputs `x0, x1, ..` of `shapes` and `dtype`, their reduce-scatter as outputs
/// `s0, s1, ..` and their all-reduce as outputs `a0, a1, ..`, compiled for the CPU.
fn step(shapes: &[&[usize]], dtype: DType) -> ingot_compiler::exe::Executable {
    let mut g = Graph::new();
    let xs: Vec<NodeId> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| g.input(&format!("x{i}"), *s, dtype).unwrap())
        .collect();
    let scattered = collective(&mut g, Op::ReduceScatter { ranks: RANKS }, &xs);
    let reduced = collective(&mut g, Op::AllReduce { ranks: RANKS }, &xs);
    for (i, (&s, &a)) in scattered.iter().zip(&reduced).enumerate() {
        g.set_output(&format!("s{i}"), s).unwrap();
        g.set_output(&format!("a{i}"), a).unwrap();
    }
    let n = g.len();
    let step = Step {
        graph: g,
        phases: Phases {
            forward: 0..n,
            backward: n..n,
            optimizer: n..n,
        },
    };
    pipeline::compile_step("reduce_scatter", step, &Options::for_target(Target::Cpu))
        .unwrap()
        .executable(Target::Cpu)
        .unwrap()
}

/// Rank `r`'s value of input `i` (`n` elements): different on every rank, and inexact in
/// binary so that the mean rounds.
fn value(r: usize, i: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|e| {
            ((e + 1) as f32 * 0.1 + i as f32) * if r == 0 { 1.0 } else { -0.37 } + r as f32 / 3.0
        })
        .collect()
}

/// Each rank's outputs (by name, as little-endian bytes) after one step of `exe` on thread
/// ranks, rank `r` writing `value(r, i, ..)` into input `xi`.
fn run(exe: &ingot_compiler::exe::Executable, dtype: DType) -> Vec<IndexMap<String, Vec<u8>>> {
    let handles: Vec<_> = threads::group(RANKS)
        .into_iter()
        .map(|c| {
            let exe = exe.clone();
            std::thread::spawn(move || {
                let r = c.rank();
                let mut s = PlannedStep::new(exe.clone()).unwrap();
                s.set_collective(Box::new(c)).unwrap();
                let g = exe.graph();
                let mut i = 0;
                while let Some(x) = g.leaf(&format!("x{i}")) {
                    let dims = g.ty(x).shape.dims().to_vec();
                    let v = value(r, i, dims.iter().product());
                    let t = match dtype {
                        DType::BF16 => Tensor::from_f32_as_bf16(dims.as_slice(), &v),
                        _ => Tensor::from_f32(dims.as_slice(), v),
                    };
                    s.write_leaf(&format!("x{i}"), &t).unwrap();
                    i += 1;
                }
                s.step().unwrap();
                g.outputs
                    .keys()
                    .map(|n| (n.clone(), s.read_output(n).unwrap().to_le_bytes()))
                    .collect()
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Checks that rank `r`'s output `s{i}` is rows `r·n/R .. (r+1)·n/R` of its `a{i}`, for each
/// operand, and that the all-reduce is the mean of the two ranks' values (f32: `(x0 + x1) / 2`).
fn check_rows(shapes: &[&[usize]], dtype: DType) {
    let out = run(&step(shapes, dtype), dtype);
    for (i, s) in shapes.iter().enumerate() {
        let n: usize = s.iter().product();
        if dtype == DType::F32 {
            let want: Vec<u8> = (0..n)
                .map(|e| (value(0, i, n)[e] + value(1, i, n)[e]) / 2.0)
                .flat_map(f32::to_le_bytes)
                .collect();
            for o in &out {
                assert_eq!(
                    o[&format!("a{i}")],
                    want,
                    "the all-reduce of x{i} is the mean"
                );
            }
        }
        for (r, o) in out.iter().enumerate() {
            let all = &o[&format!("a{i}")];
            let part = all.len() / RANKS;
            assert_eq!(
                o[&format!("s{i}")],
                all[r * part..(r + 1) * part],
                "rank {r}'s reduce-scatter of x{i} {s:?} ({dtype}) is its rows of the all-reduce"
            );
        }
    }
}

#[test]
fn each_of_two_ranks_gets_its_rows_of_the_mean_bit_for_bit_as_the_all_reduce_has_them() {
    check_rows(&[&[4, 2]], DType::F32);
}

#[test]
fn a_reduce_scatter_of_two_operands_of_different_shapes_gives_each_rank_its_rows_of_each() {
    check_rows(&[&[4, 2], &[6, 3]], DType::F32);
    check_rows(&[&[4, 2], &[6, 3]], DType::BF16);
}

#[test]
fn a_reduce_scatter_step_run_without_a_collective_says_so() {
    let mut s = PlannedStep::new(step(&[&[4, 2]], DType::F32)).unwrap();
    let e = s.step().unwrap_err().to_string();
    assert!(e.contains("2 data-parallel ranks"), "{e}");
}
