//! The rewrite rules.
//!
//! Our ops carry attributes (permutations, shapes, axes) that egg's textual patterns cannot
//! generalise over, so each rule is a small Rust function that looks at one e-class (its e-nodes,
//! its operands' e-nodes and the analysis data) and proposes [`Recipe`]s: a few e-nodes to add,
//! the last of which (or an existing class) equals the class. [`Rule::rewrite`] wraps such a
//! function as an egg [`egg::Rewrite`], so egg's [`egg::Runner`] schedules, applies and reports
//! it like any other rule.
//!
//! Every rule is sound for the IR's semantics, exactly or up to float rounding where its doc says
//! so. None folds `x * 0` for a non-constant `x` (NaN and infinities). Each recipe node is
//! type-checked with [`crate::ir::infer`] before it is added, and a recipe whose type differs from
//! the class it is unioned with is refused and recorded: both are rule bugs, and
//! [`super::simplify`] reports them as errors.

use super::analysis::{self, numel, EGraph};
use super::index;
use super::lang::{Dims, ENode, Kind, Ty};
use crate::ir::{BinaryOp, DType, ReduceOp, TensorType, UnaryOp};
use egg::{Id, Searcher, Subst, Symbol, Var};
use smallvec::SmallVec;
use std::sync::{Arc, Mutex};

/// An operand of a recipe node: an existing e-class, or an earlier node of the recipe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    Class(Id),
    New(usize),
}

impl From<Id> for Arg {
    fn from(id: Id) -> Arg {
        Arg::Class(id)
    }
}

/// What a rule proposes for an e-class: e-nodes to add (operands before users), and the class or
/// new node that equals the matched class.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Recipe {
    pub nodes: Vec<(Kind, SmallVec<[Arg; 3]>)>,
    pub result: Option<Arg>,
}

impl Recipe {
    /// The matched class equals the existing class `id`.
    pub fn class(id: Id) -> Recipe {
        Recipe {
            nodes: Vec::new(),
            result: Some(Arg::Class(id)),
        }
    }

    /// The matched class equals one new node.
    pub fn single(kind: Kind, args: &[Arg]) -> Recipe {
        let mut r = Recipe::default();
        let n = r.node(kind, args);
        r.done(n)
    }

    /// Adds a node to build, returning a reference to it for later nodes.
    pub fn node(&mut self, kind: Kind, args: &[Arg]) -> Arg {
        self.nodes.push((kind, SmallVec::from_slice(args)));
        Arg::New(self.nodes.len() - 1)
    }

    pub fn done(mut self, result: Arg) -> Recipe {
        self.result = Some(result);
        self
    }
}

/// A rule's search function: proposals for one e-class.
pub type Find = fn(&EGraph, Id, &mut Vec<Recipe>);

/// A named rule.
#[derive(Clone, Copy)]
pub struct Rule {
    pub name: &'static str,
    pub find: Find,
    /// The [`Kind::tag`]s (and [`index::CONSTANT`]) of the classes `find` can match: it finds
    /// nothing in a class holding none of them, so the search passes such classes by
    /// ([`index`]).
    pub roots: u64,
    /// For a rule that looks through an operand, the [`Kind::tag`]s (and [`index::CONSTANT`])
    /// that operand's class must hold: `find` finds nothing in a class none of whose e-nodes
    /// reads a class holding one of them, and the search passes such classes by too. 0: no
    /// condition on the operands.
    pub operands: u64,
}

impl Rule {
    /// This rule as an egg rewrite.
    pub fn rewrite(self) -> egg::Rewrite<ENode, analysis::Facts> {
        let shared = Arc::new(Shared {
            rule: self,
            found: Mutex::new(Vec::new()),
        });
        egg::Rewrite::new(self.name, RuleSearcher(shared.clone()), RuleApplier(shared))
            .expect("a rule binds no pattern variables")
    }
}

/// The proposals of a rule's last search, which its applier builds. egg searches every rule
/// before applying any, and hands the applier only class ids (`Subst`s), so each match's subst
/// holds the index of its recipe under [`RECIPE`].
struct Shared {
    rule: Rule,
    found: Mutex<Vec<Recipe>>,
}

/// The pattern variable whose "class id" is the index of a recipe in [`Shared::found`].
const RECIPE: u32 = 0;

struct RuleSearcher(Arc<Shared>);
struct RuleApplier(Arc<Shared>);

impl RuleSearcher {
    fn search_class(
        &self,
        egraph: &EGraph,
        class: Id,
        found: &mut Vec<Recipe>,
        scratch: &mut Vec<Recipe>,
    ) -> Option<egg::SearchMatches<'static, ENode>> {
        scratch.clear();
        (self.0.rule.find)(egraph, class, scratch);
        if scratch.is_empty() {
            return None;
        }
        let mut substs = Vec::with_capacity(scratch.len());
        for r in scratch.drain(..) {
            let mut s = Subst::with_capacity(1);
            s.insert(Var::from_u32(RECIPE), Id::from(found.len()));
            found.push(r);
            substs.push(s);
        }
        Some(egg::SearchMatches {
            eclass: class,
            substs,
            ast: None,
        })
    }
}

impl Searcher<ENode, analysis::Facts> for RuleSearcher {
    fn search_eclass_with_limit(
        &self,
        egraph: &EGraph,
        eclass: Id,
        limit: usize,
    ) -> Option<egg::SearchMatches<'_, ENode>> {
        let mut found = self.0.found.lock().unwrap_or_else(|e| e.into_inner());
        let mut m = self.search_class(egraph, eclass, &mut found, &mut Vec::new())?;
        m.substs.truncate(limit);
        Some(m)
    }

    /// Searches every class that holds one of the rule's roots, in id order (so that the order
    /// of matches, and of the unions they lead to, is the same on every run; the classes passed
    /// by are those where the rule finds nothing).
    fn search_with_limit(
        &self,
        egraph: &EGraph,
        limit: usize,
    ) -> Vec<egg::SearchMatches<'_, ENode>> {
        let mut found = self.0.found.lock().unwrap_or_else(|e| e.into_inner());
        found.clear();
        let rule = &self.0.rule;
        let ids = index::ClassIndex::matching(egraph, rule.roots, rule.operands);
        let mut out = Vec::new();
        let mut scratch = Vec::new();
        let mut total = 0;
        for id in ids {
            if total >= limit {
                break;
            }
            if let Some(mut m) = self.search_class(egraph, id, &mut found, &mut scratch) {
                m.substs.truncate(limit - total);
                total += m.substs.len();
                out.push(m);
            }
        }
        out
    }

    fn vars(&self) -> Vec<Var> {
        Vec::new()
    }
}

impl egg::Applier<ENode, analysis::Facts> for RuleApplier {
    fn apply_one(
        &self,
        egraph: &mut EGraph,
        eclass: Id,
        subst: &Subst,
        _searcher_ast: Option<&egg::PatternAst<ENode>>,
        _rule_name: Symbol,
    ) -> Vec<Id> {
        let recipe = {
            let found = self.0.found.lock().unwrap_or_else(|e| e.into_inner());
            subst
                .get(Var::from_u32(RECIPE))
                .and_then(|&i| found.get(usize::from(i)).cloned())
        };
        match recipe.and_then(|r| apply(egraph, self.0.rule.name, eclass, &r)) {
            Some(id) => vec![id],
            None => Vec::new(),
        }
    }
}

/// Builds `recipe` and unions its result with `class`; returns the result's class when the
/// union changed the e-graph. A node that does not type-check, or a result whose type differs
/// from the class's, is recorded as an error of `rule` and nothing is unioned.
pub fn apply(egraph: &mut EGraph, rule: &str, class: Id, recipe: &Recipe) -> Option<Id> {
    let mut built: SmallVec<[Id; 4]> = SmallVec::new();
    let resolve = |a: Arg, built: &[Id]| match a {
        Arg::Class(id) => Some(id),
        Arg::New(i) => built.get(i).copied(),
    };
    for (kind, args) in &recipe.nodes {
        let ids: Option<SmallVec<[Id; 3]>> = args.iter().map(|&a| resolve(a, &built)).collect();
        let Some(ids) = ids else {
            egraph
                .analysis
                .error(format!("rule {rule:?} refers to a node it has not built"));
            return None;
        };
        let checked = {
            let types: SmallVec<[&TensorType; 3]> =
                ids.iter().map(|&c| &egraph[c].data.ty).collect();
            kind.result_type(&types, &egraph.analysis.leaf_types)
        };
        if let Err(e) = checked {
            egraph
                .analysis
                .error(format!("rule {rule:?} built an ill-typed node: {e}"));
            return None;
        }
        built.push(egraph.add(ENode {
            kind: kind.clone(),
            args: ids,
        }));
    }
    let result = recipe.result.and_then(|a| resolve(a, &built))?;
    let (want, got) = (&egraph[class].data.ty, &egraph[result].data.ty);
    if want != got {
        let message = format!(
            "rule {rule:?} equated e-classes of different types {want} and {got} (a bug in the rule)"
        );
        egraph.analysis.error(message);
        return None;
    }
    egraph.union(class, result).then_some(result)
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn ty(eg: &EGraph, id: Id) -> &TensorType {
    &eg[id].data.ty
}

fn dims(eg: &EGraph, id: Id) -> &[usize] {
    eg[id].data.ty.shape.dims()
}

fn konst(eg: &EGraph, id: Id) -> Option<f64> {
    eg[id].data.constant
}

/// True when the class is a known constant equal to `v` (`0.0` matches both zeros).
fn is(eg: &EGraph, id: Id, v: f64) -> bool {
    konst(eg, id) == Some(v)
}

fn nodes(eg: &EGraph, id: Id) -> &[ENode] {
    &eg[id].nodes
}

fn same(eg: &EGraph, a: Id, b: Id) -> bool {
    eg.find(a) == eg.find(b)
}

/// The e-nodes of class `id` that are `kind`-like, as (node, operands).
fn nodes_where<'a>(
    eg: &'a EGraph,
    id: Id,
    pred: impl Fn(&Kind) -> bool + 'a,
) -> impl Iterator<Item = &'a ENode> + 'a {
    nodes(eg, id).iter().filter(move |n| pred(&n.kind))
}

fn is_identity(perm: &[usize]) -> bool {
    perm.iter().enumerate().all(|(i, &p)| i == p)
}

/// True for a permutation that swaps exactly the last two axes (and keeps the batch axes).
pub fn swaps_last_two(perm: &[usize]) -> bool {
    let r = perm.len();
    r >= 2 && is_identity(&perm[..r - 2]) && perm[r - 2] == r - 1 && perm[r - 1] == r - 2
}

fn with_dims(t: &TensorType, dims: &[usize]) -> Ty {
    Ty {
        dtype: t.dtype,
        dims: Dims::from_slice(dims),
    }
}

const MUL: Kind = Kind::Binary(BinaryOp::Mul);

// ---------------------------------------------------------------------------------------------
// The rules
// ---------------------------------------------------------------------------------------------

/// Every rule, in the order egg applies them (and the report lists them).
pub fn all() -> Vec<Rule> {
    // `name => find @ roots`, and `; operands` for a rule that looks through an operand.
    macro_rules! rules {
        ($($name:literal => $f:ident @ $roots:expr $(; $operands:expr)?),* $(,)?) => {
            vec![$(Rule { name: $name, find: $f, roots: $roots, operands: 0 $(| $operands)? }),*]
        };
    }
    let tag = |k: Kind| k.tag();
    let binary = |op: BinaryOp| Kind::Binary(op).tag();
    let broadcast = tag(Kind::Broadcast(Dims::new()));
    let reshape = tag(Kind::Reshape(Dims::new()));
    let transpose = tag(Kind::Transpose(Dims::new()));
    let reduce = tag(Kind::Reduce(ReduceOp::Sum, Dims::new()));
    let convert = tag(Kind::Convert(DType::F32));
    let (neg, konst) = (tag(NEG), index::CONSTANT);
    let concat = tag(Kind::Concat(0));
    let matmul = tag(Kind::MatMul {
        ta: false,
        tb: false,
    });
    rules![
        "stop-gradient" => stop_gradient @ tag(Kind::StopGradient),
        "mul-one" => mul_one @ tag(MUL); konst,
        "add-zero" => add_zero @ binary(BinaryOp::Add); konst,
        "sub-zero" => sub_zero @ binary(BinaryOp::Sub); konst,
        "div-one" => div_one @ binary(BinaryOp::Div); konst,
        "neg-neg" => neg_neg @ neg; neg,
        "select-same" => select_same @ tag(Kind::Select),
        "select-const" => select_const @ tag(Kind::Select); konst,
        "max-min-same" => max_min_same @ binary(BinaryOp::Max) | binary(BinaryOp::Min),
        "convert-same" => convert_same @ convert,
        "convert-of-exact-convert" => convert_of_exact_convert @ convert; convert,
        "convert-of-broadcast" => convert_of_broadcast @ convert; broadcast,
        "broadcast-same" => broadcast_same @ broadcast,
        "reshape-same" => reshape_same @ reshape,
        "transpose-identity" => transpose_identity @ transpose,
        "reduce-unit-axes" => reduce_unit_axes @ reduce,
        "transpose-transpose" => transpose_transpose @ transpose; transpose,
        "reshape-reshape" => reshape_reshape @ reshape; reshape,
        "broadcast-broadcast" => broadcast_broadcast @ broadcast; broadcast,
        "reduce-of-broadcast" => reduce_of_broadcast @ reduce; broadcast,
        "constant-fold" => constant_fold @ konst,
        "mul-constants" => mul_constants @ tag(MUL); konst,
        "matmul-transposed-operand" => matmul_transposed_operand @ matmul; transpose,
        "transpose-of-matmul" => transpose_of_matmul @ transpose; matmul,
        "sum-of-neg" => sum_of_neg @ reduce; neg,
        "add-neg" => add_neg @ binary(BinaryOp::Add); neg,
        "sub-neg" => sub_neg @ binary(BinaryOp::Sub); neg,
        "add-of-padded-concats" => add_of_padded_concats @ binary(BinaryOp::Add); concat,
        "slice-of-concat" => slice_of_concat @ tag(Kind::Slice { axis: 0, start: 0, end: 0 }); concat,
    ]
}

/// `stop_gradient(x) => x`: autodiff has run, so the marker has no meaning left.
fn stop_gradient(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    for n in nodes_where(eg, c, |k| matches!(k, Kind::StopGradient)) {
        out.push(Recipe::class(n.args[0]));
    }
}

/// `x * 1 => x`, `1 * x => x` (1 any constant of ones: `full`, broadcast, ...).
fn mul_one(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    for n in nodes_where(eg, c, |k| *k == MUL) {
        let (a, b) = (n.args[0], n.args[1]);
        if is(eg, b, 1.0) {
            out.push(Recipe::class(a));
        } else if is(eg, a, 1.0) {
            out.push(Recipe::class(b));
        }
    }
}

/// `x + 0 => x`, `0 + x => x` (exact, except that `-0 + 0` is `+0`).
fn add_zero(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    for n in nodes_where(eg, c, |k| *k == Kind::Binary(BinaryOp::Add)) {
        let (a, b) = (n.args[0], n.args[1]);
        if is(eg, b, 0.0) {
            out.push(Recipe::class(a));
        } else if is(eg, a, 0.0) {
            out.push(Recipe::class(b));
        }
    }
}

/// `x - 0 => x`.
fn sub_zero(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    for n in nodes_where(eg, c, |k| *k == Kind::Binary(BinaryOp::Sub)) {
        if is(eg, n.args[1], 0.0) {
            out.push(Recipe::class(n.args[0]));
        }
    }
}

/// `x / 1 => x`.
fn div_one(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    for n in nodes_where(eg, c, |k| *k == Kind::Binary(BinaryOp::Div)) {
        if is(eg, n.args[1], 1.0) {
            out.push(Recipe::class(n.args[0]));
        }
    }
}

const NEG: Kind = Kind::Unary(UnaryOp::Neg);

/// `neg(neg(x)) => x`.
fn neg_neg(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    for n in nodes_where(eg, c, |k| *k == NEG) {
        for m in nodes_where(eg, n.args[0], |k| *k == NEG) {
            out.push(Recipe::class(m.args[0]));
        }
    }
}

/// `select(c, x, x) => x`.
fn select_same(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    for n in nodes_where(eg, c, |k| *k == Kind::Select) {
        if same(eg, n.args[1], n.args[2]) {
            out.push(Recipe::class(n.args[1]));
        }
    }
}

/// `select(true, a, b) => a`, `select(false, a, b) => b`.
fn select_const(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    for n in nodes_where(eg, c, |k| *k == Kind::Select) {
        if let Some(v) = konst(eg, n.args[0]) {
            out.push(Recipe::class(n.args[if v != 0.0 { 1 } else { 2 }]));
        }
    }
}

/// `max(x, x) => x`, `min(x, x) => x`.
fn max_min_same(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    let pred = |k: &Kind| matches!(k, Kind::Binary(BinaryOp::Max | BinaryOp::Min));
    for n in nodes_where(eg, c, pred) {
        if same(eg, n.args[0], n.args[1]) {
            out.push(Recipe::class(n.args[0]));
        }
    }
}

/// `convert(x) => x` when `x` already has the target dtype.
fn convert_same(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    for n in nodes(eg, c) {
        if let Kind::Convert(to) = n.kind {
            if ty(eg, n.args[0]).dtype == to {
                out.push(Recipe::class(n.args[0]));
            }
        }
    }
}

/// Whether converting any value of `from` to `to` is exact and converting it back gives the
/// value itself: `to` holds every value of `from`. bf16 ⊂ f32 ⊂ f64 (each has the other's
/// exponent range or more, and more significand bits), i32 ⊂ i64, i32 ⊂ f64 (53 significand
/// bits), and bool's 0 and 1 are in every dtype (and come back as false and true). f32 is not
/// in bf16 (16 significand bits are dropped by rounding), nor i32 in f32, nor i64 in f64.
/// (NaN payloads aside: a signalling NaN may come back quieted, still a NaN.)
pub fn holds_every_value(from: DType, to: DType) -> bool {
    use DType::*;
    from == to
        || matches!(
            (from, to),
            (BF16, F32 | F64) | (F32, F64) | (I32, I64 | F64) | (Bool, _)
        )
}

/// `convert(convert(x) : B) : C => convert(x) : C` (or `x` when `x` is already `C`) when `B`
/// holds every value of `x`'s dtype `A` ([`holds_every_value`]): the inner conversion changes
/// no value, so the outer one sees `x`'s own values. With `C = A` the pair cancels:
/// `bf16 -> f32 -> bf16` is `x`, while `f32 -> bf16 -> f32` is not (it rounds) and stays.
/// `A -> B -> C` equals `A -> C` because every conversion is a function of the value alone
/// (float targets round the exact value once; integer targets truncate it; bool tests it for
/// zero), and the value is unchanged by `A -> B`.
fn convert_of_exact_convert(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    for n in nodes(eg, c) {
        let Kind::Convert(to) = n.kind else {
            continue;
        };
        for m in nodes(eg, n.args[0]) {
            let Kind::Convert(mid) = m.kind else {
                continue;
            };
            let x = m.args[0];
            let from = ty(eg, x).dtype;
            if !holds_every_value(from, mid) {
                continue;
            }
            if from == to {
                out.push(Recipe::class(x));
            } else {
                out.push(Recipe::single(Kind::Convert(to), &[x.into()]));
            }
        }
    }
}

/// `convert(broadcast(x, d)) => broadcast(convert(x), d)`: a conversion is elementwise, so it
/// commutes with the copy a broadcast makes, and is cheaper before it (a bias cast to bf16 once
/// per element of the bias, not of the activation it is added to). Exact.
fn convert_of_broadcast(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    for n in nodes(eg, c) {
        let Kind::Convert(to) = n.kind else {
            continue;
        };
        for m in nodes(eg, n.args[0]) {
            let Kind::Broadcast(d) = &m.kind else {
                continue;
            };
            let x = m.args[0];
            if numel(dims(eg, x)) >= numel(d) {
                continue;
            }
            let mut r = Recipe::default();
            let cx = r.node(Kind::Convert(to), &[x.into()]);
            let b = r.node(Kind::Broadcast(d.clone()), &[cx]);
            out.push(r.done(b));
        }
    }
}

/// `broadcast(x) => x` to `x`'s own shape.
fn broadcast_same(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    for n in nodes(eg, c) {
        if let Kind::Broadcast(d) = &n.kind {
            if dims(eg, n.args[0]) == d.as_slice() {
                out.push(Recipe::class(n.args[0]));
            }
        }
    }
}

/// `reshape(x) => x` to `x`'s own shape.
fn reshape_same(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    for n in nodes(eg, c) {
        if let Kind::Reshape(d) = &n.kind {
            if dims(eg, n.args[0]) == d.as_slice() {
                out.push(Recipe::class(n.args[0]));
            }
        }
    }
}

/// `transpose(x, [0, 1, ...]) => x`.
fn transpose_identity(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    for n in nodes(eg, c) {
        if let Kind::Transpose(p) = &n.kind {
            if is_identity(p) {
                out.push(Recipe::class(n.args[0]));
            }
        }
    }
}

/// `reduce(x, axes) => x` when every reduced axis has size 1 (a sum or max of one element).
fn reduce_unit_axes(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    for n in nodes(eg, c) {
        if let Kind::Reduce(_, axes) = &n.kind {
            let d = dims(eg, n.args[0]);
            if axes.iter().all(|&a| d.get(a) == Some(&1)) {
                out.push(Recipe::class(n.args[0]));
            }
        }
    }
}

/// `transpose(transpose(x, p1), p2) => transpose(x, q)` with `q[i] = p1[p2[i]]`, or `x` when `q`
/// is the identity.
fn transpose_transpose(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    for n in nodes(eg, c) {
        let Kind::Transpose(p2) = &n.kind else {
            continue;
        };
        for m in nodes(eg, n.args[0]) {
            let Kind::Transpose(p1) = &m.kind else {
                continue;
            };
            let q: Option<Dims> = p2.iter().map(|&i| p1.get(i).copied()).collect();
            let Some(q) = q else { continue };
            if is_identity(&q) {
                out.push(Recipe::class(m.args[0]));
            } else {
                out.push(Recipe::single(Kind::Transpose(q), &[m.args[0].into()]));
            }
        }
    }
}

/// `reshape(reshape(x)) => reshape(x)` (or `x` when the shapes agree).
fn reshape_reshape(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    for n in nodes(eg, c) {
        let Kind::Reshape(s2) = &n.kind else { continue };
        for m in nodes_where(eg, n.args[0], |k| matches!(k, Kind::Reshape(_))) {
            let x = m.args[0];
            if dims(eg, x) == s2.as_slice() {
                out.push(Recipe::class(x));
            } else {
                out.push(Recipe::single(Kind::Reshape(s2.clone()), &[x.into()]));
            }
        }
    }
}

/// `broadcast(broadcast(x)) => broadcast(x)`: right-aligned broadcasting composes.
fn broadcast_broadcast(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    for n in nodes(eg, c) {
        let Kind::Broadcast(s2) = &n.kind else {
            continue;
        };
        for m in nodes_where(eg, n.args[0], |k| matches!(k, Kind::Broadcast(_))) {
            let x = m.args[0];
            if dims(eg, x) == s2.as_slice() {
                out.push(Recipe::class(x));
            } else {
                out.push(Recipe::single(Kind::Broadcast(s2.clone()), &[x.into()]));
            }
        }
    }
}

/// A reduction over axes that a broadcast expanded (new axes, or axes where the operand has
/// size 1) reads each operand element `count` times:
/// `reduce_sum(broadcast(x, t), axes) => b(x) * full(count)` and
/// `reduce_max(broadcast(x, t), axes) => b(x)`, where `b(x)` is `x` itself when it has the
/// result's shape, a reshape of it when only size-1 axes differ, else a smaller broadcast.
/// (The sum is up to float rounding: the kernel adds, the rewrite multiplies.)
fn reduce_of_broadcast(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    for n in nodes(eg, c) {
        let Kind::Reduce(op, axes) = &n.kind else {
            continue;
        };
        for m in nodes(eg, n.args[0]) {
            let Kind::Broadcast(t) = &m.kind else {
                continue;
            };
            let x = m.args[0];
            if let Some(r) = reduce_broadcast_recipe(eg, *op, axes, t, x) {
                out.push(r);
            }
        }
    }
}

fn reduce_broadcast_recipe(
    eg: &EGraph,
    op: ReduceOp,
    axes: &[usize],
    t: &[usize],
    x: Id,
) -> Option<Recipe> {
    let s = dims(eg, x);
    let off = t.len().checked_sub(s.len())?;
    let expanded = |i: usize| i < t.len() && (i < off || s[i - off] == 1);
    if !axes.iter().all(|&i| expanded(i)) {
        return None;
    }
    let mut t2 = Dims::from_slice(t);
    for &i in axes {
        t2[i] = 1;
    }
    let count = axes
        .iter()
        .try_fold(1usize, |acc, &i| acc.checked_mul(t[i]))?;
    if count == 0 {
        return None;
    }
    let xt = ty(eg, x);
    let mut r = Recipe::default();
    let base = if s == t2.as_slice() {
        Arg::Class(x)
    } else if numel(s)? == numel(&t2)? {
        r.node(Kind::Reshape(t2.clone()), &[x.into()])
    } else {
        r.node(Kind::Broadcast(t2.clone()), &[x.into()])
    };
    if op == ReduceOp::Max || count == 1 {
        return Some(r.done(base));
    }
    let fits = match xt.dtype {
        DType::F32 | DType::F64 => true,
        DType::I32 => count <= i32::MAX as usize,
        DType::I64 => count <= 1 << 53,
        DType::Bool => false,
        // `full(count)` must hold the count exactly (bf16 holds the integers up to 256).
        DType::BF16 => count <= 256,
    };
    if !fits {
        return None;
    }
    let k = r.node(Kind::full(count as f64, with_dims(xt, &t2)), &[]);
    let p = r.node(MUL, &[base, k]);
    Some(r.done(p))
}

/// A class whose value is a known constant (see [`super::analysis`]) gets a `full` node.
fn constant_fold(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    let class = &eg[c];
    let d = &class.data;
    let Some(v) = d.constant else { return };
    if d.leaf.is_some()
        || class
            .nodes
            .iter()
            .any(|n| matches!(n.kind, Kind::Full { .. }))
    {
        return;
    }
    out.push(Recipe::single(Kind::full(v, Ty::of(&d.ty)), &[]));
}

/// `(x * c1) * c2 => x * (c1 * c2)` for constants `c1`, `c2` (either operand order), when the
/// product of the constants is exact (so the rewrite is too, up to the order of roundings of
/// `x`'s products) and neither they nor it are 0, infinite or NaN.
///
/// Those conditions keep saturation finite. With a degenerate constant the class comes to hold
/// `k * itself` (`(x * 0) * k` is `x * 0`), from which every power of `k` follows, one new
/// constant per iteration; with inexact products, constants around a cycle drift by an ulp per
/// iteration. Exact, nonzero products around a cycle multiply to 1, and stay a finite set.
fn mul_constants(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    let ok = |v: f64| v != 0.0 && v.is_finite();
    let split = |a: Id, b: Id| match (konst(eg, a), konst(eg, b)) {
        (None, Some(v)) if ok(v) => Some((a, v)),
        (Some(v), None) if ok(v) => Some((b, v)),
        _ => None,
    };
    let t = ty(eg, c);
    for n in nodes_where(eg, c, |k| *k == MUL) {
        let Some((inner, c2)) = split(n.args[0], n.args[1]) else {
            continue;
        };
        if same(eg, inner, c) {
            continue;
        }
        for m in nodes_where(eg, inner, |k| *k == MUL) {
            let Some((x, c1)) = split(m.args[0], m.args[1]) else {
                continue;
            };
            let Some(p) = analysis::binary(BinaryOp::Mul, c1, c2, t.dtype) else {
                continue;
            };
            // The residual of the rounded product, computed exactly by a fused multiply-add.
            let exact = !t.dtype.is_float() || c1.mul_add(c2, -p) == 0.0;
            if !ok(p) || !exact || same(eg, x, c) {
                continue;
            }
            let mut r = Recipe::default();
            let k = r.node(Kind::full(p, Ty::of(t)), &[]);
            let y = r.node(MUL, &[x.into(), k]);
            out.push(r.done(y));
        }
    }
}

/// `matmul{ta,tb}(transpose_last(x), y) => matmul{!ta,tb}(x, y)`, and likewise for the second
/// operand: the transposed operand is read in place, never materialized.
fn matmul_transposed_operand(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    for n in nodes(eg, c) {
        let Kind::MatMul { ta, tb } = n.kind else {
            continue;
        };
        let (a, b) = (n.args[0], n.args[1]);
        for m in nodes(eg, a) {
            if matches!(&m.kind, Kind::Transpose(p) if swaps_last_two(p)) {
                let k = Kind::MatMul { ta: !ta, tb };
                out.push(Recipe::single(k, &[m.args[0].into(), b.into()]));
            }
        }
        for m in nodes(eg, b) {
            if matches!(&m.kind, Kind::Transpose(p) if swaps_last_two(p)) {
                let k = Kind::MatMul { ta, tb: !tb };
                out.push(Recipe::single(k, &[a.into(), m.args[0].into()]));
            }
        }
    }
}

/// `transpose_last(matmul{ta,tb}(a, b)) => matmul{!tb,!ta}(b, a)`: `(AB)ᵀ = BᵀAᵀ`, so a weight
/// gradient is produced in the weight's layout instead of being transposed afterwards.
fn transpose_of_matmul(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    for n in nodes(eg, c) {
        if !matches!(&n.kind, Kind::Transpose(p) if swaps_last_two(p)) {
            continue;
        }
        for m in nodes(eg, n.args[0]) {
            if let Kind::MatMul { ta, tb } = m.kind {
                let k = Kind::MatMul { ta: !tb, tb: !ta };
                out.push(Recipe::single(k, &[m.args[1].into(), m.args[0].into()]));
            }
        }
    }
}

/// `reduce_sum(neg(x)) => neg(reduce_sum(x))`: exact (rounding is symmetric under negation), and
/// the negation runs on the small result.
fn sum_of_neg(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    for n in nodes(eg, c) {
        let Kind::Reduce(ReduceOp::Sum, axes) = &n.kind else {
            continue;
        };
        for m in nodes_where(eg, n.args[0], |k| *k == NEG) {
            let mut r = Recipe::default();
            let s = r.node(
                Kind::Reduce(ReduceOp::Sum, axes.clone()),
                &[m.args[0].into()],
            );
            let y = r.node(NEG, &[s]);
            out.push(r.done(y));
        }
    }
}

/// `a + neg(b) => a - b`, `neg(a) + b => b - a` (exact).
fn add_neg(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    let sub = Kind::Binary(BinaryOp::Sub);
    for n in nodes_where(eg, c, |k| *k == Kind::Binary(BinaryOp::Add)) {
        let (a, b) = (n.args[0], n.args[1]);
        for m in nodes_where(eg, b, |k| *k == NEG) {
            out.push(Recipe::single(sub.clone(), &[a.into(), m.args[0].into()]));
        }
        for m in nodes_where(eg, a, |k| *k == NEG) {
            out.push(Recipe::single(sub.clone(), &[b.into(), m.args[0].into()]));
        }
    }
}

/// `a - neg(b) => a + b` (exact).
fn sub_neg(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    let add = Kind::Binary(BinaryOp::Add);
    for n in nodes_where(eg, c, |k| *k == Kind::Binary(BinaryOp::Sub)) {
        for m in nodes_where(eg, n.args[1], |k| *k == NEG) {
            out.push(Recipe::single(
                add.clone(),
                &[n.args[0].into(), m.args[0].into()],
            ));
        }
    }
}

/// The sum of two concatenations along one axis, where pieces are zero, adds only what is not
/// zero: `concat(0, g1) + concat(g2, 0) => concat(g2, g1)` (autodiff sums the zero-padded
/// gradients of slices this way). Boundaries of the two sides may differ as long as every
/// piece that would need cutting is a constant.
fn add_of_padded_concats(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    for n in nodes_where(eg, c, |k| *k == Kind::Binary(BinaryOp::Add)) {
        for ca in nodes(eg, n.args[0]) {
            let Kind::Concat(axis) = ca.kind else {
                continue;
            };
            for cb in nodes(eg, n.args[1]) {
                if cb.kind != Kind::Concat(axis) {
                    continue;
                }
                if let Some(r) = merge_concats(eg, ty(eg, c), axis, &ca.args, &cb.args) {
                    out.push(r);
                }
            }
        }
    }
}

/// One side's piece over a segment: the part itself when it covers exactly the segment, and its
/// constant value when known.
#[derive(Clone, Copy)]
struct Piece {
    class: Option<Id>,
    constant: Option<f64>,
}

enum Seg {
    Const(f64),
    Class(Id),
    Add(Piece, Piece),
}

fn merge_concats(eg: &EGraph, t: &TensorType, axis: usize, pa: &[Id], pb: &[Id]) -> Option<Recipe> {
    let bounds = |parts: &[Id]| -> Option<Vec<usize>> {
        let mut b = vec![0usize];
        for &p in parts {
            let last = *b.last()?;
            b.push(last.checked_add(*dims(eg, p).get(axis)?)?);
        }
        Some(b)
    };
    let (ba, bb) = (bounds(pa)?, bounds(pb)?);
    let mut cuts: Vec<usize> = ba.iter().chain(&bb).copied().collect();
    cuts.sort_unstable();
    cuts.dedup();
    let piece = |parts: &[Id], bounds: &[usize], s: usize, e: usize| -> Option<Piece> {
        let j = (0..parts.len()).find(|&j| bounds[j] <= s && e <= bounds[j + 1])?;
        let aligned = bounds[j] == s && bounds[j + 1] == e;
        let p = Piece {
            class: aligned.then_some(parts[j]),
            constant: konst(eg, parts[j]),
        };
        (p.class.is_some() || p.constant.is_some()).then_some(p)
    };
    let whole = |p: Piece| match p.constant {
        Some(v) => Some(Seg::Const(v)),
        None => p.class.map(Seg::Class),
    };
    let mut segs: Vec<(usize, Seg)> = Vec::new();
    let mut saw_zero = false;
    for w in cuts.windows(2) {
        let (s, e) = (w[0], w[1]);
        if s == e {
            continue;
        }
        let (a, b) = (piece(pa, &ba, s, e)?, piece(pb, &bb, s, e)?);
        let seg = if a.constant == Some(0.0) {
            saw_zero = true;
            whole(b)?
        } else if b.constant == Some(0.0) {
            saw_zero = true;
            whole(a)?
        } else if let (Some(x), Some(y)) = (a.constant, b.constant) {
            Seg::Const(analysis::binary(BinaryOp::Add, x, y, t.dtype)?)
        } else {
            Seg::Add(a, b)
        };
        // Neighbouring equal constants become one piece.
        if let (Seg::Const(v), Some((len, Seg::Const(u)))) = (&seg, segs.last_mut()) {
            if v.to_bits() == u.to_bits() {
                *len += e - s;
                continue;
            }
        }
        segs.push((e - s, seg));
    }
    if !saw_zero {
        return None;
    }
    let seg_ty = |len: usize| {
        let mut d = Dims::from_slice(t.shape.dims());
        d[axis] = len;
        with_dims(t, &d)
    };
    let mut r = Recipe::default();
    let mut args: Vec<Arg> = Vec::new();
    for (len, seg) in segs {
        let arg = match seg {
            Seg::Const(v) => r.node(Kind::full(v, seg_ty(len)), &[]),
            Seg::Class(id) => Arg::Class(id),
            Seg::Add(a, b) => {
                let mut operand = |p: Piece| match (p.class, p.constant) {
                    (Some(id), _) => Some(Arg::Class(id)),
                    (None, Some(v)) => Some(r.node(Kind::full(v, seg_ty(len)), &[])),
                    (None, None) => None,
                };
                let (x, y) = (operand(a)?, operand(b)?);
                r.node(Kind::Binary(BinaryOp::Add), &[x, y])
            }
        };
        args.push(arg);
    }
    let result = match args.as_slice() {
        [one] => *one,
        _ => r.node(Kind::Concat(axis), &args),
    };
    Some(r.done(result))
}

/// `slice(concat(.., p, ..), range inside p) => slice(p)` (or `p` when the range is all of it).
fn slice_of_concat(eg: &EGraph, c: Id, out: &mut Vec<Recipe>) {
    for n in nodes(eg, c) {
        let Kind::Slice { axis, start, end } = n.kind else {
            continue;
        };
        for m in nodes(eg, n.args[0]) {
            if m.kind != Kind::Concat(axis) {
                continue;
            }
            let mut at = 0usize;
            for &p in &m.args {
                let Some(&len) = dims(eg, p).get(axis) else {
                    break;
                };
                let next = at.saturating_add(len);
                if at <= start && end <= next {
                    if start == at && end == next {
                        out.push(Recipe::class(p));
                    } else {
                        let k = Kind::Slice {
                            axis,
                            start: start - at,
                            end: end - at,
                        };
                        out.push(Recipe::single(k, &[p.into()]));
                    }
                    break;
                }
                at = next;
            }
        }
    }
}
