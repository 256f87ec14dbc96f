//! Fitting a training step to a memory budget, in the order that costs least:
//!
//! 1. the memory-aware schedule and fusion's cheap recomputation (every compile does both);
//!    then, over the budget, the weights cast to bf16 in each step instead of kept as bf16
//!    copies ([`crate::autodiff::copies`]: two resident bytes a weight for one cast each), and
//!    the loss head in row chunks;
//! 2. recomputing library calls for the backward pass ([`recompute_to_budget`]): matmul,
//!    attention and convolution outputs the backward pass reads, cheapest first;
//! 3. gradient accumulation: the batch in k = 2, 3, 4, ... micro-batches (divisors of the
//!    batch), each k tried alone first, then with recomputation.
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
use crate::fuse::remat::{candidates, Candidate};
use crate::fuse::{self};
use crate::ir::NodeId;
use crate::models::Model;
use crate::pipeline::{self, CompileError, Compiled, Options, Rewritten};
use crate::report::human;
use serde::Serialize;

/// The most arithmetic recomputation may add, in percent of the step's, before more
/// micro-batches are preferred (see the module docs).
pub const MAX_ADDED_FLOPS_PERCENT: f64 = 33.0;

/// The smallest loss-head chunk the fitter tries (halving from
/// [`crate::autodiff::chunk::HEAD_CHUNK_BYTES`]): gpt2's head in 16 chunks of 512 rows.
pub const MIN_HEAD_CHUNK_BYTES: usize = 64 << 20;

/// A value recomputed for the backward pass.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Recomputed {
    /// The layer it belongs to (`blocks.3.fc`).
    pub provenance: String,
    pub op: String,
    /// Its type (`f32[8192,3072]`).
    #[serde(rename = "type")]
    pub ty: String,
    /// What it kept from the forward pass to the backward one.
    pub bytes: usize,
    /// The arithmetic of computing it again.
    pub flops: u64,
}

/// What recomputation under a budget did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Recompute {
    /// The library calls recomputed, in the order they were chosen (cheapest first).
    pub values: Vec<Recomputed>,
    /// The arithmetic the copies add (with the cheap values recomputed because of them), over
    /// what the step without them does.
    pub added_flops: u64,
    /// The arithmetic of the step without them ([`crate::flops`]).
    pub step_flops: u64,
    /// `added_flops` in percent of `step_flops`.
    pub added_percent: f64,
    /// The candidates there were, and the plans compiled to choose among them.
    pub candidates: usize,
    pub probes: usize,
}

impl Recompute {
    /// The recomputed values, one phrase: `12 matmul outputs (blocks.0.fc, ...)`.
    pub fn summary(&self) -> String {
        let mut by_op: Vec<(&str, usize)> = Vec::new();
        for v in &self.values {
            match by_op.iter_mut().find(|(op, _)| *op == v.op) {
                Some((_, n)) => *n += 1,
                None => by_op.push((&v.op, 1)),
            }
        }
        let counts: Vec<String> = by_op
            .iter()
            .map(|(op, n)| format!("{n} {op} output{}", if *n == 1 { "" } else { "s" }))
            .collect();
        let names: Vec<&str> = self.values.iter().map(|v| v.provenance.as_str()).collect();
        let shown = names.iter().take(6).copied().collect::<Vec<_>>().join(", ");
        let more = names.len().saturating_sub(6);
        format!(
            "{} ({shown}{}), +{:.1}% FLOPs",
            counts.join(", "),
            if more > 0 {
                format!(", {more} more")
            } else {
                String::new()
            },
            self.added_percent
        )
    }
}

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
        format!(
            "fitted to the budget of {}: {}, {} ({} bytes) instead of {} ({} bytes)",
            human(self.budget_bytes),
            what.join("; "),
            human(self.total_bytes),
            self.total_bytes,
            human(self.unfitted_bytes),
            self.unfitted_bytes
        )
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
    /// ([`crate::models::min_batch`]; 2 for a ResNet whose `layer4` batch norms would
    /// otherwise see one value per channel). Smaller micro-batches are not tried.
    pub min_micro_batch: usize,
}

/// Why a step could not be fitted.
#[derive(Debug, thiserror::Error)]
pub enum FitError {
    #[error(transparent)]
    Compile(#[from] CompileError),
    /// The parameters, optimizer state and inputs alone are over the budget: nothing the
    /// fitter does moves them.
    #[error("the resident state of {model} (parameters, optimizer state, inputs) needs {} ({resident} bytes), over the budget of {} ({budget} bytes): no recomputation or accumulation lowers it; raise --budget or shrink the model", human(*resident), human(*budget))]
    Resident {
        model: String,
        resident: usize,
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

/// The candidates of a rewritten step ([`candidates`]) in the order recomputation takes them:
/// fewest FLOPs per byte kept first; equal ratios in node order (earlier layers' values are
/// kept longest).
pub fn ordered_candidates(r: &Rewritten) -> Result<Vec<Candidate>, CompileError> {
    let opts = r.options.fuse.clone().unwrap_or_default();
    let ops = opts.recompute_ops;
    let g = fuse::prepared_with(&r.graph, &opts)?;
    let mut c = candidates(&g, ops);
    c.sort_by(|a, b| {
        // a.flops / a.bytes against b.flops / b.bytes, exactly.
        let x = a.flops as u128 * b.bytes.max(1) as u128;
        let y = b.flops as u128 * a.bytes.max(1) as u128;
        x.cmp(&y).then(a.node.cmp(&b.node))
    });
    Ok(c)
}

/// The step `r` compiled recomputing `chosen` (candidates of [`ordered_candidates`]), and what
/// that did against `base` (the step compiled without them, [`pipeline::finish`]`(r, &[])`).
pub fn recompute(
    r: &Rewritten,
    base: &Compiled,
    chosen: &[Candidate],
    candidates: usize,
) -> Result<(Compiled, Recompute), CompileError> {
    let ids: Vec<NodeId> = chosen.iter().map(|c| c.node).collect();
    let c = pipeline::finish(r, &ids)?;
    let g = fuse::prepared_with(&r.graph, &r.options.fuse.clone().unwrap_or_default())?;
    let (done, added, step_flops) = match (&c.fuse, &base.fuse) {
        (Some(f), Some(b)) => (
            f.recomputed_heavy.clone(),
            f.recomputed_flops.saturating_sub(b.recomputed_flops),
            b.flops + b.recomputed_flops,
        ),
        _ => (Vec::new(), 0, crate::flops::of_graph(&g)),
    };
    // In the order chosen, those that did get copies.
    let values = chosen
        .iter()
        .filter(|c| done.contains(&c.node))
        .map(|c| Recomputed {
            provenance: g.origin(c.node).label(),
            op: g.node(c.node).op.name().to_string(),
            ty: g.ty(c.node).to_string(),
            bytes: c.bytes,
            flops: c.flops,
        })
        .collect();
    let info = Recompute {
        values,
        added_flops: added,
        step_flops,
        added_percent: if step_flops == 0 {
            0.0
        } else {
            added as f64 * 100.0 / step_flops as f64
        },
        candidates,
        probes: 1,
    };
    Ok((c, info))
}

/// What [`recompute_to_budget`] found.
#[derive(Debug)]
pub enum Recomputation {
    /// The plan under the budget recomputing the fewest candidates found, and what it did.
    Fits(Box<Compiled>, Recompute),
    /// Even recomputing every candidate is over: that plan (or `base`, if smaller).
    Over(Box<Compiled>),
}

/// Recomputes the fewest library calls it can so that `r`'s plan fits `budget`: the
/// candidates are ordered by FLOPs per byte kept ([`ordered_candidates`]), and the shortest
/// prefix of that order whose plan fits is found by bisection, each probe a real compile and
/// plan (about log2 of the candidates plus one).
///
/// This is a greedy order with exact peaks, not an exact optimum: a cheaper set off the order
/// (Checkmate's integer program would find it) may exist, and bisection assumes that
/// recomputing more never raises the peak, which holds for the steps tried (the copies are
/// made just before their backward users) but is not proved; when it fails the answer is
/// still under the budget, just possibly not the shortest prefix.
pub fn recompute_to_budget(
    r: &Rewritten,
    base: &Compiled,
    budget: usize,
) -> Result<Recomputation, CompileError> {
    let cands = ordered_candidates(r)?;
    if cands.is_empty() {
        return Ok(Recomputation::Over(Box::new(base.clone())));
    }
    let (all, mut info) = recompute(r, base, &cands, cands.len())?;
    let mut probes = 1;
    if all.report.total_bytes > budget {
        let smaller = if all.report.total_bytes < base.report.total_bytes {
            all
        } else {
            base.clone()
        };
        return Ok(Recomputation::Over(Box::new(smaller)));
    }
    // lo: a prefix known over (the empty one is `base`); hi: one known to fit.
    let (mut lo, mut hi) = (0, cands.len());
    let mut best = all;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        let (c, i) = recompute(r, base, &cands[..mid], cands.len())?;
        probes += 1;
        if c.report.total_bytes <= budget {
            (hi, best, info) = (mid, c, i);
        } else {
            lo = mid;
        }
    }
    info.probes = probes;
    Ok(Recomputation::Fits(Box::new(best), info))
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
/// accumulated `k` times, with every recomputation candidate recomputed when `recompute` (or
/// without any, when that is smaller). Returns that plan when it is over `budget`: then no
/// number of micro-batches up to `k` fits either (a micro-batch's plan only grows with its
/// size), and the fitter refuses the budget in the time of one or two compiles instead of
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
    let cands = match recompute {
        true => ordered_candidates(&r)?,
        false => Vec::new(),
    };
    if !cands.is_empty() {
        let all = pipeline::finish(&r, &cands.iter().map(|c| c.node).collect::<Vec<_>>())?;
        if all.report.total_bytes < floor.report.total_bytes {
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
        total_bytes: c.report.total_bytes,
    };
    if base.report.total_bytes <= budget {
        let f = as_asked(step, &base, false);
        return Ok((model.clone(), base, Some(f)));
    }
    if base.report.resident_bytes > budget {
        return Err(FitError::Resident {
            model: model.name.clone(),
            resident: base.report.resident_bytes,
            budget,
        });
    }
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
        // Before accumulating over 2, 3, ... micro-batches: when even the most accumulation
        // can do is over, nothing between is tried ([`floor_over`]).
        if let (true, Some(build)) = (k == ks[0] && ks.len() > 2, micro_batch) {
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
    let tried = match (recompute_on, ks.len() > 1) {
        (true, true) => format!("recomputing every matmul, attention and convolution output the backward pass reads, and {} to {} micro-batches", ks[0], ks.last().copied().unwrap_or(1)),
        (true, false) => "recomputing every matmul, attention and convolution output the backward pass reads; accumulation was not tried (it needs a named model and no --accumulate of its own)".to_string(),
        (false, true) => format!("{} to {} micro-batches, no recomputation", ks[0], ks.last().copied().unwrap_or(1)),
        (false, false) => "nothing was tried: recomputation is off and accumulation needs a named model and no --accumulate of its own".to_string(),
    };
    Err(FitError::Over {
        model: model.name.clone(),
        budget,
        smallest: Box::new(smallest),
        tried,
    })
}
