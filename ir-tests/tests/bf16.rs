//! bf16 through the compiler and the CPU backend: autodiff through casts against an f64
//! reference, and fused kernels that compute bf16 arithmetic in f32 and round where they
//! store, bit for bit as a graph-level statement of that rule run unfused.

use indexmap::IndexMap;
use ingot_compiler::autodiff::grad;
use ingot_compiler::fuse::{fuse, FuseOptions};
use ingot_compiler::ir::{DType, Graph, Init, NodeId, Op, Shape};
use ingot_compiler::trace::nn;
use ingot_runtime::cpu::interp::run_graph;
use ingot_runtime::tensor::Tensor;
use ingot_testkit::text::assert_mentions;

/// Deterministic values in [-1, 1).
fn values(seed: u64, n: usize) -> Vec<f64> {
    let mut next = ingot_kernels::fused::random::xorshift(seed);
    (0..n)
        .map(|_| (next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0)
        .collect()
}

fn f32_tensor(dims: &[usize], seed: u64) -> Tensor {
    let n = dims.iter().product();
    Tensor::from_f32(
        Shape::new(dims),
        values(seed, n).into_iter().map(|v| v as f32).collect(),
    )
}

/// `loss = sum(tanh(f32(bf16(x) @ bf16(w))) * c)`: the gradient of `w` that autodiff builds
/// through the casts (a cast back to f32 of a bf16 matmul of bf16 operands) against the f64
/// value of the same derivative, `xᵀ · ((1 - tanh²(x w)) * c)`, within bf16 rounding.
#[test]
fn the_gradient_through_casts_matches_an_f64_reference_within_bf16_rounding() {
    let (m, k, n) = (3, 8, 5);
    let mut g = Graph::new();
    let w = g.parameter("w", [k, n], DType::F32, Init::Zeros).unwrap();
    let x = g.input("x", [m, k], DType::F32).unwrap();
    let c = g.input("c", [m, n], DType::F32).unwrap();
    let xb = g.cast(x, DType::BF16).unwrap();
    let wb = g.cast(w, DType::BF16).unwrap();
    let h = g.matmul(xb, wb).unwrap();
    assert_eq!(g.ty(h).dtype, DType::BF16);
    let hf = g.cast(h, DType::F32).unwrap();
    let t = g.tanh(hf).unwrap();
    let tc = g.mul(t, c).unwrap();
    let loss = g.sum_all(tc).unwrap();
    let gw = grad(&mut g, loss, &[w]).unwrap()[0];
    assert_eq!(
        g.ty(gw).dtype,
        DType::F32,
        "the gradient has the parameter's dtype"
    );
    assert!(
        g.nodes()
            .iter()
            .filter(|n| matches!(n.op, Op::Convert))
            .count()
            > 3,
        "the backward pass casts too"
    );
    g.set_output("gw", gw).unwrap();

    let mut leaves = IndexMap::new();
    let (tw, tx, tcv) = (
        f32_tensor(&[k, n], 1),
        f32_tensor(&[m, k], 2),
        f32_tensor(&[m, n], 3),
    );
    leaves.insert("w".to_string(), tw.clone());
    leaves.insert("x".to_string(), tx.clone());
    leaves.insert("c".to_string(), tcv.clone());
    let got = run_graph(&g, &leaves).unwrap().outputs["gw"].to_f64_vec();

    let (wv, xv, cv) = (tw.to_f64_vec(), tx.to_f64_vec(), tcv.to_f64_vec());
    let mut want = vec![0.0; k * n];
    for i in 0..m {
        for j in 0..n {
            let h: f64 = (0..k).map(|p| xv[i * k + p] * wv[p * n + j]).sum();
            let d = (1.0 - h.tanh().powi(2)) * cv[i * n + j];
            for p in 0..k {
                want[p * n + j] += xv[i * k + p] * d;
            }
        }
    }
    let scale = want.iter().fold(0f64, |a, v| a.max(v.abs()));
    let worst = got
        .iter()
        .zip(&want)
        .fold(0f64, |a, (g, w)| a.max((g - w).abs()));
    // Each of x, w, h and the incoming gradient is rounded to bf16 (relative 2^-9 each).
    assert!(worst <= 0.03 * scale, "worst {worst:e}, scale {scale:e}");
    // And it is not the f32 gradient: the casts really round.
    assert!(
        worst > 1e-6 * scale,
        "worst {worst:e}: no bf16 rounding visible"
    );
}

/// The specification of bf16 inside fused kernels (`fuse::widen`), written at the graph level
/// independently of the kernel pass: `g` with every bf16 value that is not stored held as f32.
/// A bf16 leaf is read and widened; a bf16 constant is its f32 value; a cast to bf16 (and a
/// bf16 index) still rounds, and so does a value that leaves bf16 (a cast out of bf16, a compare
/// of bf16 values: their operands are rounded first); arithmetic on widened operands is f32 by
/// inference; a library op
/// (matmul, gather, ...) takes its operands rounded to their own dtypes, as buffers; each bf16
/// output is rounded once, and so is each bf16 value of `stored`, the other values fusion
/// stores: every reader, in the kernel that stores it too, reads the value stored. For graphs
/// whose only stored bf16 values are those, this is what the fused kernels must compute, bit
/// for bit.
fn rounded_at_stores(g: &Graph, stored: &[NodeId]) -> Graph {
    use ingot_compiler::ir::TensorType;
    let mut out = Graph::new();
    let mut new: Vec<NodeId> = Vec::with_capacity(g.len());
    let widen = |out: &mut Graph, id: NodeId| {
        let shape = out.ty(id).shape.clone();
        out.push(Op::Convert, &[id], Some(TensorType::new(shape, DType::F32)))
            .unwrap()
    };
    let round_to_bf16 = |out: &mut Graph, id: NodeId| {
        let shape = out.ty(id).shape.clone();
        out.push(
            Op::Convert,
            &[id],
            Some(TensorType::new(shape, DType::BF16)),
        )
        .unwrap()
    };
    for id in g.ids() {
        let n = g.node(id);
        let ins: Vec<NodeId> = n.inputs.iter().map(|x| new[x.index()]).collect();
        let ty = n.ty.clone();
        let bf16 = ty.dtype == DType::BF16;
        let f32_ty = TensorType::new(ty.shape.clone(), DType::F32);
        let v = match &n.op {
            Op::Leaf { .. } | Op::Iota { .. } if bf16 => {
                let x = out.push(n.op.clone(), &ins, Some(ty)).unwrap();
                widen(&mut out, x)
            }
            Op::Full { .. } if bf16 => out.push(n.op.clone(), &ins, Some(f32_ty)).unwrap(),
            Op::Convert if bf16 => {
                let x = out.push(Op::Convert, &ins, Some(ty)).unwrap();
                widen(&mut out, x)
            }
            Op::Convert if g.ty(n.inputs[0]).dtype == DType::BF16 => {
                let r = round_to_bf16(&mut out, ins[0]);
                out.push(Op::Convert, &[r], Some(ty)).unwrap()
            }
            Op::Compare(_) if g.ty(n.inputs[0]).dtype == DType::BF16 => {
                let r: Vec<NodeId> = ins.iter().map(|&x| round_to_bf16(&mut out, x)).collect();
                out.push(n.op.clone(), &r, Some(ty)).unwrap()
            }
            Op::Convert | Op::Leaf { .. } | Op::Full { .. } | Op::Iota { .. } => {
                out.push(n.op.clone(), &ins, Some(ty)).unwrap()
            }
            Op::Unary(_)
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Select
            | Op::Reduce { .. }
            | Op::Broadcast
            | Op::Transpose { .. }
            | Op::Slice { .. }
            | Op::Reshape
            | Op::StopGradient => {
                let declared = if bf16 { f32_ty } else { ty };
                out.push(n.op.clone(), &ins, Some(declared)).unwrap()
            }
            op => {
                // A library op reads buffers of its operands' own dtypes.
                let ins: Vec<NodeId> = n
                    .inputs
                    .iter()
                    .zip(&ins)
                    .map(|(&old, &x)| {
                        let want = g.ty(old).clone();
                        if out.ty(x).dtype == want.dtype {
                            x
                        } else {
                            out.push(Op::Convert, &[x], Some(want)).unwrap()
                        }
                    })
                    .collect();
                let x = out.push(op.clone(), &ins, Some(ty)).unwrap();
                if bf16 {
                    widen(&mut out, x)
                } else {
                    x
                }
            }
        };
        let v = if bf16 && stored.contains(&id) {
            let r = round_to_bf16(&mut out, v);
            widen(&mut out, r)
        } else {
            v
        };
        new.push(v);
    }
    let round = |out: &mut Graph, old: NodeId, x: NodeId| {
        let want = g.ty(old).clone();
        if out.ty(x).dtype == want.dtype {
            x
        } else {
            out.push(Op::Convert, &[x], Some(want)).unwrap()
        }
    };
    for (name, &id) in &g.outputs {
        let x = round(&mut out, id, new[id.index()]);
        out.set_output(name, x).unwrap();
    }
    for u in &g.updates {
        let x = round(&mut out, u.value, new[u.value.index()]);
        out.set_update(new[u.target.index()], x).unwrap();
    }
    out
}

/// Runs `g` fused (CPU kernels) and its specification [`rounded_at_stores`] (with the values
/// `stored` besides the outputs) unfused on the same leaves; every output must be equal bit for
/// bit. Returns the number of fused kernels, and whether some output differs from the graph
/// run op by op with a rounding after each.
fn fused_equals_unfused(
    g: &Graph,
    stored: &[NodeId],
    leaves: &IndexMap<String, Tensor>,
) -> (usize, bool) {
    let spec = rounded_at_stores(g, stored);
    let plain = run_graph(&spec, leaves).unwrap();
    let f = fuse(g, &FuseOptions::default()).unwrap();
    let fused = run_graph(&f.graph, leaves).unwrap();
    for (name, v) in &plain.outputs {
        let w = &fused.outputs[name];
        assert_eq!(w.dtype(), v.dtype(), "{name}");
        assert_eq!(w.to_le_bytes(), v.to_le_bytes(), "output {name}");
    }
    let per_op = run_graph(g, leaves).unwrap();
    let rounded_per_op = per_op
        .outputs
        .iter()
        .any(|(name, v)| v.to_le_bytes() != fused.outputs[name].to_le_bytes());
    let kernels = f
        .graph
        .nodes()
        .iter()
        .filter(|n| matches!(n.op, Op::Fused(_)))
        .count();
    (kernels, rounded_per_op)
}

fn leaves_of(g: &Graph, seed: u64) -> IndexMap<String, Tensor> {
    let mut out = IndexMap::new();
    for id in g.ids() {
        if let Op::Leaf { name, .. } = &g.node(id).op {
            let ty = &g.node(id).ty;
            let t = f32_tensor(ty.shape.dims(), seed + id.0 as u64);
            let t = match ty.dtype {
                DType::BF16 => Tensor::from_f32_as_bf16(ty.shape.clone(), t.as_f32().unwrap()),
                _ => t,
            };
            out.insert(name.clone(), t);
        }
    }
    out
}

/// A bf16 input, cast from f32 and back around some work.
fn bf16_input(g: &mut Graph, name: &str, dims: &[usize]) -> NodeId {
    g.input(name, Shape::new(dims), DType::BF16).unwrap()
}

#[test]
fn a_bf16_softmax_fused_gives_f32_arithmetic_rounded_at_the_store() {
    let mut g = Graph::new();
    let x = bf16_input(&mut g, "x", &[6, 33]);
    let s = nn::softmax(&mut g, x).unwrap();
    assert_eq!(g.ty(s).dtype, DType::BF16);
    g.set_output("s", s).unwrap();
    let (kernels, _) = fused_equals_unfused(&g, &[], &leaves_of(&g, 7));
    assert!(kernels >= 1);
}

#[test]
fn a_bf16_layer_norm_and_gelu_fused_give_f32_arithmetic_rounded_at_the_store() {
    let mut g = Graph::new();
    let x = bf16_input(&mut g, "x", &[5, 40]);
    // bf16 gain and bias here; the policy keeps them f32 and casts (tested elsewhere).
    let y = nn::layer_norm(&mut g, "ln", x, 1e-5).unwrap();
    let z = nn::gelu_tanh(&mut g, y).unwrap();
    g.set_output("z", z).unwrap();
    // The kernel stores its output alone: the normalized values and the GELU's `0.5 * y`,
    // which nothing else reads, are not stored (fuse::unread). It still goes on from them
    // rounded as they were when it stored them: dropping a store changes no value.
    let f = fuse(&g, &FuseOptions::default()).unwrap();
    let results = f
        .graph
        .ids()
        .filter(|&id| matches!(f.graph.node(id).op, Op::Result { .. }));
    assert_eq!(results.count(), 0, "{}", f.graph);
    use ingot_compiler::ir::BinaryOp;
    let mul = |id: NodeId| matches!(g.node(id).op, Op::Binary(BinaryOp::Mul));
    // `(x - mean) * rstd`, not `(x - mean)^2`.
    let sub = |x: &NodeId| matches!(g.node(*x).op, Op::Binary(BinaryOp::Sub));
    let of_sub = |id: NodeId| (g.node(id).inputs.iter()).filter(|x| sub(x)).count() == 1;
    let half = |x: NodeId| {
        let mut x = x;
        while matches!(g.node(x).op, Op::Broadcast | Op::Reshape) {
            x = g.node(x).inputs[0];
        }
        matches!(g.node(x).op, Op::Full { value, .. } if value == 0.5)
    };
    let xhat = g.ids().find(|&id| mul(id) && of_sub(id)).unwrap();
    let half_y = (g.ids())
        .find(|&id| mul(id) && g.node(id).inputs.iter().any(|&x| half(x)))
        .unwrap();
    let (_, differs) = fused_equals_unfused(&g, &[xhat, half_y], &leaves_of(&g, 11));
    assert!(
        differs,
        "a GELU chain rounded once gives other bits than rounded per op"
    );
}

#[test]
fn bf16_column_sums_and_mixed_casts_fused_give_f32_arithmetic_rounded_at_the_store() {
    // A bias gradient summed over the batch (the columns strategy), a cast in the middle of a
    // chain, and an f32 sum of a bf16 value (accumulated in f32).
    let mut g = Graph::new();
    let x = bf16_input(&mut g, "x", &[37, 24]);
    let e = g.exp(x).unwrap();
    let cols = g.sum(e, &[0]).unwrap();
    let ef = g.cast(e, DType::F32).unwrap();
    let rows = g.sum(ef, &[1]).unwrap();
    let y = g.input("y", [37, 24], DType::F32).unwrap();
    let yb = g.cast(y, DType::BF16).unwrap();
    let p = g.mul(yb, x).unwrap();
    let m = g.max(p, &[1]).unwrap();
    g.set_output("cols", cols).unwrap();
    g.set_output("rows", rows).unwrap();
    g.set_output("m", m).unwrap();
    fused_equals_unfused(&g, &[], &leaves_of(&g, 13));
}

// ---------------------------------------------------------------------------------------------
// The bf16 policy (compiler::precision)
// ---------------------------------------------------------------------------------------------

use ingot_compiler::ir::LeafKind;
use ingot_compiler::pipeline::{self, Options};
use ingot_compiler::precision::Precision;
use ingot_ir_tests::planned::{assert_planned_step_is_reference, seeded_leaves};
use ingot_trainer::session::Session;

const SMALL_GPT: &str = "gpt:vocab=64,d_model=32,layers=2,heads=4,d_ff=64,seq=8,batch=2";

fn bf16_options(base: Options) -> Options {
    Options {
        precision: Some(Precision::Bf16),
        ..base
    }
}

#[test]
fn the_bf16_policy_keeps_state_f32_and_multiplies_and_reduces_as_autocast_does() {
    let m = ingot_models::by_name(SMALL_GPT).unwrap();
    let opts = bf16_options(Options::unoptimized(
        ingot_compiler::lower::Target::Cpu.plan_options(),
    ));
    let c = pipeline::compile(&m, &opts).unwrap();
    let g = &c.step.graph;
    let (mut matmuls, mut reductions) = (0, 0);
    for id in g.ids() {
        let n = g.node(id);
        match &n.op {
            Op::Leaf { kind, name, .. } => {
                if let Some(l) = m.graph.leaf(name) {
                    assert_eq!(n.ty.dtype, m.graph.ty(l).dtype, "{name}");
                }
                // Parameters f32; optimizer state f32 (moments) or f64 (AdamW's step count),
                // but the weights' bf16 copies.
                let copy = ingot_compiler::autodiff::copies::param_of(g, id).is_some();
                if *kind != LeafKind::Input && !copy {
                    assert_ne!(n.ty.dtype, DType::BF16, "{name}");
                }
            }
            Op::MatMul { .. } => {
                matmuls += 1;
                assert_eq!(n.ty.dtype, DType::BF16, "{id:?}");
                for &x in &n.inputs {
                    assert_eq!(g.ty(x).dtype, DType::BF16, "{id:?}");
                }
            }
            Op::Reduce { .. } if g.ty(n.inputs[0]).dtype != DType::I32 => {
                // The forward's reductions, and the backward's sums of f32 values, are f32;
                // only the bias gradients (sums of a bf16 matmul's gradient) may be bf16, and
                // those accumulate in f32 inside the kernel.
                if n.ty.dtype == DType::BF16 {
                    continue;
                }
                reductions += 1;
                assert_eq!(n.ty.dtype, DType::F32, "{id:?}");
            }
            _ => {}
        }
    }
    assert!(
        matmuls >= 3 * 2 * 4,
        "forward and backward matmuls: {matmuls}"
    );
    assert!(reductions > 0);
    assert_eq!(g.ty(g.outputs["loss"]).dtype, DType::F32, "the loss is f32");
    for u in &g.updates {
        assert_eq!(
            g.ty(u.value).dtype,
            g.ty(u.target).dtype,
            "updates keep their dtype"
        );
        // Only the weights' copies are written in bf16.
        let copy = ingot_compiler::autodiff::copies::param_of(g, u.target).is_some();
        assert_eq!(g.ty(u.value).dtype == DType::BF16, copy);
    }
    // f32 and tf32 leave the forward graph as traced.
    assert_eq!(Precision::F32.apply(&m.graph).unwrap(), m.graph);
    assert_eq!(Precision::Tf32.apply(&m.graph).unwrap(), m.graph);
}

/// 20 steps of `spec` in f32 and under the bf16 policy, from the same weights and batches: every
/// step's loss within `tol` relative.
fn bf16_losses_track_f32(spec: &str, tol: f64) {
    let m = ingot_models::by_name(spec).unwrap();
    let mut f32_run = Session::new(&m, 9).unwrap();
    let mut bf16_run = Session::with_options(&m, 9, &bf16_options(Session::cpu_options())).unwrap();
    let mut worst = 0f64;
    for s in 0..20 {
        let (a, b) = (f32_run.step().unwrap().loss, bf16_run.step().unwrap().loss);
        assert!(b.is_finite(), "{spec} step {s}: bf16 loss {b}");
        let d = (a - b).abs() / a.abs();
        worst = worst.max(d);
        assert!(d <= tol, "{spec} step {s}: f32 loss {a}, bf16 {b} ({d:e})");
    }
    // bf16 really runs: the losses are not the f32 ones.
    assert!(worst > 0.0, "{spec}: the bf16 losses equal the f32 ones");
    eprintln!("{spec}: worst relative loss difference over 20 steps {worst:e}");
}

#[test]
fn bf16_mlp_losses_stay_within_one_percent_of_f32_over_20_steps() {
    bf16_losses_track_f32("mlp", 0.01);
}

#[test]
fn bf16_gpt_losses_stay_within_one_percent_of_f32_over_20_steps() {
    bf16_losses_track_f32(SMALL_GPT, 0.01);
}

#[test]
fn a_fused_planned_bf16_step_is_bit_identical_to_its_fused_reference_run_and_near_the_unfused_one()
{
    let m = ingot_models::by_name(SMALL_GPT).unwrap();
    let c = pipeline::compile(&m, &bf16_options(Session::cpu_options())).unwrap();
    let g = c.graph.clone();
    assert!(g.ids().any(|id| matches!(g.node(id).op, Op::Fused(_))));
    assert!(g.ids().any(|id| g.node(id).ty.dtype == DType::BF16));
    let leaves = seeded_leaves(&g, 5);
    // The unfused step graph (rewritten, not fused) on the same leaves.
    let unfused = pipeline::compile(
        &m,
        &bf16_options(Options {
            fuse: None,
            ..Session::cpu_options()
        }),
    )
    .unwrap();
    let plain = run_graph(&unfused.graph, &leaves).unwrap();
    let reference = assert_planned_step_is_reference(&c, &leaves);
    // The unfused step rounds after every op, the fused one where values are stored
    // (fuse::widen): the losses agree within bf16 rounding, and are not the same bits.
    let (a, b) = (
        plain.outputs["loss"].to_f64_vec()[0],
        reference.outputs["loss"].to_f64_vec()[0],
    );
    assert!((a - b).abs() <= 4e-3 * a.abs(), "unfused {a} fused {b}");
    assert_ne!(a, b, "the fused step rounds per op");
}

/// docs/examples/tiny-mlp.ir with `line` inserted after its header (line 11), as line 12.
fn tiny_mlp_with(line: &str) -> String {
    let text = include_str!("../../docs/examples/tiny-mlp.ir");
    text.replacen("ingot-ir 1\n", &format!("ingot-ir 1\n{line}\n"), 1)
}

#[test]
fn a_model_files_precision_line_compiles_its_step_in_that_precision_unless_overridden() {
    let m = ingot_compiler::model::Model::from_ir_text("tiny.ir", &tiny_mlp_with("precision bf16"))
        .unwrap();
    assert_eq!(m.precision, Precision::Bf16);
    let cpu = Options::for_target(ingot_compiler::lower::Target::Cpu);
    let c = pipeline::compile(&m, &cpu).unwrap();
    assert_eq!(c.report.precision, Precision::Bf16);
    let bf16_nodes = c
        .step
        .graph
        .ids()
        .filter(|&id| c.step.graph.ty(id).dtype == DType::BF16);
    assert!(bf16_nodes.count() > 0, "the autocast policy ran");
    // The command line (here the options) wins over the file.
    let f32 = Options {
        precision: Some(Precision::F32),
        ..cpu
    };
    let c = pipeline::compile(&m, &f32).unwrap();
    assert_eq!(c.report.precision, Precision::F32);
    assert!(c
        .step
        .graph
        .ids()
        .all(|id| c.step.graph.ty(id).dtype != DType::BF16));
    // Without the line, a file trains in f32.
    let plain = ingot_compiler::model::Model::from_ir_text("tiny.ir", &tiny_mlp_with("")).unwrap();
    assert_eq!(plain.precision, Precision::F32);
}

#[test]
fn a_bad_or_second_precision_line_is_an_error_naming_its_line() {
    let e = ingot_compiler::model::Model::from_ir_text("tiny.ir", &tiny_mlp_with("precision fp8"))
        .unwrap_err()
        .to_string();
    assert_mentions(&e, &["line 12:", "fp8", "tiny.ir"]);
    let two = tiny_mlp_with("precision bf16\nprecision f32");
    let e = ingot_compiler::model::Model::from_ir_text("tiny.ir", &two)
        .unwrap_err()
        .to_string();
    assert_mentions(
        &e,
        &["line 13:", "second precision line (the first is line 12)"],
    );
}

#[test]
fn a_bf16_op_with_an_f32_operand_and_no_cast_is_a_type_error_naming_the_line() {
    let text = "ingot-ir 1\nprecision bf16\n\
                %0 = parameter \"w\" init=zeros : bf16[4]\n\
                %1 = input \"x\" : f32[4]\n\
                %2 = mul(%0, %1) : bf16[4]\n";
    let e = ingot_compiler::model::Model::from_ir_text("mixed.ir", text)
        .unwrap_err()
        .to_string();
    assert_mentions(&e, &["line 5", "bf16[4], f32[4]"]);
}

#[test]
fn a_file_asking_for_tf32_is_refused_when_lowered_for_the_cpu() {
    let m = ingot_compiler::model::Model::from_ir_text("tiny.ir", &tiny_mlp_with("precision tf32"))
        .unwrap();
    let target = ingot_compiler::lower::Target::Cpu;
    let c = pipeline::compile(&m, &Options::for_target(target)).unwrap();
    let e = c.executable(target).unwrap_err().to_string();
    assert_mentions(&e, &["tf32", "cpu"]);
}

/// Autocast's `batch_norm` is on neither of its lists, so it gives its operand's dtype; its
/// `layer_norm` is on the f32 list. Under the bf16 policy a batch norm of a convolution (a bf16
/// value) is found by its shape, computes its statistics in f32 and gives bf16, so the ReLU
/// after it, and what a ResNet stores, stay bf16; a layer norm of the same values gives f32.
#[test]
fn a_batch_norm_of_a_bf16_convolution_gives_bf16_and_a_layer_norm_gives_f32() {
    use ingot_compiler::precision::{autocast_bf16, batch_norm_ends};
    let mut g = Graph::new();
    let x = g.input("x", [4, 3, 8, 8], DType::F32).unwrap();
    let c = nn::conv2d(&mut g, "conv", x, 3, 8, 3, 1, 1, 1, 1, true).unwrap();
    let b = nn::batch_norm2d(&mut g, "bn", c, 1e-5).unwrap();
    let r = nn::relu(&mut g, b).unwrap();
    let l = nn::layer_norm(&mut g, "ln", r, 1e-5).unwrap();
    g.set_output("bn", b).unwrap();
    g.set_output("relu", r).unwrap();
    g.set_output("ln", l).unwrap();
    let ends: Vec<NodeId> = g
        .ids()
        .zip(batch_norm_ends(&g))
        .filter_map(|(id, x)| x.map(|_| id))
        .collect();
    assert_eq!(
        ends,
        vec![b],
        "the batch norm's output, and only it, ends one"
    );
    assert_eq!(
        batch_norm_ends(&g)[b.index()],
        Some(c),
        "it normalizes the convolution"
    );

    let a = autocast_bf16(&g).unwrap();
    // Outputs keep the traced dtype (f32), so a bf16 value reaches its output through a cast.
    let computed = |name: &str| {
        let o = a.outputs[name];
        match a.node(o).op {
            Op::Convert => a.ty(a.node(o).inputs[0]).dtype,
            _ => a.ty(o).dtype,
        }
    };
    assert_eq!(computed("bn"), DType::BF16);
    assert_eq!(computed("relu"), DType::BF16);
    assert_eq!(computed("ln"), DType::F32);
    for id in a.ids() {
        if let Op::Reduce { .. } = a.node(id).op {
            assert_eq!(a.ty(id).dtype, DType::F32, "statistics are f32: {id:?}");
        }
    }
}

/// A ResNet's first loss (the forward pass, before its lr-0.1 steps make f32 and bf16 runs
/// diverge at a small batch) under the bf16 policy, batch norms giving bf16, within 2% of f32's.
/// (At this shape bf16 convolutions alone move it 0.93%: the policy with f32 batch-norm outputs
/// gave 2.161476 against f32's 2.181746; bf16 outputs give 2.159839, 1.00%.)
#[test]
fn a_bf16_resnet_with_bf16_batch_norms_starts_within_two_percent_of_f32() {
    let m = ingot_models::by_name("resnet:depth=18,side=32,batch=8,classes=10").unwrap();
    let a = Session::new(&m, 9).unwrap().step().unwrap().loss;
    let opts = bf16_options(Session::cpu_options());
    let b = Session::with_options(&m, 9, &opts)
        .unwrap()
        .step()
        .unwrap()
        .loss;
    let d = (a - b).abs() / a.abs();
    assert!(d <= 0.02 && d > 0.0, "f32 loss {a}, bf16 {b} ({d:e})");
}
