//! Compiled fused kernels (`fused::cpu::Compiled`) against the interpreter (`fused::cpu::run`),
//! which stays the reference: the same bits on random kernels, on their pieces for 1, 2 and 3
//! threads, on a layer norm's short rows run several to a chunk, and on column sums run
//! several terms to a chunk; and no allocation.

use ingot_kernels::fused::cpu::{self, Compiled};
use ingot_kernels::fused::random::{self, Rng};
use ingot_kernels::fused::{parts, Access, FusedKernel, Input, Inst, KernelError, Output};
use ingot_kernels::{BinaryOp, DType, ReduceOp, UnaryOp};
use ingot_testkit::fused_kernels::layer_norm;
use zerocopy::IntoBytes;
#[path = "support/counting.rs"]
mod counting;
use counting::allocations;

/// A random kernel made f32 throughout where it can be: inputs and constants f32, indices
/// replaced by a constant and converts by a negation. `None` if the result does not check
/// (a bool read where a number is needed, for instance).
fn f32_kernel(seed: u64, opts: &random::Options) -> Option<FusedKernel> {
    let mut k = random::kernel(seed, opts);
    for i in &mut k.inputs {
        i.dtype = DType::F32;
    }
    for inst in &mut k.body {
        *inst = match *inst {
            Inst::Const { value, .. } => Inst::Const {
                value,
                dtype: DType::F32,
            },
            Inst::Index { .. } => Inst::Const {
                value: 1.5,
                dtype: DType::F32,
            },
            Inst::Convert { x, .. } => Inst::Unary {
                op: UnaryOp::Neg,
                x,
            },
            ref other => other.clone(),
        };
    }
    k.check().ok().map(|_| k)
}

/// Inputs of ordinary values, both zeros, infinities and NaN (a fifth of the inputs hold only
/// -1 and zeros of both signs, so that max reductions meet ties).
fn data(r: &mut Rng, inp: &Input) -> Vec<u8> {
    let zeros = r.chance(20);
    let mut out = Vec::with_capacity(inp.len * 4);
    for _ in 0..inp.len {
        let x: f32 = if zeros {
            r.pick(&[-1.0, -0.0, 0.0])
        } else if r.chance(8) {
            r.pick(&[
                -0.0,
                0.0,
                f32::NAN,
                f32::INFINITY,
                f32::NEG_INFINITY,
                1e20,
                -3e-20,
            ])
        } else {
            (r.below(97) as f32 - 48.0) / 8.0 + r.below(1000) as f32 * 1e-4
        };
        out.extend_from_slice(&x.to_ne_bytes());
    }
    out
}

/// `bytes` (f32 values) with every NaN made an infinity.
fn without_nan(mut bytes: Vec<u8>) -> Vec<u8> {
    for c in bytes.chunks_exact_mut(4) {
        if f32::from_ne_bytes([c[0], c[1], c[2], c[3]]).is_nan() {
            c.copy_from_slice(&f32::INFINITY.to_ne_bytes());
        }
    }
    bytes
}

/// An arena (8-aligned) with the inputs and outputs at 256-aligned offsets and `scratch`
/// bytes after them: `(arena, inputs, outputs, scratch offset)`.
fn arena(
    k: &FusedKernel,
    inputs: &[Vec<u8>],
    scratch: usize,
) -> (Vec<u64>, Vec<usize>, Vec<usize>, usize) {
    let mut at = 0usize;
    let mut ins = Vec::new();
    for d in inputs {
        ins.push(at);
        at = (at + d.len()).next_multiple_of(256);
    }
    let mut outs = Vec::new();
    for j in 0..k.outputs.len() {
        outs.push(at);
        at = (at + k.output_len(j) * k.output_dtype(j).size()).next_multiple_of(256);
    }
    let s = at;
    let mut mem = vec![0u64; (at + scratch).div_ceil(8) + 1];
    let bytes = mem.as_mut_bytes();
    for (&o, d) in ins.iter().zip(inputs) {
        bytes[o..o + d.len()].copy_from_slice(d);
    }
    (mem, ins, outs, s)
}

fn outputs_of(k: &FusedKernel, mem: &[u64], outs: &[usize]) -> Vec<Vec<u8>> {
    let bytes = mem.as_bytes();
    (0..k.outputs.len())
        .map(|j| bytes[outs[j]..outs[j] + k.output_len(j) * 4].to_vec())
        .collect()
}

/// Runs `k` through its program (or `k`'s pieces for `threads`, each through its own program
/// where it has one, one after another) in an arena.
fn run_compiled(
    k: &FusedKernel,
    inputs: &[Vec<u8>],
    threads: usize,
) -> Result<Vec<Vec<u8>>, KernelError> {
    let pieces = if threads > 1 {
        parts::cut(k, threads, 1)
    } else {
        None
    };
    match pieces {
        None => {
            let c = Compiled::new(k).expect("compiled");
            let (mut mem, ins, outs, s) = arena(k, inputs, c.scratch_bytes());
            c.run(k, mem.as_mut_bytes(), &ins, &outs, s)?;
            Ok(outputs_of(k, &mem, &outs))
        }
        Some(ps) => {
            let need = ps
                .iter()
                .map(|p| cpu::scratch_bytes(&p.kernel))
                .max()
                .unwrap_or(0);
            let (mut mem, ins, outs, s) = arena(k, inputs, need);
            for p in &ps {
                let po: Vec<usize> = outs
                    .iter()
                    .zip(&p.output_start)
                    .map(|(&o, &st)| o + st * 4)
                    .collect();
                match Compiled::new(&p.kernel) {
                    Some(c) => c.run(&p.kernel, mem.as_mut_bytes(), &ins, &po, s)?,
                    None => cpu::run(&p.kernel, mem.as_mut_bytes(), &ins, &po, s)?,
                }
            }
            Ok(outputs_of(k, &mem, &outs))
        }
    }
}

fn same(k: &FusedKernel, got: &[Vec<u8>], want: &[Vec<u8>]) -> Result<(), String> {
    for (j, (g, w)) in got.iter().zip(want).enumerate() {
        if g != w {
            let e = g
                .chunks_exact(4)
                .zip(w.chunks_exact(4))
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            let f = |b: &[u8]| f32::from_ne_bytes(b[e * 4..e * 4 + 4].try_into().unwrap());
            return Err(format!(
                "output {j} element {e}: compiled {:?}, interpreted {:?}\n{k}",
                f(g),
                f(w)
            ));
        }
    }
    Ok(())
}

#[test]
fn compiled_random_kernels_give_the_interpreters_bits_on_1_2_and_3_threads() {
    let (mut compiled, mut rows, mut multi_row, mut columns) = (0, 0, 0, 0);
    for seed in 0..6000u64 {
        let Some(k) = f32_kernel(seed, &random::Options::small()) else {
            continue;
        };
        let Some(c) = Compiled::new(&k) else {
            continue;
        };
        compiled += 1;
        columns += usize::from(c.is_columns());
        if k.reduce_axes.iter().any(|&a| k.domain[a] > 1) {
            rows += 1;
            if c.shape().1 > 1 {
                multi_row += 1;
            }
        }
        let mut r = Rng(seed ^ 0x5EED);
        let inputs: Vec<Vec<u8>> = k.inputs.iter().map(|i| data(&mut r, i)).collect();
        let refs: Vec<&[u8]> = inputs.iter().map(|d| d.as_slice()).collect();
        let want = cpu::run_buffers(&k, &refs).unwrap();
        for threads in [1, 2, 3] {
            let got = run_compiled(&k, &inputs, threads)
                .unwrap_or_else(|e| panic!("seed {seed}, {threads} threads: {e}\n{k}"));
            if let Err(e) = same(&k, &got, &want) {
                panic!("seed {seed}, {threads} threads: {e}");
            }
        }
    }
    // The generator must reach the compiled path often, rows several to a chunk included.
    assert!(compiled >= 500, "{compiled} kernels compiled");
    assert!(columns >= 100, "{columns} column reductions compiled");
    assert!(rows >= 100, "{rows} row kernels compiled");
    assert!(
        multi_row >= 50,
        "{multi_row} row kernels with several rows a chunk"
    );
}

#[test]
fn a_layer_norms_short_rows_run_several_to_a_chunk_with_the_interpreters_bits() {
    for (rows, n) in [(512, 64), (37, 256), (5, 3000), (300, 2)] {
        let k = layer_norm(rows, n, false, true);
        k.check().unwrap();
        let c = Compiled::new(&k).expect("a layer norm compiles");
        let (lanes, group) = c.shape();
        if n <= 128 {
            assert!(group > 1, "rows of {n}: {group} a chunk of {lanes} lanes");
        }
        assert!(c.scratch_bytes() <= cpu::scratch_bytes(&k));
        let mut r = Rng(n as u64);
        let inputs: Vec<Vec<u8>> = k.inputs.iter().map(|i| data(&mut r, i)).collect();
        let refs: Vec<&[u8]> = inputs.iter().map(|d| d.as_slice()).collect();
        let want = cpu::run_buffers(&k, &refs).unwrap();
        for threads in [1, 2, 3] {
            let got = run_compiled(&k, &inputs, threads).unwrap();
            same(&k, &got, &want).unwrap();
        }
    }
}

#[test]
fn kernels_outside_the_compiled_subset_are_left_to_the_interpreter() {
    // An index, a bf16 input, a reduced axis inside a kept one: `None`, so that the
    // interpreter runs them.
    let mut k = layer_norm(8, 16, false, true);
    k.body.push(Inst::Index {
        axis: 1,
        dtype: DType::F32,
    });
    k.outputs.push(Output { value: 15 });
    assert!(Compiled::new(&k).is_none());
    let mut k = layer_norm(8, 16, false, true);
    k.inputs[1].dtype = DType::BF16;
    assert!(Compiled::new(&k).is_none());
    // A column reduction with a kept axis before its reduced one: [2, 3, 4] summed over 3.
    let mut k = column_sums(&[3], 4, false);
    k.domain = vec![2, 3, 4];
    k.reduce_axes = vec![1];
    for (n, i) in k.inputs.iter_mut().enumerate() {
        if n < 2 {
            i.len = 24;
            i.access.strides = vec![12, 4, 1];
        } else {
            i.access.strides = vec![0, 0, 1];
        }
    }
    assert!(k.check().is_ok());
    assert!(Compiled::new(&k).is_none());
}

/// Gradients of a bias and of a layer norm's weight: `dy` and `xhat` of shape
/// `[terms.., cols]` summed over the terms: `Σ dy`, `Σ dy·w·xhat` (`w` one value per
/// column), `max xhat`, and per-column values computed from them (`0.5 Σ dy·w·xhat`, plus `w`);
/// with `full`, also the full `dy·w·xhat`.
fn column_sums(terms: &[usize], cols: usize, full: bool) -> FusedKernel {
    let mut domain = terms.to_vec();
    domain.push(cols);
    let numel: usize = domain.iter().product();
    let mut w_strides = vec![0; terms.len()];
    w_strides.push(1);
    let bin = |op, a, b| Inst::Binary { op, a, b };
    let full_in = || Input {
        dtype: DType::F32,
        len: numel,
        access: Access::contiguous(&domain),
    };
    let mut outputs = vec![
        Output { value: 5 },
        Output { value: 9 },
        Output { value: 7 },
        Output { value: 10 },
    ];
    if full {
        outputs.push(Output { value: 4 });
    }
    FusedKernel {
        domain: domain.clone(),
        reduce_axes: (0..terms.len()).collect(),
        inputs: vec![
            full_in(),
            full_in(),
            Input {
                dtype: DType::F32,
                len: cols,
                access: Access {
                    offset: 0,
                    strides: w_strides,
                },
            },
        ],
        body: vec![
            Inst::Load { input: 0 },  // 0 dy
            Inst::Load { input: 1 },  // 1 xhat
            Inst::Load { input: 2 },  // 2 w, per column
            bin(BinaryOp::Mul, 0, 2), // 3
            bin(BinaryOp::Mul, 3, 1), // 4
            Inst::Reduce {
                op: ReduceOp::Sum,
                x: 0,
            }, // 5
            Inst::Reduce {
                op: ReduceOp::Sum,
                x: 4,
            }, // 6
            Inst::Reduce {
                op: ReduceOp::Max,
                x: 1,
            }, // 7
            Inst::Const {
                value: 0.5,
                dtype: DType::F32,
            }, // 8
            bin(BinaryOp::Mul, 6, 8), // 9
            bin(BinaryOp::Add, 9, 2), // 10
        ],
        outputs,
    }
}

#[test]
fn column_sums_run_several_terms_a_chunk_with_the_interpreters_bits_on_1_2_and_3_threads() {
    // Rows of a bias gradient, batch × seq of a layer norm's, more terms than a cascade level
    // takes, more columns than a chunk holds, and a few of each.
    let shapes: [(&[usize], usize); 7] = [
        (&[512], 64),
        (&[8, 64], 64),
        (&[3], 5),
        (&[70], 3),
        (&[5000], 2),
        (&[100], 1500),
        (&[2, 3], 700),
    ];
    for (terms, cols) in shapes {
        for full in [false, true] {
            let k = column_sums(terms, cols, full);
            k.check().unwrap();
            let c = Compiled::new(&k).expect("a column reduction compiles");
            assert!(c.is_columns(), "{terms:?} x {cols}");
            assert!(c.scratch_bytes() <= cpu::scratch_bytes(&k));
            let (lanes, per_chunk) = c.shape();
            if cols <= 128 {
                assert!(
                    per_chunk > 1,
                    "{cols} columns: {per_chunk} terms a chunk of {lanes}"
                );
            }
            let mut r = Rng((cols * 31 + terms[0]) as u64);
            // No NaN inputs: a sum meeting two NaNs keeps either payload (LLVM may swap an
            // addition's operands), so NaN bits are not the claim here.
            let inputs: Vec<Vec<u8>> = k
                .inputs
                .iter()
                .map(|i| without_nan(data(&mut r, i)))
                .collect();
            let refs: Vec<&[u8]> = inputs.iter().map(|d| d.as_slice()).collect();
            let want = cpu::run_buffers(&k, &refs).unwrap();
            for threads in [1, 2, 3] {
                // A full output keeps the kernel whole (it is not cut along its columns).
                let cut = parts::cut(&k, threads, 1).map_or(1, |p| p.len());
                // Nor is a kernel of fewer than 4 columns (2 at least a piece).
                let cuts = threads > 1 && !full && cols >= 4;
                assert_eq!(cut > 1, cuts, "{terms:?} x {cols}");
                let got = run_compiled(&k, &inputs, threads).unwrap();
                same(&k, &got, &want).unwrap_or_else(|e| panic!("{threads} threads: {e}"));
            }
        }
    }
}

#[test]
fn running_a_compiled_kernel_allocates_nothing() {
    let k = layer_norm(512, 64, false, true);
    let c = Compiled::new(&k).unwrap();
    let mut r = Rng(7);
    let inputs: Vec<Vec<u8>> = k.inputs.iter().map(|i| data(&mut r, i)).collect();
    let (mut mem, ins, outs, s) = arena(&k, &inputs, c.scratch_bytes());
    c.run(&k, mem.as_mut_bytes(), &ins, &outs, s).unwrap();
    let n = allocations(|| {
        for _ in 0..3 {
            c.run(&k, mem.as_mut_bytes(), &ins, &outs, s).unwrap();
        }
    });
    assert_eq!(n, 0, "{n} allocations");
}
