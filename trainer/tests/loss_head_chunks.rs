//! The loss head in row chunks (`StepOptions::loss_head_chunk_bytes`,
//! `ingot_compiler::autodiff::chunk`): a GPT whose logits and cross-entropy run a block of rows
//! at a time, each block's backward pass right after its forward pass, trains as the whole head
//! does (the same losses and parameters within float rounding, in f32 and in bf16), and gpt2's
//! plan keeps no `[tokens, vocab]` buffer and is smaller.

use ingot_compiler::autodiff::{chunk, StepOptions};
use ingot_compiler::exe::Executable;
use ingot_compiler::ir::LeafKind;
use ingot_compiler::lower::Target;
use ingot_compiler::pipeline::{self, Compiled, Options};
use ingot_compiler::precision::Precision;

#[path = "support/steps.rs"]
mod steps;

/// 64 rows of 128 classes: f32 logits of 32 KiB, so 8 KiB chunks make 4 of 16 rows.
const SPEC: &str = "gpt:vocab=128,d_model=32,layers=2,heads=2,d_ff=64,seq=16,batch=4";
const CHUNK: usize = 8 << 10;

/// `spec`'s step in `precision` for `target`, its loss head in chunks of at most
/// `chunk_bytes` (0: whole).
fn compiled(spec: &str, chunk_bytes: usize, precision: Precision, target: Target) -> Compiled {
    let step = StepOptions {
        loss_head_chunk_bytes: chunk_bytes,
        ..Default::default()
    };
    let opts = Options {
        precision: Some(precision),
        ..Options::for_target(target)
    };
    let m = ingot_models::by_name(spec).unwrap();
    pipeline::compile_observed_with(&m, &step, &opts, &mut |_| {}).unwrap()
}

fn compile(spec: &str, chunk_bytes: usize, precision: Precision) -> (Executable, usize) {
    let c = compiled(spec, chunk_bytes, precision, Target::Cpu);
    let slices = c
        .step
        .graph
        .ids()
        .filter(|&id| {
            matches!(
                c.step.graph.node(id).op,
                ingot_compiler::ir::Op::Slice { .. }
            )
        })
        .count();
    (c.executable(Target::Cpu).unwrap(), slices)
}

/// Ten steps from the same parameters and batches, whole head and chunked: the largest
/// relative difference of a loss and of a parameter.
fn chunked_against_whole(spec: &str, chunk: usize, precision: Precision) -> (f64, f64) {
    let (whole, none) = compile(spec, 0, precision);
    let (chunked, slices) = compile(spec, chunk, precision);
    assert!(
        slices >= none + 4,
        "the chunked head slices its rows ({slices} slices, {none} without chunks)"
    );
    // The head weight's gradient is summed over the chunks by their GEMMs (`matmul_acc`).
    let what = format!("{spec}, head in chunks of {chunk} bytes");
    steps::split_against_whole(&what, chunked, whole, &[LeafKind::Parameter], 10)
}

#[test]
fn a_gpt_with_its_loss_head_in_row_chunks_trains_as_with_the_whole_head_in_f32() {
    let (loss, param) = chunked_against_whole(SPEC, CHUNK, Precision::F32);
    // AdamW turns a gradient that is zero in exact arithmetic (the key bias) into a step of
    // either sign, as in accumulate.rs: the parameters are held to the losses' trajectory.
    assert!(loss <= 1e-5, "loss {loss:.2e} (parameters {param:.2e})");
}

#[test]
fn a_gpt_with_its_loss_head_in_row_chunks_trains_as_with_the_whole_head_in_bf16() {
    let (loss, _) = chunked_against_whole(SPEC, CHUNK, Precision::Bf16);
    assert!(loss <= 1e-2, "loss {loss:.2e}");
}

/// Every layer of the mlp is row-wise, so its whole forward pass is the "head": in blocks of
/// rows, each block's forward and backward pass at once, every weight and bias gradient summed
/// over the blocks. With SGD (no AdamW sign flips of rounding-noise gradients) the parameters
/// are held as tightly as the losses.
#[test]
fn an_mlp_in_row_chunks_trains_as_the_whole_batch_with_its_biases_summed_over_the_chunks() {
    let (loss, param) = chunked_against_whole("mlp", 128 << 10, Precision::F32);
    assert!(
        loss <= 1e-6 && param <= 1e-6,
        "loss {loss:.2e}, parameters {param:.2e}"
    );
}

#[test]
fn a_head_under_the_chunk_size_or_with_chunking_off_is_differentiated_whole() {
    let m = ingot_models::by_name(SPEC).unwrap();
    let loss = *m.graph.outputs.get("loss").unwrap();
    assert!(
        chunk::find(&m.graph, loss, 0).is_none(),
        "0 turns chunking off"
    );
    assert!(
        chunk::find(&m.graph, loss, 1 << 20).is_none(),
        "32 KiB of logits fit 1 MiB"
    );
    let head = chunk::find(&m.graph, loss, CHUNK).expect("a row-wise head");
    assert_eq!((head.rows, head.chunks), (64, 4));
    // The head starts at the logits' product and ends at the rows' losses.
    let start = head.region[0];
    assert!(matches!(
        m.graph.node(start).op,
        ingot_compiler::ir::Op::MatMul { .. }
    ));
    assert_eq!(m.graph.ty(start).shape.dims(), [64, 128]);
}

#[test]
fn gpt2_with_its_loss_head_in_chunks_plans_no_logits_buffer_and_less_memory() {
    for p in [Precision::F32, Precision::Bf16] {
        let plan = |bytes: usize| compiled("gpt2", bytes, p, Target::Cuda);
        let (whole, chunked) = (plan(0), plan(chunk::HEAD_CHUNK_BYTES));
        let g = &chunked.graph;
        let full = g
            .ids()
            .filter(|&id| g.ty(id).shape.dims() == [8192, 50304])
            .count();
        assert_eq!(full, 0, "{p}: values of [8192, 50304] in the chunked step");
        let saved = whole.report.total_bytes - chunked.report.total_bytes;
        assert!(
            saved > 400 << 20,
            "{p}: chunking saved only {saved} bytes ({} -> {})",
            whole.report.total_bytes,
            chunked.report.total_bytes
        );
    }
}
