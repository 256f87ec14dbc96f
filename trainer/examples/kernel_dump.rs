//! Prints the fused kernels of a model's CUDA step whose domain matches a filter, with their
//! description and the CUDA C generated for them, each distinct kernel once:
//!
//!     kernel_dump MODEL [DOMAIN_SUBSTRING]     e.g. kernel_dump gpt2 "[8, 12, 1024, 1024]"
//!     kernel_dump MODEL --graph                 the whole compiled step graph, as IR text
//!     kernel_dump random [COUNT]                the CUDA C of random kernels 0..COUNT (400), as
//!                                               the codegen tests draw them (`Options::wide`)
//!     kernel_dump MODEL:bf16 [...]              the same for the bf16 mixed-precision step
//!     kernel_dump ... --no-fuse-attention       attention left as the plain math
//!     kernel_dump ... --cu DIR                  also write each kernel, after the prelude, to
//!                                               DIR/NAME.cu (for `nvcc -cubin` and `cuobjdump
//!                                               -sass` on a GPU machine)
//!
//! A refactoring of the CUDA generator keeps every output of this byte-identical.
use ingot_compiler::ir::Op;

fn main() {
    let mut a: Vec<String> = std::env::args().skip(1).collect();
    let plain_attention = a.iter().any(|x| x == "--no-fuse-attention");
    a.retain(|x| x != "--no-fuse-attention");
    let cu_dir = a.iter().position(|x| x == "--cu").map(|at| {
        let dir = a.get(at + 1).cloned().unwrap_or_else(|| {
            eprintln!("kernel_dump: --cu takes a directory");
            std::process::exit(2);
        });
        a.drain(at..at + 2);
        std::path::PathBuf::from(dir)
    });
    if let Some(dir) = &cu_dir {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("kernel_dump: creating {}: {e}", dir.display());
            std::process::exit(1);
        }
    }
    let Some(model) = a.first() else {
        eprintln!("usage: kernel_dump MODEL [DOMAIN_SUBSTRING]");
        std::process::exit(2);
    };
    let filter = a.get(1).map(String::as_str).unwrap_or("");
    if model == "random" {
        let count = filter.parse().unwrap_or(400u64);
        let opts = ingot_kernels::fused::random::Options::wide();
        for seed in 0..count {
            let k = ingot_kernels::fused::random::kernel(seed, &opts);
            match ingot_kernels::cuda::fused(&k) {
                Ok(g) => println!("=== seed {seed} {}\n{}\n{}", g.name, k, g.source),
                Err(e) => println!("=== seed {seed}: {e}"),
            }
        }
        return;
    }
    let mut opts = ingot_trainer::session::Device::Cuda(Default::default()).options();
    opts.fuse_attention = !plain_attention;
    let model = match model.strip_suffix(":bf16") {
        Some(m) => {
            opts.precision = Some(ingot_compiler::precision::Precision::Bf16);
            m
        }
        None => model.as_str(),
    };
    let c = match ingot_models::by_name(model)
        .map_err(|e| e.to_string())
        .and_then(|m| ingot_compiler::pipeline::compile(&m, &opts).map_err(|e| e.to_string()))
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kernel_dump: {e}");
            std::process::exit(1);
        }
    };
    if filter == "--graph" {
        print!("{}", c.graph);
        return;
    }
    let mut seen = std::collections::HashSet::new();
    for id in c.graph.ids() {
        if let Op::Fused(k) = &c.graph.node(id).op {
            if !format!("{:?}", k.domain).contains(filter) {
                continue;
            }
            match ingot_kernels::cuda::fused(k) {
                Ok(g) if seen.insert(g.name.clone()) => {
                    println!("=== %{} {}\n{}\n{}", id.index(), g.name, k, g.source);
                    if let Some(dir) = &cu_dir {
                        let path = dir.join(format!("{}.cu", g.name));
                        let prelude = ingot_kernels::cuda::prelude_for(std::slice::from_ref(&g));
                        let text = format!("{prelude}\n{}", g.source);
                        if let Err(e) = std::fs::write(&path, text) {
                            eprintln!("kernel_dump: writing {}: {e}", path.display());
                            std::process::exit(1);
                        }
                    }
                }
                Ok(_) => {}
                Err(e) => println!("=== %{}: {e}", id.index()),
            }
        }
    }
}
