//! The fused kernels of a step compiled for CUDA, in launch order, with what each computes:
//! for reading which ops a kernel holds and which tensors it reads and writes.
//!
//!     kernels_of MODEL [--precision bf16] [--channels-last] [--origin TEXT] [--source OP]
//!
//! Each device operation prints one line (its index in the program, as `cuda_profile`'s
//! timeline numbers them); with `--origin TEXT`, fused kernels whose origin names TEXT also
//! print their body ([`ingot_kernels::fused::FusedKernel`]'s listing) and who reads each output;
//! `--source OP` prints the CUDA C text and launch of device operation OP.

use ingot_compiler::ir::Op;
use ingot_compiler::lower::cuda::DeviceOp;
use ingot_compiler::lower::Target;
use ingot_compiler::pipeline;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = args.first().cloned().expect("a model name");
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let mut opts = pipeline::Options::for_target(Target::Cuda);
    opts.channels_last = args.iter().any(|a| a == "--channels-last").into();
    if let Some(p) = flag("--precision") {
        opts.precision =
            Some(ingot_compiler::precision::Precision::from_name(&p).expect("a precision"));
    }
    let origin = flag("--origin");
    let source: Option<usize> = flag("--source").map(|v| v.parse().expect("--source OP"));
    let t = std::time::Instant::now();
    let c = ingot_models::compile_model(&model, &opts).expect("the step compiles");
    let exe = c.executable(Target::Cuda).expect("the step lowers");
    eprintln!("compiled in {:.1} s", t.elapsed().as_secs_f64());
    let g = &c.graph;
    let ingot_compiler::lower::Program::Cuda(program) = exe.program() else {
        panic!("a CUDA program");
    };
    let users = g.users();
    let mut op_of = std::collections::HashMap::new();
    for (i, op) in program.ops.iter().enumerate() {
        if let Some(n) = op.node() {
            op_of.insert(n, i);
        }
    }
    // The program ops reading `v` (through the Result nodes of a kernel's other outputs).
    let readers = |v: ingot_compiler::ir::NodeId| -> Vec<String> {
        users[v.index()]
            .iter()
            .map(|u| match op_of.get(u) {
                Some(i) => format!("op {i}"),
                None => format!("{} %{}", g.node(*u).op.name(), u.index()),
            })
            .collect()
    };
    for (i, op) in program.ops.iter().enumerate() {
        let Some(node) = op.node() else {
            println!("op {i}: {op:?}");
            continue;
        };
        let n = g.node(node);
        let o = g.origin(node).to_string();
        if let (Some(want), DeviceOp::Launch { kernel, .. }) = (source, op) {
            if want == i {
                let k = &program.kernels[*kernel];
                println!("{:?}\n{}", k.launch, k.source);
            }
        }
        match &n.op {
            Op::Fused(k) => {
                let bytes: usize = k.inputs.iter().map(|x| x.len * x.dtype.size()).sum();
                let launch = match op {
                    DeviceOp::Launch { kernel, .. } => {
                        let l = program.kernels[*kernel].launch;
                        format!(" grid {:?} block {:?}", l.grid, l.block)
                    }
                    _ => String::new(),
                };
                println!(
                    "op {i}: fused {:?} reduce {:?} in {} out {} read {} MB moves {} B{launch}  [{o}]",
                    k.domain,
                    k.reduce_axes,
                    k.inputs.len(),
                    k.outputs.len(),
                    bytes / 1_000_000,
                    program.touches[i].bytes()
                );
                if origin.as_ref().is_some_and(|w| o.contains(w.as_str())) {
                    print!("{k}");
                    for j in 0..k.outputs.len() {
                        let v = if j == 0 {
                            Some(node)
                        } else {
                            g.result_of(node, j)
                        };
                        let r = v.map(&readers).unwrap_or_default();
                        println!("  out{j} read by {r:?}");
                    }
                }
            }
            other => {
                let kind = match op {
                    DeviceOp::Conv(_) => "conv",
                    _ => "",
                };
                println!("op {i}: {kind} {} {}  [{o}]", other.name(), n.ty)
            }
        }
    }
}
