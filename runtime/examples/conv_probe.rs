//! Times every deterministic algorithm cuDNN's heuristics offer for one convolution, in NCHW
//! and channels-last, with its input channels as given and padded (to 4 and 8), and with
//! several workspace sizes handed to the call: what a few-channel convolution (a ResNet's
//! stem: 3 channels, 7x7, stride 2) would cost on each path, measured rather than guessed
//! (issue 48: the stem's filter gradient was 4.79 ms of resnet50's 31 ms step at 224, batch
//! 128, bf16). Every tensor lives in one allocation filled with a small constant; nothing of
//! a step is compiled or run.
//!
//!     conv_probe [N,C,H,W,K,R,S,STRIDE,PAD]    (default 128,3,224,224,64,7,7,2,3)
//!
//! One line a timing: layout, input channels, pass, the workspace handed to cuDNN, the
//! algorithm, the workspace the heuristics said it needs, and the median of 5 runs after one
//! warm-up. Needs a GPU and cuDNN; without them it says so and exits 0.

use cudarc::driver::{result, sys, CudaContext};
use ingot_compiler::ir::{ConvLayout, DType, NodeId};
use ingot_compiler::lower::cuda::{Compute, Conv, ConvPass};
use ingot_compiler::plan::Location;
use ingot_kernels::cpu::conv::ConvGeometry;
use ingot_runtime::cuda::cudnn::{self, ConvPath};

const MIB: usize = 1 << 20;

fn main() {
    let lib = ingot_runtime::cuda::cudnn_with_gpu().unwrap_or_else(|e| {
        println!("skipping: {e}");
        std::process::exit(0)
    });
    let arg = std::env::args().nth(1);
    let v: Vec<usize> = arg
        .as_deref()
        .unwrap_or("128,3,224,224,64,7,7,2,3")
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("N,C,H,W,K,R,S,STRIDE,PAD as integers")
        })
        .collect();
    assert_eq!(v.len(), 9, "N,C,H,W,K,R,S,STRIDE,PAD");
    let ctx = CudaContext::new(0).expect("a CUDA context");
    let stream = ctx.default_stream();
    let h = cudnn::Handle::new(lib, &stream).expect("a cuDNN handle");
    let start = ctx
        .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        .unwrap();
    let stop = ctx
        .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        .unwrap();
    let widest = [v[1], 4, 8].into_iter().max().unwrap();
    let geo = |c: usize| {
        let out = |i: usize| (v[2 + i] + 2 * v[8] - v[5 + i]) / v[7] + 1;
        ConvGeometry {
            batch: v[0],
            in_ch: c,
            in_hw: [v[2], v[3]],
            out_ch: v[4],
            kernel: [v[5], v[6]],
            stride: [v[7]; 2],
            padding: [v[8]; 2],
            dilation: [1, 1],
            groups: 1,
            out_hw: [out(0), out(1)],
        }
    };
    let e = 2;
    let [xb, wb, yb] = geo(widest).elements().map(|n| (n * e).div_ceil(256) * 256);
    let ws_max = 2048 * MIB;
    let total = xb + wb + yb + ws_max;
    // SAFETY: a plain device allocation for the process's life.
    let base = unsafe { result::malloc_sync(total) }.expect("device memory");
    // bf16 0x3c3c (about 0.0115) everywhere: finite products, no denormals.
    // SAFETY: inside the allocation just made.
    unsafe { result::memset_d8_sync(base, 0x3c, total) }.unwrap();
    let (x, w, y, ws) = (0, xb, xb + wb, xb + wb + yb);
    println!("shape {v:?}; one allocation of {total} bytes");
    let mut channels = vec![v[1]];
    channels.extend([4, 8].into_iter().filter(|&c| c > v[1]));
    for layout in [ConvLayout::Nchw, ConvLayout::Nhwc] {
        for &c in &channels {
            for pass in [ConvPass::Filter, ConvPass::Forward] {
                for ws_bytes in [0, 56 * MIB, 128 * MIB, 512 * MIB, ws_max] {
                    let conv = Conv {
                        node: NodeId(0),
                        pass,
                        dims: geo(c),
                        layout,
                        dtype: DType::BF16,
                        compute: Compute::Bf16F32,
                        x,
                        w,
                        y,
                        workspace: Location {
                            offset: ws,
                            bytes: ws_bytes,
                        },
                        fallback: Vec::new(),
                    };
                    let runs = match cudnn::candidates(&h, &conv) {
                        Ok(r) => r,
                        Err(e) => {
                            println!("{layout:?} C={c} {pass:?} ws {ws_bytes}: none: {e}");
                            continue;
                        }
                    };
                    for run in runs {
                        let ConvPath::Cudnn {
                            algo, workspace, ..
                        } = &run.choice.path
                        else {
                            continue;
                        };
                        let time = || -> Result<f32, String> {
                            let mut ms = Vec::new();
                            for i in 0..6 {
                                start.record(&stream).map_err(|e| e.to_string())?;
                                // SAFETY: every byte of `conv` is inside the allocation.
                                unsafe { run.enqueue(&h, &conv, base) }?;
                                stop.record(&stream).map_err(|e| e.to_string())?;
                                stream.synchronize().map_err(|e| e.to_string())?;
                                if i > 0 {
                                    ms.push(start.elapsed_ms(&stop).map_err(|e| e.to_string())?);
                                }
                            }
                            ms.sort_by(f32::total_cmp);
                            Ok(ms[ms.len() / 2])
                        };
                        match time() {
                            Ok(ms) => println!(
                                "{layout:?} C={c} {pass:?} ws {ws_bytes}: {algo} (needs \
                                 {workspace}) {:.1} us",
                                ms * 1000.0
                            ),
                            Err(e) => {
                                println!(
                                    "{layout:?} C={c} {pass:?} ws {ws_bytes}: {algo} failed: {e}"
                                )
                            }
                        }
                    }
                }
            }
        }
    }
}
