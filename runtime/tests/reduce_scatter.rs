//! The data-parallel reduce-scatter (`Op::ReduceScatter`) on the CPU: two in-process thread
//! ranks run a graph built by hand through the whole pipeline (rewrite, fusion, plan,
//! lowering), and each rank's output is its rows of the sum over the ranks, bit for bit the
//! same rows of an all-reduce of the same operands.

use indexmap::IndexMap;
use ingot_compiler::exe::Executable;
use ingot_compiler::ir::DType;
use ingot_compiler::lower::Target;
use ingot_runtime::collective::{threads, Collective};
use ingot_runtime::cpu::planned::PlannedStep;
use ingot_runtime::StepExecutor;

#[path = "support/scatter.rs"]
mod scatter;
use scatter::{check_rows, input, step, RANKS};

/// Each rank's outputs (by name, as little-endian bytes) after one step of `exe` on thread
/// ranks, rank `r` writing its [`input`]s.
fn run(exe: &Executable, dtype: DType) -> Vec<IndexMap<String, Vec<u8>>> {
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
                    let t = input(r, i, g.ty(x).shape.dims(), dtype);
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

fn run_and_check(shapes: &[&[usize]], dtype: DType) {
    check_rows(
        shapes,
        dtype,
        &run(&step(shapes, dtype, Target::Cpu), dtype),
    );
}

#[test]
fn each_of_two_ranks_gets_its_rows_of_the_sum_bit_for_bit_as_the_all_reduce_has_them() {
    run_and_check(&[&[4, 2]], DType::F32);
}

#[test]
fn a_reduce_scatter_of_two_operands_of_different_shapes_gives_each_rank_its_rows_of_each() {
    run_and_check(&[&[4, 2], &[6, 3]], DType::F32);
    run_and_check(&[&[4, 2], &[6, 3]], DType::BF16);
}

#[test]
fn a_reduce_scatter_step_run_without_a_collective_says_so() {
    let mut s = PlannedStep::new(step(&[&[4, 2]], DType::F32, Target::Cpu)).unwrap();
    let e = s.step().unwrap_err().to_string();
    assert!(e.contains("2 data-parallel ranks"), "{e}");
}
