//! Timings of the CUDA kernels, each checked against the CPU on the way: every distinct kernel
//! of the given models' training steps, timed (CUDA events, median of 20 launches after 3
//! warm-ups) with its bandwidth (`ingot_testkit::kernel_check`, which the test
//! `testkit/tests/cuda_kernels.rs` runs without timing on the GPU machine).
//!
//! ```text
//! cargo run --release -p ingot-testkit --example cuda_kernels [-- [--variants] MODEL... | --random N | --scatter]
//! ```
//! Models default to `mlp gpt-mini gpt2`; `--precision bf16` (or tf32) and
//! `--no-fuse-attention` (attention as the plain math) and `--channels-last` (every
//! convolution's tensors channels-last, as the trainer stores them where cuDNN runs them)
//! compile them so instead. `--variants`
//! also runs every row-strategy kernel with full outputs and rows of at most 8192 elements at
//! each other thread count per row (32 to 1024), every elementwise kernel that goes four elements a thread at one, every column
//! kernel at each other number of rows a block, and guarded kernels unguarded, checked and
//! timed the same way (`cuda::fused_tuned`). `--random N` checks N random fused kernels
//! instead (seeds 0 to N-1 of `fused::random::Options::exact`), untimed. `--scatter` checks
//! and times the scatter-add cases of `kernel_check::SCATTER_CASES` (the first is gpt2's token
//! embedding gradient on two ranks).
//!
//! Exit status 1 if any kernel fails; 0 with "skipping: <reason>" on machines without a GPU,
//! unless `INGOT_REQUIRE_GPU=1` asks for one (then 1).

use ingot_testkit::kernel_check::{check_kernels, CheckOptions, Source};

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let variants = args.first().is_some_and(|a| a == "--variants");
    if variants {
        args.remove(0);
    }
    let plain_attention = args.iter().any(|a| a == "--no-fuse-attention");
    args.retain(|a| a != "--no-fuse-attention");
    let channels_last = args.iter().any(|a| a == "--channels-last");
    args.retain(|a| a != "--channels-last");
    let mut precision = None;
    if let Some(at) = args.iter().position(|a| a == "--precision") {
        let name = args.get(at + 1).cloned().unwrap_or_default();
        match ingot_compiler::precision::Precision::from_name(&name) {
            Some(p) => precision = Some(p),
            None => {
                eprintln!("cuda_kernels: --precision takes f32, tf32 or bf16, not {name:?}");
                std::process::exit(2);
            }
        }
        args.drain(at..(at + 2).min(args.len()));
    }
    let source = match args.first().map(String::as_str) {
        Some("--scatter") => Source::Scatter,
        Some("--random") => match args.get(1).and_then(|s| s.parse::<u64>().ok()) {
            Some(n) => Source::Random(0..n),
            None => {
                eprintln!("cuda_kernels: --random needs a count");
                std::process::exit(2);
            }
        },
        _ => {
            if args.is_empty() {
                args = vec!["mlp".into(), "gpt-mini".into(), "gpt2".into()];
            }
            let opts = ingot_compiler::pipeline::Options {
                precision: Some(precision.unwrap_or(ingot_compiler::precision::Precision::F32)),
                fuse_attention: !plain_attention,
                channels_last: channels_last.into(),
                ..Default::default()
            };
            Source::Models(args, Box::new(opts))
        }
    };
    if let Err(e) = ingot_runtime::cuda::available() {
        if ingot_runtime::cuda::require::gpu_required() {
            eprintln!("cuda_kernels: INGOT_REQUIRE_GPU is set but there is no usable GPU: {e}");
            std::process::exit(1);
        }
        println!("skipping: {e}");
        return;
    }
    let opts = CheckOptions {
        time: matches!(source, Source::Models(..) | Source::Scatter),
        variants,
    };
    match check_kernels(&source, opts, &mut |line| println!("{line}")) {
        Ok(s) if s.failures.is_empty() => {}
        Ok(_) => std::process::exit(1),
        Err(e) => {
            eprintln!("cuda_kernels: {e}");
            std::process::exit(1);
        }
    }
}
