//! A channels-last batch norm's weight and bias gradient sums (`Σdy`, `Σdy·x̂`) are computed by
//! the kernel of its data gradient (issue 48). That kernel is itself a column reduction that
//! writes full-size outputs (`dx`, the masked gradient), so the fold that brings the sums into
//! it adds no full-size output to a column reduction; before, the sums were a kernel of their
//! own that read `dy`, stored in f32 for it alone, and `x` again: 10 bytes an element of every
//! such batch norm. Checked on the compiled step's structure, and the merged kernels' generated
//! CUDA C, run on the host by the block emulation, against the CPU interpreter. Where the GPU
//! splits such a kernel by stages it runs one stage (session 44): its sum of `dx`'s terms is
//! taken apart into sums of the first stage.

use ingot_compiler::ir::{Graph, Op};
use ingot_compiler::layout::ChannelsLast;
use ingot_compiler::lower::Target;
use ingot_compiler::pipeline::Options;
use ingot_kernels::cuda;
use ingot_kernels::fused::cpu::run_buffers;
use ingot_kernels::fused::FusedKernel;
use ingot_kernels::DType;
use ingot_testkit::block_emu;

/// A CUDA step in bf16 with its convolutions channels-last, as cuDNN runs them.
fn cuda_bf16_channels_last() -> Options {
    let mut opts = Options::for_target(Target::Cuda);
    opts.channels_last = ChannelsLast::Yes;
    opts.precision = Some(ingot_compiler::precision::Precision::Bf16);
    opts
}

fn fused_kernels(g: &Graph) -> Vec<&FusedKernel> {
    g.ids()
        .filter_map(|id| match &g.node(id).op {
            Op::Fused(k) => Some(&**k),
            _ => None,
        })
        .collect()
}

/// Reduces leading axes, not the last (one row a channel of a channels-last tensor).
fn is_column(k: &FusedKernel) -> bool {
    let last = k.domain.len() - 1;
    !k.reduce_axes.is_empty() && !k.reduce_axes.contains(&last) && k.domain[last] > 1
}

/// (full-size outputs, row-level outputs) of `k`.
fn outputs_by_level(k: &FusedKernel) -> (usize, usize) {
    let rows = k.output_rows();
    let row = rows.iter().filter(|&&r| r).count();
    (rows.len() - row, row)
}

/// Whether `k` reads a full-size f32 value.
fn reads_full_f32(k: &FusedKernel) -> bool {
    let full: usize = k.domain.iter().product();
    k.inputs
        .iter()
        .any(|i| i.dtype == DType::F32 && i.len == full)
}

#[test]
fn a_bf16_channels_last_resnet50_sums_each_batch_norms_weight_gradients_in_its_dx_kernel() {
    let g = ingot_models::compile_model(
        "resnet:depth=50,side=64,batch=2,classes=10",
        &cuda_bf16_channels_last(),
    )
    .unwrap()
    .graph;
    let kernels = fused_kernels(&g);
    let columns: Vec<&FusedKernel> = kernels.iter().copied().filter(|k| is_column(k)).collect();
    // No column reduction reads a full-size f32 value: the f32 `dy` the separate sums read
    // is neither stored nor loaded.
    let f32_readers = columns.iter().filter(|k| reads_full_f32(k)).count();
    assert_eq!(f32_readers, 0, "column kernels reading a full f32 value");
    // Every backward column kernel that writes `dx` also writes the sums of the batch norms it
    // differentiates (a downsampling block's two batch norms share `Σdy`: three sums).
    let with_dx: Vec<&FusedKernel> = columns
        .iter()
        .copied()
        .filter(|k| outputs_by_level(k).0 > 0)
        .collect();
    assert!(!with_dx.is_empty(), "no column kernel writes a full output");
    for k in &with_dx {
        let (_, rows) = outputs_by_level(k);
        assert!(
            rows >= 2,
            "a dx kernel over {:?} with {rows} row outputs",
            k.domain
        );
    }
}

/// Seeded inputs for `k`: full values in [-1, 1), per-channel values in [0.5, 1.5) (a
/// variance or rstd must be positive), bools where the value is positive.
fn inputs_of(k: &FusedKernel) -> Vec<Vec<u8>> {
    let full: usize = k.domain.iter().product();
    (k.inputs.iter().enumerate())
        .map(|(n, inp)| {
            let mut v = block_emu::values(inp.len, n as u64 + 7);
            if inp.len < full {
                v.iter_mut().for_each(|x| *x = 0.5 + x.abs());
            }
            match inp.dtype {
                DType::Bool => v.iter().map(|&x| u8::from(x > 0.0)).collect(),
                d => block_emu::encode(d, &v),
            }
        })
        .collect()
}

#[test]
fn the_merged_batch_norm_backward_kernels_run_in_the_emulation_as_the_cpu_runs_them() {
    // At side 128 and batch 4 the first stage's activations have 4,096 terms a channel: their
    // backward kernels split by stages, as resnet50's do at 224.
    let g = ingot_models::compile_model(
        "resnet:depth=50,side=128,batch=4,classes=10",
        &cuda_bf16_channels_last(),
    )
    .unwrap()
    .graph;
    let mut seen: Vec<(Vec<usize>, usize)> = Vec::new();
    let mut staged = 0;
    for k in fused_kernels(&g) {
        let (full, rows) = outputs_by_level(k);
        let key = (k.domain.clone(), k.inputs.len());
        if !is_column(k) || full == 0 || rows == 0 || seen.contains(&key) {
            continue;
        }
        let split = cuda::staged_split(k).is_some();
        // The staged ones, and one of the others; one a shape and input count.
        if !split && seen.len() > staged {
            continue;
        }
        seen.push(key);
        staged += usize::from(split);
        let ins = inputs_of(k);
        let refs: Vec<&[u8]> = ins.iter().map(|x| &x[..]).collect();
        let want = run_buffers(k, &refs).unwrap();
        let p = cuda::fused_program(k).unwrap();
        // Split by stages, one stage: its second-stage sum (of `dxc`, through the variance's
        // gradient) taken apart into first-stage sums (`ingot_kernels::fused::distribute`),
        // so a partial kernel, its finish and `dx`; two stages took five launches.
        if split {
            assert_eq!(p.launches.len(), 3, "a staged kernel over {:?}", k.domain);
        }
        let tag = format!("bn_sums_{}", seen.len());
        match block_emu::run_program(&format!("ingot_{tag}"), k, &p, &ins) {
            Some(got) => block_emu::assert_outputs_match(&tag, k, &got, &want),
            None => {
                eprintln!("no C++ compiler with ucontext.h: the emulation is skipped");
                return;
            }
        }
    }
    assert!(staged >= 2, "{staged} merged kernels split by stages");
}
