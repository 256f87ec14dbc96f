//! The optimizer sharded over the ranks (`ingot_compiler::autodiff::shard`, ZeRO stage 1) on
//! the CPU: two thread ranks that each keep and update only their rows of the copied weights
//! and of their moments train exactly as two ranks that keep every weight whole.
//!
//! This test gives each rank its rows of the whole step's initial values by hand, below the
//! rank executors that do it for a session (`collective::ranks`, tested in sharded_session.rs).

use indexmap::IndexMap;
use ingot_compiler::autodiff::{shard, StepOptions};
use ingot_compiler::exe::Executable;
use ingot_compiler::ir::{LeafKind, Shape};
use ingot_compiler::lower::Target;
use ingot_compiler::pipeline;
use ingot_runtime::collective::{threads, Collective};
use ingot_runtime::cpu::planned::PlannedStep;
use ingot_runtime::tensor::Tensor;
use ingot_runtime::StepExecutor;
use ingot_trainer::init::{init_leaves, synthetic_batch};

#[path = "support/steps.rs"]
mod steps;
use steps::shard_rows;

const GPT: &str = "gpt:vocab=64,d_model=32,layers=2,heads=4,d_ff=64,seq=8,batch=2";
const RANKS: usize = 2;

/// The step of [`GPT`] in bf16 for [`RANKS`] ranks, its optimizer sharded or not, for `target`.
fn compiled(shard_optimizer: bool, target: Target) -> pipeline::Compiled {
    let step = StepOptions {
        ranks: RANKS,
        reduce_in_bf16: true,
        shard_optimizer,
        ..StepOptions::default()
    };
    steps::bf16_step_of(GPT, &step, target)
}

fn exe(shard_optimizer: bool) -> Executable {
    compiled(shard_optimizer, Target::Cpu)
        .executable(Target::Cpu)
        .unwrap()
}

/// Each rank's losses and leaves after training `exe` on thread ranks from `state` (rank `r`
/// writing `leaf(r, name, whole value)`) over `batches` (each rank its rows of each input).
fn train(
    exe: &Executable,
    state: &IndexMap<String, Tensor>,
    batches: &[IndexMap<String, Tensor>],
    leaf: fn(&Executable, usize, &str, &Tensor) -> Tensor,
) -> Vec<(Vec<u64>, IndexMap<String, Tensor>)> {
    let handles: Vec<_> = threads::group(RANKS)
        .into_iter()
        .map(|c| {
            let (exe, state, batches) = (exe.clone(), state.clone(), batches.to_vec());
            std::thread::spawn(move || {
                let r = c.rank();
                let mut s = PlannedStep::new(exe.clone()).unwrap();
                s.set_collective(Box::new(c)).unwrap();
                for (n, v) in &state {
                    s.write_leaf(n, &leaf(&exe, r, n, v)).unwrap();
                }
                let mut losses = Vec::new();
                for b in &batches {
                    for (n, v) in b {
                        s.write_leaf(n, &shard_rows(v, r, RANKS)).unwrap();
                    }
                    s.step().unwrap();
                    losses.push(s.read_output("loss").unwrap().to_f64_vec()[0].to_bits());
                }
                let leaves = state
                    .keys()
                    .map(|n| (n.clone(), s.read_leaf(n).unwrap()))
                    .collect();
                (losses, leaves)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// The value rank `r` of a sharded step holds of leaf `name`: its rows of a sharded leaf,
/// the whole value of any other.
fn rank_rows(exe: &Executable, r: usize, name: &str, whole: &Tensor) -> Tensor {
    let g = exe.graph();
    match shard::ranks_of(g, g.leaf(name).unwrap()) {
        Some(of) => shard_rows(whole, r, of),
        None => whole.clone(),
    }
}

#[test]
fn two_ranks_updating_their_rows_of_each_weight_train_as_two_ranks_keeping_them_whole() {
    let (whole, sharded) = (exe(false), exe(true));
    let g = whole.graph();
    let mut state = init_leaves(g, LeafKind::Parameter, 5);
    state.extend(init_leaves(g, LeafKind::State, 5));
    // Two ranks' batches: each input with twice a rank's rows, every rank its own draw.
    let batches: Vec<IndexMap<String, Tensor>> = (0..4)
        .map(|i| {
            let (first, second) = (synthetic_batch(g, 40 + i), synthetic_batch(g, 140 + i));
            first
                .into_iter()
                .map(|(n, v)| {
                    let both = [v.to_le_bytes(), second[&n].to_le_bytes()].concat();
                    let mut ty = v.ty.clone();
                    let mut d = ty.shape.dims().to_vec();
                    d[0] *= RANKS;
                    ty.shape = Shape::new(&d);
                    (n, Tensor::from_le_bytes(ty, &both).unwrap())
                })
                .collect()
        })
        .collect();
    let sg = sharded.graph();
    let shards = state
        .keys()
        .filter(|n| shard::ranks_of(sg, sg.leaf(n).unwrap()).is_some())
        .count();
    assert!(
        shards >= 3 * 8,
        "weights and both moments sharded: {shards}"
    );

    let a = train(&whole, &state, &batches, |_, _, _, v| v.clone());
    let b = train(&sharded, &state, &batches, rank_rows);
    for r in 0..RANKS {
        assert_eq!(a[r].0, b[r].0, "rank {r}'s losses, to the bit");
        for (name, v) in &a[r].1 {
            let held = &b[r].1[name];
            let want = rank_rows(&sharded, r, name, v);
            assert_eq!(*held, want, "rank {r}'s {name} after 4 steps");
        }
    }
    // The sharded ranks together hold the whole weights (their rows in rank order).
    let name = "blocks.0.fc.weight";
    let joined = [b[0].1[name].to_le_bytes(), b[1].1[name].to_le_bytes()].concat();
    assert_eq!(joined, a[0].1[name].to_le_bytes());
    assert_ne!(b[0].1[name], b[1].1[name], "two different halves");
}

#[test]
fn a_sharded_step_lowers_for_cuda_and_holds_half_of_each_sharded_weight_and_its_moments() {
    let compiled = |shard_optimizer: bool| {
        let c = compiled(shard_optimizer, Target::Cuda);
        c.executable(Target::Cuda).expect("lowers for CUDA");
        c
    };
    let (whole, sharded) = (compiled(false), compiled(true));
    let g = &sharded.graph;
    // Every sharded leaf holds 1/R of the whole step's: the weights and both moments.
    let mut saved = 0;
    for id in g
        .leaves(LeafKind::Parameter)
        .into_iter()
        .chain(g.leaves(LeafKind::State))
    {
        if let Some(of) = shard::ranks_of(g, id) {
            let w = whole.graph.leaf(g.leaf_name(id).unwrap()).unwrap();
            let bytes = whole.graph.ty(w).bytes();
            assert_eq!(g.ty(id).bytes() * of, bytes, "{}", g.leaf_name(id).unwrap());
            saved += bytes - bytes / of;
        }
    }
    assert!(saved > 0);
    assert_eq!(
        whole.report.resident_bytes - sharded.report.resident_bytes,
        saved,
        "the resident bytes fall by exactly the sharded leaves' other ranks' rows"
    );
}
