//! bf16 copies of the weights, kept by the optimizer.
//!
//! Under bf16 autocast ([`crate::precision`]) every matrix product reads its f32 weight cast to
//! bf16: a `convert` of the parameter leaf, made again in every step's forward pass, and
//! kept until the backward pass has read it. [`keep_weight_copies`] makes that cast a leaf of
//! its own instead, `{param}.bf16` (resident state), which the step writes after the update:
//! the cast of the parameter's new value, computed by the update's own kernel. The next
//! step's forward and backward passes read the copy. It holds exactly the bits the cast would
//! have made at the start of that step, so the step's numbers do not change, and the forward
//! pass no longer reads four bytes and writes two per weight before each product (llm.c keeps
//! its weights the same way: bf16 for the passes, f32 master weights for the update).
//!
//! A copy is derived state: it is never saved in a checkpoint. Whoever writes a parameter
//! writes its copy too ([`param_of`] finds the parameter of a copy): the runtime derives it
//! when it initialises the leaves and when it loads parameters.

use super::phase::Phases;
use crate::error::Result;
use crate::ir::{DType, Graph, Init, LeafKind, NodeId, Op};

/// The suffix of a copy's name: `blocks.0.qkv.weight.bf16`.
pub const SUFFIX: &str = ".bf16";

/// The parameter whose bf16 copy leaf `id` is (a state leaf named `{param}.bf16` of the
/// parameter's shape in bf16, or, where the optimizer is sharded over R ranks
/// ([`super::shard`]), of R times the parameter's rows), if it is one.
pub fn param_of(g: &Graph, id: NodeId) -> Option<NodeId> {
    let Op::Leaf {
        kind: LeafKind::State,
        name,
        ..
    } = &g.node(id).op
    else {
        return None;
    };
    let p = g.leaf(name.strip_suffix(SUFFIX)?)?;
    let (pt, ct) = (g.ty(p), g.ty(id));
    let (pd, cd) = (pt.shape.dims(), ct.shape.dims());
    let whole_or_rows = pt.shape == ct.shape
        || (!pd.is_empty()
            && pd.len() == cd.len()
            && pd[1..] == cd[1..]
            && pd[0] > 0
            && cd[0].is_multiple_of(pd[0]));
    (is_parameter(g, p) && whole_or_rows && pt.dtype == DType::F32 && ct.dtype == DType::BF16)
        .then_some(p)
}

fn is_parameter(g: &Graph, id: NodeId) -> bool {
    matches!(
        g.node(id).op,
        Op::Leaf {
            kind: LeafKind::Parameter,
            ..
        }
    )
}

/// Whether leaf `id` is a parameter's bf16 copy ([`param_of`]).
pub fn is_copy(g: &Graph, id: NodeId) -> bool {
    param_of(g, id).is_some()
}

/// Replaces every cast of an updated f32 parameter to bf16 in `g` (a whole training step,
/// updates declared; `phases` its phases) by that parameter's copy leaf, and declares the
/// copy's update: the cast of the parameter's new value, with the update's origin. Returns
/// the step and its phases; a step with no such cast is returned as it is.
pub fn keep_weight_copies(g: Graph, phases: Phases) -> Result<(Graph, Phases)> {
    let updated: std::collections::HashMap<NodeId, NodeId> =
        g.updates.iter().map(|u| (u.target, u.value)).collect();
    let cast_of = |id: NodeId| cast_of(&g, id).filter(|(p, _)| updated.contains_key(p));
    if !g.ids().any(|id| cast_of(id).is_some()) {
        return Ok((g, phases));
    }
    let Copied {
        mut out,
        copies,
        map,
        len_at,
    } = with_copies(&g, cast_of)?;
    let at = |i: NodeId| map[i.index()].expect("every node is mapped");
    for u in &g.updates {
        out.set_update(at(u.target), at(u.value))?;
    }
    for (&p, &c) in &copies {
        let value = at(updated[&p]);
        let origin =
            crate::ir::Origin::new(&format!("update of {}", g.leaf_name(p).expect("a leaf")));
        let cast = out.with_origin(origin, |o| o.convert(value, DType::BF16))?;
        out.set_update(c, cast)?;
    }
    // The f32 views a cast read are dead now. A phase boundary moves by the nodes made and
    // dropped before it; the copies' updates join the optimizer phase.
    let (live, kept) = out.without_dead_code();
    let at = |i: usize| kept[..len_at[i]].iter().filter(|m| m.is_some()).count();
    let phases = Phases {
        forward: 0..at(phases.forward.end),
        backward: at(phases.backward.start)..at(phases.backward.end),
        optimizer: at(phases.optimizer.start)..live.len(),
    };
    Ok((live, phases))
}

/// The f32 parameter a cast to bf16 (`id`) reads, and the views (transposes, reshapes) between
/// them, which commute with the cast: `convert(transpose(w))` is `transpose(copy)`.
fn cast_of(g: &Graph, id: NodeId) -> Option<(NodeId, Vec<NodeId>)> {
    let n = g.node(id);
    let (Op::Convert, &[mut p]) = (&n.op, n.inputs.as_slice()) else {
        return None;
    };
    let mut views = Vec::new();
    while matches!(g.node(p).op, Op::Transpose { .. } | Op::Reshape) {
        views.push(p);
        p = g.node(p).inputs[0];
    }
    views.reverse();
    (is_parameter(g, p) && n.ty.dtype == DType::BF16 && g.ty(p).dtype == DType::F32)
        .then_some((p, views))
}

/// What [`with_copies`] made.
struct Copied {
    /// The new graph, with the old one's outputs (not its updates).
    out: Graph,
    /// Each parameter's copy leaf, by the old parameter.
    copies: indexmap::IndexMap<NodeId, NodeId>,
    /// Each old node's new node.
    map: Vec<Option<NodeId>>,
    /// The new graph's length when each old node came to be made (a phase boundary there).
    len_at: Vec<usize>,
}

/// `g` again with every cast `cast_of` picks replaced by its parameter's copy, the state leaf
/// `{param}.bf16` made where the parameter's first cast was, seen through the cast's views.
fn with_copies(
    g: &Graph,
    cast_of: impl Fn(NodeId) -> Option<(NodeId, Vec<NodeId>)>,
) -> Result<Copied> {
    let mut out = Graph::new();
    let mut map: Vec<Option<NodeId>> = vec![None; g.len()];
    // Each parameter's copy, made where its first cast was.
    let mut copies: indexmap::IndexMap<NodeId, NodeId> = indexmap::IndexMap::new();
    // The new graph's length when each old node came to be made: a phase boundary there.
    let mut len_at = Vec::with_capacity(g.len() + 1);
    for id in g.ids() {
        len_at.push(out.len());
        let node = g.node(id);
        let new = match cast_of(id) {
            Some((p, views)) => {
                let mut cur = match copies.get(&p) {
                    Some(&c) => c,
                    None => {
                        let name = format!("{}{SUFFIX}", g.leaf_name(p).expect("a leaf"));
                        let shape = g.ty(p).shape.clone();
                        let c = out.state(&name, shape, DType::BF16, Init::Zeros)?;
                        copies.insert(p, c);
                        c
                    }
                };
                for v in views {
                    let mut ty = g.ty(v).clone();
                    ty.dtype = DType::BF16;
                    let op = g.node(v).op.clone();
                    cur = out.with_origin(g.origin(v).clone(), |o| o.push(op, &[cur], Some(ty)))?;
                }
                cur
            }
            None => {
                let inputs: Vec<NodeId> = node
                    .inputs
                    .iter()
                    .map(|i| map[i.index()].expect("operands come first"))
                    .collect();
                out.with_origin(g.origin(id).clone(), |o| {
                    o.push(node.op.clone(), &inputs, Some(node.ty.clone()))
                })?
            }
        };
        map[id.index()] = Some(new);
    }
    len_at.push(out.len());
    for (k, &v) in &g.outputs {
        out.outputs
            .insert(k.clone(), map[v.index()].expect("every node is mapped"));
    }
    Ok(Copied {
        out,
        copies,
        map,
        len_at,
    })
}

/// `eval` (a forward-only step, no updates) reading the bf16 copies the training step `train`
/// keeps ([`keep_weight_copies`]) where it casts their parameters: the copy holds exactly the
/// bits of the cast (the update wrote the cast of the parameter's latest value), so the
/// evaluation computes what it did, without the casts, and without reading the f32 weight.
/// That is what lets it run beside a step whose optimizer is sharded ([`super::shard`]):
/// each rank there holds only its rows of such a weight, and the whole copy. A parameter whose
/// copy `train` lacks (or holds in another shape) keeps its cast.
pub fn read_weight_copies(eval: Graph, train: &Graph) -> Result<Graph> {
    let copy_in_train = |p: NodeId| -> Option<NodeId> {
        let name = format!("{}{SUFFIX}", eval.leaf_name(p)?);
        let c = train.leaf(&name)?;
        let mut want = eval.ty(p).clone();
        want.dtype = DType::BF16;
        (is_copy(train, c) && *train.ty(c) == want).then_some(c)
    };
    let casts = |id: NodeId| cast_of(&eval, id).filter(|(p, _)| copy_in_train(*p).is_some());
    if !eval.ids().any(|id| casts(id).is_some()) {
        return Ok(eval);
    }
    let Copied {
        out, copies, map, ..
    } = with_copies(&eval, casts)?;
    // A weight read only through its casts is no longer the evaluation's to name: a sharded
    // optimizer's training step holds only its rows.
    let replaced: std::collections::HashSet<NodeId> =
        copies.keys().filter_map(|p| map[p.index()]).collect();
    Ok(out.without_dead_code_and(|id| replaced.contains(&id)).0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autodiff::{training_step_with, StepOptions};
    use crate::models;

    fn step(cast: bool) -> crate::autodiff::Step {
        let m = models::by_name("gpt:vocab=64,d_model=32,layers=2,heads=4,d_ff=64,seq=8,batch=2")
            .unwrap();
        let forward = crate::precision::Precision::Bf16.apply(&m.graph).unwrap();
        let opts = StepOptions {
            cast_weights_each_step: cast,
            ..StepOptions::default()
        };
        training_step_with(&forward, &m.optimizer, &opts).unwrap()
    }

    #[test]
    fn an_evaluation_reads_the_training_steps_copies_in_place_of_casting_their_weights() {
        let m = models::by_name("gpt:vocab=64,d_model=32,layers=2,heads=4,d_ff=64,seq=8,batch=2")
            .unwrap();
        let eval = crate::precision::Precision::Bf16
            .apply(m.eval_graph())
            .unwrap();
        let casts = |g: &Graph| g.ids().filter(|&id| cast_param(g, id).is_some()).count();
        assert!(casts(&eval) >= 8, "the evaluation casts its weights");
        // Against a step that casts each time (no copies) it is left as it is.
        let plain = read_weight_copies(eval.clone(), &step(true).graph).unwrap();
        assert_eq!(casts(&plain), casts(&eval));
        let train = step(false).graph;
        let read = read_weight_copies(eval.clone(), &train).unwrap();
        assert_eq!(casts(&read), 0, "no weight is cast");
        for c in read.leaves(LeafKind::State) {
            let name = read.leaf_name(c).unwrap();
            if let Some(p) = name.strip_suffix(SUFFIX) {
                assert!(read.leaf(p).is_none(), "{p} is read only as its copy");
                assert_eq!(read.ty(c), train.ty(train.leaf(name).unwrap()), "{name}");
            }
        }
    }

    /// The parameter a cast to bf16 reads, through views, if it reads one.
    fn cast_param(g: &Graph, id: NodeId) -> Option<NodeId> {
        let n = g.node(id);
        if !(matches!(n.op, Op::Convert) && n.ty.dtype == DType::BF16) {
            return None;
        }
        let mut x = n.inputs[0];
        while matches!(g.node(x).op, Op::Transpose { .. } | Op::Reshape) {
            x = g.node(x).inputs[0];
        }
        g.leaves(LeafKind::Parameter).contains(&x).then_some(x)
    }

    #[test]
    fn a_bf16_step_reads_each_cast_weight_from_its_copy_which_the_update_writes_as_its_cast() {
        let (cast, kept) = (step(true), step(false));
        let cast_params: std::collections::BTreeSet<String> = cast
            .graph
            .ids()
            .filter_map(|id| cast_param(&cast.graph, id))
            .map(|p| cast.graph.leaf_name(p).unwrap().to_string())
            .collect();
        assert!(cast_params.len() >= 8, "{cast_params:?}");
        let g = &kept.graph;
        assert!(
            !g.ids().any(|id| cast_param(g, id).is_some()),
            "no step casts a weight"
        );
        let copies: Vec<NodeId> = g
            .leaves(LeafKind::State)
            .into_iter()
            .filter(|&c| is_copy(g, c))
            .collect();
        let copied: std::collections::BTreeSet<String> = copies
            .iter()
            .map(|&c| g.leaf_name(param_of(g, c).unwrap()).unwrap().to_string())
            .collect();
        assert_eq!(copied, cast_params, "one copy for each weight cast");
        for &c in &copies {
            let p = param_of(g, c).unwrap();
            let update = |t: NodeId| g.updates.iter().find(|u| u.target == t).unwrap().value;
            let v = update(c);
            assert!(matches!(g.node(v).op, Op::Convert), "{}", g.describe(v));
            assert_eq!(g.node(v).inputs[0], update(p), "the cast of the new weight");
            assert!(kept.phases.optimizer.contains(&v.index()));
            assert!(g.origin(v).to_string().contains("update of"));
        }
        // Everything else is the same step.
        assert_eq!(g.updates.len(), cast.graph.updates.len() + copies.len());
        assert_eq!(
            kept.phases.backward.len(),
            cast.phases.backward.len(),
            "the backward pass is unchanged"
        );
    }

    #[test]
    fn an_f32_step_keeps_no_copies() {
        let m = models::by_name("gpt:vocab=64,d_model=32,layers=2,heads=4,d_ff=64,seq=8,batch=2")
            .unwrap();
        let s = training_step_with(&m.graph, &m.optimizer, &StepOptions::default()).unwrap();
        let g = &s.graph;
        assert!(!g.leaves(LeafKind::State).into_iter().any(|c| is_copy(g, c)));
    }
}
