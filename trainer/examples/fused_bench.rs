//! Fused against unfused planned steps on the CPU, side by side in one run: both start from the
//! same seeded parameters and batch, steps alternate between them, and the medians, their ratio
//! and the largest relative difference of the losses and updated parameters are printed.
//!
//! `cargo run --release -p ingot-trainer --example fused_bench -- mlp gpt-mini`
use ingot_compiler::pipeline::Options;
use ingot_trainer::session::Session;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let steps: usize = std::env::var("STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(11);
    println!("| model | unfused ms | fused ms | fused / unfused | unfused kernels | fused kernels | max rel. diff of losses | of parameters |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for spec in std::env::args().skip(1) {
        let m = ingot_models::by_name(&spec).expect("model");
        let mut fused = Session::new(&m, 1).expect("fused");
        let plain_opts = Options::unoptimized(ingot_compiler::lower::Target::Cpu.plan_options());
        let mut plain = Session::with_options(&m, 1, &plain_opts).expect("unfused");
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let mut worst = 0f64;
        let mut worst_loss = 0f64;
        for i in 0..steps {
            let ra = plain.step().unwrap();
            let rb = fused.step().unwrap();
            worst_loss = worst_loss.max((ra.loss - rb.loss).abs() / ra.loss.abs());
            if i > 0 {
                a.push(ra.seconds);
                b.push(rb.seconds);
            }
        }
        let (pa, pb) = (plain.parameters(), fused.parameters());
        for (name, x) in &pa {
            let (x, y) = (x.to_f64_vec(), pb[name].to_f64_vec());
            let scale = x.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
            let d = x
                .iter()
                .zip(&y)
                .fold(0f64, |m, (p, q)| m.max((p - q).abs()));
            if d / scale > worst {
                worst = d / scale;
                if std::env::var("VERBOSE").is_ok() {
                    eprintln!("{spec}: {name} differs by {:.1e}", d / scale);
                }
            }
        }
        let count = |s: &Session| {
            s.graph()
                .ids()
                .filter(|&id| ingot_compiler::report::launches(s.graph(), id))
                .count()
        };
        let (ma, mb) = (median(a), median(b));
        println!(
            "| {spec} | {:.1} | {:.1} | {:.2} | {} | {} | {:.1e} | {:.1e} |",
            ma * 1e3,
            mb * 1e3,
            mb / ma,
            count(&plain),
            count(&fused),
            worst_loss,
            worst
        );
    }
}
