//! What each cuDNN convolution of CUDA step executables needs of its planned workspace: the
//! algorithm the load would choose in the workspace the plan gives it ([`cudnn::choose`]),
//! and the one it would choose in none at all, or cuDNN's offers where no deterministic
//! algorithm runs without workspace. A plan's convolution workspace floor (what a
//! convolution at the step's peak keeps) is today one image's im2col column plus cuBLAS's
//! 32 MiB even where the convolution runs only through cuDNN; this says, per model, whether
//! a floor of 0 would leave every convolution an algorithm (issue 46: the imported U-Net's
//! peak is one such workspace). Nothing runs on the GPU: cuDNN's heuristics are only asked.
//!
//!     cudnn_offers STEP.exe...     (written by `ingot compile --device cuda -o STEP.exe`)
//!
//! Needs a GPU and cuDNN; without them it says so and exits 0.

use ingot_compiler::exe::Executable;
use ingot_compiler::lower::{self, cuda::DeviceOp};
use ingot_runtime::cuda::cudnn::{self, ConvPath};

fn main() {
    let lib = ingot_runtime::cuda::cudnn_with_gpu().unwrap_or_else(|e| {
        println!("skipping: {e}");
        std::process::exit(0)
    });
    let ctx = cudarc::driver::CudaContext::new(0).expect("a CUDA context");
    let stream = ctx.default_stream();
    let h = cudnn::Handle::new(lib, &stream).expect("a cuDNN handle");
    for path in std::env::args().skip(1) {
        let exe = match Executable::read(&path) {
            Ok(e) => e,
            Err(e) => {
                println!("{path}: {e}");
                continue;
            }
        };
        let lower::Program::Cuda(p) = exe.program() else {
            println!("{path}: not a CUDA step");
            continue;
        };
        let (mut convs, mut none_at_zero, mut planned_sum) = (0, 0, 0usize);
        for op in &p.ops {
            let DeviceOp::Conv(c) = op else {
                continue;
            };
            convs += 1;
            planned_sum += c.workspace.bytes;
            let at_plan = describe(cudnn::choose(&h, c).map(|r| r.choice.path.clone()));
            let mut bare = c.clone();
            bare.workspace.bytes = 0;
            let at_zero = cudnn::choose(&h, &bare).map(|r| r.choice.path.clone());
            none_at_zero += usize::from(at_zero.is_err());
            println!(
                "{path}: %{} {:?} {:?} {:?}: planned {}: {at_plan}; with none: {}",
                c.node.0,
                c.pass,
                c.layout,
                c.dims,
                c.workspace.bytes,
                describe(at_zero)
            );
        }
        println!(
            "{path}: {convs} convolutions, {none_at_zero} with no deterministic algorithm in no \
             workspace; {planned_sum} workspace bytes planned in all"
        );
    }
}

fn describe(r: Result<ConvPath, String>) -> String {
    match r {
        Ok(ConvPath::Cudnn {
            algo, workspace, ..
        }) => format!("{algo} ({workspace} bytes)"),
        Ok(ConvPath::Im2col { reason }) => format!("im2col ({reason})"),
        Ok(ConvPath::Direct { reason }) => format!("direct ({reason})"),
        Err(e) => format!("none: {e}"),
    }
}
