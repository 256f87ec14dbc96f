//! A graph rebuilt node by node with a map from its old nodes to the new ones: the loop that
//! passes which replace some nodes by other ops (padding products, concats as selects,
//! accumulating products) all run, written once.

use super::{Graph, NodeId};
use crate::error::IrError;

impl Graph {
    /// A copy of this graph built node by node, in order, into a new graph: `each(out, map,
    /// id)` may build node `id`'s replacement in `out` and return it (`map` holds the new node
    /// of every node before `id`); where it returns `None` the node is copied (its op and type,
    /// on its operands' new nodes). Every node is built under its own origin's scope, so what
    /// replaces it keeps its place in the report. The outputs and updates name the new nodes.
    pub fn rebuild(
        &self,
        mut each: impl FnMut(&mut Graph, &[NodeId], NodeId) -> Result<Option<NodeId>, IrError>,
    ) -> Result<Graph, IrError> {
        let mut out = Graph::new();
        let mut map: Vec<NodeId> = Vec::with_capacity(self.len());
        for id in self.ids() {
            out.set_scope(self.origin(id).clone());
            let new = match each(&mut out, &map, id)? {
                Some(new) => new,
                None => out.push_copy(self, &map, id)?,
            };
            map.push(new);
        }
        out.keep_outputs_of(self, |x| map[x.index()])?;
        Ok(out)
    }

    /// Node `id` of `from` pushed here as it is (its op and type) on its operands' nodes here,
    /// `map` giving each node of `from` before `id` its node here.
    pub fn push_copy(
        &mut self,
        from: &Graph,
        map: &[NodeId],
        id: NodeId,
    ) -> Result<NodeId, IrError> {
        let n = from.node(id);
        let ins: Vec<NodeId> = n.inputs.iter().map(|x| map[x.index()]).collect();
        self.push(n.op.clone(), &ins, Some(n.ty.clone()))
    }
}

#[cfg(test)]
mod tests {
    use crate::ir::origin::print_with_origins;
    use crate::ir::{DType, Graph, Init, NodeId, UnaryOp};

    /// `y = exp(w · 2)` under the scope `layer`, with `w` a parameter updated to `w + y`.
    fn step() -> (Graph, NodeId) {
        let mut g = Graph::new();
        let w = g.parameter("w", [2, 3], DType::F32, Init::Zeros).unwrap();
        let y = g.scoped("layer", |g| {
            let twice = g.mul_scalar(w, 2.0).unwrap();
            g.unary(UnaryOp::Exp, twice).unwrap()
        });
        let new = g.add(w, y).unwrap();
        g.set_output("y", y).unwrap();
        g.set_update(w, new).unwrap();
        (g, y)
    }

    #[test]
    fn a_rebuild_that_replaces_nothing_is_the_same_graph_with_the_same_origins() {
        let (g, _) = step();
        let out = g.rebuild(|_, _, _| Ok(None)).unwrap();
        assert_eq!(print_with_origins(&out), print_with_origins(&g));
        assert_eq!(out.outputs, g.outputs);
        assert_eq!(out.updates, g.updates);
    }

    #[test]
    fn a_replaced_node_is_read_by_its_users_and_named_by_the_outputs_under_its_origin() {
        let (g, y) = step();
        // exp(x) replaced by tanh(x): the output and the update's add read the tanh.
        let out = g
            .rebuild(|out, map, id| {
                if id != y {
                    return Ok(None);
                }
                let x = map[g.node(id).inputs[0].index()];
                out.unary(UnaryOp::Tanh, x).map(Some)
            })
            .unwrap();
        let t = out.outputs["y"];
        assert_eq!(out.node(t).op, crate::ir::Op::Unary(UnaryOp::Tanh));
        assert_eq!(out.origin(t).label(), "layer");
        let u = out.updates[0];
        assert!(
            out.node(u.value).inputs.contains(&t),
            "{}",
            print_with_origins(&out)
        );
        assert_eq!(out.len(), g.len());
    }
}
