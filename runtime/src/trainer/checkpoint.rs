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
//! record, naming tensor files that are complete before it is written. A crash at any moment
//! of a save leaves the previous `checkpoint.json` and the files it names untouched; the files
//! of older checkpoints are removed only after the new record is in place.

use crate::data::Position;
use crate::io;
use crate::session::Session;
use crate::tensor::Tensor;
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The record's file name inside a checkpoint directory.
pub const RECORD: &str = "checkpoint.json";
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
    pub schedule: Option<crate::trainer::schedule::Schedule>,
    /// What identifies the data set on resume: its contents and cut, not its path
    /// ([`crate::trainer::dataset_fingerprint`]); absent in checkpoints written before it was
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

/// Writes `session`'s parameters and optimizer state and `info` (whose `weights` and
/// `optimizer` are set here) into `dir`, creating it if needed. Errors name the file.
pub fn save(dir: &Path, session: &Session, mut info: CheckpointInfo) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| err(dir, format!("cannot create it: {e}")))?;
    info.format = FORMAT;
    info.weights = format!("weights-{:08}.safetensors", info.step);
    info.optimizer = format!("optimizer-{:08}.safetensors", info.step);
    io::save(dir.join(&info.weights), &session.parameters()).map_err(|e| e.to_string())?;
    io::save(dir.join(&info.optimizer), &session.optimizer_state()).map_err(|e| e.to_string())?;
    let json = serde_json::to_vec_pretty(&info).map_err(|e| err(dir, e))?;
    let record = dir.join(RECORD);
    ingot_compiler::files::write_atomically(&record, &json)
        .map_err(|e| format!("{}: cannot write it: {e}", record.display()))?;
    // The new record is in place: the files of earlier checkpoints may go (best effort; a
    // leftover file is harmless).
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let ours = name.starts_with("weights-") || name.starts_with("optimizer-");
            if ours
                && name.ends_with(".safetensors")
                && name != info.weights
                && name != info.optimizer
            {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    Ok(())
}

/// Reads the checkpoint in `dir`. Errors name the directory or the file at fault.
pub fn load(dir: &Path) -> Result<Checkpoint, String> {
    let record = dir.join(RECORD);
    if !record.is_file() {
        return Err(err(
            dir,
            format!("no {RECORD} there (written by --checkpoint DIR at each save)"),
        ));
    }
    let bytes = ingot_compiler::files::read_capped(&record, 1 << 20)
        .map_err(|e| format!("{}: cannot read it: {e}", record.display()))?;
    let info: CheckpointInfo = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{}: not a checkpoint record: {e}", record.display()))?;
    if info.format != FORMAT {
        return Err(format!(
            "{}: format {} (this ingot reads format {FORMAT})",
            record.display(),
            info.format
        ));
    }
    let file = |name: &str| -> Result<PathBuf, String> {
        if name.contains('/') || name.contains('\\') || name.starts_with('.') {
            return Err(format!(
                "{}: file name {name:?} is not a plain name",
                record.display()
            ));
        }
        Ok(dir.join(name))
    };
    let parameters = io::load(file(&info.weights)?).map_err(|e| e.to_string())?;
    let optimizer_state = io::load(file(&info.optimizer)?).map_err(|e| e.to_string())?;
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
/// [`crate::trainer::dataset_fingerprint`]) may continue from `info`: the same model and the
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
    now: Option<&ingot_compiler::models::Optimizer>,
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
