//! Step 4 of fusion: merging kernels. A producer group is folded into a consumer group that
//! reads its roots at their own index, then siblings merge (see the [module docs](super)).
//! [`part`] holds a group while merging (what its kernel would hold, so that a merge is weighed
//! before the merged group is lowered); [`units`] the graph of groups and library calls the
//! merges walk and keep up to date; [`rules`] the named reasons a merge is refused.

mod part;
mod rules;
mod units;

use super::bounds::MAX_KERNEL_REDUCTIONS;
use super::group::Group;
use super::index::Map;
use super::kind::{kind, Kind};
use super::lower::{lower, Domain, Lowered};
use super::rounds::lower_all;
use super::select;
use crate::error::IrError;
use crate::ir::{Graph, NodeId};
use ingot_kernels::fused::Access;
use part::{merged_scratch, Part};
use rules::{fold_refused, siblings_refused, Fold, Siblings};
use std::collections::{BTreeSet, HashMap};
use units::{find, Units};

/// The domain of a group made of `a`'s and `b`'s roots, if they iterate the same space.
fn merged_domain(a: &Domain, b: &Domain) -> Option<Domain> {
    if a.dims != b.dims {
        return None;
    }
    let axes = match (&a.axes, &b.axes) {
        (Some(x), Some(y)) if x != y => return None,
        (Some(x), _) | (_, Some(x)) => Some(x.clone()),
        (None, None) => None,
    };
    Some(Domain {
        dims: a.dims.clone(),
        axes,
    })
}

/// [`merge`] with merges decided without lowering where that is known to be safe; should a
/// group merged that way not lower at the end (which the reasoning in [`merge`] rules out), the
/// merge is redone lowering every candidate, so the result never depends on the shortcut.
pub(super) fn merged_groups(
    g: &Graph,
    mat: &[bool],
    groups: Vec<Group>,
    early: &BTreeSet<NodeId>,
) -> Result<Vec<Group>, IrError> {
    match merge(g, mat, groups, true, early) {
        Ok((groups, _)) => Ok(groups),
        Err(_) => {
            let groups = lower_all(g, mat).map_err(|_| {
                IrError::Invalid("fusion: groups that lowered once do not lower again".into())
            })?;
            Ok(merge(g, mat, groups, false, early)?.0)
        }
    }
}

/// Folds producer groups into consumer groups that read their roots (see the module docs).
///
/// Whether a merge is allowed is decided by lowering the merged group, except when the answer is
/// known without it: two purely elementwise groups (no reduce axes, no staged reduction) where
/// the consumer reads each of the producer's roots at the root's own index. Lowering the union
/// then expands exactly the (value, index) pairs the two lowerings expanded, with the
/// consumer's loads of the producer's roots replaced by the producer's own expansions, so it
/// succeeds and computes every producer root; the merged group's loads are the two groups'
/// loads less those. Such merges leave the lowering for the end, so that a chain of n
/// elementwise groups folded one by one costs O(n), not the O(n²) of lowering a growing group
/// after every merge. The merges made are the same either way.
pub(super) fn merge(
    g: &Graph,
    mat: &[bool],
    groups: Vec<Group>,
    shortcut: bool,
    early: &BTreeSet<NodeId>,
) -> Result<(Vec<Group>, usize), IrError> {
    let slots = groups.into_iter().map(|gr| Some(Part::of(g, gr))).collect();
    let mut units = Units::new(g, slots, early.clone());
    // The step's largest value: its plan holds at least this much at its peak.
    let largest = g.ids().map(|id| g.ty(id).bytes()).max().unwrap_or(0);
    let shortcuts = fold_producers(g, mat, shortcut, largest, &mut units);
    merge_siblings(g, mat, &mut units);
    Ok((lowered_groups(g, mat, units.slots)?, shortcuts))
}

/// Folds each producer, in order of its first root, into the first consumer it can join;
/// returns how many folds were decided without lowering.
///
/// A column reduction with full-size outputs that folds into a consumer whose first root comes
/// earlier (a batch norm's data gradient into its bias gradient `Σdy`, which autodiff makes
/// first) is a producer again at once: the loop has passed the consumer's place, and the
/// merged kernel may take in the other sums of its values (`Σdy·x̂`) the same way. Before
/// [`rules`] let such a kernel fold at all, no fold made one, so this changes no other merge.
fn fold_producers(g: &Graph, mat: &[bool], shortcut: bool, largest: usize, u: &mut Units) -> usize {
    let mut shortcuts = 0;
    for p0 in 0..u.slots.len() {
        let mut p = find(&mut u.parent, p0);
        if p != p0 || u.slots[p].is_none() {
            continue;
        }
        while let Some(c) = fold_once(g, mat, shortcut, largest, u, p, &mut shortcuts) {
            let again = c < p0
                && (u.slots[c].as_ref()).is_some_and(|m| rules::column_with_full_roots(g, m));
            if !again {
                break;
            }
            p = c;
        }
    }
    shortcuts
}

/// Folds `p` into the first consumer it can join; that consumer, where the fold was made.
fn fold_once(
    g: &Graph,
    mat: &[bool],
    shortcut: bool,
    largest: usize,
    u: &mut Units,
    p: usize,
    shortcuts: &mut usize,
) -> Option<usize> {
    for c in consumers(g, u, p) {
        if let Some(known) = try_fold(g, mat, shortcut, largest, u, p, c) {
            *shortcuts += usize::from(known);
            return Some(c);
        }
    }
    None
}

/// The groups `p` could fold into. Candidates read what p produces; an anti-dependence alone
/// makes none. A consumer the merge could never join (its reductions and p's over the limit)
/// is passed over before its loads are scanned: one kernel that loads thousands of cut
/// reductions is a successor of each of their producers.
fn consumers(g: &Graph, u: &mut Units, p: usize) -> Vec<usize> {
    let Some(pg) = u.slots[p].as_ref() else {
        return Vec::new();
    };
    u.succ[p]
        .iter()
        .copied()
        .filter(|&c| {
            c < u.slots.len()
                && u.slots[c].as_ref().is_some_and(|cg| {
                    pg.reductions + cg.reductions <= MAX_KERNEL_REDUCTIONS
                        && reads_roots_of(cg, pg, p, &mut |x| u.producers.of(g, x, &mut u.parent))
                })
        })
        .collect()
}

/// Folds `p` into `c` unless a rule refuses it or the merged group does not lower; `Some`
/// (whether the fold was decided without lowering) when made.
fn try_fold(
    g: &Graph,
    mat: &[bool],
    shortcut: bool,
    largest: usize,
    u: &mut Units,
    p: usize,
    c: usize,
) -> Option<bool> {
    let (Some(pg), Some(cg)) = (&u.slots[p], &u.slots[c]) else {
        return None;
    };
    let domain = merged_domain(&pg.domain, &cg.domain)?;
    let root_loads = loads_of_roots(cg, pg, p, &mut |x| u.producers.of(g, x, &mut u.parent));
    let saved = saved_bytes(g, &root_loads);
    let fold = Fold {
        g,
        units: u,
        p,
        c,
        pg,
        cg,
        domain: &domain,
        saved,
        largest,
    };
    if fold_refused(&fold) {
        return None;
    }
    let own_index = Map::identity(domain.dims.len()).access(&domain.dims, domain.dims.len());
    let known = shortcut
        && pg.elementwise
        && cg.elementwise
        && (root_loads.iter()).all(|(x, access)| select::base(g, *x) == *x && *access == own_index);
    let (pg, cg) = (
        u.slots[p].take().expect("checked above"),
        u.slots[c].take().expect("checked above"),
    );
    let merged = if known {
        appended(pg, cg, domain)
    } else {
        // The merged kernel must compute the producer's roots, not load them.
        let merged = lowered_union(g, mat, &pg, &cg, domain, |l| {
            !l.inputs.iter().any(|&x| u.producer(g, x) == Some(p))
        });
        let Some(merged) = merged else {
            u.slots[p] = Some(pg);
            u.slots[c] = Some(cg);
            return None;
        };
        merged
    };
    u.folded(g, p, c, known, merged);
    Some(known)
}

/// The group of `pg` folded into `cg`, both elementwise, where the fold is known to lower:
/// lowered at the end.
fn appended(mut pg: Part, mut cg: Part, domain: Domain) -> Part {
    let scratch = merged_scratch(&pg, &cg);
    // Append the smaller root list to the larger, sorting only at the end.
    let (mut roots, more) = if pg.roots.len() >= cg.roots.len() {
        (std::mem::take(&mut pg.roots), std::mem::take(&mut cg.roots))
    } else {
        (std::mem::take(&mut cg.roots), std::mem::take(&mut pg.roots))
    };
    roots.extend(more);
    // The loads too, without taking out the consumer's reads of p's roots: after
    // the merge those map to the merged group itself and make no edge, and a
    // group that absorbs thousands of small producers is not rescanned at each.
    let mut loads = std::mem::take(&mut pg.loads);
    loads.absorb(std::mem::take(&mut cg.loads));
    Part {
        roots,
        domain,
        lowered: None,
        loads,
        elementwise: true,
        reductions: 0,
        scratch,
        body: pg.body + cg.body,
    }
}

/// The bytes a fold saves: each value of the producer that the consumer loads (once per
/// value, however many loads read it), which the merged kernel computes instead of reading.
fn saved_bytes(g: &Graph, root_loads: &[(NodeId, Access)]) -> usize {
    let mut values: Vec<NodeId> = root_loads
        .iter()
        .map(|(x, _)| select::base(g, *x))
        .collect();
    values.sort();
    values.dedup();
    values.iter().map(|&x| g.ty(x).bytes()).sum()
}

/// Siblings: two kernels of one pass over the same domain that read a full-size value at
/// the same index, neither reaching the other, become one kernel that reads it once.
/// GPT-2's plain attention backward recomputes the probabilities twice from the scores:
/// once for the product with the output's gradient, once inside the scores' gradient.
fn merge_siblings(g: &Graph, mat: &[bool], u: &mut Units) {
    let lib_flops: Vec<u64> = u
        .library
        .iter()
        .map(|&id| crate::flops::of_node(g, id))
        .collect();
    let mut readers = Readers::of(g, &u.slots);
    let mut candidates: BTreeSet<usize> = BTreeSet::new();
    for b0 in 0..u.slots.len() {
        let b = find(&mut u.parent, b0);
        if b != b0 || u.slots[b].is_none() {
            continue;
        }
        // The earlier groups sharing a computed load with `b`, tried from the nearest down as
        // before; a merge adds those sharing one with what `b` took in, below the one taken.
        candidates.clear();
        if let Some(pb) = &u.slots[b] {
            readers.sharing(pb, b0, &mut u.parent, &mut candidates);
        }
        while let Some(a0) = candidates.pop_last() {
            let a = find(&mut u.parent, a0);
            if a != a0 || a == b {
                continue;
            }
            let Some(merged) = sibling_merge(g, mat, u, &lib_flops, a, b) else {
                continue;
            };
            u.joined(a, b);
            readers.add(&merged, b);
            readers.sharing(&merged, a0, &mut u.parent, &mut candidates);
            u.slots[b] = Some(merged);
            u.relevel(b, a);
        }
    }
}

/// The group of siblings `a` and `b` merged, unless a rule refuses it or it does not lower.
fn sibling_merge(
    g: &Graph,
    mat: &[bool],
    u: &Units,
    lib_flops: &[u64],
    a: usize,
    b: usize,
) -> Option<Part> {
    let (Some(pa), Some(pb)) = (&u.slots[a], &u.slots[b]) else {
        return None;
    };
    let domain = merged_domain(&pa.domain, &pb.domain)?;
    let full: usize = domain.dims.iter().product();
    let mut shared: Vec<NodeId> = (pa.loads.iter())
        .filter(|(x, access)| {
            g.ty(*x).shape.numel() == full
                && !matches!(kind(g.node(select::base(g, *x))), Kind::Leaf)
                && (pb.loads.of_base(select::base(g, *x)))
                    .iter()
                    .any(|(y, other)| y == x && other == access)
        })
        .map(|(x, _)| *x)
        .collect();
    shared.sort();
    shared.dedup();
    let siblings = Siblings {
        g,
        units: u,
        a,
        b,
        pa,
        pb,
        domain: &domain,
        shared: &shared,
        lib_flops,
    };
    if siblings_refused(&siblings) {
        return None;
    }
    lowered_union(g, mat, pa, pb, domain, |_| true)
}

/// The group of `x`'s and `y`'s roots over `domain`, lowered, if it lowers within
/// [`MAX_KERNEL_REDUCTIONS`] and `accept` takes its lowering.
fn lowered_union(
    g: &Graph,
    mat: &[bool],
    x: &Part,
    y: &Part,
    domain: Domain,
    mut accept: impl FnMut(&Lowered) -> bool,
) -> Option<Part> {
    let mut roots: Vec<NodeId> = x.roots.iter().chain(&y.roots).copied().collect();
    roots.sort();
    let lowered = lower(g, mat, &roots, &domain)
        .ok()
        .filter(|l| l.kernel.reductions() <= MAX_KERNEL_REDUCTIONS && accept(l))?;
    Some(Part::of(
        g,
        Group {
            roots,
            domain,
            lowered,
        },
    ))
}

/// Which groups read each computed value: a sibling shares a load with `b`, so only these
/// are looked at (trying every earlier group for every group was quadratic in depth). Kept
/// a superset as groups merge: entries name a group or one merged into another since.
/// Only full-size reads count (what a sibling merge saves), so a small value every group
/// reads (a scalar of the optimizer's) does not make every group a candidate.
struct Readers<'g> {
    g: &'g Graph,
    of_value: HashMap<NodeId, Vec<usize>>,
}

impl<'g> Readers<'g> {
    fn of(g: &'g Graph, slots: &[Option<Part>]) -> Readers<'g> {
        let mut readers = Readers {
            g,
            of_value: HashMap::new(),
        };
        for (i, slot) in slots.iter().enumerate() {
            if let Some(part) = slot {
                readers.add(part, i);
            }
        }
        readers
    }

    /// The computed values `part` reads at full size.
    fn full_reads(&self, part: &Part) -> Vec<NodeId> {
        let g = self.g;
        let full: usize = part.domain.dims.iter().product();
        (part.loads.0.iter())
            .filter(|(base, loads)| {
                !matches!(kind(g.node(**base)), Kind::Leaf)
                    && loads.iter().any(|(x, _)| g.ty(*x).shape.numel() == full)
            })
            .map(|(base, _)| *base)
            .collect()
    }

    /// Records that group `i` reads what `part` reads.
    fn add(&mut self, part: &Part, i: usize) {
        for x in self.full_reads(part) {
            self.of_value.entry(x).or_default().push(i);
        }
    }

    /// Adds to `out` the groups below `below` that read a value `part` reads at full size.
    fn sharing(&self, part: &Part, below: usize, parent: &mut [usize], out: &mut BTreeSet<usize>) {
        for x in self.full_reads(part) {
            for &r0 in self.of_value.get(&x).into_iter().flatten() {
                let r = find(parent, r0);
                if r < below {
                    out.insert(r);
                }
            }
        }
    }
}

/// The merged groups, each lowered: those merged without lowering now.
fn lowered_groups(
    g: &Graph,
    mat: &[bool],
    slots: Vec<Option<Part>>,
) -> Result<Vec<Group>, IrError> {
    slots
        .into_iter()
        .flatten()
        .map(|mut part| {
            let lowered = match part.lowered {
                Some(l) => l,
                None => {
                    part.roots.sort();
                    lower(g, mat, &part.roots, &part.domain).map_err(|cuts| {
                        IrError::Invalid(format!(
                            "fusion: a merged elementwise kernel does not lower (cuts {cuts:?}; a bug: please report it)"
                        ))
                    })?
                }
            };
            Ok(Group {
                roots: part.roots,
                domain: part.domain,
                lowered,
            })
        })
        .collect()
}

/// Whether `c` loads a value `p` (unit `p_unit`) produces: `p`'s roots looked up among `c`'s
/// loads, or `c`'s loaded values asked for their producer, whichever list is shorter.
fn reads_roots_of(
    c: &Part,
    p: &Part,
    p_unit: usize,
    producer: &mut dyn FnMut(NodeId) -> Option<usize>,
) -> bool {
    if p.roots.len() <= c.loads.0.len() {
        p.roots.iter().any(|r| c.loads.0.contains_key(r))
    } else {
        c.loads.bases().any(|b| producer(b) == Some(p_unit))
    }
}

/// The loads of `c` that read values `p` (unit `p_unit`) produces.
fn loads_of_roots(
    c: &Part,
    p: &Part,
    p_unit: usize,
    producer: &mut dyn FnMut(NodeId) -> Option<usize>,
) -> Vec<(NodeId, Access)> {
    let bases: Vec<NodeId> = if p.roots.len() <= c.loads.0.len() {
        p.roots.clone()
    } else {
        c.loads
            .bases()
            .filter(|&b| producer(b) == Some(p_unit))
            .collect()
    };
    bases
        .into_iter()
        .flat_map(|b| c.loads.of_base(b).iter().cloned())
        .collect()
}
