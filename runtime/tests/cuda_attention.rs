//! The fused-attention kernels on the GPU (issue 17): forward `out` and `lse`, backward `dq`,
//! `dk`, `dv` (and `delta`) against a plain f64 loop reference with the analytic gradients,
//! over head dims 32/64/80/96/128, lengths 1, 17, 64, 100, 257 and 1024 (Tq = Tk, and Tq ≠ Tk),
//! causal and not, in each precision within its tolerance relative to the output's scale
//! (f32 1e-5, tf32 5e-3, bf16 2e-2); and two runs of every kernel give the same bits. Besides
//! the contiguous layout, cases in the token-major layout, the packed q/k/v layout (k and v
//! launched at their slots of q's buffer, dk and dv at theirs of dq's) and a token-major
//! layout with gaps between rows: inputs scattered where the layout puts them, outputs
//! gathered back.
//!
//! Outputs are filled with NaN bytes before each run, so an element a kernel forgets to write
//! fails; after each launch, every output byte that no output written so far addresses (the
//! gaps, the slots of the gradients still to come) must still be a fill byte. Input gaps hold
//! NaN, so a kernel reading where no input lies fails too. Without a GPU this skips with the
//! reason; with `INGOT_REQUIRE_GPU=1` that is a failure. Run with `--test-threads=1`.

use ingot_kernels::cuda::attention::{self, AttentionBackward, AttentionPrecision, AttentionShape};
use ingot_kernels::cuda::CudaKernel;
use ingot_runtime::cuda;

#[path = "support/attention_device.rs"]
mod device;
#[path = "../../kernels/tests/cuda_attention_support/placement.rs"]
mod placement;
#[path = "../../kernels/tests/cuda_attention_support/reference.rs"]
mod reference;
#[path = "../../kernels/tests/cuda_attention_support/values.rs"]
mod values;

use device::{download, upload, Buf, Modules, Res};
use ingot_kernels::attention::Layout;
use placement::{padded_tokens, Arg, Operand, Placement, DKDV, DQ, FORWARD, PREPROCESS};
use reference::relative_error;
use values::{decode, encode, f32s, inputs, problem, row_dots, tolerance};

/// The shapes checked in each precision: (batch·heads, Tq, Tk, head dim, causal).
const SHAPES: [(usize, usize, usize, usize, bool); 22] = [
    (3, 1, 1, 32, true),
    (3, 17, 17, 32, false),
    (2, 257, 257, 32, true),
    (3, 17, 17, 64, true),
    (3, 64, 64, 64, false),
    (3, 64, 64, 64, true),
    (3, 100, 100, 64, true),
    (2, 1024, 1024, 64, true),
    (3, 100, 100, 80, false),
    (2, 257, 257, 80, true),
    (3, 64, 64, 96, true),
    (3, 17, 17, 96, false),
    (2, 257, 257, 96, false),
    (2, 257, 257, 128, true),
    (3, 1, 1, 128, false),
    (3, 100, 100, 128, false),
    // Tq ≠ Tk.
    (3, 17, 100, 64, false),
    (2, 257, 64, 80, false),
    (3, 1, 257, 96, false),
    (3, 100, 17, 32, true),
    (2, 64, 257, 128, true),
    (2, 257, 100, 128, false),
];

/// A strided layout of the checked cases.
#[derive(Clone, Copy, Debug)]
enum Strided {
    /// [`Layout::tokens`], every operand in its own buffer.
    Tokens,
    /// [`Layout::packed`]: q, k, v in one buffer, dq, dk, dv in another.
    Packed,
    /// Token-major with 16 elements of gap after every token and every batch.
    Padded,
}

/// The strided cases checked in each precision: (layout, batch, heads, Tq, Tk, head dim,
/// causal); packed ones are self-attention (Tq = Tk).
const STRIDED: [(Strided, usize, usize, usize, usize, usize, bool); 7] = [
    (Strided::Tokens, 2, 3, 100, 100, 64, true),
    (Strided::Tokens, 2, 2, 17, 257, 96, false),
    (Strided::Tokens, 1, 4, 257, 64, 64, true),
    (Strided::Packed, 2, 3, 100, 100, 64, true),
    (Strided::Packed, 1, 4, 257, 257, 128, false),
    (Strided::Packed, 2, 2, 64, 64, 32, true),
    (Strided::Padded, 2, 2, 70, 70, 80, true),
];

struct Case {
    shape: AttentionShape,
    /// Where each operand lies (its layout is `shape.layout`).
    at: Placement,
    forward: CudaKernel,
    backward: AttentionBackward,
}

/// (batch·heads, Tq, Tk, head dim, causal).
type Dims = (usize, usize, usize, usize, bool);

fn case(p: AttentionPrecision, dims: Dims, at: Placement) -> Case {
    let shape = placement::shape(p, dims, at.layout);
    Case {
        shape,
        at,
        forward: attention::forward(&shape).unwrap(),
        backward: attention::backward(&shape).unwrap(),
    }
}

fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for p in [
        AttentionPrecision::F32,
        AttentionPrecision::Tf32,
        AttentionPrecision::Bf16,
    ] {
        for (bh, tq, tk, d, causal) in SHAPES {
            let at = Placement::separate(Layout::contiguous(tq, tk, d), bh, tq, tk, d);
            v.push(case(p, (bh, tq, tk, d, causal), at));
        }
        for (kind, b, h, tq, tk, d, causal) in STRIDED {
            let bh = b * h;
            let at = match kind {
                Strided::Tokens => Placement::separate(Layout::tokens(h, tq, tk, d), bh, tq, tk, d),
                Strided::Packed => Placement::packed(h, bh, tq, d),
                Strided::Padded => {
                    Placement::separate(padded_tokens(h, tq, tk, d, 16), bh, tq, tk, d)
                }
            };
            v.push(case(p, (bh, tq, tk, d, causal), at));
        }
    }
    v
}

/// One run of the forward and backward kernels of `c` on `buffers` (the placement's strided
/// buffers, then lse and delta): every buffer's bytes after each of the four launches.
fn run(m: &Modules, c: &Case, buffers: &[Vec<u8>]) -> Res<Vec<Vec<Vec<u8>>>> {
    let es = element_size(c.shape.precision);
    let bufs: Vec<Buf> = buffers.iter().map(|b| upload(b)).collect::<Res<_>>()?;
    let b = &c.backward;
    let mut after = Vec::new();
    for (kernel, args) in [
        (&c.forward, &FORWARD[..]),
        (&b.preprocess, &PREPROCESS[..]),
        (&b.dkdv, &DKDV[..]),
        (&b.dq, &DQ[..]),
    ] {
        let ptrs: Vec<u64> = args
            .iter()
            .map(|&a| {
                let (buf, elems) = c.at.arg(a);
                bufs[buf].at(elems * es)
            })
            .collect();
        m.launch_at(kernel, &ptrs)?;
        after.push(bufs.iter().map(download).collect::<Res<_>>()?);
    }
    Ok(after)
}

fn element_size(p: AttentionPrecision) -> usize {
    if p == AttentionPrecision::Bf16 {
        2
    } else {
        4
    }
}

/// What each launch has written, in launch order: a kernel storing outside these rows
/// (another operand's slot, a gap) is a failure.
const WRITTEN: [&[Operand]; 4] = [
    &[Operand::Out],
    &[Operand::Out],
    &[Operand::Out, Operand::Dk, Operand::Dv],
    &[Operand::Out, Operand::Dk, Operand::Dv, Operand::Dq],
];

fn check_all(m: &Modules, cases: &[Case]) -> Vec<String> {
    let mut bad = Vec::new();
    let mut worst = [(AttentionPrecision::F32, 0f64); 3];
    for (n, c) in cases.iter().enumerate() {
        let s = &c.shape;
        let p = s.precision;
        let es = element_size(p);
        let prob = problem(s);
        let [q, k, v, dout] = inputs(p, &prob, 1000 + 10 * n as u64);
        // Outputs (and lse, delta) are filled with NaN bytes: an element a kernel forgets to
        // write fails.
        let mut buffers: Vec<Vec<u8>> =
            c.at.inputs([&q, &k, &v, &dout])
                .into_iter()
                .zip(&c.at.lens)
                .map(|(b, &len)| match b {
                    Some(values) => encode(p, &values),
                    None => vec![0xff; len * es],
                })
                .collect();
        let rows = prob.bh * prob.tq;
        buffers.extend([
            vec![0xff; rows * 4],
            vec![0xff; attention::backward_workspace_bytes(s)],
        ]);
        let after = match run(m, c, &buffers) {
            Ok(g) => g,
            Err(e) => {
                bad.push(format!("{s:?}: {e}"));
                continue;
            }
        };
        match run(m, c, &buffers) {
            Ok(again) if again == after => {}
            Ok(_) => bad.push(format!("{s:?}: a second run gives different bits")),
            Err(e) => bad.push(format!("{s:?}: second run: {e}")),
        }
        for (launch, (bufs, written)) in after.iter().zip(WRITTEN).enumerate() {
            if let Err(e) = c.at.untouched(bufs, es, written) {
                bad.push(format!("{s:?}: after launch {launch}: {e}"));
            }
        }
        let got = &after[3];
        let values = |op: Operand| c.at.gather(op, &decode(p, &got[c.at.site(op).buffer]));
        let (want_out, want_lse) = prob.forward(&q, &k, &v);
        let (want_dq, want_dk, want_dv, terms) = prob.backward(&q, &k, &v, &dout);
        let out = values(Operand::Out);
        let want_delta = row_dots(&prob, &out, &dout);
        let tol = tolerance(p);
        let mut line = format!("{p:?} {s:?}:");
        for (what, g, w, tol, floor) in [
            ("out", out.clone(), want_out, tol, 1e-3),
            ("lse", f32s(&got[c.at.arg(Arg::Lse).0]), want_lse, tol, 1e-3),
            (
                "delta",
                // delta's rows; bf16's stored ds follows them in the workspace.
                f32s(&got[c.at.arg(Arg::Delta).0][..rows * 4]),
                want_delta,
                1e-5,
                1e-3,
            ),
            ("dk", values(Operand::Dk), want_dk, tol, terms),
            ("dv", values(Operand::Dv), want_dv, tol, 1e-3),
            ("dq", values(Operand::Dq), want_dq, tol, terms),
        ] {
            let e = relative_error(&g, &w, floor);
            line.push_str(&format!(" {what} {e:.1e}"));
            let i = p as usize;
            worst[i] = (p, worst[i].1.max(if what == "delta" { 0.0 } else { e }));
            if e.is_nan() || e > tol {
                bad.push(format!(
                    "{s:?}: {what} differs by {e:.2e} (tolerance {tol:.0e})"
                ));
            }
        }
        eprintln!("{line}");
    }
    for (p, e) in worst {
        eprintln!("largest error relative to the output's scale, {p:?}: {e:.2e}");
    }
    bad
}

#[test]
fn attention_kernels_match_the_f64_reference_on_the_gpu_and_repeat_bit_for_bit() {
    if !cuda::gpu_for_test("fused attention kernels") {
        return;
    }
    let (name, arch) = device::init().unwrap_or_else(|e| panic!("GPU setup: {e}"));
    eprintln!("device: {name} ({arch})");
    let cases = cases();
    let kernels: Vec<&CudaKernel> = cases
        .iter()
        .flat_map(|c| {
            [
                &c.forward,
                &c.backward.preprocess,
                &c.backward.dkdv,
                &c.backward.dq,
            ]
        })
        .collect();
    let t = std::time::Instant::now();
    let m = device::compile(&kernels, arch, 16).unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "compiled {} kernels in {:.1} s",
        kernels.len(),
        t.elapsed().as_secs_f64()
    );
    for c in cases.iter().step_by(7) {
        eprintln!(
            "{:?} d={}: forward {}, dkdv {}, dq {}",
            c.shape.precision,
            c.shape.head_dim,
            m.resources(&c.forward),
            m.resources(&c.backward.dkdv),
            m.resources(&c.backward.dq)
        );
    }
    let bad = check_all(&m, &cases);
    assert!(
        bad.is_empty(),
        "{} failures:\n{}",
        bad.len(),
        bad.join("\n")
    );
}
