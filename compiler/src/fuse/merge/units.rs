//! The unit graph merging works on: groups and library calls as units, their dependence edges
//! both ways (kept up to date as units merge), a union-find from a group's first index to the
//! group it is part of now, and the [`Levels`] that prune path searches.

use super::part::Part;
use crate::fuse::kind::{kind, Kind};
use crate::fuse::select;
use crate::ir::{Graph, NodeId};
use std::collections::{BTreeSet, HashMap};

/// Groups and library nodes as the units of a dependence graph, while groups merge.
pub(super) struct Units {
    /// The groups by first index; `None` once merged into another.
    pub slots: Vec<Option<Part>>,
    /// Union-find over group indices.
    pub parent: Vec<usize>,
    /// Which unit produces a value.
    pub producers: Producers,
    /// Library nodes are units too (a path through a matmul is a path), after the groups.
    pub library: Vec<NodeId>,
    /// The step's loss, if it has one: what separates the forward pass from the backward.
    pub loss: Option<NodeId>,
    /// The updated leaf each new value is written over.
    pub leaf_of_value: HashMap<NodeId, NodeId>,
    /// The units reading each updated leaf.
    pub leaf_readers: HashMap<NodeId, Vec<usize>>,
    /// The unit graph's edges, both ways: `succ[p]` holds the units reading what `p` produces,
    /// and the writer of a leaf's new value after every reader of the leaf (anti-dependences).
    /// Kept up to date as units merge (rebuilding them after every merge made the pass quadratic).
    pub succ: Vec<BTreeSet<usize>>,
    pub pred: Vec<BTreeSet<usize>>,
    /// `None` if the unit graph has a cycle.
    pub levels: Option<Levels>,
    /// Slices copied early ([`crate::fuse::early`]): kernels of their own, merged into nothing.
    pub early: BTreeSet<NodeId>,
}

/// Which unit produces a value: what a group's loads and a library call's operands are looked
/// up in. Kept apart from [`Units`]' mutable parts, so that a lookup can run while a group is
/// borrowed.
pub(super) struct Producers {
    /// The group (its first index) of each root, by node index ([`NONE`] for a node that roots
    /// none): dense tables, since every load of every group is looked up here, and a hash
    /// table of a deep step's nodes is read at random (issue 53).
    group_of: Vec<u32>,
    /// The unit of each library node, by node index ([`NONE`] for the others).
    lib_unit: Vec<u32>,
}

/// No unit, in [`Producers`]' tables.
const NONE: u32 = u32::MAX;

impl Producers {
    /// The unit producing a materialized value, if any (leaves produce none).
    pub fn of(&self, g: &Graph, x: NodeId, parent: &mut [usize]) -> Option<usize> {
        let b = select::base(g, x).index();
        match self.lib_unit.get(b) {
            Some(&u) if u != NONE => return Some(u as usize),
            _ => {}
        }
        match self.group_of.get(b) {
            Some(&i) if i != NONE => Some(find(parent, i as usize)),
            _ => None,
        }
    }
}

/// The group that group `x` is part of now.
pub(super) fn find(parent: &mut [usize], mut x: usize) -> usize {
    while parent[x] != x {
        parent[x] = parent[parent[x]];
        x = parent[x];
    }
    x
}

impl Units {
    /// The unit graph of `slots` (one group each) and `g`'s library nodes.
    pub fn new(g: &Graph, slots: Vec<Option<Part>>, early: BTreeSet<NodeId>) -> Units {
        // Units of the dependence graph: groups and library nodes, keyed by a representative node.
        let unit = |i: usize| u32::try_from(i).expect("fewer than 2^32 - 1 units");
        let mut group_of = vec![NONE; g.len()];
        for (i, gr) in slots.iter().enumerate() {
            for &r in gr.iter().flat_map(|gr| &gr.roots) {
                group_of[r.index()] = unit(i);
            }
        }
        let mut parent: Vec<usize> = (0..slots.len()).collect();
        // Library nodes are units too (a path through a matmul is a path).
        let library: Vec<NodeId> = g
            .ids()
            .filter(|&id| kind(g.node(id)) == Kind::Library)
            .collect();
        let mut lib_unit = vec![NONE; g.len()];
        for (i, &id) in library.iter().enumerate() {
            lib_unit[id.index()] = unit(slots.len() + i);
        }
        let n_units = slots.len() + library.len();
        let loss = g.outputs.get(crate::autodiff::LOSS).copied();
        let producers = Producers { group_of, lib_unit };
        // The new values written over each updated leaf, and (filled below) the units reading it.
        let mut new_values: HashMap<NodeId, Vec<NodeId>> = HashMap::new();
        let mut leaf_of_value: HashMap<NodeId, NodeId> = HashMap::new();
        for up in &g.updates {
            new_values.entry(up.target).or_default().push(up.value);
            leaf_of_value.insert(select::base(g, up.value), up.target);
        }
        let mut leaf_readers: HashMap<NodeId, Vec<usize>> = HashMap::new();
        let mut succ: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n_units];
        let mut pred: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n_units];
        for u in 0..n_units {
            let inputs: Vec<NodeId> = if u < slots.len() {
                slots[u]
                    .as_ref()
                    .map_or_else(Vec::new, |s| s.loads.bases().collect())
            } else {
                g.node(library[u - slots.len()]).inputs.to_vec()
            };
            for x in inputs {
                if let Some(p) = producers.of(g, x, &mut parent) {
                    if p != u {
                        succ[p].insert(u);
                        pred[u].insert(p);
                    }
                }
                // Anti-dependences of in-place updates: a unit reading a parameter or state runs
                // before the unit writing its new value, so no merge may put a value that reader
                // needs into that writer (the schedule would have a cycle).
                let leaf = select::base(g, x);
                if new_values.contains_key(&leaf) {
                    leaf_readers.entry(leaf).or_default().push(u);
                }
                for &v in new_values.get(&leaf).into_iter().flatten() {
                    if let Some(w) = producers.of(g, v, &mut parent) {
                        if w != u {
                            succ[u].insert(w);
                            pred[w].insert(u);
                        }
                    }
                }
            }
        }
        let levels = Levels::of(&succ, &pred);
        Units {
            slots,
            parent,
            producers,
            library,
            loss,
            leaf_of_value,
            leaf_readers,
            succ,
            pred,
            levels,
            early,
        }
    }

    /// The unit producing `x` (see [`Producers::of`]).
    pub fn producer(&mut self, g: &Graph, x: NodeId) -> Option<usize> {
        self.producers.of(g, x, &mut self.parent)
    }

    /// Whether `to` is reachable from `from` by a path of at least two edges.
    pub fn reaches(&self, from: usize, to: usize) -> bool {
        reaches_avoiding(&self.succ, self.levels.as_ref(), from, to)
    }

    /// Records `p` folded into `c` as the group `merged`: p's readers now read c; p's and c's
    /// operands are the merged kernel's. `known`: decided without lowering (see [`super::merge`]).
    pub fn folded(&mut self, g: &Graph, p: usize, c: usize, known: bool, merged: Part) {
        let (succ, pred) = (&mut self.succ, &mut self.pred);
        self.parent[p] = c;
        for w in std::mem::take(&mut succ[p]) {
            pred[w].remove(&p);
            if w != c {
                succ[c].insert(w);
                pred[w].insert(c);
            }
        }
        let old_preds: Vec<usize> = std::mem::take(&mut pred[p])
            .into_iter()
            .chain(std::mem::take(&mut pred[c]))
            .collect();
        for &q in &old_preds {
            succ[q].remove(&p);
            succ[q].remove(&c);
        }
        if known {
            // The merged loads are both groups' loads less p's roots: the same producers.
            for q in old_preds {
                if q != p && q != c {
                    succ[q].insert(c);
                    pred[c].insert(q);
                }
            }
        } else {
            for x in merged.loads.bases() {
                if let Some(q) = self.producers.of(g, x, &mut self.parent) {
                    if q != c {
                        succ[q].insert(c);
                        pred[c].insert(q);
                    }
                }
            }
            // The readers of every leaf whose new value the merged kernel writes.
            for r in &merged.roots {
                let Some(leaf) = self.leaf_of_value.get(r) else {
                    continue;
                };
                for &q0 in self.leaf_readers.get(leaf).into_iter().flatten() {
                    let q = if q0 < self.slots.len() {
                        find(&mut self.parent, q0)
                    } else {
                        q0
                    };
                    if q != c {
                        succ[q].insert(c);
                        pred[c].insert(q);
                    }
                }
            }
        }
        self.slots[c] = Some(merged);
        self.relevel(c, p);
    }

    /// Records sibling `a` joined into `b`: `a`'s edges become `b`'s (the merged group itself
    /// is put in `b`'s slot by the caller).
    pub fn joined(&mut self, a: usize, b: usize) {
        let (succ, pred) = (&mut self.succ, &mut self.pred);
        self.slots[a] = None;
        self.parent[a] = b;
        for w in std::mem::take(&mut succ[a]) {
            pred[w].remove(&a);
            succ[b].insert(w);
            pred[w].insert(b);
        }
        for q in std::mem::take(&mut pred[a]) {
            succ[q].remove(&a);
            succ[q].insert(b);
            pred[b].insert(q);
        }
    }

    /// After unit `into` took over unit `other`'s edges: the levels follow.
    pub fn relevel(&mut self, into: usize, other: usize) {
        if let Some(l) = &mut self.levels {
            let other_level = l.0[other];
            l.merged(&self.succ, into, other_level);
        }
    }
}

/// Levels of the unit graph: every edge `u -> w` has `level[u] < level[w]`, so a search for a
/// path to `to` never needs to enter a unit at `to`'s level or above. Kept valid as units
/// merge ([`Levels::merged`]), which makes [`reaches_avoiding`] visit only the units between
/// the two ends instead of everything downstream of the first: on a chain of n units, O(n)
/// merges of O(1) searches rather than O(n) searches of O(n) units each.
pub(super) struct Levels(Vec<usize>);

impl Levels {
    /// Longest-path levels by Kahn's algorithm; `None` if the graph has a cycle (then no search
    /// is pruned).
    pub fn of(succ: &[BTreeSet<usize>], pred: &[BTreeSet<usize>]) -> Option<Levels> {
        let n = succ.len();
        let mut level = vec![0usize; n];
        let mut waiting: Vec<usize> = pred.iter().map(BTreeSet::len).collect();
        let mut ready: Vec<usize> = (0..n).filter(|&u| waiting[u] == 0).collect();
        let mut done = 0;
        while let Some(u) = ready.pop() {
            done += 1;
            for &w in &succ[u] {
                level[w] = level[w].max(level[u] + 1);
                waiting[w] -= 1;
                if waiting[w] == 0 {
                    ready.push(w);
                }
            }
        }
        (done == n).then_some(Levels(level))
    }

    /// After `into` took over another unit's edges (whose level was `other`): `into` is at
    /// least as deep as either, and every unit downstream is pushed below it where needed.
    pub fn merged(&mut self, succ: &[BTreeSet<usize>], into: usize, other: usize) {
        self.0[into] = self.0[into].max(other);
        let mut work = vec![into];
        while let Some(u) = work.pop() {
            for &w in &succ[u] {
                if self.0[w] <= self.0[u] {
                    self.0[w] = self.0[u] + 1;
                    work.push(w);
                }
            }
        }
    }
}

/// True if `to` is reachable from `from` by a path of at least two edges. With `levels`, units
/// at `to`'s level or deeper are not entered (no path from them can reach it).
pub(super) fn reaches_avoiding(
    succ: &[BTreeSet<usize>],
    levels: Option<&Levels>,
    from: usize,
    to: usize,
) -> bool {
    let shallow = |u: usize| levels.is_none_or(|l| l.0[u] < l.0[to]);
    let mut stack: Vec<usize> = succ[from]
        .iter()
        .copied()
        .filter(|&u| u != to && shallow(u))
        .collect();
    let mut seen = BTreeSet::new();
    while let Some(u) = stack.pop() {
        if seen.insert(u) {
            for &w in &succ[u] {
                if w == to {
                    return true;
                }
                if shallow(w) {
                    stack.push(w);
                }
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random DAGs as edge sets over `n` units, each edge from a lower to a higher unit.
    fn random_dag(seed: u64, n: usize) -> (Vec<BTreeSet<usize>>, Vec<BTreeSet<usize>>) {
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as usize
        };
        let (mut succ, mut pred) = (vec![BTreeSet::new(); n], vec![BTreeSet::new(); n]);
        for (w, into_w) in pred.iter_mut().enumerate().skip(1) {
            for _ in 0..next() % 3 {
                let u = next() % w;
                succ[u].insert(w);
                into_w.insert(u);
            }
        }
        (succ, pred)
    }

    fn levels_hold(l: &Levels, succ: &[BTreeSet<usize>], live: &[bool]) -> bool {
        (0..succ.len())
            .filter(|&u| live[u])
            .all(|u| succ[u].iter().all(|&w| l.0[u] < l.0[w]))
    }

    #[test]
    fn a_search_pruned_by_levels_finds_every_path_the_full_search_finds_through_merges() {
        for seed in 0..60 {
            let n = 40;
            let (mut succ, mut pred) = random_dag(seed, n);
            let mut levels = Levels::of(&succ, &pred).expect("a DAG");
            let mut live = vec![true; n];
            // Merge along edges that have no other path (as fusion does), checking each time
            // that the levels still increase along every edge and that the pruned search
            // answers as the full one does.
            for _ in 0..25 {
                let edges: Vec<(usize, usize)> = (0..n)
                    .filter(|&u| live[u])
                    .flat_map(|u| succ[u].iter().map(move |&w| (u, w)))
                    .collect();
                for &(a, b) in &edges {
                    for (from, to) in [(a, b), (b, a)] {
                        assert_eq!(
                            reaches_avoiding(&succ, Some(&levels), from, to),
                            reaches_avoiding(&succ, None, from, to),
                            "seed {seed}: {from} -> {to}"
                        );
                    }
                }
                let Some(&(p, c)) = edges
                    .iter()
                    .find(|&&(p, c)| !reaches_avoiding(&succ, None, p, c))
                else {
                    break;
                };
                // p into c: p's edges become c's.
                for w in std::mem::take(&mut succ[p]) {
                    pred[w].remove(&p);
                    if w != c {
                        succ[c].insert(w);
                        pred[w].insert(c);
                    }
                }
                for q in std::mem::take(&mut pred[p]) {
                    succ[q].remove(&p);
                    if q != c {
                        succ[q].insert(c);
                        pred[c].insert(q);
                    }
                }
                live[p] = false;
                let p_level = levels.0[p];
                levels.merged(&succ, c, p_level);
                assert!(levels_hold(&levels, &succ, &live), "seed {seed}");
            }
        }
    }

    #[test]
    fn a_cycle_gives_no_levels_and_the_search_then_prunes_nothing() {
        let succ = vec![
            BTreeSet::from([1]),
            BTreeSet::from([2]),
            BTreeSet::from([0]),
        ];
        let pred = vec![
            BTreeSet::from([2]),
            BTreeSet::from([0]),
            BTreeSet::from([1]),
        ];
        assert!(Levels::of(&succ, &pred).is_none());
        assert!(reaches_avoiding(&succ, None, 0, 2));
    }
}
