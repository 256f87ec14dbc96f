//! Checkpoints: the state a run needs to continue exactly where it stopped.
//!
//! A checkpoint directory holds
//! - `weights-STEP.safetensors`: the parameters, by PyTorch name ([`Session::parameters`]);
//! - `optimizer-STEP.safetensors`: the optimizer state, by PyTorch's names
//!   (`{param}.exp_avg`, `{param}.exp_avg_sq`, `step`; empty for SGD);
//! - `checkpoint.json` ([`CheckpointInfo`]): the step, the epoch, the position in the data,
//!   the shuffle seed, the model, device and precision, the data set, and the names of the two
//!   files above.
//!
//! Every file is written to a temporary name and renamed
//! ([`ingot_compiler::files::write_atomically`]), and `checkpoint.json` last: it is the commit
//! record, naming tensor files that are complete before it is written, with each one's xxh3
//! checksum (verified when the checkpoint is read, so a flipped bit is an error, not a weight).
//! A crash at any moment of a save leaves the previous `checkpoint.json` and the files it names
//! untouched; the files the previous record named are removed only after the new record is in
//! place.
//!
//! A run holds its directory ([`lock`]): an advisory lock on `checkpoint.lock` for as long as
//! it writes there, so a second run on the same directory is refused with the holder's pid
//! instead of the two overwriting each other's files. Taking the lock also removes what a save
//! killed part-way left behind (its temporary files). Nothing that is not finite is saved
//! ([`check_finite`]): a step that made a weight NaN or infinite stops the run with the last
//! good checkpoint in place.

use crate::data::Position;
use crate::schedule::{Decay, Schedule};
use crate::session::Session;
use indexmap::IndexMap;
use ingot_runtime::io;
use ingot_runtime::tensor::Tensor;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub use crate::finite::check_finite;

/// A checkpoint directory held by this run: an advisory lock on its [`LOCK`] file, released
/// when this is dropped (or the process ends, however it ends).
#[derive(Debug)]
pub struct DirLock {
    _file: std::fs::File,
    /// The directory held.
    pub dir: PathBuf,
    /// Temporary files of an interrupted save that taking the lock removed.
    pub removed: Vec<String>,
}

/// Takes `dir` for this run, creating it if needed: refused, naming the holder's process id,
/// while another run holds it; a path that is a file, or a directory that cannot be created,
/// is an error naming it. With the lock held no other run writes there, so every temporary
/// file a checkpoint save leaves behind (`.weights-*.tmp`, `.optimizer-*.tmp`,
/// `.checkpoint.json.*.tmp`) is a killed save's, and is removed.
pub fn lock(dir: &Path) -> Result<DirLock, String> {
    if dir.exists() && !dir.is_dir() {
        return Err(err(
            dir,
            "it is a file, not a directory (give a directory for checkpoints)",
        ));
    }
    std::fs::create_dir_all(dir).map_err(|e| err(dir, format!("cannot create it: {e}")))?;
    let path = dir.join(LOCK);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| format!("{}: cannot open it: {e}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            use std::io::Read;
            let mut holder = String::new();
            let _ = (&file).take(64).read_to_string(&mut holder);
            let holder = holder.trim();
            return Err(err(
                dir,
                format!(
                    "another run is using it ({}holds {}); wait for that run to end, or give this one another directory",
                    if holder.is_empty() { String::new() } else { format!("process {holder} ") },
                    path.display()
                ),
            ));
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(format!("{}: cannot lock it: {e}", path.display()))
        }
    }
    {
        use std::io::{Seek, Write};
        let pid = std::process::id().to_string();
        file.set_len(0)
            .and_then(|()| file.seek(std::io::SeekFrom::Start(0)))
            .and_then(|_| file.write_all(pid.as_bytes()))
            .map_err(|e| format!("{}: cannot write it: {e}", path.display()))?;
    }
    let mut removed = Vec::new();
    for entry in std::fs::read_dir(dir)
        .map_err(|e| err(dir, format!("cannot list it: {e}")))?
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        let ours = ["weights-", "optimizer-", RECORD]
            .iter()
            .any(|p| name.starts_with(&format!(".{p}")));
        if ours && name.ends_with(".tmp") && std::fs::remove_file(entry.path()).is_ok() {
            removed.push(name);
        }
    }
    removed.sort();
    Ok(DirLock {
        _file: file,
        dir: dir.to_path_buf(),
        removed,
    })
}

/// The record's file name inside a checkpoint directory.
pub const RECORD: &str = "checkpoint.json";
/// The lock file a run holds in its checkpoint directory.
pub const LOCK: &str = "checkpoint.lock";
/// The record's layout version.
pub const FORMAT: u32 = 1;

/// What `checkpoint.json` holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointInfo {
    pub format: u32,
    /// Steps done (the next step run is `step + 1`).
    pub step: u64,
    /// The epoch of the next batch.
    pub epoch: u64,
    /// Where the next batch comes from; `None` for a run on one fixed batch.
    pub position: Option<Position>,
    /// The seed of the data's shuffle or random offsets.
    pub shuffle_seed: Option<u64>,
    /// The model (its name or spec, or the IR file's path).
    pub model: String,
    /// Where the run was: "cpu" or the GPU's name.
    pub device: String,
    /// The precision the step was compiled in: "f32", "tf32" or "bf16".
    pub precision: String,
    /// The data set and how it is cut ([`crate::data::BatchSource::describe`]); `None` for a
    /// fixed batch.
    pub dataset: Option<String>,
    /// The learning-rate schedule, where the run has one.
    #[serde(default)]
    pub schedule: Option<crate::schedule::Schedule>,
    /// The gradient clipping of the run's step (`Some(None)`: none), where the run knew it
    /// (`ingot train`; a step executable does not record it). Absent when not known, and in
    /// checkpoints written before it was recorded.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "recorded"
    )]
    pub clip_grad_norm: Option<Option<f64>>,
    /// What identifies the data set on resume: its contents and cut, not its path
    /// ([`crate::datasets::dataset_fingerprint`]); absent in checkpoints written before it was
    /// recorded (their `dataset` descriptions are compared instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset_fingerprint: Option<String>,
    /// The optimizer and its settings, in the IR text form's `optimizer` line syntax
    /// (`adamw lr=0.0003 betas=0.9,0.95 eps=1e-8 weight_decay=0.1`), where the run knew them
    /// (`ingot train`; a step executable does not record its optimizer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer_settings: Option<String>,
    /// The data-parallel ranks of the run (each batch is the union of their shards); absent
    /// for one rank, so a one-rank checkpoint is what it always was.
    #[serde(default = "one_rank", skip_serializing_if = "is_one_rank")]
    pub ranks: usize,
    /// The parameters' file, in the same directory.
    pub weights: String,
    /// The optimizer state's file, in the same directory.
    pub optimizer: String,
    /// Each tensor file's xxh3-64 checksum (16 hex digits), by file name; absent in
    /// checkpoints written before checksums were recorded (their files are read unchecked).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub checksums: IndexMap<String, String>,
    /// An imported model's tied aliases (a `state_dict` name → the parameter it holds,
    /// [`crate::state_dict::StateDict::tied`]), so that a resumed run's `--save` writes them
    /// too; absent when there are none.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub tied: IndexMap<String, String>,
    /// An imported model's batch norms' `num_batches_tracked` as `--init` read them (the
    /// counts before the run's first step, [`crate::state_dict::StateDict::tracked`]), so that
    /// a resumed run's `--save` writes the counts PyTorch would; absent when all are 0.
    #[serde(default, skip_serializing_if = "all_zero")]
    pub tracked: IndexMap<String, i64>,
}

/// A field that is present, `null` included: `null` is a value recorded (no clipping), told
/// apart from a field not written at all (not known), which `#[serde(default)]` gives.
fn recorded<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<f64>>, D::Error> {
    Option::<f64>::deserialize(d).map(Some)
}

fn all_zero(counts: &IndexMap<String, i64>) -> bool {
    counts.values().all(|&c| c == 0)
}

/// A checkpoint read back.
#[derive(Debug)]
pub struct Checkpoint {
    pub info: CheckpointInfo,
    pub parameters: IndexMap<String, Tensor>,
    pub optimizer_state: IndexMap<String, Tensor>,
}

fn err(dir: &Path, what: impl std::fmt::Display) -> String {
    format!("checkpoint {}: {what}", dir.display())
}

/// The checksum a record keeps of a tensor file's bytes.
fn checksum(bytes: &[u8]) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(bytes))
}

/// Writes `session`'s parameters and optimizer state and `info` (whose `weights`,
/// `optimizer` and `checksums` are set here) into `dir`, creating it if needed. Refuses, writing
/// nothing, when a parameter or optimizer state is not finite ([`check_finite`]). Errors name
/// the file.
pub fn save(dir: &Path, session: &Session, mut info: CheckpointInfo) -> Result<(), String> {
    let parameters = session.parameters();
    let state = session.optimizer_state();
    check_finite("parameter", &parameters)
        .and_then(|()| check_finite("optimizer state", &state))
        .map_err(|e| {
            err(
                dir,
                format!(
                    "not saved at step {}: {e}; the checkpoint it holds is kept",
                    info.step
                ),
            )
        })?;
    std::fs::create_dir_all(dir).map_err(|e| err(dir, format!("cannot create it: {e}")))?;
    // The files the record in place names, removed once the new record replaces it.
    let previous = read_record(dir).ok().filter(|p| p.step != info.step);
    info.format = FORMAT;
    info.weights = format!("weights-{:08}.safetensors", info.step);
    info.optimizer = format!("optimizer-{:08}.safetensors", info.step);
    info.checksums.clear();
    for (name, tensors) in [(&info.weights, &parameters), (&info.optimizer, &state)] {
        let path = dir.join(name);
        let bytes = io::to_bytes(tensors, &path).map_err(|e| e.to_string())?;
        ingot_compiler::files::write_atomically(&path, &bytes)
            .map_err(|e| format!("{}: cannot write it: {e}", path.display()))?;
        info.checksums.insert(name.clone(), checksum(&bytes));
    }
    let json = serde_json::to_vec_pretty(&info).map_err(|e| err(dir, e))?;
    let record = dir.join(RECORD);
    ingot_compiler::files::write_atomically(&record, &json)
        .map_err(|e| format!("{}: cannot write it: {e}", record.display()))?;
    // The new record is in place: the files the old one named may go (best effort; a
    // leftover file is harmless). Only those: any other file in the directory is the user's.
    if let Some(p) = previous {
        for name in [&p.weights, &p.optimizer] {
            if plain_name(name) && *name != info.weights && *name != info.optimizer {
                let _ = std::fs::remove_file(dir.join(name));
            }
        }
    }
    Ok(())
}

/// A file name a record may name: no directory part, not hidden.
fn plain_name(name: &str) -> bool {
    !(name.is_empty() || name.contains('/') || name.contains('\\') || name.starts_with('.'))
}

/// Reads and parses `dir`'s record alone.
fn read_record(dir: &Path) -> Result<CheckpointInfo, String> {
    let record = dir.join(RECORD);
    let bytes = ingot_compiler::files::read_capped(&record, 1 << 20)
        .map_err(|e| format!("{}: cannot read it: {e}", record.display()))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| format!("{}: not a checkpoint record: {e}", record.display()))
}

/// Reads the record of the checkpoint in `dir` alone (what a run is resumed from, before its
/// step is compiled). Errors name the directory or the record.
pub fn read_info(dir: &Path) -> Result<CheckpointInfo, String> {
    let record = dir.join(RECORD);
    if !record.is_file() {
        return Err(err(
            dir,
            format!("no {RECORD} there (written by --checkpoint DIR at each save)"),
        ));
    }
    let info = read_record(dir)?;
    if info.format != FORMAT {
        return Err(format!(
            "{}: format {} (this ingot reads format {FORMAT})",
            record.display(),
            info.format
        ));
    }
    Ok(info)
}

/// Reads the checkpoint in `dir`. Errors name the directory or the file at fault.
pub fn load(dir: &Path) -> Result<Checkpoint, String> {
    let record = dir.join(RECORD);
    let info = read_info(dir)?;
    let read = |name: &str| -> Result<IndexMap<String, Tensor>, String> {
        if !plain_name(name) {
            return Err(format!(
                "{}: file name {name:?} is not a plain name",
                record.display()
            ));
        }
        let path = dir.join(name);
        let bytes = io::read_bytes(&path).map_err(|e| e.to_string())?;
        if let Some(want) = info.checksums.get(name) {
            let got = checksum(&bytes);
            if got != *want {
                return Err(format!(
                    "{}: its checksum is {got}, but {} recorded {want} when it was saved: the file changed or is damaged; resume from an intact copy, or start a new run without --resume",
                    path.display(),
                    record.display()
                ));
            }
        }
        io::from_bytes(&bytes, &path).map_err(|e| e.to_string())
    };
    let parameters = read(&info.weights)?;
    let optimizer_state = read(&info.optimizer)?;
    Ok(Checkpoint {
        info,
        parameters,
        optimizer_state,
    })
}

fn one_rank() -> usize {
    1
}

fn is_one_rank(r: &usize) -> bool {
    *r == 1
}

/// A run resumes with the ranks it was written with: the data position counts batches of the
/// union of the ranks' shards, and the shards themselves depend on the number of ranks.
pub fn check_ranks(dir: &Path, info: &CheckpointInfo, ranks: usize) -> Result<(), String> {
    if info.ranks == ranks {
        return Ok(());
    }
    Err(err(
        dir,
        format!(
            "it was written by a run on {} data-parallel rank(s), but this run has {ranks}; resume with --ranks {} (its batches and shards are cut for that many), or start a new run without --resume",
            info.ranks, info.ranks
        ),
    ))
}

/// Checks that a run of `model` on `dataset` (its description and fingerprint,
/// [`crate::datasets::dataset_fingerprint`]) may continue from `info`: the same model and the
/// same data set, cut the same way. Data sets compare by fingerprint (contents and cut, so the
/// same file by another path is the same), or by description for a checkpoint that has none.
/// The error names both sides.
pub fn check_same_run(
    dir: &Path,
    info: &CheckpointInfo,
    model: &str,
    dataset: Option<&str>,
    fingerprint: Option<&str>,
) -> Result<(), String> {
    let none = "one fixed batch (no --dataset)";
    if info.model != model {
        return Err(err(
            dir,
            format!(
                "it was written by a run of model {:?}, but this run trains model {model:?}; resume with the same model, or start a new run without --resume",
                info.model
            ),
        ));
    }
    let same = match (&info.dataset_fingerprint, fingerprint) {
        (Some(a), Some(b)) => a == b,
        _ => info.dataset.as_deref() == dataset,
    };
    if !same {
        let changed = if info.dataset.as_deref() == dataset {
            " (its contents changed since the checkpoint)"
        } else {
            ""
        };
        return Err(err(
            dir,
            format!(
                "it was written by a run on {}, but this run trains on {}{changed}; resume with the same --dataset and batch settings, or start a new run without --resume",
                info.dataset.as_deref().unwrap_or(none),
                dataset.unwrap_or(none)
            ),
        ));
    }
    Ok(())
}

/// Compares the optimizer of the run being resumed (`now`) with the one the checkpoint's run
/// used (`info.optimizer_settings`, where recorded). Another kind of optimizer is an error: its
/// state does not fit. Other settings may change (lowering the learning rate to resume past a
/// divergence is common): the return value is the note to print, naming both, or `None` when
/// nothing changed or nothing was recorded.
pub fn check_optimizer(
    dir: &Path,
    info: &CheckpointInfo,
    now: Option<&ingot_compiler::autodiff::optim::Optimizer>,
) -> Result<Option<String>, String> {
    let (Some(then), Some(now)) = (info.optimizer_settings.as_deref(), now) else {
        return Ok(None);
    };
    let now_text = now.to_string();
    if then == now_text {
        return Ok(None);
    }
    let kind = |s: &str| s.split_whitespace().next().unwrap_or("").to_string();
    if kind(then) != kind(&now_text) {
        return Err(err(
            dir,
            format!(
                "it was written by a run with optimizer {then:?}, but this run uses {now_text:?}; the optimizer state of one kind does not fit another: resume with --optimizer {}, or start a new run without --resume",
                kind(then)
            ),
        ));
    }
    Ok(Some(format!(
        "resuming with optimizer settings {now_text:?} where the checkpoint's run used {then:?} (the new settings apply from the next step)"
    )))
}

/// The note to print when a run resumes in another precision than the checkpoint's run
/// (`precision` is this run's: "f32", "tf32" or "bf16"), or `None`. It is not refused: the
/// parameters and optimizer state are f32 under every precision, so they carry over exactly;
/// the steps from here compute in the new precision, and their losses follow it.
pub fn check_precision(info: &CheckpointInfo, precision: &str) -> Option<String> {
    (info.precision != precision).then(|| {
        format!(
            "it was written by a run in {}, and this run computes in {precision}: the weights and optimizer state (f32 in both) carry over exactly, the steps from here are {precision} steps",
            info.precision
        )
    })
}

/// A run's learning-rate schedule (its shape: the length is the run's own) and gradient
/// clipping, as the run trains with them.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Training {
    pub decay: Decay,
    pub warmup: u64,
    pub min_lr_ratio: f64,
    pub clip_grad_norm: Option<f64>,
}

/// The schedule and clipping as the command line gives them: `None` where a flag is not
/// given.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct GivenTraining {
    pub decay: Option<Decay>,
    pub warmup: Option<u64>,
    pub min_lr_ratio: Option<f64>,
    /// `Some(Some(max))`: clip at `max`; `Some(None)`: clipping turned off
    /// (`--no-clip-grad-norm`, which a resumed run needs to stop its checkpoint's clipping).
    pub clip_grad_norm: Option<Option<f64>>,
}

impl GivenTraining {
    /// What the run trains with: each setting given; for one not given, the checkpoint's a
    /// run resumes from (`resumed`, its record), so that a resumed run goes on as the
    /// checkpoint's run went without the flags typed again; else the default (constant rate,
    /// no warmup, minimum ratio 0, no clipping).
    pub fn or_resumed(&self, resumed: Option<&CheckpointInfo>) -> Training {
        let schedule = resumed.and_then(|i| i.schedule);
        let clip = resumed.and_then(|i| i.clip_grad_norm).flatten();
        Training {
            decay: self.decay.or(schedule.map(|s| s.decay)).unwrap_or_default(),
            warmup: self.warmup.or(schedule.map(|s| s.warmup)).unwrap_or(0),
            min_lr_ratio: self
                .min_lr_ratio
                .or(schedule.map(|s| s.min_ratio))
                .unwrap_or(0.0),
            clip_grad_norm: self.clip_grad_norm.unwrap_or(clip),
        }
    }
}

/// The note to print when a run resumes with another schedule or clipping than the
/// checkpoint's run had (`schedule` and `clip_grad_norm` this run's; `None` for a clipping not
/// known), naming both; `None` when nothing changed. Like other optimizer settings they may
/// change on resume (lowering the rate past a divergence): the new ones apply from the next
/// step.
pub fn check_training(
    dir: &Path,
    info: &CheckpointInfo,
    schedule: Option<&Schedule>,
    clip_grad_norm: Option<Option<f64>>,
) -> Option<String> {
    let mut now = Vec::new();
    let mut then = Vec::new();
    let constant = |s: Option<&Schedule>| s.is_none_or(|s| s.is_constant());
    let same_schedule = match (schedule, info.schedule.as_ref()) {
        (Some(a), Some(b)) => a == b,
        (a, b) => constant(a) && constant(b),
    };
    if !same_schedule {
        now.push(schedule_text(schedule));
        then.push(schedule_text(info.schedule.as_ref()));
    }
    if let (Some(a), Some(b)) = (clip_grad_norm, info.clip_grad_norm) {
        if a != b {
            now.push(clip_text(a));
            then.push(clip_text(b));
        }
    }
    (!now.is_empty()).then(|| {
        err(
            dir,
            format!(
                "resuming with {} where the checkpoint's run used {} (the new settings apply from the next step)",
                now.join(" and "),
                then.join(" and ")
            ),
        )
    })
}

/// A schedule in words: `schedule cosine (warmup 10, down to 0.1 of the rate at step 200)`.
fn schedule_text(s: Option<&Schedule>) -> String {
    match s {
        Some(s) if !s.is_constant() => {
            let decay = match s.decay {
                Decay::Constant => "constant",
                Decay::Cosine => "cosine",
                Decay::Linear => "linear",
            };
            let end = match s.decay {
                Decay::Constant => String::new(),
                _ => format!(", down to {} of the rate at step {}", s.min_ratio, s.total),
            };
            format!("schedule {decay} (warmup {}{end})", s.warmup)
        }
        _ => "a constant learning rate".to_string(),
    }
}

/// Gradient clipping in words.
fn clip_text(c: Option<f64>) -> String {
    match c {
        Some(c) => format!("--clip-grad-norm {c}"),
        None => "no gradient clipping".to_string(),
    }
}
