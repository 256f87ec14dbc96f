//! The loader thread allocates nothing per batch once warm: a counting global allocator
//! watches every allocation of this test process (the loader thread's included) while batches
//! of tokens and of samples are staged and consumed.
//!
//! It runs without the test harness (`harness = false` in Cargo.toml): libtest's own thread
//! allocates while a test runs (its table of running tests), which would be counted too.

use ingot_compiler::ir::DType;
use ingot_trainer::data::npy::encode;
use ingot_trainer::data::*;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

#[path = "support/counting.rs"]
mod counting;
use counting::ALLOCATIONS;

fn slot(name: &str, dtype: DType, dims: &[usize]) -> InputSlot {
    InputSlot {
        name: name.into(),
        dtype,
        dims: dims.to_vec(),
    }
}

/// Allocations made while `steps` batches after the first few are taken from a loader over
/// `source`, each read (summed, as a step would) before it is handed back.
fn allocations_while_staging<S: BatchSource + 'static>(source: S, steps: usize) -> usize {
    let (xb, yb) = (source.x().bytes(), source.y().bytes());
    let buffers = [0, 1].map(|_| Staging {
        x: vec![0u8; xb],
        y: vec![0u8; yb],
    });
    let spawning = ALLOCATIONS.load(Ordering::SeqCst);
    let mut loader = Loader::spawn(Epochs::new(source), buffers).unwrap();
    assert!(
        ALLOCATIONS.load(Ordering::SeqCst) > spawning,
        "starting a thread allocates: the counter counts"
    );
    let mut checksum = 0u64;
    let mut take = |loader: &mut Loader<Vec<u8>>| {
        let b = loader.next_batch().unwrap().unwrap();
        checksum = checksum.wrapping_add(b.x.iter().map(|&v| v as u64).sum::<u64>());
    };
    // Warm-up: the first batches grow read buffers, the first epoch's order, channel contexts.
    for _ in 0..4 {
        take(&mut loader);
    }
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    for _ in 0..steps {
        take(&mut loader);
    }
    let after = ALLOCATIONS.load(Ordering::SeqCst);
    assert!(checksum > 0);
    after - before
}

/// A scratch directory `{name}-{pid}` holding `t.bin`: the u16 tokens `i % modulo` for `i` in
/// `0..n`. Both its paths.
fn token_file(name: &str, n: u16, modulo: u16) -> (PathBuf, PathBuf) {
    let d = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let tokens: Vec<u8> = (0..n).flat_map(|t| (t % modulo).to_le_bytes()).collect();
    let p = d.join("t.bin");
    std::fs::write(&p, tokens).unwrap();
    (d, p)
}

fn main() {
    staging_token_and_sample_batches_allocates_nothing_once_warm();
    println!("test staging_token_and_sample_batches_allocates_nothing_once_warm ... ok");
    training_steps_fed_by_the_loader_allocate_nothing_once_warm();
    println!("test training_steps_fed_by_the_loader_allocate_nothing_once_warm ... ok");
}

/// The whole data path of `ingot train --dataset` on the CPU: the loader fills a staging
/// buffer, the planned step copies it into the inputs' slots and runs
/// ([`StepExecutor::step_with_inputs`]), the buffer goes back: no allocation per step.
fn training_steps_fed_by_the_loader_allocate_nothing_once_warm() {
    use ingot_runtime::StepExecutor;
    let (d, p) = token_file("ingot-train-alloc", 3000, 256);
    let m =
        ingot_models::by_name("gpt:vocab=256,d_model=16,layers=1,heads=2,d_ff=32,seq=16,batch=2")
            .unwrap();
    let c = ingot_compiler::pipeline::compile(&m, &ingot_trainer::session::Session::cpu_options())
        .unwrap();
    let g = c.graph.clone();
    let mut step = ingot_runtime::cpu::planned::PlannedStep::from_plan(c.graph, c.plan).unwrap();
    let mut leaves =
        ingot_trainer::init::init_leaves(&g, ingot_compiler::ir::LeafKind::Parameter, 1);
    leaves.extend(ingot_trainer::init::init_leaves(
        &g,
        ingot_compiler::ir::LeafKind::State,
        1,
    ));
    for (name, value) in &leaves {
        step.write_leaf(name, value).unwrap();
    }
    let src =
        TokenBatches::for_graph(TokenStream::open(&p).unwrap(), &g, Order::Random, 3).unwrap();
    let ids = [g.leaf("x").unwrap(), g.leaf("y").unwrap()];
    let (xb, yb) = (src.x().bytes(), src.y().bytes());
    let buffers = [0, 1].map(|_| Staging {
        x: vec![0u8; xb],
        y: vec![0u8; yb],
    });
    let mut loader = Loader::spawn(Epochs::new(src), buffers).unwrap();
    let run = |loader: &mut Loader<Vec<u8>>,
               step: &mut ingot_runtime::cpu::planned::PlannedStep| {
        let b = loader.next_batch().unwrap().unwrap();
        step.step_with_inputs(&[(ids[0], &b.x[..]), (ids[1], &b.y[..])])
            .unwrap();
    };
    for _ in 0..4 {
        run(&mut loader, &mut step);
    }
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    // 93 batches an epoch: 120 steps cross an epoch boundary.
    for _ in 0..120 {
        run(&mut loader, &mut step);
    }
    let after = ALLOCATIONS.load(Ordering::SeqCst);
    assert_eq!(after - before, 0, "allocations over 120 data-fed steps");
    // The steps train on the staged batches: x's slot holds the bytes of the batch staged.
    let b = loader.next_batch().unwrap().unwrap();
    step.step_with_inputs(&[(ids[0], &b.x[..]), (ids[1], &b.y[..])])
        .unwrap();
    let staged = b.x.clone();
    drop(b);
    assert_eq!(step.read_leaf("x").unwrap().to_le_bytes(), staged);
    drop(loader);
    let _ = std::fs::remove_dir_all(&d);
}

fn staging_token_and_sample_batches_allocates_nothing_once_warm() {
    let (d, p) = token_file("ingot-data-alloc", 5000, 500);
    for order in [Order::Random, Order::Sequential] {
        let src = TokenBatches::new(
            TokenStream::open(&p).unwrap(),
            slot("x", DType::I64, &[4, 16]),
            slot("y", DType::I64, &[4, 16]),
            500,
            order,
            1,
        )
        .unwrap();
        // 78 batches an epoch: 200 steps cross two epoch boundaries.
        assert_eq!(allocations_while_staging(src, 200), 0, "tokens, {order:?}");
    }
    let n = 50;
    let x: Vec<u8> = (0..n * 6).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let y: Vec<u8> = (0..n as i64).flat_map(|i| (i % 3).to_le_bytes()).collect();
    std::fs::write(d.join("x.npy"), encode("<f4", &[n, 6], &x)).unwrap();
    std::fs::write(d.join("y.npy"), encode("<i8", &[n], &y)).unwrap();
    let src = SampleBatches::new(
        SampleSet::open(&d).unwrap(),
        slot("x", DType::F32, &[8, 6]),
        slot("y", DType::I64, &[8]),
        3,
        true,
        2,
    )
    .unwrap();
    // 6 batches an epoch: 40 steps reshuffle the order six times.
    assert_eq!(allocations_while_staging(src, 40), 0, "samples");
    let _ = std::fs::remove_dir_all(&d);
}
