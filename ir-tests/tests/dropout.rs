//! Dropout (`nn.Dropout(p)`): a counter-based mask drawn from the step's seed input, recomputed
//! by the backward pass, the identity in evaluation mode; its gradient, its statistics, its
//! repeatability, the trainer's per-step seed, and its CUDA kernel (generated here; run on a GPU
//! by the kernel checks).

use indexmap::IndexMap;
use ingot_compiler::autodiff::optim::Optimizer;
use ingot_compiler::ir::{DType, Graph, LeafKind, Mode, Op, Shape};
use ingot_compiler::lower::Target;
use ingot_compiler::model::Model;
use ingot_compiler::pipeline;
use ingot_compiler::precision::Precision;
use ingot_compiler::trace::nn::{self, DROPOUT_SEED};
use ingot_ir_tests::gradcheck::{arg, check};
use ingot_runtime::cpu::interp::run_graph;
use ingot_runtime::cpu::planned::PlannedStep;
use ingot_runtime::tensor::Tensor;
use ingot_runtime::StepExecutor;
use ingot_testkit::programs::cuda_program;
use ingot_testkit::text::assert_mentions;
use ingot_trainer::eval::forward_step;
use ingot_trainer::session::Session;

fn seed(v: i64) -> Tensor {
    Tensor::from_i64(Shape::scalar(), vec![v])
}

#[test]
fn dropout_gradients_match_finite_differences_at_a_fixed_seed() {
    check(
        "dropout",
        &[arg(&[4, 25])],
        vec![(DROPOUT_SEED, seed(42))],
        |g, p| nn::dropout(g, "drop", p[0], 0.3),
    );
    // Two layers around a nonlinearity: each backward pass draws its own layer's mask again.
    check(
        "dropout-tanh-dropout",
        &[arg(&[3, 20])],
        vec![(DROPOUT_SEED, seed(-7))],
        |g, p| {
            let h = nn::dropout(g, "drop1", p[0], 0.5)?;
            let h = g.tanh(h)?;
            nn::dropout(g, "drop2", h, 0.2)
        },
    );
}

/// `x` (ones, `[n]`) through one dropout layer of probability `p`, compiled and planned for the
/// CPU as the evaluation step is (forward only); its output for the given seed.
fn drop_ones(n: usize, p: f64, layers: &[&str], s: i64) -> Vec<Vec<f32>> {
    let mut g = Graph::new();
    let x = g.input("x", [n], DType::F32).unwrap();
    for (i, name) in layers.iter().enumerate() {
        let y = nn::dropout(&mut g, name, x, p).unwrap();
        g.set_output(&format!("y{i}"), y).unwrap();
    }
    let exe = pipeline::compile_step("dropout", forward_step(&g), &Session::cpu_options())
        .unwrap()
        .executable(Target::Cpu)
        .unwrap();
    let mut planned = PlannedStep::new(exe).unwrap();
    planned
        .write_leaf("x", &Tensor::from_f32([n], vec![1.0; n]))
        .unwrap();
    planned.write_leaf(DROPOUT_SEED, &seed(s)).unwrap();
    planned.step().unwrap();
    (0..layers.len())
        .map(|i| {
            planned
                .read_output(&format!("y{i}"))
                .unwrap()
                .as_f32()
                .unwrap()
                .to_vec()
        })
        .collect()
}

#[test]
fn the_kept_fraction_is_one_minus_p_within_statistical_bounds_and_kept_values_are_scaled() {
    let n = 100_000;
    for p in [0.1, 0.5, 0.9] {
        let y = &drop_ones(n, p, &["drop"], 1234)[0];
        let scale = (1.0 / (1.0 - p)) as f32;
        assert!(
            y.iter().all(|&v| v == 0.0 || v == scale),
            "p {p}: every element is 0 or 1/(1-p)"
        );
        let kept = y.iter().filter(|&&v| v != 0.0).count() as f64 / n as f64;
        // Five standard deviations of a binomial proportion.
        let sigma = (p * (1.0 - p) / n as f64).sqrt();
        assert!(
            (kept - (1.0 - p)).abs() < 5.0 * sigma,
            "p {p}: kept {kept}, expected {} ± {}",
            1.0 - p,
            5.0 * sigma
        );
        // The mean is preserved in expectation.
        let mean = y.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
        assert!(
            (mean - 1.0).abs() < 5.0 * sigma / (1.0 - p),
            "p {p}: mean {mean}"
        );
    }
}

#[test]
fn the_same_seed_gives_the_same_mask_and_another_seed_or_layer_another() {
    let n = 10_000;
    let a = drop_ones(n, 0.5, &["drop1", "drop2"], 5);
    let b = drop_ones(n, 0.5, &["drop1", "drop2"], 5);
    let c = drop_ones(n, 0.5, &["drop1", "drop2"], 6);
    assert_eq!(a, b, "the same seed repeats bit for bit");
    let differ = |u: &[f32], v: &[f32]| u.iter().zip(v).filter(|(x, y)| x != y).count();
    // Independent masks at p = 0.5 differ at about half the elements.
    for (what, d) in [
        ("another seed", differ(&a[0], &c[0])),
        ("another layer", differ(&a[0], &a[1])),
    ] {
        assert!(
            (d as f64 - n as f64 / 2.0).abs() < 5.0 * (n as f64 / 4.0).sqrt(),
            "{what}: {d} of {n} elements differ"
        );
    }
}

/// A two-layer classifier with dropout after the hidden layer, traced in both modes.
fn mlp_with_dropout(p: f64) -> Model {
    let (graph, eval_graph) = Model::trace_modes("mlp-dropout", |g| {
        let x = g.input("x", [8, 12], DType::F32)?;
        let y = g.input("y", [8], ingot_compiler::model::ID_DTYPE)?;
        let h = nn::linear(g, "fc1", x, 12, 32, true)?;
        let h = nn::relu(g, h)?;
        let h = nn::dropout(g, "drop", h, p)?;
        let logits = nn::linear(g, "fc2", h, 32, 10, true)?;
        let loss = nn::softmax_cross_entropy(g, logits, y)?;
        g.set_output("loss", loss)
    })
    .unwrap();
    Model {
        name: "mlp-dropout".into(),
        graph,
        eval_graph,
        optimizer: Optimizer::Sgd { lr: 0.1 },
        precision: Precision::F32,
    }
}

#[test]
fn in_eval_mode_dropout_is_the_identity() {
    let m = mlp_with_dropout(0.5);
    let e = m.eval_graph.as_ref().expect("dropout traces differently");
    let drops = |g: &Graph| {
        g.nodes()
            .iter()
            .filter(|n| matches!(n.op, Op::Dropout { .. }))
            .count()
    };
    assert_eq!(drops(&m.graph), 1);
    assert_eq!(drops(e), 0);
    assert!(e.leaf(DROPOUT_SEED).is_none(), "evaluation draws nothing");
    // The eval trace computes the model without the dropout layer.
    let plain = mlp_with_dropout(0.0);
    assert!(
        plain.eval_graph.is_none(),
        "p = 0 is the identity in both modes"
    );
    assert_eq!(e, &plain.graph);
    // Evaluated on the same values: the eval loss is the no-dropout loss, bit for bit.
    let mut values: IndexMap<String, Tensor> =
        ingot_trainer::init::init_leaves(&m.graph, LeafKind::Parameter, 3);
    values.extend(ingot_trainer::init::synthetic_batch(&m.graph, 3));
    let loss = |g: &Graph| run_graph(g, &values).unwrap().outputs["loss"].to_f64_vec()[0];
    assert_eq!(loss(e).to_bits(), loss(&plain.graph).to_bits());
    assert_ne!(loss(&m.graph), loss(e), "training mode drops");
    // A single layer traced in evaluation mode returns its input itself.
    let mut g = Graph::new();
    g.set_mode(Mode::Eval);
    let x = g.input("x", [3], DType::F32).unwrap();
    assert_eq!(nn::dropout(&mut g, "drop", x, 0.7).unwrap(), x);
}

#[test]
fn a_p_outside_zero_to_one_is_an_error_naming_the_layer() {
    let mut g = Graph::new();
    let x = g.input("x", [3], DType::F32).unwrap();
    for p in [-0.1, 1.5, f64::NAN] {
        let e = nn::dropout(&mut g, "head.drop", x, p)
            .unwrap_err()
            .to_string();
        assert_mentions(&e, &["head.drop", "probability"]);
    }
}

/// The step keeps no mask: the forward and the backward pass each draw it (two dropout
/// kernels), and the planned step computes the reference interpreter's bits.
#[test]
fn a_training_step_draws_the_mask_twice_and_planned_matches_the_reference() {
    let m = mlp_with_dropout(0.4);
    let opts = Session::cpu_options();
    let compiled = pipeline::compile(&m, &opts).unwrap();
    let g = &compiled.graph;
    let drops = g
        .nodes()
        .iter()
        .filter(|n| matches!(n.op, Op::Dropout { .. }))
        .count();
    assert_eq!(drops, 2, "one dropout forward, one backward");
    // No mask of any kind is made: the bool values are relu's, as without dropout.
    let plain = pipeline::compile(&mlp_with_dropout(0.0), &opts).unwrap();
    let bools = |g: &Graph| {
        g.nodes()
            .iter()
            .filter(|n| n.ty.dtype == DType::Bool)
            .count()
    };
    assert_eq!(bools(g), bools(&plain.graph), "no mask is stored");
    let mut s = Session::new(&m, 9).unwrap();
    let mut values: IndexMap<String, Tensor> = s.parameters();
    values.extend(s.batch());
    values.insert(
        DROPOUT_SEED.into(),
        seed(ingot_kernels::rng::step_seed(9, 0) as i64),
    );
    let step = ingot_compiler::autodiff::training_step(&m.graph, &m.optimizer)
        .unwrap()
        .graph;
    let want = run_graph(&step, &values).unwrap().outputs["loss"].to_f64_vec()[0];
    let got = s.step().unwrap().loss;
    assert!(
        (got - want).abs() <= 1e-6 * want.abs(),
        "the session's first step draws step_seed(run seed, 0): {got} vs {want}"
    );
    // Unfused, planned: the reference interpreter's bits.
    let p = ingot_compiler::plan::plan(&step, &Target::Cpu.plan_options()).unwrap();
    let mut planned = PlannedStep::from_plan(step.clone(), p).unwrap();
    for (name, v) in &values {
        planned.write_leaf(name, v).unwrap();
    }
    planned.step().unwrap();
    let reference = run_graph(&step, &values).unwrap();
    for (name, v) in &reference.outputs {
        let got = planned.read_output(name).unwrap();
        assert_eq!(got.to_le_bytes(), v.to_le_bytes(), "output {name}");
    }
}

/// The trainer's seed: the same run seed repeats a run's losses; another changes them; a run
/// resumed at step k (parameters loaded, `set_updates_done(k)`) draws step k's masks.
#[test]
fn runs_repeat_by_their_seed_and_a_resumed_run_draws_the_uninterrupted_runs_masks() {
    let m = mlp_with_dropout(0.5);
    let losses = |s: &mut Session, n: usize| -> Vec<u64> {
        (0..n).map(|_| s.step().unwrap().loss.to_bits()).collect()
    };
    let mut a = Session::new(&m, 21).unwrap();
    let la = losses(&mut a, 4);
    let mut b = Session::new(&m, 21).unwrap();
    assert_eq!(losses(&mut b, 4), la);
    // Another run seed with the same parameters and batch: other masks.
    let mut c = Session::new(&m, 22).unwrap();
    c.load_parameters(&Session::new(&m, 21).unwrap().parameters())
        .unwrap();
    c.set_batch_map(&Session::new(&m, 21).unwrap().batch())
        .unwrap();
    assert_ne!(losses(&mut c, 4), la);
    // Resume after two steps.
    let mut first = Session::new(&m, 21).unwrap();
    losses(&mut first, 2);
    let mut resumed = Session::new(&m, 21).unwrap();
    resumed.load_parameters(&first.parameters()).unwrap();
    resumed
        .load_optimizer_state(&first.optimizer_state())
        .unwrap();
    resumed.set_updates_done(2);
    assert_eq!(losses(&mut resumed, 2), la[2..]);
}

#[test]
fn dropout_in_the_ir_text_form_round_trips_and_is_the_identity_in_eval_mode() {
    let text = ingot_testkit::ir_text::dropout_model(6, "0.25", 77);
    let m = Model::from_ir_text("q.ir", &text).unwrap();
    assert_eq!(
        m.graph.node(ingot_compiler::ir::NodeId(5)).op,
        Op::Dropout { p: 0.25, salt: 77 }
    );
    let printed = m.graph.to_string();
    assert!(
        printed.contains("dropout(%4, %3) p=0.25 salt=77"),
        "{printed}"
    );
    assert_eq!(ingot_compiler::ir::text::parse(&printed).unwrap(), m.graph);
    let e = m.eval_graph.as_ref().unwrap();
    assert_eq!(e.node(ingot_compiler::ir::NodeId(5)).op, Op::Reshape);
    // Trains on the CPU, the session writing the seed.
    let mut s = Session::new(&m, 4).unwrap();
    assert!(s.step().unwrap().loss.is_finite());
    // A bad p or seed is an error naming the line.
    let bad = text.replace("p=0.25", "p=2");
    let e = Model::from_ir_text("q.ir", &bad).unwrap_err().to_string();
    assert_mentions(&e, &["line 8", "probability"]);
    let bad = text.replace("i64[]", "f32[]");
    let e = Model::from_ir_text("q.ir", &bad).unwrap_err().to_string();
    assert_mentions(&e, &["line 8", "seed"]);
}

/// The CUDA compile lowers dropout to its own kernel, forward and backward, in f32 and under
/// bf16 autocast; the kernel spells the host's generator (checked against the CPU on a GPU by
/// `testkit/tests/cuda_kernels.rs`).
#[test]
fn dropout_compiled_for_cuda_is_a_kernel_that_draws_the_hosts_counter() {
    use ingot_compiler::lower::cuda::DeviceOp;
    for precision in [Precision::F32, Precision::Bf16] {
        let m = mlp_with_dropout(0.25);
        let opts = pipeline::Options {
            precision: Some(precision),
            ..pipeline::Options::for_target(Target::Cuda)
        };
        let exe = pipeline::compile(&m, &opts)
            .unwrap()
            .executable(Target::Cuda)
            .unwrap();
        let p = cuda_program(&exe);
        let g = exe.graph();
        let launches: Vec<&str> = p
            .ops
            .iter()
            .filter_map(|op| match op {
                DeviceOp::Launch { node, kernel, .. }
                    if matches!(g.node(*node).op, Op::Dropout { .. }) =>
                {
                    Some(p.kernels[*kernel].source.as_str())
                }
                _ => None,
            })
            .collect();
        assert_eq!(launches.len(), 2, "{precision:?}: forward and backward");
        for src in launches {
            assert!(src.contains("ingot dropout"), "{src}");
            assert!(src.contains("0x9e3779b97f4a7c15ull"), "{src}");
            assert!(src.contains("0xbf58476d1ce4e5b9ull"), "{src}");
            assert!(src.contains("u >= 0.25f"), "{src}");
            if precision == Precision::Bf16 {
                assert!(src.contains("ig_widen(x[e])"), "{src}");
            }
        }
    }
}

/// Under bf16 autocast dropout runs on the bf16 activation (widened to f32, scaled, rounded
/// once, as on the GPU) in its planned workspace: the step trains on the CPU, and a second
/// session of the same seed repeats it bit for bit.
#[test]
fn a_bf16_step_with_dropout_trains_on_the_cpu_and_repeats() {
    let m = Model {
        precision: Precision::Bf16,
        ..mlp_with_dropout(0.3)
    };
    let run = || {
        let mut s = Session::new(&m, 8).unwrap();
        (0..3)
            .map(|_| s.step().unwrap().loss.to_bits())
            .collect::<Vec<_>>()
    };
    let a = run();
    assert!(a.iter().all(|l| f64::from_bits(*l).is_finite()));
    assert_eq!(a, run());
    let s = Session::new(&m, 8).unwrap();
    assert!(s
        .graph()
        .nodes()
        .iter()
        .any(|n| matches!(n.op, Op::Dropout { .. }) && n.ty.dtype == DType::BF16));
}
