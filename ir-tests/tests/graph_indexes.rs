//! The graph's indexes give the answers its scans gave (issue 53): `Graph::result_of` and
//! `Graph::set_update`'s check for a target updated twice scanned the graph (every node after
//! the op, every update) on each call, which made autodiff and liveness quadratic in depth;
//! both now look up an index that the graph keeps, and that catches up when the graph was
//! deserialized or its public updates were changed directly.

use ingot_compiler::ir::{DType, Graph, Init, Op};

/// `w * x` as a step: a parameter, an input and their product as the loss.
fn step() -> (
    Graph,
    ingot_compiler::ir::NodeId,
    ingot_compiler::ir::NodeId,
) {
    let mut g = Graph::new();
    let w = g.parameter("w", [4], DType::F32, Init::Ones).unwrap();
    let x = g.input("x", [4], DType::F32).unwrap();
    let y = g.mul(w, x).unwrap();
    g.set_output("loss", y).unwrap();
    (g, w, y)
}

#[test]
fn a_target_updated_twice_is_refused_however_the_graph_was_made() {
    let (mut g, w, y) = step();
    g.set_update(w, y).unwrap();
    let err = g.set_update(w, y).unwrap_err().to_string();
    assert!(err.contains("updated twice"), "{err}");

    // Deserialized: the index starts empty and catches up from the updates.
    let mut back: Graph = serde_json::from_str(&serde_json::to_string(&g).unwrap()).unwrap();
    let err = back.set_update(w, y).unwrap_err().to_string();
    assert!(err.contains("updated twice"), "{err}");

    // Updates cleared directly: the stale index refuses nothing.
    g.updates.clear();
    g.set_update(w, y).unwrap();
    assert_eq!(g.updates.len(), 1);

    // Updates pushed directly are seen.
    let (mut h, w, y) = step();
    h.updates.push(ingot_compiler::ir::Update {
        target: w,
        value: y,
    });
    assert!(h.set_update(w, y).is_err());
}

#[test]
fn an_outputs_result_node_is_found_wherever_it_was_added() {
    // A fused kernel's second output named by a result node, as the fused graph has it.
    let text = ingot_ir_tests::chains::reduce_chain(3, 8, 8);
    let m = ingot_compiler::model::Model::from_ir_text("chain", &text).unwrap();
    let opts = ingot_compiler::pipeline::Options::for_target(ingot_compiler::lower::Target::Cpu);
    let g = ingot_compiler::pipeline::compile(&m, &opts).unwrap().graph;
    let scan = |g: &Graph, node, index| {
        g.ids()
            .find(|&r| g.node(r).op == (Op::Result { index }) && g.node(r).inputs[0] == node)
    };
    let back: Graph = serde_json::from_str(&serde_json::to_string(&g).unwrap()).unwrap();
    let mut found = 0;
    for id in g.ids() {
        for index in 0..4 {
            let want = scan(&g, id, index);
            found += usize::from(want.is_some());
            assert_eq!(g.result_of(id, index), want, "{id} output {index}");
            assert_eq!(
                back.result_of(id, index),
                want,
                "{id} output {index}, deserialized"
            );
        }
    }
    assert!(
        found > 0,
        "the fused chain names some output by a result node"
    );
}

/// The users of every node by the plainest scan: for each node, every later node whose operands
/// name it, in id order.
fn users_by_scan(g: &Graph) -> Vec<Vec<ingot_compiler::ir::NodeId>> {
    g.ids()
        .map(|x| g.ids().filter(|&u| g.node(u).inputs.contains(&x)).collect())
        .collect()
}

#[test]
fn each_nodes_users_are_the_nodes_reading_it_once_each_in_id_order() {
    // `w * w` reads `w` twice and is one user of it; `x` has no user.
    let mut g = Graph::new();
    let w = g.parameter("w", [4], DType::F32, Init::Ones).unwrap();
    let x = g.input("x", [4], DType::F32).unwrap();
    let sq = g.mul(w, w).unwrap();
    let y = g.add(sq, w).unwrap();
    g.set_output("loss", y).unwrap();
    let users = g.users();
    assert_eq!(users.len(), g.len());
    assert_eq!(&users[w.index()], &[sq, y]);
    assert!(users[x.index()].is_empty());
    assert_eq!(&users[sq.index()], &[y]);
    assert!(users[y.index()].is_empty());

    // A whole step, fused and unfused: the same lists as the scan, node for node.
    let model = ingot_models::by_name("gpt-mini").unwrap();
    let opts = ingot_compiler::pipeline::Options::for_target(ingot_compiler::lower::Target::Cpu);
    let compiled = ingot_compiler::pipeline::compile(&model, &opts).unwrap();
    for g in [&compiled.step.graph, &compiled.graph] {
        let users = g.users();
        let listed: Vec<Vec<_>> = users.iter().map(|u| u.to_vec()).collect();
        assert_eq!(listed, users_by_scan(g));
    }
}
