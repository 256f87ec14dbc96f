//! DAG-aware extraction: one e-node per needed e-class, chosen so that the bytes the step
//! materializes are small.
//!
//! egg's [`egg::Extractor`] sums the costs of a term's children, so a class used twice counts
//! twice. In a training step almost everything is shared (forward values feed the backward pass),
//! so that cost is badly wrong. Here the cost of choosing an e-node is the *set* of e-classes it
//! needs, transitively, each counted once (extraction-gym's "greedy DAG" objective): a class's
//! best choice is the e-node whose own cost plus the costs of the union of its children's sets is
//! smallest. Ties go to the smaller set, then to the first e-node in egg's (sorted) order, so the
//! result is deterministic.
//!
//! Costs are the bytes an e-node would materialize: its result's bytes, except that views
//! (`reshape`, `stop_gradient`) and leaves cost nothing and constants (`full`, `iota`, a
//! `broadcast` of a constant) cost 1, since fusion inlines them.
//!
//! The e-graph may have cycles (`x * 1` lives in `x`'s own class). Classes are decided in order of
//! the height of their shallowest term, each among its e-nodes whose children are all strictly
//! lower, which cannot cycle and leaves every child decided before its parents
//! (`ranked`). Every rule rewrites towards shallower terms, so the restriction loses nothing
//! the rules offer. Two candidates are compared by the classes only one of them needs, found by
//! a search that stops where the two terms meet, so the extraction costs about the size of the
//! e-graph plus the regions where alternatives differ, not its square. (Until 2026-11 the sets
//! were bitsets over all classes, refreshed by a worklist: quadratic time and memory, 13 s for
//! the 48-layer gpt2 shape; its choices were identical on every reference model and on the
//! 48-layer shape.)

use super::analysis::{numel, Data, EGraph};
use super::lang::{ENode, Kind};
use crate::ir::TensorType;
use egg::Id;
use smallvec::SmallVec;
use std::fmt;

/// How the e-nodes were chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// The DAG extraction (the default).
    Dag,
    /// For each class, its shallowest e-node (then the cheapest): the tree-free baseline the
    /// DAG extraction is measured against.
    Shallowest,
}

/// The chosen e-node (children canonical) of every class reachable from the roots.
pub struct Extraction {
    pub choice: Choice,
    pub method: Method,
}

/// The chosen e-node of each extracted class, by class id: a slot per id (egg's ids are dense,
/// below the number of e-nodes ever added) into a list of the choices, instead of a hash map.
/// At 200 layers of a narrow GPT a hundred thousand classes are looked up at random by
/// [`super::simplify`]'s emission; a slot costs one read where a hash map hashed the id and
/// grew by rehashing into fresh pages (issue 53).
#[derive(Clone, Default)]
pub struct Choice {
    /// `slot[id]` is the position of class `id`'s choice in `nodes`, `u32::MAX` for none.
    slot: Vec<u32>,
    nodes: Vec<(Id, ENode)>,
}

impl Choice {
    /// An empty choice for class ids below `ids`.
    fn with_ids(ids: usize) -> Choice {
        Choice {
            slot: vec![u32::MAX; ids],
            nodes: Vec::new(),
        }
    }

    /// Records `node` as class `id`'s choice (the first recorded stays).
    fn insert(&mut self, id: Id, node: ENode) {
        let i = usize::from(id);
        if i >= self.slot.len() {
            self.slot.resize(i + 1, u32::MAX);
        }
        if self.slot[i] == u32::MAX {
            self.slot[i] = self.nodes.len() as u32;
            self.nodes.push((id, node));
        }
    }

    fn contains_key(&self, id: &Id) -> bool {
        self.slot
            .get(usize::from(*id))
            .is_some_and(|&s| s != u32::MAX)
    }

    /// Class `id`'s chosen e-node, if it was extracted.
    pub fn get(&self, id: &Id) -> Option<&ENode> {
        let s = *self.slot.get(usize::from(*id))?;
        self.nodes.get(s as usize).map(|(_, n)| n)
    }

    /// How many classes were extracted.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when no class was extracted.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The extracted classes, in the order they were reached (not sorted).
    pub fn keys(&self) -> impl Iterator<Item = &Id> + '_ {
        self.nodes.iter().map(|(id, _)| id)
    }

    /// The extracted classes and their e-nodes, in increasing class id.
    pub fn sorted(&self) -> Vec<(Id, &ENode)> {
        let mut v: Vec<(Id, &ENode)> = self.nodes.iter().map(|(id, n)| (*id, n)).collect();
        v.sort_unstable_by_key(|&(id, _)| id);
        v
    }
}

impl std::ops::Index<&Id> for Choice {
    type Output = ENode;

    fn index(&self, id: &Id) -> &ENode {
        self.get(id)
            .unwrap_or_else(|| panic!("e-class {id} was not extracted"))
    }
}

/// Two choices are equal when they choose the same e-node for the same classes, whatever the
/// order they were reached in (as two hash maps compare).
impl PartialEq for Choice {
    fn eq(&self, other: &Choice) -> bool {
        self.len() == other.len() && (self.nodes.iter()).all(|(id, n)| other.get(id) == Some(n))
    }
}

impl fmt::Debug for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.sorted()).finish()
    }
}

struct CNode {
    cost: u64,
    children: SmallVec<[u32; 3]>,
    /// Position in the class's node list.
    index: usize,
}

/// Every class's candidate e-nodes, by dense class number: one flat list cut at offsets
/// (compressed rows) rather than a vector per class, so that the passes below read them in
/// order from one allocation (a hundred thousand classes at 200 layers of a narrow GPT, each
/// its own allocation before: issue 53).
struct CNodes {
    /// Class `c`'s e-nodes are `nodes[start[c]..start[c + 1]]`.
    start: Vec<u32>,
    nodes: Vec<CNode>,
}

impl CNodes {
    fn len(&self) -> usize {
        self.start.len() - 1
    }

    /// The position of class `c`'s first e-node in the flat list.
    fn first(&self, c: usize) -> usize {
        self.start[c] as usize
    }

    fn iter(&self) -> impl Iterator<Item = &[CNode]> + '_ {
        (0..self.len()).map(|c| &self[c])
    }
}

impl std::ops::Index<usize> for CNodes {
    type Output = [CNode];

    fn index(&self, c: usize) -> &[CNode] {
        &self.nodes[self.start[c] as usize..self.start[c + 1] as usize]
    }
}

/// What an e-node of class `class` costs by itself.
pub fn node_cost(eg: &EGraph, class: Id, node: &ENode) -> u64 {
    let constant = |a: Id| eg[a].data.constant.is_some();
    cost_of(&eg[class].data.ty, node, constant)
}

/// [`node_cost`] of an e-node whose class has type `t`, where `constant` tells whether a class
/// has a known constant.
fn cost_of(t: &TensorType, node: &ENode, constant: impl Fn(Id) -> bool) -> u64 {
    match &node.kind {
        Kind::Leaf(_) | Kind::Reshape(_) | Kind::StopGradient => 0,
        Kind::Full { .. } | Kind::Iota { .. } => 1,
        Kind::Broadcast(_) if constant(node.args[0]) => 1,
        _ => numel(t.shape.dims())
            .and_then(|n| n.checked_mul(t.dtype.size()))
            .map_or(u64::MAX / 4, |b| b as u64)
            .max(1),
    }
}

/// Extracts a term for every class reachable from `roots`. Fails only when some root has no
/// finite, acyclic term (which the e-graph of a verified graph always has).
pub fn extract(eg: &EGraph, roots: &[Id]) -> Result<Extraction, String> {
    extract_with(eg, roots, None)
}

/// As [`extract`], with the method forced (for tests); `None` chooses as [`extract`] does.
pub fn extract_with(
    eg: &EGraph,
    roots: &[Id],
    force: Option<Method>,
) -> Result<Extraction, String> {
    // The classes in id order, read through this list rather than `eg[id]` (a hash lookup each
    // time, at random in a table larger than the cache at depth: issue 53).
    let mut classes: Vec<&egg::EClass<ENode, Data>> = eg.classes().collect();
    classes.sort_unstable_by_key(|c| c.id);
    let ids: Vec<Id> = classes.iter().map(|c| c.id).collect();
    let mut dense = vec![u32::MAX; eg.nodes().len()];
    for (i, &id) in ids.iter().enumerate() {
        dense[usize::from(id)] = i as u32;
    }
    let dense_of = |id: Id| dense[usize::from(eg.find(id))];
    let constant = |a: Id| classes[dense_of(a) as usize].data.constant.is_some();
    let mut cnodes = CNodes {
        start: Vec::with_capacity(ids.len() + 1),
        nodes: Vec::with_capacity(eg.total_size()),
    };
    cnodes.start.push(0);
    for class in &classes {
        let nodes = (class.nodes.iter().enumerate())
            // A leaf's class is the leaf: nothing else may stand for a step's input.
            .filter(|(_, n)| class.data.leaf.is_none() || matches!(n.kind, Kind::Leaf(_)))
            .map(|(index, n)| CNode {
                cost: cost_of(&class.data.ty, n, constant),
                children: n.args.iter().map(|&a| dense_of(a)).collect(),
                index,
            });
        cnodes.nodes.extend(nodes);
        cnodes.start.push(cnodes.nodes.len() as u32);
    }
    let root_dense: Vec<u32> = roots.iter().map(|&r| dense_of(r)).collect();

    let method = force.unwrap_or(Method::Dag);
    let h = heights(&cnodes);
    let choice = match method {
        Method::Dag => ranked(&cnodes, &h),
        Method::Shallowest => shallowest(&cnodes, &h),
    };
    // Both methods take only e-nodes whose children are strictly lower than their class, so the
    // choice cannot cycle; checked anyway, since emitting a cycle would loop.
    if !acyclic_from(&cnodes, &choice, &root_dense) {
        return Err("extraction chose a cycle among height-decreasing e-nodes (a bug)".into());
    }

    // Collect the reachable classes' e-nodes.
    let mut out = Choice::with_ids(eg.nodes().len());
    let mut stack: Vec<u32> = root_dense.clone();
    while let Some(c) = stack.pop() {
        let id = ids[c as usize];
        if out.contains_key(&id) {
            continue;
        }
        let class = classes[c as usize];
        let Some(ni) = choice[c as usize] else {
            return Err(format!(
                "e-class {id} has no finite term (its e-nodes: {:?})",
                class.nodes
            ));
        };
        let cn = &cnodes[c as usize][ni];
        let node = class.nodes[cn.index].clone();
        let node = ENode {
            kind: node.kind,
            args: node.args.iter().map(|&a| eg.find(a)).collect(),
        };
        stack.extend(cn.children.iter().copied());
        out.insert(id, node);
    }
    Ok(Extraction {
        choice: out,
        method,
    })
}

/// For each class, among its e-nodes whose children are all strictly lower than itself, the
/// shallowest, then the cheapest, then the first.
fn shallowest(cnodes: &CNodes, h: &[u32]) -> Vec<Option<usize>> {
    cnodes
        .iter()
        .enumerate()
        .map(|(c, nodes)| {
            nodes
                .iter()
                .enumerate()
                .filter(|(_, n)| n.children.iter().all(|&d| h[d as usize] < h[c]))
                .min_by_key(|(ni, n)| {
                    let depth = n.children.iter().map(|&d| h[d as usize] + 1).max();
                    (depth.unwrap_or(0), n.cost, *ni)
                })
                .map(|(ni, _)| ni)
        })
        .collect()
}

/// True when following the chosen e-nodes from the roots never returns to a class on the path
/// (and every reached class has a choice).
fn acyclic_from(cnodes: &CNodes, choice: &[Option<usize>], roots: &[u32]) -> bool {
    // 0 = unvisited, 1 = on the path, 2 = done.
    let mut color = vec![0u8; cnodes.len()];
    for &r in roots {
        if color[r as usize] != 0 {
            continue;
        }
        let mut stack: Vec<(u32, usize)> = vec![(r, 0)];
        color[r as usize] = 1;
        while let Some((c, next)) = stack.pop() {
            let Some(ni) = choice[c as usize] else {
                return false;
            };
            let children = &cnodes[c as usize][ni].children;
            if let Some(&d) = children.get(next) {
                stack.push((c, next + 1));
                match color[d as usize] {
                    0 => {
                        color[d as usize] = 1;
                        stack.push((d, 0));
                    }
                    1 => return false,
                    _ => {}
                }
            } else {
                color[c as usize] = 2;
            }
        }
    }
    true
}

/// The height of each class's shallowest term (`u32::MAX` for a class with none), by a worklist
/// in increasing height (Knuth's generalization of Dijkstra): a class is final when popped, and an
/// e-node becomes available once all its children are final. Linear in the e-nodes (and a
/// logarithm for the queue), whatever order the classes are numbered in.
fn heights(cnodes: &CNodes) -> Vec<u32> {
    let n = cnodes.len();
    let mut h = vec![u32::MAX; n];
    // For each class, the (class, node index) pairs that have it as a child, once per child
    // slot, in class order: class d's are `parents[first[d]..first[d + 1]]` (compressed rows).
    let mut first = vec![0u32; n + 1];
    for node in &cnodes.nodes {
        for &d in &node.children {
            first[d as usize + 1] += 1;
        }
    }
    for d in 0..n {
        first[d + 1] += first[d];
    }
    let mut next: Vec<u32> = first[..n].to_vec();
    let mut parents = vec![(0u32, 0u32); first[n] as usize];
    // The children of each e-node (by its position in the flat list) not yet final.
    let mut missing: Vec<u32> = Vec::with_capacity(cnodes.nodes.len());
    let mut heap = std::collections::BinaryHeap::new();
    for (c, nodes) in cnodes.iter().enumerate() {
        for (ni, node) in nodes.iter().enumerate() {
            for &d in &node.children {
                parents[next[d as usize] as usize] = (c as u32, ni as u32);
                next[d as usize] += 1;
            }
            missing.push(node.children.len() as u32);
            if node.children.is_empty() {
                heap.push(std::cmp::Reverse((0u32, c as u32)));
            }
        }
    }
    drop(next);
    let mut done = vec![false; n];
    let mut best = vec![u32::MAX; n];
    while let Some(std::cmp::Reverse((hc, c))) = heap.pop() {
        let c = c as usize;
        if done[c] {
            continue;
        }
        done[c] = true;
        h[c] = hc;
        for &(p, ni) in &parents[first[c] as usize..first[c + 1] as usize] {
            let (p, ni) = (p as usize, ni as usize);
            let m = &mut missing[cnodes.first(p) + ni];
            *m -= 1;
            if *m == 0 && !done[p] {
                let hp = cnodes[p][ni]
                    .children
                    .iter()
                    .map(|&d| h[d as usize])
                    .max()
                    .unwrap_or(0)
                    .saturating_add(1);
                if hp < best[p] {
                    best[p] = hp;
                    heap.push(std::cmp::Reverse((hp, p as u32)));
                }
            }
        }
    }
    h
}

/// The DAG extraction by rank: classes are decided in increasing height, each among its e-nodes
/// whose children are all strictly lower (so decided already, and no choice can cycle). Two
/// candidates are compared by the classes only one of them needs: a search from both
/// candidates' children, down the chosen e-nodes in decreasing (height, class) order, that stops
/// as soon as every class still pending is needed by both. Two shortcuts keep that walk out of
/// what both terms share: a class one candidate needs, whose every reader is that candidate's
/// alone, is counted at once (a transpose that only one of two matmul forms reads: without it,
/// telling them apart walked the whole forward pass below, and the narrow 200-layer GPT's
/// extraction took a fifth of its compile time); and the walk stops once one side's most
/// (bounded by its pending classes' costs counted as trees) is below the other's least. The
/// cost of a comparison is the region where the two terms differ, not the size of the graph,
/// so the whole extraction is near-linear when alternatives are local (as every rewrite rule
/// makes them).
///
/// The objective is the greedy DAG extraction's: a candidate's e-node cost plus the costs of
/// the classes it needs, each once; ties go to the smaller set, then to the first e-node.
fn ranked(cnodes: &CNodes, h: &[u32]) -> Vec<Option<usize>> {
    let n = cnodes.len();
    let mut order: Vec<u32> = (0..n as u32)
        .filter(|&c| h[c as usize] != u32::MAX)
        .collect();
    order.sort_unstable_by_key(|&c| (h[c as usize], c));
    let mut choice: Vec<Option<usize>> = vec![None; n];
    let mut own = vec![0u64; n];
    // A chosen term's cost counted as a tree (shared classes once per use, saturating): more
    // than the classes it needs cost, so a bound for the comparisons' early stop.
    let mut tree = vec![0u64; n];
    // For each decided class, the decided classes whose chosen e-node reads it.
    let mut users: Vec<SmallVec<[u32; 2]>> = vec![SmallVec::new(); n];
    let mut search = SymDiff::new(n);
    for &c in &order {
        let c = c as usize;
        let mut best: Option<usize> = None;
        for (ni, node) in cnodes[c].iter().enumerate() {
            if !node.children.iter().all(|&d| h[d as usize] < h[c]) {
                continue;
            }
            best = match best {
                None => Some(ni),
                Some(bi) => {
                    let b = &cnodes[c][bi];
                    let (new, old) = search.run(
                        Decided {
                            cnodes,
                            choice: &choice,
                            own: &own,
                            tree: &tree,
                            users: &users,
                            h,
                        },
                        (node.cost, &node.children),
                        (b.cost, &b.children),
                    );
                    Some(if new < old { ni } else { bi })
                }
            };
        }
        if let Some(ni) = best {
            let node = &cnodes[c][ni];
            choice[c] = Some(ni);
            own[c] = node.cost;
            tree[c] = node
                .children
                .iter()
                .fold(node.cost, |t, &d| t.saturating_add(tree[d as usize]));
            for &d in &node.children {
                if users[d as usize].last() != Some(&(c as u32)) {
                    users[d as usize].push(c as u32);
                }
            }
        }
    }
    choice
}

/// What [`ranked`] has decided so far, which a comparison walks.
struct Decided<'a> {
    cnodes: &'a CNodes,
    choice: &'a [Option<usize>],
    /// The chosen e-node's own cost, and its cost counted as a tree (saturating).
    own: &'a [u64],
    tree: &'a [u64],
    /// The decided classes whose chosen e-node reads each class.
    users: &'a [SmallVec<[u32; 2]>],
    h: &'a [u32],
}

/// A class with more decided users than this is not tested for [`SymDiff`]'s early finish
/// (testing costs a look at each user, every time the class is reached).
const USERS_TESTED: usize = 8;

/// Scratch space of [`ranked`]'s comparisons, reused so that each costs only what it visits.
struct SymDiff {
    /// Bit 1: needed by the first candidate, bit 2: by the second (0 = not reached); bit 4:
    /// finished (its marks are final and counted).
    mark: Vec<u8>,
    touched: Vec<u32>,
    heap: std::collections::BinaryHeap<(u32, u32)>,
    /// Classes reached by one candidate, to test whether they can be finished early.
    fresh: Vec<u32>,
}

const DONE: u8 = 4;

impl SymDiff {
    fn new(n: usize) -> SymDiff {
        SymDiff {
            mark: vec![0; n],
            touched: Vec::new(),
            heap: std::collections::BinaryHeap::new(),
            fresh: Vec::new(),
        }
    }

    /// Marks `d` as needed by the candidates in `m`.
    fn reach(&mut self, dec: &Decided, d: u32, m: u8, pending: &mut [Pending; 2]) {
        let old = self.mark[d as usize];
        let new = old | m;
        if old == new {
            return;
        }
        self.mark[d as usize] = new;
        if old == 0 {
            self.touched.push(d);
            self.heap.push((dec.h[d as usize], d));
            if new != 3 {
                pending[usize::from(new - 1)].add(dec.tree[d as usize]);
                self.fresh.push(d);
            }
        } else {
            // It was pending with one bit and now has both.
            pending[usize::from(old - 1)].remove(dec.tree[d as usize]);
        }
    }

    /// Counts a class whose marks are final: its own cost goes to the one candidate that needs
    /// it alone, if one does, and its chosen e-node's children are reached with its marks.
    fn finish(
        &mut self,
        dec: &Decided,
        d: u32,
        only: &mut [(u128, u32); 2],
        pending: &mut [Pending; 2],
    ) {
        let m = self.mark[d as usize];
        self.mark[d as usize] = m | DONE;
        if m != 3 {
            let side = usize::from(m - 1);
            pending[side].remove(dec.tree[d as usize]);
            only[side].0 += u128::from(dec.own[d as usize]);
            only[side].1 += 1;
        }
        if let Some(ni) = dec.choice[d as usize] {
            for &e in &dec.cnodes[d as usize][ni].children {
                self.reach(dec, e, m, pending);
                if m != 3 {
                    // Its user is now finished with one mark: it may be finishable too.
                    self.fresh.push(e);
                }
            }
        }
    }

    /// Whether `d`'s marks are final before the walk gets down to it: it is needed by one
    /// candidate only, and every decided class that reads it is finished with that same
    /// candidate alone (so no path from the other candidate can reach it).
    fn finishable(&self, dec: &Decided, d: u32) -> bool {
        let m = self.mark[d as usize];
        let users = &dec.users[d as usize];
        (m == 1 || m == 2)
            && users.len() <= USERS_TESTED
            && users.iter().all(|&u| self.mark[u as usize] == m | DONE)
    }

    /// Each candidate's (cost, count): its own cost plus the costs of the classes only its
    /// children need, and how many those are, following the chosen e-nodes (every class below
    /// a candidate is decided). The figures are exact, or far enough along that comparing them
    /// gives the exact figures' answer (see the early stop below).
    fn run(
        &mut self,
        dec: Decided,
        (a_cost, a): (u64, &[u32]),
        (b_cost, b): (u64, &[u32]),
    ) -> ((u128, u32), (u128, u32)) {
        let mut only = [(u128::from(a_cost), 0u32), (u128::from(b_cost), 0u32)];
        let mut pending = [Pending::default(), Pending::default()];
        for &d in a {
            self.reach(&dec, d, 1, &mut pending);
        }
        for &d in b {
            self.reach(&dec, d, 2, &mut pending);
        }
        while pending[0].entries + pending[1].entries > 0 {
            // A class only one candidate needs, whose every reader is finished and needed by
            // that candidate alone, is that candidate's alone: count it now, not when the walk
            // down everything the two share gets to it. (A transpose that only the candidate
            // not using a transposed operand reads, for one: without this, comparing the two
            // walks the whole forward pass below them.)
            if let Some(d) = self.fresh.pop() {
                if self.mark[d as usize] & DONE == 0 && self.finishable(&dec, d) {
                    self.finish(&dec, d, &mut only, &mut pending);
                }
                continue;
            }
            // The comparison may be decided before the search ends: a side's figure can grow
            // by at most its pending entries' tree costs, and the other's only grows. Once one
            // side's most is below the other's least, the caller's comparison of the partial
            // figures gives the exact figures' answer.
            let below =
                |s: usize, t: usize| pending[s].most().is_some_and(|p| only[s].0 + p < only[t].0);
            if below(0, 1) || below(1, 0) {
                break;
            }
            let Some((_, d)) = self.heap.pop() else {
                break;
            };
            if self.mark[d as usize] & DONE == 0 {
                self.finish(&dec, d, &mut only, &mut pending);
            }
        }
        self.heap.clear();
        self.fresh.clear();
        for d in self.touched.drain(..) {
            self.mark[d as usize] = 0;
        }
        (only[0], only[1])
    }
}

/// One candidate's entries in a [`SymDiff`] search that only it needs so far, not yet expanded.
#[derive(Default)]
struct Pending {
    entries: usize,
    /// The sum of their tree costs, leaving out those too large to count ...
    tree_cost: u128,
    /// ... which are counted here (while there are any, nothing bounds what the entries add).
    unbounded: usize,
}

impl Pending {
    fn add(&mut self, tree: u64) {
        self.entries += 1;
        match tree {
            u64::MAX => self.unbounded += 1,
            t => self.tree_cost += u128::from(t),
        }
    }

    fn remove(&mut self, tree: u64) {
        self.entries -= 1;
        match tree {
            u64::MAX => self.unbounded -= 1,
            t => self.tree_cost -= u128::from(t),
        }
    }

    /// The most the entries can still add to their candidate's cost, when bounded.
    fn most(&self) -> Option<u128> {
        (self.unbounded == 0).then_some(self.tree_cost)
    }
}
