//! The flags that say which model a command compiles and how its step trains (`--model`,
//! `--model-file`, `--onnx`, the optimizer, ranks, accumulation, budget), and loading the model
//! they name.

use crate::failure::Failure;
use crate::files::{read_text, MAX_MODEL_FILE_BYTES};
use crate::numbers;
use crate::onnx;

/// Which model a command compiles: a named one (`--model`) or the IR text form of a forward
/// pass (`--model-file`), exactly one of the two; and the optimizer its step trains with, the
/// model's own unless changed here.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// mlp, gpt-mini, gpt2, gpt2-medium, gpt-1.3b, cnn, resnet18, gpt:vocab=..,d_model=..,layers=..,heads=..,d_ff=..,seq=..,batch=.., or resnet:depth=18|34|50|101|152,side=..,batch=..,classes=..,width=.. (torchvision's ResNets; side 224, batch 32, classes 1000, width 64 unless given)
    #[arg(
        long,
        required_unless_present_any = ["model_file", "onnx"],
        conflicts_with_all = ["model_file", "onnx"]
    )]
    pub model: Option<String>,
    /// A forward pass in Ingot's IR text form with a scalar output "loss" (e.g.
    /// docs/examples/tiny-mlp.ir), instead of --model. It trains with SGD, lr 0.1, unless the
    /// file has an `optimizer` line or --optimizer is given.
    #[arg(long = "model-file", value_name = "PATH", conflicts_with = "onnx")]
    pub model_file: Option<std::path::PathBuf>,
    /// An ONNX model instead of --model (see `ingot onnx`), with its loss and batch.
    #[command(flatten)]
    pub onnx: onnx::OnnxModelArgs,
    /// The optimizer: sgd, momentum (SGD with momentum) or adamw (default: the model's own:
    /// AdamW for the GPTs, SGD lr 0.1 for mlp and files). A new one starts from PyTorch's
    /// defaults for it (sgd/momentum: lr 0.1, momentum 0.9; adamw: lr 1e-3, betas 0.9,0.999,
    /// eps 1e-8, weight decay 0.01).
    #[arg(long, value_name = "NAME", value_parser = ["sgd", "momentum", "adamw"])]
    pub optimizer: Option<String>,
    /// Learning rate.
    #[arg(long, value_name = "LR", allow_hyphen_values = true, value_parser = numbers::positive)]
    pub lr: Option<f64>,
    /// Weight decay: decoupled for adamw (p *= 1 - lr * wd), added to the gradient for
    /// sgd/momentum (as torch.optim.SGD).
    #[arg(long = "weight-decay", value_name = "WD", allow_hyphen_values = true, value_parser = numbers::non_negative)]
    pub weight_decay: Option<f64>,
    /// AdamW's betas, B1,B2 (e.g. 0.9,0.95).
    #[arg(long, value_name = "B1,B2", allow_hyphen_values = true, value_parser = numbers::betas)]
    pub betas: Option<(f64, f64)>,
    /// The momentum of --optimizer momentum.
    #[arg(long, value_name = "M", allow_hyphen_values = true, value_parser = numbers::below_one)]
    pub momentum: Option<f64>,
    /// AdamW's eps.
    #[arg(long, value_name = "EPS", allow_hyphen_values = true, value_parser = numbers::positive)]
    pub eps: Option<f64>,
    /// Clip the gradients by their global L2 norm inside the step, as PyTorch's
    /// clip_grad_norm_ (the norm, before clipping, is logged each step).
    #[arg(long = "clip-grad-norm", value_name = "MAX", allow_hyphen_values = true, value_parser = numbers::positive)]
    pub clip_grad_norm: Option<f64>,
    /// Data parallelism over N ranks: the step averages its gradients over the ranks with
    /// all-reduces in buckets of about 25 MiB (the plan shows them). 1 (the default) is the
    /// single-device step exactly.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub ranks: u64,
    /// Gradient accumulation: the step runs K micro-batches of batch/K samples, one after
    /// another (each forward pass followed by its backward pass), sums their gradients and
    /// updates once: the whole batch's step for a mean loss (batch norm normalises each
    /// micro-batch by its own statistics, as in PyTorch), in about one micro-batch's activation
    /// memory. K must divide the model's batch; needs --model NAME. Given (even as 1), it is
    /// kept: --budget then only checks the plan.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u64).range(1..))]
    pub accumulate: Option<u64>,
    /// Memory budget (e.g. 16GiB, 512MiB, 1000000): the step is compiled to fit it. Over it,
    /// matmul and attention outputs are recomputed for the backward pass (cheapest FLOPs per
    /// byte first), and a named model accumulates gradients over the fewest micro-batches that
    /// fit, with recomputation where that adds at most 33% FLOPs (the report says what was
    /// done); what cannot fit exits with code 3 naming the smallest plan found and what is
    /// live at its peak, or the resident bytes when they alone are over. With --accumulate
    /// given (1 for none) it is a gate only.
    #[arg(long, value_parser = numbers::size)]
    pub budget: Option<usize>,
    /// Compute and differentiate the loss head in row chunks: a head whose largest value (a
    /// language model's [tokens, vocab] logits and their softmax) is over 512 MiB runs a block
    /// of rows at a time, each block's backward pass right after its forward pass, so only one
    /// block's logits live. Lowers the peak by most of the logits; costs an addition of the
    /// head's weight gradient per extra block.
    #[arg(long)]
    pub chunk_loss_head: bool,
    /// With several ranks: all-reduce the gradients computed in bf16 (a bf16 matmul's weight
    /// gradients, with --precision bf16) in bf16, before they are widened to f32 for the
    /// update: half the bytes on the wire, each mean rounded to bf16 (PyTorch DDP's
    /// bf16_compress_hook). Off by default.
    #[arg(long)]
    pub reduce_in_bf16: bool,
    /// With --precision bf16: cast the weights to bf16 in every forward pass, as autocast
    /// does, instead of keeping bf16 copies that the update writes (the default). Two bytes a
    /// weight less resident memory, for the casts' time in each step (gpt2: 247 MB less, about
    /// 2% slower). --budget drops the copies by itself before anything else
    #[arg(long)]
    pub no_weight_copies: bool,
    /// With several ranks: the size of the gradient buckets each all-reduce takes (e.g.
    /// 10MiB; default 25MiB, as PyTorch DDP's bucket_cap_mb). Smaller buckets start their
    /// all-reduces earlier in the backward pass and leave less of it to wait for at the end,
    /// in more collectives.
    #[arg(long, value_name = "SIZE", value_parser = parse_bucket_size)]
    pub bucket_size: Option<usize>,
    /// Shard the optimizer over the ranks (ZeRO stage 1): each rank keeps and updates only its
    /// rows of each bf16-copied weight and of its AdamW moments; their gradients are
    /// reduce-scattered instead of all-reduced, and the new bf16 copies all-gathered. Less
    /// memory per rank (the plan shows it), the same results as unsharded; parameters,
    /// --save and checkpoints stay whole. Needs two ranks or more (--ranks N or --gpus N, not
    /// --torchrun), --precision bf16 with its weight copies (no --no-weight-copies), and no
    /// --clip-grad-norm.
    #[arg(long)]
    pub shard_optimizer: bool,
}

fn parse_bucket_size(v: &str) -> Result<usize, String> {
    match numbers::size(v)? {
        0 => Err("a gradient bucket must hold at least one byte".into()),
        n => Ok(n),
    }
}

impl ModelArgs {
    /// What the training step computes besides gradients and update: the count of non-finite
    /// parameters after the update (always: a run stops at the step that makes one), gradient
    /// clipping as asked, and, when `inputs`, a learning-rate scale input (a schedule will drive it) and
    /// AdamW's step number as an input (the host counts steps; a resumed run passes its own).
    pub fn step_options(&self, inputs: bool) -> ingot_compiler::autodiff::StepOptions {
        ingot_compiler::autodiff::StepOptions {
            lr_scale: inputs,
            clip_grad_norm: self.clip_grad_norm,
            step_input: inputs,
            ranks: self.ranks as usize,
            accumulate: self.accumulate.unwrap_or(1) as usize,
            loss_head_chunk_bytes: if self.chunk_loss_head {
                ingot_compiler::autodiff::chunk::HEAD_CHUNK_BYTES
            } else {
                0
            },
            reduce_in_bf16: self.reduce_in_bf16,
            bucket_bytes: self.bucket_size.unwrap_or(0),
            cast_weights_each_step: self.no_weight_copies,
            shard_optimizer: self.shard_optimizer,
            count_nonfinite: true,
        }
    }

    /// `--shard-optimizer` against the `ranks` the step is compiled for (`--ranks N` or
    /// `--gpus N`), checked before anything compiles: a clear error naming the flags, where the
    /// compiler's own refusal would only say "ranks". Its other needs (bf16 weight copies, no
    /// clipping) are the compiler's to check, and its refusals name those flags.
    pub fn check_shard_optimizer(&self, ranks: u64) -> Result<(), Failure> {
        if self.shard_optimizer && ranks < 2 {
            return Err(Failure::new(
                2,
                format!(
                    "--shard-optimizer divides the optimizer among the ranks and needs two or \
                    more; the step is compiled for {ranks}: add --ranks N (CPU) or --gpus N"
                ),
            ));
        }
        Ok(())
    }
}

/// A model's batch: the first dimension of its input `x`.
fn model_batch(m: &ingot_compiler::model::Model) -> Option<usize> {
    let x = m.graph.leaf("x")?;
    m.graph.ty(x).shape.dims().first().copied()
}

impl ModelArgs {
    /// The files the model is read from, for [`check_outputs`](crate::files::check_outputs).
    pub fn input_files(&self) -> [(&'static str, Option<&std::path::Path>); 2] {
        [
            ("--model-file", self.model_file.as_deref()),
            ("--onnx", self.onnx.onnx.as_deref()),
        ]
    }

    /// Builds the model: by name, or read and parsed from the file (errors name the file).
    pub fn load(&self) -> Result<ingot_compiler::model::Model, Failure> {
        self.load_at(None, self.accumulate.unwrap_or(1) as usize)
    }

    /// The model at batch `batch` (a named model or `gpt:` spec; a model file's batch is fixed
    /// in its text), with the optimizer settings as [`ModelArgs::load`] applies them.
    pub fn load_at_batch(&self, batch: usize) -> Result<ingot_compiler::model::Model, Failure> {
        self.load_at(Some(batch), 1)
    }

    /// The forward pass of one of `k` micro-batches of the model's batch, named for what the
    /// step trains (`gpt2 in 4 micro-batches`), for a step accumulating `k` of them.
    pub fn load_accumulated(&self, k: usize) -> Result<ingot_compiler::model::Model, Failure> {
        self.load_at(None, k)
    }

    /// `--batch N` beside a named model: the batch to build it at. A batch the model's spec
    /// writes itself (`cnn:batch=64`) must be the same, or both are named; `--batch` beside a
    /// model file is refused (its batch is in its text). `None` without `--batch`, and for
    /// `--onnx`, whose import takes it.
    fn named_batch(&self) -> Result<Option<usize>, Failure> {
        let Some(b) = self.onnx.import.batch else {
            return Ok(None);
        };
        if self.onnx.onnx.is_some() {
            return Ok(None);
        }
        let Some(name) = &self.model else {
            return Err(Failure::new(
                2,
                "--batch applies to a named model (--model NAME) or an ONNX model (--onnx MODEL.onnx): a model file's batch is written in its text",
            ));
        };
        match ingot_models::spec_batch(name)? {
            Some(s) if s as u64 != b => Err(Failure::new(
                2,
                format!("--batch {b} contradicts batch={s} in --model {name}: give the batch once"),
            )),
            _ => Ok(Some(b as usize)),
        }
    }

    fn load_at(
        &self,
        batch: Option<usize>,
        k: usize,
    ) -> Result<ingot_compiler::model::Model, Failure> {
        let given = self.named_batch()?;
        let batch = batch.or(given);
        // With accumulation the forward graph is one micro-batch's: batch / K.
        let batch = match (k > 1, batch) {
            (false, b) => b,
            (true, b) => {
                let Some(name) = &self.model else {
                    return Err(Failure::new(
                        2,
                        "--accumulate needs --model NAME: a model file's batch is written in its text",
                    ));
                };
                let whole = match b {
                    Some(b) => b,
                    None => model_batch(&ingot_models::by_name(name)?).ok_or_else(|| {
                        Failure::new(2, format!("--accumulate: {name} has no batch input x"))
                    })?,
                };
                if whole % k != 0 {
                    return Err(Failure::new(
                        2,
                        format!("--accumulate {k} must divide the batch of {whole}"),
                    ));
                }
                Some(whole / k)
            }
        };
        let mut model = match (batch, &self.model) {
            (None, _) => self.load_model()?,
            // --batch N at the model's own batch: the model as its name builds it.
            (Some(b), Some(name)) if k == 1 && given == Some(b) => {
                let m = ingot_models::by_name(name)?;
                match model_batch(&m) == Some(b) {
                    true => m,
                    false => ingot_models::at_batch(name, b, ingot_compiler::ir::DType::F32)?,
                }
            }
            (Some(b), Some(name)) if k > 1 => {
                let mut m = ingot_models::at_batch(name, b, ingot_compiler::ir::DType::F32)?;
                m.name = format!("{name} in {k} micro-batches");
                m
            }
            (Some(b), Some(name)) => {
                ingot_models::at_batch(name, b, ingot_compiler::ir::DType::F32)?
            }
            // An ONNX model at another batch: imported again with that batch (the file's
            // batch axis must be symbolic; the import says so otherwise).
            (Some(b), None) if self.onnx.onnx.is_some() && k == 1 => {
                let mut at = self.onnx.clone();
                at.import.batch = Some(b as u64);
                at.load()?.expect("--onnx is given")
            }
            (Some(_), None) => {
                return Err(Failure::new(
                    2,
                    "another batch size needs --model NAME or --onnx MODEL.onnx: a model file's batch is written in its text",
                ))
            }
        };
        let settings = ingot_compiler::autodiff::optim::OptimizerSettings {
            kind: self
                .optimizer
                .as_deref()
                .and_then(ingot_compiler::autodiff::optim::OptimizerKind::parse),
            lr: self.lr,
            weight_decay: self.weight_decay,
            betas: self.betas,
            momentum: self.momentum,
            eps: self.eps,
        };
        if !settings.is_empty() {
            model.optimizer = settings
                .apply(model.optimizer)
                .map_err(|e| Failure::new(2, format!("the optimizer of {}: {e}", model.name)))?;
        }
        Ok(model)
    }

    fn load_model(&self) -> Result<ingot_compiler::model::Model, Failure> {
        if let Some(m) = self.onnx.load()? {
            return Ok(m);
        }
        match (&self.model, &self.model_file) {
            (Some(name), _) => Ok(ingot_models::by_name(name)?),
            (None, Some(path)) => {
                let text = read_text(path, MAX_MODEL_FILE_BYTES)?;
                let name = path.display().to_string();
                ingot_compiler::model::Model::from_ir_text(&name, &text).map_err(|e| {
                    Failure::new(
                        1,
                        match e {
                            ingot_compiler::error::IrError::Model { .. } => e.to_string(),
                            e => format!("{name}: {e}"),
                        },
                    )
                })
            }
            (None, None) => Err(Failure::new(
                2,
                "give --model NAME, --model-file PATH or --onnx MODEL.onnx",
            )),
        }
    }
}
