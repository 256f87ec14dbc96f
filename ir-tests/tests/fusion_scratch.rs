//! Fusion does not cost more memory than it saves (issue 53): a kernel's scratch on the CPU
//! executor grows with its body, so a kernel that expands a long chain of tiny values, or a
//! fold that joins two such kernels, can cost more scratch than the values it keeps out of
//! memory. Before such kernels were cut (`scratch_cuts` in `compiler/src/fuse/mod.rs`) and
//! such folds refused (`fold_needs_more_scratch_than_it_saves` in
//! `compiler/src/fuse/merge/rules.rs`), 2,000 layers of f32[8, 8]
//! (`scripts/reduce_chain_ir.py 2000`) planned 4.07 MiB fused against 1.47 MiB unfused, 3.1
//! MiB of it one backward kernel's scratch; 600 layers 1.28 MiB against 451 KiB.
//!
//! 150 layers are held to it too (session 31): they planned 150 KiB fused against 113.5 KiB
//! unfused, because the CPU executor gave a kernel over 64 elements 1,024 lanes (its lane
//! buffers 8 KiB each) and a kernel's scratch up to `fuse::SCRATCH_FREE` (then 64 KiB, for
//! those lane buffers) was not weighed against what it saves. Lanes now stop at the kernel's
//! domain, the scratch let be is 64 times the step's largest value up to 64 KiB
//! (`fuse::scratch_bound`: 16 KiB here), and a fold past it is refused when the merged
//! kernel's whole scratch exceeds what the fold saves.

use ingot_compiler::lower::Target;
use ingot_compiler::model::Model;
use ingot_compiler::pipeline::{self, Options};

/// The planned bytes of `m` for the CPU, fused (the default) or as traced.
fn planned(m: &Model, fused: bool) -> usize {
    let target = Options::for_target(Target::Cpu);
    let opts = if fused {
        target
    } else {
        Options::unoptimized(target.plan)
    };
    pipeline::compile(m, &opts)
        .expect("the chain compiles")
        .plan
        .total_bytes
}

#[test]
fn a_deep_chain_of_small_row_reductions_plans_no_more_fused_than_unfused() {
    for layers in [150, 600, 2000] {
        let text = ingot_ir_tests::chains::reduce_chain(layers, 8, 8);
        let m = Model::from_ir_text("chain", &text).expect("the chain parses");
        let (fused, unfused) = (planned(&m, true), planned(&m, false));
        eprintln!("{layers} layers: fused {fused} bytes, unfused {unfused}");
        assert!(
            fused <= unfused,
            "{layers} layers of f32[8, 8]: the fused step plans {fused} bytes, more than the \
             unfused step's {unfused}"
        );
    }
}
