//! Prints the fused kernels of a model's step whose domain matches a filter, with the CUDA C
//! generated for them: `kernel_dump MODEL DOMAIN_SUBSTRING` (e.g. `gpt2 "[8, 12, 1024, 1024]"`).
use ingot_compiler::ir::Op;
fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let m = ingot_compiler::models::by_name(&a[0]).unwrap();
    let c = ingot_compiler::pipeline::compile(
        &m,
        &ingot_runtime::session::Device::Cuda(Default::default()).options(),
    )
    .unwrap();
    let mut seen = std::collections::HashSet::new();
    for id in c.graph.ids() {
        if let Op::Fused(k) = &c.graph.node(id).op {
            if format!("{:?}", k.domain).contains(&a[1]) {
                let g = ingot_kernels::cuda::fused(k).unwrap();
                if seen.insert(g.name.clone()) {
                    println!("=== %{} {}\n{}\n{}", id.index(), g.name, k, g.source);
                }
            }
        }
    }
}
