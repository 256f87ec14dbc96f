//! Sessions over a step whose optimizer is sharded over two CPU thread ranks
//! (`ingot_compiler::autodiff::shard`, ZeRO stage 1): the ranks present every sharded leaf
//! whole, so a sharded session initialises, trains, loads and checkpoints exactly as the
//! unsharded two-rank session of the same seed.

use indexmap::IndexMap;
use ingot_compiler::autodiff::{shard, StepOptions};
use ingot_compiler::exe::Executable;
use ingot_compiler::ir::LeafKind;
use ingot_compiler::lower::Target;
use ingot_runtime::Tensor;
use ingot_trainer::checkpoint::{self, CheckpointInfo};
use ingot_trainer::session::{Device, Session, SessionError};

#[path = "support/steps.rs"]
mod steps;

const GPT: &str = "gpt:vocab=64,d_model=32,layers=2,heads=4,d_ff=64,seq=8,batch=2";
const RANKS: usize = 2;
const SEED: u64 = 11;

/// The bf16 step of [`GPT`] for [`RANKS`] CPU ranks, its optimizer sharded or not. AdamW's
/// step number is an input, as `ingot train` compiles it, so a resumed session counts on.
fn exe(shard_optimizer: bool) -> Executable {
    let step = StepOptions {
        ranks: RANKS,
        step_input: true,
        shard_optimizer,
        ..StepOptions::default()
    };
    steps::bf16_step_of(GPT, &step, Target::Cpu)
        .executable(Target::Cpu)
        .unwrap()
}

fn session(shard_optimizer: bool) -> Session {
    Session::from_executable(exe(shard_optimizer), SEED, Device::Cpu).unwrap()
}

/// The bits of each of `steps` steps' losses.
fn losses(s: &mut Session, steps: usize) -> Vec<u64> {
    (0..steps)
        .map(|_| s.step().unwrap().loss.to_bits())
        .collect()
}

/// The names of the leaves the sharded step holds only rows of.
fn sharded_names(s: &Session) -> Vec<String> {
    let g = s.graph();
    [LeafKind::Parameter, LeafKind::State]
        .into_iter()
        .flat_map(|k| g.leaves(k))
        .filter(|&id| shard::ranks_of(g, id) == Some(RANKS))
        .map(|id| g.leaf_name(id).unwrap().to_string())
        .collect()
}

/// `a` and `b` hold the same names (in any order: a file's are sorted), types and bits.
fn assert_same(a: &IndexMap<String, Tensor>, b: &IndexMap<String, Tensor>, what: &str) {
    let names = |m: &IndexMap<String, Tensor>| {
        let mut n: Vec<String> = m.keys().cloned().collect();
        n.sort();
        n
    };
    assert_eq!(names(a), names(b), "{what}: the same names");
    for (name, v) in a {
        assert_eq!(v.ty, b[name].ty, "{what}: {name}'s type");
        assert_eq!(
            v.to_le_bytes(),
            b[name].to_le_bytes(),
            "{what}: {name}'s bits"
        );
    }
}

#[test]
fn a_sharded_two_rank_session_trains_bit_for_bit_as_the_unsharded_one_of_the_same_seed() {
    let (mut plain, mut sharded) = (session(false), session(true));
    assert!(
        sharded_names(&sharded).len() >= 3 * 8,
        "weights and both moments sharded: {:?}",
        sharded_names(&sharded)
    );
    assert_eq!(losses(&mut sharded, 5), losses(&mut plain, 5));
    assert_same(
        &sharded.parameters(),
        &plain.parameters(),
        "parameters after 5 steps",
    );
    assert_same(
        &sharded.optimizer_state(),
        &plain.optimizer_state(),
        "optimizer state after 5 steps",
    );
}

#[test]
fn a_sharded_sessions_parameters_and_optimizer_state_are_whole_tensors_equal_to_the_unsharded_ones()
{
    let (plain, sharded) = (session(false), session(true));
    let (params, state) = (sharded.parameters(), sharded.optimizer_state());
    let g = sharded.graph();
    for name in sharded_names(&sharded) {
        let id = g.leaf(&name).unwrap();
        let value = params.get(&name).or(state.get(&name)).unwrap();
        let mut rows = value.ty.shape.dims().to_vec();
        rows[0] /= RANKS;
        assert_eq!(g.ty(id).shape.dims(), rows, "{name}: a rank holds half");
        assert_eq!(value.ty, shard::whole_type(g, id), "{name} is read whole");
    }
    // The same whole initial values, so each rank was given its rows of them.
    assert_same(&params, &plain.parameters(), "initial parameters");
    assert_same(&state, &plain.optimizer_state(), "initial optimizer state");
    // The two halves of a weight differ: the read joins two ranks, not one rank twice.
    let w = &params["blocks.0.fc.weight"].to_le_bytes();
    assert_ne!(w[..w.len() / 2], w[w.len() / 2..]);
}

/// The checkpoint record of a run of [`GPT`] after `step` steps.
fn info(step: u64) -> CheckpointInfo {
    CheckpointInfo {
        format: checkpoint::FORMAT,
        step,
        epoch: 0,
        position: None,
        shuffle_seed: None,
        model: GPT.into(),
        device: "cpu".into(),
        precision: "bf16".into(),
        dataset: None,
        schedule: None,
        clip_grad_norm: None,
        dataset_fingerprint: None,
        optimizer_settings: None,
        ranks: RANKS,
        weights: String::new(),
        optimizer: String::new(),
        checksums: Default::default(),
        tied: Default::default(),
        tracked: Default::default(),
    }
}

#[test]
fn a_sharded_runs_checkpoint_resumes_sharded_and_unsharded_as_the_uninterrupted_run() {
    let (cut, total) = (3, 6);
    let mut straight = session(true);
    let want = losses(&mut straight, total);

    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sharded-session-ck");
    let _ = std::fs::remove_dir_all(&dir);
    let mut first = session(true);
    let mut got = losses(&mut first, cut);
    checkpoint::save(&dir, &first, info(cut as u64)).unwrap();
    let ck = checkpoint::load(&dir).unwrap();
    assert_same(&ck.parameters, &first.parameters(), "the saved parameters");

    for shard_optimizer in [true, false] {
        let mut resumed = session(shard_optimizer);
        resumed.load_parameters(&ck.parameters).unwrap();
        resumed.load_optimizer_state(&ck.optimizer_state).unwrap();
        resumed.set_updates_done(ck.info.step);
        let mut all = got.clone();
        all.extend(losses(&mut resumed, total - cut));
        assert_eq!(
            all, want,
            "resumed with the optimizer sharded: {shard_optimizer}"
        );
        assert_same(
            &resumed.parameters(),
            &straight.parameters(),
            &format!("parameters resumed (sharded: {shard_optimizer})"),
        );
        assert_same(
            &resumed.optimizer_state(),
            &straight.optimizer_state(),
            &format!("optimizer state resumed (sharded: {shard_optimizer})"),
        );
    }
    // And an unsharded run's checkpoint resumes sharded.
    let mut unsharded = session(false);
    got = losses(&mut unsharded, cut);
    let mut resumed = session(true);
    resumed.load_parameters(&unsharded.parameters()).unwrap();
    resumed
        .load_optimizer_state(&unsharded.optimizer_state())
        .unwrap();
    resumed.set_updates_done(cut as u64);
    got.extend(losses(&mut resumed, total - cut));
    assert_eq!(got, want, "an unsharded run resumed sharded");
}

#[test]
fn parameters_loaded_into_a_sharded_session_give_each_rank_its_rows_of_them() {
    // Other parameters than the session's own: those of another seed, trained a little.
    let mut donor = Session::from_executable(exe(false), SEED + 1, Device::Cpu).unwrap();
    losses(&mut donor, 2);
    let loaded = donor.parameters();
    let (mut plain, mut sharded) = (session(false), session(true));
    assert_ne!(
        sharded.parameters()["blocks.0.fc.weight"],
        loaded["blocks.0.fc.weight"]
    );
    sharded.load_parameters(&loaded).unwrap();
    plain.load_parameters(&loaded).unwrap();
    assert_same(&sharded.parameters(), &loaded, "read back after loading");
    // Each rank trains on its rows of what was loaded, and of its bf16 copies made from them.
    assert_eq!(losses(&mut sharded, 3), losses(&mut plain, 3));
    assert_same(&sharded.parameters(), &plain.parameters(), "after 3 steps");

    // One rank's rows alone are not a parameter of the model: refused, naming it.
    let name = "blocks.0.fc.weight";
    let mut rows_only = loaded.clone();
    let whole = &loaded[name];
    let mut ty = whole.ty.clone();
    let mut dims = ty.shape.dims().to_vec();
    dims[0] /= RANKS;
    ty.shape = ingot_compiler::ir::Shape::new(&dims);
    let bytes = whole.to_le_bytes();
    rows_only.insert(
        name.into(),
        Tensor::from_le_bytes(ty, &bytes[..bytes.len() / RANKS]).unwrap(),
    );
    let e = sharded.load_parameters(&rows_only).unwrap_err();
    assert!(
        matches!(&e, SessionError::ParameterType { name: n, .. } if n == name),
        "{e}"
    );
    assert_same(
        &sharded.parameters(),
        &plain.parameters(),
        "nothing changed",
    );
}
