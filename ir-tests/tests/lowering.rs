//! Snapshots of the lowered programs of the reference models (compiler::lower): what each
//! backend runs per step, summarised (operation counts, the dependency graph's shape, launch
//! shapes, GEMM shapes) with a fingerprint of every offset, argument and source byte. Lowering
//! needs no GPU, so the CUDA programs are checked here, on every machine.

use ingot_compiler::exe::Executable;
use ingot_compiler::lower::{Program, Target};
use ingot_compiler::pipeline::{self, Options};
use ingot_testkit::programs::cuda_program;

fn lowered(spec: &str, target: Target) -> Executable {
    ingot_models::compile_model(spec, &Options::for_target(target))
        .unwrap()
        .executable(target)
        .unwrap()
}

fn summary(spec: &str, target: Target) -> String {
    lowered(spec, target).program().summary()
}

ingot_ir_tests::snapshot_tests! {
    mlp_cuda_program => summary("mlp", Target::Cuda),
    gpt_mini_cuda_program => summary("gpt-mini", Target::Cuda),
    gpt2_cuda_program => summary("gpt2", Target::Cuda),
    mlp_cpu_program => summary("mlp", Target::Cpu),
    gpt_mini_cpu_program => summary("gpt-mini", Target::Cpu),
}

#[test]
fn lowering_the_same_step_twice_gives_the_same_program() {
    let (a, b) = (
        lowered("gpt-mini", Target::Cuda),
        lowered("gpt-mini", Target::Cuda),
    );
    assert!(a.program() == b.program());
    a.check_program().unwrap();
}

#[test]
fn every_operation_of_the_gpt2_program_stays_inside_its_allocation_and_is_ordered() {
    let exe = lowered("gpt2", Target::Cuda);
    let p = cuda_program(&exe);
    // The checks lowering ran, run again from the outside: bounds, tables, dependencies.
    exe.program().check(exe.graph(), exe.plan()).unwrap();
    assert_eq!(p.total_bytes, exe.plan().total_bytes);
    assert_eq!(
        p.counts().gemms,
        exe.graph()
            .ids()
            .filter(|&id| {
                matches!(
                    exe.graph().node(id).op,
                    ingot_compiler::ir::Op::MatMul { .. }
                )
            })
            .count()
    );
}

/// The CUDA program of `spec` compiled for `ranks` data-parallel ranks.
fn lowered_for_ranks(spec: &str, ranks: usize) -> Executable {
    let model = ingot_models::by_name(spec).unwrap();
    let step = ingot_compiler::autodiff::StepOptions {
        ranks,
        ..Default::default()
    };
    pipeline::compile_observed_with(
        &model,
        &step,
        &Options::for_target(Target::Cuda),
        &mut |_| {},
    )
    .unwrap()
    .executable(Target::Cuda)
    .unwrap()
}

#[test]
fn each_gradient_bucket_lowers_to_one_all_reduce_over_its_region_each_waiting_for_the_last() {
    use ingot_compiler::lower::cuda::DeviceOp;
    // A vocabulary large enough for several 25 MiB buckets.
    let spec = "gpt:vocab=32768,d_model=256,layers=2,heads=4,d_ff=1024,seq=32,batch=2";
    let exe = lowered_for_ranks(spec, 2);
    let p = cuda_program(&exe);
    exe.program().check(exe.graph(), exe.plan()).unwrap();
    let buckets = ingot_compiler::plan::buckets::buckets(exe.graph(), exe.plan());
    let reduces: Vec<(usize, usize, usize)> = p
        .ops
        .iter()
        .enumerate()
        .filter_map(|(i, op)| match op {
            DeviceOp::AllReduce {
                offset,
                bytes,
                ranks,
                ..
            } => {
                assert_eq!(*ranks, 2);
                Some((i, *offset, *bytes))
            }
            _ => None,
        })
        .collect();
    assert!(buckets.len() >= 2, "{} buckets", buckets.len());
    assert_eq!(reduces.len(), buckets.len(), "one all-reduce per bucket");
    assert_eq!(p.counts().all_reduces, buckets.len());
    for ((i, offset, bytes), b) in reduces.iter().zip(&buckets) {
        assert_eq!(
            *bytes, b.region_bytes,
            "the all-reduce covers its bucket's region"
        );
        let outs = &exe.graph().kernel_outputs()[b.node.index()];
        let first = exe.plan().location(exe.graph(), outs[0]);
        assert_eq!(*offset, first.offset);
        // Every gradient of the bucket is written (by its kernel or a copy) before the
        // all-reduce, which the update reads after: the dependency graph orders them.
        assert!(
            !p.deps[*i].is_empty(),
            "an all-reduce waits for its gradients"
        );
    }
    // The token embedding's gradient is made from the ranks' gathered ids and rows: two
    // all-gathers of one rank's bytes into twice as many, in the one chain of collectives.
    let gathers: Vec<(usize, usize)> = p
        .ops
        .iter()
        .enumerate()
        .filter_map(|(i, op)| match op {
            DeviceOp::AllGather { bytes, ranks, .. } => {
                assert_eq!(*ranks, 2);
                Some((i, *bytes))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        gathers.iter().map(|g| g.1).collect::<Vec<_>>(),
        vec![2 * 32 * 8, 2 * 32 * 256 * 4],
        "the (i64) ids and the (f32) rows of one rank"
    );
    assert_eq!(p.counts().all_gathers, 2);
    let collectives: Vec<usize> = (0..p.ops.len())
        .filter(|&i| p.ops[i].is_collective())
        .collect();
    assert_eq!(collectives.len(), reduces.len() + gathers.len());
    for w in collectives.windows(2) {
        assert!(
            p.deps[w[1]].contains(&w[0]),
            "collective {} does not wait for the one before it",
            w[1]
        );
    }
    // The chain is a checked invariant: a program whose collectives may run out of order is
    // refused by the program's own check.
    let mut broken = p.clone();
    let (last, before) = (
        collectives[collectives.len() - 1],
        collectives[collectives.len() - 2],
    );
    broken.deps[last].retain(|d| *d != before);
    let e = broken.check(p.total_bytes).unwrap_err().to_string();
    assert!(e.contains("does not wait for collective"), "{e}");
}

#[test]
fn one_rank_has_no_all_reduce_on_the_gpu_either() {
    let exe = lowered_for_ranks("mlp", 1);
    let p = cuda_program(&exe);
    assert_eq!(p.counts().all_reduces, 0);
}

/// Where each collective of `exe`'s CUDA program sits: (all-reduce positions, all-gather
/// positions).
fn collective_positions(exe: &Executable) -> (Vec<usize>, Vec<usize>) {
    use ingot_compiler::lower::cuda::DeviceOp;
    let p = cuda_program(exe);
    let at = |f: fn(&DeviceOp) -> bool| -> Vec<usize> {
        p.ops
            .iter()
            .enumerate()
            .filter(|(_, op)| f(op))
            .map(|(i, _)| i)
            .collect()
    };
    (
        at(|op| matches!(op, DeviceOp::AllReduce { .. })),
        at(|op| matches!(op, DeviceOp::AllGather { .. })),
    )
}

/// gpt2 compiled for two ranks in bf16, its gradients reduced in bf16, lowered for CUDA and
/// checked; compiled once for the tests that read it.
fn gpt2_two_ranks_bf16() -> &'static Executable {
    static EXE: std::sync::OnceLock<Executable> = std::sync::OnceLock::new();
    EXE.get_or_init(|| {
        let model = ingot_models::by_name("gpt2").unwrap();
        let step = ingot_compiler::autodiff::StepOptions {
            ranks: 2,
            reduce_in_bf16: true,
            ..Default::default()
        };
        let opts = Options {
            precision: Some(ingot_compiler::precision::Precision::Bf16),
            ..Options::for_target(Target::Cuda)
        };
        let exe = pipeline::compile_observed_with(&model, &step, &opts, &mut |_| {})
            .unwrap()
            .executable(Target::Cuda)
            .unwrap();
        exe.program().check(exe.graph(), exe.plan()).unwrap();
        exe
    })
}

#[test]
fn a_recomputed_weight_gradient_runs_in_its_layer_so_its_bucket_is_reduced_during_the_backward_pass(
) {
    // gpt2 in bf16 recomputes each MLP's GELU output for its weight gradient. Placed where the
    // traced order put the recomputation (after the whole backward pass), those gradients held
    // every weight bucket, and its all-reduce, until the step's end. Pulled into their layers,
    // only the last bucket's remainder (3.5 MB, which the rows' gather overtakes) and the first
    // layer's small f32 gradients are left to reduce after the embedding's rows are gathered,
    // which needs the whole backward pass.
    use ingot_compiler::lower::cuda::DeviceOp;
    let exe = gpt2_two_ranks_bf16();
    let p = cuda_program(exe);
    let (reduces, gathers) = collective_positions(exe);
    let rows = *gathers.last().expect("the embedding's rows are gathered");
    let bytes = |i: usize| match &p.ops[i] {
        DeviceOp::AllReduce { bytes, .. } => *bytes,
        _ => 0,
    };
    let all: usize = reduces.iter().map(|&i| bytes(i)).sum();
    let late: usize = reduces
        .iter()
        .filter(|&&i| i > rows)
        .map(|&i| bytes(i))
        .sum();
    assert!(reduces.len() >= 8, "{} all-reduces", reduces.len());
    assert!(
        late * 20 < all,
        "{late} of {all} bytes all-reduced wait for the whole backward pass (all-reduces at \
         {reduces:?}, rows gathered at {rows})"
    );
}

#[test]
fn an_update_of_a_reduced_bucket_runs_one_collective_after_its_all_reduce_inside_the_backward_pass()
{
    // Deferred to the step's end, the updates of every bucket (Adam over 124M parameters) ran
    // on the tail with nothing to overlap them. One collective late, an update waits for the
    // all-reduce after its own to be launched, and comes before the step's last collective.
    use ingot_compiler::ir::Op;
    use ingot_compiler::lower::cuda::DeviceOp;
    let exe = gpt2_two_ranks_bf16();
    let g = exe.graph();
    let p = cuda_program(exe);
    let collectives: Vec<(usize, ingot_compiler::ir::NodeId)> = p
        .ops
        .iter()
        .enumerate()
        .filter(|(_, op)| op.is_collective())
        .filter_map(|(i, op)| Some((i, op.node()?)))
        .collect();
    let last = collectives.last().expect("collectives").0;
    // Where each kernel's node is launched.
    let launched: std::collections::HashMap<ingot_compiler::ir::NodeId, usize> = p
        .ops
        .iter()
        .enumerate()
        .filter_map(|(i, op)| match op {
            DeviceOp::Launch { node, .. } => Some((*node, i)),
            _ => None,
        })
        .collect();
    let reads = |reader: ingot_compiler::ir::NodeId, c: ingot_compiler::ir::NodeId| {
        g.node(reader).inputs.iter().any(|&x| {
            x == c || matches!(g.node(x).op, Op::Result { .. }) && g.node(x).inputs[0] == c
        })
    };
    let mut checked = 0;
    for (k, &(at, c)) in collectives.iter().enumerate() {
        if !matches!(g.node(c).op, Op::AllReduce { .. }) || k + 2 >= collectives.len() {
            continue;
        }
        let next = collectives[k + 1].0;
        let readers: Vec<usize> = g
            .ids()
            .filter(|&r| reads(r, c))
            .filter_map(|r| launched.get(&r).copied())
            .collect();
        assert!(!readers.is_empty(), "the all-reduce at {at} has no update");
        for r in readers {
            assert!(
                next < r && r < last,
                "an update of the all-reduce at {at} runs at {r}: not between the next \
                 collective ({next}) and the last ({last})"
            );
            checked += 1;
        }
    }
    assert!(checked >= 40, "{checked} updates checked");
}

#[test]
fn reduced_in_bf16_the_embeddings_rows_are_gathered_in_bf16_and_summed_in_f32() {
    use ingot_compiler::ir::{DType, Op};
    let exe = gpt2_two_ranks_bf16();
    let g = exe.graph();
    // The gathers: the ids (integers) and the rows.
    let rows: Vec<_> = g
        .ids()
        .filter(|&id| matches!(g.node(id).op, Op::AllGather { .. }))
        .filter(|&id| !matches!(g.ty(id).dtype, DType::I32 | DType::I64))
        .collect();
    assert_eq!(rows.len(), 1, "one gather of rows");
    assert_eq!(g.ty(rows[0]).dtype, DType::BF16);
    // Each reader makes f32 of them: the embedding's sum reads the bf16 rows itself and adds
    // them in f32 (no f32 copy of all 16,384 rows crosses memory first), the position
    // embedding's column sum widens them in its kernel.
    let users = g.users();
    for &u in &users[rows[0].index()] {
        assert_eq!(g.ty(u).dtype, DType::F32, "{:?}", g.node(u).op.name());
    }
    assert!(
        users[rows[0].index()]
            .iter()
            .any(|&u| matches!(g.node(u).op, Op::ScatterAdd { .. })),
        "the embedding's sum reads the gathered bf16 rows"
    );
}

/// The bytes of each all-reduce of `dtype` in `p`, in program order.
fn all_reduce_bytes(
    p: &ingot_compiler::lower::cuda::Program,
    dtype: ingot_compiler::ir::DType,
) -> Vec<usize> {
    use ingot_compiler::lower::cuda::DeviceOp;
    p.ops
        .iter()
        .filter_map(|op| match op {
            DeviceOp::AllReduce {
                bytes, dtype: d, ..
            } if *d == dtype => Some(*bytes),
            _ => None,
        })
        .collect()
}

#[test]
fn buckets_fill_in_the_order_the_gradients_are_made_so_the_last_is_the_remainder() {
    // As DDP's: every bf16 bucket but the last is full (more than half the 25 MiB cap: the
    // next gradient did not fit), and the last, all-reduced at the end of the backward pass,
    // holds what is left. Filled in parameter order instead, the remainder was the bucket
    // reduced first and the last a full 24 MB.
    use ingot_compiler::ir::DType;
    let exe = gpt2_two_ranks_bf16();
    let p = cuda_program(exe);
    let bytes = all_reduce_bytes(p, DType::BF16);
    let cap = ingot_compiler::autodiff::buckets::BUCKET_BYTES;
    let (&last, full) = bytes.split_last().expect("bf16 buckets");
    assert!(full.len() >= 7, "{bytes:?}");
    assert!(full.iter().all(|&b| 2 * b > cap), "{bytes:?}");
    assert!(
        last < cap / 4,
        "the last bucket holds {last} bytes: {bytes:?}"
    );
    // The f32 gradients (biases, LayerNorm gains: 485 KB in all) close with the bf16 bucket
    // they were made beside, so most are reduced, and updated, inside the backward pass.
    let f32s = all_reduce_bytes(p, DType::F32);
    let total: usize = f32s.iter().sum();
    assert!(f32s.len() >= full.len(), "{f32s:?}");
    assert!(
        f32s.iter().all(|&b| 4 * b < total),
        "one f32 bucket holds a quarter of them: {f32s:?}"
    );
}

#[test]
fn the_embeddings_rows_are_gathered_before_the_first_layers_small_gradients_are_reduced() {
    // Both are ready as the backward pass ends. The rows' readers (a scatter-add over 16,384
    // positions, then Adam over the 50,304-row table) are the step's longest tail; the small
    // f32 all-reduce ahead of them would hold the gather for NCCL's latency.
    let (reduces, gathers) = collective_positions(gpt2_two_ranks_bf16());
    let rows = *gathers.last().expect("the embedding's rows are gathered");
    let last = *reduces.last().expect("all-reduces");
    assert!(
        rows < last,
        "rows gathered at {rows}, after the last all-reduce at {last}"
    );
}

#[test]
fn the_rows_all_gather_overtakes_the_all_reduce_ready_just_before_it() {
    // The last weight bucket (the first layer's) is complete a few kernels before the
    // embedding's rows; its update waits for the next collective anyway, while the rows feed
    // the scatter-add and the embedding's update, the step's longest tail. So the gather is
    // launched first though it is ready later.
    let exe = gpt2_two_ranks_bf16();
    let p = cuda_program(exe);
    // Where an operation's operands are ready: its latest dependence that is not a collective
    // (each collective also waits for the one before it).
    let ready = |i: usize| {
        p.deps[i]
            .iter()
            .copied()
            .filter(|&d| !p.ops[d].is_collective())
            .max()
    };
    let (reduces, gathers) = collective_positions(exe);
    let rows = *gathers.last().expect("the embedding's rows are gathered");
    let overtaken = reduces
        .iter()
        .filter(|&&a| a > rows && ready(a) < ready(rows))
        .count();
    assert!(
        overtaken >= 1,
        "no all-reduce ready before the rows waits for their gather (all-reduces at \
         {reduces:?}, rows gathered at {rows})"
    );
}

#[test]
fn kernels_wait_for_the_rows_all_gather_only_through_what_it_gathers() {
    // An all-gather reads its operand until it is done. Freed at the gather's launch, the
    // rows' bytes went to the next kernels in the schedule (the sum's index over the ids, the
    // first layer's LayerNorm gains), and each then waited for the whole gather on the step's
    // tail. Only what reads the gathered rows, or a collective launched after them, may wait.
    let exe = gpt2_two_ranks_bf16();
    let p = cuda_program(exe);
    let g = exe.graph();
    let (_, gathers) = collective_positions(exe);
    let rows = *gathers.last().expect("the embedding's rows are gathered");
    // The nodes computed from the gathered rows or from a later collective's result.
    let mut after = vec![false; g.len()];
    for op in &p.ops[rows..] {
        if let Some(n) = op.node().filter(|_| op.is_collective()) {
            after[n.index()] = true;
        }
    }
    for id in g.ids() {
        if g.node(id).inputs.iter().any(|x| after[x.index()]) {
            after[id.index()] = true;
        }
    }
    // The operations that wait for the gather, through any path of the program's edges.
    let mut waits = vec![false; p.ops.len()];
    waits[rows] = true;
    let mut wrong = Vec::new();
    for j in rows + 1..p.ops.len() {
        waits[j] = p.deps[j].iter().any(|&d| waits[d]);
        // A memset has no node: it zeroes the sum's output, which reads the rows anyway.
        if let Some(n) = p.ops[j].node().filter(|_| waits[j]) {
            if !after[n.index()] {
                wrong.push((j, g.node(n).op.name()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "operations waiting for the rows' all-gather (op {rows}) without reading what it \
         gathered: {wrong:?}"
    );
}

#[test]
fn a_gradient_ready_at_the_end_of_the_backward_pass_goes_before_the_updates_released_there() {
    // The first layer's LayerNorm gains are column sums ready with the embedding's rows; the
    // updates released by the rows' gather (the embedding's sum and update, 0.4 ms) went
    // before them, and their all-reduce, the step's last, waited behind those.
    let exe = gpt2_two_ranks_bf16();
    let p = cuda_program(exe);
    let g = exe.graph();
    let (reduces, gathers) = collective_positions(exe);
    let rows = *gathers.last().expect("the embedding's rows are gathered");
    let last = *reduces.last().expect("gradients are reduced");
    // The kernels that make the last all-reduce's operands (through reshapes).
    let last_node = p.ops[last].node().unwrap();
    let mut makers = std::collections::HashSet::new();
    for &x in &g.node(last_node).inputs {
        let mut v = x;
        while matches!(g.node(v).op, ingot_compiler::ir::Op::Reshape) {
            v = g.node(v).inputs[0];
        }
        makers.insert(g.writer(v));
    }
    let made_at = p
        .ops
        .iter()
        .rposition(|op| op.node().is_some_and(|n| makers.contains(&n)))
        .expect("the last bucket's gradients are made on the device");
    // The first operation that reads the gathered rows' bytes (the embedding's sort, lowered
    // earlier under the same node, reads only the ids).
    let gathered = p.touches[rows].writes[0];
    let overlaps = |l: &ingot_compiler::plan::Location| {
        l.offset < gathered.offset + gathered.bytes && gathered.offset < l.offset + l.bytes
    };
    let first_reader = (rows + 1..p.ops.len())
        .find(|&j| p.touches[j].reads.iter().any(overlaps))
        .expect("the gathered rows are read");
    assert!(
        made_at < first_reader,
        "the last bucket's gradient is made at op {made_at}, after the first reader of the \
         gathered rows (op {first_reader})"
    );
}

/// A step built by hand around a reduce-scatter over two ranks, compiled for `target`: `a =
/// 2·x` (a gradient in the slab), `y = reduce_scatter(a, b)` (`b`'s rows a result node), `c =
/// y + 1`, then `d`, as large as `a`, made from `c` after it: the bytes `a` leaves free once
/// the collective's outputs are read are there for `d` to take.
fn reduce_scatter_step(target: Target) -> Executable {
    use ingot_compiler::autodiff::Step;
    use ingot_compiler::ir::{DType, Graph, Op, TensorType};
    let mut g = Graph::new();
    let x = g.input("x", [256, 64], DType::F32).unwrap();
    let b = g.input("b", [6, 4], DType::F32).unwrap();
    let a = g
        .binary_scalar(ingot_compiler::ir::BinaryOp::Mul, x, 2.0)
        .unwrap();
    let b2 = g
        .binary_scalar(ingot_compiler::ir::BinaryOp::Mul, b, 3.0)
        .unwrap();
    let y = g
        .push(Op::ReduceScatter { ranks: 2 }, &[a, b2], None)
        .unwrap();
    let yb = g
        .push(
            Op::Result { index: 1 },
            &[y],
            Some(TensorType::new(
                ingot_compiler::ir::Shape::new(&[3, 4]),
                DType::F32,
            )),
        )
        .unwrap();
    let c = g
        .binary_scalar(ingot_compiler::ir::BinaryOp::Add, y, 1.0)
        .unwrap();
    let s = g.sum(c, &[0, 1]).unwrap();
    let sb = g.broadcast_to(s, [256, 64]).unwrap();
    let d = g.mul(x, sb).unwrap();
    g.set_output("c", c).unwrap();
    g.set_output("yb", yb).unwrap();
    g.set_output("d", d).unwrap();
    let opts = Options::for_target(target);
    pipeline::compile_step("reduce_scatter", Step::forward_only(g), &opts)
        .unwrap()
        .executable(target)
        .unwrap()
}

#[test]
fn a_reduce_scatter_lowers_to_one_collective_over_its_operands_into_buffers_of_their_own() {
    use ingot_compiler::ir::Op;
    use ingot_compiler::lower::cpu::Instr;
    use ingot_compiler::lower::cuda::DeviceOp;
    for target in [Target::Cpu, Target::Cuda] {
        let exe = reduce_scatter_step(target);
        let (g, plan) = (exe.graph(), exe.plan());
        exe.program().check(g, plan).unwrap();
        let node = g
            .ids()
            .find(|&id| matches!(g.node(id).op, Op::ReduceScatter { ranks: 2 }))
            .expect("the reduce-scatter is neither rewritten nor fused away");
        let outs = &g.kernel_outputs()[node.index()];
        // Operand i's whole bytes in, this rank's half of them out, apart.
        let want: Vec<(usize, usize, usize)> = g
            .node(node)
            .inputs
            .iter()
            .zip(outs)
            .map(|(&x, &o)| {
                let (x, o) = (plan.location(g, x), plan.location(g, o));
                assert_eq!(x.bytes, 2 * o.bytes);
                assert!(o.offset >= x.offset + x.bytes || x.offset >= o.offset + o.bytes);
                (x.offset, o.offset, o.bytes)
            })
            .collect();
        assert_eq!(want.len(), 2);
        let parts = match exe.program() {
            Program::Cpu(p) => p.instrs.iter().find_map(|i| match i {
                Instr::ReduceScatter {
                    node: n,
                    parts,
                    ranks: 2,
                    ..
                } if *n == node => Some(parts.clone()),
                _ => None,
            }),
            Program::Cuda(p) => {
                assert_eq!(p.counts().reduce_scatters, 1);
                p.ops.iter().find_map(|op| match op {
                    DeviceOp::ReduceScatter {
                        node: n,
                        parts,
                        ranks: 2,
                        ..
                    } if *n == node => Some(parts.clone()),
                    _ => None,
                })
            }
        }
        .expect("one reduce-scatter instruction for the node");
        let got: Vec<_> = parts.iter().map(|p| (p.from, p.to, p.bytes)).collect();
        assert_eq!(got, want, "{target}");
    }
}

#[test]
fn the_program_check_refuses_a_reduce_scatter_written_over_an_operand_or_outside_the_allocation() {
    use ingot_compiler::lower::cpu::Instr;
    use ingot_compiler::lower::cuda::DeviceOp;
    for target in [Target::Cpu, Target::Cuda] {
        let exe = reduce_scatter_step(target);
        for (edit, says) in [(0, "operand"), (1, "outside")] {
            let mut program = exe.program().clone();
            let parts = match &mut program {
                Program::Cpu(p) => p.instrs.iter_mut().find_map(|i| match i {
                    Instr::ReduceScatter { parts, .. } => Some(parts),
                    _ => None,
                }),
                Program::Cuda(p) => p.ops.iter_mut().find_map(|op| match op {
                    DeviceOp::ReduceScatter { parts, .. } => Some(parts),
                    _ => None,
                }),
            }
            .unwrap();
            match edit {
                // Output 1 onto operand 0's bytes.
                0 => parts[1].to = parts[0].from,
                _ => parts[0].from = exe.plan().total_bytes - parts[0].bytes,
            }
            let e = program
                .check(exe.graph(), exe.plan())
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{target} {says}: {e}");
        }
    }
}

#[test]
fn a_later_writer_of_a_reduce_scatters_operand_bytes_waits_for_the_collective() {
    use ingot_compiler::lower::cuda::DeviceOp;
    let exe = reduce_scatter_step(Target::Cuda);
    let p = cuda_program(&exe);
    let (g, plan) = (exe.graph(), exe.plan());
    let rs = p
        .ops
        .iter()
        .position(|op| matches!(op, DeviceOp::ReduceScatter { .. }))
        .expect("the reduce-scatter is lowered");
    let node = p.ops[rs].node().unwrap();
    // It reads its operands and writes its outputs: what the dependency graph is made from.
    let outs = &g.kernel_outputs()[node.index()];
    let reads: Vec<_> = g
        .node(node)
        .inputs
        .iter()
        .map(|&x| plan.location(g, x))
        .collect();
    let writes: Vec<_> = outs.iter().map(|&o| plan.location(g, o)).collect();
    assert_eq!(p.touches[rs].reads.to_vec(), reads);
    assert_eq!(p.touches[rs].writes.to_vec(), writes);
    // Some later operation writes into the operand's bytes once they are free (the plan
    // reuses them), and it waits for the collective, through some path of edges.
    let overlaps = |a: &ingot_compiler::plan::Location, b: &ingot_compiler::plan::Location| {
        a.bytes > 0 && b.bytes > 0 && a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes
    };
    let mut waits = vec![false; p.ops.len()];
    waits[rs] = true;
    let mut writers = 0;
    for j in rs + 1..p.ops.len() {
        waits[j] = p.deps[j].iter().any(|&d| waits[d]);
        if p.touches[j]
            .writes
            .iter()
            .any(|w| reads.iter().any(|r| overlaps(w, r)))
        {
            writers += 1;
            assert!(waits[j], "op {j} writes over the operands of the reduce-scatter (op {rs}) without waiting for it");
        }
    }
    assert!(
        writers > 0,
        "the plan gives the operand's bytes to a later value"
    );
    // The edge is a checked invariant: cut every path from the collective and the program's
    // check refuses it.
    let mut broken = p.clone();
    for d in broken.deps.iter_mut().skip(rs + 1) {
        d.retain(|i| *i != rs);
    }
    let e = broken.check(p.total_bytes).unwrap_err().to_string();
    assert!(
        e.contains(&format!("operations {rs} and")) && e.contains("does not wait"),
        "{e}"
    );
}
