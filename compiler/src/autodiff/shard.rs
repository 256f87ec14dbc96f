//! The optimizer sharded over the ranks (ZeRO stage 1).
//!
//! With bf16 weight copies ([`super::copies`]) the forward and backward passes read a weight
//! only as its bf16 copy; the f32 weight and its optimizer state are read by the update alone.
//! Every rank updating every weight then repeats the same work on the same bytes, and holds
//! the same f32 weight and moments. [`shard_optimizer`] gives each rank `r` of `R` the rows
//! `r·n/R .. (r+1)·n/R` of such a weight instead:
//! - its f32 leaf and its optimizer state become leaves of those rows, under the same names;
//! - its averaged gradient arrives as those rows of the mean: a reduce-scatter
//!   ([`Op::ReduceScatter`]) where the plain step all-reduces;
//! - the update runs on the rows alone;
//! - the cast of the new rows is all-gathered ([`Op::AllGather`]) into the whole copy that the
//!   next step's passes read.
//!
//! The bytes on the wire are the all-reduce's, the update's work and the optimizer state's
//! memory are divided by R (session 19's stand-in: 707 MiB less a rank for gpt2 on two), and
//! every rank's copy holds the bits the unsharded step's would.
//!
//! A weight is sharded only when nothing else needs it whole:
//! - its update is elementwise: every node of it reads its weight's elements, its state's and
//!   its gradient's at the same index, and scalars;
//! - nothing outside the update reads the weight, its state or its averaged gradient (gradient
//!   clipping reads every gradient, so [`shard_optimizer`] refuses it);
//! - its gradient is all-reduced on its own (not a gradient shared by several weights);
//! - its rows divide by R.
//!
//! The result is recognisable without a side table: a sharded weight's copy has `R` times its
//! rows ([`ranks_of`]), as a copy is found by its name ([`super::copies::param_of`]).

use super::copies;
use super::phase::Phases;
use crate::error::{IrError, Result};
use crate::ir::{Graph, LeafKind, NodeId, Op, Shape, TensorType};
use std::collections::{HashMap, HashSet};

/// A weight whose update [`shard_optimizer`] shards: its family of leaves (the weight and the
/// state its update keeps, each of the weight's shape), its copy, the nodes of its update and
/// the all-reduced gradient they read.
struct Shardable {
    family: Vec<NodeId>,
    copy: NodeId,
    region: HashSet<NodeId>,
    source: NodeId,
    rows: usize,
}

/// Shards the update of every weight that qualifies (module docs) over `ranks` ranks, in `g`
/// (a whole training step with its updates declared and bf16 copies kept; `phases` its
/// phases). Returns the step and its phases. Refused: fewer than two ranks, a step that clips
/// its gradients, and a step with no weight to shard (no bf16 copies: an f32 step, or
/// `--no-weight-copies`).
pub fn shard_optimizer(g: Graph, phases: Phases, ranks: usize) -> Result<(Graph, Phases)> {
    if ranks < 2 {
        return Err(IrError::Invalid(format!(
            "sharding the optimizer needs two ranks or more, not {ranks}"
        )));
    }
    if g.outputs.contains_key(super::names::GRAD_NORM) {
        return Err(IrError::Invalid(
            "sharding the optimizer cannot clip the gradients by their global norm: each rank \
             holds only its rows of most gradients; drop --clip-grad-norm or the sharding"
                .into(),
        ));
    }
    let found = shardable(&g, ranks);
    if found.is_empty() {
        return Err(IrError::Invalid(
            "no weight's update can be sharded: sharding needs the bf16 weight copies \
             (--precision bf16, without --no-weight-copies) of weights whose rows divide by \
             the ranks"
                .into(),
        ));
    }
    let mut in_family: HashMap<NodeId, usize> = HashMap::new();
    let mut in_region: HashMap<NodeId, usize> = HashMap::new();
    let mut source_of: HashMap<NodeId, usize> = HashMap::new();
    for (k, s) in found.iter().enumerate() {
        for &f in &s.family {
            in_family.insert(f, k);
        }
        for &x in &s.region {
            in_region.insert(x, k);
        }
        source_of.insert(s.source, k);
    }
    let rows_of = |rows: usize, full: &Shape| -> Shape {
        let mut d = full.dims().to_vec();
        d[0] = rows;
        Shape::from(d.as_slice())
    };
    let mut out = Graph::new();
    let mut map: Vec<Option<NodeId>> = vec![None; g.len()];
    let mut len_at = Vec::with_capacity(g.len() + 1);
    let operand = |map: &[Option<NodeId>], i: NodeId| map[i.index()].expect("operands come first");
    for id in g.ids() {
        len_at.push(out.len());
        if map[id.index()].is_some() {
            continue; // a result of a split all-reduce, made with it
        }
        let node = g.node(id);
        let origin = g.origin(id).clone();
        if let Op::AllReduce { .. } = node.op {
            // The all-reduce's outputs by operand index: output 0 is the node, output i its
            // `Result { index: i }`.
            let outputs: Vec<NodeId> = (0..node.inputs.len())
                .map(|i| match i {
                    0 => Some(id),
                    _ => g.result_of(id, i),
                })
                .collect::<Option<_>>()
                .ok_or_else(|| {
                    IrError::Invalid(format!("{id}: an all-reduce output is missing"))
                })?;
            if outputs.iter().any(|o| source_of.contains_key(o)) {
                let made = out.with_origin(origin, |o| {
                    split_all_reduce(o, &g, node, &outputs, &source_of, ranks, &map)
                })?;
                for (old, new) in outputs.into_iter().zip(made) {
                    map[old.index()] = Some(new);
                }
                continue;
            }
        }
        let k = in_family.get(&id).or(in_region.get(&id)).copied();
        let ty = match k {
            None => node.ty.clone(),
            Some(k) => TensorType::new(rows_of(found[k].rows, &node.ty.shape), node.ty.dtype),
        };
        let inputs: Vec<NodeId> = node.inputs.iter().map(|&i| operand(&map, i)).collect();
        let new = out.with_origin(origin, |o| o.push(node.op.clone(), &inputs, Some(ty)))?;
        map[id.index()] = Some(new);
    }
    len_at.push(out.len());
    let at = |i: NodeId| map[i.index()].expect("every node is mapped");
    for (name, &v) in &g.outputs {
        out.outputs.insert(name.clone(), at(v));
    }
    let copy_of: HashMap<NodeId, usize> =
        found.iter().enumerate().map(|(k, s)| (s.copy, k)).collect();
    for u in &g.updates {
        let value = match copy_of.get(&u.target) {
            None => at(u.value),
            Some(_) => {
                // Every rank's new rows, cast, gathered into the whole copy.
                let full = g.ty(u.target).clone();
                out.with_origin(g.origin(u.value).clone(), |o| {
                    o.push(Op::AllGather { ranks }, &[at(u.value)], Some(full))
                })?
            }
        };
        out.set_update(at(u.target), value)?;
    }
    let at = |i: usize| len_at[i];
    let phases = Phases {
        forward: 0..at(phases.forward.end),
        backward: at(phases.backward.start)..at(phases.backward.end),
        optimizer: at(phases.optimizer.start)..out.len(),
    };
    Ok((out, phases))
}

/// The all-reduce `node` (outputs `outputs`, by operand index) as an all-reduce of the
/// operands no sharded update reads and a reduce-scatter of those it does, both where the
/// all-reduce was. Returns the new value of each old output, in order.
fn split_all_reduce(
    out: &mut Graph,
    g: &Graph,
    node: &crate::ir::Node,
    outputs: &[NodeId],
    source_of: &HashMap<NodeId, usize>,
    ranks: usize,
    map: &[Option<NodeId>],
) -> Result<Vec<NodeId>> {
    let (mut kept, mut scattered) = (Vec::new(), Vec::new());
    for (i, &o) in outputs.iter().enumerate() {
        match source_of.contains_key(&o) {
            true => scattered.push(i),
            false => kept.push(i),
        }
    }
    let mut made = vec![None; outputs.len()];
    for (op, which) in [
        (Op::AllReduce { ranks }, kept),
        (Op::ReduceScatter { ranks }, scattered),
    ] {
        if which.is_empty() {
            continue;
        }
        let inputs: Vec<NodeId> = which
            .iter()
            .map(|&i| map[node.inputs[i].index()].expect("operands come first"))
            .collect();
        let ty = |i: usize| {
            let mut t = g.ty(outputs[i]).clone();
            if matches!(op, Op::ReduceScatter { .. }) {
                let mut d = t.shape.dims().to_vec();
                d[0] /= ranks;
                t.shape = Shape::from(d.as_slice());
            }
            t
        };
        let first = out.push(op.clone(), &inputs, Some(ty(which[0])))?;
        made[which[0]] = Some(first);
        for (j, &i) in which.iter().enumerate().skip(1) {
            made[i] = Some(out.push(Op::Result { index: j }, &[first], Some(ty(i)))?);
        }
    }
    Ok(made
        .into_iter()
        .map(|m| m.expect("every output made"))
        .collect())
}

/// The ranks a leaf of a sharded step holds its rows of: a weight whose bf16 copy has `R >= 2`
/// times its rows (and the same other dimensions), or that weight's optimizer state
/// (`{weight}.{anything}`, the weight's shape). `None` for every other leaf.
pub fn ranks_of(g: &Graph, leaf: NodeId) -> Option<usize> {
    let name = g.leaf_name(leaf)?;
    let weight = match &g.node(leaf).op {
        Op::Leaf {
            kind: LeafKind::Parameter,
            ..
        } => leaf,
        Op::Leaf {
            kind: LeafKind::State,
            ..
        } if !copies::is_copy(g, leaf) => {
            let (w, _) = name.rsplit_once('.')?;
            let w = g.leaf(w)?;
            (g.ty(w).shape == g.ty(leaf).shape).then_some(w)?
        }
        _ => return None,
    };
    let copy = g.leaf(&format!("{}{}", g.leaf_name(weight)?, copies::SUFFIX))?;
    copies::param_of(g, copy).filter(|&p| p == weight)?;
    let (w, c) = (g.ty(weight).shape.dims(), g.ty(copy).shape.dims());
    let ranks = c.first()? / w.first().filter(|&&n| n > 0)?;
    (ranks >= 2 && w[1..] == c[1..] && w[0] * ranks == c[0]).then_some(ranks)
}

/// The type of the whole value of leaf `leaf`, which every rank holds a part of: for a leaf
/// sharded over `R` ranks ([`ranks_of`]), its type with `R` times its rows (the weight or
/// moment of the unsharded step); for every other leaf, its own type. Whoever presents the
/// ranks as one step (initial values, checkpoints, loaded parameters) reads and writes leaves
/// of this type, so a sharded step and an unsharded one exchange the same tensors.
pub fn whole_type(g: &Graph, leaf: NodeId) -> TensorType {
    let mut ty = g.ty(leaf).clone();
    if let Some(ranks) = ranks_of(g, leaf) {
        let mut d = ty.shape.dims().to_vec();
        d[0] *= ranks;
        ty.shape = Shape::from(d.as_slice());
    }
    ty
}

/// The weights of `g` whose updates [`shard_optimizer`] can shard over `ranks`.
fn shardable(g: &Graph, ranks: usize) -> Vec<Shardable> {
    let value_of: HashMap<NodeId, NodeId> = g.updates.iter().map(|u| (u.target, u.value)).collect();
    let mut readers: Vec<Vec<NodeId>> = vec![Vec::new(); g.len()];
    for id in g.ids() {
        for &i in &g.node(id).inputs {
            readers[i.index()].push(id);
        }
    }
    let outputs: HashSet<NodeId> = g.outputs.values().copied().collect();
    let states = g.leaves(LeafKind::State);
    let mut found = Vec::new();
    for &c in &states {
        let Some(p) = copies::param_of(g, c) else {
            continue;
        };
        let full = g.ty(p).shape.clone();
        if full.rank() == 0
            || !full.dims()[0].is_multiple_of(ranks)
            || g.ty(c).shape != full
            || !value_of.contains_key(&c)
        {
            continue;
        }
        let name = g.leaf_name(p).expect("a leaf").to_string();
        let mut family = vec![p];
        for &l in &states {
            let n = g.leaf_name(l).expect("a leaf");
            if l != c
                && n.strip_prefix(&name).is_some_and(|r| r.starts_with('.'))
                && g.ty(l).shape == full
                && value_of.contains_key(&l)
            {
                family.push(l);
            }
        }
        if let Some((region, source)) =
            region_of(g, &family, c, &value_of, &readers, &outputs, &full)
        {
            found.push(Shardable {
                family,
                copy: c,
                region,
                source,
                rows: full.dims()[0] / ranks,
            });
        }
    }
    found
}

/// The nodes of the update of `family` (and of the copy `c`'s cast) and the all-reduced
/// gradient they read, when the update is elementwise and nothing else reads them.
fn region_of(
    g: &Graph,
    family: &[NodeId],
    c: NodeId,
    value_of: &HashMap<NodeId, NodeId>,
    readers: &[Vec<NodeId>],
    outputs: &HashSet<NodeId>,
    full: &Shape,
) -> Option<(HashSet<NodeId>, NodeId)> {
    let mut region = HashSet::new();
    let mut source = None;
    let mut stack: Vec<NodeId> = family
        .iter()
        .chain(std::iter::once(&c))
        .map(|t| value_of[t])
        .collect();
    let is_reduced = |x: NodeId| match &g.node(x).op {
        Op::AllReduce { .. } => true,
        Op::Result { .. } => matches!(g.node(g.node(x).inputs[0]).op, Op::AllReduce { .. }),
        _ => false,
    };
    while let Some(x) = stack.pop() {
        if family.contains(&x) || !region.insert(x) {
            continue;
        }
        let n = g.node(x);
        if &n.ty.shape != full {
            return None;
        }
        match &n.op {
            Op::Full { .. } => {}
            Op::Broadcast => {
                // A scalar, read whole by every rank.
                if g.ty(n.inputs[0]).shape.numel() != 1 {
                    return None;
                }
                continue;
            }
            op if op.is_elementwise() => {}
            _ => return None,
        }
        for &i in &n.inputs {
            if is_reduced(i) && &g.ty(i).shape == full {
                if source.is_some_and(|s| s != i) {
                    return None;
                }
                source = Some(i);
            } else if &g.ty(i).shape == full {
                stack.push(i);
            } else {
                return None;
            }
        }
    }
    let source = source?;
    // Nothing outside the update reads what it shards (an all-reduce's other outputs read
    // the node itself, not its value).
    let inside = |x: &NodeId| region.contains(x);
    let own = |x: NodeId| readers[x.index()].iter().all(inside) && !outputs.contains(&x);
    let source_read_inside = readers[source.index()]
        .iter()
        .filter(|r| !matches!(g.node(**r).op, Op::Result { .. }))
        .all(inside);
    (family.iter().all(|&f| own(f))
        && region.iter().all(|&x| own(x))
        && source_read_inside
        && !outputs.contains(&source))
    .then_some((region, source))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autodiff::{training_step_with, StepOptions};
    use crate::models;

    const GPT: &str = "gpt:vocab=64,d_model=32,layers=2,heads=4,d_ff=64,seq=8,batch=2";

    fn step(opts: StepOptions, bf16: bool) -> Result<crate::autodiff::Step> {
        let m = models::by_name(GPT).unwrap();
        let forward = match bf16 {
            true => crate::precision::Precision::Bf16.apply(&m.graph).unwrap(),
            false => m.graph.clone(),
        };
        training_step_with(&forward, &m.optimizer, &opts)
    }

    fn sharded(ranks: usize) -> StepOptions {
        StepOptions {
            ranks,
            reduce_in_bf16: true,
            shard_optimizer: true,
            ..StepOptions::default()
        }
    }

    /// The step for two ranks, its optimizer whole and sharded.
    fn plain_and_sharded() -> (Graph, Graph) {
        let whole = StepOptions {
            shard_optimizer: false,
            ..sharded(2)
        };
        let plain = step(whole, true).unwrap().graph;
        (plain, step(sharded(2), true).unwrap().graph)
    }

    #[test]
    fn each_rank_updates_its_rows_of_a_weight_and_gathers_the_whole_copy() {
        let (plain, g) = plain_and_sharded();
        let weights: Vec<NodeId> = g
            .leaves(LeafKind::State)
            .into_iter()
            .filter_map(|c| copies::param_of(&g, c))
            .collect();
        assert!(weights.len() >= 8, "{weights:?}");
        for &p in &weights {
            let name = g.leaf_name(p).unwrap();
            let whole = plain.ty(plain.leaf(name).unwrap()).shape.dims().to_vec();
            let mut rows = whole.clone();
            rows[0] /= 2;
            assert_eq!(g.ty(p).shape.dims(), rows, "{name} holds half its rows");
            assert_eq!(ranks_of(&g, p), Some(2), "{name}");
            for moment in ["exp_avg", "exp_avg_sq"] {
                let m = g.leaf(&format!("{name}.{moment}")).unwrap();
                assert_eq!(g.ty(m).shape.dims(), rows, "{name}.{moment}");
                assert_eq!(ranks_of(&g, m), Some(2), "{name}.{moment}");
            }
            let copy = g.leaf(&format!("{name}{}", copies::SUFFIX)).unwrap();
            assert_eq!(g.ty(copy).shape.dims(), whole, "the copy is whole");
            assert_eq!(ranks_of(&g, copy), None);
            let update = |t: NodeId| g.updates.iter().find(|u| u.target == t).unwrap().value;
            let gathered = update(copy);
            assert!(
                matches!(g.node(gathered).op, Op::AllGather { ranks: 2 }),
                "{name}: {}",
                g.describe(gathered)
            );
            let cast = g.node(gathered).inputs[0];
            assert_eq!(
                g.node(cast).inputs[0],
                update(p),
                "the cast of the new rows"
            );
        }
        // Every sharded weight's gradient is scattered, none is all-reduced whole.
        let scattered: usize = g
            .ids()
            .filter(|&id| matches!(g.node(id).op, Op::ReduceScatter { .. }))
            .map(|id| g.node(id).inputs.len())
            .sum();
        assert_eq!(scattered, weights.len());
        let reduced_in = |g: &Graph| -> usize {
            g.ids()
                .filter(|&id| matches!(g.node(id).op, Op::AllReduce { .. }))
                .map(|id| g.node(id).inputs.len())
                .sum()
        };
        let (reduced, reduced_before) = (reduced_in(&g), reduced_in(&plain));
        assert_eq!(
            reduced + scattered,
            reduced_before,
            "each gradient crosses once"
        );
        // The biases and LayerNorm gains are not cast for a matrix product: kept whole.
        let gain = g.leaf("blocks.0.ln1.weight").unwrap();
        assert_eq!(ranks_of(&g, gain), None);
        assert_eq!(
            g.ty(gain),
            plain.ty(plain.leaf("blocks.0.ln1.weight").unwrap())
        );
    }

    #[test]
    fn the_whole_type_of_a_sharded_leaf_is_the_unsharded_steps_and_other_leaves_keep_theirs() {
        let (plain, g) = plain_and_sharded();
        let mut sharded_leaves = 0;
        for kind in [LeafKind::Parameter, LeafKind::State, LeafKind::Input] {
            for id in g.leaves(kind) {
                let name = g.leaf_name(id).unwrap();
                let whole = plain.ty(plain.leaf(name).unwrap());
                assert_eq!(&whole_type(&g, id), whole, "{name}");
                if ranks_of(&g, id).is_some() {
                    sharded_leaves += 1;
                    assert_ne!(g.ty(id), whole, "{name} holds its rows alone");
                } else {
                    assert_eq!(g.ty(id), whole, "{name}");
                }
            }
        }
        assert!(sharded_leaves >= 3 * 8, "{sharded_leaves}");
    }

    #[test]
    fn sharding_is_refused_with_one_rank_with_clipping_and_without_weight_copies() {
        let e = |r: Result<crate::autodiff::Step>| r.expect_err("refused").to_string();
        assert!(e(step(sharded(1), true)).contains("two ranks"));
        let clipped = StepOptions {
            clip_grad_norm: Some(1.0),
            ..sharded(2)
        };
        assert!(e(step(clipped, true)).contains("clip"));
        assert!(e(step(sharded(2), false)).contains("bf16 weight copies"));
        let cast = StepOptions {
            cast_weights_each_step: true,
            ..sharded(2)
        };
        assert!(e(step(cast, true)).contains("--no-weight-copies"));
    }

    #[test]
    fn a_weight_whose_rows_do_not_divide_by_the_ranks_is_kept_whole() {
        // 3 ranks: only the qkv weights' 96 rows divide by 3 (the others have 32 or 64).
        let g = step(sharded(3), true).unwrap().graph;
        for c in g.leaves(LeafKind::State) {
            let Some(p) = copies::param_of(&g, c) else {
                continue;
            };
            let rows = g.ty(c).shape.dims()[0];
            let want = rows.is_multiple_of(3).then_some(3);
            assert_eq!(ranks_of(&g, p), want, "{}", g.leaf_name(p).unwrap());
        }
    }
}
