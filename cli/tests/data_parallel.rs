//! Data parallelism on the CPU: a step compiled for N ranks averages its gradients with
//! all-reduces in buckets, and N threads (one rank each, the in-process collective) training on
//! N disjoint shards of a batch reach the parameters one rank reaches on the union of the shards.

use indexmap::IndexMap;
use ingot_compiler::autodiff::StepOptions;
use ingot_compiler::exe::Executable;
use ingot_compiler::ir::{Graph, LeafKind, Op};
use ingot_compiler::lower::Target;
use ingot_compiler::model::Model;
use ingot_compiler::pipeline;
use ingot_runtime::collective::{threads, Collective};
use ingot_runtime::cpu::planned::PlannedStep;
use ingot_runtime::tensor::Tensor;
use ingot_runtime::StepExecutor;
use ingot_testkit::text::assert_mentions;
use ingot_trainer::init::{init_leaves, synthetic_batch};

fn mlp(batch: usize) -> Model {
    ingot_models::mlp_with(batch, ingot_compiler::ir::DType::F32).unwrap()
}

#[path = "../../trainer/tests/support/steps.rs"]
mod steps;
use steps::{seeded_state, shard_rows, synthetic_batches};

fn compile(model: &Model, ranks: usize) -> Executable {
    steps::compile_for_ranks(model, ranks, Target::Cpu)
}

fn all_reduces(g: &Graph) -> usize {
    g.ids()
        .filter(|&id| matches!(g.node(id).op, Op::AllReduce { .. }))
        .count()
}

#[test]
fn one_rank_compiles_to_the_single_device_step_byte_for_byte() {
    for spec in [
        "mlp",
        "gpt:vocab=64,d_model=32,layers=2,heads=2,d_ff=64,seq=16,batch=2",
    ] {
        let model = ingot_models::by_name(spec).unwrap();
        let single = compile(&model, 0);
        let one = compile(&model, 1);
        assert_eq!(
            all_reduces(one.graph()),
            0,
            "{spec}: one rank adds no all-reduce"
        );
        assert_eq!(
            one.to_bytes().unwrap(),
            single.to_bytes().unwrap(),
            "{spec}: the one-rank executable (graph, plan, program) is the single-device one"
        );
    }
}

#[test]
fn two_ranks_reduce_every_gradient_once_in_contiguous_buckets_before_the_update() {
    let model =
        ingot_models::by_name("gpt:vocab=64,d_model=32,layers=2,heads=2,d_ff=64,seq=16,batch=2")
            .unwrap();
    let exe = compile(&model, 2);
    let g = exe.graph();
    let buckets = ingot_compiler::plan::buckets::buckets(g, exe.plan());
    assert!(!buckets.is_empty());
    let params = g.leaves(LeafKind::Parameter).len();
    // The token embedding's [64, 32] gradient is made on every rank from the ranks' gathered
    // ids and rows ([2, 16] and [2, 16, 32] a rank), which are fewer bytes to send; the
    // position embedding's, a sum of the same rows over the batch, from the rows already there.
    let gathers = ingot_compiler::plan::buckets::gathers(g, exe.plan());
    assert_eq!(gathers.len(), 2, "{gathers:?}");
    assert_eq!(
        buckets.iter().map(|b| b.gradients).sum::<usize>(),
        params - 2,
        "every other parameter's gradient is in exactly one bucket"
    );
    for b in &buckets {
        assert!(b.region_bytes >= b.bytes && b.region_bytes < b.bytes + 256 * b.gradients);
        // Right after its last gradient: the node before it in the schedule is the kernel (or
        // a result or reshape of it) that writes one of the bucket's gradients.
        let order = &exe.plan().liveness.order;
        let kernel = |mut x: ingot_compiler::ir::NodeId| {
            while let ingot_compiler::ir::Op::Reshape = g.node(x).op {
                x = g.node(x).inputs[0];
            }
            g.writer(x)
        };
        let before = kernel(order[b.position - 1]);
        assert!(
            g.node(b.node).inputs.iter().any(|&x| kernel(x) == before),
            "bucket {:?} is not hoisted: {before:?} runs right before it",
            b.node
        );
    }
}

/// The all-gathers of a GPT's step on two ranks and the element count of each gathered value.
fn gathered(spec: &str) -> Vec<usize> {
    let exe = compile(&ingot_models::by_name(spec).unwrap(), 2);
    let g = exe.graph();
    ingot_compiler::plan::buckets::gathers(g, exe.plan())
        .iter()
        .map(|x| g.ty(x.node).shape.numel())
        .collect()
}

#[test]
fn an_embeddings_gradient_is_made_from_gathered_ids_and_rows_only_where_they_are_fewer_bytes() {
    // vocab 4096 x 32 table (512 KiB of gradient) against 2 x 16 ids and rows a rank (4 KiB):
    // the rows are gathered, each rank's 2 x 16 positions, into 4 x 16 on both ranks.
    assert_eq!(
        gathered("gpt:vocab=4096,d_model=32,layers=1,heads=2,d_ff=64,seq=16,batch=2"),
        vec![2 * 2 * 16, 2 * 2 * 16 * 32]
    );
    // A table of 8 rows (1 KiB) is smaller than the rows of 32 positions: it is all-reduced.
    assert_eq!(
        gathered("gpt:vocab=8,d_model=32,layers=1,heads=2,d_ff=64,seq=16,batch=2"),
        Vec::<usize>::new()
    );
}

#[test]
fn each_layers_bucket_is_reduced_while_the_backward_pass_of_the_layers_below_still_runs() {
    // Small gradients (biases, LayerNorm gains) are column sums that free little: left where
    // autodiff and the memory-aware schedule put them, at the end of the backward pass, every
    // bucket would wait for them and no collective would overlap anything.
    // Layers of 12.6 MB of f32 gradients: two to a 25 MiB bucket.
    let model = ingot_models::by_name(
        "gpt:vocab=4096,d_model=512,layers=8,heads=4,d_ff=2048,seq=16,batch=2",
    )
    .unwrap();
    let step = StepOptions {
        ranks: 2,
        ..Default::default()
    };
    let exe = pipeline::compile_observed_with(
        &model,
        &step,
        &pipeline::Options::for_target(Target::Cpu),
        &mut |_| {},
    )
    .unwrap()
    .executable(Target::Cpu)
    .unwrap();
    let buckets = ingot_compiler::plan::buckets::buckets(exe.graph(), exe.plan());
    assert!(buckets.len() >= 4, "{} buckets", buckets.len());
    let first = buckets[0].backward_after;
    assert!(first > 0);
    for w in buckets.windows(2) {
        assert!(
            w[1].position > w[0].position,
            "buckets are reduced in the order they complete"
        );
    }
    // The second bucket (the top layers' gradients) completes early in the backward pass.
    assert!(
        2 * buckets[1].backward_after >= first,
        "bucket 1 ({}) leaves {} of {first} backward ops to overlap",
        buckets[1].after,
        buckets[1].backward_after
    );
}

#[test]
fn the_validator_refuses_a_bucket_whose_gradients_are_not_adjacent() {
    let exe = compile(&mlp(2), 2);
    let (g, plan) = (exe.graph(), exe.plan());
    assert!(plan.validate(g).is_ok());
    let b = &ingot_compiler::plan::buckets::buckets(g, plan)[0];
    let outs = g.kernel_outputs()[b.node.index()].clone();
    assert!(outs.len() >= 2);
    // Move the bucket's last gradient past the end of the allocation (grown to hold it): it
    // overlaps nothing, but the bucket is no longer one region.
    let mut broken = plan.clone();
    let last = outs[outs.len() - 1];
    let s = broken.liveness.storage_of[last.index()];
    broken.storage_offset[s] = broken.total_bytes;
    broken.total_bytes += g.ty(last).bytes().next_multiple_of(256);
    let e = broken.validate(g).unwrap_err().to_string();
    assert!(e.contains("one contiguous region"), "{e}");
}

/// Trains `steps` steps of `spec` at batch `ranks * per_rank` on one rank, and at `per_rank`
/// on `ranks` thread ranks each on its shard of the same batches; returns the largest relative
/// difference of any parameter (max-norm of the difference over max-norm of the union's).
fn ranks_against_union(
    model: impl Fn(usize) -> Model,
    ranks: usize,
    per_rank: usize,
    steps: usize,
) -> f64 {
    let union_model = model(ranks * per_rank);
    let rank_model = model(per_rank);
    let union_exe = compile(&union_model, 1);
    let rank_exe = compile(&rank_model, ranks);
    assert!(all_reduces(rank_exe.graph()) > 0);
    let g = union_exe.graph();
    let state = seeded_state(g, &[LeafKind::Parameter, LeafKind::State], 5);
    let batches = synthetic_batches(g, steps as u64, 100);

    let (_, union) = steps::train_planned(union_exe, &state, &batches);

    let handles: Vec<_> = threads::group(ranks)
        .into_iter()
        .map(|c| {
            let exe = rank_exe.clone();
            let state = state.clone();
            let r = c.rank();
            // Each rank its rows of every batch.
            let shards: Vec<IndexMap<String, Tensor>> = (batches.iter())
                .map(|b| {
                    (b.iter())
                        .map(|(n, v)| (n.clone(), shard_rows(v, r, ranks)))
                        .collect()
                })
                .collect();
            std::thread::spawn(move || {
                let mut s = PlannedStep::new(exe).unwrap();
                s.set_collective(Box::new(c)).unwrap();
                steps::train_on(&mut s, &state, &shards).1
            })
        })
        .collect();
    let results: Vec<IndexMap<String, Tensor>> =
        handles.into_iter().map(|h| h.join().unwrap()).collect();
    for r in &results[1..] {
        for (n, v) in r {
            assert_eq!(
                v.to_le_bytes(),
                results[0][n].to_le_bytes(),
                "every rank holds the same bits of {n}"
            );
        }
    }
    // The largest relative difference of a parameter (max-norm over the union's max-norm).
    (results[0].iter())
        .map(|(n, v)| steps::max_relative(v, &union[n]))
        .fold(0.0, f64::max)
}

#[test]
fn two_thread_ranks_on_two_shards_train_an_mlp_as_one_rank_on_the_union() {
    let worst = ranks_against_union(mlp, 2, 4, 10);
    assert!(worst <= 1e-6, "relative difference {worst}");
}

#[test]
fn three_thread_ranks_on_three_shards_train_a_gpt_as_one_rank_on_the_union() {
    let worst = ranks_against_union(
        |b| {
            // SGD, not the GPT's AdamW: the key bias's gradient is zero in exact arithmetic
            // (softmax ignores a constant added to a row of scores), so what either run computes
            // for it is rounding noise, which AdamW's g / sqrt(v) scales up to a full step of
            // either sign; the two runs then differ by up to 2 lr in those parameters.
            let spec = format!("gpt:vocab=64,d_model=32,layers=2,heads=2,d_ff=64,seq=16,batch={b}");
            steps::with_sgd(ingot_models::by_name(&spec).unwrap())
        },
        3,
        2,
        10,
    );
    assert!(worst <= 1e-6, "relative difference {worst}");
}

#[test]
fn two_ranks_evaluate_a_batch_as_one_rank_evaluates_it_whole() {
    // The same parameters (one seed), the same batch of 8 rows: two ranks each evaluate their
    // 4 rows and report the mean of their losses; one rank evaluates all 8.
    let spec =
        |b: usize| format!("gpt:vocab=64,d_model=32,layers=2,heads=2,d_ff=64,seq=16,batch={b}");
    let session = |b: usize, ranks: usize| {
        // SGD: see the GPT test above (AdamW turns the key bias's rounding noise into steps).
        let model = steps::with_sgd(ingot_models::by_name(&spec(b)).unwrap());
        let opts = pipeline::Options::for_target(Target::Cpu);
        let exe = compile(&model, ranks);
        ingot_trainer::eval::session_with_eval(
            &model,
            exe,
            &opts,
            7,
            ingot_trainer::session::Device::Cpu,
        )
        .unwrap()
    };
    let mut one = session(8, 1);
    let mut two = session(4, 2);
    assert_eq!(two.exe().data_ranks(), 2);
    let g = one.graph().clone();
    let batch = synthetic_batch(&g, 11);
    let (x, y) = (batch["x"].to_le_bytes(), batch["y"].to_le_bytes());
    let whole = one.eval_on(&x, &y).unwrap();
    let halves = two.eval_on(&x, &y).unwrap();
    assert!(
        ((whole - halves) / whole).abs() <= 1e-6,
        "one rank {whole}, two ranks {halves}"
    );
    // And after a training step on the same batch, on both ranks' shared parameters.
    let slots = one.input_slots().unwrap();
    one.step_on(&slots, &x, &y).unwrap();
    let slots = two.input_slots().unwrap();
    two.step_on(&slots, &x, &y).unwrap();
    let whole = one.eval_on(&x, &y).unwrap();
    let halves = two.eval_on(&x, &y).unwrap();
    assert!(
        ((whole - halves) / whole).abs() <= 1e-6,
        "after a step: one rank {whole}, two ranks {halves}"
    );
}

#[test]
fn bf16_gradients_reduced_in_bf16_send_half_the_bytes_and_train_as_the_f32_reduction() {
    let model = ingot_models::at_batch(
        "gpt:vocab=64,d_model=32,layers=2,heads=2,d_ff=64,seq=16,batch=2",
        2,
        ingot_compiler::ir::DType::F32,
    )
    .unwrap();
    let mut opts = pipeline::Options::for_target(Target::Cpu);
    opts.precision = Some(ingot_compiler::precision::Precision::Bf16);
    let exe = |in_bf16: bool| {
        let step = StepOptions {
            ranks: 2,
            reduce_in_bf16: in_bf16,
            ..Default::default()
        };
        pipeline::compile_observed_with(&model, &step, &opts, &mut |_| {})
            .unwrap()
            .executable(Target::Cpu)
            .unwrap()
    };
    let (wide, narrow) = (exe(false), exe(true));
    let bytes = |e: &Executable| -> (usize, usize) {
        let b = ingot_compiler::plan::buckets::buckets(e.graph(), e.plan());
        let bf16 = b
            .iter()
            .filter(|b| e.graph().ty(b.node).dtype == ingot_compiler::ir::DType::BF16)
            .map(|b| b.bytes)
            .sum();
        (b.iter().map(|b| b.bytes).sum(), bf16)
    };
    let ((w_all, w_bf16), (n_all, n_bf16)) = (bytes(&wide), bytes(&narrow));
    assert_eq!(w_bf16, 0, "f32 gradients by default");
    assert!(
        n_bf16 > 0 && n_all < w_all,
        "{n_all} of {w_all} bytes, {n_bf16} in bf16"
    );
    // The matmul weights' gradients (most of the bytes) go at half size.
    assert!(4 * n_all < 3 * w_all, "{n_all} of {w_all} bytes");
    let losses = |e: Executable| -> Vec<f64> {
        let mut ranks = ingot_runtime::cpu::ranks::CpuRanks::new(e).unwrap();
        let g = ranks.graph().clone();
        for (n, v) in init_leaves(&g, LeafKind::Parameter, 5)
            .into_iter()
            .chain(init_leaves(&g, LeafKind::State, 5))
        {
            ranks.write_leaf(&n, &v).unwrap();
        }
        // One batch again and again, so the loss must fall.
        for (n, v) in synthetic_batch(&g, 100) {
            ranks.write_leaf(&n, &v).unwrap();
        }
        (0..8)
            .map(|_| {
                ranks.step().unwrap();
                ranks.read_output("loss").unwrap().scalar_f64().unwrap()
            })
            .collect()
    };
    let (a, b) = (losses(wide), losses(narrow));
    for (x, y) in a.iter().zip(&b) {
        assert!(((x - y) / x).abs() <= 1e-2, "{a:?} against {b:?}");
    }
    assert!(a.last() < a.first(), "it trains: {a:?}");
}

#[test]
fn a_step_for_two_ranks_run_without_a_collective_says_so() {
    let model = mlp(2);
    let mut s = PlannedStep::new(compile(&model, 2)).unwrap();
    let e = s.step().unwrap_err().to_string();
    assert_mentions(&e, &["2 data-parallel ranks", "without a collective"]);
    let e = s
        .set_collective(Box::new(threads::group(3).remove(0)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("its collective has 3"), "{e}");
}

#[test]
fn a_step_for_two_ranks_lowers_for_cuda_and_loading_it_without_nccl_ranks_is_refused() {
    let model = mlp(2);
    let c = pipeline::compile_observed_with(
        &model,
        &StepOptions {
            ranks: 2,
            ..Default::default()
        },
        &pipeline::Options::for_target(Target::Cuda),
        &mut |_| {},
    )
    .unwrap();
    let exe = c.executable(Target::Cuda).unwrap();
    // Refused before any device call, so on every machine: a lone GPU step has no peers.
    let e = match ingot_runtime::cuda::CudaStep::new(exe, Default::default()) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a two-rank step loaded as a lone GPU step"),
    };
    assert_mentions(&e, &["2 data-parallel ranks", "without a collective"]);
}

#[path = "support/cli.rs"]
mod cli_support;

mod cli {
    use std::path::{Path, PathBuf};

    /// A byte-level GPT with 4 rows per rank.
    const GPT: &str = "gpt:vocab=256,d_model=32,layers=1,heads=2,d_ff=64,seq=32,batch=4";

    use super::cli_support::{ingot, ok, train_on};
    use ingot_testkit::text::assert_mentions;

    fn scratch(test: &str) -> PathBuf {
        super::cli_support::scratch("data-parallel-tests", test)
    }

    /// 4000 byte tokens of a deterministic text.
    fn tokens(dir: &Path) -> PathBuf {
        super::cli_support::letter_tokens(dir, 4000)
    }

    fn losses(stdout: &str) -> Vec<u64> {
        stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v.get("loss").and_then(|l| l.as_f64()))
            .map(f64::to_bits)
            .collect()
    }

    #[test]
    fn two_cpu_ranks_train_over_a_data_set_and_resume_bit_for_bit_from_rank_0s_checkpoint() {
        let d = scratch("resume");
        let bin = tokens(&d);
        let ck = d.join("ck");
        let (bin, ck) = (bin.to_str().unwrap(), ck.to_str().unwrap());
        let base = [
            "train",
            "--model",
            GPT,
            "--ranks",
            "2",
            "--dataset",
            bin,
            "--json",
        ];
        let straight = losses(&ok(&ingot(&[&base[..], &["--steps", "8"]].concat())));
        assert_eq!(straight.len(), 8);
        let first = losses(&ok(&ingot(
            &[&base[..], &["--steps", "4", "--checkpoint", ck]].concat(),
        )));
        let info: serde_json::Value =
            serde_json::from_slice(&std::fs::read(Path::new(ck).join("checkpoint.json")).unwrap())
                .unwrap();
        assert_eq!(info["ranks"], 2, "the checkpoint records its ranks: {info}");
        let second = losses(&ok(&ingot(
            &[&base[..], &["--steps", "8", "--resume", ck]].concat(),
        )));
        let resumed: Vec<u64> = first.into_iter().chain(second).collect();
        assert_eq!(
            resumed, straight,
            "the resumed run's losses are the straight run's"
        );

        let other = train_on(GPT, bin, &["--steps", "8", "--resume", ck]);
        let e = String::from_utf8_lossy(&other.stderr);
        assert!(
            !other.status.success() && e.contains("2 data-parallel rank"),
            "{e}"
        );
    }

    /// The validation losses of `ingot train --model GPT --ranks RANKS --dataset D --val D
    /// ... --json` with `args` added, over the token data set of `test`'s scratch folder.
    fn val_losses(test: &str, ranks: &str, args: &[&str]) -> Vec<f64> {
        let d = scratch(test);
        let bin = tokens(&d);
        let bin = bin.to_str().unwrap();
        let mut a = vec![
            "train",
            "--model",
            GPT,
            "--ranks",
            ranks,
            "--dataset",
            bin,
            "--val",
            bin,
            "--json",
        ];
        a.extend_from_slice(args);
        let out = ok(&ingot(&a));
        out.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v.get("val_loss").and_then(|l| l.as_f64()))
            .collect()
    }

    #[test]
    fn two_ranks_validate_on_the_rows_one_rank_validates_on() {
        // With a learning rate of 1e-30 the parameters keep their seeded initial values (to far
        // below the check's 1e-6), so two ranks evaluating one union batch (the data set's
        // batches 0 and 1, one a rank) report what one rank reports over batches 0 and 1: the
        // mean of the two batches' losses.
        let first = |ranks: &str, batches: &str| -> f64 {
            let args = [
                "--eval-batches",
                batches,
                "--eval-every",
                "1",
                "--steps",
                "1",
                "--lr",
                "1e-30",
            ];
            let vals = val_losses("val-rows", ranks, &args);
            *vals.first().expect("a validation loss after the step")
        };
        let (two, one) = (first("2", "1"), first("1", "2"));
        assert!((two - one).abs() <= 1e-6 * one.abs(), "{two} against {one}");
    }

    #[test]
    fn two_cpu_ranks_validate_over_a_data_set_while_they_train() {
        let args = ["--eval-batches", "2", "--eval-every", "2", "--steps", "4"];
        let vals = val_losses("val", "2", &args);
        assert_eq!(vals.len(), 2, "{vals:?}");
        assert!(vals.iter().all(|v| v.is_finite() && *v > 0.0), "{vals:?}");
    }

    #[test]
    fn smaller_buckets_make_more_all_reduces_and_the_same_losses_to_the_bit() {
        let plan = |extra: &[&str]| {
            let mut a = vec!["plan", "--model", GPT, "--ranks", "2"];
            a.extend_from_slice(extra);
            ok(&ingot(&a))
        };
        // "... ; N all-reduce bucket(s) of B bytes of gradients"
        let count = |out: &str| -> usize {
            let at = out.find(" all-reduce bucket").expect(out);
            let n = out[..at].rsplit(' ').next().unwrap();
            n.parse().expect(out)
        };
        let (default, small) = (plan(&[]), plan(&["--bucket-size", "4KiB"]));
        assert!(count(&small) > count(&default), "{default}\n{small}");
        let train = |extra: &[&str]| {
            let mut a = vec![
                "train", "--model", GPT, "--ranks", "2", "--steps", "3", "--json",
            ];
            a.extend_from_slice(extra);
            losses(&ok(&ingot(&a)))
        };
        let (a, b) = (train(&[]), train(&["--bucket-size", "4KiB"]));
        assert_eq!(a.len(), 3, "{a:?}");
        // A bucket only groups gradients; each element's mean over the ranks is the same sum.
        assert_eq!(a, b);
        let zero = ingot(&["plan", "--model", GPT, "--ranks", "2", "--bucket-size", "0"]);
        let e = String::from_utf8_lossy(&zero.stderr);
        assert!(
            !zero.status.success() && e.contains("at least one byte"),
            "{e}"
        );
    }

    #[test]
    fn the_plan_of_two_ranks_lists_its_buckets_and_the_per_rank_total() {
        let out = ok(&ingot(&["plan", "--model", GPT, "--ranks", "2"]));
        assert!(out.contains("data parallel: 2 ranks"), "{out}");
        assert!(out.contains("bytes per rank"), "{out}");
        let one = ok(&ingot(&["plan", "--model", GPT]));
        assert!(!one.contains("data parallel"), "{one}");
    }

    #[test]
    fn gpus_with_ranks_or_on_a_machine_without_the_gpus_is_a_clear_error() {
        let both = ingot(&[
            "train", "--model", GPT, "--gpus", "1", "--ranks", "2", "--steps", "1",
        ]);
        let e = String::from_utf8_lossy(&both.stderr);
        assert!(!both.status.success() && e.contains("not both"), "{e}");
        let cpu = ingot(&[
            "train", "--model", GPT, "--gpus", "1", "--device", "cpu", "--steps", "1",
        ]);
        let e = String::from_utf8_lossy(&cpu.stderr);
        assert!(!cpu.status.success() && e.contains("--ranks N"), "{e}");
        if ingot_runtime::cuda::available().is_err() {
            let none = ingot(&["train", "--model", GPT, "--gpus", "2", "--steps", "1"]);
            let e = String::from_utf8_lossy(&none.stderr);
            assert!(!none.status.success() && e.contains("GPU"), "{e}");
        }
    }

    /// `ingot train --torchrun` with the launch variables `vars` only.
    fn torchrun(args: &[&str], vars: &[(&str, &str)]) -> std::process::Output {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_ingot"));
        c.args(["train", "--torchrun", "--model", GPT, "--steps", "1"])
            .args(args);
        for k in [
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
            "INGOT_RDZV_PORT",
        ] {
            c.env_remove(k);
        }
        c.envs(vars.iter().copied());
        c.output().expect("ingot runs")
    }

    #[test]
    fn torchrun_without_its_environment_or_with_cpu_ranks_is_a_clear_error() {
        let none = torchrun(&[], &[]);
        let e = String::from_utf8_lossy(&none.stderr);
        assert_eq!(none.status.code(), Some(2), "{e}");
        assert_mentions(&e, &["RANK is not set", "torchrun"]);
        let env = [
            ("RANK", "3"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
        ];
        let bad = torchrun(&[], &env);
        let e = String::from_utf8_lossy(&bad.stderr);
        assert!(e.contains("RANK=3 is not a rank of WORLD_SIZE=2"), "{e}");
        let cpu = torchrun(&["--device", "cpu"], &env);
        let e = String::from_utf8_lossy(&cpu.stderr);
        assert!(!cpu.status.success() && e.contains("--ranks N"), "{e}");
        let both = torchrun(&["--gpus", "2"], &env);
        let e = String::from_utf8_lossy(&both.stderr);
        assert!(!both.status.success() && e.contains("--gpus"), "{e}");
    }
}

#[test]
fn two_ranks_without_a_data_set_train_on_two_halves_of_one_synthetic_batch_twice_as_large() {
    // The two-rank session's synthetic batch is drawn for both ranks together: rank 0 gets
    // the one-rank batch of 4 rows, rank 1 the next 4 rows of the same draws. Together they
    // are the synthetic batch of the model at 8 rows, so the first step's loss (the mean of
    // the ranks' losses) is the 8-row model's.
    let spec =
        |b: usize| format!("gpt:vocab=64,d_model=32,layers=2,heads=2,d_ff=64,seq=16,batch={b}");
    let session = |b: usize, ranks: usize| {
        let model = ingot_models::by_name(&spec(b)).unwrap();
        ingot_trainer::session::Session::from_executable(
            compile(&model, ranks),
            3,
            ingot_trainer::session::Device::Cpu,
        )
        .unwrap()
    };
    let (mut whole, mut two, mut one) = (session(8, 1), session(4, 2), session(4, 1));
    let (w, t, o) = (
        whole.step().unwrap().loss,
        two.step().unwrap().loss,
        one.step().unwrap().loss,
    );
    assert!(
        ((w - t) / w).abs() <= 1e-6,
        "8 rows {w}, two ranks of 4 {t}"
    );
    assert_ne!(t, o, "rank 1 trains on rows of its own, not rank 0's again");
    assert_eq!(
        two.batch()["x"],
        one.batch()["x"],
        "rank 0 reads the one-rank batch"
    );
}

#[test]
fn two_ranks_given_the_same_batch_train_bit_for_bit_as_one_rank_on_it() {
    // Each rank differentiates half its loss and the all-reduce sums: x/2 + x/2 is x exactly,
    // so two ranks on one batch must hold one rank's bits after every step. A rank missing its
    // share (a sum of whole gradients) would step twice as far under SGD.
    let model = || steps::with_sgd(mlp(4));
    let one_exe = compile(&model(), 1);
    let two_exe = compile(&model(), 2);
    let g = one_exe.graph();
    let state = seeded_state(g, &[LeafKind::Parameter, LeafKind::State], 7);
    let batches = synthetic_batches(g, 5, 200);
    let run = |s: &mut PlannedStep| -> IndexMap<String, Vec<u8>> {
        let (_, leaves) = steps::train_on(s, &state, &batches);
        (leaves.into_iter())
            .map(|(n, v)| (n, v.to_le_bytes()))
            .collect()
    };
    let want = run(&mut PlannedStep::new(one_exe).unwrap());
    let got: Vec<IndexMap<String, Vec<u8>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = threads::group(2)
            .into_iter()
            .map(|c| {
                let (exe, run) = (two_exe.clone(), &run);
                scope.spawn(move || {
                    let mut s = PlannedStep::new(exe).unwrap();
                    s.set_collective(Box::new(c)).unwrap();
                    run(&mut s)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, leaves) in got.iter().enumerate() {
        for (n, bytes) in leaves {
            assert_eq!(bytes, &want[n], "rank {r}'s {n} after 5 steps");
        }
    }
}
