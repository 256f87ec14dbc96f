//! Times each planning phase of a model: `cargo run --release -p ingot-compiler --example plan_phases -- gpt2`
use ingot_compiler::{autodiff, plan, schedule};
use std::time::Instant;
fn main() {
    let spec = std::env::args().nth(1).unwrap_or_else(|| "gpt2".into());
    let t = Instant::now();
    let m = ingot_models::by_name(&spec).unwrap();
    let step = autodiff::training_step(&m.graph, &m.optimizer).unwrap();
    let g = &step.graph;
    println!(
        "trace+autodiff {:.3}s ({} nodes)",
        t.elapsed().as_secs_f64(),
        g.len()
    );
    let t = Instant::now();
    g.verify().unwrap();
    println!("verify {:.3}s", t.elapsed().as_secs_f64());
    for (name, f) in [
        ("traced", schedule::traced as fn(&_) -> _),
        ("memory-aware", schedule::memory_aware),
    ] {
        let t = Instant::now();
        let order = f(g);
        println!("{name}: schedule {:.3}s", t.elapsed().as_secs_f64());
        let t = Instant::now();
        let lv = plan::Liveness::analyse(g, &order, None);
        println!(
            "{name}: liveness {:.3}s ({} storages)",
            t.elapsed().as_secs_f64(),
            lv.storages.len()
        );
        let t = Instant::now();
        let p = plan::plan_order(
            g,
            &order,
            schedule::Strategy::Traced,
            std::time::Duration::from_millis(300),
        )
        .unwrap();
        println!(
            "{name}: liveness+offsets {:.3}s slab {} load {}",
            t.elapsed().as_secs_f64(),
            p.slab_bytes,
            p.load_bytes
        );
        let t = Instant::now();
        p.validate(g).unwrap();
        println!("{name}: validate {:.3}s", t.elapsed().as_secs_f64());
    }
}
