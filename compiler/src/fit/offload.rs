//! The fitter's last resort: AdamW's moments kept in host memory ([`crate::plan::offload`]),
//! tried only when recomputation and micro-batches cannot bring the step under its budget.
//!
//! The moments are offered largest first (ties in graph order): each takes its bytes out of
//! the device's resident region for a staging buffer in the slab that lives only around its
//! update. The fitter takes the fewest of them whose plan fits, with whatever recomputation
//! the budget then needs ([`super::recompute::recompute_to_budget`]); every figure comes from compiling
//! the step with that set offloaded, as for the fitter's other measures.

use super::recompute::{recompute_to_budget, Recomputation, Recompute};
use crate::ir::{Graph, LeafKind, Op};
use crate::pipeline::{self, CompileError, Compiled, Rewritten};
use crate::plan::align_up;
use crate::report::human;
use serde::Serialize;

/// What offload did under a budget.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Offloaded {
    /// How many leaves live in host memory, of how many moments there were.
    pub values: usize,
    pub candidates: usize,
    /// The host region's bytes, and the device's (the plan's one allocation).
    pub host_bytes: usize,
    pub device_bytes: usize,
    /// Copies per step (one in, one out per value).
    pub copies: usize,
    /// The plans compiled to choose the set.
    pub probes: usize,
}

impl Offloaded {
    /// `offloaded: 292 values, 4.94 GiB on the host, 584 copies; device 15.2 GiB`.
    pub fn line(&self) -> String {
        format!(
            "offloaded: {} values, {} on the host, {} copies; device {} ({} bytes), host {} ({} bytes)",
            self.values,
            human(self.host_bytes),
            self.copies,
            human(self.device_bytes),
            self.device_bytes,
            human(self.host_bytes),
            self.host_bytes
        )
    }
}

/// AdamW's moments in `g` (state leaves named `*.exp_avg` and `*.exp_avg_sq`), largest first,
/// ties in graph order: the order offload takes them in.
pub fn moments(g: &Graph) -> Vec<String> {
    let mut m: Vec<(usize, String)> = g
        .ids()
        .filter_map(|id| match &g.node(id).op {
            Op::Leaf {
                kind: LeafKind::State,
                name,
                ..
            } if name.ends_with(".exp_avg") || name.ends_with(".exp_avg_sq") => {
                Some((g.ty(id).bytes(), name.clone()))
            }
            _ => None,
        })
        .collect();
    // A stable sort keeps graph order among equal sizes.
    m.sort_by_key(|(b, _)| std::cmp::Reverse(*b));
    m.into_iter().map(|(_, n)| n).collect()
}

/// The resident bytes offloading every moment of `g` takes off the device.
pub fn offloadable_bytes(g: &Graph) -> usize {
    moments(g)
        .iter()
        .filter_map(|n| g.leaf(n))
        .map(|id| align_up(g.ty(id).bytes()))
        .sum()
}

/// A plan with offload that fits, what recomputation it also needed, and what offload did.
pub type Fit = (Compiled, Option<Recompute>, Offloaded);

/// `r`'s step with the first `n` of `names` offloaded, fitted to `budget` by recomputation
/// when `recompute` (else the plan as it is): the plan under the budget, or the smallest found.
fn probe(
    r: &Rewritten,
    names: &[String],
    n: usize,
    budget: usize,
    recompute: bool,
) -> Result<Result<(Compiled, Option<Recompute>), Compiled>, CompileError> {
    let mut r = r.clone();
    r.options.plan.offload = names[..n].to_vec();
    let base = pipeline::finish(&r, &[])?;
    if base.report.total_bytes <= budget || !recompute {
        return Ok(if base.report.total_bytes <= budget {
            Ok((base, None))
        } else {
            Err(base)
        });
    }
    Ok(match recompute_to_budget(&r, &base, budget)? {
        Recomputation::Fits(c, info) => Ok((*c, Some(info))),
        Recomputation::Over(c) => Err(*c),
    })
}

/// The fewest of `r`'s moments (largest first) whose plan fits `budget`, with recomputation
/// when `recompute`; `excess` is how far over the budget the smallest plan without offload
/// was, where the search starts (the shortest prefix of moments at least that large). From
/// there it steps up (doubling) until a plan fits, then bisects down to the shortest prefix
/// that fits. Returns that plan, or the smallest plan found when even every moment
/// offloaded is over.
pub fn offload_to_budget(
    r: &Rewritten,
    budget: usize,
    excess: usize,
    recompute: bool,
) -> Result<Result<Fit, Compiled>, CompileError> {
    let names = moments(&r.graph);
    let sizes: Vec<usize> = names
        .iter()
        .filter_map(|n| r.graph.leaf(n))
        .map(|id| align_up(r.graph.ty(id).bytes()))
        .collect();
    let all = names.len();
    // The shortest prefix whose bytes cover the excess.
    let mut covered = 0usize;
    let start = sizes
        .iter()
        .position(|&b| {
            covered += b;
            covered >= excess
        })
        .map_or(all, |i| i + 1)
        .max(1)
        .min(all);
    if all == 0 {
        return Ok(Err(pipeline::finish(r, &[])?));
    }
    let mut probes = 0;
    // lo: a prefix known over (the empty one: the fitter found none fits); hi: one that fits.
    let mut lo = 0;
    let mut n = start;
    let (mut hi, mut best) = loop {
        probes += 1;
        match probe(r, &names, n, budget, recompute)? {
            Ok(fit) => break (n, fit),
            Err(over) if n == all => return Ok(Err(over)),
            Err(_) => {
                lo = n;
                n = (2 * n).min(all);
            }
        }
    };
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        probes += 1;
        match probe(r, &names, mid, budget, recompute)? {
            Ok(fit) => (hi, best) = (mid, fit),
            Err(_) => lo = mid,
        }
    }
    let (c, info) = best;
    let offloaded = Offloaded {
        values: hi,
        candidates: all,
        host_bytes: c.plan.host_bytes,
        device_bytes: c.report.total_bytes,
        copies: 2 * hi,
        probes,
    };
    Ok(Ok((c, info, offloaded)))
}
