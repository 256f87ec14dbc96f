//! Snapshots of the memory plan reports (for the CPU target, as `ingot plan` prints them) and
//! of the fused kernel lists: the reference models and small hand-made graphs.
//! A change in the planner that moves any figure shows up here as a reviewable diff.

use ingot_compiler::ir::{DType, Graph, Init};
use ingot_compiler::pipeline;
use ingot_compiler::plan;
use ingot_compiler::report::Report;

fn cpu_options() -> pipeline::Options {
    pipeline::Options {
        plan: ingot_compiler::lower::Target::Cpu.plan_options(),
        ..Default::default()
    }
}

/// The kernels of a model's fused step, one line per kind of kernel with its count.
fn kernel_list(spec: &str) -> String {
    let c = ingot_models::compile_model(spec, &cpu_options()).unwrap();
    let mut s = String::new();
    for (k, n) in ingot_compiler::fuse::kernel_list(&c.graph) {
        s.push_str(&format!("{n:5}  {k}\n"));
    }
    s
}

ingot_ir_tests::snapshot_tests! {
    mlp_kernel_list => kernel_list("mlp"),
    gpt_mini_kernel_list => kernel_list("gpt-mini"),
    gpt2_kernel_list => kernel_list("gpt2"),
}

fn report_of(spec: &str) -> String {
    let c = ingot_models::compile_model(spec, &cpu_options()).unwrap();
    c.report.table()
}

ingot_ir_tests::snapshot_tests! {
    mlp_plan_report => report_of("mlp"),
    gpt_mini_plan_report => report_of("gpt-mini"),
    gpt2_plan_report => report_of("gpt2"),
}

/// The same step with its loss head in row chunks (`--chunk-loss-head`): eight blocks of
/// `[1024, 50304]` logits in place of one `[8192, 50304]`.
#[test]
fn gpt2_plan_report_with_its_loss_head_in_chunks() {
    let m = ingot_models::by_name("gpt2").unwrap();
    let step = ingot_compiler::autodiff::StepOptions {
        loss_head_chunk_bytes: ingot_compiler::autodiff::chunk::HEAD_CHUNK_BYTES,
        ..Default::default()
    };
    let c = pipeline::compile_observed_with(&m, &step, &cpu_options(), &mut |_| {}).unwrap();
    insta::assert_snapshot!(c.report.table());
}

#[test]
fn small_gpt_plan_report_json() {
    let c = ingot_models::compile_model(
        "gpt:vocab=64,d_model=16,layers=1,heads=2,d_ff=32,seq=8,batch=2",
        &cpu_options(),
    )
    .unwrap();
    insta::assert_json_snapshot!(c.report);
}

/// Two branches off one input joined at the end: the best plan holds both branch values, and
/// the elementwise ops on each branch write in place.
#[test]
fn diamond_plan_report() {
    let mut g = Graph::new();
    let x = g.input("x", [64, 64], DType::F32).unwrap();
    let w = g.parameter("w", [64, 64], DType::F32, Init::Zeros).unwrap();
    let a = g.matmul(x, w).unwrap();
    let a = g.tanh(a).unwrap();
    let b = g.matmul(w, x).unwrap();
    let b = g.exp(b).unwrap();
    let c = g.add(a, b).unwrap();
    let s = g.sum_all(c).unwrap();
    g.set_output("s", s).unwrap();
    let p = plan::plan(&g, &ingot_compiler::lower::Target::Cpu.plan_options()).unwrap();
    insta::assert_snapshot!(Report::new("diamond", &g, &p, None).table());
}
