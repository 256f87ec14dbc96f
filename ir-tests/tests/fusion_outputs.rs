//! Fused kernels write only what is read (issue 48): after merging, a value that only its own
//! kernel read (a residual block's pre-activation sum, read by the ReLU's mask and value in the
//! same kernel) is computed there and not stored, so no kernel writes a full-size output that
//! no later operation reads and that is not a step output or update.

use ingot_compiler::ir::{Graph, NodeId, Op};
use ingot_compiler::layout::ChannelsLast;
use ingot_compiler::lower::Target;
use ingot_compiler::pipeline::Options;
use ingot_compiler::precision::Precision;

/// The full-size outputs (kernel node, output index) of `g`'s fused kernels that nothing
/// reads: no operation but the kernel's own result nodes, no step output or update. (A
/// reduction's row-level output, a few bytes a row, may be written unread: a cross-entropy's
/// row maximum and sum are.)
fn unread_outputs(g: &Graph) -> Vec<(NodeId, usize)> {
    let users = g.users();
    let named: Vec<NodeId> = g
        .outputs
        .values()
        .copied()
        .chain(g.updates.iter().map(|u| u.value))
        .collect();
    let read = |v: NodeId| {
        named.contains(&v)
            || users[v.index()]
                .iter()
                .any(|&u| !matches!(g.node(u).op, Op::Result { .. }))
    };
    let mut unread = Vec::new();
    for id in g.ids() {
        let Op::Fused(k) = &g.node(id).op else {
            continue;
        };
        let full: usize = k.domain.iter().product();
        for j in 0..k.outputs.len() {
            if k.output_dims(j).iter().product::<usize>() != full {
                continue;
            }
            let v = if j == 0 { Some(id) } else { g.result_of(id, j) };
            if !v.is_some_and(read) {
                unread.push((id, j));
            }
        }
    }
    unread
}

fn compiled(spec: &str, opts: &Options) -> Graph {
    ingot_models::compile_model(spec, opts).unwrap().graph
}

/// A CUDA step in bf16 with its convolutions channels-last, as cuDNN runs them.
fn cuda_bf16_channels_last() -> Options {
    let mut opts = Options::for_target(Target::Cuda);
    opts.channels_last = ChannelsLast::Yes;
    opts.precision = Some(Precision::Bf16);
    opts
}

#[test]
fn a_bf16_channels_last_resnet50_step_writes_no_full_size_output_that_nothing_reads() {
    let opts = cuda_bf16_channels_last();
    let g = compiled("resnet:depth=50,side=32,batch=2,classes=10", &opts);
    let unread = unread_outputs(&g);
    assert!(unread.is_empty(), "outputs nothing reads: {unread:?}");
}

#[test]
fn cpu_steps_of_a_cnn_a_resnet_and_a_gpt_write_no_full_size_output_that_nothing_reads() {
    for spec in [
        "cnn",
        "resnet:depth=18,side=32,batch=2,classes=10",
        "gpt:vocab=96,d_model=32,layers=2,heads=4,d_ff=64,seq=16,batch=3",
    ] {
        let g = compiled(spec, &Options::for_target(Target::Cpu));
        let unread = unread_outputs(&g);
        assert!(
            unread.is_empty(),
            "{spec}: outputs nothing reads: {unread:?}"
        );
    }
}

/// The pre-activation sum of each residual block (batch norm's output plus the shortcut) is
/// not stored: the kernel that applies the ReLU computes it, and the backward pass reads the
/// ReLU's mask. Its fused kernels write fewer bytes than before (issue 48's accounting).
#[test]
fn the_relu_kernels_of_resnet50s_residual_blocks_do_not_store_the_sum_before_the_relu() {
    let opts = cuda_bf16_channels_last();
    let g = compiled("resnet:depth=50,side=64,batch=2,classes=10", &opts);
    let mut blocks = 0;
    for id in g.ids() {
        let Op::Fused(k) = &g.node(id).op else {
            continue;
        };
        // The kernel whose first source is a block's last ReLU, after the sum with the
        // shortcut (it applies the block's bn3; forward, not recomputed).
        let origin = g.origin(id).to_string();
        let first = origin.split(", ").next().unwrap_or_default();
        let Some(block) = first.strip_suffix(".relu") else {
            continue;
        };
        let residual = origin.split(", ").any(|o| o == format!("{block}.bn3"));
        if !(block.starts_with("layer") && residual && k.reduce_axes.is_empty()) {
            continue;
        }
        blocks += 1;
        // Full-size float outputs: the ReLU's value (the next block's shortcut, bf16 as batch
        // norm's output is under the bf16 policy) alone; its mask is bool.
        let float_full = (0..k.outputs.len())
            .filter(|&j| {
                matches!(
                    k.output_dtype(j),
                    ingot_kernels::DType::F32 | ingot_kernels::DType::BF16
                ) && k.output_dims(j).iter().product::<usize>()
                    == k.domain.iter().product::<usize>()
            })
            .count();
        assert!(float_full <= 1, "{origin}: {float_full} float outputs\n{k}");
    }
    assert_eq!(blocks, 16, "one ReLU kernel per bottleneck block");
}
