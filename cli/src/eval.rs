//! `ingot eval` and `ingot predict`: a trained model (weights from a checkpoint or a
//! safetensors file) run forward over a whole data set by a forward-only planned step
//! ([`ingot_trainer::infer::Inference`]): `eval` prints the mean loss and a classifier's top-1
//! and top-5 accuracy, `predict` writes one CSV row per sample (its predicted class, that
//! class's probability, and its label).
//!
//! The data set is read in file order in whole batches of the model's batch (`--batch-size`
//! sets it for a named or ONNX model); samples past the last whole batch are left out and said
//! so, so a batch that divides the sample count covers them all.

use crate::failure::Failure;
use crate::train::{DatasetFormatArg, Device};
use indexmap::IndexMap;
use ingot_runtime::tensor::Tensor;
use ingot_trainer::data::images::ImageOptions;
use ingot_trainer::data::Order;
use ingot_trainer::infer::{Inference, Totals};
use ingot_trainer::{checkpoint, datasets, session};
use std::borrow::Cow;
use std::path::{Path, PathBuf};

/// Where a trained model's weights come from: `--checkpoint DIR` or `--init P.safetensors`.
#[derive(clap::Args, Debug, Clone)]
pub struct WeightsArgs {
    /// A checkpoint directory written by `ingot train --checkpoint DIR`: its weights (and a
    /// batch norm's running statistics).
    #[arg(
        long,
        value_name = "DIR",
        required_unless_present = "init",
        conflicts_with = "init"
    )]
    pub checkpoint: Option<PathBuf>,
    /// Weights as safetensors with PyTorch's names (what `ingot train --save` writes, or a
    /// whole torchvision state_dict).
    #[arg(long, value_name = "P.safetensors")]
    pub init: Option<PathBuf>,
}

/// Weights read from a checkpoint or a file: the parameters, the buffers beside them (running
/// statistics, optimizer state), and what they were written for.
pub struct Weights {
    pub parameters: IndexMap<String, Tensor>,
    pub state: IndexMap<String, Tensor>,
    /// The model a checkpoint's run trained (its name or spec); `None` for a file.
    pub model: Option<String>,
    /// `checkpoint DIR` or the file's path, for errors.
    pub source: String,
}

impl WeightsArgs {
    /// Reads the weights; errors name the directory or the file.
    pub fn read(&self) -> Result<Weights, Failure> {
        match (&self.checkpoint, &self.init) {
            (Some(dir), _) => {
                let c = checkpoint::load(dir).map_err(|e| Failure::new(1, e))?;
                Ok(Weights {
                    parameters: c.parameters,
                    state: c.optimizer_state,
                    model: Some(c.info.model),
                    source: format!("checkpoint {}", dir.display()),
                })
            }
            (None, Some(path)) => Ok(Weights {
                parameters: ingot_runtime::io::load(path)
                    .map_err(|e| Failure::new(1, format!("--init {}: {e}", path.display())))?,
                state: IndexMap::new(),
                model: None,
                source: path.display().to_string(),
            }),
            (None, None) => Err(Failure::new(
                2,
                "give --checkpoint DIR or --init P.safetensors",
            )),
        }
    }

    /// The files read, for [`crate::files::check_outputs`].
    pub fn files(&self) -> Vec<(&'static str, PathBuf)> {
        let mut files = Vec::new();
        if let Some(p) = &self.init {
            files.push(("--init", p.clone()));
        }
        if let Some(dir) = &self.checkpoint {
            if let Ok(entries) = std::fs::read_dir(dir) {
                files.extend(entries.flatten().map(|e| ("--checkpoint", e.path())));
            }
        }
        files
    }
}

impl Weights {
    /// Loads these weights into `step` of `model`; a mismatch says whose weights they are.
    pub fn load_into(&self, step: &mut Inference, model: &str) -> Result<(), Failure> {
        step.load_weights(&self.parameters, &self.state)
            .map_err(|e| {
                let whose = match &self.model {
                    Some(m) if m != model => format!(" (written by a run of {m})"),
                    _ => String::new(),
                };
                Failure::new(
                    1,
                    format!(
                        "{}{whose} does not hold the weights of {model}: {e}",
                        self.source
                    ),
                )
            })
    }
}

/// Where the step runs and on how many threads: `--device` and `--threads`.
#[derive(clap::Args, Debug, Clone)]
pub struct DeviceArgs {
    /// cpu (the default) or cuda.
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    pub device: Device,
    /// On the CPU: the threads each kernel runs on (default: INGOT_THREADS, else every core).
    #[arg(long, value_name = "N", value_parser = crate::numbers::positive_count)]
    pub threads: Option<u64>,
}

impl DeviceArgs {
    /// The session's device, the CPU's thread count set for the process.
    pub fn session_device(&self) -> Result<session::Device, Failure> {
        match self.device {
            Device::Cpu => {
                crate::train::set_cpu_threads(self.threads)?;
                Ok(session::Device::Cpu)
            }
            Device::Cuda => Ok(session::Device::Cuda(Default::default())),
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    #[command(flatten)]
    pub model: crate::model_args::ModelArgs,
    #[command(flatten)]
    pub weights: WeightsArgs,
    /// The data set (any format `ingot train --val` reads), run in file order.
    #[arg(long, value_name = "PATH")]
    pub dataset: PathBuf,
    /// How the data set is read (as `ingot train --dataset-format`).
    #[arg(long = "dataset-format", value_enum, default_value_t = DatasetFormatArg::Auto)]
    pub dataset_format: DatasetFormatArg,
    /// With an image folder: the per-channel mean R,G,B (as `ingot train`).
    #[arg(long = "image-mean", value_name = "R,G,B", default_value = "0.485,0.456,0.406", value_parser = crate::numbers::image_mean)]
    pub image_mean: [f32; 3],
    /// With an image folder: the per-channel standard deviation R,G,B.
    #[arg(long = "image-std", value_name = "R,G,B", default_value = "0.229,0.224,0.225", value_parser = crate::numbers::image_std)]
    pub image_std: [f32; 3],
    /// The batch the forward step runs (a named or ONNX model; default: the model's own).
    /// (`--batch` is an ONNX model's batch of import.)
    #[arg(long = "batch-size", value_name = "N", value_parser = crate::numbers::positive_count)]
    pub batch_size: Option<u64>,
    #[command(flatten)]
    pub device: DeviceArgs,
    #[command(flatten)]
    pub precision: crate::precision_args::PrecisionArgs,
    /// Print one JSON object instead of lines.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct PredictArgs {
    #[command(flatten)]
    pub eval: EvalArgs,
    /// The CSV file to write: index,predicted,probability,label, one row per sample.
    #[arg(long, value_name = "predictions.csv")]
    pub out: PathBuf,
    /// Write over --out if it exists (never over an input file).
    #[arg(long)]
    pub force: bool,
}

/// A forward step of `a`'s model over its data set, loaded with its weights, and the data set
/// opened for it. `logits`: the step outputs the logits too (`predict`).
fn prepare(
    a: &EvalArgs,
    logits: bool,
) -> Result<(Inference, Box<dyn ingot_trainer::data::BatchSource>), Failure> {
    let device = a.device.session_device()?;
    let precision = a.precision.for_device(a.device.device)?;
    let weights = a.weights.read()?;
    let model_args = model_of(&a.model, &weights)?;
    let model = match a.batch_size {
        Some(b) => model_args.load_at_batch(b as usize)?,
        None => model_args.load()?,
    };
    let fail = |e: ingot_compiler::IrError| Failure::new(1, format!("{}: {e}", model.name));
    let counted =
        ingot_compiler::trace::accuracy::with_top_k_counts(model.eval_graph()).map_err(fail)?;
    let mut graph = counted.unwrap_or_else(|| model.eval_graph().clone());
    if logits {
        graph = ingot_compiler::trace::logits::with_logits(&graph).map_err(fail)?;
    }
    let mut opts = device.options();
    opts.precision = precision;
    let name = format!("{} (forward)", model.name);
    let mut step = Inference::new(
        &name,
        &graph,
        precision.unwrap_or(model.precision),
        &opts,
        device,
    )
    .map_err(|e| Failure::new(1, e))?;
    weights.load_into(&mut step, &model.name)?;
    let images = ImageOptions {
        mean: a.image_mean,
        std: a.image_std,
        ..Default::default()
    };
    let format = datasets::with_image_options(a.dataset_format.into(), &a.dataset, &images);
    let mut source =
        datasets::open_dataset_as(&a.dataset, step.graph(), Order::Sequential, 0, format)
            .map_err(|e| Failure::new(1, format!("--dataset: {e}")))?;
    source
        .check_all()
        .map_err(|e| Failure::new(1, format!("--dataset: {e}")))?;
    Ok((step, source))
}

/// The model flags as given, or, where none of `--model`, `--model-file` and `--onnx` is (clap
/// allows that only with `--checkpoint DIR`), the model the checkpoint's record names: a model
/// name or spec (a run that accumulated gradients records `NAME in K micro-batches`: the
/// model is NAME), or the path of the IR file it was read from. An ONNX model is not
/// re-imported from its path alone (its import flags are not recorded), and a record that names
/// nothing loadable is an error saying what to give.
fn model_of<'a>(
    m: &'a crate::model_args::ModelArgs,
    w: &Weights,
) -> Result<Cow<'a, crate::model_args::ModelArgs>, Failure> {
    if m.model.is_some() || m.model_file.is_some() || m.onnx.onnx.is_some() {
        return Ok(Cow::Borrowed(m));
    }
    let give = "give --model NAME, --model-file PATH or --onnx MODEL.onnx";
    let recorded = w
        .model
        .as_deref()
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .ok_or_else(|| {
            Failure::new(
                2,
                format!("{} does not record the model it trained: {give}", w.source),
            )
        })?;
    let name = recorded
        .split_once(" in ")
        .filter(|(_, k)| k.ends_with(" micro-batches"))
        .map_or(recorded, |(name, _)| name);
    let mut args = m.clone();
    let path = Path::new(name);
    if ingot_models::by_name(name).is_ok() {
        args.model = Some(name.to_string());
    } else if path.extension().is_some_and(|e| e == "onnx") {
        return Err(Failure::new(
            2,
            format!(
                "{} records the ONNX model {name}, whose import flags it does not record: give --onnx {name} with the flags it was trained with",
                w.source
            ),
        ));
    } else if path.is_file() {
        args.model_file = Some(path.to_path_buf());
    } else {
        return Err(Failure::new(
            2,
            format!(
                "{} records the model {recorded:?}, which is neither a model name nor a model file found from here: {give}",
                w.source
            ),
        ));
    }
    Ok(Cow::Owned(args))
}

/// The line saying what the pass left out, if anything.
fn dropped_note(source: &dyn ingot_trainer::data::BatchSource) -> Option<String> {
    let d = source.dropped_per_epoch();
    (d.count > 0).then(|| {
        format!(
            "the last {} {} do not fill a batch and were left out (--batch-size N with N dividing the data set covers them all)",
            d.count, d.unit
        )
    })
}

pub fn run_eval(a: &EvalArgs) -> Result<(), Failure> {
    let (mut step, mut source) = prepare(a, false)?;
    let t = step
        .over_dataset(source.as_mut(), |_, _, _| Ok(()))
        .map_err(|e| Failure::new(1, e))?;
    print_totals(&t, dropped_note(source.as_ref()), a.json)
}

fn print_totals(t: &Totals, dropped: Option<String>, json: bool) -> Result<(), Failure> {
    if json {
        let line = serde_json::json!({
            "loss": t.loss,
            "top1": t.top1,
            "top5": t.top5,
            "batches": t.batches,
            "samples": t.samples,
            "left_out": dropped,
        });
        return outln!("{line}");
    }
    let accuracy = match (t.top1, t.top5) {
        (Some(a), Some(b)) => format!(", top-1 {:.2}%, top-5 {:.2}%", 100.0 * a, 100.0 * b),
        _ => String::new(),
    };
    outln!(
        "loss {:.4}{accuracy} over {} samples ({} batches)",
        ingot_trainer::figure::Figure(t.loss),
        t.samples,
        t.batches
    )?;
    if let Some(d) = dropped {
        errln!("ingot: {d}");
    }
    Ok(())
}

pub fn run_predict(a: &PredictArgs) -> Result<(), Failure> {
    let e = &a.eval;
    if a.out.exists() && !a.force {
        return Err(Failure::new(
            2,
            format!(
                "--out {} exists: give --force to write over it, or another path",
                a.out.display()
            ),
        ));
    }
    let weight_files = e.weights.files();
    let data_files = datasets::dataset_files(&e.dataset);
    let mut inputs: Vec<(&str, Option<&Path>)> = e.model.input_files().to_vec();
    inputs.extend(weight_files.iter().map(|(o, p)| (*o, Some(p.as_path()))));
    inputs.extend(data_files.iter().map(|p| ("--dataset", Some(p.as_path()))));
    crate::files::check_outputs(&[("--out", Some(a.out.as_path()))], &inputs)?;
    let (mut step, mut source) = prepare(e, true)?;
    let (rows, classes) = step
        .logits_shape()
        .ok_or_else(|| Failure::new(1, "the forward step has no logits"))?;
    let label_dtype = source.y().dtype;
    let mut csv = String::from("index,predicted,probability,label\n");
    let mut row = vec![0f32; classes];
    let t = step
        .over_dataset(source.as_mut(), |step, b, y| {
            for r in 0..rows {
                step.logits_row(r, &mut row)?;
                let (best, p) = top_class(&row);
                let label = label_at(y, label_dtype, r);
                let index = b as usize * rows + r;
                csv.push_str(&format!("{index},{best},{p:.6},{label}\n"));
            }
            Ok(())
        })
        .map_err(|e| Failure::new(1, e))?;
    crate::files::write_file(&a.out, csv.as_bytes())?;
    let dropped = dropped_note(source.as_ref());
    if !e.json {
        outln!("{}: {} predictions", a.out.display(), t.samples)?;
    }
    print_totals(&t, dropped, e.json)
}

/// The most likely class of a row of logits (the first of equal ones) and its softmax
/// probability, computed in f64.
pub fn top_class(logits: &[f32]) -> (usize, f64) {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    let top = logits[best] as f64;
    let total: f64 = logits.iter().map(|&l| (l as f64 - top).exp()).sum();
    (best, 1.0 / total)
}

/// Label `r` of a batch's label bytes, as an integer.
fn label_at(y: &[u8], dtype: ingot_compiler::ir::DType, r: usize) -> i64 {
    use ingot_compiler::ir::DType;
    let size = dtype.size();
    let Some(b) = y.get(r * size..(r + 1) * size) else {
        return -1;
    };
    match dtype {
        DType::I32 => i32::from_le_bytes(b.try_into().expect("4 bytes")) as i64,
        DType::I64 => i64::from_le_bytes(b.try_into().expect("8 bytes")),
        DType::F32 => f32::from_le_bytes(b.try_into().expect("4 bytes")) as i64,
        _ => -1,
    }
}
