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

use super::analysis::{numel, EGraph};
use super::lang::{ENode, Kind};
use egg::Id;
use smallvec::SmallVec;
use std::collections::HashMap;

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
    pub choice: HashMap<Id, ENode>,
    pub method: Method,
}

struct CNode {
    cost: u64,
    children: SmallVec<[u32; 3]>,
    /// Position in the class's node list.
    index: usize,
}

/// What an e-node of class `class` costs by itself.
pub fn node_cost(eg: &EGraph, class: Id, node: &ENode) -> u64 {
    match &node.kind {
        Kind::Leaf(_) | Kind::Reshape(_) | Kind::StopGradient => 0,
        Kind::Full { .. } | Kind::Iota { .. } => 1,
        Kind::Broadcast(_) if eg[node.args[0]].data.constant.is_some() => 1,
        _ => {
            let t = &eg[class].data.ty;
            numel(t.shape.dims())
                .and_then(|n| n.checked_mul(t.dtype.size()))
                .map_or(u64::MAX / 4, |b| b as u64)
                .max(1)
        }
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
    let mut ids: Vec<Id> = eg.classes().map(|c| c.id).collect();
    ids.sort_unstable();
    let mut dense = vec![u32::MAX; eg.nodes().len()];
    for (i, &id) in ids.iter().enumerate() {
        dense[usize::from(id)] = i as u32;
    }
    let dense_of = |id: Id| dense[usize::from(eg.find(id))];
    let cnodes: Vec<Vec<CNode>> = ids
        .iter()
        .map(|&id| {
            let class = &eg[id];
            class
                .nodes
                .iter()
                .enumerate()
                // A leaf's class is the leaf: nothing else may stand for a step's input.
                .filter(|(_, n)| class.data.leaf.is_none() || matches!(n.kind, Kind::Leaf(_)))
                .map(|(index, n)| CNode {
                    cost: node_cost(eg, id, n),
                    children: n.args.iter().map(|&a| dense_of(a)).collect(),
                    index,
                })
                .collect()
        })
        .collect();
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
    let mut out = HashMap::new();
    let mut stack: Vec<u32> = root_dense.clone();
    while let Some(c) = stack.pop() {
        let id = ids[c as usize];
        if out.contains_key(&id) {
            continue;
        }
        let Some(ni) = choice[c as usize] else {
            return Err(format!(
                "e-class {id} has no finite term (its e-nodes: {:?})",
                eg[id].nodes
            ));
        };
        let cn = &cnodes[c as usize][ni];
        let node = eg[id].nodes[cn.index].clone();
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
fn shallowest(cnodes: &[Vec<CNode>], h: &[u32]) -> Vec<Option<usize>> {
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
fn acyclic_from(cnodes: &[Vec<CNode>], choice: &[Option<usize>], roots: &[u32]) -> bool {
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
fn heights(cnodes: &[Vec<CNode>]) -> Vec<u32> {
    let n = cnodes.len();
    let mut h = vec![u32::MAX; n];
    // For each class, the (class, node index) pairs that have it as a child, once per child slot.
    let mut parents: Vec<Vec<(u32, u32)>> = vec![Vec::new(); n];
    let mut missing: Vec<Vec<u32>> = Vec::with_capacity(n);
    let mut heap = std::collections::BinaryHeap::new();
    for (c, nodes) in cnodes.iter().enumerate() {
        let mut m = Vec::with_capacity(nodes.len());
        for (ni, node) in nodes.iter().enumerate() {
            for &d in &node.children {
                parents[d as usize].push((c as u32, ni as u32));
            }
            m.push(node.children.len() as u32);
            if node.children.is_empty() {
                heap.push(std::cmp::Reverse((0u32, c as u32)));
            }
        }
        missing.push(m);
    }
    let mut done = vec![false; n];
    let mut best = vec![u32::MAX; n];
    while let Some(std::cmp::Reverse((hc, c))) = heap.pop() {
        let c = c as usize;
        if done[c] {
            continue;
        }
        done[c] = true;
        h[c] = hc;
        for &(p, ni) in &parents[c] {
            let (p, ni) = (p as usize, ni as usize);
            missing[p][ni] -= 1;
            if missing[p][ni] == 0 && !done[p] {
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
/// as soon as every class still pending is needed by both. The cost of a comparison is the
/// region where the two terms differ, not the size of the graph, so the whole extraction is
/// near-linear when alternatives are local (as every rewrite rule makes them).
///
/// The objective is the greedy DAG extraction's: a candidate's e-node cost plus the costs of
/// the classes it needs, each once; ties go to the smaller set, then to the first e-node.
fn ranked(cnodes: &[Vec<CNode>], h: &[u32]) -> Vec<Option<usize>> {
    let n = cnodes.len();
    let mut order: Vec<u32> = (0..n as u32)
        .filter(|&c| h[c as usize] != u32::MAX)
        .collect();
    order.sort_unstable_by_key(|&c| (h[c as usize], c));
    let mut choice: Vec<Option<usize>> = vec![None; n];
    let mut own = vec![0u64; n];
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
                    let (only_new, only_best) =
                        search.run(cnodes, &choice, &own, h, &node.children, &b.children);
                    let new = (node.cost as u128 + only_new.0 as u128, only_new.1);
                    let old = (b.cost as u128 + only_best.0 as u128, only_best.1);
                    Some(if new < old { ni } else { bi })
                }
            };
        }
        if let Some(ni) = best {
            choice[c] = Some(ni);
            own[c] = cnodes[c][ni].cost;
        }
    }
    choice
}

/// Scratch space of [`ranked`]'s comparisons, reused so that each costs only what it visits.
struct SymDiff {
    /// Bit 1: needed by the first candidate, bit 2: by the second; 0 = not reached.
    mark: Vec<u8>,
    touched: Vec<u32>,
    heap: std::collections::BinaryHeap<(u32, u32)>,
}

impl SymDiff {
    fn new(n: usize) -> SymDiff {
        SymDiff {
            mark: vec![0; n],
            touched: Vec::new(),
            heap: std::collections::BinaryHeap::new(),
        }
    }

    /// The (cost, count) of the classes only `a`'s children need and of those only `b`'s need,
    /// following the chosen e-nodes (every class below a candidate is decided).
    fn run(
        &mut self,
        cnodes: &[Vec<CNode>],
        choice: &[Option<usize>],
        own: &[u64],
        h: &[u32],
        a: &[u32],
        b: &[u32],
    ) -> ((u64, u32), (u64, u32)) {
        let mut only = [(0u64, 0u32), (0u64, 0u32)];
        // Entries pending in the heap that are not yet needed by both.
        let mut single = 0usize;
        let reach = |this: &mut SymDiff, d: u32, m: u8, single: &mut usize| {
            let old = this.mark[d as usize];
            let new = old | m;
            if old == new {
                return;
            }
            this.mark[d as usize] = new;
            if old == 0 {
                this.touched.push(d);
                this.heap.push((h[d as usize], d));
                if new != 3 {
                    *single += 1;
                }
            } else {
                // It was pending with one bit and now has both.
                *single -= 1;
            }
        };
        for &d in a {
            reach(self, d, 1, &mut single);
        }
        for &d in b {
            reach(self, d, 2, &mut single);
        }
        while single > 0 {
            let Some((_, d)) = self.heap.pop() else {
                break;
            };
            let m = self.mark[d as usize];
            if m != 3 {
                single -= 1;
                let slot = &mut only[usize::from(m - 1)];
                slot.0 = slot.0.saturating_add(own[d as usize]);
                slot.1 += 1;
            }
            if let Some(ni) = choice[d as usize] {
                for &e in &cnodes[d as usize][ni].children {
                    reach(self, e, m, &mut single);
                }
            }
        }
        self.heap.clear();
        for d in self.touched.drain(..) {
            self.mark[d as usize] = 0;
        }
        (only[0], only[1])
    }
}
