//! Offload (issue 51): AdamW's moments kept in host memory and copied to the device around
//! their update. The plan moves them out of the resident region and validates the copies; the
//! CPU executor runs them over a host region of its own and trains to the same losses, bit for
//! bit; the fitter reaches for it only when nothing else fits.

use ingot_compiler::autodiff::optim::Optimizer;
use ingot_compiler::autodiff::StepOptions;
use ingot_compiler::fit::{self, offload::moments, FitOptions};
use ingot_compiler::lower::{CopyIn, CopyOut, Target};
use ingot_compiler::model::Model;
use ingot_compiler::pipeline::{self, Compiled, Options};
use ingot_compiler::plan::check::PlanViolation;
use ingot_compiler::plan::{align_up, PlanError};
use ingot_ir_tests::fits::fit_none;
use ingot_testkit::steps::losses_and_state;
use ingot_testkit::text::assert_mentions;
use ingot_trainer::session::Session;

const GPT: &str = "gpt:vocab=64,d_model=32,layers=2,heads=2,d_ff=64,seq=8,batch=2";

fn mlp_adamw() -> Model {
    let mut m = ingot_models::by_name("mlp").unwrap();
    m.optimizer = Optimizer::adamw(1e-3, 0.01);
    m
}

/// The CPU pipeline options with `names` offloaded.
fn offloading(names: &[String]) -> Options {
    let mut o = Options::for_target(Target::Cpu);
    o.plan.offload = names.to_vec();
    o
}

/// `m` compiled as it is, and with every AdamW moment offloaded.
fn plain_and_offloaded(m: &Model) -> (Compiled, Compiled, Vec<String>) {
    let plain = pipeline::compile(m, &Options::for_target(Target::Cpu)).unwrap();
    let names = moments(&plain.graph);
    assert!(!names.is_empty(), "{} trains with AdamW", m.name);
    let off = pipeline::compile(m, &offloading(&names)).unwrap();
    (plain, off, names)
}

#[test]
fn offloaded_moments_leave_the_resident_region_for_homes_in_the_host_region() {
    for m in [mlp_adamw(), ingot_models::by_name(GPT).unwrap()] {
        let (plain, off, names) = plain_and_offloaded(&m);
        let moment_bytes: usize = names
            .iter()
            .map(|n| align_up(off.graph.ty(off.graph.leaf(n).unwrap()).bytes()))
            .sum();
        assert_eq!(off.plan.offload.len(), names.len());
        assert_eq!(off.plan.host_bytes, moment_bytes, "{}", m.name);
        assert_eq!(
            off.plan.resident_bytes,
            plain.plan.resident_bytes - moment_bytes,
            "{}",
            m.name
        );
        // Each staging buffer lives in the slab only around its update, so the device's total
        // falls (the slab may grow by the staging buffers live at its peak, never by all).
        assert!(
            off.plan.total_bytes < plain.plan.total_bytes,
            "{}: {} >= {}",
            m.name,
            off.plan.total_bytes,
            plain.plan.total_bytes
        );
        for o in &off.plan.offload {
            assert!(o.copy_in_before <= o.copy_out_after);
            let st = &off.plan.liveness.storages[off.plan.liveness.storage_of[o.leaf.index()]];
            // Live from its copy in, and at least until its copy out (later while its bytes
            // stay free: offload::prefetch).
            assert_eq!(st.start, o.copy_in_before);
            assert!(
                st.end > o.copy_out_after,
                "{}: ends before its copy out",
                o.leaf
            );
        }
        off.plan.validate(&off.graph).unwrap();
        let r = off
            .report
            .offload
            .as_ref()
            .expect("the report says offload");
        assert_eq!(
            (r.values, r.copies, r.host_bytes),
            (names.len(), 2 * names.len(), moment_bytes)
        );
        assert!(off.report.table().contains("offloaded:"));
        // A plan without offload says nothing of it, in its JSON too.
        assert!(plain.plan.offload.is_empty() && plain.report.offload.is_none());
        let json = serde_json::to_string(&plain.report).unwrap();
        assert!(!json.contains("offload") && !json.contains("host_bytes"));
    }
}

#[test]
fn the_validator_refuses_offload_copies_moved_or_homes_that_overlap() {
    let (_, off, _) = plain_and_offloaded(&mlp_adamw());
    // Copied out before the op that writes its new value: the staging buffer still holds the
    // old one.
    let mut p = off.plan.clone();
    let o = &mut p.offload[0];
    let leaf = o.leaf;
    (o.copy_in_before, o.copy_out_after) = (0, 0);
    match p.validate(&off.graph) {
        Err(PlanViolation::OffloadNotHeld { leaf: l, at: 0, .. }) => assert_eq!(l, leaf),
        other => panic!("moved copies accepted or refused for another reason: {other:?}"),
    }
    // Copied in after its first reader: that read finds other bytes.
    let mut p = off.plan.clone();
    let o = &mut p.offload[0];
    o.copy_in_before = o.copy_out_after + 1;
    o.copy_out_after += 1;
    assert!(
        p.validate(&off.graph).is_err(),
        "a late copy in was accepted"
    );
    // Two homes on the same host bytes.
    let mut p = off.plan.clone();
    p.offload[1].host.offset = p.offload[0].host.offset;
    p.offload[1].host.bytes = p.offload[0].host.bytes;
    let l1 = off.graph.ty(p.offload[1].leaf).bytes();
    if l1 == p.offload[1].host.bytes {
        assert!(matches!(
            p.validate(&off.graph),
            Err(PlanViolation::OffloadHomesOverlap { .. })
        ));
    }
    // A home past the host region's end.
    let mut p = off.plan.clone();
    p.host_bytes -= 256;
    let last = p.offload.len() - 1;
    p.offload[last].host.offset = p.host_bytes;
    assert!(matches!(
        p.validate(&off.graph),
        Err(PlanViolation::OffloadInvalid { .. })
    ));
}

#[test]
fn offloading_a_leaf_that_is_not_optimizer_state_is_an_error_naming_it() {
    let m = mlp_adamw();
    let plain = pipeline::compile(&m, &Options::for_target(Target::Cpu)).unwrap();
    let param = plain
        .graph
        .leaves(ingot_compiler::ir::LeafKind::Parameter)
        .into_iter()
        .next()
        .unwrap();
    let name = plain.graph.leaf_name(param).unwrap().to_string();
    for (ask, says) in [
        (name.clone(), "only optimizer state"),
        ("no.such.leaf".to_string(), "no leaf of that name"),
    ] {
        let e = pipeline::compile(&m, &offloading(std::slice::from_ref(&ask))).unwrap_err();
        let pipeline::CompileError::Plan(PlanError::Offload { name: n, reason }) = &e else {
            panic!("not an offload error: {e}");
        };
        assert_eq!(n, &ask);
        assert!(reason.contains(says), "{e}");
        assert!(e.to_string().contains(&ask), "{e}");
    }
}

/// Optimizer state by name, as little-endian bytes.
type State = Vec<(String, Vec<u8>)>;

/// Losses (as bits) of `steps` steps of `m` on the CPU compiled with `opts`, the bytes the
/// executor allocated on the device and for the host region, and the optimizer state after.
fn train(m: &Model, opts: &Options, steps: usize) -> (Vec<u64>, usize, State) {
    let mut s = Session::with_options(m, 3, opts).unwrap();
    let (losses, state) = losses_and_state(&mut s, steps);
    (losses, s.exe().allocated_bytes(), state)
}

#[test]
fn an_offloaded_step_trains_to_the_same_losses_bit_for_bit_on_a_smaller_allocation() {
    for m in [mlp_adamw(), ingot_models::by_name(GPT).unwrap()] {
        let (plain, off, names) = plain_and_offloaded(&m);
        let (l0, a0, s0) = train(&m, &Options::for_target(Target::Cpu), 4);
        let (l1, a1, s1) = train(&m, &offloading(&names), 4);
        assert_eq!(l0, l1, "{}: the losses differ", m.name);
        // The moments read back from their host homes: the same as resident ones.
        assert_eq!(s0, s1, "{}: the optimizer state differs", m.name);
        assert_eq!(
            a0 - a1,
            plain.plan.total_bytes - off.plan.total_bytes,
            "{}: the allocation shrinks by what the plan says",
            m.name
        );
    }
}

#[test]
fn the_fitter_offloads_only_when_nothing_else_fits_and_then_the_fewest_moments() {
    let m = mlp_adamw();
    let (plain, all, names) = plain_and_offloaded(&m);
    // Under the resident bytes nothing but offload fits; with every moment offloaded it does.
    let budget = align_up((all.plan.total_bytes + plain.plan.resident_bytes) / 2);
    assert!(all.plan.total_bytes <= budget && budget < plain.plan.resident_bytes);
    let fo = FitOptions {
        offload: true,
        ..fit_none(budget)
    };
    let opts = Options::for_target(Target::Cpu);
    let (_, c, f) = fit::fit(&m, &StepOptions::default(), &opts, &fo, None).unwrap();
    let f = f.expect("fitted");
    let o = f.offload.as_ref().expect("fitted by offload");
    assert!(c.report.total_bytes <= budget);
    assert_eq!(o.device_bytes, c.report.total_bytes);
    assert_eq!(o.values, c.plan.offload.len());
    assert_eq!(o.host_bytes, c.plan.host_bytes);
    assert!(f
        .line()
        .contains(&format!("offloaded: {} values", o.values)));
    c.executable(Target::Cpu).unwrap();
    // The fewest, largest first: one moment fewer is over the budget.
    assert!(o.values >= 1);
    let fewer = pipeline::compile(&m, &offloading(&names[..o.values - 1])).unwrap();
    assert!(fewer.report.total_bytes > budget);
    // At a budget the plan meets as compiled, nothing is offloaded.
    let as_is = FitOptions {
        budget: plain.plan.total_bytes,
        ..fo
    };
    let (_, c, f) = fit::fit(&m, &StepOptions::default(), &opts, &as_is, None).unwrap();
    assert!(f.is_none() && c.plan.offload.is_empty());
}

#[test]
fn a_budget_under_the_resident_bytes_less_every_moment_is_refused_naming_both() {
    let m = mlp_adamw();
    let (plain, _, names) = plain_and_offloaded(&m);
    let g = &plain.graph;
    let moment_bytes: usize = names
        .iter()
        .map(|n| align_up(g.ty(g.leaf(n).unwrap()).bytes()))
        .sum();
    let resident = plain.plan.resident_bytes;
    let opts = Options::for_target(Target::Cpu);
    let ask = |budget: usize, offload: bool| {
        let fo = FitOptions {
            recompute: true,
            accumulate: true,
            offload,
            ..fit_none(budget)
        };
        fit::fit(&m, &StepOptions::default(), &opts, &fo, None)
    };
    let e = ask(resident - moment_bytes - 1, true).unwrap_err();
    let fit::FitError::Resident { offloadable, .. } = &e else {
        panic!("not refused for its resident bytes: {e}");
    };
    assert_eq!(*offloadable, moment_bytes);
    let msg = e.to_string();
    assert!(
        msg.contains(&resident.to_string())
            && msg.contains(&(resident - moment_bytes).to_string())
            && msg.contains("offloaded to host memory"),
        "{msg}"
    );
    // Offload off (a gate or a probe): under the resident bytes is refused as before.
    let e = ask(resident - 1, false).unwrap_err();
    assert!(
        matches!(e, fit::FitError::Resident { offloadable: 0, .. }),
        "{e}"
    );
    assert!(!e.to_string().contains("offloaded"), "{e}");
}

/// The GPT compiled for CUDA with `step`, as it is and with every moment offloaded.
fn cuda_plain_and_offloaded(step: &StepOptions) -> (Compiled, Compiled) {
    let m = ingot_models::by_name(GPT).unwrap();
    let cuda = Options::for_target(Target::Cuda);
    let plain = pipeline::compile_observed_with(&m, step, &cuda, &mut |_| {}).unwrap();
    let mut opts = Options::for_target(Target::Cuda);
    opts.plan.offload = moments(&plain.graph);
    let off = pipeline::compile_observed_with(&m, step, &opts, &mut |_| {}).unwrap();
    assert!(!off.plan.offload.is_empty());
    (plain, off)
}

/// Whether operation `to` of `p` waits for `from`, directly or through others.
fn waits_for(p: &ingot_compiler::lower::cuda::Program, to: usize, from: usize) -> bool {
    let mut stack = vec![to];
    let mut seen = vec![false; p.ops.len()];
    while let Some(j) = stack.pop() {
        if j == from {
            return true;
        }
        for &i in &p.deps[j] {
            if i >= from && !std::mem::replace(&mut seen[i], true) {
                stack.push(i);
            }
        }
    }
    false
}

#[test]
fn an_offloaded_cuda_program_copies_each_moment_in_before_its_readers_and_out_after_its_update() {
    use ingot_compiler::lower::cuda::DeviceOp;
    let (plain, off) = cuda_plain_and_offloaded(&StepOptions::default());
    let exe = off.executable(Target::Cuda).unwrap();
    let ingot_compiler::lower::Program::Cuda(p) = exe.program() else {
        panic!("not a CUDA program");
    };
    assert_eq!(p.host_bytes, off.plan.host_bytes);
    assert_eq!(p.counts().offload_copies, 2 * off.plan.offload.len());
    assert!(p.summary().contains("offload:"), "{}", p.summary());
    for o in &off.plan.offload {
        let staging = off.plan.location(&off.graph, o.leaf);
        let find = |copy_in: bool| {
            p.ops.iter().position(|op| match *op {
                DeviceOp::CopyIn(CopyIn {
                    leaf,
                    host,
                    to,
                    bytes,
                }) if copy_in => {
                    (leaf, host, to, bytes)
                        == (o.leaf, o.host.offset, staging.offset, staging.bytes)
                }
                DeviceOp::CopyOut(CopyOut {
                    leaf,
                    from,
                    host,
                    bytes,
                }) if !copy_in => {
                    (leaf, host, from, bytes)
                        == (o.leaf, o.host.offset, staging.offset, staging.bytes)
                }
                _ => false,
            })
        };
        let (i_in, i_out) = (find(true).unwrap(), find(false).unwrap());
        assert!(i_in < i_out, "{}: copied out before in", o.leaf);
        // Every operation between them on the staging bytes (the update reading and writing
        // the moment) waits for the copy in, and the copy out waits for each of them.
        let on_staging: Vec<usize> = (i_in + 1..i_out)
            .filter(|&j| {
                let t = &p.touches[j];
                t.reads.iter().chain(&t.writes).any(|l| {
                    l.bytes > 0
                        && l.offset < staging.offset + staging.bytes
                        && staging.offset < l.offset + l.bytes
                })
            })
            .collect();
        assert!(
            on_staging.iter().any(|&j| p.touches[j]
                .writes
                .iter()
                .any(|l| l.offset == staging.offset)),
            "{}: nothing writes its new value between the copies",
            o.leaf
        );
        for &j in &on_staging {
            assert!(
                waits_for(p, j, i_in),
                "op {j} does not wait for {}'s copy in",
                o.leaf
            );
            assert!(
                waits_for(p, i_out, j),
                "{}'s copy out does not wait for op {j}",
                o.leaf
            );
        }
    }
    // The file reads back as what was written, and the device's allocation is smaller.
    let back =
        ingot_compiler::exe::Executable::from_bytes(&exe.to_bytes().unwrap(), "x.ingot").unwrap();
    assert_eq!(back, exe);
    assert!(off.plan.total_bytes < plain.plan.total_bytes);
    // A program whose copy reads another host range than the plan's is refused.
    let mut bad = p.clone();
    let i = bad
        .ops
        .iter()
        .position(|op| matches!(op, DeviceOp::CopyIn { .. }))
        .unwrap();
    if let DeviceOp::CopyIn(CopyIn { host, .. }) = &mut bad.ops[i] {
        *host += 256;
    }
    let e = ingot_compiler::lower::Program::Cuda(bad)
        .check(&off.graph, &off.plan)
        .unwrap_err();
    assert!(e.to_string().contains("offload"), "{e}");
}

#[test]
fn a_cuda_step_of_several_ranks_with_offload_is_refused_at_lowering_naming_the_ranks() {
    let step = StepOptions {
        ranks: 2,
        ..StepOptions::default()
    };
    let (plain, off) = cuda_plain_and_offloaded(&step);
    plain.executable(Target::Cuda).unwrap();
    let e = off.executable(Target::Cuda).unwrap_err();
    let msg = e.to_string();
    assert_mentions(&msg, &["data-parallel ranks", "one GPU"]);
}

/// For each copy in of `c`'s CUDA program, the operations it may overlap: from just after its
/// latest dependency (where its staging bytes are free) to the first operation waiting on it
/// (its first reader), as `scripts/offload_overlap.py` counts them; in the order of the leaves.
fn copy_in_windows(c: &Compiled) -> Vec<usize> {
    use ingot_compiler::lower::cuda::DeviceOp;
    let exe = c.executable(Target::Cuda).unwrap();
    let ingot_compiler::lower::Program::Cuda(p) = exe.program() else {
        panic!("not a CUDA program");
    };
    let mut first_waiter = vec![usize::MAX; p.ops.len()];
    for (j, d) in p.deps.iter().enumerate() {
        for &i in d {
            first_waiter[i] = first_waiter[i].min(j);
        }
    }
    let mut w: Vec<(ingot_compiler::ir::NodeId, usize)> = (0..p.ops.len())
        .filter_map(|i| match p.ops[i] {
            DeviceOp::CopyIn(CopyIn { leaf, .. }) => Some((leaf, i)),
            _ => None,
        })
        .map(|(leaf, i)| {
            let free = p.deps[i].iter().max().map_or(0, |&d| d + 1);
            assert!(first_waiter[i] < p.ops.len(), "nothing reads copy in {i}");
            (leaf, first_waiter[i] - free)
        })
        .collect();
    // By leaf, so that two programs' copies pair up whatever their order.
    w.sort();
    w.into_iter().map(|(_, n)| n).collect()
}

#[test]
fn a_fitted_offload_step_copies_in_far_ahead_of_the_readers_on_free_bytes_at_the_same_total() {
    let m = ingot_models::by_name(GPT).unwrap();
    let opts = Options::for_target(Target::Cuda);
    let plain = pipeline::compile(&m, &opts).unwrap();
    let moment_bytes: usize = moments(&plain.graph)
        .iter()
        .map(|n| align_up(plain.graph.ty(plain.graph.leaf(n).unwrap()).bytes()))
        .sum();
    // A budget only offload meets: half the moments' bytes under the plan as it is.
    let budget = plain.plan.total_bytes - align_up(moment_bytes / 2);
    let fo = FitOptions {
        offload: true,
        ..fit_none(budget)
    };
    let (_, on, f) = fit::fit(&m, &StepOptions::default(), &opts, &fo, None).unwrap();
    assert!(f.expect("fitted").offload.is_some(), "fitted by offload");
    assert!(on.report.total_bytes <= budget);
    on.plan.validate(&on.graph).unwrap();
    // The same offloaded set with each staging buffer live only from its first use to its last.
    let names: Vec<String> = (on.plan.offload.iter())
        .map(|o| on.graph.leaf_name(o.leaf).unwrap().to_string())
        .collect();
    let mut o = Options::for_target(Target::Cuda);
    o.plan.offload = names;
    o.plan.prefetch = false;
    let off = pipeline::compile(&m, &o).unwrap();
    assert_eq!(on.plan.liveness.order, off.plan.liveness.order);
    // The plan as solved: the same total, LOAD and offsets but the staging buffers'.
    assert_eq!(
        (on.plan.total_bytes, on.plan.load_bytes),
        (off.plan.total_bytes, off.plan.load_bytes)
    );
    let lv = &on.plan.liveness;
    let staging: Vec<usize> = (on.plan.offload.iter())
        .map(|o| lv.storage_of[o.leaf.index()])
        .collect();
    for (t, st) in lv.storages.iter().enumerate() {
        if !staging.contains(&t) {
            assert_eq!(st, &off.plan.liveness.storages[t]);
            assert_eq!(on.plan.storage_offset[t], off.plan.storage_offset[t]);
        }
    }
    for (a, b) in on.plan.offload.iter().zip(&off.plan.offload) {
        let s = lv.storage_of[a.leaf.index()];
        let (st, was) = (&lv.storages[s], &off.plan.liveness.storages[s]);
        // Each copy in no later than at its first use, each buffer ending no earlier than at
        // its last; the copy out stays after its writer.
        assert!(a.copy_in_before <= b.copy_in_before && st.end >= was.end);
        assert_eq!(
            (st.start, a.copy_out_after),
            (a.copy_in_before, b.copy_out_after)
        );
        // Its staging bytes hold no other value while they are its (checked from the plan's
        // lifetimes and offsets, apart from the validator's replay).
        let at = on.plan.storage_offset[s];
        for (t, other) in lv.storages.iter().enumerate() {
            let lives_then = other.start < st.end && st.start < other.end.max(other.start + 1);
            let (b, bytes) = (on.plan.storage_offset[t], align_up(other.bytes));
            let shares = bytes > 0 && b < at + align_up(st.bytes) && at < b + bytes;
            let slab = other.region == ingot_compiler::plan::Region::Slab;
            assert!(
                t == s || !slab || !(lives_then && shares),
                "{}'s staging bytes hold storage {t} while they are its",
                a.leaf
            );
        }
    }
    // On the GPU's dependency graph: no copy in may overlap fewer operations than when staged
    // at its reader, and together at least three times as many (measured: 9 to 23 each, 143
    // in all, against 2 to 4, 26 in all; the 1.3B GPT's figures are in benchmarks.md).
    let (w_on, w_off) = (copy_in_windows(&on), copy_in_windows(&off));
    println!("copies in may overlap {w_on:?} operations, staged at their readers {w_off:?}");
    assert!(
        w_on.iter().zip(&w_off).all(|(a, b)| a >= b)
            && w_on.iter().sum::<usize>() >= 3 * w_off.iter().sum::<usize>(),
        "copies in may overlap {w_on:?} operations, staged at their readers {w_off:?}"
    );
}
