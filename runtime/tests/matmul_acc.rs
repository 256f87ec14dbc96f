//! `matmul_acc(c, a, b) = c + a·b` on the CPU backend: against a naive f64 reference written
//! here, node by node and planned (its result written over `c`, or apart from a `c` that lives
//! on), and planned bits equal to the reference interpreter's.

use indexmap::IndexMap;
use ingot_compiler::ir::{DType, Graph, Op};
use ingot_compiler::lower::Target;
use ingot_compiler::plan;
use ingot_runtime::cpu::interp::run_graph;
use ingot_runtime::cpu::planned::PlannedStep;
use ingot_runtime::tensor::Tensor;
use ingot_runtime::StepExecutor;

/// Deterministic values in [-2, 2).
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut next = ingot_kernels::fused::random::xorshift(seed);
    (0..n)
        .map(|_| (next() >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0)
        .collect()
}

fn tensor(dtype: DType, dims: &[usize], v: &[f64]) -> Tensor {
    let f32: Vec<f32> = v.iter().map(|&x| x as f32).collect();
    match dtype {
        DType::F32 => Tensor::from_f32(dims, f32),
        DType::BF16 => Tensor::from_f32_as_bf16(dims, &f32),
        DType::F64 => Tensor::from_f64(dims, v.to_vec()),
        d => panic!("no {d} tensors here"),
    }
}

/// `c + op(a)·op(b)` in f64 over the values the tensors hold, batch by batch.
fn naive(
    c: &[f64],
    a: &[f64],
    b: &[f64],
    (batch, m, k, n): (usize, usize, usize, usize),
    (ta, tb): (bool, bool),
) -> Vec<f64> {
    let mut out = c.to_vec();
    for z in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0;
                for l in 0..k {
                    let x = if ta {
                        a[z * m * k + l * m + i]
                    } else {
                        a[z * m * k + i * k + l]
                    };
                    let y = if tb {
                        b[z * k * n + j * k + l]
                    } else {
                        b[z * k * n + l * n + j]
                    };
                    s += x * y;
                }
                out[z * m * n + i * n + j] += s;
            }
        }
    }
    out
}

struct Case {
    g: Graph,
    leaves: IndexMap<String, Tensor>,
    want: Vec<f64>,
}

/// A graph with inputs `c`, `a`, `b` and output `y = matmul_acc(c, a, b)`.
fn case(
    ab: DType,
    cd: DType,
    batch: Option<usize>,
    (m, k, n): (usize, usize, usize),
    (ta, tb): (bool, bool),
) -> Case {
    let pre: Vec<usize> = batch.into_iter().collect();
    let dims = |r: usize, c: usize| [&pre[..], &[r, c]].concat();
    let (ad, bd, cdims) = (
        if ta { dims(k, m) } else { dims(m, k) },
        if tb { dims(n, k) } else { dims(k, n) },
        dims(m, n),
    );
    let mut g = Graph::new();
    let c = g.input("c", &cdims[..], cd).unwrap();
    let a = g.input("a", &ad[..], ab).unwrap();
    let b = g.input("b", &bd[..], ab).unwrap();
    let y = g.matmul_acc(c, a, b, ta, tb).unwrap();
    g.set_output("y", y).unwrap();
    let count = |d: &[usize]| d.iter().product::<usize>();
    let ct = tensor(cd, &cdims, &values(count(&cdims), 1));
    let at = tensor(ab, &ad, &values(count(&ad), 2));
    let bt = tensor(ab, &bd, &values(count(&bd), 3));
    let want = naive(
        &ct.to_f64_vec(),
        &at.to_f64_vec(),
        &bt.to_f64_vec(),
        (batch.unwrap_or(1), m, k, n),
        (ta, tb),
    );
    let leaves = [("c", ct), ("a", at), ("b", bt)]
        .into_iter()
        .map(|(n, t)| (n.to_string(), t))
        .collect();
    Case { g, leaves, want }
}

fn assert_close(got: &Tensor, want: &[f64], rel: f64, what: &str) {
    let got = got.to_f64_vec();
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= rel * (1.0 + w.abs()),
            "{what}: element {i} is {g}, the reference {w}"
        );
    }
}

/// A batch axis (if any), `(m, k, n)` and `(ta, tb)`.
type Shape = (Option<usize>, (usize, usize, usize), (bool, bool));

fn shapes() -> Vec<Shape> {
    let mut out = Vec::new();
    for t in [(false, false), (true, false), (false, true), (true, true)] {
        out.push((None, (7, 13, 5), t));
        out.push((Some(3), (4, 9, 6), t));
    }
    // Long enough in k that the GEMM sums in several blocks.
    out.push((None, (33, 600, 17), (true, false)));
    out
}

#[test]
fn matmul_acc_equals_c_plus_the_product_computed_naively() {
    // (operands, accumulator and result, relative tolerance)
    for (ab, cd, rel) in [
        (DType::F32, DType::F32, 1e-5),
        (DType::BF16, DType::F32, 1e-5),
        (DType::F64, DType::F64, 1e-12),
        // One rounding of the f32 sum to bf16.
        (DType::BF16, DType::BF16, 1.0 / 128.0),
    ] {
        for (batch, mkn, t) in shapes() {
            let c = case(ab, cd, batch, mkn, t);
            let out = run_graph(&c.g, &c.leaves).unwrap().outputs;
            let what = format!("{ab} into {cd}, batch {batch:?}, {mkn:?}, {t:?}");
            assert_eq!(out["y"].ty.dtype, cd, "{what}");
            assert_close(&out["y"], &c.want, rel, &what);
        }
    }
}

/// The same graph, planned for the CPU: `c` is an input that lives on, so the result is placed
/// apart and `c` is copied into it first.
#[test]
fn a_planned_matmul_acc_beside_a_live_accumulator_computes_the_reference_bits() {
    for (ab, cd) in [(DType::F32, DType::F32), (DType::BF16, DType::F32)] {
        let c = case(ab, cd, None, (33, 600, 17), (true, false));
        let p = plan::plan(&c.g, &Target::Cpu.plan_options()).unwrap();
        let y = c.g.outputs["y"];
        assert_ne!(p.location(&c.g, y), p.location(&c.g, c.g.node(y).inputs[0]));
        let mut planned = PlannedStep::from_plan(c.g.clone(), p).unwrap();
        for (name, value) in &c.leaves {
            planned.write_leaf(name, value).unwrap();
        }
        planned.step().unwrap();
        let got = planned.read_output("y").unwrap();
        let reference = run_graph(&c.g, &c.leaves).unwrap().outputs;
        assert_eq!(got.to_le_bytes(), reference["y"].to_le_bytes(), "{ab}");
        assert_close(&got, &c.want, 1e-5, "planned");
    }
}

/// `y = matmul_acc(exp(c), a, b)`: `exp(c)` dies at the matmul_acc, so the plan writes the
/// result over it and the GEMM adds into those bytes.
#[test]
fn a_matmul_acc_over_its_dying_accumulator_adds_in_place_and_computes_the_reference_bits() {
    for (ab, cd) in [
        (DType::F32, DType::F32),
        (DType::BF16, DType::F32),
        (DType::BF16, DType::BF16),
    ] {
        let mut c = case(ab, cd, Some(2), (9, 70, 11), (false, true));
        let y = c.g.outputs["y"];
        let (x, a, b) = {
            let n = c.g.node(y);
            (n.inputs[0], n.inputs[1], n.inputs[2])
        };
        let mut g = Graph::new();
        let xc = g.input("c", c.g.ty(x).shape.dims(), cd).unwrap();
        let xa = g.input("a", c.g.ty(a).shape.dims(), ab).unwrap();
        let xb = g.input("b", c.g.ty(b).shape.dims(), ab).unwrap();
        let e = g.exp(xc).unwrap();
        let (ta, tb) = match c.g.node(y).op {
            Op::MatMulAcc { ta, tb } => (ta, tb),
            _ => unreachable!(),
        };
        let out = g.matmul_acc(e, xa, xb, ta, tb).unwrap();
        g.set_output("y", out).unwrap();
        let reference = run_graph(&g, &c.leaves).unwrap().outputs;
        let p = plan::plan(&g, &Target::Cpu.plan_options()).unwrap();
        assert_eq!(
            p.location(&g, out),
            p.location(&g, e),
            "{ab} into {cd}: the result is not over its accumulator"
        );
        let exe = ingot_compiler::exe::Executable::new(
            "t",
            g.clone(),
            p.clone(),
            report(&g, &p),
            Target::Cpu,
        )
        .unwrap();
        let ingot_compiler::lower::Program::Cpu(prog) = exe.program() else {
            unreachable!()
        };
        assert!(prog
            .instrs
            .contains(&ingot_compiler::lower::cpu::Instr::InPlace { node: out }));
        let mut planned = PlannedStep::from_plan(g.clone(), p).unwrap();
        for (name, value) in &c.leaves {
            planned.write_leaf(name, value).unwrap();
        }
        planned.step().unwrap();
        let got = planned.read_output("y").unwrap();
        assert_eq!(
            got.to_le_bytes(),
            reference["y"].to_le_bytes(),
            "{ab} into {cd}: planned bits differ"
        );
        // And the value: exp(c) + a·b.
        let ec: Vec<f64> = c.leaves["c"].to_f64_vec().iter().map(|v| v.exp()).collect();
        let ec = tensor(cd, c.g.ty(x).shape.dims(), &ec).to_f64_vec();
        let want = naive(
            &ec,
            &c.leaves["a"].to_f64_vec(),
            &c.leaves["b"].to_f64_vec(),
            (2, 9, 70, 11),
            (ta, tb),
        );
        let rel = if cd == DType::BF16 { 1.0 / 64.0 } else { 1e-5 };
        assert_close(&got, &want, rel, "in place");
        c.want = want;
    }
}

fn report(g: &Graph, p: &plan::MemoryPlan) -> ingot_compiler::report::Report {
    ingot_compiler::report::Report::new("t", g, p, None)
}
