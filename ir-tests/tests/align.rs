//! Matrix products padded to the tensor cores' alignment (`compiler/src/align.rs`): on CUDA every
//! GEMM of a GPT with an odd vocabulary reads and writes 16-byte-aligned rows, and the padding
//! changes no number (checked on the CPU, where it can run here).

use ingot_compiler::ir::{Graph, Op};
use ingot_compiler::lower::Target;
use ingot_compiler::pipeline::{self, Compiled, Options};
use ingot_compiler::precision::Precision;
use ingot_ir_tests::cuda_options;
use ingot_ir_tests::losses::cpu_loss_bits;

/// A GPT whose vocabulary (301) is odd and long enough to be padded (to 320).
const ODD: &str = "gpt:vocab=301,d_model=32,layers=2,heads=2,d_ff=128,seq=16,batch=4";

fn compile(opts: &Options) -> Compiled {
    pipeline::compile(&ingot_models::by_name(ODD).unwrap(), opts).unwrap()
}

/// The products (plain or accumulating) whose operands or result have a row of at least 256
/// elements that does not start every 16 bytes: `(node, the offending row length)`.
fn misaligned_products(g: &Graph) -> Vec<(String, usize)> {
    let mut bad = Vec::new();
    for id in g.ids() {
        let n = g.node(id);
        if !matches!(n.op, Op::MatMul { .. } | Op::MatMulAcc { .. }) {
            continue;
        }
        for v in n.inputs.iter().copied().chain([id]) {
            let ty = g.ty(v);
            let row = *ty.shape.dims().last().unwrap_or(&1);
            if row >= 256 && !(row * ty.dtype.size()).is_multiple_of(16) {
                bad.push((format!("{id:?} {}", g.origin(id).label()), row));
            }
        }
    }
    bad
}

/// The loss bits of `steps` CPU steps of `c` (leaves from seed 7).
fn losses(c: &Compiled, steps: usize) -> Vec<u64> {
    cpu_loss_bits(c, 7, steps)
}

#[test]
fn on_cuda_every_gemm_of_an_odd_vocabulary_gpt_reads_and_writes_aligned_rows() {
    for precision in [Precision::F32, Precision::Bf16] {
        let cuda = cuda_options(precision);
        assert_eq!(cuda.align_matmuls, Some(64));
        let padded = compile(&cuda);
        assert_eq!(misaligned_products(&padded.graph), vec![], "{precision:?}");
        padded.executable(Target::Cuda).unwrap();
        // Without the pass the head's three GEMMs have rows of 301 elements.
        let plain = compile(&Options {
            align_matmuls: None,
            ..cuda.clone()
        });
        let bad = misaligned_products(&plain.graph);
        assert!(bad.iter().any(|(_, row)| *row == 301), "{bad:?}");
    }
}

/// The padded logits' gradient is computed over the padded width and written over the padded
/// logits (`align::widen_padded_concats`), not copied beside them: the odd vocabulary plans no
/// more bytes than the vocabulary rounded up to the padding (whose head is bigger).
#[test]
fn on_cuda_an_odd_vocabulary_plans_no_more_than_the_vocabulary_rounded_up() {
    for precision in [Precision::F32, Precision::Bf16] {
        let cuda = cuda_options(precision);
        let odd = compile(&cuda).plan.total_bytes;
        let rounded = pipeline::compile(
            &ingot_models::by_name(&ODD.replace("301", "320")).unwrap(),
            &cuda,
        )
        .unwrap()
        .plan
        .total_bytes;
        assert!(
            odd <= rounded,
            "{precision:?}: {odd} bytes at 301 against {rounded} at 320"
        );
    }
}

#[test]
fn padding_the_head_changes_no_loss_over_ten_cpu_steps() {
    let cpu = Options::for_target(Target::Cpu);
    assert_eq!(cpu.align_matmuls, None, "the CPU's GEMM needs no alignment");
    let plain = compile(&cpu);
    let padded = compile(&Options {
        align_matmuls: Some(64),
        ..cpu
    });
    assert!(misaligned_products(&plain.graph)
        .iter()
        .any(|(_, row)| *row == 301));
    assert_eq!(misaligned_products(&padded.graph), vec![]);
    assert_eq!(losses(&padded, 10), losses(&plain, 10));
}
