//! Recomputation under a budget, the fitter's second step: which library-call outputs and
//! forward segments to compute again for the backward pass, cheapest per byte first, and the
//! shortest prefix of that order whose plan fits ([`recompute_to_budget`]). Offload
//! ([`super::offload`]) uses it too, so it is a file of its own that neither the fitter nor
//! offload reaches back from.

use crate::fuse::remat::{candidates, mask_candidates, Candidate};
use crate::fuse::segment::{self, Segment};
use crate::fuse::{self};
use crate::ir::NodeId;
use crate::pipeline::{self, CompileError, Compiled, Rewritten};
use crate::report::human;
use serde::Serialize;

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

/// A segment of the forward pass recomputed whole for the backward pass
/// ([`crate::fuse::segment`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RecomputedSegment {
    /// The layer of its first library call (`blocks.3.qkv`): it names the segment.
    pub first: String,
    /// How many nodes of the forward pass it recomputes.
    pub nodes: usize,
    /// The bytes of the value it is recomputed from, kept from the forward pass (0 for a
    /// segment that starts from the batch).
    pub keeps_bytes: usize,
    /// The bytes of the values inside it that the forward pass stored for the backward pass:
    /// what recomputing it frees at most.
    pub frees_bytes: usize,
    /// The arithmetic of recomputing it, and that in percent of the step's.
    pub flops: u64,
    pub flops_percent: f64,
}

impl RecomputedSegment {
    /// `blocks.3.qkv recomputed: keeps 12.00 MiB, frees up to 96.00 MiB, +2.1% FLOPs`.
    pub fn line(&self) -> String {
        format!(
            "{} recomputed ({} nodes): keeps {}, frees up to {}, +{:.1}% FLOPs",
            self.first,
            self.nodes,
            human(self.keeps_bytes),
            human(self.frees_bytes),
            self.flops_percent
        )
    }
}

/// What recomputation under a budget did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Recompute {
    /// The library calls recomputed, in the order they were chosen (cheapest first).
    pub values: Vec<Recomputed>,
    /// The segments recomputed whole, in the order they were chosen.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub segments: Vec<RecomputedSegment>,
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
        let mut counts: Vec<String> = by_op
            .iter()
            .map(|(op, n)| format!("{n} {op} output{}", if *n == 1 { "" } else { "s" }))
            .collect();
        if !self.segments.is_empty() {
            let n = self.segments.len();
            counts.insert(0, format!("{n} segment{}", if n == 1 { "" } else { "s" }));
        }
        let names: Vec<&str> = self
            .segments
            .iter()
            .map(|s| s.first.as_str())
            .chain(self.values.iter().map(|v| v.provenance.as_str()))
            .collect();
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

/// The candidates of a rewritten step ([`candidates`]) in the order recomputation takes them:
/// fewest FLOPs per byte kept first; equal ratios in node order (earlier layers' values are
/// kept longest).
pub fn ordered_candidates(r: &Rewritten) -> Result<Vec<Candidate>, CompileError> {
    let opts = r.options.fuse.clone().unwrap_or_default();
    let ops = opts.recompute_ops;
    let g = fuse::prepared_with(&r.graph, &opts)?;
    let mut c = candidates(&g, ops);
    c.extend(mask_candidates(&g, ops));
    c.sort_by(|a, b| {
        // a.flops / a.bytes against b.flops / b.bytes, exactly.
        let x = a.flops as u128 * b.bytes.max(1) as u128;
        let y = b.flops as u128 * a.bytes.max(1) as u128;
        x.cmp(&y).then(a.node.cmp(&b.node))
    });
    Ok(c)
}

/// One thing the fitter may recompute for the backward pass: a library call's output or a
/// whole segment of the forward pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    Value(Candidate),
    Segment(Segment),
}

impl Choice {
    fn flops(&self) -> u64 {
        match self {
            Choice::Value(c) => c.flops,
            Choice::Segment(s) => s.flops,
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Choice::Value(c) => c.bytes,
            Choice::Segment(s) => s.bytes,
        }
    }

    /// Its first node, for ties.
    fn node(&self) -> NodeId {
        match self {
            Choice::Value(c) => c.node,
            Choice::Segment(s) => s.nodes[0],
        }
    }
}

/// How segments are offered to the fitter, besides none: pieces between consecutive cuts
/// (a transformer's half block, a ResNet block), and pairs of them starting at the first or at
/// the second piece (a whole transformer block from its input, or from the residual between its
/// attention and its MLP: keeping one residual per block, as PyTorch's checkpoint around every
/// block does).
pub const SEGMENTINGS: [(usize, usize); 3] = [(1, 0), (2, 0), (2, 1)];

/// What [`ordered_choices`] offers besides the library calls: segments grouped
/// `(group, offset)` ([`segment::grouped`]), or none.
pub type Segmenting = Option<(usize, usize)>;

/// The library calls of [`ordered_candidates`] and the segments of `segmenting` in the order
/// recomputation takes them: fewest FLOPs per byte freed first; equal ratios in node order.
pub fn ordered_choices(r: &Rewritten, segmenting: Segmenting) -> Result<Vec<Choice>, CompileError> {
    let opts = r.options.fuse.clone().unwrap_or_default();
    let g = fuse::prepared_with(&r.graph, &opts)?;
    let mut c: Vec<Choice> = candidates(&g, opts.recompute_ops)
        .into_iter()
        .chain(mask_candidates(&g, opts.recompute_ops))
        .map(Choice::Value)
        .collect();
    if let Some((group, offset)) = segmenting {
        let pieces = segment::pieces(&g, opts.recompute_ops);
        c.extend(
            segment::grouped(&g, &pieces, group, offset)
                .into_iter()
                .map(Choice::Segment),
        );
    }
    c.sort_by(|a, b| {
        let x = a.flops() as u128 * b.bytes().max(1) as u128;
        let y = b.flops() as u128 * a.bytes().max(1) as u128;
        x.cmp(&y).then(a.node().cmp(&b.node()))
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
    let chosen: Vec<Choice> = chosen.iter().cloned().map(Choice::Value).collect();
    recompute_choices(r, base, &chosen, candidates)
}

/// As [`recompute`], for choices of [`ordered_choices`] (segments among them).
pub fn recompute_choices(
    r: &Rewritten,
    base: &Compiled,
    chosen: &[Choice],
    candidates: usize,
) -> Result<(Compiled, Recompute), CompileError> {
    let mut ids: Vec<NodeId> = Vec::new();
    for ch in chosen {
        match ch {
            Choice::Value(c) => ids.push(c.node),
            Choice::Segment(s) => ids.extend(s.nodes.iter().copied()),
        }
    }
    ids.sort();
    ids.dedup();
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
    let percent = |f: u64| {
        if step_flops == 0 {
            0.0
        } else {
            f as f64 * 100.0 / step_flops as f64
        }
    };
    let segments = chosen
        .iter()
        .filter_map(|c| match c {
            Choice::Segment(s) => Some(s),
            Choice::Value(_) => None,
        })
        .filter(|s| s.nodes.iter().any(|n| done.contains(n)))
        .map(|s| {
            let first = s.first(&g);
            RecomputedSegment {
                first: g
                    .origin(first)
                    .primary()
                    .map_or_else(|| g.origin(first).label(), str::to_string),
                nodes: s.nodes.len(),
                keeps_bytes: s.input.map_or(0, |x| g.ty(x).bytes()),
                frees_bytes: s.bytes,
                flops: s.flops,
                flops_percent: percent(s.flops),
            }
        })
        .collect();
    // In the order chosen, those that did get copies.
    let values = chosen
        .iter()
        .filter_map(|c| match c {
            Choice::Value(v) => Some(v),
            Choice::Segment(_) => None,
        })
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
        segments,
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

/// Recomputes as little as it can so that `r`'s plan fits `budget`. For each way of offering
/// choices (the library calls alone, then with the segments of each of [`SEGMENTINGS`]) the
/// choices are ordered by FLOPs per byte freed ([`ordered_choices`]), and the shortest prefix
/// of that order whose plan fits is found by bisection, each probe a real compile and plan
/// (about log2 of the choices plus one); of the plans that fit, the one adding the least
/// arithmetic is taken (ties: the smaller plan, then the earlier way).
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
    let mut best: Option<(Compiled, Recompute)> = None;
    let mut smallest = base.clone();
    let ways = std::iter::once(None).chain(SEGMENTINGS.iter().map(|&w| Some(w)));
    let mut offered: Vec<Vec<Choice>> = Vec::new();
    for way in ways {
        let cands = ordered_choices(r, way)?;
        // A way that offers nothing new (no segments, or the same ones) is not tried again.
        if cands.is_empty() || offered.contains(&cands) {
            continue;
        }
        offered.push(cands.clone());
        match recompute_prefix(r, base, &cands, budget)? {
            Ok((c, info)) => {
                let better = best.as_ref().is_none_or(|(bc, bi)| {
                    (info.added_flops, c.report.total_bytes)
                        < (bi.added_flops, bc.report.total_bytes)
                });
                if better {
                    best = Some((c, info));
                }
            }
            Err(all) => {
                if all.report.total_bytes < smallest.report.total_bytes {
                    smallest = all;
                }
            }
        }
    }
    Ok(match best {
        Some((c, info)) => Recomputation::Fits(Box::new(c), info),
        None => Recomputation::Over(Box::new(smallest)),
    })
}

/// The shortest prefix of `cands` whose plan fits `budget`, by bisection: that plan and what
/// it did, or the plan recomputing every one of them when even that is over.
fn recompute_prefix(
    r: &Rewritten,
    base: &Compiled,
    cands: &[Choice],
    budget: usize,
) -> Result<Result<(Compiled, Recompute), Compiled>, CompileError> {
    let (all, mut info) = recompute_choices(r, base, cands, cands.len())?;
    let mut probes = 1;
    if all.report.total_bytes > budget {
        return Ok(Err(all));
    }
    // lo: a prefix known over (the empty one is `base`); hi: one known to fit.
    let (mut lo, mut hi) = (0, cands.len());
    let mut best = all;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        let (c, i) = recompute_choices(r, base, &cands[..mid], cands.len())?;
        probes += 1;
        if c.report.total_bytes <= budget {
            (hi, best, info) = (mid, c, i);
        } else {
            lo = mid;
        }
    }
    info.probes = probes;
    Ok(Ok((best, info)))
}
