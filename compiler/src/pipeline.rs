//! The pipeline in one call: model -> training step -> schedule and memory plan -> report.

use crate::autodiff::{training_step, Step};
use crate::error::IrError;
use crate::models::{self, Model};
use crate::plan::report::Report;
use crate::plan::{self, MemoryPlan, PlanError, PlanOptions};

/// Knobs of the whole pipeline.
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub plan: PlanOptions,
}

/// A compiled training step: its graph, its memory plan and the report about that plan.
#[derive(Clone, Debug)]
pub struct Compiled {
    pub model: String,
    pub step: Step,
    pub plan: MemoryPlan,
    pub report: Report,
}

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error(transparent)]
    Ir(#[from] IrError),
    #[error(transparent)]
    Plan(#[from] PlanError),
}

/// Compiles a model given by name (`mlp`, `gpt-mini`, `gpt2`, `gpt:KEY=VALUE,...`).
pub fn compile_model(spec: &str, opts: &Options) -> Result<Compiled, CompileError> {
    let model = models::by_name(spec)?;
    compile(&model, opts)
}

/// Compiles a model's training step and plans its memory.
pub fn compile(model: &Model, opts: &Options) -> Result<Compiled, CompileError> {
    let step = training_step(&model.graph, &model.optimizer)?;
    let plan = plan::plan(&step.graph, &opts.plan)?;
    let report = Report::new(&model.name, &step.graph, &plan, Some(&step.phases));
    Ok(Compiled {
        model: model.name.clone(),
        step,
        plan,
        report,
    })
}
