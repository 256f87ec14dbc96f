//! Numbers that used to be silently wrong (issue 14, section 3): a long f32 sum through the CPU
//! executor is accurate (it used to stop at 2^24), and a model with a NaN weight reports a NaN
//! loss (NaN used to vanish through ReLU and max), both through the reference interpreter and
//! the fused, planned step; gradients through max and ReLU at NaN follow PyTorch's.

use indexmap::IndexMap;
use ingot_compiler::autodiff::grad;
use ingot_compiler::ir::{DType, Graph, Init, LeafKind, Shape};
use ingot_compiler::model::Model;
use ingot_compiler::pipeline;
use ingot_runtime::cpu::interp::run_graph;
use ingot_runtime::cpu::planned::PlannedStep;
use ingot_runtime::tensor::Tensor;
use ingot_runtime::StepExecutor;
use ingot_trainer::init::{init_leaves, synthetic_batch};
use ingot_trainer::session::Session;

fn map(items: Vec<(&str, Tensor)>) -> IndexMap<String, Tensor> {
    items.into_iter().map(|(n, t)| (n.to_string(), t)).collect()
}

#[test]
fn the_cpu_executor_sums_2_pow_24_plus_ones_exactly_and_random_values_accurately() {
    // 2^24 + 2^20 elements: a plain f32 sum of the ones stops at 2^24.
    let n = (1usize << 24) + (1 << 20);
    let mut g = Graph::new();
    let x = g.input("x", [n], DType::F32).unwrap();
    let s = g.sum_all(x).unwrap();
    g.set_output("s", s).unwrap();
    let ones = run_graph(&g, &map(vec![("x", Tensor::from_f32([n], vec![1.0; n]))])).unwrap();
    assert_eq!(ones.outputs["s"].as_f32().unwrap(), &[n as f32]);

    let mut st = 0x2545_F491_4F6C_DD1Du64;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            (st >> 40) as f32 / (1u64 << 24) as f32
        })
        .collect();
    let want: f64 = v.iter().map(|&x| x as f64).sum();
    let got = run_graph(&g, &map(vec![("x", Tensor::from_f32([n], v))])).unwrap();
    let got = got.outputs["s"].as_f32().unwrap()[0] as f64;
    let rel = (got - want).abs() / want;
    assert!(rel <= 1e-6, "sum {got}, f64 {want}: relative error {rel:e}");
}

/// All leaves of a step graph: default parameters and state, a synthetic batch.
fn leaves(g: &Graph, seed: u64) -> IndexMap<String, Tensor> {
    let mut l = init_leaves(g, LeafKind::Parameter, seed);
    l.extend(init_leaves(g, LeafKind::State, seed));
    l.extend(synthetic_batch(g, seed));
    l
}

/// Sets element 0 of parameter `name` to NaN.
fn poison(l: &mut IndexMap<String, Tensor>, name: &str) {
    let t = l
        .get_mut(name)
        .unwrap_or_else(|| panic!("no parameter {name}"));
    match &mut t.data {
        ingot_runtime::Data::F32(v) => v[0] = f32::NAN,
        other => panic!("{name} is {:?}", other.dtype()),
    }
}

/// The loss of one step of `m` with parameter `name` poisoned, from the reference interpreter
/// on the unfused step, and from the planned step compiled as a CPU session compiles it.
fn nan_weight_losses(m: &Model, name: &str) -> (f64, f64) {
    let c = pipeline::compile(m, &Session::cpu_options()).unwrap();
    let mut l = leaves(&c.step.graph, 5);
    poison(&mut l, name);
    let reference = run_graph(&c.step.graph, &l).unwrap().outputs["loss"]
        .scalar_f64()
        .unwrap();
    let mut planned = PlannedStep::from_plan(c.graph.clone(), c.plan.clone()).unwrap();
    let names: Vec<&str> = [LeafKind::Parameter, LeafKind::State, LeafKind::Input]
        .into_iter()
        .flat_map(|k| c.graph.leaves(k))
        .filter_map(|id| c.graph.leaf_name(id))
        .collect();
    for (n, v) in &l {
        if names.contains(&n.as_str()) {
            planned.write_leaf(n, v).unwrap();
        }
    }
    planned.step().unwrap();
    let fused = planned.read_output("loss").unwrap().scalar_f64().unwrap();
    (reference, fused)
}

#[test]
fn the_mlp_with_a_nan_weight_before_a_relu_reports_a_nan_loss() {
    let m = ingot_models::by_name("mlp").unwrap();
    let first = m.graph.leaves(LeafKind::Parameter)[0];
    let name = m.graph.leaf_name(first).unwrap().to_string();
    let (reference, fused) = nan_weight_losses(&m, &name);
    assert!(
        reference.is_nan(),
        "reference loss {reference} with {name}[0] = NaN"
    );
    assert!(
        fused.is_nan(),
        "planned, fused loss {fused} with {name}[0] = NaN"
    );
}

#[test]
fn an_ir_model_with_a_nan_weight_through_max_and_reduce_max_reports_a_nan_loss() {
    let text = r#"ingot-ir 1
%0 = input "x" : f32[4,3]
%1 = input "y" : i64[4]
%2 = parameter "w" init=normal(0.5) : f32[3,3]
%3 = matmul(%0, %2) : f32[4,3]
%4 = full value=0.0 : f32[4,3]
%5 = max(%3, %4) : f32[4,3]
%6 = reduce_max(%5) axes=[1] : f32[4,1]
%7 = reduce_sum(%6) axes=[0,1] : f32[1,1]
%8 = reshape(%7) : f32[]
output "loss" = %8
"#;
    let m = Model::from_ir_text("nan", text).unwrap();
    let (reference, fused) = nan_weight_losses(&m, "w");
    assert!(reference.is_nan(), "reference loss {reference}");
    assert!(fused.is_nan(), "planned, fused loss {fused}");
}

#[test]
fn gradients_through_relu_max_and_reduce_max_at_nan_follow_pytorch() {
    let mut g = Graph::new();
    let p = g.parameter("p", [2, 4], DType::F32, Init::Zeros).unwrap();
    let relu = ingot_compiler::trace::nn::relu(&mut g, p).unwrap();
    let zero = g.full(0.0, Shape::scalar(), DType::F32).unwrap();
    let zero = g.broadcast_to(zero, Shape::new(&[2, 4])).unwrap();
    let mx = g.maximum(p, zero).unwrap();
    let rm = g.max(p, &[1]).unwrap();
    let a = g.sum_all(relu).unwrap();
    let b = g.sum_all(mx).unwrap();
    let c = g.sum_all(rm).unwrap();
    let mut gs = Vec::new();
    for (name, y) in [("relu", a), ("max", b), ("reduce_max", c)] {
        let gp = grad(&mut g, y, &[p]).unwrap()[0];
        g.set_output(name, y).unwrap();
        g.set_output(&format!("d{name}"), gp).unwrap();
        gs.push(name);
    }
    let x = vec![f32::NAN, 1.0, -1.0, 0.0, 2.0, 3.0, -4.0, 0.5];
    let out = run_graph(&g, &map(vec![("p", Tensor::from_f32([2, 4], x))])).unwrap();
    for name in gs {
        assert!(
            out.outputs[name].as_f32().unwrap()[0].is_nan(),
            "{name} of NaN"
        );
    }
    // ReLU and max(x, 0): PyTorch's threshold_backward passes the gradient where the output
    // is not <= 0, NaN included; zero at ties.
    let want = [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0];
    assert_eq!(out.outputs["drelu"].as_f32().unwrap(), &want);
    assert_eq!(out.outputs["dmax"].as_f32().unwrap(), &want);
    // amax: a row whose max is NaN gets a NaN gradient (gy / 0 · 0); the other row's max
    // element gets the gradient.
    let d = out.outputs["dreduce_max"].as_f32().unwrap();
    assert!(d[..4].iter().all(|v| v.is_nan()), "{d:?}");
    assert_eq!(&d[4..], &[0.0, 1.0, 0.0, 0.0]);
}
