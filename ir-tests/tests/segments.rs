//! Recomputing whole segments of the forward pass for the backward pass
//! ([`ingot_compiler::fuse::segment`], offered to the budget fitter by
//! [`ingot_compiler::fit`]): segments are found from the graph's structure in every model
//! family (a GPT, an MLP, CNNs, a model written in IR text), recomputing them changes no loss
//! to the bit, their plans are valid, and the fitter reaches any budget that keeping only each
//! block's input (PyTorch's checkpoint around every block) reaches, at no more arithmetic.

use ingot_compiler::autodiff::StepOptions;
use ingot_compiler::fit::{self, Choice, FitOptions, Recomputation, SEGMENTINGS};
use ingot_compiler::fuse::segment::{self, Segment};
use ingot_compiler::ir::NodeId;
use ingot_compiler::lower::Target;
use ingot_compiler::models::{self, Model};
use ingot_compiler::pipeline::{self, Compiled, Options, Rewritten};
use ingot_compiler::precision::Precision;
use ingot_trainer::session::{Device, Session};

const GPT: &str = "gpt:vocab=64,d_model=32,layers=2,heads=2,d_ff=128,seq=16,batch=4";
const RESNET: &str = "resnet:depth=18,side=32,batch=2,classes=5,width=8";

/// Three residual blocks `h + tanh(relu(h · Wᵀ))` between an input and an output projection,
/// with a mean squared error: a model no built-in names, written in IR text.
const RESIDUAL_IR: &str = "ingot-ir 1
%0 = parameter \"inp.weight\" init=normal(0.3) : f32[32,16]
%1 = parameter \"b0.weight\" init=normal(0.2) : f32[32,32]
%2 = parameter \"b1.weight\" init=normal(0.2) : f32[32,32]
%3 = parameter \"b2.weight\" init=normal(0.2) : f32[32,32]
%4 = parameter \"out.weight\" init=normal(0.2) : f32[4,32]
%5 = input \"x\" : f32[8,16]
%6 = input \"y\" : f32[8,4]
%7 = transpose(%0) perm=[1,0] : f32[16,32]
%8 = matmul(%5, %7) : f32[8,32]
%9 = full value=0.0 : f32[8,32]
%10 = transpose(%1) perm=[1,0] : f32[32,32]
%11 = matmul(%8, %10) : f32[8,32]
%12 = max(%11, %9) : f32[8,32]
%13 = tanh(%12) : f32[8,32]
%14 = add(%8, %13) : f32[8,32]
%15 = transpose(%2) perm=[1,0] : f32[32,32]
%16 = matmul(%14, %15) : f32[8,32]
%17 = max(%16, %9) : f32[8,32]
%18 = tanh(%17) : f32[8,32]
%19 = add(%14, %18) : f32[8,32]
%20 = transpose(%3) perm=[1,0] : f32[32,32]
%21 = matmul(%19, %20) : f32[8,32]
%22 = max(%21, %9) : f32[8,32]
%23 = tanh(%22) : f32[8,32]
%24 = add(%19, %23) : f32[8,32]
%25 = transpose(%4) perm=[1,0] : f32[32,4]
%26 = matmul(%24, %25) : f32[8,4]
%27 = sub(%26, %6) : f32[8,4]
%28 = mul(%27, %27) : f32[8,4]
%29 = reduce_sum(%28) axes=[0,1] : f32[1,1]
%30 = reshape(%29) : f32[]
%31 = full value=0.03125 : f32[]
%32 = mul(%30, %31) : f32[]
output \"loss\" = %32
";

fn model(name: &str) -> Model {
    if name == "residual.ir" {
        Model::from_ir_text(name, RESIDUAL_IR).unwrap()
    } else {
        models::by_name(name).unwrap()
    }
}

fn rewritten(m: &Model, opts: &Options) -> Rewritten {
    pipeline::rewritten(m, &StepOptions::default(), opts).unwrap()
}

fn cpu() -> Options {
    Options::for_target(Target::Cpu)
}

/// The segments one way offers, alone (no library call beside them).
fn segments_of(r: &Rewritten, way: (usize, usize)) -> Vec<Choice> {
    fit::ordered_choices(r, Some(way))
        .unwrap()
        .into_iter()
        .filter(|c| matches!(c, Choice::Segment(_)))
        .collect()
}

fn losses(c: &Compiled, steps: usize) -> Vec<u64> {
    let exe = c.executable(Target::Cpu).unwrap();
    let mut s = Session::from_executable(exe, 3, Device::Cpu).unwrap();
    (0..steps)
        .map(|_| s.step().unwrap().loss.to_bits())
        .collect()
}

#[test]
fn recomputing_every_segment_changes_no_loss_over_thirty_cpu_steps_in_every_family() {
    for name in [GPT, "mlp", "cnn", RESNET, "residual.ir"] {
        let m = model(name);
        let r = rewritten(&m, &cpu());
        let base = pipeline::finish(&r, &[]).unwrap();
        let want = losses(&base, 30);
        for way in SEGMENTINGS {
            let segs = segments_of(&r, way);
            assert!(!segs.is_empty(), "{name} {way:?}: no segment found");
            let (c, info) = fit::recompute_choices(&r, &base, &segs, segs.len()).unwrap();
            assert!(!info.segments.is_empty(), "{name} {way:?}: {info:?}");
            assert!(info.added_flops > 0, "{name} {way:?}: {info:?}");
            c.plan.validate(&c.graph).unwrap();
            let g = &c.graph;
            assert!(
                g.ids()
                    .any(|id| g.origin(id).label().contains("(recomputed)")),
                "{name} {way:?}: nothing recomputed in the step graph"
            );
            assert_eq!(losses(&c, 30), want, "{name} {way:?}: losses differ");
        }
    }
}

/// The cuts are found from the structure: a GPT's are its residual stream (two a block),
/// so its pieces are half blocks (the attention's, then the MLP's), named by their first
/// matmul; a ResNet's are its blocks' outputs; the IR model's its three residual adds.
#[test]
fn segments_follow_the_blocks_of_each_model_without_reading_names() {
    let names = |name: &str| -> Vec<String> {
        let r = rewritten(&model(name), &cpu());
        let g = ingot_compiler::fuse::prepared(&r.graph).unwrap();
        segment::pieces(&g, 12)
            .iter()
            .map(|s| {
                g.origin(s.first(&g))
                    .primary()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect()
    };
    // The token embedding's rows are a piece of their own (the position embedding's depend on
    // no batch value, so the embedding sum is the first cut).
    assert_eq!(
        names(GPT),
        [
            "wte",
            "blocks.0.qkv",
            "blocks.0.fc",
            "blocks.1.qkv",
            "blocks.1.fc"
        ]
    );
    let resnet = names(RESNET);
    assert_eq!(resnet.len(), 9, "{resnet:?}");
    assert_eq!(resnet[1], "layer1.0.conv1");
    assert_eq!(resnet[8], "layer4.1.conv1");
    assert_eq!(names("residual.ir").len(), 3);
}

/// Keeping only the cut after each segment: with every segment of a ResNet recomputed, the
/// forward pass's own batch-norm and ReLU outputs inside its blocks are not kept for the
/// backward one; the backward pass reads copies. (The peak does not fall yet: the
/// memory-aware schedule is free to run those copies early, and does; see
/// `the_fitter_reaches_what_keeping_each_blocks_input_reaches_at_no_more_flops`.)
#[test]
fn recomputing_a_resnets_blocks_keeps_none_of_their_forward_batch_norm_outputs() {
    let r = rewritten(&model(RESNET), &cpu());
    let base = pipeline::finish(&r, &[]).unwrap();
    let segs = segments_of(&r, (1, 0));
    let (c, _) = fit::recompute_choices(&r, &base, &segs, segs.len()).unwrap();
    let kept = |c: &Compiled| {
        let g = &c.graph;
        let lv = &c.plan.liveness;
        let loss = lv.position[g.outputs["loss"].index()];
        lv.storages
            .iter()
            .filter(|s| !s.workspace && s.start <= loss && s.end > loss + 1)
            .filter(|s| {
                let l = g.origin(s.owner).label();
                // Full-size values, not the per-channel statistics (kept by design).
                (l.starts_with("layer2.0.bn1") || l.starts_with("layer2.0.relu"))
                    && !l.contains("(recomputed)")
                    && g.ty(s.owner).shape.numel() > 256
            })
            .count()
    };
    assert!(kept(&base) > 0, "the unfitted step keeps layer2.0's values");
    assert_eq!(
        kept(&c),
        0,
        "layer2.0's batch norm and ReLU values are kept"
    );
    let g = &c.graph;
    assert!(g.ids().any(|id| g
        .origin(id)
        .label()
        .starts_with("layer2.0.conv1 (recomputed)")));
}

/// Not met yet (issue 51): with every segment recomputed this GPT reaches about 9.1 MiB at one
/// micro-batch, over the 8.92 MiB asked. A copy is made at the first backward node in node
/// order that reads the value, and some backward nodes that read only forward values (the
/// GELU's derivative) sit right after the loss, so the last block's recomputed values are
/// made before the head's backward pass and are live at its peak.
#[test]
#[ignore = "not met yet: recomputed values are made at the first backward reader in node order"]
fn a_small_gpt_asked_to_cut_its_activation_memory_by_forty_percent_fits_without_micro_batches() {
    let m = models::by_name("gpt:vocab=256,d_model=96,layers=3,heads=4,d_ff=384,seq=64,batch=8")
        .unwrap();
    let r = rewritten(&m, &cpu());
    let base = pipeline::finish(&r, &[]).unwrap();
    let slab = base.report.total_bytes - base.report.resident_bytes;
    let budget = base.report.resident_bytes + slab * 6 / 10;
    let opts = FitOptions {
        budget,
        recompute: true,
        accumulate: false,
        min_micro_batch: 1,
    };
    let (_, c, fitted) = fit::fit(&m, &StepOptions::default(), &cpu(), &opts, None).unwrap();
    let f = fitted.expect("over the budget as asked");
    assert_eq!(f.accumulate, 1);
    assert!(c.report.total_bytes <= budget);
    c.plan.validate(&c.graph).unwrap();
    let rec = f.recompute.as_ref().expect("fitted by recomputation");
    assert!(!rec.segments.is_empty(), "{}", f.line());
    // The report says per segment what was done, in text and JSON.
    let line = f.line();
    assert!(line.contains("blocks."), "{line}");
    assert!(
        line.contains("recomputed (") && line.contains("keeps"),
        "{line}"
    );
    let json = serde_json::to_value(&f).unwrap();
    assert!(
        json["recompute"]["segments"][0]["frees_bytes"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert_eq!(losses(&c, 30), losses(&base, 30));
}

/// The block of a layer's name: `blocks.3` of `blocks.3.qkv`, `layer2.1` of `layer2.1.conv1`;
/// `None` outside blocks (the embedding, a ResNet's stem).
fn block_of(name: &str) -> Option<String> {
    let mut parts = name.split('.');
    let (a, b) = (parts.next()?, parts.next()?);
    b.parse::<usize>().ok().map(|_| format!("{a}.{b}"))
}

/// The nodes to recompute to keep only each block's input (PyTorch's checkpoint around every
/// block): the pieces grouped by the block their first layer names, the cuts between pieces of
/// a block recomputed too. (The test reads names to build PyTorch's reference; the fitter
/// never does.)
fn every_block_but_its_input(r: &Rewritten) -> Vec<NodeId> {
    let opts = r.options.fuse.clone().unwrap_or_default();
    let g = ingot_compiler::fuse::prepared_with(&r.graph, &opts).unwrap();
    let pieces = segment::pieces(&g, opts.recompute_ops);
    let mut ids = Vec::new();
    let mut prev: Option<(&Segment, Option<String>)> = None;
    for p in &pieces {
        let block = block_of(g.origin(p.first(&g)).primary().unwrap_or_default());
        if block.is_none() {
            prev = None;
            continue;
        }
        if let Some((q, b)) = &prev {
            if *b == block && Some(q.output) == p.input {
                ids.push(q.output);
            }
        }
        ids.extend(p.nodes.iter().copied());
        prev = Some((p, block));
    }
    ids.sort();
    ids.dedup();
    ids
}

/// gpt-mini, and gpt2 in bf16 on the CUDA target. (resnet18 is left out: there keeping only
/// its blocks' inputs does not lower the plan yet, since the memory-aware schedule runs the
/// recomputed convolutions long before their backward readers.)
#[test]
fn the_fitter_reaches_what_keeping_each_blocks_input_reaches_at_no_more_flops() {
    let bf16_cuda = Options {
        precision: Some(Precision::Bf16),
        ..Options::for_target(Target::Cuda)
    };
    for (name, opts) in [("gpt-mini", cpu()), ("gpt2", bf16_cuda)] {
        let r = rewritten(&model(name), &opts);
        let base = pipeline::finish(&r, &[]).unwrap();
        let ids = every_block_but_its_input(&r);
        assert!(!ids.is_empty(), "{name}");
        let reference = pipeline::finish(&r, &ids).unwrap();
        let ref_flops = reference.fuse.as_ref().unwrap().recomputed_flops;
        let budget = reference.report.total_bytes;
        assert!(budget < base.report.total_bytes, "{name}");
        let Recomputation::Fits(c, info) = fit::recompute_to_budget(&r, &base, budget).unwrap()
        else {
            panic!("{name}: the fitter does not reach {budget}, which keeping block inputs does");
        };
        assert!(c.report.total_bytes <= budget, "{name}");
        c.plan.validate(&c.graph).unwrap();
        let added = info.added_flops;
        let ref_added = ref_flops - base.fuse.as_ref().unwrap().recomputed_flops;
        assert!(
            added <= ref_added,
            "{name}: {added} FLOPs recomputed, keeping block inputs recomputes {ref_added}"
        );
    }
}

/// The figures of the report, not a check (`cargo test --release -p ingot-ir-tests --test
/// segments figures -- --ignored --nocapture`): for gpt2 and resnet18 on the CUDA target, the
/// smallest plan recomputation reaches at one micro-batch with library calls alone (as before
/// segments) and with segments, what each adds in FLOPs, and what the fitter adds at the
/// library calls' smallest plan.
#[test]
#[ignore]
fn figures() {
    for (name, precision) in [
        ("gpt2", Precision::F32),
        ("gpt2", Precision::Bf16),
        ("resnet18", Precision::F32),
        ("resnet18", Precision::Bf16),
    ] {
        let opts = Options {
            precision: Some(precision),
            ..Options::for_target(Target::Cuda)
        };
        // As the fitter has the step by then: weights cast in each pass, the head in the
        // smallest chunks it tries.
        let step = StepOptions {
            cast_weights_each_step: precision == Precision::Bf16,
            loss_head_chunk_bytes: if name == "gpt2" {
                fit::MIN_HEAD_CHUNK_BYTES
            } else {
                0
            },
            ..Default::default()
        };
        let r = pipeline::rewritten(&model(name), &step, &opts).unwrap();
        let base = pipeline::finish(&r, &[]).unwrap();
        println!(
            "{name} {precision:?}: {} bytes as asked (head chunked, casts)",
            base.report.total_bytes
        );
        let mut floors = Vec::new();
        for way in [None, Some((1, 0)), Some((2, 0)), Some((2, 1))] {
            let all = fit::ordered_choices(&r, way).unwrap();
            let (c, info) = fit::recompute_choices(&r, &base, &all, all.len()).unwrap();
            println!(
                "  everything of {way:?} recomputed: {} bytes ({:.1} MiB), +{:.1}% FLOPs",
                c.report.total_bytes,
                c.report.total_bytes as f64 / (1 << 20) as f64,
                info.added_percent
            );
            floors.push(c.report.total_bytes);
        }
        let before = floors[0];
        if let Recomputation::Fits(c, info) = fit::recompute_to_budget(&r, &base, before).unwrap() {
            println!(
                "  the fitter at {before} (library calls' smallest): {} bytes, +{:.1}% FLOPs, {} segments, {} values",
                c.report.total_bytes,
                info.added_percent,
                info.segments.len(),
                info.values.len()
            );
        }
        let after = *floors.iter().min().unwrap();
        if let Recomputation::Fits(c, info) = fit::recompute_to_budget(&r, &base, after).unwrap() {
            println!(
                "  the fitter at {after} (smallest with segments): {} bytes, +{:.1}% FLOPs, {} segments, {} values",
                c.report.total_bytes,
                info.added_percent,
                info.segments.len(),
                info.values.len()
            );
        }
    }
}
