//! The fused-attention kernels on the GPU (issue 17): forward `out` and `lse`, backward `dq`,
//! `dk`, `dv` (and `delta`) against a plain f64 loop reference with the analytic gradients,
//! over head dims 32/64/80/96/128, lengths 1, 17, 64, 100, 257 and 1024 (Tq = Tk, and Tq ≠ Tk),
//! causal and not, in each precision within its tolerance relative to the output's scale
//! (f32 1e-5, tf32 5e-3, bf16 2e-2); and two runs of every kernel give the same bits.
//!
//! Outputs are filled with NaN bytes before each run, so an element a kernel forgets to write
//! fails. Without a GPU this skips with the reason; with `INGOT_REQUIRE_GPU=1` that is a
//! failure. Run with `--test-threads=1`.

use ingot_kernels::cuda::attention::{self, AttentionBackward, AttentionPrecision, AttentionShape};
use ingot_kernels::cuda::CudaKernel;
use ingot_kernels::dtype::{bf16, bf16_from_f64};
use ingot_runtime::cuda;

#[path = "support/attention_device.rs"]
mod device;
#[path = "../../kernels/tests/cuda_attention_support/reference.rs"]
mod reference;

use device::{download, filled, upload, Modules, Res};
use reference::{relative_error, uniform, Problem};

fn encode(p: AttentionPrecision, xs: &[f64]) -> Vec<u8> {
    match p {
        AttentionPrecision::Bf16 => xs
            .iter()
            .flat_map(|&x| bf16_from_f64(x).to_bits().to_ne_bytes())
            .collect(),
        _ => xs.iter().flat_map(|&x| (x as f32).to_ne_bytes()).collect(),
    }
}

fn decode(p: AttentionPrecision, b: &[u8]) -> Vec<f64> {
    match p {
        AttentionPrecision::Bf16 => b
            .chunks(2)
            .map(|c| bf16::from_bits(u16::from_ne_bytes([c[0], c[1]])).to_f64())
            .collect(),
        _ => f32s(b),
    }
}

fn f32s(b: &[u8]) -> Vec<f64> {
    b.chunks(4)
        .map(|c| f64::from(f32::from_ne_bytes(c.try_into().unwrap())))
        .collect()
}

fn tolerance(p: AttentionPrecision) -> f64 {
    match p {
        AttentionPrecision::F32 => 1e-5,
        AttentionPrecision::Tf32 => 5e-3,
        AttentionPrecision::Bf16 => 2e-2,
    }
}

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

struct Case {
    shape: AttentionShape,
    forward: CudaKernel,
    backward: AttentionBackward,
}

fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for p in [
        AttentionPrecision::F32,
        AttentionPrecision::Tf32,
        AttentionPrecision::Bf16,
    ] {
        for (bh, tq, tk, d, causal) in SHAPES {
            let shape = AttentionShape {
                batch_heads: bh,
                seq_q: tq,
                seq_k: tk,
                head_dim: d,
                causal,
                scale: 1.0 / (d as f32).sqrt(),
                precision: p,
            };
            v.push(Case {
                shape,
                forward: attention::forward(&shape).unwrap(),
                backward: attention::backward(&shape).unwrap(),
            });
        }
    }
    v
}

/// Every output of one run: out, lse, delta, dk, dv, dq (raw bytes).
fn run(m: &Modules, c: &Case, inputs: &[Vec<u8>; 4]) -> Res<Vec<Vec<u8>>> {
    let s = &c.shape;
    let es = if s.precision == AttentionPrecision::Bf16 {
        2
    } else {
        4
    };
    let (nq, nk, rows) = (
        s.batch_heads * s.seq_q * s.head_dim,
        s.batch_heads * s.seq_k * s.head_dim,
        s.batch_heads * s.seq_q,
    );
    let q = upload(&inputs[0])?;
    let k = upload(&inputs[1])?;
    let v = upload(&inputs[2])?;
    let dout = upload(&inputs[3])?;
    let out = filled(nq * es, 0xff)?;
    let lse = filled(rows * 4, 0xff)?;
    let delta = filled(attention::backward_workspace_bytes(s), 0xff)?;
    let dk = filled(nk * es, 0xff)?;
    let dv = filled(nk * es, 0xff)?;
    let dq = filled(nq * es, 0xff)?;
    m.launch(&c.forward, &[&q, &k, &v, &out, &lse])?;
    let b = &c.backward;
    m.launch(&b.preprocess, &[&out, &dout, &delta])?;
    m.launch(&b.dkdv, &[&q, &k, &v, &dout, &lse, &delta, &dk, &dv])?;
    m.launch(&b.dq, &[&q, &k, &v, &dout, &lse, &delta, &dq])?;
    [&out, &lse, &delta, &dk, &dv, &dq]
        .iter()
        .map(|b| download(b))
        .collect()
}

fn check_all(m: &Modules, cases: &[Case]) -> Vec<String> {
    let mut bad = Vec::new();
    let mut worst = [(AttentionPrecision::F32, 0f64); 3];
    for (n, c) in cases.iter().enumerate() {
        let s = &c.shape;
        let p = s.precision;
        let prob = Problem {
            bh: s.batch_heads,
            tq: s.seq_q,
            tk: s.seq_k,
            d: s.head_dim,
            causal: s.causal,
            scale: f64::from(s.scale),
        };
        let (nq, nk) = (prob.bh * prob.tq * prob.d, prob.bh * prob.tk * prob.d);
        let seed = 1000 + 10 * n as u64;
        let round = |xs: Vec<f64>| decode(p, &encode(p, &xs));
        let q = round(uniform(nq, seed, 2.0));
        let k = round(uniform(nk, seed + 1, 1.0));
        let v = round(uniform(nk, seed + 2, 1.0));
        let dout = round(uniform(nq, seed + 3, 1.0));
        let inputs = [
            encode(p, &q),
            encode(p, &k),
            encode(p, &v),
            encode(p, &dout),
        ];
        let got = match run(m, c, &inputs) {
            Ok(g) => g,
            Err(e) => {
                bad.push(format!("{s:?}: {e}"));
                continue;
            }
        };
        match run(m, c, &inputs) {
            Ok(again) if again == got => {}
            Ok(_) => bad.push(format!("{s:?}: a second run gives different bits")),
            Err(e) => bad.push(format!("{s:?}: second run: {e}")),
        }
        let (want_out, want_lse) = prob.forward(&q, &k, &v);
        let (want_dq, want_dk, want_dv, terms) = prob.backward(&q, &k, &v, &dout);
        let out = decode(p, &got[0]);
        let want_delta: Vec<f64> = (0..prob.bh * prob.tq)
            .map(|i| {
                (0..prob.d)
                    .map(|c| out[i * prob.d + c] * dout[i * prob.d + c])
                    .sum()
            })
            .collect();
        let tol = tolerance(p);
        let mut line = format!("{p:?} {s:?}:");
        for (what, g, w, tol, floor) in [
            ("out", out.clone(), want_out, tol, 1e-3),
            ("lse", f32s(&got[1]), want_lse, tol, 1e-3),
            ("delta", f32s(&got[2]), want_delta, 1e-5, 1e-3),
            ("dk", decode(p, &got[3]), want_dk, tol, terms),
            ("dv", decode(p, &got[4]), want_dv, tol, 1e-3),
            ("dq", decode(p, &got[5]), want_dq, tol, terms),
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
    for c in cases.iter().take(SHAPES.len() * 3).step_by(7) {
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
