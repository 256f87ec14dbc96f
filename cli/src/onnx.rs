//! ONNX models on the command line: `ingot onnx check MODEL.onnx` (every node Ingot cannot
//! import, listed at once), and `--onnx MODEL.onnx` for `plan`, `train` and `compile` (with
//! `--loss`, `--logits`, `--batch`), which imports the file with `ingot_onnx` (a forward graph
//! becomes the same `Model` the built-in models give) and starts training from the file's
//! weights.

use crate::failure::Failure;
use indexmap::IndexMap;
use ingot_compiler::exe::{Constant, Executable};
use ingot_compiler::ir::LeafKind;
use ingot_compiler::model::Model;
use ingot_onnx::{ClassAxis, HeldValue, ImportOptions, Imported, Loss};
use ingot_runtime::tensor::Tensor;
use ingot_trainer::session::Session;
use ingot_trainer::state_dict::StateDict;
use std::path::PathBuf;

/// `ingot onnx ...`.
#[derive(clap::Args, Debug)]
pub struct OnnxArgs {
    #[command(subcommand)]
    pub command: OnnxCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum OnnxCommand {
    /// List every node of an ONNX model that Ingot cannot import (op type, node name, and
    /// what would be needed); exit code 1 when there is one. When every node's op is
    /// supported, the whole import that train runs follows (every node traced with its static
    /// shapes, and the loss with --loss), with the same flags, so a model check passes does
    /// not then fail to import in train.
    Check {
        /// The .onnx file.
        model: PathBuf,
        #[command(flatten)]
        import: ImportFlags,
    },
}

/// What the loss of an imported model is.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossName {
    /// The graph's scalar float output (named `loss`, or the only one).
    Output,
    /// Mean softmax cross-entropy of the logits output against integer labels `y`.
    CrossEntropy,
    /// Mean squared error of the output against a float target `y` of its shape.
    Mse,
}

/// Which axis of cross-entropy logits holds the classes (`--class-axis`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClassAxisName {
    /// The last axis: a token model's [N, S, V] logits with labels [N, S].
    Last,
    /// Axis 1: PyTorch's CrossEntropyLoss layout, [N, C, d1, ..] with labels [N, d1, ..].
    #[value(name = "1")]
    One,
}

/// The flags that choose an ONNX model (flattened into `ModelArgs`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct OnnxModelArgs {
    /// An ONNX model (a forward pass exported by PyTorch or another framework, e.g. with
    /// scripts/export_onnx.py) instead of --model: its initializers are the parameters, named
    /// as in the file, and training starts from their values (--init replaces them).
    #[arg(long, value_name = "MODEL.onnx")]
    pub onnx: Option<PathBuf>,
    #[command(flatten)]
    pub import: ImportFlags,
    /// The file's import, shared by the clones of these flags (see [`ImportCache`]).
    #[arg(skip)]
    cache: ImportCache,
}

/// One import of the --onnx file serving every use in a command: `train` reads the model (to
/// compile its step), then its weights (to start the session), and `compile` the model, then
/// its constants, and each import parses and traces the whole file. The import is kept only between those uses: [`OnnxModelArgs::keep_import`]
/// asks for it (train does), [`OnnxModelArgs::load_weights`] takes it, and a command that
/// never reads the weights (plan) drops them once the model is taken. An import made with
/// other options (the labels' shape is read from --data after the flags are parsed) is not
/// reused.
#[derive(Clone, Debug, Default)]
struct ImportCache(std::sync::Arc<std::sync::Mutex<Cached>>);

#[derive(Debug, Default)]
struct Cached {
    /// Keep the import after a use (set by [`OnnxModelArgs::keep_import`]).
    keep: bool,
    /// The options it was made with (their `Debug` form), and the import.
    held: Option<(String, Imported)>,
}

/// How an ONNX model is imported: its loss, batch and held inputs (for --onnx, and for
/// `ingot onnx check`, which runs the same import). Without --onnx they are refused by name.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ImportFlags {
    /// The loss of --onnx: output (the graph's scalar output, the default), cross-entropy
    /// (of the logits output against integer labels y, a new input), or mse (against a float
    /// target y).
    #[arg(long, value_enum)]
    pub loss: Option<LossName>,
    /// The graph output the loss reads (--loss cross-entropy or mse), when it has several.
    #[arg(long, value_name = "NAME")]
    pub logits: Option<String>,
    /// The batch to build the model at: any named model (--model NAME; a batch written in its
    /// spec must agree), or an --onnx model whose batch axis is symbolic.
    #[arg(long = "batch", value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub batch: Option<u64>,
    /// Hold a data input of --onnx at a value instead of feeding it (repeatable):
    /// `--input-value attention_mask=1 --input-value token_type_ids=0` for a BERT exported
    /// with those inputs; `position_ids=positions` holds each element at its index along the
    /// input's last axis (0, 1, .. along the sequence). Ingot's trainer feeds two inputs (x and
    /// y), so a model with more data inputs trains with the rest held this way.
    #[arg(long = "input-value", value_name = "NAME=VALUE", value_parser = parse_input_value)]
    pub input_value: Vec<(String, HeldValue)>,
    /// The class axis of --loss cross-entropy's logits when they have more than two axes:
    /// last (a token model's [N, S, V], labels [N, S]) or 1 (PyTorch's CrossEntropyLoss,
    /// [N, C, d1, ..], labels [N, d1, ..]). Without it, train decides by the shape of --data's
    /// y (the axis whose removal gives it), and anything else asks for it.
    #[arg(long = "class-axis", value_enum, value_name = "last|1")]
    pub class_axis: Option<ClassAxisName>,
    /// The labels' shape, where train knows it (--data's y), for the class axis.
    #[arg(skip)]
    pub labels_shape: Option<Vec<usize>>,
}

/// The word of `--input-value NAME=positions`.
pub(crate) const POSITIONS: &str = "positions";

/// `NAME=VALUE` of `--input-value` (train, plan, compile, `onnx check` and generate): an input
/// name and a finite number, or `positions` ([`HeldValue::Positions`]).
pub(crate) fn parse_input_value(s: &str) -> Result<(String, HeldValue), String> {
    let (name, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not NAME=VALUE"))?;
    if name.is_empty() {
        return Err(format!("{s:?} needs an input name before ="));
    }
    if v.trim() == POSITIONS {
        return Ok((name.to_string(), HeldValue::Positions));
    }
    let v: f64 = v.trim().parse().map_err(|_| {
        format!("{v:?} (in {s:?}) is neither a number nor {POSITIONS} (0, 1, .. along the input's last axis)")
    })?;
    if !v.is_finite() {
        return Err(format!("{s:?} needs a finite value"));
    }
    Ok((name.to_string(), HeldValue::Fill(v)))
}

impl ImportFlags {
    /// The import's options; `forward` when no loss is given: `Loss::Forward` (the check's
    /// trace of the forward pass alone) instead of the graph's own scalar output.
    fn options(&self, forward: bool) -> ImportOptions {
        let loss = match self.loss {
            None if forward && self.logits.is_none() => Loss::Forward,
            None | Some(LossName::Output) => match &self.logits {
                Some(n) => Loss::Output(n.clone()),
                None => Loss::Auto,
            },
            Some(LossName::CrossEntropy) => Loss::CrossEntropy {
                logits: self.logits.clone(),
            },
            Some(LossName::Mse) => Loss::Mse {
                output: self.logits.clone(),
            },
        };
        ImportOptions {
            loss,
            batch: self.batch.map(|b| b as usize),
            fixed_inputs: self.input_value.iter().cloned().collect(),
            class_axis: match self.class_axis {
                None => ClassAxis::FromLabels,
                Some(ClassAxisName::Last) => ClassAxis::Last,
                Some(ClassAxisName::One) => ClassAxis::Second,
            },
            labels_shape: self.labels_shape.clone(),
            ..Default::default()
        }
    }
}

impl OnnxModelArgs {
    fn options(&self) -> ImportOptions {
        self.import.options(false)
    }

    /// Keeps the file's import between uses, for a command that reads the model and then its
    /// weights or constants (train, compile): the file is parsed and traced once. Taken by
    /// [`Self::load_weights`]; without this call each use imports the file again and drops the
    /// import after it.
    pub fn keep_import(&self) {
        self.cache.0.lock().unwrap_or_else(|p| p.into_inner()).keep = true;
    }

    /// The cache, holding the file's import with these flags' options (made now, or the one
    /// kept from an earlier use with the same options); `None` without --onnx.
    fn imported(&self) -> Result<Option<std::sync::MutexGuard<'_, Cached>>, Failure> {
        let Some(path) = &self.onnx else {
            return Ok(None);
        };
        let options = self.options();
        let key = format!("{options:?}");
        let mut cached = self.cache.0.lock().unwrap_or_else(|p| p.into_inner());
        if cached.held.as_ref().is_none_or(|(k, _)| *k != key) {
            cached.held = None;
            let imported = ingot_onnx::import(path, &options)
                .map_err(|e| Failure::new(1, format!("{}: {e}", path.display())))?;
            for note in &imported.notes {
                eprintln!("note: {}: {note}", path.display());
            }
            cached.held = Some((key, imported));
        }
        Ok(Some(cached))
    }

    /// `f` of the file's import; kept afterwards only when [`Self::keep_import`] asked.
    fn with_import<T>(&self, f: impl FnOnce(&Imported) -> T) -> Result<Option<T>, Failure> {
        let Some(mut cached) = self.imported()? else {
            return Ok(None);
        };
        let out = cached.held.as_ref().map(|(_, i)| f(i));
        if !cached.keep {
            cached.held = None;
        }
        Ok(out)
    }

    /// The file's import, out of the cache: its last use.
    fn take_import(&self) -> Result<Option<Imported>, Failure> {
        Ok(self
            .imported()?
            .and_then(|mut cached| cached.held.take())
            .map(|(_, i)| i))
    }

    /// The imported model, when --onnx is given; `--loss`, `--logits`, `--input-value` or
    /// `--class-axis` without it is an error naming the flag (`--batch` also applies to a
    /// named model: [`crate::model_args::ModelArgs`] checks it).
    pub fn load(&self) -> Result<Option<Model>, Failure> {
        if self.onnx.is_none() {
            let f = &self.import;
            let given = [
                ("--loss", f.loss.is_some()),
                ("--logits", f.logits.is_some()),
                ("--input-value", !f.input_value.is_empty()),
                ("--class-axis", f.class_axis.is_some()),
            ];
            if let Some((flag, _)) = given.iter().find(|(_, g)| *g) {
                return Err(Failure::new(
                    2,
                    format!("{flag} applies to an ONNX model: add --onnx MODEL.onnx"),
                ));
            }
        }
        // Named by its path, as a --model-file model is (what checkpoints record and compare).
        let name = self.onnx.as_ref().map(|p| p.display().to_string());
        self.with_import(|i| {
            let mut model = i.model.clone();
            model.name = name.unwrap_or_default();
            model
        })
    }

    /// Writes the file's weights into `session`: every parameter, and the state the model
    /// reads (batch norm's running statistics, constants); the optimizer's own state stays as
    /// it is. Returns what `--init` and `--save` need to read and write a PyTorch `state_dict`
    /// for the model ([`StateDict`]). Nothing to do without --onnx.
    pub fn load_weights(&self, session: &mut Session) -> Result<Option<StateDict>, Failure> {
        let Some(imp) = self.take_import()? else {
            return Ok(None);
        };
        let info = state_dict_of(&imp);
        let at = |e: String| {
            Failure::new(
                1,
                format!(
                    "{}: {e}",
                    self.onnx
                        .as_ref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default()
                ),
            )
        };
        let mut params = IndexMap::new();
        let mut state = session.optimizer_state();
        // Each weight's bytes are dropped as its tensor is made: the model's size held once.
        for (name, w) in imp.weights {
            let t = Tensor::from_le_bytes(w.ty, &w.bytes).map_err(|e| at(e.to_string()))?;
            match w.kind {
                LeafKind::Parameter => {
                    params.insert(name, t);
                }
                _ => {
                    state.insert(name, t);
                }
            }
        }
        session
            .load_parameters(&params)
            .map_err(|e| at(e.to_string()))?;
        session
            .load_optimizer_state(&state)
            .map_err(|e| at(e.to_string()))?;
        Ok(Some(info))
    }
}

/// How an imported model's weights map onto a PyTorch `state_dict`
/// ([`ingot_trainer::state_dict::StateDict`]): its batch norms' running statistics (state the
/// training step updates, not constants) and the file's initializers Ingot computes instead.
fn state_dict_of(imp: &Imported) -> StateDict {
    let running: IndexMap<String, ingot_compiler::ir::TensorType> = imp
        .weights
        .iter()
        .filter(|(_, w)| w.kind == LeafKind::State && !w.constant)
        .map(|(k, w)| (k.clone(), w.ty.clone()))
        .collect();
    let computed = imp
        .initializers
        .iter()
        .filter(|n| !imp.weights.contains_key(*n))
        .cloned()
        .collect();
    StateDict::new(running, computed)
}

impl OnnxModelArgs {
    /// `exe` carrying the --onnx model's constants (the state it reads and never changes, which
    /// `ingot run` could not otherwise make: its parameters come from --init or the seed, its
    /// state starts at zero). Each must have the type the step reads it as. `exe` as it is
    /// without --onnx.
    pub fn with_constants(&self, exe: Executable) -> Result<Executable, Failure> {
        let file = || {
            self.onnx
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        };
        let constants = self
            .with_import(|imp| {
                imp.weights
                    .iter()
                    .filter(|(_, w)| w.constant)
                    .map(|(name, w)| {
                        let layout = exe.layouts().iter().find(|l| l.name == *name);
                        match layout {
                            Some(l)
                                if l.dtype == w.ty.dtype.name()
                                    && l.shape == w.ty.shape.dims() =>
                            {
                                Ok(Constant {
                                    name: name.clone(),
                                    bytes: w.bytes.clone(),
                                })
                            }
                            Some(l) => Err(format!(
                                "constant {name} is {} in the file, but the step reads it as {} {:?}",
                                w.ty, l.dtype, l.shape
                            )),
                            None => Err(format!("constant {name} is not a leaf of the step")),
                        }
                    })
                    .collect::<Result<Vec<_>, String>>()
            })?
            .transpose()
            .map_err(|e| Failure::new(1, format!("{}: {e}", file())))?
            .unwrap_or_default();
        exe.with_constants(constants)
            .map_err(|e| Failure::new(1, format!("{}: {e}", file())))
    }
}

/// `ingot onnx check MODEL.onnx`.
pub fn run(a: &OnnxArgs) -> Result<(), Failure> {
    match &a.command {
        OnnxCommand::Check { model, import } => {
            let listed = ingot_onnx::check(model)
                .map_err(|e| Failure::new(1, format!("{}: {e}", model.display())))?;
            if listed.is_empty() {
                // The whole import train runs (shape inference, folding, the loss when one is
                // given): a node whose op is supported can still fail to trace.
                let opts = import.options(true);
                let imp = ingot_onnx::import(model, &opts).map_err(|e| {
                    Failure::new(
                        1,
                        format!(
                            "{}: every node's op is supported, but the import fails: {e}",
                            model.display()
                        ),
                    )
                })?;
                let params = imp
                    .weights
                    .values()
                    .filter(|w| w.kind == LeafKind::Parameter)
                    .count();
                outln!(
                    "{}: every node can be imported (traced with static shapes: {params} parameter tensors{})",
                    model.display(),
                    if opts.loss == Loss::Forward {
                        "; the forward pass alone: give --loss to check the loss train adds"
                    } else {
                        ", and the loss"
                    }
                )?;
                return Ok(());
            }
            for u in &listed {
                outln!("{u}")?;
            }
            Err(Failure::new(
                1,
                format!(
                    "{}: {} node(s) cannot be imported",
                    model.display(),
                    listed.len()
                ),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_command_line_with_the_onnx_flags_is_consistent() {
        super::super::Cli::command().debug_assert();
    }

    #[test]
    fn an_input_value_is_a_number_or_the_positions_and_anything_else_is_refused_by_name() {
        use super::{parse_input_value, HeldValue};
        let held = parse_input_value;
        assert_eq!(
            held("attention_mask=1"),
            Ok(("attention_mask".into(), HeldValue::Fill(1.0)))
        );
        assert_eq!(
            held("position_ids=positions"),
            Ok(("position_ids".into(), HeldValue::Positions))
        );
        let e = held("position_ids=position").unwrap_err();
        assert!(e.contains("\"position\"") && e.contains("positions"), "{e}");
        assert!(held("=1").unwrap_err().contains("input name"));
        assert!(held("mask").unwrap_err().contains("NAME=VALUE"));
        assert!(held("mask=inf").unwrap_err().contains("finite"));
    }

    /// Flags importing a copy of a small fixture, and the copy's path (to take it away): a
    /// file of its own per test.
    fn flags_on_a_copy(test: &str) -> (super::OnnxModelArgs, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("ingot-cli-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../onnx/tests/fixtures/ops/add_broadcast.onnx");
        let copy = dir.join("model.onnx");
        std::fs::copy(fixture, &copy).unwrap();
        let mut flags = super::OnnxModelArgs {
            onnx: Some(copy.clone()),
            ..Default::default()
        };
        flags.import.loss = Some(super::LossName::Mse);
        (flags, copy)
    }

    #[test]
    fn a_kept_import_serves_the_model_and_then_the_weights_without_reading_the_file_again() {
        let (flags, copy) = flags_on_a_copy("kept");
        flags.keep_import();
        let model = flags.load().unwrap().expect("--onnx given");
        // A clone of the flags (as train's labels' shape makes) shares the import.
        let clone = flags.clone();
        std::fs::remove_file(&copy).unwrap();
        let taken = clone.take_import().unwrap().expect("kept");
        assert_eq!(taken.model.graph.len(), model.graph.len());
        // Taken: the next use reads the file, which is gone.
        assert!(flags.load().is_err());
    }

    #[test]
    fn an_import_not_kept_is_dropped_after_its_use_and_other_options_import_again() {
        let (flags, copy) = flags_on_a_copy("dropped");
        flags.load().unwrap().expect("--onnx given");
        assert!(
            flags.cache.0.lock().unwrap().held.is_none(),
            "plan holds no weights"
        );
        flags.keep_import();
        flags.load().unwrap();
        let mut other = flags.clone();
        other.import.labels_shape = Some(vec![3]);
        std::fs::remove_file(&copy).unwrap();
        assert!(flags.load().is_ok(), "same options: the kept import");
        assert!(other.load().is_err(), "other options: imported again");
    }
}
