//! Data parallelism on several GPUs over NCCL ([`ingot_runtime::cuda::ranks::GpuRanks`]): N
//! GPUs, each training on its shard of a batch, reach the parameters one GPU reaches on the
//! union of the shards (f32, within the rounding of the reduction, over 10 steps); every rank
//! holds the same bits; every GPU's allocation is its plan; and 1000 steps leave free memory on
//! every GPU as it was. Skips, saying why, without two GPUs or NCCL (fails instead with
//! `INGOT_REQUIRE_GPU=1` and `INGOT_REQUIRE_GPUS=2`).

use indexmap::IndexMap;
use ingot_compiler::autodiff::StepOptions;
use ingot_compiler::exe::Executable;
use ingot_compiler::ir::LeafKind;
use ingot_compiler::lower::Target;
use ingot_compiler::model::Model;
use ingot_runtime::cuda::ranks::GpuRanks;
use ingot_runtime::cuda::{self, nccl, CudaOptions, CudaStep};
use ingot_runtime::StepExecutor;
use ingot_trainer::init::{init_leaves, synthetic_batch};

/// The two GPUs, held by one test at a time, when this machine has two and NCCL; a skip (or,
/// where required, a failure) says why. One at a time: a test that checks the GPUs' free memory
/// over 1000 steps would otherwise see the other tests' sessions come and go.
fn two_gpus(test: &str) -> Option<std::sync::MutexGuard<'static, ()>> {
    static GPUS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    if !cuda::gpu_for_test(test) {
        return None;
    }
    let required = std::env::var("INGOT_REQUIRE_GPUS").is_ok_and(|v| v.trim() == "2");
    let why = match (cuda::available(), nccl::load()) {
        (Ok(n), Ok(_)) if n >= 2 => {
            return Some(GPUS.lock().unwrap_or_else(|p| p.into_inner()));
        }
        (Ok(n), Ok(_)) => format!("this machine has {n} GPU(s), the test needs 2"),
        (_, Err(e)) => e,
        (Err(e), _) => e.to_string(),
    };
    if required {
        panic!("{test}: INGOT_REQUIRE_GPUS=2 is set but {why}");
    }
    eprintln!("skipping {test}: {why}");
    None
}

#[path = "support/steps.rs"]
mod steps;
use steps::max_relative;

fn compile(model: &Model, ranks: usize) -> Executable {
    steps::compile_for_ranks(model, ranks, Target::Cuda)
}

/// `steps` steps of `model(ranks * per_rank)` on GPU 0, and of `model(per_rank)` compiled for
/// `ranks` ranks on GPUs 0..ranks, each on its shard of the same batches; the largest relative
/// difference of any parameter, after checking every rank holds the same bits.
fn gpus_against_union(
    model: impl Fn(usize) -> Model,
    ranks: usize,
    per_rank: usize,
    steps: u64,
) -> f64 {
    let union_exe = compile(&model(ranks * per_rank), 1);
    let rank_exe = compile(&model(per_rank), ranks);
    let g = union_exe.graph().clone();
    let state = steps::seeded_state(&g, &[LeafKind::Parameter, LeafKind::State], 5);
    let batches = steps::synthetic_batches(&g, steps, 100);

    // The union's batch is written whole, as the trainer writes it (its bytes, not a tensor
    // of one rank's shape): the ranks cut it into their shards.
    let run = |exec: &mut dyn StepExecutor| {
        for (n, v) in &state {
            exec.write_leaf(n, v).unwrap();
        }
        for b in &batches {
            for (n, v) in b {
                let id = exec.leaf_id(n).unwrap();
                exec.write_node_bytes(id, &v.to_le_bytes()).unwrap();
            }
            exec.step().unwrap();
        }
    };
    let mut union = CudaStep::new(union_exe, CudaOptions::default()).unwrap();
    run(&mut union);
    let mut gpus = GpuRanks::new(rank_exe, false).unwrap();
    run(&mut gpus);

    let mut worst = 0.0f64;
    for n in state.keys() {
        let r0 = gpus.ranks()[0].read_leaf(n).unwrap();
        for (r, s) in gpus.ranks().iter().enumerate().skip(1) {
            assert_eq!(
                s.read_leaf(n).unwrap().to_le_bytes(),
                r0.to_le_bytes(),
                "rank {r} holds other bits of {n} than rank 0"
            );
        }
        worst = worst.max(max_relative(&r0, &union.read_leaf(n).unwrap()));
    }
    worst
}

#[test]
fn two_gpus_on_two_shards_train_an_mlp_as_one_gpu_on_the_union() {
    let Some(_gpus) = two_gpus("two_gpus_on_two_shards_train_an_mlp_as_one_gpu_on_the_union")
    else {
        return;
    };
    let worst = gpus_against_union(
        |b| ingot_models::mlp_with(b, ingot_compiler::ir::DType::F32).unwrap(),
        2,
        4,
        10,
    );
    eprintln!("mlp: 2 GPUs against one on the union, largest relative difference {worst:.3e}");
    assert!(worst <= 1e-6, "relative difference {worst}");
}

#[test]
fn two_gpus_on_two_shards_train_a_gpt_as_one_gpu_on_the_union() {
    let Some(_gpus) = two_gpus("two_gpus_on_two_shards_train_a_gpt_as_one_gpu_on_the_union") else {
        return;
    };
    let worst = gpus_against_union(
        |b| {
            // Large enough for several gradient buckets, so several all-reduces overlap the
            // backward pass. SGD, not AdamW: see data_parallel.rs (the key bias's gradient is
            // rounding noise, which AdamW scales to a full step).
            let spec =
                format!("gpt:vocab=32768,d_model=256,layers=2,heads=4,d_ff=1024,seq=32,batch={b}");
            steps::with_sgd(ingot_models::by_name(&spec).unwrap())
        },
        2,
        2,
        10,
    );
    eprintln!("gpt: 2 GPUs against one on the union, largest relative difference {worst:.3e}");
    assert!(worst <= 1e-6, "relative difference {worst}");
}

#[test]
fn every_gpu_takes_its_plan_and_1000_steps_allocate_nothing_on_any() {
    let Some(_gpus) = two_gpus("every_gpu_takes_its_plan_and_1000_steps_allocate_nothing_on_any")
    else {
        return;
    };
    let exe = compile(&ingot_models::by_name("gpt-mini").unwrap(), 2);
    let planned = exe.plan().total_bytes;
    let g = exe.graph().clone();
    let mut gpus = GpuRanks::new(exe, false).unwrap();
    for (n, v) in init_leaves(&g, LeafKind::Parameter, 1)
        .into_iter()
        .chain(init_leaves(&g, LeafKind::State, 1))
        .chain(synthetic_batch(&g, 2))
    {
        gpus.write_leaf(&n, &v).unwrap();
    }
    let page = 2 << 20;
    for (r, s) in gpus.ranks().iter().enumerate() {
        let m = s.memory();
        assert_eq!(m.requested, planned.max(1), "rank {r}");
        assert!(
            m.allocation >= planned && m.allocation < planned + page,
            "rank {r}: the allocation took {} bytes for a plan of {planned}",
            m.allocation
        );
    }
    eprintln!(
        "NCCL {}: {:?} bytes per rank (communicators and connections)",
        gpus.nccl().version,
        gpus.nccl().bytes
    );
    gpus.step().unwrap();
    let free = |gpus: &GpuRanks| -> Vec<usize> {
        gpus.ranks()
            .iter()
            .map(|s| s.free_memory().unwrap())
            .collect()
    };
    let before = free(&gpus);
    for _ in 0..1000 {
        gpus.step().unwrap();
    }
    assert_eq!(
        free(&gpus),
        before,
        "free memory moved on some GPU over 1000 steps"
    );
}

#[test]
fn two_gpus_evaluate_a_batch_as_one_gpu_evaluates_it_whole() {
    let Some(_gpus) = two_gpus("two_gpus_evaluate_a_batch_as_one_gpu_evaluates_it_whole") else {
        return;
    };
    // As data_parallel.rs's CPU test: the same parameters and batch of 8 rows, evaluated by two
    // GPUs (4 rows each, the mean of their losses) and by one (all 8), before and after a step.
    let session = |b: usize, ranks: usize| {
        let spec = format!("gpt:vocab=64,d_model=32,layers=2,heads=2,d_ff=64,seq=16,batch={b}");
        let model = steps::with_sgd(ingot_models::by_name(&spec).unwrap());
        let opts = ingot_compiler::pipeline::Options::for_target(Target::Cuda);
        let exe = compile(&model, ranks);
        ingot_trainer::eval::session_with_eval(
            &model,
            exe,
            &opts,
            7,
            ingot_trainer::session::Device::Cuda(CudaOptions::default()),
        )
        .unwrap()
    };
    let mut one = session(8, 1);
    let mut two = session(4, 2);
    let g = one.graph().clone();
    let batch = synthetic_batch(&g, 11);
    let (x, y) = (batch["x"].to_le_bytes(), batch["y"].to_le_bytes());
    for round in 0..2 {
        let whole = one.eval_on(&x, &y).unwrap();
        let halves = two.eval_on(&x, &y).unwrap();
        eprintln!("eval {round}: one GPU {whole}, two GPUs {halves}");
        assert!(((whole - halves) / whole).abs() <= 1e-6, "{whole} {halves}");
        let slots = one.input_slots().unwrap();
        one.step_on(&slots, &x, &y).unwrap();
        let slots = two.input_slots().unwrap();
        two.step_on(&slots, &x, &y).unwrap();
    }
}

#[path = "../../runtime/tests/support/scatter.rs"]
mod scatter;

#[test]
fn two_gpus_reduce_scatter_each_its_rows_of_the_mean_bit_for_bit_as_their_all_reduce() {
    let Some(_gpus) = two_gpus(
        "two_gpus_reduce_scatter_each_its_rows_of_the_mean_bit_for_bit_as_their_all_reduce",
    ) else {
        return;
    };
    use ingot_compiler::ir::DType;
    // ncclReduceScatter over two operands in one NCCL group, run once before the capture and
    // then from the captured graph, against ncclAllReduce of the same inputs.
    let shapes: &[&[usize]] = &[&[4, 2], &[6, 3]];
    for dtype in [DType::F32, DType::BF16] {
        let mut ranks = GpuRanks::new(scatter::step(shapes, dtype, Target::Cuda), false).unwrap();
        let g = ranks.graph().clone();
        for (i, dims) in shapes.iter().enumerate() {
            // Written for both ranks together: each gets its own half ([`scatter::input`]).
            let both: Vec<u8> = (0..scatter::RANKS)
                .flat_map(|r| scatter::input(r, i, dims, dtype).to_le_bytes())
                .collect();
            let x = g.leaf(&format!("x{i}")).unwrap();
            ranks.write_node_bytes(x, &both).unwrap();
        }
        for _ in 0..2 {
            ranks.step().unwrap();
            let out: Vec<IndexMap<String, Vec<u8>>> = ranks
                .ranks()
                .iter()
                .map(|s| {
                    g.outputs
                        .keys()
                        .map(|n| (n.clone(), s.read_output(n).unwrap().to_le_bytes()))
                        .collect()
                })
                .collect();
            scatter::check_rows(shapes, dtype, &out);
        }
    }
}

#[test]
fn two_gpus_with_a_sharded_optimizer_train_bit_for_bit_as_two_unsharded_gpus() {
    let Some(_gpus) =
        two_gpus("two_gpus_with_a_sharded_optimizer_train_bit_for_bit_as_two_unsharded_gpus")
    else {
        return;
    };
    // As sharded_session.rs's CPU test: sessions of one seed over the bf16 step for two GPU
    // ranks, each GPU keeping its rows of the copied weights and their moments or all of them;
    // the sharded session's whole parameters and state are read joined from both GPUs.
    let run = |shard_optimizer: bool| {
        let model =
            ingot_models::by_name("gpt:vocab=64,d_model=32,layers=2,heads=4,d_ff=64,seq=8,batch=2")
                .unwrap();
        let mut o = ingot_compiler::pipeline::Options::for_target(Target::Cuda);
        o.precision = Some(ingot_compiler::precision::Precision::Bf16);
        let step = StepOptions {
            ranks: 2,
            step_input: true,
            shard_optimizer,
            ..StepOptions::default()
        };
        let exe = ingot_compiler::pipeline::compile_observed_with(&model, &step, &o, &mut |_| {})
            .unwrap()
            .executable(Target::Cuda)
            .unwrap();
        let mut s = ingot_trainer::session::Session::from_executable(
            exe,
            13,
            ingot_trainer::session::Device::Cuda(CudaOptions::default()),
        )
        .unwrap();
        let losses: Vec<u64> = (0..4).map(|_| s.step().unwrap().loss.to_bits()).collect();
        (losses, s.parameters(), s.optimizer_state())
    };
    let (plain, sharded) = (run(false), run(true));
    assert_eq!(sharded.0, plain.0, "losses, bit for bit");
    for (name, v) in plain.1.iter().chain(&plain.2) {
        let got = sharded.1.get(name).or(sharded.2.get(name)).unwrap();
        assert_eq!(v.to_le_bytes(), got.to_le_bytes(), "{name} after 4 steps");
    }
}
