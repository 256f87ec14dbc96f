//! Times the fused-attention kernels alone on GPU 0: forward and backward (preprocess + dkdv +
//! dq, and each) of B=8, H=12, T=1024, D=64 causal (GPT-2's attention) in each precision,
//! median of 20 runs after 3 warm-ups, CUDA events; TFLOP/s counted as FlashAttention does
//! (forward 4·B·H·T²·D, halved when causal; backward 2.5 times the forward); bf16's backward
//! with dq from the stored ds (`DqKernel::StoredDs`, off by default) as one more row. Then, where
//! `python3` with torch and CUDA is there, `torch.nn.functional.scaled_dot_product_attention`
//! on the same shapes (bf16 and fp32 with tf32 allowed), timed the same way.
//!
//! `cargo run --release -p ingot-runtime --example attention_bench [-- B H T D]`

use ingot_kernels::attention::Layout;
use ingot_kernels::cuda::attention::{
    self, AttentionPrecision, AttentionShape, DqKernel, TileKernel,
};
use ingot_kernels::cuda::CudaKernel;

#[path = "../tests/support/attention_device.rs"]
mod device;

use device::{filled, upload, Res};

const SDPA: &str = r#"
import sys, torch
import torch.nn.functional as F
b, h, t, d = map(int, sys.argv[1:5])
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
def ms(f, reps=20):
    for _ in range(3): f()
    torch.cuda.synchronize()
    xs = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); f(); e.record(); e.synchronize(); xs.append(s.elapsed_time(e))
    return sorted(xs)[len(xs) // 2]
flops = 4 * b * h * t * t * d / 2
for name, dt in [("tf32 (fp32 inputs)", torch.float32), ("bf16", torch.bfloat16)]:
    q, k, v = (torch.randn(b, h, t, d, device="cuda", dtype=dt, requires_grad=True) for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    g = torch.randn_like(out)
    f = ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    def fb():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.autograd.grad(o, (q, k, v), g)
    fbt = ms(fb)
    bw = fbt - f
    print(f"| SDPA {name} | {f:.3f} | {flops / f / 1e9:.1f} | {bw:.3f} | {2.5 * flops / bw / 1e9:.1f} |")
"#;

fn main() -> Res<()> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("B H T D"))
        .collect();
    let (b, h, t, d) = match args[..] {
        [b, h, t, d] => (b, h, t, d),
        _ => (8, 12, 1024, 64),
    };
    let (name, arch) = device::init()?;
    println!("device: {name}; B={b} H={h} T={t} D={d} causal");
    let flops = 4.0 * (b * h) as f64 * (t * t) as f64 * d as f64 / 2.0;
    println!("| kernels | forward ms | forward TFLOP/s | backward ms | backward TFLOP/s | preprocess / dkdv / dq ms |");
    println!("|---|---:|---:|---:|---:|---|");
    for p in [
        AttentionPrecision::F32,
        AttentionPrecision::Tf32,
        AttentionPrecision::Bf16,
    ] {
        let s = causal_shape(b * h, t, d, p);
        let fwd = attention::forward(&s).map_err(|e| e.to_string())?;
        let bwd = attention::backward(&s).map_err(|e| e.to_string())?;
        let all: Vec<&CudaKernel> = vec![&fwd, &bwd.preprocess, &bwd.dkdv, &bwd.dq];
        let m = device::compile(&all, arch, 4)?;
        let es = if p == AttentionPrecision::Bf16 { 2 } else { 4 };
        let n = b * h * t * d;
        // Small values (0x3c00 / 0x3c003c00 patterns: ~0.0078 in either type) keep the softmax
        // finite; timing does not depend on the values.
        let x = upload(&vec![0x3cu8; n * es])?;
        let (q, k, v, dout) = (
            &x,
            upload(&vec![0x3b; n * es])?,
            upload(&vec![0x3a; n * es])?,
            upload(&vec![0x3c; n * es])?,
        );
        let out = filled(n * es, 0)?;
        let lse = filled(b * h * t * 4, 0)?;
        let delta = filled(attention::backward_workspace_bytes(&s), 0)?;
        let (dq, dk, dv) = (filled(n * es, 0)?, filled(n * es, 0)?, filled(n * es, 0)?);
        let f = device::time_ms(20, || m.launch(&fwd, &[q, &k, &v, &out, &lse]))?;
        let pre = device::time_ms(20, || m.launch(&bwd.preprocess, &[&out, &dout, &delta]))?;
        let kv = device::time_ms(20, || {
            m.launch(&bwd.dkdv, &[q, &k, &v, &dout, &lse, &delta, &dk, &dv])
        })?;
        let qq = device::time_ms(20, || {
            m.launch(&bwd.dq, &[q, &k, &v, &dout, &lse, &delta, &dq])
        })?;
        let bw = device::time_ms(20, || {
            m.launch(&bwd.preprocess, &[&out, &dout, &delta])?;
            m.launch(&bwd.dkdv, &[q, &k, &v, &dout, &lse, &delta, &dk, &dv])?;
            m.launch(&bwd.dq, &[q, &k, &v, &dout, &lse, &delta, &dq])
        })?;
        println!(
            "| ingot {p:?} | {f:.3} | {:.1} | {bw:.3} | {:.1} | {pre:.3} / {kv:.3} / {qq:.3} |",
            flops / f / 1e9,
            2.5 * flops / bw / 1e9
        );
        eprintln!(
            "  {p:?}: forward {} ({}), dkdv {} ({}), dq {} ({})",
            m.resources(&fwd),
            fmt_launch(&fwd),
            m.resources(&bwd.dkdv),
            fmt_launch(&bwd.dkdv),
            m.resources(&bwd.dq),
            fmt_launch(&bwd.dq)
        );
    }
    stored_ds(b, h, t, d, arch)?;
    tilings(b, h, t, d, arch)?;
    let dir = std::env::temp_dir().join("ingot_attention_bench.py");
    if std::fs::write(&dir, SDPA).is_ok() {
        match std::process::Command::new("python3")
            .arg(&dir)
            .args([b, h, t, d].map(|x| x.to_string()))
            .output()
        {
            Ok(o) if o.status.success() => print!("{}", String::from_utf8_lossy(&o.stdout)),
            Ok(o) => println!(
                "(no SDPA comparison: {})",
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            ),
            Err(e) => println!("(no SDPA comparison: python3: {e})"),
        }
    }
    Ok(())
}

/// bf16's backward with dq from the ds dkdv stores (`DqKernel::StoredDs`, off by default),
/// timed as the table above times the default's: a row of the same table.
fn stored_ds(b: usize, h: usize, t: usize, d: usize, arch: &'static str) -> Res<()> {
    let s = causal_shape(b * h, t, d, AttentionPrecision::Bf16);
    let bwd = attention::backward_with(&s, DqKernel::StoredDs).map_err(|e| e.to_string())?;
    let m = device::compile(&[&bwd.preprocess, &bwd.dkdv, &bwd.dq], arch, 4)?;
    let n = b * h * t * d * 2;
    let (q, k, v, dout) = (
        upload(&vec![0x3cu8; n])?,
        upload(&vec![0x3b; n])?,
        upload(&vec![0x3a; n])?,
        upload(&vec![0x3c; n])?,
    );
    let out = filled(n, 0)?;
    let lse = filled(b * h * t * 4, 0)?;
    let ws = filled(
        attention::backward_workspace_bytes_with(&s, DqKernel::StoredDs),
        0,
    )?;
    let (dq, dk, dv) = (filled(n, 0)?, filled(n, 0)?, filled(n, 0)?);
    let dkdv = [&q, &k, &v, &dout, &lse, &ws, &dk, &dv];
    let dqa = [&q, &k, &v, &dout, &lse, &ws, &dq];
    let pre = device::time_ms(20, || m.launch(&bwd.preprocess, &[&out, &dout, &ws]))?;
    let kv = device::time_ms(20, || m.launch(&bwd.dkdv, &dkdv))?;
    let qq = device::time_ms(20, || m.launch(&bwd.dq, &dqa))?;
    let bw = device::time_ms(20, || {
        m.launch(&bwd.preprocess, &[&out, &dout, &ws])?;
        m.launch(&bwd.dkdv, &dkdv)?;
        m.launch(&bwd.dq, &dqa)
    })?;
    let flops = 4.0 * (b * h) as f64 * (t * t) as f64 * d as f64 / 2.0;
    println!(
        "| ingot Bf16, dq from stored ds | | | {bw:.3} | {:.1} | {pre:.3} / {kv:.3} / {qq:.3} |",
        2.5 * flops / bw / 1e9
    );
    eprintln!(
        "  Bf16 stored ds: dkdv {}, dq {} ({})",
        m.resources(&bwd.dkdv),
        m.resources(&bwd.dq),
        fmt_launch(&bwd.dq)
    );
    Ok(())
}

/// Causal self-attention of `bh` heads of `t` tokens of `d` elements, contiguous.
fn causal_shape(bh: usize, t: usize, d: usize, p: AttentionPrecision) -> AttentionShape {
    AttentionShape {
        batch_heads: bh,
        seq_q: t,
        seq_k: t,
        head_dim: d,
        causal: true,
        scale: 1.0 / (d as f32).sqrt(),
        precision: p,
        layout: Layout::contiguous(t, t, d),
    }
}

/// Every tiling the kernels take (2, 4 or 8 warps; steps of 16 to 128 rows) of each tf32 and
/// bf16 kernel, timed alone: what the tile table in `attention::tiles` is chosen from.
fn tilings(b: usize, h: usize, t: usize, d: usize, arch: &'static str) -> Res<()> {
    println!("| tiling | kernel | warps x step | ms | resources |");
    println!("|---|---|---|---:|---|");
    for p in [AttentionPrecision::Tf32, AttentionPrecision::Bf16] {
        let s = causal_shape(b * h, t, d, p);
        let mut ks = Vec::new();
        for kind in [TileKernel::Forward, TileKernel::Dkdv, TileKernel::Dq] {
            let chosen = attention::tiling(&s, kind).map_err(|e| e.to_string())?;
            for warps in [2, 4, 8] {
                for inner in [16, 32, 64, 128] {
                    if let Some(k) =
                        attention::with_tiles(&s, kind, warps, inner).map_err(|e| e.to_string())?
                    {
                        let mark = if (chosen.warps, chosen.inner) == (warps, inner) {
                            " (chosen)"
                        } else {
                            ""
                        };
                        ks.push((kind, format!("{warps} x {inner}{mark}"), k));
                    }
                }
            }
        }
        let refs: Vec<&CudaKernel> = ks.iter().map(|(_, _, k)| k).collect();
        let m = device::compile(&refs, arch, 16)?;
        let es = if p == AttentionPrecision::Bf16 { 2 } else { 4 };
        let n = b * h * t * d;
        let x: Vec<device::Buf> = (0..6)
            .map(|_| upload(&vec![0x3cu8; n * es]))
            .collect::<Res<_>>()?;
        let lse = filled(b * h * t * 4, 0)?;
        let delta = filled(b * h * t * 4, 0)?;
        for (kind, what, k) in &ks {
            let args: Vec<&device::Buf> = match kind {
                TileKernel::Forward => vec![&x[0], &x[1], &x[2], &x[3], &lse],
                TileKernel::Dkdv => vec![&x[0], &x[1], &x[2], &x[3], &lse, &delta, &x[4], &x[5]],
                TileKernel::Dq => vec![&x[0], &x[1], &x[2], &x[3], &lse, &delta, &x[4]],
            };
            let ms = device::time_ms(10, || m.launch(k, &args))?;
            println!(
                "| {p:?} | {kind:?} | {what} | {ms:.3} | {} |",
                m.resources(k)
            );
        }
    }
    Ok(())
}

fn fmt_launch(k: &CudaKernel) -> String {
    format!("grid {} block {}", k.launch.grid[0], k.launch.block[0])
}
