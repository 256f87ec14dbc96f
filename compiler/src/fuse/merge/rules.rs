//! The rules that refuse a merge, each a small named function, in the style of
//! [`crate::rewrite::rules`]: [`FOLD_RULES`] for a producer folded into a consumer that reads
//! it, [`SIBLING_RULES`] for two kernels of one pass that read one value. A merge is made when
//! no rule of its list refuses it and the merged group lowers. The rules are tried in their
//! list's order, cheap ones first, and the first that refuses ends the search.

use super::part::Part;
use super::units::Units;
use crate::fuse::bounds::MAX_KERNEL_REDUCTIONS;
use crate::fuse::lower::Domain;
use crate::fuse::select;
use crate::ir::{Graph, NodeId};
use std::collections::BTreeSet;

/// A producer `p` (its group `pg`) and a consumer `c` (`cg`) that reads what it produces, with
/// the domain their merged kernel would iterate.
pub(super) struct Fold<'a> {
    pub g: &'a Graph,
    pub units: &'a Units,
    pub p: usize,
    pub c: usize,
    pub pg: &'a Part,
    pub cg: &'a Part,
    pub domain: &'a Domain,
    /// The bytes of the producer's values that the consumer loads: what the merged kernel
    /// computes instead of reading.
    pub saved: usize,
    /// The bytes of the step's largest value, which its plan holds at its peak.
    pub largest: usize,
}

/// Two groups `a` (`pa`, the earlier) and `b` (`pb`) of one domain that load the computed
/// values `shared` at the same index.
pub(super) struct Siblings<'a> {
    pub g: &'a Graph,
    pub units: &'a Units,
    pub a: usize,
    pub b: usize,
    pub pa: &'a Part,
    pub pb: &'a Part,
    pub domain: &'a Domain,
    pub shared: &'a [NodeId],
    /// The flops of each library unit, in the order of [`Units::library`].
    pub lib_flops: &'a [u64],
}

/// The rules that refuse a fold, in the order they are tried.
pub(super) const FOLD_RULES: &[fn(&Fold) -> bool] = &[
    fold_exceeds_the_reductions,
    fold_writes_full_size_from_a_column_reduction,
    fold_skips_another_path,
    fold_pulls_backward_work_into_the_forward_pass,
    fold_takes_in_an_accumulation,
    fold_undoes_an_early_copy,
    fold_needs_more_scratch_than_it_saves,
];

/// The rules that refuse a sibling merge, in the order they are tried.
pub(super) const SIBLING_RULES: &[fn(&Siblings) -> bool] = &[
    siblings_share_no_load,
    siblings_exceed_the_reductions,
    siblings_write_full_size_from_a_column_reduction,
    siblings_are_in_different_passes,
    siblings_hold_an_accumulation,
    siblings_hold_an_early_copy,
    siblings_are_connected,
    siblings_delay_more_than_they_save,
];

/// Whether some rule of `FOLD_RULES` refuses folding `f.p` into `f.c`.
pub(super) fn fold_refused(f: &Fold) -> bool {
    FOLD_RULES.iter().any(|rule| rule(f))
}

/// Whether some rule of `SIBLING_RULES` refuses merging `s.a` and `s.b`.
pub(super) fn siblings_refused(s: &Siblings) -> bool {
    SIBLING_RULES.iter().any(|rule| rule(s))
}

/// The merged kernel would hold more than [`MAX_KERNEL_REDUCTIONS`].
fn fold_exceeds_the_reductions(f: &Fold) -> bool {
    f.pg.reductions + f.cg.reductions > MAX_KERNEL_REDUCTIONS
}

/// The fold adds scratch and the merged kernel's scratch would exceed both what the fold saves
/// and the step's largest value (or [`crate::fuse::scratch_bound`]). A kernel's scratch (the CPU
/// executor's tables and lane buffers) grows with its body; two kernels run one after the
/// other reuse one scratch region, so merging them adds to the larger one's scratch the
/// other's instructions in the tables ([`super::part::merged_scratch`]), while the fold saves the
/// producer's values that the consumer stops reading. Where the values are tiny (a deep chain
/// of f32[8, 8] layers), one merged kernel's scratch grew past what the whole unfused step
/// holds (2,000 layers planned 4.07 MiB against 1.47 MiB unfused, 3.1 MiB of it one backward
/// kernel's scratch). The whole merged scratch is weighed, not what the fold adds: the values
/// folds save are live one after another, a kernel's scratch all at once, so folds that each
/// saved a 256-byte value for a few instructions' tables grew one kernel of 150 such layers to
/// 123 KiB of scratch (its whole unfused step plans 113.5 KiB). A scratch up to the step's
/// largest value is let be: the plan holds at least that value, and only one kernel's scratch
/// is live at a time, so such a scratch is bounded by the plan it is part of; every kernel of
/// the reference models is far under it, and none of their folds is refused.
fn fold_needs_more_scratch_than_it_saves(f: &Fold) -> bool {
    let merged = super::part::merged_scratch(f.pg, f.cg);
    let added = merged > f.pg.scratch.max(f.cg.scratch);
    added && merged > f.saved && merged > crate::fuse::bounds::scratch_bound(f.largest)
}

/// A column reduction (over leading axes) runs on few blocks, one per group of columns:
/// full-size outputs written from it would be written by a small fraction of the GPU. Such
/// outputs stay in a kernel of their own, unless they are written from this column reduction
/// already: a producer over the same reduce axes (a channels-last batch norm's data gradient,
/// whose full outputs read its sums, split by stages where it runs) folds into a consumer
/// that only sums (its weight and bias gradients, `Σdy` and `Σdy·x̂`). The merged kernel
/// writes no full-size output the producer did not, and the consumer's sums join the
/// producer's first stage: the consumer no longer reads `dy` (stored in f32 for it alone,
/// then dropped as unread) nor `x` again (issue 48: 10 bytes an element of each such batch
/// norm, 9.4 GB of resnet50's 53.2 GB of fused traffic at 224x224, batch 128, in bf16). The
/// NCHW batch norm's kernel already held those sums (its reduce axes include the last one, so
/// it is not a column reduction here).
fn fold_writes_full_size_from_a_column_reduction(f: &Fold) -> bool {
    // A group's domain comes from its first root; a kernel whose full outputs read its sums
    // has a full root, so its reduce axes are its lowered kernel's.
    let column = |p: &Part| {
        p.domain.axes == f.domain.axes
            || (p.lowered.as_ref())
                .is_some_and(|l| f.domain.axes.as_ref() == Some(&l.kernel.reduce_axes))
    };
    is_column_reduction(f.domain)
        && [f.pg, f.cg]
            .into_iter()
            .any(|p| !column(p) && has_full_size_root(f.g, f.domain, p))
}

/// Another path p -> ... -> c: the merged kernel would depend on itself.
fn fold_skips_another_path(f: &Fold) -> bool {
    f.units.reaches(f.p, f.c)
}

/// A backward kernel that follows library work is not pulled into the forward pass: the
/// merged kernel runs at the forward kernel's place, so its backward outputs would be held
/// through everything in between (a softmax recomputed for the backward pass, merged into the
/// forward softmax, would be stored twice). The loss kernel and its gradient, with nothing
/// between them, still merge.
fn fold_pulls_backward_work_into_the_forward_pass(f: &Fold) -> bool {
    crosses_into_backward(f.units.loss, &f.units.library, &f.pg.roots, &f.cg.roots)
}

/// A running sum of accumulated gradients is added when its micro-batch is done, not folded
/// into its reader (the next sum, or the update after the last micro-batch), which would hold
/// every micro-batch's gradient until then.
fn fold_takes_in_an_accumulation(f: &Fold) -> bool {
    f.pg.roots.iter().any(|&r| select::is_accumulation(f.g, r))
}

/// A slice copied early ([`crate::fuse::early`]) is its own kernel: folded into its late
/// reader, the reader would read the whole value again, which the copy is there to free.
fn fold_undoes_an_early_copy(f: &Fold) -> bool {
    (f.pg.roots.iter().chain(&f.cg.roots)).any(|r| f.units.early.contains(r))
}

/// Nothing to read once instead of twice: no reason to merge.
fn siblings_share_no_load(s: &Siblings) -> bool {
    s.shared.is_empty()
}

/// The merged kernel would hold more than [`MAX_KERNEL_REDUCTIONS`].
fn siblings_exceed_the_reductions(s: &Siblings) -> bool {
    s.pa.reductions + s.pb.reductions > MAX_KERNEL_REDUCTIONS
}

/// As [`fold_writes_full_size_from_a_column_reduction`].
fn siblings_write_full_size_from_a_column_reduction(s: &Siblings) -> bool {
    writes_full_size_from_a_column_reduction(s.g, s.domain, s.pa, s.pb)
}

/// One pass: both in the forward pass or both after it.
fn siblings_are_in_different_passes(s: &Siblings) -> bool {
    let loss = s.units.loss;
    let after = |roots: &[NodeId]| loss.is_some_and(|l| roots.iter().all(|&r| r > l));
    let before = |roots: &[NodeId]| loss.is_none_or(|l| roots.iter().all(|&r| r <= l));
    let same_pass =
        (after(&s.pa.roots) && after(&s.pb.roots)) || (before(&s.pa.roots) && before(&s.pb.roots));
    !same_pass
}

/// As [`fold_takes_in_an_accumulation`], for either sibling.
fn siblings_hold_an_accumulation(s: &Siblings) -> bool {
    (s.pa.roots.iter().chain(&s.pb.roots)).any(|&r| select::is_accumulation(s.g, r))
}

/// As [`fold_undoes_an_early_copy`], for either sibling: merged, the copy would run where the
/// other kernel runs, not where it is emitted.
fn siblings_hold_an_early_copy(s: &Siblings) -> bool {
    (s.pa.roots.iter().chain(&s.pb.roots)).any(|r| s.units.early.contains(r))
}

/// One reaches the other: they are not siblings, and merging them would make a cycle.
fn siblings_are_connected(s: &Siblings) -> bool {
    let (a, b, succ) = (s.a, s.b, &s.units.succ);
    succ[a].contains(&b) || succ[b].contains(&a) || s.units.reaches(a, b) || s.units.reaches(b, a)
}

/// See [`delays_more_than_it_saves`].
fn siblings_delay_more_than_they_save(s: &Siblings) -> bool {
    let shared_bytes: u64 = s.shared.iter().map(|&x| s.g.ty(x).bytes() as u64).sum();
    delays_more_than_it_saves(
        &s.units.succ,
        &s.units.pred,
        s.lib_flops,
        s.a,
        s.b,
        shared_bytes,
    )
}

/// Whether the kernel of `x` and `y` over `domain` would be a column reduction writing a
/// full-size output.
fn writes_full_size_from_a_column_reduction(
    g: &Graph,
    domain: &Domain,
    x: &Part,
    y: &Part,
) -> bool {
    is_column_reduction(domain) && [x, y].into_iter().any(|p| has_full_size_root(g, domain, p))
}

/// Whether `p` is a column reduction writing a full-size output (a fold, which
/// [`fold_writes_full_size_from_a_column_reduction`] lets make one, may have made it).
pub(super) fn column_with_full_roots(g: &Graph, p: &Part) -> bool {
    is_column_reduction(&p.domain) && has_full_size_root(g, &p.domain, p)
}

/// Whether some root of `p` has as many elements as `domain`.
fn has_full_size_root(g: &Graph, domain: &Domain, p: &Part) -> bool {
    let full: usize = domain.dims.iter().product();
    p.roots.iter().any(|&r| g.ty(r).shape.numel() == full)
}

/// Whether `domain` reduces over some axes but not its last one (a column reduction).
fn is_column_reduction(domain: &Domain) -> bool {
    match &domain.axes {
        Some(axes) => {
            let last = domain.dims.len().saturating_sub(1);
            !axes.is_empty() && !axes.contains(&last) && domain.dims[last] > 1
        }
        None => false,
    }
}

/// Whether merging a producer with roots `p` into a consumer with roots `c` would move backward
/// work (after `loss`) to the forward pass across a library call (`library`, in node order).
fn crosses_into_backward(
    loss: Option<NodeId>,
    library: &[NodeId],
    p: &[NodeId],
    c: &[NodeId],
) -> bool {
    let (Some(loss), Some(&p_last), Some(&c_first)) = (loss, p.iter().max(), c.iter().min()) else {
        return false;
    };
    p_last <= loss && c_first > loss && library.iter().any(|&l| l > p_last && l < c_first)
}

/// Whether merging sibling units `a` and `b` (neither reaching the other), which read
/// `shared_bytes` once instead of twice, may cost more than that read: where one of them gains
/// a library call among its ancestors (the other's data-gradient product, say), everything
/// reading it now waits for that call, and the library calls reading it (a weight gradient's
/// product) can no longer run beside the other's chain.
///
/// The read saved takes about `shared_bytes / bandwidth`; the overlap lost is at most those
/// library calls' time, about `flops / peak`. An H100's peak over its bandwidth is about 300
/// flops a byte in bf16 and 150 in TF32, so a merge that delays library calls is made only
/// where they do at most [`FLOPS_PER_BYTE_SAVED`] flops a byte read less. Measured on an H200
/// (session 12): merging GPT-2's recomputed GELU and LayerNorm outputs (read by the weight
/// gradients) into the kernels of the data gradients beside them made the TF32 step's
/// dependency-graph replay 1.6 ms slower (its parallel speedup over the serial chain fell from
/// 1.057 to 1.001), while the plain attention's probabilities merged into the scores' gradient
/// (12.9 GFLOP of product against 201 MB of scores) made the bf16 step 0.9 ms faster.
fn delays_more_than_it_saves(
    succ: &[BTreeSet<usize>],
    pred: &[BTreeSet<usize>],
    lib_flops: &[u64],
    a: usize,
    b: usize,
    shared_bytes: u64,
) -> bool {
    let groups = succ.len() - lib_flops.len();
    let most = shared_bytes.saturating_mul(FLOPS_PER_BYTE_SAVED);
    // The flops of the library calls reading `x`: what would wait, if anything does. Asked
    // first, since it needs no walk: most pairs have no heavy library reader at all.
    let readers_flops = |x: usize| -> u64 {
        (succ[x].iter())
            .filter(|&&u| u >= groups)
            .map(|&u| lib_flops[u - groups])
            .sum()
    };
    let (flops_a, flops_b) = (readers_flops(a), readers_flops(b));
    if flops_a <= most && flops_b <= most {
        return false;
    }
    let ancestors = |x: usize| {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<usize> = pred[x].iter().copied().collect();
        while let Some(u) = stack.pop() {
            if seen.insert(u) {
                stack.extend(pred[u].iter().copied());
            }
        }
        seen
    };
    // Whether `x`'s library readers would newly wait: a library call among the other's
    // ancestors that is not among `x`'s (a small kernel alone, a mask's, delays little).
    let (of_a, of_b) = (ancestors(a), ancestors(b));
    let waits = |before: &BTreeSet<usize>, other: &BTreeSet<usize>| {
        other.iter().any(|&q| q >= groups && !before.contains(&q))
    };
    (flops_a > most && waits(&of_a, &of_b)) || (flops_b > most && waits(&of_b, &of_a))
}

/// See [`delays_more_than_it_saves`].
const FLOPS_PER_BYTE_SAVED: u64 = 100;
