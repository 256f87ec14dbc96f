//! The evaluation step shares the training step's allocation (issue 18): one allocation of the
//! larger total, the parameters read in place, the evaluation losses those of a separately
//! compiled forward-only step bit for bit; and AdamW's step number as a step input.

use indexmap::IndexMap;
use ingot_compiler::autodiff::StepOptions;
use ingot_compiler::exe::{StepPair, Target};
use ingot_compiler::model::Model;
use ingot_compiler::pipeline;
use ingot_models::by_name;
use ingot_runtime::Tensor;
use ingot_trainer::eval::{forward_step, pair_with_eval};
use ingot_trainer::session::{Device, Session};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts allocations of at least `THRESHOLD` bytes (while it is not 0), and the largest.
struct Large;
static THRESHOLD: AtomicUsize = AtomicUsize::new(0);
static LARGE: AtomicUsize = AtomicUsize::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

impl Large {
    fn note(size: usize) {
        let t = THRESHOLD.load(Ordering::SeqCst);
        if t > 0 && size >= t {
            LARGE.fetch_add(1, Ordering::SeqCst);
            LARGEST.fetch_max(size, Ordering::SeqCst);
        }
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so the
// allocator keeps `GlobalAlloc`'s contract exactly as `System` does; what it adds (a count in
// an atomic or a thread-local) never allocates.
unsafe impl GlobalAlloc for Large {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Large::note(layout.size());
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Large::note(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        Large::note(new);
        System.realloc(p, layout, new)
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        System.dealloc(p, layout)
    }
}

#[global_allocator]
static ALLOCATOR: Large = Large;

/// The tests of this file run one at a time: the counts above are global, and another test's
/// allocations would land in them.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A small byte-level GPT (AdamW, its default optimizer).
const GPT: &str = "gpt:vocab=64,d_model=32,layers=2,heads=2,d_ff=64,seq=16,batch=4";

fn train_exe(model: &Model, step: &StepOptions) -> ingot_compiler::exe::Executable {
    pipeline::compile_observed_with(model, step, &Session::cpu_options(), &mut |_| {})
        .unwrap()
        .executable(Target::Cpu)
        .unwrap()
}

fn inputs() -> StepOptions {
    StepOptions {
        step_input: true,
        ..Default::default()
    }
}

/// The bytes of a synthetic batch (x, y) of `session`'s model drawn from `seed`.
/// `model`'s CPU training step with `step`'s options and its evaluation step, in one allocation.
fn cpu_pair(model: &Model, step: &StepOptions) -> StepPair {
    pair_with_eval(model, train_exe(model, step), &Session::cpu_options()).unwrap()
}

fn batch(session: &Session, seed: u64) -> (Vec<u8>, Vec<u8>) {
    let b = ingot_trainer::init::synthetic_batch(session.graph(), seed);
    (b["x"].to_le_bytes(), b["y"].to_le_bytes())
}

#[test]
fn the_shared_eval_steps_losses_equal_a_separately_compiled_eval_step_bit_for_bit() {
    let _one_at_a_time = serial();
    let model = by_name(GPT).unwrap();
    let opts = Session::cpu_options();
    let pair = cpu_pair(&model, &inputs());
    let mut shared = Session::from_pair(pair, 7, Device::Cpu).unwrap();
    // The forward-only step compiled and loaded on its own, in its own allocation, its
    // attention fused as the pair's is (a fused attention and the plain math it replaces may
    // round differently; this test is about sharing the allocation).
    let fused = ingot_compiler::recognize::attention_where(&model.graph, opts.attention_supported)
        .unwrap()
        .0;
    let alone = pipeline::compile_step("eval", forward_step(&fused), &opts)
        .unwrap()
        .executable(Target::Cpu)
        .unwrap();
    let mut alone = Session::from_executable(alone, 7, Device::Cpu).unwrap();
    let slots = alone.input_slots().unwrap();
    let train_slots = shared.input_slots().unwrap();
    for round in 0..3u64 {
        // Training moves the parameters (and fills the shared slab with its own values).
        for s in 0..3 {
            let (x, y) = batch(&shared, 100 + round * 10 + s);
            shared.step_on(&train_slots, &x, &y).unwrap();
        }
        let params = shared.parameters();
        alone.load_parameters(&params).unwrap();
        for b in 0..2 {
            let (x, y) = batch(&shared, 1000 + b);
            let got = shared.eval_on(&x, &y).unwrap();
            let want = alone.step_on(&slots, &x, &y).unwrap().loss;
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "round {round} batch {b}: shared {got} vs alone {want}"
            );
        }
        assert_eq!(
            shared.parameters(),
            params,
            "evaluation changes no parameter"
        );
    }
}

#[test]
fn the_pair_is_one_allocation_of_the_larger_total_not_the_sum() {
    let _one_at_a_time = serial();
    let model = by_name(GPT).unwrap();
    let pair = cpu_pair(&model, &inputs());
    let l = pair.layout();
    let (train, eval) = (pair.train().plan().clone(), pair.eval().plan().clone());
    // Max-based: the slab is the larger of the two, over the same bytes; the resident region
    // is the training step's alone; the evaluation step's own inputs come after.
    let slabs =
        ingot_compiler::plan::align_up(train.total_bytes.max(train.slab_base + l.eval_slab_bytes));
    assert_eq!(l.total_bytes, slabs + l.eval_only_bytes);
    assert_eq!(pair.allocation_bytes(), l.total_bytes);
    assert_eq!(eval.total_bytes, l.total_bytes);
    assert!(
        l.total_bytes < l.separate_bytes(),
        "{} is not less than two allocations' {}",
        l.total_bytes,
        l.separate_bytes()
    );
    assert_eq!(l.shared_parameter_bytes, train_params_bytes(&pair));
    assert!(l.eval_only_bytes > 0 && l.eval_only_bytes < l.eval_slab_bytes);
    // The parameters are read where the training step keeps them.
    let (tg, eg) = (pair.train().graph(), pair.eval().graph());
    for id in eg.leaves(ingot_compiler::ir::LeafKind::Parameter) {
        let name = eg.leaf_name(id).unwrap();
        let t = tg.leaf(name).unwrap();
        assert_eq!(
            eval.location(eg, id),
            train.location(tg, t),
            "{name} is read in place"
        );
    }
    // Loading makes exactly one allocation at least as large as the smaller plan: the pair's.
    THRESHOLD.store(train.total_bytes.min(l.eval_alone_bytes), Ordering::SeqCst);
    LARGE.store(0, Ordering::SeqCst);
    LARGEST.store(0, Ordering::SeqCst);
    let session = Session::from_pair(pair, 1, Device::Cpu);
    THRESHOLD.store(0, Ordering::SeqCst);
    let session = session.unwrap();
    assert_eq!(LARGE.load(Ordering::SeqCst), 1, "one allocation");
    assert_eq!(LARGEST.load(Ordering::SeqCst), l.total_bytes);
    assert_eq!(session.exe().allocated_bytes(), l.total_bytes);
}

fn train_params_bytes(pair: &ingot_compiler::exe::StepPair) -> usize {
    let g = pair.train().graph();
    g.leaves(ingot_compiler::ir::LeafKind::Parameter)
        .into_iter()
        .map(|id| ingot_compiler::plan::align_up(g.ty(id).bytes()))
        .sum()
}

#[test]
fn adamws_step_number_as_an_input_trains_bit_identically_to_the_counter_kept_as_state() {
    let _one_at_a_time = serial();
    let model = by_name(GPT).unwrap();
    let state = train_exe(&model, &StepOptions::default());
    let input = train_exe(&model, &inputs());
    assert!(state.graph().leaf("step").is_some_and(|id| state
        .graph()
        .leaves(ingot_compiler::ir::LeafKind::State)
        .contains(&id)));
    assert!(input.graph().leaf("step").is_some_and(|id| input
        .graph()
        .leaves(ingot_compiler::ir::LeafKind::Input)
        .contains(&id)));
    let mut a = Session::from_executable(state, 3, Device::Cpu).unwrap();
    let mut b = Session::from_executable(input, 3, Device::Cpu).unwrap();
    assert!(b.has_step_input() && !a.has_step_input());
    assert_eq!(
        a.batch(),
        b.batch(),
        "the step number is not part of the batch"
    );
    for i in 0..5 {
        let (la, lb) = (a.step().unwrap().loss, b.step().unwrap().loss);
        assert_eq!(la.to_bits(), lb.to_bits(), "step {i}");
    }
    assert_eq!(a.parameters(), b.parameters());
    assert_eq!(a.optimizer_state(), b.optimizer_state(), "step 5 in both");
}

/// The losses of `steps` steps on synthetic batches `seed0..`, from a session.
fn losses(s: &mut Session, seeds: std::ops::Range<u64>) -> Vec<f64> {
    let slots = s.input_slots().unwrap();
    seeds
        .map(|seed| {
            let (x, y) = batch(s, seed);
            s.step_on(&slots, &x, &y).unwrap().loss
        })
        .collect()
}

#[test]
fn a_resumed_adamw_run_with_the_step_input_equals_the_uninterrupted_one() {
    let _one_at_a_time = serial();
    let model = by_name(GPT).unwrap();
    let mut whole = Session::from_executable(train_exe(&model, &inputs()), 9, Device::Cpu).unwrap();
    let all = losses(&mut whole, 0..8);
    // Four steps, a checkpoint's tensors, then a fresh session of the same executable resumed.
    let mut first = Session::from_executable(train_exe(&model, &inputs()), 9, Device::Cpu).unwrap();
    let mut got = losses(&mut first, 0..4);
    let (params, state): (IndexMap<String, Tensor>, _) =
        (first.parameters(), first.optimizer_state());
    assert_eq!(state["step"].scalar_f64(), Some(4.0), "updates made");
    let mut second =
        Session::from_executable(train_exe(&model, &inputs()), 1234, Device::Cpu).unwrap();
    second.load_parameters(&params).unwrap();
    second.load_optimizer_state(&state).unwrap();
    got.extend(losses(&mut second, 4..8));
    for (i, (a, b)) in all.iter().zip(&got).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "step {}: {a} vs {b}", i + 1);
    }
    // Without the step number the resumed run would make its first update again.
    let mut wrong =
        Session::from_executable(train_exe(&model, &inputs()), 1234, Device::Cpu).unwrap();
    wrong.load_parameters(&params).unwrap();
    let mut st = state.clone();
    st.insert("step".into(), Tensor::scalar(0.0f64));
    wrong.load_optimizer_state(&st).unwrap();
    let off = losses(&mut wrong, 4..8);
    assert_eq!(off[0].to_bits(), all[4].to_bits(), "the same first loss");
    assert_ne!(off[1].to_bits(), all[5].to_bits(), "a different second one");
}

#[test]
fn training_and_evaluating_in_the_shared_allocation_allocate_nothing_per_step() {
    let _one_at_a_time = serial();
    let model = by_name(GPT).unwrap();
    let step = StepOptions {
        lr_scale: true,
        step_input: true,
        ..Default::default()
    };
    let pair = cpu_pair(&model, &step);
    let mut s = Session::from_pair(pair, 2, Device::Cpu).unwrap();
    let slots = s.input_slots().unwrap();
    let (x, y) = batch(&s, 5);
    // Warm: the first step of each may touch lazily made state.
    s.step_on(&slots, &x, &y).unwrap();
    s.eval_on(&x, &y).unwrap();
    THRESHOLD.store(1, Ordering::SeqCst);
    LARGE.store(0, Ordering::SeqCst);
    for i in 0..4 {
        s.set_lr_scale(1.0 / (i + 1) as f64).unwrap();
        s.step_on(&slots, &x, &y).unwrap();
        s.step().unwrap();
        s.eval_on(&x, &y).unwrap();
    }
    THRESHOLD.store(0, Ordering::SeqCst);
    assert_eq!(
        LARGE.load(Ordering::SeqCst),
        0,
        "allocations during the steps"
    );
}

#[path = "support/cli.rs"]
mod cli;
use cli::{ingot, train_on};

fn json_of(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn ingot_plan_with_eval_gives_the_shared_total_and_its_parts_and_budgets_it() {
    let _one_at_a_time = serial();
    let doc = json_of(&ingot(&["plan", "--model", GPT, "--eval", "--json"]));
    let train = doc["total_bytes"].as_u64().unwrap();
    let e = &doc["eval"];
    let total = e["total_bytes"].as_u64().unwrap();
    assert_eq!(e["train_total_bytes"].as_u64(), Some(train));
    assert!(total >= train, "{total} < {train}");
    assert!(
        total < train + e["eval_alone_bytes"].as_u64().unwrap(),
        "max-based, not a sum: {e}"
    );
    let text = ingot(&["plan", "--model", GPT, "--eval"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("with the evaluation step"));
    // A budget the training step fits but the pair does not.
    if total > train {
        let out = ingot(&[
            "plan",
            "--model",
            GPT,
            "--eval",
            "--budget",
            &train.to_string(),
        ]);
        assert_eq!(out.status.code(), Some(3));
        assert!(String::from_utf8_lossy(&out.stderr).contains("training and evaluation steps"));
    }
}

#[test]
fn a_training_run_with_val_reports_one_allocation_for_both_steps() {
    let _one_at_a_time = serial();
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("eval-shared-run");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // 2000 byte tokens of a vocabulary of 64: ids below the model's bound.
    let tokens: Vec<u8> = (0..2000u32)
        .flat_map(|i| (((i * 7 + i / 13) % 64) as u16).to_le_bytes())
        .collect();
    let bin = dir.join("tokens.bin");
    std::fs::write(&bin, tokens).unwrap();
    let bin = bin.to_str().unwrap();
    let out = train_on(
        GPT,
        bin,
        &[
            "--val",
            bin,
            "--steps",
            "3",
            "--eval-batches",
            "2",
            "--json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        lines.iter().any(|l| l.get("val_loss").is_some()),
        "evaluated"
    );
    let s = &lines.last().unwrap()["summary"];
    assert_eq!(s["planned_bytes"], s["eval"]["total_bytes"], "{s}");
    assert!(s["eval"]["eval_slab_bytes"].as_u64().unwrap() > 0);
}
