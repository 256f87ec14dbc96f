//! Validation: the model's forward pass, traced in evaluation mode ([`Model::eval_graph`]: batch
//! norm by its running statistics, dropout the identity), compiled on its own (the loss of a
//! batch, no backward pass, no update), planned into the training step's allocation ([`StepPair`]): it reads the
//! parameters the training step just wrote, in place, and its transient values overlap the
//! training step's, because the two never run at the same time. The session allocates once
//! ([`Session::from_pair`]); an evaluation copies nothing but its batch.
//!
//! A classifier's evaluation step also counts its top-1 and top-5 hits in the step
//! ([`ingot_compiler::trace::accuracy`] says why there rather than from logits read back):
//! [`Evaluator::evaluate_all`] reports them as accuracies beside the loss.

use crate::data::{BatchSource, Order};
use crate::session::{Device, Session, TopK};
use ingot_compiler::autodiff::Step;
use ingot_compiler::exe::{Executable, StepPair};
use ingot_compiler::model::Model;
use ingot_compiler::pipeline;
use ingot_compiler::plan::shared::SharedLayout;
use std::path::Path;

/// The batches of a validation set that each evaluation runs, and the buffers they are read
/// into (allocated once).
pub struct Evaluator {
    source: Box<dyn BatchSource>,
    x: Vec<u8>,
    y: Vec<u8>,
    batches: u64,
}

/// The forward pass of `graph` (a model's forward graph, in the precision it is compiled in)
/// alone, as a step with no backward pass and no update.
pub fn forward_step(graph: &ingot_compiler::ir::Graph) -> Step {
    Step::forward_only(graph.without_dead_code().0)
}

/// Compiles `model`'s forward-only step with `opts` (the training step's options: its
/// precision and target) and pairs it with the training step `train` in one allocation.
pub fn pair_with_eval(
    model: &Model,
    train: Executable,
    opts: &pipeline::Options,
) -> Result<StepPair, String> {
    let name = format!("{} (eval)", model.name);
    // The training executable's precision (the options' or the model's own): one run, one
    // arithmetic.
    let precision = train.precision();
    // The forward pass traced in evaluation mode (batch norm by its running statistics,
    // dropout the identity), attention fused as it is in the training step.
    // A classifier's step counts its top-1 and top-5 hits beside the loss.
    let counted = ingot_compiler::trace::accuracy::with_top_k_counts(model.eval_graph())
        .map_err(|e| format!("the forward-only step of {}: {e}", model.name))?;
    let eval_graph = counted.as_ref().unwrap_or(model.eval_graph());
    let graph = if opts.fuse_attention {
        ingot_compiler::recognize::attention_where(eval_graph, opts.attention_supported)
            .map_err(|e| format!("the forward-only step of {}: {e}", model.name))?
            .0
    } else {
        eval_graph.clone()
    };
    // Where the training step keeps bf16 copies of its weights, the evaluation reads them
    // rather than casting the f32 weights again (the same bits; and each rank of a sharded
    // optimizer holds only its rows of those).
    let forward = precision
        .apply(&graph)
        .and_then(|f| ingot_compiler::autodiff::copies::read_weight_copies(f, train.graph()))
        .map_err(|e| format!("the forward-only step of {}: {e}", model.name))?;
    let opts = pipeline::Options {
        precision: Some(precision),
        ..opts.clone()
    };
    let c = pipeline::compile_step(&name, forward_step(&forward), &opts)
        .map_err(|e| format!("compiling the forward-only step of {}: {e}", model.name))?;
    StepPair::new(train, &name, c.graph, &c.plan)
        .map_err(|e| format!("pairing the forward-only step of {}: {e}", model.name))
}

/// A session of `model` on `device` that trains with `train` and evaluates with the model's
/// forward pass, in one allocation ([`pair_with_eval`], [`Session::from_pair`]).
pub fn session_with_eval(
    model: &Model,
    train: Executable,
    opts: &pipeline::Options,
    seed: u64,
    device: Device,
) -> Result<Session, String> {
    let pair = pair_with_eval(model, train, opts)?;
    Session::from_pair(pair, seed, device).map_err(|e| e.to_string())
}

/// How `compiled` (a model's training step) and the model's forward-only step divide one
/// allocation on `target` ([`pair_with_eval`]), for `ingot plan --eval`.
pub fn shared_layout(
    model: &Model,
    compiled: &pipeline::Compiled,
    opts: &pipeline::Options,
    target: ingot_compiler::exe::Target,
) -> Result<SharedLayout, String> {
    let train = compiled
        .executable(target)
        .map_err(|e| format!("lowering for {target}: {e}"))?;
    Ok(pair_with_eval(model, train, opts)?.layout())
}

/// One line on how the one allocation divides between the training and evaluation steps.
pub fn layout_line(l: &SharedLayout) -> String {
    let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
    format!(
        "with the evaluation step: {:.1} MiB in one allocation = {:.1} MiB resident (parameters shared: {:.1} MiB) + max({:.1} MiB training slab, {:.1} MiB evaluation slab) + {:.1} MiB evaluation inputs; two allocations would take {:.1} MiB",
        mib(l.total_bytes),
        mib(l.slab_base),
        mib(l.shared_parameter_bytes),
        mib(l.train_slab_bytes),
        mib(l.eval_slab_bytes),
        mib(l.eval_only_bytes),
        mib(l.separate_bytes())
    )
}

impl Evaluator {
    /// Opens `val` (a data set of the same kind as the training one, read in order) for the
    /// evaluation step `session` holds ([`session_with_eval`]). Each evaluation runs the first
    /// `batches` batches (fewer if the set holds fewer).
    pub fn new(
        session: &Session,
        val: &Path,
        batches: u64,
        seed: u64,
    ) -> Result<Evaluator, String> {
        Evaluator::new_as(
            session,
            val,
            batches,
            seed,
            crate::datasets::DatasetFormat::Auto,
        )
    }

    /// As [`Evaluator::new`], `val` read as `format` (`--dataset-format`).
    pub fn new_as(
        session: &Session,
        val: &Path,
        batches: u64,
        seed: u64,
        format: crate::datasets::DatasetFormat,
    ) -> Result<Evaluator, String> {
        let slots = session
            .eval_input_slots()
            .ok_or("the session was loaded without an evaluation step")?;
        // Cut to the evaluation step's batch (a step of accumulated micro-batches trains on
        // several of them at once but evaluates one).
        let graph = session
            .exe()
            .eval_executable()
            .map_or(session.graph(), |e| e.graph());
        // Each data-parallel rank evaluates its own shard of every batch, as it trains on one.
        let mut source =
            crate::datasets::open_dataset_as(val, graph, Order::Sequential, seed, format)
                .and_then(|s| crate::data::shard::rank_batches(s, session.exe()))
                .map_err(|e| format!("--val: {e}"))?;
        source.check_all().map_err(|e| format!("--val: {e}"))?;
        let batches = batches.min(source.batches_per_epoch());
        Ok(Evaluator {
            x: vec![0; slots[0].1],
            y: vec![0; slots[1].1],
            source,
            batches,
        })
    }

    /// Batches each evaluation runs.
    pub fn batches(&self) -> u64 {
        self.batches
    }

    /// The mean loss of `session`'s current parameters over the validation batches (the same
    /// batches every time, so evaluations compare), run by its evaluation step in the training
    /// step's allocation.
    pub fn evaluate(&mut self, session: &mut Session) -> Result<f64, String> {
        Ok(self.evaluate_all(session)?.loss)
    }

    /// As [`Evaluator::evaluate`], with a classifier's top-1 and top-5 accuracy over the same
    /// batches (the fraction of their rows whose label is the top class, or among the top
    /// five).
    pub fn evaluate_all(&mut self, session: &mut Session) -> Result<Evaluation, String> {
        let mut sum = 0.0;
        let mut hits: Option<TopK> = None;
        for b in 0..self.batches {
            self.source
                .fill(0, b, &mut self.x, &mut self.y)
                .map_err(|e| format!("--val: {e}"))?;
            let out = session
                .eval_batch_on(&self.x, &self.y)
                .map_err(|e| format!("evaluating: {e}"))?;
            sum += out.loss;
            if let Some(k) = out.top_k {
                let h = hits.get_or_insert_with(TopK::default);
                h.top1 += k.top1;
                h.top5 += k.top5;
                h.rows += k.rows;
            }
        }
        let accuracy = hits
            .filter(|h| h.rows > 0.0)
            .map(|h| (h.top1 / h.rows, h.top5 / h.rows));
        Ok(Evaluation {
            loss: sum / self.batches.max(1) as f64,
            top1: accuracy.map(|a| a.0),
            top5: accuracy.map(|a| a.1),
        })
    }
}

/// One evaluation's results ([`Evaluator::evaluate_all`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Evaluation {
    /// The mean loss over the batches.
    pub loss: f64,
    /// A classifier's top-1 and top-5 accuracy (fractions in 0..=1); `None` for other models.
    pub top1: Option<f64>,
    pub top5: Option<f64>,
}
