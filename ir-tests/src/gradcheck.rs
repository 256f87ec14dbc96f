//! The finite-difference harness of the gradient checks (tests/gradcheck.rs for the primitives
//! and nn layers, tests/gradcheck_conv.rs for convolution, pooling and the CNN layers): autodiff's
//! gradient of `loss = sum(f(params) * w)` (with a random `w`, so every output element matters)
//! must match central differences of the same loss evaluated by the reference interpreter, in
//! f64.

use indexmap::IndexMap;
use ingot_compiler::autodiff::grad;
use ingot_compiler::ir::{DType, Graph, Init, LeafKind, NodeId, Shape};
use ingot_compiler::Result;
use ingot_runtime::cpu::interp::run_graph;
use ingot_runtime::tensor::Tensor;

/// A small deterministic generator (the checks must not depend on a crate's stream).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64) / ((1u64 << 53) as f64)
    }
    fn uniform(&mut self, lo: f64, hi: f64, n: usize) -> Vec<f64> {
        (0..n).map(|_| lo + (hi - lo) * self.next()).collect()
    }
}

/// A differentiable input: its shape and the range its random values are drawn from.
pub struct Arg {
    pub shape: Vec<usize>,
    pub lo: f64,
    pub hi: f64,
}

pub fn arg(shape: &[usize]) -> Arg {
    Arg {
        shape: shape.to_vec(),
        lo: -1.0,
        hi: 1.0,
    }
}

/// An input drawn from [0.5, 2) (for log, sqrt, a divisor).
pub fn positive(shape: &[usize]) -> Arg {
    Arg {
        shape: shape.to_vec(),
        lo: 0.5,
        hi: 2.0,
    }
}

/// Extra non-differentiable inputs (ids), by name.
pub type Fixed = Vec<(&'static str, Tensor)>;

/// Builds `f` over parameters `p0..`, differentiates `sum(f * w)`, and compares every gradient
/// element (up to 40 per parameter) with central differences.
pub fn check(
    name: &str,
    args: &[Arg],
    fixed: Fixed,
    f: impl Fn(&mut Graph, &[NodeId]) -> Result<NodeId>,
) {
    let mut rng = Lcg(0x5eed ^ (name.len() as u64 * 7919));
    let mut g = Graph::new();
    let mut leaves: IndexMap<String, Tensor> = IndexMap::new();
    let mut params = Vec::new();
    for (i, a) in args.iter().enumerate() {
        let pname = format!("p{i}");
        params.push(
            g.parameter(&pname, Shape::new(&a.shape), DType::F64, Init::Zeros)
                .unwrap(),
        );
        let n = a.shape.iter().product();
        leaves.insert(
            pname,
            Tensor::from_f64(Shape::new(&a.shape), rng.uniform(a.lo, a.hi, n)),
        );
    }
    for (fname, t) in &fixed {
        g.input(fname, t.shape().clone(), t.dtype()).unwrap();
        leaves.insert(fname.to_string(), t.clone());
    }
    let y = f(&mut g, &params).unwrap_or_else(|e| panic!("{name}: building failed: {e}"));
    // Parameters the layer made itself (weights, gains) are checked too, from random values.
    for id in g.leaves(LeafKind::Parameter) {
        let pname = g.leaf_name(id).unwrap().to_string();
        if !leaves.contains_key(&pname) {
            let s = g.ty(id).shape.clone();
            leaves.insert(
                pname,
                Tensor::from_f64(s.clone(), rng.uniform(-1.0, 1.0, s.numel())),
            );
        }
    }
    // State the layer made itself (batch norm's running statistics) gets values too.
    for id in g.leaves(LeafKind::State) {
        let sname = g.leaf_name(id).unwrap().to_string();
        let s = g.ty(id).shape.clone();
        leaves.insert(
            sname,
            Tensor::from_f64(s.clone(), rng.uniform(0.5, 2.0, s.numel())),
        );
    }
    let params = g.leaves(LeafKind::Parameter);
    let ys = g.ty(y).shape.clone();
    let w = g.input("w", ys.clone(), DType::F64).unwrap();
    leaves.insert(
        "w".into(),
        Tensor::from_f64(ys.clone(), rng.uniform(-1.0, 1.0, ys.numel())),
    );
    let yw = g.mul(y, w).unwrap();
    let loss = g.sum_all(yw).unwrap();
    let grads = grad(&mut g, loss, &params).unwrap();
    g.set_output("loss", loss).unwrap();
    for (i, &gi) in grads.iter().enumerate() {
        g.set_output(&format!("g{i}"), gi).unwrap();
    }
    g.verify().unwrap();
    let base = run_graph(&g, &leaves).unwrap_or_else(|e| panic!("{name}: {e}"));
    let loss_at = |leaves: &IndexMap<String, Tensor>| -> f64 {
        run_graph(&g, leaves).unwrap().outputs["loss"]
            .as_f64()
            .unwrap()[0]
    };
    let h = 1e-6;
    for (i, &pid) in params.iter().enumerate() {
        let pname = g.leaf_name(pid).unwrap().to_string();
        let analytic = base.outputs[&format!("g{i}")].as_f64().unwrap().to_vec();
        let n = g.ty(pid).shape.numel();
        assert_eq!(
            analytic.len(),
            n,
            "{name}: gradient of {pname} has the wrong size"
        );
        let step = (n / 40).max(1);
        for k in (0..n).step_by(step) {
            let mut probe = leaves.clone();
            let orig = probe[&pname].as_f64().unwrap()[k];
            probe.get_mut(&pname).unwrap().get_mut::<f64>().unwrap()[k] = orig + h;
            let up = loss_at(&probe);
            probe.get_mut(&pname).unwrap().get_mut::<f64>().unwrap()[k] = orig - h;
            let down = loss_at(&probe);
            let numeric = (up - down) / (2.0 * h);
            let tol = 1e-6 * (1.0 + numeric.abs().max(analytic[k].abs()));
            assert!(
                (numeric - analytic[k]).abs() <= tol,
                "{name}: d loss / d {pname}[{k}]: autodiff {} vs finite differences {numeric}",
                analytic[k]
            );
        }
    }
}
