//! The graph's structure, checked before tracing: every name a node reads is produced exactly
//! once (by a graph input, an initializer or one node), and the nodes form no cycle. Returns
//! an order to trace them in: the file's own order when it is already topological (ONNX
//! requires it), else a topological one.

use crate::attrs::node_name;
use crate::error::{OnnxError, Result};
use crate::proto::GraphProto;
use std::collections::HashMap;

pub fn topological(graph: &GraphProto) -> Result<Vec<usize>> {
    // Who produces each name: None for graph inputs and initializers, Some(node) for nodes.
    let mut producer: HashMap<&str, Option<usize>> = HashMap::new();
    for v in &graph.input {
        producer.insert(v.name(), None);
    }
    for t in &graph.initializer {
        producer.insert(t.name(), None);
    }
    for (i, n) in graph.node.iter().enumerate() {
        for o in n.output.iter().filter(|o| !o.is_empty()) {
            if let Some(prev) = producer.insert(o, Some(i)) {
                let by = match prev {
                    Some(j) => format!("node {:?}", node_name(&graph.node[j], j)),
                    None => "a graph input or initializer".to_string(),
                };
                return Err(OnnxError::Graph(format!(
                    "{o:?} is produced twice: by {by} and by {} node {:?}",
                    n.op_type(),
                    node_name(n, i)
                )));
            }
        }
    }
    let mut deps: Vec<Vec<usize>> = vec![Vec::new(); graph.node.len()];
    for (i, n) in graph.node.iter().enumerate() {
        for inp in n.input.iter().filter(|x| !x.is_empty()) {
            match producer.get(inp.as_str()) {
                None => {
                    return Err(OnnxError::Graph(format!(
                        "{} node {:?} reads {inp:?}, which no graph input, initializer or node produces",
                        n.op_type(),
                        node_name(n, i)
                    )))
                }
                Some(Some(j)) => deps[i].push(*j),
                Some(None) => {}
            }
        }
    }
    for o in &graph.output {
        if !producer.contains_key(o.name()) {
            return Err(OnnxError::Graph(format!(
                "graph output {:?} is produced by nothing",
                o.name()
            )));
        }
    }
    // Kahn's algorithm, always taking the lowest-numbered ready node: the file's order when
    // it is topological.
    let n = graph.node.len();
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut waiting = vec![0usize; n];
    for (i, d) in deps.iter().enumerate() {
        for &j in d {
            users[j].push(i);
            waiting[i] += 1;
        }
    }
    let mut ready: std::collections::BTreeSet<usize> =
        (0..n).filter(|&i| waiting[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &u in &users[i] {
            waiting[u] -= 1;
            if waiting[u] == 0 {
                ready.insert(u);
            }
        }
    }
    if order.len() < n {
        let stuck: Vec<String> = (0..n)
            .filter(|&i| waiting[i] > 0)
            .take(8)
            .map(|i| {
                format!(
                    "{} {:?}",
                    graph.node[i].op_type(),
                    node_name(&graph.node[i], i)
                )
            })
            .collect();
        return Err(OnnxError::Graph(format!(
            "the nodes form a cycle; nodes on or after it: {}",
            stuck.join(", ")
        )));
    }
    Ok(order)
}
