//! DAG-aware extraction: one e-node per needed e-class, chosen so that the bytes the step
//! materializes are small.
//!
//! egg's [`egg::Extractor`] sums the costs of a term's children, so a class used twice counts
//! twice. In a training step almost everything is shared (forward values feed the backward pass),
//! so that cost is badly wrong. Here the cost of choosing an e-node is the *set* of e-classes it
//! needs, transitively, each counted once (extraction-gym's "greedy DAG" extractor): a class's
//! best choice is the e-node whose own cost plus the costs of the union of its children's sets is
//! smallest, computed bottom-up with a worklist until nothing improves. Ties go to the smaller
//! set, then to the first e-node in egg's (sorted) order, so the result is deterministic.
//!
//! Costs are the bytes an e-node would materialize: its result's bytes, except that views
//! (`reshape`, `stop_gradient`) and leaves cost nothing and constants (`full`, `iota`, a
//! `broadcast` of a constant) cost 1, since fusion inlines them.
//!
//! The e-graph may have cycles (`x * 1` lives in `x`'s own class). A choice whose set contains its
//! own class is never taken, but sets recorded earlier can go stale as children improve, so the
//! chosen e-nodes are checked for a cycle from the roots; if one is found the extraction is run
//! again with each class allowed only e-nodes whose children are strictly lower (by the height of
//! their shallowest term), which cannot cycle ([`Method::DagByHeight`]).
//!
//! The sets cost `classes² / 8` bytes, so an e-graph of more than [`MAX_DAG_CLASSES`] classes
//! takes each class's shallowest e-node instead ([`Method::Shallowest`]).

use super::analysis::{numel, EGraph};
use super::lang::{ENode, Kind};
use egg::Id;
use smallvec::SmallVec;
use std::collections::{BTreeSet, HashMap};

/// Above this many e-classes the set-based extraction would need too much memory (its sets take
/// `classes² / 8` bytes: 300 MiB at 50,000), so [`Method::Shallowest`] is used instead. A
/// reference model's step has a few thousand (gpt2: about 5,300).
pub const MAX_DAG_CLASSES: usize = 50_000;

/// How the e-nodes were chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// The greedy DAG extraction.
    Dag,
    /// The greedy DAG extraction among height-decreasing e-nodes, because the unrestricted one
    /// chose a cycle.
    DagByHeight,
    /// For each class, its shallowest e-node (then the cheapest): for e-graphs too large for
    /// the sets. Every rule rewrites towards shallower terms, so this keeps their gains.
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

    let first = force.unwrap_or(if ids.len() > MAX_DAG_CLASSES {
        Method::Shallowest
    } else {
        Method::Dag
    });
    let mut method = first;
    let mut choice = match first {
        Method::Dag => Some(greedy(&cnodes, None)),
        _ => None,
    }
    .filter(|c| acyclic_from(&cnodes, c, &root_dense));
    if choice.is_none() {
        let h = heights(&cnodes);
        if method == Method::Dag {
            method = Method::DagByHeight;
        }
        let c = match method {
            Method::Shallowest => shallowest(&cnodes, &h),
            _ => greedy(&cnodes, Some(&h)),
        };
        if !acyclic_from(&cnodes, &c, &root_dense) {
            return Err("extraction chose a cycle even among height-decreasing e-nodes".into());
        }
        choice = Some(c);
    }
    let choice = choice.unwrap_or_default();

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

/// The greedy DAG extraction: for each class, the index (into `cnodes[class]`) of its chosen
/// e-node, if it has a finite one. With `heights`, a class may only choose e-nodes whose
/// children are all strictly lower than itself.
fn greedy(cnodes: &[Vec<CNode>], heights: Option<&[u32]>) -> Vec<Option<usize>> {
    let n = cnodes.len();
    let words = n.div_ceil(64).max(1);
    let mut parents: Vec<Vec<u32>> = vec![Vec::new(); n];
    for (c, nodes) in cnodes.iter().enumerate() {
        for node in nodes {
            for &d in &node.children {
                let p = &mut parents[d as usize];
                if p.last() != Some(&(c as u32)) {
                    p.push(c as u32);
                }
            }
        }
    }
    let allowed = |c: usize, node: &CNode| match heights {
        None => true,
        Some(h) => node.children.iter().all(|&d| h[d as usize] < h[c]),
    };
    // Per class: the chosen node, its (total, set size), the set of classes it needs.
    let mut best: Vec<Option<(usize, u64, u32)>> = vec![None; n];
    let mut own = vec![0u64; n];
    let mut sets = vec![0u64; n * words];
    let mut scratch = vec![0u64; words];
    let mut keep = vec![0u64; words];
    let mut queue: BTreeSet<u32> = (0..n as u32).collect();
    // Refreshing a stale choice can raise its cost, so improvement alone does not bound the
    // work: cap the e-node evaluations (generously: gpt2's step needs about 13 per e-node).
    // Running out leaves some choices stale, which the cycle check after it catches.
    let total_nodes: usize = cnodes.iter().map(Vec::len).sum();
    let mut budget = 64usize.saturating_mul(total_nodes).saturating_add(1024);
    while let Some(c) = queue.pop_first() {
        let c = c as usize;
        budget = budget.saturating_sub(cnodes[c].len());
        if budget == 0 {
            break;
        }
        let mut cand: Option<(usize, u64, u32)> = None;
        let mut current: Option<(u64, u32)> = None;
        for (ni, node) in cnodes[c].iter().enumerate() {
            if !allowed(c, node) || node.children.iter().any(|&d| best[d as usize].is_none()) {
                continue;
            }
            scratch.fill(0);
            for &d in &node.children {
                let d = d as usize;
                for (s, &w) in scratch.iter_mut().zip(&sets[d * words..(d + 1) * words]) {
                    *s |= w;
                }
            }
            if scratch[c / 64] & (1 << (c % 64)) != 0 {
                continue; // it would need itself
            }
            let (mut total, mut count) = (node.cost, 1u32);
            for (w, &word) in scratch.iter().enumerate() {
                let mut x = word;
                while x != 0 {
                    let d = w * 64 + x.trailing_zeros() as usize;
                    total = total.saturating_add(own[d]);
                    count += 1;
                    x &= x - 1;
                }
            }
            if best[c].is_some_and(|(b, _, _)| b == ni) {
                current = Some((total, count));
            }
            if cand.is_none_or(|(_, t, k)| (total, count) < (t, k)) {
                cand = Some((ni, total, count));
                keep.copy_from_slice(&scratch);
            }
        }
        let Some((ni, total, count)) = cand else {
            continue;
        };
        // Take a strictly better e-node (or any, when the current one is gone: it would now
        // need its own class); otherwise keep the current one and refresh its set, since its
        // children may have changed their choices since it was recorded.
        let (ni, total, count) = match (best[c], current) {
            (Some((bi, _, _)), Some((t, k))) if (total, count) >= (t, k) => {
                keep.fill(0);
                for &d in &cnodes[c][bi].children {
                    let d = d as usize;
                    for (s, &w) in keep.iter_mut().zip(&sets[d * words..(d + 1) * words]) {
                        *s |= w;
                    }
                }
                (bi, t, k)
            }
            _ => (ni, total, count),
        };
        keep[c / 64] |= 1 << (c % 64);
        let slot = &mut sets[c * words..(c + 1) * words];
        let changed = best[c] != Some((ni, total, count)) || slot != keep.as_slice();
        if changed {
            best[c] = Some((ni, total, count));
            own[c] = cnodes[c][ni].cost;
            slot.copy_from_slice(&keep);
            queue.extend(parents[c].iter().copied());
        }
    }
    best.into_iter().map(|b| b.map(|(ni, _, _)| ni)).collect()
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

/// The height of each class's shallowest term (`u32::MAX` for a class with none).
fn heights(cnodes: &[Vec<CNode>]) -> Vec<u32> {
    let mut h = vec![u32::MAX; cnodes.len()];
    loop {
        let mut changed = false;
        for (c, nodes) in cnodes.iter().enumerate() {
            for node in nodes {
                let m = node.children.iter().try_fold(0u32, |acc, &d| {
                    let x = h[d as usize];
                    (x != u32::MAX).then_some(acc.max(x.saturating_add(1)))
                });
                if let Some(m) = m {
                    if m < h[c] {
                        h[c] = m;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            return h;
        }
    }
}
