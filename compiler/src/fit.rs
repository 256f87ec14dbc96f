//! Fitting a training step to a memory budget, in the order that costs least:
//!
//! 1. the memory-aware schedule and fusion's cheap recomputation (every compile does both);
//!    then, over the budget, the weights cast to bf16 in each step instead of kept as bf16
//!    copies ([`crate::autodiff::copies`]: two resident bytes a weight for one cast each), and
//!    the loss head in row chunks;
//! 2. recomputing for the backward pass ([`recompute_to_budget`]): matmul, attention and
//!    convolution outputs the backward pass reads, and whole segments between the cuts of the
//!    forward pass ([`crate::fuse::segment`]: a transformer block or half of one, a ResNet
//!    block, with their LayerNorm, batch-norm, ReLU and elementwise outputs), cheapest per byte
//!    first;
//! 3. gradient accumulation: the batch in k = 2, 3, 4, ... micro-batches (divisors of the
//!    batch), each k tried alone first, then with recomputation;
//! 4. when nothing above fits: offload ([`offload`]), AdamW's moments kept in host memory and
//!    copied to the device around their update, the fewest (largest first) that fit, with
//!    recomputation as the budget then needs.
//!
//! The rule when both could fit: recomputation is accepted at a given k when the arithmetic it
//! adds is at most [`MAX_ADDED_FLOPS_PERCENT`] of the step's (about what PyTorch's
//! per-block checkpointing adds: one more forward pass, a third of forward plus backward);
//! otherwise more micro-batches are tried first, since each micro-batch costs launches and
//! smaller GEMMs but no arithmetic. So the answer is the fewest micro-batches k whose plan
//! fits without recomputation or with recomputation within that limit (without it preferred
//! at the same k), and failing that the fewest k whose plan fits with any recomputation.
//!
//! Whatever is chosen, the plan is the planner's own and under the budget to the byte: every
//! figure here comes from compiling the step ([`crate::pipeline::finish`]), not from an
//! estimate.

use crate::autodiff::StepOptions;
use crate::ir::NodeId;
use crate::model::Model;
use crate::pipeline::{self, CompileError, Compiled, Options, Rewritten};
use crate::report::human;
use serde::Serialize;

pub mod offload;
pub mod recompute;

pub use recompute::{
    ordered_candidates, ordered_choices, recompute, recompute_choices, recompute_to_budget, Choice,
    Recomputation, Recompute, Recomputed, RecomputedSegment, Segmenting, SEGMENTINGS,
};

/// The most arithmetic recomputation may add, in percent of the step's, before more
/// micro-batches are preferred (see the module docs).
pub const MAX_ADDED_FLOPS_PERCENT: f64 = 33.0;

/// The smallest loss-head chunk the fitter tries (halving from
/// [`crate::autodiff::chunk::HEAD_CHUNK_BYTES`]): gpt2's head in 16 chunks of 512 rows.
pub const MIN_HEAD_CHUNK_BYTES: usize = 64 << 20;

/// What fitting a step to a budget did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Fitted {
    pub budget_bytes: usize,
    /// The plan's total as the model was asked for.
    pub unfitted_bytes: usize,
    /// Micro-batches accumulated (1: none), and the samples in each (when the model has a
    /// batch input `x`).
    pub accumulate: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub micro_batch: Option<usize>,
    /// The weights cast to bf16 in every forward pass instead of kept as bf16 copies
    /// ([`crate::autodiff::copies`]): two bytes a weight less, resident.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub weights_cast_each_step: bool,
    /// The loss head computed in row chunks ([`crate::autodiff::chunk`]).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub chunked_loss_head: bool,
    /// With the loss head in chunks: the most bytes a chunk's largest value may take (the
    /// fitter halves [`crate::autodiff::chunk::HEAD_CHUNK_BYTES`] before it accumulates).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_head_chunk_bytes: Option<usize>,
    /// Library calls recomputed for the backward pass, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recompute: Option<Recompute>,
    /// AdamW's moments kept in host memory, if the budget needed it (the last resort).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offload: Option<offload::Offloaded>,
    /// The fitted plan's total (its peak: the one allocation).
    pub total_bytes: usize,
}

impl Fitted {
    /// One line for the report.
    pub fn line(&self) -> String {
        let mut what = Vec::new();
        if self.weights_cast_each_step {
            what.push("the weights cast to bf16 in each step (no bf16 copies)".to_string());
        }
        match self.loss_head_chunk_bytes {
            Some(b) if self.chunked_loss_head && b < crate::autodiff::chunk::HEAD_CHUNK_BYTES => {
                what.push(format!(
                    "the loss head in row chunks of at most {}",
                    human(b)
                ))
            }
            _ if self.chunked_loss_head => what.push("the loss head in row chunks".to_string()),
            _ => {}
        }
        if self.accumulate > 1 {
            what.push(format!(
                "{} micro-batches{} accumulated per step (one update)",
                self.accumulate,
                self.micro_batch
                    .map(|m| format!(" of {m}"))
                    .unwrap_or_default()
            ));
        }
        if let Some(r) = &self.recompute {
            what.push(format!("recomputing {}", r.summary()));
        }
        if let Some(o) = &self.offload {
            what.push(o.line());
        }
        let mut line = format!(
            "fitted to the budget of {}: {}, {} ({} bytes) instead of {} ({} bytes)",
            human(self.budget_bytes),
            what.join("; "),
            human(self.total_bytes),
            self.total_bytes,
            human(self.unfitted_bytes),
            self.unfitted_bytes
        );
        // One line more for each segment recomputed whole.
        for seg in self.recompute.iter().flat_map(|r| &r.segments) {
            line.push_str("\n  ");
            line.push_str(&seg.line());
        }
        line
    }
}

/// What the fitter may change.
#[derive(Clone, Copy, Debug)]
pub struct FitOptions {
    pub budget: usize,
    /// Recompute library calls for the backward pass (step 2).
    pub recompute: bool,
    /// Accumulate gradients over more micro-batches (step 3; needs a way to build a
    /// micro-batch's model, see [`fit`]).
    pub accumulate: bool,
    /// The fewest samples a micro-batch may hold: the model's smallest batch
    /// (the zoo's `ingot_models::min_batch`; 2 for a ResNet whose `layer4` batch norms would
    /// otherwise see one value per channel). Smaller micro-batches are not tried.
    pub min_micro_batch: usize,
    /// Keep AdamW's moments in host memory when nothing else fits (step 4, [`offload`]):
    /// `ingot plan --budget` and the other free fits; off where the budget is a gate
    /// (`--accumulate` given) or a probe (`--max-batch`).
    pub offload: bool,
}

/// Why a step could not be fitted.
#[derive(Debug, thiserror::Error)]
pub enum FitError {
    #[error(transparent)]
    Compile(#[from] CompileError),
    /// The parameters, optimizer state and inputs alone are over the budget: nothing the
    /// fitter does moves them.
    #[error("the resident state of {model} (parameters, optimizer state, inputs) needs {} ({resident} bytes), over the budget of {} ({budget} bytes){}: no recomputation or accumulation lowers it; raise --budget or shrink the model", human(*resident), human(*budget), offloaded_too(*resident, *offloadable))]
    Resident {
        model: String,
        resident: usize,
        /// The bytes of it offload could move to host memory (AdamW's moments; 0 when
        /// offload is off or there are none).
        offloadable: usize,
        budget: usize,
    },
    /// Nothing tried fits; `smallest` is the smallest plan found.
    #[error("{model}: no plan fits {} ({budget} bytes); the smallest found needs {} ({} bytes) ({tried})", human(*budget), human(smallest.report.total_bytes), smallest.report.total_bytes)]
    Over {
        model: String,
        budget: usize,
        smallest: Box<Compiled>,
        /// What was tried.
        tried: String,
    },
    /// Building a micro-batch's model failed.
    #[error("{0}")]
    Model(String),
}

/// What [`FitError::Resident`] adds when offload could move some of the resident bytes.
fn offloaded_too(resident: usize, offloadable: usize) -> String {
    match offloadable {
        0 => String::new(),
        b => format!(
            ", and {} ({} bytes) with every AdamW moment ({}) offloaded to host memory",
            human(resident - b),
            resident - b,
            human(b)
        ),
    }
}

/// The smallest plan of `r` recomputing everything one way offers (library calls alone, or
/// with the segments of one of [`SEGMENTINGS`]), if smaller than `floor`.
fn most_recomputed(r: &Rewritten, floor: &Compiled) -> Result<Option<Compiled>, CompileError> {
    let mut smallest: Option<Compiled> = None;
    let ways = std::iter::once(None).chain(SEGMENTINGS.iter().map(|&w| Some(w)));
    for way in ways {
        let cands = ordered_choices(r, way)?;
        if cands.is_empty() {
            continue;
        }
        let mut ids: Vec<NodeId> = Vec::new();
        for ch in &cands {
            match ch {
                Choice::Value(c) => ids.push(c.node),
                Choice::Segment(s) => ids.extend(s.nodes.iter().copied()),
            }
        }
        ids.sort();
        ids.dedup();
        let all = pipeline::finish(r, &ids)?;
        let least = smallest
            .as_ref()
            .map_or(floor.report.total_bytes, |s| s.report.total_bytes);
        if all.report.total_bytes < least {
            smallest = Some(all);
        }
    }
    Ok(smallest)
}

/// `model`'s step with `variant`'s options, compiled, when its plan is smaller than `base`'s.
fn smaller(
    model: &Model,
    variant: &StepOptions,
    opts: &Options,
    base: &Compiled,
) -> Result<Option<(Rewritten, Compiled)>, FitError> {
    let r = pipeline::rewritten(model, variant, opts)?;
    let c = pipeline::finish(&r, &[])?;
    Ok((c.report.total_bytes < base.report.total_bytes).then_some((r, c)))
}

/// The most accumulating `k` micro-batches can do: one micro-batch's model (`build(k)`)
/// accumulated `k` times, with everything one way of [`recompute_to_budget`] offers
/// recomputed when `recompute` (the smallest such plan, or none recomputed when that is
/// smaller). Returns that plan when it is over `budget`: then no
/// number of micro-batches up to `k` fits either (a micro-batch's plan only grows with its
/// size), and the fitter refuses the budget in the time of a few compiles instead of
/// planning every number of micro-batches.
fn floor_over(
    build: &dyn Fn(usize) -> Result<Model, String>,
    step: &StepOptions,
    k: usize,
    opts: &Options,
    recompute: bool,
    budget: usize,
) -> Result<Option<Compiled>, FitError> {
    let micro = build(k).map_err(FitError::Model)?;
    let step_k = StepOptions {
        accumulate: k,
        ..*step
    };
    let r = pipeline::rewritten(&micro, &step_k, opts)?;
    let mut floor = pipeline::finish(&r, &[])?;
    if recompute {
        if let Some(all) = most_recomputed(&r, &floor)? {
            floor = all;
        }
    }
    Ok((floor.report.total_bytes > budget).then_some(floor))
}

/// Compiles `model`'s step to fit `opts.budget`, as the module docs say. `micro_batch(k)`
/// builds the forward pass of one of `k` micro-batches of the model's batch (`None`: the model
/// cannot be accumulated, as a model file whose batch is fixed in its text). Returns the model
/// compiled (the micro-batch's, when accumulating), its step, and what fitting did (`None`
/// when the step fits as asked).
///
/// A budget under the resident bytes (parameters, optimizer state, inputs) is refused at once
/// ([`FitError::Resident`]).
pub fn fit(
    model: &Model,
    step: &StepOptions,
    opts: &Options,
    fit: &FitOptions,
    micro_batch: Option<&dyn Fn(usize) -> Result<Model, String>>,
) -> Result<(Model, Compiled, Option<Fitted>), FitError> {
    let budget = fit.budget;
    let r = pipeline::rewritten(model, step, opts)?;
    let base = pipeline::finish(&r, &[])?;
    if base.report.total_bytes <= budget {
        return Ok((model.clone(), base, None));
    }
    let unfitted = base.report.total_bytes;
    // First the weights' bf16 copies go, if the step keeps them: two resident bytes a weight,
    // for a cast of each weight in each step (a few percent of a step's time, far less than
    // what any later measure costs).
    let cast_step = StepOptions {
        cast_weights_each_step: true,
        ..*step
    };
    // A sharded optimizer needs the copies (and saves more than they cost): they stay.
    let cast = (!step.cast_weights_each_step && !step.shard_optimizer)
        .then(|| smaller(model, &cast_step, opts, &base))
        .transpose()?
        .flatten();
    let (step, r, base, weights_cast_each_step) = match cast {
        Some((rc, bc)) => (&cast_step, rc, bc, true),
        None => (step, r, base, false),
    };
    let as_asked = |step: &StepOptions, c: &Compiled, chunked_loss_head: bool| Fitted {
        budget_bytes: budget,
        unfitted_bytes: unfitted,
        chunked_loss_head,
        loss_head_chunk_bytes: chunked_loss_head.then_some(step.loss_head_chunk_bytes),
        accumulate: step.accumulate.max(1),
        micro_batch: None,
        weights_cast_each_step,
        recompute: None,
        offload: None,
        total_bytes: c.report.total_bytes,
    };
    if base.report.total_bytes <= budget {
        let f = as_asked(step, &base, false);
        return Ok((model.clone(), base, Some(f)));
    }
    let offloadable = resident_under(model, &r, &base, fit)?;
    // Then the loss head in row chunks: its largest tensor (a language model's logits)
    // shrinks to a chunk's for an addition of the head's weight gradient per extra chunk.
    let chunked_step = StepOptions {
        loss_head_chunk_bytes: crate::autodiff::chunk::HEAD_CHUNK_BYTES,
        ..*step
    };
    let chunked = (step.loss_head_chunk_bytes == 0)
        .then(|| smaller(model, &chunked_step, opts, &base))
        .transpose()?
        .flatten();
    let (step, r, base, chunked_loss_head) = match chunked {
        Some((rc, bc)) => (&chunked_step, rc, bc, true),
        None => (step, r, base, false),
    };
    if base.report.total_bytes <= budget {
        let f = as_asked(step, &base, chunked_loss_head);
        return Ok((model.clone(), base, Some(f)));
    }
    let batch = model
        .graph
        .leaf("x")
        .and_then(|x| model.graph.ty(x).shape.dims().first().copied());
    let whole = batch.map(|b| b * step.accumulate.max(1));
    let recompute_on = fit.recompute && opts.fuse.as_ref().is_some_and(|f| f.remat);
    let mut ks = vec![step.accumulate.max(1)];
    if let (true, Some(whole), Some(_)) = (fit.accumulate, whole, micro_batch) {
        let least = fit.min_micro_batch.max(1);
        ks.extend((ks[0] + 1..=whole).filter(|k| whole % k == 0 && whole / k >= least));
    }
    let fitted = |k: usize, c: &Compiled, recompute: Option<Recompute>| Fitted {
        budget_bytes: budget,
        unfitted_bytes: unfitted,
        chunked_loss_head,
        loss_head_chunk_bytes: chunked_loss_head.then_some(step.loss_head_chunk_bytes),
        accumulate: k,
        micro_batch: whole.map(|w| w / k),
        weights_cast_each_step,
        recompute,
        offload: None,
        total_bytes: c.report.total_bytes,
    };
    let mut smallest = base.clone();
    let mut fallback: Option<(Model, Compiled, Fitted)> = None;
    for &k in &ks {
        let (m, r, base) = if k == ks[0] {
            (model.clone(), r.clone(), base.clone())
        } else {
            let build = micro_batch.expect("ks > 1 only with a micro-batch builder");
            let m = build(k).map_err(FitError::Model)?;
            let step_k = StepOptions {
                accumulate: k,
                ..*step
            };
            let r = pipeline::rewritten(&m, &step_k, opts)?;
            let base = pipeline::finish(&r, &[])?;
            if base.report.total_bytes <= budget {
                let f = fitted(k, &base, None);
                return Ok((m, base, Some(f)));
            }
            (m, r, base)
        };
        if base.report.total_bytes < smallest.report.total_bytes {
            smallest = base.clone();
        }
        if !recompute_on {
            continue;
        }
        match recompute_to_budget(&r, &base, budget)? {
            Recomputation::Fits(c, info) => {
                let f = fitted(k, &c, Some(info.clone()));
                if info.added_percent <= MAX_ADDED_FLOPS_PERCENT {
                    return Ok((m, *c, Some(f)));
                }
                if fallback.is_none() {
                    fallback = Some((m.clone(), *c, f));
                }
            }
            Recomputation::Over(c) => {
                if c.report.total_bytes < smallest.report.total_bytes {
                    smallest = *c;
                }
            }
        }
        // Before accumulating: the loss head in smaller chunks (a chunk's logits are the
        // largest transient at the peak; more chunks cost another pass over the head's weight
        // gradient each, far less than micro-batches do).
        if k == ks[0] && step.loss_head_chunk_bytes > 0 {
            let mut bytes = step.loss_head_chunk_bytes / 2;
            while bytes >= MIN_HEAD_CHUNK_BYTES {
                let step_c = StepOptions {
                    loss_head_chunk_bytes: bytes,
                    ..*step
                };
                let rc = pipeline::rewritten(&m, &step_c, opts)?;
                let bc = pipeline::finish(&rc, &[])?;
                let with_chunks = |f: Fitted| Fitted {
                    chunked_loss_head: true,
                    loss_head_chunk_bytes: Some(bytes),
                    ..f
                };
                if bc.report.total_bytes <= budget {
                    let f = with_chunks(fitted(k, &bc, None));
                    return Ok((m, bc, Some(f)));
                }
                match recompute_to_budget(&rc, &bc, budget)? {
                    Recomputation::Fits(c, info)
                        if info.added_percent <= MAX_ADDED_FLOPS_PERCENT =>
                    {
                        let f = with_chunks(fitted(k, &c, Some(info)));
                        return Ok((m, *c, Some(f)));
                    }
                    Recomputation::Fits(..) => {}
                    Recomputation::Over(c) => {
                        if c.report.total_bytes < smallest.report.total_bytes {
                            smallest = *c;
                        }
                    }
                }
                bytes /= 2;
            }
        }
        // Before accumulating over more than the fewest micro-batches: when even the most
        // accumulation can do is over, nothing between is tried ([`floor_over`]). Tested once
        // the fewest (`ks[1]`) has failed, not before it: the floor is the step of the most
        // micro-batches (64 for resnet50 at batch 128: 63,304 ops, planned several times over
        // when recomputing), which a budget that two micro-batches meet never needs.
        if let (true, Some(build)) = (ks.len() > 2 && k == ks[1], micro_batch) {
            let last = ks[ks.len() - 1];
            if let Some(floor) = floor_over(build, step, last, opts, recompute_on, budget)? {
                if floor.report.total_bytes < smallest.report.total_bytes {
                    smallest = floor;
                }
                break;
            }
        }
    }
    if let Some((m, c, f)) = fallback {
        return Ok((m, c, Some(f)));
    }
    let at_first = |c: &Compiled, info: Option<Recompute>| fitted(ks[0], c, info);
    let offload = fit.offload && offloadable > 0;
    offload_or_over(
        model,
        &r,
        budget,
        smallest,
        (recompute_on, offload),
        &ks,
        &at_first,
    )
}

/// The bytes offload could take off the device's resident region of `base` (`r`'s step), when
/// `fit` allows offload; an error when the rest of the resident region alone is over the
/// budget (nothing the fitter does moves it).
fn resident_under(
    model: &Model,
    r: &Rewritten,
    base: &Compiled,
    fit: &FitOptions,
) -> Result<usize, FitError> {
    let offloadable = match fit.offload {
        true => offload::offloadable_bytes(&r.graph),
        false => 0,
    };
    if base.report.resident_bytes.saturating_sub(offloadable) > fit.budget {
        return Err(FitError::Resident {
            model: model.name.clone(),
            resident: base.report.resident_bytes,
            offloadable,
            budget: fit.budget,
        });
    }
    Ok(offloadable)
}

/// The last resort ([`offload`]): `r`'s step (the model's own, `ks[0]` micro-batches) with the
/// fewest AdamW moments in host memory that fit `budget`, described by `fitted`; else the
/// refusal naming the smallest plan found (`smallest`, or offload's when smaller).
fn offload_or_over(
    model: &Model,
    r: &Rewritten,
    budget: usize,
    mut smallest: Compiled,
    (recompute_on, offload): (bool, bool),
    ks: &[usize],
    fitted: &dyn Fn(&Compiled, Option<Recompute>) -> Fitted,
) -> Result<(Model, Compiled, Option<Fitted>), FitError> {
    if !offload {
        return Err(over(model, budget, smallest, recompute_on, ks, false));
    }
    let excess = smallest.report.total_bytes.saturating_sub(budget);
    match offload::offload_to_budget(r, budget, excess, recompute_on)? {
        Ok((c, info, o)) => {
            let f = Fitted {
                offload: Some(o),
                ..fitted(&c, info)
            };
            return Ok((model.clone(), c, Some(f)));
        }
        Err(c) if c.report.total_bytes < smallest.report.total_bytes => smallest = c,
        Err(_) => {}
    }
    Err(over(model, budget, smallest, recompute_on, ks, true))
}

/// The refusal when nothing fits: the smallest plan found and what was tried (`ks`: the
/// numbers of micro-batches; `moments`: whether AdamW's moments were offloaded too).
fn over(
    model: &Model,
    budget: usize,
    smallest: Compiled,
    recompute_on: bool,
    ks: &[usize],
    moments: bool,
) -> FitError {
    let mut tried = match (recompute_on, ks.len() > 1) {
        (true, true) => format!("recomputing every matmul, attention and convolution output the backward pass reads and every segment between the forward pass's cuts, and {} to {} micro-batches", ks[0], ks.last().copied().unwrap_or(1)),
        (true, false) => "recomputing every matmul, attention and convolution output the backward pass reads and every segment between the forward pass's cuts; accumulation was not tried (it needs a named model and no --accumulate of its own)".to_string(),
        (false, true) => format!("{} to {} micro-batches, no recomputation", ks[0], ks.last().copied().unwrap_or(1)),
        (false, false) => "only the plan as compiled: recomputation is off, and accumulation needs a named model and no --accumulate of its own".to_string(),
    };
    if moments {
        tried.push_str("; then every AdamW moment offloaded to host memory");
    }
    FitError::Over {
        model: model.name.clone(),
        budget,
        smallest: Box::new(smallest),
        tried,
    }
}
