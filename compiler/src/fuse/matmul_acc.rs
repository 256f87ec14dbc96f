//! A matrix product added to a value that dies there becomes one `matmul_acc` (GEMM with
//! `beta = 1`): `add(c, matmul(a, b))` and `add(c, convert<f32>(matmul<bf16>(a, b)))`, in
//! either operand order, become `matmul_acc(c, a, b)`.
//!
//! Summing weight gradients (a loss head in row chunks, micro-batches of an accumulated step, a
//! weight read twice) makes these adds. As an add, each one stores the product (in bf16, a
//! second copy of it: the bf16 product, then its f32 cast fused into the add) and runs one
//! more kernel that reads the sum and the product and writes the sum. As one `matmul_acc`, the
//! library call adds its product to the sum's bytes where it writes them: no product buffer,
//! no extra kernel, and a bf16 product is accumulated in f32 and rounded once, to the sum's
//! dtype, instead of being rounded to bf16 first.
//!
//! The product may reach the add through a transpose of its last two axes (a weight's gradient
//! transposed back to the weight's layout), which the flags absorb: `(a·b)ᵀ = bᵀ·aᵀ`.
//!
//! The rewrite is made only where it saves: the product (and its cast) has no other user, so
//! that it is not needed on its own, and `c` has no other user and is not a leaf, an output or
//! a parameter's new value, so that it normally dies at the `matmul_acc` and the planner writes
//! the result over it (`plan::liveness`'s in-place rule allows exactly that, over operand 0).
//! Where the plan places the result elsewhere all the same (`c` a view of a longer-lived
//! buffer), the lowerings copy `c` to the result first: never a wrong answer.
//!
//! A chain of such sums starts from a first product: `add(convert(p0), convert(p1))` with `p0`
//! a bf16 product. Its accumulator would be `convert(p0)`, stored in f32 after `p0` is stored in
//! bf16; it becomes `matmul_acc(0, a0, b0)` instead (a zero fill, then the GEMM adds into it), so
//! that no chunk's bf16 product is stored at all (likewise a first product reached through a
//! transpose). A bare f32 first product is its own accumulator.
//!
//! The accumulator must be a buffer anyway: a library call's output (a matmul, a scatter-add,
//! a convolution), a sum this pass makes, or a first product as above. An add of a product and
//! an elementwise value (a linear layer's broadcast bias, a weight-decay term) stays an add
//! that fusion folds into the product's consumer: storing that value for the GEMM to add into
//! would cost more traffic than the add it saves.
//!
//! The `matmul_acc` is made where the matmul was when its accumulator exists there (a
//! micro-batch's weight gradient is added as it is made, and its operands die there, rather
//! than at the sums after the micro-batch), else where the add was.
//!
//! This runs in fusion, before anything is grouped, because it needs the whole graph's users
//! (which egg's e-graph does not keep) and because it trades an elementwise add for a library
//! call, which is fusion's business.

use crate::error::IrError;
use crate::ir::{BinaryOp, DType, Graph, NodeId, Op};

/// A product `add(c, ...)` can take in, as `op(a)·op(b)`: the matmul node, `a`, `b` and their
/// flags.
struct Product {
    matmul: NodeId,
    a: NodeId,
    b: NodeId,
    ta: bool,
    tb: bool,
}

/// Whether `perm` swaps the last two axes and keeps the others.
fn swaps_last_two(perm: &[usize]) -> bool {
    let r = perm.len();
    r >= 2
        && perm[r - 2] == r - 1
        && perm[r - 1] == r - 2
        && perm[..r - 2].iter().enumerate().all(|(i, &p)| i == p)
}

/// The graph with every such add written as `matmul_acc` (and each first bf16 product of such a
/// sum as one added into zeros), and how many `matmul_acc` were made.
pub fn form(g: &Graph) -> Result<(Graph, usize), IrError> {
    let users = g.users();
    let mut pinned = vec![false; g.len()];
    for &o in g.outputs.values() {
        pinned[o.index()] = true;
    }
    for u in &g.updates {
        pinned[u.value.index()] = true;
    }
    // Only user: exactly one use, by `user`, and not pinned.
    let only_user = |x: NodeId, user: NodeId| {
        !pinned[x.index()] && users[x.index()].len() == 1 && users[x.index()][0] == user
    };
    // `p`, the add's operand, is a matmul, reached through at most one cast of a bf16 value
    // up to f32 and at most one transpose of the last two axes (a weight gradient transposed
    // back to the weight's layout: `(a·b)ᵀ = bᵀ·aᵀ`), each the only user of what it reads.
    let product = |p: NodeId, add: NodeId| -> Option<Product> {
        if !only_user(p, add) {
            return None;
        }
        let (mut x, mut cast, mut transposed) = (p, false, false);
        loop {
            let n = g.node(x);
            let from = match &n.op {
                Op::MatMul { ta, tb } => {
                    if cast != (n.ty.dtype == DType::BF16 && g.ty(add).dtype == DType::F32)
                        || (!cast && n.ty.dtype != g.ty(add).dtype)
                    {
                        return None;
                    }
                    let (a, b) = (n.inputs[0], n.inputs[1]);
                    return Some(if transposed {
                        Product {
                            matmul: x,
                            a: b,
                            b: a,
                            ta: !tb,
                            tb: !ta,
                        }
                    } else {
                        Product {
                            matmul: x,
                            a,
                            b,
                            ta: *ta,
                            tb: *tb,
                        }
                    });
                }
                Op::Convert
                    if !cast
                        && n.ty.dtype == DType::F32
                        && g.ty(n.inputs[0]).dtype == DType::BF16 =>
                {
                    cast = true;
                    n.inputs[0]
                }
                Op::Transpose { perm } if !transposed && swaps_last_two(perm) => {
                    transposed = true;
                    n.inputs[0]
                }
                _ => return None,
            };
            if !only_user(from, x) {
                return None;
            }
            x = from;
        }
    };
    // In node order, so that an add's accumulator is known to be replaced before the add.
    let mut formed: Vec<Option<(NodeId, Product)>> = (0..g.len()).map(|_| None).collect();
    // Accumulators that are themselves products (the first of a sum): each becomes a product
    // added into zeros, unless it is a bare matmul, already a buffer of its own.
    let mut seeded: Vec<Option<Product>> = (0..g.len()).map(|_| None).collect();
    for id in g.ids() {
        let n = g.node(id);
        if n.op != Op::Binary(BinaryOp::Add) || n.inputs[0] == n.inputs[1] {
            continue;
        }
        // `add(c, product)` first, then `add(product, c)`.
        for (ci, pi) in [(0, 1), (1, 0)] {
            let c = n.inputs[ci];
            if g.node(c).op.is_leaf() || !only_user(c, id) {
                continue;
            }
            let Some(p) = product(n.inputs[pi], id) else {
                continue;
            };
            // `c` must be a buffer anyway (a library call's output, or a sum this pass makes),
            // or a product that becomes one: forcing an elementwise value (a broadcast bias, a
            // weight-decay term) into memory so that the GEMM can add into it costs more traffic
            // than the add it saves.
            let first = if matches!(g.node(c).op, Op::MatMul { .. }) {
                None
            } else {
                product(c, id)
            };
            let buffer = super::kind::kind(g.node(c)) == super::kind::Kind::Library
                || formed[c.index()].is_some()
                || first.is_some();
            if !buffer {
                continue;
            }
            seeded[c.index()] = first;
            formed[id.index()] = Some((c, p));
            break;
        }
    }
    let count = formed.iter().flatten().count() + seeded.iter().flatten().count();
    if count == 0 {
        return Ok((g.clone(), 0));
    }
    // Each replaced node (an add, or a seeded accumulator) and what replaces it: the
    // accumulator (`None`: zeros) and the product.
    let mut replaced: Vec<Option<(Option<NodeId>, &Product)>> = vec![None; g.len()];
    // Where each replacement is made: at its matmul's position when its accumulator exists by
    // then, so that the product's operands die where the matmul's did (a micro-batch's
    // activations are not kept until the sums at its end); else at the add.
    let mut made_at: Vec<Vec<NodeId>> = vec![Vec::new(); g.len()];
    for id in g.ids() {
        let r = match (&formed[id.index()], &seeded[id.index()]) {
            (_, Some(p)) => (None, p),
            (Some((c, p)), None) => (Some(*c), p),
            (None, None) => continue,
        };
        replaced[id.index()] = Some(r);
        let at = match r.0 {
            Some(c) if c.index() > r.1.matmul.index() => id,
            _ => r.1.matmul,
        };
        made_at[at.index()].push(id);
    }
    let mut made: Vec<Option<NodeId>> = vec![None; g.len()];
    let out = g.rebuild(|out, new_id, id| {
        let mut mapped = match replaced[id.index()] {
            Some(_) if made[id.index()].is_some() => made[id.index()].expect("made"),
            // Made here, below.
            Some(_) => NodeId(u32::MAX),
            // (The replaced matmuls and casts are copied too; nothing reads them: dead code.)
            None => out.push_copy(g, new_id, id)?,
        };
        for &t in &made_at[id.index()] {
            let (c, p) = replaced[t.index()].expect("a replacement");
            let ty = g.ty(t).clone();
            // The matmul_acc keeps the origin of the add (or accumulator) it replaces.
            out.set_scope(g.origin(t).clone());
            let c = match c {
                Some(c) => made[c.index()].unwrap_or(new_id[c.index()]),
                None => out.push(Op::Full { value: 0.0 }, &[], Some(ty.clone()))?,
            };
            let ins = [c, new_id[p.a.index()], new_id[p.b.index()]];
            let acc = out.push(Op::MatMulAcc { ta: p.ta, tb: p.tb }, &ins, Some(ty))?;
            made[t.index()] = Some(acc);
            if t == id {
                mapped = acc;
            }
        }
        debug_assert_ne!(mapped, NodeId(u32::MAX));
        Ok(Some(mapped))
    })?;
    // The products (and their casts) the accumulations replaced are dead now.
    Ok((out.without_dead_code().0, count))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{DType, Init};

    fn count(g: &Graph, name: &str) -> usize {
        g.op_histogram().get(name).copied().unwrap_or(0)
    }

    /// `acc` (an f32 sum of two products) and its operands a, b, x, y.
    fn two_products(dtype: DType) -> (Graph, NodeId) {
        let mut g = Graph::new();
        let a = g.input("a", [4, 3], DType::F32).unwrap();
        let b = g.input("b", [3, 5], DType::F32).unwrap();
        let x = g.input("x", [4, 2], DType::F32).unwrap();
        let y = g.input("y", [2, 5], DType::F32).unwrap();
        let cast = |g: &mut Graph, v| {
            if dtype == DType::F32 {
                v
            } else {
                g.convert(v, dtype).unwrap()
            }
        };
        let (a, b, x, y) = (
            cast(&mut g, a),
            cast(&mut g, b),
            cast(&mut g, x),
            cast(&mut g, y),
        );
        let p = g.matmul(a, b).unwrap();
        let q = g.matmul(x, y).unwrap();
        let (p, q) = if dtype == DType::F32 {
            (p, q)
        } else {
            (
                g.convert(p, DType::F32).unwrap(),
                g.convert(q, DType::F32).unwrap(),
            )
        };
        let acc = g.add(q, p).unwrap(); // the product first: either order is taken
        (g, acc)
    }

    #[test]
    fn an_add_of_a_product_into_a_dying_value_becomes_one_matmul_acc() {
        for dtype in [DType::F32, DType::BF16] {
            let (mut g, acc) = two_products(dtype);
            g.set_output("acc", acc).unwrap();
            let (f, n) = form(&g).unwrap();
            assert_eq!(count(&f, "add"), 0, "{dtype}");
            let o = f.outputs["acc"];
            assert_eq!(f.ty(o).dtype, DType::F32);
            assert!(matches!(f.node(o).op, Op::MatMulAcc { .. }));
            let c = f.node(o).inputs[0];
            if dtype == DType::F32 {
                // The first product is its own accumulator.
                assert_eq!(n, 1);
                assert_eq!(count(&f, "matmul"), 1);
                assert!(matches!(f.node(c).op, Op::MatMul { .. }));
            } else {
                // The first bf16 product is added into zeros: no bf16 product is stored.
                assert_eq!(n, 2);
                assert_eq!(count(&f, "matmul"), 0);
                assert_eq!(count(&f, "full"), 1);
                assert!(matches!(f.node(c).op, Op::MatMulAcc { .. }));
            }
        }
    }

    #[test]
    fn a_sum_of_two_bf16_products_adds_both_into_zeros_and_stores_neither() {
        let mut g = Graph::new();
        let a = g.input("a", [4, 3], DType::BF16).unwrap();
        let b = g.input("b", [3, 5], DType::BF16).unwrap();
        let p = g.matmul(a, b).unwrap();
        let p2 = g.matmul(a, b).unwrap();
        let (p, p2) = (
            g.convert(p, DType::F32).unwrap(),
            g.convert(p2, DType::F32).unwrap(),
        );
        let s = g.add(p, p2).unwrap();
        g.set_output("s", s).unwrap();
        let (f, n) = form(&g).unwrap();
        assert_eq!(n, 2);
        assert_eq!(count(&f, "matmul_acc"), 2);
        assert_eq!(count(&f, "matmul"), 0);
        assert_eq!(count(&f, "full"), 1);
        assert!(f
            .ids()
            .all(|id| f.ty(id).dtype != DType::BF16 || f.node(id).op.is_leaf()));
    }

    #[test]
    fn an_accumulator_with_another_user_is_not_written_over() {
        let (mut g, acc) = two_products(DType::F32);
        let c = g.node(acc).inputs[1];
        let other = g.neg(c).unwrap();
        g.set_output("acc", acc).unwrap();
        g.set_output("other", other).unwrap();
        assert_eq!(form(&g).unwrap().1, 0);
    }

    #[test]
    fn a_broadcast_bias_is_not_stored_to_be_added_into() {
        let mut g = Graph::new();
        let x = g.input("x", [4, 3], DType::F32).unwrap();
        let w = g.parameter("w", [3, 5], DType::F32, Init::Zeros).unwrap();
        let bias = g.parameter("b", [5], DType::F32, Init::Zeros).unwrap();
        let p = g.matmul(x, w).unwrap();
        let bb = g.broadcast_to(bias, [4, 5]).unwrap();
        let h = g.add(p, bb).unwrap();
        g.set_output("h", h).unwrap();
        assert_eq!(form(&g).unwrap().1, 0);
    }

    #[test]
    fn a_product_with_another_user_is_not_folded_into_the_sum() {
        let (mut g, acc) = two_products(DType::F32);
        let q = g.node(acc).inputs[0];
        g.set_output("acc", acc).unwrap();
        g.set_output("q", q).unwrap();
        assert_eq!(form(&g).unwrap().1, 0);
    }

    #[test]
    fn a_parameter_is_never_the_accumulator() {
        let mut g = Graph::new();
        let w = g.parameter("w", [4, 5], DType::F32, Init::Zeros).unwrap();
        let a = g.input("a", [4, 3], DType::F32).unwrap();
        let b = g.input("b", [3, 5], DType::F32).unwrap();
        let p = g.matmul(a, b).unwrap();
        let s = g.add(w, p).unwrap();
        g.set_output("s", s).unwrap();
        assert_eq!(form(&g).unwrap().1, 0);
    }
}
