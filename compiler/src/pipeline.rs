//! The pipeline in one call: model -> training step -> rewrite -> fuse -> schedule and memory
//! plan -> report, then [`Compiled::executable`] lowers the step for a target. Each stage can
//! be switched off, so every figure can be taken before and after.

use crate::autodiff::{phase, training_step_with, Step, StepOptions, LOSS};
use crate::error::IrError;
use crate::exe::Executable;
use crate::fuse::{self, FuseOptions, FuseReport};
use crate::ir::Graph;
use crate::lower::{LowerError, Target};
use crate::model::Model;
use crate::plan::{self, MemoryPlan, PlanError, PlanOptions};
use crate::precision::Precision;
use crate::recognize;
use crate::report::Report;
use crate::rewrite::{self, RewriteOptions, RewriteReport};
use std::time::{Duration, Instant};

/// A stage of the pipeline, as reported to a stage observer and in [`Compiled::timings`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Stage {
    /// Attention written as plain math replaced by fused attention ops ([`crate::recognize`]).
    Recognize,
    /// The backward pass and the optimizer update appended to the forward graph.
    Autodiff,
    /// egg's rewriting and the extraction of the simplified graph.
    Rewrite,
    /// Grouping ops into fused kernels.
    Fuse,
    /// Scheduling, liveness, offset assignment and validation of the memory plan.
    Plan,
    /// The memory report (phases, peak, per-buffer rows).
    Report,
}

impl Stage {
    /// The stage's name, as shown by the CLI's spinner and `--timings`.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Recognize => "recognize",
            Stage::Autodiff => "autodiff",
            Stage::Rewrite => "rewrite",
            Stage::Fuse => "fuse",
            Stage::Plan => "plan",
            Stage::Report => "report",
        }
    }
}

/// How long each stage that ran took, in pipeline order.
pub type Timings = Vec<(Stage, Duration)>;

/// Runs `f` as stage `stage`: tells the observer it starts, then records its duration.
fn stage<T>(
    stage: Stage,
    observer: &mut dyn FnMut(Stage),
    timings: &mut Timings,
    f: impl FnOnce() -> T,
) -> T {
    observer(stage);
    let start = Instant::now();
    let out = f();
    timings.push((stage, start.elapsed()));
    out
}

/// Knobs of the whole pipeline.
#[derive(Clone, Debug)]
pub struct Options {
    /// Simplify with egg before fusing; `None` skips it.
    pub rewrite: Option<RewriteOptions>,
    /// Fuse into kernels; `None` plans the primitive ops as they are.
    pub fuse: Option<FuseOptions>,
    pub plan: PlanOptions,
    /// The arithmetic of the step: bf16 applies [`crate::precision::autocast_bf16`] to the
    /// forward graph before autodiff. `None`: the model's own ([`Model::precision`]), which is
    /// f32 unless the model (a file's `precision` line) says otherwise.
    pub precision: Option<Precision>,
    /// Replace attention written as plain math by fused attention ops
    /// ([`crate::recognize::attention`]), before the precision policy and autodiff.
    pub fuse_attention: bool,
    /// The attention shapes the target has a fused kernel for; the others stay plain math.
    pub attention_supported: crate::recognize::Supported,
    /// Pad matrix products whose output rows are not a multiple of this many elements
    /// ([`crate::align`]), after the precision policy and before autodiff; `None` leaves them.
    pub align_matmuls: Option<usize>,
    /// Store the convolutions' tensors channels-last, with the transposes this needs
    /// ([`crate::layout::channels_last`]), after the rewrite and before fusion: never,
    /// always, or where the graph's rule says it pays ([`crate::layout::ChannelsLast`]). Off
    /// unless asked for: the CUDA runtime runs channels-last convolutions only through cuDNN,
    /// so the trainer asks for it on CUDA where cuDNN runs the convolutions.
    pub channels_last: crate::layout::ChannelsLast,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            rewrite: Some(RewriteOptions::default()),
            fuse: Some(FuseOptions::default()),
            plan: PlanOptions::default(),
            precision: None,
            fuse_attention: true,
            attention_supported: crate::recognize::any_shape,
            align_matmuls: None,
            channels_last: crate::layout::ChannelsLast::No,
        }
    }
}

impl Options {
    /// Rewriting and fusion on, and `target`'s workspaces planned (the CPU matmul's packing
    /// space, cuBLAS's workspace): what a step that runs on `target` is compiled with.
    pub fn for_target(target: Target) -> Options {
        Options {
            plan: target.plan_options(),
            // Each attention whose shape the target's kernels cover is fused.
            attention_supported: target.attention_supported(),
            align_matmuls: target.matmul_alignment(),
            ..Default::default()
        }
    }

    /// The primitive ops planned as traced: no attention recognition, no rewriting, no fusion
    /// (the "before" figures, and the reference the optimized step is checked against).
    pub fn unoptimized(plan: PlanOptions) -> Options {
        Options {
            rewrite: None,
            fuse: None,
            plan,
            precision: None,
            fuse_attention: false,
            attention_supported: crate::recognize::any_shape,
            align_matmuls: None,
            channels_last: crate::layout::ChannelsLast::No,
        }
    }
}

/// A compiled training step: the graph that runs, its memory plan and the report about it.
#[derive(Clone, Debug)]
pub struct Compiled {
    pub model: String,
    /// The step as traced and differentiated.
    pub step: Step,
    /// The graph that is planned and run: `step.graph` rewritten and fused.
    pub graph: Graph,
    pub plan: MemoryPlan,
    pub report: Report,
    pub rewrite: Option<RewriteReport>,
    pub fuse: Option<FuseReport>,
    /// How long each stage took (for `ingot plan --timings` and the compile-time benchmark).
    pub timings: Timings,
}

impl Compiled {
    /// The executable of this step lowered for `target` (which its plan must have been made
    /// for, [`Options::for_target`]): the plan validated, every device operation and kernel
    /// decided ([`crate::lower`]).
    pub fn executable(&self, target: Target) -> Result<Executable, LowerError> {
        Executable::new(
            &self.model,
            self.graph.clone(),
            self.plan.clone(),
            self.report.clone(),
            target,
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error(transparent)]
    Ir(#[from] IrError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Lower(#[from] LowerError),
}

/// Compiles a model's training step and plans its memory.
pub fn compile(model: &Model, opts: &Options) -> Result<Compiled, CompileError> {
    compile_observed(model, opts, &mut |_| {})
}

/// As [`compile`], calling `observer` as each stage starts (the CLI's spinner shows it).
pub fn compile_observed(
    model: &Model,
    opts: &Options,
    observer: &mut dyn FnMut(Stage),
) -> Result<Compiled, CompileError> {
    compile_observed_with(model, &StepOptions::default(), opts, observer)
}

/// As [`compile_observed`], the step built with `step` (a learning-rate input, gradient
/// clipping: [`crate::autodiff::training_step_with`]).
pub fn compile_observed_with(
    model: &Model,
    step: &StepOptions,
    opts: &Options,
    observer: &mut dyn FnMut(Stage),
) -> Result<Compiled, CompileError> {
    let r = rewritten_observed(model, step, opts, observer)?;
    finish_observed(r, &[], observer)
}

/// Rewrites, fuses and plans a training step.
pub fn compile_step(name: &str, step: Step, opts: &Options) -> Result<Compiled, CompileError> {
    compile_step_observed(name, step, opts, &mut |_| {}, Timings::new())
}

/// A training step rewritten and not yet fused: what the budget fitter (`compiler::fit`) compiles
/// again and again, each time recomputing other values, without tracing and rewriting anew.
#[derive(Clone, Debug)]
pub struct Rewritten {
    pub model: String,
    pub step: Step,
    /// `step.graph` rewritten (or as built, without rewriting).
    pub graph: Graph,
    pub rewrite: Option<RewriteReport>,
    /// The options the step is compiled with, its precision decided.
    pub options: Options,
    pub timings: Timings,
}

/// Traces, differentiates and rewrites `model`'s step (the pipeline up to fusion).
pub fn rewritten(
    model: &Model,
    step: &StepOptions,
    opts: &Options,
) -> Result<Rewritten, CompileError> {
    rewritten_observed(model, step, opts, &mut |_| {})
}

fn rewritten_observed(
    model: &Model,
    step: &StepOptions,
    opts: &Options,
    observer: &mut dyn FnMut(Stage),
) -> Result<Rewritten, CompileError> {
    let mut timings = Timings::new();
    let precision = opts.precision.unwrap_or(model.precision);
    let forward = if opts.fuse_attention {
        stage(Stage::Recognize, observer, &mut timings, || {
            recognize::attention_where(&model.graph, opts.attention_supported)
        })?
        .0
    } else {
        model.graph.clone()
    };
    let step = stage(Stage::Autodiff, observer, &mut timings, || {
        let mut forward = precision.apply(&forward)?;
        if let Some(align) = opts.align_matmuls {
            forward = crate::align::pad_matmuls(&forward, align)?.0;
        }
        training_step_with(&forward, &model.optimizer, step)
    })?;
    let opts = Options {
        precision: Some(precision),
        ..opts.clone()
    };
    rewrite_step(&model.name, step, &opts, observer, timings)
}

fn rewrite_step(
    name: &str,
    step: Step,
    opts: &Options,
    observer: &mut dyn FnMut(Stage),
    mut timings: Timings,
) -> Result<Rewritten, CompileError> {
    let (graph, rewrite) = match &opts.rewrite {
        Some(o) => {
            let (g, r) = stage(Stage::Rewrite, observer, &mut timings, || {
                rewrite::simplify(&step.graph, o)
            })?;
            (g, Some(r))
        }
        None => (step.graph.clone(), None),
    };
    // The padded products' gradients computed straight into their padded width.
    let graph = match opts.align_matmuls {
        Some(_) => crate::align::widen_padded_concats(&graph)?.0,
        None => graph,
    };
    let graph = match opts.channels_last.applies_to(&graph) {
        true => crate::layout::channels_last(&graph)?.0,
        false => graph,
    };
    Ok(Rewritten {
        model: name.to_string(),
        step,
        graph,
        rewrite,
        options: opts.clone(),
        timings,
    })
}

fn compile_step_observed(
    name: &str,
    step: Step,
    opts: &Options,
    observer: &mut dyn FnMut(Stage),
    timings: Timings,
) -> Result<Compiled, CompileError> {
    let r = rewrite_step(name, step, opts, observer, timings)?;
    finish_observed(r, &[], observer)
}

/// Fuses and plans a rewritten step, recomputing the library calls `heavy` for the backward
/// pass besides the cheap values (ids of [`fuse::prepared`]`(&r.graph)`, see
/// [`fuse::remat::candidates`]; none for the step as [`compile`] makes it).
pub fn finish(r: &Rewritten, heavy: &[crate::ir::NodeId]) -> Result<Compiled, CompileError> {
    finish_observed(r.clone(), heavy, &mut |_| {})
}

fn finish_observed(
    r: Rewritten,
    heavy: &[crate::ir::NodeId],
    observer: &mut dyn FnMut(Stage),
) -> Result<Compiled, CompileError> {
    let Rewritten {
        model: name,
        step,
        graph,
        rewrite,
        options: opts,
        mut timings,
    } = r;
    let t = &mut timings;
    let (graph, fuse) = match &opts.fuse {
        Some(o) => {
            let f = stage(Stage::Fuse, observer, t, || {
                fuse::fuse_recomputing(&graph, o, heavy)
            })?;
            // The unfused graph is not read again: freed before the plan, whose tables then
            // reuse its memory instead of touching new pages (issue 53).
            drop(graph);
            (f.graph, Some(f.report))
        }
        None if !heavy.is_empty() => {
            return Err(IrError::Invalid(
                "recomputing library calls for the backward pass needs fusion on".into(),
            )
            .into())
        }
        None => (graph, None),
    };
    // A step that recomputes forward values for the backward pass sinks its schedule: the
    // copies free memory only when they run right before their readers.
    let recomputes = fuse
        .as_ref()
        .is_some_and(|f| !f.recomputed_heavy.is_empty());
    let plan_opts = PlanOptions {
        sink: opts.plan.sink || recomputes,
        ..opts.plan.clone()
    };
    let plan = stage(Stage::Plan, observer, t, || plan::plan(&graph, &plan_opts))?;
    let report = stage(Stage::Report, observer, t, || {
        let phases = if opts.rewrite.is_none() && opts.fuse.is_none() {
            step.phases.of_nodes(graph.len())
        } else {
            phase::of_graph(&graph, graph.outputs.get(LOSS).copied())
        };
        let mut report = Report::new(&name, &graph, &plan, Some(&phases));
        // A step built outside (`compile_step`) is labelled with the precision it was built in.
        report.precision = opts.precision.unwrap_or_default();
        report
    });
    Ok(Compiled {
        model: name,
        step,
        graph,
        plan,
        report,
        rewrite,
        fuse,
        timings,
    })
}
