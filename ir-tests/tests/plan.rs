//! The memory planner: hand-made graphs whose best plan is known, the validator catching broken
//! plans, random graphs whose plans always validate, and the reference models' plans.

use ingot_compiler::autodiff::{training_step, Optimizer};
use ingot_compiler::ir::{DType, Graph, Init, NodeId, Shape};
use ingot_compiler::plan::check::{validate, PlanView, PlanViolation as V};
use ingot_compiler::plan::Location;
use ingot_compiler::plan::{self, align_up, MemoryPlan, PlanOptions, Region, ALIGNMENT};
use ingot_compiler::report::Report;
use ingot_compiler::schedule::{self, Strategy};
use proptest::prelude::*;

const KIB: usize = 1024;

fn f32s(n: usize) -> Shape {
    Shape::new(&[n / 4])
}

#[test]
fn an_elementwise_chain_reuses_its_dying_input_buffer() {
    let mut g = Graph::new();
    let x = g.input("x", f32s(64 * KIB), DType::F32).unwrap();
    let a = g.exp(x).unwrap();
    let b = g.neg(a).unwrap();
    let c = g.tanh(b).unwrap();
    let d = g.sqrt(c).unwrap();
    g.set_output("out", d).unwrap();
    let p = plan::plan(&g, &PlanOptions::default()).unwrap();
    // exp needs bytes of its own (x is an input and survives); the rest write over their operand.
    assert_eq!(p.slab_bytes, 64 * KIB);
    assert_eq!(p.load_bytes, 64 * KIB);
    let s = &p.liveness.storage_of;
    assert!(
        s[a.index()] == s[b.index()]
            && s[b.index()] == s[c.index()]
            && s[c.index()] == s[d.index()]
    );
}

#[test]
fn a_chain_of_buffers_costs_the_peak_not_the_sum() {
    // x -> m1 -> m2 -> m3 -> m4, each a matmul (never in place): two adjacent values at a time.
    let mut g = Graph::new();
    let x = g.input("x", [64, 64], DType::F32).unwrap();
    let w = g.parameter("w", [64, 64], DType::F32, Init::Zeros).unwrap();
    let mut v = x;
    for _ in 0..4 {
        v = g.matmul(v, w).unwrap();
    }
    g.set_output("out", v).unwrap();
    let p = plan::plan(&g, &PlanOptions::default()).unwrap();
    let one = 64 * 64 * 4;
    assert_eq!(p.load_bytes, 2 * one);
    assert_eq!(
        p.slab_bytes,
        2 * one,
        "four 16 KiB values should fit in two slots"
    );
    assert_eq!(p.resident_bytes, 2 * one);
    assert_eq!(p.total_bytes, 4 * one);
}

#[test]
fn a_reshape_is_a_view_and_takes_no_bytes() {
    let mut g = Graph::new();
    let x = g.input("x", [32, 32], DType::F32).unwrap();
    let a = g.exp(x).unwrap();
    let r = g.reshape(a, [1024]).unwrap();
    let s = g.sum_all(r).unwrap();
    g.set_output("s", s).unwrap();
    let p = plan::plan(&g, &PlanOptions::default()).unwrap();
    assert_eq!(
        p.liveness.storage_of[a.index()],
        p.liveness.storage_of[r.index()]
    );
    assert_eq!(
        p.load_bytes,
        4096 + align_up(4),
        "exp's value and the sum are live together, the view adds nothing"
    );
}

#[test]
fn parameter_updates_are_written_in_place() {
    for opt in [Optimizer::Sgd { lr: 0.1 }, Optimizer::adamw(1e-3, 0.01)] {
        let m = ingot_models::mlp_with(8, DType::F32).unwrap();
        let step = training_step(&m.graph, &opt).unwrap();
        let p = plan::plan(&step.graph, &PlanOptions::default()).unwrap();
        assert!(
            p.liveness.copies.is_empty(),
            "{opt:?}: every update should land in place, got copies {:?}",
            p.liveness.copies
        );
        for u in &step.graph.updates {
            let s = p.liveness.storage_of[u.value.index()];
            assert_eq!(s, p.liveness.storage_of[u.target.index()]);
            assert_eq!(p.liveness.storages[s].region, Region::Resident);
        }
    }
}

/// A traced order, each node's location, the plan's total, and its update copies.
type Placed = (Vec<NodeId>, Vec<Location>, usize, Vec<(NodeId, NodeId)>);

/// A plan of `g` for the traced order, as absolute locations the validator takes.
fn locations(g: &Graph) -> Placed {
    let p = plan::plan_order(
        g,
        &schedule::traced(g),
        Strategy::Traced,
        std::time::Duration::from_millis(100),
    )
    .unwrap();
    let locs = g.ids().map(|id| p.location(g, id)).collect();
    (
        p.liveness.order.clone(),
        locs,
        p.total_bytes,
        p.liveness.copies.clone(),
    )
}

fn check(
    g: &Graph,
    order: &[NodeId],
    locs: &[Location],
    total: usize,
    copies: &[(NodeId, NodeId)],
) -> Result<(), V> {
    check_ws(g, order, locs, &vec![None; g.len()], total, copies)
}

fn check_ws(
    g: &Graph,
    order: &[NodeId],
    locs: &[Location],
    ws: &[Option<Location>],
    total: usize,
    copies: &[(NodeId, NodeId)],
) -> Result<(), V> {
    validate(&PlanView {
        graph: g,
        order,
        location: locs,
        workspace: ws,
        workspace_filled_after: &vec![None; g.len()],
        copies,
        offload: &[],
        host_bytes: 0,
        total_bytes: total,
        alignment: ALIGNMENT,
    })
}

/// A matmul whose kernel needs 1 KiB of scratch: `x -> exp -> matmul -> add(exp, matmul)`.
fn matmul_with_workspace() -> (Graph, NodeId, NodeId) {
    let mut g = Graph::new();
    let x = g.input("x", [16, 16], DType::F32).unwrap();
    let a = g.exp(x).unwrap();
    let m = g.matmul(a, x).unwrap();
    let c = g.add(a, m).unwrap();
    g.set_output("c", c).unwrap();
    (g, a, m)
}

/// [`matmul_with_workspace`] planned with [`kib_for_matmul`]'s scratch.
struct PlannedWorkspace {
    g: Graph,
    a: NodeId,
    m: NodeId,
    p: MemoryPlan,
    /// Each node's place in the plan, and its workspace's.
    locs: Vec<Location>,
    ws: Vec<Option<Location>>,
}

fn planned_matmul_with_workspace() -> PlannedWorkspace {
    let (g, a, m) = matmul_with_workspace();
    let opts = PlanOptions {
        workspace: Some(kib_for_matmul),
        ..PlanOptions::default()
    };
    let p = plan::plan(&g, &opts).unwrap();
    let locs = g.ids().map(|id| p.location(&g, id)).collect();
    let ws = g.ids().map(|id| p.workspace(id)).collect();
    PlannedWorkspace {
        g,
        a,
        m,
        p,
        locs,
        ws,
    }
}

/// [`check_ws`] of the workspaces `ws` in `pw`'s plan.
fn check_planned_ws(pw: &PlannedWorkspace, ws: &[Option<Location>]) -> Result<(), V> {
    let p = &pw.p;
    check_ws(
        &pw.g,
        &p.liveness.order,
        &pw.locs,
        ws,
        p.total_bytes,
        &p.liveness.copies,
    )
}

fn kib_for_matmul(g: &Graph, id: NodeId) -> plan::WorkspaceNeed {
    plan::WorkspaceNeed::at_node(match g.node(id).op {
        ingot_compiler::ir::Op::MatMul { .. } => 1024,
        _ => 0,
    })
}

/// The matmul's 1 KiB filled from its first operand (as a scatter-add's sorted ids are).
fn kib_for_matmul_filled_from_its_first_operand(g: &Graph, id: NodeId) -> plan::WorkspaceNeed {
    plan::WorkspaceNeed {
        filled_from: Some(0).filter(|_| kib_for_matmul(g, id).bytes > 0),
        ..kib_for_matmul(g, id)
    }
}

/// `x -> a = exp(x) -> b = exp(a) -> m = matmul(a, x) -> c = b + m`: `b` is made between `a`
/// and the matmul and lives to the end. Returns the graph and `[x, a, b, m, c]`.
fn matmul_beside_a_live_value() -> (Graph, [NodeId; 5]) {
    let mut g = Graph::new();
    let x = g.input("x", [16, 16], DType::F32).unwrap();
    let a = g.exp(x).unwrap();
    let b = g.exp(a).unwrap();
    let m = g.matmul(a, x).unwrap();
    let c = g.add(b, m).unwrap();
    g.set_output("c", c).unwrap();
    (g, [x, a, b, m, c])
}

#[test]
fn a_workspace_filled_from_an_operand_is_held_from_where_that_operand_is_made() {
    // The matmul's workspace filled from a: it lives from a's position, beside b, so it may
    // not share b's bytes.
    let (g, [_, a, b, m, _]) = matmul_beside_a_live_value();
    for (need, early) in [
        (kib_for_matmul as plan::WorkspaceFn, false),
        (kib_for_matmul_filled_from_its_first_operand, true),
    ] {
        let opts = PlanOptions {
            workspace: Some(need),
            ..PlanOptions::default()
        };
        let p = plan::plan(&g, &opts).unwrap();
        let l = &p.liveness;
        let w = &l.storages[l.workspace_of[m.index()].unwrap()];
        let a_made = l.storages[l.storage_of[a.index()]].start;
        match early {
            true => assert_eq!(w.start, a_made),
            false => assert_eq!(w.start, l.position[m.index()]),
        }
        assert_eq!(w.end, l.position[m.index()] + 1);
        // Whatever is live between a and the matmul has bytes of its own.
        let (ws, bl) = (p.workspace(m).unwrap(), p.location(&g, b));
        let apart = ws.offset + ws.bytes <= bl.offset || bl.offset + bl.bytes <= ws.offset;
        if early {
            assert!(apart, "the workspace shares b's bytes: {ws:?} {bl:?}");
        }
    }
}

#[test]
fn a_kernel_workspace_is_planned_in_the_slab_only_while_its_op_runs() {
    let PlannedWorkspace { g, m, p, .. } = planned_matmul_with_workspace();
    let w = p.workspace(m).expect("the matmul has a workspace");
    assert_eq!(w.bytes, 1024);
    let s = p.liveness.workspace_of[m.index()].unwrap();
    assert_eq!(p.liveness.storages[s].end - p.liveness.storages[s].start, 1);
    let r = Report::new("ws", &g, &p, None);
    assert!(r.slab_bytes >= 1024 + 2 * 1024);
}

#[test]
fn the_validator_rejects_a_workspace_filled_early_that_a_value_made_before_its_node_writes_over() {
    // Each value 1 KiB of its own; m's workspace filled after a is made (position 1), read by
    // m (position 3).
    let (g, order) = matmul_beside_a_live_value();
    let [_, _, b, m, _] = order;
    let locs: Vec<Location> = (0..g.len())
        .map(|i| Location {
            offset: 1024 * i,
            bytes: 1024,
        })
        .collect();
    let run = |ws_at: usize, after: usize| {
        let mut ws = vec![None; g.len()];
        ws[m.index()] = Some(Location {
            offset: ws_at,
            bytes: 1024,
        });
        let mut filled = vec![None; g.len()];
        filled[m.index()] = Some(after);
        validate(&PlanView {
            graph: &g,
            order: &order,
            location: &locs,
            workspace: &ws,
            workspace_filled_after: &filled,
            copies: &[],
            offload: &[],
            host_bytes: 0,
            total_bytes: 1024 * (g.len() + 1),
            alignment: ALIGNMENT,
        })
    };
    run(1024 * g.len(), 1).unwrap();
    // Over b, which is made after the fill and before m: the fill's content is gone.
    let e = run(locs[b.index()].offset, 1).unwrap_err();
    assert_eq!(
        e,
        V::WorkspaceOverwritten {
            node: m,
            op: "matmul",
            after: 1
        }
    );
    assert!(e.to_string().contains("overwritten before"), "{e}");
    // Filled at the node's own position (3) or later is not ahead of it.
    let e = run(1024 * g.len(), 3).unwrap_err();
    assert!(
        matches!(e, V::WorkspaceFilledLate { node, after: 3, at: 3, .. } if node == m),
        "{e}"
    );
}

#[test]
fn the_validator_rejects_a_workspace_over_a_live_value() {
    let pw = planned_matmul_with_workspace();
    let (a, m, locs) = (pw.a, pw.m, &pw.locs);
    let mut ws = pw.ws.clone();
    check_planned_ws(&pw, &ws).unwrap();
    // Scratch over `a`, an operand of the matmul.
    ws[m.index()] = Some(Location {
        offset: locs[a.index()].offset,
        bytes: 1024,
    });
    let e = check_planned_ws(&pw, &ws).unwrap_err();
    assert_eq!(
        e,
        V::WorkspaceOnOperand {
            node: m,
            op: "matmul",
            operand: a
        }
    );
    // The message names the rule and the nodes.
    assert!(
        e.to_string().contains(&format!(
            "{m} (matmul) has its workspace on its operand {a}"
        )),
        "{e}"
    );
}

#[test]
fn the_validator_rejects_two_live_values_sharing_bytes() {
    let mut g = Graph::new();
    let x = g.input("x", [16, 16], DType::F32).unwrap();
    let a = g.exp(x).unwrap();
    let b = g.matmul(a, x).unwrap();
    let c = g.add(a, b).unwrap();
    g.set_output("c", c).unwrap();
    let (order, mut locs, total, copies) = locations(&g);
    check(&g, &order, &locs, total, &copies).unwrap();
    // Put b on a's bytes: a is still needed by c.
    locs[b.index()] = locs[a.index()];
    let e = check(&g, &order, &locs, total, &copies).unwrap_err();
    assert!(
        matches!(
            e,
            V::WritesOverOperand { node, operand, .. } if node == b && operand == a
        ) || matches!(e, V::ReadAfterOverwrite { operand, .. } if operand == a),
        "{e}"
    );
}

#[test]
fn the_validator_rejects_misaligned_and_out_of_bounds_offsets() {
    let mut g = Graph::new();
    let x = g.input("x", [16], DType::F32).unwrap();
    let a = g.exp(x).unwrap();
    g.set_output("a", a).unwrap();
    let (order, mut locs, total, copies) = locations(&g);
    locs[a.index()].offset += 4;
    assert_eq!(
        check(&g, &order, &locs, total, &copies).unwrap_err(),
        V::Misaligned {
            node: a,
            offset: locs[a.index()].offset,
            alignment: 256
        }
    );
    locs[a.index()].offset = total;
    assert!(matches!(
        check(&g, &order, &locs, total, &copies).unwrap_err(),
        V::OutsideAllocation { node, start, .. } if node == a && start == total
    ));
    // An offset at the top of the address space is outside too, not an overflow.
    locs[a.index()].offset = usize::MAX & !255;
    let e = check(&g, &order, &locs, total, &copies).unwrap_err();
    assert!(
        matches!(e, V::OutsideAllocation { node, start, .. } if node == a && start == usize::MAX & !255),
        "{e:?}"
    );
}

#[test]
fn the_validator_rejects_a_non_elementwise_op_writing_over_its_operand() {
    let mut g = Graph::new();
    let x = g.input("x", [8, 8], DType::F32).unwrap();
    let a = g.exp(x).unwrap();
    let t = g.transpose(a, &[1, 0]).unwrap();
    g.set_output("t", t).unwrap();
    let (order, mut locs, total, copies) = locations(&g);
    locs[t.index()] = locs[a.index()];
    assert!(matches!(
        check(&g, &order, &locs, total, &copies).unwrap_err(),
        V::WritesOverOperand { node, operand, .. } if node == t && operand == a
    ));
}

#[test]
fn the_validator_rejects_an_update_overwritten_before_the_step_ends() {
    let mut g = Graph::new();
    let p = g.parameter("p", [64], DType::F32, Init::Zeros).unwrap();
    let new = g.exp(p).unwrap();
    g.set_update(p, new).unwrap();
    let s = g.sum_all(new).unwrap();
    g.set_output("s", s).unwrap();
    let (order, mut locs, total, copies) = locations(&g);
    check(&g, &order, &locs, total, &copies).unwrap();
    // Leave the new value in the slab with no copy back: the parameter keeps its old value.
    locs[new.index()] = Location {
        offset: total,
        bytes: 256,
    };
    let e = check(&g, &order, &locs, total + 256, &copies).unwrap_err();
    assert!(
        matches!(e, V::UpdateNotHeld { target, value } if target == p && value == new)
            || matches!(e, V::UpdateOverwrittenBeforeCopy { value, target } if target == p && value == new),
        "{e}"
    );
}

#[test]
fn the_validator_names_each_broken_rule_of_the_schedule_and_the_tables() {
    let mut g = Graph::new();
    let x = g.input("x", [16], DType::F32).unwrap();
    let a = g.exp(x).unwrap();
    let r = g.reshape(a, [4, 4]).unwrap();
    let b = g.tanh(r).unwrap();
    g.set_output("b", b).unwrap();
    let (order, locs, total, copies) = locations(&g);
    check(&g, &order, &locs, total, &copies).unwrap();
    let n = g.len();
    // Tables of the wrong length.
    assert_eq!(
        check(&g, &order, &locs[..n - 1], total, &copies).unwrap_err(),
        V::TableLength {
            locations: n - 1,
            workspaces: n,
            nodes: n
        }
    );
    assert_eq!(
        check(&g, &order[..n - 1], &locs, total, &copies).unwrap_err(),
        V::ScheduleLength {
            scheduled: n - 1,
            nodes: n
        }
    );
    // A node twice, and one before its operand.
    let mut twice = order.clone();
    twice[n - 1] = twice[0];
    assert!(matches!(
        check(&g, &twice, &locs, total, &copies).unwrap_err(),
        V::ScheduledTwice { .. }
    ));
    let mut early = order.clone();
    let (ia, ib) = (
        early.iter().position(|&i| i == a).unwrap(),
        early.iter().position(|&i| i == b).unwrap(),
    );
    early.swap(ia, ib);
    assert!(matches!(
        check(&g, &early, &locs, total, &copies).unwrap_err(),
        V::OperandNotReady { node, .. } if node == b
    ));
    // A location of the wrong size.
    let mut small = locs.clone();
    small[b.index()].bytes = 32;
    assert_eq!(
        check(&g, &order, &small, total, &copies).unwrap_err(),
        V::WrongSize {
            node: b,
            needs: 64,
            given: 32
        }
    );
    // A view placed away from its operand.
    let mut moved = locs.clone();
    moved[r.index()].offset = total;
    assert_eq!(
        check(&g, &order, &moved, total + 256, &copies).unwrap_err(),
        V::ViewNotOnOperand {
            node: r,
            op: "reshape",
            operand: a
        }
    );
    // An output whose bytes a later op takes: put `b` on `x`'s bytes and output `x` too.
    let mut g2 = g.clone();
    g2.set_output("x", x).unwrap();
    let mut over = locs.clone();
    over[b.index()] = over[x.index()];
    let e = check(&g2, &order, &over, total, &copies).unwrap_err();
    assert_eq!(
        e,
        V::OutputOverwritten {
            name: "x".into(),
            node: x
        },
        "{e}"
    );
}

#[test]
fn the_validator_names_a_misplaced_workspace_and_one_on_its_own_output() {
    let pw = planned_matmul_with_workspace();
    let (m, total, locs) = (pw.m, pw.p.total_bytes, &pw.locs);
    let with = |w: Location| {
        let mut ws = pw.ws.clone();
        ws[m.index()] = Some(w);
        check_planned_ws(&pw, &ws).unwrap_err()
    };
    assert_eq!(
        with(Location {
            offset: 8,
            bytes: 1024
        }),
        V::WorkspaceMisaligned {
            node: m,
            offset: 8,
            alignment: ALIGNMENT
        }
    );
    assert!(matches!(
        with(Location { offset: total, bytes: 1024 }),
        V::WorkspaceOutsideAllocation { node, start, .. } if node == m && start == total
    ));
    // One whose end would overflow: outside, its end saturated, not a panic.
    assert!(matches!(
        with(Location { offset: usize::MAX & !255, bytes: 1024 }),
        V::WorkspaceOutsideAllocation { node, end: usize::MAX, .. } if node == m
    ));
    assert_eq!(
        with(Location {
            offset: locs[m.index()].offset,
            bytes: 256
        }),
        V::WorkspaceOnOutput {
            node: m,
            op: "matmul",
            output: m
        }
    );
}

#[test]
fn every_reference_model_plan_validates_and_packs_within_one_percent_of_load() {
    for spec in [
        "mlp",
        "gpt-mini",
        "gpt2",
        "gpt:vocab=512,d_model=96,layers=3,heads=3,d_ff=200,seq=48,batch=3",
    ] {
        let m = ingot_models::by_name(spec).unwrap();
        let step = training_step(&m.graph, &m.optimizer).unwrap();
        let p = plan::plan(&step.graph, &PlanOptions::default()).unwrap();
        p.validate(&step.graph).unwrap();
        let ratio = p.slab_bytes as f64 / p.load_bytes as f64;
        assert!(
            ratio <= 1.01,
            "{spec}: slab {} is {ratio:.4} x LOAD {}",
            p.slab_bytes,
            p.load_bytes
        );
    }
}

#[test]
fn the_same_model_gives_the_same_plan() {
    let m =
        ingot_models::by_name("gpt:vocab=128,d_model=32,layers=2,heads=2,d_ff=64,seq=16,batch=2")
            .unwrap();
    let step = training_step(&m.graph, &m.optimizer).unwrap();
    let a = plan::plan(&step.graph, &PlanOptions::default()).unwrap();
    let b = plan::plan(&step.graph, &PlanOptions::default()).unwrap();
    assert_eq!(
        serde_json::to_string(&a).unwrap(),
        serde_json::to_string(&b).unwrap()
    );
}

/// A random graph: a few inputs and parameters, then ops drawn over earlier values, with some
/// values named as outputs and a parameter updated.
fn random_graph(ops: &[(u8, usize, usize)], update: bool) -> Graph {
    let mut g = Graph::new();
    let p = g.parameter("p", [8, 8], DType::F32, Init::Zeros).unwrap();
    let mut vals = vec![g.input("x", [8, 8], DType::F32).unwrap(), p];
    for &(kind, i, j) in ops {
        let a = vals[i % vals.len()];
        let b = vals[j % vals.len()];
        let v = match kind % 9 {
            0 => g.exp(a),
            1 => g.add(a, b),
            2 => g.mul(a, b),
            3 => g.matmul(a, b),
            4 => g.transpose(a, &[1, 0]),
            5 => g.sum(a, &[1]).and_then(|s| g.broadcast_to(s, [8, 8])),
            6 => g
                .reshape(a, [64])
                .and_then(|r| g.neg(r))
                .and_then(|r| g.reshape(r, [8, 8])),
            7 => g.tanh(a),
            _ => g.maximum(a, b),
        }
        .unwrap();
        vals.push(v);
    }
    let last = *vals.last().unwrap();
    g.set_output("out", last).unwrap();
    if ops.len() > 2 {
        g.set_output("mid", vals[vals.len() / 2 + 1]).unwrap_or(());
    }
    if update {
        let mid = vals[vals.len() / 2];
        let t = g.tanh(mid).unwrap();
        let new = g.add(p, t).unwrap();
        g.set_update(p, new).unwrap();
    }
    g
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
    #[test]
    fn plans_of_random_graphs_always_validate(ops in proptest::collection::vec((0u8..9, 0usize..64, 0usize..64), 1..40), update: bool) {
        let g = random_graph(&ops, update);
        let (g, _) = g.without_dead_code();
        for strategy in [Strategy::Traced, Strategy::MemoryAware] {
            let order = match strategy { Strategy::Traced => schedule::traced(&g), Strategy::MemoryAware => schedule::memory_aware(&g) };
            prop_assert!(schedule::is_valid_order(&g, &order));
            let p = plan::plan_order(&g, &order, strategy, std::time::Duration::from_millis(20)).unwrap();
            if let Err(e) = p.validate(&g) {
                return Err(TestCaseError::fail(format!("{strategy:?}: {e}\n{}", ingot_compiler::ir::text::print(&g))));
            }
            prop_assert!(p.slab_bytes >= p.load_bytes);
        }
    }
}

#[test]
fn a_fused_kernel_reading_a_buffer_transposed_never_writes_over_it() {
    use ingot_compiler::ir::{BinaryOp, Op, UnaryOp};
    use ingot_kernels::fused::{Access, FusedKernel, Input, Inst, Output};
    // y = a + aᵀ, with a dying at the kernel: input 0 reads a at y's own index (alone it could
    // be overwritten), input 1 reads the same buffer transposed, which forbids it.
    let mut g = Graph::new();
    let x = g.input("x", [4, 4], DType::F32).unwrap();
    let a = g.unary(UnaryOp::Exp, x).unwrap();
    let input = |strides: Vec<usize>| Input {
        dtype: DType::F32,
        len: 16,
        access: Access { offset: 0, strides },
    };
    let k = FusedKernel {
        domain: vec![4, 4],
        reduce_axes: vec![],
        inputs: vec![input(vec![4, 1]), input(vec![1, 4])],
        body: vec![
            Inst::Load { input: 0 },
            Inst::Load { input: 1 },
            Inst::binary(BinaryOp::Add, 0, 1),
        ],
        outputs: vec![Output { value: 2 }],
    };
    assert!(k.can_write_over(0, 0) && !k.can_write_over(1, 0));
    let y = g.push(Op::Fused(Box::new(k)), &[a, a], None).unwrap();
    g.set_output("y", y).unwrap();
    let p = plan::plan(&g, &PlanOptions::default()).expect("a valid plan");
    assert_ne!(
        p.location(&g, y).offset,
        p.location(&g, a).offset,
        "y must not take a's bytes while a is still read transposed"
    );
}
