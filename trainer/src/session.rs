//! A training session: a model's step, compiled and planned for a [`Device`] and loaded into one
//! allocation that holds the values of all its leaves (parameters, optimizer state, the batch).
//! On the CPU the planned executor ([`PlannedStep`]) steps it; on CUDA ([`Device::Cuda`]) a
//! [`CudaStep`] runs its kernels in one device slab. Neither allocates per step.
//!
//! ```no_run
//! # use ingot_trainer::session::Session;
//! let model = ingot_models::by_name("mlp").unwrap();
//! let mut s = Session::new(&model, 0).unwrap(); // seeded weights and a synthetic batch
//! for _ in 0..10 {
//!     let r = s.step().unwrap();
//!     println!("loss {} in {:.3} s", r.loss, r.seconds);
//! }
//! ingot_runtime::io::save("trained.safetensors", &s.parameters()).unwrap();
//! ```

use crate::init;
use indexmap::IndexMap;
use ingot_compiler::autodiff::copies;
use ingot_compiler::autodiff::optim::STEP_COUNTER;
use ingot_compiler::autodiff::{GRAD_NORM, LOSS, LR_SCALE, NONFINITE};
use ingot_compiler::exe::{Executable, StepPair, Target};
use ingot_compiler::ir::{DType, Graph, LeafKind, NodeId, TensorType};
use ingot_compiler::lower::LowerError;
use ingot_compiler::model::Model;
use ingot_compiler::pipeline;
use ingot_compiler::plan::shared::SharedLayout;
use ingot_compiler::plan::Location;
use ingot_compiler::trace::nn::DROPOUT_SEED;
use ingot_compiler::IrError;
use ingot_runtime::cpu::planned::PlannedStep;
use ingot_runtime::cuda::{CudaOptions, CudaStep};
use ingot_runtime::error::ExecError;
use ingot_runtime::executor::StepExecutor;
use ingot_runtime::tensor::{Data, Tensor};
use smallvec::SmallVec;
use std::time::Instant;
use thiserror::Error;

/// What can go wrong building, feeding or stepping a session. Each names the tensor at fault.
#[derive(Debug, Error)]
pub enum SessionError {
    /// The model's training step could not be built.
    #[error("building the training step of {model}: {source}")]
    Build { model: String, source: IrError },
    /// The training step's memory could not be planned.
    #[error("planning the memory of {model}'s training step: {source}")]
    Plan {
        model: String,
        source: ingot_compiler::plan::PlanError,
    },
    /// The planned step could not be lowered for the device (its plan did not validate, or an
    /// op has no kernel there).
    #[error("lowering {model}'s training step for {target}: {source}")]
    Lower {
        model: String,
        target: Target,
        source: LowerError,
    },
    /// An executable lowered for another target than the device's.
    #[error("the executable of {model} was lowered for {planned}, not {device}: the two plan different library workspaces, so a step runs only on its own target; recompile it with --device {device}")]
    WrongTarget {
        model: String,
        planned: Target,
        device: Target,
    },
    /// A parameter the model needs is not among those given.
    #[error("parameter {name:?} ({expected}) is missing from the parameters given; the model's parameters are named as PyTorch names them (reference-models.md)")]
    MissingParameter { name: String, expected: TensorType },
    /// A given parameter has the wrong shape or dtype.
    #[error("parameter {name:?} is {got}, but the model needs {expected}")]
    ParameterType {
        name: String,
        expected: TensorType,
        got: TensorType,
    },
    /// Names given that are not parameters of the model.
    #[error("{} given that the model does not have: {}; its parameters are {}", if .names.len() == 1 { "a tensor is" } else { "tensors are" }, quoted(.names), quoted(.known))]
    UnknownParameters {
        names: Vec<String>,
        known: Vec<String>,
    },
    /// A batch tensor with the wrong shape or dtype.
    #[error("batch input {name:?} is {got}, but the model takes {expected}")]
    BatchType {
        name: String,
        expected: TensorType,
        got: TensorType,
    },
    /// Ids that are not integers.
    #[error("batch input {name:?} holds {got} ids, but ids must be int32 or int64 (the model takes {expected})")]
    IdDtype {
        name: String,
        expected: DType,
        got: DType,
    },
    /// An id outside the range the model accepts.
    #[error("batch input {name:?} holds id {id} at position {position}, outside 0..{bound} (the model's {what})")]
    IdOutOfRange {
        name: String,
        id: i64,
        position: usize,
        bound: usize,
        what: &'static str,
    },
    /// The batch lacks an input.
    #[error("the batch has no tensor {name:?} (it holds {}); a batch holds \"x\" and \"y\"", if .given.is_empty() { "nothing".to_string() } else { quoted(.given) })]
    MissingInput { name: String, given: Vec<String> },
    /// The step graph has no input of that name.
    #[error("the model has no input named {name:?}; its inputs are {}", quoted(.known))]
    UnknownInput { name: String, known: Vec<String> },
    /// Running the step failed.
    #[error("running the step: {0}")]
    Exec(Box<ExecError>),
    /// Loading the step failed: its plan did not validate, its memory could not be allocated
    /// (larger than the host's or the GPU's), or the GPU could not be set up.
    #[error("loading the step: {0}")]
    Load(Box<ExecError>),
    /// A step whose optimizer is sharded over the ranks (`autodiff::shard`) on an executor
    /// that holds one rank alone (a process of a torchrun job): it cannot read or write the
    /// sharded leaves whole.
    #[error("{model}'s step shards its optimizer over the ranks (parameter {leaf:?} holds one rank's rows), and this process holds one rank alone: it cannot initialise, load or checkpoint the whole weights; run the ranks in one process (--gpus N, --ranks N) or compile without sharding the optimizer")]
    ShardedOptimizer { model: String, leaf: String },
}

impl From<ExecError> for SessionError {
    fn from(e: ExecError) -> SessionError {
        SessionError::Exec(Box::new(e))
    }
}

fn quoted(names: &[String]) -> String {
    names
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What one step reports.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepResult {
    /// The loss of the batch under the parameters before the update.
    pub loss: f64,
    /// Seconds the step took: the device's own time on a GPU (CUDA events around the step),
    /// the wall clock on the CPU.
    pub seconds: f64,
    /// Wall-clock seconds of the step and the loss's return to the host: what a training loop
    /// waits, launch and synchronisation included.
    pub wall_seconds: f64,
}

use ingot_compiler::layout::ChannelsLast;

/// The environment variable that, set to `0`, keeps a CUDA step's convolutions NCHW
/// ([`Device::channels_last`]), which then run as im2col + cuBLAS by default.
pub const CHANNELS_LAST: &str = "INGOT_CHANNELS_LAST";

/// Where a session's step runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Device {
    #[default]
    Cpu,
    Cuda(CudaOptions),
}

impl Device {
    /// The target this device's plans are made for (what a step executable records).
    pub fn target(&self) -> Target {
        match self {
            Device::Cpu => Target::Cpu,
            Device::Cuda(_) => Target::Cuda,
        }
    }

    /// The pipeline options for this device: rewriting and fusion on, and the target's
    /// workspace planned (the CPU matmul's packing space, or cuBLAS's workspace).
    pub fn options(&self) -> pipeline::Options {
        pipeline::Options {
            channels_last: self.channels_last(),
            ..pipeline::Options::for_target(self.target())
        }
    }

    /// Whether this device's steps store their convolutions channels-last
    /// ([`ingot_compiler::layout`]): on CUDA by default where the graph's rule says it pays
    /// (its convolutions in bf16: [`ingot_compiler::layout::pays`], measured in session 36,
    /// docs/benchmarks.md), under `INGOT_CONV=cudnn` always; never under `INGOT_CONV=im2col`
    /// (or `--conv im2col`), with [`CHANNELS_LAST`]`=0`, or on the CPU. It depends on the
    /// options alone, not on whether cuDNN loads on the machine that compiles: a plan made in
    /// CI without cuDNN is the plan the GPU machine runs. Loading a channels-last step where
    /// cuDNN does not load is refused before its first step, naming the ways out.
    /// A misspelt `INGOT_CONV` keeps NCHW here and is refused when a step loads (the command
    /// line refuses it before compiling).
    pub fn channels_last(&self) -> ChannelsLast {
        use ingot_runtime::cuda::cudnn::{self, ConvSetting};
        let wanted = matches!(self, Device::Cuda(_))
            && std::env::var(CHANNELS_LAST)
                .ok()
                .is_none_or(|v| v.trim() != "0");
        if !wanted {
            return ChannelsLast::No;
        }
        match cudnn::conv_path() {
            Ok(ConvSetting::Auto) => ChannelsLast::WherePays,
            Ok(ConvSetting::Cudnn) => ChannelsLast::Yes,
            Ok(ConvSetting::Im2col) | Err(_) => ChannelsLast::No,
        }
    }
}

/// The loaded step, on one of the backends.
enum Backend {
    Cpu(Box<PlannedStep>),
    Cuda(Box<CudaStep>),
    /// A step compiled for several data-parallel ranks, as many CPU ranks
    /// ([`ingot_runtime::cpu::ranks::CpuRanks`]).
    CpuRanks(Box<ingot_runtime::cpu::ranks::CpuRanks>),
    /// A step compiled for several data-parallel ranks, one per GPU, over NCCL
    /// ([`ingot_runtime::cuda::ranks::GpuRanks`]).
    CudaRanks(Box<ingot_runtime::cuda::ranks::GpuRanks>),
    /// One rank of a job of one process per GPU ([`ingot_runtime::cuda::process::ProcessRank`]).
    CudaProcess(Box<ingot_runtime::cuda::process::ProcessRank>),
}

/// A model's training step, loaded with the values of all its leaves.
pub struct Session {
    model: String,
    precision: ingot_compiler::precision::Precision,
    /// The step's model FLOPs on one rank, as its executable's report keeps them
    /// ([`Session::model_flops`]).
    model_flops: u64,
    /// The step and its one allocation, which holds every leaf's value.
    exe: Backend,
    steps: u64,
    /// Where the step's loss lives, read after each step without allocating.
    loss: Option<(Location, DType)>,
    /// Where the step counts the non-finite values of the parameters it wrote
    /// ([`ingot_compiler::autodiff::StepOptions::count_nonfinite`]), read as the loss is.
    nonfinite: Option<(Location, DType)>,
    /// The learning-rate scale input and the factor written with each step's inputs.
    lr_scale: Option<(NodeId, f64)>,
    /// AdamW's step-number input ([`ingot_compiler::autodiff::StepOptions::step_input`]) and
    /// the number of the next update (1 for the first), written with each step's inputs.
    step_number: Option<(NodeId, u64)>,
    /// Dropout's seed input ([`ingot_compiler::trace::nn::DROPOUT_SEED`]), the run's seed,
    /// and the number of the next step (0 for the first): each step is given
    /// [`ingot_kernels::rng::step_seed`] of the two, so a run repeats, and a resumed run
    /// ([`Session::set_updates_done`]) draws the masks the uninterrupted one drew.
    dropout_seed: Option<(NodeId, u64, u64)>,
    /// The evaluation step loaded in the same allocation ([`Session::from_pair`]).
    eval: Option<EvalStep>,
    /// CPU only, where the process counts its heap ([`crate::host_memory`]): the bytes loading
    /// the step left allocated (its one allocation and its program).
    host_loaded: Option<usize>,
}

/// What the session knows of its evaluation step.
struct EvalStep {
    layout: SharedLayout,
    loss: (Location, DType),
    slots: [(NodeId, usize); 2],
    /// Where a classifier's evaluation step counts its top-1 and top-5 hits
    /// ([`ingot_compiler::trace::accuracy`]), and the rows of its batch.
    top_k: Option<([(Location, DType); 2], usize)>,
}

/// What one evaluation batch gives ([`Session::eval_batch_on`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EvalOutput {
    pub loss: f64,
    /// A classifier's rows whose label is the top class, and within the top five, out of
    /// `rows` (averaged over data-parallel ranks, as the loss is); `None` for other models.
    pub top_k: Option<TopK>,
}

/// Top-k hit counts of one evaluation batch (or their sums over several).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TopK {
    pub top1: f64,
    pub top5: f64,
    pub rows: f64,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("model", &self.model)
            .field("device", &self.exe().device())
            .field("allocated_bytes", &self.exe().allocated_bytes())
            .field("steps", &self.steps)
            .finish()
    }
}

impl Session {
    /// Builds `model`'s training step, initialises its parameters and optimizer state from
    /// `seed` ([`init`]), and sets a synthetic batch from the same seed.
    pub fn new(model: &Model, seed: u64) -> Result<Session, SessionError> {
        Session::with_options(model, seed, &Session::cpu_options())
    }

    /// The pipeline options a CPU session uses: rewriting and fusion on, CPU workspace planned.
    pub fn cpu_options() -> pipeline::Options {
        Device::Cpu.options()
    }

    /// As [`Session::new`], on `device`.
    pub fn on(model: &Model, seed: u64, device: Device) -> Result<Session, SessionError> {
        Session::build(model, seed, &device.options(), device)
    }

    /// As [`Session::on`], compiled with `opts` (their precision, say; their plan options must
    /// be `device`'s target's, [`Device::options`]).
    pub fn on_with(
        model: &Model,
        seed: u64,
        opts: &pipeline::Options,
        device: Device,
    ) -> Result<Session, SessionError> {
        Session::build(model, seed, opts, device)
    }

    /// As [`Session::new`], compiled with `opts` (e.g. [`pipeline::Options::unoptimized`] for
    /// the primitive ops, unfused).
    pub fn with_options(
        model: &Model,
        seed: u64,
        opts: &pipeline::Options,
    ) -> Result<Session, SessionError> {
        Session::build(model, seed, opts, Device::Cpu)
    }

    fn build(
        model: &Model,
        seed: u64,
        opts: &pipeline::Options,
        device: Device,
    ) -> Result<Session, SessionError> {
        let compiled = pipeline::compile(model, opts).map_err(|e| match e {
            pipeline::CompileError::Ir(source) => SessionError::Build {
                model: model.name.clone(),
                source,
            },
            pipeline::CompileError::Plan(source) => SessionError::Plan {
                model: model.name.clone(),
                source,
            },
            pipeline::CompileError::Lower(source) => SessionError::Lower {
                model: model.name.clone(),
                target: device.target(),
                source,
            },
        })?;
        let exe = compiled
            .executable(device.target())
            .map_err(|source| SessionError::Lower {
                model: model.name.clone(),
                target: device.target(),
                source,
            })?;
        Session::from_executable(exe, seed, device)
    }

    /// A session running a step executable as it is (made by [`pipeline::Compiled::executable`],
    /// [`Executable::from_plan`] or read from a file): its program loaded on `device`, whose
    /// target must be the executable's, its parameters and optimizer state initialised from
    /// `seed` and a synthetic batch from the same seed, exactly as [`Session::on`] does for the
    /// same step. Nothing is lowered or validated again.
    pub fn from_executable(
        exe: Executable,
        seed: u64,
        device: Device,
    ) -> Result<Session, SessionError> {
        if exe.target() != device.target() {
            return Err(SessionError::WrongTarget {
                model: exe.model().to_string(),
                planned: exe.target(),
                device: device.target(),
            });
        }
        // The allocation first: a plan too large for the device is refused (naming its sizes)
        // before any leaf's initial value is made on the host.
        let load = |e: ExecError| SessionError::Load(Box::new(e));
        // Written into their leaves once the step is loaded (the executable moves into it).
        let constants = exe.constants().to_vec();
        // On the CPU, the host heap the loading took (the one allocation and the program) is
        // measured where the process counts its allocations ([`crate::host_memory`]).
        let (backend, host) = crate::host_memory::held_by(|| -> Result<Backend, SessionError> {
            Ok(match device {
                Device::Cpu if ingot_runtime::collective::ranks::ranks_of(&exe) > 1 => {
                    Backend::CpuRanks(Box::new(
                        ingot_runtime::cpu::ranks::CpuRanks::new(exe).map_err(load)?,
                    ))
                }
                Device::Cpu => Backend::Cpu(Box::new(PlannedStep::new(exe).map_err(load)?)),
                Device::Cuda(o) if ingot_runtime::collective::ranks::ranks_of(&exe) > 1 => {
                    Backend::CudaRanks(Box::new(
                        ingot_runtime::cuda::ranks::GpuRanks::new(exe, o.serial).map_err(load)?,
                    ))
                }
                Device::Cuda(o) => Backend::Cuda(Box::new(CudaStep::new(exe, o).map_err(load)?)),
            })
        });
        let mut session = Session::loaded(backend?, None, seed)?;
        session.host_loaded = host.filter(|_| matches!(device, Device::Cpu));
        // The state the step reads and never writes (an imported model's constants): the
        // file's values, not the zeros state starts at.
        for c in &constants {
            let id = session.exe().leaf_id(&c.name)?;
            let value = Tensor::from_le_bytes(session.exe().leaf_type(id), &c.bytes)?;
            session.exe_mut().write_leaf(&c.name, &value)?;
        }
        Ok(session)
    }

    /// CPU only, where the process counts its heap ([`crate::host_memory::Counting`] is its
    /// allocator): the host bytes loading the step left allocated, its one allocation (the
    /// planned total, and the threads' scratch after it) and its loaded program. `None` on a
    /// GPU, whose allocation [`CudaStep::memory`] measures, and without the counting allocator.
    pub fn host_loaded_bytes(&self) -> Option<usize> {
        self.host_loaded
    }

    /// A session running a training step and its forward-only evaluation step in one
    /// allocation ([`StepPair`]: the two share the parameters, and their transient regions
    /// overlap): [`Session::step`] and [`Session::step_on`] train, [`Session::eval_on`]
    /// evaluates the current parameters. Initialised as [`Session::from_executable`] does.
    pub fn from_pair(pair: StepPair, seed: u64, device: Device) -> Result<Session, SessionError> {
        let exe = pair.train();
        if exe.target() != device.target() {
            return Err(SessionError::WrongTarget {
                model: exe.model().to_string(),
                planned: exe.target(),
                device: device.target(),
            });
        }
        let layout = pair.layout();
        let load = |e: ExecError| SessionError::Load(Box::new(e));
        let ranks = ingot_runtime::collective::ranks::ranks_of(exe);
        let (backend, host) = crate::host_memory::held_by(|| -> Result<Backend, SessionError> {
            Ok(match device {
                Device::Cpu if ranks > 1 => Backend::CpuRanks(Box::new(
                    ingot_runtime::cpu::ranks::CpuRanks::pair(pair).map_err(load)?,
                )),
                Device::Cpu => Backend::Cpu(Box::new(PlannedStep::pair(pair).map_err(load)?)),
                Device::Cuda(o) if ranks > 1 => Backend::CudaRanks(Box::new(
                    ingot_runtime::cuda::ranks::GpuRanks::pair(pair, o.serial).map_err(load)?,
                )),
                Device::Cuda(o) => Backend::Cuda(Box::new(CudaStep::pair(pair, o).map_err(load)?)),
            })
        });
        let mut session = Session::loaded(backend?, Some(layout), seed)?;
        session.host_loaded = host.filter(|_| matches!(device, Device::Cpu));
        Ok(session)
    }

    fn loaded(
        backend: Backend,
        layout: Option<SharedLayout>,
        seed: u64,
    ) -> Result<Session, SessionError> {
        let step: &dyn StepExecutor = match &backend {
            Backend::Cpu(p) => p.as_ref(),
            Backend::Cuda(c) => c.as_ref(),
            Backend::CpuRanks(r) => r.as_ref(),
            Backend::CudaRanks(r) => r.as_ref(),
            Backend::CudaProcess(r) => r.as_ref(),
        };
        let (model, precision, model_flops) = {
            let e = match &backend {
                Backend::Cpu(p) => p.executable(),
                Backend::Cuda(c) => c.executable(),
                Backend::CpuRanks(r) => r.ranks()[0].executable(),
                Backend::CudaRanks(r) => r.ranks()[0].executable(),
                Backend::CudaProcess(r) => r.step().executable(),
            };
            // A report written before it kept the count: the graph's products, recomputed
            // copies among them (the graph has no provenance to tell them apart).
            let flops = e
                .report()
                .model_flops
                .unwrap_or_else(|| ingot_compiler::flops::model(e.graph()));
            (e.model().to_string(), e.precision(), flops)
        };
        let scalar_at = |g: &Graph, plan: &ingot_compiler::plan::MemoryPlan, name: &str| {
            let id = *g.outputs.get(name)?;
            (g.ty(id).shape.numel() == 1).then(|| (plan.location(g, id), g.ty(id).dtype))
        };
        let input = |g: &Graph, name: &str| {
            g.leaf(name)
                .filter(|id| g.leaves(LeafKind::Input).contains(id))
        };
        let graph = step.graph();
        let loss = scalar_at(graph, step.plan(), LOSS);
        let nonfinite = scalar_at(graph, step.plan(), NONFINITE);
        let lr_scale = input(graph, LR_SCALE).map(|id| (id, 1.0));
        let step_number = input(graph, STEP_COUNTER).map(|id| (id, 1));
        let dropout_seed = input(graph, DROPOUT_SEED).map(|id| (id, seed, 0));
        let eval = match (layout, step.eval_executable()) {
            (Some(layout), Some(eval)) => {
                let (g, plan) = (eval.graph(), eval.plan());
                let loss = scalar_at(g, plan, LOSS).ok_or_else(|| {
                    SessionError::Exec(Box::new(ExecError::Invalid {
                        op: "eval",
                        reason: format!("the evaluation step has no scalar output {LOSS:?}"),
                    }))
                })?;
                let slot = |name: &str| {
                    let id = input(g, name).ok_or_else(|| SessionError::UnknownInput {
                        name: name.to_string(),
                        known: g
                            .leaves(LeafKind::Input)
                            .into_iter()
                            .filter_map(|id| g.leaf_name(id).map(str::to_string))
                            .collect(),
                    })?;
                    // A batch for every data-parallel rank together, as the training step's
                    // ([`Session::input_slots`]).
                    let union = match step.data_shard() {
                        Some(_) => 1,
                        None => step.data_ranks(),
                    };
                    Ok::<_, SessionError>((id, plan.location(g, id).bytes * union))
                };
                use ingot_compiler::trace::accuracy::{TOP1, TOP5};
                let top_k = match (scalar_at(g, plan, TOP1), scalar_at(g, plan, TOP5)) {
                    (Some(a), Some(b)) => {
                        let rows = input(g, "y").map_or(0, |id| g.ty(id).shape.dims()[0]);
                        Some(([a, b], rows))
                    }
                    _ => None,
                };
                Some(EvalStep {
                    layout,
                    loss,
                    slots: [slot("x")?, slot("y")?],
                    top_k,
                })
            }
            _ => None,
        };
        let mut session = Session {
            model,
            precision,
            model_flops,
            exe: backend,
            steps: 0,
            loss,
            nonfinite,
            lr_scale,
            step_number,
            dropout_seed,
            eval,
            host_loaded: None,
        };
        session.check_whole_leaves()?;
        let graph = session.graph();
        let mut values = init::init_leaves(graph, LeafKind::Parameter, seed);
        values.extend(init::init_leaves(graph, LeafKind::State, seed));
        for (name, value) in &values {
            session.exe_mut().write_leaf(name, value)?;
        }
        session.set_synthetic_batch(seed)?;
        Ok(session)
    }

    /// Refuses a step whose optimizer is sharded over the ranks (`autodiff::shard`) where the
    /// executor cannot present its leaves whole ([`StepExecutor::leaf_type`]): one process of
    /// a torchrun job holds only its own rank's rows, and joining the others' would take a
    /// collective. The ranks of one process ([`ingot_runtime::cpu::ranks::CpuRanks`], the GPU
    /// ranks) present them whole, so their sessions initialise, load and checkpoint whole
    /// tensors as for the unsharded step.
    fn check_whole_leaves(&self) -> Result<(), SessionError> {
        let g = self.graph();
        // Only a sharded leaf's whole type differs from its own.
        let partial = g.leaves(LeafKind::Parameter).into_iter().find(|&l| {
            self.exe().leaf_type(l) != ingot_compiler::autodiff::shard::whole_type(g, l)
        });
        match partial {
            Some(leaf) => Err(SessionError::ShardedOptimizer {
                model: self.model.clone(),
                leaf: g.leaf_name(leaf).unwrap_or("?").to_string(),
            }),
            None => Ok(()),
        }
    }

    /// Writes the synthetic batch of `seed` ([`init::synthetic_union_batch`]): with several
    /// data-parallel ranks, one for all of them together, each rank's part its own samples
    /// (in one process of several, this rank's part alone), as a data set's shards would be.
    fn set_synthetic_batch(&mut self, seed: u64) -> Result<(), SessionError> {
        let (ranks, mine) = match self.exe().data_shard() {
            Some((r, n)) => (n, Some(r)),
            None => (self.exe().data_ranks(), None),
        };
        let union = init::synthetic_union_batch(self.graph(), seed, ranks);
        for (name, value) in &union {
            // One rank's batch, or a scalar: the same value on every rank.
            if ranks <= 1 || value.dims().is_empty() {
                self.exe_mut().write_leaf(name, value)?;
                continue;
            }
            let id = self.exe().leaf_id(name)?;
            let bytes = value.to_le_bytes();
            let part = bytes.len() / ranks;
            match mine {
                Some(r) => self
                    .exe_mut()
                    .write_node_bytes(id, &bytes[r * part..(r + 1) * part])?,
                None => self.exe_mut().write_node_bytes(id, &bytes)?,
            }
        }
        Ok(())
    }

    /// The precision the step was compiled in.
    pub fn precision(&self) -> ingot_compiler::precision::Precision {
        self.precision
    }

    /// The step's model FLOPs on one rank ([`ingot_compiler::flops::model`]: the forward and
    /// backward products of every micro-batch, recomputed ones left out), as counted when it was
    /// compiled and kept in its executable's report, so a step read from a file counts the same
    /// as the step compiled in the process.
    pub fn model_flops(&self) -> u64 {
        self.model_flops
    }

    /// The model's name.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The training step graph.
    pub fn graph(&self) -> &Graph {
        self.exe().graph()
    }

    /// The loaded step: its plan and its one allocation, on whichever device.
    pub fn exe(&self) -> &dyn StepExecutor {
        match &self.exe {
            Backend::Cpu(p) => p.as_ref(),
            Backend::Cuda(c) => c.as_ref(),
            Backend::CpuRanks(r) => r.as_ref(),
            Backend::CudaRanks(r) => r.as_ref(),
            Backend::CudaProcess(r) => r.as_ref(),
        }
    }

    fn exe_mut(&mut self) -> &mut dyn StepExecutor {
        match &mut self.exe {
            Backend::Cpu(p) => p.as_mut(),
            Backend::Cuda(c) => c.as_mut(),
            Backend::CpuRanks(r) => r.as_mut(),
            Backend::CudaRanks(r) => r.as_mut(),
            Backend::CudaProcess(r) => r.as_mut(),
        }
    }

    /// Runs the step's operations one at a time on the GPU with an event after each
    /// ([`CudaStep::profile`]; on several GPUs every rank at once) and returns (rank 0's) device
    /// time per operation in milliseconds, in program order; `None` off the GPU or in a
    /// process of a torchrun job.
    pub fn profile_gpu(&mut self) -> Option<Result<Vec<f32>, ExecError>> {
        match &mut self.exe {
            Backend::Cuda(c) => Some(c.profile()),
            Backend::CudaRanks(r) => Some(r.profile()),
            Backend::Cpu(_) | Backend::CpuRanks(_) | Backend::CudaProcess(_) => None,
        }
    }

    /// Replays the step `replays` times as a graph with a timestamp after each operation
    /// ([`CudaStep::timeline`]; on several GPUs every rank at once) and returns every rank's
    /// stamps in nanoseconds, rank 0 first; `None` off the GPU or in a process of a torchrun job.
    pub fn timeline_gpu(&mut self, replays: usize) -> Option<Result<Vec<Vec<u64>>, ExecError>> {
        match &mut self.exe {
            Backend::Cuda(c) => Some(c.timeline(replays).map(|t| vec![t])),
            Backend::CudaRanks(r) => Some(r.timeline(replays)),
            Backend::Cpu(_) | Backend::CpuRanks(_) | Backend::CudaProcess(_) => None,
        }
    }

    /// The step loaded on the GPU, if the session runs there (for its memory measurements);
    /// rank 0's on several GPUs.
    pub fn cuda(&self) -> Option<&CudaStep> {
        match &self.exe {
            Backend::Cuda(c) => Some(c),
            Backend::CudaRanks(r) => r.ranks().first(),
            Backend::CudaProcess(r) => Some(r.step()),
            Backend::Cpu(_) | Backend::CpuRanks(_) => None,
        }
    }

    /// The step on every GPU it runs on, rank 0 first (one for a single-GPU session, none on
    /// the CPU).
    pub fn cuda_ranks(&self) -> Vec<&CudaStep> {
        match &self.exe {
            Backend::Cuda(c) => vec![c],
            Backend::CudaRanks(r) => r.ranks().iter().collect(),
            Backend::CudaProcess(r) => vec![r.step()],
            Backend::Cpu(_) | Backend::CpuRanks(_) => Vec::new(),
        }
    }

    /// This process's rank of a job of one process per GPU (`--torchrun`).
    pub fn process_rank(&self) -> Option<&ingot_runtime::cuda::process::ProcessRank> {
        match &self.exe {
            Backend::CudaProcess(r) => Some(r),
            _ => None,
        }
    }

    /// A session running `exe` (compiled for `env.world` ranks, lowered for CUDA) as this
    /// process's rank of a job of one process per GPU: the processes meet, each makes its NCCL
    /// communicator and loads the step on GPU `env.local_rank`. Parameters are initialised
    /// from `seed` on every rank alike, as [`Session::from_executable`] does.
    pub fn from_process_rank(
        exe: Executable,
        seed: u64,
        env: &ingot_runtime::collective::launch::LaunchEnv,
        serial: bool,
    ) -> Result<Session, SessionError> {
        let load = |e: ExecError| SessionError::Load(Box::new(e));
        let rank =
            ingot_runtime::cuda::process::ProcessRank::new(exe, env, serial).map_err(load)?;
        Session::loaded(Backend::CudaProcess(Box::new(rank)), None, seed)
    }

    /// As [`Session::from_process_rank`], with the pair's evaluation step beside the training
    /// step in one allocation ([`Session::from_pair`]): each process evaluates its shard of
    /// each batch, and the loss read is the mean over the processes.
    pub fn from_process_rank_pair(
        pair: StepPair,
        seed: u64,
        env: &ingot_runtime::collective::launch::LaunchEnv,
        serial: bool,
    ) -> Result<Session, SessionError> {
        let layout = pair.layout();
        let load = |e: ExecError| SessionError::Load(Box::new(e));
        let rank =
            ingot_runtime::cuda::process::ProcessRank::pair(pair, env, serial).map_err(load)?;
        Session::loaded(Backend::CudaProcess(Box::new(rank)), Some(layout), seed)
    }

    /// The GPU ranks of a data-parallel session over NCCL.
    pub fn gpu_ranks(&self) -> Option<&ingot_runtime::cuda::ranks::GpuRanks> {
        match &self.exe {
            Backend::CudaRanks(r) => Some(r),
            _ => None,
        }
    }

    /// How many steps have run.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The names of the leaves of `kind`, but the parameters' bf16 copies: derived from the
    /// parameters ([`ingot_compiler::autodiff::copies`]), never saved or loaded on their own.
    fn leaf_names_of(&self, kind: LeafKind) -> Vec<String> {
        let g = self.graph();
        self.exe()
            .leaf_names(kind)
            .into_iter()
            .filter(|name| !g.leaf(name).is_some_and(|id| copies::is_copy(g, id)))
            .collect()
    }

    /// Writes each parameter's bf16 copy from `params`, the parameters' values just written
    /// (every parameter, by name: [`Session::load_parameters`] has checked them).
    fn write_copies(&mut self, params: &IndexMap<String, Tensor>) -> Result<(), SessionError> {
        let g = self.graph();
        let pairs: Vec<(String, String)> = g
            .leaves(LeafKind::State)
            .into_iter()
            .filter_map(|c| {
                let p = copies::param_of(g, c)?;
                Some((g.leaf_name(c)?.to_string(), g.leaf_name(p)?.to_string()))
            })
            .collect();
        for (copy, param) in pairs {
            let value = &params[&param];
            let cast = init::bf16_copy(value).ok_or_else(|| SessionError::ParameterType {
                name: param.clone(),
                expected: TensorType::new(value.shape().clone(), DType::F32),
                got: value.ty.clone(),
            })?;
            self.exe_mut().write_leaf(&copy, &cast)?;
        }
        Ok(())
    }

    fn leaves_of(&self, kind: LeafKind) -> IndexMap<String, Tensor> {
        self.leaf_names_of(kind)
            .into_iter()
            .filter_map(|name| {
                let value = self.exe().read_leaf(&name).ok()?;
                Some((name, value))
            })
            .collect()
    }

    /// The parameters by PyTorch name, in the model's order (what `--save` writes).
    pub fn parameters(&self) -> IndexMap<String, Tensor> {
        self.leaves_of(LeafKind::Parameter)
    }

    /// The optimizer state (`{param}.exp_avg`, `{param}.exp_avg_sq`, `step` for AdamW; none for
    /// SGD). Where AdamW's step number is an input of the step rather than state, `step` is the
    /// number of updates made, as the state would hold it: a checkpoint reads the same either way.
    pub fn optimizer_state(&self) -> IndexMap<String, Tensor> {
        let mut state = self.leaves_of(LeafKind::State);
        if let Some((_, next)) = self.step_number {
            state.insert(STEP_COUNTER.to_string(), Tensor::scalar((next - 1) as f64));
        }
        state
    }

    /// The batch every step trains on: `x` and `y`.
    pub fn batch(&self) -> IndexMap<String, Tensor> {
        let mut b = self.leaves_of(LeafKind::Input);
        b.shift_remove(LR_SCALE);
        if self.step_number.is_some() {
            b.shift_remove(STEP_COUNTER);
        }
        b.shift_remove(DROPOUT_SEED);
        b
    }

    /// Whether the step was compiled with a learning-rate scale input
    /// ([`ingot_compiler::autodiff::StepOptions::lr_scale`]).
    pub fn has_lr_scale(&self) -> bool {
        self.lr_scale.is_some()
    }

    /// Whether AdamW's step number is an input of the step
    /// ([`ingot_compiler::autodiff::StepOptions::step_input`]), counted by the session.
    pub fn has_step_input(&self) -> bool {
        self.step_number.is_some()
    }

    /// Sets the factor the next steps scale the learning rate by (a schedule's value for the
    /// step). It is written into the input's slot with the next step's inputs (on a GPU, an
    /// asynchronous copy queued before the step, not a synchronous write now): nothing is
    /// allocated. An error if the step has no such input.
    pub fn set_lr_scale(&mut self, factor: f64) -> Result<(), SessionError> {
        match &mut self.lr_scale {
            Some((_, f)) => {
                *f = factor;
                Ok(())
            }
            None => Err(SessionError::UnknownInput {
                name: LR_SCALE.to_string(),
                known: self.input_names(),
            }),
        }
    }

    /// Says how many updates the optimizer has made (a resumed run's checkpoint step): the next
    /// step passes `done + 1` as AdamW's step number. Nothing to do, and no error, when the
    /// step keeps its counter as state (loaded with [`Session::load_optimizer_state`]) or has
    /// none.
    pub fn set_updates_done(&mut self, done: u64) {
        if let Some((_, next)) = &mut self.step_number {
            *next = done + 1;
        }
        // Dropout's masks: step `done` (0-based) comes next.
        if let Some((_, _, next)) = &mut self.dropout_seed {
            *next = done;
        }
    }

    /// How the one allocation divides between the training and evaluation steps, when the
    /// session holds both ([`Session::from_pair`]).
    pub fn shared_layout(&self) -> Option<SharedLayout> {
        self.eval.as_ref().map(|e| e.layout)
    }

    /// The planned slots of the evaluation step's inputs `x` and `y`, and each one's bytes
    /// (what [`Session::eval_on`] takes); `None` without an evaluation step.
    pub fn eval_input_slots(&self) -> Option<[(NodeId, usize); 2]> {
        self.eval.as_ref().map(|e| e.slots)
    }

    /// Runs the evaluation step ([`Session::from_pair`]) on the current parameters and the batch
    /// given as the bytes of `x` and `y`, copied straight into its input slots, and returns its
    /// loss. Nothing is allocated; the parameters and optimizer state are not changed.
    pub fn eval_on(&mut self, x: &[u8], y: &[u8]) -> Result<f64, SessionError> {
        Ok(self.eval_batch_on(x, y)?.loss)
    }

    /// As [`Session::eval_on`], with a classifier's top-1 and top-5 hit counts, which its
    /// evaluation step computes beside the loss (two scalars, read as the loss is).
    pub fn eval_batch_on(&mut self, x: &[u8], y: &[u8]) -> Result<EvalOutput, SessionError> {
        let eval = self.eval.as_ref().ok_or_else(|| {
            SessionError::Exec(Box::new(ExecError::Invalid {
                op: "eval",
                reason: "this session was loaded without an evaluation step".into(),
            }))
        })?;
        let (slots, (at, dtype), top_k) = (eval.slots, eval.loss, eval.top_k);
        let x = x.get(..slots[0].1).unwrap_or(x);
        let y = y.get(..slots[1].1).unwrap_or(y);
        self.exe_mut()
            .eval_with_inputs(&[(slots[0].0, x), (slots[1].0, y)])?;
        let loss = self.exe().read_scalar(at, dtype)?;
        let top_k = match top_k {
            Some(([(a1, d1), (a5, d5)], rows)) => Some(TopK {
                top1: self.exe().read_scalar(a1, d1)?,
                top5: self.exe().read_scalar(a5, d5)?,
                rows: rows as f64,
            }),
            None => None,
        };
        Ok(EvalOutput { loss, top_k })
    }

    /// Runs the step once with `inputs` written into their planned slots and no other input
    /// (no learning-rate scale, step number or dropout seed): a forward-only step's run
    /// ([`crate::infer`]). Allocates nothing; counts no training step.
    pub fn run_with_inputs(&mut self, inputs: &[(NodeId, &[u8])]) -> Result<(), SessionError> {
        self.exe_mut().step_with_inputs(inputs)?;
        Ok(())
    }

    /// Copies `out.len()` bytes from `at` (a location of the plan) after the last step into
    /// `out` ([`StepExecutor::read_at`]): a slice of an output, into a buffer allocated once.
    pub fn read_at(&self, at: Location, out: &mut [u8]) -> Result<(), SessionError> {
        self.exe().read_at(at, out)?;
        Ok(())
    }

    /// The gradients' global norm of the last step, where the step clips them
    /// ([`ingot_compiler::autodiff::StepOptions::clip_grad_norm`]).
    pub fn last_grad_norm(&self) -> Option<f64> {
        self.graph().outputs.get(GRAD_NORM)?;
        self.exe().read_output(GRAD_NORM).ok()?.scalar_f64()
    }

    /// How many values of the parameters the last step wrote are NaN or infinite (averaged
    /// over data-parallel ranks, as the loss is: nonzero when any rank's are), where the step
    /// counts them ([`ingot_compiler::autodiff::StepOptions::count_nonfinite`]). A few bytes
    /// read as the loss is: nothing allocated.
    pub fn last_nonfinite_count(&self) -> Result<Option<f64>, SessionError> {
        match self.nonfinite {
            Some((at, dtype)) => Ok(Some(self.exe().read_scalar(at, dtype)?)),
            None => Ok(None),
        }
    }

    /// The first parameter holding a NaN or infinite value, as a message naming it, the first
    /// such element's index and value, and how many there are ([`crate::checkpoint::check_finite`]);
    /// `None` when all are finite. Reads every parameter to the host: for after a step whose
    /// count ([`Session::last_nonfinite_count`]) was not 0.
    pub fn first_nonfinite_parameter(&self) -> Option<String> {
        crate::finite::check_finite("parameter", &self.parameters()).err()
    }

    /// Replaces every parameter with the one of the same name in `params`. Every parameter of
    /// the model must be there with its exact shape and dtype, and nothing else may be: a missing
    /// or mistyped parameter is an error naming it, and unknown names are an error listing them.
    /// On error nothing changes. The optimizer state is left as it is.
    pub fn load_parameters(
        &mut self,
        params: &IndexMap<String, Tensor>,
    ) -> Result<(), SessionError> {
        let ids = self.graph().leaves(LeafKind::Parameter);
        let mut known = Vec::with_capacity(ids.len());
        for &id in &ids {
            let name = self.graph().leaf_name(id).expect("leaves have names");
            let expected = &self.exe().leaf_type(id);
            given_leaf(name, expected, params.get(name), |t| {
                t.data.dtype() == expected.dtype && t.data.len() == expected.shape.numel()
            })?;
            known.push(name.to_string());
        }
        let unknown: Vec<String> = params
            .keys()
            .filter(|k| !known.contains(k))
            .cloned()
            .collect();
        if !unknown.is_empty() {
            return Err(SessionError::UnknownParameters {
                names: unknown,
                known,
            });
        }
        for name in known {
            self.exe_mut().write_leaf(&name, &params[&name])?;
        }
        self.write_copies(params)
    }

    /// Replaces the optimizer state (`{param}.exp_avg`, `{param}.exp_avg_sq`, `step` for AdamW)
    /// with `state`, as [`Session::load_parameters`] replaces the parameters: every state leaf
    /// must be there with its exact type, nothing else may be, and on error nothing changes.
    /// With the parameters, this is all a step reads besides its batch: a run resumed from
    /// both continues as the uninterrupted one would.
    pub fn load_optimizer_state(
        &mut self,
        state: &IndexMap<String, Tensor>,
    ) -> Result<(), SessionError> {
        // AdamW's step number as an input: `step` (updates done) sets the session's count.
        let counted = match self.step_number {
            Some(_) => {
                let done =
                    state
                        .get(STEP_COUNTER)
                        .ok_or_else(|| SessionError::MissingParameter {
                            name: STEP_COUNTER.to_string(),
                            expected: TensorType::new(
                                ingot_compiler::ir::Shape::scalar(),
                                DType::F64,
                            ),
                        })?;
                let n = done
                    .scalar_f64()
                    .filter(|n| n.is_finite() && *n >= 0.0 && n.fract() == 0.0)
                    .ok_or_else(|| SessionError::ParameterType {
                        name: STEP_COUNTER.to_string(),
                        expected: TensorType::new(ingot_compiler::ir::Shape::scalar(), DType::F64),
                        got: done.ty.clone(),
                    })?;
                Some(n as u64)
            }
            None => None,
        };
        let mut names = self.leaf_names_of(LeafKind::State);
        for name in &names {
            let id = self.graph().leaf(name).expect("a leaf of the graph");
            let expected = &self.exe().leaf_type(id);
            given_leaf(name, expected, state.get(name), |t| {
                t.data.len() == expected.shape.numel()
            })?;
        }
        let unknown: Vec<String> = state
            .keys()
            .filter(|k| {
                let counted_step = counted.is_some() && *k == STEP_COUNTER;
                !names.contains(k) && !counted_step
            })
            .cloned()
            .collect();
        if !unknown.is_empty() {
            if counted.is_some() {
                names.push(STEP_COUNTER.to_string());
            }
            return Err(SessionError::UnknownParameters {
                names: unknown,
                known: names,
            });
        }
        for name in &names {
            self.exe_mut().write_leaf(name, &state[name])?;
        }
        if let Some(done) = counted {
            self.set_updates_done(done);
        }
        Ok(())
    }

    /// The planned slots of the inputs `x` and `y`, and each one's bytes: what
    /// [`Session::step_on`] takes (a data loader's staging buffers are cut to these sizes).
    pub fn input_slots(&self) -> Result<[(NodeId, usize); 2], SessionError> {
        let slot = |name: &str| {
            let id = self
                .graph()
                .leaf(name)
                .filter(|id| self.graph().leaves(LeafKind::Input).contains(id))
                .ok_or_else(|| SessionError::UnknownInput {
                    name: name.to_string(),
                    known: self.input_names(),
                })?;
            // A data-parallel step in one process takes the union of its ranks' shards; one
            // process of several (`--torchrun`) takes its own shard.
            let bytes = self.exe().plan().location(self.graph(), id).bytes;
            let union = match self.exe().data_shard() {
                Some(_) => 1,
                None => self.exe().data_ranks(),
            };
            Ok::<_, SessionError>((id, bytes * union))
        };
        Ok([slot("x")?, slot("y")?])
    }

    /// Runs one training step on a batch given as the bytes of `x` and `y` (native-endian
    /// elements of each input's dtype, as [`crate::data::BatchSource::fill`] writes them), copied
    /// straight into their planned slots ([`StepExecutor::step_with_inputs`]): nothing is
    /// allocated for the batch. `slots` comes from [`Session::input_slots`]. The caller
    /// vouches for the ids (the data readers check every id against the model's bound).
    pub fn step_on(
        &mut self,
        slots: &[(NodeId, usize); 2],
        x: &[u8],
        y: &[u8],
    ) -> Result<StepResult, SessionError> {
        const {
            assert!(
                cfg!(target_endian = "little"),
                "planned slots hold little-endian values"
            )
        };
        let start = Instant::now();
        let x = x.get(..slots[0].1).unwrap_or(x);
        let y = y.get(..slots[1].1).unwrap_or(y);
        self.run_step(&[(slots[0].0, x), (slots[1].0, y)])?;
        self.finish_step(start)
    }

    /// Runs one step with `batch` written into its slots first, and the learning-rate scale
    /// and step number (where the step has them) beside it: on a GPU all of them are
    /// asynchronous copies queued on the step's stream ahead of the step, with no
    /// synchronisation of their own. Allocates nothing.
    fn run_step(&mut self, batch: &[(NodeId, &[u8])]) -> Result<(), SessionError> {
        let lr = self.lr_scale.map(|(id, f)| (id, f.to_le_bytes()));
        let t = self
            .step_number
            .map(|(id, n)| (id, (n as f64).to_le_bytes()));
        let d = self.dropout_seed.map(|(id, run, n)| {
            (
                id,
                (ingot_kernels::rng::step_seed(run, n) as i64).to_le_bytes(),
            )
        });
        let mut inputs: SmallVec<[(NodeId, &[u8]); 5]> = batch.iter().copied().collect();
        if let Some((id, b)) = &lr {
            inputs.push((*id, b));
        }
        if let Some((id, b)) = &t {
            inputs.push((*id, b));
        }
        if let Some((id, b)) = &d {
            inputs.push((*id, b));
        }
        if inputs.is_empty() {
            self.exe_mut().step()?;
        } else {
            self.exe_mut().step_with_inputs(&inputs)?;
        }
        if let Some((_, n)) = &mut self.step_number {
            *n += 1;
        }
        if let Some((_, _, n)) = &mut self.dropout_seed {
            *n += 1;
        }
        Ok(())
    }

    /// Sets the batch every following step trains on. Integer ids may be i32 or i64 and are
    /// converted to the model's input dtype; ids are checked against the model's range
    /// ([`init::id_bound`]). A shape or dtype mismatch is an error naming the input and both types.
    pub fn set_batch(&mut self, x: &Tensor, y: &Tensor) -> Result<(), SessionError> {
        let x = self.batch_value("x", x)?;
        let y = self.batch_value("y", y)?;
        self.exe_mut().write_leaf("x", &x)?;
        self.exe_mut().write_leaf("y", &y)?;
        Ok(())
    }

    /// Sets the batch from a map holding exactly `x` and `y` (a batch file's contents).
    pub fn set_batch_map(&mut self, batch: &IndexMap<String, Tensor>) -> Result<(), SessionError> {
        let inputs = self.input_names();
        if let Some(name) = batch.keys().find(|k| !inputs.contains(k)) {
            return Err(SessionError::UnknownInput {
                name: name.clone(),
                known: inputs,
            });
        }
        let get = |name: &str| {
            batch.get(name).ok_or_else(|| SessionError::MissingInput {
                name: name.to_string(),
                given: batch.keys().cloned().collect(),
            })
        };
        self.set_batch(get("x")?, get("y")?)
    }

    fn input_names(&self) -> Vec<String> {
        self.graph()
            .leaves(LeafKind::Input)
            .into_iter()
            .filter_map(|id| self.graph().leaf_name(id).map(str::to_string))
            .collect()
    }

    /// `t` as the value of input `name`: checked, with integer ids converted to the input's dtype.
    fn batch_value(&self, name: &str, t: &Tensor) -> Result<Tensor, SessionError> {
        let id = self
            .graph()
            .leaf(name)
            .filter(|&id| {
                matches!(
                    self.graph().node(id).op,
                    ingot_compiler::ir::Op::Leaf {
                        kind: LeafKind::Input,
                        ..
                    }
                )
            })
            .ok_or_else(|| SessionError::UnknownInput {
                name: name.to_string(),
                known: self.input_names(),
            })?;
        let expected = self.graph().ty(id).clone();
        let mismatch = || SessionError::BatchType {
            name: name.to_string(),
            expected: expected.clone(),
            got: t.ty.clone(),
        };
        if t.ty.shape != expected.shape
            || t.data.len() != expected.shape.numel()
            || t.data.dtype() != t.ty.dtype
        {
            return Err(mismatch());
        }
        if expected.dtype.is_float() {
            return if t.ty.dtype == expected.dtype {
                Ok(t.clone())
            } else {
                Err(mismatch())
            };
        }
        let ids: Vec<i64> = match &t.data {
            Data::I32(v) => v.iter().map(|&i| i as i64).collect(),
            Data::I64(v) => v.clone(),
            _ => {
                return Err(SessionError::IdDtype {
                    name: name.to_string(),
                    expected: expected.dtype,
                    got: t.ty.dtype,
                })
            }
        };
        if let Some(bound) = init::id_bound(self.graph(), name) {
            if let Some(position) = ids.iter().position(|&i| i < 0 || i as u64 >= bound as u64) {
                let what = if name == "x" {
                    "embedding rows"
                } else {
                    "output classes"
                };
                return Err(SessionError::IdOutOfRange {
                    name: name.to_string(),
                    id: ids[position],
                    position,
                    bound,
                    what,
                });
            }
        }
        let data = match expected.dtype {
            DType::I32 => Data::I32(ids.iter().map(|&i| i as i32).collect()),
            _ => Data::I64(ids),
        };
        Ok(Tensor { ty: expected, data })
    }

    /// Runs one training step on the current batch: computes the loss, then updates the
    /// parameters and optimizer state in place. Returns the loss before the update.
    pub fn step(&mut self) -> Result<StepResult, SessionError> {
        let start = Instant::now();
        self.run_step(&[])?;
        self.finish_step(start)
    }

    /// Reads the loss of the step just run, which began at `start`: a few bytes copied onto
    /// the stack from the loss's planned slot, nothing allocated.
    fn finish_step(&mut self, start: Instant) -> Result<StepResult, SessionError> {
        let (at, dtype) = self.loss.ok_or_else(|| ExecError::Invalid {
            op: "step",
            reason: format!("the step graph has no scalar output {LOSS:?}"),
        })?;
        let loss = self.exe().read_scalar(at, dtype)?;
        let wall = start.elapsed().as_secs_f64();
        self.steps += 1;
        Ok(StepResult {
            loss,
            seconds: self.exe().last_step_device_seconds().unwrap_or(wall),
            wall_seconds: wall,
        })
    }
}

/// Checks `found`, the tensor given for the leaf `name` of type `expected`: missing, or of
/// another type or with data that does not `fit`, is the error that says so.
fn given_leaf(
    name: &str,
    expected: &TensorType,
    found: Option<&Tensor>,
    fits: impl Fn(&Tensor) -> bool,
) -> Result<(), SessionError> {
    let Some(t) = found else {
        return Err(SessionError::MissingParameter {
            name: name.to_string(),
            expected: expected.clone(),
        });
    };
    if t.ty != *expected || !fits(t) {
        return Err(SessionError::ParameterType {
            name: name.to_string(),
            expected: expected.clone(),
            got: t.ty.clone(),
        });
    }
    Ok(())
}
