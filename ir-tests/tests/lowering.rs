//! Snapshots of the lowered programs of the reference models (compiler::lower): what each
//! backend runs per step, summarised (operation counts, the dependency graph's shape, launch
//! shapes, GEMM shapes) with a fingerprint of every offset, argument and source byte. Lowering
//! needs no GPU, so the CUDA programs are checked here, on every machine.

use ingot_compiler::exe::Executable;
use ingot_compiler::lower::{Program, Target};
use ingot_compiler::pipeline::{self, Options};

fn lowered(spec: &str, target: Target) -> Executable {
    pipeline::compile_model(spec, &Options::for_target(target))
        .unwrap()
        .executable(target)
        .unwrap()
}

fn summary(spec: &str, target: Target) -> String {
    lowered(spec, target).program().summary()
}

#[test]
fn mlp_cuda_program() {
    insta::assert_snapshot!(summary("mlp", Target::Cuda));
}

#[test]
fn gpt_mini_cuda_program() {
    insta::assert_snapshot!(summary("gpt-mini", Target::Cuda));
}

#[test]
fn gpt2_cuda_program() {
    insta::assert_snapshot!(summary("gpt2", Target::Cuda));
}

#[test]
fn mlp_cpu_program() {
    insta::assert_snapshot!(summary("mlp", Target::Cpu));
}

#[test]
fn gpt_mini_cpu_program() {
    insta::assert_snapshot!(summary("gpt-mini", Target::Cpu));
}

#[test]
fn lowering_the_same_step_twice_gives_the_same_program() {
    let (a, b) = (
        lowered("gpt-mini", Target::Cuda),
        lowered("gpt-mini", Target::Cuda),
    );
    assert!(a.program() == b.program());
    a.check_program().unwrap();
}

#[test]
fn every_operation_of_the_gpt2_program_stays_inside_its_allocation_and_is_ordered() {
    let exe = lowered("gpt2", Target::Cuda);
    let Program::Cuda(p) = exe.program() else {
        panic!("a cuda executable holds a cuda program")
    };
    // The checks lowering ran, run again from the outside: bounds, tables, dependencies.
    exe.program().check(exe.graph(), exe.plan()).unwrap();
    assert_eq!(p.total_bytes, exe.plan().total_bytes);
    assert_eq!(
        p.counts().gemms,
        exe.graph()
            .ids()
            .filter(|&id| {
                matches!(
                    exe.graph().node(id).op,
                    ingot_compiler::ir::Op::MatMul { .. }
                )
            })
            .count()
    );
}
